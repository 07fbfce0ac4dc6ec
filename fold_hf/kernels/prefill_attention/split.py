"""Prefill attention as two flash calls merged by log-sum-exp (CUDA only; PyTorch's cuDNN or flash kernels).

A chunk's ``L`` queries at ``start ..`` over the cache prefix ``[0, start + L)`` = the prefix ``[0, start)``, which
every query sees in full (no mask), plus the chunk's own ``L`` keys, seen causally (a square causal block). Both
run at flash speed (``torch.ops.aten._scaled_dot_product_cudnn_attention`` / ``_scaled_dot_product_flash_attention``,
which return the log-sum-exp of each row); the two results merge as ``o = o1 * w + o2 * (1 - w)``,
``w = sigmoid(lse1 - lse2)``, in one Triton launch that writes the ``[B, L, Hq, D]`` layout the o-projection reads. SDPA with a lower-right causal bias instead runs PyTorch's FA2 kernel, about
1.6x slower than cuDNN on an H200 (benchmarks/results/2026-12-04-nvidia-h200-prefill).
"""

from __future__ import annotations

import torch

BACKENDS = ("cudnn", "flash")


def _with_lse(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float):
    """(out ``[B, H, L, D]``, lse ``[B, H, L]`` fp32) of one flash call."""
    if backend == "cudnn":
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False,
                                                                  scale=scale)
    else:
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    out, lse = res[0], res[1]
    return out, lse.reshape(q.shape[0], q.shape[1], q.shape[2]).float()


def expand_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """``[B, Hkv, S, D]`` -> ``[B, Hkv * group, S, D]`` (each key head repeated for its query heads)."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def prefill_attention_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                            backend: str = "cudnn", gqa_native: bool = True, merge: str = "triton") -> torch.Tensor:
    """Causal attention of a chunk with a query offset (no sliding window), semantics of
    :func:`~fold_hf.kernels.prefill_attention.naive.prefill_attention_naive`.

    Args:
        q: ``[B, Hq, L, D]`` queries at ``start ..``; k, v: ``[B, Hkv, start + L, D]``.
        backend: ``"cudnn"`` or ``"flash"``.
        gqa_native: pass ``Hkv < Hq`` keys to the kernel as they are (it maps the heads); else repeat them first.
        merge: ``"triton"`` (:func:`~.triton.merge_lse_triton`, one launch) or ``"torch"``
            (:func:`~.naive.merge_lse_reference`, five elementwise kernels).

    Returns:
        ``[B, Hq, L, D]`` in ``q``'s dtype.
    """
    L = q.shape[2]
    group = q.shape[1] // k.shape[1]
    if not gqa_native:
        k, v = expand_kv(k, group), expand_kv(v, group)
    own_k, own_v = k[:, :, start : start + L], v[:, :, start : start + L]
    out2, lse2 = _with_lse(backend, q, own_k, own_v, True, scale)
    if start == 0:
        return out2
    out1, lse1 = _with_lse(backend, q, k[:, :, :start], v[:, :, :start], False, scale)
    if merge == "triton":  # one launch, written in [B, L, Hq, D] order (the o-projection's layout)
        from .triton import merge_lse_triton

        return merge_lse_triton(out1, lse1, out2, lse2)
    from .naive import merge_lse_reference

    return merge_lse_reference(out1, lse1, out2, lse2)
