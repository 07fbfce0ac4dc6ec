"""FOLD kernels on plain tensors: Triton kernels and their pure-torch twins.

* :mod:`fold_hf.kernels.triton_fold`: the FOLD read given as numbers (``fold_read_triton``) and the target's
  verify attention (``decode_attention_triton``); twins in :mod:`fold_hf.kernels.reference`;
* :mod:`fold_hf.kernels.triton_layer`: the fused elementwise ops of the fast loop's layers; twins in
  :mod:`fold_hf.kernels.layer_reference`;
* :mod:`fold_hf.kernels.triton_hybrid`: the fused ops of Qwen3.5 and Gemma target layers (Gemma norms, per-head
  norm + partial rope + ring write, GELU-tanh, the fused Gated DeltaNet verify and its commit); twins in
  :mod:`fold_hf.kernels.hybrid_reference`.

This package takes tensors and imports nothing from :mod:`fold_hf.modeling` (checked by
``tests/test_import_graph.py``); reading a planned ``LayerRead`` through these kernels is
:mod:`fold_hf.modeling.fold_read`. Triton is never imported on the CPU path.
"""

from __future__ import annotations

import os

import torch

from ..import_utils import is_triton_available
from .common import compute_dtype, rotate_half
from .reference import decode_attention_reference, fold_read_geometry_reference, rotate_by_tables

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def triton_kernels_enabled(device: torch.device | str) -> bool:
    """True when tensors on ``device`` may run Triton kernels: CUDA, Triton importable, and
    ``FOLD_HF_DISABLE_TRITON`` not ``1``."""
    if torch.device(device).type != "cuda" or os.environ.get("FOLD_HF_DISABLE_TRITON") == "1":
        return False
    return is_triton_available()


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


HYBRID_OPS = ("residual_norm", "head_norm_rope_write", "ring_attention", "gelu_tanh_mul", "sigmoid_mul",
              "gated_rms_norm", "gated_delta_verify", "gated_delta_commit")


class HybridOps:
    """The fused ops of Qwen3.5 / Gemma target layers (:data:`HYBRID_OPS`, each ``<name>_triton`` or
    ``<name>_reference``); ``backend`` is ``"triton"`` or ``"torch"``."""

    def __init__(self, backend: str, **ops) -> None:
        missing = set(HYBRID_OPS) - set(ops)
        if missing:
            raise ValueError(f"HybridOps needs {sorted(missing)}")
        self.__dict__.update(ops)
        self.backend = backend

    def __repr__(self) -> str:
        return f"HybridOps({self.backend})"


def default_hybrid_ops(device: torch.device | str) -> HybridOps:
    """The Triton kernels of :mod:`fold_hf.kernels.triton_hybrid` on CUDA when they import (and
    ``FOLD_HF_DISABLE_TRITON`` is not ``1``), else their torch twins (:mod:`fold_hf.kernels.hybrid_reference`)."""
    if triton_kernels_enabled(device):
        try:
            from . import triton_hybrid as module
        except ImportError:
            pass
        else:
            return HybridOps("triton", **{name: getattr(module, f"{name}_triton") for name in HYBRID_OPS})
    from . import hybrid_reference as module

    return HybridOps("torch", **{name: getattr(module, f"{name}_reference") for name in HYBRID_OPS})


__all__ = ["HYBRID_OPS", "HybridOps", "KERNEL_DTYPES", "LayerOps", "compute_dtype", "decode_attention_reference",
           "default_decode_attention", "default_hybrid_ops", "default_layer_ops", "fold_read_geometry_reference",
           "rotate_by_tables", "rotate_half", "triton_kernels_enabled"]
