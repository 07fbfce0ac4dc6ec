"""The retrieval baselines (InfLLM, CMR; :mod:`fold_hf.modeling.retrieval`) inside the static drafting step.

Their rules are those of the loop path (:mod:`fold_hf.modeling.retrieval`, tested against float64 loop statements);
here every selection is made on the device from fixed-shape tensors, so a round can be captured in a CUDA graph:

InfLLM (:class:`InfLLMRounds`, full-attention layers)
    Per layer, on the device: the attention mass each entry received while in a window (``[Hq, capacity]``), a
    seen flag per entry, and the block representatives ``[Hq, blocks, Dh]``. Each round it (re)builds the
    representatives of the newest blocks (a formed block's entries never re-enter a window, so building it again
    gives the same keys: no host bookkeeping of which blocks exist), scores every block with the block-averaged
    query, takes the ``topk`` best (stable sort, ties to the earlier block) and gathers a compact context of fixed
    size: ``[initial entries | selected blocks | entries from the end of the grouped blocks to T]``, valid entries
    first. The tail keeps its distances to the block (compact slot ``c`` holds entry ``c + shift``), so the FOLD
    read's geometry at window D and a far branch at ``D - 1`` (α = 1: one softmax) reads exactly InfLLM's
    membership; window keys are rotated at their true positions through per-slot rope tables. After the read, the
    window attention of the round (one softmax over window, block and far entries, fp32) is added to the
    statistics.

CMR (:class:`CMRRounds`, every layer)
    The chunk selection ``[chunks]`` and the number of chunks at the last selection live on the device. The host
    counts drafting rounds and picks the round's captured step: ``initial`` (the most recent chunks), ``refresh``
    (every ``cmr_refresh`` rounds: the softmax of the target's query at ``t - 1`` in its last full-attention layer
    over the target's cached keys, heads averaged, mean per chunk, the best chunks; the query is kept by the verify
    step of cmr requests only, :meth:`~fold_hf.targets.base.StaticTarget.keep_queries`) or ``grow``
    (chunks started since the selection join it). The selected entries are gathered into a fixed-size buffer,
    valid ones first, and read renumbered ``0 .. K-1`` with the block right after them.
"""

from __future__ import annotations

import math

import torch

from ..kernels.fold_read.naive import grouped_logits, rotate_by_tables
from ..modeling.retrieval import RetrievalParams

_FAR_AWAY = 1 << 40  # sorts after every real entry or chunk number


class InfLLMRounds:
    """InfLLM's device state and per-round selection for the full-attention layers ``layers`` of a drafter.

    Args:
        params: block / initial / top-k / representative counts.
        layers: indices of the layers that retrieve (full-attention layers).
        heads, kv_heads, head_dim: the drafter's attention shape.
        capacity: entries of the drafter cache.
        window_distance: D = W + B.
        block_size: B (block rows); rows: context rows a round may commit (bounds the blocks formed per round).
        cos, sin: ``[>= capacity, rd]`` rope tables of the drafter (fp32, or fp64 for fp64 models).
    """

    def __init__(self, params: RetrievalParams, layers: list[int], heads: int, kv_heads: int, head_dim: int,
                 capacity: int, window_distance: int, block_size: int, rows: int, cos: torch.Tensor,
                 sin: torch.Tensor) -> None:
        P = self.params = params
        device, acc = cos.device, cos.dtype
        self.layers = list(layers)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.capacity, self.D, self.block = capacity, window_distance, block_size
        self.cos, self.sin = cos, sin
        self.acc = acc
        # block slots (one more: a dummy that absorbs writes of blocks that do not exist yet)
        self.num_blocks = max(P.infllm_topk, (capacity - P.infllm_init) // P.infllm_block + 1)
        self.new_blocks = -(-rows // P.infllm_block) + 1  # blocks that may form in one round, plus one
        self.far_only = P.infllm_init + P.infllm_topk * P.infllm_block
        tail = window_distance + max(P.infllm_block, P.infllm_init) + block_size
        self.size = self.far_only + tail  # compact context slots
        long = dict(dtype=torch.long, device=device)
        self.slots = torch.arange(self.size, **long)
        self.init_entries = torch.arange(P.infllm_init, **long)
        self.block_entries = torch.arange(P.infllm_block, **long)
        self.fresh = torch.arange(self.new_blocks, **long)
        self.block_slots = torch.arange(self.num_blocks, **long)
        self.ranks = torch.arange(P.infllm_topk, **long)
        self.window_slots = torch.arange(window_distance - 1, **long)
        self.row_offsets = torch.arange(block_size, **long)
        self.pad = torch.zeros(tail, **long)
        # per layer: attention received in windows [Hq, capacity + 1] (last column: a dummy), times read in a
        # window [capacity + 1], representatives [Hq, num_blocks + 1, Dh] (last: a dummy)
        self.received = {i: torch.zeros(heads, capacity + 1, device=device, dtype=acc) for i in layers}
        self.seen = {i: torch.zeros(capacity + 1, device=device, dtype=acc) for i in layers}
        self.reprs = {i: torch.zeros(heads, self.num_blocks + 1, head_dim, device=device, dtype=acc) for i in layers}
        self.blocks_built = 0  # host: blocks whose representatives exist (the loop's bookkeeping, for the phase)

    def n_blocks(self, context_length: int) -> int:
        """Blocks formed at a context of ``context_length`` entries (host ints)."""
        outside = max(0, context_length - self.D + 1)
        return max(0, outside - self.params.infllm_init) // self.params.infllm_block

    def next_phase(self, context_length: int) -> str:
        """``"form"`` when blocks form in this round (its step rebuilds the newest representatives), else
        ``"steady"`` (the step skips that part); host-side, from the round's context length."""
        n = self.n_blocks(context_length)
        formed = n > self.blocks_built
        self.blocks_built = max(self.blocks_built, n)
        return "form" if formed else "steady"

    def reset(self, keys_of, context_length: int) -> None:
        """Start a request whose context holds ``context_length`` entries: clear the statistics and build the
        representatives of the blocks that already exist (never in a window yet: the mean key of each block).
        ``keys_of(i)``: layer i's ``[1, Hkv, capacity, Dh]`` key buffer. Host-side, once per request."""
        P = self.params
        for i in self.layers:
            self.received[i].zero_()
            self.seen[i].zero_()
            self.reprs[i].zero_()
        n_blocks = self.blocks_built = self.n_blocks(context_length)
        if not n_blocks:
            return
        G = self.heads // self.kv_heads
        stop = P.infllm_init + n_blocks * P.infllm_block
        for i in self.layers:
            keys = keys_of(i)[0, :, P.infllm_init:stop].to(self.acc)
            mean = keys.reshape(self.kv_heads, n_blocks, P.infllm_block, -1).mean(2)
            self.reprs[i][:, :n_blocks] = mean.repeat_interleave(G, dim=0)

    def round(self, context_length: torch.Tensor) -> dict:
        """The round's shared layout (device tensors) for a context of ``context_length [1]`` entries (= t)."""
        P = self.params
        T = context_length
        outside = (T - self.D + 1).clamp_min(0)
        has_init = outside >= P.infllm_init
        n_blocks = torch.where(has_init, (outside - P.infllm_init).clamp_min(0) // P.infllm_block, 0)
        grouped_end = torch.where(has_init, P.infllm_init, 0) + n_blocks * P.infllm_block
        far_only = torch.where(has_init, P.infllm_init, 0) + n_blocks.clamp_max(P.infllm_topk) * P.infllm_block
        read_length = far_only + T - grouped_end  # T' = t' (the block follows the compact context)
        # true entry of compact slot c >= far_only (the tail keeps its distance to the block)
        tail_entry = grouped_end + self.slots - far_only
        rows = tail_entry.clamp(0, self.cos.shape[0] - 1)
        # the newest blocks (their representatives are built again each round) and the masks every layer applies
        blocks = n_blocks - self.new_blocks + self.fresh  # [k]; negative: not a block (yet)
        fresh_entries = P.infllm_init + blocks.clamp_min(0)[:, None] * P.infllm_block + self.block_entries
        return dict(n_blocks=n_blocks, far_only=far_only, read_length=read_length, tail_entry=tail_entry,
                    key_tables=(self.cos[rows], self.sin[rows]),
                    fresh_entries=fresh_entries.clamp_max(self.capacity - 1),  # [k, block]
                    fresh_slots=torch.where(blocks >= 0, blocks, self.num_blocks),  # absent ones: the dummy slot
                    absent=self.block_slots >= n_blocks, ranked=self.ranks < n_blocks)

    def select(self, i: int, query: torch.Tensor, keys: torch.Tensor, layout: dict, rebuild: bool = True
               ) -> torch.Tensor:
        """Layer ``i``'s compact context ``[size]`` (cache entries, valid ones first; slots past the round's read
        length are never read): refresh the newest blocks' representatives, score every block with the
        block-averaged query ``query [1, Hq, B, Dh]`` (unrotated), gather the best.

        ``keys``: the layer's ``[1, Hkv, capacity, Dh]`` unrotated cache keys (this round's entries committed);
        ``rebuild``: rebuild the newest blocks' representatives (rounds where blocks form, :meth:`next_phase`)."""
        P, acc = self.params, self.acc
        received, seen, reprs = self.received[i], self.seen[i], self.reprs[i]
        if rebuild:
            self._rebuild(keys, received, seen, reprs, layout)
        # the blocks whose representatives best match the block-averaged query (every block when no more exist)
        block_query = query[0].to(acc).mean(1)  # [Hq, Dh]
        scores = torch.einsum("hd,hbd->b", block_query, reprs[:, : self.num_blocks])
        scores = scores.masked_fill(layout["absent"], -math.inf)
        best = torch.sort(scores, descending=True, stable=True).indices[: P.infllm_topk]
        chosen = torch.where(layout["ranked"], best, _FAR_AWAY).sort().values
        selected = (P.infllm_init + chosen.clamp_max(self.num_blocks)[:, None] * P.infllm_block
                    + self.block_entries).reshape(-1)
        far_only = torch.cat((self.init_entries, selected, self.pad))
        gather = torch.where(self.slots < layout["far_only"], far_only, layout["tail_entry"])
        return gather.clamp(0, self.capacity - 1)

    def _rebuild(self, keys, received, seen, reprs, layout) -> None:
        """Representatives of the newest blocks: the mean key of the entries with the most window attention per
        query head (ties: the earlier entry), or of all entries for a block never read in a window."""
        P, acc = self.params, self.acc
        Hq, Hkv = self.heads, self.kv_heads
        G = Hq // Hkv
        entries = layout["fresh_entries"]  # [k, block]
        block_keys = keys[0][:, entries].to(acc)  # [Hkv, k, block, Dh]
        k = self.new_blocks
        score = received[:, entries].reshape(Hkv, G, k, P.infllm_block)
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., : P.infllm_repr]
        per_head = block_keys[:, None].expand(Hkv, G, k, P.infllm_block, self.head_dim)
        top = per_head.gather(3, order[..., None].expand(-1, -1, -1, -1, self.head_dim)).mean(3).reshape(Hq, k, -1)
        mean = block_keys.mean(2).repeat_interleave(G, dim=0)
        was_seen = (seen[entries] > 0).any(-1)
        fresh = torch.where(was_seen[None, :, None], top, mean)
        reprs.index_copy_(1, layout["fresh_slots"], fresh)

    @torch.no_grad()
    def record(self, i: int, query_near: torch.Tensor, query_far: torch.Tensor | None, block_keys: torch.Tensor,
               keys: torch.Tensor, layout: dict) -> None:
        """Add the attention each window entry received in this round's read (one softmax over window, block and
        far entries, as read; fp32) to layer ``i``'s statistics.

        Args:
            query_near: ``[1, Hq, B, Dh]`` the read's queries (rotated at the rows' true positions, logit scale in).
            query_far: ``[1, Hq, B, Dh]`` the read's far queries (at D - 1), or None (no far memory this round).
            block_keys: ``[1, Hkv, B, Dh]`` rotated block keys.
            keys: ``[1, Hkv, size, Dh]`` the compact context the layer read.
        """
        acc = self.acc
        Hkv, G, B = self.kv_heads, self.heads // self.kv_heads, self.block
        T = layout["read_length"]
        q = query_near[0].to(acc).reshape(Hkv, G, B, -1)
        window = T - (self.D - 1) + self.window_slots  # compact slots of the widest window (row 0's)
        valid = window >= 0
        slot = window.clamp_min(0)
        cos_k, sin_k = layout["key_tables"]
        near_keys = rotate_by_tables(keys[0][:, slot], cos_k[slot], sin_k[slot])  # [Hkv, D-1, Dh] at true positions
        distance = (T + self.row_offsets)[:, None] - window[None, :]
        near_mask = (distance < self.D) & valid
        s_near = grouped_logits(q[None], near_keys[None])[0].masked_fill(~near_mask, -math.inf)
        parts = [s_near, grouped_logits(q[None], block_keys.to(acc))[0]]
        if query_far is not None:
            s_far = grouped_logits(query_far.to(acc).reshape(1, Hkv, G, B, -1), keys.to(acc))[0]
            far_mask = ((T + self.row_offsets)[:, None] - self.slots[None, :] >= self.D) & (self.slots < T)
            parts.append(s_far.masked_fill(~far_mask, -math.inf))
        lse = torch.logsumexp(torch.cat(parts, -1), -1, keepdim=True)
        weights = torch.exp(s_near - lse).sum(-2).reshape(self.heads, -1)  # [Hq, D-1]
        entries = torch.where(valid, layout["tail_entry"][slot], self.capacity)
        self.received[i].index_add_(1, entries, weights)
        self.seen[i].index_add_(0, entries, near_mask.any(0).to(acc))


class CMRRounds:
    """CMR's device state and per-round selection (read by every drafter layer).

    Args:
        params: chunk size, chunks selected, refresh period.
        capacity: entries of the drafter cache.
        rows: context rows a round may commit (bounds the chunks that start between selections).
        device, dtype: where the selection lives; fp32 (fp64 for fp64 models) for the attention weights.
    """

    PHASES = ("initial", "refresh", "grow")

    def __init__(self, params: RetrievalParams, capacity: int, rows: int, device, dtype) -> None:
        P = self.params = params
        self.capacity, self.acc = capacity, dtype
        long = dict(dtype=torch.long, device=device)
        self.new_chunks = -(-P.cmr_refresh * rows // P.cmr_chunk) + 1
        self.size = (P.cmr_chunks + self.new_chunks) * P.cmr_chunk  # gathered slots
        self.chosen = torch.full((P.cmr_chunks,), _FAR_AWAY, **long)  # chunk numbers, sorted, _FAR_AWAY = none
        self.chunks_then = torch.zeros(1, **long)
        self.ranks = torch.arange(P.cmr_chunks, **long)
        self.fresh = torch.arange(self.new_chunks, **long)
        self.offsets = torch.arange(P.cmr_chunk, **long)
        self.rounds = 0
        self.target = None  # (kept queries [1, Hq, R, Dh], target keys [1, Hkv, capacity, Dh], scaling)

    def reset(self) -> None:
        self.rounds = 0
        self.chosen.fill_(_FAR_AWAY)
        self.chunks_then.zero_()

    def next_phase(self) -> str:
        """The phase of the next drafting round (host-side round count; the loop counts the same)."""
        k = self.rounds
        self.rounds += 1
        return "initial" if k == 0 else "refresh" if k % self.params.cmr_refresh == 0 else "grow"

    def select(self, context_length: torch.Tensor, new_rows: torch.Tensor, phase: str):
        """``(gathered entries [size], read length [1])`` of this round (valid entries first, ascending).

        ``new_rows``: rows committed this round (the preceding verify's accepted count + 1: its last accepted
        row is the query at ``t - 1``)."""
        P = self.params
        T = context_length
        n_chunks = (T + P.cmr_chunk - 1) // P.cmr_chunk
        if phase == "initial":
            recent = n_chunks - P.cmr_chunks + self.ranks
            self.chosen.copy_(torch.where(recent >= 0, recent, _FAR_AWAY))
            self.chunks_then.copy_(n_chunks)
        elif phase == "refresh":
            self.chosen.copy_(self._refresh(T, n_chunks, new_rows))
            self.chunks_then.copy_(n_chunks)
        elif phase != "grow":
            raise ValueError(f"cmr phase must be one of {self.PHASES}, got {phase!r}")
        chunks = torch.cat((self.chosen, self.chunks_then + self.fresh))
        entries = (chunks[:, None] * P.cmr_chunk + self.offsets).reshape(-1)
        valid = entries < T
        kept = torch.where(valid, entries, _FAR_AWAY).sort().values.clamp_max(self.capacity - 1)
        return kept, valid.sum().reshape(1)

    def _refresh(self, T: torch.Tensor, n_chunks: torch.Tensor, new_rows: torch.Tensor) -> torch.Tensor:
        """The chunks with the highest mean target attention of the query at ``t - 1`` (sorted, padded)."""
        if self.target is None:
            raise RuntimeError("cmr refreshes from the target's attention: attach the target's kept queries and "
                               "keys first (StaticDrafter.attach_target_attention)")
        P, acc = self.params, self.acc
        queries, keys, scaling = self.target
        _, Hq, _, Dh = queries.shape
        Hkv, Tk = keys.shape[1], keys.shape[2]
        q = queries[0].index_select(1, (new_rows - 1).clamp_min(0))  # [Hq, 1, Dh]
        # logits in the keys' dtype with fp32 accumulation (a half-precision cache is not copied to fp32: at 128K
        # that copy would be half a gigabyte), softmax in fp32; fp32 and fp64 targets compute in their own dtype
        logits = grouped_logits(q.to(keys.dtype).reshape(1, Hkv, Hq // Hkv, 1, Dh), keys)[0, :, :, 0]
        logits = logits.to(acc) * scaling
        visible = torch.arange(Tk, device=keys.device) < T  # the query at T - 1 sees entries 0 .. T - 1
        weights = torch.softmax(logits.masked_fill(~visible, -math.inf), -1).reshape(Hq, Tk).mean(0)
        n = max(-(-Tk // P.cmr_chunk), P.cmr_chunks)
        padded = weights.new_zeros(n * P.cmr_chunk)
        padded[:Tk] = weights
        chunk_ids = torch.arange(n, device=keys.device)
        sizes = torch.where(chunk_ids == n_chunks - 1, T - (n_chunks - 1) * P.cmr_chunk, P.cmr_chunk).to(acc)
        scores = (padded.view(n, P.cmr_chunk).sum(-1) / sizes).masked_fill(chunk_ids >= n_chunks, -math.inf)
        best = torch.sort(scores, descending=True, stable=True).indices[: P.cmr_chunks]
        return torch.where(self.ranks < n_chunks, best, _FAR_AWAY).sort().values
