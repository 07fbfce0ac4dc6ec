"""Speculative decoding: our loop (`generate`), its fast twin (`fast_generate`), verification, stats, and the candidate generator of transformers' assisted loop (installed by :mod:`fold_hf.integrations.transformers`)."""

from .fast import fast_generate, release_fast_state
from .loop import generate
from .request import GenerationRequest
from .stats import BatchGenerationResult, GenerationResult
from .verify import greedy_accept, process_logits, speculative_accept

__all__ = ["BatchGenerationResult", "GenerationRequest", "GenerationResult", "fast_generate", "generate",
           "greedy_accept", "process_logits", "release_fast_state", "speculative_accept"]
