"""The fused layers of the Gemma target family (:class:`~fold_hf.targets.gemma.GemmaStaticTarget`'s fast step).

Projections as the Llama family runs them (:mod:`fold_hf.targets.weight_layout`): q|k|v as one GEMM (q|k on a global
layer with ``attention_k_eq_v``, whose values are the raw keys; q alone on a KV-shared layer, which reads an earlier
layer's cache) and gate|up as one GEMM, over buffers the model's own parameters become views of; on CUDA a decode
step's products (1 to ``skinny_rows`` rows: an AR step, a verify block) and o / down / the per-layer-input gate and
projection run the skinny Triton GEMMs (:mod:`fold_hf.kernels.gemm.triton`; gate|up ending in
``gelu(gate, "tanh") * up``, one launch), more rows cuBLAS. A projection that is
not a plain ``nn.Linear`` in the model dtype (PEFT, quantized) runs as its module, warned once. The router and
experts of Gemma-4's MoE block and the lm_head stay the modules. The norms (Gemma-3's ``(1 + w)``, Gemma-4's ``w``
and its scale-free value norm), the rope with the (ring) cache write, the ring attention of sliding layers, the
sandwich norms with the residual and ``layer_scalar``, and GELU-tanh (past the skinny rows: over the gate|up
product's halves, read in place) run as fused kernels (:mod:`fold_hf.kernels.hybrid.triton`, :mod:`fold_hf.kernels.gemma.triton`; torch twins
off CUDA). An AR step launches the kernels that take it with programmatic dependent launch (the GEMMs'; the hybrid
and Gemma kernels not yet).
Over rows (:meth:`GemmaFusedLayers.forward_rows_static`, a batch's verify on the static and graphs engines, issue 35)
the same loop runs ``[A, L]`` tokens: embedding, per-layer inputs, GEMMs, norms, MLP / MoE and lm_head over the
``A * L`` tokens, each row's norm-rope-write and attention its own launch in its own cache row at its own context
length, read from the device positions (exact mode: the exact kernels, so a row has the bits of that row alone).
:meth:`GemmaFusedLayers.fused_unsupported` names what they do not cover (the fast loop then warns once and runs the
layers on the modules). A mixin: it reads the runner's attributes that :mod:`fold_hf.targets.gemma` sets (layers,
``layer_types``, ``kv_source``, ``windows``, ``head_dims``, ``scalings``, ``tables``, rings) and its
``_embed`` / ``_moe_branch``.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from ..compat import has_norm_epsilon, norm_epsilon
from .base import UnsupportedTarget
from .common import HybridFusedOps, tap_writer
from .weight_layout import (
    MergedLinears,
    decode_gemm,
    gated_mlp,
    gemm_unsupported,
    merged_linears,
    project,
)


# activation module -> {(device, dtype): probed}: each probe ends in a device sync, and fused_unsupported runs on every
# prefill (18 syncs a call for Gemma-3-270M; 54 when a session was built: the H100 profile of 2026-12-07)
_GELU_TANH_PROBED: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def _is_gelu_tanh(act, device, dtype) -> bool:
    """Whether the MLP's activation module computes ``gelu(x, approximate="tanh")`` (transformers' ``GELUTanh``),
    probed once per module, device and dtype (a stateless module computes what it computed)."""
    if type(act).__name__ != "GELUTanh":
        return False
    key = (str(torch.device(device)), dtype)
    seen = _GELU_TANH_PROBED.setdefault(act, {})
    if key not in seen:
        probe = torch.linspace(-6, 6, 97, device=device, dtype=dtype)
        with torch.no_grad():
            seen[key] = torch.equal(act(probe), F.gelu(probe, approximate="tanh"))
    return seen[key]


class GemmaFusedLayers(HybridFusedOps):
    """``fused_unsupported``, ``_forward_static_fused`` and ``forward_rows_static`` of
    :class:`~fold_hf.targets.gemma.GemmaStaticTarget`."""

    def fused_unsupported(self) -> str | None:
        """Why the fused Gemma layers (:mod:`fold_hf.kernels.hybrid.triton`, :mod:`fold_hf.kernels.gemma.triton`)
        cannot run this target, or None."""
        kinds = {"Gemma3RMSNorm": 1.0, "Gemma4RMSNorm": 0.0}
        offsets = set()
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            norms = [layer.input_layernorm, layer.post_attention_layernorm, layer.pre_feedforward_layernorm,
                     layer.post_feedforward_layernorm, attn.q_norm]
            for name in ("k_norm", "v_norm"):  # KV-shared layers have neither
                if getattr(attn, name, None) is not None:
                    norms.append(getattr(attn, name))
                    if norm_epsilon(getattr(attn, name)) != norm_epsilon(attn.q_norm):
                        return f"layer {i}: q and {name} norms with different eps"
            if self.ple:
                norms.append(layer.post_per_layer_input_norm)
            for norm in norms:
                kind = type(norm).__name__
                if kind not in kinds or not has_norm_epsilon(norm):
                    return f"layer {i}: norm {kind} is not a Gemma RMSNorm"
                weight = getattr(norm, "weight", None)
                if weight is not None and weight.dtype != self.dtype:
                    return f"layer {i}: norm weights in {weight.dtype}, activations in {self.dtype}"
                offsets.add(kinds[kind])
            mlp = layer.mlp
            if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
                return f"layer {i}: MLP {type(mlp).__name__} is not gate/up/down"
            if not _is_gelu_tanh(mlp.act_fn, self.device, self.dtype):
                return f"layer {i}: MLP activation {type(mlp.act_fn).__name__} is not GELU-tanh"
        if len(offsets) != 1:
            return "norms of both Gemma kinds in one model"
        self._norm_offset = offsets.pop()
        for layer_type, (cos, _) in self.tables.items():
            if cos.shape[-1] % 2:
                return f"{layer_type} rope table of odd width {cos.shape[-1]}"
        return None

    def exact_unsupported(self) -> str | None:
        """Why exact mode (docs/exact-mode.md) cannot run this target (None when it can): the device (CUDA, or a CPU
        under Triton's interpreter), the fused layers, every projection and the lm_head a plain Linear
        (:func:`~fold_hf.targets.weight_layout.gemm_unsupported`),
        q|k|v and gate|up merged, and neither Gemma-4's per-layer inputs nor its MoE block (both run modules whose
        kernels follow the row count)."""
        reason = self._exact_basics_unsupported()
        if reason is None and self.ple:
            reason = "per-layer inputs (PLE) are computed by the model's modules"
        for i, layer in enumerate(self.layers):
            if reason is not None:
                break
            if getattr(layer, "enable_moe_block", False):
                reason = f"layer {i}: the MoE block's router and experts run as modules"
                break
            attn, mlp = layer.self_attn, layer.mlp
            names = [("q_proj", attn), ("o_proj", attn), ("gate_proj", mlp), ("up_proj", mlp), ("down_proj", mlp)]
            if self.kv_source[i] == i:
                names += [(name, attn) for name in ("k_proj", "v_proj") if getattr(attn, name, None) is not None]
            for name, owner in names:
                reason = reason or gemm_unsupported(getattr(owner, name), self.dtype, name)
            reason = None if reason is None else f"layer {i}: {reason}"
        reason = reason or gemm_unsupported(self.lm_head, self.dtype, "lm_head")
        return None if reason is None else f"exact mode cannot run this target: {reason}"

    def merged_projections(self, i: int) -> tuple[MergedLinears | None, MergedLinears | None]:
        """Layer ``i``'s (q|k|v, gate|up) as one GEMM each (:func:`~fold_hf.targets.weight_layout.merged_linears`;
        the first call lays the weights out): q|k|v ``[(Hq + 2 Hkv) D, H]``, q|k ``[(Hq + Hkv) D, H]`` on a layer
        without ``v_proj`` (``attention_k_eq_v``), q alone ``[Hq D, H]`` on a KV-shared layer; gate|up ``[2 I, H]``.
        None where a projection is not a plain Linear in the model dtype (PEFT, quantized: warned once, the layer runs
        its modules) or ``$FOLD_HF_CONCAT_PROJECTIONS=0``."""
        layer = self.layers[i]
        attn, mlp = layer.self_attn, layer.mlp
        names = ("q_proj",)
        if self.kv_source[i] == i:
            names += ("k_proj", "v_proj") if getattr(attn, "v_proj", None) is not None else ("k_proj",)
        qkv = merged_linears({name: getattr(attn, name) for name in names}, self.dtype, "qkv")
        return qkv, merged_linears({"gate_proj": mlp.gate_proj, "up_proj": mlp.up_proj}, self.dtype, "gate_up")

    def _forward_static_fused(self, input_ids, positions, bucket: int, taps_out) -> torch.Tensor:
        """The device-length forward with fused layers over ``input_ids [1, L]`` at ``positions [L]``: per layer
        the q|k|v GEMM (:meth:`merged_projections`), one kernel for the q/k/v norms, rope and the (ring) cache write,
        the ring attention kernel (sliding layers, two launches) or the decode kernel (global layers), o_proj, one
        kernel for the sandwich norm + residual + next norm after the attention and one after the MLP (with
        ``layer_scalar``), the gate|up GEMM, GELU-tanh times up, down_proj. A step's products of 1 to
        ``skinny_rows`` rows run the skinny GEMMs where the device has them (:func:`~fold_hf.targets.weight_layout.
        decode_gemm`, the Llama family's rule); an AR step opens :func:`~fold_hf.kernels.common.pdl_scope`. Returns
        logits ``[L, V]``."""
        from ..kernels.common import pdl_scope

        self._fused_ops_ready()
        with pdl_scope(input_ids.shape[1] == 1):
            return self._fused_layers(input_ids, positions, bucket, taps_out)

    def forward_rows_static(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: list[int], bucket: int,
                            taps_out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`~fold_hf.targets.base.StaticTarget.forward_rows_static`: the fused layers over ``input_ids [A, L]``
        at ``positions [A, L]`` (device), row ``a`` in cache row ``rows[a]`` (:meth:`_fused_layers`; exact mode's
        kernels when it is on, so a row's logits have the bits of that row decoded alone). Returns logits
        ``[A, L, V]``, soft-capped as the model."""
        self._check_rows_step(input_ids, positions, rows, bucket)
        self._check_ring_slack(input_ids.shape[1])
        self._fused_ops_ready()
        with torch.no_grad():
            return self._fused_layers(input_ids, positions, bucket, taps_out, rows=rows)

    def _fused_prefill(self) -> bool:
        """Whether :meth:`~fold_hf.targets.base.StaticTarget.prefill` runs its chunks through the fused layers
        (:meth:`_prefill_chunk_fused`), as the Llama family's: on CUDA, ``$FOLD_HF_FUSED_PREFILL`` not ``0`` and
        :meth:`fused_unsupported` None (:meth:`~fold_hf.targets.base.StaticTarget._fused_prefill_allowed`). The
        module path launches ~100 kernels a layer for a chunk (each RMSNorm in fp32 with its casts, rope,
        GELU-tanh), which bounds a small target's time to first token on the host."""
        return self._fused_prefill_allowed()

    def _prefill_attention(self, row: int, start: int, L: int) -> dict:
        """A prefill chunk's attention (:meth:`~fold_hf.targets.base.StaticTarget._prefill_chunk_fused`): the fused
        layers' kernels (merged projections on cuBLAS, the norms, q/k/v norms + rope, GELU-tanh) around the module
        path's own cache writes and prefill attention
        (:meth:`~fold_hf.targets.gemma_rows.GemmaRows._row_attention`: the global layers' cache, the sliding layers'
        window of ring entries read before the chunk's rows enter the ring)."""
        self._fused_ops_ready()
        return {"attention": self._row_attention(row, start, L)}

    def _check_ring_slack(self, L: int) -> None:
        """Raise unless a device-length step of ``L`` rows per cache row fits the sliding layers' rings (module
        docstring of :mod:`fold_hf.targets.gemma`: at most ``ring_slack + 1`` rows written, then rolled back)."""
        if L > self.ring_slack + 1:
            raise ValueError(f"a static step of {L} rows exceeds the sliding layers' ring slack "
                             f"({self.ring_slack} + 1)")

    def _fused_layers(self, input_ids, positions, bucket: int, taps_out, rows=(0,), attention=None,
                      last_only: bool = False) -> torch.Tensor:
        """The fused layers (their ops resolved, :meth:`_fused_ops_ready`) over ``input_ids [1, L]`` at ``positions
        [L]`` in cache row ``rows[0]`` (logits ``[L, V]``: :meth:`_forward_static_fused`), or over ``input_ids
        [A, L]`` at ``positions [A, L]``, row ``a`` in cache row ``rows[a]`` (logits ``[A, L, V]``:
        :meth:`forward_rows_static`). The embedding, per-layer inputs, projections, norms, MLP, MoE block and
        lm_head run once over the ``A * L`` tokens; each row's q/k/v norms + rope + (ring) cache write and its
        attention (the ring kernel on a sliding layer, the decode kernel on a global one at the row's context length,
        its first position, read on the device; a KV-shared layer reading its source's cache row) are that row's own
        launches, exactly as when it runs alone; on CUDA outside exact mode a batch's rows run them in one launch
        (pair) per layer instead (:meth:`_rows_attention_layer`: the kernels with a row axis). Per-layer inputs (PLE)
        keep their activation on the module; their gate and projection go through
        :func:`~fold_hf.targets.weight_layout.project`.

        ``attention``: a prefill chunk's ``(write_kv, attend)`` of one cache row
        (:meth:`~fold_hf.targets.gemma_rows.GemmaRows._row_attention`, the module path's own closures: the global
        cache write, the sliding layers' ring entries in the window read before the chunk's rows overwrite them, the
        prefill attention kernel): the norm-rope kernel then writes no cache and the closures attend and store.
        ``last_only``: the lm_head over the last position only (logits ``[1, V]``)."""
        ops, decode, ring_attention = self._hybrid_ops, self._decode_attention, self._hybrid_ops.ring_attention
        gemm_ops = self._layer_ops
        exact = self.exact and attention is None  # a prefill chunk is shared by AR and speculation: not exact
        if exact:  # every GEMM (the lm_head too), the global and the ring attention row-count invariant
            gemm_ops, decode, ring_attention = self._exact_ops()
        offset = self._norm_offset
        A, L = input_ids.shape
        # a batch's verify on CUDA: every row's attention of a layer in one launch pair (the ring or the decode kernel
        # with a row axis), each row at its cache row, positions and length read on the device
        rows_attention = self._rows_attention() if A > 1 and attention is None and not exact else None
        if rows_attention is not None:
            row_index, row_lengths = self._row_index(rows), positions[:, 0].to(torch.int32)
        else:  # one row's launches after another: each row's positions [L] and context length, on the device
            row_positions = [positions] if positions.dim() == 1 else [positions[a] for a in range(A)]
            lengths = [p[:1].to(torch.int32) for p in row_positions]
        block_kv = {}  # (layer, row) -> the row's new keys and values
        # a decode step's rows (A * L of a batch's rows) through the skinny GEMMs where the ops take that many
        skinny = decode_gemm(gemm_ops, A * L, exact)
        tap = tap_writer(self.tap_layer_ids, self.config.hidden_size, taps_out)
        hidden, per_layer = self._embed(input_ids)  # per_layer: [A, L, n_layers, d] or None

        def weight(norm):
            return getattr(norm, "weight", None)

        first = self.layers[0].input_layernorm
        hidden, normed = ops.residual_norm(hidden, None, weight(first), norm_epsilon(first), offset)
        n_layers = len(self.layers)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            D = self.head_dims[i]
            cos, sin = self.tables[self.layer_types[i]]
            qkv, gate_up = self.merged_projections(i)
            src = self.kv_source[i]
            owns_kv = src == i
            v_proj = getattr(attn, "v_proj", None)
            if qkv is not None:  # one GEMM; the heads are read in place by the norm-rope kernel
                q, *kv = qkv(normed, skinny)
            else:
                kv = [attn.k_proj(normed), v_proj(normed) if v_proj is not None else None] if owns_kv else []
                q = attn.q_proj(normed)
            q = q.view(A, L, -1, D)
            if owns_kv:
                raw_k = kv[0].view(A, L, -1, D)
                raw_v = kv[1].view(A, L, -1, D) if v_proj is not None else raw_k  # attention_k_eq_v
            if rows_attention is not None:  # a batch's verify: every row's norms, rope, write and attention at once
                out = self._rows_attention_layer(i, rows_attention, q, raw_k if owns_kv else None,
                                                 raw_v if owns_kv else None, positions, row_index, row_lengths,
                                                 bucket, block_kv).reshape(A, L, -1)
            else:
                outs = []
                for a, cache_row in enumerate(rows):
                    here = slice(cache_row, cache_row + 1)  # the row's own cache row of every cache
                    if owns_kv:  # a prefill chunk's caches are written by its closures (a ring after its attention)
                        caches = (None, None) if attention is not None else (self.keys[i][here], self.values[i][here])
                        qa, k, v = ops.head_norm_rope_write(q[a : a + 1], raw_k[a : a + 1], raw_v[a : a + 1],
                                                            weight(attn.q_norm), weight(attn.k_norm),
                                                            norm_epsilon(attn.q_norm), offset, cos, sin,
                                                            row_positions[a], *caches,
                                                            norm_value=getattr(attn, "v_norm", None) is not None)
                        block_kv[i, a] = (k, v)
                    else:
                        qa, _, _ = ops.head_norm_rope_write(q[a : a + 1], None, None, weight(attn.q_norm), None,
                                                            norm_epsilon(attn.q_norm), offset, cos, sin,
                                                            row_positions[a], None, None)
                    if attention is not None:  # a prefill chunk (one row): the module path's write and attention
                        write_kv, attend = attention
                        if owns_kv:
                            write_kv(i, k, v)
                        outs.append(attend(i, qa).transpose(1, 2))  # [1, Hq, L, D] -> [1, L, Hq, D], as the kernels'
                        continue
                    if self.query_keep is not None and i == self.query_keep[0]:  # cmr only (keep_queries)
                        self.query_keep[1][:, :, :L].copy_(qa)
                    keys, values = self.keys[src][here], self.values[src][here]
                    if self.windows[i] is not None:
                        outs.append(ring_attention(qa, keys, values, row_positions[a], self.windows[i],
                                                   self.scalings[i]))
                    else:
                        k, v = block_kv[src, a]
                        outs.append(decode(qa, keys, values, k, v, lengths[a], scaling=self.scalings[i],
                                           max_context_length=bucket))  # [1, L, Hq, D] from both kernels
                out = (outs[0] if A == 1 else torch.cat(outs)).reshape(A, L, -1)
            post, pre = layer.post_attention_layernorm, layer.pre_feedforward_layernorm
            hidden, normed = ops.residual_norm(hidden, project(skinny, attn.o_proj, out), weight(pre),
                                               norm_epsilon(pre), offset, delta_weight=weight(post),
                                               delta_eps=norm_epsilon(post), norm_delta=True)
            # with the skinny GEMMs gate|up and gelu(gate) * up are one launch
            delta = gated_mlp(layer.mlp, normed, gate_up, skinny, ops.gelu_tanh_mul, gemm_ops.gate_up_gelu)
            delta = self._moe_branch(layer, delta, hidden)  # Gemma-4's MoE block on the modules (else delta)
            after = self.layers[i + 1].input_layernorm if i + 1 < n_layers else self.final_norm
            post = layer.post_feedforward_layernorm
            scalar = getattr(layer, "layer_scalar", None)
            if per_layer is not None:
                hidden, _ = ops.residual_norm(hidden, delta, None, norm_epsilon(post), offset, norm_out=False,
                                              delta_weight=weight(post), delta_eps=norm_epsilon(post), norm_delta=True)
                gated = layer.act_fn(project(skinny, layer.per_layer_input_gate, hidden)) * per_layer[:, :, i]
                delta, post = project(skinny, layer.per_layer_projection, gated), layer.post_per_layer_input_norm
            hidden, normed = ops.residual_norm(hidden, delta, weight(after), norm_epsilon(after), offset,
                                               delta_weight=weight(post), delta_eps=norm_epsilon(post), norm_delta=True,
                                               scalar=scalar)
            if taps_out is not None and i in self.tap_layer_ids:
                tap(i, normed if i == n_layers - 1 else hidden)  # the last layer's tap is after the final norm
        if last_only:
            normed = normed[:, -1:]
        logits = project(skinny, self.lm_head, normed) if exact else self.lm_head(normed)
        if positions.dim() == 1:
            logits = logits[0]
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def _rows_attention(self):
        """``(head_norm_rope_write_rows_triton, ring_attention_rows_triton, decode_attention_rows_triton)``: the
        q / k / v norms, rope and cache writes of a batch's rows in one launch, and the sliding and the global layers'
        attention of the rows in one launch pair each, where the Triton kernels run (CUDA; ``$FOLD_HF_ROWS_KERNELS`` not
        ``0``), else None (per row)."""
        return self._rows_kernels_of(("hybrid.triton", "head_norm_rope_write_rows_triton"),
                                     ("gemma.triton", "ring_attention_rows_triton"))

    def _rows_attention_layer(self, i: int, kernels, q, raw_k, raw_v, positions, row_index, row_lengths, bucket: int,
                              block_kv: dict) -> torch.Tensor:
        """Layer ``i``'s attention of a batch's rows with the row-axis ``kernels`` (:meth:`_rows_attention`): the
        norms, rope and cache writes of every row in one launch (queries alone on a KV-shared layer, ``raw_k`` None),
        then the rows' ring (sliding) or decode (global) attention over their cache rows ``row_index`` at ``positions
        [A, L]`` in one launch pair. ``q [A, L, Hq, D]``; the layer's block keys / values go to ``block_kv[i]`` for the
        KV-shared layers that read them. Returns ``[A, L, Hq, D]``."""
        head_rows, ring_rows, decode_rows = kernels
        attn, src, offset = self.layers[i].self_attn, self.kv_source[i], self._norm_offset
        cos, sin = self.tables[self.layer_types[i]]
        q_weight = getattr(attn.q_norm, "weight", None)
        if raw_k is not None:
            queries, keys, values = head_rows(q, raw_k, raw_v, q_weight, getattr(attn.k_norm, "weight", None),
                                              norm_epsilon(attn.q_norm), offset, cos, sin, positions, self.keys[i],
                                              self.values[i], row_index,
                                              norm_value=getattr(attn, "v_norm", None) is not None)
            block_kv[i] = (keys, values)
        else:
            queries, _, _ = head_rows(q, None, None, q_weight, None, norm_epsilon(attn.q_norm), offset, cos, sin,
                                      positions, None, None, row_index)
        if self.windows[i] is not None:
            return ring_rows(queries, self.keys[src], self.values[src], positions, row_index, self.windows[i],
                             self.scalings[i])
        block_keys, block_values = block_kv[src]
        return decode_rows(queries, self.keys[src], self.values[src], block_keys, block_values, row_lengths, row_index,
                           scaling=self.scalings[i], max_context_length=bucket)

    def _exact_ops(self):
        """Exact mode's (:class:`~fold_hf.kernels.LayerOps` of its GEMMs, global decode attention, ring attention),
        resolved on the first exact step (:mod:`fold_hf.kernels.exact`,
        :func:`~fold_hf.kernels.gemma.triton.exact_ring_attention_triton`). The norms, the norm-rope-write and
        GELU-tanh stay the hybrid ops: one program per row (or elementwise), configured by the widths alone."""
        if self._exact_kernels is None:
            from ..kernels import import_triton_module
            from ..kernels.exact import exact_decode_attention, exact_layer_ops

            ring = import_triton_module("gemma.triton").exact_ring_attention_triton
            self._exact_kernels = (exact_layer_ops(self.device), exact_decode_attention(self.device), ring)
        return self._exact_kernels
