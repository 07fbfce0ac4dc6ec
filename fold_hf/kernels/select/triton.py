"""Triton kernels for greedy token selection on logits rows: the argmax of each row and the greedy verify of a
speculative round (prefix match of the proposals against the target's argmax, the accepted count and the round's
last token), in two launches and no host read (capturable in a CUDA graph).

Why: at Llama-3.1's vocabulary (V = 128256) ``torch.argmax(-1)`` runs one thread block per row and measured
27.8 us for one bf16 row on an H200 (its 0.5 MB read takes ~2 us), and the greedy verify around it (the fp32 copy
of the logits, the argmax, eq / cumprod / sum / minimum and the gather) is 6-7 small launches. Here:

* :func:`_argmax_partials_kernel`, grid ``(rows, chunks)``: one program reads one chunk of ``BLOCK`` entries of one
  row in its own dtype (bf16 / fp16 / fp32, turned into fp32 inside: exact) and writes the chunk's maximum (fp32)
  and the index of its first occurrence (int32) to the partial buffers ``[rows, chunks]``;
* :func:`_greedy_accept_kernel`, one program: every row's partials reduced in chunk order to the row's argmax,
  then the accepted count ``n = min(matched, limit)`` (``matched``: leading proposals equal to the target's argmax;
  ``limit`` an int or read from a device tensor), ``n``, the round's last token ``posterior[n]`` and optionally
  every row's argmax written; :func:`_argmax_finish_kernel` is its argmax-only sibling (a program per tile of rows).

Semantics are ``torch.argmax``'s exactly: ties go to the smallest index, NaN counts as the maximum (the first NaN
of a row is its argmax: a chunk holding a NaN reports its first NaN's index with value NaN, and the second stage
takes the first chunk reporting NaN), a row of ``-inf`` gives 0, ``+inf`` is an ordinary maximum. No reduction
relies on ``tl.argmax`` (which does not order NaN) or on how ``tl.max`` treats NaN: NaN entries are found with
``x != x`` and replaced by ``-inf`` before the maximum.

Pure-torch twins (the same two-level chunk plan): :mod:`fold_hf.kernels.select.naive`. Imported only when
Triton is usable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # entries of a row one stage-1 program reads (a power of two); 63 chunks of a 128256-entry row
NUM_WARPS = 4  # stage 1: 16 entries a thread at BLOCK 2048
FINISH_TILE = 4096  # stage 2: at most this many partials in registers at once (rows x chunks tile)
SCORE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_INT32_MAX = 2147483647
_BIG = tl.constexpr(_INT32_MAX)  # "no index" in the index reductions (int32 max)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


@triton.jit
def _argmax_partials_kernel(SCORES, VALUES, INDICES, vocab, row_stride, chunks, BLOCK: tl.constexpr):
    """Program (row, chunk): the chunk's maximum and the index of its first occurrence, or NaN and the index of its
    first NaN when it holds one."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    ok = offs < vocab
    x = tl.load(SCORES + row.to(tl.int64) * row_stride + offs, mask=ok, other=float("-inf")).to(tl.float32)
    nan = x != x
    first_nan = tl.min(tl.where(nan & ok, offs, _BIG), 0)
    clean = tl.where(nan, float("-inf"), x)
    best = tl.max(clean, 0)
    first = tl.min(tl.where((clean == best) & ok, offs, _BIG), 0)
    has_nan = first_nan < _BIG
    out = row * chunks + chunk
    tl.store(VALUES + out, tl.where(has_nan, float("nan"), best))
    tl.store(INDICES + out, tl.where(has_nan, first_nan, first))


@triton.jit
def _reduce_partials(VALUES, INDICES, first_row, rows, chunks, ROWS: tl.constexpr, CHUNKS: tl.constexpr):
    """The argmax ``[ROWS]`` (int32) of rows ``first_row ..`` from their partials, chunk tiles of ``CHUNKS`` in
    order (a later tile wins only with a strictly larger maximum); with the row ids and their mask."""
    r = first_row + tl.arange(0, ROWS)
    row_ok = r < rows
    best = tl.full([ROWS], float("-inf"), tl.float32)
    best_index = tl.full([ROWS], _BIG, tl.int32)
    first_nan = tl.full([ROWS], _BIG, tl.int32)
    for start in range(0, chunks, CHUNKS):
        c = start + tl.arange(0, CHUNKS)
        ok = row_ok[:, None] & (c < chunks)[None, :]
        at = r[:, None] * chunks + c[None, :]
        v = tl.load(VALUES + at, mask=ok, other=float("-inf"))
        i = tl.load(INDICES + at, mask=ok, other=_BIG)
        nan = v != v
        first_nan = tl.minimum(first_nan, tl.min(tl.where(nan & ok, i, _BIG), 1))
        clean = tl.where(nan, float("-inf"), v)
        m = tl.max(clean, 1)
        m_index = tl.min(tl.where((clean == m[:, None]) & ok, i, _BIG), 1)
        take = (m > best) | (best_index == _BIG)
        best_index = tl.where(take, m_index, best_index)
        best = tl.where(take, m, best)
    return tl.where(first_nan < _BIG, first_nan, best_index), r, row_ok


@triton.jit
def _argmax_finish_kernel(VALUES, INDICES, OUT, rows, chunks, ROWS: tl.constexpr, CHUNKS: tl.constexpr):
    """Program p: the argmax of rows ``p * ROWS ..`` written to ``OUT`` (int64)."""
    argmax, r, row_ok = _reduce_partials(VALUES, INDICES, tl.program_id(0) * ROWS, rows, chunks, ROWS, CHUNKS)
    tl.store(OUT + r, argmax.to(tl.int64), mask=row_ok)


@triton.jit
def _greedy_accept_kernel(VALUES, INDICES, PROPOSALS, LIMIT, limit_value, N_OUT, FINAL_OUT, POSTERIOR_OUT, rows,
                          chunks, ROWS: tl.constexpr, CHUNKS: tl.constexpr, LIMIT_IN_MEMORY: tl.constexpr,
                          WRITE_POSTERIOR: tl.constexpr):
    """One program: every row's argmax (``posterior``), ``matched`` = leading proposals equal to it,
    ``n = min(matched, limit)``, ``final = posterior[n]``."""
    posterior, r, row_ok = _reduce_partials(VALUES, INDICES, 0, rows, chunks, ROWS, CHUNKS)
    posterior = posterior.to(tl.int64)
    k = rows - 1
    is_proposal = r < k
    proposals = tl.load(PROPOSALS + r, mask=is_proposal, other=0).to(tl.int64)
    miss = is_proposal & (proposals != posterior)
    matched = tl.min(tl.where(miss, r, k), 0).to(tl.int64)
    if LIMIT_IN_MEMORY:
        n = tl.minimum(matched, tl.load(LIMIT).to(tl.int64))
    else:
        n = tl.minimum(matched, limit_value)
    final = tl.sum(tl.where(row_ok & (r == n), posterior, 0), 0)
    tl.store(N_OUT, n)
    tl.store(FINAL_OUT, final)
    if WRITE_POSTERIOR:
        tl.store(POSTERIOR_OUT + r, posterior, mask=row_ok)


def _check_scores(scores: torch.Tensor, block: int) -> torch.Tensor:
    if scores.dim() != 2 or scores.shape[1] == 0:
        raise ValueError(f"scores must be [n, V] with V > 0, got {tuple(scores.shape)}")
    if scores.dtype not in SCORE_DTYPES:
        raise ValueError(f"scores must be bfloat16, float16 or float32, got {scores.dtype}")
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    if scores.shape[1] >= _INT32_MAX:
        raise ValueError(f"rows of {scores.shape[1]} entries do not fit int32 indices")
    return scores if scores.stride(1) == 1 else scores.contiguous()


def _partials(scores: torch.Tensor, block: int, num_warps: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stage 1: (values ``[n, chunks]`` fp32, first indices ``[n, chunks]`` int32, chunks)."""
    rows, vocab = scores.shape
    chunks = triton.cdiv(vocab, block)
    values = torch.empty(rows, chunks, dtype=torch.float32, device=scores.device)
    indices = torch.empty(rows, chunks, dtype=torch.int32, device=scores.device)
    _argmax_partials_kernel[(rows, chunks)](scores, values, indices, vocab, scores.stride(0), chunks, BLOCK=block,
                                            num_warps=num_warps)
    return values, indices, chunks


def _finish_tile(rows: int, chunks: int) -> tuple[int, int]:
    """(rows, chunks) of the stage-2 tile: every row of the program, chunk tiles filling :data:`FINISH_TILE`."""
    rows_p2 = _next_pow2(rows)
    return rows_p2, max(1, min(_next_pow2(chunks), FINISH_TILE // rows_p2))


def argmax_rows_triton(scores: torch.Tensor, block: int = BLOCK, num_warps: int = NUM_WARPS) -> torch.Tensor:
    """``torch.argmax(scores, -1)`` exactly (first maximum, NaN as the maximum), in two launches.

    Args:
        scores: ``[n, V]`` bf16 / fp16 / fp32 on a CUDA device (or under Triton's interpreter), last dim contiguous
            (rows may be strided; otherwise a contiguous copy is read).
        block: entries of a row one stage-1 program reads (a power of two; default :data:`BLOCK`).
        num_warps: warps of a stage-1 program.

    Returns:
        ``[n]`` long: each row's index of its first maximum.
    """
    scores = _check_scores(scores, block)
    rows = scores.shape[0]
    out = torch.empty(rows, dtype=torch.long, device=scores.device)
    if rows == 0:
        return out
    values, indices, chunks = _partials(scores, block, num_warps)
    tile_rows, tile_chunks = _finish_tile(min(rows, 16), chunks)
    _argmax_finish_kernel[(triton.cdiv(rows, tile_rows),)](values, indices, out, rows, chunks, ROWS=tile_rows,
                                                           CHUNKS=tile_chunks, num_warps=4)
    return out


def greedy_verify_triton(scores: torch.Tensor, proposals: torch.Tensor, limit: int | torch.Tensor,
                         block: int = BLOCK, num_warps: int = NUM_WARPS, return_posterior: bool = False):
    """Greedy verification of one round in two launches: what ``verify_greedy`` and the gather of the round's
    last token give (:func:`fold_hf.kernels.select.naive.greedy_verify_torch`), no host read.

    Args:
        scores: ``[K + 1, V]`` bf16 / fp16 / fp32 target scores (raw logits or processed) at the last committed
            token and each proposal, on a CUDA device (or under Triton's interpreter); last dim contiguous.
        proposals: ``[K]`` integer (long) proposed tokens, same device; K may be 0 (an AR step).
        limit: proposals that may be accepted (>= 0): a Python int or an integer tensor ``[1]`` on the device, read
            there (no host sync: capturable).
        block, num_warps: stage 1's chunk (a power of two) and warps, as in :func:`argmax_rows_triton`.
        return_posterior: also return every row's argmax.

    Returns:
        (accepted count n ``[1]`` long, the round's last token ``posterior[n]`` ``[1]`` long), and the argmax of
        every row ``[K + 1]`` long with ``return_posterior``.
    """
    scores = _check_scores(scores, block)
    rows = scores.shape[0]
    k = proposals.shape[0]
    if proposals.dim() != 1 or k != rows - 1:
        raise ValueError(f"proposals must be [{rows - 1}] for scores of {rows} rows, got {tuple(proposals.shape)}")
    if proposals.dtype.is_floating_point or proposals.dtype == torch.bool:
        raise ValueError(f"proposals must be integer tokens, got {proposals.dtype}")
    device = scores.device
    n = torch.empty(1, dtype=torch.long, device=device)
    final = torch.empty(1, dtype=torch.long, device=device)
    posterior = torch.empty(rows, dtype=torch.long, device=device) if return_posterior else n
    in_memory = isinstance(limit, torch.Tensor)
    if in_memory:
        if limit.numel() != 1 or limit.device != device or limit.dtype.is_floating_point:
            raise ValueError(f"limit must be an int or an integer tensor [1] on {device}, got "
                             f"{tuple(limit.shape)} {limit.dtype} on {limit.device}")
        limit_ptr, limit_value = limit, 0
    else:
        limit_ptr, limit_value = n, int(limit)
    values, indices, chunks = _partials(scores, block, num_warps)
    tile_rows, tile_chunks = _finish_tile(rows, chunks)
    # an empty proposals tensor (K = 0) may have no storage: the (fully masked) load reads the output's address
    _greedy_accept_kernel[(1,)](values, indices, proposals if k else n, limit_ptr, limit_value, n, final, posterior,
                                rows, chunks, ROWS=tile_rows, CHUNKS=tile_chunks, LIMIT_IN_MEMORY=in_memory,
                                WRITE_POSTERIOR=return_posterior, num_warps=4)
    return (n, final, posterior) if return_posterior else (n, final)


__all__ = ["BLOCK", "NUM_WARPS", "SCORE_DTYPES", "argmax_rows_triton", "greedy_verify_triton"]
