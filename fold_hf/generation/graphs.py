"""CUDA graph capture of one decoding step, kept deliberately simple.

A step is a Python function that reads only static device buffers and writes only static device buffers (and
returns tensors allocated during capture, which the graph keeps alive). It must be *idempotent* apart from the
buffers it names as ``preserve``: running it twice with the same buffers produces the same writes, so the warm-up
runs before capture change nothing that the real replay would not write again. Every step of the fast loop is
written that way: state updates go to a ``next_state`` buffer that the loop copies over the state after the replay.
A step that does read what it overwrites (a recurrent target's verify commits the accepted position's state into
the state buffer it started from) names those buffers in ``preserve``: their contents are saved before the warm-up
runs and put back after them, so the first replay starts from the state the loop left.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _warm_up(fn, warmup: int, preserve: Sequence[torch.Tensor]) -> None:
    """Run ``fn`` ``warmup`` times, each run from the ``preserve`` buffers as they were before the first, and leave
    them so. Restoring after every run, not only after the last, keeps every run's writes where the real replay
    writes: a second run from an advanced state would write the cache one block further on, and in a ring that
    is only a few rows longer than the window (a sliding layer's cache) that overwrites entries still in the
    window."""
    saved = [t.clone() for t in preserve] if warmup else []
    for _ in range(warmup):
        fn()
        for buffer, value in zip(preserve, saved):
            buffer.copy_(value)


class CapturedStep:
    """``fn`` captured in a CUDA graph after warm-up on a side stream; :meth:`replay` reruns it.

    Args:
        fn: the step (no arguments); its return value (tensors) is available as :attr:`outputs`.
        pool: a graph memory pool shared with the other steps of one session.
        warmup: eager runs before capture (lets cuBLAS/cuDNN pick and allocate their workspaces).
        preserve: buffers ``fn`` both reads and overwrites (non-idempotent state); restored after the warm-up.
    """

    def __init__(self, fn, pool=None, warmup: int = 2, preserve: Sequence[torch.Tensor] = ()) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _warm_up(fn, warmup, preserve)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn()

    def replay(self):
        self.graph.replay()
        return self.outputs


class EagerStep:
    """Same interface as :class:`CapturedStep` without a graph (CPU, or graphs turned off). ``warmup`` runs
    (default none) happen as in :class:`CapturedStep`, ``preserve`` restored after them: tests use them to check
    on CPU that every step survives the graph engine's warm-up."""

    def __init__(self, fn, warmup: int = 0, preserve: Sequence[torch.Tensor] = ()) -> None:
        self.fn = fn
        _warm_up(fn, warmup, preserve)

    def replay(self):
        return self.fn()
