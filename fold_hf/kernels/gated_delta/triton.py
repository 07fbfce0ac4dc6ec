"""Triton kernel of the gated delta rule with per-position states (contract:
:func:`fold_hf.kernels.gated_delta.gated_delta_states_reference`). Imported only when Triton is usable.

One program per (value head, block of ``BV`` value columns) holds ``S[:, cols]`` (``[Dk, BV]`` fp32) in registers
and walks the ``L`` block tokens, writing the output and the state after each token: the state is read once and
written ``L`` times, no ``[L, Hv, Dk, Dv]`` intermediate is recomputed. Columns of ``S`` are independent in the
delta rule (the read ``S^T k`` and the update are per column), which is what makes the split exact.

The fused Qwen3.5 layers (:func:`fold_hf.kernels.default_hybrid_ops`) run
:func:`gated_delta_verify_triton`, a whole Gated DeltaNet step after the projections: causal conv + silu, L2 norms,
``beta``/``g`` from ``b``/``a`` for all rows at once, then the delta rule, one program per (value head, ``BV`` value
columns) holding ``S[:, cols]`` in registers. A block of ``L > 1`` tokens (a verify) runs it chunked: with ``G`` the
cumulative log decay, every token's write ``d_t = beta_t (v_t - (e^{g_t} S_{t-1})^T k_t)`` solves
``d = R - A d`` (``A`` strictly lower triangular, ``A_ts = beta_t e^{G_t - G_s} k_t . k_s``,
``R_t = beta_t (v_t - e^{G_t} S_0^T k_t)``), and
``o_t = e^{G_t} S_0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) d_s``: dots over the block (``tl.dot``, tf32x3 by
default, ``$FOLD_HF_GDN_DOT``) and ``L - 1`` rounds of ``d <- R - A d`` over an ``[L, BV]`` tile, where the
token-by-token walk reduced the ``[Dk, BV]`` state twice per token (``$FOLD_HF_GDN_SOLVE=blocks`` solves by blocks of
about ``sqrt(L)`` rows instead: the diagonal blocks' inverses by ``SOLVE_BLOCK - 1`` rounds, then one round per block,
7 dependent dots for 16 rows; 14.81 -> 13.72 us alone on an H100, no gain visible in a round, so not the default).
One token (an AR
step) runs the rule's step. The kernel writes *no* state: ``k``, ``g``, the writes ``d`` and the raw projections go
to small pending buffers and :func:`gated_delta_commit_triton` replays ``S <- e^{g_t} S + k_t d_t^T`` for the
accepted prefix ``0 .. n`` into every linear layer's state in one launch (``n`` read on the device; rank-one
updates, no reduction). A verify of 16 rows at the Qwen3.5-9B shape thus moves 2 MB of state per layer and
direction instead of writing 16 x 2 MB.
:func:`gated_rms_norm_triton` is the layer's gated output norm, one program per row.

Twins: :mod:`fold_hf.kernels.gated_delta.naive`. Rounding and transcendental functions as in
:mod:`fold_hf.kernels.hybrid.triton` (whose helpers these kernels share).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..hybrid.triton import _EXACT, _exp, _libdevice, _sigmoid, _silu
from ..layer.triton import _round_to
from ..triton_pdl import launch_options, pdl_enter


@triton.jit
def _state_tile(h, vb, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr):
    """Value head ``h``'s key head and its ``S[:, cols]`` tile: ``(hk, rk [BK], rv [BV], mk, mv, m2 [BK, BV])``
    for value-column block ``vb``."""
    hk = h // (HV // HK)
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    mk = rk < DK
    mv = rv < DV
    return hk, rk, rv, mk, mv, mk[:, None] & mv[None, :]


@triton.jit
def _gated_delta_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, o_ptr, states_ptr, L,
                        HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)
    hk, rk, rv, mk, mv, m2 = _state_tile(h, tl.program_id(1), HK, HV, DK, DV, BK, BV)
    s_off = h * DK * DV + rk[:, None] * DV + rv[None, :]
    S = tl.load(s_ptr + s_off, mask=m2, other=0.0).to(tl.float32)
    for t in range(0, L):
        k = tl.load(k_ptr + (t * HK + hk) * DK + rk, mask=mk, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + (t * HK + hk) * DK + rk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (t * HV + h) * DV + rv, mask=mv, other=0.0).to(tl.float32)
        gate = tl.load(g_ptr + t * HV + h).to(tl.float32)
        beta = tl.load(b_ptr + t * HV + h).to(tl.float32)
        S = S * tl.exp(gate)
        read = tl.sum(S * k[:, None], axis=0)
        delta = (v - read) * beta
        S = S + k[:, None] * delta[None, :]
        out = tl.sum(S * q[:, None], axis=0)
        tl.store(o_ptr + (t * HV + h) * DV + rv, out, mask=mv)
        tl.store(states_ptr + t * HV * DK * DV + s_off, S, mask=m2)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def gated_delta_states_triton(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                              beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~fold_hf.kernels.gated_delta.gated_delta_states_reference` (fp32 state)."""
    if state.dtype != torch.float32:
        raise ValueError(f"the Triton gated delta kernel keeps an fp32 state, got {state.dtype}")
    L, HK, DK = key.shape
    HV, DV = value.shape[1], value.shape[2]
    if HV % HK:
        raise ValueError(f"{HV} value heads are not a multiple of {HK} key heads")
    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    g, beta, state = g.contiguous(), beta.contiguous(), state.contiguous()
    out = torch.empty(L, HV, DV, device=state.device, dtype=torch.float32)
    states = torch.empty(L, HV, DK, DV, device=state.device, dtype=torch.float32)
    BK = _next_pow2(DK)
    BV = min(_next_pow2(DV), max(16, 4096 // BK))
    grid = (HV, triton.cdiv(DV, BV))
    _gated_delta_kernel[grid](query, key, value, g, beta, state, out, states, L, HK=HK, HV=HV, DK=DK, DV=DV,
                              BK=BK, BV=BV)
    return out, states


# ------------------------------------------------------------------------------------ Gated DeltaNet verify + commit
@triton.jit
def _conv_silu_rows(QKV, CONV, CW, chan, cmask, rows, rmask, qkv_stride, KS: tl.constexpr, LIB: tl.constexpr):
    """Causal depthwise conv of channels ``chan [BC]`` at block tokens ``rows [LP]`` over [conv state | block rows],
    then silu, rounded as the model dtype: ``[LP, BC]`` in fp32."""
    acc = tl.zeros((rows.shape[0], chan.shape[0]), tl.float32)
    m2 = rmask[:, None] & cmask[None, :]
    for j in tl.static_range(KS):
        m = rows + j  # column of the window [C, K - 1 + L]
        w = tl.load(CW + chan * KS + j, mask=cmask, other=0.0).to(tl.float32)
        in_state = (m < KS - 1)[:, None]
        col = tl.minimum(m, KS - 2)[:, None]
        row = tl.maximum(m - (KS - 1), 0)[:, None]
        from_state = tl.load(CONV + chan[None, :] * (KS - 1) + col, mask=m2 & in_state, other=0.0)
        from_block = tl.load(QKV + row * qkv_stride + chan[None, :], mask=m2 & (m >= KS - 1)[:, None], other=0.0)
        x = tl.where(in_state, from_state.to(tl.float32), from_block.to(tl.float32))
        acc = acc + w[None, :] * x
    dtype = QKV.dtype.element_ty
    acc = _round_to(acc, dtype)
    return _round_to(_silu(acc, LIB), dtype)


@triton.jit
def _gdn_inputs(QKV, B, A, CONV, CW, ALOG, DTB, h, hk, vb, L, qkv_stride, b_stride, a_stride, scale,
                HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KS: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr, LIB: tl.constexpr):
    """The delta rule's inputs of value head ``h`` (key head ``hk``, value columns block ``vb``) for all ``LP`` block
    rows at once: conv + silu, L2 norms, gates. Returns ``(q, k [LP, BK], v [LP, BV], g, beta [LP])`` in fp32 (rows
    past ``L`` are zeros, their gates 0) and the index vectors ``(rk, rv, rl, mk, mv, ml, qc, kc, vc)``."""
    KD: tl.constexpr = HK * DK
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    rl = tl.arange(0, LP)
    mk = rk < DK
    mv = rv < DV
    ml = rl < L
    qc = hk * DK + rk
    kc = KD + hk * DK + rk
    vc = 2 * KD + h * DV + rv
    q = _conv_silu_rows(QKV, CONV, CW, qc, mk, rl, ml, qkv_stride, KS, LIB)
    k = _conv_silu_rows(QKV, CONV, CW, kc, mk, rl, ml, qkv_stride, KS, LIB)
    v = _conv_silu_rows(QKV, CONV, CW, vc, mv, rl, ml, qkv_stride, KS, LIB)
    q = q * tl.math.rsqrt(tl.sum(q * q, 1) + 1e-6)[:, None] * scale
    k = k * tl.math.rsqrt(tl.sum(k * k, 1) + 1e-6)[:, None]
    braw = tl.load(B + rl * b_stride + h, mask=ml, other=0.0)
    beta = tl.where(ml, _round_to(_sigmoid(braw.to(tl.float32), LIB), braw.dtype), 0.0)
    x = tl.load(A + rl * a_stride + h, mask=ml, other=0.0).to(tl.float32) + tl.load(DTB + h).to(tl.float32)
    if LIB:
        soft = tl.where(x > 20.0, x, libdevice.log1p(libdevice.exp(x)))
    else:
        soft = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    g = tl.where(ml, -_exp(tl.load(ALOG + h).to(tl.float32), LIB) * soft, 0.0)
    return q, k, v, g, beta, rk, rv, rl, mk, mv, ml, qc, kc, vc


@triton.jit
def _gdn_keep_raw(QKV, PR, qkv_stride, C, rl, qc, kc, vc, lk, lv, KEY_OWNER):
    """The block's raw projections into the pending ``qkv [rows, C]`` (the commit's convolution window): every
    program its value channels, the first program of a key head (``KEY_OWNER``) its q and k channels."""
    tl.store(PR + rl[:, None] * C + vc[None, :], tl.load(QKV + rl[:, None] * qkv_stride + vc[None, :], mask=lv,
                                                         other=0.0), mask=lv)
    if KEY_OWNER:
        tl.store(PR + rl[:, None] * C + qc[None, :], tl.load(QKV + rl[:, None] * qkv_stride + qc[None, :], mask=lk,
                                                             other=0.0), mask=lk)
        tl.store(PR + rl[:, None] * C + kc[None, :], tl.load(QKV + rl[:, None] * qkv_stride + kc[None, :], mask=lk,
                                                             other=0.0), mask=lk)


@triton.jit
def _gdn_verify_kernel(QKV, B, A, CONV, CW, ALOG, DTB, S, OUT, PK, PG, PD, PR, L, qkv_stride, b_stride, a_stride,
                       scale, ROWS, qkv_row, b_row, a_row, conv_row, s_row, p_row, HK: tl.constexpr,
                       HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, KS: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, LP: tl.constexpr, CHUNK: tl.constexpr, PREC: tl.constexpr,
                       LIB: tl.constexpr, HAS_ROWS: tl.constexpr, PDL: tl.constexpr, SOLVE_BLOCK: tl.constexpr):
    pdl_enter(PDL)
    h = tl.program_id(0)
    vb = tl.program_id(1)
    GROUP: tl.constexpr = HV // HK
    hk = h // GROUP
    C: tl.constexpr = 2 * HK * DK + HV * DV
    if HAS_ROWS:  # block row a of a batch, in cache row ROWS[a]: its inputs, state, window, output and pending rows
        pa = tl.program_id(2).to(tl.int64)
        row = tl.load(ROWS + pa).to(tl.int64)
        QKV += pa * qkv_row
        B += pa * b_row
        A += pa * a_row
        CONV += row * conv_row
        S += row * s_row
        OUT += pa * L * HV * DV
        PK += row * p_row * HK * DK
        PG += row * p_row * HV
        PD += row * p_row * HV * DV
        PR += row * p_row * C
    q, k, v, g, beta, rk, rv, rl, mk, mv, ml, qc, kc, vc = _gdn_inputs(
        QKV, B, A, CONV, CW, ALOG, DTB, h, hk, vb, L, qkv_stride, b_stride, a_stride, scale, HK, HV, DK, DV, KS, BK,
        BV, LP, LIB)
    lk = ml[:, None] & mk[None, :]
    lv = ml[:, None] & mv[None, :]
    # what the commit needs: k and g (once per key / value head) and the raw projections for its conv window
    if vb == 0:
        tl.store(PG + rl * HV + h, g, mask=ml)
    key_owner = (vb == 0) & (h % GROUP == 0)  # the one program of a key head that writes its q / k rows
    _gdn_keep_raw(QKV, PR, qkv_stride, C, rl, qc, kc, vc, lk, lv, key_owner)
    if key_owner:
        tl.store(PK + (rl[:, None] * HK + hk) * DK + rk[None, :], k, mask=lk)
    m2 = mk[:, None] & mv[None, :]
    S_ = tl.load(S + h * DK * DV + rk[:, None] * DV + rv[None, :], mask=m2, other=0.0).to(tl.float32)
    if CHUNK:
        # S_t = e^{G_t} S_0 + sum_{s<=t} e^{G_t - G_s} k_s d_s^T  (G the cumulative log decay), so
        #   d = R - A d,  R_t = beta_t (v_t - e^{G_t} S_0^T k_t),  A_ts = beta_t e^{G_t - G_s} (k_t . k_s) for s < t
        #   o_t = e^{G_t} S_0^T q_t + sum_{s<=t} e^{G_t - G_s} (q_t . k_s) d_s
        # A is strictly lower triangular: L - 1 rounds of d <- R - A d make rows 0 .. L - 1 exact (row t is exact
        # once rows < t are), with no power of A formed (stable where a Neumann product is not)
        gc = tl.cumsum(g, 0)
        ks = tl.dot(k, S_, input_precision=PREC)  # [LP, BV]
        qs = tl.dot(q, S_, input_precision=PREC)
        kt = tl.trans(k)
        kk = tl.dot(k, kt, input_precision=PREC)  # [LP, LP]
        qk = tl.dot(q, kt, input_precision=PREC)
        rs = tl.arange(0, LP)
        lower = rl[:, None] >= rs[None, :]
        decay = tl.where(lower, _exp(tl.where(lower, gc[:, None] - gc[None, :], 0.0), LIB), 0.0)
        amat = tl.where(rl[:, None] > rs[None, :], beta[:, None] * kk * decay, 0.0)
        eg = _exp(gc, LIB)
        r = beta[:, None] * (v - eg[:, None] * ks)
        if SOLVE_BLOCK > 1:
            # by blocks of SOLVE_BLOCK rows: T = (I + A_diag)^-1 of the diagonal blocks (SOLVE_BLOCK - 1 rounds of
            # T <- I - A_diag T), then d = T r - (T A_off) d, whose matrix is strictly lower by blocks: one round per
            # block but the first. Dependent dots: SOLVE_BLOCK - 1 + 1 + ceil(L / SOLVE_BLOCK) - 1 instead of L - 1
            # (7 for 16 rows in blocks of 4), and still no power of A formed
            same = (rl[:, None] // SOLVE_BLOCK) == (rs[None, :] // SOLVE_BLOCK)
            eye = tl.where(rl[:, None] == rs[None, :], 1.0, 0.0)
            a_diag = tl.where(same, amat, 0.0)
            tinv = eye
            for _ in tl.static_range(1, SOLVE_BLOCK):
                tinv = eye - tl.dot(a_diag, tinv, input_precision=PREC)
            m_off = tl.dot(tinv, tl.where(same, 0.0, amat), input_precision=PREC)
            r = tl.dot(tinv, r, input_precision=PREC)
            d = r
            for _ in range(1, (L + SOLVE_BLOCK - 1) // SOLVE_BLOCK):
                d = r - tl.dot(m_off, d, input_precision=PREC)
        else:
            d = r
            for _ in range(1, L):
                d = r - tl.dot(amat, d, input_precision=PREC)
        out = eg[:, None] * qs + tl.dot(qk * decay, d, input_precision=PREC)
        tl.store(OUT + (rl[:, None] * HV + h) * DV + rv[None, :], out, mask=lv)
        tl.store(PD + (rl[:, None] * HV + h) * DV + rv[None, :], d, mask=lv)
    else:  # one token (an AR step): S' = e S + k d^T, d = (v - e S^T k) beta, o = e S^T q + d (k . q)
        kt = tl.sum(k, 0)
        qt = tl.sum(q, 0)
        e = _exp(tl.sum(g, 0), LIB)
        read = tl.sum(S_ * kt[:, None], axis=0)
        seen = tl.sum(S_ * qt[:, None], axis=0)
        kq = tl.sum(kt * qt, axis=0)
        d = (tl.sum(v, 0) - e * read) * tl.sum(beta, 0)
        tl.store(OUT + h * DV + rv, e * seen + d * kq, mask=mv)
        tl.store(PD + h * DV + rv, d, mask=mv)


def _blocks(DK: int, DV: int) -> tuple[int, int, int]:
    """(BK, BV, num_warps) of the Gated DeltaNet kernels; ``$FOLD_HF_GDN_BV`` / ``$FOLD_HF_GDN_WARPS`` override
    (benchmarks/hybrid_bench.py ``--kernel-sweep`` times the choices)."""
    BK = _next_pow2(DK)
    BV = int(os.environ.get("FOLD_HF_GDN_BV") or min(_next_pow2(DV), max(16, 4096 // BK)))
    return BK, BV, int(os.environ.get("FOLD_HF_GDN_WARPS") or 4)


DOT_PRECISIONS = ("tf32x3", "ieee")


def _dot_precision() -> str:
    """The fp32 dots of the chunked verify: ``tf32x3`` (default: three tf32 products per dot on the tensor cores) or
    ``ieee`` (FMA; ``$FOLD_HF_GDN_DOT``); plain tf32 (a 10-bit mantissa) is not offered. Both keep the GPU tests'
    float64 oracle within 2e-5 of the outputs' scale at 16 and 64 rows of nearly repeating keys. On an H100 at the
    Qwen3.5-9B layer shape, 16 rows: tf32x3 14.8 us, ieee 23.2, the token-by-token walk it replaced 19.7
    (benchmarks/results/2026-12-06-nvidia-h100-gdn-chunk)."""
    prec = os.environ.get("FOLD_HF_GDN_DOT") or "tf32x3"
    if prec not in DOT_PRECISIONS:
        raise ValueError(f"$FOLD_HF_GDN_DOT={prec!r}: one of {DOT_PRECISIONS}")
    return prec


SOLVE_ENV = "FOLD_HF_GDN_SOLVE"  # the chunked verify's triangular solve: "rows" (default) or "blocks"


def _solve_block(L: int) -> int:
    """Rows per block of the chunked verify's triangular solve, from ``$FOLD_HF_GDN_SOLVE``: ``rows`` (default; 0:
    ``L - 1`` rounds of ``d <- R - A d``) or ``blocks`` (blocks of about ``sqrt(L)`` rows, a power of two: 4 for 16
    rows, 8 for 32 or 64; 0 below 4 rows, where blocks save no round)."""
    solve = os.environ.get(SOLVE_ENV) or "rows"
    if solve not in ("rows", "blocks"):
        raise ValueError(f"${SOLVE_ENV}={solve!r}: 'rows' or 'blocks'")
    if solve == "rows" or L < 4:
        return 0
    return 1 << ((max(L - 1, 1).bit_length() + 1) // 2)


def _check_verify_shapes(qkv, conv_state, state, num_k_heads: int, k_dim: int, conv_weight, pending: dict):
    """(L, C, HK, HV, DK, DV, KS) of a verify over ``qkv [..., L, C]``, raising on what does not fit."""
    if state.dtype != torch.float32:
        raise ValueError(f"the Triton Gated DeltaNet kernels keep an fp32 state, got {state.dtype}")
    L, C = qkv.shape[-2:]
    HV, DK, DV = state.shape[-3:]
    HK = num_k_heads
    KS = conv_weight.shape[-1]
    if (DK != k_dim or HV % HK or C != 2 * HK * DK + HV * DV or tuple(conv_state.shape[-2:]) != (C, KS - 1)
            or KS < 2):
        raise ValueError(f"shapes do not match: qkv {tuple(qkv.shape)}, state {tuple(state.shape)}, conv "
                         f"{tuple(conv_state.shape)}, {HK} key heads of {k_dim}")
    if L > pending["k"].shape[-3]:
        raise ValueError(f"a verify of {L} rows exceeds the pending buffers ({pending['k'].shape[-3]} rows)")
    return L, C, HK, HV, DK, DV, KS


def _launch_verify(grid_rows, qkv, b, a, conv, conv_weight, a_log, dt_bias, state, out, pk, pg, pd, pr, k_dim,
                   dims, rows=None, strides=(0, 0, 0, 0, 0, 0)):
    L, C, HK, HV, DK, DV, KS = dims
    BK, BV, warps = _blocks(DK, DV)
    chunk = L > 1
    if chunk:  # tl.dot takes tiles of at least 16 x 16
        BK, BV = max(BK, 16), max(BV, 16)
    _gdn_verify_kernel[(HV, triton.cdiv(DV, BV), grid_rows)](
        qkv, b, a, conv, conv_weight.reshape(C, KS).contiguous(), a_log, dt_bias, state, out, pk, pg, pd, pr, L,
        qkv.stride(-2), b.stride(-2), a.stride(-2), float(k_dim ** -0.5), rows if rows is not None else out,
        *strides, HK=HK, HV=HV, DK=DK, DV=DV, KS=KS, BK=BK, BV=BV, LP=max(16, _next_pow2(L)) if chunk else 1,
        CHUNK=chunk, PREC=_dot_precision() if chunk else "ieee", LIB=_libdevice(), HAS_ROWS=rows is not None,
        SOLVE_BLOCK=_solve_block(L) if chunk else 0, num_warps=warps, **launch_options(qkv.device), **_EXACT)


def _inner(x: torch.Tensor) -> torch.Tensor:
    """``x`` with unit stride on its last axis (a strided view of a merged projection's rows stays a view)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def gated_delta_verify_triton(qkv, b, a, conv_state, conv_weight, a_log, dt_bias, state, num_k_heads: int,
                              k_dim: int, pending: dict, layer: int) -> torch.Tensor:
    """:func:`~fold_hf.kernels.gated_delta.naive.gated_delta_verify_reference` (fp32 state; ``qkv [L, C]``,
    ``b``/``a [L, Hv]`` may have strided rows). One token runs the rule's step; more run it chunked (dots over
    the block, module docstring)."""
    dims = _check_verify_shapes(qkv, conv_state, state, num_k_heads, k_dim, conv_weight, pending)
    L, HV, DV = dims[0], dims[3], dims[5]
    out = torch.empty(L, HV, DV, device=state.device, dtype=torch.float32)
    _launch_verify(1, _inner(qkv), _inner(b), _inner(a), conv_state.contiguous(), conv_weight, a_log, dt_bias, state,
                   out, *(pending[name][layer] for name in ("k", "g", "delta", "qkv")), k_dim, dims)
    return out


def gated_delta_verify_rows_triton(qkv, b, a, conv_rows, conv_weight, a_log, dt_bias, state_rows,
                                   row_index: torch.Tensor, num_k_heads: int, k_dim: int, pending_rows: dict,
                                   layer: int) -> torch.Tensor:
    """:func:`gated_delta_verify_triton` of ``A`` rows of a batch in one launch: row ``a`` (``qkv [A, L, C]``,
    ``b``/``a [A, L, Hv]``, strided rows allowed) from cache row ``row_index[a]`` (``[A]`` int32, on the device) of
    the layer's convolution windows ``conv_rows [B, C, K - 1]`` and states ``state_rows [B, Hv, Dk, Dv]`` (fp32;
    not modified), its pending rows those of that cache row in ``pending_rows`` (:func:`~fold_hf.kernels.
    gated_delta.naive.gated_delta_pending` of ``B * NL`` layers viewed ``[B, NL, P, ...]``), layer ``layer``. Each
    row as :func:`~fold_hf.kernels.gated_delta.naive.gated_delta_verify_reference` of that row alone. Returns
    ``[A, L, Hv, Dv]`` fp32."""
    dims = _check_verify_shapes(qkv, conv_rows, state_rows, num_k_heads, k_dim, conv_weight, pending_rows)
    A, L, HV, DV = qkv.shape[0], dims[0], dims[3], dims[5]
    B, NL, P = pending_rows["k"].shape[:3]
    if state_rows.shape[0] != B or conv_rows.shape[0] != B or row_index.shape != (A,) or not state_rows.is_contiguous():
        raise ValueError(f"{A} rows of a verify over {B} cache rows: state rows {tuple(state_rows.shape)}, conv rows "
                         f"{tuple(conv_rows.shape)}, row index {tuple(row_index.shape)}")
    conv_rows = conv_rows.contiguous()
    qkv, b, a = _inner(qkv), _inner(b), _inner(a)
    out = torch.empty(A, L, HV, DV, device=state_rows.device, dtype=torch.float32)
    _launch_verify(A, qkv, b, a, conv_rows, conv_weight, a_log, dt_bias, state_rows, out,
                   *(pending_rows[name][:, layer] for name in ("k", "g", "delta", "qkv")), k_dim, dims,
                   rows=row_index, strides=(qkv.stride(0), b.stride(0), a.stride(0), conv_rows.stride(0),
                                            state_rows.stride(0), NL * P))
    return out


@triton.jit
def _gdn_commit_kernel(N, PK, PG, PD, S, rows, s_layer, ROWS, s_row, p_row, HK: tl.constexpr, HV: tl.constexpr,
                       DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LIB: tl.constexpr,
                       HAS_ROWS: tl.constexpr):
    pid = tl.program_id(0)
    vb = tl.program_id(1)
    layer = pid // HV
    h = pid - layer * HV
    hk, rk, rv, mk, mv, m2 = _state_tile(h, vb, HK, HV, DK, DV, BK, BV)
    base = layer.to(tl.int64) * rows  # the layer's first pending row
    if HAS_ROWS:  # row a of a batch: its count, its cache row's states and pending rows
        pa = tl.program_id(2)
        row = tl.load(ROWS + pa).to(tl.int64)
        N += pa
        S += row * s_row
        base += row * p_row
    s_off = layer.to(tl.int64) * s_layer + h.to(tl.int64) * DK * DV + rk[:, None] * DV + rv[None, :]
    S_ = tl.load(S + s_off, mask=m2, other=0.0)
    n = tl.load(N)
    kt = tl.load(PK + (base * HK + hk) * DK + rk, mask=mk, other=0.0)
    dt = tl.load(PD + (base * HV + h) * DV + rv, mask=mv, other=0.0)
    gt = tl.load(PG + base * HV + h)
    for t in range(0, n + 1):  # S <- e^{g_t} S + k_t d_t^T with the verify's writes d_t: no read of S
        r = base + tl.minimum(t + 1, n)  # (the last token loads itself again, unused)
        kn = tl.load(PK + (r * HK + hk) * DK + rk, mask=mk, other=0.0)
        dn = tl.load(PD + (r * HV + h) * DV + rv, mask=mv, other=0.0)
        gn = tl.load(PG + r * HV + h)
        S_ = S_ * _exp(gt, LIB) + kt[:, None] * dt[None, :]
        kt, dt, gt = kn, dn, gn
    tl.store(S + s_off, S_, mask=m2)


def _launch_commit(grid_rows, n, pending, states, conv_states, rows=None, strides=(0, 0, 0)):
    """The two commit launches over ``states [NL, (B,) Hv, Dk, Dv]`` / ``conv_states [NL, (B,) C, K - 1]`` (strided
    over layers; each layer's, or each cache row's, contiguous). With ``rows`` (the batch's cache rows) ``strides``
    are the states' and the windows' cache-row strides and a cache row's pending rows (``NL * P``)."""
    NL, HV, DK, DV = states.shape[0], *states.shape[-3:]
    C, K1 = conv_states.shape[-2], conv_states.shape[-1]
    if states.stride()[-3:] != (DK * DV, DV, 1) or conv_states.stride()[-2:] != (K1, 1):
        raise ValueError(f"each layer's state and convolution window must be contiguous (strides {states.stride()}, "
                         f"{conv_states.stride()})")
    P, HK = pending["k"].shape[-3], pending["k"].shape[-2]
    BK, BV, warps = _blocks(DK, DV)
    index = rows if rows is not None else n
    _gdn_commit_kernel[(NL * HV, triton.cdiv(DV, BV), grid_rows)](
        n, pending["k"], pending["g"], pending["delta"], states, P, states.stride(0), index, strides[0], strides[2],
        HK=HK, HV=HV, DK=DK, DV=DV, BK=BK, BV=BV, LIB=_libdevice(), HAS_ROWS=rows is not None, num_warps=warps,
        **_EXACT)
    block = min(1024, _next_pow2(C))
    _conv_commit_kernel[(NL, triton.cdiv(C, block), grid_rows)](
        n, pending["qkv"], conv_states, C, P, conv_states.stride(0), index, strides[1], strides[2], K1=K1,
        BK1=_next_pow2(K1), BLOCK=block, HAS_ROWS=rows is not None, num_warps=4)


def gated_delta_commit_triton(n: torch.Tensor, pending: dict, length: int, states: torch.Tensor,
                              conv_states: torch.Tensor) -> None:
    """:func:`~fold_hf.kernels.gated_delta.naive.gated_delta_commit_reference`: one launch replays tokens
    ``0 .. n``'s writes into every layer's state, one shifts every layer's convolution window. ``states`` and
    ``conv_states`` may be strided over layers (one cache row of ``[NL, B, ...]`` all-row tensors: ``[:, row]``);
    each layer's ``[Hv, Dk, Dv]`` / ``[C, K - 1]`` must be contiguous."""
    _launch_commit(1, n, pending, states, conv_states)


def gated_delta_commit_rows_triton(n: torch.Tensor, pending_rows: dict, length: int, states: torch.Tensor,
                                   conv_states: torch.Tensor, row_index: torch.Tensor) -> None:
    """:func:`gated_delta_commit_triton` of ``A`` rows of a batch in one launch pair: row ``a`` commits the first
    ``n[a] + 1`` tokens (``n [A]`` long, on the device) of its last verify into cache row ``row_index[a]`` of every
    layer's states ``states [NL, B, Hv, Dk, Dv]`` and windows ``conv_states [NL, B, C, K - 1]``, from that cache
    row's pending rows (``pending_rows``: ``[B, NL, P, ...]``, :func:`gated_delta_verify_rows_triton`'s)."""
    NL, B = states.shape[:2]
    A = row_index.shape[0]
    P = pending_rows["k"].shape[2]
    if conv_states.shape[:2] != (NL, B) or pending_rows["k"].shape[:2] != (B, NL) or n.shape != (A,):
        raise ValueError(f"states {tuple(states.shape)}, windows {tuple(conv_states.shape)}, pending "
                         f"{tuple(pending_rows['k'].shape)}, counts {tuple(n.shape)} of {A} rows do not match")
    _launch_commit(A, n, pending_rows, states, conv_states, rows=row_index,
                   strides=(states.stride(1), conv_states.stride(1), NL * P))


@triton.jit
def _conv_commit_kernel(N, RAW, CONV, C, rows, conv_layer, ROWS, conv_row, p_row, K1: tl.constexpr,
                        BK1: tl.constexpr, BLOCK: tl.constexpr, HAS_ROWS: tl.constexpr):
    """Window column ``n + 1 + j`` of [conv state | the block's raw projections] into conv state column ``j``, for
    every layer's channels (each program reads all its old columns before writing them); with ``HAS_ROWS`` for row
    ``program_id(2)`` of a batch, in its cache row."""
    layer = tl.program_id(0)
    chan = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mc = chan < C
    cols = tl.arange(0, BK1)
    mj = cols < K1
    if HAS_ROWS:
        pa = tl.program_id(2)
        cache_row = tl.load(ROWS + pa).to(tl.int64)
        N += pa
        CONV += cache_row * conv_row
        RAW += cache_row * p_row * C
    n = tl.load(N)
    src = (n + 1 + cols).to(tl.int32)  # window column of each new column
    in_state = (src < K1)[None, :]
    m2 = mc[:, None] & mj[None, :]
    base = layer.to(tl.int64) * conv_layer
    old = tl.load(CONV + base + chan[:, None] * K1 + tl.minimum(src, K1 - 1)[None, :], mask=m2 & in_state,
                  other=0.0)
    row = tl.maximum(src - K1, 0)[None, :]
    new = tl.load(RAW + (layer.to(tl.int64) * rows + row) * C + chan[:, None], mask=m2 & (src >= K1)[None, :],
                  other=0.0)
    value = tl.where(in_state, old, new)
    tl.debug_barrier()  # a column one thread writes may be another thread's old column: every load first
    tl.store(CONV + base + chan[:, None] * K1 + cols[None, :], value, mask=m2)


# ---------------------------------------------------------------------------------------------- output norm
@triton.jit
def _gated_rms_norm_kernel(X, Z, W, OUT, D, z_heads, z_token_stride, eps, BD: tl.constexpr, LIB: tl.constexpr,
                           PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BD)
    ok = offs < D
    z = tl.load(Z + (row // z_heads) * z_token_stride + (row % z_heads) * D + offs, mask=ok, other=0.0)
    dtype = z.dtype
    x = _round_to(tl.load(X + row * D + offs, mask=ok, other=0.0).to(tl.float32), dtype)
    n = _round_to(x * tl.math.rsqrt(tl.sum(x * x, 0) / D + eps), dtype)
    o = _round_to(tl.load(W + offs, mask=ok, other=0.0).to(tl.float32) * n, dtype)
    tl.store(OUT + row * D + offs, _round_to(o * _silu(z.to(tl.float32), LIB), dtype).to(dtype), mask=ok)


def gated_rms_norm_triton(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`~fold_hf.kernels.gated_delta.naive.gated_rms_norm_reference` (``x``, ``gate [..., Hv, Dv]``). ``gate``
    may have strided tokens (``z`` read in place from a merged input projection's rows, heads and values packed)."""
    D = x.shape[-1]
    if gate.shape != x.shape or weight.shape != (D,) or weight.dtype != gate.dtype:
        raise ValueError(f"x {tuple(x.shape)}, gate {tuple(gate.shape)}, weight {tuple(weight.shape)} "
                         f"{weight.dtype} do not match")
    x = x.contiguous()
    if gate.stride(-1) != 1 or (gate.dim() > 1 and gate.stride(-2) != D):
        gate = gate.contiguous()
    heads = gate.shape[-2] if gate.dim() > 1 else 1
    tokens = gate.reshape(-1, heads, D)  # a view when the leading dims flatten (a copy otherwise)
    out = torch.empty(gate.shape, device=gate.device, dtype=gate.dtype)
    _gated_rms_norm_kernel[(x.numel() // D,)](x, tokens, weight, out, D, heads, tokens.stride(0), float(eps),
                                             BD=_next_pow2(D), LIB=_libdevice(), num_warps=1 if D <= 256 else 4,
                                             **launch_options(gate.device), **_EXACT)
    return out


__all__ = ["gated_delta_commit_rows_triton", "gated_delta_commit_triton", "gated_delta_states_triton",
           "gated_delta_verify_rows_triton", "gated_delta_verify_triton", "gated_rms_norm_triton"]
