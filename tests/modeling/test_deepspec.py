"""DeepSpec DFlash (markov_rank 0) and DSpark (markov_rank > 0) drafters, Qwen3-like and Gemma-4-like, loaded from
tiny checkpoints the tests write in DeepSpec's layout (tests/deepspec_tiny.py).

* block logits and greedy Markov proposals against a float64 reference written from the format description;
* greedy output = the target's greedy output in every reading mode on all three paths (``fold_hf.generate``,
  ``target.generate(assistant_model=...)``, ``fold_hf.fast_generate`` eager and static engines, the static step
  taking the Markov head's argmax slot by slot on the device);
* speculative sampling with the Markov head's draft distribution keeps the target's distribution (χ²);
* save/load round trips and errors naming the file and field.
"""

import functools
import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

import fold_hf
from fold_hf import FoldConfig, FoldDrafter
from fold_hf.generation import fast as fast_module
from fold_hf.generation import fast_generate
from fold_hf.generation.fast import release_fast_state
from fold_hf.generation.static_drafter import StaticDrafter, commit_context, preallocated_cache
from fold_hf.targets.taps import HiddenTaps
from fold_hf.targets import gemma
from fold_hf.kernels import default_layer_ops
from deepspec_tiny import (MASK_ID, deepspec_config, deepspec_weights, markov_step_distributions, reference_block,
                           target_bigram, tiny_gemma4_target, write_checkpoint)
from tiny import GEMMA_WINDOW, greedy_reference, mode_config, tiny_target

MODES = ["fold", "dflash", "window", "streaming", "rerope", "yarn"]
KINDS = ["dflash", "dspark"]


@functools.lru_cache(maxsize=None)
def qwen3_target():
    return tiny_target("qwen3", seed=3)


@functools.lru_cache(maxsize=None)
def gemma4_target():
    return tiny_gemma4_target(seed=4)


def checkpoint(tmp_path_factory, variant: str, kind: str, confidence: bool = False, block: int = 4,
               dtype=torch.float64, target=None):
    """(directory, config dict, float64 weights) of a tiny DeepSpec drafter for the variant's tiny target."""
    target = target or (qwen3_target() if variant == "qwen3" else gemma4_target())
    V = target.config.vocab_size
    rank = V if kind == "dspark" else 0
    cfg = deepspec_config(target, variant, block=block, markov_rank=rank, confidence=confidence,
                          with_markov=confidence and rank > 0)
    # DSpark: a Markov head following the target's greedy bigrams, so proposals are accepted often
    weights = deepspec_weights(cfg, target, seed=7, bigram=target_bigram(target) if rank else None)
    directory = tmp_path_factory.mktemp(f"{variant}-{kind}")
    return write_checkpoint(directory, cfg, weights, dtype=dtype), cfg, weights


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    """Loaded drafters by (variant, kind), float64, with their config dicts and weights."""
    out = {}
    for variant in ("qwen3", "gemma4"):
        for kind in KINDS:
            directory, cfg, weights = checkpoint(tmp_path_factory, variant, kind, confidence=True)
            out[variant, kind] = (FoldDrafter.from_pretrained(directory), cfg, weights, directory)
    return out


def prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(3000 + seed))


def taps_of(target, drafter, ids):
    taps = HiddenTaps(target, drafter.config.target_layer_ids)
    with taps, torch.no_grad():
        target(ids)
    return taps.features()


# ------------------------------------------------------------------------------------------------ forward
@pytest.mark.parametrize("variant", ["qwen3", "gemma4"])
@pytest.mark.parametrize("kind", KINDS)
def test_block_logits_and_greedy_proposals_match_the_float64_reference(drafters, variant, kind):
    drafter, cfg, weights, _ = drafters[variant, kind]
    target = qwen3_target() if variant == "qwen3" else gemma4_target()
    drafter.bind_target(target).set_fold_config(FoldConfig(mode="dflash"))
    assert drafter.family == "deepspec" and drafter.num_proposals == cfg["block_size"]
    assert (drafter.markov_head is not None) == (kind == "dspark")
    ids = prompt(0, 21)
    feats = taps_of(target, drafter, ids)
    cache = drafter.new_cache()
    # two rounds through one cache: 13 context entries, then 7 more (the cache's increments are exercised)
    for start, stop in ((0, 13), (13, 20)):
        anchor = int(ids[0, stop])
        logits = drafter.draft_logits(ids[0, stop : stop + 1], feats[:, start:stop], cache, block_start=stop)
        ref_logits, ref_tokens, _ = reference_block(cfg, weights, feats[0, :stop], anchor, stop)
        assert logits.shape == (1, cfg["block_size"], cfg["vocab_size"])
        torch.testing.assert_close(logits[0], ref_logits, rtol=0, atol=1e-12)
        # the proposals: Markov argmax slot by slot (DSpark), plain argmax (DFlash); a fresh cache per call
        fresh = drafter.new_cache()
        tokens, scores = drafter.propose(ids[0, stop : stop + 1], feats[:, :stop], fresh, block_start=stop)
        assert tokens.tolist() == ref_tokens.tolist() and scores is None


@pytest.mark.parametrize("variant", ["qwen3", "gemma4"])
def test_confidence_threshold_cuts_the_proposal_like_the_reference(drafters, variant):
    drafter, cfg, weights, _ = drafters[variant, "dspark"]
    target = qwen3_target() if variant == "qwen3" else gemma4_target()
    drafter.bind_target(target).set_fold_config(FoldConfig(mode="dflash"))
    ids = prompt(1, 30)
    feats = taps_of(target, drafter, ids)
    kept_counts = set()
    try:
        for threshold in (0.0, 0.3, 0.6, 0.75, 0.9, 0.99):
            drafter.set_confidence_threshold(threshold)
            for stop in (9, 17, 25):
                tokens, _ = drafter.propose(ids[0, stop : stop + 1], feats[:, :stop], drafter.new_cache(),
                                            block_start=stop)
                _, ref_tokens, kept = reference_block(cfg, weights, feats[0, :stop], int(ids[0, stop]), stop,
                                                      threshold=threshold)
                assert tokens.tolist() == ref_tokens[:kept].tolist(), (threshold, stop)
                kept_counts.add(kept)
    finally:
        drafter.set_confidence_threshold(0.0)
    assert len(kept_counts) >= 2, kept_counts  # the thresholds did cut somewhere
    with pytest.raises(ValueError, match="confidence"):
        drafter.set_confidence_threshold(1.5)


# ------------------------------------------------------------------------------------------------ lossless
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_greedy_lossless_qwen3_all_three_paths(drafters, kind, mode):
    drafter, cfg, _, _ = drafters["qwen3", kind]
    target = qwen3_target()
    rounds = []
    for seed, length in enumerate((12, 100)):  # W = 16: the longer prompt reads a far memory
        ids = prompt(seed, length)
        ref = greedy_reference(target, ids, 30)
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=30, return_stats=True,
                               fold_config=mode_config(mode))
        assert torch.equal(res.sequences, ref), (kind, mode, seed)
        assert len(res.proposals) == res.rounds
        assert all(len(p) <= cfg["block_size"] for p in res.proposals)
        assert max(len(p) for p in res.proposals) == cfg["block_size"]  # the anchor slot proposes too: B per round
        for props, accepted in zip(res.proposals, res.acceptance_lengths):
            assert accepted - 1 <= len(props)
        drafter.set_fold_config(mode_config(mode))
        hf = target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False, fold_fast=False)
        assert torch.equal(hf, ref), (kind, mode, seed)
        assert drafter.last_acceptance_lengths == res.acceptance_lengths
        assert drafter.last_proposals == res.proposals
        routed = target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False)  # fast loop
        assert torch.equal(routed, ref), (kind, mode, seed)
        assert drafter.last_proposals == res.proposals
        for engine in ("eager", "static"):
            fast = fast_generate(target, drafter, input_ids=ids, max_new_tokens=30, return_stats=True,
                                 fold_config=mode_config(mode), engine=engine)
            assert torch.equal(fast.sequences, ref), (kind, mode, engine, seed)
            assert fast.acceptance_lengths == res.acceptance_lengths, (kind, mode, engine, seed)
            assert fast.proposals == res.proposals, (kind, mode, engine, seed)
        rounds += res.acceptance_lengths
    assert min(rounds) == 1, rounds
    if kind == "dspark":  # the bigram Markov head gets whole blocks accepted: B + 1 tokens in one round
        assert max(rounds) == cfg["block_size"] + 1, rounds


def test_static_step_with_a_confidence_threshold_matches_the_foundation_loop(drafters):
    drafter, _, _, _ = drafters["qwen3", "dspark"]
    target = qwen3_target()
    drafter.set_fold_config(mode_config("fold"))
    try:
        drafter.set_confidence_threshold(0.5)
        for seed, length in enumerate((12, 60)):
            ids = prompt(10 + seed, length)
            ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=30, return_stats=True)
            assert torch.equal(ref.sequences, greedy_reference(target, ids, 30))
            lengths = {len(p) for p in ref.proposals}
            assert 4 in lengths and lengths - {4}, lengths  # the threshold cut some proposals, not all
            for engine in ("eager", "static"):
                fast = fast_generate(target, drafter, input_ids=ids, max_new_tokens=30, return_stats=True,
                                     engine=engine)
                assert torch.equal(fast.sequences, ref.sequences), engine
                assert fast.acceptance_lengths == ref.acceptance_lengths, engine
                assert fast.proposals == ref.proposals, engine
    finally:
        drafter.set_confidence_threshold(0.0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_greedy_lossless_gemma4_foundation_and_transformers_paths(drafters, kind, mode):
    """Tiny Gemma-4 text target whose sliding window (512) exceeds every prompt + generation here, every reading
    mode. The fast engines and the routed call on a target with a short window (8) are in
    test_greedy_lossless_gemma4_windowed_target_on_the_fast_loop."""
    drafter, cfg, _, _ = drafters["gemma4", kind]
    target = gemma4_target()
    rounds = []
    for seed, length in enumerate((12, 100)):
        ids = prompt(20 + seed, length)
        ref = greedy_reference(target, ids, 30)
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=30, return_stats=True,
                               fold_config=mode_config(mode))
        assert torch.equal(res.sequences, ref), (kind, mode, seed)
        drafter.set_fold_config(mode_config(mode))
        hf = target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False, fold_fast=False)
        assert torch.equal(hf, ref), (kind, mode, seed)
        assert drafter.last_acceptance_lengths == res.acceptance_lengths
        assert drafter.last_proposals == res.proposals
        rounds += res.acceptance_lengths
    assert min(rounds) == 1, rounds
    if kind == "dspark":
        assert max(rounds) >= 3, rounds


@pytest.fixture(scope="module")
def windowed_gemma4(tmp_path_factory):
    """The tiny Gemma-4 target of deepspec_tiny with test_gemma_targets' sliding window (8; no per-layer inputs,
    which DeepSpec's Gemma-4 drafters refuse) and a DFlash and a DSpark drafter written for it, by kind."""
    target = tiny_gemma4_target(seed=4, sliding_window=GEMMA_WINDOW)
    out = {}
    for kind in KINDS:
        directory, cfg, _ = checkpoint(tmp_path_factory, "gemma4", kind, confidence=True, target=target)
        out[kind] = (FoldDrafter.from_pretrained(directory), cfg)
    return target, out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", ["fold", "dflash"])
def test_greedy_lossless_gemma4_windowed_target_on_the_fast_loop(windowed_gemma4, monkeypatch, kind, mode):
    """Prompts longer than the target's sliding window (8) and the drafter's window (16); the fast path's sliding
    rings get a slack of 4 rows (a verify writes B + 1 = 5) so they wrap. Every path equals the target's own greedy output, and the fast engines
    and the routed call make the same proposals and acceptances as ``fold_hf.generate``."""
    monkeypatch.setattr(gemma, "RING_SLACK", cfg_block := 4)
    target, by_kind = windowed_gemma4
    drafter, cfg = by_kind[kind]
    assert target.config.sliding_window == GEMMA_WINDOW and cfg["block_size"] == cfg_block
    rounds = []
    for seed, length in enumerate((20, 40)):
        ids = prompt(40 + seed, length)
        ref = greedy_reference(target, ids, 20)
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=20, return_stats=True,
                               fold_config=mode_config(mode))
        assert torch.equal(res.sequences, ref), (kind, mode, seed)
        drafter.set_fold_config(mode_config(mode))
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # no fallback to transformers' loop
            routed = target.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False)
        assert fast_module._SESSION_ATTR in target.__dict__  # the fast loop ran
        assert torch.equal(routed, ref), (kind, mode, seed)
        assert drafter.last_acceptance_lengths == res.acceptance_lengths, (kind, mode, seed)
        assert drafter.last_proposals == res.proposals, (kind, mode, seed)
        for engine in ("eager", "static"):
            fast = fast_generate(target, drafter, input_ids=ids, max_new_tokens=20, return_stats=True,
                                 fold_config=mode_config(mode), engine=engine)
            assert torch.equal(fast.sequences, ref), (kind, mode, engine, seed)
            assert fast.acceptance_lengths == res.acceptance_lengths, (kind, mode, engine, seed)
            assert fast.proposals == res.proposals, (kind, mode, engine, seed)
        release_fast_state(target)
        rounds += res.acceptance_lengths
    assert min(rounds) == 1, rounds
    if kind == "dspark":
        assert max(rounds) >= 3, rounds


@pytest.mark.parametrize("variant", ["qwen3", "gemma4"])
@pytest.mark.parametrize("mode", MODES)
def test_static_step_matches_propose_round_by_round(drafters, variant, mode):
    """The static (capturable) drafter step against ``drafter.propose`` over rounds of a synthetic decode: the
    verify's tapped rows arrive B + 1 at a time, some of them accepted."""
    drafter, cfg, _, _ = drafters[variant, "dspark"]
    target = qwen3_target() if variant == "qwen3" else gemma4_target()
    drafter.bind_target(target).set_fold_config(mode_config(mode))
    ids = prompt(30, 140)
    feats = taps_of(target, drafter, ids)
    rows = drafter.num_proposals + 1
    prompt_len, total = 20, 140
    steps = []
    # the module step, and for pre-norm (Qwen3-like) layers the fused step (torch twins of its kernels on the CPU)
    for ops in [None] + ([default_layer_ops(torch.device("cpu"))] if variant == "qwen3" else []):
        static_cache = preallocated_cache(drafter, 256, "cpu", request_length=total)
        static = StaticDrafter(drafter, static_cache, layer_ops=ops)
        static.start_request(total)
        commit_context(drafter, static_cache, feats[:, :prompt_len])
        steps.append(static)
    cache = drafter.new_cache(request_length=total)
    pending = feats[:, :prompt_len]
    g = torch.Generator().manual_seed(0)
    d_len, d_new, position = prompt_len, 0, prompt_len
    verify_rows = torch.zeros(1, rows, feats.shape[-1], dtype=feats.dtype)
    while position + rows < total:
        last = ids[0, position : position + 1]
        want, _ = drafter.propose(last, pending, cache, block_start=position)
        state = torch.tensor([0, d_len, d_new, int(last), rows - 1, rows - 1, 0, 0])
        for static in steps:
            got = static.draft(verify_rows, state.clone(), static.needs_far(d_len + d_new))
            assert got.tolist() == want.tolist(), (variant, mode, position, static.ops)
        accepted = int(torch.randint(0, rows, (1,), generator=g)) + 1  # rows the verify commits
        verify_rows = torch.zeros_like(verify_rows)
        verify_rows[:, :accepted] = feats[:, position : position + accepted]
        pending = feats[:, position : position + accepted]
        d_len, d_new = d_len + d_new, accepted
        position += accepted


# ------------------------------------------------------------------------------------------------ sampling
def test_markov_sampling_returns_the_biased_step_distributions(drafters):
    drafter, cfg, weights, _ = drafters["qwen3", "dspark"]
    target = qwen3_target()
    drafter.bind_target(target).set_fold_config(FoldConfig(mode="dflash"))
    ids = prompt(4, 15)
    feats = taps_of(target, drafter, ids)
    g = torch.Generator().manual_seed(0)

    def pick(logits, first_slot=0):
        probs = torch.softmax(logits.double(), -1)
        return torch.multinomial(probs, 1, generator=g).squeeze(-1), probs

    tokens, q = drafter.propose(ids[0, 14:15], feats[:, :14], drafter.new_cache(), block_start=14, pick=pick)
    base, _, _ = reference_block(cfg, weights, feats[0, :14], int(ids[0, 14]), 14)
    expected = markov_step_distributions(cfg, weights, base, int(ids[0, 14]), tokens.tolist())
    torch.testing.assert_close(q, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["fold", "streaming"])
def test_a_seed_reproduces_a_dspark_sampled_run_on_every_engine(drafters, mode):
    """Sampling draws the Markov head's proposals slot by slot from the round's uniforms: the foundation loop, the
    eager engine and the static step (its Markov chain on the device) give the same tokens and proposals."""
    drafter, _, _, _ = drafters["qwen3", "dspark"]
    target = qwen3_target()
    sampled = dict(do_sample=True, temperature=0.9, top_k=8, top_p=0.95)
    for seed, length in enumerate((14, 70)):
        ids = prompt(50 + seed, length)
        runs = [fold_hf.generate(target, drafter, ids, max_new_tokens=24, return_stats=True,
                                 fold_config=mode_config(mode), generator=torch.Generator().manual_seed(seed),
                                 **sampled)]
        for engine in ("eager", "static"):
            runs.append(fast_generate(target, drafter, ids, max_new_tokens=24, engine=engine, return_stats=True,
                                      fold_config=mode_config(mode), generator=torch.Generator().manual_seed(seed),
                                      **sampled))
        for run in runs[1:]:
            assert torch.equal(run.sequences, runs[0].sequences), (mode, seed)
            assert run.acceptance_lengths == runs[0].acceptance_lengths, (mode, seed)
            assert run.proposals == runs[0].proposals, (mode, seed)
        assert max(runs[0].acceptance_lengths) >= 2  # proposals were accepted under sampling


@pytest.mark.slow
def test_speculative_sampling_with_the_markov_head_keeps_the_target_distribution(tmp_path):
    from sampling_reference import PROMPT, chi2_statistic, chi2_threshold, exact_distribution
    from sampling_reference import VOCAB as SV

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = tiny_target("qwen3", seed=21, vocab=SV, layers=4, dtype=torch.float64)
        cfg = deepspec_config(target, "qwen3", block=3, markov_rank=3, taps=(1, 2))
        cfg["mask_token_id"] = SV - 1
        weights = deepspec_weights(cfg, target, seed=3)
        weights["markov_head.markov_w1.weight"] *= 3  # a Markov bias strong enough to move q slot by slot
        drafter = FoldDrafter.from_pretrained(write_checkpoint(tmp_path, cfg, weights, dtype=torch.float64),
                                              fold_config=FoldConfig(window=4))
        warp = dict(temperature=0.8, top_k=3, top_p=0.95)
        n = 3000
        gen = torch.Generator().manual_seed(4321)
        counts: dict = {}
        accepted = 0
        for _ in range(n):  # one round: 2 proposals (of B = 3, cut by the length) + the target's token
            res = fold_hf.generate(target, drafter, input_ids=PROMPT, max_new_tokens=4, do_sample=True,
                                   generator=gen, return_stats=True, **warp)
            key = tuple(res.new_tokens[0].tolist())
            counts[key] = counts.get(key, 0) + 1
            accepted += res.acceptance_lengths[0] - 1
        probs = exact_distribution(target, warp)
        stat, df = chi2_statistic(counts, probs, n)
        assert stat < chi2_threshold(df), f"chi2 {stat:.1f} with {df} dof exceeds {chi2_threshold(df):.1f}"
        assert accepted > n * 0.2, accepted
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------ files
@pytest.mark.parametrize("variant", ["qwen3", "gemma4"])
@pytest.mark.parametrize("kind", KINDS)
def test_save_load_round_trip_keeps_the_deepspec_layout(drafters, tmp_path, variant, kind):
    drafter, cfg, _, directory = drafters[variant, kind]
    drafter.set_fold_config(mode_config("fold"))
    drafter.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((directory / "config.json").read_text())
    written.pop("torch_dtype")
    assert written == original
    assert "dflash_config" not in written
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(load_file(str(directory / "model.safetensors")))
    again = FoldDrafter.from_pretrained(tmp_path)
    assert again.family == "deepspec" and again.fold_config == drafter.fold_config
    for (name, a), (_, b) in zip(drafter.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_zlab_checkpoints_still_save_in_their_own_layout(tmp_path):
    from tiny import tiny_drafter

    target = qwen3_target()
    zlab = tiny_drafter(target)
    zlab.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["DFlashDraftModel"] and "dflash_config" in written
    again = FoldDrafter.from_pretrained(tmp_path)
    assert again.family == "zlab" and again.num_proposals == zlab.block_size - 1


def _broken(tmp_path, edit_config=None, edit_weights=None, variant="qwen3", kind="dspark"):
    target = qwen3_target() if variant == "qwen3" else gemma4_target()
    cfg = deepspec_config(target, variant, markov_rank=5 if kind == "dspark" else 0)
    weights = deepspec_weights(cfg, target)
    if edit_config:
        edit_config(cfg)
    if edit_weights:
        edit_weights(weights)
    return write_checkpoint(tmp_path, cfg, weights)


def test_errors_name_the_file_and_field(tmp_path):
    d = _broken(tmp_path / "rank", edit_config=lambda c: c.update(markov_rank=7))
    with pytest.raises(ValueError, match=r"config\.json: 'markov_rank' is 7 but .*model\.safetensors.* rank 5"):
        FoldDrafter.from_pretrained(d)
    d = _broken(tmp_path / "rank0", edit_config=lambda c: c.update(markov_rank=0))
    with pytest.raises(ValueError, match=r"'markov_rank' is 0 but .*model\.safetensors holds a Markov head"):
        FoldDrafter.from_pretrained(d)
    d = _broken(tmp_path / "head", edit_weights=lambda w: w.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"model\.safetensors: no 'lm_head\.weight'"):
        FoldDrafter.from_pretrained(d)
    d = _broken(tmp_path / "block", edit_config=lambda c: c.pop("block_size"))
    with pytest.raises(ValueError, match=r"config\.json: missing 'block_size'"):
        FoldDrafter.from_pretrained(d)
    d = _broken(tmp_path / "type", edit_config=lambda c: c.update(markov_head_type="rnn"))
    with pytest.raises(ValueError, match=r"config\.json: 'markov_head_type' 'rnn' is not supported"):
        FoldDrafter.from_pretrained(d)
    d = _broken(tmp_path / "gemma", variant="gemma4")
    gemma_drafter = FoldDrafter.from_pretrained(d)
    with pytest.raises(ValueError, match=r"built for a gemma4 target .* given a qwen3 target.*config\.json"):
        fold_hf.generate(qwen3_target(), gemma_drafter, input_ids=prompt(0, 5), max_new_tokens=3)
    with pytest.raises(ValueError, match="speculation_type='dflash'"):
        gemma4_target().generate(prompt(0, 5), assistant_model=gemma_drafter, max_new_tokens=3,
                                 speculation_type="dflash", fold_fast=False)


def test_doctor_reports_the_deepspec_fields(drafters):
    from fold_hf.doctor import diagnose, format_checks

    drafter, _, _, _ = drafters["gemma4", "dspark"]
    text = format_checks(diagnose(gemma4_target(), drafter, mode_config("fold")))
    assert "DeepSpec DSpark (gemma4)" in text and "4 drafted tokens per round" in text
    assert "Markov rank 12 (vanilla)" in text and "confidence head with Markov features" in text
    assert "type proportional, theta 1000000.0, 4/16 rotary dims" in text  # 0.25 of global_head_dim 16
    assert "ERROR" not in text, text
    dflash_text = format_checks(diagnose(qwen3_target(), drafters["qwen3", "dflash"][0], mode_config("fold")))
    assert "DeepSpec DFlash (qwen3)" in dflash_text and "Markov rank 0," in dflash_text


def test_presets_name_the_six_pairs():
    from fold_hf.modeling.presets import PRESETS

    deepspec = {k: v for k, v in PRESETS.items() if v["drafter_model"].startswith("deepseek-ai/")}
    assert sorted(deepspec) == ["gemma4-12b-dflash", "gemma4-12b-dspark", "qwen3-8b-dflash", "qwen3-8b-dspark"]
    assert all(v["train_length"] == 4096 for v in deepspec.values())
    paper = [k for k in PRESETS if not k.startswith("smollm2")]
    assert len(paper) == 6


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu(reason="CUDA graphs: the captured DeepSpec step (Markov argmax, confidence cut) replays on a CUDA device")
@pytest.mark.parametrize("kind", KINDS)
def test_graph_engine_captures_the_deepspec_step_on_gpu(drafters, kind):
    """The captured drafter step (Markov argmax slot by slot on the device, a confidence cut in the device state)
    gives the foundation loop's tokens, rounds and proposals, fp32 on CUDA, every reading mode."""
    drafter, _, _, _ = drafters["qwen3", kind]
    target = qwen3_target()
    target.to("cuda", torch.float32)
    drafter.to("cuda", torch.float32)
    try:
        for threshold in ((0.0, 0.5) if kind == "dspark" else (0.0,)):
            drafter.set_confidence_threshold(threshold)
            for seed, length in enumerate([10, 230, 300]):
                ids = prompt(40 + seed, length).cuda()
                ar = fast_generate(target, None, input_ids=ids, max_new_tokens=30, engine="graphs")
                assert torch.equal(ar, greedy_reference(target, ids, 30))
                for mode in MODES:
                    ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=30, return_stats=True,
                                           fold_config=mode_config(mode))
                    assert torch.equal(ref.sequences, ar), (kind, mode, length)
                    res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=30, return_stats=True,
                                        fold_config=mode_config(mode), engine="graphs")
                    assert torch.equal(res.sequences, ar), (kind, mode, length)
                    assert res.acceptance_lengths == ref.acceptance_lengths, (kind, mode, length)
                    assert res.proposals == ref.proposals, (kind, mode, length)
    finally:
        drafter.set_confidence_threshold(0.0)
        target.to("cpu", torch.float64)
        drafter.to("cpu", torch.float64)
        fold_hf.generation.release_fast_state(target)
