"""Which context entries each block row reads, in which branch, at which position.

A :class:`LayerRead` is the whole geometry of one drafter layer's attention for one forward: the
reading mode (``FoldConfig``) reduced to index ranges, positions and a region mask. The attention
reference and the Triton kernel consume it alike (:mod:`fold_hf.modeling.fold_read`).

Notation (docs/design.md §2): context entries ``j = 0 .. T-1`` sit at their absolute positions; the block
rows sit at ``p = t + r`` (``r = 0 .. Lq-1``, ``t >= T``); ``D = W + B`` for full-attention layers and
``D = sliding_window`` for sliding layers. Entry ``j`` is in the window of row ``r`` iff
``p - j < D``; otherwise it belongs to the far memory (``fold``, ``rerope``) or is not read.
"""

from __future__ import annotations

import math

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .fold_config import FoldConfig
from .rope import RotaryTables

REGION_HIDDEN = 0
REGION_NEAR = 1
REGION_FAR = 2


@dataclass
class LayerRead:
    """Geometry of one layer's read (shapes with ``T`` context entries, ``Lq`` block rows).

    Attributes:
        num_context: T, context entries held in the cache.
        query_length: Lq, block rows (queries and block keys).
        near_index: ``[Nn]`` long, context entries read by the window branch of at least one row.
        near_key_pos: ``[Nn]`` long, positions at which those keys are rotated.
        query_pos: ``[Lq]`` long, positions of the block rows (queries and block keys, window branch).
        far_stop: far entries of every row lie in ``[0, far_stop)``; 0 means no far memory.
        far_distance: ``[Lq]`` long, distance at which row r reads its far memory (``D + r``).
        near_mask: ``[Lq, Nn]`` bool, row r reads ``near_index[n]`` in the window branch.
        far_mask: ``[Lq, far_stop]`` bool, row r reads entry j in the far branch.
        alpha: concentration of the far branch (1 merges the branches into one softmax).
        query_scale: ``[Lq]`` fp32 multiplier of the logits of row r (ReRoPE), or None.
        rope: rotary tables of this read (YaRN's are rescaled).
        true_positions: window keys sit at their absolute positions (False when renumbered).
        block_start: t, position of block row 0 (None on reads built by hand).
        window_distance: D, entry ``j`` is in row ``r``'s window iff ``t + r - j < D``; None = every entry.
        geometry_from_plan: True only on reads built by :func:`plan_layer_read`, whose membership masks follow
            ``block_start`` and ``window_distance`` exactly (what the fused kernels read instead of the masks).
            Not an init field: ``dataclasses.replace`` (e.g. a custom region mask applied by
            ``read_from_region``) resets it to False, so changed membership falls back to the mask-reading
            reference.
        on_read: None, or ``fn(attention_module, query, context_keys, block_keys)`` the layer calls after its read
            (InfLLM records the attention its window entries received). Not an init field.
        gather: None, or ``[T']`` long cache entries the layer gathers as its context before reading (the read's
            indices then refer to that compact context: InfLLM reads its selection, not the whole cache). Not an
            init field.
    """

    num_context: int
    query_length: int
    near_index: torch.Tensor
    near_key_pos: torch.Tensor
    query_pos: torch.Tensor
    far_stop: int
    far_distance: torch.Tensor
    near_mask: torch.Tensor
    far_mask: torch.Tensor
    alpha: float
    query_scale: torch.Tensor | None
    rope: RotaryTables
    true_positions: bool = True
    block_start: int | None = None
    window_distance: int | None = None
    geometry_from_plan: bool = field(default=False, init=False)
    on_read: "Callable | None" = field(default=None, init=False, repr=False, compare=False)
    gather: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def near_is_suffix(self) -> bool:
        """True when the window branch reads one contiguous suffix of the context."""
        n = self.near_index.numel()
        return n == 0 or int(self.near_index[0]) == self.num_context - n

    def region_mask(self) -> torch.Tensor:
        """``[Lq, T + Lq]`` int8: 0 not read, 1 window branch, 2 far branch (block columns last)."""
        T, Lq = self.num_context, self.query_length
        device = self.near_index.device
        region = torch.zeros(Lq, T + Lq, dtype=torch.int8, device=device)
        if self.far_stop:
            region[:, : self.far_stop] = self.far_mask.to(torch.int8) * REGION_FAR
        if self.near_index.numel():
            near = region[:, self.near_index]
            near = torch.where(self.near_mask, torch.full_like(near, REGION_NEAR), near)
            region[:, self.near_index] = near
        region[:, T:] = REGION_NEAR
        return region


def _row_distances(T: int, t: int, Lq: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Distance ``p_r - j`` of every block row to every context entry: (dist ``[Lq, T]``, rows ``[Lq]``)."""
    rows = torch.arange(Lq, device=device)
    dist = (t + rows)[:, None] - torch.arange(T, device=device)[None, :]
    return dist, rows


@dataclass(frozen=True)
class ReadGeometry:
    """What one drafter layer reads under a reading mode: the mode -> geometry rules of every read, in one place.

    :func:`read_geometry` is the only place that knows the modes. The host plan (:func:`plan_layer_read`, read by
    the reference read and, through :func:`fold_hf.modeling.fold_read.read_kernel_inputs`, by the Triton read), the
    static drafting step (:class:`fold_hf.generation.static_drafter.StaticDrafter`), the drafter's rope choice
    (``FoldDrafter._rope_for``) and ``fold-hf doctor`` all take their geometry from it.

    Attributes:
        window: D, entry ``j`` is in row ``r``'s window iff ``p_r - j < D`` (positions as read); None = every entry.
        far: distance of the far memory (``W + B``; InfLLM's retrieved entries ``D - 1``), None = no far branch.
        far_per_row: row ``r`` reads its far memory at ``far + r`` (FOLD) instead of ``far`` (ReRoPE, InfLLM).
        alpha: concentration of the far branch (1 = one softmax with the window).
        rerope_scale: each row's queries are scaled by ``max(1, log(p + 1) / log 4096)`` (ReRoPE, layers in scope).
        selection: None (the cache as it is), ``"streaming"`` (sinks + recent entries), ``"cmr"`` (CMR's chunks)
            or ``"infllm"`` (initial entries, retrieved blocks and not-yet-grouped older entries, read at true
            positions beside the window).
        renumbered: the selection is read at positions ``0 .. K-1``, the block right after it (streaming, CMR).
        yarn: the request's rescaled rope tables (YaRN on full-attention layers).
    """

    window: int | None
    far: int | None = None
    far_per_row: bool = False
    alpha: float = 1.0
    rerope_scale: bool = False
    selection: str | None = None
    renumbered: bool = False
    yarn: bool = False


def read_geometry(cfg: FoldConfig, block_size: int, sliding_window: int | None = None) -> ReadGeometry:
    """The geometry of a layer under ``cfg`` (see :class:`ReadGeometry`); ``sliding_window``: the layer's native
    window when it is a sliding-window layer, else None.

    Full-attention layers (``D = W + B``): ``fold`` window + far memory at ``D + r`` (α); ``rerope`` window + far
    memory at ``D`` from every row, queries log-4096 scaled; ``window`` the window alone; ``dflash`` / ``yarn``
    every entry (YaRN's tables); ``streaming`` / ``cmr`` their renumbered selection; ``infllm`` the window plus its
    retrieved entries at ``D - 1`` in one softmax.

    Sliding layers keep their native window S at true positions; with ``cfg.layers == "all"`` ``fold`` and
    ``rerope`` add the far memory at the pair's shared distance (``W + B``, + r for fold; paper B.3) and ReRoPE
    scales their queries; CMR's selection is read by every layer (renumbered, the native window over the renumbered
    distances); InfLLM retrieves in full-attention layers only.
    """
    mode = cfg.mode
    D_full = cfg.window + block_size
    if sliding_window is not None:
        S = int(sliding_window)
        if mode == "cmr":
            return ReadGeometry(S, selection="cmr", renumbered=True)
        if cfg.layers == "all" and mode == "fold":
            return ReadGeometry(S, D_full, True, float(cfg.alpha))
        if cfg.layers == "all" and mode == "rerope":
            return ReadGeometry(S, D_full, rerope_scale=True)
        return ReadGeometry(S)
    if mode == "fold":
        return ReadGeometry(D_full, D_full, True, float(cfg.alpha))
    if mode == "rerope":
        return ReadGeometry(D_full, D_full, rerope_scale=True)
    if mode == "window":
        return ReadGeometry(D_full)
    if mode in ("dflash", "yarn"):
        return ReadGeometry(None, yarn=mode == "yarn")
    if mode in ("streaming", "cmr"):
        return ReadGeometry(None, selection=mode, renumbered=True)
    if mode == "infllm":
        return ReadGeometry(D_full, D_full - 1, selection="infllm")
    raise ValueError(f"unknown reading mode {mode!r}")


def plan_layer_read(
    cfg: FoldConfig,
    *,
    num_context: int,
    block_start: int,
    query_length: int,
    block_size: int,
    rope: RotaryTables,
    sliding_window: int | None = None,
    device: torch.device | str = "cpu",
) -> LayerRead:
    """Reduce ``cfg`` to the read of one layer (its :func:`read_geometry` at these lengths).

    Args:
        cfg: the reading mode.
        num_context: T, entries in the drafter's context cache (positions ``0 .. T-1``).
        block_start: t, position of block row 0 (``t >= T``).
        query_length: Lq, block rows in this forward.
        block_size: B, the drafter's block size (sets ``D = W + B``).
        rope: rotary tables for this read (the caller passes YaRN's rescaled tables for ``yarn``).
        sliding_window: the layer's native window when it is a sliding-window layer, else None.
    """
    T, t, Lq = int(num_context), int(block_start), int(query_length)
    if t < T:
        raise ValueError(f"block_start ({t}) must not precede the end of the context ({T})")
    device = torch.device(device)
    long = dict(dtype=torch.long, device=device)
    geometry = read_geometry(cfg, block_size, sliding_window)
    if geometry.selection == "streaming":
        return _streaming_read(cfg, T, t, Lq, rope, device)
    if geometry.selection is not None:
        raise ValueError(f"mode {cfg.mode!r} keeps per-request state: plan it through FoldDrafter.plan_read with "
                         "its cache (fold_hf.modeling.retrieval)")
    query_pos = torch.arange(t, t + Lq, **long)
    empty_far = torch.zeros(Lq, 0, dtype=torch.bool, device=device)
    query_scale = rerope_query_scale(query_pos).to(device) if geometry.rerope_scale else None
    D, alpha = geometry.window, geometry.alpha

    if D is None:
        near_index = torch.arange(T, **long)
        near_mask = torch.ones(Lq, T, dtype=torch.bool, device=device)
        return _planned(LayerRead(T, Lq, near_index, near_index.clone(), query_pos, 0, torch.zeros(Lq, **long),
                                  near_mask, empty_far, alpha, query_scale, rope, block_start=t, window_distance=None))

    near_start = max(0, t - D + 1)  # row 0 has the widest window
    near_index = torch.arange(near_start, T, **long)
    dist, rows = _row_distances(T, t, Lq, device)
    near_mask = dist[:, near_start:] < D
    far_stop = 0
    far_mask = empty_far
    far_distance = torch.zeros(Lq, **long)
    if geometry.far is not None:
        far_stop = max(0, min(T, t + Lq - 1 - D + 1))  # the last row has the longest far memory
        far_mask = dist[:, :far_stop] >= D
        # fold: every far entry at t - D_far, read from row r at D_far + r; rerope: at distance D_far from every row
        far_distance = geometry.far + rows if geometry.far_per_row else torch.full_like(rows, geometry.far)
    return _planned(LayerRead(T, Lq, near_index, near_index.clone(), query_pos, far_stop, far_distance,
                              near_mask, far_mask, alpha, query_scale, rope, block_start=t, window_distance=D))


RERoPE_LOG_BASE = 4096  # the paper's ReRoPE log base, for every model (B.3)


def rerope_query_scale(query_pos: torch.Tensor) -> torch.Tensor:
    """ReRoPE's query scale ``max(1, log(p + 1) / log 4096)`` of block rows at positions ``query_pos [Lq]`` (fp32;
    fp64 positions give fp64)."""
    dtype = torch.float64 if query_pos.dtype == torch.float64 else torch.float32
    return (torch.log(query_pos.to(torch.float64) + 1) / math.log(RERoPE_LOG_BASE)).clamp_min(1.0).to(dtype)


def _planned(read: LayerRead) -> LayerRead:
    read.geometry_from_plan = True
    return read


def _streaming_read(cfg: FoldConfig, T: int, t: int, Lq: int, rope: RotaryTables, device) -> LayerRead:
    long = dict(dtype=torch.long, device=device)
    budget = cfg.streaming_budget
    if T <= budget:
        keep = torch.arange(T, **long)
    else:
        recent = budget - cfg.sinks
        keep = torch.cat((torch.arange(cfg.sinks, **long), torch.arange(T - recent, T, **long)))
    kept = keep.numel()
    # kept entries renumbered 0..kept-1; the block follows them (keeping any gap between context and block)
    near_key_pos = torch.arange(kept, **long)
    query_pos = torch.arange(kept + (t - T), kept + (t - T) + Lq, **long)
    near_mask = torch.ones(Lq, kept, dtype=torch.bool, device=device)
    return LayerRead(T, Lq, keep, near_key_pos, query_pos, 0, torch.zeros(Lq, **long), near_mask,
                     torch.zeros(Lq, 0, dtype=torch.bool, device=device), 1.0, None, rope)
