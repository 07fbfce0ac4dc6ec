"""fold_hf: FOLD (Far memory with Local Order) for Hugging Face transformers.

Importing fold_hf (or any of its modules) patches nothing. Creating or loading a :class:`FoldDrafter` installs the
transformers integration (:func:`install`: the ``"fold"`` attention and mask, and ``target.generate(...,
assistant_model=<FoldDrafter>)`` routed to FOLD), whatever was imported; :func:`install` is also public (explicit,
idempotent; :func:`uninstall` undoes it). The names are imported on first use, so ``import fold_hf`` and
``fold-hf --help`` do not pay for importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> submodule that defines it
_EXPORTS = {
    "FoldCache": ".modeling",
    "FoldConfig": ".modeling",
    "FoldDrafter": ".modeling",
    "FoldDrafterConfig": ".modeling",
    "BatchGenerationResult": ".generation",
    "GenerationRequest": ".generation",
    "GenerationResult": ".generation",
    "fast_generate": ".generation",
    "generate": ".generation",
    "install": ".integrations.transformers",
    "load_embedded_pair": ".embedded",
    "uninstall": ".integrations.transformers",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .embedded import load_embedded_pair
    from .generation import BatchGenerationResult, GenerationRequest, GenerationResult, fast_generate, generate
    from .integrations.transformers import install, uninstall
    from .modeling import FoldCache, FoldConfig, FoldDrafter, FoldDrafterConfig


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fold_hf' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
