"""`fast_generate`: the foundation loop (:func:`fold_hf.generate`) rebuilt for speed, same results.

What changes against :mod:`fold_hf.generation.loop` (which runs any causal LM through its own ``forward``):

* the target runs through :class:`~fold_hf.generation.static_target.StaticTarget`: our forward over the
  model's own modules with a preallocated KV cache; rollback rewinds a length;
* the drafter's :class:`~fold_hf.modeling.cache.FoldCache` is preallocated for the whole request (nothing
  reallocates) and the prompt's context is committed chunk by chunk during the prefill;
* token choice is on the device (:mod:`~fold_hf.generation.sampling`: greedy match count or speculative sampling
  with temperature, top-k, top-p, min-p, the repetition penalty and ``min_new_tokens``); each round reads one
  small tensor back (the accepted count with the round's tokens) and nothing else;
* engines:

  ``eager``   host-side lengths, exact-length attention (flash decoding for one query), the drafter through
              :meth:`FoldDrafter.draft_logits` exactly as the foundation loop calls it. Default on CPU.
  ``static``  every length lives in a device state tensor and every step has fixed shapes (what ``graphs``
              captures), run without capture: the graph path's logic, testable on CPU.
  ``graphs``  ``static`` with each step captured once in a CUDA graph and replayed. A round (the drafter's
              static step, the verify, the acceptance and the state update) is one step, with one graph per
              (query length, attention bucket, drafter variant): the bucket grows with the context (length
              dispatch), so a short context does not read the whole capacity. The drafter's part is captured
              when the FOLD Triton kernel (``fold_hf.kernels.triton_fold``) imports, in every reading mode
              (the baselines too, :mod:`~fold_hf.generation.static_drafter`; cmr's phases each a variant),
              with a window-only variant until the context exceeds W; sliding-window drafter layers included,
              the window-only variant runs until some layer's far memory is non-empty (a sliding layer's: past
              sliding_window - B entries). The next round is queued before the previous one's result is read
              whenever its variant does not depend on that result (:func:`_static_rounds`). Default on CUDA.

* ``target_attention`` (static and graphs engines): ``"triton"`` (default on CUDA with Triton) runs the verify
  step's attention through the decode kernel :func:`fold_hf.kernels.triton_fold.decode_attention_triton` (its
  torch twin off CUDA), which reads the lengths from the device state; ``"bucket"`` (default elsewhere) attends
  over the length bucket with two matmuls and a masked fp32 softmax (far slower at long contexts: measured in
  docs/fast-path.md). The environment variable ``FOLD_HF_TARGET_ATTENTION`` sets the
  default. The eager engine always uses SDPA over the exact prefix.

* ``fused_layers`` (static and graphs engines, with ``target_attention="triton"``): the target's norms with
  their residual adds, the rope with the cache write and the MLP's ``silu(gate) * up`` run as three fused
  kernels per layer (:mod:`fold_hf.kernels.triton_layer`; torch twins off CUDA) instead of ~30 small module
  kernels. Default: on when the attention is ``"triton"`` on CUDA and the target's layers allow it
  (:meth:`StaticTarget.fused_unsupported`); ``$FOLD_HF_FUSED_LAYERS`` (``0``/``1``) overrides. Qwen3.5 and Gemma
  targets have their own fused layers (:mod:`fold_hf.kernels.triton_hybrid`, in their family modules).

* ``drafter=None`` is autoregressive decoding on the same machinery (block size 1), so AR and speculative
  timings compare like with like.

Targets: the Llama family (see :data:`SUPPORTED_ARCHITECTURES`) and the families registered in
:data:`~fold_hf.generation.static_target.TARGET_FAMILIES` (Gemma-3 / Gemma-4 text: :mod:`fold_hf.generation.targets.gemma`, with ring caches
for sliding layers; Qwen3.5: :mod:`fold_hf.generation.targets.qwen35`, whose
verify keeps the linear-attention state of every block position (fused layers: the block's inputs) and
``accept(n)`` selects (re-runs) the accepted one on the device, inside the captured verify); batch 1; anything else raises a ValueError saying why (use
:func:`fold_hf.generate` for those). The round loop of the eager engine is
:func:`fold_hf.generation.rounds.eager_rounds`, the one :func:`fold_hf.generate` runs; EOS, stop strings, streamers
and the returned :class:`GenerationResult` come from :class:`~fold_hf.generation.tracker.Tracker`.

Sessions: the KV cache, drafter cache and captured graphs are kept on the target between calls (capture costs
once) and rebuilt when a request needs more room; :func:`release_fast_state` frees them.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Sequence

import torch

from ..kernels import default_layer_ops, triton_kernels_enabled
from ..kernels.reference import fold_read_geometry_reference
from ..modeling.cache import FoldCache
from ..modeling.drafter import FoldDrafter
from ..modeling.fold_config import FoldConfig
from ..modeling.retrieval import TargetAttentionProbe, retrieval_state
from ..modeling.rope import compute_dtype
from ..modeling.validation import validate_batch
from .graphs import CapturedStep, EagerStep
from .rounds import decode, eager_rounds, num_proposals, propose
from .sampling import Sampling, TokenChoice
from .static_drafter import (
    CUT_SLOT,
    StaticDrafter,
    commit_context,
    fused_drafter_unsupported,
    default_read_function,
    preallocated_cache,
    static_drafter_unsupported,
)
from .static_target import (
    PREFILL_CHUNK,
    SUPPORTED_ARCHITECTURES,
    TARGET_ATTENTIONS,
    StaticTarget,
    UnsupportedTarget,
    bucket_length,
    build_static_target,
    check_target,
)
from .stats import GenerationResult
from .tracker import StopStrings, Tracker, clock, eos_ids

ENGINES = ("eager", "static", "graphs")
_SESSION_ATTR = "_fold_fast_session"
CAPACITY_ROUNDING = 256
KEPT_DRAFT_MODES = 12  # reading modes whose draft steps a session keeps captured (fold-hf bench runs 10)

# state vector slots (long, on device): target length, drafter length, drafter rows to commit, last token, proposals
# that may be accepted this round, tokens generated so far
_T_LEN, _D_LEN, _D_NEW, _LAST, _LIMIT, _GEN = range(6)


_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """A UserWarning the first time ``message`` comes up in this process (the fast path's fallbacks say why)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def resolve_target_attention(target_attention: str | None, device: torch.device | str = "cpu") -> str:
    """``target_attention``, else ``$FOLD_HF_TARGET_ATTENTION``, else ``"triton"`` on CUDA with Triton and
    ``"bucket"`` elsewhere; raises on unknown names."""
    if target_attention is None:
        target_attention = os.environ.get("FOLD_HF_TARGET_ATTENTION") or None
    if target_attention is None:
        target_attention = "triton" if triton_kernels_enabled(device) else "bucket"
    if target_attention not in TARGET_ATTENTIONS:
        raise ValueError(f"target_attention must be one of {TARGET_ATTENTIONS}, got {target_attention!r}")
    return target_attention


def resolve_fused_layers(fused_layers: bool | None, target_attention: str, runner: StaticTarget,
                         engine: str) -> bool:
    """Whether the static and graphs engines run the target's fused layers (module docstring).

    Raises:
        ValueError: ``fused_layers=True`` with the eager engine or with ``target_attention="bucket"``.
        UnsupportedTarget: ``fused_layers=True`` on a target whose layers the fused kernels do not cover.
    """
    if fused_layers is None:
        env = os.environ.get("FOLD_HF_FUSED_LAYERS")
        if env not in (None, "", "0", "1"):
            raise ValueError(f"FOLD_HF_FUSED_LAYERS must be 0 or 1, got {env!r}")
        if env:
            fused_layers = env == "1"
        else:
            if engine == "eager" or target_attention != "triton" or runner.device.type != "cuda":
                return False
            reason = runner.fused_unsupported()
            if reason is not None:
                warn_once(f"fused target layers are off: {reason}")
            return reason is None
    if not fused_layers:
        return False
    if engine == "eager":
        raise ValueError("fused_layers runs in the static and graphs engines, not engine='eager'")
    if target_attention != "triton":
        raise ValueError("fused_layers needs target_attention='triton' (the fused layers attend with the decode "
                         "kernel)")
    reason = runner.fused_unsupported()
    if reason is not None:
        raise UnsupportedTarget(f"fused_layers=True: {reason}")
    return True


def fused_drafter_enabled() -> bool:
    """Whether fused layers extend to the drafter's static step (default yes; ``$FOLD_HF_FUSED_DRAFTER=0`` keeps
    the drafter on its modules). The same math as the drafter's modules, tested on CPU, in Triton's interpreter
    and on a GPU; what it saves per round is measured in docs/fast-path.md."""
    value = os.environ.get("FOLD_HF_FUSED_DRAFTER", "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"FOLD_HF_FUSED_DRAFTER must be 0 or 1, got {value!r}")
    return value == "1"


def resolve_fused_drafter(fused: bool, fused_layers: bool | None, target_attention: str, runner: StaticTarget,
                          engine: str) -> bool:
    """Whether the drafter's static step runs the fused kernels: when the target's layers do (``fused``), and also
    when only the target's own layer type kept them off by default (a Gemma target with a Llama-layout drafter;
    the drafter's layers are checked by :func:`fused_drafter_unsupported`). Off with ``fused_layers=False``,
    ``$FOLD_HF_FUSED_LAYERS=0`` or ``$FOLD_HF_FUSED_DRAFTER=0``."""
    if not fused_drafter_enabled():
        return False
    if fused:
        return True
    if (fused_layers is False or os.environ.get("FOLD_HF_FUSED_LAYERS") == "0" or engine == "eager"
            or target_attention != "triton" or runner.device.type != "cuda"):
        return False
    return runner.fused_unsupported() is not None


def release_fast_state(target) -> None:
    """Free the fast loop's KV cache, drafter cache and graphs kept on ``target``."""
    target.__dict__.pop(_SESSION_ATTR, None)


class _Session:
    """Buffers and captured steps of one target (reused across calls while they fit)."""

    def __init__(self, target, capacity: int, tap_layer_ids: tuple, engine: str) -> None:
        self.runner = build_static_target(target, capacity, tap_layer_ids)
        self.capacity = capacity
        self.tap_layer_ids = tap_layer_ids
        self.engine = engine
        device = self.runner.device
        self.device = device
        self.pool = torch.cuda.graph_pool_handle() if engine == "graphs" else None
        self.state = torch.zeros(8, dtype=torch.long, device=device)
        self.steps: dict[tuple, object] = {}
        self.ids: dict[int, torch.Tensor] = {}
        self.taps: dict[int, torch.Tensor] = {}
        self.offsets: dict[int, torch.Tensor] = {}
        self.drafter_key = None
        self.drafter_cache = None
        self.static_drafters: dict[str, StaticDrafter | None] = {}  # by repr(FoldConfig), most recent last
        self.static_drafter = None
        self.draft_tag = None

    def buffers(self, block: int):
        if block not in self.ids:
            self.ids[block] = torch.zeros(1, block, dtype=torch.long, device=self.device)
            # zeros, not empty: rows past the accepted ones feed garbage cache entries that are masked out, and
            # a masked NaN would still poison the weighted sum of values
            self.taps[block] = torch.zeros(1, block, self.runner.tap_width, dtype=self.runner.dtype,
                                           device=self.device)
            self.offsets[block] = torch.arange(block, device=self.device)
        return self.ids[block], self.taps[block], self.offsets[block]

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
        overwrites, restored after the graph engine's warm-up runs."""
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
        fused = fused and fused_drafter_unsupported(drafter) is None
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
                    warn_once("the FOLD Triton read kernel is not usable here (Triton missing or "
                              "FOLD_HF_DISABLE_TRITON=1): the drafter drafts eagerly, uncaptured")
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


def _session(target, capacity: int, tap_layer_ids: tuple, engine: str) -> _Session:
    session = target.__dict__.get(_SESSION_ATTR)
    # a session built with taps serves AR too (its verify simply skips them)
    if session is not None and (session.capacity < capacity or session.engine != engine
                                or (tap_layer_ids and session.tap_layer_ids != tap_layer_ids)):
        release_fast_state(target)
        session = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if session is None:
        rounded = -(-capacity // CAPACITY_ROUNDING) * CAPACITY_ROUNDING
        session = _Session(target, rounded, tap_layer_ids, engine)
        target.__dict__[_SESSION_ATTR] = session
    return session


def fast_unsupported(target, drafter=None, *, batch_size: int = 1, capacity: int | None = None) -> str | None:
    """Why :func:`fast_generate` cannot run this request (``capacity``: its prompt + new tokens, when known), or
    None when it can (used by the routing)."""
    if batch_size != 1:
        return f"batch size {batch_size}: the fast loop runs batch 1"
    if drafter is not None and not isinstance(drafter, FoldDrafter):
        return f"assistant {type(drafter).__name__} is not a FoldDrafter"
    placed = {str(d) for d in (getattr(target, "hf_device_map", None) or {}).values()}
    if len(placed) > 1:
        return (f"a target dispatched over {', '.join(sorted(placed))} (device_map): the fast loop keeps the whole "
                "target on one device")
    try:
        check_target(target, capacity)
    except UnsupportedTarget as err:
        return str(err)
    return None


@torch.no_grad()
def fast_generate(
    target,
    drafter: FoldDrafter | None = None,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int | None = 256,
    max_length: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    min_new_tokens: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    stop_strings: Sequence[str] | str | None = None,
    tokenizer=None,
    streamer=None,
    generator: torch.Generator | None = None,
    fold_config: FoldConfig | None = None,
    return_stats: bool = False,
    engine: str | None = None,
    prefill_chunk: int = PREFILL_CHUNK,
    target_attention: str | None = None,
    fused_layers: bool | None = None,
):
    """Speculative decoding (greedy or sampled) of ``target`` with ``drafter`` (AR when None) on the fast machinery.

    Same arguments and result as :func:`fold_hf.generate`, plus:

    Args:
        engine: ``"eager"``, ``"static"`` or ``"graphs"`` (module docstring); default ``graphs`` on CUDA,
            ``eager`` otherwise.
        prefill_chunk: prompt tokens per prefill forward (bounds the prefill's activation memory).
        target_attention: the verify step's attention in the static and graphs engines, ``"bucket"`` or
            ``"triton"`` (module docstring); default ``$FOLD_HF_TARGET_ATTENTION``, else ``"triton"`` on CUDA
            with Triton and ``"bucket"`` elsewhere.
        fused_layers: run the target's elementwise work as fused kernels (module docstring); default on with
            ``target_attention="triton"`` on CUDA where the target allows it.

    Sampling (``do_sample=True``, with temperature, top-k, top-p, min-p) and the repetition penalty and
    ``min_new_tokens`` run on the device inside the round (:mod:`~fold_hf.generation.sampling`), captured in the
    graphs engine; ``generator`` seeds them (the same seed gives the same tokens on every engine).

    Returns:
        ``[1, P + N]`` sequences, or a :class:`GenerationResult` with ``return_stats=True``.

    Raises:
        ValueError: batch > 1, padding, an unsupported target architecture (the message says which).
    """
    if input_ids is None:
        raise ValueError("input_ids is required")
    validate_batch(input_ids)
    reason = fast_unsupported(target, drafter)
    if reason is not None:
        raise ValueError(f"fast_generate cannot run this request: {reason}")
    if attention_mask is not None and not bool(torch.all(attention_mask != 0)):
        raise ValueError("attention_mask has padding; batch-1 generation takes unpadded prompts")
    prompt_len = input_ids.shape[1]
    if max_new_tokens is None:
        if max_length is None:
            raise ValueError("give max_new_tokens or max_length")
        max_new_tokens = max_length - prompt_len
    if max_new_tokens < 1:
        raise ValueError(f"nothing to generate: max_new_tokens={max_new_tokens} (prompt has {prompt_len} tokens)")
    sampling = Sampling.from_settings(do_sample, temperature, top_k, top_p, min_p, repetition_penalty,
                                      min_new_tokens)
    device = input_ids.device
    if engine is None:
        engine = "graphs" if device.type == "cuda" else "eager"
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "graphs" and device.type != "cuda":
        raise ValueError("engine='graphs' needs CUDA tensors; use engine='eager' or 'static' on CPU")
    target_attention = resolve_target_attention(target_attention, device)
    if drafter is not None:
        drafter.bind_target(target)
    previous_config = None
    if fold_config is not None:
        if drafter is None:
            raise ValueError("fold_config was given without a drafter")
        previous_config = drafter.fold_config
        drafter.set_fold_config(fold_config)
    try:
        rows = num_proposals(drafter) + 1
        capacity = prompt_len + max_new_tokens + rows
        taps = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        session = _session(target, capacity, taps, engine)
        fused = resolve_fused_layers(fused_layers, target_attention, session.runner, engine)
        out = Tracker(eos_ids(target, eos_token_id), StopStrings(stop_strings, tokenizer), streamer)
        result = _decode(session, drafter, input_ids.to(session.device), max_new_tokens, out, sampling, generator,
                         prefill_chunk, target_attention, fused,
                         resolve_fused_drafter(fused, fused_layers, target_attention, session.runner, engine))
        return result if return_stats else result.sequences
    finally:
        if previous_config is not None:
            drafter.set_fold_config(previous_config)


class _StaticRunner:
    """The eager engine's runner (:mod:`~fold_hf.generation.rounds`): :class:`StaticTarget` at host positions."""

    def __init__(self, runner: StaticTarget, taps: torch.Tensor | None) -> None:
        self.runner, self.taps = runner, taps
        self._start = None  # position of the last verify

    def prefill(self, input_ids, chunk, on_taps):
        self._start = None
        return self.runner.prefill(input_ids, chunk=chunk, on_taps=on_taps), None

    def verify(self, ids: torch.Tensor, position: int):
        if self._start is not None:  # the last verify kept position - start tokens: recurrent families select
            self.runner.accept(position - self._start - 1)  # that position's state (a no-op for KV-only ones)
        self._start = position
        taps = self.taps[:, : ids.shape[1]] if self.taps is not None else None
        return self.runner.forward(ids, position, taps_out=taps), taps


@contextlib.contextmanager
def _cmr_probe(session: _Session, drafter, dcache, static_drafter):
    """``cmr`` with host-length rounds (the eager engine, or no static drafting step here): the target attention
    probe on the static target's host-length verify (its refreshes read those weights), yielded while the rounds
    run; None otherwise (every other mode, and cmr's static step, which reads the verify's kept queries)."""
    if drafter is None or drafter.fold_config.mode != "cmr" or (session.engine != "eager"
                                                                and static_drafter is not None):
        yield None
        return
    if session.engine != "eager":
        warn_once("fast loop: mode 'cmr' runs host-length (eager) rounds: its static drafting step is not available "
                  "here (the warning above says why), so its refreshes read the target's attention from the "
                  "host-length verify")
    with TargetAttentionProbe(session.runner.model, runner=session.runner) as probe:
        retrieval_state(dcache).probe = probe
        yield probe


def _decode(session: _Session, drafter, input_ids, budget: int, out: Tracker, sampling: Sampling, generator,
            prefill_chunk: int, target_attention: str = "bucket", fused: bool = False,
            drafter_fused: bool | None = None) -> GenerationResult:
    prompt_len = input_ids.shape[1]
    slots = num_proposals(drafter)
    dcache = static_drafter = None
    on_taps = None
    if drafter is not None:
        if drafter_fused is None:
            drafter_fused = fused and fused_drafter_enabled()
        dcache, static_drafter = session.drafter_slot(drafter, prompt_len + budget, fused=drafter_fused)

        def on_taps(features, start):
            commit_context(drafter, dcache, features)

    taps = session.buffers(slots + 1)[1] if drafter is not None else None
    runner = _StaticRunner(session.runner, taps)

    def make_choice(logits):
        return TokenChoice(sampling, generator, logits.shape[-1], session.device, input_ids, out.eos, slots,
                           buffers=session.choice_buffers(slots))

    def rounds(last, position, pending, choice):
        with _cmr_probe(session, drafter, dcache, static_drafter) as probe:
            if session.engine == "eager" or probe is not None:
                eager_rounds(runner, drafter, dcache, budget, out, last, position, pending, choice)
            else:
                _static_rounds(session, drafter, dcache, static_drafter, last, position, budget, out, choice,
                               target_attention, fused)

    return decode(runner, drafter, input_ids, out, make_choice, rounds, prefill_chunk, on_taps, session.device)


def pipelined_rounds_enabled() -> bool:
    """Whether the static and graphs engines queue a round before reading the previous one's result (default yes;
    ``$FOLD_HF_PIPELINE_ROUNDS=0`` reads each round's result before the next is launched, for A/B timings)."""
    value = os.environ.get("FOLD_HF_PIPELINE_ROUNDS", "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"FOLD_HF_PIPELINE_ROUNDS must be 0 or 1, got {value!r}")
    return value != "0"


class _Launched:
    """A round queued on the device: its result copied (asynchronously) to a host buffer, the event that says the
    copy is done, and the host facts it was launched with (``k``: proposals that may be accepted)."""

    __slots__ = ("values", "event", "k")

    def __init__(self, result: torch.Tensor, k: int, host: torch.Tensor) -> None:
        self.k, self.values = k, host
        if result.device.type == "cuda":
            host.copy_(result, non_blocking=True)  # pinned: the copy is queued after the round
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            host.copy_(result)
            self.event = None

    def read(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.values.tolist()


def _static_rounds(session: _Session, drafter, dcache, static_drafter, last, position: int, budget: int,
                   out: Tracker, choice: TokenChoice, target_attention: str = "bucket", fused: bool = False) -> None:
    """Device-length rounds (engines ``static`` and ``graphs``); one host read per round.

    A round is one step (one CUDA graph in the ``graphs`` engine): the drafter's static step, the verify, the
    acceptance and the state update. Its host inputs are the attention bucket, whether the drafter reads far memory
    and the proposals the budget allows; when those follow from what the host already knows whatever the round in
    flight accepts (nearly always), the next round is queued before that round's result is read, so the host's
    work overlaps the device's (``$FOLD_HF_PIPELINE_ROUNDS=0`` turns this off). When they do not (a bucket or the
    far-memory threshold may be crossed, the budget may end), or when the drafter drafts on the host, the loop
    reads the round first: every round runs the step the one-round-at-a-time loop would run, so the tokens are the
    same. A round queued past an EOS or stop string is dropped (its cache writes lie past the committed length)."""
    runner = session.runner
    slots = num_proposals(drafter)
    rows = slots + 1
    ids, taps, offsets = session.buffers(rows)
    with_taps = drafter is not None
    sampling = choice.sampling
    q_buffer = choice.q
    state = session.state
    drafter_length = dcache.get_seq_length() if dcache is not None else 0
    state.zero_()
    state[_T_LEN] = position
    state[_D_LEN] = drafter_length
    state[_LAST : _LAST + 1] = last
    state[_LIMIT] = slots
    state[_GEN] = len(out.tokens)
    state[CUT_SLOT] = slots  # a DeepSpec confidence threshold may lower it each round (the draft step writes it)
    limit = slots
    new_rows = 0  # host copy of state[_D_NEW]
    pending = None
    host_drafting = drafter is not None and static_drafter is None
    pipelined = pipelined_rounds_enabled() and not host_drafting
    # the round's processing is baked into its captured steps: one step per setting
    choice_key = (sampling, choice.masks_eos)
    keeps_queries = _start_retrieval(runner, static_drafter, drafter_length, rows)
    # a round step reads what it overwrites: the state (updated at its end), the verify's tapped features (the next
    # round's draft commits them), cmr's kept target queries (its refreshes read the last verify's), the tokens seen
    # (repetition penalty) and infllm/cmr's selection state; the graph engine's warm-up restores them
    preserve = [state] + ([taps] if with_taps else []) + ([choice.seen] if sampling.penalized else [])
    if keeps_queries:
        preserve.append(runner.query_keep[1])
    if static_drafter is not None:
        preserve += static_drafter.step_state()

    def verify(bucket: int):
        def run():
            ids[:, :1] = state[_LAST : _LAST + 1].view(1, 1)
            positions = state[_T_LEN : _T_LEN + 1] + offsets
            logits = runner.forward_static(ids, positions, bucket, taps_out=taps if with_taps else None,
                                           attention=target_attention, fused=fused)
            proposals = ids[0, 1:]
            kept = state[CUT_SLOT : CUT_SLOT + 1]  # proposals the drafter kept (all, unless a confidence cut)
            n, final = choice.verify(logits, proposals, q_buffer if sampling.do_sample else None,
                                     torch.minimum(state[_LIMIT : _LIMIT + 1], kept), state[_GEN : _GEN + 1])
            runner.accept(n)  # recurrent-state families keep the accepted position's state (device-side)
            next_state = torch.cat((state[_T_LEN : _T_LEN + 1] + n + 1,
                                    state[_D_LEN : _D_LEN + 1] + state[_D_NEW : _D_NEW + 1],
                                    n + 1, final, state[_LIMIT : _LIMIT + 1], state[_GEN : _GEN + 1] + n + 1,
                                    state[_GEN + 1 :]))
            outputs = (next_state, torch.cat((n, final, kept, proposals)))
            if sampling.penalized:
                outputs += (choice.observed(proposals, n, final),)
            return outputs

        return run

    def draft(with_far: bool, phase):
        pick = choice.picker()

        def run():
            proposals, q = static_drafter.draft(taps, state, with_far, pick=pick, phase=phase)
            ids[0, 1:] = proposals
            if q is not None:
                q_buffer.copy_(q)
            return proposals

        return run

    def round_step(drafts: bool, with_far: bool, phase, bucket: int):
        """Draft (when ``drafts``), verify, accept, update the state: one step, the round's result returned."""
        drafting = draft(with_far, phase) if drafts else None
        verifying = verify(bucket)

        def run():
            if drafting is not None:
                drafting()
            outputs = verifying()
            state.copy_(outputs[0])
            if sampling.penalized:
                choice.seen.copy_(outputs[2])
            return outputs[1]

        return run

    def plan(position: int, d_context: int, generated: int, spread: int):
        """(k, drafts, with_far, bucket, d_context) of the next round when the round in flight may accept 0 .. ``spread``
        proposals (0: nothing in flight, exact) and every outcome gives the same; None when they differ or the budget
        may end (then the in-flight round is read first). ``position``, ``d_context`` (entries the drafter's cache
        holds once it commits the last verify's rows) and ``generated`` count the in-flight round's one sure token."""
        lo_tokens, hi_tokens = generated, generated + spread
        if hi_tokens >= budget:  # (never with nothing in flight: the loop runs while tokens < budget)
            return None
        k = min(slots, budget - lo_tokens - 1)
        if min(slots, budget - hi_tokens - 1) != k:
            return None
        bucket = bucket_length(position + rows, runner.capacity)
        if bucket_length(min(position + spread + rows, runner.capacity), runner.capacity) != bucket:
            return None
        drafts = static_drafter is not None and k > 0
        with_far = drafts and static_drafter.needs_far(d_context)
        if drafts and static_drafter.needs_far(d_context + spread) != with_far:
            return None
        if drafts and spread and not static_drafter.same_phase(d_context, d_context + spread):
            return None  # infllm: whether blocks form this round depends on the round in flight
        return k, drafts, with_far, bucket, d_context

    def launch(k: int, drafts: bool, with_far: bool, bucket: int, d_context: int) -> _Launched:
        nonlocal limit, pending
        if k != limit:
            state[_LIMIT : _LIMIT + 1].fill_(k)
            limit = k
        choice.refill()
        if host_drafting and k > 0:
            proposals, q = propose(drafter, state[_LAST : _LAST + 1], pending, dcache, position, slots,
                                   choice.picker())
            ids[0, 1 : 1 + proposals.shape[0]] = proposals
            state[CUT_SLOT] = proposals.shape[0]  # fewer when a confidence threshold cut the proposal
            if q is not None:
                q_buffer[: q.shape[0]].copy_(q)
            pending = None
        # cmr: initial / refresh / grow (a host round count, whatever the rounds accept); infllm: form / steady (from
        # the context length, which plan() saw the same for every outcome of the round in flight); each its own step
        phase = static_drafter.next_phase(d_context) if drafts else None
        key = ("round", session.draft_tag if drafts else None, drafts, with_far, phase, rows, bucket, with_taps,
               target_attention, fused, keeps_queries) + choice_key
        result = session.step(key, round_step(drafts, with_far, phase, bucket), preserve=preserve).replay()
        host_slot[0] ^= 1  # the other buffer: the round in flight (if any) still owns this one's twin
        return _Launched(result, k, host_buffers[host_slot[0]])

    def process(launched: _Launched) -> None:
        nonlocal drafter_length, new_rows, position, pending
        values = launched.read()  # the round's one device-to-host read
        n, final, kept, proposals = values[0], values[1], values[2], values[3:]
        out.proposals.append(proposals[: min(launched.k, kept)] if drafter is not None else [])
        if host_drafting:
            accepted = taps[:, : n + 1].clone()
            pending = accepted if pending is None else torch.cat((pending, accepted), 1)
        drafter_length += new_rows
        new_rows = n + 1
        position += n + 1
        out.commit(proposals[:n] + [final])

    host_buffers, host_slot = session.host_results(3 + slots), [0]
    in_flight = None
    while True:
        if in_flight is None:
            if not out.running(budget):
                break
            step = plan(position, drafter_length + new_rows, len(out.tokens), 0)
        elif not pipelined:
            step = None
        else:  # the round in flight commits 1 .. k + 1 tokens
            step = plan(position + 1, drafter_length + new_rows + 1, len(out.tokens) + 1, in_flight.k)
        if step is None:
            process(in_flight)
            in_flight = None
            continue
        launched = launch(*step)
        if in_flight is not None:
            process(in_flight)  # while the device runs the round just queued
            if not out.running(budget):
                break  # an EOS or stop string: the queued round is dropped
        in_flight = launched
    if static_drafter is not None:
        for layer in dcache.layers:  # keep the cache's host length truthful for bytes_used() and later reads
            layer.length = drafter_length
    if keeps_queries:
        runner.keep_queries(None)


def _start_retrieval(runner: StaticTarget, static_drafter, drafter_length: int, rows: int) -> bool:
    """Before a request's static rounds: the retrieval modes' device state (:meth:`StaticDrafter.start_rounds`);
    for ``cmr`` the verify keeps the queries of the target's last full-attention layer, which its refreshes read,
    and every other request's verify keeps none. Returns whether the verify keeps queries (a key of its steps)."""
    runner.keep_queries(None)
    if static_drafter is None:
        return False
    static_drafter.start_rounds(drafter_length)
    if static_drafter.cmr is None:
        return False
    from ..modeling.retrieval import last_full_attention_layer

    layer = last_full_attention_layer(runner.model)
    static_drafter.attach_target_attention(runner.keep_queries(layer, rows), runner.keys[layer], runner.scaling)
    return True


@torch.no_grad()
def time_rounds(target, drafter: FoldDrafter | None, context_length: int, rounds: int, engine: str = "graphs",
                first_token: int = 0, target_attention: str | None = None,
                fused_layers: bool | None = None, sampling: Sampling | None = None,
                generator: torch.Generator | None = None) -> GenerationResult:
    """Benchmark entry: decode ``rounds`` rounds as if a ``context_length``-token prompt had been prefilled.

    No prefill runs: the target and drafter caches simply hold ``context_length`` entries (whatever the buffers
    contain, zeros when fresh), so per-round cost at long contexts can be timed in seconds. Timing is
    value-independent; tokens are meaningless. Every round commits at least one token, so at most ``rounds``
    rounds run (fewer only if drafts get accepted). ``decode_s`` covers the rounds only;
    the result also carries ``round_seconds``, the wall time of each round. ``target_attention`` and
    ``fused_layers`` as in :func:`fast_generate`; ``sampling`` (default greedy) times a sampled round.
    """
    rows = num_proposals(drafter) + 1
    sampling = sampling or Sampling()
    budget = rounds + 1
    taps = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
    session = _session(target, context_length + budget + rows, taps, engine)
    target_attention = resolve_target_attention(target_attention, session.device)
    fused = engine != "eager" and resolve_fused_layers(fused_layers, target_attention, session.runner, engine)
    out = Tracker(set(), StopStrings(None, None), None)
    out.first(first_token)
    out.commit_times = []
    dcache = static_drafter = None
    if drafter is not None:
        drafter.bind_target(target)
        dcache, static_drafter = session.drafter_slot(
            drafter, context_length + budget,
            fused=resolve_fused_drafter(fused, fused_layers, target_attention, session.runner, engine))
        for layer in dcache.layers:
            layer.length = context_length
    last = torch.tensor([first_token], device=session.device)
    slots = rows - 1
    choice = TokenChoice(sampling, generator, session.runner.lm_head.weight.shape[0], session.device, last, set(),
                         slots, buffers=session.choice_buffers(slots))
    start = clock(session.device)
    with _cmr_probe(session, drafter, dcache, static_drafter) as probe:
        if engine == "eager" or probe is not None:
            taps = session.buffers(rows)[1] if drafter is not None else None
            eager_rounds(_StaticRunner(session.runner, taps), drafter, dcache, budget, out, last, context_length,
                         None, choice)
        else:
            _static_rounds(session, drafter, dcache, static_drafter, last, context_length, budget, out, choice,
                           target_attention, fused)
    end = clock(session.device)
    sequences = torch.tensor([out.tokens], device=session.device)
    result = GenerationResult(sequences=sequences, acceptance_lengths=out.acceptance, decode_s=end - start,
                              num_prompt_tokens=0, mode=drafter.fold_config.mode if drafter is not None else "ar")
    result.round_seconds = [b - a for a, b in zip([start] + out.commit_times[:-1], out.commit_times)]
    return result


def drafter_cache_of(target) -> FoldCache | None:
    """The drafter cache the fast loop keeps on ``target`` (for memory accounting), or None."""
    session = target.__dict__.get(_SESSION_ATTR)
    return None if session is None else session.drafter_cache


__all__ = ["ENGINES", "SUPPORTED_ARCHITECTURES", "drafter_cache_of", "fast_generate", "fast_unsupported",
           "release_fast_state", "time_rounds"]
