"""Triton kernels of the Qwen3.5 and Gemma target layers on the fast loop (twins with the same signatures:
:mod:`fold_hf.kernels.hybrid.naive`). Imported only when Triton is usable.

Through the model's modules a Qwen3.5 Gated DeltaNet layer is ~75 small kernels per step and a Gemma layer ~100 (a
Gemma RMSNorm alone is eight, six norms a layer); at one query per step each costs a few microseconds of launch and
latency, more than reading the layer's weights. These kernels leave a layer its projections, its attention and:

* :func:`residual_norm_triton`: residual add (of a normed sublayer output, Gemma's sandwich), ``layer_scalar`` and
  the next norm in one pass (one program per row);
* :func:`head_norm_rope_write_triton`: q/k (and Gemma-4 v) per-head norms, partial rope and the (ring) cache write,
  one program per (token, head);
* :func:`gelu_tanh_mul_triton`, :func:`sigmoid_mul_triton`, :func:`gated_rms_norm_triton`: the activations;
* :func:`gated_delta_verify_triton`: a whole Gated DeltaNet step after the projections: causal conv + silu, L2 norms,
  ``beta``/``g`` from ``b``/``a`` for all rows at once, then the delta rule token after token, one program per
  (value head, ``BV`` value columns) holding ``S[:, cols]`` in registers (the step is written
  ``S' = e S + k d^T``, ``d = (v - e S^T k) beta``, ``o = e S^T q + d (k . q)``: its two reductions read the same
  state, so they do not wait for each other); it reads the committed state once and writes *no* state: the block's
  inputs go to small pending buffers and :func:`gated_delta_commit_triton` re-runs the accepted prefix
  ``0 .. n`` from the committed state for every linear layer in one launch (``n`` read on the device). A verify of
  16 rows at the Qwen3.5-9B shape thus moves 2 MB of state per layer and direction instead of writing 16 x 2 MB.

Rounding follows the modules (model dtype after each op that rounds there) through ``_round_to`` and
``enable_fp_fusion=False`` as in :mod:`fold_hf.kernels.layer.triton`; transcendental functions use libdevice on the
GPU (``expf``, ``log1pf``, ``tanhf`` as PyTorch's CUDA kernels) and Triton's own in the interpreter.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..layer.triton import _round_to

_EXACT = dict(enable_fp_fusion=False)


def _libdevice() -> bool:
    return os.environ.get("TRITON_INTERPRET") != "1"  # the interpreter has no libdevice


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@triton.jit
def _exp(x, LIB: tl.constexpr):
    if LIB:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def _sigmoid(x, LIB: tl.constexpr):
    return tl.math.div_rn(tl.full(x.shape, 1.0, tl.float32), 1.0 + _exp(-x, LIB))


@triton.jit
def _silu(x, LIB: tl.constexpr):
    return tl.math.div_rn(x, 1.0 + _exp(-x, LIB))


# ---------------------------------------------------------------------------------------------- residual + norm
@triton.jit
def _residual_norm_kernel(HIDDEN, DELTA, DW, W, SCALAR, TOTAL, NORMED, H, eps, delta_eps, offset,
                          HAS_DELTA: tl.constexpr, NORM_DELTA: tl.constexpr, HAS_DW: tl.constexpr,
                          HAS_SCALAR: tl.constexpr, NORM_OUT: tl.constexpr, HAS_W: tl.constexpr,
                          BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    base = row.to(tl.int64) * H
    x = tl.load(HIDDEN + base + offs, mask=ok, other=0.0)
    dtype = x.dtype
    xf = x.to(tl.float32)
    if HAS_DELTA:
        d = tl.load(DELTA + base + offs, mask=ok, other=0.0).to(tl.float32)
        if NORM_DELTA:
            d = d * tl.math.rsqrt(tl.sum(d * d, 0) / H + delta_eps)
            if HAS_DW:
                d = d * (offset + tl.load(DW + offs, mask=ok, other=0.0).to(tl.float32))
            d = _round_to(d, dtype)
        xf = _round_to(xf + d, dtype)
    if HAS_SCALAR:
        xf = _round_to(xf * tl.load(SCALAR).to(tl.float32), dtype)
    if HAS_DELTA or HAS_SCALAR:
        tl.store(TOTAL + base + offs, xf.to(dtype), mask=ok)
    if NORM_OUT:
        n = xf * tl.math.rsqrt(tl.sum(xf * xf, 0) / H + eps)
        if HAS_W:
            n = n * (offset + tl.load(W + offs, mask=ok, other=0.0).to(tl.float32))
        tl.store(NORMED + base + offs, _round_to(n, dtype).to(dtype), mask=ok)


def residual_norm_triton(hidden, delta, weight, eps, offset=0.0, *, norm_out=True, delta_weight=None, delta_eps=None,
                         norm_delta=False, scalar=None):
    """:func:`~fold_hf.kernels.hybrid.naive.residual_norm_reference` (``hidden``/``delta [..., H]``)."""
    H = hidden.shape[-1]
    hidden = hidden.contiguous()
    for name, t in (("delta", delta), ("weight", weight), ("delta_weight", delta_weight)):
        if t is not None and t.dtype != hidden.dtype:
            raise ValueError(f"{name} is {t.dtype}, hidden {hidden.dtype}")
    if delta is not None:
        if delta.shape != hidden.shape:
            raise ValueError(f"delta {tuple(delta.shape)} does not match hidden {tuple(hidden.shape)}")
        delta = delta.contiguous()
    rows = hidden.numel() // H
    total = torch.empty_like(hidden) if (delta is not None or scalar is not None) else hidden
    normed = torch.empty_like(hidden) if norm_out else None
    block = _next_pow2(H)
    dummy = hidden
    _residual_norm_kernel[(rows,)](
        hidden, delta if delta is not None else dummy, delta_weight if delta_weight is not None else dummy,
        weight if weight is not None else dummy, scalar if scalar is not None else dummy, total,
        normed if normed is not None else dummy, H, float(eps), float(eps if delta_eps is None else delta_eps),
        float(offset), HAS_DELTA=delta is not None, NORM_DELTA=bool(norm_delta), HAS_DW=delta_weight is not None,
        HAS_SCALAR=scalar is not None, NORM_OUT=bool(norm_out), HAS_W=weight is not None, BLOCK=block,
        num_warps=max(1, min(16, block // 512)), **_EXACT)
    return total, normed


# ---------------------------------------------------------------------------------------------- heads: norm + rope
@triton.jit
def _norm_rope_row(src, W, COS, SIN, pos, cos_stride, eps, offset, D, HALF: tl.constexpr, R: tl.constexpr,
                   NORM: tl.constexpr, HAS_W: tl.constexpr, ROTATE: tl.constexpr, BD: tl.constexpr):
    offs = tl.arange(0, BD)
    ok = offs < D
    x = tl.load(src + offs, mask=ok, other=0.0)
    dtype = x.dtype
    xf = x.to(tl.float32)
    rot = offs < R
    partner = tl.where(offs < HALF, offs + HALF, offs - HALF)
    xp = tl.load(src + partner, mask=rot & ok, other=0.0).to(tl.float32)
    if NORM:
        inv = tl.math.rsqrt(tl.sum(xf * xf, 0) / D + eps)
        xf = xf * inv
        xp = xp * inv
        if HAS_W:
            xf = xf * (offset + tl.load(W + offs, mask=ok, other=0.0).to(tl.float32))
            xp = xp * (offset + tl.load(W + partner, mask=rot & ok, other=0.0).to(tl.float32))
        xf = _round_to(xf, dtype)
        xp = _round_to(xp, dtype)
    if ROTATE:
        c = tl.load(COS + pos * cos_stride + offs, mask=rot & ok, other=0.0).to(tl.float32)
        s = tl.load(SIN + pos * cos_stride + offs, mask=rot & ok, other=0.0).to(tl.float32)
        sign = tl.where(offs < HALF, -1.0, 1.0)
        rotated = _round_to(_round_to(xf * c, dtype) + _round_to((sign * xp) * s, dtype), dtype)
        xf = tl.where(rot, rotated, xf)
    return xf.to(dtype), offs, ok


@triton.jit
def _head_norm_rope_kernel(Q, K, V, QW, KW, COS, SIN, POS, KC, VC, QO, KO, VO, L, HQ, HKV,
                           q_tok, q_head, k_tok, k_head, v_tok, v_head, cache_head, cache_row, ring, cos_stride,
                           eps, offset, D, HALF: tl.constexpr, R: tl.constexpr, BD: tl.constexpr,
                           NORM_QK: tl.constexpr, HAS_W: tl.constexpr, NORM_V: tl.constexpr):
    token = tl.program_id(0)
    head = tl.program_id(1)  # [0, HQ) queries, [HQ, HQ + HKV) keys, then values
    pos = tl.load(POS + token)
    slot = pos % ring
    if head < HQ:
        out, offs, ok = _norm_rope_row(Q + token * q_tok + head * q_head, QW, COS, SIN, pos, cos_stride, eps, offset,
                                       D, HALF, R, NORM_QK, HAS_W, True, BD)
        tl.store(QO + (head * L + token) * D + offs, out, mask=ok)
    elif head < HQ + HKV:
        h = head - HQ
        out, offs, ok = _norm_rope_row(K + token * k_tok + h * k_head, KW, COS, SIN, pos, cos_stride, eps, offset,
                                       D, HALF, R, NORM_QK, HAS_W, True, BD)
        tl.store(KO + (h * L + token) * D + offs, out, mask=ok)
        tl.store(KC + h * cache_head + slot * cache_row + offs, out, mask=ok)
    else:
        h = head - HQ - HKV
        out, offs, ok = _norm_rope_row(V + token * v_tok + h * v_head, KW, COS, SIN, pos, cos_stride, eps, 0.0,
                                       D, HALF, R, NORM_V, False, False, BD)
        tl.store(VO + (h * L + token) * D + offs, out, mask=ok)
        tl.store(VC + h * cache_head + slot * cache_row + offs, out, mask=ok)


def _heads(x: torch.Tensor):
    """``[1, L, heads, D]`` with a contiguous last dim -> (tensor, token stride, head stride)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x, x.stride(1), x.stride(2)


def head_norm_rope_write_triton(query, key, value, q_weight, k_weight, eps, offset, cos_table, sin_table, positions,
                                key_cache, value_cache, *, norm_qk=True, norm_value=False):
    """:func:`~fold_hf.kernels.hybrid.naive.head_norm_rope_write_reference` (queries and keys may be strided
    views of a wider projection)."""
    _, L, HQ, D = query.shape
    R = cos_table.shape[-1]
    if R % 2 or R > D or sin_table.shape != cos_table.shape:
        raise ValueError(f"rope tables {tuple(cos_table.shape)} do not rotate head dim {D}")
    if norm_qk and q_weight is not None and (q_weight.shape != (D,) or k_weight is not None
                                             and k_weight.shape != (D,)):
        raise ValueError(f"norm weights must be [{D}]")
    query, q_tok, q_head = _heads(query)
    cos_table, sin_table = cos_table.contiguous(), sin_table.contiguous()
    q_out = query.new_empty(1, HQ, L, D)
    if key is None:
        HKV, k_out = 0, None
        key = value = query
        k_tok = k_head = v_tok = v_head = cache_head = cache_row = 0
        ring = 1
        key_cache = value_cache = k_out_arg = v_out_arg = q_out
    else:
        HKV = key.shape[2]
        if key.shape != (1, L, HKV, D) or value.shape != key.shape:
            raise ValueError(f"key {tuple(key.shape)} / value {tuple(value.shape)} do not match query "
                             f"{tuple(query.shape)}")
        if key_cache.stride() != value_cache.stride() or key_cache.stride(-1) != 1:
            raise ValueError("key and value caches must share strides with a contiguous head dim")
        key, k_tok, k_head = _heads(key)
        value, v_tok, v_head = _heads(value)
        k_out_arg = k_out = key.new_empty(1, HKV, L, D)
        v_out_arg = value.new_empty(1, HKV, L, D)
        cache_head, cache_row, ring = key_cache.stride(1), key_cache.stride(2), key_cache.shape[2]
    weight = q_weight if q_weight is not None else query
    _head_norm_rope_kernel[(L, HQ + 2 * HKV)](
        query, key, value, weight, k_weight if k_weight is not None else weight, cos_table, sin_table, positions,
        key_cache, value_cache, q_out, k_out_arg, v_out_arg, L, HQ, HKV, q_tok, q_head, k_tok, k_head, v_tok, v_head,
        cache_head, cache_row, ring, cos_table.stride(0), float(eps), float(offset), D, HALF=R // 2, R=R,
        BD=_next_pow2(D), NORM_QK=bool(norm_qk), HAS_W=q_weight is not None, NORM_V=bool(norm_value),
        num_warps=1 if D <= 256 else 2, **_EXACT)
    if k_out is None:
        return q_out, None, None
    return q_out, k_out, v_out_arg


# ---------------------------------------------------------------------------------------------- activations
@triton.jit
def _gelu_tanh_mul_kernel(GATE, UP, OUT, n, width, gate_row, up_row, BLOCK: tl.constexpr, LIB: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    row = offs // width
    col = offs - row * width
    g = tl.load(GATE + row * gate_row + col, mask=ok, other=0.0)
    u = tl.load(UP + row * up_row + col, mask=ok, other=0.0)
    x = g.to(tl.float32)
    inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
    if LIB:
        th = libdevice.tanh(inner)
    else:
        th = 1.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0)
    gelu = _round_to(0.5 * x * (1.0 + th), g.dtype)
    tl.store(OUT + offs, _round_to(gelu * u.to(tl.float32), g.dtype).to(g.dtype), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def gelu_tanh_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """:func:`~fold_hf.kernels.hybrid.naive.gelu_tanh_mul_reference` (rows may be strided)."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} differ")
    out = torch.empty(gate.shape, device=gate.device, dtype=gate.dtype)
    g, u = _rows(gate), _rows(up)
    n, block = gate.numel(), 1024
    _gelu_tanh_mul_kernel[(triton.cdiv(n, block),)](g, u, out, n, gate.shape[-1], g.stride(0), u.stride(0),
                                                    BLOCK=block, LIB=_libdevice(), num_warps=4, **_EXACT)
    return out


@triton.jit
def _sigmoid_mul_kernel(X, GATE, OUT, n, width, x_row, gate_row, BLOCK: tl.constexpr, LIB: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    row = offs // width
    col = offs - row * width
    x = tl.load(X + row * x_row + col, mask=ok, other=0.0)
    g = tl.load(GATE + row * gate_row + col, mask=ok, other=0.0).to(tl.float32)
    sig = _round_to(_sigmoid(g, LIB), x.dtype)
    tl.store(OUT + offs, _round_to(x.to(tl.float32) * sig, x.dtype).to(x.dtype), mask=ok)


def sigmoid_mul_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """:func:`~fold_hf.kernels.hybrid.naive.sigmoid_mul_reference` (``[..., D]``; rows may be strided)."""
    if x.shape != gate.shape or x.dtype != gate.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and gate {tuple(gate.shape)} {gate.dtype} differ")
    out = torch.empty(x.shape, device=x.device, dtype=x.dtype)
    xr, gr = _rows(x), _rows(gate)
    n, block = x.numel(), 1024
    _sigmoid_mul_kernel[(triton.cdiv(n, block),)](xr, gr, out, n, x.shape[-1], xr.stride(0), gr.stride(0),
                                                  BLOCK=block, LIB=_libdevice(), num_warps=4, **_EXACT)
    return out


@triton.jit
def _gated_rms_norm_kernel(X, Z, W, OUT, D, eps, BD: tl.constexpr, LIB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BD)
    ok = offs < D
    z = tl.load(Z + row * D + offs, mask=ok, other=0.0)
    dtype = z.dtype
    x = _round_to(tl.load(X + row * D + offs, mask=ok, other=0.0).to(tl.float32), dtype)
    n = _round_to(x * tl.math.rsqrt(tl.sum(x * x, 0) / D + eps), dtype)
    o = _round_to(tl.load(W + offs, mask=ok, other=0.0).to(tl.float32) * n, dtype)
    tl.store(OUT + row * D + offs, _round_to(o * _silu(z.to(tl.float32), LIB), dtype).to(dtype), mask=ok)


def gated_rms_norm_triton(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`~fold_hf.kernels.hybrid.naive.gated_rms_norm_reference` (``x``, ``gate [..., Dv]``)."""
    D = x.shape[-1]
    if gate.shape != x.shape or weight.shape != (D,) or weight.dtype != gate.dtype:
        raise ValueError(f"x {tuple(x.shape)}, gate {tuple(gate.shape)}, weight {tuple(weight.shape)} "
                         f"{weight.dtype} do not match")
    x, gate = x.contiguous(), gate.contiguous()
    out = torch.empty(gate.shape, device=gate.device, dtype=gate.dtype)
    _gated_rms_norm_kernel[(x.numel() // D,)](x, gate, weight, out, D, float(eps), BD=_next_pow2(D), LIB=_libdevice(),
                                             num_warps=1 if D <= 256 else 4, **_EXACT)
    return out


# ---------------------------------------------------------------------------------------------- ring attention
@triton.jit
def _ring_split_kernel(Q, KR, VR, POS, PACC, PM, PL, L, R, window, scale, kv_head, kv_row, chunks_per_split,
                       G: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       IEEE: tl.constexpr):
    kvh = tl.program_id(0)
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
    base = kvh * nsp + sp
    tl.store(PACC + (base * rows_total + rm)[:, None] * BD + rd[None, :], acc)
    tl.store(PM + base * rows_total + rm, m_i)
    tl.store(PL + base * rows_total + rm, l_i)


@triton.jit
def _ring_merge_kernel(PACC, PM, PL, OUT, L, HQ, nsp, BM, G: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                       BS: tl.constexpr):
    kvh = tl.program_id(0)
    m = tl.program_id(1)  # row g * L + r
    r = m % L
    g = m // L
    rs = tl.arange(0, BS)
    ok = rs < nsp
    rd = tl.arange(0, BD)
    base = kvh * nsp + rs
    mx = tl.load(PM + base * BM + m, mask=ok, other=-1.0e30)
    lx = tl.load(PL + base * BM + m, mask=ok, other=0.0)
    top = tl.max(mx, 0)
    w = tl.where(ok, tl.exp(mx - top), 0.0)
    acc = tl.load(PACC + (base * BM + m)[:, None] * BD + rd[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.sum(lx * w, 0)
    tl.store(OUT + (r * HQ + kvh * G + g) * D + rd, out.to(OUT.dtype.element_ty), mask=rd < D)


def ring_attention_triton(query, key_ring, value_ring, positions, window: int, scaling: float) -> torch.Tensor:
    """:func:`~fold_hf.kernels.hybrid.naive.ring_attention_reference` in two launches: programs over (KV head,
    split of the ring) keep an online softmax of all ``G * L`` query rows of their KV head (keys read once per
    head), a merge combines the splits. Returns ``[1, L, Hq, D]``."""
    _, HQ, L, D = query.shape
    HKV, R = key_ring.shape[1], key_ring.shape[2]
    if HQ % HKV or key_ring.shape[-1] != D or value_ring.shape != key_ring.shape or key_ring.stride(-1) != 1:
        raise ValueError(f"query {tuple(query.shape)} and rings {tuple(key_ring.shape)} / "
                         f"{tuple(value_ring.shape)} do not match")
    if key_ring.stride() != value_ring.stride():
        raise ValueError("key and value rings must share strides")
    G = HQ // HKV
    query = query.contiguous()
    BD = max(16, _next_pow2(D))
    BM = min(64, max(16, _next_pow2(G * L)))  # query rows per program (more rows: more programs)
    row_blocks = triton.cdiv(G * L, BM)
    BN = 64 if BD <= 128 else (32 if BD <= 256 else 16)
    chunks = triton.cdiv(R, BN)
    per_split = triton.cdiv(chunks, max(1, 128 // HKV))
    splits = triton.cdiv(chunks, per_split)
    part_acc = torch.empty(HKV, splits, row_blocks * BM, BD, device=query.device, dtype=torch.float32)
    part_m = torch.empty(HKV, splits, row_blocks * BM, device=query.device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    _ring_split_kernel[(HKV, splits, row_blocks)](query, key_ring, value_ring, positions, part_acc, part_m, part_l, L, R,
                                      int(window), float(scaling), key_ring.stride(1), key_ring.stride(2), per_split,
                                      G=G, D=D, BD=BD, BM=BM, BN=BN,
                                      IEEE=query.dtype == torch.float32 or not _libdevice(),
                                      num_warps=4)
    out = torch.empty(1, L, HQ, D, device=query.device, dtype=value_ring.dtype)
    _ring_merge_kernel[(HKV, G * L)](part_acc, part_m, part_l, out, L, HQ, splits, row_blocks * BM, G=G, D=D,
                                     BD=BD, BS=_next_pow2(splits), num_warps=4)
    return out


# ---------------------------------------------------------------------------------------------- Gated DeltaNet
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
def _gdn_verify_kernel(QKV, B, A, CONV, CW, ALOG, DTB, S, OUT, PQ, PK, PV, PG, PB, PR, L, qkv_stride, b_stride,
                       a_stride, scale, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                       KS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LP: tl.constexpr, LIB: tl.constexpr):
    h = tl.program_id(0)
    vb = tl.program_id(1)
    GROUP: tl.constexpr = HV // HK
    hk = h // GROUP
    KD: tl.constexpr = HK * DK
    C: tl.constexpr = 2 * HK * DK + HV * DV
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    rl = tl.arange(0, LP)
    mk = rk < DK
    mv = rv < DV
    ml = rl < L
    qc = hk * DK + rk
    kc = KD + hk * DK + rk
    vc = 2 * KD + h * DV + rv
    # prologue, all block tokens at once: conv + silu, L2 norms, gates; written to the commit's buffers. Every
    # program sharing a key head writes the same q/k bits, so each may read back its own writes after the barrier.
    q = _conv_silu_rows(QKV, CONV, CW, qc, mk, rl, ml, qkv_stride, KS, LIB)
    k = _conv_silu_rows(QKV, CONV, CW, kc, mk, rl, ml, qkv_stride, KS, LIB)
    v = _conv_silu_rows(QKV, CONV, CW, vc, mv, rl, ml, qkv_stride, KS, LIB)
    q = q * tl.math.rsqrt(tl.sum(q * q, 1) + 1e-6)[:, None] * scale
    k = k * tl.math.rsqrt(tl.sum(k * k, 1) + 1e-6)[:, None]
    braw = tl.load(B + rl * b_stride + h, mask=ml, other=0.0)
    beta = _round_to(_sigmoid(braw.to(tl.float32), LIB), braw.dtype)
    x = tl.load(A + rl * a_stride + h, mask=ml, other=0.0).to(tl.float32) + tl.load(DTB + h).to(tl.float32)
    if LIB:
        soft = tl.where(x > 20.0, x, libdevice.log1p(libdevice.exp(x)))
    else:
        soft = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    g = -_exp(tl.load(ALOG + h).to(tl.float32), LIB) * soft
    lk = ml[:, None] & mk[None, :]
    lv = ml[:, None] & mv[None, :]
    tl.store(PQ + (rl[:, None] * HK + hk) * DK + rk[None, :], q, mask=lk)
    tl.store(PK + (rl[:, None] * HK + hk) * DK + rk[None, :], k, mask=lk)
    tl.store(PV + (rl[:, None] * HV + h) * DV + rv[None, :], v, mask=lv)
    tl.store(PG + rl * HV + h, g, mask=ml)
    tl.store(PB + rl * HV + h, beta, mask=ml)
    # raw projections, for the commit's convolution window
    tl.store(PR + rl[:, None] * C + vc[None, :], tl.load(QKV + rl[:, None] * qkv_stride + vc[None, :], mask=lv,
                                                         other=0.0), mask=lv)
    if (vb == 0) & (h % GROUP == 0):
        tl.store(PR + rl[:, None] * C + qc[None, :], tl.load(QKV + rl[:, None] * qkv_stride + qc[None, :], mask=lk,
                                                             other=0.0), mask=lk)
        tl.store(PR + rl[:, None] * C + kc[None, :], tl.load(QKV + rl[:, None] * qkv_stride + kc[None, :], mask=lk,
                                                             other=0.0), mask=lk)
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


def _blocks(DK: int, DV: int) -> tuple[int, int, int]:
    """(BK, BV, num_warps) of the Gated DeltaNet kernels; ``$FOLD_HF_GDN_BV`` / ``$FOLD_HF_GDN_WARPS`` override
    (benchmarks/hybrid_bench.py ``--kernel-sweep`` times the choices)."""
    BK = _next_pow2(DK)
    BV = int(os.environ.get("FOLD_HF_GDN_BV") or min(_next_pow2(DV), max(16, 4096 // BK)))
    return BK, BV, int(os.environ.get("FOLD_HF_GDN_WARPS") or 4)


def gated_delta_verify_triton(qkv, b, a, conv_state, conv_weight, a_log, dt_bias, state, num_k_heads: int,
                              k_dim: int, pending: dict, layer: int) -> torch.Tensor:
    """:func:`~fold_hf.kernels.hybrid.naive.gated_delta_verify_reference` (fp32 state; ``qkv [L, C]``,
    ``b``/``a [L, Hv]`` may have strided rows)."""
    if state.dtype != torch.float32:
        raise ValueError(f"the Triton Gated DeltaNet kernels keep an fp32 state, got {state.dtype}")
    L, C = qkv.shape
    HV, DK, DV = state.shape
    HK = num_k_heads
    KS = conv_weight.shape[-1]
    if DK != k_dim or HV % HK or C != 2 * HK * DK + HV * DV or conv_state.shape != (C, KS - 1) or KS < 2:
        raise ValueError(f"shapes do not match: qkv {tuple(qkv.shape)}, state {tuple(state.shape)}, conv "
                         f"{tuple(conv_state.shape)}, {HK} key heads of {k_dim}")
    if L > pending["q"].shape[1]:
        raise ValueError(f"a verify of {L} rows exceeds the pending buffers ({pending['q'].shape[1]} rows)")
    qkv = qkv if qkv.stride(-1) == 1 else qkv.contiguous()
    b = b if b.stride(-1) == 1 else b.contiguous()
    a = a if a.stride(-1) == 1 else a.contiguous()
    out = torch.empty(L, HV, DV, device=state.device, dtype=torch.float32)
    BK, BV, warps = _blocks(DK, DV)
    _gdn_verify_kernel[(HV, triton.cdiv(DV, BV))](
        qkv, b, a, conv_state.contiguous(), conv_weight.reshape(C, KS).contiguous(), a_log, dt_bias, state, out,
        pending["q"][layer], pending["k"][layer], pending["v"][layer], pending["g"][layer], pending["beta"][layer],
        pending["qkv"][layer], L, qkv.stride(0), b.stride(0), a.stride(0), float(k_dim ** -0.5), HK=HK, HV=HV, DK=DK,
        DV=DV, KS=KS, BK=BK, BV=BV, LP=_next_pow2(L), LIB=_libdevice(), num_warps=warps, **_EXACT)
    return out


@triton.jit
def _gdn_commit_kernel(N, PK, PV, PG, PB, S, rows, HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr,
                       DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LIB: tl.constexpr):
    pid = tl.program_id(0)
    vb = tl.program_id(1)
    layer = pid // HV
    h = pid - layer * HV
    hk = h // (HV // HK)
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    mk = rk < DK
    mv = rv < DV
    m2 = mk[:, None] & mv[None, :]
    s_off = (layer * HV + h).to(tl.int64) * DK * DV + rk[:, None] * DV + rv[None, :]
    S_ = tl.load(S + s_off, mask=m2, other=0.0)
    n = tl.load(N)
    base = layer.to(tl.int64) * rows
    kt = tl.load(PK + (base * HK + hk) * DK + rk, mask=mk, other=0.0)
    vt = tl.load(PV + (base * HV + h) * DV + rv, mask=mv, other=0.0)
    gt = tl.load(PG + base * HV + h)
    bt = tl.load(PB + base * HV + h)
    for t in range(0, n + 1):  # the same steps as the verify's, one token after another
        r = base + tl.minimum(t + 1, n)  # (the last token loads itself again, unused)
        kn = tl.load(PK + (r * HK + hk) * DK + rk, mask=mk, other=0.0)
        vn = tl.load(PV + (r * HV + h) * DV + rv, mask=mv, other=0.0)
        gn = tl.load(PG + r * HV + h)
        bn = tl.load(PB + r * HV + h)
        e = _exp(gt, LIB)
        delta = (vt - e * tl.sum(S_ * kt[:, None], axis=0)) * bt
        S_ = S_ * e + kt[:, None] * delta[None, :]
        kt, vt, gt, bt = kn, vn, gn, bn
    tl.store(S + s_off, S_, mask=m2)


def gated_delta_commit_triton(n: torch.Tensor, pending: dict, length: int, states: torch.Tensor,
                              conv_states: torch.Tensor) -> None:
    """:func:`~fold_hf.kernels.hybrid.naive.gated_delta_commit_reference`: one launch re-runs tokens ``0 .. n``
    for every layer's state, one shifts every layer's convolution window."""
    NL, HV, DK, DV = states.shape
    HK = pending["q"].shape[2]
    BK, BV, warps = _blocks(DK, DV)
    _gdn_commit_kernel[(NL * HV, triton.cdiv(DV, BV))](
        n, pending["k"], pending["v"], pending["g"], pending["beta"], states, pending["q"].shape[1],
        HK=HK, HV=HV, DK=DK, DV=DV, BK=BK, BV=BV, LIB=_libdevice(), num_warps=warps, **_EXACT)
    C, K1 = conv_states.shape[1], conv_states.shape[2]
    block = min(1024, _next_pow2(C))
    _conv_commit_kernel[(NL, triton.cdiv(C, block))](n, pending["qkv"], conv_states, C, pending["q"].shape[1],
                                                     K1=K1, BK1=_next_pow2(K1), BLOCK=block, num_warps=4)


@triton.jit
def _conv_commit_kernel(N, RAW, CONV, C, rows, K1: tl.constexpr, BK1: tl.constexpr, BLOCK: tl.constexpr):
    """Window column ``n + 1 + j`` of [conv state | the block's raw projections] into conv state column ``j``, for
    every layer's channels (each program reads all its old columns before writing them)."""
    layer = tl.program_id(0)
    chan = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mc = chan < C
    cols = tl.arange(0, BK1)
    mj = cols < K1
    n = tl.load(N)
    src = (n + 1 + cols).to(tl.int32)  # window column of each new column
    in_state = (src < K1)[None, :]
    m2 = mc[:, None] & mj[None, :]
    base = layer.to(tl.int64) * C * K1
    old = tl.load(CONV + base + chan[:, None] * K1 + tl.minimum(src, K1 - 1)[None, :], mask=m2 & in_state,
                  other=0.0)
    row = tl.maximum(src - K1, 0)[None, :]
    new = tl.load(RAW + (layer.to(tl.int64) * rows + row) * C + chan[:, None], mask=m2 & (src >= K1)[None, :],
                  other=0.0)
    value = tl.where(in_state, old, new)
    tl.debug_barrier()  # a column one thread writes may be another thread's old column: every load first
    tl.store(CONV + base + chan[:, None] * K1 + cols[None, :], value, mask=m2)


__all__ = ["gated_delta_commit_triton", "gated_delta_verify_triton", "gated_rms_norm_triton", "gelu_tanh_mul_triton",
           "head_norm_rope_write_triton", "residual_norm_triton", "ring_attention_triton", "sigmoid_mul_triton"]
