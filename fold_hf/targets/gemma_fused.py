"""The fused layers of the Gemma target family (:class:`~fold_hf.targets.gemma.GemmaStaticTarget`'s fast step).

The projections stay the model's modules; the norms (Gemma-3's ``(1 + w)``, Gemma-4's ``w`` and its scale-free value
norm), the rope with the (ring) cache write, the ring attention of sliding layers, the sandwich norms with the residual
and ``layer_scalar``, and GELU-tanh run as fused kernels (:mod:`fold_hf.kernels.hybrid.triton`,
:mod:`fold_hf.kernels.gemma.triton`; torch twins off CUDA).
:meth:`GemmaFusedLayers.fused_unsupported` names what they do not cover (the fast loop then warns once and runs the
layers on the modules). A mixin: it reads the runner's attributes that :mod:`fold_hf.targets.gemma` sets (layers,
``layer_types``, ``kv_source``, ``windows``, ``head_dims``, ``scalings``, ``tables``, rings) and its
``_embed`` / ``_moe_branch``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..compat import has_norm_epsilon, norm_epsilon
from .base import UnsupportedTarget
from .common import tap_writer


def _is_gelu_tanh(act, device, dtype) -> bool:
    """Whether the MLP's activation module computes ``gelu(x, approximate="tanh")`` (transformers' ``GELUTanh``)."""
    if type(act).__name__ != "GELUTanh":
        return False
    probe = torch.linspace(-6, 6, 97, device=device, dtype=dtype)
    with torch.no_grad():
        return torch.equal(act(probe), F.gelu(probe, approximate="tanh"))


class GemmaFusedLayers:
    """``fused_unsupported`` and ``_forward_static_fused`` of :class:`~fold_hf.targets.gemma.GemmaStaticTarget`."""

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

    def _forward_static_fused(self, input_ids, positions, bucket: int, taps_out) -> torch.Tensor:
        """The device-length forward with fused layers: per layer the projections, one kernel for the q/k/v norms,
        rope and the (ring) cache write, the ring attention kernel (sliding layers, two launches) or the decode
        kernel (global layers), one kernel for the sandwich norm + residual + next norm after the attention and one
        after the MLP (with ``layer_scalar``), GELU-tanh fused with ``up``. Per-layer inputs (PLE) keep their gate
        and projection on the modules."""
        if self._hybrid_ops is None:
            from ..kernels import default_hybrid_ops

            reason = self.fused_unsupported()
            if reason is not None:
                raise UnsupportedTarget(f"fused layers: {reason}")
            self._hybrid_ops = default_hybrid_ops(self.device)
        ops, decode = self._hybrid_ops, self._decode_attention
        offset = self._norm_offset
        context_length = positions[:1].to(torch.int32)
        block_kv = {}
        L = input_ids.shape[1]
        tap = tap_writer(self.tap_layer_ids, self.config.hidden_size, taps_out)
        hidden, per_layer = self._embed(input_ids)  # per_layer: [1, L, n_layers, d] or None

        def weight(norm):
            return getattr(norm, "weight", None)

        first = self.layers[0].input_layernorm
        hidden, normed = ops.residual_norm(hidden, None, weight(first), norm_epsilon(first), offset)
        n_layers = len(self.layers)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            D = self.head_dims[i]
            cos, sin = self.tables[self.layer_types[i]]
            q = attn.q_proj(normed).view(1, L, -1, D)
            if self.kv_source[i] == i:
                raw_k = attn.k_proj(normed).view(1, L, -1, D)
                v_proj = getattr(attn, "v_proj", None)
                raw_v = v_proj(normed).view(1, L, -1, D) if v_proj is not None else raw_k  # attention_k_eq_v
                q, k, v = ops.head_norm_rope_write(q, raw_k, raw_v, weight(attn.q_norm), weight(attn.k_norm),
                                                   norm_epsilon(attn.q_norm), offset, cos, sin, positions, self.keys[i],
                                                   self.values[i],
                                                   norm_value=getattr(attn, "v_norm", None) is not None)
                block_kv[i] = (k, v)
            else:
                q, _, _ = ops.head_norm_rope_write(q, None, None, weight(attn.q_norm), None,
                                                   norm_epsilon(attn.q_norm), offset,
                                                   cos, sin, positions, None, None)
            src = self.kv_source[i]
            if self.query_keep is not None and i == self.query_keep[0]:  # cmr only (keep_queries)
                self.query_keep[1][:, :, :L].copy_(q)
            if self.windows[i] is not None:
                out = ops.ring_attention(q, self.keys[src], self.values[src], positions, self.windows[i],
                                         self.scalings[i])
            else:
                k, v = block_kv[src]
                out = decode(q, self.keys[src], self.values[src], k, v, context_length, scaling=self.scalings[i],
                             max_context_length=bucket)
            out = out.reshape(1, L, -1)  # [1, L, Hq, D] from both kernels
            post, pre = layer.post_attention_layernorm, layer.pre_feedforward_layernorm
            hidden, normed = ops.residual_norm(hidden, attn.o_proj(out), weight(pre), norm_epsilon(pre), offset,
                                               delta_weight=weight(post), delta_eps=norm_epsilon(post), norm_delta=True)
            mlp = layer.mlp
            delta = mlp.down_proj(ops.gelu_tanh_mul(mlp.gate_proj(normed), mlp.up_proj(normed)))
            delta = self._moe_branch(layer, delta, hidden)  # Gemma-4's MoE block on the modules (else delta)
            after = self.layers[i + 1].input_layernorm if i + 1 < n_layers else self.final_norm
            post = layer.post_feedforward_layernorm
            scalar = getattr(layer, "layer_scalar", None)
            if per_layer is not None:
                hidden, _ = ops.residual_norm(hidden, delta, None, norm_epsilon(post), offset, norm_out=False,
                                              delta_weight=weight(post), delta_eps=norm_epsilon(post), norm_delta=True)
                gated = layer.act_fn(layer.per_layer_input_gate(hidden)) * per_layer[:, :, i]
                delta, post = layer.per_layer_projection(gated), layer.post_per_layer_input_norm
            hidden, normed = ops.residual_norm(hidden, delta, weight(after), norm_epsilon(after), offset,
                                               delta_weight=weight(post), delta_eps=norm_epsilon(post), norm_delta=True,
                                               scalar=scalar)
            if taps_out is not None and i in self.tap_layer_ids:
                tap(i, normed if i == n_layers - 1 else hidden)  # the last layer's tap is after the final norm
        logits = self.lm_head(normed)[0]
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
