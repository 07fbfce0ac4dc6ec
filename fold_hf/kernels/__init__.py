"""FOLD kernels on plain tensors: Triton kernels and their pure-torch twins.

* :mod:`fold_hf.kernels.triton_fold`: the FOLD read given as numbers (``fold_read_triton``) and the target's
  verify attention (``decode_attention_triton``); twins in :mod:`fold_hf.kernels.reference`;
* :mod:`fold_hf.kernels.triton_layer`: the fused elementwise ops of the fast loop's layers; twins in
  :mod:`fold_hf.kernels.layer_reference`;
* :mod:`fold_hf.kernels.triton_gemm`: the skinny GEMMs of the fused target layers' decode steps (no split-K, SiLU in
  the gate|up product); twins in :mod:`fold_hf.kernels.gemm_reference`;
* :mod:`fold_hf.kernels.triton_pdl`: programmatic dependent launch for the kernels above, inside
  :func:`fold_hf.kernels.common.pdl_scope` (an AR step's fused target layers);
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


SKINNY_GEMM_ENV = "FOLD_HF_SKINNY_GEMM"
QKV_ROPE_ENV = "FOLD_HF_QKV_ROPE"


def skinny_gemm_enabled() -> bool:
    """Whether the fused target layers run their decode projections (1 to 16 rows) through the skinny Triton GEMMs
    of :mod:`fold_hf.kernels.triton_gemm` on CUDA (default yes; ``$FOLD_HF_SKINNY_GEMM=0`` keeps cuBLAS, for A/B
    timings)."""
    value = os.environ.get(SKINNY_GEMM_ENV, "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"{SKINNY_GEMM_ENV} must be 0 or 1, got {value!r}")
    return value != "0"


def qkv_rope_enabled() -> bool:
    """Whether the skinny q|k|v GEMM of a decode step also rotates and writes the cache in its epilogue
    (:func:`fold_hf.kernels.triton_gemm.qkv_rope_write_triton`; no separate rope launch), for targets without a
    per-head q/k norm. Opt-in (``$FOLD_HF_QKV_ROPE=1``) until it is timed on a GPU; default off."""
    value = os.environ.get(QKV_ROPE_ENV, "0")
    if value not in ("0", "1", ""):
        raise ValueError(f"{QKV_ROPE_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


class LayerOps:
    """The fused elementwise ops of the fast loop's fused layers (target and drafter).

    ``skinny_linear`` / ``gate_up_silu``: the decode-step GEMMs (:mod:`fold_hf.kernels.triton_gemm`, or their twins
    in :mod:`fold_hf.kernels.gemm_reference`), or None where the projections run as ``F.linear`` / the modules
    (the CPU path, whose multi-row products go to MKL's packed GEMM, or ``$FOLD_HF_SKINNY_GEMM=0``);
    ``skinny_rows`` the most rows they take; ``skinny_wins(rows, N, K)`` whether the skinny kernel takes a shape;
    ``qkv_rope_write``: the q|k|v GEMM with the rope and the cache write in its epilogue (:func:`qkv_rope_enabled`),
    or None."""

    def __init__(self, add_rms_norm, rope_write, silu_mul, rotate_heads, backend: str, skinny_linear=None,
                 gate_up_silu=None, skinny_rows: int = 0, skinny_wins=None, qkv_rope_write=None) -> None:
        self.add_rms_norm, self.rope_write, self.silu_mul = add_rms_norm, rope_write, silu_mul
        self.rotate_heads, self.backend = rotate_heads, backend
        self.skinny_linear, self.gate_up_silu, self.skinny_rows = skinny_linear, gate_up_silu, skinny_rows
        self.skinny_wins, self.qkv_rope_write = skinny_wins, qkv_rope_write

    def __repr__(self) -> str:
        gemm = ", skinny GEMMs" if self.skinny_linear is not None else ""
        return f"LayerOps({self.backend}{gemm})"


def default_layer_ops(device: torch.device) -> LayerOps:
    """The Triton kernels of :mod:`fold_hf.kernels.triton_layer` (and the skinny GEMMs of
    :mod:`fold_hf.kernels.triton_gemm`, see :func:`skinny_gemm_enabled`) on CUDA when they import (and
    ``FOLD_HF_DISABLE_TRITON`` is not ``1``), else their torch twins from :mod:`fold_hf.kernels.layer_reference`
    with the projections left to ``F.linear``."""
    if triton_kernels_enabled(device):
        try:
            from .triton_layer import add_rms_norm_triton, rope_write_triton, rotate_heads_triton, silu_mul_triton
        except ImportError:
            pass
        else:
            skinny = {}
            if skinny_gemm_enabled():
                from . import triton_gemm as gemm

                skinny = dict(skinny_linear=gemm.decode_linear_triton, gate_up_silu=gemm.gate_up_silu_triton,
                              skinny_rows=gemm.MAX_ROWS, skinny_wins=gemm.skinny_wins,
                              qkv_rope_write=gemm.qkv_rope_write_triton if qkv_rope_enabled() else None)
            return LayerOps(add_rms_norm_triton, rope_write_triton, silu_mul_triton, rotate_heads_triton, "triton",
                            **skinny)
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


__all__ = ["HYBRID_OPS", "HybridOps", "KERNEL_DTYPES", "LayerOps", "QKV_ROPE_ENV", "SKINNY_GEMM_ENV",
           "qkv_rope_enabled", "skinny_gemm_enabled", "compute_dtype", "decode_attention_reference",
           "default_decode_attention", "default_hybrid_ops", "default_layer_ops", "fold_read_geometry_reference",
           "rotate_by_tables", "rotate_half", "triton_kernels_enabled"]
