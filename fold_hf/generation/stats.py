"""The results of :func:`fold_hf.generate` and :func:`fold_hf.fast_generate`: tokens plus decoding statistics (one
prompt: :class:`GenerationResult`; a batch: :class:`BatchGenerationResult`, per-row lists)."""

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


@dataclass
class BatchGenerationResult:
    """Output of a batch of ``B > 1`` prompts (``return_stats=True``): the batched sequences and each row's own
    result, the per-row statistics as lists (row order).

    Attributes:
        sequences: ``[B, L + N]`` as transformers' batched ``generate`` returns them: each row's left padding kept,
            a row that stopped early filled on the right with the pad id (``N``: the most new tokens of any row).
        rows: each row's :class:`GenerationResult` (``sequences [1, P_i + N_i]``, its real prompt without padding).
        num_prompt_tokens: L (padding included).
        batched: True when the rows ran in batched rounds (one target forward per round for all running rows,
            :mod:`fold_hf.generation.fast.batched`), False when they were decoded one after another.
    """

    sequences: torch.Tensor
    rows: list[GenerationResult]
    num_prompt_tokens: int
    batched: bool = False

    @property
    def new_tokens(self) -> torch.Tensor:
        return self.sequences[:, self.num_prompt_tokens :]

    @property
    def acceptance_lengths(self) -> list[list[int]]:
        return [row.acceptance_lengths for row in self.rows]

    @property
    def proposals(self) -> list[list[list[int]]]:
        return [row.proposals for row in self.rows]

    @property
    def finish_reason(self) -> list[str]:
        return [row.finish_reason for row in self.rows]

    @property
    def tau(self) -> list[float]:
        return [row.tau for row in self.rows]

    def summary(self) -> list[dict]:
        return [row.summary() for row in self.rows]
