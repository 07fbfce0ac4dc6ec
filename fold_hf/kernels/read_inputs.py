"""From a planned :class:`LayerRead` to the fused kernels' inputs.

The kernels (:func:`fold_hf.kernels.triton_fold.fold_read_triton` and its torch twin
:func:`fold_hf.kernels.reference.fold_read_geometry_reference`) take the geometry as numbers
(``T``, ``t``, ``D``, ``alpha``) instead of index lists and masks, queries already rotated (Lq rows: cheap in
torch), block keys already rotated, and cos/sin tables by which the kernel rotates window keys on the fly.
"""

from __future__ import annotations

import weakref

import torch

from ..modeling.read_plan import LayerRead
from ..modeling.rope import RotaryTables, compute_dtype

# rope tables per RotaryTables object and (device, dtype), grown by doubling so a growing context
# does not recompute them every round
_TABLES: "weakref.WeakKeyDictionary[RotaryTables, dict]" = weakref.WeakKeyDictionary()


def rope_tables(rope: RotaryTables, length: int, device: torch.device,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of positions ``0 .. >= length-1``, each ``[max_position, rotary_dim]`` (attention scaling in)."""
    per_rope = _TABLES.setdefault(rope, {})
    key = (torch.device(device), dtype)
    held = per_rope.get(key)
    if held is None or held[0].shape[0] < length:
        size = 1 << max(6, (max(length, 1) - 1).bit_length())
        positions = torch.arange(size, device=device)
        held = rope.cos_sin(positions, dtype=dtype)
        per_rope[key] = held
    return held


def kernel_supports(read: LayerRead) -> bool:
    """True when the read's membership is pure geometry (planned, true positions, not hand-edited)."""
    return bool(read.geometry_from_plan and read.true_positions and read.block_start is not None)


def read_kernel_inputs(
    query: torch.Tensor,
    context_keys: torch.Tensor,
    context_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    read: LayerRead,
    scaling: float,
) -> dict:
    """Keyword arguments of the fused kernels for one layer's read (batch 1).

    Args:
        query: ``[1, Hq, Lq, Dh]`` unrotated block queries.
        context_keys: ``[1, Hkv, T, Dh]`` unrotated context keys (a view of the cache buffer is fine).
        context_values: ``[1, Hkv, T, Dv]``.
        block_keys: ``[1, Hkv, Lq, Dh]`` unrotated block keys.
        block_values: ``[1, Hkv, Lq, Dv]``.
        read: a read from :func:`plan_layer_read` (:func:`kernel_supports` is True).
        scaling: logit scale.

    Returns:
        ``query_near``/``query_far`` ``[1, Hq, Lq, Dh]`` (``query.dtype``; ``query_far`` None without far
        memory), the context and block tensors (block keys rotated at their positions), ``cos``/``sin``
        ``[>= T, rd]``, ``context_length``, ``block_start``, ``window`` and ``alpha``.
    """
    if not kernel_supports(read):
        raise ValueError("this read's membership is not pure geometry (streaming or a custom region mask)")
    rope = read.rope
    dtype = query.dtype
    row_scale = torch.full((read.query_length, 1), float(scaling), dtype=compute_dtype(dtype), device=query.device)
    if read.query_scale is not None:
        row_scale = row_scale * read.query_scale.to(device=query.device, dtype=row_scale.dtype)[:, None]
    query_near = (rope.rotate(query, read.query_pos) * row_scale).to(dtype)
    query_far = None
    if read.far_stop > 0:
        query_far = (rope.rotate(query, read.far_distance, scale=rope.attention_scaling**2) * row_scale).to(dtype)
    cos, sin = rope_tables(rope, read.num_context, query.device, dtype=compute_dtype(dtype))
    return dict(
        query_near=query_near,
        query_far=query_far,
        context_keys=context_keys,
        context_values=context_values,
        block_keys=rope.rotate(block_keys, read.query_pos).to(dtype),
        block_values=block_values,
        cos=cos,
        sin=sin,
        context_length=read.num_context,
        block_start=read.block_start,
        window=read.window_distance,
        alpha=float(read.alpha),
    )
