"""The retrieval baselines of the paper's Appendix B.3: InfLLM and CMR (SpecExtend's cross-model retrieval).

Both keep per-request state across drafting rounds, held by the drafter's :class:`~fold_hf.modeling.cache.FoldCache`
(``cache.retrieval``), and reduce it each round to a :class:`~fold_hf.modeling.read_plan.LayerRead` that the shared
attention reads (the reference read: neither geometry is a window/far split of the fused kernels).

InfLLM (``mode="infllm"``; full-attention layers only, sliding layers read as released)
    ``D = W + B``. Entries outside every block row's window (``j < t - D + 1``) past the ``INFLLM_INIT`` initial
    ones are grouped into consecutive blocks of ``INFLLM_BLOCK``. A block is represented, per query head, by the
    mean key of its ``INFLLM_REPR`` entries with the most attention received while inside the window (summed over
    rows and rounds); a block none of whose entries was ever read in a window (most of a long prompt) by the mean
    of all its keys. Each round and layer, the block queries (unrotated, averaged over the block rows) score every
    block by the inner product summed over heads (InfLLM flattens heads), and the ``INFLLM_TOPK`` best blocks are
    read (all when there are no more). Row ``r`` then reads, in one softmax with its window at true distances,
    the initial entries, the selected blocks and the entries not yet grouped (``[grouped_end, T)``) that are
    outside its window, all at distance ``D - 1``.

CMR (``mode="cmr"``; every layer, sliding ones included)
    The context is split into chunks of ``CMR_CHUNK`` entries. The first round after prefill reads the
    ``CMR_CHUNKS`` most recent chunks. Every ``CMR_REFRESH`` rounds the selection is remade from the target's
    attention weights of the query at position ``t - 1`` in its last full-attention layer, heads averaged, from
    the preceding verification (:class:`TargetAttentionProbe`): the chunks with the highest mean weight. Between
    refreshes every chunk started after the selection joins it and grows. The selected entries are renumbered
    ``0 .. K-1`` in chronological order and the block follows them.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from .read_plan import LayerRead, ReadGeometry

INFLLM_BLOCK = 128
INFLLM_INIT = 128
INFLLM_TOPK = 16
INFLLM_REPR = 4
CMR_CHUNK = 32
CMR_CHUNKS = 64
CMR_REFRESH = 8
RETRIEVAL_MODES = ("infllm", "cmr")
# FoldConfig.extra keys overriding the paper's settings (tests use small ones so that selection happens at
# short contexts)
EXTRA_KEYS = ("infllm_block", "infllm_init", "infllm_topk", "infllm_repr", "cmr_chunk", "cmr_refresh")


@dataclass(frozen=True)
class RetrievalParams:
    """InfLLM's block / initial / retrieved-block / representative counts and CMR's chunk size, chunk count and
    refresh period (the paper's values by default)."""

    infllm_block: int = INFLLM_BLOCK
    infllm_init: int = INFLLM_INIT
    infllm_topk: int = INFLLM_TOPK
    infllm_repr: int = INFLLM_REPR
    cmr_chunk: int = CMR_CHUNK
    cmr_chunks: int = CMR_CHUNKS
    cmr_refresh: int = CMR_REFRESH

    @classmethod
    def of(cls, cfg) -> "RetrievalParams":
        extra = {k: v for k, v in (cfg.extra or {}).items() if k in EXTRA_KEYS}
        chunk = int(extra.get("cmr_chunk", CMR_CHUNK))
        return cls(**{k: int(v) for k, v in extra.items()}, cmr_chunks=cfg.retrieval_budget // chunk)


# ---------------------------------------------------------------------------------------------- InfLLM
@dataclass
class _InfLLMLayer:
    received: torch.Tensor | None = None  # [Hq, capacity] attention received while in a window (fp32/fp64)
    seen: torch.Tensor | None = None  # [capacity] bool: read in some row's window at least once
    reprs: torch.Tensor | None = None  # [Hq, n_blocks, Dh] representative keys of the blocks formed so far

    def grow(self, heads: int, needed: int, device, dtype) -> None:
        if self.received is None:
            self.received = torch.zeros(heads, max(64, needed), device=device, dtype=dtype)
            self.seen = torch.zeros(max(64, needed), dtype=torch.bool, device=device)
        elif self.received.shape[1] < needed:
            cap = max(needed, 2 * self.received.shape[1])
            received = self.received.new_zeros(heads, cap)
            received[:, : self.received.shape[1]] = self.received
            seen = self.seen.new_zeros(cap)
            seen[: self.seen.numel()] = self.seen
            self.received, self.seen = received, seen


def infllm_block_layout(block_start: int, window_distance: int, P: RetrievalParams = RetrievalParams()
                        ) -> tuple[int, int]:
    """``(n_blocks, grouped_end)``: blocks formed from the entries outside every row's window (``j < t - D + 1``)
    past the initial ones; entries ``[grouped_end, T)`` are not grouped yet."""
    outside = max(0, block_start - window_distance + 1)
    n_blocks = max(0, outside - P.infllm_init) // P.infllm_block
    return n_blocks, P.infllm_init + n_blocks * P.infllm_block


def infllm_block_representatives(keys: torch.Tensor, received: torch.Tensor, seen: torch.Tensor,
                                 blocks: range, heads: int, P: RetrievalParams = RetrievalParams()) -> torch.Tensor:
    """Representative keys ``[Hq, len(blocks), Dh]`` of the given blocks.

    Args:
        keys: ``[Hkv, T, Dh]`` unrotated context keys of the layer.
        received: ``[Hq, >= T]`` attention each entry received from each query head while in a window.
        seen: ``[>= T]`` bool, the entry was read in a window at least once.
        blocks: block numbers (block ``b`` holds entries ``INFLLM_INIT + b * INFLLM_BLOCK`` onwards).
        heads: Hq (query head ``h`` reads KV head ``h // (Hq / Hkv)``).
    """
    if len(blocks) == 0:
        return keys.new_zeros(heads, 0, keys.shape[-1]).to(received.dtype)
    Hkv, _, Dh = keys.shape
    group = heads // Hkv
    size = P.infllm_block
    first = P.infllm_init + blocks.start * size
    stop = P.infllm_init + blocks.stop * size
    nb = len(blocks)
    block_keys = keys[:, first:stop].to(received.dtype).reshape(Hkv, nb, size, Dh)
    score = received[:, first:stop].reshape(Hkv, group, nb, size)
    # the 4 most attended entries per query head (ties: the earlier entry), gathered from its KV head's keys (an
    # expanded view: the keys are not copied per query head)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :P.infllm_repr]
    per_head = block_keys[:, None].expand(Hkv, group, nb, size, Dh)
    top = per_head.gather(3, order[..., None].expand(-1, -1, -1, -1, Dh)).mean(3).reshape(heads, nb, Dh)
    mean = block_keys.mean(2).repeat_interleave(group, dim=0)  # [Hq, nb, Dh]
    was_seen = seen[first:stop].reshape(nb, size).any(-1)  # [nb]
    return torch.where(was_seen[None, :, None], top, mean)


def infllm_select_blocks(block_query: torch.Tensor, reprs: torch.Tensor, topk: int = INFLLM_TOPK) -> torch.Tensor:
    """Sorted numbers of the ``INFLLM_TOPK`` blocks whose representatives have the largest inner product with
    ``block_query [Hq, Dh]`` summed over heads (every block when there are no more); ``reprs [Hq, nb, Dh]``."""
    nb = reprs.shape[1]
    if nb <= topk:
        return torch.arange(nb, device=reprs.device)
    score = torch.einsum("hd,hbd->b", block_query.to(reprs.dtype), reprs)
    chosen = torch.sort(score, descending=True, stable=True).indices[:topk]
    return chosen.sort().values


def plan_infllm_read(state: "RetrievalState", layer_idx: int, *, query: torch.Tensor, context_keys: torch.Tensor,
                     block_start: int, geometry: ReadGeometry, rope,
                     params: RetrievalParams = RetrievalParams()) -> LayerRead:
    """InfLLM's read of one full-attention layer (see the module docstring).

    Args:
        state: the request's retrieval state (``cache.retrieval``).
        query: ``[1, Hq, Lq, Dh]`` unrotated block queries of this layer.
        context_keys: ``[1, Hkv, T, Dh]`` unrotated context keys.
        block_start: t.
        geometry: the layer's :func:`~fold_hf.modeling.read_plan.read_geometry` (``selection == "infllm"``): its
            window D = W + B and the distance of the retrieved entries (D - 1).
    """
    if geometry.selection != "infllm":
        raise ValueError(f"plan_infllm_read reads an InfLLM geometry, got {geometry}")
    _, Hq, Lq, Dh = query.shape
    T = context_keys.shape[2]
    t, D = int(block_start), geometry.window
    device = query.device
    long = dict(dtype=torch.long, device=device)
    acc = torch.float64 if query.dtype == torch.float64 else torch.float32
    layer = state.infllm_layer(layer_idx)
    layer.grow(Hq, T, device, acc)
    P = params
    n_blocks, grouped_end = infllm_block_layout(t, D, P)
    have = 0 if layer.reprs is None else layer.reprs.shape[1]
    if n_blocks > have:  # blocks never change once formed: their entries left every window for good
        new = infllm_block_representatives(context_keys[0], layer.received, layer.seen, range(have, n_blocks), Hq,
                                           P)
        layer.reprs = new if layer.reprs is None else torch.cat((layer.reprs, new), 1)
    reprs = layer.reprs[:, :n_blocks] if layer.reprs is not None else query.new_zeros(Hq, 0, Dh).to(acc)
    chosen = infllm_select_blocks(query[0].to(acc).mean(1), reprs, P.infllm_topk)
    eligible = torch.zeros(T, dtype=torch.bool, device=device)
    eligible[: min(P.infllm_init, T)] = True
    eligible[grouped_end:] = True
    if chosen.numel():
        starts = P.infllm_init + chosen.to(device) * P.infllm_block
        eligible[(starts[:, None] + torch.arange(P.infllm_block, **long)).reshape(-1)] = True
    # the read runs over a compact context: the old candidates (outside the last row's window) then the window
    # entries, gathered from the cache (``read.gather``), so its cost follows what it reads, not T
    far_stop = max(0, min(T, t + Lq - D))
    old = torch.nonzero(eligible[:far_stop]).reshape(-1)
    near_start = max(0, t - D + 1)
    near = torch.arange(near_start, T, **long)
    n_old = old.numel()
    positions = torch.arange(t, t + Lq, **long)
    near_mask = (positions[:, None] - near[None, :]) < D
    far_mask = (positions[:, None] - old[None, :]) >= D
    read = LayerRead(n_old + near.numel(), Lq, torch.arange(n_old, n_old + near.numel(), **long), near, positions,
                     n_old, torch.full((Lq,), geometry.far, **long), near_mask, far_mask, geometry.alpha, None, rope,
                     block_start=t, window_distance=D)
    read.gather = torch.cat((old, near))
    read.on_read = lambda attn, q, k_ctx, k_blk: record_window_attention(layer, q, k_ctx, k_blk, read, attn.scaling)
    state.last_selection[layer_idx] = chosen
    return read


@torch.no_grad()
def record_window_attention(layer: _InfLLMLayer, query: torch.Tensor, context_keys: torch.Tensor,
                            block_keys: torch.Tensor, read: LayerRead, scaling: float) -> None:
    """Add the attention each window entry received in this read (one softmax over window, block and the far
    entries, as read) to ``layer.received`` and mark the entries read in a window as seen.

    ``context_keys`` is the read's context: the cache entries ``read.gather`` when the read gathers them."""
    b, Hq, Lq, Dh = query.shape
    Hkv = context_keys.shape[1]
    acc = layer.received.dtype
    rope = read.rope
    q = query[0].to(acc)
    kv_of = torch.arange(Hq, device=q.device) // (Hq // Hkv)
    near_k = rope.rotate(context_keys[0][:, read.near_index], read.near_key_pos).to(acc)[kv_of]
    blk_k = rope.rotate(block_keys[0], read.query_pos).to(acc)[kv_of]
    q_near = rope.rotate(q, read.query_pos).to(acc)
    s_ctx = (q_near @ near_k.transpose(-1, -2) * scaling).masked_fill(~read.near_mask, -math.inf)
    parts = [s_ctx, q_near @ blk_k.transpose(-1, -2) * scaling]
    if read.far_stop:
        far_k = context_keys[0][:, : read.far_stop].to(acc)[kv_of]
        q_far = rope.rotate(q, read.far_distance, scale=rope.attention_scaling**2).to(acc)
        parts.append((q_far @ far_k.transpose(-1, -2) * scaling).masked_fill(~read.far_mask, -math.inf))
    lse = torch.logsumexp(torch.cat(parts, -1), -1, keepdim=True)  # [Hq, Lq, 1]
    weights = torch.exp(s_ctx - lse).sum(1)  # [Hq, Nn]
    entries = read.near_index if read.gather is None else read.gather[read.near_index]
    layer.received[:, entries] += weights
    layer.seen[entries] |= read.near_mask.any(0)


# ---------------------------------------------------------------------------------------------- CMR
@dataclass
class _CMRState:
    rounds: int = 0
    chunks: torch.Tensor | None = None  # chunk numbers chosen at the last selection
    chunks_then: int = 0  # chunks that existed at the last selection (later ones join the selection)
    refreshes: list[int] = field(default_factory=list)  # rounds at which the selection was remade


def cmr_chunk_scores(weights: torch.Tensor, length: int, chunk: int = CMR_CHUNK) -> torch.Tensor:
    """Mean weight of each chunk of ``CMR_CHUNK`` entries over ``weights [>= length]`` (the last chunk may be
    partial); returns ``[ceil(length / CMR_CHUNK)]``."""
    n = -(-length // chunk)
    padded = weights.new_zeros(n * chunk)
    padded[:length] = weights[:length]
    sizes = torch.full((n,), chunk, dtype=weights.dtype, device=weights.device)
    sizes[-1] = length - (n - 1) * chunk
    return padded.view(n, chunk).sum(-1) / sizes


def cmr_select_entries(state: "RetrievalState", num_context: int, block_start: int,
                       params: RetrievalParams = RetrievalParams()) -> torch.Tensor:
    """The sorted context entries CMR reads this round (one call per drafting round)."""
    cmr, P = state.cmr, params
    T = int(num_context)
    n_chunks = -(-T // P.cmr_chunk)
    k = cmr.rounds
    if k == 0 or k % P.cmr_refresh == 0:
        if k == 0:
            chosen = torch.arange(max(0, n_chunks - P.cmr_chunks), n_chunks)
        else:
            probe = state.probe
            if probe is None:
                raise RuntimeError("cmr refreshes from the target's attention: no TargetAttentionProbe is attached "
                                   "to the drafter cache (run cmr through fold_hf.generate or target.generate)")
            weights = probe.weights_of_position(int(block_start) - 1)
            scores = cmr_chunk_scores(weights.double().cpu(), min(T, weights.numel()), P.cmr_chunk)
            chosen = torch.sort(scores, descending=True, stable=True).indices[:P.cmr_chunks].sort().values
            cmr.refreshes.append(k)
        cmr.chunks, cmr.chunks_then = chosen, n_chunks
    chunks = torch.cat((cmr.chunks, torch.arange(cmr.chunks_then, n_chunks)))
    cmr.rounds = k + 1
    if state.probe is not None:  # the next verification feeds a refresh: only then compute its weights
        state.probe.armed = cmr.rounds % P.cmr_refresh == 0
    entries = (chunks[:, None] * P.cmr_chunk + torch.arange(P.cmr_chunk)[None]).reshape(-1)
    return entries[entries < T]


def plan_cmr_read(entries: torch.Tensor, *, num_context: int, block_start: int, query_length: int, rope,
                  sliding_window: int | None, device) -> LayerRead:
    """Read the selected ``entries`` renumbered ``0 .. K-1``, the block right after them (keeping any gap between
    the context and the block); a sliding layer keeps its native window over the renumbered distances."""
    long = dict(dtype=torch.long, device=device)
    T, t, Lq = int(num_context), int(block_start), int(query_length)
    keep = entries.to(device)
    kept = keep.numel()
    key_pos = torch.arange(kept, **long)
    query_pos = torch.arange(kept + (t - T), kept + (t - T) + Lq, **long)
    near_mask = torch.ones(Lq, kept, dtype=torch.bool, device=device)
    if sliding_window is not None:
        near_mask = (query_pos[:, None] - key_pos[None, :]) < sliding_window
    return LayerRead(T, Lq, keep, key_pos, query_pos, 0, torch.zeros(Lq, **long), near_mask,
                     torch.zeros(Lq, 0, dtype=torch.bool, device=device), 1.0, None, rope, true_positions=False)


# ---------------------------------------------------------------------------------------------- state
class RetrievalState:
    """Per-request state of the retrieval modes (held by ``FoldCache.retrieval``)."""

    def __init__(self) -> None:
        self.infllm: dict[int, _InfLLMLayer] = {}
        self.last_selection: dict[int, torch.Tensor] = {}  # InfLLM: blocks read by each layer last round
        self.cmr = _CMRState()
        self.probe: TargetAttentionProbe | None = None

    def infllm_layer(self, idx: int) -> _InfLLMLayer:
        return self.infllm.setdefault(idx, _InfLLMLayer())


def retrieval_state(cache) -> RetrievalState:
    """The cache's retrieval state (created on first use)."""
    state = getattr(cache, "retrieval", None)
    if state is None:
        state = RetrievalState()
        cache.retrieval = state
    return state


# ---------------------------------------------------------------------------------------------- target probe
PROBE_ATTENTION = "fold_cmr_probe"


def last_full_attention_layer(target: nn.Module) -> int:
    """Index of the target's last full-attention layer (``config.layer_types``; the last layer without it)."""
    from .target_layers import decoder_layers, unwrap as _unwrap

    layers, _ = decoder_layers(target)
    config = getattr(_unwrap(target), "config", None)
    config = getattr(config, "text_config", None) or config
    types = list(getattr(config, "layer_types", None) or [])
    if types:
        full = [i for i, kind in enumerate(types) if kind == "full_attention"]
        if not full:
            raise ValueError("cmr: the target's config.layer_types has no 'full_attention' layer")
        return full[-1]
    return len(layers) - 1


def _attention_module(layer: nn.Module) -> nn.Module:
    for name in ("self_attn", "attention", "attn"):
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module) and hasattr(module, "config"):
            return module
    raise ValueError(f"cmr: cannot find the attention module of target layer {type(layer).__name__}")


def _probe_attention(module, query, key, value, attention_mask, *, scaling=None, **kwargs):
    """The layer's own attention implementation, plus (when its probe is armed) the causal attention weights of
    every query row, heads averaged."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    probe: TargetAttentionProbe = module._fold_cmr_probe
    if probe.armed:
        probe.capture(query, key, scaling if scaling is not None else query.shape[-1] ** -0.5)
    original = ALL_ATTENTION_FUNCTIONS.get_interface(probe.implementation, eager_attention_forward)
    return original(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


class TargetAttentionProbe:
    """Context manager recording, on demand, the target's attention weights in its last full-attention layer.

    Only that layer's attention module is touched: it gets its own copy of the config whose attention
    implementation is a wrapper around the original one. While ``armed`` is False (every round but those before a
    CMR refresh) the wrapper only forwards the call; when armed it also computes ``softmax(q k^T * scaling)`` of
    the forward's query rows (causal, heads averaged, fp32; fp64 for fp64 models) and keeps it by query position.
    Other modes never install the probe, so their verification is unchanged.
    """

    def __init__(self, target: nn.Module, runner=None) -> None:
        from .target_layers import decoder_layers

        layers, _ = decoder_layers(target)
        self.layer_idx = last_full_attention_layer(target)
        # the fast loop's static target computes attention itself: it calls capture() from its host-length forward
        self.runner = runner
        self.module = None if runner is not None else _attention_module(layers[self.layer_idx])
        self.armed = False
        self.implementation: str | None = None
        self.positions: dict[int, torch.Tensor] = {}
        self._saved_config = None

    def __enter__(self) -> "TargetAttentionProbe":
        import copy

        from transformers import AttentionInterface

        if self.runner is not None:
            self.runner.attention_probe = self
            return self
        AttentionInterface.register(PROBE_ATTENTION, _probe_attention)
        config = self.module.config
        self.implementation = config._attn_implementation or "eager"
        self._saved_config = config
        probe_config = copy.copy(config)
        probe_config._attn_implementation = PROBE_ATTENTION
        self.module.config = probe_config
        self.module._fold_cmr_probe = self
        return self

    def __exit__(self, *exc) -> None:
        if self.runner is not None:
            self.runner.attention_probe = None
        if self._saved_config is not None:
            self.module.config = self._saved_config
            self._saved_config = None
            del self.module._fold_cmr_probe

    @torch.no_grad()
    def capture(self, query: torch.Tensor, key: torch.Tensor, scaling: float) -> None:
        """query ``[1, Hq, Lq, Dh]`` (rows at positions ``Tk - Lq .. Tk - 1``), key ``[1, Hkv, Tk, Dh]``."""
        _, Hq, Lq, _ = query.shape
        Hkv, Tk = key.shape[1], key.shape[2]
        acc = torch.float64 if query.dtype == torch.float64 else torch.float32
        k = key[0].to(acc).repeat_interleave(Hq // Hkv, dim=0)
        logits = query[0].to(acc) @ k.transpose(-1, -2) * scaling  # [Hq, Lq, Tk]
        first = Tk - Lq
        causal = torch.arange(Tk, device=key.device)[None, :] <= (first + torch.arange(Lq, device=key.device))[:, None]
        weights = torch.softmax(logits.masked_fill(~causal, -math.inf), -1).mean(0)  # [Lq, Tk]
        self.positions = {first + i: weights[i, : first + i + 1] for i in range(Lq)}

    def weights_of_position(self, position: int) -> torch.Tensor:
        """Heads-averaged weights ``[position + 1]`` of the query at ``position`` from the last armed forward."""
        weights = self.positions.get(position)
        if weights is None:
            raise RuntimeError(f"cmr: the preceding verification recorded no attention for the query at position "
                               f"{position} (recorded: {sorted(self.positions)[:4]}...)")
        return weights


@contextlib.contextmanager
def target_attention_probe(target: nn.Module, drafter):
    """Around one generate call: a :class:`TargetAttentionProbe` on ``target`` when ``drafter`` reads ``cmr`` (the
    caches the drafter makes meanwhile get it), else nothing at all."""
    if drafter is None or drafter.fold_config.mode != "cmr":
        yield None
        return
    with TargetAttentionProbe(target) as probe:
        drafter.__dict__["_target_probe"] = probe
        try:
            yield probe
        finally:
            drafter.__dict__.pop("_target_probe", None)
