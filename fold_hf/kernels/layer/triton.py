"""Triton kernels fusing the elementwise work of a Llama-family layer in the fast loop's decode steps.

A decode step at 8B shape runs ~45 small kernels per layer through the transformers modules (RMSNorm alone is
seven: cast, pow, mean, add, rsqrt, mul, mul); at one query each is a launch of a few microseconds, and together
they cost about as much as reading the weights (docs/fast-path.md). These kernels cut a layer to the projections, the attention and three
fused launches:

* :func:`add_rms_norm_triton` residual add and RMSNorm in one pass (one program per row);
* :func:`rope_write_triton` rotary embedding of queries and keys at their positions, written straight into the
  KV cache with the values (one program per (token, head));
* :func:`silu_mul_triton` ``silu(gate) * up``.

Each rounds to the model dtype where transformers rounds (products and sums of the rope, the norm's cast before
its weight), and uses libdevice's ``expf`` and correctly rounded division as PyTorch's CUDA silu does,
so results differ from the modules only through the order of the norm's sum. Twins with the same signatures:
:mod:`fold_hf.kernels.layer.naive`. Imported only when Triton is usable.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..triton_pdl import launch_options, pdl_enter


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


# Triton folds a written fp32 -> bf16 -> fp32 round trip away (measured on an H200: the rope came out rounded once
# instead of three times) and contracts a * b + c into an FMA, so the rounding torch does between its ops is
# spelled out in integer arithmetic here and the kernels are built with enable_fp_fusion=False.
_EXACT = dict(enable_fp_fusion=False)
NORM_WARPS_ENV = "FOLD_HF_NORM_WARPS"  # benchmarks: warps of every add + RMSNorm launch


@triton.jit
def _round_to(x, DTYPE: tl.constexpr):
    """fp32 ``x`` rounded to ``DTYPE`` (nearest, ties to even) and held in fp32, as a torch op's result is (a
    later ``.to(DTYPE)`` is then exact, whatever rounding the conversion uses)."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif DTYPE == tl.float32:
        return x
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def _add_rms_norm_kernel(HIDDEN, DELTA, WEIGHT, SUM_OUT, NORM_OUT, hidden_size, inv_hidden_size, eps,
                         rows_per_token, token_stride, row_stride, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < hidden_size
    base = row * hidden_size  # outputs are contiguous
    # inputs may be heads sliced out of a wider projection: row r is head (r % rows_per_token) of token
    # (r // rows_per_token)
    token = row // rows_per_token
    in_base = token.to(tl.int64) * token_stride + (row - token * rows_per_token) * row_stride
    x = tl.load(HIDDEN + in_base + offs, mask=ok, other=0.0)
    dtype = x.dtype
    xf = x.to(tl.float32)
    if HAS_DELTA:
        xf = _round_to(xf + tl.load(DELTA + base + offs, mask=ok, other=0.0).to(tl.float32), dtype)
        tl.store(SUM_OUT + base + offs, xf.to(dtype), mask=ok)
    variance = tl.sum(xf * xf, 0) * inv_hidden_size
    normed = _round_to(xf * tl.math.rsqrt(variance + eps), dtype)
    w = tl.load(WEIGHT + offs, mask=ok, other=0.0)
    tl.store(NORM_OUT + base + offs, _round_to(w.to(tl.float32) * normed, dtype).to(dtype), mask=ok)


def _token_head_strides(x: torch.Tensor) -> tuple[torch.Tensor, int, int, int] | None:
    """``(x viewed as [tokens, heads, D], heads, token stride, head stride)`` when ``x [..., heads, D]`` has a
    contiguous last dim and viewable leading dims (heads sliced out of a wider projection), else None."""
    if x.dim() < 2 or x.stride(-1) != 1:
        return None
    try:
        view = x.view(-1, x.shape[-2], x.shape[-1])
    except RuntimeError:
        return None
    return view, view.shape[1], view.stride(0), view.stride(1)


def add_rms_norm_triton(hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                        eps: float, num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then RMSNorm; shapes and semantics of
    :func:`~fold_hf.kernels.layer.naive.add_rms_norm_reference` (``hidden [..., H]``, ``weight [H]``).

    Without ``delta``, ``hidden`` may be strided in its leading dims (e.g. ``[1, L, heads, D]`` heads sliced out of
    a fused q|k|v projection, read in place); the outputs are contiguous. ``num_warps``: a tuning override (default
    ``$FOLD_HF_NORM_WARPS``, else one warp per 256 columns, at most 16: for the 8B's rows of 4096, 16 warps took
    the 65 norms of a 32K AR step from 185.6 to 141.5 us inside the step's graph, the step 5.376 -> 5.332 ms,
    where alone in a graph of norms they measured 1.86 against 1.73 us; benchmarks/results/2026-12-02-nvidia-h200-merge)."""
    H = hidden.shape[-1]
    if weight.shape != (H,) or weight.dtype != hidden.dtype:
        raise ValueError(f"weight must be [{H}] in {hidden.dtype}, got {tuple(weight.shape)} {weight.dtype}")
    strided = None if delta is not None or hidden.is_contiguous() else _token_head_strides(hidden)
    if strided is None:
        hidden = hidden.contiguous()
        source, rows_per_token, token_stride, row_stride = hidden, 1, H, 0
    else:
        source, rows_per_token, token_stride, row_stride = strided
    rows = hidden.numel() // H
    total = hidden
    if delta is not None:
        if delta.shape != hidden.shape or delta.dtype != hidden.dtype:
            raise ValueError(f"delta {tuple(delta.shape)} {delta.dtype} does not match hidden "
                             f"{tuple(hidden.shape)} {hidden.dtype}")
        delta = delta.contiguous()
        total = torch.empty_like(hidden)
    normed = torch.empty(hidden.shape, device=hidden.device, dtype=hidden.dtype)
    block = _next_pow2(H)
    _add_rms_norm_kernel[(rows,)](source, delta if delta is not None else source, weight, total, normed, H,
                                  1.0 / H, float(eps), rows_per_token, token_stride, row_stride,
                                  HAS_DELTA=delta is not None, BLOCK=block,
                                  num_warps=num_warps or int(os.environ.get(NORM_WARPS_ENV) or 0)
                                  or max(1, min(16, block // 256)),
                                  **launch_options(hidden.device), **_EXACT)
    return total, normed


@triton.jit
def _rope_write_kernel(Q, K, V, COS, SIN, POS, KEY_CACHE, VALUE_CACHE, Q_OUT, K_OUT, V_OUT,
                       num_tokens, num_heads, num_kv_heads, cache_head_stride, cache_row_stride,
                       q_token_stride, k_token_stride, v_token_stride, ROW_PTR, cache_batch_stride,
                       HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr):
    pdl_enter(PDL)
    token = tl.program_id(0)  # ROWS: token l of row a at a * num_tokens + l (the inputs' and positions' order)
    head = tl.program_id(1)  # [0, Hq) queries, [Hq, Hq + Hkv) keys, then values
    offs = tl.arange(0, BLOCK_HALF)
    ok = offs < HALF
    D = 2 * HALF
    pos = tl.load(POS + token)
    if ROWS:  # several rows of a batch: row a's outputs [a, heads, l], its cache row ROW_PTR[a]
        a = token // num_tokens
        out_token = token % num_tokens
        row_q = a * num_heads
        row_kv = a * num_kv_heads
        cache_base = tl.load(ROW_PTR + a).to(tl.int64) * cache_batch_stride
        KEY_CACHE += cache_base
        VALUE_CACHE += cache_base
    else:
        out_token = token
        row_q = 0
        row_kv = 0
    if head < num_heads + num_kv_heads:
        if head < num_heads:
            src = Q + token * q_token_stride + head * D
            dst = Q_OUT + ((row_q + head) * num_tokens + out_token) * D
        else:
            src = K + token * k_token_stride + (head - num_heads) * D
            dst = K_OUT + ((row_kv + head - num_heads) * num_tokens + out_token) * D
        x1 = tl.load(src + offs, mask=ok, other=0.0)
        x2 = tl.load(src + HALF + offs, mask=ok, other=0.0)
        dtype = x1.dtype
        c1 = tl.load(COS + pos * D + offs, mask=ok, other=0.0).to(tl.float32)
        c2 = tl.load(COS + pos * D + HALF + offs, mask=ok, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + pos * D + offs, mask=ok, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + pos * D + HALF + offs, mask=ok, other=0.0).to(tl.float32)
        x1f = x1.to(tl.float32)
        x2f = x2.to(tl.float32)
        # q * cos + rotate_half(q) * sin, rotate_half(q) = (-q2, q1); each product and the sum rounded like torch
        out1 = _round_to(_round_to(x1f * c1, dtype) + _round_to(-(x2f * s1), dtype), dtype).to(dtype)
        out2 = _round_to(_round_to(x2f * c2, dtype) + _round_to(x1f * s2, dtype), dtype).to(dtype)
        tl.store(dst + offs, out1, mask=ok)
        tl.store(dst + HALF + offs, out2, mask=ok)
        if head >= num_heads:
            cache = KEY_CACHE + (head - num_heads) * cache_head_stride + pos * cache_row_stride
            tl.store(cache + offs, out1, mask=ok)
            tl.store(cache + HALF + offs, out2, mask=ok)
    else:
        kv_head = head - num_heads - num_kv_heads
        src = V + token * v_token_stride + kv_head * D
        dst = V_OUT + ((row_kv + kv_head) * num_tokens + out_token) * D
        cache = VALUE_CACHE + kv_head * cache_head_stride + pos * cache_row_stride
        for start in tl.static_range(0, 2):
            v = tl.load(src + start * HALF + offs, mask=ok, other=0.0)
            tl.store(dst + start * HALF + offs, v, mask=ok)
            tl.store(cache + start * HALF + offs, v, mask=ok)


def rope_write_triton(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos_table: torch.Tensor,
                      sin_table: torch.Tensor, positions: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rotary embedding of the block's queries and keys, keys and values written into the cache; shapes and
    semantics of :func:`~fold_hf.kernels.layer.naive.rope_write_reference`. The cache buffers must have a
    contiguous head dim and equal strides (``[1, Hkv, capacity, D]`` as :class:`StaticTarget` allocates). The
    inputs may have a token stride of their own (heads of a fused q|k|v projection, read in place)."""
    if query.shape[0] != 1:
        raise ValueError("rope_write_triton takes one row (rope_write_rows_triton several)")
    return _rope_write(query, key, value, cos_table, sin_table, positions, key_cache, value_cache, None)


def rope_write_rows_triton(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos_table: torch.Tensor,
                           sin_table: torch.Tensor, positions: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                    torch.Tensor]:
    """:func:`rope_write_triton` of ``A`` rows of a batch in one launch: row ``a``'s queries, keys and values
    ``[A, L, H, D]`` rotated at its positions ``positions[a]`` (``[A, L]`` device integers), its keys and values written
    into cache row ``rows[a]`` (``[A]`` device integers) of ``key_cache`` / ``value_cache [batch, Hkv, capacity,
    D]``. Returns ``q [A, Hq, L, D]``, ``k`` and ``v [A, Hkv, L, D]``, row ``a`` what :func:`rope_write_triton` gives
    that row alone (the same arithmetic, token by token)."""
    A, L = query.shape[:2]
    if positions.shape != (A, L) or rows.numel() != A:
        raise ValueError(f"{A} rows of {L} tokens need positions [{A}, {L}] and {A} cache rows, got "
                         f"{tuple(positions.shape)} and {rows.numel()}")
    return _rope_write(query, key, value, cos_table, sin_table, positions.contiguous(), key_cache, value_cache,
                       rows.reshape(-1).to(torch.int32))


def _rope_write(query, key, value, cos_table, sin_table, positions, key_cache, value_cache, rows):
    """The launch of :func:`rope_write_triton` (``rows`` None) and :func:`rope_write_rows_triton`."""
    A, L, Hq, D = query.shape
    Hkv = key.shape[2]
    if key.shape != (A, L, Hkv, D) or value.shape != key.shape:
        raise ValueError(f"key {tuple(key.shape)} / value {tuple(value.shape)} do not match query "
                         f"{tuple(query.shape)}")
    if D % 2 or cos_table.shape[-1] != D or sin_table.shape != cos_table.shape:
        raise ValueError(f"rope tables {tuple(cos_table.shape)} do not rotate head dim {D} (full rotary only)")
    if key_cache.stride() != value_cache.stride() or key_cache.stride(-1) != 1:
        raise ValueError("key and value caches must share strides with a contiguous head dim")
    query, key, value = (_tokens_in_place(x) for x in (query, key, value))
    cos_table, sin_table = cos_table.contiguous(), sin_table.contiguous()
    q_out = query.new_empty(A, Hq, L, D)
    k_out = key.new_empty(A, Hkv, L, D)
    v_out = value.new_empty(A, Hkv, L, D)
    half = D // 2
    _rope_write_kernel[(A * L, Hq + 2 * Hkv)](
        query, key, value, cos_table, sin_table, positions, key_cache, value_cache, q_out, k_out, v_out,
        L, Hq, Hkv, key_cache.stride(1), key_cache.stride(2), query.stride(1), key.stride(1), value.stride(1),
        positions if rows is None else rows, key_cache.stride(0), HALF=half, BLOCK_HALF=_next_pow2(half),
        ROWS=rows is not None, num_warps=1, **launch_options(query.device), **_EXACT)
    return q_out, k_out, v_out


def _tokens_in_place(x: torch.Tensor) -> torch.Tensor:
    """``x [A, L, H, D]`` itself when its heads are contiguous within a token and its ``A * L`` tokens one stride
    apart (heads sliced out of a q|k|v projection of the rows' tokens, read in place), else a contiguous copy."""
    one_row = x.shape[0] == 1
    if x.stride(-1) == 1 and x.stride(-2) == x.shape[-1] and (one_row or x.stride(0) == x.shape[1] * x.stride(1)):
        return x
    return x.contiguous()


@triton.jit
def _silu_mul_kernel(GATE, UP, OUT, n, width, gate_row_stride, up_row_stride, BLOCK: tl.constexpr,
                     LIBDEVICE_EXP: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    row = offs // width  # gate and up may be the two halves of one gate|up projection
    col = offs - row * width
    g = tl.load(GATE + row * gate_row_stride + col, mask=ok, other=0.0)
    u = tl.load(UP + row * up_row_stride + col, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    if LIBDEVICE_EXP:
        e = libdevice.exp(-gf)  # expf, as torch's silu; tl.exp is exp2-based and a few ulp off
    else:
        e = tl.exp(-gf)  # Triton's interpreter has no libdevice
    silu = _round_to(tl.math.div_rn(gf, 1.0 + e), g.dtype)
    tl.store(OUT + offs, _round_to(silu * u.to(tl.float32), g.dtype).to(g.dtype), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., I]`` as ``[rows, I]`` with a contiguous last dim, a view where one exists."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def silu_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (``[..., I]``, one dtype); the semantics of
    :func:`~fold_hf.kernels.layer.naive.silu_mul_reference`. The inputs may have strided rows (the two halves
    of a fused gate|up projection are read in place); the output is contiguous."""
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} differ")
    out = torch.empty(gate.shape, device=gate.device, dtype=gate.dtype)
    gate_rows, up_rows = _rows(gate), _rows(up)
    n, width = gate.numel(), gate.shape[-1]
    block = 1024
    _silu_mul_kernel[(triton.cdiv(n, block),)](gate_rows, up_rows, out, n, width, gate_rows.stride(0),
                                               up_rows.stride(0), BLOCK=block,
                                               LIBDEVICE_EXP=os.environ.get("TRITON_INTERPRET") != "1", num_warps=4,
                                               **launch_options(gate.device), **_EXACT)
    return out


@triton.jit
def _rotate_heads_kernel(X, COS, SIN, OUT, num_tokens, num_heads, head_dim, scale, HALF: tl.constexpr,
                         BLOCK_HALF: tl.constexpr, REST: tl.constexpr, BLOCK_REST: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_enter(PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    src = X + (token * num_heads + head) * head_dim
    dst = OUT + (head * num_tokens + token) * head_dim
    table = token * 2 * HALF
    offs = tl.arange(0, BLOCK_HALF)
    ok = offs < HALF
    x1 = tl.load(src + offs, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + offs, mask=ok, other=0.0).to(tl.float32)
    c1 = tl.load(COS + table + offs, mask=ok, other=0.0)
    c2 = tl.load(COS + table + HALF + offs, mask=ok, other=0.0)
    s1 = tl.load(SIN + table + offs, mask=ok, other=0.0)
    s2 = tl.load(SIN + table + HALF + offs, mask=ok, other=0.0)
    out_dtype = OUT.dtype.element_ty
    o1 = (x1 * c1 + (-x2) * s1) * scale
    o2 = (x2 * c2 + x1 * s2) * scale
    tl.store(dst + offs, _round_to(o1, out_dtype).to(out_dtype), mask=ok)
    tl.store(dst + HALF + offs, _round_to(o2, out_dtype).to(out_dtype), mask=ok)
    if REST > 0:
        offs_rest = 2 * HALF + tl.arange(0, BLOCK_REST)
        ok_rest = offs_rest < head_dim
        rest = tl.load(src + offs_rest, mask=ok_rest, other=0.0).to(tl.float32) * scale
        tl.store(dst + offs_rest, _round_to(rest, out_dtype).to(out_dtype), mask=ok_rest)


def rotate_heads_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float,
                        out_dtype: torch.dtype) -> torch.Tensor:
    """Rotate ``[1, L, H, D]`` heads by fp32 tables ``[L, R]``, scale, cast to ``out_dtype``, as ``[1, H, L, D]``;
    the semantics of :func:`~fold_hf.kernels.layer.naive.rotate_heads_reference` (partial rotary: channels
    past ``R`` are only scaled)."""
    _, L, H, D = x.shape
    R = cos.shape[-1]
    if cos.shape != (L, R) or sin.shape != cos.shape or R % 2 or R > D:
        raise ValueError(f"tables {tuple(cos.shape)} / {tuple(sin.shape)} do not rotate {L} tokens of head dim {D}")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"the kernel rotates with fp32 tables, got {cos.dtype}")
    x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
    out = torch.empty(1, H, L, D, device=x.device, dtype=out_dtype)
    rest = D - R
    _rotate_heads_kernel[(L, H)](x, cos, sin, out, L, H, D, float(scale), HALF=R // 2,
                                 BLOCK_HALF=_next_pow2(R // 2), REST=rest, BLOCK_REST=_next_pow2(max(rest, 1)),
                                 num_warps=1, **launch_options(x.device), **_EXACT)
    return out


__all__ = ["add_rms_norm_triton", "rope_write_rows_triton", "rope_write_triton", "rotate_heads_triton",
           "silu_mul_triton"]
