"""The ``"fold"`` attention and mask registered with transformers.

``AttentionInterface`` entry ``"fold"``: called with a ``fold_read`` keyword (a :class:`LayerRead`), it
performs the FOLD read over unrotated keys; called without one (an ordinary model that selected
``attn_implementation="fold"``), it is plain SDPA, so the name is safe to set anywhere.

``AttentionMaskInterface`` entry ``"fold"``: with ``fold_read`` it returns the region mask
``[1, 1, Lq, T + Lq]`` (0 not read, 1 window branch, 2 far branch); without, it is ``sdpa_mask``.
The attention reads near/far membership from that mask, so a mask function registered in its place
changes what the drafter reads.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .read_plan import REGION_FAR, REGION_NEAR, LayerRead

FOLD_ATTENTION = "fold"


def fold_mask(*args, fold_read: LayerRead | None = None, **kwargs):
    """Mask function of ``"fold"``: the region mask of ``fold_read``, else transformers' ``sdpa_mask``."""
    if fold_read is None:
        return sdpa_mask(*args, **kwargs)
    return fold_read.region_mask()[None, None]


def read_from_region(read: LayerRead, region: torch.Tensor) -> LayerRead:
    """``read`` with its near/far membership taken from a region mask ``[.., Lq, T + Lq]``."""
    region = region.reshape(region.shape[-2], region.shape[-1])
    T = read.num_context
    if region.shape != (read.query_length, T + read.query_length):
        raise ValueError(f"region mask of shape {tuple(region.shape)} does not fit T={T}, Lq={read.query_length}")
    near_mask = region[:, read.near_index] == REGION_NEAR
    far_mask = region[:, : read.far_stop] == REGION_FAR
    if not bool(torch.all(region[:, T:] == REGION_NEAR)):
        raise ValueError("the block must read itself: block columns of the region mask must all be 1")
    return dataclasses.replace(read, near_mask=near_mask, far_mask=far_mask)


def fold_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    fold_read: LayerRead | None = None,
    block_keys: torch.Tensor | None = None,
    block_values: torch.Tensor | None = None,
    context_keys_rotated: torch.Tensor | None = None,
    **kwargs,
):
    """transformers attention signature; see the module docstring.

    With ``fold_read``: ``query [b, Hq, Lq, D]`` unrotated, ``key``/``value`` ``[b, Hkv, T, D]`` unrotated
    context entries, ``block_keys``/``block_values`` ``[b, Hkv, Lq, D]`` unrotated block entries (passed
    apart so the cache is never copied), ``attention_mask`` a region mask or None (geometry of
    ``fold_read``). Returns ``([b, Lq, Hq, D], None)``.
    """
    if fold_read is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if dropout:
        raise ValueError("FOLD attention has no dropout (drafters run in inference)")
    if block_keys is None or block_values is None:
        raise ValueError("FOLD attention needs block_keys and block_values")
    from .fold_read import fold_attention

    read = fold_read if attention_mask is None else read_from_region(fold_read, attention_mask)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = fold_attention(query, key, value, block_keys, block_values, read, scaling,
                         context_keys_rotated=context_keys_rotated)
    return out, None


def plain_attention(module, impl: str, query, ctx_k, ctx_v, blk_k, blk_v, read: LayerRead, scaling: float):
    """Run a read with true positions through any other registered attention (``sdpa``, ``eager``, ...).

    Only reads without a far branch or query scaling qualify (the ``dflash`` mode, sliding layers as released).
    """
    if read.far_stop or read.query_scale is not None:
        raise ValueError(
            f"attn_implementation={impl!r} can only run mode 'dflash'; FOLD reads need attn_implementation='fold'"
        )
    rope = read.rope
    k = torch.cat((rope.rotate(ctx_k[:, :, read.near_index], read.near_key_pos), rope.rotate(blk_k, read.query_pos)), 2)
    v = torch.cat((ctx_v[:, :, read.near_index], blk_v), dim=2)
    q = rope.rotate(query, read.query_pos)
    mask = None
    if not bool(read.near_mask.all()):
        visible = torch.cat((read.near_mask, torch.ones_like(read.near_mask[:, :1]).expand(-1, query.shape[2])), 1)
        mask = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, -math.inf)[None, None]
    dtype = query.dtype
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    attention = ALL_ATTENTION_FUNCTIONS.get_interface(impl, eager_attention_forward)
    out, _ = attention(module, q.to(dtype), k.to(dtype), v.to(dtype),
                                           None if mask is None else mask.to(dtype), scaling=scaling, dropout=0.0,
                                           is_causal=False)
    return out


def register() -> None:
    """Register ``"fold"`` with transformers' attention and mask interfaces (idempotent; called by
    :func:`fold_hf.integrations.transformers.install`, which creating a FoldDrafter runs)."""
    AttentionInterface.register(FOLD_ATTENTION, fold_attention_forward)
    AttentionMaskInterface.register(FOLD_ATTENTION, fold_mask)


def drafter_read(module, query, ctx_k, ctx_v, blk_k, blk_v, read: LayerRead, scaling: float,
                 context_keys_rotated: torch.Tensor | None = None) -> torch.Tensor:
    """One drafter layer's read through the attention implementation its config selects; ``[b, Lq, Hq, D]``."""
    impl = getattr(module.config, "_attn_implementation", None) or FOLD_ATTENTION
    if impl != FOLD_ATTENTION:
        return plain_attention(module, impl, query, ctx_k, ctx_v, blk_k, blk_v, read, scaling)
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS[FOLD_ATTENTION]
    # our own mask function only restates the read's geometry: skip materializing it
    mask = None if mask_fn is fold_mask else mask_fn(fold_read=read)
    out, _ = ALL_ATTENTION_FUNCTIONS[FOLD_ATTENTION](
        module, query, ctx_k, ctx_v, mask, scaling=scaling, fold_read=read, block_keys=blk_k, block_values=blk_v,
        context_keys_rotated=context_keys_rotated,
    )
    return out

