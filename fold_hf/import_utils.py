"""Optional dependencies, checked once, and the lazy public names of the package's ``__init__`` modules."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from typing import Any, Callable


@functools.lru_cache(maxsize=None)
def is_triton_available() -> bool:
    """True when Triton is importable and a CUDA device is present (Triton never loads on the CPU path)."""
    if importlib.util.find_spec("triton") is None:
        return False
    import torch

    return torch.cuda.is_available()


@functools.lru_cache(maxsize=None)
def is_peft_available() -> bool:
    return importlib.util.find_spec("peft") is not None


def lazy_attributes(package: str, exports: dict[str, tuple[str, ...]],
                    namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` of ``package`` whose public names are imported on first use.

    ``exports`` maps each submodule, relative to ``package`` (``".modeling"``), to the public names it defines;
    ``namespace`` is the package's ``globals()``, where a name is stored once imported so later look-ups skip
    ``__getattr__``."""
    exports = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
