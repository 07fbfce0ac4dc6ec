"""Exact mode on the fast loop (issue 37, docs/exact-mode.md): the Llama target's decode / verify forward with the
row-count-invariant kernels, under Triton's interpreter on CPU (conftest sets ``TRITON_INTERPRET=1``; fp32 and
fp16: the interpreter's ``tl.dot`` is wrong in bf16), and the gpu-marked bf16 checks for a CUDA machine.

* a verify block's logits equal, bit for bit, the logits of the same tokens decoded as successive one-row AR steps
  (the independent statement: the AR steps themselves), and are the model's logits within rounding;
* greedy ``fast_generate(exact=True)`` with a drafter (a random one: many rejections; an oracle: every draft
  accepted) equals ``fast_generate(exact=True)`` without one, token for token; so does the routed front door;
* each refusal names why (no fallback);
* the bit comparison fails with the default decode kernels in exact mode's place (so it can fail).
"""

from __future__ import annotations

import pytest
import torch
from tiny import drafter_config, left_pad, prompt, tiny_target

import fold_hf
from fold_hf import FoldConfig, FoldDrafter
from fold_hf.kernels.exact import ExactUnavailable
from fold_hf.targets.llama import LlamaStaticTarget

pytest.importorskip("triton")
pytestmark = pytest.mark.usefixtures("row_invariant_dot")  # tl.dot as an MMA reduces a row (conftest)

K = 3  # proposals per round: verify blocks of K + 1 rows


def small_target(dtype=torch.float32, arch: str = "llama"):
    return tiny_target(arch, layers=2, dtype=dtype)


def small_drafter(target, seed: int = 1) -> FoldDrafter:
    torch.manual_seed(seed)
    config = drafter_config(target, block=K + 1, layers=1, taps=(0, 1))
    return FoldDrafter(config, FoldConfig(window=16)).to(next(target.parameters()).dtype).eval()


def exact_runner(target, capacity: int = 64) -> LlamaStaticTarget:
    runner = LlamaStaticTarget(target, capacity)
    runner.set_exact(True)
    return runner


def block_against_ar_steps(target, device: str = "cpu") -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """(logits of a verify block of K + 1 rows after a 9-token prompt ``[K + 1, V]``, the same tokens' logits from
    K + 1 successive AR steps (each ``[V]``), the model's own logits of those positions ``[K + 1, V]``)."""
    ids = prompt(3, 9 + K + 1).to(device)
    context, block = ids[:, :9], ids[:, 9:]
    positions = torch.arange(9, 9 + K + 1, device=device)
    verify = exact_runner(target)
    verify.prefill(context)
    block_logits = verify.forward_static(block, positions, 48, attention="triton", fused=True)
    ar = exact_runner(target)
    ar.prefill(context)
    steps = [ar.forward_static(block[:, r : r + 1], positions[r : r + 1], 16 if r < 3 else 32, attention="triton",
                               fused=True)[0] for r in range(K + 1)]
    with torch.no_grad():
        model = target(ids).logits[0, 9:]
    return block_logits, steps, model


@pytest.mark.parametrize("arch,dtype", [("llama", torch.float32), ("llama", torch.float16), ("qwen3", torch.float32)])
def test_verify_block_logits_are_the_ar_steps_bit_for_bit(arch, dtype, interpreter):
    target = small_target(dtype, arch)
    block, steps, model = block_against_ar_steps(target)
    assert block.dtype == dtype and block.shape == (K + 1, target.config.vocab_size)
    for r in range(K + 1):
        assert torch.equal(block[r], steps[r]), f"row {r}"
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(block.double(), model.double(), atol=tol, rtol=tol)


def test_the_check_fails_with_the_default_kernels(interpreter):
    """The same comparison with the default decode kernels in exact mode's place (one row on the CUDA-core
    reduction, a block through ``tl.dot``; the split decode attention) finds rows whose bits differ."""
    from fold_hf.kernels import LayerOps, import_triton_module

    layer, gemm = import_triton_module("layer.triton"), import_triton_module("gemm.triton")
    default = (LayerOps(layer.add_rms_norm_triton, layer.rope_write_triton, layer.silu_mul_triton,
                        layer.rotate_heads_triton, "triton", skinny_linear=gemm.skinny_linear_triton,
                        gate_up_silu=gemm.gate_up_silu_triton, skinny_rows=gemm.MAX_ROWS),
               import_triton_module("fold_read.triton").decode_attention_triton)
    original = LlamaStaticTarget._fused_ops
    try:
        LlamaStaticTarget._fused_ops = lambda self, exact: default if exact else original(self, exact)
        block, steps, _ = block_against_ar_steps(small_target())
    finally:
        LlamaStaticTarget._fused_ops = original
    assert not all(torch.equal(block[r], steps[r]) for r in range(K + 1))


def test_exact_runner_refuses_the_other_forwards(interpreter):
    runner = exact_runner(small_target())
    runner.prefill(prompt(0, 5))
    ids, positions = prompt(1, 2), torch.arange(5, 7)
    for kwargs in (dict(attention="bucket"), dict(attention="triton"), dict(attention="bucket", fused=False)):
        with pytest.raises(ValueError, match="exact mode runs forward_static with fused=True"):
            runner.forward_static(ids, positions, 16, **kwargs)


def test_greedy_speculative_output_is_the_exact_ar_output(interpreter, oracle):
    target = small_target()
    drafter = small_drafter(target)
    ids = prompt(5, 7)
    new = 10
    ar = fold_hf.fast_generate(target, None, ids, max_new_tokens=new, engine="static", exact=True, return_stats=True)
    assert target.__dict__["_fold_fast_session"].runner.exact
    sd = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=new, engine="static", exact=True,
                               return_stats=True)
    assert torch.equal(sd.sequences, ar.sequences)
    assert min(sd.acceptance_lengths) == 1, sd.acceptance_lengths  # rejections happened
    routed = target.generate(ids, assistant_model=drafter, max_new_tokens=new, do_sample=False, exact=True)
    assert torch.equal(routed, ar.sequences)
    oracle(drafter, ar.sequences)  # every draft is the exact AR output: whole blocks accepted
    accepted = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=new, engine="static", exact=True,
                                     return_stats=True)
    assert torch.equal(accepted.sequences, ar.sequences)
    assert max(accepted.acceptance_lengths) == K + 1, accepted.acceptance_lengths
    # a request without exact mode does not reuse the exact session
    fold_hf.fast_generate(target, None, ids, max_new_tokens=2, engine="static")
    assert not target.__dict__["_fold_fast_session"].runner.exact


def assert_batch_rows_alone_in_exact_mode(target, drafter, new: int) -> None:
    """Three left-padded rows (5, 23 and 12 tokens) in exact mode, with ``drafter`` and without (AR): each row's
    tokens, acceptance lengths and proposals are those of the row decoded alone in exact mode (the static engine), the
    batch's SD output is its AR output, and some round rejected."""
    rows = [prompt(11, 5)[0], prompt(12, 23)[0], prompt(13, 12)[0]]
    ids, mask = left_pad(rows)
    batches = {}
    for assistant in (drafter, None):
        batch = batches[assistant is None] = fold_hf.fast_generate(target, assistant, ids, mask, max_new_tokens=new,
                                                                   exact=True, return_stats=True)
        assert batch.batched
        for i, r in enumerate(rows):
            alone = fold_hf.fast_generate(target, assistant, r[None], max_new_tokens=new, engine="static",
                                          exact=True, return_stats=True)
            assert batch.rows[i].sequences.tolist() == alone.sequences.tolist(), (i, assistant is None)
            assert batch.rows[i].acceptance_lengths == alone.acceptance_lengths, i
            assert batch.rows[i].proposals == alone.proposals, i
    sd, ar = batches[False], batches[True]
    assert torch.equal(sd.sequences, ar.sequences)  # greedy SD = AR, batched, in exact mode
    assert min(n for row in sd.rows for n in row.acceptance_lengths) == 1  # rejections happened


def test_batched_rows_are_each_row_alone_in_exact_mode(interpreter):
    """A left-padded batch in exact mode (batched rounds: one verify forward for every row, exact mode's kernels
    row by row), fp16: each row's tokens, acceptance lengths and proposals are those of the row decoded alone in exact
    mode (the static engine), with a drafter (rejections) and without (AR); and the batch's SD output is its AR
    output."""
    target = small_target(torch.float16)
    drafter = small_drafter(target)
    assert_batch_rows_alone_in_exact_mode(target, drafter, new=6)


# ------------------------------------------------------------------ refusals
def test_exact_mode_refuses_what_it_cannot_run(monkeypatch):
    target = small_target()
    drafter = small_drafter(target)
    ids = prompt(2, 5)

    def fast(**kwargs):
        return fold_hf.fast_generate(target, kwargs.pop("drafter", None), ids, max_new_tokens=2, exact=True,
                                     **kwargs)

    with pytest.raises(ValueError, match="fold_hf.generate runs the model's own forward"):
        fold_hf.generate(target, drafter, ids, max_new_tokens=2, exact=True)
    with pytest.raises(ValueError, match="exact mode runs in the static and graphs engines"):
        fast(engine="eager")
    with pytest.raises(ValueError, match="exact mode needs target_attention='triton'.*'bucket'"):
        fast(engine="static", target_attention="bucket")
    with pytest.raises(ValueError, match="exact mode runs the target's fused layers; fused_layers=False"):
        fast(engine="static", fused_layers=False)
    monkeypatch.setenv("FOLD_HF_FUSED_LAYERS", "0")
    with pytest.raises(ValueError, match=r"\$FOLD_HF_FUSED_LAYERS=0 turns them off"):
        fast(engine="static")
    monkeypatch.delenv("FOLD_HF_FUSED_LAYERS")
    with pytest.raises(ValueError, match="fold_fast=False asks for transformers' loop"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=2, exact=True, fold_fast=False)
    with pytest.raises(ValueError, match="cannot take this request: num_beams=2"):
        target.generate(ids, assistant_model=drafter, max_new_tokens=2, exact=True, num_beams=2)

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU outside the interpreter
    with pytest.raises(ExactUnavailable, match="exact mode runs Triton kernels on CUDA"):
        fast(engine="static")
    assert "_fold_fast_session" not in target.__dict__  # no session was kept for the refused request


def test_exact_mode_refuses_other_families_and_module_projections(interpreter):
    qwen = tiny_target("qwen35", dtype=torch.float32)
    with pytest.raises(ExactUnavailable, match="exact mode runs the Llama and Gemma families; Qwen3_5ForCausalLM not "):
        fold_hf.fast_generate(qwen, None, prompt(0, 5), max_new_tokens=2, engine="static", exact=True)

    class Wrapped(torch.nn.Linear):  # stands for a LoRA wrapper or a quantized layer: it runs as its module
        pass

    target = small_target()
    o_proj = target.model.layers[1].self_attn.o_proj
    wrapped = Wrapped(o_proj.in_features, o_proj.out_features, bias=False)
    wrapped.weight = o_proj.weight
    target.model.layers[1].self_attn.o_proj = wrapped
    with pytest.raises(ExactUnavailable, match="layer 1: o_proj is a Wrapped, not a plain nn.Linear"):
        exact_runner(target)
    target.model.layers[1].self_attn.o_proj = o_proj
    handle = target.lm_head.register_forward_hook(lambda module, args, out: out)
    with pytest.raises(ExactUnavailable, match="lm_head has forward hooks"):
        exact_runner(target)
    handle.remove()
    exact_runner(target)  # the same target, plain again: accepted


# ------------------------------------------------------------------ the Gemma family
def gemma_target(arch: str, dtype=torch.float32):
    """A tiny Gemma target exact mode runs: ``gemma3`` (two sliding layers of window 8, then a global one), or
    ``gemma4`` without per-layer inputs (sliding and global layers of their own head dims, ``attention_k_eq_v``, the
    last two layers KV-shared)."""
    import transformers as tf

    from tiny import VOCAB

    torch.manual_seed(0)
    if arch == "gemma3":
        config = tiny_target("gemma3", dtype=torch.float64).config.to_dict()
        config.update(num_hidden_layers=3, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
        return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**config)).to(dtype).eval()
    config = tiny_target("gemma4_shared", dtype=torch.float64).config.to_dict()
    config.update(hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB)
    return tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**config)).to(dtype).eval()


def gemma_block_against_ar_steps(target, prompt_length: int, device: str = "cpu"):
    """As :func:`block_against_ar_steps` for a Gemma target (its own runner, rings of window + 3 slots wrapped)."""
    from fold_hf.targets.gemma import GemmaStaticTarget

    ids = prompt(4, prompt_length + K + 1).to(device)
    context, block = ids[:, :prompt_length], ids[:, prompt_length:]
    positions = torch.arange(prompt_length, prompt_length + K + 1, device=device)

    def runner():
        r = GemmaStaticTarget(target, 64)
        r.set_exact(True)
        r.prefill(context)
        return r

    block_logits = runner().forward_static(block, positions, 48, attention="triton", fused=True)
    ar = runner()
    steps = [ar.forward_static(block[:, r : r + 1], positions[r : r + 1], 32 if r < 2 else 48, attention="triton",
                               fused=True)[0] for r in range(K + 1)]
    with torch.no_grad():
        model = target(ids).logits[0, prompt_length:]
    return block_logits, steps, model


@pytest.mark.parametrize("arch,dtype", [("gemma3", torch.float32), ("gemma3", torch.float16),
                                        ("gemma4", torch.float32)])
def test_gemma_verify_block_logits_are_the_ar_steps_bit_for_bit(arch, dtype, interpreter, monkeypatch):
    """Gemma's sliding layers read their ring (wrapped: 21 tokens > 8 + 3 slots) through the exact ring kernel, its
    global layers the exact decode attention, every GEMM and the lm_head the exact GEMM."""
    from fold_hf.targets import gemma

    monkeypatch.setattr(gemma, "RING_SLACK", 3)
    target = gemma_target(arch, dtype)
    block, steps, model = gemma_block_against_ar_steps(target, 21)
    for r in range(K + 1):
        assert torch.equal(block[r], steps[r]), f"row {r}"
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert torch.allclose(block.double(), model.double(), atol=tol, rtol=tol)


def test_gemma_check_fails_with_the_default_kernels(interpreter, monkeypatch):
    """The Gemma comparison with the default GEMMs (one row on the CUDA-core reduction, a block through ``tl.dot``)
    and the default ring tile in exact mode's place finds rows whose bits differ."""
    from fold_hf.kernels import LayerOps, import_triton_module
    from fold_hf.targets import gemma
    from fold_hf.targets.gemma_fused import GemmaFusedLayers

    monkeypatch.setattr(gemma, "RING_SLACK", 3)
    layer, gemm = import_triton_module("layer.triton"), import_triton_module("gemm.triton")
    default = (LayerOps(layer.add_rms_norm_triton, layer.rope_write_triton, layer.silu_mul_triton,
                        layer.rotate_heads_triton, "triton", skinny_linear=gemm.skinny_linear_triton,
                        gate_up_silu=gemm.gate_up_silu_triton, skinny_rows=gemm.MAX_ROWS),
               import_triton_module("exact_attention.triton").exact_decode_attention_triton,
               import_triton_module("gemma.triton").ring_attention_triton)
    monkeypatch.setattr(GemmaFusedLayers, "_exact_ops", lambda self: default)
    block, steps, _ = gemma_block_against_ar_steps(gemma_target("gemma3"), 21)
    assert not all(torch.equal(block[r], steps[r]) for r in range(K + 1))


def test_gemma_greedy_speculative_output_is_the_exact_ar_output(interpreter, oracle, monkeypatch):
    """Gemma-3 (the real pair's family; Gemma-4's layers are held to the AR steps' bits above), rings wrapped."""
    from fold_hf.targets import gemma

    monkeypatch.setattr(gemma, "RING_SLACK", K)
    target = gemma_target("gemma3")
    drafter = small_drafter(target)
    ids = prompt(6, 13)
    ar = fold_hf.fast_generate(target, None, ids, max_new_tokens=10, engine="static", exact=True)
    sd = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=10, engine="static", exact=True,
                               return_stats=True)
    assert torch.equal(sd.sequences, ar)
    assert min(sd.acceptance_lengths) == 1, sd.acceptance_lengths
    oracle(drafter, ar)
    accepted = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=10, engine="static", exact=True,
                                     return_stats=True)
    assert torch.equal(accepted.sequences, ar)
    assert len(set(accepted.acceptance_lengths)) >= 3, accepted.acceptance_lengths  # rolled back by many amounts


def test_gemma_batched_rows_are_each_row_alone_in_exact_mode(interpreter, monkeypatch):
    """A left-padded Gemma-3 batch in exact mode (batched rounds: one verify forward for every row through the fused
    layers over rows, each row's ring / global attention its own exact launch, the GEMMs the exact GEMM over the
    rows), rings wrapped: each row's tokens, acceptance lengths and proposals are those of the row decoded alone in
    exact mode (the static engine), with a drafter (rejections); and the batch's SD output is its AR output."""
    from fold_hf.targets import gemma

    monkeypatch.setattr(gemma, "RING_SLACK", K)
    target = gemma_target("gemma3")
    drafter = small_drafter(target)
    assert_batch_rows_alone_in_exact_mode(target, drafter, new=5)  # rows inside the window of 8; wrapped; wrapped


def test_gemma_exact_rows_step_has_the_bits_of_each_row_alone(interpreter, monkeypatch):
    """The exact fused rows step itself: three rows at their own lengths (one inside its first window, two with wrapped
    rings) verify blocks of K + 1 in one ``forward_rows_static``; each row's logits equal, bit for bit, that row's
    exact verify step through a one-row runner (Gemma-4 without per-layer inputs: KV-shared layers,
    ``attention_k_eq_v``)."""
    from fold_hf.targets import gemma
    from fold_hf.targets.base import bucket_length
    from fold_hf.targets.gemma import GemmaStaticTarget

    monkeypatch.setattr(gemma, "RING_SLACK", K)
    target = gemma_target("gemma4")
    lengths = (5, 21, 13)
    seqs = [prompt(30 + n, n + K + 1) for n in lengths]
    runner = GemmaStaticTarget(target, 48, batch=3)
    runner.set_exact(True)
    singles = []
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        runner.prefill(s[:, :n], row=i)
        single = GemmaStaticTarget(target, 48)
        single.set_exact(True)
        single.prefill(s[:, :n])
        singles.append(single)
    positions = torch.tensor(lengths)[:, None] + torch.arange(K + 1)
    ids = torch.cat([s[:, n:] for s, n in zip(seqs, lengths)])
    bucket = bucket_length(max(lengths) + K + 1, 48)
    logits = runner.forward_rows_static(ids, positions, [0, 1, 2], bucket)
    for i in range(3):
        alone = singles[i].forward_static(ids[i : i + 1], positions[i], bucket, attention="triton", fused=True)
        assert torch.equal(logits[i], alone), f"row {i}"


def test_gemma_exact_mode_refuses_what_it_cannot_run(interpreter, monkeypatch):
    from fold_hf.targets.gemma import GemmaStaticTarget

    for arch, why in (("gemma4", "per-layer inputs"), ("gemma4_moe", "per-layer inputs")):
        with pytest.raises(ExactUnavailable, match=why):
            GemmaStaticTarget(tiny_target(arch, dtype=torch.float32), 32).set_exact(True)
    target = gemma_target("gemma3")
    GemmaStaticTarget(target, 32, batch=2).set_exact(True)  # a batch's rows verify through the exact fused rows
    monkeypatch.setenv("FOLD_HF_CONCAT_PROJECTIONS", "0")
    with pytest.raises(ExactUnavailable, match="CONCAT_PROJECTIONS=0"):
        GemmaStaticTarget(target, 32).set_exact(True)
    monkeypatch.delenv("FOLD_HF_CONCAT_PROJECTIONS")
    handle = target.lm_head.register_forward_hook(lambda module, args, out: out)
    with pytest.raises(ExactUnavailable, match="lm_head has forward hooks"):
        GemmaStaticTarget(target, 32).set_exact(True)
    handle.remove()
    runner = GemmaStaticTarget(target, 32)
    runner.set_exact(True)
    runner.prefill(prompt(0, 5))
    with pytest.raises(ValueError, match="exact mode runs forward_static with fused=True"):
        runner.forward_static(prompt(1, 1), torch.arange(5, 6), 16, attention="bucket")


# ------------------------------------------------------------------ bf16 on a GPU (the lead's run)
@pytest.mark.gpu(reason="bf16 MMA tiles: the interpreter's dot is numpy's and wrong in bf16")
@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4"])
def test_verify_block_logits_are_the_ar_steps_in_bf16_on_gpu(arch, monkeypatch):
    from fold_hf.targets import gemma

    monkeypatch.setattr(gemma, "RING_SLACK", 3)  # the Gemma rings wrap (21 tokens > 8 + 3 slots)
    if arch == "llama":
        block, steps, _ = block_against_ar_steps(small_target(torch.bfloat16).cuda(), "cuda")
    else:
        block, steps, _ = gemma_block_against_ar_steps(gemma_target(arch, torch.bfloat16).cuda(), 21, "cuda")
    for r in range(K + 1):
        assert torch.equal(block[r], steps[r]), f"row {r}"


@pytest.mark.gpu(reason="bf16 and the graphs engine (CUDA graphs)")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("engine", ["static", "graphs"])
def test_greedy_speculative_output_is_the_exact_ar_output_in_bf16_on_gpu(arch, engine, monkeypatch):
    from fold_hf.targets import gemma

    monkeypatch.setattr(gemma, "RING_SLACK", 8)
    target = (small_target(torch.bfloat16) if arch == "llama" else gemma_target(arch, torch.bfloat16)).cuda()
    drafter = small_drafter(target).cuda()
    for seed in range(4):
        ids = prompt(seed, 40).cuda()
        ar = fold_hf.fast_generate(target, None, ids, max_new_tokens=48, engine=engine, exact=True)
        sd = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=48, engine=engine, exact=True)
        assert torch.equal(sd, ar), (seed, arch)


@pytest.mark.gpu(reason="bf16 and the graphs engine (CUDA graphs)")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_batched_rows_are_each_row_alone_and_the_ar_output_in_bf16_on_gpu(arch, monkeypatch):
    """Issue 37's batch goal in bf16 on CUDA: a left-padded batch of 6 rows (block rows past one skinny GEMM's 16)
    in exact mode on the graphs engine; every row's tokens are that row's exact AR output decoded alone, and the
    batch's SD output is its exact AR output (Gemma-3: the fused layers over rows, rings wrapped)."""
    from fold_hf.targets import gemma

    monkeypatch.setattr(gemma, "RING_SLACK", 8)
    target = (small_target(torch.bfloat16) if arch == "llama" else gemma_target(arch, torch.bfloat16)).cuda()
    drafter = small_drafter(target).cuda()
    rows = [prompt(20 + i, n)[0] for i, n in enumerate((5, 40, 17, 64, 9, 33))]
    ids, mask = (t.cuda() for t in left_pad(rows))
    sd = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=32, engine="graphs", exact=True,
                               return_stats=True)
    ar = fold_hf.fast_generate(target, None, ids, mask, max_new_tokens=32, engine="graphs", exact=True)
    assert sd.batched and torch.equal(sd.sequences, ar)
    for i, r in enumerate(rows):
        alone = fold_hf.fast_generate(target, None, r[None].cuda(), max_new_tokens=32, engine="graphs", exact=True)
        assert sd.rows[i].sequences.tolist() == alone.tolist(), i


def test_time_rounds_times_exact_mode_steps_and_refuses_the_eager_engine():
    """The benchmark entry of the cost keys (``exact_*_over_default_8b_32k``, ``benchmarks/e2e_bench.py
    --target-paths exact``) times the exact runner's rounds, and refuses what ``fast_generate(exact=True)`` refuses."""
    from fold_hf.generation.fast import time_rounds
    from fold_hf.generation.fast.session import SESSION_ATTR

    target = small_target()
    drafter = small_drafter(target)
    res = time_rounds(target, drafter, 20, 3, engine="static", exact=True)
    assert len(res.round_seconds) == 3
    assert target.__dict__[SESSION_ATTR].runner.exact
    res = time_rounds(target, None, 20, 2, engine="static")  # the default path rebuilds a default session
    assert not target.__dict__[SESSION_ATTR].runner.exact
    with pytest.raises(ValueError, match="static and graphs engines"):
        time_rounds(target, None, 20, 2, engine="eager", exact=True)
    fold_hf.generation.release_fast_state(target)


# ------------------------------------------------------------------ fold-hf bench --exact
def test_bench_in_exact_mode_finds_no_output_differing_from_exact_ar(interpreter, tmp_path, capsys):
    """``run_bench(exact=True)`` (``fold-hf bench --exact``): AR and every method in exact mode, so every row's
    ``same_as_ar`` holds (a random drafter: rejections) and the summary's ``differ_from_ar`` is 0; the summary says
    ``exact``, refuses to mix exact and default runs, and the loop engine refuses exact mode (CLI too)."""
    import json

    from fold_hf.bench import default_methods, run_bench, summarize
    from fold_hf.cli import main

    target = small_target()
    drafter = small_drafter(target)
    requests = [{"id": "r0", "suite": "tiny", "tier": 30, "new_tokens": 10, "input_ids": prompt(2, 30)[0].tolist()}]
    methods = [m for m in default_methods(window=16, train_length=24) if m.name in ("ar", "fold-a2")]
    runs = run_bench(target, drafter, requests, methods, tmp_path / "exact", engine="fast", exact=True,
                     log=lambda *a: None, warmup=False)
    rows = [json.loads(line) for line in runs.read_text().splitlines()]
    assert len(rows) == 2 and all(r["exact"] and r["same_as_ar"] for r in rows)
    assert target.__dict__["_fold_fast_session"].runner.exact  # the decodes ran exact mode's kernels
    assert any(r["tau"] < K + 1 for r in rows if r["method"] != "ar")  # rejections happened
    summary = summarize([runs], tmp_path / "sum")
    assert summary["exact"] is True and summary["rows"] and all(r["differ_from_ar"] == 0 for r in summary["rows"])
    other = tmp_path / "default" / "runs.jsonl"
    other.parent.mkdir()
    other.write_text("".join(json.dumps({**row, "exact": False}) + "\n" for row in rows))
    with pytest.raises(ValueError, match="mix exact modes"):
        summarize([runs, other], tmp_path / "sum")
    with pytest.raises(ValueError, match="exact mode runs on the fast engine"):
        run_bench(target, drafter, requests, methods, tmp_path / "x", engine="loop", exact=True)
    assert main(["bench", "--exact", "--engine", "loop", "--device", "cpu", "--out", str(tmp_path / "cli")]) == 2
    assert "--exact runs on the fast engine" in capsys.readouterr().err
