"""The target's verify attention ``target_attention="triton"`` (the default on CUDA): the decode kernel
``decode_attention_triton`` and its torch twin compute causal attention over the cache prefix plus the block, and
the fast loop using them gives the same tokens and acceptance lengths as the bucket attention.

* CPU (runs in CI): the twin against plain causal SDPA over the concatenated keys; the static engine with
  ``target_attention="triton"`` (which runs the twin off CUDA) is lossless against HF greedy on tiny models.
* Triton interpreter (``TRITON_INTERPRET=1``, Triton installed, no CUDA): the kernel against the twin.
* GPU (``@pytest.mark.gpu``): the kernel over odd shapes and long contexts, in a CUDA graph with new lengths,
  and the graphs engine with the decode kernel against the bucket attention.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import fold_hf
from fold_hf.generation import fast_generate
from fold_hf.kernels import decode_attention_reference
from tiny import greedy_reference, mode_config, pair_on_gpu, trained_pair
from tiny import prompt as tiny_prompt

TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 1e-2}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def decode_inputs(T, L, Hq, Hkv, head_dim, dtype, device="cpu", capacity=None, seed=0):
    """Random rotated query ``[1, Hq, L, Dh]``, cache buffers ``[1, Hkv, capacity, Dh]`` (garbage past ``T``)
    and block keys/values ``[1, Hkv, L, Dh]``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    capacity = capacity or T + L

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)

    return dict(query=rand(1, Hq, L, head_dim), context_keys=rand(1, Hkv, capacity, head_dim),
                context_values=rand(1, Hkv, capacity, head_dim), block_keys=rand(1, Hkv, L, head_dim),
                block_values=rand(1, Hkv, L, head_dim))


def sdpa_over_concatenation(inputs: dict, T: int, scaling: float) -> torch.Tensor:
    """Plain causal SDPA of the block over ``cache[:T] ++ block``: ``[1, L, Hq, Dv]``."""
    q = inputs["query"].double()
    keys = torch.cat((inputs["context_keys"][:, :, :T], inputs["block_keys"]), dim=2).double()
    values = torch.cat((inputs["context_values"][:, :, :T], inputs["block_values"]), dim=2).double()
    L = q.shape[2]
    visible = torch.ones(L, T + L, dtype=torch.bool, device=q.device).tril(diagonal=T)  # row r sees keys < T + r + 1
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)


# ---------------------------------------------------------------------------------------------------- CPU (CI)
@pytest.mark.parametrize("L", [1, 3, 10, 16])
@pytest.mark.parametrize("T", [0, 1, 63, 500])
@pytest.mark.parametrize("Hq, Hkv", [(8, 2), (4, 4)])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_twin_is_causal_attention_over_prefix_and_block(L, T, Hq, Hkv, as_tensor):
    inputs = decode_inputs(T, L, Hq, Hkv, 16, torch.float64, capacity=T + L + 7, seed=T + L)
    length = torch.tensor([T], dtype=torch.int32) if as_tensor else T
    got = decode_attention_reference(**inputs, context_length=length, scaling=0.3)
    assert got.shape == (1, L, Hq, 16) and got.dtype == torch.float64
    assert rel_err(got, sdpa_over_concatenation(inputs, T, 0.3)) < 1e-12


def test_twin_ignores_cache_entries_past_the_length():
    inputs = decode_inputs(50, 4, 4, 2, 16, torch.float32, capacity=80)
    expected = decode_attention_reference(**inputs, context_length=50, scaling=0.25)
    inputs["context_keys"][:, :, 50:] = float("nan")
    inputs["context_values"][:, :, 50:] = 1e6
    got = decode_attention_reference(**inputs, context_length=torch.tensor([50]), scaling=0.25)
    torch.testing.assert_close(got, expected)


def prompt(seed: int, length: int) -> torch.Tensor:
    return tiny_prompt(seed, length, offset=3000)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_engine_with_the_opt_in_is_lossless(arch):
    target, drafter = trained_pair(arch)
    rounds = []
    for seed, length in enumerate([10, 300]):
        ids = prompt(seed, length)
        expected = greedy_reference(target, ids, 40)
        ar = fast_generate(target, None, input_ids=ids, max_new_tokens=40, engine="static", target_attention="triton")
        assert torch.equal(ar, expected), (arch, length)
        ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=40, return_stats=True,
                               fold_config=mode_config("fold"))
        res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=40, return_stats=True, engine="static",
                            fold_config=mode_config("fold"), target_attention="triton")
        assert torch.equal(res.sequences, expected), (arch, length)
        assert res.acceptance_lengths == ref.acceptance_lengths, (arch, length)
        rounds += res.acceptance_lengths
    assert max(rounds) >= 2 and min(rounds) == 1, rounds  # multi-token rounds and rollbacks both happened


def test_target_attention_comes_from_the_environment_and_is_checked(monkeypatch):
    target, _ = trained_pair("llama")
    ids = prompt(5, 20)
    expected = greedy_reference(target, ids, 8)
    monkeypatch.setenv("FOLD_HF_TARGET_ATTENTION", "triton")
    assert torch.equal(fast_generate(target, None, input_ids=ids, max_new_tokens=8, engine="static"), expected)
    monkeypatch.setenv("FOLD_HF_TARGET_ATTENTION", "flash")
    with pytest.raises(ValueError, match="target_attention"):
        fast_generate(target, None, input_ids=ids, max_new_tokens=8, engine="static")
    with pytest.raises(ValueError, match="target_attention"):
        fast_generate(target, None, input_ids=ids, max_new_tokens=8, engine="static", target_attention="sdpa")


# ---------------------------------------------------------------------------------------------------- kernel
def kernel_vs_twin(T, L, Hq, Hkv, head_dim, dtype, device, capacity=None, as_tensor=False, num_splits=None,
                   max_context_length=None, seed=0):
    from fold_hf.kernels.fold_read.triton import decode_attention_triton

    inputs = decode_inputs(T, L, Hq, Hkv, head_dim, dtype, device=device, capacity=capacity, seed=seed)
    scaling = head_dim**-0.5
    oracle = decode_attention_reference(**{k: v.double() for k, v in inputs.items()}, context_length=T,
                                        scaling=scaling)
    length = torch.tensor([T], dtype=torch.int32, device=device) if as_tensor else T
    out = decode_attention_triton(**inputs, context_length=length, scaling=scaling, num_splits=num_splits,
                                  max_context_length=max_context_length)
    assert out.shape == (1, L, Hq, head_dim) and out.dtype == dtype
    return out, oracle


# the interpreter has no bf16 dot, so it checks fp32 and fp16
INTERPRETER_CASES = [
    dict(T=0, L=3, Hq=4, Hkv=2, head_dim=16),
    dict(T=1, L=1, Hq=4, Hkv=1, head_dim=16),
    dict(T=63, L=10, Hq=8, Hkv=2, head_dim=32, num_splits=3),
    dict(T=150, L=16, Hq=2, Hkv=2, head_dim=16, num_splits=4),
    dict(T=90, L=3, Hq=6, Hkv=2, head_dim=24, capacity=200, as_tensor=True, num_splits=3),
    dict(T=130, L=1, Hq=4, Hkv=1, head_dim=16, capacity=256, as_tensor=True, max_context_length=160),
    dict(T=40, L=7, Hq=4, Hkv=1, head_dim=512),  # Gemma-4 global layers: head_dim 512, few KV heads, block 7
]


@pytest.mark.parametrize("case", INTERPRETER_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernel_in_interpreter_matches_twin(interpreter, case, dtype):
    out, oracle = kernel_vs_twin(**case, dtype=dtype, device="cpu")
    assert rel_err(out, oracle) < TOLERANCE[dtype]


@pytest.mark.gpu(reason="8B shapes and 32K contexts in bf16: too slow and no bf16 dot in the interpreter (it checks "
                        "small shapes)")
@pytest.mark.parametrize("L", [1, 3, 10, 16])
@pytest.mark.parametrize("T", [1, 63, 500, 8191, 32768])
@pytest.mark.parametrize("Hq, Hkv, head_dim", [(32, 8, 128), (12, 3, 96), (5, 5, 64), (16, 4, 512), (16, 4, 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernel_matches_twin_on_gpu(L, T, Hq, Hkv, head_dim, dtype):
    out, oracle = kernel_vs_twin(T, L, Hq, Hkv, head_dim, dtype, "cuda", seed=T + L)
    assert rel_err(out, oracle) < TOLERANCE[dtype]
    # device length inside a larger buffer, splits sized for a bucket or for the whole buffer
    for max_context_length in (T + L, None):
        out, oracle = kernel_vs_twin(T, L, Hq, Hkv, head_dim, dtype, "cuda", capacity=T + L + 300, as_tensor=True,
                                     max_context_length=max_context_length, seed=T + L + 1)
        assert rel_err(out, oracle) < TOLERANCE[dtype], max_context_length


@pytest.mark.parametrize("merge_kw", [dict(merge_dv_block=16), dict(merge_early_acc=False),
                                      dict(merge_dv_block=32, merge_warps=2, merge_early_acc=True)])
def test_merge_launch_shapes_in_interpreter_match_twin(interpreter, merge_kw):
    from fold_hf.kernels.fold_read.triton import decode_attention_triton

    inputs = decode_inputs(90, 3, 6, 2, 64, torch.float32, device="cpu", capacity=200, seed=5)
    oracle = decode_attention_reference(**{k: v.double() for k, v in inputs.items()}, context_length=90,
                                        scaling=0.125)
    out = decode_attention_triton(**inputs, context_length=torch.tensor([90], dtype=torch.int32), scaling=0.125,
                                  num_splits=5, **merge_kw)
    assert rel_err(out, oracle) < TOLERANCE[torch.float32]


@pytest.mark.gpu(reason="the merge's launch shapes compiled for the GPU at the 8B decode shape (32K, 33 splits)")
@pytest.mark.parametrize("merge_kw", [dict(), dict(merge_dv_block=32), dict(merge_dv_block=64),
                                      dict(merge_early_acc=False), dict(merge_warps=4)])
@pytest.mark.parametrize("L", [1, 10])
def test_merge_launch_shapes_on_gpu(merge_kw, L):
    from fold_hf.kernels.fold_read.triton import decode_attention_triton

    inputs = decode_inputs(32768 - L, L, 32, 8, 128, torch.bfloat16, device="cuda", capacity=32768, seed=L)
    oracle = decode_attention_reference(**{k: v.double() for k, v in inputs.items()}, context_length=32768 - L,
                                        scaling=128**-0.5)
    out = decode_attention_triton(**inputs, context_length=torch.tensor([32768 - L], dtype=torch.int32,
                                                                        device="cuda"),
                                  scaling=128**-0.5, **merge_kw)
    assert rel_err(out, oracle) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu(reason="num_stages software pipelining is a GPU compilation setting the interpreter ignores")
@pytest.mark.parametrize("num_stages", [1, 2, 3])
@pytest.mark.parametrize("num_splits", [1, 7, None])
def test_kernel_pipelining_and_splits_on_gpu(num_stages, num_splits):
    from fold_hf.kernels.fold_read.triton import decode_attention_triton

    for T, L in ((4097, 10), (777, 1)):
        inputs = decode_inputs(T, L, 32, 8, 128, torch.bfloat16, device="cuda", seed=T)
        oracle = decode_attention_reference(**{k: v.double() for k, v in inputs.items()}, context_length=T,
                                            scaling=128**-0.5)
        out = decode_attention_triton(**inputs, context_length=T, scaling=128**-0.5, num_splits=num_splits,
                                      num_stages=num_stages)
        assert rel_err(out, oracle) < TOLERANCE[torch.bfloat16], (T, L)


@pytest.mark.gpu(reason="CUDA graphs: capture once, replay with new device-side lengths")
def test_kernel_replays_in_a_cuda_graph_with_new_lengths():
    from fold_hf.kernels.fold_read.triton import decode_attention_triton

    capacity, L = 4096, 10
    inputs = decode_inputs(0, L, 16, 4, 64, torch.bfloat16, device="cuda", capacity=capacity)
    length = torch.tensor([3000], dtype=torch.long, device="cuda")  # the fast loop's state is long
    decode_attention_triton(**inputs, context_length=length, scaling=0.125)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = decode_attention_triton(**inputs, context_length=length, scaling=0.125)
    for T in (3000, 0, 100, 2100, capacity - L):
        length.fill_(T)
        graph.replay()
        expected = decode_attention_reference(**{k: v.double() for k, v in inputs.items()}, context_length=T,
                                              scaling=0.125)
        assert rel_err(captured, expected) < 1e-2, T


@pytest.mark.gpu(reason="CUDA graphs: the graphs engine with the decode kernel")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_engine_with_the_decode_kernel_matches_the_bucket_attention_on_gpu(arch):
    with pair_on_gpu(arch) as (target, drafter):
        # prompts around the 256-token attention buckets, so the verify graph changes bucket mid-request
        for seed, length in enumerate([10, 230, 300, 700]):
            ids = prompt(seed, length).cuda()
            for engine in ("static", "graphs"):
                bucket_ar = fast_generate(target, None, input_ids=ids, max_new_tokens=40, engine=engine,
                                           target_attention="bucket")
                ar = fast_generate(target, None, input_ids=ids, max_new_tokens=40, engine=engine,
                                   target_attention="triton")
                assert torch.equal(ar, bucket_ar), (arch, length, engine)
                assert torch.equal(ar, greedy_reference(target, ids, 40)), (arch, length, engine)
                for mode in ("fold", "dflash"):
                    kw = dict(input_ids=ids, max_new_tokens=40, return_stats=True, fold_config=mode_config(mode),
                              engine=engine)
                    bucket = fast_generate(target, drafter, **kw, target_attention="bucket")
                    res = fast_generate(target, drafter, **kw, target_attention="triton")
                    assert torch.equal(res.sequences, bucket.sequences), (arch, mode, length, engine)
                    assert res.acceptance_lengths == bucket.acceptance_lengths, (arch, mode, length, engine)


# ---------------------------------------------------------------------------------------------------- rows
def rows_vs_sdpa(reads, L, Hq, Hkv, head_dim, dtype, device, batch=4, capacity=200, max_context_length=None,
                 num_splits=None, seed=5):
    """``decode_attention_rows_triton`` over ``reads`` = ``[(cache_row, T), ...]`` of one ``[batch, Hkv, capacity,
    Dh]`` cache, and each read's causal SDPA over its own ``cache[:T] ++ block`` in fp64."""
    from fold_hf.kernels.fold_read.triton import decode_attention_rows_triton

    g = torch.Generator(device="cpu").manual_seed(seed)
    A = len(reads)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)

    query, block_keys, block_values = rand(A, Hq, L, head_dim), rand(A, Hkv, L, head_dim), rand(A, Hkv, L, head_dim)
    keys, values = rand(batch, Hkv, capacity, head_dim), rand(batch, Hkv, capacity, head_dim)
    scaling = head_dim**-0.5
    oracles = [sdpa_over_concatenation(dict(query=query[a : a + 1], context_keys=keys[row : row + 1],
                                            context_values=values[row : row + 1], block_keys=block_keys[a : a + 1],
                                            block_values=block_values[a : a + 1]), T, scaling)[0]
               for a, (row, T) in enumerate(reads)]
    out = decode_attention_rows_triton(query, keys, values, block_keys, block_values,
                                       torch.tensor([T for _, T in reads], dtype=torch.int32, device=device),
                                       torch.tensor([row for row, _ in reads], dtype=torch.int32, device=device),
                                       scaling=scaling, num_splits=num_splits, max_context_length=max_context_length)
    assert out.shape == (A, L, Hq, head_dim) and out.dtype == dtype
    return out, torch.stack(oracles)


ROWS_CASES = [
    dict(reads=[(2, 0), (0, 63), (3, 150)], L=4, Hq=4, Hkv=2, head_dim=16, num_splits=3),
    dict(reads=[(1, 190), (0, 1)], L=1, Hq=8, Hkv=2, head_dim=32, max_context_length=196),
    dict(reads=[(3, 40), (2, 41), (1, 7)], L=7, Hq=4, Hkv=1, head_dim=64),
]


@pytest.mark.parametrize("case", ROWS_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rows_kernel_in_interpreter_is_each_rows_own_attention(interpreter, case, dtype):
    """One launch over several rows of a batch (each its cache row and length, from the device) gives every row the
    causal attention over its own prefix and block (fp64 SDPA)."""
    out, oracle = rows_vs_sdpa(**case, dtype=dtype, device="cpu")
    for a in range(len(case["reads"])):
        assert rel_err(out[a], oracle[a]) < TOLERANCE[dtype], a


@pytest.mark.gpu(reason="bf16 at the Llama-3.1-8B and Gemma-3 global shapes, contexts to 32K")
@pytest.mark.parametrize("Hq, Hkv, head_dim", [(32, 8, 128), (4, 1, 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rows_kernel_is_each_rows_own_attention_on_gpu(Hq, Hkv, head_dim, dtype):
    reads = [(5, 32760), (0, 700), (7, 1), (2, 8191)]
    out, oracle = rows_vs_sdpa(reads, 8, Hq, Hkv, head_dim, dtype, "cuda", batch=8, capacity=32784,
                               max_context_length=32768 + 16)
    for a in range(len(reads)):
        assert rel_err(out[a], oracle[a].to(out.device)) < TOLERANCE[dtype], a


@pytest.mark.parametrize("rope", ["rows", "per_row"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_batchs_verify_attends_every_row_in_one_launch_as_row_by_row(interpreter, arch, rope):
    """The Llama family's fused layers over rows (``forward_rows_static``, a batch's verify) with every row's
    attention of a layer in one ``decode_attention_rows_triton`` launch pair (the default on CUDA) against the same
    forward attending row by row with ``decode_attention_triton`` (held to SDPA by the kernel tests above), in Triton's
    interpreter, fp32: three rows of a 4-row cache (rows 3, 0, 2) at lengths 5, 31 and 17, blocks of 4, the rows'
    rope and cache writes in one ``rope_write_rows_triton`` launch (``rope="rows"``) or one per row; the logits
    and the rows' cache entries agree to fp32 rounding."""
    from fold_hf.kernels.fold_read.triton import decode_attention_rows_triton, decode_attention_triton
    from fold_hf.kernels.layer.triton import rope_write_rows_triton
    from fold_hf.targets.base import bucket_length
    from fold_hf.targets.llama import LlamaStaticTarget
    from tiny import tiny_target

    target = tiny_target(arch, layers=2, dtype=torch.float32)
    starts, rows, L = [5, 31, 17], [3, 0, 2], 4
    seqs = [tiny_prompt(40 + a, n + L) for a, n in enumerate(starts)]
    logits, caches = {}, {}
    for name, rows_kernel in (("row_by_row", None), ("rows", decode_attention_rows_triton)):
        runner = LlamaStaticTarget(target, 64, batch=4)
        for seq, n, row in zip(seqs, starts, rows):
            runner.prefill(seq[:, :n], row=row)
        runner._fused_ops(False)
        runner._decode_attention, runner._decode_rows = decode_attention_triton, rows_kernel
        runner._layer_ops.rope_write_rows = rope_write_rows_triton if rows_kernel and rope == "rows" else None
        ids = torch.cat([seq[:, n:] for seq, n in zip(seqs, starts)])
        positions = torch.tensor(starts)[:, None] + torch.arange(L)
        logits[name] = runner.forward_rows_static(ids, positions, rows, bucket_length(max(starts) + L, 64))
        caches[name] = [runner.keys[i][rows].clone() for i in range(len(runner.keys))]
    assert logits["rows"].shape == (3, L, target.config.vocab_size)
    torch.testing.assert_close(logits["rows"], logits["row_by_row"], rtol=1e-4, atol=1e-4)
    for mine, theirs in zip(caches["rows"], caches["row_by_row"]):  # the second layer's entries carry the first
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)  # layer's fp32 rounding
