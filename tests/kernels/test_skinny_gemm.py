"""The decode step's skinny GEMMs (:mod:`fold_hf.kernels.gemm.triton`) and their place in the fused target layers.

* Triton interpreter (CPU CI): each kernel against a float64 statement of the product (and of ``silu(g) * u``)
  over odd shapes, both paths (one row on the CUDA cores, 2-16 rows through ``tl.dot``), with and without bias;
  the static engine with the kernels in its fused layers gives HF greedy's tokens and the unfused loop's
  acceptance lengths, and runs them for the decode rows only (a prefill chunk stays on ``F.linear``).
* CPU: bad inputs and settings raise errors that say why.
* GPU (``@pytest.mark.gpu``): the kernels at the Llama-3.1-8B shapes in bf16 / fp32, and the graphs engine with
  them against cuBLAS (``$FOLD_HF_SKINNY_GEMM=0``) and HF greedy.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

import fold_hf
from fold_hf.generation import fast_generate
from tiny import check_graph_engine_settings, greedy_reference, mode_config, trained_pair, with_skinny_gemms
from tiny import prompt as tiny_prompt


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def randn(*shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def oracle_linear(x, weight, bias):
    """``x @ weight^T + bias`` summed in float64, one output at a time."""
    x64, w64 = x.double().reshape(-1, x.shape[-1]), weight.double()
    out = torch.empty(x64.shape[0], w64.shape[0], dtype=torch.float64)
    for n in range(w64.shape[0]):
        out[:, n] = (x64 * w64[n]).sum(-1) + (0.0 if bias is None else bias[n].double())
    return out.reshape(*x.shape[:-1], w64.shape[0])


def oracle_gate_up_silu(x, weight, bias):
    gate, up = oracle_linear(x, weight, bias).chunk(2, -1)
    return gate / (1 + torch.exp(-gate)) * up


def oracle_gate_up_gelu(x, weight, bias):
    gate, up = oracle_linear(x, weight, bias).chunk(2, -1)
    return 0.5 * gate * (1 + torch.tanh(0.7978845608028654 * (gate + 0.044715 * gate**3))) * up


TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}


def check_gemms(device, dtype, shapes, gate_up: bool = True):
    """``gate_up``: also the gate|up products (whose plans always use ``tl.dot``)."""
    from fold_hf.kernels.gemm.triton import gate_up_gelu_tanh_triton, gate_up_silu_triton, skinny_linear_triton

    for rows, N, K, with_bias in shapes:
        seed = rows * 7 + N + K
        x = randn(1, rows, K, dtype=dtype, device=device, seed=seed)
        weight = randn(N, K, dtype=dtype, device=device, seed=seed + 1, scale=K**-0.5)
        bias = randn(N, dtype=dtype, device=device, seed=seed + 2) if with_bias else None
        out = skinny_linear_triton(x, weight, bias)
        assert out.shape == (1, rows, N) and out.dtype == dtype
        cpu_bias = None if bias is None else bias.cpu()
        assert rel_err(out.cpu(), oracle_linear(x.cpu(), weight.cpu(), cpu_bias)) < TOLERANCE[dtype], (rows, N, K)
        if gate_up and N % 2 == 0:
            act = gate_up_silu_triton(x, weight, bias)
            assert act.shape == (1, rows, N // 2)
            want = oracle_gate_up_silu(x.cpu(), weight.cpu(), None if bias is None else bias.cpu())
            assert rel_err(act.cpu(), want) < TOLERANCE[dtype], (rows, N, K, dtype)
            act = gate_up_gelu_tanh_triton(x, weight, bias)  # Gemma's MLP (issue 39)
            want = oracle_gate_up_gelu(x.cpu(), weight.cpu(), None if bias is None else bias.cpu())
            assert rel_err(act.cpu(), want) < TOLERANCE[dtype], (rows, N, K, dtype, "gelu")


# (rows, N, K, bias): N not a multiple of the 16-column tile, K not a multiple of the K tile
INTERPRETER_SHAPES = [(1, 70, 200, True), (1, 33, 64, False), (1, 96, 600, False), (3, 70, 200, False),
                      (10, 48, 129, True), (16, 64, 520, False),
                      # issue 39: the tiny Qwen3.5's merged in_proj_qkv|z|b|a (64 + 32 + 4 + 4 rows), Gemma-4's q|k
                      (1, 104, 32, False), (4, 104, 32, False), (4, 48, 32, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gemms_in_interpreter_match_the_float64_product(interpreter, dtype):
    check_gemms("cpu", dtype, INTERPRETER_SHAPES)


def test_one_row_path_in_bf16_matches_the_float64_product(interpreter):
    """The one-row path sums on the CUDA cores (no dot), which the interpreter runs in bf16 too (the gate|up plans
    use the dot, whose bf16 the interpreter gets wrong)."""
    check_gemms("cpu", torch.bfloat16, [s for s in INTERPRETER_SHAPES if s[0] == 1], gate_up=False)


def test_gemm_inputs_and_settings_are_checked(monkeypatch):
    pytest.importorskip("triton")
    from fold_hf.kernels import SKINNY_GEMM_ENV, skinny_gemm_enabled
    from fold_hf.kernels.gemm.triton import PLAN_ENV, gate_up_silu_triton, gemm_plan, skinny_linear_triton

    weight = torch.zeros(8, 16)
    with pytest.raises(ValueError, match="1 to 16 rows"):
        skinny_linear_triton(torch.zeros(17, 16), weight)
    with pytest.raises(ValueError, match="features"):
        skinny_linear_triton(torch.zeros(1, 15), weight)
    with pytest.raises(ValueError, match="float16"):
        skinny_linear_triton(torch.zeros(1, 16, dtype=torch.float16), weight)
    with pytest.raises(ValueError, match="contiguous"):
        skinny_linear_triton(torch.zeros(1, 8), weight.t())
    with pytest.raises(ValueError, match="even number of rows"):
        gate_up_silu_triton(torch.zeros(1, 16), torch.zeros(7, 16))
    from fold_hf.kernels.gemm.triton import skinny_wins

    # the routing measured on the H200: one row and gate|up always, a block's rows only up to 4096 x 4096
    assert skinny_wins(1, 4096, 14336) and skinny_wins(10, 28672, 4096, silu_mul=True)
    assert skinny_wins(10, 4096, 4096) and not skinny_wins(10, 4096, 14336) and not skinny_wins(16, 6144, 4096)


# (rows, N, K, bias) for the split-K plan: K not a multiple of the K tile or of the split, a split count that leaves
# the last range short, one column tile and several, 2 to 16 rows
SPLIT_K_SHAPES = [(3, 70, 600, True), (16, 64, 1030, False), (2, 200, 2048, False), (10, 48, 129, True),
                  (7, 130, 900, True), (5, 40, 1800, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_k_plan_in_interpreter_matches_the_float64_product(interpreter, monkeypatch, dtype):
    """``$FOLD_HF_SKINNY_SPLIT_K=1`` (issue 39): several rows of a plain projection run the split pass and the
    ordered reduce; the result is the float64 product within one rounding, with the plan's split counts and with
    counts forced through ``$FOLD_HF_SKINNY_GEMM_PLAN``'s ``sk=``."""
    from fold_hf.kernels.gemm.triton import PLAN_ENV, SPLIT_K_ENV, gemm_plan, skinny_linear_triton

    monkeypatch.setenv(SPLIT_K_ENV, "1")
    split = 0
    for rows, N, K, with_bias in SPLIT_K_SHAPES:
        split += gemm_plan(rows, N, K, element_bytes=torch.finfo(dtype).bits // 8, sms=4).split_k > 1
    assert split >= 3  # the interpreter's 4 "SMs" split most of these shapes
    check_gemms("cpu", dtype, SPLIT_K_SHAPES, gate_up=False)
    for forced in ("32,64,4,1,sk=3", "16,32,4,2,dot,sk=5", "64,128,4,3,sk=1"):
        monkeypatch.setenv(PLAN_ENV, forced)
        check_gemms("cpu", dtype, [(4, 70, 300, True), (16, 33, 257, False)], gate_up=False)


def test_split_counts_cover_k_with_no_empty_split():
    """:func:`split_count` against the rule written out: the fewest splits giving two programs per SM, at most one
    per two K tiles, each split a whole number of K tiles, every split non-empty and K covered."""
    pytest.importorskip("triton")
    from fold_hf.kernels.gemm.triton import split_count

    for N in (48, 64, 1000, 4096, 12352):
        for K in (129, 600, 4096, 12288, 14336):
            for block_n, block_k, sms in ((64, 256, 132), (64, 128, 4), (32, 256, 114)):
                splits = split_count(N, K, block_n, block_k, sms)
                tiles = (N + block_n - 1) // block_n
                wanted = 1
                while wanted * tiles < 2 * sms and (wanted + 1) * 2 * block_k <= K:
                    wanted += 1
                per = -(-K // wanted)
                per = -(-per // block_k) * block_k
                ranges = [(s * per, min(K, (s + 1) * per)) for s in range(splits)]
                assert splits <= wanted and all(lo < hi for lo, hi in ranges) and ranges[-1][1] == K, (N, K)
                assert (splits - 1) * per < K <= splits * per


def test_split_k_setting_routes_every_block_product_to_the_split_plan(monkeypatch):
    pytest.importorskip("triton")
    from fold_hf.kernels.gemm.triton import SPLIT_K_ENV, gemm_plan, skinny_wins, split_k_enabled

    assert not split_k_enabled() and not skinny_wins(16, 6144, 4096)
    assert gemm_plan(16, 4096, 4096).split_k == 1
    monkeypatch.setenv(SPLIT_K_ENV, "1")
    assert skinny_wins(16, 6144, 4096) and skinny_wins(10, 4096, 14336)
    plan = gemm_plan(16, 4096, 12288, sms=132)
    assert plan.split_k == 5 and plan.block_n == 64 and plan.use_dot  # 64 column tiles x 5 = 320 programs
    assert gemm_plan(1, 4096, 12288).split_k == 1 and gemm_plan(16, 24576, 4096, silu_mul=True).split_k == 1
    monkeypatch.setenv(SPLIT_K_ENV, "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        split_k_enabled()


@contextlib.contextmanager
def fp32_pair(arch):
    target, drafter = trained_pair(arch)
    target.to(torch.float32)
    drafter.to(torch.float32)
    fold_hf.generation.release_fast_state(target)  # an earlier test's engine holds fp64 caches
    try:
        yield target, drafter
    finally:
        target.to(torch.float64)
        drafter.to(torch.float64)
        fold_hf.generation.release_fast_state(target)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_engine_runs_the_skinny_gemms_for_decode_rows(arch, interpreter, monkeypatch):
    """Fused layers with the Triton GEMMs (interpreter) in place of F.linear: HF greedy's tokens, the unfused loop's
    acceptance lengths; the GEMMs see the AR step's 1 row and the verify block's rows, never a prefill chunk."""
    import fold_hf.kernels as kernels

    seen = []
    original = with_skinny_gemms(monkeypatch, seen)
    monkeypatch.setenv("FOLD_HF_FUSED_DRAFTER", "0")
    kw = dict(engine="static", target_attention="triton", fused_layers=True)
    with fp32_pair(arch) as (target, drafter):
        ids = tiny_prompt(3, 40)
        expected = greedy_reference(target, ids, 8)
        assert torch.equal(fast_generate(target, None, input_ids=ids, max_new_tokens=8, **kw), expected)
        assert seen and set(seen) == {1}, seen
        fold_hf.generation.release_fast_state(target)
        seen.clear()
        res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=8, return_stats=True,
                            fold_config=mode_config("fold"), **kw)
        assert torch.equal(res.sequences, expected)
        block = drafter.config.block_size
        assert seen and max(seen) == block and ids.shape[1] not in seen, seen
        monkeypatch.setattr(kernels, "default_layer_ops", original)
        fold_hf.generation.release_fast_state(target)
        plain = fast_generate(target, drafter, input_ids=ids, max_new_tokens=8, return_stats=True,
                              fold_config=mode_config("fold"), **kw)
        assert res.acceptance_lengths == plain.acceptance_lengths


@pytest.mark.gpu(reason="bf16 and the 8B shapes: the interpreter has no bf16 dot and is too slow at 4096-wide rows")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gemms_match_the_float64_product_on_gpu(dtype):
    shapes = [(1, 6144, 4096, False), (1, 4096, 14336, False), (10, 28672, 4096, False), (16, 4096, 4096, True),
              (1, 1030, 4100, True), (7, 4098, 1000, False),
              # issue 39: Qwen3.5-9B's merged in_proj_qkv|z|b|a (12,352 rows) at 1 and 16 rows; the Gemma-4-12B-like
              # global q|k (10,240 x 3,840) at the 7-row verify and down_proj (K = 15,360) at one row
              (1, 12352, 4096, False), (16, 12352, 4096, False), (7, 10240, 3840, False), (1, 3840, 15360, False)]
    from fold_hf.kernels.gemm.triton import skinny_linear_triton

    check_gemms("cuda", dtype, shapes)
    with pytest.MonkeyPatch.context() as patch:  # issue 39's split-K plan at the verify block's shapes
        patch.setenv("FOLD_HF_SKINNY_SPLIT_K", "1")
        check_gemms("cuda", dtype, [(16, 4096, 4096, True), (16, 4096, 12288, False), (10, 12352, 4096, False),
                                    (7, 4098, 1000, True)], gate_up=False)
    x = randn(1, 1, 4096, dtype=dtype, device="cuda")
    w = randn(6144, 4096, dtype=dtype, device="cuda", scale=1 / 64)
    # against cuBLAS: one rounding of an fp32 sum either way
    assert rel_err(skinny_linear_triton(x, w), F.linear(x, w)) < (1e-2 if dtype == torch.bfloat16 else 1e-6)


@pytest.mark.gpu(reason="CUDA graphs: the graphs engine with the skinny GEMMs captures on a CUDA device")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_engine_with_skinny_gemms_matches_cublas_on_gpu(arch, monkeypatch):
    check_graph_engine_settings(arch, monkeypatch, "FOLD_HF_SKINNY_GEMM", ("1", "0"), [(90, 1), (91, 300), (92, 700)])


def test_gemm_benchmark_dry_run_writes_its_rows(interpreter, tmp_path):
    """``benchmarks/skinny_gemm_bench.py --dry-run``: tiny shapes in the interpreter, every row checked against
    F.linear (relative error in the CSV), cuBLAS and the sweep for each row count."""
    import csv
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "skinny_gemm_bench.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--dry-run", "--rows", "1,3", "--split-k"],
                   check=True, capture_output=True)
    rows = list(csv.DictReader((tmp_path / "skinny_gemm.csv").open()))
    assert {r["rows"] for r in rows} == {"1", "3"} and {r["shape"] for r in rows} == {"qkv", "gate_up_silu"}
    assert any(r["method"] == "cublas" for r in rows) and any(r["method"].startswith("triton") for r in rows)
    # --split-k: the library's split plan and a forced count, for several rows of the plain product only
    split = [r for r in rows if r["method"].startswith("triton split")]
    assert {(r["shape"], r["rows"]) for r in split} == {("qkv", "3")} and len(split) == 2
    assert all(float(r["rel_err"]) < 1e-5 for r in split)
    assert all(float(r["rel_err"]) < 1e-5 for r in rows), [r["rel_err"] for r in rows]
