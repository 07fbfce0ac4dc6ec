"""Triton kernels of the FOLD read over one unrotated context cache (flash-decoding style).

Imported only when Triton is usable (:func:`fold_hf.import_utils.is_triton_available`); the pure-torch twin
with the same signature is :func:`fold_hf.kernels.fold_read.naive.fold_read_geometry_reference`.

Layout of the work:

* one program per (KV head, context split, row block). A row block packs the ``G = Hq / Hkv`` query heads
  of the KV head times the ``Lq`` block rows (row ``m = g * Lq + r``), so each key tile is loaded once for
  every query that reads it (GQA without repeating keys);
* every program keeps two online-softmax states per row: the window branch (keys rotated at their position
  ``j`` on the fly from the cos/sin tables, one dot per rotate_half channel group so nothing is loaded twice) and the far branch (unrotated keys against the far query,
  logits times ``alpha``, or a running top-1 when ``alpha`` is infinite);
* a tile lying wholly before the widest window (row 0's) is far memory for every row: it is read without
  any rope load; tiles that meet a window are read by both branches under per-row masks ``p - j`` vs ``D``;
  tiles no row reads (before the window of a read without far memory) are never loaded;
* split 0 also reads the ``Lq`` block keys into the window branch;
* a second kernel merges the splits of each row in log space and then merges the two branches by mass:
  ``o = o_N + sigmoid(log Z_F - lse_N) (o_F - o_N)``.

The same split kernel with ``KEYS_PREROTATED`` and ``BLOCK_CAUSAL`` (no window, no far branch) is the target's
verify attention (:func:`decode_attention_triton`): the cache holds rotated keys, so each tile is one dot, and
block row ``r`` sees the block keys ``c <= r``.

Logits live in base 2 inside the kernels (``exp2``); everything accumulates in fp32.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..triton_pdl import launch_options, pdl_enter

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)  # jit code may only read constexpr globals


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
    far_log2_scale, LEN_FROM_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_FAR: tl.constexpr, FAR_HARD: tl.constexpr,
    KEYS_PREROTATED: tl.constexpr, BLOCK_CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_X: tl.constexpr, HAS_REST: tl.constexpr,
    MIXED_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    # row blocks of one (head, split) launch side by side so their shared key tiles come from L2
    row_block = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
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
    # queries are contiguous [Hq, Lq, Dh]: row m of this KV head sits at (q_head * Lq + r) * Dh
    q_off = (q_head.to(tl.int64) * Lq + r) * head_dim
    q_mask = row_ok[:, None] & d_ok[None, :]
    dtype = QN.dtype.element_ty

    k_base = K + head.to(tl.int64) * stride_kh
    v_base = V + head.to(tl.int64) * stride_vh
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
        bk = tl.load(BK + head.to(tl.int64) * stride_bkh + offs_l[:, None] * stride_bkn + offs_d[None, :],
                     mask=l_ok[:, None] & d_ok[None, :], other=0.0)
        bv = tl.load(BV + head.to(tl.int64) * stride_bvh + offs_l[:, None] * stride_bvn + offs_dv[None, :],
                     mask=l_ok[:, None] & dv_ok[None, :], other=0.0)
        q_near = tl.load(QN + q_off[:, None] + offs_d[None, :], mask=q_mask, other=0.0)
        s = tl.dot(q_near, tl.trans(bk), input_precision=DOT_PRECISION) * near_log2_scale
        if BLOCK_CAUSAL:
            block_visible = l_ok[None, :] & (offs_l[None, :] <= r[:, None])
        else:
            block_visible = l_ok[None, :]
        m_n, l_n, acc_n = _online_update(m_n, l_n, acc_n, s, bv, block_visible, False, DOT_PRECISION)

    # partials: [branch, Hkv, splits, rows(, Dv)]
    part = (head * num_splits + split).to(tl.int64) * num_rows + offs_m
    branch_stride = tl.num_programs(1).to(tl.int64) * num_splits * num_rows
    tl.store(PART_M + part, m_n, mask=row_ok)
    tl.store(PART_L + part, l_n, mask=row_ok)
    acc_mask = row_ok[:, None] & dv_ok[None, :]
    tl.store(PART_ACC + part[:, None] * value_dim + offs_dv[None, :], acc_n, mask=acc_mask)
    if HAS_FAR:
        tl.store(PART_M + branch_stride + part, m_f, mask=row_ok)
        tl.store(PART_L + branch_stride + part, l_f, mask=row_ok)
        tl.store(PART_ACC + (branch_stride + part[:, None]) * value_dim + offs_dv[None, :], acc_f, mask=acc_mask)


@triton.jit
def _merge_splits(PART_M, PART_L, PART_ACC, base, split_stride, num_splits, offs_dv, dv_ok, value_dim,
                  HARD: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT_CHUNK: tl.constexpr, BLOCK_DV: tl.constexpr,
                  EARLY_ACC: tl.constexpr):
    """Merge one row's split partials: (base-2 log-mass, normalized output ``[BDV]``, mass > 0).

    ``EARLY_ACC`` (only with ``SPLIT_CHUNK >= BLOCK_S``, one load of every split): the ``[BLOCK_S, BLOCK_DV]``
    partial outputs are loaded together with the maxima and masses, so the program waits on one round of loads
    instead of two; the arithmetic is the same, in the same order."""
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < num_splits
    m = tl.load(PART_M + base + offs_s * split_stride, mask=s_ok, other=float("-inf"))
    l = tl.load(PART_L + base + offs_s * split_stride, mask=s_ok, other=0.0)
    if EARLY_ACC:
        acc_all = tl.load(PART_ACC + (base + offs_s[:, None] * split_stride) * value_dim + offs_dv[None, :],
                          mask=s_ok[:, None] & dv_ok[None, :], other=0.0)
    m_max = tl.max(m, 0)
    m_shift = tl.where(m_max == float("-inf"), 0.0, m_max)
    if HARD:
        mass = tl.sum(tl.where(m == m_max, l, 0.0), 0)
    else:
        mass = tl.sum(l * tl.exp2(m - m_shift), 0)
    out = tl.zeros([BLOCK_DV], tl.float32)
    if EARLY_ACC:
        if HARD:
            w_all = tl.where(s_ok & (m == m_max), 1.0, 0.0)
        else:
            w_all = tl.where(s_ok, tl.exp2(m - m_shift), 0.0)
        out += tl.sum(acc_all * w_all[:, None], 0)
    else:
        # the [splits, Dv] partial outputs are summed a few splits at a time to stay in registers
        for first in range(0, num_splits, SPLIT_CHUNK):
            offs_c = first + tl.arange(0, SPLIT_CHUNK)
            c_ok = offs_c < num_splits
            m_c = tl.load(PART_M + base + offs_c * split_stride, mask=c_ok, other=float("-inf"))
            if HARD:
                w_c = tl.where(c_ok & (m_c == m_max), 1.0, 0.0)
            else:
                w_c = tl.where(c_ok, tl.exp2(m_c - m_shift), 0.0)
            acc_c = tl.load(PART_ACC + (base + offs_c[:, None] * split_stride) * value_dim + offs_dv[None, :],
                            mask=c_ok[:, None] & dv_ok[None, :], other=0.0)
            out += tl.sum(acc_c * w_c[:, None], 0)
    out = out / tl.where(mass > 0, mass, 1.0)
    if HARD:
        log2_mass = m_max
    else:
        log2_mass = m_shift + tl.log2(tl.where(mass > 0, mass, 1.0))
    return log2_mass, out, mass > 0


@triton.jit
def _fold_merge_kernel(
    PART_M, PART_L, PART_ACC, OUT, stride_ol, stride_oh,
    num_rows, Lq, G, value_dim, num_splits, inv_alpha,
    HAS_FAR: tl.constexpr, FAR_HARD: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
    BLOCK_DV: tl.constexpr, EARLY_ACC: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    head = tl.program_id(0)
    row = tl.program_id(1)
    # axis 2: the value dims this program writes (BLOCK_DV of them; one program per row when it covers Dv)
    offs_dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < value_dim
    # partial index of split s for this row: (head * S + s) * rows + row
    base = (head * num_splits).to(tl.int64) * num_rows + row
    log2_near, out, _ = _merge_splits(PART_M, PART_L, PART_ACC, base, num_rows, num_splits, offs_dv, dv_ok,
                                      value_dim, False, BLOCK_S, SPLIT_CHUNK, BLOCK_DV, EARLY_ACC)
    if HAS_FAR:
        branch_stride = tl.num_programs(0).to(tl.int64) * num_splits * num_rows
        log2_far, out_far, has_far = _merge_splits(PART_M, PART_L, PART_ACC, branch_stride + base, num_rows,
                                                   num_splits, offs_dv, dv_ok, value_dim, FAR_HARD, BLOCK_S,
                                                   SPLIT_CHUNK, BLOCK_DV, EARLY_ACC)
        # log Z_F = lse(alpha s) / alpha; the far partials hold alpha-scaled logits (plain ones and
        # inv_alpha = 1 for top-1, whose log-mass is the largest logit)
        log_far = log2_far * LN2 * inv_alpha
        log_near = log2_near * LN2
        w_far = tl.where(has_far, tl.sigmoid(log_far - log_near), 0.0)
        out = out + w_far * (out_far - out)
    q_head = head * G + row // Lq
    r = row % Lq
    tl.store(OUT + r.to(tl.int64) * stride_ol + q_head.to(tl.int64) * stride_oh + offs_dv,
             out.to(OUT.dtype.element_ty), mask=dv_ok)


DEFAULT_WINDOW_SPLITS = 16  # programs per KV head for the window region of a read (fold_read_triton)


def _next_pow2(n: int, minimum: int = 16) -> int:
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@functools.lru_cache(maxsize=None)
def _multiprocessor_count(device: torch.device) -> int:
    # asked once per device: an eager read's host time adds to its latency when the read itself is short
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_num_splits(span: int, num_kv_heads: int, block_n: int, device: torch.device) -> int:
    """Splits along the context so that about two programs per SM exist (flash-decoding)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    sms = _multiprocessor_count(device)
    wanted = max(1, -(-2 * sms // max(num_kv_heads, 1)))
    return max(1, min(wanted, -(-max(span, 1) // block_n)))


def _inner_contiguous(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` in ``dtype`` with a unit innermost stride (the kernels index the last dim with stride 1)."""
    x = x.to(dtype)
    return x if x.stride(-1) == 1 else x.contiguous()


def _read_shapes(name: str, query: torch.Tensor, context_keys: torch.Tensor, context_values: torch.Tensor):
    """(Hq, Lq, Dh, Hkv, capacity, Dv) of a batch-1 read, or a ValueError naming ``name``."""
    b, Hq, Lq, Dh = query.shape
    _, Hkv, capacity, _ = context_keys.shape
    if b != 1 or context_keys.shape[0] != 1:
        raise ValueError(f"{name} reads batch 1")
    if Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of KV heads ({Hkv})")
    if query.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"unsupported dtype {query.dtype}")
    return Hq, Lq, Dh, Hkv, capacity, context_values.shape[-1]


@dataclass(frozen=True)
class _LaunchPlan:
    """Tile sizes and the context split of one launch of ``_fold_split_kernel``."""

    num_rows: int
    row_blocks: int
    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    num_warps: int
    num_stages: int
    num_splits: int
    chunk: int
    dot_precision: str


WIDE_TILE_SMEM_BYTES = 128 * 1024  # estimated shared memory of a wide-head tile (the H200 allows 227 KB a block;
# Triton adds layout-conversion buffers beyond the estimate: at head dim 512 it asked for up to 1.5x of it)
DECODE_WIDE_TILE_SMEM_BYTES = 160 * 1024  # the same for the target's decode kernel (pre-rotated keys: no rope
# tiles); 32 x 512 queries with 2 stages of 32 keys (160 KB estimated) launched and ran fastest at Gemma-4's global
# shape on the H200 (benchmarks/results/2026-12-01-nvidia-h200-anatomy)


def wide_tile_smem_estimate(block_m: int, block_n: int, block_d: int, block_dv: int, num_stages: int,
                            dtype: torch.dtype) -> int:
    """Shared-memory bytes of one program's tiles: the query tile plus ``num_stages`` buffered key and value tiles
    (matches what Triton asked for at head dim 512 in bf16: 262,144 bytes for 64 x 512 queries, 3 x 32 keys)."""
    elem = torch.finfo(dtype).bits // 8
    return elem * (block_m * block_d + num_stages * block_n * (block_d + block_dv))


def _fit_wide_tiles(block_m: int, block_n: int, block_d: int, block_dv: int, num_stages: int, dtype: torch.dtype,
                    fixed: tuple[bool, bool, bool], budget: int = WIDE_TILE_SMEM_BYTES) -> tuple[int, int, int]:
    """Shrink, in this order, the pipelining stages (to 2), the key tile (to 16), the row tile (to 16) and the
    stages (to 1) until :func:`wide_tile_smem_estimate` fits ``budget`` bytes; knobs the caller set
    (``fixed``: block_m, block_n, num_stages given) are kept."""
    m_fixed, n_fixed, stages_fixed = fixed

    def fits() -> bool:
        return wide_tile_smem_estimate(block_m, block_n, block_d, block_dv, num_stages, dtype) <= budget

    while not fits():
        if not stages_fixed and num_stages > 2:
            num_stages = 2
        elif not n_fixed and block_n > 16:
            block_n //= 2
        elif not m_fixed and block_m > 16:
            block_m //= 2
        elif not stages_fixed and num_stages > 1:
            num_stages = 1
        else:
            break
    return block_m, block_n, num_stages


def _launch_plan(num_rows: int, Dh: int, Dv: int, Hkv: int, span: int, dtype: torch.dtype, device: torch.device,
                 num_splits: int | None, block_m: int | None, block_n: int | None, num_warps: int | None,
                 num_stages: int | None, decode: bool = False) -> _LaunchPlan:
    """Defaults for the tuning knobs left None, and the even split of ``span`` context entries.

    Tiles of up to 64 x 128 (``block_m x block_d``) run with 4 warps, larger ones with 8: both reads are bound by
    loading keys, and 4 warps measured faster for a 10-token block's packed rows (docs/design.md §6). ``decode``
    (the target's decode kernel, keys pre-rotated): wide heads (over 256) run 4 warps with 32-key tiles under
    :data:`DECODE_WIDE_TILE_SMEM_BYTES` (at Gemma-4's global shape, 16 / 4 heads of 512 over 32K keys, bf16, on
    the H200: 28 rows 97.7 us instead of 209.6 with 8 warps and 16-key tiles, 4 rows 79.8 instead of 91.6), and
    tiles over 64 x 128 run 4 warps with 32-key tiles in 2 stages (Qwen3.5-9B's 16-row verify, 64 packed rows of
    256: 59.4 us instead of 69.9 with 8 warps, 64 keys, 3 stages)."""
    given_m, given_n, given_stages = block_m is not None, block_n is not None, num_stages is not None
    block_m = block_m or min(_next_pow2(num_rows), 128 if Dh <= 64 else 64)
    block_d, block_dv = _next_pow2(Dh), _next_pow2(Dv)
    if block_n is None:
        block_n = 64 if max(block_d, block_dv) <= 128 else 32
    wide = max(block_d, block_dv) > 256  # Gemma-4's global 512
    large = block_m * max(block_d, block_dv) > 64 * 128
    if num_warps is None:
        num_warps = 8 if large and not decode else 4
    if decode and large and not wide:  # Qwen3.5's full-attention verify: 64 packed rows of 256
        block_n = block_n if given_n else 32
        num_stages = num_stages if given_stages else 2
    if num_stages is None:
        num_stages = 3 if device.type == "cuda" else 1
    if wide:  # shrink the tiles the caller left open
        block_m, block_n, num_stages = _fit_wide_tiles(
            block_m, block_n, block_d, block_dv, num_stages, dtype, fixed=(given_m, given_n, given_stages),
            budget=DECODE_WIDE_TILE_SMEM_BYTES if decode else WIDE_TILE_SMEM_BYTES)
    if num_splits is None:
        num_splits = default_num_splits(span, Hkv, block_n, device)
    num_splits = max(1, int(num_splits))
    chunk = -(-max(span, 1) // num_splits)
    chunk = -(-chunk // block_n) * block_n
    return _LaunchPlan(num_rows, -(-num_rows // block_m), block_m, block_n, block_d, block_dv, num_warps, num_stages,
                       num_splits, chunk, "ieee" if dtype == torch.float32 else "tf32")


MERGE_TILE_ELEMENTS = 8192  # fp32 partial outputs one merge program loads at once ([splits, Dv]; 64 registers a thread)


MERGE_DV_ENV = "FOLD_HF_MERGE_DV"  # value dims per merge program (benchmarks)
# value dims per merge program: at the 8B decode shape (33 splits, Dv 128) two programs per row of 64 took the 32 merges
# of a 32K AR step from 95.7 to 63.4 us and the step 5.482 -> 5.443 ms, the fold round 7.368 -> 7.250
# (benchmarks/results/2026-12-02-nvidia-h200-merge); 32 per program measured between the two
DEFAULT_MERGE_DV_BLOCK = 64
MERGE_EARLY_ENV = "FOLD_HF_MERGE_EARLY"  # "0": load the partial outputs after the maxima (two load rounds)


@dataclass(frozen=True)
class _MergePlan:
    """Launch shape of ``_fold_merge_kernel``: grid ``(Hkv, rows, dv_programs)``."""

    block_s: int
    split_chunk: int
    num_warps: int
    block_dv: int
    dv_programs: int
    early_acc: bool


def _merge_tiles(num_splits: int, block_dv: int, split_chunk: int | None, dv_block: int | None = None,
                 num_warps: int | None = None, early_acc: bool | None = None) -> _MergePlan:
    """The merge's tiles: every split in one load when the ``[BLOCK_S, dv_block]`` tile fits
    :data:`MERGE_TILE_ELEMENTS`, 8 warps when the tile is over half of that size.

    The merge is latency-bound (a few KB per row, read from L2 right after the split pass), so its cost is the
    number of dependent load rounds; loading all splits at once instead of 8 at a time cuts them from
    ``ceil(S / 8)`` to one for up to 64 splits at head_dim 128, and ``early_acc`` (default on, ``$FOLD_HF_MERGE_EARLY``)
    issues that load together with the maxima's. ``dv_block`` (default ``$FOLD_HF_MERGE_DV`` or
    :data:`DEFAULT_MERGE_DV_BLOCK`, at most ``block_dv``) spreads a row's value dims over several programs."""
    block_s = _next_pow2(num_splits, 2)
    if dv_block is None:
        dv_block = int(os.environ.get(MERGE_DV_ENV) or 0) or DEFAULT_MERGE_DV_BLOCK
    dv_block = max(16, min(_next_pow2(int(dv_block)), block_dv))
    if split_chunk is None:
        split_chunk = max(2, min(block_s, MERGE_TILE_ELEMENTS // dv_block))
    split_chunk = _next_pow2(min(int(split_chunk), block_s), 2)
    if num_warps is None:
        num_warps = 4 if block_s * dv_block <= MERGE_TILE_ELEMENTS // 2 else 8
    if early_acc is None:
        early_acc = os.environ.get(MERGE_EARLY_ENV, "1") != "0"
    return _MergePlan(block_s, split_chunk, int(num_warps), dv_block, block_dv // dv_block,
                      bool(early_acc) and split_chunk >= block_s)


def _partials(branches: int, Hkv: int, num_splits: int, num_rows: int, Dv: int, device: torch.device):
    """fp32 split partials (running max, mass, unnormalized output) of every branch, KV head, split and row."""
    part_m = torch.empty(branches, Hkv, num_splits, num_rows, device=device, dtype=torch.float32)
    part_acc = torch.empty(branches, Hkv, num_splits, num_rows, Dv, device=device, dtype=torch.float32)
    return part_m, torch.empty_like(part_m), part_acc


def fold_read_triton(
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
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    window_splits: int | None = None,
    merge_split_chunk: int | None = None,
    merge_dv_block: int | None = None,
    merge_warps: int | None = None,
    merge_early_acc: bool | None = None,
) -> torch.Tensor:
    """FOLD read of one layer in two Triton launches (split pass, merge pass).

    Args:
        query_near: ``[1, Hq, Lq, Dh]`` queries rotated at ``p = t + r`` and multiplied by the logit scale
            (``scaling * query_scale[r]``); bf16, fp16 or fp32.
        query_far: ``[1, Hq, Lq, Dh]`` queries rotated at distance ``D + r`` with cos/sin scaled by
            attention_scaling squared, scaled like ``query_near``; None = no far branch.
        context_keys: ``[1, Hkv, capacity, Dh]`` **unrotated** cache buffer; entries ``>= context_length``
            are never read.
        context_values: ``[1, Hkv, capacity, Dv]``.
        block_keys: ``[1, Hkv, Lq, Dh]`` block keys already rotated at ``p``.
        block_values: ``[1, Hkv, Lq, Dv]``.
        cos, sin: ``[max_position, rotary_dim]`` fp32 tables, rotate_half layout, attention scaling folded in,
            ``max_position >= context_length``.
        context_length: T, an int or an int32 CUDA tensor ``[1]`` (read on the device: no host sync, so the
            call can be captured in a CUDA graph; the grid then depends only on ``capacity``).
        block_start: t, int or int32 CUDA tensor ``[1]``.
        window: D (entry ``j`` is in row ``r``'s window iff ``t + r - j < D``); None = every entry in the window.
        alpha: far concentration (1.0 = one softmax over both branches; ``math.inf`` = top-1 read).
        num_splits: context splits (default: about two programs per SM over ``T``, or over ``capacity``
            when ``context_length`` is a tensor).
        block_m, block_n, num_warps, num_stages: tuning overrides (benchmarks); ``block_m`` rows of the
            ``G * Lq`` packed rows per program.
        window_splits: extra programs given to the window region alone (the last ``W + B`` entries, where keys
            are rotated and masked per row), on top of ``num_splits`` for the far-only region; 0 splits the whole
            context evenly, which leaves the window to one program per KV head. Default: 16 with a window, else 0
            (measured in docs/design.md §6).
        merge_split_chunk: splits the merge pass loads at once (benchmarks; default all of them when
            ``splits x Dv <= 8192``).
        merge_dv_block, merge_warps, merge_early_acc: the merge pass's tuning overrides (:func:`_merge_tiles`).

    Returns:
        ``[1, Lq, Hq, Dv]`` in ``query_near.dtype``.
    """
    Hq, Lq, Dh, Hkv, capacity, Dv = _read_shapes("fold_read_triton", query_near, context_keys, context_values)
    G = Hq // Hkv
    device = query_near.device
    dtype = query_near.dtype
    has_far = query_far is not None
    if has_far and window is None:
        raise ValueError("a far branch needs a window distance")
    far_hard = math.isinf(alpha)

    # kernels index the innermost dim with stride 1 and the queries as contiguous [Hq, Lq, Dh]
    query_near = query_near.contiguous()
    query_far = query_far.to(dtype).contiguous() if has_far else query_near

    context_keys, context_values = _inner_contiguous(context_keys, dtype), _inner_contiguous(context_values, dtype)
    block_keys, block_values = _inner_contiguous(block_keys, dtype), _inner_contiguous(block_values, dtype)
    cos, sin = _inner_contiguous(cos, torch.float32), _inner_contiguous(sin, torch.float32)
    if sin.stride(0) != cos.stride(0):
        sin = sin.contiguous()
        cos = cos.contiguous()

    len_from_ptr = isinstance(context_length, torch.Tensor)
    if len_from_ptr != isinstance(block_start, torch.Tensor):
        raise ValueError("context_length and block_start must both be ints or both be tensors")
    if len_from_ptr:
        ctx_ptr, start_ptr = context_length.to(torch.int32), block_start.to(torch.int32)
        ctx_value = start_value = 0
        span = capacity
    else:
        ctx_value, start_value = int(context_length), int(block_start)
        if ctx_value > capacity:
            raise ValueError(f"context_length {ctx_value} exceeds the buffer's {capacity} entries")
        ctx_ptr = start_ptr = query_near  # unused
        span = ctx_value

    plan = _launch_plan(G * Lq, Dh, Dv, Hkv, span, dtype, device, num_splits, block_m, block_n, num_warps, num_stages)
    if window is None:
        window_splits = 0
    else:
        window_splits = DEFAULT_WINDOW_SPLITS if window_splits is None else max(0, int(window_splits))
    num_splits = plan.num_splits + window_splits
    half_rotary = cos.shape[-1] // 2
    part_m, part_l, part_acc = _partials(2 if has_far else 1, Hkv, num_splits, plan.num_rows, Dv, device)
    out = torch.empty(1, Lq, Hq, Dv, device=device, dtype=dtype)

    far_log2_scale = LOG2E if far_hard else float(alpha) * LOG2E
    _fold_split_kernel[(plan.row_blocks, Hkv, num_splits)](
        query_near, query_far, context_keys, context_values, block_keys, block_values, cos, sin,
        ctx_ptr, ctx_value, start_ptr, start_value, int(window) if window is not None else 0,
        part_m, part_l, part_acc,
        context_keys.stride(1), context_keys.stride(2), context_values.stride(1), context_values.stride(2),
        block_keys.stride(1), block_keys.stride(2), block_values.stride(1), block_values.stride(2), cos.stride(0),
        plan.num_rows, Lq, G, Dh, Dv, half_rotary, plan.chunk, num_splits, window_splits, LOG2E, far_log2_scale,
        LEN_FROM_PTR=len_from_ptr, HAS_WINDOW=window is not None, HAS_FAR=has_far, FAR_HARD=far_hard,
        KEYS_PREROTATED=False, BLOCK_CAUSAL=False,
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_L=_next_pow2(Lq), BLOCK_D=plan.block_d,
        BLOCK_DV=plan.block_dv,
        BLOCK_H=_next_pow2(half_rotary), BLOCK_X=_next_pow2(Dh - 2 * half_rotary), HAS_REST=Dh > 2 * half_rotary,
        # the window loop is never software-pipelined: pipelining it with its conditional far update gave wrong far
        # branches on the H200 (docs/design.md §6), while one stage matches the oracle
        MIXED_STAGES=1, DOT_PRECISION=plan.dot_precision, num_warps=plan.num_warps, num_stages=plan.num_stages,
        **launch_options(device),
    )
    merge = _merge_tiles(num_splits, plan.block_dv, merge_split_chunk, merge_dv_block, merge_warps, merge_early_acc)
    _fold_merge_kernel[(Hkv, plan.num_rows, merge.dv_programs)](
        part_m, part_l, part_acc, out, out.stride(1), out.stride(2),
        plan.num_rows, Lq, G, Dv, num_splits, 1.0 if far_hard else 1.0 / float(alpha),
        HAS_FAR=has_far, FAR_HARD=far_hard, BLOCK_S=merge.block_s, SPLIT_CHUNK=merge.split_chunk,
        BLOCK_DV=merge.block_dv, EARLY_ACC=merge.early_acc,
        num_warps=merge.num_warps, **launch_options(device),
    )
    return out


def decode_attention_triton(
    query: torch.Tensor,
    context_keys: torch.Tensor,
    context_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    context_length,
    scaling: float = 1.0,
    num_splits: int | None = None,
    max_context_length: int | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    merge_split_chunk: int | None = None,
    merge_dv_block: int | None = None,
    merge_warps: int | None = None,
    merge_early_acc: bool | None = None,
) -> torch.Tensor:
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
        block_m, block_n, num_warps, num_stages: tuning overrides. The key loop has no data-dependent branch
            around a dot here (no far branch), so it is software-pipelined with ``num_stages`` (default 3).
        merge_split_chunk, merge_dv_block, merge_warps, merge_early_acc: as in :func:`fold_read_triton`.

    Returns:
        ``[1, L, Hq, Dv]`` in ``query.dtype``.
    """
    Hq, Lq, Dh, Hkv, capacity, Dv = _read_shapes("decode_attention_triton", query, context_keys, context_values)
    G = Hq // Hkv
    device, dtype = query.device, query.dtype
    query = query.contiguous()
    context_keys, context_values = _inner_contiguous(context_keys, dtype), _inner_contiguous(context_values, dtype)
    block_keys, block_values = _inner_contiguous(block_keys, dtype), _inner_contiguous(block_values, dtype)

    len_from_ptr = isinstance(context_length, torch.Tensor)
    if len_from_ptr:
        ctx_ptr = context_length.reshape(-1)[:1]
        if ctx_ptr.dtype != torch.int32:
            ctx_ptr = ctx_ptr.to(torch.int32)
        ctx_value = 0
        span = capacity if max_context_length is None else min(int(max_context_length), capacity)
    else:
        ctx_value = int(context_length)
        if ctx_value > capacity:
            raise ValueError(f"context_length {ctx_value} exceeds the buffer's {capacity} entries")
        ctx_ptr = query  # unused
        span = ctx_value

    plan = _launch_plan(G * Lq, Dh, Dv, Hkv, span, dtype, device, num_splits, block_m, block_n, num_warps, num_stages,
                        decode=True)
    part_m, part_l, part_acc = _partials(1, Hkv, plan.num_splits, plan.num_rows, Dv, device)
    out = torch.empty(1, Lq, Hq, Dv, device=device, dtype=dtype)

    _fold_split_kernel[(plan.row_blocks, Hkv, plan.num_splits)](
        query, query, context_keys, context_values, block_keys, block_values, query, query,
        ctx_ptr, ctx_value, ctx_ptr, ctx_value, 0,
        part_m, part_l, part_acc,
        context_keys.stride(1), context_keys.stride(2), context_values.stride(1), context_values.stride(2),
        block_keys.stride(1), block_keys.stride(2), block_values.stride(1), block_values.stride(2), 0,
        plan.num_rows, Lq, G, Dh, Dv, 0, plan.chunk, plan.num_splits, 0, float(scaling) * LOG2E, LOG2E,
        LEN_FROM_PTR=len_from_ptr, HAS_WINDOW=False, HAS_FAR=False, FAR_HARD=False,
        KEYS_PREROTATED=True, BLOCK_CAUSAL=True, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_L=_next_pow2(Lq),
        BLOCK_D=plan.block_d, BLOCK_DV=plan.block_dv, BLOCK_H=16, BLOCK_X=16, HAS_REST=False,
        # no far branch: the key loop holds no data-dependent branch, so pipelining it is safe
        MIXED_STAGES=plan.num_stages, DOT_PRECISION=plan.dot_precision, num_warps=plan.num_warps,
        num_stages=plan.num_stages, **launch_options(device),
    )
    merge = _merge_tiles(plan.num_splits, plan.block_dv, merge_split_chunk, merge_dv_block, merge_warps, merge_early_acc)
    _fold_merge_kernel[(Hkv, plan.num_rows, merge.dv_programs)](
        part_m, part_l, part_acc, out, out.stride(1), out.stride(2),
        plan.num_rows, Lq, G, Dv, plan.num_splits, 1.0,
        HAS_FAR=False, FAR_HARD=False, BLOCK_S=merge.block_s, SPLIT_CHUNK=merge.split_chunk,
        BLOCK_DV=merge.block_dv, EARLY_ACC=merge.early_acc,
        num_warps=merge.num_warps, **launch_options(device),
    )
    return out
