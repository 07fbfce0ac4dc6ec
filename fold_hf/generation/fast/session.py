"""The fast loop's session: the KV cache, drafter cache, device state, buffers and captured steps one target keeps
between calls (capture costs once), rebuilt when a request needs more room; :func:`release_fast_state` frees them
and :func:`drafter_cache_of` exposes the drafter cache for memory accounting."""

from __future__ import annotations

import torch

from ...kernels import default_layer_ops, triton_unavailable_reason
from ...kernels.fold_read.naive import fold_read_geometry_reference
from ...modeling.cache import FoldCache
from ...modeling.drafter import FoldDrafter
from ...modeling.rope import compute_dtype
from ...targets.registry import build_static_target
from ..graphs import CapturedStep, EagerStep
from ..static_drafter import (
    StaticDrafter,
    default_read_function,
    default_rows_read_function,
    fused_drafter_unsupported,
    preallocated_cache,
    static_drafter_unsupported,
)
from ..static_drafter_rows import RowsDrafter, rows_drafter_unsupported
from .settings import warn_once

ENGINES = ("eager", "static", "graphs")
SESSION_ATTR = "_fold_fast_session"
CAPACITY_ROUNDING = 256
KEPT_DRAFT_MODES = 12  # reading modes whose draft steps a session keeps captured (fold-hf bench runs 10)


def release_fast_state(target) -> None:
    """Free the fast loop's KV cache, drafter cache and graphs kept on ``target``."""
    target.__dict__.pop(SESSION_ATTR, None)


class Session:
    """Buffers and captured steps of one target (reused across calls while they fit)."""

    def __init__(self, target, capacity: int, tap_layer_ids: tuple, engine: str, exact: bool = False,
                 batch: int = 1) -> None:
        self.placement = weights_placement(target)
        self.runner = build_static_target(target, capacity, tap_layer_ids, batch=batch)
        self.batch = batch
        self.runner.set_exact(exact)  # raises ExactUnavailable naming why exact mode cannot run this target
        self.exact = exact
        self.capacity = capacity
        self.tap_layer_ids = tap_layer_ids
        self.engine = engine
        device = self.runner.device
        self.device = device
        self.pool = torch.cuda.graph_pool_handle() if engine == "graphs" else None
        self.state = torch.zeros(8, dtype=torch.long, device=device)
        # a round's state update (device_rounds): which of slots 0 .. 5 it keeps (x 1) or overwrites (x 0) before
        # adding its step, and the step's zero for the kept slot; session buffers, since captured steps read them
        self.keep_slots = torch.tensor([1, 1, 0, 0, 1, 1], dtype=torch.long, device=device)
        self.zero_slot = torch.zeros(1, dtype=torch.long, device=device)
        self.steps: dict[tuple, object] = {}
        self.ids: dict[int, torch.Tensor] = {}
        self.taps: dict[int, torch.Tensor] = {}
        self.offsets: dict[int, torch.Tensor] = {}
        self.drafter_key = None
        self.drafter_cache = None
        self.static_drafters: dict[str, StaticDrafter | None] = {}  # by repr(FoldConfig), most recent last
        self.static_drafter = None
        self.draft_tag = None
        self.rows_key = None  # the batched rounds' rows drafting step (rows_drafter)
        self.rows_static: RowsDrafter | None = None

    def buffers(self, block: int):
        if block not in self.ids:
            self.ids[block] = torch.zeros(1, block, dtype=torch.long, device=self.device)
            # zeros, not empty: rows past the accepted ones feed garbage cache entries that are masked out, and
            # a masked NaN would still poison the weighted sum of values
            self.taps[block] = torch.zeros(1, block, self.runner.tap_width, dtype=self.runner.dtype,
                                           device=self.device)
            self.offsets[block] = torch.arange(block, device=self.device)
        return self.ids[block], self.taps[block], self.offsets[block]

    def row_buffers(self, rows: int, width: int, with_taps: bool):
        """Persistent ``(ids [A, W], positions [A, W], taps [A, W, n_taps * H] or None)`` of a batched verify step
        over ``A = rows`` rows of ``W = width`` tokens (:class:`fold_hf.generation.fast.batched._Verify`): kept here,
        as the steps that read them are."""
        key = ("rows", rows, width, with_taps)
        if key not in self.ids:
            runner = self.runner
            taps = (torch.zeros(rows, width, runner.tap_width, device=self.device, dtype=runner.dtype) if with_taps
                    else None)
            self.ids[key] = (torch.zeros(rows, width, dtype=torch.long, device=self.device),
                             torch.zeros(rows, width, dtype=torch.long, device=self.device), taps)
        return self.ids[key]

    def draft_row_buffers(self, rows: int, width: int):
        """Persistent ``(features [A, R, n_taps * H], lengths [A, 4] long)`` of the rows drafting step over ``A =
        rows`` rows with ``R = width`` context rows each (:meth:`RowsDrafter.draft_rows`)."""
        key = ("draft_rows", rows, width)
        if key not in self.ids:
            self.ids[key] = (torch.zeros(rows, width, self.runner.tap_width, device=self.device,
                                         dtype=self.runner.dtype),
                             torch.zeros(rows, 4, dtype=torch.long, device=self.device))
        return self.ids[key]

    def draft_outputs(self, rows: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Persistent ``(drafts [A, slots] long on the device, host [A, slots] long, pinned on CUDA)``: where the
        batched rounds keep a rows step's proposals once it has run. A captured step's outputs live in the session's
        graph pool, which every step shares, so they stay valid only until the next replay of another step: one
        captured earlier may have used their memory for its own temporaries (graphs sharing a pool are safe only
        replayed in capture order). These buffers are allocated outside the pool."""
        key = ("draft_outputs", rows, slots)
        if key not in self.ids:
            self.ids[key] = (torch.zeros(rows, slots, dtype=torch.long, device=self.device),
                             torch.zeros(rows, slots, dtype=torch.long, pin_memory=self.device.type == "cuda"))
        return self.ids[key]

    def rows_drafter(self, drafter: FoldDrafter, fused: bool = False) -> RowsDrafter | None:
        """The batched rounds' rows drafting step of ``drafter`` in its current mode, over one preallocated
        ``[batch, Hkv, capacity, Dh]`` cache (kept with its steps while the drafter, its mode and ``fused`` stay;
        the rows' caches view it: :func:`~fold_hf.generation.static_drafter_rows.row_cache`), or None after saying
        once why the rows draft on the host (:func:`~fold_hf.modeling.drafter_rows.propose_rows`)."""
        if fused:
            why_not = fused_drafter_unsupported(drafter)
            if why_not is not None:
                warn_once(f"the drafter's rows step runs its modules, not the fused kernels: {why_not}")
                fused = False
        key = (id(drafter), repr(drafter.fold_config), drafter.confidence_threshold, fused,
               draft_vocab_tag(drafter))
        if key == self.rows_key:
            return self.rows_static
        for k in [k for k in self.steps if k[0] == "draft_rows"]:
            del self.steps[k]
        self.rows_key, self.rows_static = key, None
        reason = rows_drafter_unsupported(drafter)
        read = default_read_function(self.device)
        if read is None and self.engine == "static":
            read = fold_read_geometry_reference
        if reason is None and read is None:
            reason = f"the FOLD Triton read kernel is not usable here ({triton_unavailable_reason(self.device)})"
        if reason is not None:
            warn_once(f"batched rounds on engine {self.engine!r} draft on the host (propose_rows): the rows drafting "
                      f"step does not cover {reason}")
            return None
        cache = preallocated_cache(drafter, self.capacity, self.device, rows=self.batch)
        layer_ops = default_layer_ops(self.device) if fused else None
        self.rows_static = RowsDrafter(drafter, cache, read, layer_ops=layer_ops,
                                       rows_read=default_rows_read_function(self.device))
        return self.rows_static

    def host_results(self, numel: int) -> list[torch.Tensor]:
        """Two host buffers (pinned on CUDA) receiving a round's result ``[numel]`` (long): one for the round in
        flight, one for the round queued behind it."""
        key = ("host", numel)
        if key not in self.ids:
            pinned = self.device.type == "cuda"
            self.ids[key] = [torch.zeros(numel, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        return self.ids[key]

    def choice_buffers(self, slots: int) -> dict:
        """Persistent buffers of :class:`TokenChoice` for ``slots`` proposal slots (captured steps read them)."""
        key = ("choice", slots)
        if key not in self.ids:
            vocab = self.runner.lm_head.weight.shape[0]
            self.ids[key] = dict(
                seen=torch.zeros(vocab, dtype=torch.bool, device=self.device),
                eos=torch.zeros(vocab, dtype=torch.bool, device=self.device),
                u=torch.zeros(2 * slots + 1, dtype=torch.float64, device=self.device),
                q=torch.zeros(slots, vocab, dtype=compute_dtype(self.runner.dtype), device=self.device))
        return self.ids[key]

    def step(self, key: tuple, fn, preserve=()):
        """The step of ``key`` (built from ``fn`` the first time); ``preserve``: buffers ``fn`` reads and
        overwrites, restored after the graph engine's warm-up runs. What its replay returns is valid until the next
        replay of any step of the session (the graphs share one memory pool: see :meth:`draft_outputs`); copy it out
        in stream order before that, or read it first."""
        step = self.steps.get(key)
        if step is None:
            # a recurrent target's verify commits the accepted state into the buffer it reads: its warm-up runs
            # must leave that state as the loop left it
            preserve = self.runner.step_state() + list(preserve)
            step = (CapturedStep(fn, pool=self.pool, preserve=preserve) if self.engine == "graphs"
                    else EagerStep(fn, preserve=preserve))
            self.steps[key] = step
        return step

    def drafter_slot(self, drafter: FoldDrafter, request_length: int, fused: bool = False):
        """(FoldCache reset to empty, StaticDrafter or None) for ``drafter`` in its current mode.

        The cache does not depend on the reading mode, so one buffer serves every mode of a drafter; the static
        drafters and their captured draft steps are kept per mode (the last :data:`KEPT_DRAFT_MODES`), so a caller
        comparing modes on one request does not capture the draft graphs again at every switch. ``fused``: the
        static drafter runs its layers with the fused elementwise kernels (see :func:`fused_drafter_enabled`)."""
        cfg = drafter.fold_config
        if fused:
            why_not = fused_drafter_unsupported(drafter)
            if why_not is not None:
                warn_once(f"the drafter's static step runs its modules, not the fused kernels: {why_not}")
                fused = False
        key = (id(drafter), self.engine)
        if key != self.drafter_key:
            for k in [k for k in self.steps if k[0] == "round" and k[1] is not None]:
                del self.steps[k]
            self.drafter_cache = preallocated_cache(drafter, self.capacity, self.device, request_length)
            self.static_drafters = {}
            self.drafter_key = key
        tag = repr(cfg) + (" fused" if fused else "")
        if drafter.confidence_threshold > 0:  # baked into the captured step (a DeepSpec confidence cut)
            tag += f" confidence<{drafter.confidence_threshold!r}"
        tag += draft_vocab_tag(drafter)  # the proposals' head rows are baked into the captured step too
        if tag not in self.static_drafters:
            static = None
            reason = static_drafter_unsupported(drafter) if self.engine != "eager" else None
            if reason is None and self.engine != "eager" and cfg.mode == "cmr":
                why = self.runner.keep_queries_unsupported()  # cmr's refreshes read the verify's queries
                if why is not None:
                    reason = f"mode 'cmr' on this target: {why}"
            if self.engine != "eager" and reason is None:
                read = default_read_function(self.device)
                if read is None and self.engine == "static":
                    read = fold_read_geometry_reference
                if read is None:
                    warn_once(f"the FOLD Triton read kernel is not usable here "
                              f"({triton_unavailable_reason(self.device)}): the drafter drafts eagerly, uncaptured")
                if read is not None:
                    shared = next((d for d in self.static_drafters.values()
                                   if d is not None and not d.owns_tables), None)
                    static = StaticDrafter(drafter, self.drafter_cache, read,
                                           tables=(shared.cos, shared.sin) if shared is not None else None,
                                           layer_ops=default_layer_ops(self.device) if fused else None)
            if reason is not None:
                warn_once(f"the drafter drafts eagerly, uncaptured: static drafting does not cover {reason}")
            self.static_drafters[tag] = static
            while len(self.static_drafters) > KEPT_DRAFT_MODES:
                oldest = next(iter(self.static_drafters))
                del self.static_drafters[oldest]
                for k in [k for k in self.steps if k[0] == "round" and k[1] == oldest]:
                    del self.steps[k]
        else:
            self.static_drafters[tag] = self.static_drafters.pop(tag)  # most recently used last
        self.static_drafter = self.static_drafters[tag]
        self.draft_tag = tag
        self.drafter_cache.reset()
        self.drafter_cache.request_length = request_length
        if self.static_drafter is not None:
            self.static_drafter.start_request(request_length)
        return self.drafter_cache, self.static_drafter


def draft_vocab_tag(drafter) -> str:
    """What of the drafter's draft vocabulary (:meth:`FoldDrafter.use_draft_vocab`) a captured draft step bakes in:
    '' without one; the object's identity with one (its head rows are read by address)."""
    vocab = getattr(drafter, "draft_vocab", None)
    return "" if vocab is None else f" draft_vocab[{len(vocab)} of {vocab.vocab_size}]#{id(vocab)}"


def weights_placement(target) -> tuple:
    """The dtypes and devices of ``target``'s parameters: a session built for other ones (the model was cast or
    moved since, or deep-copied with its session and then cast) holds caches and weight copies of the old ones."""
    return tuple(sorted({(str(p.dtype), str(p.device)) for p in target.parameters()}))


def session_for(target, capacity: int, tap_layer_ids: tuple, engine: str, exact: bool = False,
                batch: int = 1) -> Session:
    """The session kept on ``target``, or a new one when it lacks room, the engine, the taps, the exact mode
    (``exact``: the runner's decode / verify steps run exact mode's kernels, docs/exact-mode.md), the batch (cache
    rows: ``batch`` > 1 for batched rounds, :mod:`~fold_hf.generation.fast.batched`) or the weights' dtype and
    device (:func:`weights_placement`)."""
    session = target.__dict__.get(SESSION_ATTR)
    # a session built with taps serves AR too (its verify simply skips them)
    if session is not None and (session.capacity < capacity or session.engine != engine or session.exact != exact
                                or session.batch != batch
                                or (tap_layer_ids and session.tap_layer_ids != tap_layer_ids)
                                or session.placement != weights_placement(target)):
        release_fast_state(target)
        session = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if session is None:
        rounded = -(-capacity // CAPACITY_ROUNDING) * CAPACITY_ROUNDING
        session = Session(target, rounded, tap_layer_ids, engine, exact, batch)
        target.__dict__[SESSION_ATTR] = session
    return session


def drafter_cache_of(target) -> FoldCache | None:
    """The drafter cache the fast loop keeps on ``target`` (for memory accounting), or None."""
    session = target.__dict__.get(SESSION_ATTR)
    return None if session is None else session.drafter_cache
