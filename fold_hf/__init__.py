"""fold_hf: FOLD (Far memory with Local Order) for Hugging Face transformers.

Using any public name of the package (``fold_hf.FoldDrafter``, ``from fold_hf import generate``, ...) registers the
``"fold"`` attention and mask with transformers and routes ``target.generate(..., assistant_model=<FoldDrafter>)``
to FOLD's candidate generator. The names are imported on first use, so ``import fold_hf`` and ``fold-hf --help``
do not pay for importing torch and transformers (importing :mod:`fold_hf.modeling` registers the attention,
importing :mod:`fold_hf.generation` installs the assistant strategy).
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
    "GenerationResult": ".generation",
    "fast_generate": ".generation",
    "generate": ".generation",
    "load_embedded_pair": ".embedded",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .embedded import load_embedded_pair
    from .generation import GenerationResult, fast_generate, generate
    from .modeling import FoldCache, FoldConfig, FoldDrafter, FoldDrafterConfig


def _activate() -> None:
    """Import the modeling and generation layers once: registers the attention and the assistant strategy."""
    importlib.import_module(".modeling", __name__)
    importlib.import_module(".generation", __name__)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'fold_hf' has no attribute {name!r}")
    _activate()
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
