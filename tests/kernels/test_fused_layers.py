"""The target's fused layers in the fast loop (``fused_layers``): residual add + RMSNorm, rope + cache write and
``silu(gate) * up`` as single kernels (:mod:`fold_hf.kernels.layer.triton`) beside their torch twins
(:mod:`fold_hf.kernels.layer.naive`).

* CPU (CI): the twins compute what the transformers modules compute, bit for bit; the static engine with fused
  layers (twins off CUDA) is lossless against HF greedy with the acceptance lengths of the foundation loop;
  bad settings and unsupported layers raise errors that say why.
* Triton interpreter (``TRITON_INTERPRET=1``): each kernel against its twin over odd shapes.
* GPU (``@pytest.mark.gpu``): the kernels against the twins in bf16/fp16/fp32 at odd and 8B shapes (the rope
  exactly), and the graphs engine with fused layers against the unfused path and HF greedy.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers.models.llama import modeling_llama

import fold_hf
from fold_hf.generation import fast_generate
from fold_hf.targets.base import UnsupportedTarget
from fold_hf.kernels.layer.naive import (
    add_rms_norm_reference,
    rope_write_reference,
    rotate_heads_reference,
    silu_mul_reference,
)
from fold_hf.kernels.fold_read.naive import rotate_by_tables
from tiny import greedy_reference, mode_config, pair_on_gpu, tiny_target, trained_pair
from tiny import prompt as tiny_prompt


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def randn(*shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def rope_inputs(L, Hq, Hkv, D, capacity, start, dtype, device="cpu", seed=0):
    positions = torch.arange(start, start + L, device=device)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
    angles = torch.arange(capacity).float()[:, None] * inv_freq[None]
    emb = torch.cat((angles, angles), dim=-1)
    return dict(query=randn(1, L, Hq, D, dtype=dtype, device=device, seed=seed),
                key=randn(1, L, Hkv, D, dtype=dtype, device=device, seed=seed + 1),
                value=randn(1, L, Hkv, D, dtype=dtype, device=device, seed=seed + 2),
                cos_table=emb.cos().to(device=device, dtype=dtype), sin_table=emb.sin().to(device=device, dtype=dtype),
                positions=positions,
                key_cache=randn(1, Hkv, capacity, D, dtype=dtype, device=device, seed=seed + 3),
                value_cache=randn(1, Hkv, capacity, D, dtype=dtype, device=device, seed=seed + 4))


def run_rope(fn, inputs):
    inputs = {k: v.clone() for k, v in inputs.items()}
    q, k, v = fn(**inputs)
    return q, k, v, inputs["key_cache"], inputs["value_cache"]


# ---------------------------------------------------------------------------------------------------- CPU (CI)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_twins_compute_what_the_modules_compute(dtype):
    H = 96
    norm = modeling_llama.LlamaRMSNorm(H, eps=1e-5).to(dtype)
    norm.weight.data = randn(H, dtype=dtype, seed=9)
    hidden, delta = randn(1, 5, H, dtype=dtype, seed=1, scale=3), randn(1, 5, H, dtype=dtype, seed=2)
    total, normed = add_rms_norm_reference(hidden, delta, norm.weight, norm.variance_epsilon)
    assert torch.equal(total, hidden + delta) and torch.equal(normed, norm(hidden + delta))

    inputs = rope_inputs(L=3, Hq=6, Hkv=2, D=16, capacity=20, start=7, dtype=dtype)
    before_keys = inputs["key_cache"].clone()
    q, k, v, keys, values = run_rope(rope_write_reference, inputs)
    cos, sin = inputs["cos_table"][7:10][None], inputs["sin_table"][7:10][None]
    q_hf, k_hf = modeling_llama.apply_rotary_pos_emb(inputs["query"].transpose(1, 2), inputs["key"].transpose(1, 2),
                                                     cos, sin)
    assert torch.equal(q, q_hf) and torch.equal(k, k_hf)
    assert torch.equal(keys[:, :, 7:10], k_hf) and torch.equal(values[:, :, 7:10], inputs["value"].transpose(1, 2))
    untouched = torch.ones(20, dtype=torch.bool)
    untouched[7:10] = False
    assert torch.equal(keys[:, :, untouched], before_keys[:, :, untouched])

    gate, up = randn(2, 3, 40, dtype=dtype, seed=4, scale=4), randn(2, 3, 40, dtype=dtype, seed=5)
    assert torch.equal(silu_mul_reference(gate, up), nn.SiLU()(gate) * up)


def prompt(seed: int, length: int) -> torch.Tensor:
    return tiny_prompt(seed, length, offset=4000)


FUSED_STATIC = dict(engine="static", target_attention="triton", fused_layers=True)
ALL_MODES = ("fold", "dflash", "window", "streaming", "rerope", "yarn")


def fused_rounds_equal_the_foundation_loops(target, drafter, ids, expected, mode: str, new_tokens: int) -> list[int]:
    """Decode ``ids`` in ``mode`` with the static engine's fused layers; assert the tokens are ``expected`` and the
    acceptance lengths are the foundation loop's (so the drafter saw the same tapped features); return them."""
    ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=new_tokens, return_stats=True,
                           fold_config=mode_config(mode))
    res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=new_tokens, return_stats=True,
                        fold_config=mode_config(mode), **FUSED_STATIC)
    assert torch.equal(res.sequences, expected), (ids.shape[1], mode)
    assert res.acceptance_lengths == ref.acceptance_lengths, (ids.shape[1], mode)
    return res.acceptance_lengths


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_engine_with_fused_layers_is_lossless(arch):
    target, drafter = trained_pair(arch)
    rounds = []
    for seed, length in enumerate([1, 17, 300]):
        ids = prompt(seed, length)
        expected = greedy_reference(target, ids, 40)
        assert torch.equal(fast_generate(target, None, input_ids=ids, max_new_tokens=40, **FUSED_STATIC), expected)
        for mode in ("fold", "dflash"):
            rounds += fused_rounds_equal_the_foundation_loops(target, drafter, ids, expected, mode, 40)
    assert max(rounds) >= 2 and min(rounds) == 1, rounds


@pytest.mark.parametrize("fused_drafter", [None, "1", "0"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_drafter_layers_give_the_foundation_loops_rounds(arch, fused_drafter, monkeypatch):
    """The drafter's static step with the fused ops (the default, ``FOLD_HF_FUSED_DRAFTER=1``; twins off CUDA)
    drafts exactly what its modules draft (``=0``), so the rounds equal the foundation loop's in every reading
    mode either way."""
    if fused_drafter is None:
        monkeypatch.delenv("FOLD_HF_FUSED_DRAFTER", raising=False)
    else:
        monkeypatch.setenv("FOLD_HF_FUSED_DRAFTER", fused_drafter)
    target, drafter = trained_pair(arch)
    fold_hf.generation.release_fast_state(target)  # a fresh session: only this test's static drafters in it
    for seed, length in enumerate([5, 120]):
        ids = prompt(20 + seed, length)
        expected = greedy_reference(target, ids, 30)
        for mode in ALL_MODES:
            fused_rounds_equal_the_foundation_loops(target, drafter, ids, expected, mode, 30)
    session = target.__dict__["_fold_fast_session"]
    fused = fused_drafter != "0"
    assert session.static_drafters and all(d is not None and (d.ops is not None) == fused
                                           for d in session.static_drafters.values())
    fold_hf.generation.release_fast_state(target)


def test_rotate_heads_twin_is_the_drafters_rotation():
    x = randn(1, 3, 4, 16, dtype=torch.bfloat16, seed=30)
    cos, sin = randn(3, 12, seed=31), randn(3, 12, seed=32)  # partial rotary: 12 of 16 channels
    want = (rotate_by_tables(x.transpose(1, 2), cos, sin) * 0.25).to(torch.bfloat16)
    assert torch.equal(rotate_heads_reference(x, cos, sin, 0.25, torch.bfloat16), want)


def test_fused_layers_settings_are_checked(monkeypatch):
    target, _ = trained_pair("llama")
    ids = prompt(7, 12)
    with pytest.raises(ValueError, match="target_attention='triton'"):
        fast_generate(target, None, input_ids=ids, max_new_tokens=4, engine="static", fused_layers=True)
    with pytest.raises(ValueError, match="engine='eager'"):
        fast_generate(target, None, input_ids=ids, max_new_tokens=4, engine="eager", target_attention="triton",
                      fused_layers=True)
    monkeypatch.setenv("FOLD_HF_FUSED_LAYERS", "yes")
    with pytest.raises(ValueError, match="FOLD_HF_FUSED_LAYERS"):
        fast_generate(target, None, input_ids=ids, max_new_tokens=4, engine="static", target_attention="triton")
    monkeypatch.setenv("FOLD_HF_FUSED_LAYERS", "1")
    expected = greedy_reference(target, ids, 6)
    assert torch.equal(fast_generate(target, None, input_ids=ids, max_new_tokens=6, engine="static",
                                     target_attention="triton"), expected)


def test_unsupported_layers_are_named():
    target = tiny_target("llama", seed=3, layers=2)
    target.model.layers[1].mlp.act_fn = nn.GELU()
    ids = prompt(8, 10)
    with pytest.raises(UnsupportedTarget, match="GELU"):
        fast_generate(target, None, input_ids=ids, max_new_tokens=4, engine="static", target_attention="triton",
                      fused_layers=True)
    # without the request the same target simply runs unfused
    expected = greedy_reference(target, ids, 4)
    assert torch.equal(fast_generate(target, None, input_ids=ids, max_new_tokens=4, engine="static",
                                     target_attention="triton"), expected)
    fold_hf.generation.release_fast_state(target)


# ------------------------------------------------------------------------------------------- kernels vs twins
def check_kernels(device, dtype, norm_shapes, rope_shapes, silu_shapes, exact_rope: bool):
    from fold_hf.kernels.layer.triton import add_rms_norm_triton, rope_write_triton, silu_mul_triton

    from fold_hf.kernels.layer.triton import rotate_heads_triton

    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    for L, H, D, R, scale in ((1, 4, 16, 16, 0.25), (3, 6, 24, 16, 1.0), (10, 32, 128, 128, 128**-0.5),
                              (7, 5, 96, 64, 0.1)):
        x = randn(1, L, H, D, dtype=dtype, device=device, seed=L * H + D)
        cos, sin = randn(L, R, device=device, seed=R), randn(L, R, device=device, seed=R + 1)
        got, want = rotate_heads_triton(x, cos, sin, scale, dtype), rotate_heads_reference(x, cos, sin, scale, dtype)
        assert got.shape == (1, H, L, D)
        if exact_rope:
            assert torch.equal(got, want), (L, H, D, R)
        else:
            assert rel_err(got, want) < tol, (L, H, D, R)
    for rows, H in norm_shapes:
        hidden = randn(1, rows, H, dtype=dtype, device=device, seed=H + rows, scale=5)
        delta = randn(1, rows, H, dtype=dtype, device=device, seed=H + rows + 1)
        weight = randn(H, dtype=dtype, device=device, seed=H)
        for d in (delta, None):
            total, normed = add_rms_norm_triton(hidden, d, weight, 1e-6)
            ref_total, ref_normed = add_rms_norm_reference(hidden, d, weight, 1e-6)
            assert torch.equal(total, ref_total), (rows, H)
            assert rel_err(normed, ref_normed) < tol, (rows, H, d is None)
    for L, Hq, Hkv, D, capacity, start in rope_shapes:
        inputs = rope_inputs(L, Hq, Hkv, D, capacity, start, dtype, device=device, seed=L + D)
        got = run_rope(rope_write_triton, inputs)
        want = run_rope(rope_write_reference, inputs)
        for name, a, b in zip(("q", "k", "v", "key_cache", "value_cache"), got, want):
            assert a.shape == b.shape, name
            if exact_rope:
                assert torch.equal(a, b), (name, L, Hq, Hkv, D)
            else:
                assert rel_err(a, b) < tol, (name, L, Hq, Hkv, D)
    for shape in silu_shapes:
        gate = randn(*shape, dtype=dtype, device=device, seed=sum(shape), scale=4)
        up = randn(*shape, dtype=dtype, device=device, seed=sum(shape) + 1)
        out, ref = silu_mul_triton(gate, up), silu_mul_reference(gate, up)
        assert rel_err(out, ref) < tol, shape
        if dtype != torch.float32:  # at most one rounding step apart, and nearly always identical
            assert (out != ref).float().mean().item() < 0.01, shape
    # fused projections: the heads of a q|k|v output and the halves of a gate|up output are read in place, with
    # the same result as from contiguous copies
    for L, Hq, Hkv, D in ((1, 4, 2, 16), (10, 6, 2, 24), (7, 8, 8, 64)):
        fused = randn(1, L, (Hq + 2 * Hkv) * D, dtype=dtype, device=device, seed=L + Hq, scale=3)
        weight = randn(D, dtype=dtype, device=device, seed=D)
        for start, heads in ((0, Hq), (Hq * D, Hkv), ((Hq + Hkv) * D, Hkv), (0, Hq + Hkv)):
            view = fused[..., start:start + heads * D].view(1, L, heads, D)
            assert L == 1 or not view.is_contiguous()
            _, normed = add_rms_norm_triton(view, None, weight, 1e-6)
            assert normed.is_contiguous() and torch.equal(normed,
                                                          add_rms_norm_triton(view.contiguous(), None, weight, 1e-6)[1])
            assert rel_err(normed, add_rms_norm_reference(view, None, weight, 1e-6)[1]) < tol, (L, start, heads)
        # the rope reads the heads of a q|k|v output in place, as from contiguous copies
        inputs = rope_inputs(L, Hq, Hkv, D, 3 * L + 4, 2, dtype, device=device, seed=L + D)
        q, k, v = fused.split((Hq * D, Hkv * D, Hkv * D), -1)
        inputs.update(query=q.view(1, L, Hq, D), key=k.view(1, L, Hkv, D), value=v.view(1, L, Hkv, D))
        got = run_rope(rope_write_triton, inputs)
        want = run_rope(rope_write_triton, {k: v.contiguous() for k, v in inputs.items()})
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (L, Hq, Hkv, D)
    for L, width in ((1, 100), (10, 1030), (3, 64)):
        gate, up = randn(1, L, 2 * width, dtype=dtype, device=device, seed=L + width, scale=4).split(width, -1)
        out = silu_mul_triton(gate, up)
        assert out.is_contiguous() and torch.equal(out, silu_mul_triton(gate.contiguous(), up.contiguous()))
        assert rel_err(out, silu_mul_reference(gate, up)) < tol, (L, width)


INTERPRETER_NORMS = [(1, 96), (3, 64), (2, 1000)]
INTERPRETER_ROPES = [(1, 4, 2, 16, 8, 7), (3, 6, 2, 24, 40, 11), (10, 8, 8, 64, 32, 0)]
INTERPRETER_SILU = [(1, 1, 100), (1, 3, 1030)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernels_in_interpreter_match_twins(interpreter, dtype):
    check_kernels("cpu", dtype, INTERPRETER_NORMS, INTERPRETER_ROPES, INTERPRETER_SILU,
                  exact_rope=dtype != torch.float16)


@pytest.mark.gpu(reason="bf16 and 8B shapes: the interpreter has no bf16 dot and is too slow at 4096-wide rows (it "
                        "checks odd shapes in fp32/fp16)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kernels_match_twins_on_gpu(dtype):
    norms = [(1, 4096), (10, 4096), (16, 8192), (3, 576), (7, 2880), (1, 63)]
    ropes = [(1, 32, 8, 128, 8192, 8191), (10, 32, 8, 128, 70000, 65535), (16, 12, 3, 96, 500, 63),
             (3, 9, 3, 64, 100, 0)]
    silu = [(1, 1, 14336), (1, 10, 14336), (1, 16, 1536), (1, 7, 63)]
    check_kernels("cuda", dtype, norms, ropes, silu, exact_rope=True)


@pytest.mark.gpu(reason="CUDA graphs: the graphs engine with the fused layers captures on a CUDA device")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_engine_with_fused_layers_matches_unfused_on_gpu(arch, monkeypatch):
    with pair_on_gpu(arch) as (target, drafter):
        for seed, length in enumerate([1, 230, 300, 700]):
            ids = prompt(seed, length).cuda()
            expected = greedy_reference(target, ids, 40)
            for fused in (True, False):
                ar = fast_generate(target, None, input_ids=ids, max_new_tokens=40, engine="graphs",
                                   target_attention="triton", fused_layers=fused)
                assert torch.equal(ar, expected), (arch, length, fused)
            for mode in ALL_MODES:
                kw = dict(input_ids=ids, max_new_tokens=40, return_stats=True, fold_config=mode_config(mode),
                          engine="graphs", target_attention="triton")
                monkeypatch.setenv("FOLD_HF_FUSED_DRAFTER", "0")  # fused target, drafter on its modules
                fused = fast_generate(target, drafter, **kw, fused_layers=True)
                unfused = fast_generate(target, drafter, **kw, fused_layers=False)
                assert torch.equal(fused.sequences, expected), (arch, mode, length)
                assert fused.acceptance_lengths == unfused.acceptance_lengths, (arch, mode, length)
                monkeypatch.delenv("FOLD_HF_FUSED_DRAFTER")  # the default: the drafter's step fused too
                fused_drafter = fast_generate(target, drafter, **kw, fused_layers=True)
                assert torch.equal(fused_drafter.sequences, expected), (arch, mode, length)
                assert fused_drafter.acceptance_lengths == unfused.acceptance_lengths, (arch, mode, length)


def test_fused_drafter_projections_hold_the_weights_once_and_save_as_before(tmp_path, monkeypatch):
    """The fused drafter step reads q|k|v and gate|up as one GEMM each; the drafter's own parameters become views of
    those buffers (no second copy), keep their values, train and save as before, and a ``.to()`` afterwards is
    picked up."""
    from fold_hf.generation.static_drafter import fused_projections

    monkeypatch.delenv("FOLD_HF_FUSED_DRAFTER", raising=False)
    target, drafter = trained_pair("llama")
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    fold_hf.generation.release_fast_state(target)
    ids = prompt(40, 60)
    expected = greedy_reference(target, ids, 20)
    fused_rounds_equal_the_foundation_loops(target, drafter, ids, expected, "fold", 20)
    attn, mlp = drafter.layers[0].self_attn, drafter.layers[0].mlp
    qkv, _, gate_up = fused_projections(drafter.layers[0])
    assert attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert attn.v_proj.weight.data_ptr() == qkv[attn.q_proj.out_features + attn.k_proj.out_features:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == gate_up[mlp.gate_proj.out_features:].data_ptr()
    assert all(torch.equal(v, before[k]) for k, v in drafter.state_dict().items())
    drafter.save_pretrained(tmp_path / "saved")  # safetensors refuses tensors sharing memory: save copies
    reloaded = fold_hf.FoldDrafter.from_pretrained(tmp_path / "saved", dtype=drafter.fc.weight.dtype)
    assert all(torch.equal(v, before[k]) for k, v in reloaded.state_dict().items())
    with torch.no_grad():  # a write through the module reaches the fused buffer the step reads
        attn.k_proj.weight.mul_(2)
    assert torch.equal(qkv[attn.q_proj.out_features:][:attn.k_proj.out_features], attn.k_proj.weight)
    attn.k_proj.weight.data.div_(2)
    dtype = drafter.fc.weight.dtype
    try:
        drafter.to(torch.float32)  # new tensors for every parameter: the next call fuses them again
        assert fused_projections(drafter.layers[0])[0].dtype == torch.float32
        assert attn.q_proj.weight.data_ptr() == fused_projections(drafter.layers[0])[0].data_ptr()
    finally:
        drafter.to(dtype)  # the pair is shared by the module's tests
        drafter.load_state_dict(before)
        fold_hf.generation.release_fast_state(target)


def test_wrapped_drafter_projection_runs_as_its_module(monkeypatch):
    """A drafter projection wrapped by an adapter (here a Linear subclass adding a low-rank delta, as LoRA does)
    keeps the fused drafter step off, so the adapter's output is what drafts: same rounds as the foundation loop."""
    import copy

    from fold_hf.generation.static_drafter import fused_drafter_unsupported

    class WithDelta(nn.Linear):
        def forward(self, x):
            return super().forward(x) + 0.5 * x[..., : self.out_features].flip(-1)

    monkeypatch.delenv("FOLD_HF_FUSED_DRAFTER", raising=False)
    target, base = trained_pair("llama")
    drafter = copy.deepcopy(base)
    old = drafter.layers[0].self_attn.q_proj
    wrapped = WithDelta(old.in_features, old.out_features, bias=False, dtype=old.weight.dtype)
    wrapped.weight.data.copy_(old.weight.data)
    drafter.layers[0].self_attn.q_proj = wrapped
    assert "WithDelta" in fused_drafter_unsupported(drafter)
    fold_hf.generation.release_fast_state(target)
    ids = prompt(50, 70)
    expected = greedy_reference(target, ids, 24)
    fused_rounds_equal_the_foundation_loops(target, drafter, ids, expected, "fold", 24)
    session = target.__dict__["_fold_fast_session"]
    assert all(d is not None and d.ops is None for d in session.static_drafters.values())
    fold_hf.generation.release_fast_state(target)


# ------------------------------------------------------------------------------ target projections laid out
def static_logits(target, ids: torch.Tensor, concat: str, monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(host-length forward logits, fused static verify logits) of a fresh LlamaStaticTarget, with
    ``$FOLD_HF_CONCAT_PROJECTIONS=concat``: the prompt but its last 3 tokens, then those 3 as one verify block."""
    from fold_hf.targets.llama import LlamaStaticTarget

    monkeypatch.setenv("FOLD_HF_CONCAT_PROJECTIONS", concat)
    runner = LlamaStaticTarget(target, 64)
    P = ids.shape[1]
    prefill = runner.forward(ids[:, : P - 3], 0)
    verify = runner.forward_static(ids[:, P - 3 :], torch.arange(P - 3, P), 64, attention="triton", fused=True)
    return prefill, verify


@pytest.mark.parametrize("arch,bias", [("llama", False), ("llama", True), ("qwen3", False)])
def test_target_projections_laid_out_once_equal_the_modules(arch, bias, monkeypatch, tmp_path):
    """The static target's q|k|v and gate|up as one GEMM each (fp32, CPU): its parameters become views of the
    concatenated buffers (held once, same values, saved as before), and both its host-length forward and its fused
    verify give the logits of the module-by-module path."""
    from fold_hf.targets.weight_layout import DecodeProjections

    target = tiny_target(arch, seed=5, layers=2, dtype=torch.float32)
    if bias:  # biases on q/k/v and gate/up/down too: concatenated with their weights
        cfg = target.config
        cfg.attention_bias = cfg.mlp_bias = True
        target = type(target)(cfg).eval()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    ids = prompt(60, 12)
    separate = static_logits(target, ids, "0", monkeypatch)
    attn, mlp = target.model.layers[1].self_attn, target.model.layers[1].mlp
    fused = static_logits(target, ids, "1", monkeypatch)
    for a, b in zip(fused, separate):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), (a - b).abs().max()
    layout = DecodeProjections(attn, mlp)
    q_rows, kv_rows = attn.q_proj.out_features, attn.k_proj.out_features
    assert attn.q_proj.weight.data_ptr() == layout.qkv_weight.data_ptr()
    assert attn.v_proj.weight.data_ptr() == layout.qkv_weight[q_rows + kv_rows:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == layout.gate_up_weight[mlp.gate_proj.out_features:].data_ptr()
    assert (layout.qkv_bias is not None) == bias and (layout.gate_up_bias is not None) == bias
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    target.save_pretrained(tmp_path / "saved")  # views of one buffer save as separate tensors
    reloaded = type(target).from_pretrained(tmp_path / "saved", dtype=torch.float32)
    assert all(torch.equal(v, before[k]) for k, v in reloaded.state_dict().items())
    with torch.no_grad():  # a write through a module reaches the buffer the GEMM reads
        attn.k_proj.weight.mul_(2)
    assert torch.equal(layout.qkv_weight[q_rows:q_rows + kv_rows], attn.k_proj.weight)


def test_wrapped_target_projection_runs_as_its_module(monkeypatch):
    """A target projection wrapped by an adapter (a Linear subclass adding a delta, as LoRA does) runs as its module,
    with a warning naming it; the other layers keep the concatenated GEMMs; tokens = HF greedy."""
    from fold_hf.targets import weight_layout

    class WithDelta(nn.Linear):
        def forward(self, x):
            return super().forward(x) + 0.5 * x[..., : self.out_features].flip(-1)

    target = tiny_target("llama", seed=6, layers=2)
    old = target.model.layers[0].self_attn.k_proj
    wrapped = WithDelta(old.in_features, old.out_features, bias=False, dtype=old.weight.dtype)
    wrapped.weight.data.copy_(old.weight.data)
    target.model.layers[0].self_attn.k_proj = wrapped
    monkeypatch.setattr(weight_layout, "_WARNED", set())
    monkeypatch.delenv("FOLD_HF_CONCAT_PROJECTIONS", raising=False)
    ids = prompt(61, 9)
    expected = greedy_reference(target, ids, 8)
    with pytest.warns(UserWarning, match="k_proj is a .*WithDelta"):
        got = fast_generate(target, None, input_ids=ids, max_new_tokens=8, **FUSED_STATIC)
    assert torch.equal(got, expected)
    attn = target.model.layers[1].self_attn
    assert attn.k_proj.weight.data_ptr() == attn.q_proj.weight.data_ptr() + attn.q_proj.weight.numel() * 8
    fold_hf.generation.release_fast_state(target)


def test_concat_setting_is_checked(monkeypatch):
    from fold_hf.targets.weight_layout import concat_projections_enabled

    monkeypatch.setenv("FOLD_HF_CONCAT_PROJECTIONS", "yes")
    with pytest.raises(ValueError, match="FOLD_HF_CONCAT_PROJECTIONS"):
        concat_projections_enabled()


@pytest.mark.gpu(reason="CUDA graphs and cuBLAS: the captured steps with concatenated target projections")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_engine_with_concatenated_projections_matches_separate_on_gpu(arch, monkeypatch):
    """Graphs engine, fused layers, fp32 on the GPU: q|k|v and gate|up as one GEMM each give HF greedy's tokens and
    the acceptance lengths of the module-by-module projections, AR and speculative."""
    with pair_on_gpu(arch) as (target, drafter):
        for seed, length in enumerate([1, 300, 700]):
            ids = prompt(70 + seed, length).cuda()
            expected = greedy_reference(target, ids, 40)
            runs = {}
            for concat in ("1", "0"):
                monkeypatch.setenv("FOLD_HF_CONCAT_PROJECTIONS", concat)
                fold_hf.generation.release_fast_state(target)
                kw = dict(input_ids=ids, max_new_tokens=40, engine="graphs", target_attention="triton",
                          fused_layers=True)
                assert torch.equal(fast_generate(target, None, **kw), expected), (arch, length, concat)
                runs[concat] = fast_generate(target, drafter, **kw, return_stats=True,
                                             fold_config=mode_config("fold"))
                assert torch.equal(runs[concat].sequences, expected), (arch, length, concat)
            assert runs["1"].acceptance_lengths == runs["0"].acceptance_lengths, (arch, length)
        fold_hf.generation.release_fast_state(target)


@pytest.mark.gpu(reason="num_warps is a GPU launch setting the interpreter ignores")
@pytest.mark.parametrize("warps", [4, 8, 16, 32])
def test_norm_warps_match_the_twin_on_gpu(warps):
    # the default for a row of 4096 is 16 warps; the step's A/B rows time 8 and 32 ($FOLD_HF_NORM_WARPS)
    from fold_hf.kernels.layer.triton import add_rms_norm_triton

    for rows, H in ((1, 4096), (10, 4096), (1, 2880)):
        hidden = randn(1, rows, H, dtype=torch.bfloat16, device="cuda", seed=H + warps, scale=5)
        delta = randn(1, rows, H, dtype=torch.bfloat16, device="cuda", seed=H + 1)
        weight = randn(H, dtype=torch.bfloat16, device="cuda", seed=H)
        total, normed = add_rms_norm_triton(hidden, delta, weight, 1e-6, num_warps=warps)
        ref_total, ref_normed = add_rms_norm_reference(hidden, delta, weight, 1e-6)
        assert torch.equal(total, ref_total), (rows, H)
        assert rel_err(normed, ref_normed) < 1e-2, (rows, H)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_write_rows_in_one_launch_is_each_rows_own(interpreter, dtype):
    """``rope_write_rows_triton`` (a batch's verify, Llama family on CUDA): three rows of blocks of 4 at their own
    positions (5, 40, 17), written into cache rows 2, 0, 3 of a 4-row cache, their heads read in place from one
    q|k|v projection of the rows' tokens: each row's rotated q / k / v and its cache row equal, bit for bit, the torch
    twin of the row alone; the cache row no row writes (1) is untouched."""
    from fold_hf.kernels.layer.triton import rope_write_rows_triton

    A, L, Hq, Hkv, D, capacity = 3, 4, 6, 2, 16, 64
    starts, rows = [5, 40, 17], [2, 0, 3]
    base = rope_inputs(L, Hq, Hkv, D, capacity, 0, dtype, seed=11)
    fused = randn(A, L, (Hq + 2 * Hkv) * D, dtype=dtype, seed=12, scale=2)
    q, k, v = (t.view(A, L, -1, D) for t in fused.split((Hq * D, Hkv * D, Hkv * D), -1))
    keys, values = randn(4, Hkv, capacity, D, dtype=dtype, seed=13), randn(4, Hkv, capacity, D, dtype=dtype, seed=14)
    positions = torch.tensor(starts)[:, None] + torch.arange(L)
    got_keys, got_values = keys.clone(), values.clone()
    qs, ks, vs = rope_write_rows_triton(q, k, v, base["cos_table"], base["sin_table"], positions, got_keys,
                                        got_values, torch.tensor(rows, dtype=torch.int32))
    assert qs.shape == (A, Hq, L, D) and ks.shape == vs.shape == (A, Hkv, L, D)
    for a, row in enumerate(rows):
        want_keys, want_values = keys[row : row + 1].clone(), values[row : row + 1].clone()
        wq, wk, wv = rope_write_reference(q[a : a + 1], k[a : a + 1], v[a : a + 1], base["cos_table"],
                                          base["sin_table"], positions[a], want_keys, want_values)
        assert torch.equal(qs[a : a + 1], wq) and torch.equal(ks[a : a + 1], wk) and torch.equal(vs[a : a + 1], wv)
        assert torch.equal(got_keys[row], want_keys[0]) and torch.equal(got_values[row], want_values[0]), row
    assert torch.equal(got_keys[1], keys[1]) and torch.equal(got_values[1], values[1])
