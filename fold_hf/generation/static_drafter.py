"""`StaticDrafter`: one drafting round of a :class:`FoldDrafter` with fixed shapes and device-side lengths.

:meth:`FoldDrafter.draft_logits` plans each read on the host from Python ints, which costs milliseconds of
Python per round and cannot be captured in a CUDA graph. This step runs the same layers (the drafter's own
:class:`~fold_hf.modeling.drafter_layer.DrafterLayer` forward and draft head, or their fused restatement) with every
length held in a device tensor, so a round can be captured once and replayed:

* the verify step's tapped features of all ``B`` rows are projected to context keys/values and written at
  ``[d_len, d_len + B)`` of the drafter's :class:`~fold_hf.modeling.cache.FoldCache` buffers; only the first
  ``d_new`` rows (the accepted tokens) count, the rest is overwritten next round;
* the read goes through a function with the FOLD kernel contract, which takes the context length and block
  start as device tensors: ``fold_read_triton`` when Triton is there (no host read: capturable), else its torch
  twin :func:`~fold_hf.kernels.fold_read.naive.fold_read_geometry_reference` (reads the lengths on the host: the
  ``static`` engine's uncaptured path);
* every reading mode, each as a case of that one geometry (its rules: :func:`~fold_hf.modeling.read_plan.
  read_geometry`, the planner the loop's reads use too), so the baselines run as fast as FOLD and a comparison of
  modes compares reading, not engines: ``fold`` (window + far memory), ``window`` (no far memory), ``dflash``
  (every entry near), ``rerope`` (``fold`` at α = 1, every far entry at distance D from every row, each row's
  queries scaled by max(1, log(p + 1) / log 4096)), ``yarn`` (``dflash`` with the request's rescaled rope tables,
  refilled in place by :meth:`StaticDrafter.start_request`, so captured graphs stay valid), ``streaming`` (the
  sinks and the most recent entries gathered into a ``[1, Hkv, budget, Dh]`` buffer by device-side indices, then
  read as ``dflash`` at their renumbered positions 0 .. kept-1, the block right after them), ``infllm`` (a
  compact context of the initial entries, the retrieved blocks and the window, selected on the device each round
  and layer, read with the far branch at D - 1 and α = 1) and ``cmr`` (its chunk selection gathered and read
  renumbered, refreshed on the device from the target's attention; the host picks the round's captured step by
  :meth:`StaticDrafter.next_phase`); :mod:`~fold_hf.generation.static_retrieval` holds the last two. Before the
  context exceeds W the far memory is empty, and the caller picks the window-only variant (``with_far=False``),
  which skips the far branch entirely (length dispatch).

Numerics: queries and block keys are rotated in fp32 (fp64 for fp64 models) and cast to the model dtype, as
the kernel contract asks; the foundation loop keeps them in fp32, so drafts may rarely differ in bf16 at a
near-tie. Greedy output never depends on the drafts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..kernels.fold_read.naive import fold_read_geometry_reference, rotate_by_tables
from ..modeling.cache import FoldCache
from ..modeling.drafter import FoldDrafter
from ..modeling.read_plan import RERoPE_LOG_BASE
from ..modeling.rope import compute_dtype
from ..targets.weight_layout import concatenated_rows as _fuse_rows

STATIC_MODES = ("fold", "window", "dflash", "rerope", "yarn", "streaming", "infllm", "cmr")
CUT_SLOT = 6  # state slot receiving the proposals a DeepSpec confidence threshold keeps (the fast loop reads it)


def static_drafter_unsupported(drafter: FoldDrafter) -> str | None:
    """Why :class:`StaticDrafter` cannot run ``drafter`` as configured, or None when it can."""
    mode = drafter.fold_config.mode
    if mode not in STATIC_MODES:
        return f"mode {mode!r} (static drafting covers {', '.join(STATIC_MODES)})"
    return None


def default_read_function(device: torch.device | str):
    """``fold_read_triton`` when tensors on ``device`` may run Triton kernels (CUDA, Triton importable,
    ``FOLD_HF_DISABLE_TRITON`` not ``1``), else None."""
    from ..kernels import import_triton_module, triton_kernels_enabled

    module = import_triton_module("fold_read.triton") if triton_kernels_enabled(device) else None
    return module.fold_read_triton if module is not None else None


def default_rows_read_function(device: torch.device | str):
    """``fold_read_rows_triton`` (every row of a batched round's drafts read in one launch pair) where
    :func:`default_read_function` gives the Triton read and :func:`~fold_hf.kernels.rows_kernels_enabled`, else
    None."""
    from ..kernels import import_triton_module, rows_kernels_enabled, triton_kernels_enabled

    module = import_triton_module("fold_read.triton") if triton_kernels_enabled(device) else None
    return module.fold_read_rows_triton if module is not None and rows_kernels_enabled() else None


def preallocated_cache(drafter: FoldDrafter, capacity: int, device, request_length: int | None = None,
                       rows: int = 1) -> FoldCache:
    """A :class:`FoldCache` whose layers already hold ``[rows, Hkv, capacity, Dh]`` buffers (length 0; ``rows`` > 1:
    the batched rows step's cache, :mod:`~fold_hf.generation.static_drafter_rows`)."""
    cache = drafter.new_cache(request_length=request_length)
    attn = drafter.layers[0].self_attn
    dtype = drafter.fc.weight.dtype
    probe = torch.empty(1, attn.num_kv_heads, 1, attn.head_dim, device=device, dtype=dtype)
    shaped = probe.expand(rows, attn.num_kv_heads, capacity, attn.head_dim)
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


class _View:
    """What a layer reads in one round: its block rows' rope rows ``(cos, sin) [B, rd]``, the read length (= the
    block start t of the read's positions), the keys' rope tables and the cache entries it gathers (None: the cache
    as it is)."""

    __slots__ = ("rows", "length", "tables", "gather")

    def __init__(self, rows, length, tables, gather=None) -> None:
        self.rows, self.length, self.tables, self.gather = rows, length, tables, gather


class StaticDrafter:
    """Drafting rounds of ``drafter`` over a preallocated ``cache`` with device-side lengths.

    Every layer's geometry comes from the one planner, :func:`fold_hf.modeling.read_plan.read_geometry` (the same
    rules the reference read and the Triton read of the loop path follow); this class only turns it into device
    tensors: true positions, a renumbered selection (``streaming``, ``cmr``) or InfLLM's compact context
    (:mod:`~fold_hf.generation.static_retrieval`).

    Args:
        drafter: a bound :class:`FoldDrafter` whose mode is in :data:`STATIC_MODES`.
        cache: from :func:`preallocated_cache`, large enough for every entry plus one block.
        read_function: a function with the FOLD kernel contract (default: its torch twin
            :func:`~fold_hf.kernels.fold_read.naive.fold_read_geometry_reference`).
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
        cfg = self.fold_config = drafter.fold_config
        self.block = drafter.block_size
        layer0 = cache.layers[0]
        self.capacity = layer0.keys.shape[2]
        self.device = layer0.keys.device
        self.dtype = drafter.fc.weight.dtype
        acc = compute_dtype(self.dtype)
        rope = drafter.rope
        self.mode = cfg.mode
        self.geometry = [drafter.read_geometry(i, cfg) for i in range(len(drafter.layers))]
        # yarn's tables depend on the request (its length sets the factor): this drafter keeps its own and
        # refills them per request; every other mode reads the drafter's plain tables, which may be shared
        self.owns_tables = any(g.yarn for g in self.geometry)
        self.acc = acc
        self.yarn_rope = None
        if tables is None or self.owns_tables:
            positions = torch.arange(self.capacity + self.block, device=self.device)
            tables = rope.cos_sin(positions, dtype=acc)
        self.cos, self.sin = tables  # [capacity + B, rotary_dim]: the tables of the layers with yarn=True if any
        # layers reading the plain rope while others read yarn's (sliding layers under yarn)
        self.plain_tables = (self.cos, self.sin)
        if self.owns_tables and not all(g.yarn for g in self.geometry):
            self.plain_tables = rope.cos_sin(torch.arange(self.capacity + self.block, device=self.device), dtype=acc)
        # far rows' tables per (distance, per row): fold at D + r, rerope at D, InfLLM's retrieved entries at D - 1
        self.far_tables = {}
        for g in self.geometry:
            if g.far is not None and (g.far, g.far_per_row) not in self.far_tables:
                rows = torch.arange(self.block, device=self.device)
                distance = g.far + rows if g.far_per_row else torch.full_like(rows, g.far)
                self.far_tables[(g.far, g.far_per_row)] = rope.cos_sin(distance, scale=rope.attention_scaling**2,
                                                                       dtype=acc)
        # the far memory of some layer is non-empty once the context exceeds its window minus the block
        thresholds = [g.window - self.block for g in self.geometry if g.far is not None]
        self.far_threshold = min(thresholds) if thresholds else None
        self.log_rerope_base = math.log(RERoPE_LOG_BASE) if any(g.rerope_scale for g in self.geometry) else None
        self.selections = {g.selection for g in self.geometry} - {None}
        if "streaming" in self.selections:
            self.budget, self.sinks = cfg.streaming_budget, cfg.sinks
            self.budget_slots = torch.arange(self.budget, device=self.device)
        self.block_offsets = torch.arange(self.block, device=self.device)
        # context rows a round commits = rows of the last verify (last token + proposals: B for z-lab, B + 1 for
        # DeepSpec, whose anchor slot predicts too)
        self.verify_rows = drafter.num_proposals + 1
        self.row_offsets = torch.arange(self.verify_rows, device=self.device)
        self.mask_id = drafter.config.mask_token_id
        self.infllm = self.cmr = None
        if self.selections & {"infllm", "cmr"}:
            from ..modeling.retrieval import RetrievalParams
            from .static_retrieval import CMRRounds, InfLLMRounds

            params = RetrievalParams.of(cfg)
            attn = drafter.layers[0].self_attn
            layers = [i for i, g in enumerate(self.geometry) if g.selection == "infllm"]
            if layers:
                self.infllm = InfLLMRounds(params, layers, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                                           self.capacity, self.geometry[layers[0]].window, self.block,
                                           self.verify_rows, self.cos, self.sin)
            if "cmr" in self.selections:
                self.cmr = CMRRounds(params, self.capacity, self.verify_rows, self.device, acc)
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
        geometry = next(g for g in self.geometry if g.yarn)
        rope = self.drafter.read_rope(geometry, request_length or 0, self.block, self.fold_config)
        if rope is self.yarn_rope:
            return
        positions = torch.arange(self.cos.shape[0], device=self.device)
        cos, sin = rope.cos_sin(positions, dtype=self.acc)
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        self.yarn_rope = rope

    def start_rounds(self, context_length: int) -> None:
        """Before a request's first round (host-side, uncaptured), with ``context_length`` entries committed: the
        retrieval modes clear their per-request device state (InfLLM: statistics and the representatives of the
        blocks that exist; CMR: the selection and the round count)."""
        if self.infllm is not None:
            self.infllm.reset(lambda i: self.cache.layers[i].keys, context_length)
        if self.cmr is not None:
            self.cmr.reset()

    def step_state(self) -> list[torch.Tensor]:
        """Buffers a drafting round both reads and overwrites (the retrieval modes' per-request state: InfLLM's
        statistics and representatives, CMR's selection), which a captured step's warm-up runs must leave as they
        found them (:class:`fold_hf.generation.graphs.CapturedStep`); empty for the other modes."""
        state = []
        if self.infllm is not None:
            state += [*self.infllm.received.values(), *self.infllm.seen.values(), *self.infllm.reprs.values()]
        if self.cmr is not None:
            state += [self.cmr.chosen, self.cmr.chunks_then]
        return state

    def attach_target_attention(self, queries: torch.Tensor, keys: torch.Tensor, scaling: float) -> None:
        """CMR: where its refreshes read the target's attention: the verify's kept queries ``[1, Hq, R, Dh]`` of the
        target's last full-attention layer (rotated), that layer's key cache ``[1, Hkv, capacity, Dh]`` and its
        logit scale (:meth:`fold_hf.targets.base.StaticTarget.keep_queries`)."""
        if self.cmr is None:
            raise ValueError(f"mode {self.mode!r} reads no target attention")
        self.cmr.target = (queries, keys, float(scaling))

    def next_phase(self, context_length: int):
        """The phase of the next drafting round, whose context holds ``context_length`` entries: a key of its
        captured step (host-side). CMR: ``initial`` / ``refresh`` / ``grow``; InfLLM: ``form`` (blocks form: the
        step rebuilds the newest representatives) / ``steady``; None for every other mode (one step)."""
        if self.cmr is not None:
            return self.cmr.next_phase()
        if self.infllm is not None:
            return self.infllm.next_phase(context_length)
        return None

    def same_phase(self, context_length: int, other_length: int) -> bool:
        """Whether rounds whose contexts hold ``context_length`` or ``other_length`` entries take the same phase
        (:meth:`next_phase`; host-side, changes nothing): InfLLM's depends on the blocks formed, CMR's on the round
        count only."""
        if self.infllm is not None:
            return self.infllm.n_blocks(context_length) == self.infllm.n_blocks(other_length)
        return True

    def needs_far(self, context_length: int) -> bool:
        """Whether a round whose context holds ``context_length`` entries reads a non-empty far memory."""
        return self.far_threshold is not None and context_length > self.far_threshold

    @torch.no_grad()
    def draft(self, new_features: torch.Tensor, state: torch.Tensor, with_far: bool, pick=None, phase=None):
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
            phase: :meth:`next_phase`'s answer for this round (CMR, InfLLM); None otherwise.

        Returns:
            ``[R - 1]`` proposals (long): slots 1 .. B-1 (z-lab) or 0 .. B-1 (DeepSpec, its Markov head applied slot
            by slot on the device); greedy without ``pick``, else what ``pick`` returns (proposals and their
            distributions ``q`` or None).
        """
        if self.owns_tables and self.yarn_rope is None:
            raise RuntimeError("yarn reads the request's rope tables: call start_request(request_length) first")
        if (phase is not None) != (self.cmr is not None or self.infllm is not None):
            raise ValueError("phase= is the retrieval modes' round phase (StaticDrafter.next_phase); other modes "
                             "take None")
        layers = self._layers if self.ops is None else self._layers_fused
        return self._draft_tokens(layers(self._round(new_features, state, phase), with_far), state, pick)

    def _round(self, new_features: torch.Tensor, state: torch.Tensor, phase) -> dict:
        """What every layer of a round needs (device tensors): the new context rows' entry positions and features,
        the block's embeddings, ReRoPE's row scale (or None), and the views layers read (``_View``)."""
        drafter, B = self.drafter, self.block
        d_len, d_new, last = state[1:2], state[2:3], state[3:4]
        context_length = d_len + d_new
        true_positions = context_length + self.block_offsets  # block_start = end of the context
        row_scale = self._row_scale(true_positions)
        ids = torch.cat((last, torch.full((B - 1,), self.mask_id, dtype=last.dtype, device=last.device)))
        plain = self.plain_tables
        # the reads take their lengths as int32 (the kernels' type): converted once a round, not per layer
        read_length = context_length.to(torch.int32)
        views = {"true": _View((plain[0][true_positions], plain[1][true_positions]), read_length, plain)}
        if self.owns_tables:
            views["yarn"] = _View((self.cos[true_positions], self.sin[true_positions]), read_length,
                                  (self.cos, self.sin))
        kept = None
        if "streaming" in self.selections:
            # slot i holds sink i, or recent entry T - budget + i once the context outgrows the budget; slots past
            # the context (short contexts) are gathered but never read
            shift = (context_length - self.budget).clamp_min(0)
            kept = torch.where(self.budget_slots < self.sinks, self.budget_slots, self.budget_slots + shift)
            kept, kept_length = kept.clamp_max(self.capacity - 1), context_length.clamp_max(self.budget)
        elif self.cmr is not None:
            kept, kept_length = self.cmr.select(context_length, d_new, phase)
        if kept is not None:  # the selection renumbered 0 .. K-1, the block right after it
            rows = kept_length + self.block_offsets
            views["renumbered"] = _View((self.cos[rows], self.sin[rows]), kept_length, (self.cos, self.sin), kept)
        infllm = None
        if self.infllm is not None:
            infllm = self.infllm.round(context_length)
            views["infllm"] = _View(views["true"].rows, infllm["read_length"], infllm["key_tables"])
        return dict(entry_positions=d_len + self.row_offsets, context=drafter.context_features(new_features),
                    hidden=drafter.embed_block(ids[None]).to(self.dtype), row_scale=row_scale, views=views,
                    infllm=infllm, phase=phase)

    def _row_scale(self, true_positions: torch.Tensor) -> torch.Tensor | None:
        """ReRoPE's query scale of each block row at ``true_positions [..., B]`` (same shape), None in other modes."""
        if self.log_rerope_base is None:
            return None
        return (torch.log((true_positions + 1).to(self.acc)) / self.log_rerope_base).clamp_min(1.0)

    def _view(self, geometry, rnd: dict) -> _View:
        if geometry.selection == "infllm":
            return rnd["views"]["infllm"]
        if geometry.renumbered:
            return rnd["views"]["renumbered"]
        return rnd["views"]["yarn" if geometry.yarn else "true"]

    def _attend(self, i: int, cache_layer, q, k_blk, v_blk, rnd: dict, with_far: bool, rotate, heads):
        """Layer ``i``'s read of its cache (or the entries it gathers) and the block; ``rotate(x, (cos, sin),
        row_scale, scale)`` rotates queries / block keys into the read's layout, ``heads(x)`` gives ``[1, H, B,
        Dh]`` views of them (InfLLM's selection and statistics)."""
        g = self.geometry[i]
        attn = self.drafter.layers[i].self_attn
        view = self._view(g, rnd)
        row_scale = rnd["row_scale"] if g.rerope_scale else None
        query_near = rotate(q, view.rows, row_scale, attn.scaling)
        far_rows = self.far_tables[(g.far, g.far_per_row)] if with_far and g.far is not None else None
        query_far = rotate(q, far_rows, row_scale, attn.scaling) if far_rows is not None else None
        block_keys = rotate(k_blk, view.rows, None, 1.0)
        keys, values = cache_layer.keys, cache_layer.values
        gather = view.gather
        if g.selection == "infllm":
            gather = self.infllm.select(i, heads(q), keys, rnd["infllm"], rebuild=rnd["phase"] != "steady")
        if gather is not None:
            keys, values = keys.index_select(2, gather), values.index_select(2, gather)
        out = self._read(query_near, query_far, keys, values, block_keys, v_blk, view, g, rnd)
        if g.selection == "infllm":  # the window attention this read gave, from the read's own queries
            self.infllm.record(i, query_near, query_far, block_keys, keys, rnd["infllm"])
        return out

    def _read(self, query_near, query_far, keys, values, block_keys, block_values, view: _View, geometry,
              rnd: dict) -> torch.Tensor:
        """The read function over ``view``'s length and tables (the kernel contract; a rows step reads row by row)."""
        return self.read(query_near, query_far, keys, values, block_keys, block_values, *view.tables, view.length,
                         view.length, geometry.window, geometry.alpha)

    def _write(self, cache_layer, rnd: dict, keys: torch.Tensor, values: torch.Tensor) -> None:
        """The round's new context entries ``keys`` / ``values [1, Hkv, R, Dh]`` into ``cache_layer`` at its entry
        positions ``[R]`` (a rows step: each row's into its own cache row)."""
        cache_layer.keys.index_copy_(2, rnd["entry_positions"], keys)
        cache_layer.values.index_copy_(2, rnd["entry_positions"], values)

    def _rotate_fused(self, x, rows, row_scale, scale):
        """Fused path: ``x [A, B, H, Dh]`` rotated by ``rows`` (``(cos, sin) [B, rd]``, or ``[A, B, rd]``), times the
        logit scale (per block row with ReRoPE, ``row_scale [B]`` or ``[A, B]``), as ``[A, H, B, Dh]`` in the model
        dtype: one launch over the ``A * B`` tokens."""
        A, B = x.shape[:2]
        if row_scale is not None:  # rerope: a row's query scale scales its logits
            x = x * row_scale.to(x.dtype).reshape(-1, B)[:, :, None, None]
        cos, sin = (t.expand(A, B, t.shape[-1]).reshape(A * B, t.shape[-1]) for t in rows)  # [B, rd]: every row's
        out = self.ops.rotate_heads(x.reshape(1, A * B, *x.shape[2:]), cos, sin, scale, self.dtype)
        return out if A == 1 else out.view(out.shape[1], A, B, out.shape[-1]).transpose(0, 1)

    def _draft_tokens(self, hidden: torch.Tensor, state: torch.Tensor, pick=None):
        """Proposals ``[R - 1]`` from the final-normed block ``[1, B, H]`` through the drafter's head
        (:meth:`FoldDrafter.draft_head`, device ops only): greedy, or ``pick``'s choice with its ``q``; a DeepSpec
        confidence cut writes the kept count to ``state[CUT_SLOT]``."""
        drafter = self.drafter
        tokens, q, kept = drafter.draft_head(hidden[0, drafter.first_proposal_slot :], state[3:4], pick)
        if kept is not None:
            state[CUT_SLOT : CUT_SLOT + 1].copy_(kept)
        return tokens if pick is None else (tokens, q)

    def _rotate(self, x, rows, row_scale, scale):
        """Module path: ``x [A, H, B, Dh]`` rotated by ``rows`` (``(cos, sin) [B, rd]``, or ``[A, B, rd]``: a rows
        step's, each row's own) in fp32, times the logit scale (per block row with ReRoPE, ``row_scale [B]`` or
        ``[A, B]``), in the model dtype."""
        if row_scale is not None:
            scale = scale * row_scale[..., None, :, None]  # [(A,) 1, B, 1]: block rows
        cos, sin = rows
        return (rotate_by_tables(x, cos.unsqueeze(-3), sin.unsqueeze(-3)) * scale).to(self.dtype)

    def _layers(self, rnd: dict, with_far: bool) -> torch.Tensor:
        """The drafter's layers through their own forward (:class:`~fold_hf.modeling.drafter_layer.DrafterLayer`),
        reading through :meth:`_store_and_attend`; returns the final-normed block ``[1, B, H]``."""
        drafter, hidden = self.drafter, rnd["hidden"]

        def read(attn, q, k_new, v_new, k_blk, v_blk):
            return self._store_and_attend(attn.layer_idx, q, k_new, v_new, k_blk, v_blk, rnd, with_far)

        for layer in drafter.layers:
            hidden = layer(hidden, rnd["context"], read)
        return drafter.norm(hidden)

    def _store_and_attend(self, i: int, q, k_new, v_new, k_blk, v_blk, rnd: dict, with_far: bool) -> torch.Tensor:
        """Layer ``i``'s read in the module path: its new context entries ``k_new`` / ``v_new [1, Hkv, R, Dh]`` written
        at the round's entry positions of the preallocated cache, then :meth:`_attend` of queries ``q [1, Hq, B, Dh]``
        and the block ``k_blk`` / ``v_blk [1, Hkv, B, Dh]``; returns ``[1, B, Hq, Dh]``."""
        cache_layer = self.cache.layers[i]
        self._write(cache_layer, rnd, k_new, v_new)
        return self._attend(i, cache_layer, q, k_blk, v_blk, rnd, with_far, self._rotate, lambda x: x)

    def _layers_fused(self, rnd: dict, with_far: bool) -> torch.Tensor:
        """:meth:`_layers` restated with the fused elementwise ops (pre-norm layers only): each residual add happens
        inside the next norm, q|k|v and gate|up are one GEMM each; returns the final-normed block ``[A, B, H]`` (``A``
        = 1, or a rows step's rows: every GEMM over all of them at once)."""
        drafter, B, ops = self.drafter, self.block, self.ops
        hidden, context = rnd["hidden"], rnd["context"]
        A = hidden.shape[0]
        delta = None
        for i, (layer, cache_layer) in enumerate(zip(drafter.layers, self.cache.layers)):
            attn = layer.self_attn
            qkv_weight, qkv_bias, gate_up_weight = fused_projections(layer)
            hidden, normed = ops.add_rms_norm(hidden, delta, layer.input_layernorm.weight, layer.input_layernorm.eps)
            # one q|k|v GEMM over the new context rows and the block together: the weights are read once a round
            # (7 -> 4 GEMMs a layer with gate|up below; on the H200 a GEMM costs the same at any row count up to
            # 16, so the queries of the context rows, which nothing reads, cost nothing)
            rows = torch.cat((context, normed), 1)
            nc = context.shape[1]  # context rows: the last verify's (B, or B + 1 for DeepSpec)
            qkv = F.linear(rows, qkv_weight, qkv_bias)  # [A, nc + B, (Hq + 2 Hkv) D]
            n_q, n_kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
            q = ops.add_rms_norm(qkv[:, nc:, :n_q].view(A, B, attn.num_heads, attn.head_dim), None,
                                 attn.q_norm.weight, attn.q_norm.eps)[1]
            keys = ops.add_rms_norm(qkv[..., n_q:n_q + n_kv].view(A, nc + B, attn.num_kv_heads, attn.head_dim), None,
                                    attn.k_norm.weight, attn.k_norm.eps)[1]
            values = qkv[..., n_q + n_kv:].view(A, nc + B, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
            self._write(cache_layer, rnd, keys[:, :nc].transpose(1, 2), values[:, :, :nc])
            k_blk, v_blk = keys[:, nc:], values[:, :, nc:]
            out = self._attend(i, cache_layer, q, k_blk, v_blk, rnd, with_far, self._rotate_fused,
                               lambda x: x.transpose(1, 2))
            post = layer.post_attention_layernorm
            hidden, normed = ops.add_rms_norm(hidden, attn.o_proj(out.reshape(A, B, -1)), post.weight, post.eps)
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
    from ..kernels.layer.naive import is_silu

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
