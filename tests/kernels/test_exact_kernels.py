"""The exact mode's row-count-invariant kernels (issue 37, ``docs/exact-mode.md``), under Triton's interpreter.

* each kernel against an independent float64 statement (a loop / float64 torch) by relative error: the exact GEMM
  (:func:`~fold_hf.kernels.gemm.triton.exact_linear_triton`, ``exact_gate_up_silu_triton``), the row-wise RMSNorm
  (``add_rms_norm_triton``), the exact decode / verify attention
  (:func:`~fold_hf.kernels.exact_attention.triton.exact_decode_attention_triton`);
* INVARIANCE: row ``r`` of a call with ``M`` rows equals, bit for bit, the same row computed alone and within other
  ``M`` (attention: a block at ``T`` against each row as an AR step at ``T + r``, with other data past its position);
  the kernels exact mode keeps as they are (rope with the cache write, ``silu(gate) * up``, the argmax) likewise;
* the invariance check fails on a split-K GEMM whose split follows the row count (defined here), so it can fail.

What the interpreter proves: the kernels' arithmetic order (tiles, splits, merge order, masking, the skipped
tiles) does not depend on the row count; ``tl.dot`` is a fixed-order sum over ``k`` per element there (conftest's
``row_invariant_dot``: numpy's matmul reduces a row differently by its place in a tile on some CPUs), so whether a
GPU's MMA reduces a row the same way wherever it sits in a tile is not tested here (the GPU bf16 run of ``benchmarks/exact_mode_bench.py``
checks it, and so do the ``gpu``-marked tests here, in bf16). The interpreter's ``tl.dot`` is wrong in bf16, so
the CPU runs use fp32 and fp16; conftest sets ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("row_invariant_dot")  # tl.dot as an MMA reduces a row (conftest)
import triton.language as tl  # noqa: E402

from fold_hf.kernels.exact_attention.naive import exact_decode_attention_reference  # noqa: E402

TINY_ATTENTION = dict(split_keys=32, block_m=16, block_n=16)  # small fixed tiles for the interpreter


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu().double(), b.detach().cpu().double()  # a GPU result against a CPU oracle
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def row_mismatches(fn, x: torch.Tensor, row_counts) -> list[str]:
    """Rows whose bits differ between ``fn(x[:M])`` for each ``M`` and ``fn(x[r:r+1])`` (row alone); ``x [R, ...]``,
    ``fn`` maps ``[M, ...]`` to ``[M, ...]``."""
    alone = [fn(x[r : r + 1].contiguous())[0] for r in range(max(row_counts))]
    bad = []
    for M in row_counts:
        out = fn(x[:M].contiguous())
        bad += [f"M={M} row {r}" for r in range(M) if not torch.equal(out[r], alone[r])]
    return bad


def oracle_linear(x, weight, bias=None):
    """``x @ weight^T (+ bias)`` in float64, one output column at a time."""
    x64, w64 = x.double(), weight.double()
    out = torch.stack([(x64 * w64[n]).sum(-1) for n in range(w64.shape[0])], -1)
    return out if bias is None else out + bias.double()


# ------------------------------------------------------------------ GEMM
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
def test_exact_linear_matches_float64(dtype, tol, interpreter):
    from fold_hf.kernels.gemm.triton import exact_gate_up_silu_triton, exact_linear_triton

    for rows, N, K, with_bias in [(1, 37, 200, False), (5, 19, 130, True), (17, 23, 96, False)]:
        x = randn(rows, K, dtype=dtype, seed=rows)
        w = randn(N, K, dtype=dtype, seed=rows + 1, scale=K**-0.5)
        b = randn(N, dtype=dtype, seed=rows + 2) if with_bias else None
        assert rel_err(exact_linear_triton(x, w, b), oracle_linear(x, w, b)) < tol, (rows, N, K)
        wg = randn(2 * N, K, dtype=dtype, seed=rows + 3, scale=K**-0.5)
        gate, up = oracle_linear(x, wg).chunk(2, -1)
        assert rel_err(exact_gate_up_silu_triton(x, wg), gate / (1 + torch.exp(-gate)) * up) < 2 * tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_exact_linear_rows_are_invariant(dtype, interpreter):
    from fold_hf.kernels.gemm.triton import exact_gate_up_silu_triton, exact_linear_triton

    K, N = 1100, 21  # three K tiles of the fp32 plan, the last one partial
    x = randn(19, K, dtype=dtype, seed=3)
    w = randn(N, K, dtype=dtype, seed=4, scale=K**-0.5)
    b = randn(N, dtype=dtype, seed=5)
    assert row_mismatches(lambda rows: exact_linear_triton(rows, w, b), x, (1, 2, 7, 16, 19)) == []
    wg = randn(2 * N, K, dtype=dtype, seed=6, scale=K**-0.5)
    assert row_mismatches(lambda rows: exact_gate_up_silu_triton(rows, wg), x, (1, 5, 16, 19)) == []


def test_an_exact_plan_override_keeps_rows_invariant_and_bad_ones_are_refused(interpreter, monkeypatch):
    """``$FOLD_HF_EXACT_GEMM_PLAN`` / ``$FOLD_HF_EXACT_GATE_UP_PLAN`` (the benchmarks' plan sweep) replace the tiles
    for every row count: the products still match float64 and every row has its bits alone; a plan that is not four
    integers or whose tiles are not powers of two >= 16 is refused, naming the variable."""
    from fold_hf.kernels.gemm.triton import exact_gate_up_silu_triton, exact_linear_triton, exact_plan

    monkeypatch.setenv("FOLD_HF_EXACT_GEMM_PLAN", "32,128,8,2")
    monkeypatch.setenv("FOLD_HF_EXACT_GATE_UP_PLAN", "16,64,2,4")
    assert (exact_plan(2).block_n, exact_plan(2).block_k, exact_plan(2).num_warps) == (32, 128, 8)
    assert (exact_plan(2, silu_mul=True).block_n, exact_plan(2, silu_mul=True).num_stages) == (16, 4)
    K, N = 300, 45
    x = randn(18, K, dtype=torch.float32, seed=7)
    w = randn(N, K, dtype=torch.float32, seed=8, scale=K**-0.5)
    assert rel_err(exact_linear_triton(x, w), oracle_linear(x, w)) < 1e-5
    assert row_mismatches(lambda rows: exact_linear_triton(rows, w), x, (1, 3, 16, 18)) == []
    wg = randn(2 * N, K, dtype=torch.float32, seed=9, scale=K**-0.5)
    assert row_mismatches(lambda rows: exact_gate_up_silu_triton(rows, wg), x, (1, 17)) == []
    for bad in ("16,512,4", "24,512,4,3", "16,8,4,3", "a,b,c,d"):
        monkeypatch.setenv("FOLD_HF_EXACT_GEMM_PLAN", bad)
        with pytest.raises(ValueError, match="FOLD_HF_EXACT_GEMM_PLAN|power"):
            exact_plan(2)


@triton.jit
def _split_k_kernel(X, W, P, M, N, K, chunk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Partial ``x @ w^T`` of one K chunk (program (n, split)) into ``P [splits, M, N]``."""
    pid_n, split = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(split * chunk, tl.minimum(split * chunk + chunk, K), BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < tl.minimum(split * chunk + chunk, K)
        x = tl.load(X + offs_m[:, None] * K + offs_k[None, :], mask=(offs_m < M)[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(W + offs_n[:, None] * K + offs_k[None, :], mask=(offs_n < N)[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    tl.store(P + (split * M + offs_m[:, None]) * N + offs_n[None, :], acc,
             mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def split_k_by_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A GEMM as cuBLAS may run a skinny product: split-K whose split count follows the row count (one row: 4 K
    splits summed after; more rows: none). Not row-count invariant."""
    M, K = x.shape
    N = w.shape[0]
    splits = 4 if M == 1 else 1
    chunk = -(-K // (splits * 16)) * 16
    partials = torch.empty(splits, M, N, dtype=torch.float32)
    _split_k_kernel[(triton.cdiv(N, 16), splits)](x, w, partials, M, N, K, chunk, BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    return partials.sum(0)


def test_invariance_check_fails_on_a_split_following_the_row_count(interpreter):
    x = randn(8, 333, seed=7)
    w = randn(9, 333, seed=8, scale=333**-0.5)
    assert rel_err(split_k_by_rows(x, w), oracle_linear(x, w)) < 1e-5  # a correct GEMM ...
    assert row_mismatches(lambda rows: split_k_by_rows(rows, w), x, (2, 8))  # ... whose rows depend on M


# ------------------------------------------------------------------ RMSNorm
def oracle_rms_norm(x, weight, eps):
    x64 = x.double()
    return weight.double() * x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float16, 2e-3)])
def test_rms_norm_matches_float64_and_rows_are_invariant(dtype, tol, interpreter):
    from fold_hf.kernels.layer.triton import add_rms_norm_triton

    H = 300
    x = randn(13, H, dtype=dtype, seed=9)
    d = randn(13, H, dtype=dtype, seed=10)
    w = randn(H, dtype=dtype, seed=11)
    total, normed = add_rms_norm_triton(x, d, w, 1e-6)
    assert torch.equal(total, x + d)
    assert rel_err(normed, oracle_rms_norm((x + d), w, 1e-6)) < tol
    both = torch.stack([x, d], 1)  # [R, 2, H]: rows with their delta

    def norm(rows):
        return add_rms_norm_triton(rows[:, 0], rows[:, 1], w, 1e-6)[1]

    assert row_mismatches(norm, both, (1, 4, 13)) == []
    assert row_mismatches(lambda rows: add_rms_norm_triton(rows, None, w, 1e-6)[1], x, (1, 6, 13)) == []


def test_rope_silu_and_select_rows_are_invariant(interpreter):
    """The rest of the exact path keeps its kernels: the rope with the cache write and ``silu(gate) * up`` are
    elementwise, the argmax exact in any order; each row (token) alone gives the bits it gives among others."""
    from fold_hf.kernels.layer.triton import rope_write_triton, silu_mul_triton
    from fold_hf.kernels.select.triton import argmax_rows_triton

    dtype, L, Hq, Hkv, D, capacity = torch.float16, 5, 4, 2, 16, 40
    q, k, v = (randn(1, L, h, D, dtype=dtype, seed=seed) for h, seed in ((Hq, 30), (Hkv, 31), (Hkv, 32)))
    cos, sin = randn(capacity, D, dtype=dtype, seed=40), randn(capacity, D, dtype=dtype, seed=41)
    positions = torch.arange(17, 17 + L)

    def rope(rows):  # rows [M, 1]: token indices -> [M, ...] each token's q, k, v and cache entries
        idx = rows[:, 0]
        kc, vc = torch.zeros(1, Hkv, capacity, D, dtype=dtype), torch.zeros(1, Hkv, capacity, D, dtype=dtype)
        qo, ko, vo = rope_write_triton(q[:, idx], k[:, idx], v[:, idx], cos, sin, positions[idx], kc, vc)
        cache = torch.cat([kc[0, :, positions[idx]], vc[0, :, positions[idx]]], -1)  # [Hkv, M, 2D]
        return torch.cat([qo[0].transpose(0, 1).flatten(1), ko[0].transpose(0, 1).flatten(1),
                          vo[0].transpose(0, 1).flatten(1), cache.transpose(0, 1).flatten(1)], -1)

    assert row_mismatches(rope, torch.arange(L)[:, None], (1, 3, 5)) == []
    gate_up = randn(6, 2, 50, dtype=dtype, seed=42)
    assert row_mismatches(lambda rows: silu_mul_triton(rows[:, 0], rows[:, 1]), gate_up, (1, 4, 6)) == []
    scores = randn(6, 300, dtype=dtype, seed=43)
    scores[3, 7] = scores[3, 200] = scores[3].max() + 1  # a tie: the first index, alone or not
    assert row_mismatches(lambda rows: argmax_rows_triton(rows)[:, None], scores, (1, 4, 6)) == []
    assert argmax_rows_triton(scores[3:4])[0] == 7


# ------------------------------------------------------------------ attention
def attention_case(dtype, Hq=6, Hkv=2, D=24, capacity=150, seed=12):
    q = randn(1, Hq, 9, D, dtype=dtype, seed=seed)
    kc = randn(1, Hkv, capacity, D, dtype=dtype, seed=seed + 1)
    vc = randn(1, Hkv, capacity, D, dtype=dtype, seed=seed + 2)
    return q, kc, vc


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
def test_exact_attention_matches_float64(dtype, tol, interpreter):
    from fold_hf.kernels.exact_attention.triton import exact_decode_attention_triton

    q, kc, vc = attention_case(dtype)
    scale = 24**-0.5
    for T, L in [(0, 1), (0, 9), (31, 4), (70, 1), (100, 9)]:
        block = q[:, :, :L]
        want = exact_decode_attention_reference(block.double(), kc.double(), vc.double(), None, None, T, scale)
        got = exact_decode_attention_triton(block, kc, vc, None, None, T, scale, **TINY_ATTENTION)
        assert got.shape == (1, L, 6, 24)
        assert rel_err(got, want) < tol, (T, L)
        on_device = exact_decode_attention_triton(block, kc, vc, None, None, torch.tensor([T]), scale,
                                                  max_context_length=150, **TINY_ATTENTION)
        assert torch.equal(on_device, got), (T, L)


def test_exact_attention_reference_is_a_masked_softmax():
    """The twin itself against a loop over rows and heads (T = 5, two rows, GQA 2)."""
    q, kc, vc = attention_case(torch.float64, Hq=4, Hkv=2, D=8, capacity=12)
    got = exact_decode_attention_reference(q[:, :, :2], kc, vc, None, None, 5, 0.5)
    for r in range(2):
        for h in range(4):
            keys, values = kc[0, h // 2, : 5 + r + 1], vc[0, h // 2, : 5 + r + 1]
            w = torch.softmax(keys @ q[0, h, r] * 0.5, 0)
            assert torch.allclose(got[0, r, h], w @ values, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_exact_attention_rows_are_invariant(dtype, interpreter):
    """Row ``r`` of a verify block at ``T`` (rows ``T .. T + L - 1`` written in the cache) against the same row as an
    AR step at ``T + r`` alone, whose cache past its position holds other data, and within other block sizes and
    buckets."""
    from fold_hf.kernels.exact_attention.triton import exact_decode_attention_triton

    q, kc, vc = attention_case(dtype, Hq=8, Hkv=2, D=16, capacity=140)  # G = 4: 36 packed rows, three row tiles
    scale = 0.25
    for T in (0, 20, 45, 95):  # blocks within one split, across split and tile edges
        for L in (1, 3, 9):
            block = exact_decode_attention_triton(q[:, :, :L], kc, vc, None, None, torch.tensor([T]), scale,
                                                  max_context_length=T + L + 30, **TINY_ATTENTION)
            for r in range(L):
                kc2, vc2 = kc.clone(), vc.clone()
                kc2[:, :, T + r + 1 :] = randn(*kc2[:, :, T + r + 1 :].shape, dtype=dtype, seed=T + r)
                vc2[:, :, T + r + 1 :] = randn(*vc2[:, :, T + r + 1 :].shape, dtype=dtype, seed=T + r + 1)
                alone = exact_decode_attention_triton(q[:, :, r : r + 1], kc2, vc2, None, None, T + r, scale,
                                                      **TINY_ATTENTION)
                assert torch.equal(block[0, r], alone[0, 0]), (T, L, r)


def ring_case(dtype, R, Hq=8, Hkv=2, D=16, seed=40):
    """Queries ``[1, Hq, 9, D]`` and key / value rings ``[1, Hkv, R, D]`` of random data."""
    return (randn(1, Hq, 9, D, dtype=dtype, seed=seed), randn(1, Hkv, R, D, dtype=dtype, seed=seed + 1),
            randn(1, Hkv, R, D, dtype=dtype, seed=seed + 2))


def oracle_ring(q, kr, vr, positions, window, scale):
    """Sliding-window attention over a ring in float64, one (row, head) at a time: slot ``s`` holds the newest
    position ``p <= positions[-1]`` with ``p = s (mod R)``; row ``r`` reads the slots with ``0 <= positions[r] - p <
    window`` and ``p >= 0``."""
    _, Hq, L, D = q.shape
    Hkv, R = kr.shape[1], kr.shape[2]
    top = int(positions[-1])
    held = [top - ((top - s) % R) for s in range(R)]
    out = torch.empty(1, L, Hq, D, dtype=torch.float64)
    for r in range(L):
        slots = [s for s in range(R) if held[s] >= 0 and 0 <= int(positions[r]) - held[s] < window]
        for h in range(Hq):
            keys, values = kr[0, h // (Hq // Hkv), slots].double(), vr[0, h // (Hq // Hkv), slots].double()
            out[0, r, h] = torch.softmax(keys @ q[0, h, r].double() * scale, 0) @ values
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
def test_exact_ring_attention_matches_float64_and_rows_are_invariant(dtype, tol, interpreter):
    """Gemma's sliding layers in exact mode: :func:`exact_ring_attention_triton` against a float64 loop, and row
    ``r`` of a verify block at ``T .. T + L - 1`` (its rows written into the ring at ``p mod R``) bit for bit the same
    as that query decoded alone at ``T + r``, whose ring holds, in the slots the block's later rows took, the older
    entries an AR step still sees there (out of its window: other data)."""
    from fold_hf.kernels.gemma.triton import exact_ring_attention_triton

    R, window, scale = 160, 150, 0.25  # R >= window + the longest block; three splits of 64 slots at head dim 16
    q, kr, vr = ring_case(dtype, R)
    for T in (3, 100, 155, 500):  # a ring not yet full, across a split edge, just wrapped, wrapped many times
        for L in (1, 4, 9):
            positions = torch.arange(T, T + L)
            block = exact_ring_attention_triton(q[:, :, :L], kr, vr, positions, window, scale)
            assert rel_err(block, oracle_ring(q[:, :, :L], kr, vr, positions, window, scale)) < tol, (T, L)
            for r in range(L):
                kr2, vr2 = kr.clone(), vr.clone()
                later = [(T + j) % R for j in range(r + 1, L)]  # slots of the block's later rows: older data alone
                kr2[:, :, later] = randn(1, kr.shape[1], len(later), kr.shape[3], dtype=dtype, seed=T + r)
                vr2[:, :, later] = randn(1, vr.shape[1], len(later), vr.shape[3], dtype=dtype, seed=T + r + 1)
                alone = exact_ring_attention_triton(q[:, :, r : r + 1], kr2, vr2, positions[r : r + 1], window,
                                                    scale)
                assert torch.equal(block[0, r], alone[0, 0]), (T, L, r)


def test_ring_attention_refuses_a_bad_tile(interpreter):
    from fold_hf.kernels.gemma.triton import ring_attention_triton

    q, kr, vr = ring_case(torch.float32, 40)
    with pytest.raises(ValueError, match="power of two"):
        ring_attention_triton(q, kr, vr, torch.arange(30, 39), 29, 0.25, block_m=24)


def test_exact_attention_rejects_bad_inputs(interpreter):
    from fold_hf.kernels.exact_attention.triton import exact_decode_attention_triton

    q, kc, vc = attention_case(torch.float32)
    with pytest.raises(ValueError, match="multiple of block_n"):
        exact_decode_attention_triton(q, kc, vc, None, None, 0, split_keys=40, block_n=16)
    with pytest.raises(ValueError, match="do not fit"):
        exact_decode_attention_triton(q, kc, vc, None, None, 145)
    with pytest.raises(ValueError, match="caches must be"):
        exact_decode_attention_triton(q, kc.double(), vc, None, None, 3)


def test_exact_ops_refuse_a_cpu_device(monkeypatch):
    """Off CUDA the exact ops refuse, naming why; a CPU under Triton's interpreter is accepted (the CPU tests)."""
    from fold_hf.kernels.exact import (
        ExactUnavailable,
        exact_decode_attention,
        exact_layer_ops,
        exact_unavailable_reason,
    )

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert exact_unavailable_reason("cpu") is None
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ExactUnavailable, match="Triton kernels on CUDA"):
        exact_layer_ops("cpu")
    with pytest.raises(ExactUnavailable, match="Triton kernels on CUDA"):
        exact_decode_attention("cpu")


def test_softmax_scale_in_base_two_is_the_natural_scale():
    """The kernels fold ``log2(e)`` into the logit scale; exp2 of the folded logits is exp of the natural ones."""
    from fold_hf.kernels.exact_attention.triton import LOG2E

    assert math.isclose(2 ** (3.0 * LOG2E), math.exp(3.0), rel_tol=1e-12)


@pytest.mark.gpu(reason="bf16 MMA tiles and the 8B widths: what the interpreter cannot show (its dot is numpy's)")
def test_exact_kernels_rows_are_invariant_in_bf16_on_gpu():
    from fold_hf.kernels.exact import exact_decode_attention, exact_layer_ops

    ops, attend = exact_layer_ops("cuda"), exact_decode_attention("cuda")
    dtype = torch.bfloat16
    x = randn(16, 4096, dtype=dtype, seed=20).cuda()
    w = randn(6144, 4096, dtype=dtype, seed=21, scale=1 / 64).cuda()
    assert rel_err(ops.skinny_linear(x, w), oracle_linear(x.cpu(), w.cpu())) < 1e-2
    assert row_mismatches(lambda rows: ops.skinny_linear(rows, w), x, (1, 2, 5, 16)) == []
    wg = randn(2 * 1024, 4096, dtype=dtype, seed=22, scale=1 / 64).cuda()
    assert row_mismatches(lambda rows: ops.gate_up_silu(rows, wg), x, (1, 3, 16)) == []
    nw = randn(4096, dtype=dtype, seed=23).cuda()
    assert row_mismatches(lambda rows: ops.add_rms_norm(rows, None, nw, 1e-5)[1], x, (1, 7, 16)) == []
    q = randn(1, 32, 16, 128, dtype=dtype, seed=24).cuda()
    kc = randn(1, 8, 4096, 128, dtype=dtype, seed=25).cuda()
    vc = randn(1, 8, 4096, 128, dtype=dtype, seed=26).cuda()
    for T in (0, 500, 3000):
        want = exact_decode_attention_reference(q[:, :, :16].double(), kc.double(), vc.double(), None, None, T, 0.088)
        block = attend(q, kc, vc, None, None, torch.tensor([T], device="cuda"), 0.088, max_context_length=4096)
        assert rel_err(block, want) < 1e-2
        for r in (0, 5, 15):
            alone = attend(q[:, :, r : r + 1], kc, vc, None, None, torch.tensor([T + r], device="cuda"), 0.088,
                           max_context_length=T + r + 1)
            assert torch.equal(block[0, r], alone[0, 0]), (T, r)
    # Gemma's sliding layers: the ring at head dims 256 and 512 (Gemma-3 / Gemma-4), window 1024, 8 query heads a
    # KV head, a verify block of 16 rows against each row alone
    from fold_hf.kernels.gemma.triton import exact_ring_attention_triton

    for D in (256, 512):
        R, T = 1024 + 64, 5000
        q = randn(1, 16, 16, D, dtype=dtype, seed=27).cuda()
        kr = randn(1, 2, R, D, dtype=dtype, seed=28).cuda()
        vr = randn(1, 2, R, D, dtype=dtype, seed=29).cuda()
        positions = torch.arange(T, T + 16, device="cuda")
        block = exact_ring_attention_triton(q, kr, vr, positions, 1024, D**-0.5)
        for r in (0, 7, 15):
            alone = exact_ring_attention_triton(q[:, :, r : r + 1], kr, vr, positions[r : r + 1], 1024, D**-0.5)
            assert torch.equal(block[0, r], alone[0, 0]), (D, r)


def test_exact_mode_benchmark_runs_tiny(interpreter, tmp_path):
    """``benchmarks/exact_mode_bench.py --tiny``: every piece on both paths at tiny shapes, correct against its
    reference, the exact pieces' rows the same bits across row counts, CSV and JSON written."""
    import csv
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "exact_mode_bench.py"
    spec = importlib.util.spec_from_file_location("exact_mode_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    summary = bench.main(["--out", str(tmp_path), "--tiny", "--rows", "1,4"])
    rows = list(csv.DictReader((tmp_path / "exact_mode.csv").open()))
    pieces = {"qkv", "o_proj", "gate_up_silu", "down", "lm_head", "attention", "rms_norm_x2"}
    assert {(r["piece"], r["path"], r["rows"]) for r in rows} == {(p, path, m) for p in pieces
                                                                  for path in ("default", "exact") for m in "14"}
    assert all(float(r["rel_err"]) < 1e-5 for r in rows), [(r["piece"], r["rel_err"]) for r in rows]
    assert all(r["invariant"] == "True" for r in rows if r["path"] == "exact")
    assert summary["exact_invariant"] is True
    assert json.loads((tmp_path / "exact_mode.json").read_text())["summary"] == summary
    assert summary["exact_ar_over_default_shape_pieces"] > 0


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
def test_ring_attention_rows_in_one_launch_are_each_rows_own(dtype, tol, interpreter):
    """``ring_attention_rows_triton`` (the Gemma family's batched verify on CUDA): three rows of a 4-row batch of
    rings (cache rows 2, 0, 3), each at its own positions (a ring not yet full, one across a split edge, one wrapped
    many times), blocks of 5, in one launch pair: every row equals the float64 loop over its own ring."""
    from fold_hf.kernels.gemma.triton import ring_attention_rows_triton

    R, window, scale, L = 160, 150, 0.25, 5
    q = randn(3, 8, L, 16, dtype=dtype, seed=60)
    kr, vr = randn(4, 2, R, 16, dtype=dtype, seed=61), randn(4, 2, R, 16, dtype=dtype, seed=62)
    rows, starts = [2, 0, 3], [3, 120, 500]
    positions = torch.tensor(starts)[:, None] + torch.arange(L)
    out = ring_attention_rows_triton(q, kr, vr, positions, torch.tensor(rows, dtype=torch.int32), window, scale)
    assert out.shape == (3, L, 8, 16)
    for a, row in enumerate(rows):
        expected = oracle_ring(q[a : a + 1], kr[row : row + 1], vr[row : row + 1], positions[a], window, scale)
        assert rel_err(out[a : a + 1], expected) < tol, a
