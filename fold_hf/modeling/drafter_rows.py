"""Several requests' blocks drafted in one drafter forward (batched rounds, :mod:`fold_hf.generation.fast.batched`).

Each request keeps its own :class:`~fold_hf.modeling.cache.FoldCache`, position and read plan (the FOLD window
boundary is its own); what the rows share is every projection: the new context features of all rows go through
``fc`` and each layer's k/v projections as one ``[1, N, H]`` sequence, the blocks ``[A, B, H]`` through the layers
and the lm_head together. The read of each row is the drafter's own eager read (``FoldDrafter.reader``), so a row
drafts what it drafts alone (up to the rounding of a GEMM over more rows).
"""

from __future__ import annotations

import torch


@torch.no_grad()
def propose_rows(drafter, lasts: list[torch.Tensor], pendings: list[torch.Tensor | None], caches: list,
                 block_starts: list[int], counts: list[int], picks: list) -> list[tuple]:
    """:meth:`~fold_hf.modeling.drafter.FoldDrafter.propose` of ``drafter`` for ``A`` requests at once (``propose``
    is this for one; this module is below the drafter's, so it names no class of it).

    Args:
        lasts: each request's last committed token ``[1]``.
        pendings: each request's taps committed since its last draft ``[1, n_a, n_taps * H]``, or None.
        caches: each request's :class:`~fold_hf.modeling.cache.FoldCache` (receives its new context).
        block_starts: each request's anchor position.
        counts: at most this many proposals per request (``>= 1``).
        picks: each request's token chooser, or None for argmax (see ``FoldDrafter.pick_proposals``).

    Returns:
        per request (tokens ``[k_a]``, scores ``[k_a, V]`` or None), ``k_a <= counts[a]`` (fewer when a DeepSpec
        confidence threshold cuts).
    """
    noise = drafter.embed_block(drafter.block_ids(torch.cat(lasts)))  # [A, B, H]
    hidden = noise.to(drafter.fc.weight.dtype)
    Lq = hidden.shape[1]
    sizes = [0 if p is None else p.shape[1] for p in pendings]
    context = None
    if any(sizes):  # fc + hidden norm are row-wise: every row's new features in one sequence
        context = drafter.context_features(torch.cat([p.to(hidden.device) for p in pendings if p is not None
                                                      and p.shape[1]], 1))
    readers = [drafter.reader(cache, cache.get_seq_length() + n, start, Lq, hidden.device)
               for cache, n, start in zip(caches, sizes, block_starts)]

    def read(attn, q, k_new, v_new, k_blk, v_blk):  # k_new / v_new [1, Hkv, N, D]: the rows' new entries in order
        outs, offset = [], 0
        for a, (reader, n) in enumerate(zip(readers, sizes)):
            kn = vn = None
            if n:
                kn, vn = k_new[:, :, offset : offset + n], v_new[:, :, offset : offset + n]
                offset += n
            outs.append(reader(attn, q[a : a + 1], kn, vn, k_blk[a : a + 1], v_blk[a : a + 1]))
        return torch.cat(outs)

    for layer in drafter.layers:
        hidden = layer(hidden, context, read)
    hidden = drafter.norm(hidden)
    start = drafter.first_proposal_slot
    limits = [min(count, drafter.num_proposals) for count in counts]
    slots = hidden[:, start : start + max(limits)]
    base = drafter.proposal_logits(slots)  # [A, max k, V]: the lm_head once for every row
    proposals = []
    for a, k in enumerate(limits):
        tokens, scores, kept = drafter.draft_head(slots[a, :k], lasts[a], picks[a], base=base[a, :k])
        if kept is not None:
            keep = int(kept)
            tokens, scores = tokens[:keep], (scores[:keep] if scores is not None else None)
        proposals.append((tokens, scores))
    return proposals
