"""Multi-row CPU linears through a packed GEMM, oneDNN's or MKL's (fold_hf/kernels/gemm/cpu.py), against a float64
statement of ``x W^T + b``, the backend choice, and the cache of packed copies against every way a weight can change
under it.

The rule is written here in float64 from the definition (a sum over the input features), never read from the
module; the packed product must follow it to fp32 rounding whatever the shape, and must follow the weights after
an in-place write, a ``load_state_dict``, a new buffer, or a write to one part of a concatenated q|k|v buffer.
"""

import copy
import warnings

import pytest
import torch
from torch import nn

import fold_hf
from fold_hf.targets.weight_layout import DecodeProjections
from fold_hf.kernels.gemm import cpu as cpu_gemm
from tiny import greedy_reference, mode_config, prompt, trained_pair

BACKENDS = [name for name, have in (("onednn", cpu_gemm.onednn_packed_available()),
                                    ("mkl", cpu_gemm.mkl_packed_available())) if have]
needs_packed = pytest.mark.skipif(not BACKENDS, reason="this torch build has no packed linear: F.linear runs")


def linear_float64(x, weight, bias=None):
    """sum_k x[..., k] * W[n, k] (+ b[n]) in float64, one output feature at a time."""
    x64, w64 = x.double(), weight.double()
    out = torch.stack([(x64 * w64[n]).sum(-1) for n in range(w64.shape[0])], dim=-1)
    return out if bias is None else out + bias.double()


def rel_err(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.fixture(autouse=True)
def fresh_packs(monkeypatch):
    monkeypatch.delenv(cpu_gemm.PACKED_ENV, raising=False)
    monkeypatch.delenv(cpu_gemm.BACKEND_ENV, raising=False)
    cpu_gemm._state["warned"].clear()
    yield


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [2, 3, 4, 5, 8, 13, 32])
@pytest.mark.parametrize("shape", [(7, 3), (96, 40), (33, 257)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_follows_the_float64_rule(backend, rows, shape, bias, monkeypatch):
    if rows < cpu_gemm.min_rows(backend):
        pytest.skip(f"{backend} packs from {cpu_gemm.min_rows(backend)} rows")
    monkeypatch.setenv(cpu_gemm.BACKEND_ENV, backend)
    out_features, in_features = shape
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    layer = nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=g))
        if bias:
            layer.bias.copy_(torch.randn(out_features, generator=g))
    x = torch.randn(1, rows, in_features, generator=g)
    with torch.no_grad():
        assert cpu_gemm.packed_applies(x, layer.weight)
        out = cpu_gemm.linear_module(layer, x)
    assert out.shape == (1, rows, out_features) and out.dtype == torch.float32
    assert rel_err(out, linear_float64(x, layer.weight, layer.bias)) < 2e-6
    assert any(tag.endswith(f"@{backend}") for tag in cpu_gemm._PACKED[layer.weight])  # packed by that backend


@pytest.mark.parametrize("backend", BACKENDS)
def test_which_products_run_packed(backend, monkeypatch):
    """A CPU fp32 product of 2..32 rows (oneDNN) or 4..32 rows (MKL) without autograd; one row (an AR step), a
    prefill chunk, another dtype or a product that needs gradients run F.linear."""
    monkeypatch.setenv(cpu_gemm.BACKEND_ENV, backend)
    w = torch.randn(16, 8)
    with torch.no_grad():
        applies = {rows: cpu_gemm.packed_applies(torch.randn(rows, 8), w) for rows in (1, 2, 3, 4, 32, 33, 512)}
        assert not cpu_gemm.packed_applies(torch.randn(8, 8, dtype=torch.float64), w.double())
        assert not cpu_gemm.packed_applies(torch.randn(8, 8).bfloat16(), w.bfloat16())
    low = backend == "onednn"
    assert applies == {1: False, 2: low, 3: low, 4: True, 32: True, 33: False, 512: False}
    x = torch.randn(8, 8, requires_grad=True)
    assert not cpu_gemm.packed_applies(x, w)
    weight = nn.Parameter(w.clone())
    cpu_gemm.linear(x, weight).sum().backward()  # autograd goes through F.linear
    assert torch.allclose(x.grad, weight.detach().sum(0).expand(8, 8))


@needs_packed
def test_in_place_writes_load_state_dict_and_new_buffers_repack():
    layer = nn.Linear(24, 40)
    x = torch.randn(8, 24)
    with torch.no_grad():
        cpu_gemm.linear_module(layer, x)  # packs
        layer.weight.mul_(-2.0)  # in place: the version counter moves
        assert rel_err(cpu_gemm.linear_module(layer, x), linear_float64(x, layer.weight, layer.bias)) < 2e-6
        state = {k: torch.randn_like(v) for k, v in layer.state_dict().items()}
        layer.load_state_dict(state)
        assert rel_err(cpu_gemm.linear_module(layer, x), linear_float64(x, state["weight"], state["bias"])) < 2e-6
        layer.weight.data = torch.randn(40, 24)  # a new buffer under the same parameter
        assert rel_err(cpu_gemm.linear_module(layer, x), linear_float64(x, layer.weight, layer.bias)) < 2e-6


@needs_packed
def test_a_write_to_one_part_of_a_concatenated_buffer_repacks():
    """q|k|v is one buffer the three parameters are views of, each with its own version counter: a write through
    k_proj alone must reach the packed q|k|v product."""
    attn = nn.Module()
    attn.q_proj, attn.k_proj, attn.v_proj = nn.Linear(16, 16), nn.Linear(16, 8), nn.Linear(16, 8)
    mlp = nn.Module()
    mlp.gate_proj, mlp.up_proj = nn.Linear(16, 32), nn.Linear(16, 32)
    x = torch.randn(1, 6, 16)
    with torch.no_grad():
        DecodeProjections(attn, mlp).qkv(x)  # lays the buffer out and packs it
        attn.k_proj.weight.add_(1.0)
        q, k, v = DecodeProjections(attn, mlp).qkv(x)
        gate, up = DecodeProjections(attn, mlp).gate_up(x)
    for got, module in ((q, attn.q_proj), (k, attn.k_proj), (v, attn.v_proj), (gate, mlp.gate_proj),
                        (up, mlp.up_proj)):
        assert rel_err(got, linear_float64(x, module.weight, module.bias)) < 2e-6


@needs_packed
def test_past_the_byte_budget_it_warns_once_and_stays_exact(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "packed_budget_bytes", lambda: cpu_gemm.packed_bytes())  # no room for more
    layer = nn.Linear(20, 30, bias=False)
    x = torch.randn(8, 20)
    with torch.no_grad(), pytest.warns(UserWarning, match="would exceed"):
        out = cpu_gemm.linear_module(layer, x)
    assert rel_err(out, linear_float64(x, layer.weight)) < 2e-6
    assert layer.weight not in cpu_gemm._PACKED
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        with torch.no_grad():
            cpu_gemm.linear_module(nn.Linear(20, 30), x)


def test_the_backend_choice(monkeypatch):
    """auto: MKL on an Intel CPU, oneDNN on any other (each where the build has it); the variable names one; a value
    that is neither, or a backend the build lacks, is refused."""
    have = {"onednn": cpu_gemm.onednn_packed_available(), "mkl": cpu_gemm.mkl_packed_available()}
    for vendor, order in (("GenuineIntel", ("mkl", "onednn")), ("AuthenticAMD", ("onednn", "mkl")), ("", ("onednn", "mkl"))):
        monkeypatch.setattr(cpu_gemm, "cpu_vendor", lambda vendor=vendor: vendor)
        assert cpu_gemm.packed_backend() == next((name for name in order if have[name]), None), vendor
    for name in ("onednn", "mkl"):
        monkeypatch.setenv(cpu_gemm.BACKEND_ENV, name)
        if have[name]:
            assert cpu_gemm.packed_backend() == name
        else:
            with pytest.raises(ValueError, match="has no"):
                cpu_gemm.packed_backend()
    monkeypatch.setenv(cpu_gemm.BACKEND_ENV, "blas")
    with pytest.raises(ValueError, match="auto, onednn or mkl"):
        cpu_gemm.packed_backend()


@pytest.mark.skipif(len(BACKENDS) < 2, reason="needs both packed backends in this torch build")
def test_switching_backend_repacks_and_stays_exact(monkeypatch):
    """Each backend keeps its own packed copy (its layout is its own): a product after a switch reads the other
    backend's copy, never the first one's."""
    layer = nn.Linear(40, 24)
    x = torch.randn(6, 40)
    with torch.no_grad():
        for name in ("onednn", "mkl", "onednn"):
            monkeypatch.setenv(cpu_gemm.BACKEND_ENV, name)
            assert rel_err(cpu_gemm.linear_module(layer, x), linear_float64(x, layer.weight, layer.bias)) < 2e-6
    assert {tag.rsplit("@", 1)[1] for tag in cpu_gemm._PACKED[layer.weight]} == {"onednn", "mkl"}


def test_mode_zero_and_bad_values(monkeypatch):
    monkeypatch.setenv(cpu_gemm.PACKED_ENV, "0")
    with torch.no_grad():
        assert not cpu_gemm.packed_applies(torch.randn(8, 4), torch.randn(4, 4))
    monkeypatch.setenv(cpu_gemm.PACKED_ENV, "yes")
    with pytest.raises(ValueError, match="auto, 0 or 1"):
        cpu_gemm.packed_gemm_mode()


@needs_packed
def test_fp32_pair_on_the_fast_loop_packs_its_verify_and_stays_lossless():
    """The tiny llama pair in fp32: the eager and static engines' verify (B = 4 rows) and the drafter's lm_head
    (3 rows) run packed, and every output equals the target's own greedy generate."""
    target64, drafter64 = trained_pair("llama")
    target, drafter = copy.deepcopy(target64).float(), copy.deepcopy(drafter64).float()
    drafter.bind_target(target)
    for seed, length in ((0, 12), (1, 70)):
        ids = prompt(seed, length, offset=77)
        ref = greedy_reference(target, ids, 24)
        for engine in ("eager", "static"):
            res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=24, engine=engine, return_stats=True,
                                        fold_config=mode_config("fold"))
            assert torch.equal(res.sequences, ref), (seed, engine)
            assert max(res.acceptance_lengths) > 1
        fold_hf.generation.release_fast_state(target)
    assert target.lm_head.weight in cpu_gemm._PACKED  # the verify's and the drafter's lm_head products
    assert target.model.layers[0].mlp.down_proj.weight in cpu_gemm._PACKED


def test_a_hooked_or_offloaded_linear_runs_as_its_module():
    """Forward hooks (and accelerate's ``_hf_hook``, which loads an offloaded weight) only run through the module
    call: a hooked Linear is never read through its weight."""
    layer = nn.Linear(12, 10)
    x = torch.randn(8, 12)
    handle = layer.register_forward_hook(lambda module, args, out: out * 2.0)
    with torch.no_grad():
        got = cpu_gemm.linear_module(layer, x)
    handle.remove()
    assert rel_err(got, 2.0 * linear_float64(x, layer.weight, layer.bias)) < 2e-6
    layer._hf_hook = object()  # what accelerate's dispatch attaches
    with torch.no_grad():
        assert rel_err(cpu_gemm.linear_module(layer, x), linear_float64(x, layer.weight, layer.bias)) < 2e-6
    assert layer.weight not in cpu_gemm._PACKED
