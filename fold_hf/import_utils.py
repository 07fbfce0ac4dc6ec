"""Optional dependencies, checked once."""

from __future__ import annotations

import functools
import importlib.util


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
