"""The merge pass of the fused reads (:mod:`.triton`): the split partials of each row merged in log space, then the
two branches merged by mass, ``o = o_N + sigmoid(log Z_F - lse_N) (o_F - o_N)``.

Imported only by :mod:`.triton` (never on the CPU path). The partials are ``[branch, Hkv, splits, rows(, Dv)]`` fp32
(:func:`.launch.partials`); logits are in base 2 as the split pass leaves them.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..triton_pdl import launch_options, pdl_enter
from .launch import merge_tiles

LN2 = tl.constexpr(0.6931471805599453)  # jit code may only read constexpr globals


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
    PART_M, PART_L, PART_ACC, OUT, stride_oa, stride_ol, stride_oh,
    num_rows, Lq, G, value_dim, num_splits, inv_alpha, kv_heads,
    HAS_FAR: tl.constexpr, FAR_HARD: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT_CHUNK: tl.constexpr,
    BLOCK_DV: tl.constexpr, EARLY_ACC: tl.constexpr, PDL: tl.constexpr,
):
    pdl_enter(PDL)
    head_id = tl.program_id(0)  # read a's KV head h at a * kv_heads + h (one read: a = 0)
    row = tl.program_id(1)
    # axis 2: the value dims this program writes (BLOCK_DV of them; one program per row when it covers Dv)
    offs_dv = tl.program_id(2) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < value_dim
    # partial index of split s for this row: (head * S + s) * rows + row
    base = (head_id * num_splits).to(tl.int64) * num_rows + row
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
    a = head_id // kv_heads
    q_head = (head_id % kv_heads) * G + row // Lq
    r = row % Lq
    tl.store(OUT + a.to(tl.int64) * stride_oa + r.to(tl.int64) * stride_ol + q_head.to(tl.int64) * stride_oh + offs_dv,
             out.to(OUT.dtype.element_ty), mask=dv_ok)


def launch_merge(part_m: torch.Tensor, part_l: torch.Tensor, part_acc: torch.Tensor, out: torch.Tensor, Lq: int,
                 G: int, num_splits: int, block_dv: int, has_far: bool, alpha: float, tuning: tuple,
                 kv_heads: int | None = None) -> None:
    """Merge the partials ``[branches, A * Hkv, num_splits, rows(, Dv)]`` into ``out [A, Lq, Hq, Dv]`` (one launch;
    ``kv_heads`` = Hkv, default the partials' heads: one read).

    ``alpha`` the far concentration (``math.inf``: top-1); ``tuning`` = ``(split_chunk, dv_block, num_warps,
    early_acc)`` overrides of :func:`.launch.merge_tiles` (None = default; :attr:`.launch.Tuning.merge_pass`)."""
    _, Hkv, _, num_rows = part_m.shape
    far_hard = math.isinf(alpha)
    merge = merge_tiles(num_splits, block_dv, *tuning)
    _fold_merge_kernel[(Hkv, num_rows, merge.dv_programs)](
        part_m, part_l, part_acc, out, out.stride(0), out.stride(1), out.stride(2),
        num_rows, Lq, G, out.shape[-1], num_splits, 1.0 if far_hard else 1.0 / float(alpha),
        Hkv if kv_heads is None else kv_heads,
        HAS_FAR=has_far, FAR_HARD=far_hard, BLOCK_S=merge.block_s, SPLIT_CHUNK=merge.split_chunk,
        BLOCK_DV=merge.block_dv, EARLY_ACC=merge.early_acc,
        num_warps=merge.num_warps, **launch_options(out.device),
    )
