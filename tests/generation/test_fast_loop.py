"""The fast loop (fold_hf.generation.fast_generate) computes what the foundation loop computes: same tokens, same
acceptance lengths, same stopping, on both CPU engines; the graph engine is checked on a GPU."""

import functools

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import fold_hf
from fold_hf.generation import fast_generate
from fold_hf.generation.static_drafter import static_drafter_unsupported
from tiny import (GRID_NEW_TOKENS, GRID_PROMPT_LENGTHS, VOCAB, greedy_reference, grid_greedy, grid_loop, grid_prompt,
                  mode_config, pair_on_gpu, trained_pair)
from tiny import prompt as tiny_prompt

PROMPT_LENGTHS = [10, 90, 300]  # the window is 16: the longer prompts read a far memory
GRID_SEEDS = [GRID_PROMPT_LENGTHS.index(n) for n in PROMPT_LENGTHS]  # the same prompts as the lossless grid
NEW_TOKENS = GRID_NEW_TOKENS


pytestmark = pytest.mark.xdist_group("lossless-grid")  # shares the grid's cached loop results (tiny.grid_loop)


def prompt(seed: int, length: int) -> torch.Tensor:
    return tiny_prompt(seed, length, offset=2000)


class Collect:
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


# every reading mode has a static drafter step (the baselines too, so a benchmark compares reading, not engines);
# the 300-token prompt reads a far memory (fold, rerope), a rescaled rope (yarn) and a full streaming budget
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("mode", ["fold", "dflash", "window", "streaming", "rerope", "yarn"])
def test_same_tokens_and_rounds_as_the_foundation_loop(arch, mode):
    target, drafter = trained_pair(arch)
    own = drafter.fold_config  # the pair is shared by other tests: leave its own config as it was
    assert static_drafter_unsupported(drafter.set_fold_config(mode_config(mode))) is None
    drafter.set_fold_config(own)
    rounds = []
    for seed in GRID_SEEDS:
        ids, ref = grid_prompt(seed), grid_loop(arch, mode, seed)  # cached: test_lossless runs the same
        assert torch.equal(ref.sequences, grid_greedy(arch, seed))
        for engine in ("eager", "static"):
            res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=NEW_TOKENS, return_stats=True,
                                fold_config=mode_config(mode), engine=engine)
            assert torch.equal(res.sequences, ref.sequences), (arch, mode, engine, seed)
            assert res.acceptance_lengths == ref.acceptance_lengths, (arch, mode, engine, seed)
            assert res.mode == mode and res.finish_reason == "length"
        rounds += ref.acceptance_lengths
    assert max(rounds) >= 2 and min(rounds) == 1, rounds  # rollbacks and multi-token rounds both happened


def test_switching_modes_within_a_session_keeps_each_mode_exact():
    """A session keeps the draft steps of its recent modes and shares one cache among them: cycling through more
    modes than it keeps, and coming back to earlier ones, still gives the foundation loop's rounds."""
    from fold_hf.generation.fast import KEPT_DRAFT_MODES

    target, drafter = trained_pair("llama")
    ids = prompt(20, 120)
    reference = greedy_reference(target, ids, 24)
    fold = mode_config("fold")
    # yarn first: its rope tables are its own (refilled per request), the modes built after it must not share them
    configs = [mode_config("yarn"), fold, mode_config("dflash"), mode_config("window"), mode_config("streaming"),
               mode_config("rerope"), mode_config("infllm"), mode_config("cmr")]
    configs += [fold.replace(alpha=a) for a in (1.0, 3.0, 4.0, 8.0)] + [fold.replace(window=w) for w in (8, 32)]
    configs += [fold, mode_config("dflash"), mode_config("infllm")]  # back to modes the session has dropped by now
    assert len({repr(c) for c in configs}) > KEPT_DRAFT_MODES
    expected = {}
    for cfg in configs:
        key = repr(cfg)
        if key not in expected:
            expected[key] = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24,
                                             return_stats=True, fold_config=cfg).acceptance_lengths
        res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=24, return_stats=True,
                            fold_config=cfg, engine="static")
        assert torch.equal(res.sequences, reference), cfg
        assert res.acceptance_lengths == expected[key], cfg
    fold_hf.generation.release_fast_state(target)


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_autoregressive_on_the_same_machinery(engine):
    target, _ = trained_pair("llama")
    for seed, length in enumerate(PROMPT_LENGTHS):
        ids = prompt(seed, length)
        res = fast_generate(target, None, input_ids=ids, max_new_tokens=NEW_TOKENS, return_stats=True, engine=engine)
        assert torch.equal(res.sequences, greedy_reference(target, ids, NEW_TOKENS))
        assert res.acceptance_lengths == [1] * (NEW_TOKENS - 1) and res.mode == "ar"


def test_chunked_prefill_and_repeated_calls_of_growing_length():
    target, drafter = trained_pair("llama")
    drafter.set_fold_config(mode_config("fold"))
    for seed, length in enumerate([30, 300, 20]):  # the second call outgrows the kept cache, the third reuses it
        ids = prompt(10 + seed, length)
        for engine in ("eager", "static"):
            res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=NEW_TOKENS, engine=engine,
                                prefill_chunk=64)
            assert torch.equal(res, greedy_reference(target, ids, NEW_TOKENS)), (length, engine)


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_eos_stop_strings_and_streamer_match_the_foundation_loop(engine, char_tokenizer):
    target, drafter = trained_pair("llama")
    drafter.set_fold_config(mode_config("fold"))
    for seed in range(3):
        ids = prompt(20 + seed, 40)
        free = greedy_reference(target, ids, 40)[0, ids.shape[1]:].tolist()
        cases = [dict(eos_token_id=[free[9]]),
                 dict(stop_strings=["".join(chr(97 + t) for t in free[12:15])], tokenizer=char_tokenizer),
                 dict(max_new_tokens=7)]
        for kw in cases:
            kw = {"max_new_tokens": 40, **kw}
            ref_stream, fast_stream = Collect(), Collect()
            ref = fold_hf.generate(target, drafter, input_ids=ids, return_stats=True, streamer=ref_stream, **kw)
            res = fast_generate(target, drafter, input_ids=ids, return_stats=True, streamer=fast_stream,
                                engine=engine, **kw)
            assert torch.equal(res.sequences, ref.sequences), kw
            assert res.acceptance_lengths == ref.acceptance_lengths and res.finish_reason == ref.finish_reason
            assert fast_stream.chunks == ref_stream.chunks and fast_stream.ended


def test_rounds_queued_ahead_give_the_one_at_a_time_rounds(monkeypatch):
    """The static engine queues a round before reading the previous one's result (one step per round: draft, verify,
    acceptance, state); tokens, acceptance lengths, proposals and finish reasons equal the one-round-at-a-time loop
    (``FOLD_HF_PIPELINE_ROUNDS=0``) and the foundation loop's, through an EOS mid-request, the budget's end and the
    window's crossing, speculative (``fold``, ``infllm``, ``cmr``) and AR."""
    from fold_hf.generation import fast as fast_module

    events = []
    init, read = fast_module._Launched.__init__, fast_module._Launched.read
    eager_step = fast_module.session.EagerStep

    def launched(self, result, k, host):
        events.append("L")
        init(self, result, k, host)

    def reading(self):
        events.append("R")
        return read(self)

    monkeypatch.setattr(fast_module._Launched, "__init__", launched)
    monkeypatch.setattr(fast_module._Launched, "read", reading)
    target, drafter = trained_pair("llama")
    fold_hf.generation.release_fast_state(target)
    ids = prompt(20, 50)
    expected = greedy_reference(target, ids, 36)
    free = expected[0, ids.shape[1]:].tolist()
    eos = next(t for i, t in enumerate(free) if i >= 8 and t not in free[:i])  # first seen mid-request
    short = prompt(21, 6)  # crosses the window (16) mid-request: a new round step (far memory read) is built then
    for ids, kw in ((ids, dict(max_new_tokens=36)), (ids, dict(max_new_tokens=36, eos_token_id=[eos])),
                    (short, dict(max_new_tokens=30))):
        expected = greedy_reference(target, ids, kw["max_new_tokens"])
        # infllm / cmr: device-side selection state read and rewritten every round, cmr's phases (a host round
        # count) and its refreshes reading the last verify's kept queries
        cases = [(drafter, "fold"), (None, None)] + ([(drafter, "infllm"), (drafter, "cmr")] if kw == dict(
            max_new_tokens=36) else [])
        for draft, mode in cases:
            results = {}
            caches = {}
            for setting in ("1", "0"):
                monkeypatch.setenv("FOLD_HF_PIPELINE_ROUNDS", setting)
                # queued rounds: each step runs twice when built, as the graphs engine's warm-up does before
                # capture; a round step reads what it overwrites (the state, the tapped features the next draft
                # commits), which must survive that
                monkeypatch.setattr(fast_module.session, "EagerStep",
                                    functools.partial(eager_step, warmup=2 if setting == "1" else 0))
                fold_hf.generation.release_fast_state(target)
                events.clear()
                results[setting] = fast_generate(target, draft, input_ids=ids, return_stats=True, engine="static",
                                                 fold_config=mode_config(mode) if draft else None, **kw)
                pattern = "".join(events)
                assert ("LL" in pattern) == (setting == "1"), (setting, mode, pattern)  # queued ahead, or never
                if draft is not None:  # the drafter's committed context entries
                    cache = target.__dict__["_fold_fast_session"].drafter_cache.layers[0]
                    caches[setting] = cache.keys[:, :, : cache.length].clone()
            if draft is not None:
                assert torch.equal(caches["1"], caches["0"]), (mode, kw)
            a, b = results["1"], results["0"]
            assert torch.equal(a.sequences, b.sequences) and a.acceptance_lengths == b.acceptance_lengths, (mode, kw)
            assert a.proposals == b.proposals and a.finish_reason == b.finish_reason, (mode, kw)
            assert torch.equal(a.sequences, expected[:, : a.sequences.shape[1]]), (mode, kw)
            assert a.finish_reason == ("eos" if "eos_token_id" in kw else "length"), (mode, kw)
            reference = fold_hf.generate(target, draft, input_ids=ids, return_stats=True,
                                         fold_config=mode_config(mode) if draft else None, **kw)
            assert a.acceptance_lengths == reference.acceptance_lengths, (mode, kw)
    fold_hf.generation.release_fast_state(target)


def test_target_generate_routes_to_the_fast_loop_when_it_can():
    target, drafter = trained_pair("llama")
    drafter.set_fold_config(mode_config("fold"))
    ids = prompt(30, 90)
    ref = greedy_reference(target, ids, NEW_TOKENS)
    assert torch.equal(target.generate(ids, assistant_model=drafter, fold_fast=True, max_new_tokens=NEW_TOKENS), ref)
    assert torch.equal(target.generate(ids, fold_fast=True, max_new_tokens=NEW_TOKENS), ref)  # AR
    with pytest.warns(UserWarning, match="no_repeat_ngram_size"):
        out = target.generate(ids, assistant_model=drafter, fold_fast=True, max_new_tokens=8, no_repeat_ngram_size=3)
    assert out.shape == (1, 98)


def test_unsupported_requests_say_why():
    target, drafter = trained_pair("llama")
    with pytest.raises(ValueError, match="temperature"):
        fast_generate(target, drafter, input_ids=prompt(0, 10), max_new_tokens=5, do_sample=True, temperature=0.0)
    right_padded = torch.ones(2, 10, dtype=torch.long)
    right_padded[1, -3:] = 0  # a batch is decoded (row by row); right padding is not transformers' convention
    with pytest.raises(ValueError, match="left padding"):
        fast_generate(target, drafter, input_ids=torch.cat([prompt(0, 10), prompt(1, 10)]),
                      attention_mask=right_padded, max_new_tokens=5)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)).eval()
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        fast_generate(gpt2, None, input_ids=prompt(0, 10), max_new_tokens=5)
    with pytest.raises(ValueError, match="graphs"):
        fast_generate(target, None, input_ids=prompt(0, 10), max_new_tokens=5, engine="graphs")


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu(reason="CUDA graphs: the graphs engine captures and replays on a CUDA device")
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_engine_matches_the_foundation_loop_on_gpu(arch):
    with pair_on_gpu(arch) as (target, drafter):
        # prompts around the 256-token attention buckets, so the verify graph changes bucket mid-request
        for seed, length in enumerate([10, 230, 300, 700]):
            ids = prompt(seed, length).cuda()
            ar = fast_generate(target, None, input_ids=ids, max_new_tokens=NEW_TOKENS, engine="graphs")
            assert torch.equal(ar, greedy_reference(target, ids, NEW_TOKENS)), (arch, length)
            for mode in ("fold", "dflash", "window", "streaming", "rerope", "yarn"):
                ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=NEW_TOKENS, return_stats=True,
                                       fold_config=mode_config(mode))
                assert torch.equal(ref.sequences, ar)
                for engine in ("eager", "static", "graphs"):
                    res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=NEW_TOKENS, return_stats=True,
                                        fold_config=mode_config(mode), engine=engine)
                    assert torch.equal(res.sequences, ref.sequences), (arch, mode, engine, length)
                    assert res.acceptance_lengths == ref.acceptance_lengths, (arch, mode, engine, length)
            chunked = fast_generate(target, drafter, input_ids=ids, max_new_tokens=NEW_TOKENS, prefill_chunk=128)
            assert torch.equal(chunked, ar), (arch, length)


def test_yarn_static_step_refuses_to_draft_before_its_request_tables_are_set():
    """yarn's rope tables depend on the request's length: a static step used without `start_request` would draft
    with plain tables, so it refuses; `start_request` fills the request's tables in place (the same buffer)."""
    import copy

    from fold_hf.generation.static_drafter import StaticDrafter, preallocated_cache

    _, base = trained_pair("llama")
    drafter = copy.deepcopy(base).set_fold_config(mode_config("yarn"))
    static = StaticDrafter(drafter, preallocated_cache(drafter, 512, "cpu"))
    plain = static.cos.clone()
    with pytest.raises(RuntimeError, match="start_request"):
        static.draft(None, None, with_far=False)
    buffer = static.cos.data_ptr()
    static.start_request(400)  # factor 512 / 64 = 8 with the tests' training length 64
    assert static.cos.data_ptr() == buffer and not torch.equal(static.cos, plain)


def test_warm_up_runs_each_start_from_the_preserved_state():
    """CapturedStep / EagerStep warm-up: every run starts from the ``preserve`` buffers as they were (a step that
    writes a cache at its length and advances the length writes the same slot each run), and they are left so."""
    from fold_hf.generation.graphs import EagerStep

    length = torch.tensor([3])
    cache = torch.zeros(8)

    def step():
        cache[length] += 1.0  # a write at the current length, then the length advances
        length.add_(2)
        return cache

    EagerStep(step, warmup=2, preserve=[length])
    assert length.item() == 3
    expected = torch.zeros(8)
    expected[3] = 2.0  # both runs wrote slot 3; slot 5 (where an advanced second run writes) untouched
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("with_drafter", [True, False])
def test_time_rounds_runs_its_rounds_queued_ahead(monkeypatch, with_drafter):
    """The benchmark entry times what a long request runs: exactly ``rounds`` rounds, each after the first queued
    before the previous one is read (its token budget cannot end within the proposals in flight). With a budget of
    ``rounds + 1`` tokens the loop read every speculative round first, so the headline SD/AR ratio timed the host
    between rounds."""
    from fold_hf.generation import fast as fast_module

    events = []
    init, read = fast_module._Launched.__init__, fast_module._Launched.read

    def launched(self, result, k, host):
        events.append("L")
        init(self, result, k, host)

    def reading(self):
        events.append("R")
        return read(self)

    monkeypatch.setattr(fast_module._Launched, "__init__", launched)
    monkeypatch.setattr(fast_module._Launched, "read", reading)
    target, drafter = trained_pair("llama")
    rounds = 7
    res = fast_module.time_rounds(target, drafter if with_drafter else None, 40, rounds, engine="static")
    assert len(res.acceptance_lengths) == rounds and len(res.round_seconds) == rounds
    pattern = "".join(events)
    # L (L R)^(rounds - 1) then the last read, and nothing queued past the last round (a profile divides by rounds)
    assert pattern == "L" + "LR" * (rounds - 1) + "R", pattern
    fold_hf.generation.release_fast_state(target)


def test_a_session_is_rebuilt_when_the_weights_change_dtype():
    """A model used once in float64, then deep-copied (its session rides along in ``__dict__``) and cast to float32,
    decodes in float32: the kept session is for other weights and is rebuilt, not reused (the 5.17 CI run of
    2026-12-04 hit this through a shared test fixture)."""
    import copy

    target, drafter = trained_pair("llama")
    target, drafter = copy.deepcopy(target).double(), copy.deepcopy(drafter).double()
    ids = prompt(3, 20)
    fast_generate(target, drafter, input_ids=ids, max_new_tokens=4, engine="static")
    cast, cast_drafter = copy.deepcopy(target).float(), copy.deepcopy(drafter).float()
    out = fast_generate(cast, cast_drafter, input_ids=ids, max_new_tokens=6, engine="static")
    assert torch.equal(out, cast.generate(ids, max_new_tokens=6, do_sample=False))


def test_the_family_free_base_target_cannot_be_built():
    """``StaticTarget`` states no layers: building it directly fails naming the method a family must define."""
    from fold_hf.targets.base import StaticTarget

    with pytest.raises(TypeError, match="abstract.*_run_layers"):
        StaticTarget()
