"""Triton decode / verify attention of the exact mode: a row's output is the same bits whether the row is an AR
step alone, one of a verify block's rows, or in any other block (issue 37, ``docs/exact-mode.md``).

What makes it row-count invariant (every choice below is fixed by the key positions and the model shape, never by
the number of rows ``L`` or by the bucket):

* keys are read from the cache only (the block's own entries are already there), in tiles of ``BLOCK_N`` keys at
  fixed positions ``[t * BLOCK_N, (t + 1) * BLOCK_N)``; splits cover fixed key ranges
  ``[s * SPLIT_KEYS, (s + 1) * SPLIT_KEYS)`` (the bucket only sets how many split programs exist);
* the query rows of one KV head (``G = Hq / Hkv`` heads times ``L`` rows, row ``m = g * L + r``) sit in tiles of a
  fixed ``BLOCK_M`` rows with fixed warps, so each row's logits and its ``p @ V`` are reduced by the same
  instructions wherever it sits in the tile;
* a row skips (bit for bit: its state is kept by ``tl.where``) every tile with no key it may see, so the tiles the
  block's later rows need do not touch it;
* the merge reads row ``r``'s splits ``0 .. (T + r) // SPLIT_KEYS`` only: their largest maximum first (exact in any
  order), then the rescaled sums ``MERGE_CHUNK`` splits at a time (a fixed tree within a chunk, where unused slots
  add exact zeros), chunks accumulated in split order: the same sums in the same order for the same position,
  whatever ``L`` or the bucket.

Logits in base 2 (``exp2``, the scale folded in), fp32 accumulation, ``p`` rounded to the value dtype before its
dot (as flash attention does). Twin with the same signature: :mod:`fold_hf.kernels.exact_attention.naive`.
Imported only when Triton is usable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..triton_pdl import launch_options, pdl_enter

LOG2E = 1.4426950408889634
SPLIT_KEYS = 512  # keys per split program, fixed by position
BLOCK_M, BLOCK_N, NUM_WARPS = 64, 64, 4  # fixed tiles (see the module docstring)
MERGE_CHUNK = 16  # splits one merge step loads at once


@triton.jit
def _context_length(CTX_PTR, ctx_value, LEN_FROM_PTR: tl.constexpr):
    """The cache's committed length ``T``: read from the device (``CTX_PTR``, CUDA graphs) or passed as a value."""
    if LEN_FROM_PTR:
        T = tl.load(CTX_PTR)
    else:
        T = ctx_value
    return T


# no specialization on the row count, the start or the split count (Triton compiles an int argument equal to 1 or
# divisible by 16 as a variant of its own): every call runs one binary per model shape
@triton.jit(do_not_specialize=["ctx_value", "num_rows", "L", "num_splits"])
def _exact_split_kernel(Q, KC, VC, CTX_PTR, ctx_value, PART_M, PART_L, PART_ACC,
                        stride_kh, stride_kn, stride_vh, stride_vn, num_rows, L, head_dim, value_dim, qk_scale,
                        num_splits, LEN_FROM_PTR: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                        DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row_block = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    T = _context_length(CTX_PTR, ctx_value, LEN_FROM_PTR)
    offs_m = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < num_rows
    pos = T + offs_m % L  # each row's position; its visible keys are 0 .. pos
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_ok = offs_d < head_dim
    dv_ok = offs_dv < value_dim
    q_base = Q + (head * num_rows).to(tl.int64) * head_dim
    q = tl.load(q_base + offs_m[:, None] * head_dim + offs_d[None, :], mask=m_ok[:, None] & d_ok[None, :],
                other=0.0)
    k_base = KC + head.to(tl.int64) * stride_kh
    v_base = VC + head.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, T + L)  # past the block's last position: no row sees it
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        n_ok = offs_n < hi
        k = tl.load(k_base + offs_n[:, None].to(tl.int64) * stride_kn + offs_d[None, :],
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = (offs_n[None, :] <= pos[:, None]) & m_ok[:, None]
        s = tl.where(visible, s, float("-inf"))
        row_max = tl.max(s, 1)
        seen = row_max > float("-inf")  # rows with a visible key in this tile; the others keep their state
        m_new = tl.where(seen, tl.maximum(m_i, row_max), 0.0)
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        v = tl.load(v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :],
                    mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
        l_new = l_i * alpha + tl.sum(p, 1)
        acc_new = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = tl.where(seen, m_new, m_i)
        l_i = tl.where(seen, l_new, l_i)
        acc = tl.where(seen[:, None], acc_new, acc)
    part = (head * num_splits + split).to(tl.int64) * num_rows + offs_m
    tl.store(PART_M + part, m_i, mask=m_ok)
    tl.store(PART_L + part, l_i, mask=m_ok)
    tl.store(PART_ACC + part[:, None] * value_dim + offs_dv[None, :], acc, mask=m_ok[:, None] & dv_ok[None, :])


@triton.jit(do_not_specialize=["ctx_value", "num_rows", "L", "num_splits"])
def _exact_merge_kernel(PART_M, PART_L, PART_ACC, OUT, CTX_PTR, ctx_value, num_rows, L, G, value_dim, num_splits,
                        out_row_stride, LEN_FROM_PTR: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK_DV: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    head = tl.program_id(0)
    row = tl.program_id(1)
    T = _context_length(CTX_PTR, ctx_value, LEN_FROM_PTR)
    r = row % L
    g = row // L
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_ok = offs_dv < value_dim
    offs_c = tl.arange(0, CHUNK)
    used = (T + r) // SPLIT + 1  # the splits holding keys 0 .. T + r, each non-empty
    base = (head * num_splits).to(tl.int64) * num_rows + row
    # pass 1: the largest split maximum (a maximum is exact in any order)
    m_max = tl.full([CHUNK], float("-inf"), tl.float32)
    for first in range(0, used, CHUNK):
        s_ok = first + offs_c < used
        m_max = tl.maximum(m_max, tl.load(PART_M + base + (first + offs_c) * num_rows, mask=s_ok,
                                          other=float("-inf")))
    m_all = tl.max(m_max, 0)
    # pass 2: the splits rescaled to it, CHUNK at a time (a fixed tree within a chunk; unused slots add +0), chunks
    # folded in order: the same sums in the same order for the same position
    l_tot = tl.zeros([CHUNK], tl.float32)
    acc_tot = tl.zeros([CHUNK, BLOCK_DV], tl.float32)
    for first in range(0, used, CHUNK):
        s_ok = first + offs_c < used
        part = base + (first + offs_c) * num_rows
        w = tl.math.exp2(tl.load(PART_M + part, mask=s_ok, other=float("-inf")) - m_all)
        l_tot += tl.load(PART_L + part, mask=s_ok, other=0.0) * w
        acc = tl.load(PART_ACC + part[:, None] * value_dim + offs_dv[None, :], mask=s_ok[:, None] & dv_ok[None, :],
                      other=0.0)
        acc_tot += acc * w[:, None]
    out = tl.sum(acc_tot, 0) / tl.sum(l_tot, 0)
    dst = OUT + r.to(tl.int64) * out_row_stride + (head * G + g) * value_dim
    tl.store(dst + offs_dv, out.to(OUT.dtype.element_ty), mask=dv_ok)


def _pow2(n: int) -> int:
    return max(16, 1 << max(0, int(n) - 1).bit_length())


def exact_decode_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_keys: torch.Tensor | None,
    block_values: torch.Tensor | None,
    context_length,
    scaling: float = 1.0,
    max_context_length: int | None = None,
    *,
    split_keys: int = SPLIT_KEYS,
    block_m: int = BLOCK_M,
    block_n: int = BLOCK_N,
    num_warps: int = NUM_WARPS,
) -> torch.Tensor:
    """Causal attention of a block of ``L`` rotated queries at positions ``T .. T + L - 1`` (AR: ``L = 1``),
    row-count invariant (module docstring); the signature of
    :func:`~fold_hf.kernels.fold_read.triton.decode_attention_triton` so the fast loop can call either.

    Args:
        query: ``[1, Hq, L, Dh]`` rotated queries; bf16, fp16 or fp32.
        key_cache: ``[1, Hkv, capacity, Dh]`` rotated keys, the block's own at ``T .. T + L - 1`` already written;
            entries past a row's position are masked (they must be finite: the cache starts zeroed).
        value_cache: ``[1, Hkv, capacity, Dv]``.
        block_keys, block_values: not read (the cache holds them); accepted for the common signature.
        context_length: ``T``, an int or an integer device tensor ``[1]`` (read on the device: capturable).
        scaling: logit scale.
        max_context_length: static bound on ``T + L`` when ``T`` is a tensor (a graph's bucket; default the
            capacity): it sets only how many split programs are launched, never what a row computes.
        split_keys, block_m, block_n, num_warps: the fixed configuration (tests and benchmarks shrink it); the
            results are row-count invariant among calls that pass the same values. ``split_keys`` must be a
            multiple of ``block_n``.

    Returns:
        ``[1, L, Hq, Dv]`` in ``query.dtype``.
    """
    del block_keys, block_values
    _, Hq, L, Dh = query.shape
    _, Hkv, capacity, _ = key_cache.shape
    Dv = value_cache.shape[-1]
    if query.shape[0] != 1 or key_cache.shape[0] != 1 or Hq % Hkv:
        raise ValueError(f"batch-1 query [1, Hq, L, D] with Hq a multiple of the cache's KV heads, got "
                         f"{tuple(query.shape)} over {tuple(key_cache.shape)}")
    if query.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"unsupported dtype {query.dtype}")
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise ValueError(f"the caches must be {query.dtype}, got {key_cache.dtype} / {value_cache.dtype}")
    if key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("the caches need a contiguous head dim")
    if split_keys % block_n:
        raise ValueError(f"split_keys ({split_keys}) must be a multiple of block_n ({block_n})")
    G = Hq // Hkv
    device = query.device
    query = query.contiguous()
    from_ptr = isinstance(context_length, torch.Tensor)
    if from_ptr:
        ctx_ptr = context_length.reshape(-1)[:1].to(torch.int32)
        ctx_value = 0
        span = capacity if max_context_length is None else min(int(max_context_length), capacity)
    else:
        ctx_value = int(context_length)
        ctx_ptr = query  # unused
        span = ctx_value + L
        if span > capacity:
            raise ValueError(f"positions up to {span - 1} do not fit the cache's {capacity} entries")
    num_rows = G * L
    num_splits = max(1, -(-span // split_keys))
    part_m = torch.empty(Hkv * num_splits * num_rows, device=device, dtype=torch.float32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(Hkv * num_splits * num_rows, Dv, device=device, dtype=torch.float32)
    out = torch.empty(1, L, Hq, Dv, device=device, dtype=query.dtype)
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    _exact_split_kernel[(-(-num_rows // block_m), Hkv, num_splits)](
        query, key_cache, value_cache, ctx_ptr, ctx_value, part_m, part_l, part_acc,
        key_cache.stride(1), key_cache.stride(2), value_cache.stride(1), value_cache.stride(2), num_rows, L, Dh, Dv,
        float(scaling) * LOG2E, num_splits, LEN_FROM_PTR=from_ptr, SPLIT=split_keys, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_D=_pow2(Dh), BLOCK_DV=_pow2(Dv), DOT_PRECISION=precision, num_warps=num_warps,
        num_stages=3 if device.type == "cuda" else 1, **launch_options(device))
    _exact_merge_kernel[(Hkv, num_rows)](
        part_m, part_l, part_acc, out, ctx_ptr, ctx_value, num_rows, L, G, Dv, num_splits, out.stride(1),
        LEN_FROM_PTR=from_ptr, SPLIT=split_keys, CHUNK=MERGE_CHUNK, BLOCK_DV=_pow2(Dv), num_warps=4, **launch_options(device))
    return out


__all__ = ["BLOCK_M", "BLOCK_N", "SPLIT_KEYS", "exact_decode_attention_triton"]
