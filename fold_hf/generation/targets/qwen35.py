"""The Qwen3.5 target family on the fast loop: config fields, layers and the verify step with per-position states.

Qwen3.5 (``Qwen3_5ForCausalLM``, ``model_type`` ``qwen3_5_text``; the dense text model) interleaves Gated
DeltaNet linear-attention layers with a full-attention layer every fourth (``config.layer_types``:
``"linear_attention"`` / ``"full_attention"``, from ``full_attention_interval`` = 4). What the fast loop reads
from the model, all its own modules and weights (PEFT included):

* config: ``layer_types``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
  ``linear_num_key_heads`` (Hk), ``linear_num_value_heads`` (Hv), ``linear_key_head_dim`` (Dk),
  ``linear_value_head_dim`` (Dv), ``linear_conv_kernel_dim`` (K), ``hidden_act`` (silu), ``rope_parameters``
  (``partial_rotary_factor`` 0.25, ``mrope_section``: text positions are equal in every section, so the rope is
  the plain partial rope of the table ``rotary_emb`` computes);
* full-attention layer ``self_attn``: ``q_proj`` (``[2 * Hq * D, H]``: query and output gate interleaved per
  head), ``k_proj``, ``v_proj``, ``q_norm`` / ``k_norm`` (zero-centred RMSNorm over D), ``o_proj``; output
  ``o_proj(attn * sigmoid(gate))``;
* linear layer ``linear_attn``: ``in_proj_qkv`` (``[2 * Hk * Dk + Hv * Dv, H]``), ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``, ``conv1d`` (depthwise, kernel K, no bias), ``A_log``, ``dt_bias``, ``norm`` (gated RMSNorm over
  Dv), ``out_proj``; per token: causal depthwise conv + silu over the qkv projection, L2-normed q and k (q scaled
  by ``Dk ** -0.5``), ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``, the gated delta rule
  (:mod:`fold_hf.kernels.gated_delta`), ``out_proj(norm(o, z))``;
* both: ``input_layernorm``, ``post_attention_layernorm``, ``mlp`` (the module), final ``norm``, ``lm_head``.

State per linear layer: the convolution window (the last ``K - 1`` qkv projections, model dtype) and the
recurrent state ``[Hv, Dk, Dv]`` (fp32; fp64 for fp64 models). The verify step computes the state after *every*
block position (the convolution windows are slices of one ``[C, K - 1 + L]`` buffer, the recurrent states come
out of the kernel) and :meth:`Qwen35StaticTarget.accept` copies the accepted position's into place, on the device,
inside the captured verify graph: a rejection costs no replay and no host read. The prompt is prefilled through
the model's own forward (transformers' cache and kernels, chunked) and its states copied in.

Not covered (``check`` says so): the MoE variant (``Qwen3_5MoeForCausalLM``, routed experts), the multimodal
``Qwen3_5ForConditionalGeneration`` wrapper, activations other than silu, fused layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...modeling.rope import compute_dtype
from ..static_target import PREFILL_CHUNK, StaticTarget, UnsupportedTarget
from ..taps import HiddenTaps, _unwrap

ARCHITECTURES = ("Qwen3_5ForCausalLM",)
LAYER_TYPES = ("linear_attention", "full_attention")


def check(model, capacity: int | None = None) -> None:
    """Raise :class:`UnsupportedTarget` when :class:`Qwen35StaticTarget` cannot run ``model``."""
    name = type(model).__name__
    config = model.config
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
        raise UnsupportedTarget(f"{name} has no .model.layers / .model.rotary_emb (unexpected transformers layout)")
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) != len(decoder.layers) or any(t not in LAYER_TYPES for t in types):
        raise UnsupportedTarget(f"{name}: config.layer_types {types} must list {LAYER_TYPES} per layer")
    if "full_attention" not in types:
        raise UnsupportedTarget(f"{name} has no full-attention layer")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedTarget(f"{name}: hidden_act {config.hidden_act!r}; the linear layers' step uses silu")
    rope_type = getattr(decoder.rotary_emb, "rope_type", "default")
    if rope_type != "default":
        raise UnsupportedTarget(f"{name}: rope_type {rope_type!r}; the fast loop needs a fixed rope table")
    for i, layer in enumerate(decoder.layers):
        if types[i] == "linear_attention" and getattr(layer.linear_attn.conv1d, "bias", None) is not None:
            raise UnsupportedTarget(f"{name}: layer {i} conv1d has a bias")


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """As transformers' Qwen3.5 ``l2norm`` (FLA's): ``x * rsqrt(sum(x^2) + eps)``."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class Qwen35StaticTarget(StaticTarget):
    """:class:`~fold_hf.generation.static_target.StaticTarget` for Qwen3.5 (same interface, batch 1).

    Attention layers keep ``[1, Hkv, capacity, D]`` key/value buffers (``None`` at linear layers); linear layers
    keep ``conv[i] [C, K - 1]`` and ``recurrent[i] [Hv, Dk, Dv]``. Every forward over a block leaves its
    per-position states pending until :meth:`accept` selects one.
    """

    def __init__(self, target, capacity: int, tap_layer_ids=()) -> None:
        model = _unwrap(target)
        check(model, capacity)
        config = model.config
        self.model = model
        self.decoder = model.model
        self.layers = self.decoder.layers
        self.layer_types = list(config.layer_types)
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.final_norm = self.decoder.norm
        attn = next(layer.self_attn for layer, t in zip(self.layers, self.layer_types) if t == "full_attention")
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.capacity = int(capacity)
        self.tap_layer_ids = list(tap_layer_ids)
        weight = self.embed.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.state_dtype = compute_dtype(self.dtype)
        import sys

        module = sys.modules[type(attn).__module__]
        self._apply_rope = module.apply_rotary_pos_emb
        shape = (1, self.num_kv_heads, self.capacity, self.head_dim)
        full = [t == "full_attention" for t in self.layer_types]
        self.keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) if f else None for f in full]
        self.values = [torch.zeros(shape, device=self.device, dtype=self.dtype) if f else None for f in full]
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_dim = config.linear_key_head_dim
        self.v_dim = config.linear_value_head_dim
        self.kernel = config.linear_conv_kernel_dim
        self.conv_dim = 2 * self.num_k_heads * self.k_dim + self.num_v_heads * self.v_dim
        self.conv = [None if f else torch.zeros(self.conv_dim, self.kernel - 1, device=self.device, dtype=self.dtype)
                     for f in full]
        self.recurrent = [None if f else torch.zeros(self.num_v_heads, self.k_dim, self.v_dim, device=self.device,
                                                     dtype=self.state_dtype) for f in full]
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        with torch.no_grad():
            # text positions: the same in the three mrope sections ([3, 1, capacity], as 5.17 and 5.24 both take)
            positions = torch.arange(self.capacity, device=self.device).expand(3, 1, self.capacity)
            probe = torch.empty(1, 1, self.head_dim, device=self.device, dtype=self.dtype)
            cos, sin = self.decoder.rotary_emb(probe, positions)
        self.cos, self.sin = cos.reshape(-1, self.capacity, cos.shape[-1])[0], sin.reshape(
            -1, self.capacity, sin.shape[-1])[0]  # [capacity, rotary dims]
        self.length = 0
        self._decode_attention = None
        self._layer_ops = None
        self._gated_delta = None

    def fused_unsupported(self) -> str | None:
        return "Qwen3.5 layers (gated attention, Gated DeltaNet) have no fused elementwise kernels"

    def bytes_held(self) -> int:
        tensors = [t for t in self.keys + self.values + self.conv + self.recurrent if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ linear attention
    def _linear(self, i: int, layer, hidden: torch.Tensor) -> torch.Tensor:
        """Gated DeltaNet over the block ``hidden [1, L, H]`` from the committed state; keeps every position's
        state pending. Returns ``[1, L, H]``."""
        from ...kernels.gated_delta import default_gated_delta

        if self._gated_delta is None:
            self._gated_delta = default_gated_delta(self.device)
        lin = layer.linear_attn
        L = hidden.shape[1]
        cd = self.state_dtype
        qkv = lin.in_proj_qkv(hidden)[0]  # [L, C]
        z = lin.in_proj_z(hidden)
        b = lin.in_proj_b(hidden)[0]
        a = lin.in_proj_a(hidden)[0]
        window = torch.cat((self.conv[i], qkv.transpose(0, 1).to(self.dtype)), dim=1)  # [C, K - 1 + L]
        mixed = F.conv1d(window[None].to(lin.conv1d.weight.dtype), lin.conv1d.weight, groups=self.conv_dim)
        mixed = F.silu(mixed)[0].transpose(0, 1).to(hidden.dtype)  # [L, C]
        kd = self.num_k_heads * self.k_dim
        q = mixed[:, :kd].reshape(L, self.num_k_heads, self.k_dim).to(cd)
        k = mixed[:, kd : 2 * kd].reshape(L, self.num_k_heads, self.k_dim).to(cd)
        v = mixed[:, 2 * kd :].reshape(L, self.num_v_heads, self.v_dim).to(cd)
        q = _l2norm(q) * (self.k_dim ** -0.5)
        k = _l2norm(k)
        beta = b.sigmoid().to(cd)
        g = (-lin.A_log.float().exp() * F.softplus(a.float() + lin.dt_bias)).to(cd)
        out, states = self._gated_delta(q, k, v, g, beta, self.recurrent[i])
        self._pending[i] = (window, states)
        out = lin.norm(out.to(hidden.dtype).reshape(-1, self.v_dim), z.reshape(-1, self.v_dim))
        return lin.out_proj(out.reshape(1, L, -1))

    @torch.no_grad()
    def accept(self, n) -> None:
        """Commit the state after block position ``n`` (int or ``[1]`` long device tensor: the accepted drafts;
        the block's first ``n + 1`` tokens are kept) of the last forward."""
        if not self._pending:
            return
        if not isinstance(n, torch.Tensor):
            n = torch.tensor([int(n)], device=self.device)
        n = n.reshape(1).to(self.device)
        columns = n + 1 + torch.arange(self.kernel - 1, device=self.device)
        for i, (window, states) in self._pending.items():
            self.conv[i].copy_(window.index_select(1, columns))
            self.recurrent[i].copy_(states.index_select(0, n)[0])
        self._pending.clear()

    def step_state(self) -> list[torch.Tensor]:
        """The committed convolution and recurrent states: a verify reads them and :meth:`accept` overwrites them."""
        return [t for t in self.conv + self.recurrent if t is not None]

    # ------------------------------------------------------------------ layers
    def _run_layers(self, input_ids, cos, sin, write_kv, attend, taps_out, last_only):
        hidden = self.embed(input_ids)
        L = input_ids.shape[1]
        H = hidden.shape[-1]
        last_layer = len(self.layers) - 1
        self._pending.clear()
        for i, layer in enumerate(self.layers):
            residual = hidden
            normed = layer.input_layernorm(hidden)
            if self.layer_types[i] == "linear_attention":
                hidden = residual + self._linear(i, layer, normed)
            else:
                attn = layer.self_attn
                query, gate = torch.chunk(attn.q_proj(normed).view(1, L, -1, 2 * self.head_dim), 2, dim=-1)
                gate = gate.reshape(1, L, -1)
                q = attn.q_norm(query).transpose(1, 2)
                k = attn.k_norm(attn.k_proj(normed).view(1, L, -1, self.head_dim)).transpose(1, 2)
                v = attn.v_proj(normed).view(1, L, -1, self.head_dim).transpose(1, 2)
                q, k = self._apply_rope(q, k, cos[None], sin[None])
                write_kv(i, k, v)
                out = attend(i, q).transpose(1, 2).reshape(1, L, -1)
                hidden = residual + attn.o_proj(out * torch.sigmoid(gate))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            if taps_out is not None and i in self.tap_layer_ids:
                tapped = self.final_norm(hidden) if i == last_layer else hidden
                for slot in (n for n, lid in enumerate(self.tap_layer_ids) if lid == i):
                    taps_out[:, :, slot * H : (slot + 1) * H] = tapped
        hidden = self.final_norm(hidden[:, -1:] if last_only else hidden)
        return self.lm_head(hidden)[0]

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk: int = PREFILL_CHUNK, on_taps=None) -> torch.Tensor:
        """The prompt ``[1, P]`` through the model's own forward (transformers' cache and kernels), ``chunk``
        tokens at a time; its keys, values, convolution and recurrent states are then copied into the static
        buffers. ``on_taps(features [1, c, n_taps * H], start)`` per chunk. Returns the last logits ``[V]``."""
        import inspect

        from transformers import DynamicCache

        P = input_ids.shape[1]
        if P > self.capacity:
            raise ValueError(f"{P} tokens exceed the cache capacity {self.capacity}")
        params = set(inspect.signature(self.model.forward).parameters)
        cache_name = "cache" if "cache" in params else "past_key_values"
        cache = DynamicCache(config=self.model.config)
        taps = HiddenTaps(self.model, self.tap_layer_ids, device=self.device) if (
            on_taps is not None and self.num_taps) else None
        logits = None
        for start in range(0, P, chunk):
            piece = input_ids[:, start : start + chunk]
            if taps is not None:
                with taps:
                    out = self.model(input_ids=piece, **{cache_name: cache}, use_cache=True, logits_to_keep=1)
                on_taps(taps.features().to(self.dtype), start)
            else:
                out = self.model(input_ids=piece, **{cache_name: cache}, use_cache=True, logits_to_keep=1)
            logits = out.logits[0, -1]
        for i, layer in enumerate(cache.layers):
            if self.layer_types[i] == "full_attention":
                self.keys[i][:, :, :P] = layer.keys
                self.values[i][:, :, :P] = layer.values
            else:
                conv = layer.conv_states[0][0]  # [C, K'] (K' = K, zero-padded on the left for short prompts)
                tail = conv[:, -(self.kernel - 1):]
                self.conv[i].zero_()
                self.conv[i][:, self.kernel - 1 - tail.shape[1]:] = tail
                self.recurrent[i].copy_(layer.recurrent_states[0][0])
        self._pending.clear()
        self.length = P
        return logits


def register() -> dict:
    """This family's entry for :data:`fold_hf.generation.static_target.TARGET_FAMILIES`."""
    return {name: (check, Qwen35StaticTarget) for name in ARCHITECTURES}


__all__ = ["ARCHITECTURES", "Qwen35StaticTarget", "check", "register"]
