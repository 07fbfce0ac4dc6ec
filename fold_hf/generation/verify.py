"""Verification of a drafted block: greedy prefix match and speculative sampling.

Speculative sampling (Leviathan et al., Chen et al.) keeps the target's distribution exactly: draft
token ``d_i`` drawn from the drafter's processed distribution ``q_i`` is accepted with probability
``min(1, p_i(d_i) / q_i(d_i))``; the first rejection is replaced by a draw from
``normalize(max(0, p_i - q_i))``; when every draft is accepted, one more token is drawn from ``p_{k+1}``.
Block-parallel drafts are drawn independently per slot, which is one valid choice of ``q``.
"""

from __future__ import annotations

import torch

from ..modeling.rope import compute_dtype
from .sampling import filter_top_k_top_p


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """Probabilities ``[..., V]`` after temperature, top-k and top-p (fp32), as target-only sampling applies them."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    scores = logits.to(compute_dtype(logits.dtype)) / temperature
    shape = scores.shape
    scores = filter_top_k_top_p(scores.reshape(-1, shape[-1]), top_k, top_p).reshape(shape)
    return scores.softmax(-1)


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Greedy verification.

    Args:
        draft_tokens: ``[k]`` drafted tokens.
        target_logits: ``[k + 1, V]`` target logits at the last committed token and each draft.

    Returns:
        (number of accepted drafts n, ``[n + 1]`` tokens to commit: accepted drafts then the target's token).
    """
    posterior = target_logits.argmax(-1)
    k = draft_tokens.shape[0]
    matches = (draft_tokens == posterior[:k]).int().cumprod(0)
    n = int(matches.sum())
    return n, torch.cat((draft_tokens[:n], posterior[n : n + 1]))


def speculative_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, torch.Tensor]:
    """Speculative sampling of one block.

    Args:
        draft_tokens: ``[k]`` tokens drawn from ``draft_probs``.
        draft_probs: ``[k, V]`` the drafter's processed distributions.
        target_probs: ``[k + 1, V]`` the target's processed distributions.
        generator: random source (on the probabilities' device).

    Returns:
        (accepted drafts n, ``[n + 1]`` tokens to commit).
    """
    k = draft_tokens.shape[0]
    idx = torch.arange(k, device=draft_tokens.device)
    p = target_probs[idx, draft_tokens]
    q = draft_probs[idx, draft_tokens]
    u = torch.rand(k, generator=generator, device=draft_probs.device)
    accepted = (u * q <= p).int().cumprod(0)  # u < p/q without dividing by a zero q
    n = int(accepted.sum())
    if n < k:
        residual = (target_probs[n] - draft_probs[n]).clamp_min(0)
        total = residual.sum()
        dist = residual / total if total > 0 else target_probs[n]
    else:
        dist = target_probs[k]
    last = torch.multinomial(dist, 1, generator=generator)
    return n, torch.cat((draft_tokens[:n], last))
