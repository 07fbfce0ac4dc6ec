"""Speculative decoding: our loop (`generate`), its fast twin (`fast_generate`), verification, stats and the transformers assistant strategy."""

from .assisted import install as _install_assisted
from .fast import fast_generate, release_fast_state
from .loop import generate
from .stats import GenerationResult
from .verify import greedy_accept, process_logits, speculative_accept

_install_assisted()  # target.generate(assistant_model=<FoldDrafter>) drafts with FOLD once this package is imported

__all__ = ["GenerationResult", "fast_generate", "generate", "greedy_accept", "process_logits", "release_fast_state",
           "speculative_accept"]
