"""Verification of one drafted block on the host, for callers holding a block's tensors: greedy prefix match and
speculative sampling.

The rules live in one place, :mod:`fold_hf.generation.sampling` (what every decode loop runs, on the device);
these functions are that module's rules with a host-friendly signature (a Python int for the accepted count,
probabilities instead of processed scores, a ``torch.Generator`` instead of a uniforms buffer).

Speculative sampling (Leviathan et al., Chen et al.) keeps the target's distribution exactly: draft token ``d_i``
drawn from the drafter's processed distribution ``q_i`` is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``;
the first rejection is replaced by a draw from ``normalize(max(0, p_i - q_i))``; when every draft is accepted, one
more token is drawn from ``p_{k+1}``.
"""

from __future__ import annotations

import torch

from .sampling import Sampling, greedy_ops, process, verify_sampled


def process_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> torch.Tensor:
    """Probabilities ``[..., V]`` (fp32; fp64 for fp64 logits) after temperature, top-k and top-p, as sampling
    applies them (:func:`fold_hf.generation.sampling.process`)."""
    sampling = Sampling(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
    rows = logits.reshape(-1, logits.shape[-1])  # process() takes [n, V]
    return process(rows, sampling).softmax(-1).reshape(logits.shape)


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Greedy verification (:func:`fold_hf.generation.sampling.verify_greedy`; on CUDA the Triton kernels of
    :func:`fold_hf.kernels.greedy_select_ops`).

    Args:
        draft_tokens: ``[k]`` drafted tokens.
        target_logits: ``[k + 1, V]`` target logits at the last committed token and each draft.

    Returns:
        (number of accepted drafts n, ``[n + 1]`` tokens to commit: accepted drafts then the target's token).
    """
    k = draft_tokens.shape[0]
    n, final = greedy_ops(target_logits.device).greedy_verify(target_logits, draft_tokens, k)
    n = int(n)
    return n, torch.cat((draft_tokens[:n], final))


def speculative_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, torch.Tensor]:
    """Speculative sampling of one block (:func:`fold_hf.generation.sampling.verify_sampled`).

    Args:
        draft_tokens: ``[k]`` tokens drawn from ``draft_probs``.
        draft_probs: ``[k, V]`` the drafter's processed distributions.
        target_probs: ``[k + 1, V]`` the target's processed distributions.
        generator: random source (on the probabilities' device; torch's default generator when None).

    Returns:
        (accepted drafts n, ``[n + 1]`` tokens to commit).
    """
    k = draft_tokens.shape[0]
    source = generator.device if generator is not None else draft_probs.device
    u = torch.rand(2 * k + 1, generator=generator, device=source, dtype=torch.float64).to(draft_probs.device)
    # verify_sampled takes processed scores: log p gives back p under its softmax (zeros stay zeros)
    n, last = verify_sampled(target_probs.log(), draft_tokens, draft_probs, u, k)
    n = int(n)
    return n, torch.cat((draft_tokens[:n], last))
