"""Pure-torch reference of the prefill attention (the twin every kernel here is tested against).

A prefill chunk's ``L`` queries sit at positions ``start .. start + L - 1``; the keys are the cache's first
``S = start + L`` entries (positions ``0 .. S - 1``, the chunk's own keys last). Query ``p`` sees key ``j`` when
``j <= p`` and, with a sliding ``window``, ``p - j < window``.
"""

from __future__ import annotations

import torch


def prefill_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                            window: int | None = None) -> torch.Tensor:
    """Causal attention of a chunk with a query offset, in fp32 (fp64 for fp64 inputs).

    Args:
        q: ``[B, Hq, L, D]`` queries at positions ``start .. start + L - 1``.
        k: ``[B, Hkv, S, D]`` keys at positions ``0 .. S - 1`` with ``S = start + L`` (``Hq % Hkv == 0``: query
            head ``h`` reads key head ``h // (Hq // Hkv)``).
        v: ``[B, Hkv, S, D]`` values.
        start: position of the first query.
        scale: the logit scale.
        window: sliding window (keys with ``p - j < window``), or None for full causal attention.

    Returns:
        ``[B, Hq, L, D]`` in ``q``'s dtype.
    """
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if S != start + L or v.shape != k.shape or Hq % Hkv:
        raise ValueError(f"q {tuple(q.shape)} at {start} does not match k {tuple(k.shape)} / v {tuple(v.shape)}")
    group = Hq // Hkv
    work = torch.promote_types(q.dtype, torch.float32)
    kf = k.to(work).repeat_interleave(group, dim=1)
    vf = v.to(work).repeat_interleave(group, dim=1)
    scores = torch.matmul(q.to(work), kf.transpose(-1, -2)) * scale  # [B, Hq, L, S]
    pos = torch.arange(start, start + L, device=q.device)[:, None]
    key = torch.arange(S, device=q.device)[None, :]
    visible = key <= pos
    if window is not None:
        visible = visible & (pos - key < window)
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.matmul(scores.softmax(-1), vf).to(q.dtype)


def merge_lse_reference(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Merge two partial attentions of the same queries over disjoint key sets by their log-sum-exp.

    Args:
        out1, out2: ``[B, H, L, D]`` normalized outputs over each key set.
        lse1, lse2: ``[B, H, L]`` fp32 natural-log sums of the exponentiated scores of each set.

    Returns:
        ``[B, H, L, D]`` in ``out2``'s dtype: ``out1 * w + out2 * (1 - w)``, ``w = sigmoid(lse1 - lse2)``.
    """
    weight = torch.sigmoid(lse1.float() - lse2.float()).unsqueeze(-1)
    return out2.float().lerp(out1.float(), weight).to(out2.dtype)
