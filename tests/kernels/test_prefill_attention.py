"""Prefill attention (issue 36, :mod:`fold_hf.kernels.prefill_attention`): a chunk's queries at ``start ..`` over the
cache prefix, causal, GQA, optional sliding window.

* Triton interpreter on the CPU (``TRITON_INTERPRET=1``, conftest) / natively on CUDA: our kernel against the fp32
  reference at odd lengths, chunk boundaries, GQA, windows (fp32 and fp16 here; bf16 only on the GPU: the
  interpreter has no bf16 dot);
* the SDPA form (the CPU default) against the reference, and the fallback warning when a variant cannot run;
* :class:`StaticTarget`'s prefill with chunks (the kernel in place of SDPA) against the model's own forward, and
  the fused prefill chunk (:meth:`LlamaStaticTarget._prefill_chunk_fused`, torch twins on the CPU) against the module
  path;
* GPU (``@pytest.mark.gpu``): the cuDNN / FA2 split with its log-sum-exp merge, and the kernel in bf16 at 8B
  shapes.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from fold_hf.kernels import prefill_attention as pa
from fold_hf.kernels.prefill_attention import prefill_attention, prefill_attention_naive, prefill_attention_sdpa
from tiny import tiny_target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(Hq, Hkv, D, start, L, dtype, device=DEVICE, seed=0, slack=5):
    """q ``[1, Hq, L, D]`` (a transposed view of ``[1, L, Hq, D]``, as the layers make it) and k, v as views of a
    longer cache ``[1, Hkv, start + L + slack, D]``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, L, Hq, D, generator=g).to(device=device, dtype=dtype).transpose(1, 2)
    cache_k = torch.randn(1, Hkv, start + L + slack, D, generator=g).to(device=device, dtype=dtype)
    cache_v = torch.randn(1, Hkv, start + L + slack, D, generator=g).to(device=device, dtype=dtype)
    return q, cache_k[:, :, : start + L], cache_v[:, :, : start + L]


def rel(a, b) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


# (Hq, Hkv, D, start, L, window, config): odd lengths, a chunk starting inside / on a block boundary, GQA 1/2/3/4,
# MHA, windows shorter than the chunk, longer than the context, equal to one block, head dims not a power of 2
CASES = [
    (4, 2, 32, 0, 37, None, (16, 16, 1, 1)),
    (4, 2, 32, 45, 29, None, (16, 16, 1, 1)),
    (6, 2, 32, 32, 32, None, (16, 16, 1, 1)),  # start and L on block boundaries
    (3, 3, 16, 19, 50, None, (32, 16, 1, 1)),
    (4, 1, 48, 31, 17, None, (16, 32, 1, 1)),  # head dim 48 (padded to 64), MQA
    (6, 2, 32, 50, 33, 20, (16, 16, 1, 1)),
    (2, 2, 32, 7, 40, 5, (16, 32, 1, 1)),
    (4, 2, 32, 70, 21, 16, (16, 16, 1, 1)),
    (4, 2, 32, 3, 30, 1000, (16, 16, 1, 1)),
]


@pytest.mark.parametrize("Hq,Hkv,D,start,L,window,config", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_kernel_matches_reference(Hq, Hkv, D, start, L, window, config, dtype):
    from fold_hf.kernels.prefill_attention.triton import prefill_attention_triton

    if dtype == torch.float16 and window is not None and window < 10:
        pytest.skip("covered in fp32")
    q, k, v = inputs(Hq, Hkv, D, start, L, dtype)
    want = prefill_attention_naive(q.float(), k.float(), v.float(), start, D ** -0.5, window)
    got = prefill_attention_triton(q, k, v, start, D ** -0.5, window, config=config)
    assert got.shape == (1, Hq, L, D) and got.dtype == dtype
    assert rel(got, want) < (2e-6 if dtype == torch.float32 else 5e-3)


def test_triton_default_config_and_layout():
    from fold_hf.kernels.prefill_attention.triton import prefill_attention_triton

    q, k, v = inputs(4, 2, 64, 130, 70, torch.float32)
    got = prefill_attention_triton(q, k, v, 130, 0.125)
    assert got.transpose(1, 2).is_contiguous()  # [1, L, Hq, D] memory: the o-projection reads it without a copy
    assert rel(got, prefill_attention_naive(q, k, v, 130, 0.125)) < 2e-6
    with pytest.raises(ValueError, match="does not match"):
        prefill_attention_triton(q, k[:, :, :-1], v[:, :, :-1], 130, 0.125)


@pytest.mark.parametrize("start,L,window", [(0, 65, None), (100, 65, None), (1, 99, None), (40, 70, 33), (0, 80, 7)])
def test_sdpa_form_matches_reference(start, L, window):
    q, k, v = inputs(6, 2, 16, start, L, torch.float64, device="cpu")
    got = prefill_attention_sdpa(q, k, v, start, 0.3, window)
    assert rel(got, prefill_attention_naive(q, k, v, start, 0.3, window)) < 1e-12


def test_variant_setting_and_fallback_warning(monkeypatch):
    monkeypatch.setattr(pa, "_warned", set())
    q, k, v = inputs(4, 2, 16, 10, 70, torch.float64, device="cpu")
    monkeypatch.setenv(pa.PREFILL_ATTENTION_ENV, "cudnn")
    assert pa.prefill_attention_variant("cpu") == "cudnn"
    with pytest.warns(UserWarning, match="cudnn prefill attention needs CUDA"):
        got = prefill_attention(q, k, v, 10, 0.25)
    assert rel(got, prefill_attention_naive(q, k, v, 10, 0.25)) < 1e-12
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per reason
        prefill_attention(q, k, v, 10, 0.25)
    monkeypatch.setenv(pa.PREFILL_ATTENTION_ENV, "nope")
    with pytest.raises(ValueError, match="FOLD_HF_PREFILL_ATTENTION"):
        pa.prefill_attention_variant("cpu")
    monkeypatch.delenv(pa.PREFILL_ATTENTION_ENV)
    assert pa.prefill_attention_variant("cpu") == "sdpa" and pa.prefill_attention_variant("cuda") == pa.DEFAULT_CUDA
    assert "window" in pa.unsupported_reason("cudnn", q.to(torch.float16), 5) or DEVICE == "cpu"
    # off CUDA a cudnn call falls to sdpa (the memory-efficient kernel is CUDA's), and says so
    assert "needs CUDA" in pa.unsupported_reason("efficient", q, None)


def test_a_cudnn_call_cudnn_cannot_run_takes_the_efficient_kernel_or_says_why_not(monkeypatch):
    """A cudnn call at a head dim cuDNN cannot run goes to the ``efficient`` variant; where this torch has no such
    kernel for the call (here: the CPU, told the variant can run) the SDPA form answers, and a warning says why."""
    monkeypatch.setattr(pa, "_warned", set())
    reasons = {"cudnn": "cudnn prefill attention takes head dims <= 256 in multiples of 8, not 16", "efficient": None}
    monkeypatch.setattr(pa, "unsupported_reason", lambda variant, q, window: reasons.get(variant))
    q, k, v = inputs(4, 2, 16, 10, 70, torch.float32, device="cpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = prefill_attention(q, k, v, 10, 0.25, variant="cudnn")
    said = [str(w.message) for w in seen]
    assert any("memory-efficient kernel over repeated key heads instead" in m for m in said), said
    assert any(m.startswith("efficient prefill attention cannot run here") for m in said), said
    assert rel(got, prefill_attention_naive(q, k, v, 10, 0.25)) < 1e-5


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits[0]


@pytest.mark.parametrize("variant", ["sdpa", "triton"])
def test_static_prefill_in_chunks_matches_the_model(monkeypatch, recwarn, variant):
    """Chunks of 80 (more rows than a verify block: the prefill attention) over a 230-token prompt: chunk
    boundaries inside the prompt, a short last chunk; the cache and the last logits equal the model's forward."""
    from fold_hf.targets.base import PREFILL_ATTENTION_MIN_ROWS
    from fold_hf.targets.llama import LlamaStaticTarget

    monkeypatch.setenv(pa.PREFILL_ATTENTION_ENV, variant)
    model = tiny_target("llama", dtype=torch.float32).to(DEVICE)
    ids = torch.randint(0, 10, (1, 230), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    runner = LlamaStaticTarget(model, 256)
    assert 80 > PREFILL_ATTENTION_MIN_ROWS
    calls = []
    real = pa.prefill_attention
    monkeypatch.setattr(pa, "prefill_attention", lambda *a, **kw: calls.append(a[3]) or real(*a, **kw))
    logits = runner.prefill(ids, chunk=80)
    assert not [w for w in recwarn if "prefill attention" in str(w.message)]  # the variant ran, no fallback
    n = len(runner.layers)
    assert calls == [0] * n + [80] * n + [160] * n
    want = _hf_logits(model, ids)[-1]
    assert rel(logits.float(), want.float()) < 1e-4
    whole = LlamaStaticTarget(model, 256)
    whole.prefill(ids, chunk=256)
    for i in range(len(runner.layers)):
        assert rel(runner.keys[i][:, :, :230], whole.keys[i][:, :, :230]) < 1e-5
        assert rel(runner.values[i][:, :, :230], whole.values[i][:, :, :230]) < 1e-5


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fused_prefill_chunk_matches_module_path(arch):
    """:meth:`LlamaStaticTarget._prefill_chunk_fused` (the fused elementwise ops, torch twins on the CPU, and the prefill
    attention) gives the module path's logits, cache and taps over chunks of 70."""
    from fold_hf.targets.llama import LlamaStaticTarget

    model = tiny_target(arch, dtype=torch.float32)
    ids = torch.randint(0, 10, (1, 150), generator=torch.Generator().manual_seed(5))
    taps_ids = [0, 2, len(model.model.layers) - 1]
    ref, fused = LlamaStaticTarget(model, 160, taps_ids), LlamaStaticTarget(model, 160, taps_ids)
    assert not fused._fused_prefill()  # CPU: the module path by default
    for start in (0, 70, 140):
        piece = ids[:, start : start + 70]
        t_ref = torch.empty(1, piece.shape[1], ref.tap_width)
        t_fused = torch.empty_like(t_ref)
        want = ref.forward(piece, start, taps_out=t_ref, last_only=True)
        got = fused._prefill_chunk_fused(piece, start, t_fused)
        assert got.shape == want.shape == (1, model.config.vocab_size)
        assert rel(got, want) < 1e-5 and rel(t_fused, t_ref) < 1e-5
        assert fused.length == ref.length == start + piece.shape[1]
    for i in range(len(ref.layers)):
        assert rel(fused.keys[i][:, :, :150], ref.keys[i][:, :, :150]) < 1e-5


# ------------------------------------------------------------------ GPU twins
@pytest.mark.gpu(reason="cuDNN / FA2 flash kernels and bf16 Triton dots need CUDA")
@pytest.mark.parametrize("variant", ["cudnn", "flash", "triton"])
@pytest.mark.parametrize("Hq,Hkv,D", [(32, 8, 128), (16, 4, 256), (12, 4, 64)])
@pytest.mark.parametrize("start,L", [(0, 1000), (777, 333), (8192, 4097), (129, 65)])
def test_gpu_variants_match_reference(variant, Hq, Hkv, D, start, L):
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = inputs(Hq, Hkv, D, start, L, dtype, device="cuda")
        want = prefill_attention_naive(q.float(), k.float(), v.float(), start, D ** -0.5)
        got = prefill_attention(q, k, v, start, D ** -0.5, variant=variant)
        assert rel(got, want) < 2e-2


@pytest.mark.gpu(reason="SDPA's memory-efficient kernel is CUDA's")
@pytest.mark.parametrize("Hq,Hkv,D", [(16, 4, 512), (16, 8, 256), (12, 4, 64)])
@pytest.mark.parametrize("start,L", [(0, 1000), (777, 333), (8192, 4097), (129, 65)])
def test_gpu_efficient_variant_matches_reference(Hq, Hkv, D, start, L):
    """The ``efficient`` variant, and what a ``cudnn`` call at a head dim cuDNN cannot run (Gemma-4's 512) takes
    instead (said once): both against the fp32 reference, GQA, query offsets, odd lengths."""
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = inputs(Hq, Hkv, D, start, L, dtype, device="cuda")
        want = prefill_attention_naive(q.float(), k.float(), v.float(), start, D ** -0.5)
        assert rel(prefill_attention(q, k, v, start, D ** -0.5, variant="efficient"), want) < 2e-2
        if D > 256:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                pa._warned.discard(pa.unsupported_reason("cudnn", q, None))
                got = prefill_attention(q, k, v, start, D ** -0.5, variant="cudnn")
            assert rel(got, want) < 2e-2
            assert any("memory-efficient" in str(w.message) for w in seen)


@pytest.mark.gpu(reason="bf16 Triton dots need CUDA")
@pytest.mark.parametrize("window", [1, 100, 1024, 5000])
def test_gpu_triton_window(window):
    q, k, v = inputs(16, 8, 256, 3000, 2049, torch.bfloat16, device="cuda")
    want = prefill_attention_naive(q.float(), k.float(), v.float(), 3000, 0.0625, window)
    assert rel(prefill_attention(q, k, v, 3000, 0.0625, window, variant="triton"), want) < 2e-2


@pytest.mark.parametrize("arch", ["gemma3", "gemma4"])
@pytest.mark.parametrize("variant", ["sdpa", "triton"])
def test_gemma_prefill_in_chunks_matches_the_model(monkeypatch, recwarn, arch, variant):
    """Gemma's sliding layers (window 8) and global layers over chunks of 80 (the prefill attention, the window's
    kernel with ``triton``): the last logits equal the model's own forward."""
    from fold_hf.targets.registry import build_static_target

    monkeypatch.setenv(pa.PREFILL_ATTENTION_ENV, variant)
    model = tiny_target(arch, dtype=torch.float32).to(DEVICE)
    ids = torch.randint(0, 10, (1, 230), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    runner = build_static_target(model, 256)
    calls = []
    real = pa.prefill_attention
    monkeypatch.setattr(pa, "prefill_attention", lambda *a, **kw: calls.append(a[3]) or real(*a, **kw))
    import fold_hf.targets.gemma_rows as gemma_rows  # Gemma's host-length forwards

    monkeypatch.setattr(gemma_rows, "prefill_attention", pa.prefill_attention)
    logits = runner.prefill(ids, chunk=80)
    assert not [w for w in recwarn if "prefill attention" in str(w.message)]  # the variant ran, no fallback
    assert len(calls) == 3 * len(runner.layers)
    assert rel(logits.float(), _hf_logits(model, ids)[-1].float()) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("H,L,D", [(3, 37, 32), (2, 64, 48)])
def test_merge_kernel_matches_reference(dtype, H, L, D):
    """The split's log-sum-exp merge in one launch against its torch twin, and the merge of two halves of the keys
    against attention over all of them."""
    from fold_hf.kernels.prefill_attention.naive import merge_lse_reference
    from fold_hf.kernels.prefill_attention.triton import merge_lse_triton

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, L, D, generator=g).to(DEVICE)
    k = torch.randn(1, H, 50, D, generator=g).to(DEVICE)
    v = torch.randn(1, H, 50, D, generator=g).to(DEVICE)

    def part(keys, values):
        scores = q @ keys.transpose(-1, -2) * 0.2
        return (scores.softmax(-1) @ values).to(dtype), scores.logsumexp(-1)

    (o1, l1), (o2, l2) = part(k[:, :, :20], v[:, :, :20]), part(k[:, :, 20:], v[:, :, 20:])
    got = merge_lse_triton(o1, l1, o2, l2)
    want = merge_lse_reference(o1, l1, o2, l2)
    assert got.transpose(1, 2).is_contiguous() and got.dtype == dtype
    assert rel(got, want) < (1e-6 if dtype == torch.float32 else 2e-3)
    full = ((q @ k.transpose(-1, -2) * 0.2).softmax(-1) @ v)
    assert rel(want, full) < (1e-5 if dtype == torch.float32 else 2e-3)
