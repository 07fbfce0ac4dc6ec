"""The prefill's default chunk (``StaticTarget.prefill_chunk``, ``fused_prefill_chunk``) and the GELU-tanh probe
made once per activation module (``gemma_fused._is_gelu_tanh``).

The rule, as the docstring states it: the fused prefill takes the largest power of two of tokens whose widest
activation (2 x the layers' widest linear output, gate|up being one product) fits 512 MiB, between 8,192 and
65,536 tokens; every other prefill takes 8,192."""

import functools
import math

import pytest
import torch

from tiny import prompt, tiny_target

from fold_hf.targets import base
from fold_hf.targets.base import PREFILL_CHUNK, fused_prefill_chunk
from fold_hf.targets.gemma_fused import _is_gelu_tanh
from fold_hf.targets.registry import build_static_target


def rule(widest: int, element_bytes: int) -> int:
    """The statement above, by logarithm instead of the library's doubling loop."""
    fits = (512 * 2**20) // (widest * element_bytes)
    if fits < 8192:
        return 8192
    return 2 ** min(16, int(math.floor(math.log2(fits))))


@pytest.mark.parametrize("widest,element_bytes,expected", [
    (2 * 14336, 2, 8192),   # Llama-3.1-8B, bf16: 57 KB a token, 9,362 tokens fit
    (2 * 2048, 2, 65536),   # Gemma-3-270M, bf16: 8 KB a token, 65,536 fit
    (2 * 1536, 4, 32768),   # SmolLM2-135M in fp32: 12 KB a token, 43,690 fit
    (2 * 15360, 2, 8192),   # the Gemma-4-12B shape
    (2 * 8192, 2, 16384),   # 32 KB a token: 16,384 fit exactly
    (1, 1, 65536),          # capped
    (10**7, 4, 8192),       # floored
])
def test_the_fused_prefill_chunk_follows_its_rule(widest, element_bytes, expected):
    assert fused_prefill_chunk(widest, element_bytes) == expected == rule(widest, element_bytes)


def test_odd_widths_follow_the_rule_too():
    for widest in (3, 1000, 4097, 12345, 28671, 28673, 40000, 65537):
        for element_bytes in (1, 2, 4):
            assert fused_prefill_chunk(widest, element_bytes) == rule(widest, element_bytes), (widest, element_bytes)


@pytest.mark.parametrize("bad", [(0, 2), (4096, 0), (-1, 2)])
def test_the_rule_refuses_empty_widths(bad):
    with pytest.raises(ValueError, match="must be positive"):
        fused_prefill_chunk(*bad)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "qwen35"])
def test_the_runner_default_is_8192_off_the_fused_prefill_and_the_rule_on_it(arch):
    target = tiny_target(arch, dtype=torch.float32)
    runner = build_static_target(target, capacity=96, tap_layer_ids=())
    assert not runner._fused_prefill()  # a CPU: the module path
    assert runner.prefill_chunk() == PREFILL_CHUNK
    widest = max(m.out_features for m in target.model.layers.modules() if isinstance(m, torch.nn.Linear))
    assert widest == 64  # the tiny models' MLP
    assert runner.prefill_chunk(fused=True) == rule(2 * widest, 4) == 65536


def _default_chunk_of_16(monkeypatch, arch: str):
    """``(runner, ids, whole)``: a runner over a tiny ``arch`` target (fp32), a 40-token prompt, its last logits from
    one 40-token prefill, and then the runner's default chunk patched to 16 tokens."""
    target = tiny_target(arch, dtype=torch.float32)
    runner = build_static_target(target, capacity=96, tap_layer_ids=())
    ids = prompt(3, 40)
    whole = runner.prefill(ids, chunk=40)
    monkeypatch.setattr(type(runner), "prefill_chunk", lambda self, fused=None: 16)
    return runner, ids, whole


def test_prefill_without_a_chunk_takes_the_runner_default(monkeypatch):
    """A 40-token prompt in the default chunk (patched to 16: three forwards) gives the logits of one 40-token
    forward; an explicit chunk still wins."""
    runner, ids, whole = _default_chunk_of_16(monkeypatch, "llama")
    starts = []
    forward = type(runner).forward

    def counting(self, input_ids, start, *args, **kwargs):
        starts.append(start)
        return forward(self, input_ids, start, *args, **kwargs)

    monkeypatch.setattr(type(runner), "forward", counting)
    chunked = runner.prefill(ids)
    assert starts == [0, 16, 32]
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    starts.clear()
    runner.prefill(ids, chunk=20)
    assert starts == [0, 20]


def test_the_gelu_tanh_probe_runs_once_per_module_device_and_dtype():
    """Each probe ends in a device sync; the fused layers ask on every prefill."""
    from transformers.activations import GELUTanh

    act = GELUTanh()
    calls = []
    act.register_forward_hook(lambda module, args, out: calls.append(args[0].dtype))
    for _ in range(3):
        assert _is_gelu_tanh(act, "cpu", torch.float32)
    assert calls == [torch.float32]
    assert _is_gelu_tanh(act, torch.device("cpu"), torch.float64)
    assert _is_gelu_tanh(act, "cpu", torch.float64)
    assert calls == [torch.float32, torch.float64]
    other = GELUTanh()  # another module is probed on its own
    assert _is_gelu_tanh(other, "cpu", torch.float32)
    assert not _is_gelu_tanh(torch.nn.SiLU(), "cpu", torch.float32)
    assert not _is_gelu_tanh(torch.nn.GELU(), "cpu", torch.float32)  # the exact GELU: a different name, not probed


def test_the_rule_constants_are_the_documented_ones():
    assert (base.PREFILL_CHUNK, base.PREFILL_CHUNK_MAX, base.PREFILL_ACTIVATION_BYTES) == (8192, 65536, 512 << 20)


def test_the_qwen35_prefill_without_a_chunk_takes_the_runner_default(monkeypatch):
    """Qwen3.5's prefill (the model's own forward) asks the same default: 40 tokens in chunks of 16 (patched) are three
    forwards, with the logits of one 40-token forward."""
    runner, ids, whole = _default_chunk_of_16(monkeypatch, "qwen35")
    lengths = []
    forward = runner.model.forward

    @functools.wraps(forward)  # the runner reads the forward's signature (cache vs past_key_values)
    def counting(*args, **kwargs):
        lengths.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    monkeypatch.setattr(runner.model, "forward", counting)
    chunked = runner.prefill(ids)
    assert lengths == [16, 16, 8]
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-4)
