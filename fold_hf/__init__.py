"""fold_hf: FOLD (Far memory with Local Order) for Hugging Face transformers.

``import fold_hf`` registers the ``"fold"`` attention and mask with transformers and routes
``target.generate(..., assistant_model=<FoldDrafter>)`` to FOLD's candidate generator.
"""

from .modeling import FoldCache, FoldConfig, FoldDrafter, FoldDrafterConfig
from .modeling.attention import register as _register_attention

_register_attention()

from .generation import GenerationResult, fast_generate, generate  # noqa: E402
from .generation.assisted import install as _install_assisted  # noqa: E402

_install_assisted()

__version__ = "0.1.0"

__all__ = ["FoldCache", "FoldConfig", "FoldDrafter", "FoldDrafterConfig", "GenerationResult", "fast_generate", "generate"]
