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
targets' decode steps use it: the Llama family's q|k|v and gate|up (:class:`DecodeProjections`), Qwen3.5's
``in_proj_qkv|in_proj_z|in_proj_b|in_proj_a``, q|k|v and gate|up and Gemma's q|k|v (q|k where ``attention_k_eq_v``)
and gate|up (:class:`MergedLinears`, :func:`merged_linears`). The fused layers of every family then run a decode
step's products (1 to ``ops.skinny_rows`` rows) through the skinny GEMMs and any more rows through cuBLAS, by the
same rule (:func:`decode_gemm`, :func:`project`, :func:`gated_mlp`).

A model whose parameters became such views saves as before: transformers' ``save_pretrained`` clones tensors that
share a buffer without overlapping (safetensors itself refuses shared buffers).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import nn

from ..kernels.common import is_sharded
from ..kernels.gemm.cpu import _hooked, linear, linear_module
from .tensor_parallel import all_reduce, column_shard, local, plan_style, relink, row_shard

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
    message = f"a layer runs its input projections (q/k/v, gate/up) as separate modules ({reason})"
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
        # the same storage object (not its data pointer: fake tensors, which the capturability tests run, have none)
        if part.untyped_storage()._cdata != storage._cdata or part.storage_offset() != offset:
            return None
        offset += part.numel()
    rows = sum(p.shape[0] for p in parts)
    return first.new_empty(0).set_(storage, first.storage_offset(), (rows, *first.shape[1:]))


@torch.no_grad()
def concatenated_rows(modules: list[nn.Module], name: str) -> torch.Tensor | None:
    """One buffer holding the modules' ``name`` tensors (``"weight"`` or ``"bias"``) as consecutive row blocks,
    ``[sum(out_features), ...]``; the modules' parameters become views of it. None when the modules have no such
    tensor (no bias). Column-parallel shards (:func:`~fold_hf.targets.tensor_parallel.column_shard`): this rank's rows
    of each, their local parts becoming views of it."""
    params = [getattr(m, name) for m in modules]
    if params[0] is None:
        return None
    parts = [local(p).detach() for p in params]  # a column-parallel shard: this rank's rows
    whole = rows_of_one_buffer(parts)
    if whole is not None:
        return whole
    whole = torch.cat(parts)
    offset = 0
    for param, part in zip(params, parts):
        relink(param, whole[offset:offset + part.shape[0]])
        offset += part.shape[0]
    return whole


def plain_linears_unsupported(named: dict[str, nn.Module], dtype: torch.dtype) -> str | None:
    """Why ``named`` projections cannot be read as one GEMM (None when they can): each must be a plain
    ``nn.Linear`` (a LoRA wrapper or a quantized layer must run as its module) in ``dtype``, with biases on all or
    none."""
    sharded = any(is_sharded(getattr(m, "weight", None)) for m in named.values())
    for name, module in named.items():
        if sharded and not column_shard(module):
            if not is_sharded(getattr(module, "weight", None)):
                return f"{name} is whole beside tensor-parallel shards"
            return (f"{name} is a tensor-parallel shard of style {plan_style(module)} (only colwise shards merge; its "
                    "module's forward does the collectives)")
        if type(module) is not nn.Linear or module.weight.dtype != dtype:
            weight = getattr(module, "weight", None)
            kind = type(module)
            kind = kind.__name__ if kind.__module__.startswith("torch.") else f"{kind.__module__}.{kind.__qualname__}"
            return f"{name} is a {kind} in {getattr(weight, 'dtype', None)}, not a plain torch Linear in {dtype}"
    if len({m.bias is None for m in named.values()}) > 1:
        return f"{', '.join(named)} have biases on some and not others"
    return None


class MergedLinears:
    """Plain ``nn.Linear`` modules that read the same input, as one GEMM over one buffer their parameters are views
    of (:func:`concatenated_rows`: nothing held twice). Column-parallel shards of a tensor-parallel target: this
    rank's rows of each (its share of the heads, of the MLP's features), as their modules return them.

    Attributes:
        weight: ``[sum N_i, K]`` (module ``i``'s ``[N_i, K]`` weight is rows ``sum N_<i .. sum N_<=i``).
        bias: ``[sum N_i]`` or None (no module has a bias).
        widths: ``(N_0, N_1, ...)``, the modules' ``out_features``.
        owners: the parameters whose in-place writes change the buffers (each keeps its own version counter).
        tag: names the packed CPU copy (:func:`fold_hf.kernels.gemm.cpu.linear`).
    """

    __slots__ = ("weight", "bias", "widths", "owners", "tag")

    def __init__(self, modules: list[nn.Module], tag: str) -> None:
        self.weight = concatenated_rows(modules, "weight")
        self.bias = concatenated_rows(modules, "bias")
        self.widths = tuple(local(m.weight).shape[0] for m in modules)
        self.owners = tuple(p for m in modules for p in (m.weight, m.bias) if p is not None)
        self.tag = tag

    def product(self, hidden: torch.Tensor, gemm=None) -> torch.Tensor:
        """``hidden [..., K]`` -> ``[..., sum N_i]``: ``gemm(hidden, weight, bias)`` when given (a decode step's skinny
        GEMM), else :func:`fold_hf.kernels.gemm.cpu.linear` (several CPU rows: a packed GEMM)."""
        if gemm is not None:
            return gemm(hidden, self.weight, self.bias)
        return linear(hidden, self.weight, self.bias, owners=self.owners, tag=self.tag)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A product ``[..., sum N_i]`` as views ``([..., N_0], [..., N_1], ...)`` (rows strided, read in place)."""
        parts, start = [], 0
        for width in self.widths:
            parts.append(out[..., start : start + width])
            start += width
        return tuple(parts)

    def __call__(self, hidden: torch.Tensor, gemm=None) -> tuple[torch.Tensor, ...]:
        """``hidden [..., K]`` -> every module's output ``[..., N_i]``, views of one :meth:`product`."""
        return self.split(self.product(hidden, gemm))


class DecodeProjections:
    """A Llama-style layer's q|k|v and gate|up as single GEMMs (two :class:`MergedLinears`).

    Attributes:
        qkv_weight: ``[(Hq + 2 Hkv) D, H]``; ``qkv_bias`` the same rows' bias or None.
        gate_up_weight: ``[2 I, H]``; ``gate_up_bias`` or None.
    """

    __slots__ = ("qkv_merged", "gate_up_merged", "qkv_weight", "qkv_bias", "gate_up_weight", "gate_up_bias")

    def __init__(self, attn: nn.Module, mlp: nn.Module) -> None:
        self.qkv_merged = MergedLinears([attn.q_proj, attn.k_proj, attn.v_proj], "qkv")
        self.gate_up_merged = MergedLinears([mlp.gate_proj, mlp.up_proj], "gate_up")
        self.qkv_weight, self.qkv_bias = self.qkv_merged.weight, self.qkv_merged.bias
        self.gate_up_weight, self.gate_up_bias = self.gate_up_merged.weight, self.gate_up_merged.bias

    def qkv(self, hidden: torch.Tensor, gemm=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``hidden [..., H]`` -> views ``(q [..., Hq D], k [..., Hkv D], v [..., Hkv D])`` of one GEMM's output
        (:meth:`MergedLinears.product`)."""
        return self.qkv_merged(hidden, gemm)

    def split_qkv(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A q|k|v product ``[..., (Hq + 2 Hkv) D]`` as views ``(q, k, v)``."""
        return self.qkv_merged.split(out)

    def gate_up(self, hidden: torch.Tensor, gemm=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``hidden [..., H]`` -> views ``(gate [..., I], up [..., I])`` of one GEMM's output."""
        return self.gate_up_merged(hidden, gemm)


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


def merged_linears(named: dict[str, nn.Module], dtype: torch.dtype, tag: str) -> MergedLinears | None:
    """``named`` projections (in this order) as one :class:`MergedLinears`, or None when they cannot be
    (:func:`plain_linears_unsupported`: a LoRA wrapper, a quantized layer, a shard, another dtype; warned once,
    naming why, and the layer then runs them as modules) or ``$FOLD_HF_CONCAT_PROJECTIONS=0``."""
    if not concat_projections_enabled():
        return None
    reason = plain_linears_unsupported(named, dtype)
    if reason is not None:
        warn_separate_once(f"static target: {reason}")
        return None
    return MergedLinears(list(named.values()), tag)


def gemm_unsupported(module: nn.Module, dtype: torch.dtype, name: str) -> str | None:
    """Why :func:`project` runs ``module`` (named ``name``) as its module rather than through a GEMM kernel (None
    when the kernel takes it); the Llama family's exact mode refuses a target for which this is not None."""
    if type(module) is not nn.Linear:
        return f"{name} is a {type(module).__name__}, not a plain nn.Linear (LoRA and quantized layers run as modules)"
    if is_sharded(module.weight) and not (column_shard(module) or row_shard(module)):
        return f"{name} is a tensor-parallel shard of style {plan_style(module)} (its module's forward does the collectives)"
    if module.weight.dtype != dtype or not local(module.weight).is_contiguous():
        return f"{name}'s weight is not a contiguous {dtype} tensor"
    if _hooked(module):
        return f"{name} has forward hooks"
    return None


def project(gemm, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` for ``x [..., K]`` -> ``[..., N]``: through ``gemm(x, weight, bias)`` (a decode step's skinny
    GEMM) when given and ``module`` is a plain, hook-free ``nn.Linear`` with a contiguous weight in ``x``'s dtype;
    else :func:`~fold_hf.kernels.gemm.cpu.linear_module` (a LoRA wrapper or a quantized layer runs as its module).

    A tensor-parallel shard that :func:`gemm_unsupported` takes runs on this rank's weight: a column-parallel one
    returns this rank's share of the output, a row-parallel one (``x``: this rank's share of the input features) the
    sum over the ranks (one all-reduce) plus its bias, as their modules do."""
    if is_sharded(getattr(module, "weight", None)) and gemm_unsupported(module, x.dtype, "") is None:
        weight, bias = local(module.weight), local(module.bias)
        product = gemm if gemm is not None else nn.functional.linear
        if column_shard(module):
            return product(x, weight, bias)
        out = all_reduce(product(x, weight, None), module.weight)
        return out if bias is None else out + bias
    if gemm is not None and gemm_unsupported(module, x.dtype, "") is None:
        return gemm(x, module.weight, module.bias)
    return linear_module(module, x)


def decode_gemm(ops, rows: int, exact: bool = False):
    """The GEMM a fused layer's projections of ``rows`` rows run through: ``ops.skinny_linear`` (a
    :class:`~fold_hf.kernels.LayerOps`) for a decode step's 1 to ``ops.skinny_rows`` rows (an AR step, a verify
    block; any row count in exact mode), None (cuBLAS / the modules) for more rows (a prefill chunk, a wide batch)
    or where the ops have no skinny GEMMs (the CPU path, ``$FOLD_HF_SKINNY_GEMM=0``)."""
    if ops.skinny_linear is None or not (exact or rows <= ops.skinny_rows):
        return None
    return ops.skinny_linear


def gated_mlp(mlp: nn.Module, normed: torch.Tensor, gate_up: MergedLinears | None, gemm, act_mul,
              fused_act=None) -> torch.Tensor:
    """``down_proj(act(gate_proj(x)) * up_proj(x))`` of ``normed [..., H]`` -> ``[..., H]``: gate|up as one GEMM
    when ``gate_up`` is given (else the modules); ``fused_act(x, gate_up_weight, gate_up_bias)`` (the skinny gate|up
    GEMM ending in the SiLU-and-multiply, ``ops.gate_up_silu``) when given with ``gemm``, else ``act_mul(gate, up)``
    over the product's halves read in place; ``down_proj`` through :func:`project`."""
    if gate_up is not None and gemm is not None and fused_act is not None:
        act = fused_act(normed, gate_up.weight, gate_up.bias)
    else:
        gate, up = gate_up(normed, gemm) if gate_up is not None else (mlp.gate_proj(normed), mlp.up_proj(normed))
        act = act_mul(gate, up)
    return project(gemm, mlp.down_proj, act)


__all__ = ["CONCAT_ENV", "warn_separate_once", "DecodeProjections", "MergedLinears", "concat_projections_enabled",
           "concatenated_rows", "decode_gemm", "decode_projections", "decode_projections_unsupported", "gated_mlp",
           "gemm_unsupported", "merged_linears", "plain_linears_unsupported", "project", "rows_of_one_buffer"]
