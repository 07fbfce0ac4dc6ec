"""Attention of a prefill chunk: ``L`` queries at positions ``start ..`` over the cache prefix ``[0, start + L)``,
causal, GQA, optionally inside a sliding window.

Variants (``$FOLD_HF_PREFILL_ATTENTION``; all take and return the shapes of :func:`prefill_attention`):

* ``cudnn`` (default on CUDA, layers without a sliding window): the prefix and the chunk's own causal block as two cuDNN flash calls merged by their
  log-sum-exp (:mod:`.split`); ``flash``: the same with PyTorch's FA2 kernel;
* ``triton``: our flash-attention forward with a query offset (:mod:`.triton`; the default on CUDA for sliding-window
  layers, which read only their window);
* ``efficient``: SDPA's memory-efficient kernel over key heads repeated for their query heads, a lower-right causal
  bias (:func:`prefill_attention_efficient`); what a call takes on CUDA when ``cudnn`` / ``flash`` cannot run its
  head dim (Gemma-4's global heads of 512): with GQA passed natively SDPA has no fused kernel there and its math
  path writes ``[Hq, L, start + L]`` fp32 scores (a 32K Gemma-4-12B prefill peaked at 67.7 GiB against transformers'
  39.2, benchmarks/results/2026-12-05-nvidia-h200-prefill-families);
* ``sdpa``: ``F.scaled_dot_product_attention`` with a lower-right causal bias (the path before 2026-12-04: PyTorch
  runs its FA2 kernel for it) or a boolean mask for a window; the default on the CPU.

Chosen by measurement on an H200 (benchmarks/results/2026-12-04-nvidia-h200-prefill). When the chosen variant
cannot run a call (device, dtype, head dim, window) the call runs ``efficient`` where it can, else ``sdpa``, and a
warning says why, once per reason.
:func:`~.naive.prefill_attention_naive` is the fp32 reference the tests compare every variant with.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import torch
import torch.nn.functional as F

from .naive import prefill_attention_naive

PREFILL_ATTENTION_ENV = "FOLD_HF_PREFILL_ATTENTION"
VARIANTS = ("cudnn", "flash", "triton", "efficient", "sdpa")
DEFAULT_CUDA = "cudnn"
_warned: set[str] = set()

__all__ = ["PREFILL_ATTENTION_ENV", "VARIANTS", "prefill_attention", "prefill_attention_efficient",
           "prefill_attention_naive", "prefill_attention_sdpa", "prefill_attention_variant", "unsupported_reason"]


def prefill_attention_variant(device: torch.device | str, windowed: bool = False) -> str:
    """The variant prefill chunks on ``device`` run: ``$FOLD_HF_PREFILL_ATTENTION`` when set, else on CUDA
    :data:`DEFAULT_CUDA` (``triton`` for a sliding-window layer: the flash libraries take no window) and ``sdpa``
    elsewhere."""
    value = os.environ.get(PREFILL_ATTENTION_ENV, "")
    if value:
        if value not in VARIANTS:
            raise ValueError(f"{PREFILL_ATTENTION_ENV} must be one of {VARIANTS}, got {value!r}")
        return value
    if torch.device(device).type != "cuda":
        return "sdpa"
    return "triton" if windowed else DEFAULT_CUDA


def unsupported_reason(variant: str, q: torch.Tensor, window: int | None) -> str | None:
    """Why ``variant`` cannot run queries ``q [B, Hq, L, D]`` (with ``window``), or None."""
    if variant == "sdpa":
        return None
    if q.device.type != "cuda" and not (variant == "triton" and os.environ.get("TRITON_INTERPRET") == "1"):
        return f"{variant} prefill attention needs CUDA (tensors on {q.device.type})"
    D = q.shape[-1]
    if variant == "efficient":
        if window is not None:
            return f"efficient prefill attention has no sliding window (window {window})"
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or D % 8:
            return (f"efficient prefill attention takes fp16/bf16/fp32 and head dims in multiples of 8, not "
                    f"{q.dtype}, {D}")
        return None
    if variant in ("cudnn", "flash"):
        if window is not None:
            return f"{variant} prefill attention has no sliding window (window {window})"
        if q.dtype not in (torch.float16, torch.bfloat16):
            return f"{variant} prefill attention runs fp16/bf16, not {q.dtype}"
        if D > 256 or D % 8:
            return f"{variant} prefill attention takes head dims <= 256 in multiples of 8, not {D}"
        return None
    from ...import_utils import is_triton_available

    interpreted = q.device.type == "cpu" and importlib.util.find_spec("triton") is not None  # TRITON_INTERPRET=1
    if not (interpreted or is_triton_available()) or os.environ.get("FOLD_HF_DISABLE_TRITON") == "1":
        return "triton prefill attention: Triton is not available (or FOLD_HF_DISABLE_TRITON=1)"
    from .triton import MAX_HEAD_DIM

    if D > MAX_HEAD_DIM:
        return f"triton prefill attention takes head dims <= {MAX_HEAD_DIM}, not {D}"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"triton prefill attention runs fp16/bf16/fp32, not {q.dtype}"
    return None


def prefill_attention_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                           window: int | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` form (shapes of :func:`prefill_attention`): ``is_causal`` from position
    0, a lower-right causal bias after it, a boolean mask with a window."""
    L = q.shape[2]
    if window is not None and window < start + L:
        pos = torch.arange(start, start + L, device=q.device)[:, None]
        key = torch.arange(start + L, device=q.device)[None, :]
        mask = (key <= pos) & (pos - key < window)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    if L == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    from torch.nn.attention.bias import causal_lower_right

    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, start + L), scale=scale,
                                          enable_gqa=True)


def prefill_attention_efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                                scale: float) -> torch.Tensor:
    """SDPA's memory-efficient kernel (shapes of :func:`prefill_attention`, no window): the ``Hkv`` key / value
    heads repeated for their query heads (that kernel takes no GQA; a transient ``[B, Hq, start + L, D]`` copy
    each), ``is_causal`` from position 0, a lower-right causal bias after it. The backend is forced, so a call it
    cannot run raises rather than falling to the math path."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .split import expand_kv

    L, group = q.shape[2], q.shape[1] // k.shape[1]
    k, v = expand_kv(k, group), expand_kv(v, group)
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        if start == 0:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(L, start + L), scale=scale)


def _say_once(reason: str, instead: str) -> None:
    """Warn once per ``reason`` that a prefill runs ``instead`` of the variant it asked for."""
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"{reason}: this prefill runs {instead} instead", stacklevel=3)


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                      window: int | None = None, variant: str | None = None) -> torch.Tensor:
    """Causal attention of a prefill chunk (semantics of :func:`~.naive.prefill_attention_naive`).

    Args:
        q: ``[B, Hq, L, D]`` queries at positions ``start .. start + L - 1``.
        k: ``[B, Hkv, start + L, D]`` keys at positions ``0 ..`` (a view of the static cache); v: values, same shape.
        start: position of the first query; scale: the logit scale; window: sliding window or None.
        variant: one of :data:`VARIANTS`, default :func:`prefill_attention_variant`.

    Returns:
        ``[B, Hq, L, D]`` in ``q``'s dtype (possibly a view of ``[B, L, Hq, D]`` memory).
    """
    if window is not None and window >= k.shape[2]:  # every query sees its whole prefix
        window = None
    variant = variant or prefill_attention_variant(q.device, windowed=window is not None)
    if variant not in VARIANTS:
        raise ValueError(f"prefill attention variant must be one of {VARIANTS}, got {variant!r}")
    reason = unsupported_reason(variant, q, window)
    if reason is not None:
        instead = "sdpa"
        if variant in ("cudnn", "flash") and unsupported_reason("efficient", q, window) is None:
            instead = "efficient"
        _say_once(reason, "SDPA's memory-efficient kernel over repeated key heads" if instead == "efficient"
                  else "SDPA with a causal bias")
        variant = instead
    if variant == "sdpa":
        return prefill_attention_sdpa(q, k, v, start, scale, window)
    if variant == "efficient":
        try:
            return prefill_attention_efficient(q, k, v, start, scale)
        except RuntimeError as err:  # this torch build has no memory-efficient kernel for the call
            if reason is None:  # asked for by name: its own error
                raise
            _say_once(f"efficient prefill attention cannot run here ({str(err).splitlines()[0]})",
                      "SDPA with a causal bias")
            return prefill_attention_sdpa(q, k, v, start, scale, window)
    if variant == "triton":
        from .triton import prefill_attention_triton

        return prefill_attention_triton(q, k, v, start, scale, window)
    from .split import prefill_attention_split

    return prefill_attention_split(q, k, v, start, scale, backend=variant)
