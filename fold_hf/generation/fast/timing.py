"""Benchmark entry: :func:`time_rounds` times decode rounds at a context length without a prefill."""

from __future__ import annotations

import torch

from ...modeling.drafter import FoldDrafter
from ..rounds import num_proposals
from ..sampling import Sampling, TokenChoice
from ..stats import GenerationResult
from ..tracker import StopStrings, Tracker, clock
from .engine import StaticRunner, run_rounds
from .session import session_for
from .settings import check_exact_settings, resolve_fused_drafter, resolve_fused_layers, resolve_target_attention


@torch.no_grad()
def time_rounds(target, drafter: FoldDrafter | None, context_length: int, rounds: int, engine: str = "graphs",
                first_token: int = 0, target_attention: str | None = None,
                fused_layers: bool | None = None, sampling: Sampling | None = None,
                generator: torch.Generator | None = None, exact: bool = False) -> GenerationResult:
    """Benchmark entry: decode ``rounds`` rounds as if a ``context_length``-token prompt had been prefilled.

    No prefill runs: the target and drafter caches simply hold ``context_length`` entries (whatever the buffers
    contain, zeros when fresh), so per-round cost at long contexts can be timed in seconds. Timing is
    value-independent; tokens are meaningless. Exactly ``rounds`` rounds run, under a token budget they cannot
    reach (``rounds`` full blocks), so every round after the first is queued before the previous one is read, as
    in a long request (a budget of ``rounds + 1`` tokens, as before, made the loop read every speculative round
    first: the budget might end within the proposals in flight). ``decode_s`` covers the rounds only (nothing is queued
    past the last); the result also carries ``round_seconds``, the wall time of each round. ``target_attention`` and
    ``fused_layers`` as in :func:`fast_generate`; ``sampling`` (default greedy) times a sampled round; ``exact``
    times exact mode's steps (docs/exact-mode.md; the settings checked as :func:`fast_generate` checks them).
    """
    rows = num_proposals(drafter) + 1
    sampling = sampling or Sampling()
    budget = rounds * rows + 1  # never reached: the rounds stop at out.round_limit
    taps = tuple(drafter.config.target_layer_ids) if drafter is not None else ()
    session = session_for(target, context_length + budget + rows, taps, engine, exact)
    target_attention = resolve_target_attention(target_attention, session.device, exact)
    if exact:
        check_exact_settings(engine, target_attention, fused_layers)
    fused = engine != "eager" and resolve_fused_layers(True if exact else fused_layers, target_attention,
                                                       session.runner, engine)
    out = Tracker(set(), StopStrings(None, None), None)
    out.first(first_token)
    out.commit_times = []
    out.round_limit = rounds
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
    runner = StaticRunner(session.runner, session.buffers(rows)[1] if drafter is not None else None)
    run_rounds(session, runner, drafter, dcache, static_drafter, last, context_length, None, budget, out, choice,
               target_attention, fused)
    end = clock(session.device)
    sequences = torch.tensor([out.tokens], device=session.device)
    result = GenerationResult(sequences=sequences, acceptance_lengths=out.acceptance, decode_s=end - start,
                              num_prompt_tokens=0, mode=drafter.fold_config.mode if drafter is not None else "ar")
    result.round_seconds = [b - a for a, b in zip([start] + out.commit_times[:-1], out.commit_times)]
    return result

