"""Triton kernels of the FOLD read over one unrotated context cache (flash-decoding style).

Imported only when Triton is usable (:func:`fold_hf.import_utils.is_triton_available`); the pure-torch twin
with the same signature is :func:`fold_hf.kernels.fold_read.naive.fold_read_geometry_reference`.

Layout of the work:

* one program per (KV head, context split, row block). A row block packs the ``G = Hq / Hkv`` query heads
  of the KV head times the ``Lq`` block rows (row ``m = g * Lq + r``), so each key tile is loaded once for
  every query that reads it (GQA without repeating keys);
* every program keeps two online-softmax states per row: the window branch (keys rotated at their position
  ``j`` on the fly from the cos/sin tables, one dot per rotate_half channel group so nothing is loaded twice) and
  the far branch (unrotated keys against the far query, logits times ``alpha``, or a running top-1 when ``alpha``
  is infinite);
* a tile lying wholly before the widest window (row 0's) is far memory for every row: it is read without
  any rope load; tiles that meet a window are read by both branches under per-row masks ``p - j`` vs ``D``;
  tiles no row reads (before the window of a read without far memory) are never loaded;
* split 0 also reads the ``Lq`` block keys into the window branch;
* a second kernel (:mod:`.triton_merge`) merges the splits of each row in log space and then merges the two
  branches by mass: ``o = o_N + sigmoid(log Z_F - lse_N) (o_F - o_N)``.

Tile sizes, split counts and the partial buffers are planned in :mod:`.launch` (no Triton there).

The same split kernel with ``KEYS_PREROTATED`` and ``BLOCK_CAUSAL`` (no window, no far branch) is the target's
verify attention (:func:`decode_attention_triton`): the cache holds rotated keys, so each tile is one dot, and
block row ``r`` sees the block keys ``c <= r``.

Logits live in base 2 inside the kernels (``exp2``); everything accumulates in fp32.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..triton_pdl import launch_options, pdl_enter
from .launch import (Tuning, inner_contiguous, launch_plan, length_arguments, next_pow2, partials, read_shapes,
                     read_splits)
from .triton_merge import launch_merge

LOG2E = 1.4426950408889634


@triton.jit
def _online_update(m, l, acc, s, v, valid, HARD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold a tile of base-2 logits ``s [BM, BN]`` (``valid`` mask) and values ``v [BN, BDV]`` into a state."""
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, 1))
    # a row that has seen nothing yet keeps m = -inf: shift by 0 there so no inf - inf appears
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    if HARD:
        # top-1: the state holds the value rows at the running maximum (ties share the weight)
        p = tl.where(valid & (s == m_new[:, None]), 1.0, 0.0)
        keep = tl.where(m == m_new, 1.0, 0.0)
    else:
        p = tl.exp2(s - m_shift[:, None])
        keep = tl.exp2(m - m_shift)
    l = l * keep + tl.sum(p, 1)
    acc = acc * keep[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l, acc


@triton.jit(do_not_specialize=["ctx_len_value", "block_start_value", "window"])
def _fold_split_kernel(
    QN, QF, K, V, BK, BV, COS, SIN,
    CTX_LEN_PTR, ctx_len_value, BLOCK_START_PTR, block_start_value, window,
    PART_M, PART_L, PART_ACC,
    stride_kh, stride_kn, stride_vh, stride_vn, stride_bkh, stride_bkn, stride_bvh, stride_bvn, stride_cos,
    num_rows, Lq, G, head_dim, value_dim, half_rotary, chunk, num_splits, window_splits, near_log2_scale,
    far_log2_scale, ROW_PTR, kv_heads, stride_kb, stride_vb, stride_bkb, stride_bvb,
    LEN_FROM_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_FAR: tl.constexpr, FAR_HARD: tl.constexpr,
    KEYS_PREROTATED: tl.constexpr, BLOCK_CAUSAL: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_X: tl.constexpr, HAS_REST: tl.constexpr,
    MIXED_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # row blocks of one (head, split) launch side by side so their shared key tiles come from L2
    row_block = tl.program_id(0)
    head_id = tl.program_id(1)  # ROWS: read a's KV head h at a * kv_heads + h (the partials' head index)
    split = tl.program_id(2)
    if ROWS:
        # the reads of several rows in one launch: read a's queries, block and lengths at index a, its context in
        # cache row ROW_PTR[a] of the buffers
        a = head_id // kv_heads
        head = head_id % kv_heads
        cache_row = tl.load(ROW_PTR + a).to(tl.int64)
        T = tl.load(CTX_LEN_PTR + a)
        t = tl.load(BLOCK_START_PTR + a)
    else:
        a = 0
        head = head_id
        cache_row = 0
        if LEN_FROM_PTR:
            T = tl.load(CTX_LEN_PTR)
            t = tl.load(BLOCK_START_PTR)
        else:
            T = ctx_len_value
            t = block_start_value

    offs_m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < num_rows
    d_ok = offs_d < head_dim
    dv_ok = offs_dv < value_dim
    r = offs_m % Lq
    q_head = head * G + offs_m // Lq
    if ROWS:  # queries are contiguous [A, Hq, Lq, Dh]: read a's heads follow the kv_heads * G of the reads before it
        q_head = q_head + a * kv_heads * G
    # queries are contiguous [Hq, Lq, Dh]: row m of this KV head sits at (q_head * Lq + r) * Dh
    q_off = (q_head.to(tl.int64) * Lq + r) * head_dim
    q_mask = row_ok[:, None] & d_ok[None, :]
    dtype = QN.dtype.element_ty

    k_base = K + head.to(tl.int64) * stride_kh
    v_base = V + head.to(tl.int64) * stride_vh
    bk_base = BK + head.to(tl.int64) * stride_bkh
    bv_base = BV + head.to(tl.int64) * stride_bvh
    if ROWS:
        k_base += cache_row * stride_kb
        v_base += cache_row * stride_vb
        bk_base += a.to(tl.int64) * stride_bkb
        bv_base += a.to(tl.int64) * stride_bvb
    # row r's window starts at entry p - D + 1; row 0 has the widest window
    # scalar bounds use `if` rather than tl.minimum/maximum, which the interpreter turns into 1-element tensors
    lo = split * chunk
    hi = lo + chunk
    if hi > T:
        hi = T
    if HAS_WINDOW:
        if window_splits > 0:
            # the window region (from row 0's tile-aligned window start) gets the last `window_splits` programs, so
            # its rope-and-mask tiles do not queue behind one program; the far-only region [0, boundary) the rest
            boundary = ((t - window + 1) // BLOCK_N) * BLOCK_N
            if boundary < 0:
                boundary = 0
            if boundary > T:
                boundary = T
            far_splits = num_splits - window_splits
            if split < far_splits:
                region_chunk = (boundary + far_splits - 1) // far_splits
                region_chunk = ((region_chunk + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
                lo = split * region_chunk
                hi = lo + region_chunk
                if hi > boundary:
                    hi = boundary
            else:
                region_chunk = (T - boundary + window_splits - 1) // window_splits
                region_chunk = ((region_chunk + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
                lo = boundary + (split - far_splits) * region_chunk
                hi = lo + region_chunk
                if hi > T:
                    hi = T
    mixed_start = lo
    if HAS_WINDOW:
        window_start = t + r - window + 1
        # tiles wholly before the widest window (row 0's) are far memory of every row, or never read
        widest_tile = ((t - window + 1) // BLOCK_N) * BLOCK_N
        if widest_tile > mixed_start:
            mixed_start = widest_tile
    else:
        window_start = r * 0
    far_only_end = mixed_start
    if far_only_end > hi:
        far_only_end = hi

    neg_inf = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m_n = neg_inf
    l_n = tl.zeros([BLOCK_M], tl.float32)
    acc_n = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    m_f = neg_inf
    l_f = tl.zeros([BLOCK_M], tl.float32)
    acc_f = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    if HAS_FAR:
        q_far = tl.load(QF + q_off[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
        far_stop = t + Lq - window  # the last row has the longest far memory (entries < T by the tile masks)
        for start in range(lo, far_only_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_ok = offs_n < hi
            k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                        mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :],
                        mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
            s = tl.dot(q_far, tl.trans(k), input_precision=DOT_PRECISION) * far_log2_scale
            m_f, l_f, acc_f = _online_update(m_f, l_f, acc_f, s, v, n_ok[None, :], FAR_HARD, DOT_PRECISION)
    else:
        far_stop = 0

    # window tiles work on the channel groups of rotate_half: x1 = [0, h), x2 = [h, 2h) rotate together
    # (x1 c - x2 s, x2 c + x1 s with the first half of the duplicated tables), the rest [2h, Dh) passes through;
    # the logits are the sum of one dot per group, so no channel is loaded twice
    offs_h = tl.arange(0, BLOCK_H)
    h_ok = offs_h < half_rotary
    offs_x = tl.arange(0, BLOCK_X)
    rest_dim = head_dim - 2 * half_rotary
    x_ok = offs_x < rest_dim
    if KEYS_PREROTATED:
        # the cache holds keys rotated at their positions (a target's cache): one dot over all channels
        q_whole = tl.load(QN + q_off[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
    else:
        qn1 = tl.load(QN + q_off[:, None] + offs_h[None, :], mask=row_ok[:, None] & h_ok[None, :], other=0.0)
        qn2 = tl.load(QN + q_off[:, None] + half_rotary + offs_h[None, :], mask=row_ok[:, None] & h_ok[None, :],
                      other=0.0)
        qn3 = tl.load(QN + q_off[:, None] + 2 * half_rotary + offs_x[None, :],
                      mask=row_ok[:, None] & x_ok[None, :], other=0.0)
    if HAS_FAR:
        qf1 = tl.load(QF + q_off[:, None] + offs_h[None, :], mask=row_ok[:, None] & h_ok[None, :], other=0.0)
        qf2 = tl.load(QF + q_off[:, None] + half_rotary + offs_h[None, :], mask=row_ok[:, None] & h_ok[None, :],
                      other=0.0)
        qf3 = tl.load(QF + q_off[:, None] + 2 * half_rotary + offs_x[None, :],
                      mask=row_ok[:, None] & x_ok[None, :], other=0.0)
    for start in tl.range(mixed_start, hi, BLOCK_N, num_stages=MIXED_STAGES):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        rows_n = offs_n[:, None].to(tl.int64)
        if KEYS_PREROTATED:
            k = tl.load(k_base + rows_n * stride_kn + offs_d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            v = tl.load(v_base + rows_n * stride_vn + offs_dv[None, :], mask=n_ok[:, None] & dv_ok[None, :],
                        other=0.0)
            s = tl.dot(q_whole, tl.trans(k), input_precision=DOT_PRECISION)
        else:
            h_mask = n_ok[:, None] & h_ok[None, :]
            x1 = tl.load(k_base + rows_n * stride_kn + offs_h[None, :], mask=h_mask, other=0.0)
            x2 = tl.load(k_base + rows_n * stride_kn + half_rotary + offs_h[None, :], mask=h_mask, other=0.0)
            v = tl.load(v_base + rows_n * stride_vn + offs_dv[None, :], mask=n_ok[:, None] & dv_ok[None, :],
                        other=0.0)
            cos = tl.load(COS + rows_n * stride_cos + offs_h[None, :], mask=h_mask, other=0.0)
            sin = tl.load(SIN + rows_n * stride_cos + offs_h[None, :], mask=h_mask, other=0.0)
            x1f = x1.to(tl.float32)
            x2f = x2.to(tl.float32)
            r1 = (x1f * cos - x2f * sin).to(dtype)
            r2 = (x2f * cos + x1f * sin).to(dtype)
            s = tl.dot(qn1, tl.trans(r1), input_precision=DOT_PRECISION)
            s = tl.dot(qn2, tl.trans(r2), acc=s, input_precision=DOT_PRECISION)
            if HAS_REST:
                x3 = tl.load(k_base + rows_n * stride_kn + 2 * half_rotary + offs_x[None, :],
                             mask=n_ok[:, None] & x_ok[None, :], other=0.0)
                s = tl.dot(qn3, tl.trans(x3), acc=s, input_precision=DOT_PRECISION)
        in_window = n_ok[None, :] & (offs_n[None, :] >= window_start[:, None])
        m_n, l_n, acc_n = _online_update(m_n, l_n, acc_n, s * near_log2_scale, v, in_window, False, DOT_PRECISION)
        if HAS_FAR:
            if start < far_stop:
                s = tl.dot(qf1, tl.trans(x1), input_precision=DOT_PRECISION)
                s = tl.dot(qf2, tl.trans(x2), acc=s, input_precision=DOT_PRECISION)
                if HAS_REST:
                    s = tl.dot(qf3, tl.trans(x3), acc=s, input_precision=DOT_PRECISION)
                in_far = n_ok[None, :] & (offs_n[None, :] < window_start[:, None])
                m_f, l_f, acc_f = _online_update(m_f, l_f, acc_f, s * far_log2_scale, v, in_far, FAR_HARD,
                                                 DOT_PRECISION)

    if split == 0:
        # the block keys (already rotated) are in every row's window
        offs_l = tl.arange(0, BLOCK_L)
        l_ok = offs_l < Lq
        bk = tl.load(bk_base + offs_l[:, None] * stride_bkn + offs_d[None, :],
                     mask=l_ok[:, None] & d_ok[None, :], other=0.0)
        bv = tl.load(bv_base + offs_l[:, None] * stride_bvn + offs_dv[None, :],
                     mask=l_ok[:, None] & dv_ok[None, :], other=0.0)
        q_near = tl.load(QN + q_off[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
        s = tl.dot(q_near, tl.trans(bk), input_precision=DOT_PRECISION) * near_log2_scale
        if BLOCK_CAUSAL:
            block_visible = l_ok[None, :] & (offs_l[None, :] <= r[:, None])
        else:
            block_visible = l_ok[None, :]
        m_n, l_n, acc_n = _online_update(m_n, l_n, acc_n, s, bv, block_visible, False, DOT_PRECISION)

    # partials: [branch, Hkv, splits, rows(, Dv)]
    part = (head_id * num_splits + split).to(tl.int64) * num_rows + offs_m
    branch_stride = tl.num_programs(1).to(tl.int64) * num_splits * num_rows
    tl.store(PART_M + part, m_n, mask=row_ok)
    tl.store(PART_L + part, l_n, mask=row_ok)
    acc_mask = row_ok[:, None] & dv_ok[None, :]
    tl.store(PART_ACC + part[:, None] * value_dim + offs_dv[None, :], acc_n, mask=acc_mask)
    if HAS_FAR:
        tl.store(PART_M + branch_stride + part, m_f, mask=row_ok)
        tl.store(PART_L + branch_stride + part, l_f, mask=row_ok)
        tl.store(PART_ACC + (branch_stride + part[:, None]) * value_dim + offs_dv[None, :], acc_f, mask=acc_mask)


def fold_read_triton(query_near: torch.Tensor, query_far: torch.Tensor | None, context_keys: torch.Tensor,
                     context_values: torch.Tensor, block_keys: torch.Tensor, block_values: torch.Tensor,
                     cos: torch.Tensor, sin: torch.Tensor, context_length, block_start, window: int | None,
                     alpha: float, num_splits: int | None = None, **tuning) -> torch.Tensor:
    """FOLD read of one layer in two Triton launches (split pass, merge pass).

    The contract (arguments, shapes, membership) is that of its twin
    :func:`~fold_hf.kernels.fold_read.naive.fold_read_geometry_reference`, with these kernel specifics:

    Args:
        query_near, query_far, context_keys, context_values, block_keys, block_values: bf16, fp16 or fp32 (the
            dtype of ``query_near``); the context buffers ``[1, Hkv, capacity, *]`` are never read past ``T``.
        cos, sin: fp32 tables ``[max_position, rotary_dim]``, ``max_position >= context_length``.
        context_length, block_start: ints, or int32 CUDA tensors ``[1]`` (both the one or the other), read on the
            device: no host sync, so the call can be captured in a CUDA graph (the grid then depends only on
            ``capacity``).
        alpha: 1.0 = one softmax over both branches; ``math.inf`` = top-1 read.
        num_splits: context splits (default: about two programs per SM over ``T``, or over ``capacity``
            when ``context_length`` is a tensor, each of at least :func:`.launch.min_split_entries` entries).
        tuning: overrides (:class:`.launch.Tuning`), among them ``window_splits``: extra programs given to the
            window region alone (the last ``W + B`` entries, where keys are rotated and masked per row), on top of
            ``num_splits`` for the far-only region (a read without far memory launches the window's programs
            only); 0 splits the whole context evenly, which leaves the window to one program per KV head. Default:
            16 with a window, else 0 (measured in docs/design.md §6).

    Returns:
        ``[1, Lq, Hq, Dv]`` in ``query_near.dtype``.
    """
    Hq, Lq, Dh, Hkv, capacity, Dv = read_shapes("fold_read_triton", query_near, context_keys, context_values)
    len_from_ptr = isinstance(context_length, torch.Tensor)
    if len_from_ptr != isinstance(block_start, torch.Tensor):
        raise ValueError("context_length and block_start must both be ints or both be tensors")
    ctx_ptr, ctx_value, span = length_arguments(context_length, capacity, query_near)
    start_ptr, start_value = (block_start.to(torch.int32), 0) if len_from_ptr else (query_near, int(block_start))
    return _fold_read(query_near, query_far, context_keys, context_values, block_keys, block_values, cos, sin,
                      (ctx_ptr, ctx_value, start_ptr, start_value, span, len_from_ptr), window, alpha, num_splits,
                      Tuning(**tuning), None)


def fold_read_rows_triton(query_near: torch.Tensor, query_far: torch.Tensor | None, context_keys: torch.Tensor,
                          context_values: torch.Tensor, block_keys: torch.Tensor, block_values: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, context_lengths: torch.Tensor,
                          block_starts: torch.Tensor, rows: torch.Tensor, window: int | None, alpha: float,
                          num_splits: int | None = None, **tuning) -> torch.Tensor:
    """The FOLD reads of ``A`` rows of a batch in one split launch and one merge launch: read ``a`` is
    :func:`fold_read_triton` of its queries and block over cache row ``rows[a]`` at its own length (the batched
    rounds' drafts, :mod:`fold_hf.generation.static_drafter_rows`; its twin loops
    :func:`~fold_hf.kernels.fold_read.naive.fold_read_geometry_reference` over the rows).

    Args:
        query_near, query_far: ``[A, Hq, Lq, Dh]``; block_keys, block_values: ``[A, Hkv, Lq, *]``.
        context_keys, context_values: ``[batch, Hkv, capacity, *]`` (every row's cache row; read ``a`` reads row
            ``rows[a]``, never past its ``context_lengths[a]``).
        context_lengths, block_starts, rows: ``[A]`` integer tensors on the device (int32 or converted), read there:
            capturable in a CUDA graph; the splits cover ``capacity`` entries.
        cos, sin, window, alpha, num_splits, tuning: as :func:`fold_read_triton` (the default splits are sized for
            the ``A * Hkv`` heads of the launch).

    Returns:
        ``[A, Lq, Hq, Dv]`` in ``query_near.dtype``.
    """
    Hq, Lq, Dh, Hkv, capacity, Dv, A = rows_shapes("fold_read_rows_triton", query_near, context_keys, context_values,
                                                   block_keys, context_lengths, rows)
    ctx = context_lengths.reshape(-1).to(torch.int32)
    start = block_starts.reshape(-1).to(torch.int32)
    return _fold_read(query_near, query_far, context_keys, context_values, block_keys, block_values, cos, sin,
                      (ctx, 0, start, 0, capacity, True), window, alpha, num_splits, Tuning(**tuning),
                      rows.reshape(-1).to(torch.int32))


def rows_shapes(name: str, query: torch.Tensor, context_keys: torch.Tensor, context_values: torch.Tensor,
                block_keys: torch.Tensor, lengths: torch.Tensor, rows: torch.Tensor):
    """(Hq, Lq, Dh, Hkv, capacity, Dv, A) of the reads of ``A`` rows, or a ValueError naming ``name``."""
    A, Hq, Lq, Dh = query.shape
    _, Hkv, capacity, _ = context_keys.shape
    if Hq % Hkv:
        raise ValueError(f"{name}: query heads ({Hq}) must be a multiple of KV heads ({Hkv})")
    if query.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{name}: unsupported dtype {query.dtype}")
    if block_keys.shape[0] != A or lengths.numel() != A or rows.numel() != A:
        raise ValueError(f"{name}: {A} reads need {A} blocks, lengths and cache rows, got {block_keys.shape[0]}, "
                         f"{lengths.numel()} and {rows.numel()}")
    if not (isinstance(lengths, torch.Tensor) and isinstance(rows, torch.Tensor)):
        raise ValueError(f"{name}: lengths and rows are device tensors")
    return Hq, Lq, Dh, Hkv, capacity, context_values.shape[-1], A


def _rows_strides(rows, *tensors) -> tuple:
    """``(ROW_PTR, kv_heads, stride_kb, stride_vb, stride_bkb, stride_bvb)`` of the split kernel: the batch strides of
    the context and block buffers when ``rows`` (int32 ``[A]``) is given; placeholders otherwise (``ROWS`` off)."""
    keys, values, block_keys, block_values = tensors
    if rows is None:
        return keys, keys.shape[1], 0, 0, 0, 0
    return rows, keys.shape[1], keys.stride(0), values.stride(0), block_keys.stride(0), block_values.stride(0)


def _fold_read(query_near, query_far, context_keys, context_values, block_keys, block_values, cos, sin, lengths,
               window, alpha, num_splits, tune, rows) -> torch.Tensor:
    """The launches of :func:`fold_read_triton` (``rows`` None: one read) and :func:`fold_read_rows_triton`
    (``rows`` int32 ``[A]``); ``lengths`` = ``(ctx_ptr, ctx_value, start_ptr, start_value, span, len_from_ptr)``."""
    A, Hq, Lq, Dh = query_near.shape
    Hkv, Dv = context_keys.shape[1], context_values.shape[-1]
    G = Hq // Hkv
    device = query_near.device
    dtype = query_near.dtype
    has_far = query_far is not None
    if has_far and window is None:
        raise ValueError("a far branch needs a window distance")
    far_hard = math.isinf(alpha)
    ctx_ptr, ctx_value, start_ptr, start_value, span, len_from_ptr = lengths

    # kernels index the innermost dim with stride 1 and the queries as contiguous [A, Hq, Lq, Dh]
    query_near = query_near.contiguous()
    query_far = query_far.to(dtype).contiguous() if has_far else query_near

    context_keys, context_values = inner_contiguous(context_keys, dtype), inner_contiguous(context_values, dtype)
    block_keys, block_values = inner_contiguous(block_keys, dtype), inner_contiguous(block_values, dtype)
    cos, sin = inner_contiguous(cos, torch.float32), inner_contiguous(sin, torch.float32)
    if sin.stride(0) != cos.stride(0):
        sin = sin.contiguous()
        cos = cos.contiguous()

    heads = A * Hkv  # the launch's (read, KV head) programs
    plan = launch_plan(G * Lq, Dh, Dv, heads, span, dtype, device, num_splits, *tune.split_pass,
                       branches=2 if has_far else 1, pipelined=window is not None)
    window_splits, num_splits = read_splits(plan.num_splits, window, has_far, tune.window_splits)
    half_rotary = cos.shape[-1] // 2
    part_m, part_l, part_acc = partials(2 if has_far else 1, heads, num_splits, plan.num_rows, Dv, device)
    out = torch.empty(A, Lq, Hq, Dv, device=device, dtype=dtype)

    far_log2_scale = LOG2E if far_hard else float(alpha) * LOG2E
    _fold_split_kernel[(plan.row_blocks, heads, num_splits)](
        query_near, query_far, context_keys, context_values, block_keys, block_values, cos, sin,
        ctx_ptr, ctx_value, start_ptr, start_value, int(window) if window is not None else 0,
        part_m, part_l, part_acc,
        context_keys.stride(1), context_keys.stride(2), context_values.stride(1), context_values.stride(2),
        block_keys.stride(1), block_keys.stride(2), block_values.stride(1), block_values.stride(2), cos.stride(0),
        plan.num_rows, Lq, G, Dh, Dv, half_rotary, plan.chunk, num_splits, window_splits, LOG2E, far_log2_scale,
        *_rows_strides(rows, context_keys, context_values, block_keys, block_values),
        LEN_FROM_PTR=len_from_ptr, HAS_WINDOW=window is not None, HAS_FAR=has_far, FAR_HARD=far_hard,
        KEYS_PREROTATED=False, BLOCK_CAUSAL=False, ROWS=rows is not None,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_L=next_pow2(Lq), BLOCK_D=plan.block_d,
        BLOCK_DV=plan.block_dv,
        BLOCK_H=next_pow2(half_rotary), BLOCK_X=next_pow2(Dh - 2 * half_rotary), HAS_REST=Dh > 2 * half_rotary,
        # the window loop is never software-pipelined: pipelining it with its conditional far update gave wrong far
        # branches on the H200 (docs/design.md §6), while one stage matches the oracle
        MIXED_STAGES=1, DOT_PRECISION=plan.dot_precision, num_warps=plan.num_warps, num_stages=plan.num_stages,
        **launch_options(device),
    )
    launch_merge(part_m, part_l, part_acc, out, Lq, G, num_splits, plan.block_dv, has_far, alpha, tune.merge_pass,
                 kv_heads=Hkv)
    return out


def decode_attention_triton(query: torch.Tensor, context_keys: torch.Tensor, context_values: torch.Tensor,
                            block_keys: torch.Tensor, block_values: torch.Tensor, context_length,
                            scaling: float = 1.0, num_splits: int | None = None,
                            max_context_length: int | None = None, **tuning) -> torch.Tensor:
    """Causal attention of a target's verify step (AR: ``L = 1``; speculative: one block of ``L``) in two launches.

    The split kernel of :func:`fold_read_triton` with ``KEYS_PREROTATED`` (the cache holds keys rotated at their
    positions, as a target's cache does: one dot per tile, no rope tables) and ``BLOCK_CAUSAL`` (block row ``r``
    sees block keys ``c <= r``); no window, no far branch. Row ``r`` of the block sits at position
    ``context_length + r`` and reads cache entries ``[0, context_length)`` and block keys ``0 .. r``.

    Args:
        query: ``[1, Hq, L, Dh]`` queries, already rotated; bf16, fp16 or fp32.
        context_keys: ``[1, Hkv, capacity, Dh]`` cache buffer of rotated keys; entries ``>= context_length``
            are never read (the block's own entries may already sit there: they are read from the block).
        context_values: ``[1, Hkv, capacity, Dv]``.
        block_keys: ``[1, Hkv, L, Dh]`` the block's keys, rotated; block_values ``[1, Hkv, L, Dv]``.
        context_length: entries of the cache before the block, an int or an int32/long CUDA tensor ``[1]``
            (read on the device: no host sync, so the call can be captured in a CUDA graph).
        scaling: logit scale, folded into the kernel's base-2 scale (no extra pass over the query).
        num_splits: context splits (default: about two programs per SM over the span below).
        max_context_length: static bound on ``context_length`` when it is a tensor, used to size the splits
            (default ``capacity``; a graph per length bucket passes the bucket so splits stay balanced).
        tuning: overrides (:class:`.launch.Tuning`; no ``window_splits`` here). The key loop has no
            data-dependent branch around a dot here (no far branch), so it is software-pipelined with
            ``num_stages`` (default 3).

    Returns:
        ``[1, L, Hq, Dv]`` in ``query.dtype``.
    """
    tune = Tuning(**tuning)
    if tune.window_splits is not None:
        raise TypeError("decode_attention_triton reads no window: window_splits does not apply")
    Hq, Lq, Dh, Hkv, capacity, Dv = read_shapes("decode_attention_triton", query, context_keys, context_values)
    len_from_ptr = isinstance(context_length, torch.Tensor)
    ctx_ptr, ctx_value, span = length_arguments(context_length, capacity, query, max_context_length)
    return _decode_attention(query, context_keys, context_values, block_keys, block_values,
                             (ctx_ptr, ctx_value, span, len_from_ptr), scaling, num_splits, tune, None)


def decode_attention_rows_triton(query: torch.Tensor, context_keys: torch.Tensor, context_values: torch.Tensor,
                                 block_keys: torch.Tensor, block_values: torch.Tensor, context_lengths: torch.Tensor,
                                 rows: torch.Tensor, scaling: float = 1.0, num_splits: int | None = None,
                                 max_context_length: int | None = None, **tuning) -> torch.Tensor:
    """The verify attention of ``A`` rows of a batch in one split launch and one merge launch: row ``a`` is
    :func:`decode_attention_triton` of its queries and block over cache row ``rows[a]`` at its own length (its twin
    loops :func:`~fold_hf.kernels.fold_read.naive.decode_attention_reference` over the rows).

    Args:
        query: ``[A, Hq, L, Dh]`` rotated queries; block_keys, block_values: ``[A, Hkv, L, *]``.
        context_keys, context_values: ``[batch, Hkv, capacity, *]``; row ``a`` reads cache row ``rows[a]``'s entries
            ``[0, context_lengths[a])``.
        context_lengths, rows: ``[A]`` integer device tensors (read on the device: capturable).
        scaling, num_splits, max_context_length, tuning: as :func:`decode_attention_triton` (the splits cover
            ``max_context_length`` or ``capacity`` entries, sized for the ``A * Hkv`` heads of the launch).

    Returns:
        ``[A, L, Hq, Dv]`` in ``query.dtype``.
    """
    tune = Tuning(**tuning)
    if tune.window_splits is not None:
        raise TypeError("decode_attention_rows_triton reads no window: window_splits does not apply")
    Hq, Lq, Dh, Hkv, capacity, Dv, A = rows_shapes("decode_attention_rows_triton", query, context_keys,
                                                   context_values, block_keys, context_lengths, rows)
    span = capacity if max_context_length is None else min(int(max_context_length), capacity)
    return _decode_attention(query, context_keys, context_values, block_keys, block_values,
                             (context_lengths.reshape(-1).to(torch.int32), 0, span, True), scaling, num_splits, tune,
                             rows.reshape(-1).to(torch.int32))


def _decode_attention(query, context_keys, context_values, block_keys, block_values, lengths, scaling, num_splits,
                      tune, rows) -> torch.Tensor:
    """The launches of :func:`decode_attention_triton` (``rows`` None) and :func:`decode_attention_rows_triton`;
    ``lengths`` = ``(ctx_ptr, ctx_value, span, len_from_ptr)``."""
    A, Hq, Lq, Dh = query.shape
    Hkv, Dv = context_keys.shape[1], context_values.shape[-1]
    G = Hq // Hkv
    device, dtype = query.device, query.dtype
    query = query.contiguous()
    context_keys, context_values = inner_contiguous(context_keys, dtype), inner_contiguous(context_values, dtype)
    block_keys, block_values = inner_contiguous(block_keys, dtype), inner_contiguous(block_values, dtype)
    ctx_ptr, ctx_value, span, len_from_ptr = lengths

    heads = A * Hkv
    plan = launch_plan(G * Lq, Dh, Dv, heads, span, dtype, device, num_splits, *tune.split_pass, decode=True)
    part_m, part_l, part_acc = partials(1, heads, plan.num_splits, plan.num_rows, Dv, device)
    out = torch.empty(A, Lq, Hq, Dv, device=device, dtype=dtype)

    _fold_split_kernel[(plan.row_blocks, heads, plan.num_splits)](
        query, query, context_keys, context_values, block_keys, block_values, query, query,
        ctx_ptr, ctx_value, ctx_ptr, ctx_value, 0,
        part_m, part_l, part_acc,
        context_keys.stride(1), context_keys.stride(2), context_values.stride(1), context_values.stride(2),
        block_keys.stride(1), block_keys.stride(2), block_values.stride(1), block_values.stride(2), 0,
        plan.num_rows, Lq, G, Dh, Dv, 0, plan.chunk, plan.num_splits, 0, float(scaling) * LOG2E, LOG2E,
        *_rows_strides(rows, context_keys, context_values, block_keys, block_values),
        LEN_FROM_PTR=len_from_ptr, HAS_WINDOW=False, HAS_FAR=False, FAR_HARD=False,
        KEYS_PREROTATED=True, BLOCK_CAUSAL=True, ROWS=rows is not None, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        BLOCK_L=next_pow2(Lq), BLOCK_D=plan.block_d, BLOCK_DV=plan.block_dv, BLOCK_H=16, BLOCK_X=16, HAS_REST=False,
        # no far branch: the key loop holds no data-dependent branch, so pipelining it is safe
        MIXED_STAGES=plan.num_stages, DOT_PRECISION=plan.dot_precision, num_warps=plan.num_warps,
        num_stages=plan.num_stages, **launch_options(device),
    )
    launch_merge(part_m, part_l, part_acc, out, Lq, G, plan.num_splits, plan.block_dv, False, 1.0, tune.merge_pass,
                 kv_heads=Hkv)
    return out
