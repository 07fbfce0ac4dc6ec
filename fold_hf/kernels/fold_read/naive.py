"""Pure-torch twins of the attention kernels in :mod:`fold_hf.kernels.fold_read.triton`, on plain tensors.

* :func:`fold_read_geometry_reference`: the FOLD read given as numbers (``T``, ``t``, ``D``, ``alpha``), rotated
  queries and cos/sin tables, exactly what ``fold_read_triton`` takes;
* :func:`decode_attention_reference`: the target's verify attention (``decode_attention_triton``).

Math (docs/design.md §2, paper Eqs. 1-4), per block row r and head h:

    window:  s_j = (R_{p_r} q) . (R_{pos_j} k_j) * scaling            j in N_r (and all block rows)
             lse_N = logsumexp(s),  o_N = softmax(s) V
    far:     s~_j = (R_{D+r} q) . k_j * scaling                         j in F_r, k_j unrotated
             o_F = softmax(alpha s~) V,  log Z_F = logsumexp(alpha s~) / alpha
    merge:   o = o_N + sigmoid(log Z_F - lse_N) (o_F - o_N)              (o = o_N when F_r is empty)

Everything accumulates in fp32 whatever the input dtype. This module takes tensors only and imports nothing from
:mod:`fold_hf.modeling`; the read from a planned ``LayerRead`` (index lists and masks, the oracle of these twins)
is :func:`fold_hf.modeling.fold_read.fold_attention_reference`.
"""

from __future__ import annotations

import math

import torch

from ..common import compute_dtype, rotate_half


def grouped_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q ``[b, Hkv, G, Lq, D]`` x k ``[b, Hkv, N, D]`` -> ``[b, Hkv, G, Lq, N]`` (GQA without repeating keys).

    The G query heads of a KV head are stacked as ``G * Lq`` rows of one product, so the keys are read in place
    (a broadcast ``matmul`` against ``k[:, :, None]`` would first copy them G times)."""
    b, Hkv, G, Lq, D = q.shape
    return torch.matmul(q.reshape(b, Hkv, G * Lq, D), k.transpose(-1, -2)).view(b, Hkv, G, Lq, k.shape[-2])


def grouped_values(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """weights ``[b, Hkv, G, Lq, N]`` x v ``[b, Hkv, N, Dv]`` -> ``[b, Hkv, G, Lq, Dv]`` (values read in place, as
    :func:`grouped_logits` reads the keys)."""
    b, Hkv, G, Lq, N = weights.shape
    return torch.matmul(weights.reshape(b, Hkv, G * Lq, N), v).view(b, Hkv, G, Lq, v.shape[-1])


def rotate_by_tables(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., N, Dh]`` by per-row tables ``cos``/``sin`` ``[N, rd]`` (rotate_half layout) in
    ``cos.dtype``; channels past ``rd`` pass through."""
    x = x.to(cos.dtype)
    rd = cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


def fold_read_geometry_reference(
    query_near: torch.Tensor,
    query_far: torch.Tensor | None,
    context_keys: torch.Tensor,
    context_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    context_length,
    block_start,
    window: int | None,
    alpha: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """The fused kernels' contract in plain torch (the CPU oracle of :func:`fold_read_triton`).

    Membership comes from geometry alone: row ``r`` sits at ``p = t + r``; context entry ``j < T`` is in its
    window iff ``window is None or p - j < window``, else in its far memory when ``query_far`` is given.

    Args:
        query_near: ``[1, Hq, Lq, Dh]`` queries rotated at ``p`` and multiplied by the row's logit scale.
        query_far: ``[1, Hq, Lq, Dh]`` queries rotated at distance ``window + r`` (cos/sin scaled by
            attention_scaling squared), scaled like ``query_near``; None = no far memory.
        context_keys: ``[1, Hkv, capacity, Dh]`` unrotated keys; entries ``>= context_length`` are ignored.
        context_values: ``[1, Hkv, capacity, Dv]``.
        block_keys: ``[1, Hkv, Lq, Dh]`` block keys already rotated at ``p``.
        block_values: ``[1, Hkv, Lq, Dv]``.
        cos, sin: ``[max_position, rd]`` tables (rotate_half layout, attention scaling folded in); the first
            ``rd`` channels of a context key are rotated at its position ``j``, the rest pass through.
        context_length: T (int or one-element tensor).
        block_start: t (int or one-element tensor), ``t >= T``.
        window: D, or None for every entry in the window.
        alpha: far concentration (``math.inf`` = top-1 read).
        num_splits: ignored (kernel tuning).

    Returns:
        ``[1, Lq, Hq, Dv]`` in ``query_near.dtype``.
    """
    del num_splits
    T, t = int(context_length), int(block_start)
    _, Hq, Lq, Dh = query_near.shape
    Hkv = context_keys.shape[1]
    G = Hq // Hkv
    acc = compute_dtype(query_near.dtype)
    q_near = query_near.to(acc).view(Hkv, G, Lq, Dh)
    keys = context_keys[0, :, :T].to(acc)
    values = context_values[0, :, :T].to(acc)
    keys_at_positions = rotate_by_tables(keys, cos[:T].to(acc), sin[:T].to(acc))
    dist = (t + torch.arange(Lq, device=keys.device))[:, None] - torch.arange(T, device=keys.device)[None, :]
    in_window = torch.ones_like(dist, dtype=torch.bool) if window is None else dist < window

    s_near = torch.cat((grouped_logits(q_near[None], keys_at_positions[None])[0],
                        grouped_logits(q_near[None], block_keys[:, :].to(acc))[0]), dim=-1)
    near_mask = torch.cat((in_window, torch.ones(Lq, Lq, dtype=torch.bool, device=dist.device)), dim=1)
    s_near = s_near.masked_fill(~near_mask, -math.inf)
    lse_near = torch.logsumexp(s_near, dim=-1)
    near_values = torch.cat((values, block_values[0].to(acc)), dim=1)  # [Hkv, T + Lq, Dv]
    out = grouped_values(torch.softmax(s_near, dim=-1)[None], near_values[None])[0]

    if query_far is not None:
        far_mask = ~in_window
        has_far = far_mask.any(dim=-1)  # [Lq]
        s_far = grouped_logits(query_far.to(acc).view(1, Hkv, G, Lq, Dh), keys[None])[0]
        s_far = s_far.masked_fill(~far_mask, -math.inf)
        if math.isinf(alpha):
            top = s_far.argmax(dim=-1, keepdim=True)
            log_mass_far = s_far.gather(-1, top).squeeze(-1)
            weights = torch.zeros_like(s_far).scatter_(-1, top, 1.0)
        else:
            log_mass_far = torch.logsumexp(alpha * s_far, dim=-1) / alpha
            weights = torch.softmax(alpha * s_far, dim=-1)
        o_far = grouped_values(torch.nan_to_num(weights)[None], values[None])[0]
        w_far = torch.where(has_far, torch.sigmoid(log_mass_far - lse_near), torch.zeros_like(lse_near))
        out = out + w_far[..., None] * (torch.nan_to_num(o_far) - out)
    return out.reshape(Hq, Lq, -1).transpose(0, 1)[None].to(query_near.dtype)


def decode_attention_reference(
    query: torch.Tensor,
    context_keys: torch.Tensor,
    context_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    context_length,
    scaling: float = 1.0,
    num_splits: int | None = None,
    max_context_length: int | None = None,
) -> torch.Tensor:
    """The contract of :func:`fold_hf.kernels.fold_read.triton.decode_attention_triton` in plain torch.

    Causal attention of a block of ``L`` rotated queries at positions ``T .. T + L - 1`` over the cache prefix
    ``[0, T)`` followed by the block itself (row ``r`` sees block keys ``0 .. r``). A tensor length is read
    on the device (the cache is masked, never sliced), so the static engine runs it without a host sync.

    Args:
        query: ``[1, Hq, L, Dh]`` rotated queries.
        context_keys: ``[1, Hkv, capacity, Dh]`` rotated keys; entries ``>= context_length`` are ignored.
        context_values: ``[1, Hkv, capacity, Dv]``.
        block_keys: ``[1, Hkv, L, Dh]`` rotated block keys; block_values ``[1, Hkv, L, Dv]``.
        context_length: T, an int or a one-element integer tensor.
        scaling: logit scale.
        num_splits, max_context_length: ignored (kernel tuning); with an int ``context_length`` only the
            prefix ``[0, T)`` is read.

    Returns:
        ``[1, L, Hq, Dv]`` in ``query.dtype``.
    """
    del num_splits, max_context_length
    _, Hq, L, Dh = query.shape
    Hkv = context_keys.shape[1]
    G = Hq // Hkv
    acc = compute_dtype(query.dtype)
    device = query.device
    if isinstance(context_length, torch.Tensor):
        keys, values = context_keys[0], context_values[0]
        valid = torch.arange(keys.shape[1], device=device) < context_length.reshape(-1)[:1].to(device)
    else:
        keys, values = context_keys[0, :, : int(context_length)], context_values[0, :, : int(context_length)]
        valid = torch.ones(keys.shape[1], dtype=torch.bool, device=device)
    q = query.to(acc).reshape(Hkv, G, L, Dh) * scaling
    s_ctx = grouped_logits(q[None], keys.to(acc)[None])[0].masked_fill(~valid, -math.inf)
    s_blk = grouped_logits(q[None], block_keys.to(acc))[0]
    causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    s_blk = s_blk.masked_fill(~causal, -math.inf)
    probs = torch.softmax(torch.cat((s_ctx, s_blk), dim=-1), dim=-1)
    all_values = torch.cat((values, block_values[0]), dim=1).to(acc)  # [Hkv, T + L, Dv]
    out = grouped_values(probs[None], all_values[None])[0]  # [Hkv, G, L, Dv]
    return out.reshape(Hq, L, -1).transpose(0, 1)[None].to(query.dtype)
