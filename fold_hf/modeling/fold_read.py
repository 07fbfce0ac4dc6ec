"""The FOLD read of one layer from its planned geometry (:class:`~fold_hf.modeling.read_plan.LayerRead`).

* :func:`fold_attention_reference`: the read from the plan's index lists and masks in pure torch (the CPU path):
  the plan's key sets, rotations and masks handed to :func:`fold_hf.kernels.fold_read.naive.fold_read_masked`, the
  one statement of the read's math;
* :func:`fold_attention`: the single entry point the ``fold`` attention calls. On CUDA with Triton available it
  runs the fused kernel :func:`fold_hf.kernels.fold_read.triton.fold_read_triton` for every read whose membership is
  pure geometry: planned by ``plan_layer_read`` with true positions (``fold``, ``dflash``, ``window``,
  ``rerope``, ``yarn``, sliding layers), batch 1, bf16/fp16/fp32. Everything else (CPU tensors,
  ``streaming``'s renumbered positions, a custom region mask, fp64) runs :func:`fold_attention_reference`.
  Triton is never imported on the CPU path;
* :func:`read_kernel_inputs`: from a plan to the kernels' plain-tensor inputs. The kernels
  (:func:`~fold_hf.kernels.fold_read.triton.fold_read_triton` and its torch twin
  :func:`~fold_hf.kernels.fold_read.naive.fold_read_geometry_reference`) take the geometry as numbers (``T``, ``t``,
  ``D``, ``alpha``) instead of index lists and masks, queries already rotated (Lq rows: cheap in torch), block
  keys already rotated, and cos/sin tables by which the kernel rotates window keys on the fly.

This module is where plans meet kernels: :mod:`fold_hf.kernels` takes tensors and imports nothing from
:mod:`fold_hf.modeling`.
"""

from __future__ import annotations

import weakref

import torch

from ..kernels import KERNEL_DTYPES, triton_kernels_enabled
from ..kernels.common import compute_dtype
from ..kernels.fold_read.naive import fold_read_masked
from .read_plan import LayerRead
from .rope import RotaryTables


def fold_attention_reference(
    query: torch.Tensor,
    context_keys: torch.Tensor,
    context_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    read: LayerRead,
    scaling: float,
    return_lse: bool = False,
    context_keys_rotated: torch.Tensor | None = None,
):
    """FOLD read of one layer: the plan's key sets, rotations and masks, read by
    :func:`~fold_hf.kernels.fold_read.naive.fold_read_masked` (accumulating in fp32, fp64 for fp64 inputs).

    Args:
        query: ``[b, Hq, Lq, D]`` block queries, **unrotated** (after q_norm).
        context_keys: ``[b, Hkv, T, D]`` context keys, **unrotated** (after k_norm).
        context_values: ``[b, Hkv, T, Dv]``.
        block_keys: ``[b, Hkv, Lq, D]`` block keys, unrotated.
        block_values: ``[b, Hkv, Lq, Dv]``.
        read: the layer's geometry (:func:`fold_hf.modeling.read_plan.plan_layer_read`).
        scaling: logit scale, usually ``D ** -0.5``.
        return_lse: also return the merged log-mass ``[b, Hq, Lq]`` (for tests and kernels).
        context_keys_rotated: ``[b, Hkv, T, D]`` keys already rotated at their true positions under
            ``read.rope`` (the two-copy layout); used for the window branch when the read keeps true positions.

    Returns:
        ``[b, Lq, Hq, Dv]`` in ``query.dtype`` (and the log-mass when asked).
    """
    b, Hq, Lq, D = query.shape
    Hkv = context_keys.shape[1]
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of KV heads ({Hkv})")
    if context_keys.shape[2] != read.num_context or Lq != read.query_length:
        raise ValueError(
            f"read planned for T={read.num_context}, Lq={read.query_length}; got T={context_keys.shape[2]}, Lq={Lq}"
        )
    G = Hq // Hkv
    rope = read.rope
    acc = compute_dtype(query.dtype)
    q = query.to(acc).view(b, Hkv, G, Lq, D)
    row_scale = scaling if read.query_scale is None else scaling * read.query_scale.to(acc)[:, None]

    # window branch: selected context keys and the block keys, each at its position
    if context_keys_rotated is not None and read.true_positions:
        near_k = context_keys_rotated[:, :, read.near_index].to(acc)
    else:
        near_k = rope.rotate(context_keys[:, :, read.near_index], read.near_key_pos)
    near_k = torch.cat((near_k, rope.rotate(block_keys, read.query_pos)), dim=2)
    near_v = torch.cat((context_values[:, :, read.near_index], block_values), dim=2).to(acc)
    block_cols = torch.ones(Lq, Lq, dtype=torch.bool, device=query.device)
    near_mask = torch.cat((read.near_mask, block_cols), dim=1)
    far = None
    if read.far_stop > 0:
        # far keys sit unrotated; the query carries the whole distance D + r and both rope scalings
        far = (rope.rotate(q, read.far_distance, scale=rope.attention_scaling**2),
               context_keys[:, :, : read.far_stop].to(acc), context_values[:, :, : read.far_stop].to(acc),
               read.far_mask)
    out, lse = fold_read_masked(rope.rotate(q, read.query_pos), near_k, near_v, near_mask, row_scale, far,
                                read.alpha)

    out = out.reshape(b, Hq, Lq, -1).transpose(1, 2).to(query.dtype)
    if return_lse:
        return out, lse.reshape(b, Hq, Lq)
    return out


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


def read_kernel_inputs(query: torch.Tensor, context_keys: torch.Tensor, context_values: torch.Tensor,
                       block_keys: torch.Tensor, block_values: torch.Tensor, read: LayerRead, scaling: float) -> dict:
    """Keyword arguments of the fused kernels for one layer's read (batch 1).

    Args: as :func:`fold_attention_reference`, with ``b = 1`` (the context tensors may be views of the cache
    buffer) and a read from :func:`plan_layer_read` for which :func:`kernel_supports` is True.

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


def triton_read_applies(query: torch.Tensor, context_keys: torch.Tensor, read: LayerRead) -> bool:
    """True when :func:`fold_attention` runs this read with the Triton kernel."""
    if query.shape[0] != 1 or query.dtype not in KERNEL_DTYPES or read.num_context == 0:
        return False
    return kernel_supports(read) and triton_kernels_enabled(query.device)


def fold_attention(query: torch.Tensor, context_keys: torch.Tensor, context_values: torch.Tensor,
                   block_keys: torch.Tensor, block_values: torch.Tensor, read: LayerRead, scaling: float,
                   context_keys_rotated: torch.Tensor | None = None) -> torch.Tensor:
    """FOLD read of one layer; shapes as in :func:`fold_attention_reference`. Returns ``[b, Lq, Hq, Dv]``.

    Set ``FOLD_HF_DISABLE_TRITON=1`` to force the reference on CUDA.
    """
    if triton_read_applies(query, context_keys, read):
        from ..kernels.fold_read.triton import fold_read_triton

        return fold_read_triton(**read_kernel_inputs(query, context_keys, context_values, block_keys, block_values,
                                                     read, scaling))
    return fold_attention_reference(query, context_keys, context_values, block_keys, block_values, read, scaling,
                                    context_keys_rotated=context_keys_rotated)
