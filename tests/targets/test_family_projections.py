"""Qwen3.5 and Gemma fused layers with the Llama family's projection machinery (issue 39).

What runs: the input projections merged into one GEMM over a buffer the model's own parameters become views of
(:mod:`fold_hf.targets.weight_layout`: Qwen3.5's ``in_proj_qkv|in_proj_z|in_proj_b|in_proj_a`` and q|k|v, Gemma's
q|k|v, q|k with ``attention_k_eq_v``, q alone on a KV-shared layer; gate|up), and a decode step's products through
the skinny GEMMs (Triton's interpreter here, in place of the CUDA launch) by the Llama family's rule.

Independent statements: transformers' own forward (logits, fp32) and its greedy ``generate`` (tokens).

* CPU: the fused step's logits (a verify block, a rejected block, an AR step) equal the model's with the merged
  projections on F.linear, and the parameters are views of one buffer per merge;
* interpreter: the same with the skinny GEMMs, which see the AR step's one row and the verify block's rows, and the
  fast loop's greedy SD output equals transformers' greedy;
* a projection wrapped as an adapter does (PEFT's way) runs as its module, warned once naming it;
* GPU (``@pytest.mark.gpu``): the graphs engine with the skinny GEMMs against cuBLAS (``$FOLD_HF_SKINNY_GEMM``) and
  with the merged projections against the modules (``$FOLD_HF_CONCAT_PROJECTIONS``), HF greedy's tokens.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import fold_hf
from fold_hf.targets import gemma
from fold_hf.targets.registry import build_static_target
from fold_hf.targets.weight_layout import rows_of_one_buffer
from tiny import (MASK_ID, check_graph_engine_settings, greedy_reference, tiny_drafter, tiny_target,
                  with_skinny_gemms)

transformers = pytest.importorskip("transformers")
ARCHS = ["gemma3", "gemma4", "gemma4_shared", "gemma4_moe"]
if hasattr(transformers, "Qwen3_5TextConfig"):
    ARCHS = ["qwen35", "qwen35_moe"] + ARCHS
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32: the merged GEMM sums each output as the module's does
SKINNY_TOL = dict(rtol=1e-4, atol=1e-4)  # the skinny GEMM sums K in another order (fp32 accumulation)


@pytest.fixture(autouse=True)
def small_ring(monkeypatch):
    monkeypatch.setattr(gemma, "RING_SLACK", 3)
    monkeypatch.delenv("FOLD_HF_CONCAT_PROJECTIONS", raising=False)


def prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(900 + seed))


def merges_of(runner) -> list:
    return [m for i in range(len(runner.layers)) for m in runner.merged_projections(i) if m is not None]


def check_fused_step(arch: str, tol: dict) -> None:
    """Prefill, a verify block rejected after its first row, the true block, then one AR step: the fused step's
    logits equal the model's forward over the whole sequence (fp32)."""
    target = tiny_target(arch, seed=3, dtype=torch.float32)
    P, L = 29, 4
    ids = prompt(len(arch), P + 2 * L + 1)
    with torch.no_grad():
        want = target(ids).logits[0]
    runner = build_static_target(target, capacity=64)
    runner.prefill(ids[:, :P], chunk=16)

    def step(rows, start):
        return runner.forward_static(rows, torch.arange(start, start + rows.shape[1]), 64, attention="triton",
                                     fused=True)

    block = ids[:, P : P + L].clone()
    block[0, 1:] = (block[0, 1:] + 1) % MASK_ID
    step(block, P)
    runner.accept(0)
    torch.testing.assert_close(step(ids[:, P + 1 : P + 1 + L], P + 1), want[P + 1 : P + 1 + L], **tol)
    runner.accept(L - 1)
    torch.testing.assert_close(step(ids[:, P + 1 + L : P + 2 + L], P + 1 + L), want[P + 1 + L : P + 2 + L], **tol)
    merges = merges_of(runner)
    assert merges, arch
    for merged in merges:  # the modules' parameters are the merged buffer's row blocks, nothing held twice
        weights = [p for p in merged.owners if p.dim() == 2]
        assert rows_of_one_buffer([w.data for w in weights]) is not None
        assert merged.weight.data_ptr() == weights[0].data_ptr() and sum(merged.widths) == merged.weight.shape[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_step_with_merged_projections_gives_the_models_logits(arch):
    check_fused_step(arch, TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_step_with_skinny_gemms_gives_the_models_logits(arch, interpreter, monkeypatch):
    seen = []
    with_skinny_gemms(monkeypatch, seen)
    check_fused_step(arch, SKINNY_TOL)
    assert {1, 4} <= set(seen) and max(seen) <= 4, seen  # the AR row and the verify rows; the prefill is the model's


@pytest.mark.parametrize("arch", [a for a in ("qwen35", "gemma4") if a in ARCHS])
def test_greedy_sd_with_skinny_gemms_equals_transformers_greedy(arch, interpreter, monkeypatch):
    """The fast loop (static engine, fused layers with the skinny GEMMs) speculating with an untrained drafter (every
    round rejects somewhere) and alone: transformers' greedy tokens."""
    seen = []
    with_skinny_gemms(monkeypatch, seen)
    monkeypatch.setenv("FOLD_HF_FUSED_DRAFTER", "0")
    target = tiny_target(arch, seed=4, dtype=torch.float32)
    drafter = tiny_drafter(target, taps=(1, 3)).to(torch.float32)
    ids = prompt(7, 33)
    expected = greedy_reference(target, ids, 12)
    kw = dict(input_ids=ids, max_new_tokens=12, engine="static", target_attention="triton", fused_layers=True)
    assert torch.equal(fold_hf.fast_generate(target, drafter, **kw), expected)
    assert max(seen) == drafter.config.block_size, seen
    fold_hf.generation.release_fast_state(target)
    seen.clear()
    assert torch.equal(fold_hf.fast_generate(target, None, **kw), expected)
    assert set(seen) == {1}, seen
    fold_hf.generation.release_fast_state(target)


@pytest.mark.skipif("qwen35" not in ARCHS, reason="this transformers has no Qwen3.5")
def test_greedy_sd_with_the_triton_gated_delta_kernels_equals_transformers_greedy(interpreter, monkeypatch):
    """The fused Qwen3.5 layers with every hybrid op a Triton kernel (the interpreter here): the chunked Gated
    DeltaNet verify over the drafter's blocks, its one-token form in AR steps, the commit replaying the kept writes
    after every rejection. The fused step's logits after a rejected and an accepted block equal the model's, and the
    fast loop speculating with an untrained drafter (every round rejects somewhere) and alone gives transformers'
    greedy tokens."""
    import fold_hf.kernels as kernels

    rows = []

    def triton_hybrid_ops(device):
        ops = {}
        for op, package in kernels.HYBRID_OP_PACKAGES.items():
            fn = getattr(kernels.import_triton_module(f"{package}.triton"), f"{op}_triton")
            if op == "gated_delta_verify":
                fn = (lambda f: lambda qkv, *a, **k: (rows.append(qkv.shape[0]), f(qkv, *a, **k))[1])(fn)
            ops[op] = fn
        return kernels.HybridOps("triton", **ops)

    monkeypatch.setattr(kernels, "default_hybrid_ops", triton_hybrid_ops)
    check_fused_step("qwen35", SKINNY_TOL)  # logits of a rejected block, the true block and an AR step after it
    assert sorted(set(rows)) == [1, 4], rows
    rows.clear()
    monkeypatch.setenv("FOLD_HF_FUSED_DRAFTER", "0")
    target = tiny_target("qwen35", seed=5, dtype=torch.float32)
    drafter = tiny_drafter(target, taps=(1, 3)).to(torch.float32)
    ids = prompt(8, 27)
    expected = greedy_reference(target, ids, 10)
    kw = dict(input_ids=ids, max_new_tokens=10, engine="static", target_attention="triton", fused_layers=True)
    assert torch.equal(fold_hf.fast_generate(target, drafter, **kw), expected)
    assert drafter.config.block_size in rows, rows  # the chunked verify ran
    fold_hf.generation.release_fast_state(target)
    rows.clear()
    assert torch.equal(fold_hf.fast_generate(target, None, **kw), expected)
    assert set(rows) == {1}, rows
    fold_hf.generation.release_fast_state(target)


class WithDelta(nn.Linear):
    """An adapter-style Linear subclass adding a delta (as LoRA does): must run as its module."""

    def forward(self, x):
        return super().forward(x) + 0.5 * x[..., :1]  # any widths


@pytest.mark.parametrize("arch,owner,name", [("qwen35", "linear_attn", "in_proj_z"), ("gemma4", "mlp", "up_proj")])
def test_wrapped_projection_runs_as_its_module(arch, owner, name, monkeypatch):
    from fold_hf.targets import weight_layout

    if arch not in ARCHS:
        pytest.skip("this transformers has no Qwen3.5")
    target = tiny_target(arch, seed=5, dtype=torch.float32)
    module = getattr(target.model.layers[0], owner)
    old = getattr(module, name)
    wrapped = WithDelta(old.in_features, old.out_features, bias=False, dtype=old.weight.dtype)
    wrapped.weight.data.copy_(old.weight.data)
    setattr(module, name, wrapped)
    monkeypatch.setattr(weight_layout, "_WARNED", set())
    ids = prompt(11, 21)
    with torch.no_grad():
        want = target(ids).logits[0]
    runner = build_static_target(target, capacity=32)
    runner.prefill(ids[:, :17])
    with pytest.warns(UserWarning, match=f"{name} is a .*WithDelta"):
        got = runner.forward_static(ids[:, 17:], torch.arange(17, 21), 32, attention="triton", fused=True)
    torch.testing.assert_close(got, want[17:], **TOL)
    assert runner.merged_projections(1)[0] is not None  # the other layers keep their merged GEMMs


@pytest.mark.gpu(reason="CUDA graphs and the skinny GEMMs' CUDA launch")
@pytest.mark.parametrize("arch", [a for a in ("qwen35", "gemma4", "gemma4_shared") if a in ARCHS])
@pytest.mark.parametrize("env,values", [("FOLD_HF_SKINNY_GEMM", ("1", "0")),
                                        ("FOLD_HF_CONCAT_PROJECTIONS", ("1", "0"))])
def test_graph_engine_with_merged_skinny_projections_matches_on_gpu(arch, env, values, monkeypatch):
    check_graph_engine_settings(arch, monkeypatch, env, values, [(90, 1), (91, 300)])
