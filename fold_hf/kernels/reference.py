"""Pure-torch FOLD read: the oracle for every kernel and the CPU path.

Math (DESIGN §2, paper Eqs. 1-4), per block row r and head h:

    window:  s_j = (R_{p_r} q) . (R_{pos_j} k_j) * scaling            j in N_r (and all block rows)
             lse_N = logsumexp(s),  o_N = softmax(s) V
    far:     s~_j = (R_{D+r} q) . k_j * scaling                         j in F_r, k_j unrotated
             o_F = softmax(alpha s~) V,  log Z_F = logsumexp(alpha s~) / alpha
    merge:   o = o_N + sigmoid(log Z_F - lse_N) (o_F - o_N)              (o = o_N when F_r is empty)

Everything accumulates in fp32 whatever the input dtype. GQA packs the ``Hq / Hkv`` query heads of one
KV head together instead of repeating keys.
"""

from __future__ import annotations

import math

import torch

from ..modeling.read_plan import LayerRead
from ..modeling.rope import compute_dtype


def _grouped_logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q ``[b, Hkv, G, Lq, D]`` x k ``[b, Hkv, N, D]`` -> ``[b, Hkv, G, Lq, N]``."""
    return torch.matmul(q, k.unsqueeze(2).transpose(-1, -2))


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
    """FOLD read of one layer.

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
    q_near = rope.rotate(q, read.query_pos)
    s_near = _grouped_logits(q_near, near_k) * row_scale
    block_cols = torch.ones(Lq, Lq, dtype=torch.bool, device=query.device)
    near_mask = torch.cat((read.near_mask, block_cols), dim=1)
    s_near = s_near.masked_fill(~near_mask, -math.inf)
    lse_near = torch.logsumexp(s_near, dim=-1)
    o_near = torch.matmul(torch.exp(s_near - lse_near[..., None]), near_v.unsqueeze(2))

    out, lse = o_near, lse_near
    if read.far_stop > 0:
        far_k = context_keys[:, :, : read.far_stop].to(acc)
        far_v = context_values[:, :, : read.far_stop].to(acc)
        # the key sits unrotated; the query carries the whole distance D + r and both rope scalings
        q_far = rope.rotate(q, read.far_distance, scale=rope.attention_scaling**2)
        s_far = _grouped_logits(q_far, far_k) * row_scale
        s_far = s_far.masked_fill(~read.far_mask, -math.inf)
        has_far = read.far_mask.any(dim=-1)  # [Lq]
        if math.isinf(read.alpha):
            top = s_far.argmax(dim=-1, keepdim=True)
            log_mass_far = s_far.gather(-1, top).squeeze(-1)
            weights = torch.zeros_like(s_far).scatter_(-1, top, 1.0)
        else:
            scaled = s_far * read.alpha
            lse_scaled = torch.logsumexp(scaled, dim=-1)
            log_mass_far = lse_scaled / read.alpha
            weights = torch.exp(scaled - lse_scaled[..., None])
        o_far = torch.matmul(torch.nan_to_num(weights), far_v.unsqueeze(2))
        w_far = torch.sigmoid(log_mass_far - lse_near)
        w_far = torch.where(has_far, w_far, torch.zeros_like(w_far))
        out = o_near + w_far[..., None] * (o_far - o_near)
        lse = torch.where(has_far, torch.logaddexp(lse_near, log_mass_far), lse_near)

    out = out.reshape(b, Hq, Lq, -1).transpose(1, 2).to(query.dtype)
    if return_lse:
        return out, lse.reshape(b, Hq, Lq)
    return out
