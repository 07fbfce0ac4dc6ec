"""Torch statement of :func:`fold_hf.kernels.exact_attention.triton.exact_decode_attention_triton` (same signature).

Causal attention of ``L`` rotated queries at positions ``T .. T + L - 1`` over the key/value cache, which already
holds the block's own entries at those positions (the fast loop's rope write puts them there before attending):
row ``r`` reads cache entries ``[0, T + r]``. fp32 accumulation (fp64 for fp64 inputs). This twin is a plain masked
softmax; it states the result, not the exact mode's reduction order (only the Triton kernel fixes that).
"""

from __future__ import annotations

import torch

from ..common import compute_dtype


def exact_decode_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_keys: torch.Tensor | None,
    block_values: torch.Tensor | None,
    context_length,
    scaling: float = 1.0,
    max_context_length: int | None = None,
) -> torch.Tensor:
    """Attention of ``query [1, Hq, L, Dh]`` over ``key_cache [1, Hkv, capacity, Dh]`` / ``value_cache
    [1, Hkv, capacity, Dv]``, row ``r`` at position ``T + r`` (``T = context_length``, an int or a one-element
    integer tensor) seeing entries ``0 .. T + r``. ``block_keys`` / ``block_values`` (``[1, Hkv, L, D]``, the
    signature of :func:`~fold_hf.kernels.fold_read.naive.decode_attention_reference`) are not read: the cache
    holds them. ``max_context_length``: ignored (the kernel's bound on ``T + L``). Returns ``[1, L, Hq, Dv]`` in
    ``query.dtype``."""
    del block_keys, block_values, max_context_length
    _, Hq, L, _ = query.shape
    Hkv, capacity = key_cache.shape[1], key_cache.shape[2]
    acc = compute_dtype(query.dtype)
    start = context_length.reshape(-1)[:1].to(query.device) if isinstance(context_length, torch.Tensor) else \
        torch.tensor([int(context_length)], device=query.device)
    positions = start + torch.arange(L, device=query.device)  # [L]
    visible = torch.arange(capacity, device=query.device)[None, :] <= positions[:, None]  # [L, capacity]
    keys = key_cache[0].to(acc).repeat_interleave(Hq // Hkv, 0)  # [Hq, capacity, Dh]
    values = value_cache[0].to(acc).repeat_interleave(Hq // Hkv, 0)
    scores = torch.matmul(query[0].to(acc), keys.transpose(-1, -2)) * scaling  # [Hq, L, capacity]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.matmul(probs, values).transpose(0, 1)[None].to(query.dtype)


__all__ = ["exact_decode_attention_reference"]
