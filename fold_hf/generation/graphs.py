"""CUDA graph capture of one decoding step, kept deliberately simple.

A step is a Python function that reads only static device buffers and writes only static device buffers (and
returns tensors allocated during capture, which the graph keeps alive). It must be *idempotent*: running it
twice with the same buffers produces the same writes, so the warm-up runs before capture change nothing that
the real replay would not write again. Every step of the fast loop is written that way: state updates go to a
``next_state`` buffer that the loop copies over the state after the replay.
"""

from __future__ import annotations

import torch


class CapturedStep:
    """``fn`` captured in a CUDA graph after warm-up on a side stream; :meth:`replay` reruns it.

    Args:
        fn: the step (no arguments); its return value (tensors) is available as :attr:`outputs`.
        pool: a graph memory pool shared with the other steps of one session.
        warmup: eager runs before capture (lets cuBLAS/cuDNN pick and allocate their workspaces).
    """

    def __init__(self, fn, pool=None, warmup: int = 2) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn()

    def replay(self):
        self.graph.replay()
        return self.outputs


class EagerStep:
    """Same interface as :class:`CapturedStep` without a graph (CPU, or graphs turned off)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def replay(self):
        return self.fn()
