"""Programmatic dependent launch (PDL) for the decode chain's Triton kernels.

Why: a decode step at batch 1 is ~310 launches in a CUDA graph (Llama-3.1-8B shape), and between two of them the GPU
drains: the last programs of one kernel finish and flush their writes before the next kernel's programs are launched.
On Hopper a kernel launched with PDL may be launched before its predecessor has completed; its programs then block in
``griddepcontrol.wait`` (:func:`pdl_enter`, the first thing every kernel here does) until the predecessor has
completed and its writes are visible. Nothing is read or written before the wait, so the stream's order is what it
was without PDL, transitively: a kernel completes only after its own wait, i.e. after its predecessor completed.
Kernels launched without PDL (cuBLAS, torch's) keep the full dependency on either side.

Where the successor may launch (``$FOLD_HF_PDL_MODE``, :data:`MODES`) was measured on an H200 with
``benchmarks/pdl_chain_bench.py`` (32 layers of the 8B chain at 32K in one graph; the run is in
``benchmarks/results/2026-12-02-nvidia-h200-pdl``): ``at_exit`` (no explicit trigger: the successor launches as
the predecessor's programs exit, overlapping its write flush and the launch) 5.149 ms against 5.180 without PDL;
an explicit ``griddepcontrol.launch_dependents`` after the wait (``after_wait``) 6.086 ms and before it
(``before_wait``) 6.645 ms: the more kernels sit resident waiting, the slower the chain. So the default is
``at_exit``; the others stay for that benchmark. An L2 prefetch of the first weight tiles before the wait was
slower still in every budget tried (same run), and is not kept.

Only launches inside :func:`fold_hf.kernels.common.pdl_scope` take PDL: the fused target layers of every family open
it for an AR step's one token (1.0% faster at 32K on the H200 for Llama; the Qwen3.5 and Gemma kernels, which take it
too, 0.6-0.7% on an H100), not for a speculative round's drafter and verify blocks (the
round measured 0.8-1.2% slower with PDL on its launches, same run). ``$FOLD_HF_PDL=0`` launches every kernel without
PDL (A/B timings). Triton's interpreter has no grid-dependency ops:
there the kernels take ``PDL=0`` and plain launches. Imported only when Triton is usable.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import in_pdl_scope

PDL_ENV = "FOLD_HF_PDL"
MODE_ENV = "FOLD_HF_PDL_MODE"  # benchmarks: where a kernel lets its successor launch (see pdl_enter)
MODES = {"after_wait": 1, "at_exit": 2, "before_wait": 3}


@functools.lru_cache(maxsize=None)
def _device_supports_pdl(index: int) -> bool:
    if torch.cuda.get_device_capability(index)[0] < 9:  # griddepcontrol is sm_90 and later
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError as error:
        reason = f"this Triton has no NVIDIA backend options ({error})"
    else:
        if "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {}):
            return True
        reason = "this Triton's launcher takes no launch_pdl"
    warnings.warn(f"fold_hf: kernels launch without programmatic dependent launch on this sm_90+ device: {reason}",
                  UserWarning, stacklevel=3)
    return False


def pdl_enabled(device: torch.device | str) -> bool:
    """Whether kernels on ``device`` launch with PDL: a CUDA device of compute capability 9 or later, a Triton whose
    launcher takes ``launch_pdl``, not Triton's interpreter, and ``$FOLD_HF_PDL`` not ``0``."""
    value = os.environ.get(PDL_ENV, "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"{PDL_ENV} must be 0 or 1, got {value!r}")
    device = torch.device(device)
    if value == "0" or device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _device_supports_pdl(device.index if device.index is not None else torch.cuda.current_device())


def pdl_mode() -> int:
    """The ``PDL`` constexpr of a launch with PDL on (:func:`pdl_enter`): ``$FOLD_HF_PDL_MODE`` of :data:`MODES`
    (default ``at_exit``, the fastest in the chain benchmark)."""
    name = os.environ.get(MODE_ENV) or "at_exit"
    if name not in MODES:
        raise ValueError(f"{MODE_ENV} must be one of {sorted(MODES)}, got {name!r}")
    return MODES[name]


def launch_options(device: torch.device | str) -> dict:
    """Keyword arguments for a kernel launch taking a ``PDL`` constexpr: ``PDL`` (0 off, else :func:`pdl_mode`)
    and, when on, ``launch_pdl``. On only inside :func:`fold_hf.kernels.common.pdl_scope` (an AR step's fused
    target layers) and where :func:`pdl_enabled`."""
    if in_pdl_scope() and pdl_enabled(device):
        return {"PDL": pdl_mode(), "launch_pdl": True}
    return {"PDL": 0}


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Wait for the predecessor kernel (its writes visible) and say when the successor may launch: as this kernel's
    programs exit (``PDL`` 2, no explicit trigger), after the wait (1) or before it (3). A no-op for 0 (no PDL).
    Each keeps the stream's order for everything after the wait: a kernel completes only after its own wait."""
    if PDL == 1:
        gdc_wait()
        gdc_launch_dependents()
    elif PDL == 2:
        gdc_wait()
    elif PDL == 3:
        gdc_launch_dependents()
        gdc_wait()


__all__ = ["MODES", "MODE_ENV", "PDL_ENV", "launch_options", "pdl_enabled", "pdl_enter", "pdl_mode"]
