"""Qwen3.5 targets (Gated DeltaNet linear attention + full attention every fourth layer) on every path.

Tiny random targets built from transformers' own ``Qwen3_5TextConfig`` (no Hub). Rejections are forced by an
"oracle with errors" drafter: it drafts the target's true greedy continuation but corrupts one slot picked by
the position, so every round accepts a different number of drafts (0 .. k) and the linear-attention
state must roll back by a different amount each time. Independent statements: the target's own greedy
``generate`` (lossless), a float64 loop written from the gated delta rule (kernel), transformers' own
``torch_recurrent_gated_delta_rule`` (reference), and a forward over the accepted tokens only (rollback).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

import fold_hf
from fold_hf.kernels.gated_delta import gated_delta_states_reference
from tiny import PATHS, assert_step_reads_nothing_on_the_host, mode_config, run_path, share, tiny_drafter, tiny_target

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3_5TextConfig"):
    pytest.skip("this transformers has no Qwen3.5", allow_module_level=True)

VOCAB = 12
MASK = VOCAB - 1
BLOCK = 4
# transformers runs the gated delta rule in fp32 even for an fp64 model: block-wise and token-wise agree to ~1e-7
TOL = dict(atol=1e-5, rtol=1e-5)
MODES = ("fold", "dflash", "window", "streaming", "rerope", "yarn")


@functools.lru_cache(maxsize=None)
def qwen35_target(seed: int = 0):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_key_head_dim=8,
                               linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                               linear_conv_kernel_dim=4, max_position_embeddings=4096, tie_word_embeddings=False,
                               bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen3_5ForCausalLM(config).to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    assert model.config.layer_types.count("linear_attention") == 6
    return model


def qwen35_drafter(target, sliding: bool = True):
    kw = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8) if sliding else {}
    return tiny_drafter(target, block=BLOCK, taps=(1, 3), **kw)


def prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, MASK, (1, length), generator=torch.Generator().manual_seed(500 + seed))


def reference(target, ids, new):
    return target.generate(ids, max_new_tokens=new, do_sample=False)


def _cache_name(target) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"


def _run(path: str, target, drafter, ids, new):
    if path == "generate":
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=new, return_stats=True)
        return res.sequences, res.acceptance_lengths
    if path == "assisted":
        # fold_fast=False: transformers' assisted loop (a FoldDrafter assistant is routed to the fast loop otherwise)
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=new, do_sample=False, fold_fast=False)
        return out, list(drafter.last_acceptance_lengths)
    if path == "fast-fused":
        # the fused layers (kernels' torch twins here): the Gated DeltaNet verify keeps the block's inputs and
        # accept(n) re-runs the accepted prefix from the committed state
        res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=new, engine="static",
                                    target_attention="triton", fused_layers=True, return_stats=True)
        return res.sequences, res.acceptance_lengths
    engine = path.split("-")[1]
    res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=new, engine=engine, return_stats=True)
    return res.sequences, res.acceptance_lengths


# ---------------------------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("path", ["generate", "assisted", "fast-eager", "fast-static", "fast-fused"])
@pytest.mark.parametrize("mode", ["fold", "dflash"])
def test_lossless_with_forced_rejections(path, mode, oracle):
    target = qwen35_target()
    drafter = qwen35_drafter(target, sliding=(mode == "fold"))
    drafter.set_fold_config(mode_config(mode))
    rounds = []
    for seed, length in enumerate([9, 40]):  # shorter and longer than the drafter's window (16) and slide (8)
        ids = prompt(seed, length)
        new = 24
        ref = reference(target, ids, new)
        oracle(drafter, ref)
        out, acceptance = _run(path, target, drafter, ids, new)
        assert torch.equal(out, ref), (path, mode, length)
        rounds += acceptance
    # every acceptance count 1 .. BLOCK happened, so the state rolled back by 0 .. k - 1 positions
    assert set(rounds) >= set(range(1, BLOCK + 1)), rounds


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_lossless_random_drafter(mode):
    """A random drafter: nearly every draft is rejected (the state rolls back almost every round)."""
    target = qwen35_target()
    drafter = qwen35_drafter(target)
    ids = prompt(7, 30)
    ref = reference(target, ids, 16)
    cfg = mode_config(mode)
    res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=16, fold_config=cfg, return_stats=True)
    assert torch.equal(res.sequences, ref)
    assert min(res.acceptance_lengths) == 1
    fast = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=16, fold_config=cfg, engine="static")
    assert torch.equal(fast, ref)


def test_seeded_sampling_equal_on_every_path():
    """Speculative sampling over a hybrid target: the same seed gives the same tokens through the rollback of
    fold_hf.generate and the per-position states of both fast engines (a random drafter: rejections most rounds)."""
    target = qwen35_target()
    drafter = qwen35_drafter(target)
    ids = prompt(13, 20)
    outs = [fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=15, do_sample=True,
                             generator=torch.Generator().manual_seed(0))]
    for engine in ("eager", "static"):
        outs.append(fold_hf.fast_generate(target, drafter, ids, max_new_tokens=15, do_sample=True, engine=engine,
                                          generator=torch.Generator().manual_seed(0)))
    assert all(torch.equal(o, outs[0]) for o in outs[1:]), [o[0, 20:].tolist() for o in outs]


def test_autoregressive_fast_loop_and_routing():
    target = qwen35_target()
    ids = prompt(3, 21)
    ref = reference(target, ids, 12)
    for engine in ("eager", "static"):
        assert torch.equal(fold_hf.fast_generate(target, None, ids, max_new_tokens=12, engine=engine), ref)
    # target.generate(..., fold_fast=True) takes the fast loop for Qwen3.5 (no "running transformers'" warning)
    drafter = qwen35_drafter(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False, fold_fast=True)
    assert torch.equal(out, ref)


# ---------------------------------------------------------------------------------------------- variants
# The MoE variant and the multimodal wrappers (text-only ids), tests/tiny.py's builders: the wrappers' text model is the
# dense tiny target's config; the MoE layers route to 2 of 4 experts (weights drawn wide, so the routing and every
# expert term reach the logits) plus a gated shared expert. fp64 with the experts' eager loop as the model's reference.
VARIANTS = ("qwen35_cg", "qwen35_moe", "qwen35_moe_cg")
VARIANT_NEW = 24


@functools.lru_cache(maxsize=None)
def variant_case(arch: str):
    """(target, drafter, prompt, the target's own greedy output) of a variant, built once per process."""
    target = tiny_target(arch, seed=3)
    drafter = share(tiny_drafter(target, block=BLOCK, taps=(1, 3), fold_config=mode_config("fold")))
    ids = prompt(30, 30)  # longer than the drafter's window (16)
    return target, drafter, ids, reference(target, ids, VARIANT_NEW)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("arch", VARIANTS)
def test_variants_lossless_with_forced_rejections(arch, path, oracle):
    """Every path equals the target's own greedy generate with every acceptance count 1 .. 4 (so the linear state
    rolls back by every amount), on the MoE variant's capturable step and the wrappers' text decoder."""
    target, drafter, ids, ref = variant_case(arch)
    oracle(drafter, ref)
    out, acceptance = run_path(path, target, drafter, ids, VARIANT_NEW)
    assert torch.equal(out, ref), (arch, path, out[0, ids.shape[1]:].tolist(), ref[0, ids.shape[1]:].tolist())
    assert set(acceptance) == set(range(1, BLOCK + 1)), acceptance


@pytest.mark.parametrize("arch", VARIANTS)
def test_variant_forwards_match_the_model(arch):
    """Our forwards give the model's own logits and tapped hidden states (``output_hidden_states``: the text decoder's
    layers, which the drafter's ``target_layer_ids`` index): the chunked prefill (through the model's forward, 1-D
    positions passed), a verify whose rows after the first are rejected (``accept(0)``), the true rows, then the same
    with the device-length step (bucket, decode-kernel twin, fused twins). A wrapper carries rope deltas an image
    request would have left (-3): the positions must not see them."""
    from fold_hf.targets.registry import build_static_target
    from fold_hf.targets.qwen35 import Qwen35StaticTarget

    target = tiny_target(arch, seed=2)
    taps, P, L = (1, 3, 7), 21, 4
    ids = prompt(40, P + 4 * (L + 1))
    with torch.no_grad():
        full = target(ids, output_hidden_states=True)
    want_logits = full.logits[0]
    want_taps = torch.cat([full.hidden_states[t + 1][0] for t in taps], -1)
    if "cg" in arch:
        target.model.rope_deltas = torch.tensor([[-3]])
    runner = build_static_target(target, capacity=64, tap_layer_ids=taps)
    assert type(runner) is Qwen35StaticTarget
    seen = []
    last = runner.prefill(ids[:, :P], chunk=8, on_taps=lambda f, s: seen.append(f))
    torch.testing.assert_close(last, want_logits[P - 1], **TOL)
    torch.testing.assert_close(torch.cat(seen, 1)[0], want_taps[:P], **TOL)
    position = P
    for attention, fused in ((None, False), ("bucket", False), ("triton", False), ("triton", True)):
        def step(rows, start, taps_out=None):
            if attention is None:
                return runner.forward(rows, start, taps_out=taps_out)
            return runner.forward_static(rows, torch.arange(start, start + rows.shape[1]), 64, taps_out=taps_out,
                                         attention=attention, fused=fused)

        block = ids[:, position : position + L].clone()
        block[0, 1:] = (block[0, 1:] + 1) % MASK  # rejected rows: only the first is kept
        step(block, position)
        runner.accept(0)
        out = torch.empty(1, L, runner.tap_width, dtype=torch.float64)
        logits = step(ids[:, position + 1 : position + 1 + L], position + 1, out)
        runner.accept(L - 1)
        rows = slice(position + 1, position + 1 + L)
        torch.testing.assert_close(logits, want_logits[rows], **TOL)
        torch.testing.assert_close(out[0], want_taps[rows], **TOL)
        position += L + 1


def test_moe_block_matches_the_model_float64():
    """The capturable MoE step (router and shared expert modules, experts gathered by device indices) against the
    model's own ``Qwen3_5MoeSparseMoeBlock`` (its eager loop over the experts hit), fp64, every layer, 37 tokens."""
    from fold_hf.targets.qwen35 import Qwen35StaticTarget

    target = tiny_target("qwen35_moe", seed=4)
    x = torch.randn(1, 37, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for layer in target.model.layers:
        with torch.no_grad():
            want = layer.mlp(x)
            got = Qwen35StaticTarget._sparse_moe(layer.mlp, x)
            _, _, index = layer.mlp.gate(x[0])
        assert len(set(index.flatten().tolist())) == 4  # every expert is used somewhere
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12 * float(want.abs().max()))


def test_moe_step_reads_nothing_on_the_host():
    """The verify step of the MoE variant runs on fake tensors (no host read, no value-dependent shape: capturable);
    the model's own experts (their eager loop) cannot, which is what this check catches."""
    from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode

    from fold_hf.targets.registry import build_static_target

    target = tiny_target("qwen35_moe", seed=4)
    runner = build_static_target(target, capacity=64, tap_layer_ids=(1, 3))
    runner.prefill(prompt(41, 20))
    assert_step_reads_nothing_on_the_host(runner, 20)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        with pytest.raises(DynamicOutputShapeException):
            target.model.layers[0].mlp(mode.from_tensor(torch.zeros(1, 4, 32, dtype=torch.float64)))


@pytest.mark.parametrize("arch", ["qwen35_moe", "qwen35_moe_cg"])
def test_moe_fp32_lossless_against_transformers_default_experts(arch):
    """fp32 with transformers' default experts implementation (grouped GEMM) as the model's reference: our fast
    engines (capturable gather + batched matmuls) and the transformers paths give its greedy output."""
    target = tiny_target(arch, seed=3, dtype=torch.float32)
    target.set_experts_implementation("grouped_mm")
    drafter = tiny_drafter(target, block=BLOCK, taps=(1, 3))
    ids = prompt(31, 30)
    ref = reference(target, ids, VARIANT_NEW)
    for path in ("generate", "fast-static", "fast-fused"):
        out, _ = run_path(path, target, drafter, ids, VARIANT_NEW)
        assert torch.equal(out, ref), path


def test_wrapper_ignores_rope_deltas_of_an_earlier_image_request():
    """``Qwen3_5Model`` adds ``rope_deltas`` (left by its last image request) to the positions of every call with a
    non-empty cache; transformers' ``generate`` resets them for a text prompt. The foundation loop's runner must too:
    its verify logits equal the model's forward over the whole text."""
    from fold_hf.generation.loop import ForwardRunner

    target = tiny_target("qwen35_cg", seed=2)
    ids = prompt(42, 24)
    with torch.no_grad():
        want = target(ids).logits[0]
    target.model.rope_deltas = torch.tensor([[-3]])
    runner = ForwardRunner(target, (1, 3))
    runner.prefill(ids[:, :20])
    logits, _ = runner.verify(ids[:, 20:], 20)
    torch.testing.assert_close(logits, want[20:], **TOL)
    assert target.model.rope_deltas is None


# ---------------------------------------------------------------------------------------------- rollback
def test_snapshot_rollback_equals_accepted_prefix_only():
    """After a 5-token verify of which 2 tokens are kept, the cache equals one that only ever saw those 2."""
    from transformers import DynamicCache

    from fold_hf.targets.rollback import LinearStateRollback

    target = qwen35_target()
    ids = prompt(11, 14)
    block = prompt(12, 5)
    kept = 2
    name = _cache_name(target)
    rolled = DynamicCache(config=target.config)
    target(input_ids=ids, **{name: rolled}, use_cache=True)
    rollback = LinearStateRollback(rolled)
    rollback.snapshot()
    target(input_ids=block, **{name: rolled}, use_cache=True)
    rollback.rollback(target, 5, block[:, :kept], name)
    clean = DynamicCache(config=target.config)
    target(input_ids=torch.cat((ids, block[:, :kept]), 1), **{name: clean}, use_cache=True)
    assert rolled.get_seq_length() == clean.get_seq_length() == 16
    for a, b in zip(rolled.layers, clean.layers):
        if hasattr(a, "recurrent_states"):
            torch.testing.assert_close(a.recurrent_states[0], b.recurrent_states[0], **TOL)
            torch.testing.assert_close(a.conv_states[0][..., -3:], b.conv_states[0][..., -3:], **TOL)
        else:
            torch.testing.assert_close(a.keys, b.keys, **TOL)
    # without the rollback the state would still hold the rejected tokens
    rollback.snapshot()
    target(input_ids=block, **{name: rolled}, use_cache=True)
    changed = [a for a, b in zip(rolled.layers, clean.layers) if hasattr(a, "recurrent_states")
               and not torch.allclose(a.recurrent_states[0], b.recurrent_states[0])]
    assert changed


def test_static_target_accept_selects_the_position_state():
    """The fast path's verify keeps every position's state; accept(n) equals running only the first n + 1."""
    from fold_hf.targets.qwen35 import Qwen35StaticTarget

    target = qwen35_target()
    ids, block = prompt(21, 13), prompt(22, 4)
    for n in range(4):
        runner = Qwen35StaticTarget(target, 64)
        runner.prefill(ids)
        runner.forward(block, 13)
        runner.accept(n)
        clean = Qwen35StaticTarget(target, 64)
        clean.prefill(ids)
        clean.forward(block[:, : n + 1], 13)
        clean.accept(n)
        for i, rec in enumerate(runner.recurrent):
            if rec is not None:
                torch.testing.assert_close(rec, clean.recurrent[i], **TOL)
                torch.testing.assert_close(runner.conv[i], clean.conv[i], **TOL)
        # and the logits of the next token agree with transformers' forward over the whole accepted text
        nxt = prompt(23, 1)
        ours = runner.forward(nxt, 13 + n + 1)[-1]
        theirs = target(torch.cat((ids, block[:, : n + 1], nxt), 1)).logits[0, -1]
        torch.testing.assert_close(ours, theirs, **TOL)


def test_static_engine_survives_the_graph_engines_warm_up_runs(monkeypatch):
    """The graphs engine runs every new step twice before capturing it (CapturedStep's warm-up). A verify commits
    the accepted position's recurrent state into the buffer it starts from, so without its state restored the
    warm-up runs advance the target's state two blocks too far (on the H200: same tokens by luck in a 12-token
    vocabulary, but different drafter features and acceptance lengths). The static engine with the same warm-up
    runs, on CPU, must give the foundation loop's tokens and acceptance lengths and the very state a run without
    warm-up leaves."""
    from fold_hf.generation import fast
    from fold_hf.generation.graphs import EagerStep

    target = qwen35_target(seed=5)
    drafter = qwen35_drafter(target)
    cfg = mode_config("fold")
    ids = prompt(2, 60)
    try:
        ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, return_stats=True,
                               fold_config=cfg)
        states = {}
        for warmup in (0, 2):
            monkeypatch.setattr(fast.session, "EagerStep", functools.partial(EagerStep, warmup=warmup))
            fold_hf.generation.release_fast_state(target)
            res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=24, engine="static",
                                        return_stats=True, fold_config=cfg)
            assert torch.equal(res.sequences, ref.sequences), warmup
            assert res.acceptance_lengths == ref.acceptance_lengths, warmup
            states[warmup] = [t.clone() for t in target.__dict__[fast._SESSION_ATTR].runner.step_state()]
        assert len(states[0]) == 12  # 6 linear-attention layers: convolution and recurrent state each
        for clean, warmed in zip(states[0], states[2]):
            assert torch.equal(clean, warmed)
    finally:
        fold_hf.generation.release_fast_state(target)


def test_fast_path_unsupported_target_says_why():
    from transformers import Qwen3_5ForCausalLM

    from fold_hf.generation.fast import fast_unsupported

    target = qwen35_target()
    cfg = target.config.to_dict()
    cfg["hidden_act"] = "gelu"
    gelu = Qwen3_5ForCausalLM(type(target.config).from_dict(cfg))
    assert "silu" in fast_unsupported(gelu)
    assert fast_unsupported(target) is None


# ---------------------------------------------------------------------------------------------- kernel
def _float64_loop(q, k, v, g, beta, state):
    """The gated delta rule written per head and per token in float64, from the recurrence."""
    L, Hk, Dk = k.shape
    Hv = v.shape[1]
    S = state.double().clone()
    out = torch.zeros(L, Hv, v.shape[2], dtype=torch.float64)
    states = torch.zeros(L, *S.shape, dtype=torch.float64)
    for t in range(L):
        for h in range(Hv):
            hk = h // (Hv // Hk)
            kt, qt, vt = k[t, hk].double(), q[t, hk].double(), v[t, h].double()
            S[h] = S[h] * torch.exp(g[t, h].double())
            read = S[h].T @ kt
            S[h] = S[h] + torch.outer(kt, float(beta[t, h]) * (vt - read))
            out[t, h] = S[h].T @ qt
            states[t, h] = S[h]
    return out, states


def _inputs(L=5, Hk=2, Hv=6, Dk=12, Dv=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    norm = torch.nn.functional.normalize
    q = norm(torch.randn(L, Hk, Dk, generator=g), dim=-1) * Dk ** -0.5
    k = norm(torch.randn(L, Hk, Dk, generator=g), dim=-1)
    v = torch.randn(L, Hv, Dv, generator=g)
    gate = -torch.rand(L, Hv, generator=g) * 2
    beta = torch.rand(L, Hv, generator=g)
    state = torch.randn(Hv, Dk, Dv, generator=g)
    return q, k, v, gate, beta, state


def test_gated_delta_reference_against_float64_loop_and_transformers():
    q, k, v, gate, beta, state = _inputs()
    out, states = gated_delta_states_reference(q, k, v, gate, beta, state)
    want_out, want_states = _float64_loop(q, k, v, gate, beta, state)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states.double(), want_states, atol=1e-5, rtol=1e-5)
    # transformers' own recurrent rule (it L2-normalizes and scales q itself; ours arrive prepared)
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    group = v.shape[1] // k.shape[1]  # 5.17's rule takes as many q/k heads as v heads
    hf_out, hf_state = m.torch_recurrent_gated_delta_rule(
        q.repeat_interleave(group, 1)[None], k.repeat_interleave(group, 1)[None], v[None], g=gate[None], beta=beta[None], initial_state=state[None],
        output_final_state=True, use_qk_l2norm_in_kernel=False)
    # transformers scales q by Dk ** -0.5 again: compare against our output for q * Dk ** -0.5
    scaled_out, _ = gated_delta_states_reference(q * q.shape[-1] ** -0.5, k, v, gate, beta, state)
    torch.testing.assert_close(hf_out[0], scaled_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hf_state[0], states[-1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 1, 8, 8), (5, 2, 6, 12, 20), (16, 2, 4, 32, 48)])
def test_gated_delta_triton_in_interpreter(interpreter, shape):
    from fold_hf.kernels.gated_delta.triton import gated_delta_states_triton

    q, k, v, gate, beta, state = _inputs(*shape)
    out, states = gated_delta_states_triton(q, k, v, gate, beta, state)
    ref_out, ref_states = gated_delta_states_reference(q, k, v, gate, beta, state)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states, ref_states, atol=1e-5, rtol=1e-5)
    want_out, want_states = _float64_loop(q, k, v, gate, beta, state)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(states.double(), want_states, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu(reason="the 9B shape: too slow in the interpreter (it checks small shapes)")
def test_gated_delta_triton_on_gpu_at_the_9b_shape():
    from fold_hf.kernels.gated_delta.triton import gated_delta_states_triton

    q, k, v, gate, beta, state = (t.cuda() for t in _inputs(16, 16, 32, 128, 128, seed=3))
    out, states = gated_delta_states_triton(q, k, v, gate, beta, state)
    ref_out, ref_states = gated_delta_states_reference(q, k, v, gate, beta, state)
    torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(states, ref_states, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu(reason="CUDA graphs: the graphs engine captures on a CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_graph_engine_matches_the_foundation_loop_on_gpu(mode):
    """fp32 on CUDA: the captured verify (Triton gated delta rule, per-position states selected on device) and the
    captured sliding-window drafter step give the foundation loop's tokens and acceptance lengths."""
    target = qwen35_target(seed=5)
    target.to("cuda", torch.float32)
    drafter = qwen35_drafter(target).to("cuda", torch.float32)
    try:
        cfg = mode_config(mode)
        for seed, length in enumerate([9, 40, 300]):
            ids = prompt(seed, length).cuda()
            ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, return_stats=True,
                                   fold_config=cfg)
            assert torch.equal(ref.sequences, reference(target, ids, 24))
            ar = fold_hf.fast_generate(target, None, ids, max_new_tokens=24, engine="graphs")
            assert torch.equal(ar, ref.sequences)
            for engine in ("static", "graphs"):
                res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=24, engine=engine,
                                            return_stats=True, fold_config=cfg)
                assert torch.equal(res.sequences, ref.sequences), (mode, engine, length)
                assert res.acceptance_lengths == ref.acceptance_lengths, (mode, engine, length)
    finally:
        fold_hf.generation.release_fast_state(target)
        qwen35_target.cache_clear()


@pytest.mark.gpu(reason="CUDA graphs: the captured verify of the MoE step and of the wrappers replays on a CUDA device")
@pytest.mark.parametrize("arch", VARIANTS)
def test_variants_graphs_engine_on_gpu(arch):
    """fp32 on CUDA: the captured verify (the MoE step gathers its experts inside the graph; a capture with a host
    read would raise) gives the target's own greedy output, module and fused layers, with the foundation loop's
    acceptance lengths."""
    target = tiny_target(arch, seed=3, dtype=torch.float32).cuda()
    drafter = tiny_drafter(target, block=BLOCK, taps=(1, 3)).cuda()
    try:
        for seed, length in enumerate([9, 40, 300]):
            ids = prompt(seed, length).cuda()
            ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, return_stats=True)
            assert torch.equal(ref.sequences, reference(target, ids, 24)), (arch, length)
            for extra in (dict(), dict(target_attention="triton", fused_layers=True)):
                res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=24, engine="graphs",
                                            return_stats=True, **extra)
                assert torch.equal(res.sequences, ref.sequences), (arch, length, extra)
                assert res.acceptance_lengths == ref.acceptance_lengths, (arch, length, extra)
    finally:
        fold_hf.generation.release_fast_state(target)


def test_cmr_runs_captured_and_drafts_what_the_loop_drafts():
    """cmr's refreshes read the verify's queries of the last full-attention layer: the Qwen3.5 runner keeps them
    (module and fused layers), so the static engine runs cmr's capturable step without a warning and proposes
    what the foundation loop proposes, round by round."""
    from tiny import fit_drafter

    target = qwen35_target()
    drafter = fit_drafter(target, qwen35_drafter(target, sliding=False), steps=80, seq_len=40)  # drafts that
    ids = prompt(5, 80)  # depend on what the refreshes select (a random drafter proposes one token everywhere)
    cfg = mode_config("cmr")
    ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, fold_config=cfg, return_stats=True)
    assert torch.equal(ref.sequences, reference(target, ids, 24))
    for extra in (dict(), dict(target_attention="triton", fused_layers=True)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "drafts eagerly" / "mode 'cmr' on this target" warning
            res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=24, fold_config=cfg, engine="static",
                                        return_stats=True, **extra)
        assert torch.equal(res.sequences, ref.sequences), extra
        assert res.proposals == ref.proposals, extra
        fold_hf.generation.release_fast_state(target)
