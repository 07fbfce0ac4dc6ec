"""Pure-torch twins of the Gemma-only fused ops of the fast loop's Gemma target layers (:mod:`.triton`).

* :func:`gelu_tanh_mul_reference`: Gemma's MLP, ``gelu_tanh(gate) * up``;
* :func:`ring_attention_reference`: a block's sliding-window attention over a sliding layer's ring cache.

The norms and the per-head norm + rope + (ring) cache write Gemma shares with Qwen3.5 are in
:mod:`fold_hf.kernels.hybrid`. These are the CPU path of the fused fast loop and the oracles of the kernels'
interpreter tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gelu_tanh_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up`` (Gemma's MLP before ``down_proj``), ``[..., I]``."""
    return F.gelu(gate, approximate="tanh") * up


def ring_attention_reference(query: torch.Tensor, key_ring: torch.Tensor, value_ring: torch.Tensor,
                             positions: torch.Tensor, window: int, scaling: float) -> torch.Tensor:
    """Sliding-window attention of a block over a ring cache (Gemma's sliding layers on the fast loop).

    Slot ``s`` of the ring (``R`` slots) holds position ``top - ((top - s) mod R)`` with ``top = positions[-1]`` (the
    block's own rows are already written); query row ``r`` sees the slots whose position ``p`` has ``p >= 0``,
    ``p <= positions[r]`` and ``positions[r] - p < window``. Scores in fp32 (fp64 for fp64), probabilities cast to
    the values' dtype before the second product, as the module path's ``masked_attention``.

    Args:
        query: ``[1, Hq, L, D]`` rotated queries.
        key_ring, value_ring: ``[1, Hkv, R, D]``.
        positions: ``[L]`` long, consecutive.

    Returns:
        ``[1, L, Hq, D]`` in the values' dtype.
    """
    R = key_ring.shape[2]
    top = positions[-1]
    slot_pos = top - torch.remainder(top - torch.arange(R, device=positions.device), R)
    delta = positions[:, None] - slot_pos[None, :]
    visible = (slot_pos[None, :] >= 0) & (delta >= 0) & (delta < window)
    _, hq, L, D = query.shape
    hkv = key_ring.shape[1]
    group = hq // hkv
    rows = query.reshape(1, hkv, group * L, D)
    scores = torch.matmul(rows, key_ring.transpose(-1, -2)).to(torch.promote_types(query.dtype, torch.float32))
    scores = (scores * scaling).masked_fill(~visible.repeat(group, 1), float("-inf"))
    probs = scores.softmax(-1).to(value_ring.dtype)
    return torch.matmul(probs, value_ring).reshape(1, hq, L, D).transpose(1, 2).contiguous()


__all__ = ["gelu_tanh_mul_reference", "ring_attention_reference"]
