"""Triton flash-attention forward for prefill chunks: causal with a query offset, GQA, an optional sliding window.

Semantics of :func:`~fold_hf.kernels.prefill_attention.naive.prefill_attention_naive`. One program per block of
``BLOCK_M`` queries of one query head; it walks the key blocks its queries can see (``[p0 - window + 1, p1]``) in
three loops: the window's edge (masked), the blocks every query sees in full (no mask), the diagonal (masked).
Online softmax in fp32 (exp2 with the scale folded in), ``P`` rounded to the value dtype before ``P @ V``, as
flash attention does. Output written in ``[B, L, Hq, D]`` memory order (the layout the o-projection reads) and
returned as a ``[B, Hq, L, D]`` view.

Import only on CUDA (or under ``TRITON_INTERPRET=1`` in tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, num_warps, num_stages) per head-dim bound; D 128: the best of 5 on an H200 (528 TFLOP/s at 32K in
# chunks of 8192; benchmarks/results/2026-12-04-nvidia-h200-prefill), D 256: the largest that fits shared memory
CONFIGS = {64: (128, 64, 4, 3), 128: (128, 128, 8, 3), 256: (64, 32, 4, 2)}
MAX_HEAD_DIM = 256


@triton.jit
def _tile(acc, l_i, m_i, q, K, V, k_base, v_base, stride_kn, stride_vn, lo, hi, pos, S, window, qk_scale,
          offs_n, offs_d, d_ok, BLOCK_N: tl.constexpr, MASK: tl.constexpr, HAS_WINDOW: tl.constexpr,
          FP32_DOT: tl.constexpr):
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + offs_n
        if MASK:
            ok_n = cols < S
            k = tl.load(K + k_base + cols[None, :] * stride_kn + offs_d[:, None],
                        mask=ok_n[None, :] & d_ok[:, None], other=0.0)
        else:
            k = tl.load(K + k_base + cols[None, :] * stride_kn + offs_d[:, None], mask=d_ok[:, None], other=0.0)
        if FP32_DOT:
            qk = tl.dot(q, k, input_precision="ieee")
        else:
            qk = tl.dot(q, k)
        qk = qk * qk_scale
        if MASK:
            visible = (cols[None, :] <= pos[:, None]) & (cols[None, :] < S)
            if HAS_WINDOW:
                visible = visible & (pos[:, None] - cols[None, :] < window)
            qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = m_new
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if MASK:
            v = tl.load(V + v_base + cols[:, None] * stride_vn + offs_d[None, :],
                        mask=ok_n[:, None] & d_ok[None, :], other=0.0)
        else:
            v = tl.load(V + v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        if FP32_DOT:
            acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _prefill_attention_kernel(Q, K, V, O, start, L, S, num_heads, group, window, qk_scale,
                              stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                              D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              HAS_WINDOW: tl.constexpr, FP32_DOT: tl.constexpr):
    mblock = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // num_heads
    h = bh % num_heads
    kvh = h // group
    offs_m = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    m_ok = offs_m < L
    pos = start + offs_m  # query positions
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = b * stride_kb + kvh * stride_kh
    v_base = b * stride_vb + kvh * stride_vh
    p0 = start + mblock * BLOCK_M  # first query position of the block
    p_last = tl.minimum(p0 + BLOCK_M, start + L) - 1
    hi = tl.minimum(p_last + 1, S)
    hi_full = ((p0 + 1) // BLOCK_N) * BLOCK_N  # key blocks [.., hi_full) are visible to every query (causally)
    if HAS_WINDOW:
        lo = (tl.maximum(p0 - window + 1, 0) // BLOCK_N) * BLOCK_N
        lo_full = ((tl.maximum(p_last - window + 1, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
        lo_full = tl.minimum(lo_full, hi_full)
    else:
        lo = 0
        lo_full = 0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HAS_WINDOW:
        acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, k_base, v_base, stride_kn, stride_vn, lo, lo_full, pos, S,
                              window, qk_scale, offs_n, offs_d, d_ok, BLOCK_N, True, HAS_WINDOW, FP32_DOT)
    acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, k_base, v_base, stride_kn, stride_vn, lo_full, hi_full, pos, S,
                          window, qk_scale, offs_n, offs_d, d_ok, BLOCK_N, False, HAS_WINDOW, FP32_DOT)
    acc, l_i, m_i = _tile(acc, l_i, m_i, q, K, V, k_base, v_base, stride_kn, stride_vn, hi_full, hi, pos, S,
                          window, qk_scale, offs_n, offs_d, d_ok, BLOCK_N, True, HAS_WINDOW, FP32_DOT)
    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # rows past L (never stored)
    out = acc / l_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def prefill_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float,
                             window: int | None = None, config: tuple | None = None) -> torch.Tensor:
    """Causal attention of a prefill chunk with a query offset (semantics of
    :func:`~fold_hf.kernels.prefill_attention.naive.prefill_attention_naive`).

    Args:
        q: ``[B, Hq, L, D]`` queries at positions ``start .. start + L - 1`` (any strides, head dim contiguous).
        k: ``[B, Hkv, S, D]`` keys at positions ``0 .. S - 1``, ``S = start + L`` (e.g. a view of the static
            cache ``[1, Hkv, capacity, D]``); v: ``[B, Hkv, S, D]`` values.
        start: position of the first query.
        scale: the logit scale.
        window: sliding window or None.
        config: ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``, default :data:`CONFIGS` by head dim.

    Returns:
        ``[B, Hq, L, D]`` in ``q``'s dtype (a view of ``[B, L, Hq, D]`` memory).
    """
    B, Hq, L, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    if S != start + L or v.shape != k.shape or Hq % Hkv or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"q {tuple(q.shape)} at {start} does not match k {tuple(k.shape)} / v {tuple(v.shape)}")
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head dim {D} > {MAX_HEAD_DIM}")
    if q.dtype != k.dtype or v.dtype != k.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    block_d = max(16, _next_pow2(D))
    if config is None:
        config = CONFIGS[min(c for c in CONFIGS if c >= block_d)]
        if q.dtype == torch.float32:  # fp32 tiles take twice the shared memory
            config = (min(config[0], 64), min(config[1], 32), config[2], min(config[3], 2))
    block_m, block_n, warps, stages = config
    out = torch.empty(B, L, Hq, D, device=q.device, dtype=q.dtype).transpose(1, 2)  # [B, Hq, L, D] view
    LOG2E = 1.4426950408889634
    grid = (triton.cdiv(L, block_m), B * Hq)
    _prefill_attention_kernel[grid](
        q, k, v, out, start, L, S, Hq, Hq // Hkv, window if window is not None else 0, scale * LOG2E,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=D, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, HAS_WINDOW=window is not None,
        FP32_DOT=q.dtype == torch.float32, num_warps=warps, num_stages=stages)
    return out


@triton.jit
def _merge_lse_kernel(O1, LSE1, O2, LSE2, OUT, L, num_heads, s1b, s1h, s1l, s2b, s2h, s2l, sob, soh, sol,
                      D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr):
    bh = tl.program_id(0)
    b = bh // num_heads
    h = bh % num_heads
    rows = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    cols = tl.arange(0, BLOCK_D)
    ok_r = rows < L
    ok = ok_r[:, None] & (cols < D)[None, :]
    lse1 = tl.load(LSE1 + bh * L + rows, mask=ok_r, other=0.0)
    lse2 = tl.load(LSE2 + bh * L + rows, mask=ok_r, other=0.0)
    w = 1.0 / (1.0 + tl.exp(lse2 - lse1))
    o1 = tl.load(O1 + b * s1b + h * s1h + rows[:, None] * s1l + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    o2 = tl.load(O2 + b * s2b + h * s2h + rows[:, None] * s2l + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    out = o2 + w[:, None] * (o1 - o2)
    tl.store(OUT + b * sob + h * soh + rows[:, None] * sol + cols[None, :], out.to(OUT.dtype.element_ty), mask=ok)


def merge_lse_triton(out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """:func:`~fold_hf.kernels.prefill_attention.naive.merge_lse_reference` in one launch (``out1, out2
    [B, H, L, D]`` with a contiguous head dim, ``lse1, lse2 [B, H, L]`` fp32); the result is written in
    ``[B, L, H, D]`` memory order and returned as a ``[B, H, L, D]`` view."""
    B, H, L, D = out2.shape
    if out1.shape != out2.shape or out1.stride(-1) != 1 or out2.stride(-1) != 1:
        raise ValueError(f"out1 {tuple(out1.shape)} / out2 {tuple(out2.shape)} must match with a contiguous head dim")
    lse1 = lse1.reshape(B, H, L).float().contiguous()
    lse2 = lse2.reshape(B, H, L).float().contiguous()
    out = torch.empty(B, L, H, D, device=out2.device, dtype=out2.dtype).transpose(1, 2)
    block_l = 32
    _merge_lse_kernel[(B * H, triton.cdiv(L, block_l))](
        out1, lse1, out2, lse2, out, L, H, out1.stride(0), out1.stride(1), out1.stride(2),
        out2.stride(0), out2.stride(1), out2.stride(2), out.stride(0), out.stride(1), out.stride(2),
        D=D, BLOCK_D=max(16, _next_pow2(D)), BLOCK_L=block_l, num_warps=4)
    return out
