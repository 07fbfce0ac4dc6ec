"""One request's committed tokens: stopping (length, EOS ids, stop strings), the streamer and the round statistics.

Every decode loop of fold_hf (:func:`fold_hf.generate`, :func:`fold_hf.generation.fast.fast_generate` on each of
its engines, ``target.generate`` when it is routed to the fast loop) commits its tokens through one
:class:`Tracker`, so stopping and statistics are written once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch


def clock(device: torch.device) -> float:
    """``perf_counter()`` after the device's queued work (CUDA) is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def eos_ids(target, eos_token_id) -> set[int]:
    """EOS ids as a set: ``eos_token_id`` (int, list or tensor), else the target's generation config's."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.tolist()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(e) for e in eos_token_id}


class StopStrings:
    """Finds the first token at which the decoded continuation contains a stop string."""

    def __init__(self, stop_strings: Sequence[str] | str | None, tokenizer) -> None:
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        self.strings = [s for s in (stop_strings or []) if s]
        if self.strings and tokenizer is None:
            raise ValueError("stop_strings needs tokenizer=... to decode the generated tokens")
        self.tokenizer = tokenizer

    def cut(self, new_tokens: list[int], checked: int) -> int | None:
        """Index (exclusive) of the token that completes a stop string, searching tokens >= ``checked``."""
        if not self.strings:
            return None
        for end in range(max(1, checked), len(new_tokens) + 1):
            text = self.tokenizer.decode(new_tokens[:end])
            if any(s in text for s in self.strings):
                return end
        return None


class Tracker:
    """Committed tokens of one request, its acceptance lengths, why it finished, and its streamer.

    ``first`` takes the prefill's token, ``commit`` each verification round's tokens (accepted proposals then the
    target's own); a round's tokens past an EOS or past the end of a stop string are dropped and ``finish`` says
    why (``"length"`` while running or when the budget ended it, ``"eos"``, ``"stop_string"``). The streamer gets
    exactly the kept tokens, round by round (the caller puts the prompt).
    """

    def __init__(self, eos: set[int], stops: StopStrings, streamer) -> None:
        self.eos, self.stops, self.streamer = eos, stops, streamer
        self.tokens: list[int] = []
        self.acceptance: list[int] = []
        self.finish = "length"
        self.commit_times: list[float] | None = None  # perf_counter() after each round, when a benchmark asks
        self.proposals: list[list[int]] = []  # each round's proposed token ids (the loops append them)
        self.round_limit: int | None = None  # benchmarks: stop after this many rounds (the budget never binds)

    def running(self, budget: int) -> bool:
        return (self.finish == "length" and len(self.tokens) < budget
                and (self.round_limit is None or len(self.acceptance) < self.round_limit))

    def first(self, token: int) -> None:
        self.tokens.append(token)
        if self.streamer is not None:
            self.streamer.put(torch.tensor([token]))
        if token in self.eos:
            self.finish = "eos"
        elif self.stops.cut(self.tokens, 1) is not None:
            self.finish = "stop_string"

    def commit(self, committed: list[int]) -> None:
        if self.commit_times is not None:
            self.commit_times.append(time.perf_counter())
        self.acceptance.append(len(committed))
        checked = len(self.tokens) + 1
        self.tokens.extend(committed)
        for i, tok in enumerate(committed):
            if tok in self.eos:
                del self.tokens[checked + i :]
                self.finish = "eos"
                break
        cut = self.stops.cut(self.tokens, checked)
        if cut is not None:
            del self.tokens[cut:]
            self.finish = "stop_string"
        if self.streamer is not None:
            shown = self.tokens[checked - 1 :]
            if shown:
                self.streamer.put(torch.tensor(shown))
