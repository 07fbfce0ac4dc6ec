"""`StaticTarget`: our own forward of a Llama-family target over its own weights, with a preallocated KV cache.

transformers' ``forward`` costs tens of milliseconds of Python per step at 8B scale (docs/design.md §6) and its
``DynamicCache`` reallocates; neither can be captured in a CUDA graph. This runner calls the model's own
submodules (embedding, RMSNorms, q/k/v/o projections, q/k norms where the model has them, MLP, final norm,
lm_head) so every weight is the model's own (no copies, PEFT wrappers included) and the numerics follow the
model's; only the cache and the attention are ours:

* KV cache: one ``[1, Hkv, capacity, D]`` key and value buffer per layer, keys stored rotated as transformers
  stores them. Rollback = rewind a length: entries past the length are never read and get overwritten.
* RoPE: the model's rotary embedding evaluated once for positions ``0 .. capacity-1`` (elementwise, so a table
  lookup gives the same values as calling it per step).
* Attention, two forms:
  - ``forward`` (host lengths): SDPA over the exact prefix ``[0, start + Lq)``; no mask for one query (flash
    decoding), a lower-right causal bias for several.
  - ``forward_static`` (device lengths, fixed shapes, CUDA-graph friendly): positions come from a device
    tensor; attention reads a fixed *bucket* of the cache ``[0, S)`` with a mask built on device from the
    positions. Buckets grow with the context (length dispatch) so a short context does not pay for the whole
    capacity. The query heads of one KV head are stacked as rows, so GQA reads each KV head once.
    ``attention="triton"``: a split-context decode kernel
    (:func:`fold_hf.kernels.fold_read.triton.decode_attention_triton`; its torch twin off CUDA) reads the cache
    prefix ``[0, start)`` up to a length it loads from the device, plus the block's own keys causally, so no
    ``[Hkv, G * L, S]`` fp32 score tensor is written; the bucket then only sizes the kernel's splits.
* Fused layers (``fused=True`` with ``attention="triton"``): the norms' residual adds, the rope with the cache
  write and the MLP's ``silu(gate) * up`` run as three fused launches (:mod:`fold_hf.kernels.layer.triton`,
  torch twins off CUDA) instead of ~30 small module kernels per layer; projections stay the model's modules
  (PEFT included). Llama-style RMSNorm, SiLU MLP and full rotary only (:meth:`StaticTarget.fused_unsupported`).
* Projections laid out for decode (every forward, default on; ``$FOLD_HF_CONCAT_PROJECTIONS=0`` turns it off): q|k|v
  and gate|up run as one GEMM each over buffers the model's own q/k/v and gate/up parameters become views of
  (:mod:`fold_hf.generation.weight_layout`: nothing held twice, writes through the modules reach them). A layer
  whose projections are not plain ``nn.Linear`` in the model dtype (LoRA, quantized) runs them as modules, with a
  warning naming why (:meth:`StaticTarget.decode_projections`). On CUDA a decode step's projections (1 to 16 rows)
  in the fused layers run the skinny Triton GEMMs of :mod:`fold_hf.kernels.gemm.triton` where they measured faster
  than cuBLAS (gate|up with ``silu(gate) * up`` in the same launch); ``$FOLD_HF_SKINNY_GEMM=0`` keeps cuBLAS. An AR
  step's Triton launches there use programmatic dependent launch (:mod:`fold_hf.kernels.triton_pdl`; ``$FOLD_HF_PDL=0``
  turns it off).
* Taps: the outputs of the drafter's tapped layers (the last layer's after the final norm, as
  :class:`~fold_hf.generation.taps.HiddenTaps` captures them) concatenated ``[1, Lq, n_taps * H]``.

Supported: ``LlamaForCausalLM`` (SmolLM2 included), ``MistralForCausalLM``, ``Qwen2ForCausalLM``,
``Qwen3ForCausalLM``, without sliding-window layers shorter than the capacity and without position-dependent
rope (``dynamic``, ``longrope``). Anything else raises :class:`UnsupportedTarget` naming why.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from ..compat import has_norm_epsilon, norm_epsilon
from ..kernels.gemm.cpu import _hooked, linear_module
from .taps import _unwrap
from .weight_layout import (
    DecodeProjections,
    concat_projections_enabled,
    decode_projections_unsupported,
    warn_separate_once,
)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
PREFILL_CHUNK = 8192
FUSED_PREFILL_ENV = "FOLD_HF_FUSED_PREFILL"  # 0: prefill chunks through the module kernels
PREFILL_ATTENTION_MIN_ROWS = 64  # more query rows than a verify block: the prefill attention kernels
TARGET_ATTENTIONS = ("bucket", "triton")


class UnsupportedTarget(ValueError):
    """The fast loop cannot run this target (the message says why)."""


def _sliding_window_of(model, layer) -> int | None:
    window = getattr(layer.self_attn, "sliding_window", None)
    if window is None and type(model).__name__ == "MistralForCausalLM":
        window = getattr(model.config, "sliding_window", None)
    return window


# Target families with their own module (config fields, layers, fast-path step): architecture name -> module path;
# the module's ``register()`` returns {architecture: (check(model, capacity), runner class)}.
TARGET_FAMILIES = {
    "Qwen3_5ForCausalLM": "fold_hf.generation.targets.qwen35",
    "Qwen3_5MoeForCausalLM": "fold_hf.generation.targets.qwen35",
    "Qwen3_5ForConditionalGeneration": "fold_hf.generation.targets.qwen35",
    "Qwen3_5MoeForConditionalGeneration": "fold_hf.generation.targets.qwen35",
    "Gemma3ForCausalLM": "fold_hf.generation.targets.gemma",
    "Gemma4ForCausalLM": "fold_hf.generation.targets.gemma",
    "Gemma3ForConditionalGeneration": "fold_hf.generation.targets.gemma",
    "Gemma4ForConditionalGeneration": "fold_hf.generation.targets.gemma",
}


def _family(name: str):
    """(check, runner class) of a registered family for architecture ``name``, or None."""
    path = TARGET_FAMILIES.get(name)
    if path is None:
        return None
    import importlib

    return importlib.import_module(path).register()[name]


def prepare_text_request(target: nn.Module) -> None:
    """Before a text-only request through the model's own forward (:class:`fold_hf.generation.loop.ForwardRunner`):
    the family module's ``prepare_text_request(model)``, when it has one, clears wrapper state that such a request
    must not inherit (Qwen3.5's wrapper keeps the rope deltas of its last image request)."""
    model = _unwrap(target)
    path = TARGET_FAMILIES.get(type(model).__name__)
    if path is None:
        return
    import importlib

    hook = getattr(importlib.import_module(path), "prepare_text_request", None)
    if hook is not None:
        hook(model)


def build_static_target(target: nn.Module, capacity: int, tap_layer_ids=()) -> "StaticTarget":
    """The static runner of ``target``'s family (:class:`StaticTarget` for the Llama family)."""
    family = _family(type(_unwrap(target)).__name__)
    runner = family[1] if family is not None else StaticTarget
    return runner(target, capacity, tap_layer_ids)


def check_target(target: nn.Module, capacity: int | None = None) -> None:
    """Raise :class:`UnsupportedTarget` when :class:`StaticTarget` cannot run ``target``."""
    model = _unwrap(target)
    name = type(model).__name__
    family = _family(name)
    if family is not None:
        family[0](model, capacity)
        return
    if name not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedTarget(
            f"the fast loop runs {', '.join(SUPPORTED_ARCHITECTURES + tuple(TARGET_FAMILIES))}; {name} is not one "
            "of them (use fold_hf.generate, which runs any causal LM)")
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


def bucket_length(needed: int, capacity: int, minimum: int = 256) -> int:
    """Attention length of the static forward for ``needed`` keys: a multiple of a step that grows with the
    length (at most 1/8 of it), so the padding read is at most ~12.5% and few buckets (graphs) exist."""
    if needed > capacity:
        raise ValueError(f"{needed} keys do not fit the cache capacity {capacity}")
    step = max(minimum, 2 ** max(0, math.floor(math.log2(max(needed, 1))) - 3))
    return min(capacity, -(-needed // step) * step)


_RMS_NORMS = ("LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
# MLPs computing down_proj(act_fn(gate_proj(x)) * up_proj(x)), which the host-length forward may run as gate|up
_GATED_MLPS = ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")



def _project(gemm, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module(x)``: through ``gemm(x, weight, bias)`` (a decode step's skinny GEMM) when given and ``module`` is a
    plain, hook-free ``nn.Linear`` with a contiguous weight in ``x``'s dtype; else
    :func:`~fold_hf.kernels.gemm.cpu.linear_module` (a LoRA wrapper or a quantized layer runs as its module)."""
    if (gemm is not None and type(module) is nn.Linear and module.weight.dtype == x.dtype
            and module.weight.is_contiguous() and not _hooked(module)):
        return gemm(x, module.weight, module.bias)
    return linear_module(module, x)

class StaticTarget:
    """Forward passes of a Llama-family causal LM over a preallocated KV cache (batch 1).

    Args:
        target: the transformers model (or a PEFT wrapper of one).
        capacity: cache length in tokens (prompt + generated + one block of slack).
        tap_layer_ids: the drafter's tapped layers (``hidden_states[l + 1]`` of each), or ``()``.
    """

    def __init__(self, target: nn.Module, capacity: int, tap_layer_ids=()) -> None:
        check_target(target, capacity)
        model = _unwrap(target)
        self.model = model
        self.decoder = model.model
        self.layers = self.decoder.layers
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.final_norm = self.decoder.norm
        attn = self.layers[0].self_attn
        config = model.config
        self.config = config  # the text model's config (a family runner over a multimodal wrapper sets its text_config)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.capacity = int(capacity)
        self.tap_layer_ids = list(tap_layer_ids)
        weight = self.embed.weight
        self.device, self.dtype = weight.device, weight.dtype
        self._apply_rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        shape = (1, self.num_kv_heads, self.capacity, self.head_dim)
        self.keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        with torch.no_grad():
            positions = torch.arange(self.capacity, device=self.device)[None]
            probe = torch.empty(1, 1, self.head_dim, device=self.device, dtype=self.dtype)
            cos, sin = self.decoder.rotary_emb(probe, positions)
        self.cos, self.sin = cos[0], sin[0]  # [capacity, D]
        self.length = 0  # tokens in the cache (host view; the static path keeps its own on device)
        self._decode_attention = None  # resolved on first use of attention="triton"
        self._layer_ops = None  # resolved on first use of fused=True

    def accept(self, n) -> None:
        """Acceptance of ``n`` drafts after a verify (int or ``[1]`` device tensor). Nothing to do here: a KV cache
        rolls back by its length; families with recurrent state select the accepted position's state."""

    def step_state(self) -> list[torch.Tensor]:
        """Buffers a verify both reads and overwrites (:meth:`accept` commits a recurrent family's state into the
        buffer the next verify starts from), so that a captured step's warm-up runs can restore them
        (:class:`fold_hf.generation.graphs.CapturedStep`). Empty for a KV cache: its writes are idempotent."""
        return []

    # ------------------------------------------------------------------ cmr's query tap (a separate hook)
    query_keep = None  # (layer index, [1, Hq, rows, D] buffer) while a cmr request runs, else None

    def keep_queries_unsupported(self) -> str | None:
        """Why :meth:`keep_queries` cannot run on this target (None when it can)."""
        if type(self).forward_static is not StaticTarget.forward_static or \
                type(self)._run_layers is not StaticTarget._run_layers:
            return f"{type(self).__name__}'s verify step does not keep its queries"
        return None

    def kept_query_keys(self, layer_idx: int) -> tuple[torch.Tensor, float]:
        """The key cache ``[1, Hkv, capacity, Dh]`` and logit scale that layer ``layer_idx``'s kept queries attend
        with (a family with shared KV or per-layer scales says which)."""
        return self.keys[layer_idx], self.scaling

    def keep_queries(self, layer_idx: int | None, rows: int = 0) -> torch.Tensor | None:
        """CMR's refreshes read the target's attention of one query (:mod:`fold_hf.generation.static_retrieval`):
        from now on :meth:`forward_static` copies layer ``layer_idx``'s rotated queries of its ``rows`` rows into
        the returned ``[1, Hq, rows, D]`` buffer (one small copy per verify, in that layer only); ``None`` stops.
        Only cmr requests turn this on, and the fast loop keys its captured verify steps by it, so every other
        mode's verify is unchanged."""
        if layer_idx is None:
            self.query_keep = None
            return None
        reason = self.keep_queries_unsupported()
        if reason is not None:
            raise UnsupportedTarget(reason)
        # one buffer per (layer, rows) for the runner's lifetime: captured steps of earlier requests read it
        buffers = self.__dict__.setdefault("_kept_queries", {})
        if (layer_idx, rows) not in buffers:
            heads, head_dim = self.kept_query_shape(layer_idx)
            buffers[(layer_idx, rows)] = torch.zeros(1, heads, rows, head_dim, device=self.device, dtype=self.dtype)
        self.query_keep = (layer_idx, buffers[(layer_idx, rows)])
        return self.query_keep[1]

    def kept_query_shape(self, layer_idx: int) -> tuple[int, int]:
        """(query heads, head dim) of layer ``layer_idx``."""
        return self.num_heads, self.head_dim

    def _keeping_queries(self, attend):
        """``attend`` that first copies the kept layer's queries (:meth:`keep_queries`), or ``attend`` itself."""
        keep = self.query_keep
        if keep is None:
            return attend
        layer, buffer = keep

        def attend_and_keep(i, q):
            if i == layer:
                buffer[:, :, : q.shape[2]].copy_(q)
            return attend(i, q)

        return attend_and_keep

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

    def decode_projections(self, layer) -> DecodeProjections | None:
        """Layer ``layer``'s q|k|v and gate|up as one GEMM each (:mod:`~fold_hf.generation.weight_layout`; the first
        call lays the weights out, later calls find them so), or None: off by ``$FOLD_HF_CONCAT_PROJECTIONS=0``, or
        the layer's projections are not plain Linears in the model dtype (warned once, naming why)."""
        if not concat_projections_enabled():
            return None
        reason = decode_projections_unsupported(layer.self_attn, layer.mlp, self.dtype)
        if reason is not None:
            warn_separate_once(f"static target: {reason}")
            return None
        return DecodeProjections(layer.self_attn, layer.mlp)

    # ------------------------------------------------------------------ sizes
    @property
    def num_taps(self) -> int:
        return len(self.tap_layer_ids)

    @property
    def tap_width(self) -> int:
        return self.num_taps * self.config.hidden_size

    def bytes_held(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    # ------------------------------------------------------------------ one layer
    def _qkv(self, layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
             projections: DecodeProjections | None = None):
        """Normed hidden ``[1, L, H]`` -> rotated q ``[1, Hq, L, D]``, rotated k and v ``[1, Hkv, L, D]``."""
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
        q, k = self._apply_rope(q.transpose(1, 2), k.transpose(1, 2), cos[None], sin[None])
        return q, k, v

    def _run_layers(self, input_ids: torch.Tensor, cos, sin, write_kv, attend, taps_out: torch.Tensor | None,
                    last_only: bool) -> torch.Tensor:
        """Shared body of every forward. ``write_kv(i, k, v)`` stores the new entries of layer ``i``,
        ``attend(i, q)`` returns ``[1, Hq, L, D]``. Returns logits ``[L, V]`` (or ``[1, V]`` with ``last_only``)."""
        hidden = self.embed(input_ids)
        L = input_ids.shape[1]
        taps = {lid: n for n, lid in enumerate(self.tap_layer_ids)}
        H = hidden.shape[-1]
        last_layer = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            residual = hidden
            projections = self.decode_projections(layer)
            q, k, v = self._qkv(layer, layer.input_layernorm(hidden), cos, sin, projections)
            write_kv(i, k, v)
            out = attend(i, q).transpose(1, 2).reshape(1, L, -1)
            hidden = residual + linear_module(layer.self_attn.o_proj, out)
            mlp, normed = layer.mlp, layer.post_attention_layernorm(hidden)
            if projections is not None and type(mlp).__name__ in _GATED_MLPS:
                gate, up = projections.gate_up(normed)
                hidden = hidden + linear_module(mlp.down_proj, mlp.act_fn(gate) * up)
            else:
                hidden = hidden + mlp(normed)
            if taps_out is not None and i in taps:
                tapped = self.final_norm(hidden) if i == last_layer else hidden
                for slot in (n for n, lid in enumerate(self.tap_layer_ids) if lid == i):
                    taps_out[:, :, slot * H : (slot + 1) * H] = tapped
        hidden = self.final_norm(hidden[:, -1:] if last_only else hidden)
        return linear_module(self.lm_head, hidden)[0]

    # ------------------------------------------------------------------ host-length forward
    def prefix_mask(self, L: int, start: int):
        """``(attn_mask, is_causal)`` of ``L`` queries at ``start ..`` over the prefix ``[0, start + L)``: none for one
        query, causal from 0, else lower-right causal (for a CPU verify block a boolean mask built once per forward:
        SDPA would materialize the bias object again in every layer)."""
        if L == 1:
            return None, False
        if start == 0:
            return None, True
        if self.device.type == "cpu" and L <= 64:  # a verify block (a prefill chunk keeps the bias object)
            mask = torch.ones(L, start + L, dtype=torch.bool)
            mask[:, start:] = torch.ones(L, L, dtype=torch.bool).tril()
            return mask, False
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(L, start + L), False

    def _attend_prefix(self, i: int, q: torch.Tensor, start: int, prefix_mask=None) -> torch.Tensor:
        L = q.shape[2]
        keys = self.keys[i][:, :, : start + L]
        values = self.values[i][:, :, : start + L]
        mask, causal = prefix_mask if prefix_mask is not None else self.prefix_mask(L, start)
        probe = self.__dict__.get("attention_probe")  # cmr's refreshes (fold_hf.modeling.retrieval), else None
        if probe is not None and probe.armed and i == probe.layer_idx:
            probe.capture(q, keys, self.scaling)
        if L > PREFILL_ATTENTION_MIN_ROWS:  # a prefill chunk: flash-class attention (fold_hf.kernels.prefill_attention)
            from ..kernels.prefill_attention import prefill_attention

            return prefill_attention(q, keys, values, start, self.scaling)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal,
                                              scale=self.scaling, enable_gqa=True)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, start: int, taps_out: torch.Tensor | None = None,
                last_only: bool = False) -> torch.Tensor:
        """Run ``input_ids [1, L]`` at positions ``start .. start+L-1``; the cache then holds ``start + L`` tokens.

        Args:
            taps_out: ``[1, L, n_taps * H]`` buffer receiving the tapped features, or None.
            last_only: return only the last row's logits.

        Returns:
            logits ``[L, V]`` (``[1, V]`` with ``last_only``) in the model's dtype.
        """
        L = input_ids.shape[1]
        if start + L > self.capacity:
            raise ValueError(f"{start + L} tokens exceed the cache capacity {self.capacity}")
        cos, sin = self.cos[start : start + L], self.sin[start : start + L]

        def write_kv(i, k, v):
            self.keys[i][:, :, start : start + L] = k
            self.values[i][:, :, start : start + L] = v

        mask = self.prefix_mask(L, start)
        logits = self._run_layers(input_ids, cos, sin, write_kv, lambda i, q: self._attend_prefix(i, q, start, mask),
                                  taps_out, last_only)
        self.length = start + L
        return logits

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk: int = PREFILL_CHUNK, on_taps=None) -> torch.Tensor:
        """Fill the cache with the prompt ``[1, P]`` in chunks; returns the last position's logits ``[V]``.

        ``on_taps(features [1, c, n_taps * H], start)`` receives each chunk's tapped features (so a 128K prompt
        never holds all its taps at once).
        """
        P = input_ids.shape[1]
        logits = None
        fused = self._fused_prefill()
        for start in range(0, P, chunk):
            piece = input_ids[:, start : start + chunk]
            taps = None
            if on_taps is not None and self.num_taps:
                taps = torch.empty(1, piece.shape[1], self.tap_width, device=self.device, dtype=self.dtype)
            if fused:
                logits = self._prefill_chunk_fused(piece, start, taps)
            else:
                logits = self.forward(piece, start, taps_out=taps, last_only=True)
            if taps is not None:
                on_taps(taps, start)
        return logits[-1]

    def _fused_prefill(self) -> bool:
        """Whether :meth:`prefill` runs its chunks through the fused layers (:meth:`_prefill_chunk_fused`): on CUDA,
        ``$FOLD_HF_FUSED_PREFILL`` not ``0``, the Llama family's own forward and :meth:`fused_unsupported` None."""
        import os

        if self.device.type != "cuda" or os.environ.get(FUSED_PREFILL_ENV, "1") == "0":
            return False
        if type(self)._fused_layers is not StaticTarget._fused_layers or type(self).forward is not \
                StaticTarget.forward or self.__dict__.get("attention_probe") is not None:
            return False
        return self.fused_unsupported() is None

    def _prefill_chunk_fused(self, input_ids: torch.Tensor, start: int, taps_out: torch.Tensor | None):
        """One prefill chunk ``[1, L]`` at ``start``: the fused layers' elementwise kernels (norms, rope with the
        cache write, ``silu(gate) * up``) around cuBLAS projections and the prefill attention
        (:func:`fold_hf.kernels.prefill_attention.prefill_attention`); logits ``[1, V]`` of the last row."""
        from ..kernels.prefill_attention import prefill_attention

        L = input_ids.shape[1]
        if start + L > self.capacity:
            raise ValueError(f"{start + L} tokens exceed the cache capacity {self.capacity}")
        positions = torch.arange(start, start + L, device=self.device)

        def attend(i, q):  # q [1, Hq, L, D] -> [1, L, Hq, D]
            keys, values = self.keys[i][:, :, : start + L], self.values[i][:, :, : start + L]
            return prefill_attention(q, keys, values, start, self.scaling).transpose(1, 2)

        with torch.no_grad():
            logits = self._fused_layers(input_ids, positions, start + L, taps_out, attend=attend, last_only=True)
        self.length = start + L
        return logits

    # ------------------------------------------------------------------ device-length forward
    @torch.no_grad()
    def forward_static(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                       taps_out: torch.Tensor | None = None, attention: str = "bucket",
                       fused: bool = False) -> torch.Tensor:
        """CUDA-graph-friendly forward: nothing here reads a device value on the host.

        Args:
            input_ids: ``[1, L]`` tokens.
            positions: ``[L]`` long device tensor, consecutive positions of the tokens (start = cache length).
            bucket: S, keys read by the attention (static; ``positions[-1] < S <= capacity``); keys past each
                query's position are masked.
            taps_out: ``[1, L, n_taps * H]`` buffer for the tapped features, or None.
            attention: ``"bucket"`` (two matmuls over the bucket with a masked fp32 softmax) or ``"triton"``
                (the decode kernel over the prefix ``[0, positions[0])`` plus the block; its torch twin when the
                kernel cannot run here). Both give the causal attention of the block.
            fused: with ``attention="triton"``, run the layers' elementwise work as fused kernels (module
                docstring); raises :class:`UnsupportedTarget` when :meth:`fused_unsupported` says why not.

        Returns:
            logits ``[L, V]``.
        """
        if attention not in TARGET_ATTENTIONS:
            raise ValueError(f"attention must be one of {TARGET_ATTENTIONS}, got {attention!r}")
        if fused:
            if attention != "triton":
                raise ValueError("fused layers run with attention='triton' (the decode kernel)")
            return self._forward_static_fused(input_ids, positions, bucket, taps_out)
        L = input_ids.shape[1]
        cos, sin = self.cos[positions], self.sin[positions]
        if attention == "triton":
            return self._forward_static_decode(input_ids, positions, bucket, cos, sin, taps_out)
        group = self.num_heads // self.num_kv_heads
        key_index = torch.arange(bucket, device=positions.device)
        visible = (key_index[None, :] <= positions[:, None]).repeat(group, 1)  # rows ordered (head in group, query)
        hidden_keys = ~visible

        def write_kv(i, k, v):
            self.keys[i].index_copy_(2, positions, k)
            self.values[i].index_copy_(2, positions, v)

        def attend(i, q):
            q_rows = q.reshape(1, self.num_kv_heads, group * L, self.head_dim)
            keys = self.keys[i][:, :, :bucket]
            values = self.values[i][:, :, :bucket]
            scores = torch.matmul(q_rows, keys.transpose(-1, -2)).float() * self.scaling
            scores = scores.masked_fill(hidden_keys, -math.inf)
            probs = scores.softmax(-1).to(values.dtype)
            return torch.matmul(probs, values).reshape(1, self.num_heads, L, self.head_dim)

        return self._run_layers(input_ids, cos, sin, write_kv, self._keeping_queries(attend), taps_out,
                                last_only=False)

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
                      taps_out: torch.Tensor | None, attend=None, last_only: bool = False) -> torch.Tensor:
        if self._layer_ops is None:
            from ..kernels import default_decode_attention, default_layer_ops

            reason = self.fused_unsupported()
            if reason is not None:
                raise UnsupportedTarget(f"fused layers: {reason}")
            self._layer_ops = default_layer_ops(self.device)
            self._decode_attention = self._decode_attention or default_decode_attention(self.device)
        ops, decode = self._layer_ops, self._decode_attention
        L = input_ids.shape[1]
        context_length = positions[:1].to(torch.int32)
        taps = {}
        for slot, lid in enumerate(self.tap_layer_ids):
            taps.setdefault(lid, []).append(slot)
        H = self.config.hidden_size

        def tap(layer_id: int, value: torch.Tensor) -> None:
            if taps_out is not None:
                for slot in taps.get(layer_id, ()):
                    taps_out[:, :, slot * H : (slot + 1) * H] = value

        # a decode step's rows (AR 1, a verify block) go through the skinny GEMMs where the ops have them; a prefill
        # chunk through cuBLAS
        skinny = ops.skinny_linear if ops.skinny_linear is not None and L <= ops.skinny_rows else None
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
            q = q.view(1, L, self.num_heads, self.head_dim)
            k = k.view(1, L, self.num_kv_heads, self.head_dim)
            v = v.view(1, L, self.num_kv_heads, self.head_dim)
            q, k = self._head_norm(ops, attn, "q_norm", q), self._head_norm(ops, attn, "k_norm", k)
            q, k, v = ops.rope_write(q, k, v, self.cos, self.sin, positions, self.keys[i], self.values[i])
            if self.query_keep is not None and i == self.query_keep[0]:  # cmr only (keep_queries)
                self.query_keep[1][:, :, :L].copy_(q)
            if attend is not None:  # a prefill chunk (_prefill_chunk_fused)
                out = attend(i, q)
            else:
                out = decode(q, self.keys[i], self.values[i], k, v, context_length, scaling=self.scaling,
                             max_context_length=bucket)  # [1, L, Hq, D]
            norm = layer.post_attention_layernorm
            attn_out = _project(skinny, attn.o_proj, out.reshape(1, L, -1))
            mlp = layer.mlp
            hidden, normed = ops.add_rms_norm(hidden, attn_out, norm.weight, norm_epsilon(norm))
            if projections is not None and skinny is not None:  # one launch: gate|up, then silu(gate) * up
                act = ops.gate_up_silu(normed, projections.gate_up_weight, projections.gate_up_bias)
            else:
                gate, up = projections.gate_up(normed) if projections is not None else (mlp.gate_proj(normed),
                                                                                        mlp.up_proj(normed))
                act = ops.silu_mul(gate, up)
            delta = _project(skinny, mlp.down_proj, act)
        hidden, normed = ops.add_rms_norm(hidden, delta, self.final_norm.weight, norm_epsilon(self.final_norm))
        tap(len(self.layers) - 1, normed)  # the last layer's tap is after the final norm, as HiddenTaps gives it
        return linear_module(self.lm_head, normed[:, -1:] if last_only else normed)[0]

    def _head_norm(self, ops, attn, name: str, heads: torch.Tensor) -> torch.Tensor:
        """Qwen3's per-head q/k RMSNorm of ``heads [1, L, h, D]`` (read in place from a q|k|v output): the fused
        norm when it is a Llama-style RMSNorm in the model dtype, else the module; no norm: ``heads`` as given."""
        norm = getattr(attn, name, None)
        if norm is None:
            return heads
        if (type(norm).__name__ in _RMS_NORMS and has_norm_epsilon(norm)
                and norm.weight.dtype == heads.dtype):
            return ops.add_rms_norm(heads, None, norm.weight, norm_epsilon(norm))[1]
        return norm(heads)

    def _forward_static_decode(self, input_ids, positions, bucket: int, cos, sin, taps_out) -> torch.Tensor:
        """``forward_static`` with the decode kernel: the new entries go into the cache as usual, and the kernel
        reads the cache before the block (length ``positions[0]``, loaded on the device) and the block itself."""
        if self._decode_attention is None:
            from ..kernels import default_decode_attention

            self._decode_attention = default_decode_attention(self.device)
        decode = self._decode_attention
        context_length = positions[:1].to(torch.int32)
        block_kv = {}

        def write_kv(i, k, v):
            self.keys[i].index_copy_(2, positions, k)
            self.values[i].index_copy_(2, positions, v)
            block_kv[i] = (k, v)

        def attend(i, q):
            k, v = block_kv.pop(i)
            out = decode(q, self.keys[i], self.values[i], k, v, context_length, scaling=self.scaling,
                         max_context_length=bucket)  # [1, L, Hq, D]
            return out.transpose(1, 2)

        return self._run_layers(input_ids, cos, sin, write_kv, self._keeping_queries(attend), taps_out,
                                last_only=False)
