"""Pure-torch twins of :mod:`fold_hf.kernels.triton_gemm` (same signatures, used off CUDA).

Shapes: ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` or None; ``gate_up_weight [2 I, K]`` (gate rows, then up).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layer_reference import rope_write_reference, silu_mul_reference


def skinny_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``[..., N]``."""
    return F.linear(x, weight, bias)


def gate_up_silu_reference(x: torch.Tensor, gate_up_weight: torch.Tensor,
                           gate_up_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` with ``gate, up`` the two halves of one gate|up product, each rounded to the model
    dtype as the separate modules give them: ``[..., I]``."""
    gate, up = F.linear(x, gate_up_weight, gate_up_bias).chunk(2, -1)
    return silu_mul_reference(gate, up)


def qkv_rope_write_reference(x: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None,
                             num_heads: int, num_kv_heads: int, cos_table: torch.Tensor, sin_table: torch.Tensor,
                             positions: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor):
    """The q|k|v product, split into heads, then :func:`~fold_hf.kernels.layer_reference.rope_write_reference`:
    ``(q [1, Hq, L, D], k [1, Hkv, L, D], v [1, Hkv, L, D])``, k and v written into the caches at ``positions``."""
    D = cos_table.shape[-1]
    L = x.shape[-2]
    q, k, v = F.linear(x, qkv_weight, qkv_bias).split([num_heads * D, num_kv_heads * D, num_kv_heads * D], -1)
    return rope_write_reference(q.reshape(1, L, num_heads, D), k.reshape(1, L, num_kv_heads, D),
                                v.reshape(1, L, num_kv_heads, D), cos_table, sin_table, positions, key_cache,
                                value_cache)


__all__ = ["gate_up_silu_reference", "qkv_rope_write_reference", "skinny_linear_reference"]
