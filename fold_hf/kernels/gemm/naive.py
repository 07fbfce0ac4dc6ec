"""Pure-torch twins of :mod:`fold_hf.kernels.gemm.triton` (same signatures, used off CUDA).

Shapes: ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` or None; ``gate_up_weight [2 I, K]`` (gate rows, then up).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..gemma.naive import gelu_tanh_mul_reference
from ..layer.naive import silu_mul_reference


def skinny_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: ``[..., N]``."""
    return F.linear(x, weight, bias)


def gate_up_silu_reference(x: torch.Tensor, gate_up_weight: torch.Tensor,
                           gate_up_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` with ``gate, up`` the two halves of one gate|up product, each rounded to the model
    dtype as the separate modules give them: ``[..., I]``."""
    gate, up = F.linear(x, gate_up_weight, gate_up_bias).chunk(2, -1)
    return silu_mul_reference(gate, up)


def gate_up_gelu_tanh_reference(x: torch.Tensor, gate_up_weight: torch.Tensor,
                                gate_up_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up`` of one gate|up product's halves (Gemma's MLP): ``[..., I]``."""
    gate, up = F.linear(x, gate_up_weight, gate_up_bias).chunk(2, -1)
    return gelu_tanh_mul_reference(gate, up)


__all__ = ["gate_up_gelu_tanh_reference", "gate_up_silu_reference", "skinny_linear_reference"]
