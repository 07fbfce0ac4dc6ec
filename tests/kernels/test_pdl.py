"""Programmatic dependent launch of the decode chain's kernels (:mod:`fold_hf.kernels.triton_pdl`).

* CPU: the switch and the mode settings; no PDL on the CPU or under Triton's interpreter (which has no
  grid-dependency ops), so every CPU test runs the kernels as before.
* GPU (``@pytest.mark.gpu``): a CUDA graph of a long chain of dependent PDL kernels (norm -> skinny GEMM -> rope and
  cache write -> decode attention -> GEMM -> norm, each reading what the one before wrote and writing buffers the
  graph's pool reuses) replayed many times gives bit for bit what the same chain gives launched without PDL, in
  every mode; and the graphs engine's tokens and acceptance lengths with and without PDL are HF greedy's and each
  other's.
"""

from __future__ import annotations

import pytest
import torch

import fold_hf
from fold_hf.generation import fast_generate
from tiny import check_graph_engine_settings, greedy_reference, mode_config
from tiny import prompt as tiny_prompt

triton = pytest.importorskip("triton")


def test_switch_and_mode_settings(monkeypatch):
    from fold_hf.kernels import triton_pdl

    monkeypatch.setenv(triton_pdl.PDL_ENV, "yes")
    with pytest.raises(ValueError, match=triton_pdl.PDL_ENV):
        triton_pdl.pdl_enabled("cpu")
    monkeypatch.setenv(triton_pdl.PDL_ENV, "1")
    assert not triton_pdl.pdl_enabled("cpu")
    assert triton_pdl.launch_options("cpu") == {"PDL": 0}
    monkeypatch.delenv(triton_pdl.MODE_ENV, raising=False)
    assert triton_pdl.pdl_mode() == triton_pdl.MODES["at_exit"]  # the fastest in the chain benchmark
    monkeypatch.setenv(triton_pdl.MODE_ENV, "sometimes")
    with pytest.raises(ValueError, match=triton_pdl.MODE_ENV):
        triton_pdl.pdl_mode()
    monkeypatch.setenv(triton_pdl.MODE_ENV, "before_wait")
    assert triton_pdl.pdl_mode() == 3
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not triton_pdl.pdl_enabled("cuda")  # the interpreter has no griddepcontrol, whatever the device


def test_launches_take_pdl_only_inside_the_scope(monkeypatch):
    """launch_options with a PDL-capable device (stood in for on the CPU): PDL inside pdl_scope only, nested scopes
    restore the outer setting, and $FOLD_HF_PDL=0 wins over the scope."""
    from fold_hf.kernels import triton_pdl
    from fold_hf.kernels.common import in_pdl_scope, pdl_scope

    monkeypatch.setattr(triton_pdl, "pdl_enabled", lambda device: triton_pdl.os.environ.get("FOLD_HF_PDL") != "0")
    monkeypatch.delenv("FOLD_HF_PDL", raising=False)
    monkeypatch.delenv(triton_pdl.MODE_ENV, raising=False)
    assert not in_pdl_scope() and triton_pdl.launch_options("cuda") == {"PDL": 0}
    with pdl_scope():
        assert triton_pdl.launch_options("cuda") == {"PDL": 2, "launch_pdl": True}
        with pdl_scope(False):
            assert triton_pdl.launch_options("cuda") == {"PDL": 0}
        assert in_pdl_scope()
        monkeypatch.setenv("FOLD_HF_PDL", "0")
        assert triton_pdl.launch_options("cuda") == {"PDL": 0}
    assert not in_pdl_scope()


def _ar_then_fold(arch, seen: list, seed: int, length: int, new: int) -> tuple[list, list]:
    """The static engine's fused layers (Triton kernels, in the interpreter) on the fp32 tiny pair: an AR call, then a
    ``fold`` speculative call, each HF greedy's tokens; returns what ``seen`` recorded during each."""
    from test_skinny_gemm import fp32_pair

    kw = dict(engine="static", target_attention="triton", fused_layers=True, max_new_tokens=new)
    with fp32_pair(arch) as (target, drafter):
        ids = tiny_prompt(seed, length)
        expected = greedy_reference(target, ids, new)
        assert torch.equal(fast_generate(target, None, input_ids=ids, **kw), expected)
        ar = list(seen)
        seen.clear()
        fold_hf.generation.release_fast_state(target)
        res = fast_generate(target, drafter, input_ids=ids, return_stats=True, fold_config=mode_config("fold"), **kw)
        assert torch.equal(res.sequences, expected)
        fold_hf.generation.release_fast_state(target)
    return ar, list(seen)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_layers_open_the_scope_for_one_token_only(arch, interpreter, monkeypatch):
    """The static engine's fused layers (Triton kernels in the interpreter): every norm of an AR step runs inside
    pdl_scope, no norm of a verify block does, and the tokens are HF greedy's."""
    import fold_hf.kernels as kernels
    from fold_hf.kernels.common import in_pdl_scope

    seen = []
    original = kernels.default_layer_ops

    def recording(device):
        ops = original(device)
        norm = ops.add_rms_norm

        def add_rms_norm(hidden, *args):
            seen.append((hidden.shape[1], in_pdl_scope()))
            return norm(hidden, *args)

        ops.add_rms_norm = add_rms_norm
        return ops

    monkeypatch.setattr(kernels, "default_layer_ops", recording)
    monkeypatch.setenv("FOLD_HF_FUSED_DRAFTER", "0")
    ar, fold = _ar_then_fold(arch, seen, 5, 30, 6)
    assert ar and all(scoped == (tokens == 1) for tokens, scoped in ar), ar
    assert any(tokens > 1 for tokens, _ in fold), fold  # the verify blocks
    assert all(scoped == (tokens == 1) for tokens, scoped in fold), fold


# the launchers of the Gemma and Qwen3.5 chains' own kernels (beside the skinny GEMMs and the decode attention, which
# the Llama chain shares), by the Python function that launches each
HYBRID_LAUNCHERS = {
    "gemma4": {"residual_norm_triton", "_head_norm_rope_write", "_ring_attention"},
    "qwen35": {"residual_norm_triton", "_head_norm_rope_write", "_launch_verify", "gated_rms_norm_triton", "_pairwise"},
}


@pytest.mark.parametrize("arch", sorted(HYBRID_LAUNCHERS))
def test_hybrid_chains_take_pdl_in_an_ar_step_only(arch, interpreter, monkeypatch):
    """The Gemma and Qwen3.5 fused layers on the static engine with the Triton kernels (interpreter): every launch of
    their norms, head norm + rope, ring attention, Gated DeltaNet verify, gated norm and sigmoid gate asks
    ``launch_options`` (so takes PDL where the device has it) inside ``pdl_scope`` exactly when the forward is one
    token, and the tokens are HF greedy's."""
    import inspect

    import fold_hf.kernels as kernels
    from fold_hf.kernels.common import in_pdl_scope
    from fold_hf.kernels.gated_delta import triton as gated_delta_triton
    from fold_hf.kernels.gemma import triton as gemma_triton
    from fold_hf.kernels.hybrid import triton as hybrid_triton

    seen = []

    def recording(device):
        seen.append((inspect.stack()[1].function, in_pdl_scope()))
        return {"PDL": 0}  # the interpreter has no grid-dependency ops

    for module in (hybrid_triton, gemma_triton, gated_delta_triton):
        monkeypatch.setattr(module, "launch_options", recording)
    monkeypatch.setattr(kernels, "triton_kernels_enabled", lambda device: True)
    monkeypatch.setenv("FOLD_HF_FUSED_DRAFTER", "0")
    ar, fold = _ar_then_fold(arch, seen, 7, 40, 4)
    in_scope = {name for name, scoped in ar if scoped}
    assert HYBRID_LAUNCHERS[arch] <= in_scope, (HYBRID_LAUNCHERS[arch] - in_scope, ar)
    assert not any(scoped for _, scoped in fold), fold  # a verify block (and the prefill) take no PDL
    assert HYBRID_LAUNCHERS[arch] & {name for name, _ in fold}


def _chain(x, weights, norm_w, cos, sin, positions, caches, layers):
    """A decode step's chain of dependent kernels at a small shape: ``layers`` times norm -> q|k|v -> rope and cache
    write -> attention -> o -> norm -> gate|up + SiLU -> down, as the fused target layers launch them."""
    from fold_hf.kernels.fold_read.triton import decode_attention_triton
    from fold_hf.kernels.gemm.triton import decode_linear_triton, gate_up_silu_triton
    from fold_hf.kernels.layer.triton import add_rms_norm_triton, rope_write_triton

    hidden, delta = x, None
    Hq, Hkv, D = 8, 2, 64
    for i in range(layers):
        qkv_w, o_w, gu_w, down_w = weights[i]
        hidden, normed = add_rms_norm_triton(hidden, delta, norm_w, 1e-6)
        qkv = decode_linear_triton(normed, qkv_w)
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], -1)
        q, k, v = (t.view(1, 1, -1, D) for t in (q, k, v))
        key_cache, value_cache = caches[i]
        q, k, v = rope_write_triton(q, k, v, cos, sin, positions, key_cache, value_cache)
        out = decode_attention_triton(q, key_cache, value_cache, k, v, positions[:1].to(torch.int32),
                                      scaling=D**-0.5, max_context_length=key_cache.shape[2])
        attn = decode_linear_triton(out.reshape(1, 1, -1), o_w)
        hidden, normed = add_rms_norm_triton(hidden, attn, norm_w, 1e-6)
        delta = decode_linear_triton(gate_up_silu_triton(normed, gu_w), down_w)
    return add_rms_norm_triton(hidden, delta, norm_w, 1e-6)[1]


@pytest.mark.gpu(reason="programmatic dependent launch needs a Hopper-class CUDA device and CUDA graphs")
@pytest.mark.parametrize("dtype,mode", [(torch.bfloat16, "at_exit"), (torch.float32, "at_exit"),
                                        (torch.bfloat16, "after_wait"), (torch.bfloat16, "before_wait")])
def test_graph_of_pdl_chain_matches_the_chain_without_pdl(dtype, mode, monkeypatch):
    from fold_hf.kernels.common import pdl_scope
    from fold_hf.kernels.triton_pdl import pdl_enabled

    if not pdl_enabled("cuda"):
        pytest.skip("this device or Triton has no programmatic dependent launch")
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    H, I, layers, T = 512, 1536, 12, 3000
    weights = [(rnd(768, H, scale=H**-0.5), rnd(H, H, scale=H**-0.5), rnd(2 * I, H, scale=H**-0.5),
                rnd(H, I, scale=I**-0.5)) for _ in range(layers)]
    norm_w = rnd(H, scale=0.1) + 1
    cos, sin = rnd(T + 8, 64).float().cos().to(dtype), rnd(T + 8, 64).float().sin().to(dtype)
    base_caches = [(rnd(1, 2, T + 8, 64), rnd(1, 2, T + 8, 64)) for _ in range(layers)]
    x = rnd(1, 1, H)

    def run(position):
        positions = torch.tensor([position], device="cuda")
        caches = [(k.clone(), v.clone()) for k, v in base_caches]
        return positions, caches

    expected = {}
    monkeypatch.setenv("FOLD_HF_PDL", "0")
    for position in (17, 2999):
        positions, caches = run(position)
        expected[position] = (_chain(x, weights, norm_w, cos, sin, positions, caches, layers), caches)
    monkeypatch.setenv("FOLD_HF_PDL", "1")
    monkeypatch.setenv("FOLD_HF_PDL_MODE", mode)
    positions, caches = run(17)
    static_x = x.clone()
    with pdl_scope():
        _chain(static_x, weights, norm_w, cos, sin, positions, caches, layers)  # compile the PDL variants
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _chain(static_x, weights, norm_w, cos, sin, positions, caches, layers)
    for position in (17, 2999, 17):
        positions.fill_(position)
        for (k, v), (k0, v0) in zip(caches, base_caches):
            k.copy_(k0)
            v.copy_(v0)
        for _ in range(20):  # a race shows up as a mismatch on some replay
            graph.replay()
            torch.cuda.synchronize()
            want, want_caches = expected[position]
            assert torch.equal(out, want), position
        for (k, v), (wk, wv) in zip(caches, want_caches):
            assert torch.equal(k, wk) and torch.equal(v, wv)


@pytest.mark.gpu(reason="CUDA graphs: the graphs engine with and without PDL on a CUDA device")
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "gemma4", "qwen35"])
def test_graph_engine_with_and_without_pdl_gives_greedy_tokens_on_gpu(arch, monkeypatch):
    check_graph_engine_settings(arch, monkeypatch, "FOLD_HF_PDL", ("1", "0"), [(70, 1), (71, 500)])


def test_last_mile_benchmark_dry_run_writes_the_pdl_rows(tmp_path):
    """``benchmarks/last_mile_bench.py --dry-run`` (a tiny pair on the CPU): every section runs, the ``[no_pdl]`` A/B
    rows and their headline keys are there, and the profile holds the step without PDL beside the default one."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "last_mile_bench.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--dry-run", "--skip-hf"], check=True,
                   capture_output=True)
    report = json.loads((tmp_path / "last_mile.json").read_text())
    names = {r["row"] for r in report["rows"]}
    assert {"our_ar", "our_ar[no_pdl]", "our_sd_fold", "our_sd_fold[no_pdl]", "our_ar[torch_select]",
            "our_sd_fold[torch_select]"} <= names, names
    assert all(r["p50_ms"] and r["p50_ms"] > 0 for r in report["rows"] if r["row"] != "floor")
    assert {"ar_128", "ar_128[no_pdl]", "sd_fold_128", "ar_128[torch_select]"} <= set(report["profile"])
    assert {"our_ar_no_pdl_over_pdl_8b_32k", "sd_fold_no_pdl_over_pdl_8b_32k"} <= set(report["headline"])
