"""Triton kernels of the Gemma-only fused ops (twins with the same signatures: :mod:`fold_hf.kernels.gemma.naive`).
Imported only when Triton is usable.

* :func:`gelu_tanh_mul_triton`: Gemma's MLP activation, one pass over ``gate`` and ``up``;
* :func:`ring_attention_triton`: the sliding layers' attention over their ring cache in two launches (a split pass
  keeping an online softmax per KV head and ring split, then a merge).

Rounding and transcendental functions as in :mod:`fold_hf.kernels.hybrid.triton`, whose helpers these kernels share.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..hybrid.triton import _elementwise_block, _libdevice, _next_pow2, _pairwise
from ..layer.triton import _round_to
from ..triton_pdl import launch_options, pdl_enter


# ---------------------------------------------------------------------------------------------- GELU-tanh product
@triton.jit
def gelu_tanh_f32(x, LIB: tl.constexpr):
    """``gelu(x, approximate="tanh")`` of fp32 ``x`` (``LIB``: libdevice's tanh; the interpreter has none). Also the
    epilogue of :func:`fold_hf.kernels.gemm.triton.gate_up_gelu_tanh_triton`."""
    inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
    if LIB:
        th = libdevice.tanh(inner)
    else:
        th = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
    return 0.5 * x * (1.0 + th)


@triton.jit
def _gelu_tanh_mul_kernel(GATE, UP, OUT, n, width, gate_row, up_row, BLOCK: tl.constexpr, LIB: tl.constexpr,
                          PDL: tl.constexpr):
    pdl_enter(PDL)
    offs, ok, row, col = _elementwise_block(n, width, BLOCK)
    g = tl.load(GATE + row * gate_row + col, mask=ok, other=0.0)
    u = tl.load(UP + row * up_row + col, mask=ok, other=0.0)
    gelu = _round_to(gelu_tanh_f32(g.to(tl.float32), LIB), g.dtype)
    tl.store(OUT + offs, _round_to(gelu * u.to(tl.float32), g.dtype).to(g.dtype), mask=ok)


def gelu_tanh_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`~fold_hf.kernels.gemma.naive.gelu_tanh_mul_reference` (rows may be strided)."""
    return _pairwise(_gelu_tanh_mul_kernel, gate, up, ("gate", "up"))


# ---------------------------------------------------------------------------------------------- ring attention
@triton.jit
def _ring_split_kernel(Q, KR, VR, POS, PACC, PM, PL, L, R, window, scale, kv_head, kv_row, chunks_per_split,
                       ROW_PTR, HKV, kv_batch, G: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, IEEE: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    flat = tl.program_id(0)  # ROWS: row a's KV head h at a * HKV + h (the partials' head index)
    if ROWS:  # several rows of a batch in one launch: row a's queries and positions at index a, its ring in cache
        # row ROW_PTR[a]
        a = flat // HKV
        kvh = flat % HKV
        Q += a.to(tl.int64) * (HKV * G * L * D)
        POS += a * L
        ring = tl.load(ROW_PTR + a).to(tl.int64) * kv_batch
        KR += ring
        VR += ring
    else:
        kvh = flat
    sp = tl.program_id(1)
    nsp = tl.num_programs(1)
    rows_total = tl.num_programs(2) * BM
    rm = tl.program_id(2) * BM + tl.arange(0, BM)  # row m = g * L + r: query head kvh * G + g, block row r
    rd = tl.arange(0, BD)
    md = rd < D
    mm = rm < G * L
    r = rm % L
    g = rm // L
    pos = tl.load(POS + r, mask=mm, other=0)
    top = tl.load(POS + L - 1)
    q = tl.load(Q + ((kvh * G + g) * L + r)[:, None] * D + rd[None, :], mask=mm[:, None] & md[None, :], other=0.0)
    m_i = tl.full((BM,), -1.0e30, tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    for c in range(0, chunks_per_split):
        s = (sp * chunks_per_split + c) * BN + tl.arange(0, BN)
        ms = s < R
        k = tl.load(KR + kvh * kv_head + s[:, None] * kv_row + rd[None, :], mask=ms[:, None] & md[None, :],
                    other=0.0)
        v = tl.load(VR + kvh * kv_head + s[:, None] * kv_row + rd[None, :], mask=ms[:, None] & md[None, :],
                    other=0.0)
        slot_pos = top - (((top - s) % R) + R) % R
        delta = pos[:, None] - slot_pos[None, :]
        visible = (slot_pos >= 0)[None, :] & ms[None, :] & mm[:, None] & (delta >= 0) & (delta < window)
        if IEEE:  # fp32 inputs (or the interpreter, whose bf16/fp16 dot is wrong): fp32 products
            scores = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee") * scale
        else:
            scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
        scores = tl.where(visible, scores, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(visible, tl.exp(scores - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32),
                                                input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    base = flat * nsp + sp  # the tile's padding rows (past G * L, which the merge never reads) are not written
    tl.store(PACC + (base * rows_total + rm)[:, None] * BD + rd[None, :], acc, mask=mm[:, None])
    tl.store(PM + base * rows_total + rm, m_i, mask=mm)
    tl.store(PL + base * rows_total + rm, l_i, mask=mm)


@triton.jit
def _ring_merge_kernel(PACC, PM, PL, OUT, L, HQ, nsp, BM, HKV, G: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                       BS: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    flat = tl.program_id(0)  # row a's KV head h at a * HKV + h (one row: a = 0)
    kvh = flat % HKV
    OUT += (flat // HKV).to(tl.int64) * (L * HQ * D)
    m = tl.program_id(1)  # row g * L + r
    r = m % L
    g = m // L
    rs = tl.arange(0, BS)
    ok = rs < nsp
    rd = tl.arange(0, BD)
    base = flat * nsp + rs
    mx = tl.load(PM + base * BM + m, mask=ok, other=-1.0e30)
    lx = tl.load(PL + base * BM + m, mask=ok, other=0.0)
    top = tl.max(mx, 0)
    w = tl.where(ok, tl.exp(mx - top), 0.0)
    acc = tl.load(PACC + (base * BM + m)[:, None] * BD + rd[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lx * w, 0)
    tl.store(OUT + (r * HQ + kvh * G + g) * D + rd, out.to(OUT.dtype.element_ty), mask=rd < D)


RING_PROGRAMS_ENV = "FOLD_HF_RING_PROGRAMS"  # benchmarks (benchmarks/ring_bench.py): split programs of one launch
DEFAULT_RING_PROGRAMS = 128


def ring_programs() -> int:
    """About how many split programs one ring attention launch runs (the ring's key chunks are dealt out over the
    launch's (row, KV head) pairs to reach it): ``$FOLD_HF_RING_PROGRAMS``, default :data:`DEFAULT_RING_PROGRAMS`."""
    value = os.environ.get(RING_PROGRAMS_ENV) or str(DEFAULT_RING_PROGRAMS)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{RING_PROGRAMS_ENV} must be a positive integer, got {value!r}")
    return int(value)


def ring_attention_triton(query, key_ring, value_ring, positions, window: int, scaling: float, *,
                          block_m: int | None = None) -> torch.Tensor:
    """:func:`~fold_hf.kernels.gemma.naive.ring_attention_reference` in two launches: programs over (KV head,
    split of the ring) keep an online softmax of all ``G * L`` query rows of their KV head (keys read once per
    head), a merge combines the splits. Returns ``[1, L, Hq, D]``.

    ``block_m``: query rows per program (a power of two, >= 16); by default it grows with ``G * L`` (more rows, fewer
    programs). The splits follow the ring's slots (``R``, the head count), never ``L``, so with a fixed ``block_m``
    a row's arithmetic does not depend on how many rows the block has (:func:`exact_ring_attention_triton`)."""
    if query.shape[0] != 1 or key_ring.shape[0] != 1:
        raise ValueError("ring_attention_triton reads one row (ring_attention_rows_triton reads several)")
    return _ring_attention(query, key_ring, value_ring, positions, window, scaling, block_m, None)


def ring_attention_rows_triton(query, key_ring, value_ring, positions, rows, window: int, scaling: float
                               ) -> torch.Tensor:
    """The sliding layers' attention of ``A`` rows of a batch in one split launch and one merge launch: row ``a`` is
    :func:`ring_attention_triton` of its queries ``query[a]`` at its positions ``positions[a]`` over the rings of
    cache row ``rows[a]`` (its twin loops :func:`~fold_hf.kernels.gemma.naive.ring_attention_reference` over the
    rows).

    Args:
        query: ``[A, Hq, L, D]``; key_ring, value_ring: ``[batch, Hkv, R, D]``; positions: ``[A, L]`` device integers
            (each row's consecutive positions); rows: ``[A]`` device integers, the cache row of each row.

    Returns:
        ``[A, L, Hq, D]``.
    """
    A, _, L, _ = query.shape
    if positions.shape != (A, L) or rows.numel() != A:
        raise ValueError(f"{A} rows of {L} queries need positions [{A}, {L}] and {A} cache rows, got "
                         f"{tuple(positions.shape)} and {rows.numel()}")
    return _ring_attention(query, key_ring, value_ring, positions.contiguous(), window, scaling, None,
                           rows.reshape(-1).to(torch.int32))


def _ring_attention(query, key_ring, value_ring, positions, window, scaling, block_m, rows) -> torch.Tensor:
    """The launches of :func:`ring_attention_triton` (``rows`` None) and :func:`ring_attention_rows_triton`."""
    A, HQ, L, D = query.shape
    HKV, R = key_ring.shape[1], key_ring.shape[2]
    if HQ % HKV or key_ring.shape[-1] != D or value_ring.shape != key_ring.shape or key_ring.stride(-1) != 1:
        raise ValueError(f"query {tuple(query.shape)} and rings {tuple(key_ring.shape)} / "
                         f"{tuple(value_ring.shape)} do not match")
    if key_ring.stride() != value_ring.stride():
        raise ValueError("key and value rings must share strides")
    G = HQ // HKV
    query = query.contiguous()
    BD = max(16, _next_pow2(D))
    BM = min(64, max(16, _next_pow2(G * L))) if block_m is None else int(block_m)  # query rows per program
    if BM < 16 or BM & (BM - 1):
        raise ValueError(f"block_m must be a power of two >= 16, got {block_m}")
    row_blocks = triton.cdiv(G * L, BM)
    BN = 64 if BD <= 128 else (32 if BD <= 256 else 16)
    chunks = triton.cdiv(R, BN)
    heads = A * HKV  # the launch's (row, KV head) programs
    per_split = triton.cdiv(chunks, max(1, ring_programs() // heads))
    splits = triton.cdiv(chunks, per_split)
    part_acc = torch.empty(heads, splits, row_blocks * BM, BD, device=query.device, dtype=torch.float32)
    part_m = torch.empty(heads, splits, row_blocks * BM, device=query.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    _ring_split_kernel[(heads, splits, row_blocks)](
        query, key_ring, value_ring, positions, part_acc, part_m, part_l, L, R, int(window), float(scaling),
        key_ring.stride(1), key_ring.stride(2), per_split, positions if rows is None else rows, HKV,
        key_ring.stride(0), G=G, D=D, BD=BD, BM=BM, BN=BN,
        IEEE=query.dtype == torch.float32 or not _libdevice(), ROWS=rows is not None, num_warps=4,
        **launch_options(query.device))
    out = torch.empty(A, L, HQ, D, device=query.device, dtype=value_ring.dtype)
    _ring_merge_kernel[(heads, G * L)](part_acc, part_m, part_l, out, L, HQ, splits, row_blocks * BM, HKV, G=G, D=D,
                                       BD=BD, BS=_next_pow2(splits), num_warps=4, **launch_options(query.device))
    return out


EXACT_BLOCK_M = 16  # the exact mode's fixed query tile: every block size runs the same tl.dot shape


def exact_ring_attention_triton(query, key_ring, value_ring, positions, window: int, scaling: float) -> torch.Tensor:
    """:func:`ring_attention_triton` under one fixed tile (``block_m = EXACT_BLOCK_M``): row ``r`` of a block at
    positions ``T .. T + L - 1`` gets the same bits as that query decoded alone at ``T + r`` over the same ring
    (exact mode, issue 37, ``docs/exact-mode.md``): its keys sit in the slots their positions give (``p mod R``),
    the splits are fixed by slot, the chunks of a split are visited in slot order, the splits merged in split
    order. Shapes as :func:`ring_attention_triton`."""
    return ring_attention_triton(query, key_ring, value_ring, positions, window, scaling, block_m=EXACT_BLOCK_M)


__all__ = ["EXACT_BLOCK_M", "exact_ring_attention_triton", "gelu_tanh_mul_triton", "ring_attention_rows_triton",
           "ring_attention_triton"]
