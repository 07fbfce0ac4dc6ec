"""FOLD attention kernels.

:func:`fold_attention` is the single entry point: it runs the pure-torch reference
(:mod:`fold_hf.kernels.reference`), which is the oracle for every accelerated kernel and the CPU path.
Triton is never imported on the CPU path.
"""

from __future__ import annotations

import torch

from ..modeling.read_plan import LayerRead
from .reference import fold_attention_reference


def fold_attention(
    query: torch.Tensor,
    context_keys: torch.Tensor,
    context_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    read: LayerRead,
    scaling: float,
    context_keys_rotated: torch.Tensor | None = None,
) -> torch.Tensor:
    """FOLD read of one layer; shapes as in :func:`fold_attention_reference`. Returns ``[b, Lq, Hq, D]``."""
    return fold_attention_reference(query, context_keys, context_values, block_keys, block_values, read, scaling,
                                    context_keys_rotated=context_keys_rotated)


__all__ = ["fold_attention", "fold_attention_reference"]
