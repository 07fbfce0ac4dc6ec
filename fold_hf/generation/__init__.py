"""Speculative decoding: our loop (`generate`), verification, stats and the transformers assistant strategy."""

from .loop import generate
from .stats import GenerationResult
from .verify import greedy_accept, process_logits, speculative_accept

__all__ = ["GenerationResult", "generate", "greedy_accept", "process_logits", "speculative_accept"]
