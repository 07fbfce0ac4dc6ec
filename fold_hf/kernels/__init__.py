"""FOLD attention kernels.

:func:`fold_attention` is the single entry point. On CUDA with Triton available it runs the fused kernel
(:mod:`fold_hf.kernels.triton_fold`) for every read whose membership is pure geometry: planned by
``plan_layer_read`` with true positions (``fold``, ``dflash``, ``window``, ``rerope``, ``yarn``, sliding
layers), batch 1, bf16/fp16/fp32. Everything else (CPU tensors, ``streaming``'s renumbered positions, a custom
region mask, fp64) runs the pure-torch reference (:mod:`fold_hf.kernels.reference`), which is the oracle
for every accelerated kernel. Triton is never imported on the CPU path.
"""

from __future__ import annotations

import os

import torch

from ..import_utils import is_triton_available
from ..modeling.read_plan import LayerRead
from .read_inputs import kernel_supports, read_kernel_inputs
from .reference import decode_attention_reference, fold_attention_reference, fold_read_geometry_reference

_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def triton_kernels_enabled(device: torch.device | str) -> bool:
    """True when tensors on ``device`` may run Triton kernels: CUDA, Triton importable, and
    ``FOLD_HF_DISABLE_TRITON`` not ``1``."""
    if torch.device(device).type != "cuda" or os.environ.get("FOLD_HF_DISABLE_TRITON") == "1":
        return False
    return is_triton_available()


def triton_read_applies(query: torch.Tensor, context_keys: torch.Tensor, read: LayerRead) -> bool:
    """True when :func:`fold_attention` runs this read with the Triton kernel."""
    if query.shape[0] != 1 or query.dtype not in _KERNEL_DTYPES or read.num_context == 0:
        return False
    return kernel_supports(read) and triton_kernels_enabled(query.device)


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
    """FOLD read of one layer; shapes as in :func:`fold_attention_reference`. Returns ``[b, Lq, Hq, Dv]``.

    Set ``FOLD_HF_DISABLE_TRITON=1`` to force the reference on CUDA.
    """
    if triton_read_applies(query, context_keys, read):
        from .triton_fold import fold_read_triton

        return fold_read_triton(**read_kernel_inputs(query, context_keys, context_values, block_keys, block_values,
                                                     read, scaling))
    return fold_attention_reference(query, context_keys, context_values, block_keys, block_values, read, scaling,
                                    context_keys_rotated=context_keys_rotated)


def default_decode_attention(device: torch.device):
    """The target's verify attention for the opt-in ``target_attention="triton"`` on ``device``: the Triton
    kernel (:func:`~fold_hf.kernels.triton_fold.decode_attention_triton`) on CUDA when it imports, else its
    pure-torch twin :func:`~fold_hf.kernels.reference.decode_attention_reference` (same signature)."""
    if triton_kernels_enabled(device):
        try:
            from .triton_fold import decode_attention_triton
        except ImportError:
            pass
        else:
            return decode_attention_triton
    return decode_attention_reference


class LayerOps:
    """The fused elementwise ops of the fast loop's fused layers (target and drafter)."""

    def __init__(self, add_rms_norm, rope_write, silu_mul, rotate_heads, backend: str) -> None:
        self.add_rms_norm, self.rope_write, self.silu_mul = add_rms_norm, rope_write, silu_mul
        self.rotate_heads, self.backend = rotate_heads, backend

    def __repr__(self) -> str:
        return f"LayerOps({self.backend})"


def default_layer_ops(device: torch.device) -> LayerOps:
    """The Triton kernels of :mod:`fold_hf.kernels.triton_layer` on CUDA when they import (and
    ``FOLD_HF_DISABLE_TRITON`` is not ``1``), else their torch twins from :mod:`fold_hf.kernels.layer_reference`."""
    if triton_kernels_enabled(device):
        try:
            from .triton_layer import add_rms_norm_triton, rope_write_triton, rotate_heads_triton, silu_mul_triton
        except ImportError:
            pass
        else:
            return LayerOps(add_rms_norm_triton, rope_write_triton, silu_mul_triton, rotate_heads_triton, "triton")
    from .layer_reference import (
        add_rms_norm_reference,
        rope_write_reference,
        rotate_heads_reference,
        silu_mul_reference,
    )

    return LayerOps(add_rms_norm_reference, rope_write_reference, silu_mul_reference, rotate_heads_reference,
                    "torch")


__all__ = ["LayerOps", "decode_attention_reference", "default_decode_attention", "default_layer_ops", "fold_attention",
           "fold_attention_reference", "fold_read_geometry_reference", "read_kernel_inputs", "triton_kernels_enabled",
           "triton_read_applies"]
