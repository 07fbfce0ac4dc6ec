"""The one decode loop: prefill, then rounds of propose → verify → accept → commit, over any target runner.

Both entry points run it: :func:`fold_hf.generate` over the target's own ``forward`` (a ``DynamicCache``, any
causal LM), :func:`fold_hf.generation.fast.fast_generate` over its preallocated :class:`StaticTarget` (the
``eager`` engine here; its ``static``/``graphs`` engines run the same round with device-side lengths). Token
choice (greedy or speculative sampling, the logits processing) is :class:`~.sampling.TokenChoice`, stopping and
statistics :class:`~.tracker.Tracker`; this module only sequences them.

A *runner* has

* ``prefill(input_ids [1, P], chunk, on_taps) -> (logits [V], pending)``: fill the target's cache with the
  prompt; ``pending`` is the prompt's tapped features ``[1, P, n_taps * H]`` when the drafter still has to
  commit them (None when ``on_taps`` already did);
* ``verify(ids [1, k + 1], position) -> (logits [k + 1, V], features [1, k + 1, n_taps * H] or None)``: run the
  last committed token and ``k`` proposals at ``position ..``; the cache keeps what it holds below ``position``
  (rollback is rewinding to the committed length).

A *drafter* (family-free) has ``block_size``, optionally ``num_proposals`` (proposal slots per round, default
``block_size - 1``; a DeepSpec drafter's anchor slot predicts too: ``block_size``) and either ``propose(last [1],
pending, cache, block_start, count, pick) -> (proposals [<= count], q or None)`` (fewer when a DeepSpec confidence
threshold cuts the block) or ``draft_logits(last, pending, cache, block_start) -> [1, >= count, V]``;
``pick(logits [n, V], first_slot=0)`` turns logits into tokens and the distributions ``q`` they were drawn from,
so a drafter that proposes step by step calls it once per slot and a block-parallel one once.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import torch

from .stats import GenerationResult
from .tracker import Tracker, clock


@dataclass
class RoundPhases:
    """Where the eager rounds' time went (seconds, summed over ``rounds``): the drafter's proposals, the target's
    verify forward, and the whole rounds (token choice, commits and Python are the rest)."""

    rounds: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    round_s: float = 0.0
    # batched rounds (fast/batched.py): the same sums per number of running rows A, {A: [rounds, draft_s, verify_s,
    # round_s]}, so a round of 8 rows and one of a last row left alone can be told apart
    by_rows: dict = field(default_factory=dict)

    @property
    def other_s(self) -> float:
        return self.round_s - self.draft_s - self.verify_s

    def add(self, draft_s: float, verify_s: float, round_s: float, rows: int | None = None) -> None:
        """One round's parts (seconds); ``rows``: the running rows of a batched round."""
        self.rounds += 1
        self.draft_s += draft_s
        self.verify_s += verify_s
        self.round_s += round_s
        if rows is not None:
            sums = self.by_rows.setdefault(int(rows), [0, 0.0, 0.0, 0.0])
            sums[0] += 1
            sums[1] += draft_s
            sums[2] += verify_s
            sums[3] += round_s

    def per_round_ms(self) -> dict:
        n = max(self.rounds, 1)
        return {"round": self.round_s / n * 1e3, "draft": self.draft_s / n * 1e3,
                "verify": self.verify_s / n * 1e3, "other": self.other_s / n * 1e3}

    def per_rows_ms(self) -> dict:
        """``{A: {"rounds", "round", "draft", "verify", "other"}}``: the batched rounds by running rows, ms a round."""
        out = {}
        for rows, (n, draft, verify, whole) in sorted(self.by_rows.items()):
            out[rows] = {"rounds": n, "round": whole / n * 1e3, "draft": draft / n * 1e3,
                         "verify": verify / n * 1e3, "other": (whole - draft - verify) / n * 1e3}
        return out


_PHASES: contextvars.ContextVar = contextvars.ContextVar("fold_hf_round_phases", default=None)


@contextlib.contextmanager
def round_phases():
    """Times the parts of every host-length round (:func:`eager_rounds`) run inside; yields a :class:`RoundPhases`.
    Each part ends with a device synchronisation (CUDA), so use it to measure, not in a timed benchmark's loop."""
    phases = RoundPhases()
    token = _PHASES.set(phases)
    try:
        yield phases
    finally:
        _PHASES.reset(token)


def round_phases_in_effect() -> RoundPhases | None:
    """The :class:`RoundPhases` of an enclosing :func:`round_phases` block, or None (the rounds are not timed)."""
    return _PHASES.get()


def num_proposals(drafter) -> int:
    """Proposal slots per round: ``drafter.num_proposals`` when a family sets it, else ``block_size - 1`` (0 for
    AR)."""
    if drafter is None:
        return 0
    count = getattr(drafter, "num_proposals", None)
    return int(count) if count is not None else drafter.block_size - 1


def propose(drafter, last: torch.Tensor, pending, cache, position: int, count: int, pick):
    """``count`` proposals (and their ``q`` when sampling) for the block after ``last`` at ``position``."""
    own = getattr(drafter, "propose", None)
    if own is not None:
        return own(last, pending, cache, block_start=position, count=count, pick=pick)
    logits = drafter.draft_logits(last, pending, cache, block_start=position)[0, :count]
    return pick(logits)


def eager_rounds(runner, drafter, cache, budget: int, out: Tracker, last: torch.Tensor, position: int, pending,
                 choice) -> None:
    """Host-length rounds until ``out`` stops or holds ``budget`` tokens.

    Args:
        last: ``[1]`` the last committed token (not yet in the target's cache), at ``position``.
        pending: tapped features the drafter has not committed yet.
    """
    slots = num_proposals(drafter)
    phases = round_phases_in_effect()
    while out.running(budget):
        if phases is not None:
            started = clock(last.device)
        k = min(slots, budget - len(out.tokens) - 1)
        generated = len(out.tokens)
        choice.refill()
        q = None
        if k > 0:
            proposals, q = propose(drafter, last, pending, cache, position, k, choice.picker())
            pending = None  # committed to the drafter's cache by the draft
            proposals = proposals.to(last.device)  # maybe fewer than k (a DeepSpec confidence threshold)
        else:
            proposals = last.new_empty(0)
        if phases is not None:
            drafted = clock(last.device)
        out.proposals.append(proposals.tolist())
        logits, features = runner.verify(torch.cat((last, proposals))[None], position)
        if phases is not None:
            verified = clock(logits.device)
        commit, pending = accept(choice, logits, proposals, q, generated, features, pending)
        position += commit.shape[0]
        out.commit(commit.tolist())
        last = commit[-1:].to(last.device)
        if phases is not None:
            phases.add(drafted - started, verified - drafted, clock(last.device) - started)


def accept(choice, logits: torch.Tensor, proposals: torch.Tensor, q, generated: int, features, pending):
    """One round's acceptance: ``choice`` verifies the ``k`` ``proposals`` (drawn from ``q [k, V]`` when sampling) on
    the target's ``logits [k + 1, V]``; the accepted rows of the verify's tapped ``features [1, k + 1, T]`` (or None)
    join ``pending``, the features the drafter has not committed. Returns (the committed tokens ``[n + 1]``: the
    accepted proposals and the round's own token, on the logits' device; the new ``pending``)."""
    # a target split across devices gives its logits on the lm_head's device
    there = proposals.to(logits.device)
    n, final = choice.verify(logits, there, q.to(logits.device) if q is not None else None, proposals.shape[0],
                             generated)
    n = int(n)
    commit = torch.cat((there[:n], final.to(there.dtype)))
    pending = join_pending(pending, features, n)
    choice.observe(commit)
    return commit, pending


def join_pending(pending, features, n: int):
    """``pending`` (the tapped features the drafter has not committed, ``[1, m, T]`` or None) with the accepted rows
    ``features[:, : n + 1]`` of a verify's taps ``[1, k + 1, T]`` appended, copied (a runner's buffer is rewritten by
    the next verify); ``pending`` itself when ``features`` is None."""
    if features is None:
        return pending
    accepted = features[:, : n + 1].clone()
    return accepted if pending is None else torch.cat((pending, accepted), 1)


def result_of(out: Tracker, prompt: torch.Tensor, drafter, ttft_s: float, decode_s: float) -> GenerationResult:
    """The :class:`GenerationResult` of one prompt ``[1, P]`` whose tokens and statistics ``out`` holds."""
    sequences = torch.cat((prompt, torch.tensor([out.tokens], dtype=prompt.dtype, device=prompt.device)), dim=1)
    return GenerationResult(
        sequences=sequences,
        acceptance_lengths=out.acceptance,
        ttft_s=ttft_s,
        decode_s=decode_s,
        num_prompt_tokens=prompt.shape[1],
        mode=drafter.fold_config.mode if drafter is not None and hasattr(drafter, "fold_config") else "ar",
        finish_reason=out.finish,
        proposals=out.proposals,
    )


def decode(runner, drafter, input_ids: torch.Tensor, out: Tracker, make_choice, rounds, prefill_chunk: int | None,
           on_taps=None, device=None) -> GenerationResult:
    """Prefill, the first token, then ``rounds(last, position, pending, choice)``; returns the
    :class:`GenerationResult`. ``make_choice(logits [V])`` builds the request's :class:`~.sampling.TokenChoice`
    once the vocabulary and the logits' device are known."""
    device = device or input_ids.device
    prompt_len = input_ids.shape[1]
    if out.streamer is not None:
        out.streamer.put(input_ids.cpu())
    start = clock(device)
    logits, pending = runner.prefill(input_ids, prefill_chunk, on_taps)
    choice = make_choice(logits)
    last = choice.first(logits).to(input_ids.device)
    first_token_at = clock(device)
    out.first(int(last))
    rounds(last, prompt_len, pending, choice)
    end = clock(device)
    if out.streamer is not None:
        out.streamer.end()
    return result_of(out, input_ids, drafter, first_token_at - start, end - first_token_at)
