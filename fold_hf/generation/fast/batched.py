"""Batched rounds (issue 35): the rows of a batch decoded together, one target forward per round for every row that
is still running.

Each row keeps its own everything but the target's forward: its cache row in one ``[B, Hkv, capacity, D]`` cache
(:class:`~fold_hf.targets.base.StaticTarget` with ``batch=B``), its own length and position (no realignment, no
padding in the cache: a row's prompt is prefilled without its left padding), its drafter cache
(:class:`~fold_hf.modeling.cache.FoldCache`, so the FOLD read's window boundary is the row's own), its
:class:`~fold_hf.generation.sampling.TokenChoice` (its generator when the request gives one per row) and its
:class:`~fold_hf.generation.tracker.Tracker` (EOS, stop strings, budget). A round:

1. every running row drafts its block from its own cache, all rows in one drafter forward: on engines ``static`` and
   ``graphs`` one fixed-shape step (:class:`_DraftRows`, a CUDA graph in ``graphs``, keyed by the number of
   running rows and whether some row reads far memory: :class:`~fold_hf.generation.static_drafter_rows.RowsDrafter`,
   the single-prompt static drafter with a row axis: block embedding, ``fc`` over each row's new taps (``R`` rows
   per row, masked by its length), every projection and the lm_head shared over ``[A, B]``; each row's cache row of
   one ``[batch, Hkv, capacity, Dh]`` drafter cache, its length read from the device, its own FOLD read; greedy
   proposals by argmax on the device); on the ``eager`` engine, for sampled or penalized rows and for the modes and
   drafters the step does not cover (``streaming``, ``infllm``, ``yarn``, a DeepSpec confidence cut; said once), on
   the host (:func:`~fold_hf.modeling.drafter_rows.propose_rows`: the projections and the lm_head shared, each row's
   eager read its own, planned from host lengths);
2. one verify forward (:class:`_Verify`) checks all of them: ``[A, 1 + k]`` tokens, a row with fewer proposals
   padded (its padded positions are past what it can keep, so they are rolled back by its length like any rejected
   entry); the projections read the weights once for the ``A`` rows, each row attends to its own prefix;
3. each row accepts, commits and stops on its own; a row that stopped leaves the batch (it costs nothing after).

The running rows are always cache rows ``0 .. A-1`` (:func:`_compact`, before each round): when a row stops, the
running row in the highest cache row moves into the cache row it freed (its target state,
:meth:`~fold_hf.targets.base.StaticTarget.move_row`: every per-row buffer of the family, KV, Gemma's rings,
Qwen3.5's convolution and recurrent states; on the rows step, its drafter entries and its drafter cache's view),
a one-row copy per row that stopped, on every engine. So the fixed-shape steps are keyed by how many rows run, never
by which: the verify by ``("rows", A, W, bucket, taps)`` (``A`` running rows, block width, attention bucket, taps
or not), the drafts by ``("draft_rows", A, with_far)``. The fixed-shape verify always takes a full block (``W`` =
proposals + 1, a row with fewer proposals padded with its last token), so ``W`` is one per call. A step is built the
first time the session meets its key, and later rounds and calls of the session replay it. On the ``graphs`` engine
``A`` is a row bucket (1, 2, 4, 8, 16, at most the batch: :func:`row_bucket`): the steps then also run ``bucket - A``
*parked* rows, cache rows that rows which stopped or moved left behind, each at the length it was left at
(:class:`_Parked`; their outputs are dropped, their writes land past what their cache row holds), so a batch whose rows
stop one by one replays one graph per bucket instead of capturing one per count of running rows mid-call. A round's
drafts on the rows step cover every running row (a row whose budget takes no proposal keeps none).

Greedy rows equal the row decoded alone (the same rule on the same logits, the attention of each row exactly its own);
sampled rows keep the target's distribution exactly (per-row speculative sampling), and with one generator per row
they sample the same tokens as alone.

Exact mode (``exact=True``, docs/exact-mode.md; the Llama and Gemma families): the verify forward runs exact mode's
kernels, each row as its own verify step, so a batched row's tokens have the bits of that row decoded alone in exact
mode (bf16 included).

Where it runs (:func:`batched_unsupported`): a family whose runner holds rows (the Llama, Qwen3.5 and Gemma
families), every engine: the ``eager`` engine (a batch's default off CUDA) verifies host-length; ``static`` and
``graphs`` (the default on CUDA) verify through the fused layers as a fixed-shape step (a CUDA graph in ``graphs``,
:class:`_Verify`; the Llama and Gemma families) and draft through the rows step (every family), so a round is two
replays, the verify queued behind the drafts with no host read between (its ids: each row's last token, uploaded
through pinned memory, and the drafts where they lie; a row's drafts past its budget are verified, never accepted);
what stays on the host is each row's acceptance, the copy of its accepted taps and lengths into the rows step's
buffers, and the choice of the two steps' keys; the Qwen3.5 family has no fused layers over rows, so there
its verify runs host-length, said once. After each round the runner's
``accept`` takes every row's accepted count (a recurrent family keeps each row's state at its own accepted position;
a KV cache rolls back by the row's length). The other families and ``cmr`` (its refreshes read one row's target
attention) decode the rows one after another (:func:`fold_hf.generation.batch.decode_rows`), which says so once,
naming why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...modeling.drafter_rows import propose_rows
from ...targets.base import bucket_length
from ...targets.registry import batch_unsupported_reason
from ..batch import assemble, check_batch, unpadded_rows
from ..request import GenerationRequest, drafter_for_call, warn_past_context
from ..rounds import accept, join_pending, num_proposals, result_of, round_phases_in_effect
from ..sampling import TokenChoice
from ..static_drafter import commit_context, preallocated_cache
from ..static_drafter_rows import row_cache, view_row
from ..tracker import Tracker, clock
from .device_rounds import HostCopy
from .session import session_for
from .settings import resolve_fused_drafter, resolve_fused_layers, warn_once


def batched_unsupported(target, drafter, request: GenerationRequest) -> str | None:
    """Why a batch cannot run in batched rounds (None when it can); its rows are then decoded one after another."""
    reason = batch_unsupported_reason(target)
    if reason is not None:
        return reason
    if drafter is not None and (request.fold_config or drafter.fold_config).mode == "cmr":
        return "mode 'cmr' reads the target's attention of one row at a time"
    return None


def row_bucket(A: int, batch: int, pad: bool) -> int:
    """The rows a fixed-shape step runs for ``A`` running rows of a ``batch``-row call: ``A`` itself, or with
    ``pad`` (the ``graphs`` engine: :func:`pads_rows`) the next power of two, at most ``batch``."""
    return min(1 << (A - 1).bit_length(), batch) if pad else A


def pads_rows(engine: str) -> bool:
    """Whether the fixed-shape steps run a row bucket (:func:`row_bucket`): on the ``graphs`` engine, where a new count
    of rows is a graph captured (and kernels compiled) mid-call; the ``static`` engine runs each count as it comes."""
    return engine == "graphs"


@dataclass(frozen=True)
class _Parked:
    """A cache row no running row holds (its row stopped, or moved down by :func:`_compact`), as it was left: the
    target cache holds ``position`` entries, the drafter cache ``drafted``; ``last_id`` a token to feed it. A row
    bucket's extra rows run these (:func:`row_bucket`)."""

    position: int
    drafted: int
    last_id: int


@dataclass
class _Row:
    """One row's state between rounds."""

    index: int  # cache row (the running rows hold 0 .. A-1: _compact moves a row when another stops)
    prompt: torch.Tensor  # [1, P]
    out: Tracker
    choice: TokenChoice
    cache: object  # its FoldCache, or None (AR)
    last: torch.Tensor  # [1] the last committed token, not yet in the cache
    position: int  # where ``last`` goes
    last_id: int = 0  # ``last`` on the host
    drafted: int = 0  # entries of its drafter cache (the rows step: the committed ones, before ``pending``)
    pending: torch.Tensor | None = None  # tapped features the drafter has not committed
    first_token_at: float = 0.0
    end: float = 0.0
    left: bool = False  # stopped, its cache row parked (_compact)
    proposals: torch.Tensor | None = field(default=None, repr=False)  # this round's
    q: torch.Tensor | None = field(default=None, repr=False)

    def take(self, committed: list[int], last: torch.Tensor) -> None:
        """Commit a round's tokens ``committed`` (accepted proposals and the round's own token, ``last`` ``[1]`` on
        the device) to the row: its output, its position, its last token."""
        self.position += len(committed)
        self.out.commit(committed)
        self.last, self.last_id = last.to(self.last.device), committed[-1]


@torch.no_grad()
def decode_batched(target, drafter, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   request: GenerationRequest, budget: int, prefill_chunk: int | None, engine: str = "eager",
                   fused_layers: bool | None = None):
    """The rows of ``input_ids`` ``[B, L]`` (left padding marked by ``attention_mask``; validated, and
    :func:`batched_unsupported` None) in batched rounds, ``budget`` new tokens at most per row. ``engine``: how the
    verify forward runs (:class:`_Verify`); ``fused_layers`` as in :func:`~fold_hf.generation.fast.fast_generate`.

    Returns:
        what :func:`fold_hf.generation.batch.assemble` returns (``batched=True`` on a :class:`BatchGenerationResult`).
    """
    batch = input_ids.shape[0]
    pad = check_batch(target, request, batch)
    prompts = unpadded_rows(input_ids, attention_mask)
    longest = max(p.shape[1] for p in prompts)
    warn_past_context(target, longest, budget, stacklevel=5)
    with drafter_for_call(target, drafter, request.fold_config):
        slots = num_proposals(drafter)
        taps = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
        session = session_for(target, longest + budget + slots + 1, taps, engine, request.exact, batch=batch)
        runner, device = session.runner, session.device
        verify = _Verify(session, fused_layers, longest + budget + slots + 1)
        draft_rows = _draft_rows_step(session, drafter, request, verify.fused, fused_layers)
        whole = draft_rows.static.cache if draft_rows is not None else None
        taps_out = (torch.zeros(batch, slots + 1, runner.tap_width, device=device, dtype=runner.dtype)
                    if drafter is not None and runner.num_taps else None)
        sampling = request.sampling()
        started = clock(device)
        rows = []
        for i, prompt in enumerate(prompts):  # prefill row by row: no padding computed, each row's own length
            prompt = prompt.to(device)
            out = request.tracker(target)
            cache = None
            on_taps = None
            if drafter is not None:
                length = prompt.shape[1] + budget
                cache = (preallocated_cache(drafter, session.capacity, device, length) if whole is None
                         else row_cache(whole, drafter, i, length))  # the rows step's: a view of cache row i

                def on_taps(features, start, cache=cache):
                    commit_context(drafter, cache, features)

            logits = runner.prefill(prompt, chunk=prefill_chunk, on_taps=on_taps, row=i)
            choice = TokenChoice(sampling, request.row_generator(i), logits.shape[-1], device, prompt, out.eos, slots)
            last = choice.first(logits).to(device)
            out.first(int(last))
            row = _Row(i, prompt, out, choice, cache, last, prompt.shape[1], int(last),
                       cache.get_seq_length() if cache is not None else 0, first_token_at=clock(device))
            row.end = row.first_token_at
            rows.append(row)
        _rounds(verify, drafter, rows, budget, slots, taps_out, draft_rows)
        results = [result_of(row.out, row.prompt, drafter, row.first_token_at - started,  # the call's reading mode
                             row.end - row.first_token_at) for row in rows]
    return assemble(input_ids, results, request, pad, batched=True)


def _rounds(verify, drafter, rows: list[_Row], budget: int, slots: int, taps_out: torch.Tensor | None,
            draft_rows=None) -> None:
    """Rounds until every row has stopped (module docstring); the drafts by ``draft_rows`` (:class:`_DraftRows`)
    when given, else by :func:`~fold_hf.modeling.drafter_rows.propose_rows`. Inside
    :func:`~fold_hf.generation.rounds.round_phases` the drafts (all rows), the verify forward and the whole rounds are
    timed (each part ends with a device synchronisation)."""
    phases = round_phases_in_effect()
    parked: dict[int, _Parked] = {}  # cache rows no running row holds, as they were left
    pad = pads_rows(verify.session.engine)  # (a host-length verify takes no bucket: it runs the running rows)
    while True:
        active = _compact([row for row in rows if row.out.running(budget)], verify.runner, draft_rows, rows, parked)
        if not active:
            return
        # a fixed-shape step's extra rows of the bucket: cache rows A .. bucket - 1, every one parked
        extra = [parked[index] for index in range(len(active), row_bucket(len(active), len(rows), pad))]
        if phases is not None:
            started = clock(verify.device)
        drafting, counts = [], []
        for row in active:  # 1. drafts: every row that may still take proposals, in one drafter forward
            k = min(slots, budget - len(row.out.tokens) - 1)
            row.choice.refill()
            row.q, row.proposals = None, row.last.new_empty(0)
            if k > 0:
                drafting.append(row)
                counts.append(k)
        drafts = None  # the rows step's proposals [A, slots] (_Drafts), read on the host after the verify is queued
        if drafting and draft_rows is not None:  # the step drafts every running row (cache rows 0 .. A-1); a row
            # whose budget takes no proposal keeps none (it stops after this round's verify)
            drafts = draft_rows(active, extra)
            if not verify.fused:  # the host-length verify takes each row's own proposals: read them now
                _take_drafts(active, drafts, slots, budget)
                drafts = None
        else:
            if drafting:
                proposed = propose_rows(drafter, [row.last for row in drafting], [row.pending for row in drafting],
                                        [row.cache for row in drafting], [row.position for row in drafting], counts,
                                        [row.choice.picker() for row in drafting])
                for row, (proposals, q) in zip(drafting, proposed):
                    row.pending = None  # committed to the drafter's cache by the draft
                    row.proposals, row.q = proposals.to(row.last.device), q
            for row in active:
                row.out.proposals.append(row.proposals.tolist())
        # 2. one verify forward: each row's last token and proposals, padded with its last token to the longest, or
        # on the fixed-shape verify to a full block always (one step per row count: a width that shrinks as rows
        # near their budget would capture, and compile for, a new shape mid-call)
        width = 1 + (slots if verify.fused else max(row.proposals.shape[0] for row in active))
        if drafts is not None:  # the rows step's drafts as they lie on the device, after each row's last token: the
            # verify is queued behind the drafts with no read between (a row's drafts past its budget are verified
            # and never accepted: a causal row's logits up to its k-th proposal do not see them)
            tokens = drafts.tokens
            ids = torch.cat((upload([[row.last_id] for row in active], tokens.device), tokens[:, : width - 1]), 1)
        else:  # built on the host from each row's host proposals and last token: one copy, not a launch a row
            ids = torch.tensor([[row.last_id] + row.out.proposals[-1]
                                + [row.last_id] * (width - 1 - row.proposals.shape[0]) for row in active])
        features = taps_out[: len(active), :width] if taps_out is not None else None
        if phases is not None:
            drafted = clock(verify.device)
        logits = verify(ids, [row.index for row in active], [row.position for row in active], features, extra)
        if drafts is not None:  # read while the verify runs (the host copy was queued before it)
            _take_drafts(active, drafts, slots, budget)
        if phases is not None:
            verified = clock(verify.device)
        if _greedy_plain(active):  # 3. each row's acceptance: greedy, one argmax and one read for all rows
            accepted = _accept_greedy(active, logits, features)
        else:  # row by row (sampling, penalties, a min_new_tokens mask)
            accepted = []
            for a, row in enumerate(active):
                k = row.proposals.shape[0]
                commit, row.pending = accept(row.choice, logits[a, : k + 1], row.proposals, row.q,
                                             len(row.out.tokens), features[a : a + 1] if features is not None else None,
                                             row.pending)
                accepted.append(commit.shape[0] - 1)
                row.take(commit.tolist(), commit[-1:])
        verify.runner.accept(accepted)  # a recurrent family keeps each row's state at its accepted position
        now = clock(logits.device)
        for row in active:
            row.end = now
        if phases is not None:
            phases.add(drafted - started, verified - drafted, now - started, rows=len(active))


def _take_drafts(active: list[_Row], drafts: _Drafts, slots: int, budget: int) -> None:
    """Each running row's proposals from the rows step's ``drafts`` (``[A, slots]``, one host read for every row):
    the first ``k`` (what its budget takes) as its device proposals and in its tracker."""
    tokens, host = drafts.tokens, drafts.read()
    for a, row in enumerate(active):
        k = max(0, min(slots, budget - len(row.out.tokens) - 1))
        row.proposals = tokens[a, :k]
        row.out.proposals.append(host[a][:k])


def upload(rows: list, device: torch.device, dtype=torch.long) -> torch.Tensor:
    """``rows`` (nested lists) as a tensor on ``device``; to a GPU through pinned memory without waiting for the
    stream (a copy from pageable memory would first wait for every queued kernel)."""
    host = torch.tensor(rows, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _greedy_plain(active: list[_Row]) -> bool:
    """Whether every row picks by the plain argmax of its logits (greedy, no penalty, no min_new_tokens mask): then
    :func:`_accept_greedy` accepts all rows at once."""
    return all(not row.choice.sampling.do_sample and not row.choice.sampling.penalized and not row.choice.masks_eos
               for row in active)


def _accept_greedy(active: list[_Row], logits: torch.Tensor, features: torch.Tensor | None) -> list[int]:
    """Greedy acceptance of every row of a round from the verify's ``logits [A, W, V]``: one argmax over the ``A * W``
    rows (:func:`~fold_hf.kernels.greedy_select_ops`, the kernels the one-row verify uses) and one host read, then
    per row on the host: ``n`` = the leading proposals equal to the target's argmax (the row's host proposals,
    ``row.out.proposals[-1]``), the committed tokens (those and the argmax after them), the accepted rows of the
    tapped ``features [A, W, T]`` joined to the row's pending ones. The rule of
    :func:`~fold_hf.generation.rounds.accept` for a greedy choice, without a launch and a read per row. Returns each
    row's ``n``."""
    from ..sampling import greedy_ops

    A, W, V = logits.shape
    posterior = greedy_ops(logits.device).argmax_rows(logits.reshape(A * W, V)).view(A, W)
    host = posterior.tolist()
    accepted = []
    for a, row in enumerate(active):
        proposals = row.out.proposals[-1]
        n = 0
        while n < len(proposals) and proposals[n] == host[a][n]:
            n += 1
        row.pending = join_pending(row.pending, features[a : a + 1] if features is not None else None, n)
        row.take(proposals[:n] + [host[a][n]], posterior[a, n : n + 1])
        accepted.append(n)
    return accepted


def _compact(active: list[_Row], runner, draft_rows, rows: list[_Row], parked: dict[int, _Parked]) -> list[_Row]:
    """The running rows ``active`` in cache rows ``0 .. A-1``, in cache-row order: each running row in a cache row
    ``>= A`` moves into a cache row below ``A`` that a stopped row freed (its target state,
    :meth:`~fold_hf.targets.base.StaticTarget.move_row`; its drafter entries in the rows step's cache,
    :meth:`_DraftRows.move`); a one-row copy per row that stopped. So the fixed-shape steps are keyed by ``A``, not by
    which rows run (module docstring). ``parked`` (updated): the cache rows no running row holds, as their rows (of
    ``rows``, every row of the call) left them."""
    A = len(active)
    running = {id(row) for row in active}
    for row in rows:  # a row that stopped leaves its cache row as it was (once: a mover may take it later)
        if id(row) not in running and not row.left:
            parked[row.index], row.left = _Parked(row.position, row.drafted, row.last_id), True
    free = sorted(set(range(A)) - {row.index for row in active})
    movers = sorted((row for row in active if row.index >= A), key=lambda row: row.index)
    for dest, row in zip(free, movers):
        runner.move_row(row.index, dest, row.position)  # its cache holds the tokens before ``last``
        if draft_rows is not None:
            draft_rows.move(row, dest)
        parked[row.index] = _Parked(row.position, row.drafted, row.last_id)
        parked.pop(dest, None)
        row.index = dest
    return sorted(active, key=lambda row: row.index)


def _draft_rows_step(session, drafter, request: GenerationRequest, fused: bool, fused_layers: bool | None):
    """The rows drafting step of a batched call (:class:`_DraftRows`) on engines ``static`` and ``graphs``, or None:
    the eager engine, no drafter, or what the step does not take (sampled or penalized drafts, whose picks read each
    row's own generator and tokens seen; the modes and drafters :func:`~fold_hf.generation.static_drafter_rows.
    rows_drafter_unsupported` names), each said once."""
    if drafter is None or session.engine == "eager":
        return None
    sampling = request.sampling()
    if sampling.do_sample or sampling.penalized:
        warn_once(f"batched rounds on engine {session.engine!r} draft on the host (propose_rows): the rows drafting "
                  f"step drafts greedily, and a sampled or penalized row picks its drafts with its own generator and "
                  f"tokens seen")
        return None
    static = session.rows_drafter(drafter, resolve_fused_drafter(fused, fused_layers, "triton", session.runner,
                                                                 session.engine))
    return _DraftRows(session, static) if static is not None else None


class _DraftRows:
    """The drafts of the ``A`` running rows (cache rows ``0 .. A-1``, :func:`_compact`) as one fixed-shape step of
    the session (a CUDA graph in ``graphs``): :meth:`~fold_hf.generation.static_drafter_rows.RowsDrafter.draft_rows`,
    keyed ``("draft_rows", A, with_far)`` (the number of running rows and whether some row reads far memory),
    replayed from the session's buffers (each row's pending taps and lengths copied in)."""

    def __init__(self, session, static) -> None:
        self.session, self.static, self.width = session, static, static.verify_rows

    def move(self, row: _Row, dest: int) -> None:
        """Move ``row``'s committed drafter entries into cache row ``dest`` of the step's cache, its
        :class:`~fold_hf.modeling.cache.FoldCache` then viewing that row (:func:`_compact`)."""
        self.static.move_row(row.index, dest, row.drafted)
        view_row(row.cache, self.static.cache, dest)

    def __call__(self, rows: list[_Row], extra: list[_Parked] = ()) -> torch.Tensor:
        """Proposals ``[A, R - 1]`` (greedy) of ``rows`` (cache rows ``0 .. A-1`` in order), whose pending taps the
        step commits to their caches; ``extra``: the parked cache rows ``A ..`` of a row bucket (:func:`row_bucket`),
        drafted from as they were left (nothing committed) and their proposals dropped."""
        A = len(rows)
        if [row.index for row in rows] != list(range(A)):
            raise AssertionError(f"the rows step drafts cache rows 0 .. {A - 1}, got {[row.index for row in rows]}")
        features, lengths = self.session.draft_row_buffers(A + len(extra), self.width)
        host = []
        for a, row in enumerate(rows):
            new = 0 if row.pending is None else row.pending.shape[1]
            if new > self.width:
                raise AssertionError(f"row {row.index} has {new} pending taps, more than a round's {self.width}")
            if new:
                features[a, :new].copy_(row.pending[0])
            host.append([row.drafted, new, row.last_id, row.index])
        with_far = any(self.static.needs_far(drafted + new) for drafted, new, _, _ in host)  # the running rows'
        host += [[p.drafted, 0, p.last_id, A + i] for i, p in enumerate(extra)]
        lengths.copy_(upload(host, lengths.device))  # without waiting for the queued kernels (moves, accepts)
        static, cache_rows = self.static, tuple(range(len(host)))
        out = self.session.step(("draft_rows", len(host), with_far),
                                lambda: static.draft_rows(features, lengths, with_far, cache_rows)).replay()[:A]
        # the proposals leave the graph pool before the verify is queued: a verify step captured before this step
        # (an earlier call in another mode, or fewer rows) may have its temporaries where the step left them
        tokens, host_tokens = self.session.draft_outputs(A, out.shape[1])
        tokens.copy_(out)
        for row, (drafted, new, _, _) in zip(rows, host):
            row.drafted, row.pending = drafted + new, None  # committed by the step
            for layer in row.cache.layers:  # the host length truthful (bytes_used, later reads)
                layer.length = row.drafted
        return _Drafts(tokens, host_tokens)


class _Drafts(HostCopy):
    """A rows step's proposals ``[A, slots]``: on the device (``tokens``, a session buffer outside the graph pool, what
    the verify reads) and on their way to the host (a :class:`HostCopy` queued behind the step, not behind the verify
    queued next)."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: torch.Tensor, host: torch.Tensor) -> None:
        super().__init__(tokens, host)
        self.tokens = tokens


class _Verify:
    """The batched verify forward ``(ids [A, W], cache rows, starts, features [A, W, T] or None) -> logits [A, W, V]``.

    Engine ``eager``: :meth:`~fold_hf.targets.base.StaticTarget.forward_rows` (host lengths). Engines ``static`` and
    ``graphs``: :meth:`~fold_hf.targets.base.StaticTarget.forward_rows_static` (the family's fused layers: the GEMMs
    shared, each row's rope, cache write and decode attention its own launch at a context length read from the
    device) as a fixed-shape step of the session (a CUDA graph in ``graphs``) over cache rows ``0 .. A-1`` (the
    running rows, :func:`_compact`), keyed ``("rows", A, W, bucket, taps)``: the number of running rows, the block
    width, the attention bucket of the longest row and whether it taps, replayed from the session's buffers; when the
    fused layers cannot run the target or the family has none over rows (the runner's ``fused_rows_unsupported``: the
    Qwen3.5 family), the host-length forward, said once with the reason.
    """

    def __init__(self, session, fused_layers: bool | None, final: int | None = None) -> None:
        self.session, self.runner, self.device = session, session.runner, session.device
        self.final = final  # the most keys a row of the call can reach (its attention buckets: _bucket)
        self.fused = False
        if session.engine != "eager":
            self.fused = session.runner.exact or resolve_fused_layers(fused_layers, "triton", session.runner,
                                                                      session.engine)
            why = None if self.runner.exact else self.runner.fused_rows_unsupported()  # the family's, first
            if why is None and not self.fused:
                why = self.runner.fused_unsupported() or "off by default off CUDA; fused_layers=True runs their twins"
                why = f"the fused layers are off here ({why})"
            if why is not None:
                self.fused = False
                warn_once(f"batched rounds on engine {session.engine!r} verify host-length (engine 'eager'): {why}")

    def __call__(self, ids: torch.Tensor, rows: list[int], starts: list[int], features, extra: list[_Parked] = ()):
        """Logits ``[A, W, V]`` of the running rows' ``ids [A, W]`` (on the host or the device); ``extra`` (the
        fixed-shape verify): the parked cache rows ``A ..`` of a row bucket (:func:`row_bucket`), each fed its last
        token at its length (their writes land past what their cache rows hold, their logits and taps dropped)."""
        runner = self.runner
        if not self.fused:
            return runner.forward_rows(ids.to(self.device), rows, starts, features)
        runner.check_rows(ids, rows, starts)
        n = ids.shape[0]
        if extra:
            fed = upload([[p.last_id] for p in extra], ids.device)
            ids = torch.cat((ids, fed.expand(-1, ids.shape[1])))
            rows = list(rows) + list(range(n, n + len(extra)))
            starts = list(starts) + [p.position for p in extra]
        A, W = ids.shape
        if list(rows) != list(range(A)):
            raise AssertionError(f"the fixed-shape verify runs cache rows 0 .. {A - 1}, got {list(rows)}")
        ids_buf, positions, taps = self.session.row_buffers(A, W, features is not None)
        ids_buf.copy_(ids)  # the ids (from the host, or the drafts on the device) and the positions: one copy each
        positions.copy_(upload([[s + w for w in range(W)] for s in starts], positions.device))
        bucket = self._bucket(max(starts) + W)
        key = ("rows", A, W, bucket, taps is not None)
        cache_rows = list(range(A))
        logits = self.session.step(key, lambda: runner.forward_rows_static(ids_buf, positions, cache_rows, bucket,
                                                                          taps)).replay()
        runner.after_rows_step(range(n), W)  # a replay runs no Python: a recurrent family learns its rows here
        if features is not None:
            features.copy_(taps[:n])
        return logits[:n]

    def _bucket(self, needed: int) -> int:
        """The attention bucket of a verify whose longest row needs ``needed`` keys: the call's last bucket (that of
        :attr:`final` keys) once ``needed`` is within 1/8 of it, else the bucket of ``needed``
        (:func:`~fold_hf.targets.base.bucket_length`). So the rows of a long prompt cross no bucket boundary
        mid-call: a boundary crossed by the first row of one call and by none of another is a step captured inside
        a call (the H100 suite at 32,704 + 64 tokens built them), while a short prompt with many new tokens keeps
        buckets that grow with it (the decode kernel sizes its splits by the bucket)."""
        capacity = self.runner.capacity
        if self.final is not None:
            last = bucket_length(min(self.final, capacity), capacity)
            if needed <= last and 8 * needed > 7 * last:
                return last
        return bucket_length(needed, capacity)
