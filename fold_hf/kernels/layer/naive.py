"""Pure-torch twins of the target layer's fused elementwise kernels (:mod:`fold_hf.kernels.layer.triton`).

Each function computes exactly what the transformers modules compute, rounding where they round, so that the
fused fast path and the module path agree to the last bit wherever the order of a reduction does not differ:

* ``add_rms_norm``: ``residual + delta`` in the model dtype, then Llama's RMSNorm
  ``weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(dtype)``;
* ``rope_write``: transformers' ``apply_rotary_pos_emb`` (``q * cos + rotate_half(q) * sin``, each product and
  the sum rounded to the model dtype) on queries and keys, and the rotated keys and the values written into the
  KV cache at their positions;
* ``silu_mul``: ``silu(gate) * up`` as the Llama MLP computes it before ``down_proj``.

These run on the CPU path and are the oracles of the kernels' tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common import rotate_half


def add_rms_norm_reference(hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm.

    Args:
        hidden: ``[..., H]`` residual stream.
        delta: ``[..., H]`` added to it first (a sublayer's output), or None for a plain norm.
        weight: ``[H]`` norm weight, same dtype as ``hidden``.
        eps: the norm's ``variance_epsilon``.

    Returns:
        ``(hidden + delta, rms_norm(hidden + delta))``, both ``[..., H]`` in ``hidden``'s dtype.
    """
    total = hidden if delta is None else hidden + delta
    x = total.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return total, weight * normed.to(total.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def rope_write_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos_table: torch.Tensor,
                         sin_table: torch.Tensor, positions: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rotate the block's queries and keys at their positions and append keys and values to the cache.

    Args:
        query: ``[1, L, Hq, D]`` projected (and q-normed) queries.
        key: ``[1, L, Hkv, D]`` projected (and k-normed) keys.
        value: ``[1, L, Hkv, D]`` projected values.
        cos_table, sin_table: ``[capacity, D]`` rope tables in the model dtype.
        positions: ``[L]`` long, the tokens' positions (rows of the tables and of the cache).
        key_cache, value_cache: ``[1, Hkv, capacity, D]``; rows ``positions`` are overwritten.

    Returns:
        rotated queries ``[1, Hq, L, D]``, rotated keys ``[1, Hkv, L, D]`` and values ``[1, Hkv, L, D]``
        (contiguous).
    """
    cos = cos_table[positions][None, None]  # [1, 1, L, D]
    sin = sin_table[positions][None, None]
    q = _rotate(query.transpose(1, 2), cos, sin).contiguous()
    k = _rotate(key.transpose(1, 2), cos, sin).contiguous()
    v = value.transpose(1, 2).contiguous()
    key_cache.index_copy_(2, positions, k)
    value_cache.index_copy_(2, positions, v)
    return q, k, v


def is_silu(activation) -> bool:
    """True when an MLP's activation module is the SiLU that ``silu_mul`` fuses (torch's or transformers')."""
    from torch import nn
    from transformers.activations import SiLUActivation

    return isinstance(activation, (nn.SiLU, SiLUActivation))


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``[..., I]`` tensors of one dtype."""
    return F.silu(gate) * up


def rotate_heads_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float,
                           out_dtype: torch.dtype) -> torch.Tensor:
    """Rotate per-token heads by rope tables in the tables' dtype, scale, cast: the drafter's query and block-key
    rotation (:func:`~fold_hf.kernels.fold_read.naive.rotate_by_tables` then ``* scale``).

    Args:
        x: ``[1, L, H, D]`` heads as projected (and normed).
        cos, sin: ``[L, R]`` tables (rotate_half layout, ``R <= D`` even; channels past ``R`` pass through).
        scale: multiplies every channel after the rotation (the attention scaling for queries, 1 for keys).
        out_dtype: dtype of the result.

    Returns:
        ``[1, H, L, D]`` in ``out_dtype``.
    """
    from ..fold_read.naive import rotate_by_tables

    rotated = rotate_by_tables(x.transpose(1, 2), cos, sin)
    if scale != 1.0:
        rotated = rotated * scale
    return rotated.to(out_dtype)


__all__ = ["add_rms_norm_reference", "is_silu", "rope_write_reference", "rotate_heads_reference", "silu_mul_reference"]
