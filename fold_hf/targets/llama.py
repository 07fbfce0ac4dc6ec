"""The Llama-style target family on the fast loop: Llama (SmolLM2 included), Mistral, Qwen2, Qwen3.

:class:`LlamaStaticTarget` is :class:`~fold_hf.targets.base.StaticTarget` over the model's embedding, RMSNorms,
q/k/v/o projections, q/k norms where the model has them (Qwen3), MLP, final norm and lm_head; on top of the base:

* Fused layers (``fused=True`` with ``attention="triton"``): the norms' residual adds, the rope with the cache
  write and the MLP's ``silu(gate) * up`` run as three fused launches (:mod:`fold_hf.kernels.layer.triton`,
  torch twins off CUDA) instead of ~30 small module kernels per layer; projections stay the model's modules
  (PEFT included). Llama-style RMSNorm, SiLU MLP and full rotary only (:meth:`LlamaStaticTarget.fused_unsupported`).
  On CUDA the prefill chunks run through them too (``$FOLD_HF_FUSED_PREFILL=0`` turns that off).
* Projections laid out for decode (every forward, default on; ``$FOLD_HF_CONCAT_PROJECTIONS=0`` turns it off): q|k|v
  and gate|up run as one GEMM each over buffers the model's own q/k/v and gate/up parameters become views of
  (:mod:`fold_hf.targets.weight_layout`: nothing held twice, writes through the modules reach them). A layer
  whose projections are not plain ``nn.Linear`` in the model dtype (LoRA, quantized) runs them as modules, with a
  warning naming why (:meth:`LlamaStaticTarget.decode_projections`). On CUDA a decode step's projections (1 to 16
  rows) in the fused layers run the skinny Triton GEMMs of :mod:`fold_hf.kernels.gemm.triton` where they measured
  faster than cuBLAS (gate|up with ``silu(gate) * up`` in the same launch); ``$FOLD_HF_SKINNY_GEMM=0`` keeps cuBLAS.
  The rule and the helpers (``decode_gemm``, ``project``, ``gated_mlp``) are family-free in
  :mod:`fold_hf.targets.weight_layout`; the Qwen3.5 and Gemma fused layers use them too.
  An AR step's Triton launches there use programmatic dependent launch (:mod:`fold_hf.kernels.triton_pdl`;
  ``$FOLD_HF_PDL=0`` turns it off).
* Exact mode (:meth:`LlamaStaticTarget.exact_unsupported`, docs/exact-mode.md): a decode / verify step's fused
  layers run :func:`~fold_hf.kernels.exact.exact_layer_ops` (every projection and the lm_head through the exact GEMM,
  for any number of rows) and :func:`~fold_hf.kernels.exact.exact_decode_attention`; the prefill is unchanged.

Tensor parallelism (transformers' ``tp_plan``, :mod:`fold_hf.targets.tensor_parallel`): each rank's runner holds its
own KV heads and calls the sharded modules; the fused layers do not take shards (:meth:`fused_unsupported` says so).

Supported: :data:`ARCHITECTURES`, without sliding-window layers shorter than the capacity and without
position-dependent rope (``dynamic``, ``longrope``). Anything else raises
:class:`~fold_hf.targets.base.UnsupportedTarget` naming why (:func:`check`).
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

from ..compat import has_norm_epsilon, norm_epsilon
from ..kernels.gemm.cpu import linear_module
from .base import StaticTarget, UnsupportedTarget
from .common import tap_writer
from .taps import _unwrap
from .weight_layout import (
    DecodeProjections,
    concat_projections_enabled,
    decode_gemm,
    decode_projections_unsupported,
    gated_mlp,
    gemm_unsupported,
    project,
    warn_separate_once,
)

ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
# MLPs computing down_proj(act_fn(gate_proj(x)) * up_proj(x)), which the host-length forward may run as gate|up
_GATED_MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")


def _sliding_window_of(model, layer) -> int | None:
    window = getattr(layer.self_attn, "sliding_window", None)
    if window is None and type(model).__name__ == "MistralForCausalLM":
        window = getattr(model.config, "sliding_window", None)
    return window


def check(model: nn.Module, capacity: int | None = None) -> None:
    """Raise :class:`UnsupportedTarget` when :class:`LlamaStaticTarget` cannot run ``model`` (unwrapped)."""
    name = type(model).__name__
    if name not in ARCHITECTURES:
        raise UnsupportedTarget(f"the Llama family runs {', '.join(ARCHITECTURES)}; {name} is not one of them")
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
        raise UnsupportedTarget(f"{name} has no .model.layers / .model.rotary_emb (unexpected transformers layout)")
    rope_type = getattr(decoder.rotary_emb, "rope_type", "default")
    if isinstance(rope_type, str) and ("dynamic" in rope_type or rope_type == "longrope"):
        raise UnsupportedTarget(f"rope_type {rope_type!r} changes the frequencies with the length; the fast loop "
                                "needs a fixed rope table")
    if capacity is not None:
        for i, layer in enumerate(decoder.layers):
            window = _sliding_window_of(model, layer)
            if window is not None and window < capacity:
                raise UnsupportedTarget(f"layer {i} uses a sliding window of {window} tokens, shorter than this "
                                        f"request ({capacity} tokens); the fast loop attends to the full context")


def _fused_norm(norm: nn.Module, dtype: torch.dtype) -> bool:
    """Whether the fused RMSNorm kernel runs ``norm``: a Llama-style RMSNorm with its weight in ``dtype``."""
    return type(norm).__name__ in _RMS_NORMS and has_norm_epsilon(norm) and norm.weight.dtype == dtype


class LlamaStaticTarget(StaticTarget):
    """:class:`~fold_hf.targets.base.StaticTarget` of a Llama-family causal LM (module docstring; batch 1).

    Args:
        target: the transformers model (or a PEFT wrapper of one).
        capacity: cache length in tokens (prompt + generated + one block of slack).
        tap_layer_ids: the drafter's tapped layers (``hidden_states[l + 1]`` of each), or ``()``.
        batch: cache rows (a batched request's runner, :meth:`~fold_hf.targets.base.StaticTarget.forward_rows`).
    """

    batched_rows = True  # forward_rows: [A, L] rows at their own positions (issue 35)

    def __init__(self, target: nn.Module, capacity: int, tap_layer_ids=(), batch: int = 1) -> None:
        model = _unwrap(target)
        check(model, capacity)
        self._setup(model, model.config, model.model, capacity, tap_layer_ids, batch)
        attn = self.layers[0].self_attn
        config = self.config
        self.num_heads = self.local_heads(config.num_attention_heads, "query heads")
        self.num_kv_heads = self.local_heads(config.num_key_value_heads, "KV heads")
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self._apply_rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        shape = (self.batch, self.num_kv_heads, self.capacity, self.head_dim)
        self.keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        with torch.no_grad():
            positions = torch.arange(self.capacity, device=self.device)[None]
            probe = torch.empty(1, 1, self.head_dim, device=self.device, dtype=self.dtype)
            cos, sin = self.decoder.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0], sin[0]  # [capacity, D]

    def keep_queries_unsupported(self) -> str | None:
        """Both device-length forwards copy the kept layer's queries, unless a subclass replaced them."""
        if type(self).forward_static is not StaticTarget.forward_static or \
                type(self)._run_layers is not LlamaStaticTarget._run_layers:
            return f"{type(self).__name__}'s verify step does not keep its queries"
        return None

    def fused_unsupported(self) -> str | None:
        """Why the fused-layer path cannot run this target (None when it can)."""
        from ..kernels.layer.naive import is_silu

        if self.cos.shape[-1] != self.head_dim:
            return f"partial rotary ({self.cos.shape[-1]} of {self.head_dim} dims): the fused rope rotates all"
        norms = [self.final_norm] + [n for layer in self.layers
                                     for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        for norm in norms:
            if type(norm).__name__ not in _RMS_NORMS or not has_norm_epsilon(norm):
                return f"norm {type(norm).__name__} is not a Llama-style RMSNorm"
            if norm.weight.dtype != self.dtype:
                return f"norm weights in {norm.weight.dtype}, activations in {self.dtype}"
        for layer in self.layers:
            mlp = layer.mlp
            if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
                return f"MLP {type(mlp).__name__} is not gate/up/down"
            if not is_silu(mlp.act_fn):
                return f"MLP activation {type(mlp.act_fn).__name__} is not SiLU"
        return None

    def exact_unsupported(self) -> str | None:
        """Why exact mode cannot run this target (None when it can): the device (CUDA, or a CPU under Triton's
        interpreter), the fused layers, a subclass replacing the fused forward, and any projection or head norm that
        would run as its module (LoRA, quantized, hooked: its kernel picks its reduction order by the row count)."""
        from ..kernels.layer.triton import NORM_WARPS_ENV

        reason = self._exact_basics_unsupported()
        if reason is None and (type(self)._fused_layers is not LlamaStaticTarget._fused_layers
                               or type(self).forward_static is not StaticTarget.forward_static):
            reason = f"{type(self).__name__} replaces the fused forward"
        if reason is None and os.environ.get(NORM_WARPS_ENV):
            reason = f"${NORM_WARPS_ENV} is set (it changes the norms' launch between calls)"
        for i, layer in enumerate(self.layers):
            if reason is not None:
                break
            attn, mlp = layer.self_attn, layer.mlp
            reason = decode_projections_unsupported(attn, mlp, self.dtype)
            modules = {"o_proj": attn.o_proj, "down_proj": mlp.down_proj, **{
                name: getattr(owner, name) for owner, names in ((attn, ("q_proj", "k_proj", "v_proj")),
                                                                (mlp, ("gate_proj", "up_proj"))) for name in names}}
            for name, module in modules.items():
                reason = reason or gemm_unsupported(module, self.dtype, name)
            for name in ("q_norm", "k_norm"):
                norm = getattr(attn, name, None)
                if reason is None and norm is not None and not _fused_norm(norm, self.dtype):
                    reason = f"{name} {type(norm).__name__} is not a Llama-style RMSNorm in {self.dtype}"
            reason = None if reason is None else f"layer {i}: {reason}"
        reason = reason or gemm_unsupported(self.lm_head, self.dtype, "lm_head")
        return None if reason is None else f"exact mode cannot run this target: {reason}"

    def decode_projections(self, layer) -> DecodeProjections | None:
        """Layer ``layer``'s q|k|v and gate|up as one GEMM each (:mod:`~fold_hf.targets.weight_layout`; the first
        call lays the weights out, later calls find them so), or None: off by ``$FOLD_HF_CONCAT_PROJECTIONS=0``, or
        the layer's projections are not plain Linears in the model dtype (warned once, naming why)."""
        if not concat_projections_enabled():
            return None
        reason = decode_projections_unsupported(layer.self_attn, layer.mlp, self.dtype)
        if reason is not None:
            warn_separate_once(f"static target: {reason}")
            return None
        return DecodeProjections(layer.self_attn, layer.mlp)

    # ------------------------------------------------------------------ one layer
    def _qkv(self, layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             projections: DecodeProjections | None = None):
        """Normed hidden ``[A, L, H]`` -> rotated q ``[A, Hq, L, D]``, rotated k and v ``[A, Hkv, L, D]``; rope rows
        ``cos`` / ``sin`` ``[L, D]`` (every row at the same positions) or ``[A, L, D]`` (each row at its own)."""
        attn = layer.self_attn
        shape = (*hidden.shape[:-1], -1, self.head_dim)
        if projections is not None:
            q, k, v = (x.view(shape) for x in projections.qkv(hidden))
        else:
            q, k, v = attn.q_proj(hidden).view(shape), attn.k_proj(hidden).view(shape), attn.v_proj(hidden).view(shape)
        if getattr(attn, "q_norm", None) is not None:
            q = attn.q_norm(q)
        if getattr(attn, "k_norm", None) is not None:
            k = attn.k_norm(k)
        v = v.transpose(1, 2)
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]
        q, k = self._apply_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q, k, v

    def _run_layers(self, input_ids: torch.Tensor, cos, sin, write_kv, attend, taps_out: torch.Tensor | None,
                    last_only: bool) -> torch.Tensor:
        """Shared body of every forward (:meth:`StaticTarget._run_layers`), over ``input_ids [A, L]`` (``A`` > 1: a
        batched verify, :meth:`~fold_hf.targets.base.StaticTarget.forward_rows`). ``write_kv(i, k, v)`` stores the
        new entries of layer ``i``, ``attend(i, q)`` returns ``[A, Hq, L, D]``. Returns logits ``[L, V]`` (or
        ``[1, V]`` with ``last_only``), ``[A, L, V]`` for ``A > 1``."""
        hidden = self.embed(input_ids)
        A, L = input_ids.shape
        tap = tap_writer(self.tap_layer_ids, hidden.shape[-1], taps_out)
        last_layer = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            residual = hidden
            projections = self.decode_projections(layer)
            q, k, v = self._qkv(layer, layer.input_layernorm(hidden), cos, sin, projections)
            write_kv(i, k, v)
            out = attend(i, q).transpose(1, 2).reshape(A, L, -1)
            hidden = residual + linear_module(layer.self_attn.o_proj, out)
            mlp, normed = layer.mlp, layer.post_attention_layernorm(hidden)
            if projections is not None and type(mlp).__name__ in _GATED_MLPS:
                gate, up = projections.gate_up(normed)
                hidden = hidden + linear_module(mlp.down_proj, mlp.act_fn(gate) * up)
            else:
                hidden = hidden + mlp(normed)
            if taps_out is not None and i in self.tap_layer_ids:
                tap(i, self.final_norm(hidden) if i == last_layer else hidden)
        hidden = self.final_norm(hidden[:, -1:] if last_only else hidden)
        logits = linear_module(self.lm_head, hidden)
        return logits[0] if A == 1 else logits

    def _fused_prefill(self) -> bool:
        """Whether :meth:`prefill` runs its chunks through the fused layers (:meth:`_prefill_chunk_fused`): on CUDA,
        ``$FOLD_HF_FUSED_PREFILL`` not ``0`` and :meth:`fused_unsupported` None
        (:meth:`~fold_hf.targets.base.StaticTarget._fused_prefill_allowed`), and the Llama family's own forward."""
        if type(self)._fused_layers is not LlamaStaticTarget._fused_layers or type(self).forward is not \
                StaticTarget.forward or self.__dict__.get("attention_probe") is not None:
            return False
        return self._fused_prefill_allowed()

    def _prefill_attention(self, row: int, start: int, L: int) -> dict:
        """A prefill chunk's attention (:meth:`~fold_hf.targets.base.StaticTarget._prefill_chunk_fused`): the fused
        layers' elementwise kernels (norms, rope with the cache write, ``silu(gate) * up``) around cuBLAS projections,
        and the prefill attention (:func:`fold_hf.kernels.prefill_attention.prefill_attention`) over the row's cache
        up to the chunk's end."""
        from ..kernels.prefill_attention import prefill_attention

        def attend(i, q):  # q [1, Hq, L, D] -> [1, L, Hq, D]
            keys = self.keys[i][row : row + 1, :, : start + L]
            values = self.values[i][row : row + 1, :, : start + L]
            return prefill_attention(q, keys, values, start, self.scaling).transpose(1, 2)

        return {"attend": attend}

    def _forward_static_fused(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                              taps_out: torch.Tensor | None) -> torch.Tensor:
        """``forward_static`` with the decode kernel and the fused elementwise kernels. The residual add of each
        sublayer happens inside the next norm, so the tap of layer ``i`` is written when layer ``i + 1`` (or the
        final norm) forms it. An AR step (one token) launches its Triton kernels with programmatic dependent launch
        (:func:`fold_hf.kernels.common.pdl_scope`); a verify block or a prefill chunk without."""
        from ..kernels.common import pdl_scope

        with pdl_scope(input_ids.shape[1] == 1):
            return self._fused_layers(input_ids, positions, bucket, taps_out)

    def _fused_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                      taps_out: torch.Tensor | None, attend=None, last_only: bool = False, rows=(0,)) -> torch.Tensor:
        """The fused layers over ``input_ids [1, L]`` at ``positions [L]`` in cache row ``rows[0]`` (logits ``[L, V]``),
        or over ``input_ids [A, L]`` at ``positions [A, L]``, row ``a`` in cache row ``rows[a]`` (logits ``[A, L, V]``:
        :meth:`forward_rows_static`). A row's context length is its first position; every row's rope, cache write and
        attention are its own launch, exactly as when it runs alone; or, on CUDA outside exact mode, the rows'
        attention of a layer is one launch pair over every row's cache row at its length (:meth:`_rows_decode`)."""
        exact = self.exact and attend is None  # exact mode's decode / verify step (a prefill chunk is shared)
        ops, decode = self._fused_ops(exact)
        A, L = input_ids.shape
        rows_decode = self._rows_decode() if A > 1 and attend is None and not exact else None
        row_index = self._row_index(rows) if rows_decode is not None else None
        lengths = positions.reshape(A, L)[:, :1].to(torch.int32)  # [A, 1]: each row's context length
        tap = tap_writer(self.tap_layer_ids, self.config.hidden_size, taps_out)

        # a decode step's rows (AR 1, a verify block; A * L of a batch's rows) go through the skinny GEMMs where the
        # ops have them and take that many rows; a prefill chunk or a wide batch through cuBLAS. Exact mode: every
        # row count through the exact GEMM, the lm_head too
        skinny = decode_gemm(ops, A * L, exact)
        hidden = self.embed(input_ids)
        delta = None
        for i, layer in enumerate(self.layers):
            norm = layer.input_layernorm
            attn = layer.self_attn
            projections = self.decode_projections(layer)
            hidden, normed = ops.add_rms_norm(hidden, delta, norm.weight, norm_epsilon(norm))
            if i > 0:
                tap(i - 1, hidden)
            if projections is not None:  # one GEMM; the heads are read in place by the norms and the rope
                q, k, v = projections.qkv(normed, skinny)
            else:
                q, k, v = attn.q_proj(normed), attn.k_proj(normed), attn.v_proj(normed)
            q = q.view(A, L, self.num_heads, self.head_dim)
            k = k.view(A, L, self.num_kv_heads, self.head_dim)
            v = v.view(A, L, self.num_kv_heads, self.head_dim)
            q, k = self._head_norm(ops, attn, "q_norm", q), self._head_norm(ops, attn, "k_norm", k)
            if rows_decode is not None:  # a batch's verify: every row's rope, write and attention at once
                out = self._rows_attention_layer(i, ops, rows_decode, q, k, v, positions, lengths, rows, row_index,
                                                 bucket)
            else:
                outs = []
                for a, cache_row in enumerate(rows):
                    keys = self.keys[i][cache_row : cache_row + 1]  # the whole cache at batch 1
                    values = self.values[i][cache_row : cache_row + 1]
                    qa, ka, va = ops.rope_write(q[a : a + 1], k[a : a + 1], v[a : a + 1], self.cos, self.sin,
                                                positions if positions.dim() == 1 else positions[a], keys, values)
                    if self.query_keep is not None and i == self.query_keep[0]:  # cmr only (keep_queries)
                        self.query_keep[1][:, :, :L].copy_(qa)
                    if attend is not None:  # a prefill chunk (_prefill_chunk_fused)
                        outs.append(attend(i, qa))
                    else:
                        outs.append(decode(qa, keys, values, ka, va, lengths[a], scaling=self.scaling,
                                           max_context_length=bucket))  # [1, L, Hq, D]
                out = outs[0] if A == 1 else torch.cat(outs)
            norm = layer.post_attention_layernorm
            attn_out = project(skinny, attn.o_proj, out.reshape(A, L, -1))
            hidden, normed = ops.add_rms_norm(hidden, attn_out, norm.weight, norm_epsilon(norm))
            gate_up = projections.gate_up_merged if projections is not None else None
            # with the skinny GEMMs gate|up and silu(gate) * up are one launch
            delta = gated_mlp(layer.mlp, normed, gate_up, skinny, ops.silu_mul, ops.gate_up_silu)
        hidden, normed = ops.add_rms_norm(hidden, delta, self.final_norm.weight, norm_epsilon(self.final_norm))
        tap(len(self.layers) - 1, normed)  # the last layer's tap is after the final norm, as HiddenTaps gives it
        if exact:
            logits = project(skinny, self.lm_head, normed)
        else:
            logits = linear_module(self.lm_head, normed[:, -1:] if last_only else normed)
        return logits[0] if positions.dim() == 1 else logits

    def _rows_attention_layer(self, i: int, ops, rows_decode, q, k, v, positions, lengths, rows, row_index,
                              bucket: int):
        """Layer ``i``'s attention of a batch's rows (``q [A, L, Hq, D]``, ``k`` / ``v [A, L, Hkv, D]`` at ``positions
        [A, L]``, cache rows ``rows``, on the device ``row_index``): the rope and cache write of every row in one
        launch where the ops have ``rope_write_rows`` (else one per row), then every row's attention over its cache
        row at its length in one launch pair. Returns ``[A, L, Hq, D]``."""
        keys, values = self.keys[i], self.values[i]
        if ops.rope_write_rows is not None:
            qs, ks, vs = ops.rope_write_rows(q, k, v, self.cos, self.sin, positions, keys, values, row_index)
        else:
            rotated = [ops.rope_write(q[a : a + 1], k[a : a + 1], v[a : a + 1], self.cos, self.sin, positions[a],
                                      keys[row : row + 1], values[row : row + 1])
                       for a, row in enumerate(rows)]
            qs, ks, vs = (torch.cat(parts) for parts in zip(*rotated))
        return rows_decode(qs, keys, values, ks, vs, lengths[:, 0], row_index, scaling=self.scaling,
                           max_context_length=bucket)

    def forward_rows_static(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: list[int], bucket: int,
                            taps_out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`~fold_hf.targets.base.StaticTarget.forward_rows_static`: the fused layers over the rows (exact
        mode's kernels when it is on, so a row's logits have the bits of that row decoded alone)."""
        return self._fused_layers(input_ids, positions, bucket, taps_out, rows=rows)

    def _fused_ops(self, exact: bool):
        """(:class:`~fold_hf.kernels.LayerOps`, decode attention) of the fused layers: exact mode's
        (:mod:`fold_hf.kernels.exact`) for its decode / verify steps, else the defaults of the device."""
        if exact:
            if self._exact_kernels is None:
                from ..kernels.exact import exact_decode_attention, exact_layer_ops

                self._exact_kernels = (exact_layer_ops(self.device), exact_decode_attention(self.device))
            return self._exact_kernels
        if self._layer_ops is None:
            from ..kernels import default_decode_attention, default_layer_ops

            reason = self.fused_unsupported()
            if reason is not None:
                raise UnsupportedTarget(f"fused layers: {reason}")
            self._layer_ops = default_layer_ops(self.device)
            self._decode_attention = self._decode_attention or default_decode_attention(self.device)
        return self._layer_ops, self._decode_attention

    def _head_norm(self, ops, attn, name: str, heads: torch.Tensor) -> torch.Tensor:
        """Qwen3's per-head q/k RMSNorm of ``heads [1, L, h, D]`` (read in place from a q|k|v output): the fused
        norm when it is a Llama-style RMSNorm in the model dtype, else the module; no norm: ``heads`` as given."""
        norm = getattr(attn, name, None)
        if norm is None:
            return heads
        if _fused_norm(norm, heads.dtype):
            return ops.add_rms_norm(heads, None, norm.weight, norm_epsilon(norm))[1]
        return norm(heads)

