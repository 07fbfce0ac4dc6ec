"""Target families of the fast loop: one module per family (config fields, layer math, static step).

The default family (Llama, Mistral, Qwen2, Qwen3) is :class:`~fold_hf.generation.static_target.StaticTarget`
itself; other families register a subclass with :func:`~fold_hf.generation.static_target.register_target_family`
when this package is imported (``static_target`` imports it at its end).
"""

from . import gemma  # noqa: F401  (registers the Gemma-3 / Gemma-4 text family)
