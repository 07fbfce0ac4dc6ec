"""Triton kernels of the Qwen3.5 and Gemma target layers on the fast loop (twins with the same signatures:
:mod:`fold_hf.kernels.hybrid.naive`). Imported only when Triton is usable.

Through the model's modules a Qwen3.5 Gated DeltaNet layer is ~75 small kernels per step and a Gemma layer ~100 (a
Gemma RMSNorm alone is eight, six norms a layer); at one query per step each costs a few microseconds of launch and
latency, more than reading the layer's weights. These kernels leave a layer its projections, its attention and:

* :func:`residual_norm_triton`: residual add (of a normed sublayer output, Gemma's sandwich), ``layer_scalar`` and
  the next norm in one pass (one program per row);
* :func:`head_norm_rope_write_triton`: q/k (and Gemma-4 v) per-head norms, partial rope and the (ring) cache write,
  one program per (token, head);
* :func:`sigmoid_mul_triton`: Qwen3.5's gated attention output;
* the helpers the other fused target-layer kernels share (``_exp``, ``_sigmoid``, ``_silu``, ``_pairwise``, ...).

Gemma-only ops (GELU-tanh MLP, ring attention) are in :mod:`fold_hf.kernels.gemma.triton`; the Gated DeltaNet
verify, commit and output norm of Qwen3.5's linear layers in :mod:`fold_hf.kernels.gated_delta.triton`.

Rounding follows the modules (model dtype after each op that rounds there) through ``_round_to`` and
``enable_fp_fusion=False`` as in :mod:`fold_hf.kernels.layer.triton`; transcendental functions use libdevice on the
GPU (``expf``, ``log1pf``, ``tanhf`` as PyTorch's CUDA kernels) and Triton's own in the interpreter. Every kernel
here, in :mod:`fold_hf.kernels.gemma.triton` and the Gated DeltaNet verify and output norm starts with
:func:`~fold_hf.kernels.triton_pdl.pdl_enter` and launches through ``launch_options``: with programmatic dependent
launch inside an AR step's ``pdl_scope``, as the Llama chain's kernels.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..layer.triton import _round_to
from ..triton_pdl import launch_options, pdl_enter

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
                          BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
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
        num_warps=max(1, min(16, block // 512)), **launch_options(hidden.device), **_EXACT)
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
                           eps, offset, D, ROW_PTR, cache_batch, HALF: tl.constexpr, R: tl.constexpr,
                           BD: tl.constexpr, NORM_QK: tl.constexpr, HAS_W: tl.constexpr, NORM_V: tl.constexpr,
                           WRITE: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    token = tl.program_id(0)  # ROWS: token l of row a at a * L + l (the inputs' and positions' order)
    head = tl.program_id(1)  # [0, HQ) queries, [HQ, HQ + HKV) keys, then values
    pos = tl.load(POS + token)
    slot = pos % ring
    if ROWS:  # several rows of a batch: row a's outputs [a, heads, l], its caches in cache row ROW_PTR[a]
        a = token // L
        out_token = token % L
        row_q = a * HQ
        row_kv = a * HKV
        if WRITE:
            cache_base = tl.load(ROW_PTR + a).to(tl.int64) * cache_batch
            KC += cache_base
            VC += cache_base
    else:
        out_token = token
        row_q = 0
        row_kv = 0
    if head < HQ:
        out, offs, ok = _norm_rope_row(Q + token * q_tok + head * q_head, QW, COS, SIN, pos, cos_stride, eps, offset,
                                       D, HALF, R, NORM_QK, HAS_W, True, BD)
        tl.store(QO + ((row_q + head) * L + out_token) * D + offs, out, mask=ok)
    elif head < HQ + HKV:
        h = head - HQ
        out, offs, ok = _norm_rope_row(K + token * k_tok + h * k_head, KW, COS, SIN, pos, cos_stride, eps, offset,
                                       D, HALF, R, NORM_QK, HAS_W, True, BD)
        tl.store(KO + ((row_kv + h) * L + out_token) * D + offs, out, mask=ok)
        if WRITE:
            tl.store(KC + h * cache_head + slot * cache_row + offs, out, mask=ok)
    else:
        h = head - HQ - HKV
        out, offs, ok = _norm_rope_row(V + token * v_tok + h * v_head, KW, COS, SIN, pos, cos_stride, eps, 0.0,
                                       D, HALF, R, NORM_V, False, False, BD)
        tl.store(VO + ((row_kv + h) * L + out_token) * D + offs, out, mask=ok)
        if WRITE:
            tl.store(VC + h * cache_head + slot * cache_row + offs, out, mask=ok)


def _heads(x: torch.Tensor):
    """``[A, L, heads, D]`` with a contiguous last dim and its ``A * L`` tokens one stride apart -> (tensor, token
    stride, head stride)."""
    if x.stride(-1) != 1 or (x.shape[0] > 1 and x.stride(0) != x.shape[1] * x.stride(1)):
        x = x.contiguous()
    return x, x.stride(1), x.stride(2)


def head_norm_rope_write_triton(query, key, value, q_weight, k_weight, eps, offset, cos_table, sin_table, positions,
                                key_cache, value_cache, *, norm_qk=True, norm_value=False):
    """:func:`~fold_hf.kernels.hybrid.naive.head_norm_rope_write_reference` (queries and keys may be strided
    views of a wider projection; ``key_cache`` None: keys and values returned, no cache written)."""
    if query.shape[0] != 1:
        raise ValueError("head_norm_rope_write_triton takes one row (head_norm_rope_write_rows_triton several)")
    return _head_norm_rope_write(query, key, value, q_weight, k_weight, eps, offset, cos_table, sin_table, positions,
                                 key_cache, value_cache, norm_qk, norm_value, None)


def head_norm_rope_write_rows_triton(query, key, value, q_weight, k_weight, eps, offset, cos_table, sin_table,
                                     positions, key_cache, value_cache, rows, *, norm_qk=True, norm_value=False):
    """:func:`head_norm_rope_write_triton` of ``A`` rows of a batch in one launch: row ``a``'s heads ``[A, L, H, D]``
    normed and rotated at its positions ``positions[a]`` (``[A, L]`` device integers), its keys and values written into
    cache row ``rows[a]`` (``[A]`` device integers) of ``key_cache`` / ``value_cache [batch, Hkv, slots, D]`` (a ring:
    slot ``p mod slots``), or no cache written (``key_cache`` None, or ``key`` None: queries only). Returns ``q [A, Hq,
    L, D]`` and ``k`` / ``v [A, Hkv, L, D]`` (or None), row ``a`` what the one-row kernel gives that row alone."""
    A, L = query.shape[:2]
    if positions.shape != (A, L) or rows.numel() != A:
        raise ValueError(f"{A} rows of {L} tokens need positions [{A}, {L}] and {A} cache rows, got "
                         f"{tuple(positions.shape)} and {rows.numel()}")
    return _head_norm_rope_write(query, key, value, q_weight, k_weight, eps, offset, cos_table, sin_table,
                                 positions.contiguous(), key_cache, value_cache, norm_qk, norm_value,
                                 rows.reshape(-1).to(torch.int32))


def _head_norm_rope_write(query, key, value, q_weight, k_weight, eps, offset, cos_table, sin_table, positions,
                          key_cache, value_cache, norm_qk, norm_value, rows):
    """The launch of :func:`head_norm_rope_write_triton` (``rows`` None) and
    :func:`head_norm_rope_write_rows_triton`."""
    A, L, HQ, D = query.shape
    R = cos_table.shape[-1]
    if R % 2 or R > D or sin_table.shape != cos_table.shape:
        raise ValueError(f"rope tables {tuple(cos_table.shape)} do not rotate head dim {D}")
    if norm_qk and q_weight is not None and (q_weight.shape != (D,) or k_weight is not None
                                             and k_weight.shape != (D,)):
        raise ValueError(f"norm weights must be [{D}]")
    query, q_tok, q_head = _heads(query)
    cos_table, sin_table = cos_table.contiguous(), sin_table.contiguous()
    q_out = query.new_empty(A, HQ, L, D)
    write = key is not None and key_cache is not None
    cache_batch = 0
    if key is None:
        HKV, k_out = 0, None
        key = value = query
        k_tok = k_head = v_tok = v_head = cache_head = cache_row = 0
        ring = 1
        key_cache = value_cache = k_out_arg = v_out_arg = q_out
    else:
        HKV = key.shape[2]
        if key.shape != (A, L, HKV, D) or value.shape != key.shape:
            raise ValueError(f"key {tuple(key.shape)} / value {tuple(value.shape)} do not match query "
                             f"{tuple(query.shape)}")
        if (key_cache is None) != (value_cache is None):
            raise ValueError("give both caches or neither")
        if key_cache is not None and (key_cache.stride() != value_cache.stride() or key_cache.stride(-1) != 1):
            raise ValueError("key and value caches must share strides with a contiguous head dim")
        key, k_tok, k_head = _heads(key)
        value, v_tok, v_head = _heads(value)
        k_out_arg = k_out = key.new_empty(A, HKV, L, D)
        v_out_arg = value.new_empty(A, HKV, L, D)
        if key_cache is None:  # no cache write (WRITE off: the pointers are never stored through)
            key_cache = value_cache = k_out
            cache_head = cache_row = 0
            ring = 1
        else:
            cache_head, cache_row, ring = key_cache.stride(1), key_cache.stride(2), key_cache.shape[2]
            cache_batch = key_cache.stride(0)
    weight = q_weight if q_weight is not None else query
    _head_norm_rope_kernel[(A * L, HQ + 2 * HKV)](
        query, key, value, weight, k_weight if k_weight is not None else weight, cos_table, sin_table, positions,
        key_cache, value_cache, q_out, k_out_arg, v_out_arg, L, HQ, HKV, q_tok, q_head, k_tok, k_head, v_tok, v_head,
        cache_head, cache_row, ring, cos_table.stride(0), float(eps), float(offset), D,
        positions if rows is None else rows, cache_batch, HALF=R // 2, R=R,
        BD=_next_pow2(D), NORM_QK=bool(norm_qk), HAS_W=q_weight is not None, NORM_V=bool(norm_value),
        WRITE=write, ROWS=rows is not None, num_warps=1 if D <= 256 else 2, **launch_options(query.device),
        **_EXACT)
    if k_out is None:
        return q_out, None, None
    return q_out, k_out, v_out_arg


# ---------------------------------------------------------------------------------------------- activations
@triton.jit
def _elementwise_block(n, width, BLOCK: tl.constexpr):
    """This program's ``BLOCK`` flat offsets into ``n`` elements of rows of ``width``: (offs, in range, row, col)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = offs // width
    return offs, offs < n, row, offs - row * width


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _pairwise(kernel, a: torch.Tensor, b: torch.Tensor, names: tuple[str, str]) -> torch.Tensor:
    """Launch an elementwise ``kernel`` of two same-shape tensors ``[..., D]`` (rows may be strided) into a new
    contiguous output of ``a``'s dtype; ``names`` name them in the error when shapes or dtypes differ."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"{names[0]} {tuple(a.shape)} {a.dtype} and {names[1]} {tuple(b.shape)} {b.dtype} differ")
    out = torch.empty(a.shape, device=a.device, dtype=a.dtype)
    ar, br = _rows(a), _rows(b)
    n, block = a.numel(), 1024
    kernel[(triton.cdiv(n, block),)](ar, br, out, n, a.shape[-1], ar.stride(0), br.stride(0),
                                     BLOCK=block, LIB=_libdevice(), num_warps=4, **launch_options(a.device), **_EXACT)
    return out


@triton.jit
def _sigmoid_mul_kernel(X, GATE, OUT, n, width, x_row, gate_row, BLOCK: tl.constexpr, LIB: tl.constexpr,
                        PDL: tl.constexpr):
    pdl_enter(PDL)
    offs, ok, row, col = _elementwise_block(n, width, BLOCK)
    x = tl.load(X + row * x_row + col, mask=ok, other=0.0)
    g = tl.load(GATE + row * gate_row + col, mask=ok, other=0.0).to(tl.float32)
    sig = _round_to(_sigmoid(g, LIB), x.dtype)
    tl.store(OUT + offs, _round_to(x.to(tl.float32) * sig, x.dtype).to(x.dtype), mask=ok)


def sigmoid_mul_triton(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """:func:`~fold_hf.kernels.hybrid.naive.sigmoid_mul_reference` (``[..., D]``; rows may be strided)."""
    return _pairwise(_sigmoid_mul_kernel, x, gate, ("x", "gate"))


__all__ = ["head_norm_rope_write_rows_triton", "head_norm_rope_write_triton", "residual_norm_triton",
           "sigmoid_mul_triton"]
