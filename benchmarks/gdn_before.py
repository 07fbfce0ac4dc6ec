"""The Gated DeltaNet verify kernel as it was before the chunked verify (fold_hf 2026-12-05, f2c4b56): the delta
rule walked token after token, each step two reductions of the ``[Dk, BV]`` state tile. Kept only as the "before"
row of ``hybrid_bench.py --kernel-sweep`` (timed beside the chunked kernel in one process); nothing in fold_hf
imports it. Its pending buffers hold q, k, v, g and beta (:func:`steps_pending`), not the chunked kernel's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fold_hf.kernels.gated_delta.triton import _blocks, _gdn_inputs, _gdn_keep_raw, _next_pow2
from fold_hf.kernels.hybrid.triton import _EXACT, _exp, _libdevice


@triton.jit
def _gdn_verify_kernel(QKV, B, A, CONV, CW, ALOG, DTB, S, OUT, PQ, PK, PV, PG, PB, PR, L, qkv_stride, b_stride,
                       a_stride, scale, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       KS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr, LIB: tl.constexpr):
    h = tl.program_id(0)
    vb = tl.program_id(1)
    GROUP: tl.constexpr = HV // HK
    hk = h // GROUP
    C: tl.constexpr = 2 * HK * DK + HV * DV
    # prologue (the current kernel's), written to the commit's buffers. Every program sharing a key head writes the
    # same q/k bits, so each may read back its own writes after the barrier.
    q, k, v, g, beta, rk, rv, rl, mk, mv, ml, qc, kc, vc = _gdn_inputs(
        QKV, B, A, CONV, CW, ALOG, DTB, h, hk, vb, L, qkv_stride, b_stride, a_stride, scale, HK, HV, DK, DV, KS, BK,
        BV, LP, LIB)
    lk = ml[:, None] & mk[None, :]
    lv = ml[:, None] & mv[None, :]
    tl.store(PQ + (rl[:, None] * HK + hk) * DK + rk[None, :], q, mask=lk)
    tl.store(PK + (rl[:, None] * HK + hk) * DK + rk[None, :], k, mask=lk)
    tl.store(PV + (rl[:, None] * HV + h) * DV + rv[None, :], v, mask=lv)
    tl.store(PG + rl * HV + h, g, mask=ml)
    tl.store(PB + rl * HV + h, beta, mask=ml)
    _gdn_keep_raw(QKV, PR, qkv_stride, C, rl, qc, kc, vc, lk, lv, (vb == 0) & (h % GROUP == 0))
    tl.debug_barrier()
    # the recurrence: one token after another, the next token's inputs loaded while this one computes
    m2 = mk[:, None] & mv[None, :]
    s_off = h * DK * DV + rk[:, None] * DV + rv[None, :]
    S_ = tl.load(S + s_off, mask=m2, other=0.0).to(tl.float32)
    kt = tl.load(PK + hk * DK + rk, mask=mk, other=0.0)
    qt = tl.load(PQ + hk * DK + rk, mask=mk, other=0.0)
    vt = tl.load(PV + h * DV + rv, mask=mv, other=0.0)
    gt = tl.load(PG + h)
    bt = tl.load(PB + h)
    for t in range(0, L):
        nxt = tl.minimum(t + 1, L - 1)  # (the last token loads itself again, unused)
        kn = tl.load(PK + (nxt * HK + hk) * DK + rk, mask=mk, other=0.0)
        qn = tl.load(PQ + (nxt * HK + hk) * DK + rk, mask=mk, other=0.0)
        vn = tl.load(PV + (nxt * HV + h) * DV + rv, mask=mv, other=0.0)
        gn = tl.load(PG + nxt * HV + h)
        bn = tl.load(PB + nxt * HV + h)
        # S_t = e S + k delta^T, delta = (v - e S^T k) beta, o_t = S_t^T q = e S^T q + delta (k . q): both
        # reductions read the previous state, so they run side by side instead of one after the other
        e = _exp(gt, LIB)
        read = tl.sum(S_ * kt[:, None], axis=0)
        seen = tl.sum(S_ * qt[:, None], axis=0)
        kq = tl.sum(kt * qt, axis=0)
        delta = (vt - e * read) * bt
        tl.store(OUT + (t * HV + h) * DV + rv, e * seen + delta * kq, mask=mv)
        S_ = S_ * e + kt[:, None] * delta[None, :]
        kt, qt, vt, gt, bt = kn, qn, vn, gn, bn



def steps_pending(rows: int, HK: int, DK: int, HV: int, DV: int, C: int) -> dict:
    z = dict(device="cuda", dtype=torch.float32)
    return {"q": torch.zeros(rows, HK, DK, **z), "k": torch.zeros(rows, HK, DK, **z),
            "v": torch.zeros(rows, HV, DV, **z), "g": torch.zeros(rows, HV, **z), "beta": torch.zeros(rows, HV, **z),
            "qkv": torch.zeros(rows, C, device="cuda", dtype=torch.bfloat16)}


def steps_verify(qkv, b, a, conv_state, conv_weight, a_log, dt_bias, state, num_k_heads: int, k_dim: int,
                 pending: dict) -> torch.Tensor:
    L, C = qkv.shape
    HV, DK, DV = state.shape
    KS = conv_weight.shape[-1]
    out = torch.empty(L, HV, DV, device=state.device, dtype=torch.float32)
    BK, BV, warps = _blocks(DK, DV)
    _gdn_verify_kernel[(HV, triton.cdiv(DV, BV))](
        qkv, b, a, conv_state, conv_weight.reshape(C, KS), a_log, dt_bias, state, out, pending["q"], pending["k"],
        pending["v"], pending["g"], pending["beta"], pending["qkv"], L, qkv.stride(0), b.stride(0), a.stride(0),
        float(k_dim ** -0.5), HK=num_k_heads, HV=HV, DK=DK, DV=DV, KS=KS, BK=BK, BV=BV, LP=_next_pow2(L),
        LIB=_libdevice(), num_warps=warps, **_EXACT)
    return out
