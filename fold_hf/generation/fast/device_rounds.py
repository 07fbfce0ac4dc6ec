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


class Launched:
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


def static_rounds(session: Session, drafter, dcache, static_drafter, last, position: int, budget: int,
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

    # which of the state slots 0 .. _GEN a round keeps (times 1) or overwrites (times 0) before adding its step: the
    # session's buffers (a captured step outlives this call: it may only read buffers the session keeps)
    keep_slots, zero_slot = session.keep_slots, session.zero_slot
    if keep_slots.numel() != _GEN + 1:
        raise AssertionError("the session's keep_slots must cover the state slots 0 .. _GEN")

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
            # the next state is state * keep + step (three launches, not the nine of one op per slot):
            # T += n + 1, D += D_NEW, D_NEW = n + 1, LAST = final, LIMIT kept, GEN += n + 1, the rest kept
            n1 = n + 1
            step = torch.cat((n1, state[_D_NEW : _D_NEW + 1], n1, final, zero_slot, n1))
            outputs = (step, torch.cat((n, final, kept, proposals)))
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
            head = state[: _GEN + 1]
            torch.addcmul(outputs[0], head, keep_slots, out=head)
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

    def launch(k: int, drafts: bool, with_far: bool, bucket: int, d_context: int) -> Launched:
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
        return Launched(result, k, host_buffers[host_slot[0]])

    def process(launched: Launched) -> None:
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
        elif not pipelined or (out.round_limit is not None and len(out.acceptance) + 1 >= out.round_limit):
            step = None  # (a benchmark's last round: nothing is queued past it)
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
    layer = last_full_attention_layer(runner.model)
    static_drafter.attach_target_attention(runner.keep_queries(layer, rows), *runner.kept_query_keys(layer))
    return True

