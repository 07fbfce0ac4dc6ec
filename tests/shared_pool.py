"""The graphs engine's memory contract on the CPU: a session's CUDA graphs share one memory pool, which is safe only
for graphs replayed in the order they were captured, so what a step returns holds only until another step of the
session replays (a graph captured earlier may keep its temporaries where a later one's outputs lie).
:class:`SharedPoolStep` (an :class:`~fold_hf.generation.graphs.EagerStep`, what the ``static`` engine builds) makes
that visible without a GPU: its replay first overwrites what every other step returned last, with -1 (integers) or
NaN. ``tests/conftest.py`` installs it for every test, so a loop that reads a step's outputs after another step has
replayed fails on the CPU as it would on the graphs engine (on an H100 it did: every reading mode after the first
in a process accepted nothing at B > 1, 2026-12-07)."""

from __future__ import annotations

import torch

from fold_hf.generation.graphs import EagerStep


class SharedPoolStep(EagerStep):
    live: list = []  # steps that have replayed, most recent last (the last 64)

    def replay(self):
        for step in SharedPoolStep.live:
            if step is not self:
                for tensor in tensors(step.last):
                    tensor.fill_(-1 if not tensor.is_floating_point() else float("nan"))
        self.last = super().replay()
        if self not in SharedPoolStep.live:
            SharedPoolStep.live.append(self)
            del SharedPoolStep.live[:-64]
        return self.last


def tensors(value) -> list[torch.Tensor]:
    """The tensors of a step's return value (a tensor, or nested tuples / lists of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    return []
