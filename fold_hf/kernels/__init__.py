"""FOLD kernels on plain tensors: Triton kernels and their pure-torch twins, one package per op (as
flash-linear-attention's ``ops/<op>/``): ``<op>/naive.py`` the torch twins (the CPU path and the oracles of the tests),
``<op>/triton.py`` the Triton kernels, imported only through :func:`import_triton_module` (never on the CPU path; a
``naive.py`` and a package's ``__init__`` never import their ``triton.py``). This module is the dispatch.

* :mod:`.fold_read`: the FOLD read given as numbers (``fold_read_triton``) and the target's verify attention
  (``decode_attention_triton``, :func:`default_decode_attention`); twins ``fold_read_geometry_reference`` /
  ``decode_attention_reference``;
* :mod:`.layer`: the fused elementwise ops of the fast loop's layers (:func:`default_layer_ops`);
* :mod:`.gemm`: the skinny GEMMs of the fused target layers' decode steps (no split-K, SiLU in the gate|up product;
  :func:`skinny_gemm_enabled`), and :mod:`.gemm.cpu`: several CPU rows through a packed GEMM (oneDNN's or MKL's);
* :mod:`.hybrid`: the fused ops Qwen3.5 and Gemma target layers share (residual norms, per-head norm + partial
  rope + ring write, the sigmoid gate), :mod:`.gemma`: Gemma's own (ring attention, GELU-tanh), and
  :mod:`.gated_delta`: the gated delta rule (per position states, :func:`~.gated_delta.default_gated_delta`; the
  fused Gated DeltaNet verify, its commit and its gated RMSNorm output), all in :func:`default_hybrid_ops`;
* :mod:`.select`: greedy token selection on logits rows (the argmax of each row, and a round's greedy verify:
  accepted count and last token) in two launches, ``torch.argmax``'s semantics exactly; the torch path in
  :mod:`.select.naive`, chosen by :func:`greedy_select_ops` (``$FOLD_HF_TRITON_SELECT=0``: the torch path on CUDA
  too);
* :mod:`.prefill_attention`: a prefill chunk's attention (its own dispatch,
  :func:`~.prefill_attention.prefill_attention`);
* :mod:`.exact_attention` and :mod:`.exact`: the exact mode's row-count-invariant kernels (the decode / verify
  attention with splits fixed by key position; :func:`~.exact.exact_layer_ops` and
  :func:`~.exact.exact_decode_attention`, docs/exact-mode.md);
* :mod:`.common` (dtypes, ``rotate_half``, :func:`~.common.pdl_scope`) and :mod:`.triton_pdl` (programmatic
  dependent launch for the Triton kernels inside ``pdl_scope``: an AR step's fused target layers) are shared.

This package takes tensors and imports nothing from :mod:`fold_hf.modeling` (checked by
``tests/test_import_graph.py``); reading a planned ``LayerRead`` through these kernels is
:mod:`fold_hf.modeling.fold_read`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import warnings

import torch

from ..import_utils import is_triton_available
from .common import compute_dtype, rotate_half
from .fold_read.naive import decode_attention_reference, fold_read_geometry_reference, rotate_by_tables
from .select.naive import argmax_rows_torch, greedy_verify_torch

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def triton_kernels_enabled(device: torch.device | str) -> bool:
    """True when tensors on ``device`` may run Triton kernels: CUDA, Triton importable, and
    ``FOLD_HF_DISABLE_TRITON`` not ``1``."""
    if torch.device(device).type != "cuda" or os.environ.get("FOLD_HF_DISABLE_TRITON") == "1":
        return False
    return is_triton_available()


def triton_unavailable_reason(device: torch.device | str) -> str | None:
    """Why Triton kernels cannot run on ``device`` (None when they can): the words a fallback's warning uses."""
    if torch.device(device).type != "cuda":
        return f"tensors on {torch.device(device).type}, not CUDA"
    if os.environ.get("FOLD_HF_DISABLE_TRITON") == "1":
        return "FOLD_HF_DISABLE_TRITON=1"
    if not is_triton_available():
        return "Triton is not installed" if importlib.util.find_spec("triton") is None else "no CUDA device"
    return None


_IMPORT_FAILURES: set[str] = set()


def import_triton_module(name: str):
    """``fold_hf.kernels.<name>`` (a Triton module), or None when importing it fails on a machine where Triton
    kernels should run: then one warning names the module and the error, and the caller runs the torch twins."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError as error:
        if name not in _IMPORT_FAILURES:
            _IMPORT_FAILURES.add(name)
            warnings.warn(f"fold_hf: the Triton kernels of fold_hf.kernels.{name} failed to import "
                          f"({type(error).__name__}: {error}); their pure-torch twins run instead", UserWarning,
                          stacklevel=3)
        return None


def default_decode_attention(device: torch.device):
    """The target's verify attention for the opt-in ``target_attention="triton"`` on ``device``: the Triton
    kernel (:func:`~fold_hf.kernels.fold_read.triton.decode_attention_triton`) on CUDA when it imports, else its
    pure-torch twin :func:`~fold_hf.kernels.fold_read.naive.decode_attention_reference` (same signature)."""
    module = import_triton_module("fold_read.triton") if triton_kernels_enabled(device) else None
    return module.decode_attention_triton if module is not None else decode_attention_reference


ROWS_KERNELS_ENV = "FOLD_HF_ROWS_KERNELS"


def rows_kernels_enabled() -> bool:
    """Whether a batch's rows run the kernels with a row axis on CUDA (one launch, or launch pair, per layer for
    every row: the drafts' FOLD reads, the verify's rope / norm / cache writes and attention; default yes).
    ``$FOLD_HF_ROWS_KERNELS=0`` runs the one-row kernels row by row, for A/B timings in one process (read when a
    runner or a rows drafting step resolves its kernels: release the fast state between settings)."""
    value = os.environ.get(ROWS_KERNELS_ENV, "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"{ROWS_KERNELS_ENV} must be 0 or 1, got {value!r}")
    return value != "0"


SKINNY_GEMM_ENV = "FOLD_HF_SKINNY_GEMM"


def skinny_gemm_enabled() -> bool:
    """Whether the fused target layers run their decode projections (1 to 16 rows) through the skinny Triton GEMMs
    of :mod:`fold_hf.kernels.gemm.triton` on CUDA (default yes; ``$FOLD_HF_SKINNY_GEMM=0`` keeps cuBLAS, for A/B
    timings)."""
    value = os.environ.get(SKINNY_GEMM_ENV, "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"{SKINNY_GEMM_ENV} must be 0 or 1, got {value!r}")
    return value != "0"


class LayerOps:
    """The fused elementwise ops of the fast loop's fused layers (target and drafter).

    ``skinny_linear`` / ``gate_up_silu`` / ``gate_up_gelu`` (Gemma's GELU-tanh): the decode-step GEMMs (:mod:`fold_hf.kernels.gemm.triton`, or their twins
    in :mod:`fold_hf.kernels.gemm.naive`), or None where the projections run as ``F.linear`` / the modules
    (the CPU path, whose multi-row products go to a packed GEMM, or ``$FOLD_HF_SKINNY_GEMM=0``);
    ``skinny_rows`` the most rows they take. ``rope_write_rows``: the rope and cache write of a batch's rows in one
    launch (:func:`fold_hf.kernels.layer.triton.rope_write_rows_triton`), or None (one ``rope_write`` per row)."""

    def __init__(self, add_rms_norm, rope_write, silu_mul, rotate_heads, backend: str, skinny_linear=None,
                 gate_up_silu=None, skinny_rows: int = 0, gate_up_gelu=None, rope_write_rows=None) -> None:
        self.add_rms_norm, self.rope_write, self.silu_mul = add_rms_norm, rope_write, silu_mul
        self.rotate_heads, self.backend = rotate_heads, backend
        self.skinny_linear, self.gate_up_silu, self.skinny_rows = skinny_linear, gate_up_silu, skinny_rows
        self.gate_up_gelu, self.rope_write_rows = gate_up_gelu, rope_write_rows

    def __repr__(self) -> str:
        gemm = ", skinny GEMMs" if self.skinny_linear is not None else ""
        return f"LayerOps({self.backend}{gemm})"


def default_layer_ops(device: torch.device) -> LayerOps:
    """The Triton kernels of :mod:`fold_hf.kernels.layer.triton` (and the skinny GEMMs of
    :mod:`fold_hf.kernels.gemm.triton`, see :func:`skinny_gemm_enabled`) on CUDA when they import (and
    ``FOLD_HF_DISABLE_TRITON`` is not ``1``), else their torch twins from :mod:`fold_hf.kernels.layer.naive`
    with the projections left to ``F.linear``."""
    layer = import_triton_module("layer.triton") if triton_kernels_enabled(device) else None
    if layer is not None:
        skinny = {}
        gemm = import_triton_module("gemm.triton") if skinny_gemm_enabled() else None
        if gemm is not None:
            skinny = dict(skinny_linear=gemm.decode_linear_triton, gate_up_silu=gemm.gate_up_silu_triton,
                          gate_up_gelu=gemm.gate_up_gelu_tanh_triton,
                          skinny_rows=gemm.MAX_ROWS)
        rows = layer.rope_write_rows_triton if rows_kernels_enabled() else None
        return LayerOps(layer.add_rms_norm_triton, layer.rope_write_triton, layer.silu_mul_triton,
                        layer.rotate_heads_triton, "triton", rope_write_rows=rows, **skinny)
    from .layer.naive import (
        add_rms_norm_reference,
        rope_write_reference,
        rotate_heads_reference,
        silu_mul_reference,
    )

    return LayerOps(add_rms_norm_reference, rope_write_reference, silu_mul_reference, rotate_heads_reference,
                    "torch")


# each op of the Qwen3.5 / Gemma target layers -> the package (fold_hf.kernels.<package>) whose naive.py and triton.py
# define <op>_reference and <op>_triton
HYBRID_OP_PACKAGES = {
    "residual_norm": "hybrid", "head_norm_rope_write": "hybrid", "ring_attention": "gemma", "gelu_tanh_mul": "gemma",
    "sigmoid_mul": "hybrid", "gated_rms_norm": "gated_delta", "gated_delta_verify": "gated_delta",
    "gated_delta_commit": "gated_delta",
}
HYBRID_OPS = tuple(HYBRID_OP_PACKAGES)


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
    """The Triton kernels of :mod:`fold_hf.kernels.hybrid.triton`, :mod:`fold_hf.kernels.gemma.triton` and
    :mod:`fold_hf.kernels.gated_delta.triton` (:data:`HYBRID_OP_PACKAGES`) on CUDA when all of them import (and
    ``FOLD_HF_DISABLE_TRITON`` is not ``1``), else their torch twins (the packages' ``naive`` modules)."""
    packages = tuple(dict.fromkeys(HYBRID_OP_PACKAGES.values()))
    kernels = {}
    if triton_kernels_enabled(device):
        for package in packages:
            module = import_triton_module(f"{package}.triton")
            if module is None:
                break
            kernels[package] = module
    if len(kernels) == len(packages):
        return HybridOps("triton", **{op: getattr(kernels[package], f"{op}_triton")
                                      for op, package in HYBRID_OP_PACKAGES.items()})
    from .gated_delta.naive import (
        gated_delta_commit_reference,
        gated_delta_verify_reference,
        gated_rms_norm_reference,
    )
    from .gemma.naive import gelu_tanh_mul_reference, ring_attention_reference
    from .hybrid.naive import head_norm_rope_write_reference, residual_norm_reference, sigmoid_mul_reference

    return HybridOps("torch", residual_norm=residual_norm_reference,
                     head_norm_rope_write=head_norm_rope_write_reference, ring_attention=ring_attention_reference,
                     gelu_tanh_mul=gelu_tanh_mul_reference, sigmoid_mul=sigmoid_mul_reference,
                     gated_rms_norm=gated_rms_norm_reference, gated_delta_verify=gated_delta_verify_reference,
                     gated_delta_commit=gated_delta_commit_reference)


class SelectOps:
    """Greedy token selection on logits rows (:func:`greedy_select_ops`); ``backend`` is ``"triton"`` or
    ``"torch"``.

    * ``argmax_rows(scores [n, V]) -> [n] long``: each row's first maximum (NaN as the maximum), as
      ``scores.argmax(-1)``;
    * ``greedy_verify(scores [K + 1, V], proposals [K] long, limit) -> (n [1] long, final [1] long)``: accepted
      n = min(leading proposals equal to the rows' argmax, limit) and the round's last token ``argmax[n]``;
      ``limit`` an int or a long tensor ``[1]`` on the device (read there: capturable).

    The Triton backend takes bf16 / fp16 / fp32 scores (the argmax of bf16 logits is that of their fp32 copy: the
    conversion is exact); other dtypes (fp64) go to the torch path."""

    def __init__(self, backend: str, argmax_rows=None, greedy_verify=None) -> None:
        self.backend = backend
        self._argmax_rows, self._greedy_verify = argmax_rows, greedy_verify

    def takes(self, scores: torch.Tensor) -> bool:
        """Whether the Triton kernels run on ``scores`` (else the torch path does)."""
        return self._argmax_rows is not None and scores.dtype in KERNEL_DTYPES and scores.dim() == 2

    def argmax_rows(self, scores: torch.Tensor) -> torch.Tensor:
        if self.takes(scores):
            return self._argmax_rows(scores)
        return argmax_rows_torch(scores)

    def greedy_verify(self, scores: torch.Tensor, proposals: torch.Tensor, limit):
        if self.takes(scores):
            return self._greedy_verify(scores, proposals, limit)
        return greedy_verify_torch(scores, proposals, limit)

    def __repr__(self) -> str:
        return f"SelectOps({self.backend})"


SELECT_ENV = "FOLD_HF_TRITON_SELECT"


def select_kernels_enabled() -> bool:
    """Whether greedy selection on CUDA runs the Triton kernels of :mod:`fold_hf.kernels.select.triton` (default
    yes; ``$FOLD_HF_TRITON_SELECT=0`` keeps ``torch.argmax``, for A/B timings)."""
    value = os.environ.get(SELECT_ENV, "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"{SELECT_ENV} must be 0 or 1, got {value!r}")
    return value != "0"


def greedy_select_ops(device: torch.device | str) -> SelectOps:
    """Greedy token selection for logits on ``device``: the Triton kernels of
    :mod:`fold_hf.kernels.select.triton` (two launches, no fp32 copy of the logits needed) on CUDA when they import
    (and neither ``FOLD_HF_DISABLE_TRITON`` is ``1`` nor :data:`SELECT_ENV` ``0``), else the torch path
    (``torch.argmax`` then the prefix match, :mod:`fold_hf.kernels.select.naive`), what the decode loops ran
    before the kernels."""
    return _select_ops(triton_kernels_enabled(device) and select_kernels_enabled())


@functools.lru_cache(maxsize=None)
def _select_ops(triton: bool) -> SelectOps:
    module = import_triton_module("select.triton") if triton else None
    if module is not None:
        return SelectOps("triton", module.argmax_rows_triton, module.greedy_verify_triton)
    return SelectOps("torch")


__all__ = ["HYBRID_OPS", "HYBRID_OP_PACKAGES", "HybridOps", "KERNEL_DTYPES", "LayerOps", "ROWS_KERNELS_ENV",
           "SELECT_ENV", "SKINNY_GEMM_ENV", "SelectOps", "compute_dtype", "decode_attention_reference",
           "default_decode_attention",
           "default_hybrid_ops", "default_layer_ops", "fold_read_geometry_reference", "greedy_select_ops",
           "import_triton_module", "triton_unavailable_reason", "rotate_by_tables", "rotate_half",
           "rows_kernels_enabled", "select_kernels_enabled", "skinny_gemm_enabled", "triton_kernels_enabled"]
