"""DFlash training objective, many anchors of one sequence in one drafter forward.

Recipe (docs/design.md §7): pick random anchors a; the block is ``[x_a, mask, ..., mask]`` at positions
``a .. a+B-1``; slot k predicts ``x_{a+k}``; the block reads the context strictly before the anchor
(features of positions ``0 .. a-1``) at true positions, and itself bidirectionally; slot k's loss
weight is ``exp(-(k-1)/gamma)``. All anchors of a sequence share one forward: queries of every block
are stacked and a boolean mask keeps each block to its own context prefix and its own slots. This is
the ``dflash`` read of :class:`~fold_hf.modeling.FoldDrafter` written for training; tests check that
it matches the inference forward anchor by anchor.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .modeling.drafter import FoldDrafter, execution_device


def block_training_mask(anchors: torch.Tensor, seq_len: int, block: int) -> torch.Tensor:
    """``[..., n*B, L + n*B]`` bool: block i reads context ``j < anchors[..., i]`` and its own B slots.

    ``anchors`` is ``[n]`` (one sequence) or ``[b, n]`` (a batch, one mask per sequence)."""
    n = anchors.shape[-1]
    device = anchors.device
    rows = torch.arange(n * block, device=device) // block  # block of each query row
    ctx = torch.arange(seq_len, device=device) < anchors[..., rows, None]
    own = rows[:, None] == (torch.arange(n * block, device=device) // block)[None, :]
    return torch.cat((ctx, own.expand(*anchors.shape[:-1], -1, -1)), dim=-1)


def drafter_block_hidden(drafter: FoldDrafter, features: torch.Tensor, block_embeds: torch.Tensor,
                         anchors: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Final hidden states of many blocks of one or several sequences at once.

    Args:
        features: ``[b, L, n_taps * H]`` target taps of the whole sequences.
        block_embeds: ``[b, n * B, H]`` embeddings of the stacked blocks.
        anchors: ``[b, n]`` anchor indices (block i of sequence s holds ``anchors[s, i] .. + B - 1``);
            ``[n]`` when ``b = 1``.
        positions: ``[b, L]`` (or ``[L]``) the drafter's rope positions of the context entries, increasing;
            ``None``: ``0 .. L - 1``. Block i's slots sit at ``positions[s, anchors[s, i]] + 0 .. B - 1``. What
            the mask reads is decided by indices, so only the distances the rope (and a sliding layer's window)
            sees change (:func:`spread_positions`; not checked here: that would cost a host sync a step).

    Returns:
        ``[b, n * B, H]`` after the final norm.
    """
    B = drafter.block_size
    b, L = features.shape[:2]
    anchors = anchors.reshape(b, -1)
    context = drafter.context_features(features)
    hidden = block_embeds.to(context.dtype)
    if positions is None:
        positions = torch.arange(L, device=anchors.device).expand(b, -1)
    positions = positions.to(anchors.device).reshape(-1, L).expand(b, L)  # [L] or [1, L]: one row for all
    start = positions.gather(1, anchors)  # [b, n] position of each anchor (slot 0)
    q_pos = (start[:, :, None] + torch.arange(B, device=anchors.device)).reshape(b, -1)  # [b, n*B]
    k_pos = torch.cat((positions, q_pos), dim=1)  # [b, L + n*B]
    mask = block_training_mask(anchors, L, B)[:, None]  # [b, 1, n*B, L + n*B]
    rope = drafter.rope

    def read(attn, q, k_ctx, v_ctx, k_blk, v_blk):  # the block mask's read (DrafterAttention.forward's read)
        k, v = torch.cat((k_ctx, k_blk), dim=2), torch.cat((v_ctx, v_blk), dim=2)
        layer_mask = mask
        if attn.sliding_window is not None:
            layer_mask = mask & ((q_pos[:, None, :, None] - k_pos[:, None, None, :]) < attn.sliding_window)
        q = rope.rotate(q, q_pos[:, None]).to(hidden.dtype)
        k = rope.rotate(k, k_pos[:, None]).to(hidden.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=layer_mask, scale=attn.scaling,
                                             enable_gqa=attn.num_key_value_groups > 1)
        return out.transpose(1, 2)  # [b, n*B, Hq, D]

    for layer in drafter.layers:
        hidden = layer(hidden, context, read)
    return drafter.norm(hidden)


def spread_positions(seq_len: int, span: int, count: int = 1,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """``[count, seq_len]`` rope positions that spread a ``seq_len``-token window over ``span`` positions
    (positional skip-wise training, PoSE: Zhu et al., 2023): each row cuts the window at a uniform point
    ``c`` in ``[1, seq_len - 1]`` and moves everything from ``c`` on by a uniform skip ``s`` in
    ``[0, span - seq_len]``, so index ``j`` sits at ``j + s * (j >= c)``. The drafter then sees distances up to
    ``span - 1`` between the entries it reads and its block while no window holds more than ``seq_len`` tokens.
    ``span <= seq_len`` gives ``0 .. seq_len - 1`` on every row."""
    rows = torch.arange(seq_len).expand(count, -1)
    if span <= seq_len or seq_len < 2:
        return rows.clone()
    cut = torch.randint(1, seq_len, (count, 1), generator=generator)
    skip = torch.randint(0, span - seq_len + 1, (count, 1), generator=generator)
    return rows + skip * (rows >= cut)


def sample_anchors(seq_len: int, block: int, count: int, generator: torch.Generator | None = None,
                   min_context: int = 1) -> torch.Tensor:
    """``count`` distinct anchors in ``[min_context, seq_len - 2]`` (each predicts at least one token)."""
    high = seq_len - 1
    if high <= min_context:
        raise ValueError(f"sequence of {seq_len} tokens is too short for anchors with {min_context} context")
    count = min(count, high - min_context)
    return (torch.randperm(high - min_context, generator=generator)[:count] + min_context).sort().values


def slot_target_logits(target_logits: torch.Tensor, anchors: torch.Tensor, block: int) -> torch.Tensor:
    """``[b, n, B - 1, V]``: the target's logits for the token of slot k of block i, i.e. at position
    ``anchors[s, i] + k - 1`` (logits at position p predict token p + 1), clamped to the sequence's last position.

    ``target_logits`` is ``[b, L, V]``; ``anchors`` ``[b, n]`` (``[n]`` when ``b = 1``)."""
    b, L = target_logits.shape[:2]
    anchors = anchors.reshape(b, -1)
    pos = (anchors[:, :, None] + torch.arange(block - 1, device=anchors.device)).clamp_max(L - 1)  # a + k - 1
    return target_logits[torch.arange(b, device=anchors.device)[:, None, None], pos]


def dflash_loss(drafter: FoldDrafter, features: torch.Tensor, labels: torch.Tensor, anchors: torch.Tensor,
                gamma: float = 4.0, target_logits: torch.Tensor | None = None,
                kl: float = 0.0, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """Weighted cross-entropy of the DFlash recipe on one sequence or a batch of them (one drafter forward).

    Args:
        features: ``[b, L, n_taps * H]`` target taps of ``labels``.
        labels: ``[b, L]`` token ids (the target's own continuation, or text labelled by it).
        anchors: ``[b, n]`` positions (``[n]`` when ``b = 1``); slot k of block i of sequence s is trained on
            ``labels[s, anchors[s, i] + k]`` when inside L.
        gamma: decay of the slot weights ``exp(-(k-1)/gamma)``.
        target_logits: ``[b, L, V]`` the target's logits over ``labels`` (needed when ``kl > 0``).
        kl: weight of the distillation term: per slot ``KL(p_target || q_drafter)`` at temperature 1, with the
            target's distribution the one it gives for that slot's token (:func:`slot_target_logits`), weighted
            and averaged like the cross-entropy and added to it (``loss = CE + kl * KL``).
        positions: ``[b, L]`` the drafter's rope positions of the sequences (:func:`drafter_block_hidden`);
            ``None``: ``0 .. L - 1``. The targets are the same tokens whatever the positions.

    Returns:
        (loss, info): the loss is each sequence's weighted mean over its slots, averaged over the ``b``
        sequences (so a batch equals the mean of its sequences' losses); ``info["accuracy"]`` is the per-slot
        top-1 accuracy over all blocks, a ``[B - 1]`` tensor left on the device (no host sync per step).
    """
    if getattr(drafter, "is_deepspec", False):
        raise ValueError("dflash_loss trains the z-lab DFlash layout (slot 0 carries the anchor, the target's "
                         "lm_head); a DeepSpec drafter's anchor slot predicts and it has its own heads")
    B = drafter.block_size
    b, L = labels.shape
    anchors = anchors.reshape(b, -1)
    n = anchors.shape[1]
    device = labels.device
    slots = torch.arange(B, device=device)
    pos = anchors[:, :, None] + slots  # [b, n, B]
    ids = torch.full_like(pos, drafter.config.mask_token_id)
    ids[:, :, 0] = labels.gather(1, anchors)
    # a device-mapped target may keep its embedding, the drafter and its lm_head on three devices
    embeds = drafter.target_embedding(ids.reshape(b, -1)).detach().to(features.device)
    hidden = drafter_block_hidden(drafter, features, embeds, anchors, positions)
    hidden = hidden.view(b, n, B, -1)[:, :, 1:]
    head = drafter.target_lm_head
    logits = head(hidden.to(execution_device(head), head.weight.dtype)).float().to(device)  # [b, n, B-1, V]
    target_pos = pos[:, :, 1:]
    valid = target_pos < L
    target_ids = labels.gather(1, target_pos.clamp_max(L - 1).reshape(b, -1)).view(b, n, B - 1)
    weights = torch.exp(-(slots[1:].float() - 1) / gamma) * valid  # [b, n, B-1]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1), reduction="none")
    per_slot = ce.view(b, -1)
    info: dict = {}
    if kl:
        if target_logits is None:
            raise ValueError("kl > 0 needs the target's logits (target_logits)")
        t = slot_target_logits(target_logits.to(device), anchors, B).float()
        log_p = F.log_softmax(t, dim=-1)
        div = (log_p.exp() * (log_p - F.log_softmax(logits, dim=-1))).sum(-1)  # [b, n, B-1]
        per_slot = per_slot + kl * div.reshape(b, -1)
        info["kl"] = ((div.reshape(b, -1) * weights.view(b, -1)).sum(1)
                      / weights.view(b, -1).sum(1).clamp_min(1e-9)).mean().detach()
    per_sequence = (per_slot * weights.view(b, -1)).sum(1) / weights.view(b, -1).sum(1).clamp_min(1e-9)
    loss = per_sequence.mean()
    with torch.no_grad():
        hit = (logits.argmax(-1) == target_ids) & valid
        acc = hit.sum((0, 1)).float() / valid.sum((0, 1)).clamp_min(1).float()
    return loss, {"accuracy": acc, **info}


def expected_tau_from_accuracy(slot_accuracy: list[float]) -> float:
    """Rough τ if slot hits were independent: 1 + sum_k prod_{i<=k} acc_i (for progress displays only)."""
    tau, run = 1.0, 1.0
    for acc in slot_accuracy:
        run *= acc
        tau += run
    return tau if math.isfinite(tau) else 1.0
