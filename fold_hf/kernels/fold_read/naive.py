"""Pure-torch twins of the attention kernels in :mod:`fold_hf.kernels.fold_read.triton`, on plain tensors.

* :func:`fold_read_masked`: the FOLD read from explicit key sets and masks, the one statement of its math in the
  package (the read from a planned ``LayerRead``, :func:`fold_hf.modeling.fold_read.fold_attention_reference`,
  builds those sets from the plan's index lists and calls it);
* :func:`fold_read_geometry_reference`: the FOLD read given as numbers (``T``, ``t``, ``D``, ``alpha``), rotated
  queries and cos/sin tables, exactly what ``fold_read_triton`` takes (sets and masks from the geometry, then
  :func:`fold_read_masked`);
* :func:`decode_attention_reference`: the target's verify attention (``decode_attention_triton``).

Math (docs/design.md §2, paper Eqs. 1-4), per block row r and head h:

    window:  s_j = (R_{p_r} q) . (R_{pos_j} k_j) * scaling            j in N_r (and all block rows)
             lse_N = logsumexp(s),  o_N = softmax(s) V
    far:     s~_j = (R_{D+r} q) . k_j * scaling                         j in F_r, k_j unrotated
             o_F = softmax(alpha s~) V,  log Z_F = logsumexp(alpha s~) / alpha
    merge:   o = o_N + sigmoid(log Z_F - lse_N) (o_F - o_N)              (o = o_N when F_r is empty)

The twins accumulate in fp32 whatever the input dtype (fp64 for fp64; :func:`fold_read_masked` computes in the
dtype its callers cast to). This module takes tensors only and imports nothing from :mod:`fold_hf.modeling`.
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


def fold_read_masked(
    query_near: torch.Tensor,
    near_keys: torch.Tensor,
    near_values: torch.Tensor,
    near_mask: torch.Tensor,
    row_scale,
    far: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    alpha: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FOLD read (the equations above) from explicit key sets and masks, in the inputs' dtype.

    Args:
        query_near: ``[b, Hkv, G, Lq, Dh]`` queries rotated at their positions (G query heads per KV head).
        near_keys: ``[b, Hkv, N, Dh]`` window keys rotated at their positions, block keys included.
        near_values: ``[b, Hkv, N, Dv]``.
        near_mask: ``[Lq, N]`` bool, True where row r reads entry j in its window.
        row_scale: logit scale, a float or ``[Lq, 1]``.
        far: ``(query_far [b, Hkv, G, Lq, Dh], far_keys [b, Hkv, F, Dh], far_values [b, Hkv, F, Dv],
            far_mask [Lq, F])``: queries rotated at the far distance, unrotated keys; None = no far memory.
        alpha: far concentration (``math.inf`` = top-1 read).

    Returns:
        ``(out [b, Hkv, G, Lq, Dv], lse [b, Hkv, G, Lq])``: the merged output and log-mass.
    """
    s_near = grouped_logits(query_near, near_keys) * row_scale
    s_near = s_near.masked_fill(~near_mask, -math.inf)
    lse_near = torch.logsumexp(s_near, dim=-1)
    o_near = grouped_values(torch.exp(s_near - lse_near[..., None]), near_values)
    if far is None:
        return o_near, lse_near
    query_far, far_keys, far_values, far_mask = far
    s_far = grouped_logits(query_far, far_keys) * row_scale
    s_far = s_far.masked_fill(~far_mask, -math.inf)
    has_far = far_mask.any(dim=-1)  # [Lq]
    if math.isinf(alpha):
        top = s_far.argmax(dim=-1, keepdim=True)
        log_mass_far = s_far.gather(-1, top).squeeze(-1)
        weights = torch.zeros_like(s_far).scatter_(-1, top, 1.0)
    else:
        scaled = s_far * alpha
        lse_scaled = torch.logsumexp(scaled, dim=-1)
        log_mass_far = lse_scaled / alpha
        # a row without far entries has lse -inf: exp(-inf - 0) = 0 weights instead of NaN (no NaN pass over the
        # weights, whose o_far the merge then multiplies by w_far = 0)
        weights = torch.exp(scaled - torch.where(has_far, lse_scaled, torch.zeros_like(lse_scaled))[..., None])
    o_far = grouped_values(weights, far_values)
    w_far = torch.sigmoid(log_mass_far - lse_near)
    w_far = torch.where(has_far, w_far, torch.zeros_like(w_far))
    out = o_near + w_far[..., None] * (o_far - o_near)
    return out, torch.where(has_far, torch.logaddexp(lse_near, log_mass_far), lse_near)


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
    """The fused kernels' contract in plain torch (the CPU oracle of :func:`fold_read_triton`): the geometry
    turned into key sets and masks, then :func:`fold_read_masked`.

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
    keys = context_keys[:, :, :T].to(acc)
    values = context_values[:, :, :T].to(acc)
    keys_at_positions = rotate_by_tables(keys, cos[:T].to(acc), sin[:T].to(acc))
    dist = (t + torch.arange(Lq, device=keys.device))[:, None] - torch.arange(T, device=keys.device)[None, :]
    in_window = torch.ones_like(dist, dtype=torch.bool) if window is None else dist < window
    near_mask = torch.cat((in_window, torch.ones(Lq, Lq, dtype=torch.bool, device=dist.device)), dim=1)
    far = None
    if query_far is not None:
        far = (query_far.to(acc).view(1, Hkv, G, Lq, Dh), keys, values, ~in_window)
    out, _ = fold_read_masked(
        query_near.to(acc).view(1, Hkv, G, Lq, Dh), torch.cat((keys_at_positions, block_keys.to(acc)), dim=2),
        torch.cat((values, block_values.to(acc)), dim=2), near_mask, 1.0, far, alpha)
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
