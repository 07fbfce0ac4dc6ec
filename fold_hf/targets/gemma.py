"""The Gemma text family on the fast loop: ``Gemma3ForCausalLM`` (``gemma3_text``), ``Gemma4ForCausalLM``
(``gemma4_text``) and their multimodal wrappers ``Gemma3ForConditionalGeneration`` / ``Gemma4ForConditionalGeneration``
with text-only ids. Everything the fast loop needs to know about these targets is here.

What differs from the default (Llama) family, all read from the model's own config and modules:

* **layer types**: ``config.layer_types`` mixes ``sliding_attention`` (a query at position q sees keys at
  ``q - window < p <= q``, ``window = config.sliding_window``) and ``full_attention`` layers.
* **per-type rope**: ``model.model.rotary_emb(x, positions, layer_type)``; Gemma-4's global layers have their own
  head_dim (``global_head_dim``) and a *proportional* partial rope (only the first ``partial_rotary_factor`` of the
  frequencies turn; the rest have cos 1, sin 0 in the model's own table, so one table lookup covers it).
* **attention**: q/k RMSNorms over head_dim (Gemma-3: ``(1 + w)``; Gemma-4: ``w``), Gemma-4's value norm without
  scale and ``attention_k_eq_v`` (global layers without ``v_proj``: values are the raw key projection), scaling
  ``query_pre_attn_scalar ** -0.5`` (Gemma-3) or 1.0 (Gemma-4) as ``self_attn.scaling``. Gemma-3's config carries
  ``attn_logit_softcapping``, but transformers' ``Gemma3Attention`` (5.17 and 5.24) does not pass it to the
  attention function, so the model attends without it; so do we (the fp32 test compares with the model).
* **sandwich norms**: ``h += post_attention_layernorm(attn)``; ``h += post_feedforward_layernorm(mlp(
  pre_feedforward_layernorm(h)))``; GELU-tanh MLP (the model's module).
* **Gemma-4 extras**: per-layer inputs (PLE: ``get_per_layer_inputs`` / ``project_per_layer_inputs`` of the model,
  then a gated projection after the MLP), ``layer_scalar``, KV sharing (``num_kv_shared_layers``: the last layers
  reuse the keys/values of the last earlier layer of their type).
* **embeddings** scaled by ``sqrt(hidden)`` (the model's embedding module does it); **final logit soft-capping**
  ``tanh(z / c) * c`` (``final_logit_softcapping``).

The static cache of a sliding layer is a *ring* of ``R = window + RING_SLACK`` entries (position p in slot
``p mod R``) instead of the whole capacity, so memory and the attention read stay ``O(window)`` at any context. It
is rollback-safe without copies: a verify of at most ``RING_SLACK + 1`` rows writes positions ``t .. t + L - 1``;
the slots it overwrites held positions ``<= t + L - 1 - R < t - window + 1``, older than any later query can see,
and rejected entries at ``t + n + 1 ..`` are rewritten by the next verify (or sit below the window of every
later query). Global layers keep the default family's full cache (the bucket attention or the decode kernel).
Every cache holds ``batch`` rows (batched rounds, issue 35): the host-length forwards of one row or several
(``forward_rows``) are :mod:`fold_hf.targets.gemma_rows`'; the device-length step of one row (``forward_static``)
runs a one-row runner, that of several rows (``forward_rows_static``: a batch's fixed-shape verify on the static and
graphs engines) the fused layers over rows (:mod:`fold_hf.targets.gemma_fused`).

**Multimodal wrappers** (text-only ids): the text config is ``config.text_config``, the text decoder
``model.model.language_model`` (the same ``Gemma3TextModel`` / ``Gemma4TextModel`` as in the causal LM, scaled
embedding included; the drafter's ``target_layer_ids`` index its layers), ``lm_head`` the wrapper's. What the
wrappers do differently for text (transformers 5.24), and so do we:

* ``Gemma3ForConditionalGeneration`` applies **no** final logit soft-capping (only ``Gemma3ForCausalLM`` does; the
  released Gemma-3 configs set none), and maps an image token id outside the vocabulary to 0 before the embedding;
* ``Gemma4ForConditionalGeneration`` soft-caps as the causal LM and replaces the image / video / audio placeholder
  ids (inside the vocabulary) by ``pad_token_id`` before the embedding and the per-layer inputs;
* both attend causally for text: the bidirectional attention of image tokens (Gemma-3's ``token_type_ids``,
  Gemma-4's ``use_bidirectional_attention="vision"`` with ``mm_token_type_ids``) needs image tokens, which the fast
  loop does not take.

**MoE block** (Gemma-4, ``enable_moe_block``): besides the dense MLP each layer has a router (the model's module:
scale-free norm, ``scale``, projection, fp32 softmax, top-k, renormalised, ``per_expert_scale``) and stacked experts
(:func:`~fold_hf.targets.moe.stacked_experts`: gathered by the router's device indices, no host read);
the feed-forward output is ``post_feedforward_layernorm(post_feedforward_layernorm_1(mlp(pre_ff(h))) +
post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(h))))``, with the router reading ``h`` (the residual
stream before the MLP), as the model's layer computes it.

Not taken by the fast loop (the reason is raised, and :func:`fold_hf.generate` runs them): bidirectional attention
(``use_bidirectional_attention`` ``True`` / ``"all"``), length-dependent rope types, experts in another layout
(:func:`~fold_hf.targets.moe.experts_unsupported`). Fused layers (the fast loop's default on CUDA): the
projections as the Llama family runs them (q|k|v and gate|up merged, the skinny GEMMs for a step's few rows; see
:mod:`fold_hf.targets.gemma_fused`), norms, rope + cache write, the ring attention and GELU-tanh run as fused kernels
(:mod:`fold_hf.kernels.hybrid.triton` and :mod:`fold_hf.kernels.gemma.triton`, from
:mod:`fold_hf.targets.gemma_fused`, whose ``fused_unsupported`` names what
they do not cover, and the fast loop then warns once and runs the layers on the modules).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..kernels.common import rotate_half
from .base import TARGET_ATTENTIONS, StaticTarget, UnsupportedTarget
from .common import tap_writer, wrapped_text_parts
from .gemma_fused import GemmaFusedLayers
from .gemma_rows import GemmaRows
from .moe import experts_unsupported, stacked_experts
from .taps import _unwrap

WRAPPERS = ("Gemma3ForConditionalGeneration", "Gemma4ForConditionalGeneration")
ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma4ForCausalLM") + WRAPPERS
RING_SLACK = 64  # ring entries beyond the window: the most rows one verify may write and then roll back, minus one
# (read when a runner is built: tests set it small so the tiny targets wrap their rings)


def text_parts(model: nn.Module):
    """(text config, text decoder) of a Gemma causal LM or of its multimodal wrapper (``config.text_config``,
    ``model.model.language_model``); raises :class:`UnsupportedTarget` on an unexpected layout."""
    return wrapped_text_parts(model, WRAPPERS)


def _text_token_map(model: nn.Module, config) -> tuple[list[int], int] | None:
    """(placeholder ids, replacement id) that the multimodal wrapper substitutes in text ids before embedding them,
    or None: Gemma-4 replaces its image / video / audio placeholders by ``pad_token_id``; Gemma-3 maps an image token
    id at or past the vocabulary to 0."""
    name = type(model).__name__
    outer = model.config
    if name == "Gemma4ForConditionalGeneration":
        ids = [getattr(outer, f, None) for f in ("image_token_id", "video_token_id", "audio_token_id")]
        ids = sorted({int(i) for i in ids if i is not None})
        return (ids, int(config.pad_token_id)) if ids else None
    if name == "Gemma3ForConditionalGeneration":
        image = getattr(outer, "image_token_id", None)
        if image is not None and image >= config.vocab_size:
            return [int(image)], 0
    return None


def _applies_final_softcap(model: nn.Module) -> bool:
    """Whether the model's forward soft-caps its logits by ``final_logit_softcapping``: the causal LMs and Gemma-4's
    wrapper do; ``Gemma3ForConditionalGeneration`` (5.24) does not."""
    return type(model).__name__ != "Gemma3ForConditionalGeneration"


def slices_before_taps(model: nn.Module, tap_layer_ids) -> bool:
    """Whether ``model(..., logits_to_keep=1)`` would cut the sequence before a tapped layer runs.

    Gemma-4 with KV sharing (``num_kv_shared_layers > 0``) drops all but the kept positions from the hidden states
    at the first shared layer (they read no cache of their own), so a tap at or after that layer would see only the
    last position; the foundation loop then prefills without ``logits_to_keep``.
    """
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config  # a multimodal wrapper's text model slices the same way
    shared = getattr(config, "num_kv_shared_layers", 0) or 0
    if not shared:
        return False
    first_shared = config.num_hidden_layers - shared
    return any(lid >= first_shared for lid in tap_layer_ids)


def masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
                     scaling: float) -> torch.Tensor:
    """Attention with an explicit visibility mask, GQA without repeating keys.

    Args:
        q: ``[1, Hq, L, D]`` rotated queries.
        keys, values: ``[1, Hkv, S, D]``.
        visible: ``[L, S]`` bool, True where query row l may read key s (every row must see at least one key).
        scaling: score scale.

    Returns:
        ``[1, Hq, L, D]`` in the values' dtype (softmax in fp32, or fp64 for fp64 inputs).
    """
    _, hq, L, D = q.shape
    hkv = keys.shape[1]
    group = hq // hkv
    rows = q.reshape(1, hkv, group * L, D)
    scores = torch.matmul(rows, keys.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) * scaling
    scores = scores.masked_fill(~visible.repeat(group, 1), -math.inf)
    probs = scores.softmax(-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(1, hq, L, D)


def check(model: nn.Module, capacity: int | None = None) -> None:
    """Raise :class:`UnsupportedTarget` when :class:`GemmaStaticTarget` cannot run ``model`` (unwrapped)."""
    name = type(model).__name__
    config, decoder = text_parts(model)
    if getattr(config, "enable_moe_block", False):
        for i, layer in enumerate(decoder.layers):
            router = getattr(layer, "router", None)
            if router is None or not hasattr(layer, "experts"):
                raise UnsupportedTarget(f"{name} with enable_moe_block: layer {i} has no router / experts "
                                        "(unexpected transformers layout)")
            reason = experts_unsupported(layer.experts)
            if reason is not None:
                raise UnsupportedTarget(f"{name} with enable_moe_block: layer {i}: {reason}; use fold_hf.generate")
    bidirectional = getattr(config, "use_bidirectional_attention", None)
    if bidirectional in (True, "all"):
        raise UnsupportedTarget(f"{name} with use_bidirectional_attention={bidirectional!r} is not causal")
    rope = getattr(config, "rope_parameters", None) or {}
    for layer_type in set(config.layer_types):
        params = rope.get(layer_type) or {}
        rope_type = params.get("rope_type", "default")
        if "dynamic" in rope_type or rope_type == "longrope":
            raise UnsupportedTarget(f"{layer_type} layers use rope_type {rope_type!r}, which changes with the "
                                    "length; the fast loop needs a fixed rope table")
    unknown = set(config.layer_types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise UnsupportedTarget(f"{name} has layer types {sorted(unknown)}; the fast loop runs sliding_attention "
                                "and full_attention layers")


class GemmaStaticTarget(GemmaRows, GemmaFusedLayers, StaticTarget):
    """:class:`~fold_hf.targets.base.StaticTarget` for Gemma-3 / Gemma-4 text targets (module docstring; the fused
    layers in :class:`~fold_hf.targets.gemma_fused.GemmaFusedLayers`, the host-length forwards of one row or
    several in :class:`~fold_hf.targets.gemma_rows.GemmaRows`).

    Per layer ``i``: ``self.windows[i]`` (None for a global layer), ``self.keys[i]`` / ``self.values[i]`` of shape
    ``[batch, Hkv_i, capacity, D_i]`` (global) or ``[batch, Hkv_i, R_i, D_i]`` (sliding ring), shared tensors for
    KV-shared layers (``self.kv_source[i]`` names the layer that writes them).
    """

    def __init__(self, target: nn.Module, capacity: int, tap_layer_ids=(), batch: int = 1) -> None:  # noqa: D107
        model = _unwrap(target)
        check(model, capacity)
        config, decoder = text_parts(model)
        self._setup(model, config, decoder, capacity, tap_layer_ids, batch)  # config: a wrapper's config.text_config
        self.num_heads = self.local_heads(config.num_attention_heads, "query heads")
        self.layer_types = list(config.layer_types)
        self.final_softcap = getattr(config, "final_logit_softcapping", None) if _applies_final_softcap(model) else None
        token_map = _text_token_map(model, config)
        self._placeholders = None if token_map is None else (
            torch.tensor(token_map[0], device=self.device), token_map[1])
        self.ple = bool(getattr(config, "hidden_size_per_layer_input", 0)) and hasattr(self.decoder,
                                                                                       "project_per_layer_inputs")
        n = len(self.layers)
        shared = getattr(config, "num_kv_shared_layers", 0) or 0
        first_shared = n - shared
        self.kv_source = []
        for i, layer in enumerate(self.layers):
            if shared and i >= first_shared:
                producers = [j for j in range(first_shared) if self.layer_types[j] == self.layer_types[i]]
                self.kv_source.append(producers[-1])
            else:
                self.kv_source.append(i)
        self.windows = [config.sliding_window if t == "sliding_attention" else None for t in self.layer_types]
        self.head_dims = [layer.self_attn.head_dim for layer in self.layers]
        self.scalings = [float(layer.self_attn.scaling) for layer in self.layers]
        self.kv_heads = []
        self.keys, self.values = [], []
        for i, layer in enumerate(self.layers):
            src = self.kv_source[i]
            if src != i:
                self.kv_heads.append(self.kv_heads[src])
                self.keys.append(self.keys[src])
                self.values.append(self.values[src])
                continue
            attn = layer.self_attn
            # out_features: the whole projection's (a tp_plan shard keeps it); this rank holds its share of the heads
            hkv = self.local_heads(attn.k_proj.out_features // self.head_dims[i], f"KV heads of layer {i}")
            self.kv_heads.append(hkv)
            length = self.capacity if self.windows[i] is None else min(self.capacity, self.windows[i] + RING_SLACK)
            shape = (self.batch, hkv, length, self.head_dims[i])
            self.keys.append(torch.zeros(shape, device=self.device, dtype=self.dtype))
            self.values.append(torch.zeros(shape, device=self.device, dtype=self.dtype))
        self.ring_slack = RING_SLACK
        self.num_kv_heads = self.kv_heads[0]
        self.head_dim = self.head_dims[0]
        self.scaling = self.scalings[0]
        self.tables = {}
        with torch.no_grad():
            positions = torch.arange(self.capacity, device=self.device)[None]
            for layer_type in dict.fromkeys(self.layer_types):
                dim = self.head_dims[self.layer_types.index(layer_type)]
                probe = torch.empty(1, 1, dim, device=self.device, dtype=self.dtype)
                cos, sin = self.decoder.rotary_emb(probe, positions, layer_type)
                self.tables[layer_type] = (cos[0], sin[0])  # [capacity, D_type]
        self.cos, self.sin = self.tables[self.layer_types[0]]
        self._hybrid_ops = None
        self._norm_offset = None
        self._rows_kernels = False  # the rows' attention kernels of a batch's verify: resolved by _rows_attention

    # ------------------------------------------------------------------ what the shared machinery asks
    def bytes_held(self) -> int:
        unique = {id(t): t for t in self.keys + self.values}
        return sum(t.numel() * t.element_size() for t in unique.values())

    @property
    def tap_width(self) -> int:
        return self.num_taps * self.config.hidden_size

    # ------------------------------------------------------------------ one layer
    def _qkv(self, i: int, layer, hidden: torch.Tensor, positions):
        """Normed hidden ``[A, L, H]`` at ``positions`` ``[L]`` or ``[A, L]`` -> rotated q ``[A, Hq, L, D]`` and
        (None for a KV-shared layer) rotated k, normed v ``[A, Hkv, L, D]``."""
        attn = layer.self_attn
        cos, sin = self.tables[self.layer_types[i]]
        cos, sin = cos[positions].unsqueeze(-3), sin[positions].unsqueeze(-3)  # [1, L, D] or [A, 1, L, D]
        shape = (*hidden.shape[:-1], -1, self.head_dims[i])
        q = attn.q_norm(attn.q_proj(hidden).view(shape)).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        if self.kv_source[i] != i:
            return q, None, None
        raw_k = attn.k_proj(hidden).view(shape)
        v_proj = getattr(attn, "v_proj", None)
        raw_v = v_proj(hidden).view(shape) if v_proj is not None else raw_k  # attention_k_eq_v
        k = attn.k_norm(raw_k).transpose(1, 2)
        k = k * cos + rotate_half(k) * sin
        v_norm = getattr(attn, "v_norm", None)
        v = (v_norm(raw_v) if v_norm is not None else raw_v).transpose(1, 2)
        return q, k, v

    def _text_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The ids the wrapper's text model embeds (:func:`_text_token_map`: placeholders substituted on the device),
        or ``input_ids`` for a causal LM."""
        if self._placeholders is None:
            return input_ids
        ids, replacement = self._placeholders
        hit = (input_ids[..., None] == ids).any(-1)
        return torch.where(hit, torch.full_like(input_ids, replacement), input_ids)

    def _embed(self, input_ids: torch.Tensor):
        """``(hidden [1, L, H], per-layer inputs [1, L, n_layers, d] or None)`` of ``input_ids [1, L]``: the text
        ids (:meth:`_text_ids`) through the model's scaled embedding, and Gemma-4's per-layer inputs (PLE)."""
        input_ids = self._text_ids(input_ids)
        hidden = self.embed(input_ids)
        if not self.ple:
            return hidden, None
        per_layer = self.decoder.get_per_layer_inputs(input_ids, hidden)
        return hidden, self.decoder.project_per_layer_inputs(hidden, per_layer)

    @staticmethod
    def _moe_branch(layer, mlp_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The feed-forward output before ``post_feedforward_layernorm``: ``mlp_out`` itself, or with Gemma-4's MoE
        block ``post_ff_1(mlp_out) + post_ff_2(experts(pre_ff_2(residual)))``, the router reading ``residual`` (the
        stream before the MLP); the experts by :func:`~fold_hf.targets.moe.stacked_experts`."""
        if not getattr(layer, "enable_moe_block", False):
            return mlp_out
        flat = residual.reshape(-1, residual.shape[-1])
        _, weights, index = layer.router(flat)
        routed = stacked_experts(layer.experts, layer.pre_feedforward_layernorm_2(flat), index, weights)
        routed = layer.post_feedforward_layernorm_2(routed.reshape(residual.shape))
        return layer.post_feedforward_layernorm_1(mlp_out) + routed

    def _tail(self, layer, hidden: torch.Tensor, attn_out: torch.Tensor, per_layer_input) -> torch.Tensor:
        """Everything of a decoder layer after the attention's ``o_proj`` (the layer's own modules)."""
        hidden = hidden + layer.post_attention_layernorm(attn_out)
        ff = self._moe_branch(layer, layer.mlp(layer.pre_feedforward_layernorm(hidden)), hidden)
        hidden = hidden + layer.post_feedforward_layernorm(ff)
        if per_layer_input is not None:
            gated = layer.act_fn(layer.per_layer_input_gate(hidden)) * per_layer_input
            hidden = hidden + layer.post_per_layer_input_norm(layer.per_layer_projection(gated))
        scalar = getattr(layer, "layer_scalar", None)
        if scalar is not None:
            hidden = hidden * scalar
        return hidden

    def _run_layers(self, input_ids: torch.Tensor, positions, write_kv, attend, taps_out, last_only: bool):
        """Shared body of every forward over ``input_ids [A, L]`` at ``positions`` ``[L]`` or ``[A, L]``:
        ``write_kv(i, k, v)`` stores layer i's new entries, ``attend(i, q)`` returns ``[A, Hq, L, D]``. Returns logits
        ``[L, V]`` (``[1, V]`` with ``last_only``; ``[A, L, V]`` for ``A > 1``), soft-capped as the model."""
        hidden, per_layer = self._embed(input_ids)
        A, L = input_ids.shape
        tap = tap_writer(self.tap_layer_ids, hidden.shape[-1], taps_out)
        last_layer = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(i, layer, layer.input_layernorm(hidden), positions)
            if k is not None:
                write_kv(i, k, v)
            out = attend(i, q).transpose(1, 2).reshape(A, L, -1)
            hidden = self._tail(layer, hidden, layer.self_attn.o_proj(out),
                                per_layer[:, :, i] if per_layer is not None else None)
            if taps_out is not None and i in self.tap_layer_ids:
                tap(i, self.final_norm(hidden) if i == last_layer else hidden)
        hidden = self.final_norm(hidden[:, -1:] if last_only else hidden)
        logits = self.lm_head(hidden)
        logits = logits[0] if A == 1 else logits
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    # ------------------------------------------------------------------ cmr's query tap
    def keep_queries_unsupported(self) -> str | None:
        """Both device-length forwards (module and fused layers) copy the kept layer's rotated queries."""
        return None

    def kept_query_keys(self, layer_idx: int) -> tuple[torch.Tensor, float]:
        """The cache the layer reads (a KV-shared layer's entry is its producer's buffer) and its own scale."""
        return self.keys[layer_idx], self.scalings[layer_idx]

    def kept_query_shape(self, layer_idx: int) -> tuple[int, int]:
        return self.num_heads, self.head_dims[layer_idx]

    # ------------------------------------------------------------------ device-length forward
    @torch.no_grad()
    def forward_static(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                       taps_out: torch.Tensor | None = None, attention: str = "bucket",
                       fused: bool = False) -> torch.Tensor:
        """CUDA-graph-friendly forward (same contract as :meth:`StaticTarget.forward_static`).

        Sliding layers write their rows into the ring at ``positions mod R`` and attend over the whole ring with a
        mask built on device: slot s holds position ``top - ((top - s) mod R)`` (``top = positions[-1]``), visible
        to query q when it is ``>= 0``, ``<= q`` and ``> q - window``. Global layers attend over the length
        ``bucket`` (``attention="bucket"``) or through the decode kernel (``"triton"``). ``fused=True``: the fused
        layers (:mod:`fold_hf.targets.gemma_fused`; :class:`UnsupportedTarget` where they cannot run the target).
        """
        if attention not in TARGET_ATTENTIONS:
            raise ValueError(f"attention must be one of {TARGET_ATTENTIONS}, got {attention!r}")
        if fused and attention != "triton":
            raise ValueError("fused layers run with attention='triton' (the decode kernel)")
        self._check_one_row()
        self._check_exact_forward(fused, attention)
        self._check_ring_slack(input_ids.shape[1])
        use_kernel = attention == "triton"
        if use_kernel and self._decode_attention is None:
            from ..kernels import default_decode_attention

            self._decode_attention = default_decode_attention(self.device)
        if fused:
            return self._forward_static_fused(input_ids, positions, bucket, taps_out)
        key_index = torch.arange(bucket, device=positions.device)
        global_visible = key_index[None, :] <= positions[:, None]
        top = positions[-1]
        rings = {}
        block_kv = {}

        def ring_visible(i):
            R = self.keys[i].shape[2]
            if R not in rings:
                slot_pos = top - torch.remainder(top - torch.arange(R, device=positions.device), R)
                delta = positions[:, None] - slot_pos[None, :]
                rings[R] = (slot_pos[None, :] >= 0) & (delta >= 0) & (delta < self.windows[i])
            return rings[R]

        def write_kv(i, k, v):
            if self.windows[i] is None:
                self.keys[i].index_copy_(2, positions, k)
                self.values[i].index_copy_(2, positions, v)
                block_kv[i] = (k, v)
            else:
                slots = torch.remainder(positions, self.keys[i].shape[2])
                self.keys[i].index_copy_(2, slots, k)
                self.values[i].index_copy_(2, slots, v)

        def attend(i, q):
            src = self.kv_source[i]
            if self.windows[i] is not None:
                return masked_attention(q, self.keys[src], self.values[src], ring_visible(src), self.scalings[i])
            if use_kernel:
                k, v = block_kv[src]
                out = self._decode_attention(q, self.keys[src], self.values[src], k, v, positions[:1].to(torch.int32),
                                             scaling=self.scalings[i], max_context_length=bucket)
                return out.transpose(1, 2)
            return masked_attention(q, self.keys[src][:, :, :bucket], self.values[src][:, :, :bucket],
                                    global_visible, self.scalings[i])

        return self._run_layers(input_ids, positions, write_kv, self._keeping_queries(attend), taps_out,
                                last_only=False)
