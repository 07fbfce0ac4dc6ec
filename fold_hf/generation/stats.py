"""The result of :func:`fold_hf.generate`: tokens plus decoding statistics."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class GenerationResult:
    """Output of one speculative (or AR) generation.

    Attributes:
        sequences: ``[1, P + N]`` prompt then generated tokens.
        acceptance_lengths: tokens committed per verification round, the target's own token included.
        ttft_s: seconds from the call to the first generated token (prefill).
        decode_s: seconds spent after the first token.
        num_prompt_tokens: P.
        mode: the drafter's reading mode, or ``"ar"``.
        finish_reason: ``"length"``, ``"eos"`` or ``"stop_string"``.
        proposals: the drafted token ids of every round (``[]`` for a round that drafted nothing), beside
            ``acceptance_lengths``: round i accepted ``acceptance_lengths[i] - 1`` of ``proposals[i]``.
    """

    sequences: torch.Tensor
    acceptance_lengths: list[int] = field(default_factory=list)
    ttft_s: float = 0.0
    decode_s: float = 0.0
    num_prompt_tokens: int = 0
    mode: str = "ar"
    finish_reason: str = "length"
    proposals: list[list[int]] = field(default_factory=list)

    @property
    def num_new_tokens(self) -> int:
        return self.sequences.shape[-1] - self.num_prompt_tokens

    @property
    def new_tokens(self) -> torch.Tensor:
        return self.sequences[:, self.num_prompt_tokens :]

    @property
    def rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def tau(self) -> float:
        """Mean tokens committed per verification round (paper's acceptance length)."""
        return sum(self.acceptance_lengths) / len(self.acceptance_lengths) if self.acceptance_lengths else 0.0

    @property
    def tpot_s(self) -> float:
        """Seconds per output token after the first (prefill excluded)."""
        after_first = self.num_new_tokens - 1
        return self.decode_s / after_first if after_first > 0 else 0.0

    def summary(self) -> dict:
        return {
            "mode": self.mode,
            "prompt_tokens": self.num_prompt_tokens,
            "new_tokens": self.num_new_tokens,
            "rounds": self.rounds,
            "tau": self.tau,
            "ttft_s": self.ttft_s,
            "tpot_s": self.tpot_s,
            "finish_reason": self.finish_reason,
        }
