"""Pure-torch twins of the fused kernels Qwen3.5 and Gemma target layers share (:mod:`fold_hf.kernels.hybrid.triton`).

The Llama-shaped fused kernels (:mod:`fold_hf.kernels.layer.naive`) cover ``w * x.to(dtype)`` norms, SiLU MLPs and
full rope. Qwen3.5 and Gemma layers differ:

* norms multiply in fp32 before the cast, by ``1 + w`` (Qwen3.5, Gemma-3: zero-centred weights) or ``w`` (Gemma-4),
  or by nothing (Gemma-4's value norm); Gemma adds *normed* sublayer outputs to the residual (sandwich norms) and
  Gemma-4 scales the residual by ``layer_scalar``: :func:`residual_norm_reference` is every residual step of
  those layers in one pass;
* queries and keys are RMS-normed per head before a rope that may be partial (Qwen3.5 rotates the first 64 of 256
  dims; Gemma-4's global table is ``cos 1, sin 0`` past its proportional part), sliding layers write into a ring:
  :func:`head_norm_rope_write_reference`;
* Qwen3.5's gated attention output is ``attn * sigmoid(gate)`` (:func:`sigmoid_mul_reference`);
* Gemma's MLP product and sliding-layer ring attention are in :mod:`fold_hf.kernels.gemma.naive`; the Gated
  DeltaNet step (conv + silu + L2 norms + gates + the delta rule), its commit and its gated RMSNorm output in
  :mod:`fold_hf.kernels.gated_delta.naive`.

Each twin rounds to the model dtype where transformers' modules round. These are the CPU path of the fused fast
loop and the oracles of the kernels' interpreter tests.
"""

from __future__ import annotations

import torch

from ..common import rotate_half


def _rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, dtype: torch.dtype) -> torch.Tensor:
    """``(x.float() * rsqrt(mean(x^2) + eps)) * (offset + w.float())`` cast to ``dtype`` (no weight: no scale)."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        normed = normed * (offset + weight.to(normed.dtype))
    return normed.to(dtype)


def residual_norm_reference(hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor | None, eps: float,
                            offset: float = 0.0, *, norm_out: bool = True, delta_weight: torch.Tensor | None = None,
                            delta_eps: float | None = None, norm_delta: bool = False,
                            scalar: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One residual step of a Qwen3.5 / Gemma layer.

    ``total = (hidden + d) * scalar`` with ``d = rms(delta)`` (``norm_delta``, weight ``delta_weight``, eps
    ``delta_eps``) or ``delta``; then ``normed = rms(total)`` (weight ``weight``) when ``norm_out``. Every norm is
    ``(x.float() * rsqrt(mean(x^2) + eps) * (offset + w.float())).to(dtype)`` (no weight: no scale); the add and the
    scalar product round to the dtype, as the modules do.

    Args:
        hidden: ``[..., H]`` residual stream.
        delta: ``[..., H]`` sublayer output, or None.
        weight, eps, offset: the output norm (``offset`` 1 for zero-centred weights).
        scalar: a one-element tensor multiplying the sum (Gemma-4's ``layer_scalar``), or None.

    Returns:
        ``(total, normed)`` in ``hidden``'s dtype (``normed`` None without ``norm_out``).
    """
    dtype = hidden.dtype
    total = hidden
    if delta is not None:
        d = _rms(delta, delta_weight, eps if delta_eps is None else delta_eps, offset, dtype) if norm_delta else delta
        total = hidden + d
    if scalar is not None:
        total = total * scalar
    return total, (_rms(total, weight, eps, offset, dtype) if norm_out else None)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' (partial) rope: the first ``R = cos.shape[-1]`` dims rotate (rotate_half pairs), the rest pass."""
    R = cos.shape[-1]
    rot, rest = x[..., :R], x[..., R:]
    rotated = rot * cos + rotate_half(rot) * sin
    return torch.cat((rotated, rest), -1) if rest.shape[-1] else rotated


def head_norm_rope_write_reference(query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
                                   q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
                                   offset: float, cos_table: torch.Tensor, sin_table: torch.Tensor,
                                   positions: torch.Tensor, key_cache: torch.Tensor | None,
                                   value_cache: torch.Tensor | None, *, norm_qk: bool = True,
                                   norm_value: bool = False):
    """Per-head norms, rope and the cache write of one attention layer's block.

    Args:
        query: ``[1, L, Hq, D]`` projected queries (may be a strided view of a wider projection).
        key, value: ``[1, L, Hkv, D]`` projected keys and values, or None (a KV-shared layer: queries only).
        q_weight, k_weight: per-head norm weights ``[D]`` (``norm_qk``), ``offset`` as in
            :func:`residual_norm_reference`; ``norm_value``: values get the scale-free norm (Gemma-4's ``v_norm``).
        cos_table, sin_table: ``[capacity, R]`` rope tables in the model dtype (``R <= D``; dims past ``R`` pass).
        positions: ``[L]`` long; the cache rows written are ``positions % key_cache.shape[2]`` (a ring when the
            cache is shorter than the positions).
        key_cache, value_cache: ``[1, Hkv, S, D]``, or None: keys and values returned, no cache written (a Gemma
            prefill chunk's sliding layer, whose ring is written after its attention).

    Returns:
        ``(q [1, Hq, L, D], k [1, Hkv, L, D], v [1, Hkv, L, D])`` contiguous (k and v None without a key).
    """
    dtype = query.dtype
    cos = cos_table[positions][None, :, None]  # [1, L, 1, R]
    sin = sin_table[positions][None, :, None]
    q = _rms(query, q_weight, eps, offset, dtype) if norm_qk else query
    q = _rotate(q, cos, sin).transpose(1, 2).contiguous()
    if key is None:
        return q, None, None
    k = _rms(key, k_weight, eps, offset, dtype) if norm_qk else key
    k = _rotate(k, cos, sin).transpose(1, 2).contiguous()
    v = _rms(value, None, eps, 0.0, dtype) if norm_value else value
    v = v.transpose(1, 2).contiguous()
    if key_cache is not None:
        slots = positions % key_cache.shape[2]
        key_cache.index_copy_(2, slots, k)
        value_cache.index_copy_(2, slots, v)
    return q, k, v


def sigmoid_mul_reference(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``x * sigmoid(gate)`` (Qwen3.5's gated attention output), ``[..., D]`` of one dtype; contiguous result."""
    return (x * torch.sigmoid(gate)).contiguous()


__all__ = ["head_norm_rope_write_reference", "residual_norm_reference", "sigmoid_mul_reference"]
