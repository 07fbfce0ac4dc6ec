"""Device-length rounds (engines ``static`` and ``graphs``): every length lives in the session's state tensor, a
round (the drafter's static step, the verify, the acceptance and the state update) is one step with fixed shapes
(one CUDA graph in ``graphs``), and the next round is queued before the previous one's result is read whenever
its step does not depend on that result."""

from __future__ import annotations

import torch

from ...modeling.retrieval import last_full_attention_layer
from ...targets.base import StaticTarget, bucket_length
from ..rounds import num_proposals, propose
from ..sampling import TokenChoice
from ..static_drafter import CUT_SLOT
from ..tracker import Tracker
from .session import Session
from .settings import pipelined_rounds_enabled


# state vector slots (long, on device): target length, drafter length, drafter rows to commit, last token, proposals
# that may be accepted this round, tokens generated so far
_T_LEN, _D_LEN, _D_NEW, _LAST, _LIMIT, _GEN = range(6)


class HostCopy:
    """A device result on its way to the host: copied (asynchronously) into a host buffer, pinned on CUDA, queued
    behind the work that produced it and nothing after it, and the event that says the copy is done."""

    __slots__ = ("values", "event")

    def __init__(self, result: torch.Tensor, host: torch.Tensor) -> None:
        self.values = host
        if result.device.type == "cuda":
            host.copy_(result, non_blocking=True)  # pinned: the copy is queued after the result's producer
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            host.copy_(result)
            self.event = None

    def read(self) -> list:
        """The result as (nested) lists, waiting for its copy only."""
        if self.event is not None:
            self.event.synchronize()
        return self.values.tolist()


class Launched(HostCopy):
    """A round queued on the device: its result's :class:`HostCopy` and the host facts it was launched with (``k``:
    proposals that may be accepted)."""

    __slots__ = ("k",)

    def __init__(self, result: torch.Tensor, k: int, host: torch.Tensor) -> None:
        super().__init__(result, host)
        self.k = k


class RoundStep:
    """One round on the device, fixed shapes, no host read (one CUDA graph in the ``graphs`` engine): the drafter's
    static step (when ``drafts``), the verify, the acceptance and the state update, run top to bottom by
    :meth:`__call__`.

    The session keeps a step per key and replays it in later requests, so a step holds only what the session keeps
    (its buffers, the runner, the static drafter, the token choice), never a request's host state. Buffers
    (``R`` = proposals + 1 rows, ``K = R - 1``): ``ids [1, R]`` (the last token then the proposals), ``taps [1, R,
    n_taps * H]`` (the verify's tapped features, committed by the next round's draft), the state vector (slots
    ``_T_LEN .. _GEN`` and :data:`CUT_SLOT`), ``q [K, V]`` (the draft distributions when sampling).
    """

    def __init__(self, session: Session, static_drafter, choice: TokenChoice, rows: int, with_taps: bool,
                 drafts: bool, with_far: bool, phase, bucket: int, target_attention: str, fused: bool) -> None:
        self.runner, self.state = session.runner, session.state
        self.ids, self.taps, self.offsets = session.buffers(rows)
        self.keep_slots, self.zero_slot = session.keep_slots, session.zero_slot
        self.static_drafter, self.choice = static_drafter, choice
        self.taps_out = self.taps if with_taps else None
        self.pick = choice.picker() if drafts else None
        self.drafts, self.with_far, self.phase, self.bucket = drafts, with_far, phase, bucket
        self.target_attention, self.fused = target_attention, fused

    def __call__(self) -> torch.Tensor:
        """Run the round; returns its result ``[3 + K]`` long: accepted n, the final token, the proposals the drafter
        kept, the proposals."""
        if self.drafts:
            self.draft()
        outputs = self.verify()
        self.update_state(outputs)
        return outputs[1]

    def draft(self) -> None:
        """The drafter's static step: commits the last verify's ``taps`` rows and writes its proposals ``[K]`` to
        ``ids[0, 1:]`` (and their distributions to ``q [K, V]`` when sampling)."""
        proposals, q = self.static_drafter.draft(self.taps, self.state, self.with_far, pick=self.pick,
                                                 phase=self.phase)
        self.ids[0, 1:] = proposals
        if q is not None:
            self.choice.q.copy_(q)

    def verify(self) -> tuple[torch.Tensor, ...]:
        """The target's verify of ``ids [1, R]`` at positions ``T .. T + R - 1`` (its taps into ``taps``) and the
        acceptance. Returns (the state step ``[_GEN + 1]``, the round's result ``[3 + K]``, and with a repetition
        penalty the tokens seen after it ``[V]``)."""
        state, ids, choice = self.state, self.ids, self.choice
        sampling = choice.sampling
        ids[:, :1] = state[_LAST : _LAST + 1].view(1, 1)
        positions = state[_T_LEN : _T_LEN + 1] + self.offsets
        logits = self.runner.forward_static(ids, positions, self.bucket, taps_out=self.taps_out,
                                            attention=self.target_attention, fused=self.fused)
        proposals = ids[0, 1:]
        kept = state[CUT_SLOT : CUT_SLOT + 1]  # proposals the drafter kept (all, unless a confidence cut)
        n, final = choice.verify(logits, proposals, choice.q if sampling.do_sample else None,
                                 torch.minimum(state[_LIMIT : _LIMIT + 1], kept), state[_GEN : _GEN + 1])
        self.runner.accept(n)  # recurrent-state families keep the accepted position's state (device-side)
        # T += n + 1, D += D_NEW, D_NEW = n + 1, LAST = final, LIMIT kept, GEN += n + 1 (update_state adds it)
        n1 = n + 1
        step = torch.cat((n1, state[_D_NEW : _D_NEW + 1], n1, final, self.zero_slot, n1))
        outputs = (step, torch.cat((n, final, kept, proposals)))
        if sampling.penalized:
            outputs += (choice.observed(proposals, n, final),)
        return outputs

    def update_state(self, outputs: tuple[torch.Tensor, ...]) -> None:
        """``state[:_GEN + 1] = state * keep_slots + step`` (three launches, not the nine of one op per slot), and the
        tokens seen under a repetition penalty."""
        head = self.state[: _GEN + 1]
        torch.addcmul(outputs[0], head, self.keep_slots, out=head)
        if self.choice.sampling.penalized:
            self.choice.seen.copy_(outputs[2])


class Plan:
    """The host inputs of a round: ``k`` proposals that may be accepted, whether it ``drafts`` and reads far memory
    (``with_far``), the target's attention ``bucket``, and ``d_context``: entries the drafter's cache holds once it
    commits the last verify's rows."""

    __slots__ = ("k", "drafts", "with_far", "bucket", "d_context")

    def __init__(self, k: int, drafts: bool, with_far: bool, bucket: int, d_context: int) -> None:
        self.k, self.drafts, self.with_far, self.bucket, self.d_context = k, drafts, with_far, bucket, d_context


class Rounds:
    """The host side of one request's device-length rounds: what the host knows (``position``, the drafter's
    committed length, the rows the next draft commits, a host drafter's pending taps) and its three moves,
    :meth:`plan` a round, :meth:`launch` it (queue its :class:`RoundStep`), :meth:`process` its result."""

    def __init__(self, session: Session, drafter, dcache, static_drafter, last, position: int, budget: int,
                 out: Tracker, choice: TokenChoice, target_attention: str, fused: bool) -> None:
        self.session, self.runner, self.drafter, self.dcache = session, session.runner, drafter, dcache
        self.static_drafter, self.out, self.choice, self.budget = static_drafter, out, choice, budget
        self.target_attention, self.fused = target_attention, fused
        self.slots = num_proposals(drafter)
        self.rows = self.slots + 1
        self.ids, self.taps, _ = session.buffers(self.rows)
        self.with_taps = drafter is not None
        self.state = state = session.state
        self.position = position
        self.drafter_length = dcache.get_seq_length() if dcache is not None else 0
        state.zero_()
        state[_T_LEN] = position
        state[_D_LEN] = self.drafter_length
        state[_LAST : _LAST + 1] = last
        state[_LIMIT] = self.slots
        state[_GEN] = len(out.tokens)
        state[CUT_SLOT] = self.slots  # a DeepSpec confidence threshold may lower it each round (the draft writes it)
        self.limit = self.slots  # host copy of state[_LIMIT]
        self.new_rows = 0  # host copy of state[_D_NEW]
        self.pending = None  # a host drafter's taps of the tokens committed since its last proposal
        self.host_drafting = drafter is not None and static_drafter is None
        self.pipelined = pipelined_rounds_enabled() and not self.host_drafting
        self.choice_key = (choice.sampling, choice.masks_eos)  # a round's processing is baked into its steps
        self.keeps_queries = _start_retrieval(self.runner, static_drafter, self.drafter_length, self.rows)
        # a round step reads what it overwrites: the state (updated at its end), the verify's tapped features (the
        # next round's draft commits them), cmr's kept target queries (its refreshes read the last verify's), the
        # tokens seen (repetition penalty) and infllm/cmr's selection state; the graph engine's warm-up restores them
        self.preserve = ([state] + ([self.taps] if self.with_taps else [])
                         + ([choice.seen] if choice.sampling.penalized else []))
        if self.keeps_queries:
            self.preserve.append(self.runner.query_keep[1])
        if static_drafter is not None:
            self.preserve += static_drafter.step_state()
        # which of the state slots 0 .. _GEN a round keeps (times 1) or overwrites (times 0) before adding its step:
        # the session's buffers (a captured step outlives this request: it may only read buffers the session keeps)
        if session.keep_slots.numel() != _GEN + 1:
            raise AssertionError("the session's keep_slots must cover the state slots 0 .. _GEN")
        self.host_buffers, self.host_slot = session.host_results(3 + self.slots), 0

    def plan(self, position: int, d_context: int, generated: int, spread: int) -> Plan | None:
        """The next round when the round in flight may accept 0 .. ``spread`` proposals (0: nothing in flight, exact)
        and every outcome gives the same; None when they differ or the budget may end (then the in-flight round is
        read first). ``position``, ``d_context`` and ``generated`` count the in-flight round's one sure token."""
        slots, runner, static_drafter = self.slots, self.runner, self.static_drafter
        lo_tokens, hi_tokens = generated, generated + spread
        if hi_tokens >= self.budget:  # (never with nothing in flight: the loop runs while tokens < budget)
            return None
        k = min(slots, self.budget - lo_tokens - 1)
        if min(slots, self.budget - hi_tokens - 1) != k:
            return None
        bucket = bucket_length(position + self.rows, runner.capacity)
        if bucket_length(min(position + spread + self.rows, runner.capacity), runner.capacity) != bucket:
            return None
        drafts = static_drafter is not None and k > 0
        with_far = drafts and static_drafter.needs_far(d_context)
        if drafts and static_drafter.needs_far(d_context + spread) != with_far:
            return None
        if drafts and spread and not static_drafter.same_phase(d_context, d_context + spread):
            return None  # infllm: whether blocks form this round depends on the round in flight
        return Plan(k, drafts, with_far, bucket, d_context)

    def launch(self, plan: Plan) -> Launched:
        """Queue the round ``plan`` describes (a host drafter proposes first, on the host) and its result's copy."""
        state, choice, session = self.state, self.choice, self.session
        if plan.k != self.limit:
            state[_LIMIT : _LIMIT + 1].fill_(plan.k)
            self.limit = plan.k
        choice.refill()
        if self.host_drafting and plan.k > 0:
            proposals, q = propose(self.drafter, state[_LAST : _LAST + 1], self.pending, self.dcache, self.position,
                                   self.slots, choice.picker())
            self.ids[0, 1 : 1 + proposals.shape[0]] = proposals
            state[CUT_SLOT] = proposals.shape[0]  # fewer when a confidence threshold cut the proposal
            if q is not None:
                choice.q[: q.shape[0]].copy_(q)
            self.pending = None
        # cmr: initial / refresh / grow (a host round count, whatever the rounds accept); infllm: form / steady (from
        # the context length, which plan() saw the same for every outcome of the round in flight); each its own step
        phase = self.static_drafter.next_phase(plan.d_context) if plan.drafts else None
        key = ("round", session.draft_tag if plan.drafts else None, plan.drafts, plan.with_far, phase, self.rows,
               plan.bucket, self.with_taps, self.target_attention, self.fused, self.keeps_queries) + self.choice_key
        step = RoundStep(session, self.static_drafter, choice, self.rows, self.with_taps, plan.drafts, plan.with_far,
                         phase, plan.bucket, self.target_attention, self.fused)
        result = session.step(key, step, preserve=self.preserve).replay()
        self.host_slot ^= 1  # the other buffer: the round in flight (if any) still owns this one's twin
        return Launched(result, plan.k, self.host_buffers[self.host_slot])

    def process(self, launched: Launched) -> None:
        """Read a round's result (its one device-to-host read) and commit its tokens on the host."""
        values = launched.read()
        n, final, kept, proposals = values[0], values[1], values[2], values[3:]
        self.out.proposals.append(proposals[: min(launched.k, kept)] if self.drafter is not None else [])
        if self.host_drafting:
            accepted = self.taps[:, : n + 1].clone()
            self.pending = accepted if self.pending is None else torch.cat((self.pending, accepted), 1)
        self.drafter_length += self.new_rows
        self.new_rows = n + 1
        self.position += n + 1
        self.out.commit(proposals[:n] + [final])

    def finish(self) -> None:
        """After the last round: the drafter cache's host length made truthful, the verify's kept queries let go."""
        if self.static_drafter is not None:
            for layer in self.dcache.layers:  # for bytes_used() and later reads
                layer.length = self.drafter_length
        if self.keeps_queries:
            self.runner.keep_queries(None)


def static_rounds(session: Session, drafter, dcache, static_drafter, last, position: int, budget: int,
                  out: Tracker, choice: TokenChoice, target_attention: str = "bucket", fused: bool = False) -> None:
    """Device-length rounds (engines ``static`` and ``graphs``); one host read per round.

    A round is one step (:class:`RoundStep`; one CUDA graph in the ``graphs`` engine): the drafter's static step, the
    verify, the acceptance and the state update. Its host inputs (:class:`Plan`) are the attention bucket, whether
    the drafter reads far memory and the proposals the budget allows; when those follow from what the host already
    knows whatever the round in flight accepts (nearly always), the next round is queued before that round's result
    is read, so the host's work overlaps the device's (``$FOLD_HF_PIPELINE_ROUNDS=0`` turns this off). When they do
    not (a bucket or the far-memory threshold may be crossed, the budget may end), or when the drafter drafts on the
    host, the loop reads the round first: every round runs the step the one-round-at-a-time loop would run, so the
    tokens are the same. A round queued past an EOS or stop string is dropped (its cache writes lie past the
    committed length)."""
    rounds = Rounds(session, drafter, dcache, static_drafter, last, position, budget, out, choice, target_attention,
                    fused)
    in_flight = None
    while True:
        if in_flight is None:
            if not out.running(budget):
                break
            plan = rounds.plan(rounds.position, rounds.drafter_length + rounds.new_rows, len(out.tokens), 0)
        elif not rounds.pipelined or (out.round_limit is not None and len(out.acceptance) + 1 >= out.round_limit):
            plan = None  # (a benchmark's last round: nothing is queued past it)
        else:  # the round in flight commits 1 .. k + 1 tokens
            plan = rounds.plan(rounds.position + 1, rounds.drafter_length + rounds.new_rows + 1, len(out.tokens) + 1,
                               in_flight.k)
        if plan is None:
            rounds.process(in_flight)
            in_flight = None
            continue
        launched = rounds.launch(plan)
        if in_flight is not None:
            rounds.process(in_flight)  # while the device runs the round just queued
            if not out.running(budget):
                break  # an EOS or stop string: the queued round is dropped
        in_flight = launched
    rounds.finish()


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
    layer = last_full_attention_layer(runner.model)
    static_drafter.attach_target_attention(runner.keep_queries(layer, rows), *runner.kept_query_keys(layer))
    return True

