"""fold_hf: FOLD (Far memory with Local Order) for Hugging Face transformers.

Importing fold_hf (or any of its modules) patches nothing. Creating or loading a :class:`FoldDrafter` installs the
transformers integration (:func:`install`: the ``"fold"`` attention and mask, and ``target.generate(...,
assistant_model=<FoldDrafter>)`` routed to FOLD), whatever was imported; :func:`install` is also public (explicit,
idempotent; :func:`uninstall` undoes it). The names are imported on first use, so ``import fold_hf`` and
``fold-hf --help`` do not pay for importing torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .import_utils import lazy_attributes

__version__ = "0.1.0"

# submodule -> the public names it defines
_EXPORTS = {
    ".embedded": ("load_embedded_pair",),
    ".generation": ("BatchGenerationResult", "GenerationRequest", "GenerationResult", "fast_generate", "generate"),
    ".integrations.transformers": ("install", "uninstall"),
    ".modeling": ("DraftVocab", "FoldCache", "FoldConfig", "FoldDrafter", "FoldDrafterConfig"),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .embedded import load_embedded_pair
    from .generation import BatchGenerationResult, GenerationRequest, GenerationResult, fast_generate, generate
    from .integrations.transformers import install, uninstall
    from .modeling import DraftVocab, FoldCache, FoldConfig, FoldDrafter, FoldDrafterConfig


__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, globals())
