"""One request's rounds on a session: the eager engine's runner (:class:`StaticTarget` at host positions, for
:func:`~fold_hf.generation.rounds.eager_rounds`), cmr's target-attention probe for host-length rounds, and
:func:`run_rounds`, which picks host-length or device-length rounds for the engine."""

from __future__ import annotations

import contextlib

import torch

from ...modeling.retrieval import TargetAttentionProbe, retrieval_state
from ...targets.base import StaticTarget
from ..rounds import eager_rounds
from ..sampling import TokenChoice
from ..tracker import Tracker
from .device_rounds import static_rounds
from .session import Session
from .settings import warn_once

class StaticRunner:
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
def cmr_probe(session: Session, drafter, dcache, static_drafter):
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



def run_rounds(session: Session, runner: StaticRunner, drafter, dcache, static_drafter, last: torch.Tensor,
               position: int, pending, budget: int, out: Tracker, choice: TokenChoice,
               target_attention: str = "bucket", fused: bool = False) -> None:
    """Decode rounds after a prefill at ``position`` (``last`` ``[1]``: the last committed token; ``pending``: tapped
    features ``[1, n, n_taps * H]`` the drafter has not committed, or None) until ``out`` stops or ``budget``
    tokens: host-length rounds (:func:`~fold_hf.generation.rounds.eager_rounds` over ``runner``) in the eager engine
    and for cmr without a static step, device-length rounds (:func:`static_rounds`) otherwise."""
    with cmr_probe(session, drafter, dcache, static_drafter) as probe:
        if session.engine == "eager" or probe is not None:
            if session.runner.exact:
                raise ValueError("exact mode runs device-length rounds; mode 'cmr' runs host-length rounds here "
                                 "(the warning above says why), through the model's modules")
            eager_rounds(runner, drafter, dcache, budget, out, last, position, pending, choice)
        else:
            static_rounds(session, drafter, dcache, static_drafter, last, position, budget, out, choice,
                          target_attention, fused)
