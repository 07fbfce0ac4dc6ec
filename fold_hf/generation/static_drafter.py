"""`StaticDrafter`: one drafting round of a :class:`FoldDrafter` with fixed shapes and device-side lengths.

:meth:`FoldDrafter.draft_logits` plans each read on the host from Python ints, which costs milliseconds of
Python per round and cannot be captured in a CUDA graph. This step does the same math with every length held
in a device tensor, so a round can be captured once and replayed:

* the verify step's tapped features of all ``B`` rows are projected to context keys/values and written at
  ``[d_len, d_len + B)`` of the drafter's :class:`~fold_hf.modeling.cache.FoldCache` buffers; only the first
  ``d_new`` rows (the accepted tokens) count, the rest is overwritten next round;
* the read goes through a function with the FOLD kernel contract, which takes the context length and block
  start as device tensors: ``fold_read_triton`` when Triton is there (no host read: capturable), else its torch
  twin :func:`~fold_hf.kernels.reference.fold_read_geometry_reference` (reads the lengths on the host: the
  ``static`` engine's uncaptured path);
* every reading mode, each as a case of that one geometry, so the baselines run as fast as FOLD and a
  comparison of modes compares reading, not engines: ``fold`` (window + far memory), ``window`` (no far
  memory), ``dflash`` (every entry near), ``rerope`` (``fold`` at α = 1, every far entry at distance D from
  every row, each row's queries scaled by max(1, log(p + 1) / log 4096)), ``yarn`` (``dflash`` with the request's
  rescaled rope tables, refilled in place
  by :meth:`StaticDrafter.start_request`, so captured graphs stay valid) and ``streaming`` (the sinks and the
  most recent entries gathered into a ``[1, Hkv, budget, Dh]`` buffer by device-side indices, then read as
  ``dflash`` at their renumbered positions 0 .. kept-1, the block right after them). Before the context
  exceeds W the far memory is empty, and the caller picks the window-only variant (``with_far=False``), which
  skips the far branch entirely (length dispatch).

Numerics: queries and block keys are rotated in fp32 (fp64 for fp64 models) and cast to the model dtype, as
the kernel contract asks; the foundation loop keeps them in fp32, so drafts may rarely differ in bf16 at a
near-tie. Greedy output never depends on the drafts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels.reference import fold_read_geometry_reference, rotate_by_tables
from ..modeling.cache import FoldCache
from ..modeling.drafter import FoldDrafter
from ..modeling.read_plan import RERoPE_LOG_BASE
from ..modeling.rope import compute_dtype
from .weight_layout import concatenated_rows as _fuse_rows

STATIC_MODES = ("fold", "window", "dflash", "rerope", "yarn", "streaming")
CUT_SLOT = 6  # state slot receiving the proposals a DeepSpec confidence threshold keeps (the fast loop reads it)


def static_drafter_unsupported(drafter: FoldDrafter) -> str | None:
    """Why :class:`StaticDrafter` cannot run ``drafter`` as configured, or None when it can."""
    mode = drafter.fold_config.mode
    if mode not in STATIC_MODES:
        if mode in ("infllm", "cmr"):
            return (f"mode {mode!r}: its selection keeps per-request host state (InfLLM: per-layer block "
                    "representatives from window attention; CMR: a refresh every 8 rounds from the target's "
                    "attention), so its rounds draft on the host, uncaptured")
        return f"mode {mode!r} (static drafting covers {', '.join(STATIC_MODES)})"
    return None


def default_read_function(device: torch.device | str):
    """``fold_read_triton`` when tensors on ``device`` may run Triton kernels (CUDA, Triton importable,
    ``FOLD_HF_DISABLE_TRITON`` not ``1``), else None."""
    from ..kernels import triton_kernels_enabled

    if not triton_kernels_enabled(device):
        return None
    try:
        from ..kernels.triton_fold import fold_read_triton
    except ImportError:
        return None
    return fold_read_triton


def preallocated_cache(drafter: FoldDrafter, capacity: int, device, request_length: int | None = None) -> FoldCache:
    """A :class:`FoldCache` whose layers already hold ``[1, Hkv, capacity, Dh]`` buffers (length 0)."""
    cache = drafter.new_cache(request_length=request_length)
    attn = drafter.layers[0].self_attn
    dtype = drafter.fc.weight.dtype
    probe = torch.empty(1, attn.num_kv_heads, 1, attn.head_dim, device=device, dtype=dtype)
    shaped = probe.expand(1, attn.num_kv_heads, capacity, attn.head_dim)
    for layer in cache.layers:
        layer.lazy_initialization(shaped, shaped)
    return cache


@torch.no_grad()
def commit_context(drafter: FoldDrafter, cache: FoldCache, target_hidden: torch.Tensor) -> None:
    """Append context entries for ``target_hidden [1, n, n_taps * H]`` (the prompt's taps) to ``cache``, exactly
    as the drafter's forward commits new context."""
    context = drafter.context_features(target_hidden)
    for layer, cache_layer in zip(drafter.layers, cache.layers):
        cache_layer.update(*layer.self_attn.project_keys_values(context))


class StaticDrafter:
    """Drafting rounds of ``drafter`` over a preallocated ``cache`` with device-side lengths.

    Args:
        drafter: a bound :class:`FoldDrafter` whose mode is in :data:`STATIC_MODES`.
        cache: from :func:`preallocated_cache`, large enough for every entry plus one block.
        read_function: a function with the FOLD kernel contract (default: its torch twin
            :func:`~fold_hf.kernels.reference.fold_read_geometry_reference`).
        tables: the rope tables ``(cos, sin)`` of another StaticDrafter of the same drafter and cache (they do not
            depend on the reading mode), to share instead of building them again.
        layer_ops: fused elementwise ops (:func:`fold_hf.kernels.default_layer_ops`) to run the layers' norms with
            their residual adds, the query/key rotations and ``silu(gate) * up`` as single launches; None runs the
            drafter's modules. The same math either way (see :func:`fused_drafter_unsupported`).
    """

    def __init__(self, drafter: FoldDrafter, cache: FoldCache, read_function=None, tables=None,
                 layer_ops=None) -> None:
        reason = static_drafter_unsupported(drafter)
        if reason is not None:
            raise ValueError(f"static drafting does not cover {reason}")
        self.drafter = drafter
        self.cache = cache
        self.read = read_function or fold_read_geometry_reference
        cfg = drafter.fold_config
        self.block = drafter.block_size
        layer0 = cache.layers[0]
        self.capacity = layer0.keys.shape[2]
        self.device = layer0.keys.device
        self.dtype = drafter.fc.weight.dtype
        acc = compute_dtype(self.dtype)
        rope = drafter.rope
        self.mode = cfg.mode
        # yarn's tables depend on the request (its length sets the factor): this drafter keeps its own and
        # refills them per request; every other mode reads the drafter's plain tables, which may be shared
        self.owns_tables = cfg.mode == "yarn"
        self.acc = acc
        self.yarn_rope = None
        if tables is None or self.owns_tables:
            positions = torch.arange(self.capacity + self.block, device=self.device)
            tables = rope.cos_sin(positions, dtype=acc)
        self.cos, self.sin = tables  # [capacity + B, rotary_dim]
        self.window = cfg.window + self.block if cfg.mode in ("fold", "window", "rerope") else None
        self.alpha = float(cfg.alpha) if cfg.mode == "fold" else 1.0
        self.has_far_mode = cfg.mode in ("fold", "rerope")
        if self.window is not None:
            # fold reads its far memory from row r at distance D + r, rerope at D from every row (B.3)
            rows = torch.arange(self.block, device=self.device) if cfg.mode == "fold" else torch.zeros(
                self.block, dtype=torch.long, device=self.device)
            self.cos_far, self.sin_far = rope.cos_sin(self.window + rows, scale=rope.attention_scaling**2, dtype=acc)
        # per layer: (D, far rope tables or None, reads the renumbered streaming selection). A sliding-window layer
        # keeps its native window D = sliding_window at true positions in every mode, and with FoldConfig.layers ==
        # "all" reads the far memory of fold / rerope at the pair's shared distance (W + B, + r for fold), as
        # read_plan.plan_layer_read does; ``layer_scaled``: rerope scales the layer's queries (layers in scope only)
        self.layer_geometry = []
        self.layer_scaled = []
        thresholds = []
        for layer in drafter.layers:
            sw = layer.self_attn.sliding_window
            if sw is None:
                far = self.has_far_mode
                self.layer_geometry.append((self.window, (self.cos_far, self.sin_far) if far else None,
                                            cfg.mode == "streaming"))
                self.layer_scaled.append(cfg.mode == "rerope")
                if far:
                    thresholds.append(cfg.window)
                continue
            far = self.has_far_mode and cfg.layers == "all"
            self.layer_geometry.append((int(sw), (self.cos_far, self.sin_far) if far else None, False))
            self.layer_scaled.append(cfg.mode == "rerope" and far)
            if far:
                thresholds.append(int(sw) - self.block)
        self.has_sliding = any(layer.self_attn.sliding_window is not None for layer in drafter.layers)
        # yarn rescales the full-attention layers' rope only: sliding layers keep the plain tables
        self.plain_tables = None
        if self.owns_tables and self.has_sliding:
            self.plain_tables = rope.cos_sin(torch.arange(self.capacity + self.block, device=self.device), dtype=acc)
        # the far memory of some layer is non-empty once the context exceeds this (W for full-attention layers)
        self.far_threshold = min(thresholds) if thresholds else None
        self.log_rerope_base = math.log(RERoPE_LOG_BASE) if cfg.mode == "rerope" else None
        if cfg.mode == "streaming":
            self.budget, self.sinks = cfg.streaming_budget, cfg.sinks
            self.budget_slots = torch.arange(self.budget, device=self.device)
        self.block_offsets = torch.arange(self.block, device=self.device)
        # context rows a round commits = rows of the last verify (last token + proposals: B for z-lab, B + 1 for
        # DeepSpec, whose anchor slot predicts too)
        self.verify_rows = drafter.num_proposals + 1
        self.row_offsets = torch.arange(self.verify_rows, device=self.device)
        self.mask_id = drafter.config.mask_token_id
        if layer_ops is not None:
            reason = fused_drafter_unsupported(drafter)
            if reason is not None:
                raise ValueError(f"fused drafter layers: {reason}")
        self.ops = layer_ops

    def start_request(self, request_length: int | None) -> None:
        """Prepare for a request of ``request_length`` = P + G tokens: ``yarn`` refills its rope tables in place
        with the request's factor (the same tables the foundation loop builds); other modes need nothing."""
        if not self.owns_tables:
            return
        self.cache.request_length = request_length
        rope = self.drafter._rope_for(False, 0, self.block, self.cache, self.drafter.fold_config)
        if rope is self.yarn_rope:
            return
        positions = torch.arange(self.cos.shape[0], device=self.device)
        cos, sin = rope.cos_sin(positions, dtype=self.acc)
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        self.yarn_rope = rope

    def needs_far(self, context_length: int) -> bool:
        """Whether a round whose context holds ``context_length`` entries reads a non-empty far memory."""
        return self.far_threshold is not None and context_length > self.far_threshold

    @torch.no_grad()
    def draft(self, new_features: torch.Tensor, state: torch.Tensor, with_far: bool, pick=None):
        """Commit the accepted context rows and draft one block; graph-capturable.

        Args:
            new_features: ``[1, R, n_taps * H]`` tapped features of the last verify (R = proposals + 1 rows; the
                first ``d_new`` count).
            state: long device tensor; ``state[1]`` = d_len (entries committed before this round), ``state[2]``
                = d_new (rows of ``new_features`` to commit), ``state[3]`` = the last committed token; when the
                drafter has a confidence threshold, ``state[CUT_SLOT]`` receives the number of proposals it keeps.
            with_far: run the far branch (use :meth:`needs_far` on the host-known length).
            pick: the loop's picker (:meth:`fold_hf.generation.sampling.TokenChoice.picker`), called once on the
                slots' logits (a Markov head: once per slot); None takes the argmax.

        Returns:
            ``[R - 1]`` proposals (long): slots 1 .. B-1 (z-lab) or 0 .. B-1 (DeepSpec, its Markov head applied slot
            by slot on the device); greedy without ``pick``, else what ``pick`` returns (proposals and their
            distributions ``q`` or None).
        """
        if self.owns_tables and self.yarn_rope is None:
            raise RuntimeError("yarn reads the request's rope tables: call start_request(request_length) first")
        layers = self._layers if self.ops is None else self._layers_fused
        return self._draft_tokens(layers(*self._block_inputs(new_features, state), with_far), state, pick)

    def _block_inputs(self, new_features: torch.Tensor, state: torch.Tensor):
        """What every layer of a round needs (device tensors): entry positions of the new context rows, the new
        context features, the block's embeddings, the block rows' rope tables, and the read: how many entries it
        reads (``streaming``: the kept ones), which cache entries those are (``streaming``; None = the cache as it
        is) and each row's logit scale (``rerope``; else None)."""
        drafter, B = self.drafter, self.block
        d_len, d_new, last = state[1:2], state[2:3], state[3:4]
        entry_positions = d_len + self.row_offsets
        context_length = d_len + d_new
        read_length, kept_index, row_scale = context_length, None, None
        if self.mode == "streaming":
            # slot i holds sink i, or recent entry T - budget + i once the context outgrows the budget; slots past
            # the context (short contexts) are gathered but never read
            read_length = context_length.clamp_max(self.budget)
            shift = (context_length - self.budget).clamp_min(0)
            kept_index = torch.where(self.budget_slots < self.sinks, self.budget_slots, self.budget_slots + shift)
            kept_index = kept_index.clamp_max(self.capacity - 1)
        query_positions = read_length + self.block_offsets  # block_start = end of the (kept) context
        if self.log_rerope_base is not None:
            row_scale = (torch.log((query_positions + 1).to(self.acc)) / self.log_rerope_base).clamp_min(1.0)
        context = drafter.context_features(new_features)
        ids = torch.cat((last, torch.full((B - 1,), self.mask_id, dtype=last.dtype, device=last.device)))
        hidden = drafter.embed_block(ids[None]).to(self.dtype)
        # sliding layers read at true positions under streaming and with the plain rope under yarn:
        # (their rows' cos, sin, read length, context tables)
        true_rows = None
        if self.has_sliding and self.mode in ("streaming", "yarn"):
            cos, sin = self.plain_tables if self.plain_tables is not None else (self.cos, self.sin)
            true_positions = context_length + self.block_offsets
            true_rows = (cos[true_positions], sin[true_positions], context_length, (cos, sin))
        return (entry_positions, context, hidden, self.cos[query_positions], self.sin[query_positions],
                read_length, kept_index, row_scale, true_rows)

    def _layer_read(self, i: int, cos_q, sin_q, read_length, kept_index, true_rows):
        """Layer ``i``'s (D, far tables, rows' cos, rows' sin, read length, kept index, context rope tables)."""
        window, far_tables, _ = self.layer_geometry[i]
        tables = (self.cos, self.sin)
        if true_rows is not None and self.drafter.layers[i].self_attn.sliding_window is not None:
            cos_q, sin_q, read_length, tables = true_rows
            kept_index = None
        return window, far_tables, cos_q, sin_q, read_length, kept_index, tables

    def _read(self, cache_layer, query_near, query_far, block_keys, block_values, read_length, kept_index,
              window, tables):
        """The layer's attention over its cache (or the kept entries gathered from it) and the block."""
        keys, values = cache_layer.keys, cache_layer.values
        if kept_index is not None:
            keys, values = keys.index_select(2, kept_index), values.index_select(2, kept_index)
        return self.read(query_near, query_far, keys, values, block_keys, block_values, *tables,
                         read_length, read_length, window, self.alpha)

    def _draft_tokens(self, hidden: torch.Tensor, state: torch.Tensor, pick=None):
        """Proposals ``[R - 1]`` from the final-normed block ``[1, B, H]`` (device ops only): greedy, or ``pick``'s
        choice with its ``q``; a DeepSpec confidence cut writes the kept count to ``state[CUT_SLOT]``."""
        drafter = self.drafter
        slots = hidden[0, drafter.first_proposal_slot :]
        last = state[3:4]
        tokens, q = drafter.pick_proposals(drafter.proposal_logits(slots), last, pick)
        if drafter.is_deepspec and drafter.confidence_threshold > 0:
            from ..modeling.families.deepspec import confident_length

            state[CUT_SLOT : CUT_SLOT + 1].copy_(confident_length(drafter, slots, tokens, last,
                                                                 drafter.confidence_threshold))
        return tokens if pick is None else (tokens, q)

    def _layers(self, entry_positions, context, hidden, cos_rows, sin_rows, read_rows, kept_rows, row_scale,
                true_rows, with_far: bool) -> torch.Tensor:
        """The drafter's layers through its modules; returns the final-normed block ``[1, B, H]``."""
        drafter, B = self.drafter, self.block
        for i, (layer, cache_layer) in enumerate(zip(drafter.layers, self.cache.layers)):
            window, far_tables, cos_q, sin_q, read_length, kept_index, tables = self._layer_read(
                i, cos_rows, sin_rows, read_rows, kept_rows, true_rows)
            attn = layer.self_attn
            k_new, v_new = attn.project_keys_values(context)
            cache_layer.keys.index_copy_(2, entry_positions, k_new)
            cache_layer.values.index_copy_(2, entry_positions, v_new)
            normed = layer.input_layernorm(hidden)
            q = attn.project_queries(normed)
            k_blk, v_blk = attn.project_keys_values(normed)
            scaled = row_scale is not None and self.layer_scaled[i]
            scale = attn.scaling * row_scale[:, None] if scaled else attn.scaling  # [B, 1]: rows
            query_near = (rotate_by_tables(q, cos_q, sin_q) * scale).to(self.dtype)
            query_far = None
            if with_far and far_tables is not None:
                query_far = (rotate_by_tables(q, *far_tables) * scale).to(self.dtype)
            block_keys = rotate_by_tables(k_blk, cos_q, sin_q).to(self.dtype)
            out = self._read(cache_layer, query_near, query_far, block_keys, v_blk, read_length, kept_index,
                             window, tables)
            hidden = layer.attention_residual(hidden, attn.o_proj(out.reshape(1, B, -1)))
            hidden = layer.mlp_residual(hidden)
        return drafter.norm(hidden)

    def _layers_fused(self, entry_positions, context, hidden, cos_rows, sin_rows, read_rows, kept_rows, row_scale,
                      true_rows, with_far: bool) -> torch.Tensor:
        """:meth:`_layers` with the fused elementwise ops: each residual add happens inside the next norm."""
        drafter, B, ops = self.drafter, self.block, self.ops
        delta = None
        for i, (layer, cache_layer) in enumerate(zip(drafter.layers, self.cache.layers)):
            window, far_tables, cos_q, sin_q, read_length, kept_index, tables = self._layer_read(
                i, cos_rows, sin_rows, read_rows, kept_rows, true_rows)
            attn = layer.self_attn
            qkv_weight, qkv_bias, gate_up_weight = fused_projections(layer)
            hidden, normed = ops.add_rms_norm(hidden, delta, layer.input_layernorm.weight, layer.input_layernorm.eps)
            # one q|k|v GEMM over the new context rows and the block together: the weights are read once a round
            # (7 -> 4 GEMMs a layer with gate|up below; on the H200 a GEMM costs the same at any row count up to
            # 16, so the queries of the context rows, which nothing reads, cost nothing)
            rows = torch.cat((context, normed), 1)
            nc = context.shape[1]  # context rows: the last verify's (B, or B + 1 for DeepSpec)
            qkv = F.linear(rows, qkv_weight, qkv_bias)  # [1, nc + B, (Hq + 2 Hkv) D]
            n_q, n_kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
            q = ops.add_rms_norm(qkv[:, nc:, :n_q].view(1, B, attn.num_heads, attn.head_dim), None,
                                 attn.q_norm.weight, attn.q_norm.eps)[1]
            keys = ops.add_rms_norm(qkv[..., n_q:n_q + n_kv].view(1, nc + B, attn.num_kv_heads, attn.head_dim), None,
                                    attn.k_norm.weight, attn.k_norm.eps)[1]
            values = qkv[..., n_q + n_kv:].view(1, nc + B, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
            cache_layer.keys.index_copy_(2, entry_positions, keys[:, :nc].transpose(1, 2))
            cache_layer.values.index_copy_(2, entry_positions, values[:, :, :nc])
            k_blk, v_blk = keys[:, nc:], values[:, :, nc:]
            if row_scale is not None and self.layer_scaled[i]:  # rerope: a row's query scale scales its logits
                q = q * row_scale.to(q.dtype)[None, :, None, None]
            query_near = ops.rotate_heads(q, cos_q, sin_q, attn.scaling, self.dtype)
            query_far = (ops.rotate_heads(q, *far_tables, attn.scaling, self.dtype)
                         if with_far and far_tables is not None else None)
            block_keys = ops.rotate_heads(k_blk, cos_q, sin_q, 1.0, self.dtype)
            out = self._read(cache_layer, query_near, query_far, block_keys, v_blk, read_length, kept_index,
                             window, tables)
            post = layer.post_attention_layernorm
            hidden, normed = ops.add_rms_norm(hidden, attn.o_proj(out.reshape(1, B, -1)), post.weight, post.eps)
            gate, up = F.linear(normed, gate_up_weight).chunk(2, -1)
            delta = layer.mlp.down_proj(ops.silu_mul(gate, up))
        return ops.add_rms_norm(hidden, delta, drafter.norm.weight, drafter.norm.eps)[1]


@torch.no_grad()
def fused_projections(layer) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(q|k|v weight [(Hq + 2 Hkv) D, H], q|k|v bias or None, gate|up weight [2 I, H])`` of a drafter layer.

    The first call concatenates the weights and points the layer's own q/k/v and gate/up parameters into the new
    buffers, so the weights are not held twice and ``load_state_dict`` or training writes reach the buffers;
    later calls find the parameters laid out so and return views of the same buffers (after ``.to()``, which
    gives every parameter a buffer of its own, they are concatenated again).
    """
    attn, mlp = layer.self_attn, layer.mlp
    projections = [attn.q_proj, attn.k_proj, attn.v_proj]
    if len({p.bias is None for p in projections}) > 1:
        raise ValueError("q/k/v projections must all have biases or none")
    return (_fuse_rows(projections, "weight"), _fuse_rows(projections, "bias"),
            _fuse_rows([mlp.gate_proj, mlp.up_proj], "weight"))


def fused_drafter_unsupported(drafter: FoldDrafter) -> str | None:
    """Why the fused drafter layers cannot run ``drafter`` (None when they can)."""
    from ..kernels.layer_reference import is_silu

    dtype = drafter.fc.weight.dtype
    if any(layer.self_attn.k_eq_v or layer.sandwich_norms for layer in drafter.layers):
        return "Gemma-4-style layers (k_eq_v attention, sandwich norms): the fused step covers pre-norm layers only"
    norms = [drafter.norm] + [n for layer in drafter.layers for n in (layer.input_layernorm,
                                                                       layer.post_attention_layernorm,
                                                                       layer.self_attn.q_norm, layer.self_attn.k_norm)]
    if any(n.weight.dtype != dtype for n in norms):
        return f"norm weights not in the drafter's dtype {dtype}"
    for i, layer in enumerate(drafter.layers):
        if not is_silu(layer.mlp.act):
            return f"MLP activation {type(layer.mlp.act).__name__} is not SiLU"
        attn, mlp = layer.self_attn, layer.mlp
        for name, module in (("q_proj", attn.q_proj), ("k_proj", attn.k_proj), ("v_proj", attn.v_proj),
                             ("gate_proj", mlp.gate_proj), ("up_proj", mlp.up_proj)):
            # the fused step reads these weights straight into one GEMM: a wrapped or quantized projection (LoRA,
            # bitsandbytes...) must run as its module
            if type(module) is not torch.nn.Linear or module.weight.dtype != dtype:
                return f"layer {i} {name} is a {type(module).__name__} in {module.weight.dtype}, not a plain Linear"
    return None
