"""Triton skinny GEMMs of the fast loop's decode steps: a few rows against a weight read once, no split-K.

Why: at batch 1 a decode step's projections read far more weight bytes than they compute with, and cuBLAS covers a
small output width by splitting K and launching a second reduce kernel (on an H200 at the Llama-3.1-8B shape
``o_proj`` and ``down_proj`` run split-K plus ``splitKreduce``, 64 extra launches a step), while ``gate|up`` is
followed by a ``silu(gate) * up`` kernel. Here one program owns ``BLOCK_N`` output columns over the whole of K, so
there is no reduce pass, and the gate|up product can end in the SiLU-and-multiply:

* :func:`skinny_linear_triton` ``x [..., K] @ weight[N, K]^T (+ bias)`` as ``F.linear``;
* :func:`gate_up_silu_triton` ``silu(x @ gate^T) * (x @ up^T)`` over one ``[2 I, K]`` gate|up buffer (the
  layout of :class:`fold_hf.generation.weight_layout.DecodeProjections`), rounding gate and up to the model dtype
  before the SiLU as the unfused modules do, then exactly as
  :func:`fold_hf.kernels.triton_layer.silu_mul_triton`.

One row (an AR step) reduces on the CUDA cores (``[BLOCK_N, BLOCK_K]`` products summed along K); more rows (a
verify block) use ``tl.dot`` over 16-row tiles. Accumulation is fp32 and the result is rounded once, as cuBLAS
does; the order of the sum differs from cuBLAS', so bf16 results may differ from ``F.linear`` in the last bit.
Twins with the same signatures: :mod:`fold_hf.kernels.gemm_reference`. Imported only when Triton is usable.

Shapes: ``x [..., K]`` (rows with a unit inner stride), ``weight [N, K]`` contiguous, ``bias [N]`` or None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .triton_layer import _EXACT, _round_to
from .triton_pdl import launch_options, pdl_enter


@triton.jit
def _row_products(X, W, BIAS, offs_m, offs_n, m_ok, n_ok, K, stride_xm, stride_wn, second_rows,
                  HAS_BIAS: tl.constexpr, SECOND: tl.constexpr, USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``x [BLOCK_M rows] @ W[offs_n]^T`` (+ bias) in fp32 over the whole of K, and with ``SECOND`` the same for the
    weight rows ``offs_n + second_rows`` from the same loads of ``x`` (gate|up's up half; a head's second rope half):
    ``(acc [BLOCK_M, BLOCK_N], second [BLOCK_M, BLOCK_N])`` (zeros without ``SECOND``)."""
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        x = tl.load(X + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = n_ok[:, None] & k_ok[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=w_mask, other=0.0)
        if USE_DOT:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
        else:
            acc += tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], 2)
        if SECOND:
            wu = tl.load(w_rows + second_rows * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
            if USE_DOT:
                acc_up = tl.dot(x, tl.trans(wu), acc_up, input_precision=DOT_PRECISION)
            else:
                acc_up += tl.sum(x.to(tl.float32)[:, None, :] * wu.to(tl.float32)[None, :, :], 2)
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SECOND:
            acc_up += tl.load(BIAS + second_rows + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    return acc, acc_up


@triton.jit
def _skinny_gemm_kernel(X, W, BIAS, Y, M, N, K, stride_xm, stride_wn, stride_ym, up_rows,
                        HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, USE_DOT: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, LIBDEVICE_EXP: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    dtype = Y.dtype.element_ty
    acc, acc_up = _row_products(X, W, BIAS, offs_m, offs_n, m_ok, n_ok, K, stride_xm, stride_wn, up_rows, HAS_BIAS,
                                SILU_MUL, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, DOT_PRECISION)
    if SILU_MUL:
        g = _round_to(acc, dtype)  # the gate and up projections' outputs, as the modules round them
        u = _round_to(acc_up, dtype)
        if LIBDEVICE_EXP:
            e = libdevice.exp(-g)  # expf, as torch's silu
        else:
            e = tl.exp(-g)  # Triton's interpreter has no libdevice
        silu = _round_to(tl.math.div_rn(g, 1.0 + e), dtype)
        acc = _round_to(silu * u, dtype)
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(dtype), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _qkv_rope_kernel(X, W, BIAS, COS, SIN, POS, KEY_CACHE, VALUE_CACHE, Q_OUT, K_OUT, V_OUT, M, K, stride_xm,
                     stride_wn, num_heads, num_kv_heads, cache_head_stride, cache_row_stride,
                     HALF: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_enter(PDL)
    groups = (HALF + BLOCK_N - 1) // BLOCK_N  # programs per head, each owning channels c and c + HALF
    head = tl.program_id(0) // groups  # [0, Hq) queries, [Hq, Hq + Hkv) keys, then values
    offs_c = (tl.program_id(0) % groups) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    c_ok = offs_c < HALF
    m_ok = offs_m < M
    D = 2 * HALF
    x1, x2 = _row_products(X, W, BIAS, offs_m, head * D + offs_c, m_ok, c_ok, K, stride_xm, stride_wn, HALF,
                           HAS_BIAS, True, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, DOT_PRECISION)
    dtype = Q_OUT.dtype.element_ty
    x1 = _round_to(x1, dtype)  # the projection's output, as the module rounds it
    x2 = _round_to(x2, dtype)
    mask = m_ok[:, None] & c_ok[None, :]
    pos = tl.load(POS + offs_m, mask=m_ok, other=0)
    row = offs_m[:, None]
    if head < num_heads + num_kv_heads:
        table = pos.to(tl.int64)[:, None] * D + offs_c[None, :]
        c1 = tl.load(COS + table, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(COS + table + HALF, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + table, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + table + HALF, mask=mask, other=0.0).to(tl.float32)
        # q * cos + rotate_half(q) * sin, each product and the sum rounded like torch (as _rope_write_kernel)
        out1 = _round_to(_round_to(x1 * c1, dtype) + _round_to(-(x2 * s1), dtype), dtype).to(dtype)
        out2 = _round_to(_round_to(x2 * c2, dtype) + _round_to(x1 * s2, dtype), dtype).to(dtype)
        if head < num_heads:
            dst = Q_OUT + (head * M + row) * D + offs_c[None, :]
        else:
            dst = K_OUT + ((head - num_heads) * M + row) * D + offs_c[None, :]
            cache = (KEY_CACHE + (head - num_heads) * cache_head_stride + pos.to(tl.int64)[:, None] * cache_row_stride
                     + offs_c[None, :])
            tl.store(cache, out1, mask=mask)
            tl.store(cache + HALF, out2, mask=mask)
        tl.store(dst, out1, mask=mask)
        tl.store(dst + HALF, out2, mask=mask)
    else:
        kv_head = head - num_heads - num_kv_heads
        dst = V_OUT + (kv_head * M + row) * D + offs_c[None, :]
        cache = (VALUE_CACHE + kv_head * cache_head_stride + pos.to(tl.int64)[:, None] * cache_row_stride
                 + offs_c[None, :])
        for half in tl.static_range(0, 2):
            value = (x1 if half == 0 else x2).to(dtype)
            tl.store(dst + half * HALF, value, mask=mask)
            tl.store(cache + half * HALF, value, mask=mask)


@dataclass(frozen=True)
class GemmPlan:
    """Tiles of one skinny GEMM launch (``use_dot`` False: one row reduced on the CUDA cores)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    use_dot: bool


MAX_ROWS = 16  # rows one launch of this kernel takes (a verify block); more rows go to cuBLAS (a prefill chunk)
PLAN_ENV = "FOLD_HF_SKINNY_GEMM_PLAN"  # benchmarks: "block_n,block_k,warps,stages[,dot]" for every launch


def gemm_plan(rows: int, out_features: int, in_features: int, silu_mul: bool = False,
              element_bytes: int = 2) -> GemmPlan:
    """Tiles for ``rows`` rows (``1 <= rows <= MAX_ROWS``) against a ``[out_features, in_features]`` weight, from
    the sweep on the H200 at the Llama-3.1-8B shapes (``benchmarks/skinny_gemm_bench.py``;
    ``benchmarks/results/2026-12-01-nvidia-h200-skinny-gemm``): one row, 16 columns a program over 512-wide K
    tiles with 2 warps (q|k|v 15.4 us, o 11.9, down 31.3 against cuBLAS' 16.1, 12.5, 31.9); the gate|up product,
    which loads two tiles an iteration, 32 columns through ``tl.dot`` (58.1 us against cuBLAS plus the silu kernel's
    62.7); several rows, ``tl.dot`` over 16 x 512 tiles. fp32 (``element_bytes`` 4) halves the K tile, so the
    buffered tiles fit in shared memory. ``$FOLD_HF_SKINNY_GEMM_PLAN`` overrides them."""
    override = os.environ.get(PLAN_ENV)
    if override:
        parts = [p.strip() for p in override.split(",")]
        block_n, block_k, warps, stages = (int(p) for p in parts[:4])
        use_dot = rows > 1 or (len(parts) > 4 and parts[4] == "dot")
        return GemmPlan(16 if use_dot else 1, block_n, block_k, warps, stages, use_dot)
    shrink = max(1, element_bytes // 2)
    if silu_mul:
        return GemmPlan(16, 32, 256 // shrink, 4, 3, True)
    if rows == 1:
        return GemmPlan(1, 16, 512 // shrink, 2, 3, False)
    return GemmPlan(16, 16, 512 // shrink, 4, 3, True)


def skinny_wins(rows: int, out_features: int, in_features: int, silu_mul: bool = False) -> bool:
    """Whether this kernel beat cuBLAS at the shape in the H200 sweep (:func:`gemm_plan`): always for one row and
    for the gate|up product with its SiLU (which saves a launch); for a verify block's rows only at widths up to
    4096 by 4096 (o: 13.0 against 13.2 us), while q|k|v (6144 wide: 16.3 against 15.8) and down (K = 14336: 36.3
    against 32.6, too few programs along N for the rows' dot) stay on cuBLAS."""
    if rows == 1 or silu_mul:
        return True
    return out_features <= 4096 and in_features <= 4096


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int, up_rows: int,
            silu_mul: bool) -> torch.Tensor:
    if x.dtype != weight.dtype:
        raise ValueError(f"x is {x.dtype}, the weight {weight.dtype}")
    if not weight.is_contiguous():
        raise ValueError("the weight must be contiguous [N, K]")
    K = weight.shape[1]
    if x.shape[-1] != K:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {K}")
    rows = x.reshape(-1, K)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    M = rows.shape[0]
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"the skinny GEMM takes 1 to {MAX_ROWS} rows, got {M}")
    out = torch.empty(*x.shape[:-1], out_features, device=x.device, dtype=x.dtype)
    plan = gemm_plan(M, out_features, K, silu_mul, x.element_size())
    grid = (triton.cdiv(out_features, plan.block_n), triton.cdiv(M, plan.block_m))
    _skinny_gemm_kernel[grid](
        rows, weight, bias if bias is not None else weight, out, M, out_features, K, rows.stride(0),
        weight.stride(0), out_features, up_rows,
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul, USE_DOT=plan.use_dot, BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, STAGES=plan.num_stages,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        LIBDEVICE_EXP=os.environ.get("TRITON_INTERPRET") != "1",
        num_warps=plan.num_warps, num_stages=plan.num_stages, **launch_options(x.device), **_EXACT,
    )
    return out


def skinny_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x [..., K]`` of 1 to :data:`MAX_ROWS` rows: ``[..., N]``."""
    return _launch(x, weight, bias, weight.shape[0], 0, silu_mul=False)


def decode_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A decode step's projection: :func:`skinny_linear_triton` where it beat cuBLAS (:func:`skinny_wins`), else
    ``F.linear`` (cuBLAS), by the shape alone (so the same shape always takes the same kernel)."""
    rows = x.numel() // max(x.shape[-1], 1)
    if 1 <= rows <= MAX_ROWS and skinny_wins(rows, weight.shape[0], weight.shape[1]):
        return skinny_linear_triton(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def gate_up_silu_triton(x: torch.Tensor, gate_up_weight: torch.Tensor,
                        gate_up_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate, up = F.linear(x, gate_up_weight, gate_up_bias).chunk(2, -1)``:
    ``x [..., K]``, ``gate_up_weight [2 I, K]`` -> ``[..., I]``."""
    if gate_up_weight.shape[0] % 2:
        raise ValueError(f"a gate|up weight has an even number of rows, got {gate_up_weight.shape[0]}")
    width = gate_up_weight.shape[0] // 2
    return _launch(x, gate_up_weight, gate_up_bias, width, width, silu_mul=True)


def qkv_rope_write_triton(x: torch.Tensor, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None, num_heads: int,
                          num_kv_heads: int, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                          key_cache: torch.Tensor, value_cache: torch.Tensor):
    """The q|k|v projection of ``x [1, L, K]`` (``qkv_weight [(Hq + 2 Hkv) D, K]``, L from 1 to :data:`MAX_ROWS`)
    with the rope and the cache write of :func:`fold_hf.kernels.triton_layer.rope_write_triton` in its epilogue:
    one program owns channels ``c`` and ``c + D/2`` of one head, so it rotates what it computed. Returns
    ``(q [1, Hq, L, D], k [1, Hkv, L, D], v [1, Hkv, L, D])`` and writes k and v into the caches at ``positions``;
    the results of ``rope_write_triton(*split(skinny_linear_triton(x, ...)))``. Full rotary, no per-head norm."""
    if x.dtype != qkv_weight.dtype or not qkv_weight.is_contiguous():
        raise ValueError("the q|k|v weight must be contiguous in x's dtype")
    D = cos_table.shape[-1]
    K = qkv_weight.shape[1]
    if D % 2 or sin_table.shape != cos_table.shape or qkv_weight.shape[0] != (num_heads + 2 * num_kv_heads) * D:
        raise ValueError(f"a [{(num_heads + 2 * num_kv_heads) * D}, K] q|k|v weight and [capacity, {D}] rope tables "
                         f"are needed, got {tuple(qkv_weight.shape)} and {tuple(cos_table.shape)}")
    if key_cache.stride() != value_cache.stride() or key_cache.stride(-1) != 1 or key_cache.shape[-1] != D:
        raise ValueError("key and value caches must share strides with a contiguous head dim of the rope's width")
    rows = x.reshape(-1, K)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    M = rows.shape[0]
    if x.shape[-1] != K or not 1 <= M <= MAX_ROWS or positions.shape != (M,):
        raise ValueError(f"x [1, L, {K}] with L from 1 to {MAX_ROWS} and positions [L], got {tuple(x.shape)} and "
                         f"{tuple(positions.shape)}")
    plan = gemm_plan(M, qkv_weight.shape[0], K, False, x.element_size())
    half = D // 2
    q_out = x.new_empty(1, num_heads, M, D)
    k_out = x.new_empty(1, num_kv_heads, M, D)
    v_out = x.new_empty(1, num_kv_heads, M, D)
    grid = ((num_heads + 2 * num_kv_heads) * triton.cdiv(half, plan.block_n), triton.cdiv(M, plan.block_m))
    _qkv_rope_kernel[grid](
        rows, qkv_weight, qkv_bias if qkv_bias is not None else qkv_weight, cos_table.contiguous(),
        sin_table.contiguous(), positions, key_cache, value_cache, q_out, k_out, v_out, M, K, rows.stride(0),
        qkv_weight.stride(0), num_heads, num_kv_heads, key_cache.stride(1), key_cache.stride(2),
        HALF=half, HAS_BIAS=qkv_bias is not None, USE_DOT=plan.use_dot, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        BLOCK_K=plan.block_k, STAGES=plan.num_stages, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=plan.num_warps, num_stages=plan.num_stages, **launch_options(x.device), **_EXACT,
    )
    return q_out, k_out, v_out


__all__ = ["MAX_ROWS", "PLAN_ENV", "GemmPlan", "decode_linear_triton", "gate_up_silu_triton", "gemm_plan",
           "qkv_rope_write_triton", "skinny_linear_triton", "skinny_wins"]
