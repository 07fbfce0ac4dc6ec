"""What ``fold-hf demo`` decodes and how it times it.

* The input is pinned: ``assets/demo-input/input.txt`` (transformers' source code, Apache-2.0, drawn once by
  ``benchmarks/build_demo_input.py``; its SHA-256 is checked here), cut into a retrieval request (its end restarts a
  function from its first quarter, :func:`fold_hf.bench.suites.retrieval_prompt`). The same text on every machine
  and transformers version gives the same tokens, hence the same τ.
* The timing is a benchmark's: one short warm-up call per method, then ``repeats`` rounds in which every method
  decodes the whole request once, in a rotating order, so a change of the machine's speed falls on all methods
  alike. A method's speed is the median over the repeats with its min–max; its speedup is the median of the
  per-repeat ratios TPOT(AR) / TPOT(method) (paired: both from the same repeat), with their min–max.
* :func:`noise_verdict` says when the ratios cannot be trusted (the rule is in its docstring).
"""

from __future__ import annotations

import hashlib
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

DEMO_INPUT = Path(__file__).parent / "assets" / "demo-input" / "input.txt"
DEMO_INPUT_SHA256 = "76fc296bec62bce7f6bc2a1e15e1fae8d697db5da39ec4f901428acd3d350f86"
# the ratio's spread (max - min over the median) above which the demo calls the machine too noisy: FOLD's gain on
# a CPU is ~20% (README), so a spread wider than that cannot tell FOLD's speed from AR's
NOISE_SPREAD = 0.20


def demo_text() -> str:
    """The pinned input text; ValueError when the file is not the one the demo was built with."""
    data = DEMO_INPUT.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != DEMO_INPUT_SHA256:
        raise ValueError(f"{DEMO_INPUT} has SHA-256 {digest}, not the pinned {DEMO_INPUT_SHA256}: the demo's input "
                         "was changed; rebuild it with benchmarks/build_demo_input.py and update DEMO_INPUT_SHA256")
    return data.decode("utf-8")


def demo_prompt_ids(tokenizer, tokens: int) -> list[int]:
    """``tokens`` token ids of the pinned input whose end restarts a function from far above: the request starts at
    the first line of the text (every 10th line tried, in order) from which
    :func:`~fold_hf.bench.suites.retrieval_prompt` finds a function in the first quarter, so the same ``tokens`` give
    the same ids everywhere; ValueError when the pinned text cannot make one of that length."""
    from .bench.suites import retrieval_prompt

    text = demo_text()
    available = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    if tokens <= available:
        for start in line_starts[::10]:
            ids = retrieval_prompt(tokenizer, text[start:], random.Random("fold-hf-demo"), tokens)
            if ids is not None:
                return ids
    raise ValueError(f"--tokens {tokens}: the demo's pinned input ({DEMO_INPUT.name}, {available} tokens) has no "
                     "function to restart in the first quarter of an input of that length, or is too short")


@dataclass
class Spread:
    """The median of some repeats and their min and max."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def relative(self) -> float:
        """(max - min) / median: 0 for identical repeats."""
        return (self.high - self.low) / self.median if self.median else float("inf")

    def show(self, fmt: str = "{:.2f}", unit: str = "") -> str:
        if len(self.values) == 1:
            return fmt.format(self.median) + unit + " (1 run)"
        return f"{fmt.format(self.median)}{unit} [{fmt.format(self.low)}-{fmt.format(self.high)}]"


def paired_speedups(ar_tpot: list[float], method_tpot: list[float]) -> Spread:
    """The per-repeat ratios TPOT(AR) / TPOT(method), repeat i against repeat i."""
    if len(ar_tpot) != len(method_tpot):
        raise ValueError("one AR time per repeat of the method")
    return Spread([a / m for a, m in zip(ar_tpot, method_tpot)])


def noise_verdict(name: str, speedup: Spread, threshold: float = NOISE_SPREAD) -> str | None:
    """A line saying why ``name``'s speedup over AR cannot be trusted, or None when it can.

    Rule: with fewer than 3 repeats there is no spread to judge; the ratio is too noisy when its repeats spread
    over more than ``threshold`` of their median ((max - min) / median), or when they fall on both sides of 1.0
    (some repeats say faster than AR, others slower)."""
    if len(speedup.values) < 3:
        return f"{name}: fewer than 3 repeats, the ratio's spread is unknown: run with --repeats 3 or more"
    if speedup.relative > threshold:
        return (f"too noisy to trust the ratio: {name}'s speedups over the repeats span {speedup.low:.2f}-"
                f"{speedup.high:.2f}x, {speedup.relative:.0%} of their median (more than {threshold:.0%}): the "
                "machine's speed changed during the run; rerun on an idle machine")
    if speedup.low < 1.0 < speedup.high:
        return (f"too noisy to trust the ratio: {name}'s repeats fall on both sides of AR ({speedup.low:.2f}-"
                f"{speedup.high:.2f}x)")
    return None
