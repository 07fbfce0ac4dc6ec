"""Definitions every read and every layer share: the accumulation dtype, rope's channel swap, and the scope in which
Triton launches may use programmatic dependent launch.

Leaf module (torch only), so that :mod:`fold_hf.modeling.rope`, the references and the fused layers use one
definition each.
"""

from __future__ import annotations

import contextlib
import threading

import torch

_PDL_SCOPE = threading.local()


@contextlib.contextmanager
def pdl_scope(enabled: bool = True):
    """Inside this block (on this thread) the Triton kernels of :mod:`fold_hf.kernels` may launch with programmatic
    dependent launch (:mod:`fold_hf.kernels.triton_pdl`, where the device and ``$FOLD_HF_PDL`` allow it); outside it
    they never do. The fused target layers open it for an AR step's single token only: there PDL measured 1% faster
    on the H200, while a speculative round with it measured slower (``benchmarks/results/2026-12-02-nvidia-h200-pdl``),
    so a round's graphs are what they were without it."""
    previous = getattr(_PDL_SCOPE, "on", False)
    _PDL_SCOPE.on = bool(enabled)
    try:
        yield
    finally:
        _PDL_SCOPE.on = previous


def in_pdl_scope() -> bool:
    """Whether the calling thread is inside :func:`pdl_scope` (enabled)."""
    return getattr(_PDL_SCOPE, "on", False)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for inputs of ``dtype``: fp32, or fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``(-x2, x1)`` for ``x = (x1, x2)`` split in halves of the last dim ``[..., R]`` (R even): the rope layout
    of transformers (``rotate_half``), so that ``x * cos + rotate_half(x) * sin`` rotates each channel pair
    ``(i, i + R/2)``."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def is_sharded(tensor) -> bool:
    """Whether ``tensor`` is a ``torch.distributed`` DTensor (a tensor-parallel shard, as transformers' ``tp_plan``
    leaves a sharded model's weights): a kernel given one would read a shard as if it were the whole weight, so the
    module it belongs to runs as itself (its forward does the collectives)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def local(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """This rank's part of a sharded ``tensor`` (a replicated DTensor: the whole), else ``tensor`` itself."""
    return tensor.to_local() if is_sharded(tensor) else tensor
