"""Multi-row linear layers on a CPU through a packed GEMM (oneDNN's or MKL's), beside their reference ``F.linear``.

Why: a speculative round's verify runs the target on ``B`` rows (the last token and ``B - 1`` drafts) and the
drafter's proposals run the target's ``lm_head`` on ``B - 1`` rows. On a CPU, ``F.linear`` with 4 to 16 rows
reaches a fraction of the cores' FMA rate (the 2-core CI machine, SmolLM2-135M's projections in fp32: 8 rows cost
2.4x one row, 47 vs 20 ms over the model's weights), while the same product over weights MKL has packed once
costs 1.5x (30 ms). One row gains nothing (memory-bound either way), so a single-row call (an AR step) and a
prefill chunk (hundreds of rows, where ``F.linear`` is the faster) run ``F.linear``. Measured numbers and the
profile: ``docs/fast-path.md`` (On a CPU).

Two packed backends (``$FOLD_HF_CPU_GEMM_BACKEND``: ``auto``, ``onednn``, ``mkl``): MKL's packed sgemm
(``torch.ops.mkl._mkl_reorder_linear_weight`` / ``_mkl_linear``, the ops torch.compile's CPU freezing uses) and
oneDNN's (``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, its JIT kernels). ``auto`` takes MKL on
Intel CPUs (where the numbers above were measured) and oneDNN elsewhere: MKL does not run its tuned kernels on other
vendors' CPUs, and on the 2-core AMD EPYC machine of 2026-12-07 (AVX2) MKL's product of 8 rows over SmolLM2's
``lm_head`` took 25.7 ms (``F.linear`` 27.0, one row 9.9) against oneDNN's 8.7, and a 1536 x 576 projection 0.27 ms
against 0.15 (``docs/fast-path.md``). oneDNN's product of 2 rows costs about one row's there, so it packs from
:data:`ONEDNN_MIN_ROWS` rows, MKL from :data:`MIN_ROWS`.

The packed copy is the backend's opaque layout of the weight, a second copy of it, cached under the
``nn.Parameter`` (or the parameters) whose values the weight holds, per backend, and checked against their version
counters and the weight's data pointer on every call: an in-place write (``load_state_dict``, training, a LoRA
merge) or a new buffer (``.to()``) repacks, never a stale read. The total packed bytes are capped
(:func:`packed_budget_bytes`); past the cap, or with neither backend in the build (an ARM build), calls run
``F.linear`` and say so once.

``$FOLD_HF_CPU_PACKED_GEMM``: ``auto`` (default: packed while the copies stay within a quarter of the machine's
RAM), ``1`` (no cap), ``0`` (never: plain ``F.linear``, for A/B timings).
``$FOLD_HF_CPU_GEMM_BACKEND``: ``auto`` (default, above), ``onednn`` or ``mkl`` (for A/B timings; a backend this torch
build lacks is refused with the reason).

Shapes: ``x [..., K]``, ``weight [N, K]``, ``bias [N]`` or None -> ``[..., N]``, as ``F.linear``.
"""

from __future__ import annotations

import functools
import os
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from ..common import is_sharded

PACKED_ENV = "FOLD_HF_CPU_PACKED_GEMM"
BACKEND_ENV = "FOLD_HF_CPU_GEMM_BACKEND"
# F.linear's products of 4 to ~16 rows are slow on MKL (8 rows: 3x the time of 3 rows over one hot weight); packed
# products win from 4 rows to ~32 and lose beyond (a prefill chunk runs F.linear). PACK_ROWS: MKL's row-count hint.
MIN_ROWS, MAX_ROWS, PACK_ROWS = 4, 32, 32
LABELS = {"onednn": "oneDNN", "mkl": "MKL"}
ONEDNN_MIN_ROWS, ONEDNN_PACK_ROWS = 2, 8  # oneDNN: 2 rows cost about one row's time (its JIT kernels), pack hint 8
_DTYPES = (torch.float32,)  # fp32 packed products; bf16/fp16 weights run F.linear

# owner parameter -> {tag: (data_ptr, shape, version, packed)}
_PACKED = WeakIdKeyDictionary()  # keyed by identity (a tensor's == is elementwise)
_state = {"bytes": 0, "warned": set(), "broken": None}


def packed_gemm_mode() -> str:
    """``auto``, ``1`` or ``0`` from ``$FOLD_HF_CPU_PACKED_GEMM`` (ValueError on anything else)."""
    value = os.environ.get(PACKED_ENV, "auto") or "auto"
    if value not in ("auto", "0", "1"):
        raise ValueError(f"{PACKED_ENV} must be auto, 0 or 1, got {value!r}")
    return value


@functools.cache
def mkl_packed_available() -> bool:
    """True when this torch build has MKL's packed linear ops (x86 builds with MKL)."""
    return bool(getattr(torch._C, "has_mkl", False)) and hasattr(torch.ops.mkl, "_mkl_linear")


@functools.cache
def onednn_packed_available() -> bool:
    """True when this torch build has oneDNN's packed linear ops (``torch.ops.mkldnn._linear_pointwise``)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor id from ``/proc/cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``, ...; ``""`` when unknown)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def packed_backend() -> str | None:
    """``"onednn"``, ``"mkl"`` or None (neither in this build) from ``$FOLD_HF_CPU_GEMM_BACKEND``: ``auto`` takes MKL on
    Intel CPUs and oneDNN on the others (the module docstring says why), each where this build has it."""
    value = os.environ.get(BACKEND_ENV, "auto") or "auto"
    have = {"onednn": onednn_packed_available(), "mkl": mkl_packed_available()}
    if value in have:
        if not have[value]:
            raise ValueError(f"{BACKEND_ENV}={value}: this torch build has no {value} packed linear")
        return value
    if value != "auto":
        raise ValueError(f"{BACKEND_ENV} must be auto, onednn or mkl, got {value!r}")
    order = ("mkl", "onednn") if cpu_vendor() == "GenuineIntel" else ("onednn", "mkl")
    return next((name for name in order if have[name]), None)


def min_rows(backend: str | None = None) -> int:
    """The fewest rows a product runs packed with ``backend`` (default: :func:`packed_backend`)."""
    return ONEDNN_MIN_ROWS if (backend or packed_backend()) == "onednn" else MIN_ROWS


def packed_budget_bytes() -> int | None:
    """The most bytes the packed copies may take in ``auto`` mode (a quarter of physical RAM), None for no cap."""
    if packed_gemm_mode() == "1":
        return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def packed_bytes() -> int:
    """Bytes held by the packed copies made so far in this process (live or not yet collected)."""
    return _state["bytes"]


def _warn_once(reason: str) -> None:
    message = f"multi-row CPU linears run F.linear, not a packed GEMM: {reason}"
    if message not in _state["warned"]:
        _state["warned"].add(message)
        warnings.warn(message, UserWarning, stacklevel=4)


def _packed_backend_for(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """The backend :func:`linear` runs ``x @ weight.T`` with, or None for ``F.linear``: a CPU fp32 product of
    :func:`min_rows` (2 with oneDNN, 4 with MKL) to :data:`MAX_ROWS` rows, without autograd, the mode not ``0``, a
    packed backend present (the environment is read once per product, after the cheap checks)."""
    if x.device.type != "cpu" or weight.device.type != "cpu" or x.dtype not in _DTYPES or weight.dtype != x.dtype:
        return None
    if x.dim() == 0 or weight.dim() != 2 or not ONEDNN_MIN_ROWS * x.shape[-1] <= x.numel() <= MAX_ROWS * x.shape[-1]:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return None
    if packed_gemm_mode() == "0":
        return None
    backend = packed_backend()
    if backend is None:
        _warn_once("this torch build has neither oneDNN's nor MKL's packed linear (an ARM build?)")
        return None
    if x.numel() < min_rows(backend) * x.shape[-1]:
        return None
    if _state["broken"] is not None:  # a private op failed once: said then, F.linear from then on
        return None
    return backend


def packed_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`linear` would run ``x @ weight.T`` packed (:func:`_packed_backend_for` names a backend)."""
    return _packed_backend_for(x, weight) is not None


def pack(weight: torch.Tensor, rows: int | None = None, backend: str = "mkl") -> torch.Tensor:
    """``backend``'s packed copy of ``weight [N, K]`` (fp32, CPU) for products of about ``rows`` rows (default: the
    backend's hint)."""
    if backend == "onednn":
        return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), int(rows or ONEDNN_PACK_ROWS))
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), int(rows or PACK_ROWS))


def packed_product(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   backend: str) -> torch.Tensor:
    """``x [..., K]`` times ``backend``'s packed copy of ``weight [N, K]`` (+ ``bias [N]``) -> ``[..., N]``."""
    if backend == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return torch.ops.mkl._mkl_linear(x, packed, weight, bias, x.numel() // x.shape[-1])


def packed_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The rule :func:`linear` computes: ``F.linear``."""
    return F.linear(x, weight, bias)


def _packed_for(owners: tuple, tag: str, weight: torch.Tensor, backend: str) -> torch.Tensor | None:
    """The cached ``backend`` copy of ``weight`` (made under ``owners[0]``'s ``tag``), or None past the byte budget."""
    entries = _PACKED.get(owners[0], {})
    tag = f"{tag}@{backend}"
    key = (weight.data_ptr(), tuple(weight.shape), weight.stride(), tuple(id(o) for o in owners),
           tuple(o._version for o in owners))
    entry = entries.get(tag)
    if entry is not None and entry[0] == key:
        return entry[1]
    size = weight.numel() * weight.element_size()
    budget = packed_budget_bytes()
    if entry is not None:  # a stale copy: repacked below, its bytes freed
        _state["bytes"] -= entry[2]
        del entries[tag]
    if budget is not None and _state["bytes"] + size > budget:
        _warn_once(f"the packed copies would exceed {budget / 2**30:.1f} GiB, a quarter of this machine's RAM "
                   f"(set {PACKED_ENV}=1 to lift the cap, 0 to silence this)")
        return None
    packed = pack(weight, backend=backend)
    entries[tag] = (key, packed, size)
    _PACKED[owners[0]] = entries
    _state["bytes"] += size
    weakref.finalize(packed, _release, size)
    return packed


def _release(size: int) -> None:
    _state["bytes"] = max(0, _state["bytes"] - size)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           owners: tuple = (), tag: str = "") -> torch.Tensor:
    """``F.linear(x, weight, bias)``; a multi-row CPU fp32 product (:func:`packed_applies`) runs a packed GEMM
    (:func:`packed_backend`) over a copy of ``weight`` cached under ``owners[0]`` (default: ``weight`` itself, which
    must then be the parameter) and ``tag``, repacked when any owner's version or ``weight``'s buffer changes.

    Args:
        x: ``[..., K]``.
        weight: ``[N, K]``.
        bias: ``[N]`` or None.
        owners: the parameters whose in-place writes change ``weight`` (each one's version counter is checked:
            a concatenated q|k|v buffer passes q's, k's and v's weights, whose counters are separate); empty:
            ``(weight,)``.
        tag: names ``weight`` among the packed copies of ``owners[0]`` (q|k|v, gate|up).

    Returns:
        ``[..., N]`` in ``x.dtype``.
    """
    backend = _packed_backend_for(x, weight)
    if backend is None:
        return F.linear(x, weight, bias)
    return _packed_linear(x, weight, bias, owners, tag, backend)


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, owners: tuple, tag: str,
                   backend: str) -> torch.Tensor:
    """:func:`linear` once ``backend`` is chosen: the cached packed copy's product, or ``F.linear`` past the byte
    budget or when the private ops fail (said once)."""
    try:
        packed = _packed_for(tuple(owners) or (weight,), tag, weight, backend)
        if packed is None:
            return F.linear(x, weight, bias)
        return packed_product(x, packed, weight, bias, backend)
    except (RuntimeError, AttributeError, TypeError) as error:
        # the packed ops are private to torch: a build that changed them runs F.linear, said once
        _state["broken"] = f"{type(error).__name__}: {error}"
        _warn_once(f"{LABELS[backend]}'s private packed ops failed on this torch {torch.__version__} "
                   f"({_state['broken']})")
        return F.linear(x, weight, bias)


def _hooked(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` does more than its ``forward``: forward (pre-)hooks of its own or global ones, or
    accelerate's hook (an offloaded ``device_map`` weight is loaded by it)."""
    from torch.nn.modules import module as module_mod

    return bool(module._forward_hooks or module._forward_pre_hooks or getattr(module, "_hf_hook", None) is not None
                or module_mod._global_forward_hooks or module_mod._global_forward_pre_hooks)


def linear_module(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``; a plain, hook-free ``nn.Linear`` whose product :func:`packed_applies` to runs a packed GEMM
    (a LoRA wrapper, a quantized layer, a hooked or offloaded module, a tensor-parallel shard always runs as
    itself)."""
    if type(module) is torch.nn.Linear and not is_sharded(module.weight):
        backend = _packed_backend_for(x, module.weight)
        if backend is not None and not _hooked(module):
            return _packed_linear(x, module.weight, module.bias, (), "", backend)
    return module(x)


__all__ = ["BACKEND_ENV", "MAX_ROWS", "MIN_ROWS", "ONEDNN_MIN_ROWS", "PACK_ROWS", "PACKED_ENV", "cpu_vendor", "linear",
           "linear_module", "min_rows", "mkl_packed_available", "onednn_packed_available", "pack", "packed_applies",
           "packed_backend", "packed_product", "packed_budget_bytes", "packed_bytes", "packed_gemm_mode", "packed_linear_reference"]
