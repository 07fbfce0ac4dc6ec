"""Weights laid out for decode: projections that read the same input concatenated into one GEMM.

At batch 1 a decode step's small projections are latency-bound (on an H200 at the Llama-3.1-8B shape ``k_proj`` and
``v_proj`` reach 0.17 of their weight-read floor; q|k|v concatenated costs about half of q, k and v apart, gate|up
about 0.8 of gate and up apart: ``benchmarks/results/2026-11-30-nvidia-h200-single-load-merge/first_run/gemm_bench``).
:func:`concatenated_rows` puts the weights (or biases) of several ``nn.Linear`` modules into one buffer as
consecutive row blocks and points each module's parameter at its block, so nothing is held twice and writes through
the modules (``load_state_dict``, training, in-place edits) reach the buffer the fused GEMM reads. A second call finds
the parameters laid out so and returns a view of the same buffer; after ``.to()`` (every parameter gets a buffer of
its own) it concatenates them again.

Family-free: the drafter's fused step (:func:`fold_hf.generation.static_drafter.fused_projections`) and the static
target's decode steps (:meth:`fold_hf.targets.llama.LlamaStaticTarget.decode_projections`) both use it; any
target family whose layers have q/k/v and gate/up projections can (:func:`decode_projections`).

A model whose parameters became such views saves as before: transformers' ``save_pretrained`` clones tensors that
share a buffer without overlapping (safetensors itself refuses shared buffers).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import nn

from ..kernels.common import is_sharded
from ..kernels.gemm.cpu import linear

CONCAT_ENV = "FOLD_HF_CONCAT_PROJECTIONS"


def concat_projections_enabled() -> bool:
    """Whether the static target's decode steps read q|k|v and gate|up as one GEMM each (default yes;
    ``$FOLD_HF_CONCAT_PROJECTIONS=0`` keeps the module calls, for A/B timings)."""
    value = os.environ.get(CONCAT_ENV, "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"{CONCAT_ENV} must be 0 or 1, got {value!r}")
    return value != "0"


_WARNED: set[str] = set()


def warn_separate_once(reason: str) -> None:
    """A UserWarning, once per process and reason, that a layer runs its projections as separate modules."""
    message = f"a layer runs q/k/v and gate/up as separate modules ({reason})"
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def rows_of_one_buffer(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The ``[sum(rows), ...]`` tensor whose consecutive row blocks ``parts`` are (one storage, contiguous, no
    gaps), or None when they are not laid out so."""
    first = parts[0]
    if not all(p.is_contiguous() and p.dtype == first.dtype and p.device == first.device
               and p.shape[1:] == first.shape[1:] for p in parts):
        return None
    storage = first.untyped_storage()
    offset = first.storage_offset()
    for part in parts:
        if part.untyped_storage().data_ptr() != storage.data_ptr() or part.storage_offset() != offset:
            return None
        offset += part.numel()
    rows = sum(p.shape[0] for p in parts)
    return first.new_empty(0).set_(storage, first.storage_offset(), (rows, *first.shape[1:]))


@torch.no_grad()
def concatenated_rows(modules: list[nn.Module], name: str) -> torch.Tensor | None:
    """One buffer holding the modules' ``name`` tensors (``"weight"`` or ``"bias"``) as consecutive row blocks,
    ``[sum(out_features), ...]``; the modules' parameters become views of it. None when the modules have no such
    tensor (no bias)."""
    params = [getattr(m, name) for m in modules]
    if params[0] is None:
        return None
    whole = rows_of_one_buffer([p.data for p in params])
    if whole is not None:
        return whole
    whole = torch.cat([p.data for p in params])
    offset = 0
    for param in params:
        param.data = whole[offset:offset + param.shape[0]]
        offset += param.shape[0]
    return whole


def plain_linears_unsupported(named: dict[str, nn.Module], dtype: torch.dtype) -> str | None:
    """Why ``named`` projections cannot be read as one GEMM (None when they can): each must be a plain
    ``nn.Linear`` (a LoRA wrapper or a quantized layer must run as its module) in ``dtype``, with biases on all or
    none."""
    for name, module in named.items():
        if is_sharded(getattr(module, "weight", None)):
            return f"{name} is a tensor-parallel shard (its module's forward does the collectives)"
        if type(module) is not nn.Linear or module.weight.dtype != dtype:
            weight = getattr(module, "weight", None)
            kind = type(module)
            kind = kind.__name__ if kind.__module__.startswith("torch.") else f"{kind.__module__}.{kind.__qualname__}"
            return f"{name} is a {kind} in {getattr(weight, 'dtype', None)}, not a plain torch Linear in {dtype}"
    if len({m.bias is None for m in named.values()}) > 1:
        return f"{', '.join(named)} have biases on some and not others"
    return None


class DecodeProjections:
    """A layer's q|k|v and gate|up as single GEMMs (views of the concatenated buffers; see the module docstring).

    Attributes:
        qkv_weight: ``[(Hq + 2 Hkv) D, H]``; ``qkv_bias`` the same rows' bias or None.
        gate_up_weight: ``[2 I, H]``; ``gate_up_bias`` or None.
        q_width, kv_width: output columns of q and of k (= of v).
    """

    __slots__ = ("qkv_weight", "qkv_bias", "gate_up_weight", "gate_up_bias", "q_width", "kv_width", "qkv_owners",
                 "gate_up_owners")

    def __init__(self, attn: nn.Module, mlp: nn.Module) -> None:
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.qkv_weight = concatenated_rows(projections, "weight")
        self.qkv_bias = concatenated_rows(projections, "bias")
        self.gate_up_weight = concatenated_rows([mlp.gate_proj, mlp.up_proj], "weight")
        self.gate_up_bias = concatenated_rows([mlp.gate_proj, mlp.up_proj], "bias")
        self.q_width, self.kv_width = attn.q_proj.out_features, attn.k_proj.out_features
        # whose in-place writes change the buffers (each parameter keeps its own version counter)
        self.qkv_owners = tuple(p for m in projections for p in (m.weight, m.bias) if p is not None)
        self.gate_up_owners = tuple(p for m in (mlp.gate_proj, mlp.up_proj) for p in (m.weight, m.bias)
                                    if p is not None)

    def qkv(self, hidden: torch.Tensor, gemm=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``hidden [..., H]`` -> views ``(q [..., Hq D], k [..., Hkv D], v [..., Hkv D])`` of one GEMM's output:
        ``gemm(hidden, weight, bias)`` when given (a decode step's skinny GEMM), else
        :func:`fold_hf.kernels.gemm.cpu.linear` (several CPU rows: MKL's packed GEMM)."""
        if gemm is not None:
            out = gemm(hidden, self.qkv_weight, self.qkv_bias)
        else:
            out = linear(hidden, self.qkv_weight, self.qkv_bias, owners=self.qkv_owners, tag="qkv")
        return self.split_qkv(out)

    def split_qkv(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A q|k|v product ``[..., (Hq + 2 Hkv) D]`` as views ``(q, k, v)``."""
        q_end, k_end = self.q_width, self.q_width + self.kv_width
        return out[..., :q_end], out[..., q_end:k_end], out[..., k_end:]

    def gate_up(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden [..., H]`` -> views ``(gate [..., I], up [..., I])`` of one GEMM's output."""
        return linear(hidden, self.gate_up_weight, self.gate_up_bias, owners=self.gate_up_owners,
                      tag="gate_up").chunk(2, -1)


def decode_projections_unsupported(attn: nn.Module, mlp: nn.Module, dtype: torch.dtype) -> str | None:
    """Why :class:`DecodeProjections` cannot take this layer (None when it can)."""
    named = {}
    for owner, names in ((attn, ("q_proj", "k_proj", "v_proj")), (mlp, ("gate_proj", "up_proj"))):
        for name in names:
            module = getattr(owner, name, None)
            if module is None:
                return f"no {name}"
            named[name] = module
    reason = plain_linears_unsupported({k: named[k] for k in ("q_proj", "k_proj", "v_proj")}, dtype)
    if reason is None:
        reason = plain_linears_unsupported({k: named[k] for k in ("gate_proj", "up_proj")}, dtype)
    if reason is None and named["k_proj"].out_features != named["v_proj"].out_features:
        reason = "k_proj and v_proj differ in width"
    return reason


def decode_projections(attn: nn.Module, mlp: nn.Module, dtype: torch.dtype) -> DecodeProjections | None:
    """:class:`DecodeProjections` of a layer whose projections allow it, else None
    (:func:`decode_projections_unsupported` says why)."""
    if decode_projections_unsupported(attn, mlp, dtype) is not None:
        return None
    return DecodeProjections(attn, mlp)


__all__ = ["CONCAT_ENV", "warn_separate_once", "DecodeProjections", "concat_projections_enabled", "concatenated_rows",
           "decode_projections", "decode_projections_unsupported", "plain_linears_unsupported",
           "rows_of_one_buffer"]
