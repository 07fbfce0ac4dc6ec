"""Two definitions every read and every layer share: the accumulation dtype and rope's channel swap.

Leaf module (torch only), so that :mod:`fold_hf.modeling.rope`, the references and the fused layers use one
definition each.
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for inputs of ``dtype``: fp32, or fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(-x2, x1)`` for ``x = (x1, x2)`` split in halves of the last dim ``[..., R]`` (R even): the rope layout
    of transformers (``rotate_half``), so that ``x * cos + rotate_half(x) * sin`` rotates each channel pair
    ``(i, i + R/2)``."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
