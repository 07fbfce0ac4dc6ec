"""Environment knobs of the fast loop and its fallback warnings: which verify attention, fused target layers, fused
drafter step and queued rounds a request gets (each a function of its arguments, the device and ``$FOLD_HF_*``), and
what exact mode needs of them (:func:`check_exact_settings`)."""

from __future__ import annotations

import os
import warnings

import torch

from ...kernels import triton_kernels_enabled
from ...targets.base import TARGET_ATTENTIONS, StaticTarget, UnsupportedTarget

_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """A UserWarning the first time ``message`` comes up in this process (the fast path's fallbacks say why)."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def resolve_target_attention(target_attention: str | None, device: torch.device | str = "cpu",
                             exact: bool = False) -> str:
    """``target_attention``, else ``$FOLD_HF_TARGET_ATTENTION``, else ``"triton"`` on CUDA with Triton (or in exact
    mode, which attends with its own Triton kernel) and ``"bucket"`` elsewhere; raises on unknown names."""
    if target_attention is None:
        target_attention = os.environ.get("FOLD_HF_TARGET_ATTENTION") or None
    if target_attention is None:
        target_attention = "triton" if exact or triton_kernels_enabled(device) else "bucket"
    if target_attention not in TARGET_ATTENTIONS:
        raise ValueError(f"target_attention must be one of {TARGET_ATTENTIONS}, got {target_attention!r}")
    return target_attention


def check_exact_settings(engine: str, target_attention: str, fused_layers: bool | None,
                         batched: bool = False) -> None:
    """What exact mode (docs/exact-mode.md) needs of a request's settings: the static or graphs engine (``batched``:
    a batch's batched rounds, whose verify runs exact mode's kernels row by row), the Triton attention and the fused
    layers (its kernels replace theirs). Raises ValueError naming what is in the way."""
    if engine == "eager" and not batched:
        raise ValueError("exact mode runs in the static and graphs engines; engine='eager' runs the host-length "
                         "forward through the model's modules, whose kernels choose their reduction by the row count")
    if target_attention != "triton":
        raise ValueError(f"exact mode needs target_attention='triton' (it attends with its own decode kernel), got "
                         f"{target_attention!r}")
    if fused_layers is False or os.environ.get("FOLD_HF_FUSED_LAYERS") == "0":
        why = "fused_layers=False" if fused_layers is False else "$FOLD_HF_FUSED_LAYERS=0"
        raise ValueError(f"exact mode runs the target's fused layers; {why} turns them off")


def resolve_fused_layers(fused_layers: bool | None, target_attention: str, runner: StaticTarget,
                         engine: str) -> bool:
    """Whether the static and graphs engines run the target's fused layers (module docstring).

    Raises:
        ValueError: ``fused_layers=True`` with the eager engine or with ``target_attention="bucket"``.
        UnsupportedTarget: ``fused_layers=True`` on a target whose layers the fused kernels do not cover.
    """
    if fused_layers is None:
        env = os.environ.get("FOLD_HF_FUSED_LAYERS")
        if env not in (None, "", "0", "1"):
            raise ValueError(f"FOLD_HF_FUSED_LAYERS must be 0 or 1, got {env!r}")
        if env:
            fused_layers = env == "1"
        else:
            if engine == "eager" or target_attention != "triton" or runner.device.type != "cuda":
                return False
            reason = runner.fused_unsupported()
            if reason is not None:
                warn_once(f"fused target layers are off: {reason}")
            return reason is None
    if not fused_layers:
        return False
    if engine == "eager":
        raise ValueError("fused_layers runs in the static and graphs engines, not engine='eager'")
    if target_attention != "triton":
        raise ValueError("fused_layers needs target_attention='triton' (the fused layers attend with the decode "
                         "kernel)")
    reason = runner.fused_unsupported()
    if reason is not None:
        raise UnsupportedTarget(f"fused_layers=True: {reason}")
    return True


def fused_drafter_enabled() -> bool:
    """Whether fused layers extend to the drafter's static step (default yes; ``$FOLD_HF_FUSED_DRAFTER=0`` keeps
    the drafter on its modules). The same math as the drafter's modules, tested on CPU, in Triton's interpreter
    and on a GPU; what it saves per round is measured in docs/fast-path.md."""
    value = os.environ.get("FOLD_HF_FUSED_DRAFTER", "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"FOLD_HF_FUSED_DRAFTER must be 0 or 1, got {value!r}")
    return value == "1"


def resolve_fused_drafter(fused: bool, fused_layers: bool | None, target_attention: str, runner: StaticTarget,
                          engine: str) -> bool:
    """Whether the drafter's static step runs the fused kernels: when the target's layers do (``fused``), and also
    when only the target's own layer type kept them off by default (a Gemma target with a Llama-layout drafter;
    the drafter's layers are checked by :func:`fused_drafter_unsupported`). Off with ``fused_layers=False``,
    ``$FOLD_HF_FUSED_LAYERS=0`` or ``$FOLD_HF_FUSED_DRAFTER=0``."""
    if not fused_drafter_enabled():
        return False
    if fused:
        return True
    if (fused_layers is False or os.environ.get("FOLD_HF_FUSED_LAYERS") == "0" or engine == "eager"
            or target_attention != "triton" or runner.device.type != "cuda"):
        return False
    return runner.fused_unsupported() is not None


def pipelined_rounds_enabled() -> bool:
    """Whether the static and graphs engines queue a round before reading the previous one's result (default yes;
    ``$FOLD_HF_PIPELINE_ROUNDS=0`` reads each round's result before the next is launched, for A/B timings)."""
    value = os.environ.get("FOLD_HF_PIPELINE_ROUNDS", "1")
    if value not in ("0", "1", ""):
        raise ValueError(f"FOLD_HF_PIPELINE_ROUNDS must be 0 or 1, got {value!r}")
    return value != "0"

