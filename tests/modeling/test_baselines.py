"""The paper's Appendix B.3 baselines against loop-based statements of their rules (float64): ReRoPE (distance D
at every block row, log-4096 query scaling, layer scopes), InfLLM (blocks, representatives, top-k selection,
distance D - 1, one softmax), CMR (chunks, refresh schedule from the target's attention, renumbering), and greedy
losslessness of both retrieval modes on every generate path."""

import math
import warnings

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig
from fold_hf.generation.fast import fast_generate
from fold_hf.modeling.fold_read import fold_attention_reference
from fold_hf.modeling import plan_layer_read
from fold_hf.modeling.read_plan import read_geometry
from fold_hf.modeling import drafter as drafter_module
from fold_hf.modeling.retrieval import (RetrievalParams, RetrievalState, TargetAttentionProbe, cmr_select_entries,
                                        plan_cmr_read, plan_infllm_read, target_attention_probe)
from naive import rope_complex
from test_fold_attention import THETA, inputs, rel_err, tables
from tiny import MASK_ID, SMALL_RETRIEVAL, greedy_reference, mode_config, trained_pair

SCALING = 8**-0.5


def one_softmax_naive(q, k_ctx, v_ctx, k_blk, v_blk, *, t, D, old_distance, row_scale=None, old=None, window=None):
    """One softmax per row over: context entries in the row's window (``p - j < window``, true positions), the
    block (true positions), and old entries (``old(r, j)`` true, outside the window) read at ``old_distance(r)``.
    q ``[Hq, Lq, d]``; returns ``[Lq, Hq, d]`` (float64, loops)."""
    Hq, Lq, _ = q.shape
    Hkv, T, _ = k_ctx.shape
    window = D if window is None else window
    out = torch.zeros(Lq, Hq, v_ctx.shape[-1], dtype=torch.float64)
    for h in range(Hq):
        kv = h // (Hq // Hkv)
        for r in range(Lq):
            p = t + r
            scale = 1.0 if row_scale is None else row_scale(p)
            qp = rope_complex(q[h, r] * scale, p, THETA, 8)
            s, v = [], []
            for j in range(T):
                if p - j < window:
                    s.append(SCALING * qp.dot(rope_complex(k_ctx[kv, j], j, THETA, 8)))
                    v.append(v_ctx[kv, j])
                elif old is None or old(r, j):
                    s.append(SCALING * qp.dot(rope_complex(k_ctx[kv, j], p - old_distance(r), THETA, 8)))
                    v.append(v_ctx[kv, j])
            for rr in range(Lq):
                s.append(SCALING * qp.dot(rope_complex(k_blk[kv, rr], t + rr, THETA, 8)))
                v.append(v_blk[kv, rr])
            out[r, h] = torch.softmax(torch.stack(s), 0) @ torch.stack(v).double()
    return out


# ---------------------------------------------------------------------------------------------- ReRoPE
def rerope_scale(p):
    return max(1.0, math.log(p + 1) / math.log(4096))


@pytest.mark.parametrize("train_length", [64, 100000])
def test_rerope_reads_older_entries_at_distance_D_from_every_row_with_log_4096_scaling(train_length):
    # block rows at p ~ 5000 so that log(p + 1) / log 4096 > 1; W chosen so the window splits the 40 entries per row
    T, t, B, W = 40, 5000, 4, 4980
    D = W + B
    cfg = FoldConfig(mode="rerope", window=W, train_length=train_length)  # train_length plays no part any more
    q, kc, vc, kb, vb = inputs(T)
    read = plan_layer_read(cfg, num_context=T, block_start=t, query_length=B, block_size=B, rope=tables())
    assert read.far_distance.tolist() == [D] * B
    assert torch.allclose(read.query_scale.double(), torch.tensor([rerope_scale(t + r) for r in range(B)],
                                                                  dtype=torch.float64), rtol=1e-6)
    assert read.query_scale.min() > 1.0
    out = fold_attention_reference(q, kc, vc, kb, vb, read, SCALING)
    ref = one_softmax_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=t, D=D, old_distance=lambda r: D,
                            row_scale=rerope_scale)
    assert rel_err(out[0], ref) < 1e-6  # the row scale is fp32


def test_rerope_scale_is_one_below_position_4095():
    read = plan_layer_read(FoldConfig(mode="rerope", window=16, train_length=64), num_context=40, block_start=40,
                           query_length=4, block_size=4, rope=tables())
    assert read.query_scale.tolist() == [1.0] * 4  # log(p + 1) / log 4096 < 1 for p < 4095


def test_rerope_scopes_on_sliding_layers():
    T, t, B, W, S = 40, 5000, 4, 4980, 4970
    q, kc, vc, kb, vb = inputs(T)

    def read(layers, mode="rerope"):
        return plan_layer_read(FoldConfig(mode=mode, window=W, layers=layers), num_context=T, block_start=t,
                               query_length=B, block_size=B, rope=tables(), sliding_window=S)

    released = read("all", mode="dflash")
    full = read("full")
    assert full.query_scale is None and full.far_stop == 0  # exactly as released: no scaling, no older entries
    assert torch.equal(fold_attention_reference(q, kc, vc, kb, vb, full, SCALING),
                       fold_attention_reference(q, kc, vc, kb, vb, released, SCALING))
    every = read("all")  # native window S for nearby entries, older entries at the shared distance W + B
    out = fold_attention_reference(q, kc, vc, kb, vb, every, SCALING)
    ref = one_softmax_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=t, D=W + B, window=S, old_distance=lambda r: W + B,
                            row_scale=rerope_scale)
    assert rel_err(out[0], ref) < 1e-6


def test_retrieval_scopes_on_sliding_layers():
    """InfLLM leaves a sliding layer as released; CMR's sliding layer reads the selection renumbered."""
    from tiny import drafter_config, tiny_target

    target = tiny_target("qwen3", seed=3)
    drafter = fold_hf.FoldDrafter(drafter_config(target, layer_types=["sliding_attention", "full_attention"],
                                                 sliding_window=12), mode_config("infllm")).double()
    sliding = drafter.plan_read(0, 60, 60, 4)
    assert sliding.far_stop == 0 and sliding.near_index.tolist() == list(range(60 - 12 + 1, 60))
    with pytest.raises(ValueError, match="plan it through"):
        drafter.plan_read(1, 60, 60, 4)
    entries = torch.tensor([0, 1, 2, 40, 41, 59])
    cmr = drafter.plan_read(0, 60, 60, 4, fold_config=mode_config("cmr"), selection=entries)
    assert cmr.near_index.tolist() == entries.tolist() and cmr.near_key_pos.tolist() == list(range(6))
    assert cmr.query_pos.tolist() == [6, 7, 8, 9]


# ---------------------------------------------------------------------------------------------- InfLLM
def infllm_rule(q, keys, received, seen, *, t, D, P):
    """The blocks InfLLM reads, from the paper's words, with loops: returns (selected blocks, old-set predicate)."""
    Hq, Lq, d = q.shape
    Hkv, T, _ = keys.shape
    outside = max(0, t - D + 1)
    n_blocks = max(0, outside - P.infllm_init) // P.infllm_block
    grouped_end = P.infllm_init + n_blocks * P.infllm_block
    qbar = q.double().mean(1)  # [Hq, d]
    scores = []
    for b in range(n_blocks):
        entries = range(P.infllm_init + b * P.infllm_block, P.infllm_init + (b + 1) * P.infllm_block)
        total = 0.0
        for h in range(Hq):
            kv = h // (Hq // Hkv)
            if any(bool(seen[j]) for j in entries):
                best = sorted(entries, key=lambda j: (-float(received[h, j]), j))[: P.infllm_repr]
            else:
                best = list(entries)
            rep = torch.stack([keys[kv, j].double() for j in best]).mean(0)
            total += float(qbar[h] @ rep)
        scores.append(total)
    if n_blocks <= P.infllm_topk:
        chosen = list(range(n_blocks))
    else:
        chosen = sorted(sorted(range(n_blocks), key=lambda b: (-scores[b], b))[: P.infllm_topk])
    chosen_entries = {P.infllm_init + b * P.infllm_block + i for b in chosen for i in range(P.infllm_block)}

    def old(r, j):
        return j < P.infllm_init or j >= grouped_end or j in chosen_entries

    return chosen, old


@pytest.mark.parametrize("seed", [0, 1])
def test_infllm_read_matches_its_rule(seed):
    P = RetrievalParams(**SMALL_RETRIEVAL)
    T, B, W = 120, 4, 16
    D = W + B
    q, kc, vc, kb, vb = inputs(T, seed=seed)
    g = torch.Generator().manual_seed(seed)
    state = RetrievalState()
    layer = state.infllm_layer(0)
    layer.grow(4, T, "cpu", torch.float64)
    layer.received[:, :T] = torch.rand(4, T, generator=g, dtype=torch.float64)
    layer.seen[:T] = torch.rand(T, generator=g) < 0.3  # some blocks were seen, others never
    received, seen = layer.received.clone(), layer.seen.clone()
    geometry = read_geometry(FoldConfig(mode="infllm", window=W), B)
    assert (geometry.window, geometry.far, geometry.alpha) == (D, D - 1, 1.0)
    read = plan_infllm_read(state, 0, query=q, context_keys=kc, block_start=T, geometry=geometry, rope=tables(),
                            params=P)
    chosen, old = infllm_rule(q[0], kc[0], received, seen, t=T, D=D, P=P)
    assert len(chosen) == P.infllm_topk and state.last_selection[0].tolist() == chosen
    assert read.far_distance.tolist() == [D - 1] * B
    kg, vg = kc[:, :, read.gather], vc[:, :, read.gather]  # the read's compact context
    assert read.gather.numel() < T  # only what it reads
    out = fold_attention_reference(q, kg, vg, kb, vb, read, SCALING)
    ref = one_softmax_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, D=D, old_distance=lambda r: D - 1, old=old)
    assert rel_err(out[0], ref) < 1e-12

    # the read then adds the attention its window entries received (one softmax over everything read)
    class Attn:
        scaling = SCALING

    read.on_read(Attn(), q, kg, kb)
    added = layer.received[:, :T] - received[:, :T]
    expected = torch.zeros(4, T, dtype=torch.float64)
    for h in range(4):
        kv = h // 2
        for r in range(B):
            p = T + r
            qp = rope_complex(q[0, h, r], p, THETA, 8)
            logits, cols = [], []
            for j in range(T):
                if p - j < D:
                    logits.append(SCALING * qp.dot(rope_complex(kc[0, kv, j], j, THETA, 8)))
                    cols.append(j)
                elif old(r, j):
                    logits.append(SCALING * qp.dot(rope_complex(kc[0, kv, j], p - (D - 1), THETA, 8)))
                    cols.append(None)
            for rr in range(B):
                logits.append(SCALING * qp.dot(rope_complex(kb[0, kv, rr], T + rr, THETA, 8)))
                cols.append(None)
            w = torch.softmax(torch.stack(logits), 0)
            for c, x in zip(cols, w):
                if c is not None:
                    expected[h, c] += x
    assert torch.allclose(added, expected, atol=1e-12)
    assert bool(layer.seen[T - D + 1 : T].all())


def test_infllm_never_seen_blocks_use_the_mean_key():
    from fold_hf.modeling.retrieval import infllm_block_representatives

    P = RetrievalParams(**SMALL_RETRIEVAL)
    keys = torch.randn(2, 40, 8, dtype=torch.float64)
    received = torch.rand(4, 40, dtype=torch.float64)
    seen = torch.zeros(40, dtype=torch.bool)
    seen[20] = True  # block 1 (entries 16..23) was seen
    reps = infllm_block_representatives(keys, received, seen, range(0, 4), 4, P)
    assert torch.allclose(reps[0, 0], keys[0, 8:16].mean(0))  # block 0 never seen
    top = sorted(range(16, 24), key=lambda j: -float(received[3, j]))[:2]
    assert torch.allclose(reps[3, 1], keys[1, top].mean(0))


# ---------------------------------------------------------------------------------------------- CMR
class FakeProbe:
    """Stands in for the target: the attention of the query at position ``p`` is a fixed random vector."""

    def __init__(self, seed):
        self.g = torch.Generator().manual_seed(seed)
        self.armed = False
        self.table = {}
        self.armed_log = []

    def weights_of_position(self, position):
        return self.table.setdefault(position, torch.rand(position + 1, generator=self.g, dtype=torch.float64))


def test_cmr_schedule_matches_its_rule():
    P = RetrievalParams(**SMALL_RETRIEVAL, cmr_chunks=4)  # chunks of 8, 4 chunks, refresh every 3 rounds
    state = RetrievalState()
    state.probe = probe = FakeProbe(0)
    T = 70
    selected, base = None, None
    for k in range(11):
        entries = cmr_select_entries(state, T, T, P)
        n_chunks = -(-T // 8)
        # the rule, stated plainly
        if k == 0:
            selected, base = list(range(n_chunks - 4, n_chunks)), n_chunks
        elif k % 3 == 0:
            w = probe.table[T - 1]
            means = [float(w[8 * c: min(8 * c + 8, T)].mean()) for c in range(n_chunks)]
            selected, base = sorted(sorted(range(n_chunks), key=lambda c: (-means[c], c))[:4]), n_chunks
        chunks = selected + list(range(base, n_chunks))
        expected = [j for c in chunks for j in range(8 * c, min(8 * c + 8, T))]
        assert entries.tolist() == expected, k
        assert probe.armed == ((k + 1) % 3 == 0)  # only the verification before a refresh records attention
        T += 1 + (k % 4) * 2  # rounds commit 1..7 entries: new chunks start and join
    assert state.cmr.refreshes == [3, 6, 9]


def test_cmr_renumbers_the_selection_and_the_block_follows():
    T, B = 50, 4
    entries = torch.tensor([0, 1, 2, 3, 16, 17, 30, 31, 32, 49])
    q, kc, vc, kb, vb = inputs(T)
    read = plan_cmr_read(entries, num_context=T, block_start=T, query_length=B, rope=tables(), sliding_window=None,
                         device="cpu")
    out = fold_attention_reference(q, kc, vc, kb, vb, read, SCALING)
    K = len(entries)
    ref = one_softmax_naive(q[0], kc[0, :, entries], vc[0, :, entries], kb[0], vb[0], t=K, D=10**9,
                            old_distance=lambda r: 0)
    assert rel_err(out[0], ref) < 1e-12


def test_probe_records_the_targets_attention_weights_heads_averaged():
    from tiny import tiny_target

    target = tiny_target("llama", seed=5)
    target.config._attn_implementation = "eager"
    ids = torch.randint(0, MASK_ID, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = target(ids, output_attentions=True).attentions[-1][0].mean(0)  # [L, L], last (full) layer
    with TargetAttentionProbe(target) as probe:
        probe.armed = True
        with torch.no_grad():
            target(ids)
        for p in (0, 17, 29):
            assert torch.allclose(probe.weights_of_position(p), ref[p, : p + 1], atol=1e-10)
    assert target.model.layers[-1].self_attn.config is target.config  # restored


def test_other_modes_never_install_the_probe():
    target, drafter = trained_pair("llama")
    module = target.model.layers[-1].self_attn
    drafter.set_fold_config(mode_config("fold"))
    with target_attention_probe(target, drafter) as probe:
        assert probe is None and module.config is target.config


# ---------------------------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("mode", ["infllm", "cmr"])
def test_retrieval_modes_are_lossless_on_every_path(mode, monkeypatch):
    target, drafter = trained_pair("llama")
    selected = []
    original = drafter_module.plan_infllm_read

    def spy(state, layer_idx, **kw):
        read = original(state, layer_idx, **kw)
        selected.append(state.last_selection[layer_idx].numel())
        return read

    monkeypatch.setattr(drafter_module, "plan_infllm_read", spy)
    refreshes = []
    original_weights = TargetAttentionProbe.weights_of_position
    monkeypatch.setattr(TargetAttentionProbe, "weights_of_position",
                        lambda self, p: refreshes.append(p) or original_weights(self, p))
    for seed, length in enumerate([37, 300]):
        ids = torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(1000 + seed))
        ref = greedy_reference(target, ids, 40)
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=40, return_stats=True,
                               fold_config=mode_config(mode))
        assert torch.equal(res.sequences, ref)
        drafter.set_fold_config(mode_config(mode))
        assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=40, do_sample=False), ref)
        assert drafter.last_acceptance_lengths == res.acceptance_lengths  # same drafts on both paths
        # transformers' own assisted loop with our candidate generator (the front door's fallback)
        assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                                           fold_fast=False), ref)
        assert drafter.last_acceptance_lengths == res.acceptance_lengths
        for engine in ("eager", "static"):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # the static engine runs the capturable step: no "eagerly" warning
                fast = fast_generate(target, drafter, ids, max_new_tokens=40, return_stats=True,
                                     fold_config=mode_config(mode), engine=engine)
            assert torch.equal(fast.sequences, ref), engine
            assert fast.acceptance_lengths == res.acceptance_lengths, engine
            assert fast.proposals == res.proposals, engine  # the same drafts, round by round
    if mode == "infllm":
        assert max(selected) == SMALL_RETRIEVAL["infllm_topk"]  # the long prompt had more blocks than it reads
    else:
        assert len(refreshes) >= 4  # refreshes ran on every path


@pytest.mark.parametrize("mode", ["infllm", "cmr"])
def test_static_retrieval_step_with_the_fused_layer_ops_drafts_what_the_loop_drafts(mode, monkeypatch):
    """The static step with the fused elementwise ops and the target's fused layers (their torch twins here; the
    graphs engine's path on CUDA), each step run twice more when it is made, as the graphs engine's warm-up before capture does: the retrieval
    state those runs advance (InfLLM's statistics) is put back."""
    import functools

    from fold_hf.generation import fast
    from fold_hf.generation.graphs import EagerStep

    target, drafter = trained_pair("llama")
    fast.release_fast_state(target)
    monkeypatch.setattr(fast.api, "resolve_fused_drafter", lambda *args: True)
    monkeypatch.setattr(fast.session, "EagerStep", functools.partial(EagerStep, warmup=2))
    ids = torch.randint(0, MASK_ID, (1, 300), generator=torch.Generator().manual_seed(1001))
    ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=40, return_stats=True,
                           fold_config=mode_config(mode))
    # the target's fused layers with the decode kernel's twin: cmr's verify keeps its queries on that path too
    res = fast_generate(target, drafter, ids, max_new_tokens=40, return_stats=True, fold_config=mode_config(mode),
                        engine="static", target_attention="triton", fused_layers=True)
    fast.release_fast_state(target)
    assert torch.equal(res.sequences, ref.sequences) and res.proposals == ref.proposals


def test_cmr_on_a_target_whose_verify_keeps_no_queries_warns_and_stays_lossless(monkeypatch):
    from fold_hf.generation import fast
    from fold_hf.targets.llama import LlamaStaticTarget

    target, drafter = trained_pair("llama")
    monkeypatch.setattr(LlamaStaticTarget, "keep_queries_unsupported", lambda self: "no query tap (test)")
    fast.release_fast_state(target)
    ids = torch.randint(0, MASK_ID, (1, 120), generator=torch.Generator().manual_seed(7))
    fast._WARNED.clear()  # warnings come once per process
    with pytest.warns(UserWarning, match="mode 'cmr' on this target: no query tap"):
        res = fast_generate(target, drafter, ids, max_new_tokens=16, fold_config=mode_config("cmr"),
                            engine="static")
    fast.release_fast_state(target)
    assert torch.equal(res, greedy_reference(target, ids, 16))


def test_only_cmr_requests_keep_the_verify_queries():
    """cmr's verify copies the target's queries of one layer (its refreshes read them); every other request's verify
    keeps none and replays its own steps (keyed without the copy)."""
    from fold_hf.generation.fast import _SESSION_ATTR

    target, drafter = trained_pair("llama")
    ids = torch.randint(0, MASK_ID, (1, 60), generator=torch.Generator().manual_seed(3))
    fold_hf.generation.release_fast_state(target)
    for mode in ("cmr", "fold"):
        fast_generate(target, drafter, ids, max_new_tokens=12, fold_config=mode_config(mode), engine="static")
    session = target.__dict__[_SESSION_ATTR]
    assert session.runner.query_keep is None  # the cmr request turned it off again
    # round steps: ("round", tag, drafts, with_far, phase, rows, bucket, taps, attention, fused, keeps_queries, ...)
    rounds = [k for k in session.steps if k[0] == "round"]
    assert {k[10] for k in rounds if k[4] is not None} == {True}  # cmr's phased rounds verify with the copy
    assert {k[10] for k in rounds if k[2] and k[4] is None} == {False}  # fold's drafting rounds without it
    fold_hf.generation.release_fast_state(target)


def static_rounds_against_the_loop(drafter, commits, read_function=None, prompt_length=120, dtype=None):
    """Drive the static drafting step and the loop drafter (``draft_logits``) through the same rounds: the prompt's
    taps, then ``commits[k]`` rows before round k (round 0 commits none); asserts the same proposals every round.
    Returns (static step, loop cache, context length)."""
    from fold_hf.generation.static_drafter import StaticDrafter, commit_context, preallocated_cache
    from fold_hf.targets.taps import HiddenTaps

    target, _ = trained_pair("llama")
    ids = torch.randint(0, MASK_ID, (1, prompt_length + sum(commits) + 1), generator=torch.Generator().manual_seed(21))
    with HiddenTaps(target, drafter.config.target_layer_ids) as taps:
        target(ids)
    features = taps.features().to(dtype or drafter.fc.weight.dtype)
    R = drafter.num_proposals + 1
    loop_cache = drafter.new_cache(request_length=256)
    cache = preallocated_cache(drafter, 256, "cpu", 256)
    static = StaticDrafter(drafter, cache, read_function)
    static.start_request(256)
    commit_context(drafter, cache, features[:, :prompt_length])
    static.start_rounds(prompt_length)
    state = torch.zeros(8, dtype=torch.long)
    T = prompt_length
    for k, n in enumerate(commits):
        T += n
        context = features[:, :prompt_length] if k == 0 else features[:, T - n:T]
        want = drafter.draft_logits(ids[0, T:T + 1], context, loop_cache, block_start=T)[0].argmax(-1)
        rows = torch.zeros(1, R, features.shape[-1], dtype=features.dtype)
        rows[:, :n] = features[:, T - n:T]
        state[1], state[2], state[3] = T - n, n, int(ids[0, T])
        got = static.draft(rows, state, static.needs_far(T), phase=static.next_phase(T))
        assert torch.equal(got, want), (k, T)
    return static, loop_cache, T


def test_static_infllm_statistics_and_selection_follow_the_loop():
    """Round by round with uneven commits: the device statistics (window attention received, seen flags), the
    block representatives and the proposals equal the loop's (fold_hf.modeling.retrieval) state."""
    from fold_hf.modeling.retrieval import infllm_block_layout

    _, drafter = trained_pair("llama")
    drafter.set_fold_config(mode_config("infllm"))
    P_ = RetrievalParams.of(drafter.fold_config)
    static, loop_cache, T = static_rounds_against_the_loop(drafter, [0, 3, 1, 4, 2, 4, 4, 1, 3, 4, 2, 4, 4, 3])
    n_blocks, _ = infllm_block_layout(T, drafter.fold_config.window + drafter.block_size, P_)
    assert n_blocks > P_.infllm_topk
    for i, loop_layer in loop_cache.retrieval.infllm.items():
        assert torch.allclose(static.infllm.received[i][:, :T], loop_layer.received[:, :T].to(torch.float64),
                              rtol=1e-9, atol=1e-12), i
        assert torch.equal(static.infllm.seen[i][:T] > 0, loop_layer.seen[:T]), i
        assert torch.allclose(static.infllm.reprs[i][:, :n_blocks], loop_layer.reprs[:, :n_blocks], rtol=1e-9), i
        assert float(loop_layer.received[:, :T].sum()) > 0


@pytest.mark.parametrize("mode", ["infllm", "cmr"])
def test_static_retrieval_steps_through_the_triton_read_in_the_interpreter(interpreter, mode):
    """The FOLD read kernel (Triton's interpreter, fp32) on InfLLM's compact context (per-slot rope rows, the far
    branch at D - 1) and CMR's renumbered selection drafts what the loop drafts (rounds before CMR's first
    refresh: the loop's refresh needs the target)."""
    import copy

    from fold_hf.kernels.fold_read.triton import fold_read_triton

    _, base = trained_pair("llama")
    drafter = copy.deepcopy(base).float().set_fold_config(mode_config(mode))
    commits = [0, 4, 3]  # blocks form and selections change (InfLLM); initial and grow phases (CMR)
    static_rounds_against_the_loop(drafter, commits, fold_read_triton, prompt_length=60)


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu(reason="CUDA graphs: the captured infllm/cmr draft steps replay on a CUDA device with the Triton read")
@pytest.mark.parametrize("mode", ["infllm", "cmr"])
def test_captured_retrieval_steps_equal_the_loop_on_gpu(mode):
    from fold_hf.generation.fast import _SESSION_ATTR
    from fold_hf.generation.graphs import CapturedStep
    from tiny import pair_on_gpu

    with pair_on_gpu("llama") as (target, drafter):
        # 600 after 700: a second request on the same session replays the steps captured for the first
        for seed, length in enumerate([37, 300, 700, 600]):
            ids = torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(1000 + seed)).cuda()
            ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=40, return_stats=True,
                                   fold_config=mode_config(mode))
            assert torch.equal(ref.sequences, greedy_reference(target, ids, 40)), length
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                res = fast_generate(target, drafter, ids, max_new_tokens=40, return_stats=True,
                                    fold_config=mode_config(mode), engine="graphs")
            assert not [w for w in caught if "uncaptured" in str(w.message) or "host-length" in str(w.message)]
            assert torch.equal(res.sequences, ref.sequences), length
            assert res.acceptance_lengths == ref.acceptance_lengths, length
            assert res.proposals == ref.proposals, length
        steps = target.__dict__[_SESSION_ATTR].steps
        # one captured step per drafting round: ("round", draft tag, drafts, with_far, phase, ...)
        drafts = {k: v for k, v in steps.items() if k[0] == "round" and k[2]}
        assert drafts and all(isinstance(v, CapturedStep) for v in drafts.values())
        if mode == "cmr":  # initial, refresh and grow rounds each replay their own captured step
            assert {k[4] for k in drafts} == {"initial", "refresh", "grow"}
