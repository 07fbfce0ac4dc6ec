"""Triton skinny GEMMs of the fast loop's decode steps: a few rows against a weight read once.

Why: at batch 1 a decode step's projections read far more weight bytes than they compute with, and cuBLAS covers a
small output width by splitting K and launching a second reduce kernel (on an H200 at the Llama-3.1-8B shape
``o_proj`` and ``down_proj`` run split-K plus ``splitKreduce``, 64 extra launches a step), while ``gate|up`` is
followed by a ``silu(gate) * up`` kernel. Here one program owns ``BLOCK_N`` output columns over the whole of K, so
there is no reduce pass, and the gate|up product can end in the SiLU-and-multiply:

* :func:`skinny_linear_triton` ``x [..., K] @ weight[N, K]^T (+ bias)`` as ``F.linear``;
* :func:`gate_up_silu_triton` ``silu(x @ gate^T) * (x @ up^T)`` (:func:`gate_up_gelu_tanh_triton`: Gemma's
  GELU-tanh in place of the SiLU) over one ``[2 I, K]`` gate|up buffer (the
  layout of :class:`fold_hf.targets.weight_layout.DecodeProjections`), rounding gate and up to the model dtype
  before the SiLU as the unfused modules do, then exactly as
  :func:`fold_hf.kernels.layer.triton.silu_mul_triton`.

Opt-in (``$FOLD_HF_SKINNY_SPLIT_K=1``, issue 39): a verify block's plain projections split along K
(:func:`split_k_plan`: 64-column tiles, two programs per SM) into fp32 partials that a second launch sums in split
order, so narrow-N, wide-K products (o, down) and the wide ones cuBLAS takes today launch enough programs.
Measured on an H100 (benchmarks/results/2026-12-07-nvidia-h100-splitk-prefill-profile): slower than cuBLAS at every
verify shape of Qwen3.5-9B and Llama-3.1-8B, and than this kernel's own plan where that runs (o at 16 rows 17.2 us
against 14.5; the best forced split, 2, 15.8), and the Qwen3.5-9B FOLD round 0.22 ms slower with it: it stays off.

One row (an AR step) reduces on the CUDA cores (``[BLOCK_N, BLOCK_K]`` products summed along K); more rows (a
verify block) use ``tl.dot`` over 16-row tiles. Accumulation is fp32 and the result is rounded once, as cuBLAS
does; the order of the sum differs from cuBLAS', so bf16 results may differ from ``F.linear`` in the last bit.
The exact variants (:func:`exact_linear_triton`, :func:`exact_gate_up_silu_triton`) run one fixed plan
(:func:`exact_plan`) for any number of rows, so a row's result does not depend on the row count (issue 37).
Twins with the same signatures: :mod:`fold_hf.kernels.gemm.naive`. Imported only when Triton is usable.

Shapes: ``x [..., K]`` (rows with a unit inner stride), ``weight [N, K]`` contiguous, ``bias [N]`` or None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..fold_read.launch import multiprocessor_count
from ..gemma.triton import gelu_tanh_f32
from ..layer.triton import _EXACT, _round_to
from ..triton_pdl import launch_options, pdl_enter


@triton.jit
def _skinny_gemm_kernel(X, W, BIAS, Y, M, N, K, stride_xm, stride_wn, stride_ym, up_rows,
                        HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr, GELU: tl.constexpr, USE_DOT: tl.constexpr,
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
        if SILU_MUL:
            wu = tl.load(w_rows + up_rows * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
            if USE_DOT:
                acc_up = tl.dot(x, tl.trans(wu), acc_up, input_precision=DOT_PRECISION)
            else:
                acc_up += tl.sum(x.to(tl.float32)[:, None, :] * wu.to(tl.float32)[None, :, :], 2)
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if SILU_MUL:
            acc_up += tl.load(BIAS + up_rows + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if SILU_MUL:
        g = _round_to(acc, dtype)  # the gate and up projections' outputs, as the modules round them
        u = _round_to(acc_up, dtype)
        if GELU:  # Gemma's gelu(gate, "tanh") * up, as fold_hf.kernels.gemma.triton's kernel
            act = _round_to(gelu_tanh_f32(g, LIBDEVICE_EXP), dtype)
        else:
            if LIBDEVICE_EXP:
                e = libdevice.exp(-g)  # expf, as torch's silu
            else:
                e = tl.exp(-g)  # Triton's interpreter has no libdevice
            act = _round_to(tl.math.div_rn(g, 1.0 + e), dtype)
        acc = _round_to(act * u, dtype)
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(dtype), mask=m_ok[:, None] & n_ok[None, :])


# the exact GEMMs' kernel: the same source compiled without specializing on the row count (Triton otherwise
# compiles M == 1 and M % 16 == 0 as variants of their own), so every row count runs one binary
_exact_gemm_kernel = triton.jit(do_not_specialize=["M"])(_skinny_gemm_kernel.fn)


@triton.jit
def _split_k_partial_kernel(X, W, P, M, N, K, k_per_split, stride_xm, stride_wn,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    """Split-K pass: program ``(n, s)`` sums ``x[:, k] * w[n-tile, k]`` over its K range ``[s k_per_split,
    (s + 1) k_per_split)`` through ``tl.dot`` into ``P[s, :M, n-tile]`` (fp32)."""
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    m_ok = offs_m < M
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_end
        x = tl.load(X + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    out = P + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _split_k_reduce_kernel(P, BIAS, Y, M, N, SPLITS, stride_ym, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """Reduce pass: ``Y[:M, n-tile] = sum_s P[s, :M, n-tile] (+ bias)``, the splits added in order (deterministic),
    rounded once to Y's dtype."""
    pdl_enter(PDL)
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    ok = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    tile = offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(P + s * M * N + tile, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=ok)


@dataclass(frozen=True)
class GemmPlan:
    """Tiles of one skinny GEMM launch (``use_dot`` False: one row reduced on the CUDA cores)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    use_dot: bool
    split_k: int = 1  # > 1: K cut into this many ranges (one program per column tile and range), then a reduce pass


MAX_ROWS = 16  # rows one launch of this kernel takes (a verify block); more rows go to cuBLAS (a prefill chunk)
PLAN_ENV = "FOLD_HF_SKINNY_GEMM_PLAN"  # benchmarks: "block_n,block_k,warps,stages[,dot]" for every launch
# benchmarks: the exact plan's "block_n,block_k,warps,stages" (gate|up: its own variable); tiles and warps fixed for
# every row count as the default's, so any value keeps exact mode's invariance (it changes which bits both give)
EXACT_PLAN_ENV, EXACT_GATE_UP_PLAN_ENV = "FOLD_HF_EXACT_GEMM_PLAN", "FOLD_HF_EXACT_GATE_UP_PLAN"
# issue 39: a verify block's plain projections (2 to 16 rows, no gate|up) split along K, so that wide-K and narrow-N
# products (o, down, q|k|v) launch enough programs. "0" (default; slower on an H100 at every verify shape, 2026-12-07):
# off, today's routing; "1": every such product runs :func:`split_k_plan` on this kernel, cuBLAS none of them (A/B)
SPLIT_K_ENV = "FOLD_HF_SKINNY_SPLIT_K"
SPLIT_K_PROGRAMS_PER_SM = 2  # the split count aims at this many programs per SM (each split >= 2 K tiles)


def split_k_enabled() -> bool:
    """``$FOLD_HF_SKINNY_SPLIT_K``: ``"1"`` on, ``"0"`` or unset off; a ValueError names anything else."""
    value = os.environ.get(SPLIT_K_ENV) or "0"
    if value not in ("0", "1"):
        raise ValueError(f"${SPLIT_K_ENV} must be 0 or 1, got {value!r}")
    return value == "1"


def split_ranges(in_features: int, splits: int, block_k: int) -> tuple[int, int]:
    """``(K range a split reads, splits launched)`` for ``splits`` asked: the range ``cdiv(K, splits)`` rounded up to
    whole K tiles, and as many splits as that takes to cover K (fewer than asked where the rounding would leave the
    last ones empty)."""
    per_split = -(-(-(-in_features // splits)) // block_k) * block_k
    return per_split, -(-in_features // per_split)


def split_count(out_features: int, in_features: int, block_n: int, block_k: int, sms: int) -> int:
    """Splits along K for ``cdiv(N, block_n)`` column tiles: enough for :data:`SPLIT_K_PROGRAMS_PER_SM` programs per
    SM, each split at least two K tiles, and no split left empty (:func:`split_ranges`)."""
    tiles = -(-out_features // block_n)
    wanted = max(1, -(-SPLIT_K_PROGRAMS_PER_SM * sms // tiles))
    wanted = min(wanted, max(1, in_features // (2 * block_k)))
    return split_ranges(in_features, wanted, block_k)[1]


def split_k_plan(rows: int, out_features: int, in_features: int, element_bytes: int = 2, sms: int = 132) -> GemmPlan:
    """The split-K plan of a verify block's plain projection (``$FOLD_HF_SKINNY_SPLIT_K=1``): ``tl.dot`` over
    16-row tiles of 64 columns and 256-wide K tiles (halved in fp32), 4 warps, 3 stages, :func:`split_count` splits
    for ``sms`` SMs."""
    block_n, block_k = 64, 256 // max(1, element_bytes // 2)
    return GemmPlan(16, block_n, block_k, 4, 3, True, split_count(out_features, in_features, block_n, block_k, sms))


def exact_plan(element_bytes: int = 2, silu_mul: bool = False) -> GemmPlan:
    """The one plan of the exact GEMMs (:func:`exact_linear_triton`, :func:`exact_gate_up_silu_triton`): ``tl.dot``
    over 16-row tiles of 16 columns and 512-wide K tiles with 2 warps (the gate|up product: 32 columns, 256-wide K
    tiles, 4 warps, the plan :func:`gemm_plan` gives it for every row count), K tiles halved in fp32, whatever the
    number of rows: every row is reduced by the same instructions in the same order (issue 37,
    ``docs/exact-mode.md``). 2 warps, not 4: on the H200 at the Llama-3.1-8B shape, 32K, exact mode's AR step is
    1.038x the default's with them against 1.105x with 4, and its SD round 1.018x against 1.055x
    (``benchmarks/results/2026-12-05-nvidia-h200-rows-prefill/exact-plans``).
    ``$FOLD_HF_SKINNY_GEMM_PLAN`` does not apply; ``$FOLD_HF_EXACT_GEMM_PLAN`` / ``$FOLD_HF_EXACT_GATE_UP_PLAN``
    (``"block_n,block_k,warps,stages"``, benchmarks: ``benchmarks/gpu/exact_plans.sh``) replace the tiles, still one
    plan for every row count."""
    override = os.environ.get(EXACT_GATE_UP_PLAN_ENV if silu_mul else EXACT_PLAN_ENV)
    if override:
        try:
            block_n, block_k, warps, stages = (int(p) for p in override.split(","))
        except ValueError:
            raise ValueError(f"${EXACT_GATE_UP_PLAN_ENV if silu_mul else EXACT_PLAN_ENV}={override!r}: expected "
                             f"'block_n,block_k,warps,stages' (four integers)") from None
        if block_n < 16 or block_n & (block_n - 1) or block_k < 16 or block_k & (block_k - 1):
            raise ValueError(f"exact GEMM plan {override!r}: block_n and block_k must be powers of two >= 16 "
                             f"(tl.dot tiles)")
        return GemmPlan(16, block_n, block_k, warps, stages, True)
    shrink = max(1, element_bytes // 2)
    if silu_mul:
        return GemmPlan(16, 32, 256 // shrink, 4, 3, True)
    return GemmPlan(16, 16, 512 // shrink, 2, 3, True)


def gemm_plan(rows: int, out_features: int, in_features: int, silu_mul: bool = False,
              element_bytes: int = 2, sms: int = 132) -> GemmPlan:
    """Tiles for ``rows`` rows (``1 <= rows <= MAX_ROWS``) against a ``[out_features, in_features]`` weight, from
    the sweep on the H200 at the Llama-3.1-8B shapes (``benchmarks/skinny_gemm_bench.py``;
    ``benchmarks/results/2026-12-01-nvidia-h200-skinny-gemm``): one row, 16 columns a program over 512-wide K
    tiles with 2 warps (q|k|v 15.4 us, o 11.9, down 31.3 against cuBLAS' 16.1, 12.5, 31.9); the gate|up product,
    which loads two tiles an iteration, 32 columns through ``tl.dot`` (58.1 us against cuBLAS plus the silu kernel's
    62.7); several rows, ``tl.dot`` over 16 x 512 tiles. fp32 (``element_bytes`` 4) halves the K tile, so the
    buffered tiles fit in shared memory. Under ``$FOLD_HF_SKINNY_SPLIT_K=1`` several rows of a plain projection
    take :func:`split_k_plan` (``sms``: the device's SM count). ``$FOLD_HF_SKINNY_GEMM_PLAN`` overrides them
    (``"block_n,block_k,warps,stages[,dot][,sk=S]"``: ``sk=S`` splits a several-row plain product's K in S)."""
    override = os.environ.get(PLAN_ENV)
    if override:
        parts = [p.strip() for p in override.split(",")]
        block_n, block_k, warps, stages = (int(p) for p in parts[:4])
        use_dot = rows > 1 or "dot" in parts[4:]
        splits = [int(p[3:]) for p in parts[4:] if p.startswith("sk=")]
        split_k = splits[0] if splits and rows > 1 and not silu_mul else 1
        if split_k < 1:
            raise ValueError(f"${PLAN_ENV}={override!r}: sk= takes a split count >= 1")
        return GemmPlan(16 if use_dot else 1, block_n, block_k, warps, stages, use_dot, split_k)
    shrink = max(1, element_bytes // 2)
    if silu_mul:
        return exact_plan(element_bytes, silu_mul=True)
    if rows == 1:
        return GemmPlan(1, 16, 512 // shrink, 2, 3, False)
    if split_k_enabled():
        return split_k_plan(rows, out_features, in_features, element_bytes, sms)
    return exact_plan(element_bytes)  # several rows: the exact plan


def skinny_wins(rows: int, out_features: int, in_features: int, silu_mul: bool = False) -> bool:
    """Whether this kernel beat cuBLAS at the shape in the H200 sweep (:func:`gemm_plan`): always for one row and
    for the gate|up product with its SiLU (which saves a launch); for a verify block's rows only at widths up to
    4096 by 4096 (o: 13.0 against 13.2 us), while q|k|v (6144 wide: 16.3 against 15.8) and down (K = 14336: 36.3
    against 32.6, too few programs along N for the rows' dot) stay on cuBLAS. Under ``$FOLD_HF_SKINNY_SPLIT_K=1``
    every shape runs here (the split-K plan, :func:`split_k_plan`)."""
    if rows == 1 or silu_mul or split_k_enabled():
        return True
    return out_features <= 4096 and in_features <= 4096


def _launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int, up_rows: int,
            silu_mul: bool, exact: bool = False, gelu: bool = False) -> torch.Tensor:
    """``silu_mul``: a gate|up product ending in ``act(gate) * up``, SiLU or (``gelu``) GELU-tanh."""
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
    if not exact and not 1 <= M <= MAX_ROWS:  # the exact plan tiles any number of rows (16 a program)
        raise ValueError(f"the skinny GEMM takes 1 to {MAX_ROWS} rows, got {M}")
    out = torch.empty(*x.shape[:-1], out_features, device=x.device, dtype=x.dtype)
    if M == 0:
        return out
    plan = (exact_plan(x.element_size(), silu_mul) if exact
            else gemm_plan(M, out_features, K, silu_mul, x.element_size(), multiprocessor_count(x.device)))
    if plan.split_k > 1:
        return _launch_split_k(rows, weight, bias, out, plan)
    grid = (triton.cdiv(out_features, plan.block_n), triton.cdiv(M, plan.block_m))
    kernel = _exact_gemm_kernel if exact else _skinny_gemm_kernel
    kernel[grid](
        rows, weight, bias if bias is not None else weight, out, M, out_features, K, rows.stride(0),
        weight.stride(0), out_features, up_rows,
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul, GELU=gelu, USE_DOT=plan.use_dot, BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, STAGES=plan.num_stages,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        LIBDEVICE_EXP=os.environ.get("TRITON_INTERPRET") != "1",
        num_warps=plan.num_warps, num_stages=plan.num_stages, **launch_options(x.device), **_EXACT,
    )
    return out


def _launch_split_k(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
                    plan: GemmPlan) -> torch.Tensor:
    """``rows [M, K] @ weight[N, K]^T (+ bias)`` into ``out [..., N]`` in two launches: the split pass's fp32
    partials ``[S, M, N]``, then their sum in split order (:func:`split_k_plan`)."""
    M, K = rows.shape
    N = weight.shape[0]
    if M > plan.block_m:
        raise ValueError(f"the split-K plan takes at most {plan.block_m} rows, got {M}")
    per_split, splits = split_ranges(K, plan.split_k, plan.block_k)  # a forced count (sk=S) may shrink
    partials = torch.empty(splits, M, N, device=rows.device, dtype=torch.float32)
    options = launch_options(rows.device)
    _split_k_partial_kernel[(triton.cdiv(N, plan.block_n), splits)](
        rows, weight, partials, M, N, K, per_split, rows.stride(0), weight.stride(0),
        BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, STAGES=plan.num_stages,
        DOT_PRECISION="ieee" if rows.dtype == torch.float32 else "tf32", num_warps=plan.num_warps,
        num_stages=plan.num_stages, **options, **_EXACT)
    flat = out.view(-1, N)
    reduce_n = 128
    _split_k_reduce_kernel[(triton.cdiv(N, reduce_n),)](
        partials, bias if bias is not None else weight, flat, M, N, splits, flat.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=plan.block_m, BLOCK_N=reduce_n, num_warps=4, **options, **_EXACT)
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


def _gate_up_width(gate_up_weight: torch.Tensor) -> int:
    """``I`` of a stacked ``gate|up`` weight ``[2 I, K]`` (ValueError for an odd row count)."""
    if gate_up_weight.shape[0] % 2:
        raise ValueError(f"a gate|up weight has an even number of rows, got {gate_up_weight.shape[0]}")
    return gate_up_weight.shape[0] // 2


def gate_up_silu_triton(x: torch.Tensor, gate_up_weight: torch.Tensor,
                        gate_up_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate, up = F.linear(x, gate_up_weight, gate_up_bias).chunk(2, -1)``:
    ``x [..., K]``, ``gate_up_weight [2 I, K]`` -> ``[..., I]``."""
    width = _gate_up_width(gate_up_weight)
    return _launch(x, gate_up_weight, gate_up_bias, width, width, silu_mul=True)


def gate_up_gelu_tanh_triton(x: torch.Tensor, gate_up_weight: torch.Tensor,
                             gate_up_bias: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up`` of ``gate, up = F.linear(x, gate_up_weight, gate_up_bias).chunk(2,
    -1)`` (Gemma's MLP; :func:`gate_up_silu_triton`'s plan and rounding): ``x [..., K]``, ``gate_up_weight [2 I, K]``
    -> ``[..., I]``."""
    width = _gate_up_width(gate_up_weight)
    return _launch(x, gate_up_weight, gate_up_bias, width, width, silu_mul=True, gelu=True)


def exact_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x [..., K]`` of any number of rows, ``weight [N, K]`` -> ``[..., N]``,
    under :func:`exact_plan`: row ``r``'s result is bit for bit the same whatever the other rows are and however
    many there are (one row alone, a verify block, a prefill chunk)."""
    return _launch(x, weight, bias, weight.shape[0], 0, silu_mul=False, exact=True)


def exact_gate_up_silu_triton(x: torch.Tensor, gate_up_weight: torch.Tensor,
                              gate_up_bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`gate_up_silu_triton` under :func:`exact_plan` (any number of rows, row-count invariant):
    ``x [..., K]``, ``gate_up_weight [2 I, K]`` -> ``[..., I]``."""
    width = _gate_up_width(gate_up_weight)
    return _launch(x, gate_up_weight, gate_up_bias, width, width, silu_mul=True, exact=True)


__all__ = ["MAX_ROWS", "PLAN_ENV", "SPLIT_K_ENV", "GemmPlan", "decode_linear_triton", "exact_gate_up_silu_triton", "gate_up_gelu_tanh_triton",
           "exact_linear_triton", "exact_plan", "gate_up_silu_triton", "gemm_plan", "skinny_linear_triton",
           "skinny_wins", "split_count", "split_k_enabled", "split_k_plan", "split_ranges"]
