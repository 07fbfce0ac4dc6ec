"""The batched rounds' rows drafting step (issue 35): on engines ``static`` and ``graphs`` every running row drafts in
one fixed-shape step (:class:`~fold_hf.generation.static_drafter_rows.RowsDrafter`) instead of the host-driven
``propose_rows``.

The independent statements: each row's drafts from the drafter's own eager forward over a cache of its own
(``FoldDrafter.draft_logits``: planned reads, host lengths), each row's output from transformers' greedy ``generate``
of the row alone, and the eager engine's batched rounds (``propose_rows``) round by round."""

import copy
import warnings

import pytest
import torch
from test_batch import pair, row_prompt  # noqa: F401  (pair: test_batch's fixture)

import fold_hf
from fold_hf.generation import release_fast_state
from fold_hf.generation.fast import SESSION_ATTR, batched, settings
from fold_hf.generation.graphs import EagerStep
from fold_hf.generation.static_drafter import commit_context, preallocated_cache
from fold_hf.generation.static_drafter_rows import RowsDrafter, row_cache, view_row
from fold_hf.kernels import default_layer_ops
from tiny import expected_batch, greedy_alone, left_pad, mode_config, tiny_drafter, tiny_target

NEW = 12
EOS = 2


def _features(drafter, n: int, seed: int) -> torch.Tensor:
    width = len(drafter.config.target_layer_ids) * drafter.config.hidden_size
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, width, generator=generator, dtype=torch.float64).to(drafter.fc.weight.dtype)


# ------------------------------------------------------------------------------------------------ the step itself
@pytest.mark.parametrize("fused", [False, True], ids=["modules", "fused"])
@pytest.mark.parametrize("mode", ["fold", "window", "dflash", "rerope"])
def test_each_row_drafts_what_the_drafters_own_forward_drafts_for_it_alone(mode, fused):
    """Three rows at three lengths (5 < W - B, 23 and 90 > W: far memory read), each in a cache row of its own (rows
    2, 0, 3 of a 4-row cache), two rounds committing different counts of new context per row: every row's logits equal
    the drafter's eager forward over that row alone (fp64), and its proposals are their argmax; the step runs after
    the graphs engine's two warm-up runs."""
    target = tiny_target("llama", seed=5)
    drafter = tiny_drafter(target, fold_config=mode_config(mode)).bind_target(target)
    prompts, cache_rows = [5, 90, 23], (2, 0, 3)
    rounds = [(2, 4, 1), (3, 1, 4)]  # new context rows per row and round (R = 4 at most)
    R = drafter.num_proposals + 1
    static = RowsDrafter(drafter, preallocated_cache(drafter, 128, "cpu", rows=4),
                         layer_ops=default_layer_ops(torch.device("cpu")) if fused else None)
    mine = [row_cache(static.cache, drafter, row) for row in cache_rows]
    alone = [drafter.new_cache() for _ in prompts]
    for a, length in enumerate(prompts):
        for cache in (mine[a], alone[a]):
            commit_context(drafter, cache, _features(drafter, length, seed=a))
    committed = list(prompts)
    seen = []
    original = drafter.proposal_logits

    def recording(hidden):
        out = original(hidden)
        seen.append(out)
        return out

    # the fused ops norm in fp32 (as the kernels do), the modules in the model dtype (fp64 here)
    tol = dict(rtol=0, atol=1e-5 if fused else 1e-9)
    for r, news in enumerate(rounds):
        lasts = [(7 + 3 * a + r) % drafter.config.mask_token_id for a in range(3)]
        pendings = [_features(drafter, n, seed=100 * r + a) for a, n in enumerate(news)]
        expected = [drafter.draft_logits(torch.tensor([last]), pending, cache)[0]
                    for last, pending, cache in zip(lasts, pendings, alone)]
        features = torch.randn(3, R, pendings[0].shape[-1], generator=torch.Generator().manual_seed(r),
                               dtype=torch.float64).to(drafter.fc.weight.dtype)
        for a, pending in enumerate(pendings):  # the rest of a row's R rows is garbage the step must not read
            features[a, : pending.shape[1]] = pending[0]
        lengths = torch.tensor([[committed[a], news[a], lasts[a], cache_rows[a]] for a in range(3)])
        with_far = any(static.needs_far(committed[a] + news[a]) for a in range(3))
        assert with_far == (mode in ("fold", "rerope"))  # the modes with far memory read it here,
        assert not static.needs_far(committed[0] + news[0])  # one row without any among them
        drafter.proposal_logits = recording
        # as the graphs engine runs it: two warm-up runs before the replay, which must change nothing it reads
        tokens = EagerStep(lambda: static.draft_rows(features, lengths, with_far, cache_rows), warmup=2).replay()
        del drafter.proposal_logits
        assert len(seen) == 3
        logits = seen.pop()
        seen.clear()
        assert tokens.shape == (3, R - 1)
        for a in range(3):
            torch.testing.assert_close(logits[a], expected[a], **tol,
                                       msg=lambda m, a=a, r=r: f"{mode} round {r} row {a}: {m}")
            assert tokens[a].tolist() == expected[a].argmax(-1).tolist()
        committed = [c + n for c, n in zip(committed, news)]
    for a, row in enumerate(cache_rows):  # each row's entries in its own cache row, equal to its cache alone
        for layer, theirs in zip(static.cache.layers, alone[a].layers):
            torch.testing.assert_close(layer.keys[row, :, : committed[a]], theirs.keys[0, :, : committed[a]], **tol)


@pytest.mark.parametrize("mode", ["fold", "window", "dflash", "rerope"])
def test_the_rows_read_in_one_launch_reads_each_row_as_the_per_row_kernel_does(interpreter, mode):
    """The rows step with every row's read of a layer in one ``fold_read_rows_triton`` call (what the graphs engine
    runs) against the same step reading row by row with ``fold_read_triton`` (held to the drafter's own forward by the
    GPU test below and by the kernel's oracle tests), in Triton's interpreter, fp32: three rows in cache rows 2, 0, 3
    of a 4-row cache at lengths 5, 90 (far memory) and 23, two rounds; the logits agree to fp32 rounding and the
    proposals are equal."""
    from fold_hf.kernels.fold_read.triton import fold_read_rows_triton, fold_read_triton

    target = tiny_target("llama", seed=5, dtype=torch.float32)
    drafter = tiny_drafter(target, fold_config=mode_config(mode)).bind_target(target)
    prompts, cache_rows, R = [5, 90, 23], (2, 0, 3), drafter.num_proposals + 1
    steps = {}
    for name, rows_read in (("per_row", None), ("rows", fold_read_rows_triton)):
        static = RowsDrafter(drafter, preallocated_cache(drafter, 128, "cpu", rows=4), fold_read_triton,
                             rows_read=rows_read)
        for a, length in enumerate(prompts):
            commit_context(drafter, row_cache(static.cache, drafter, cache_rows[a]), _features(drafter, length, a))
        steps[name] = static
    committed = list(prompts)
    seen = {"per_row": [], "rows": []}
    original = drafter.proposal_logits
    for r, news in enumerate([(2, 4, 1), (3, 1, 4)]):
        features = torch.randn(3, R, _features(drafter, 1, 0).shape[-1], generator=torch.Generator().manual_seed(r))
        lengths = torch.tensor([[committed[a], news[a], (5 + a + r) % drafter.config.mask_token_id, cache_rows[a]]
                                for a in range(3)])
        with_far = any(steps["rows"].needs_far(committed[a] + news[a]) for a in range(3))
        tokens = {}
        for name, static in steps.items():
            drafter.proposal_logits = lambda hidden, name=name: seen[name].append(original(hidden)) or seen[name][-1]
            tokens[name] = static.draft_rows(features, lengths, with_far, cache_rows)
            del drafter.proposal_logits
        torch.testing.assert_close(seen["rows"][-1], seen["per_row"][-1], rtol=1e-4, atol=1e-4)
        assert torch.equal(tokens["rows"], tokens["per_row"]), (mode, r)
        committed = [c + n for c, n in zip(committed, news)]


def test_a_dspark_drafter_chains_each_rows_slots_from_its_own_anchor(tmp_path):
    """A DSpark drafter (DeepSpec: the anchor slot predicts too, a Markov head biases slot k by the token before it):
    each row's proposals equal the drafter's eager proposal for that row alone, two rounds, rows at 5, 60 and 21."""
    from deepspec_tiny import deepspec_config, deepspec_weights, write_checkpoint

    from fold_hf import FoldDrafter

    target = tiny_target("qwen3", seed=3)
    cfg = deepspec_config(target, "qwen3", block=4, markov_rank=target.config.vocab_size, with_markov=True)
    directory = write_checkpoint(tmp_path, cfg, deepspec_weights(cfg, target, seed=7), dtype=torch.float64)
    drafter = FoldDrafter.from_pretrained(directory).bind_target(target)
    drafter.set_fold_config(mode_config("fold"))
    prompts, R = [5, 60, 21], drafter.num_proposals + 1
    assert drafter.first_proposal_slot == 0 and drafter.markov_head is not None
    static = RowsDrafter(drafter, preallocated_cache(drafter, 128, "cpu", rows=3))
    mine = [row_cache(static.cache, drafter, a) for a in range(3)]
    alone = [drafter.new_cache() for _ in prompts]
    for a, length in enumerate(prompts):
        for cache in (mine[a], alone[a]):
            commit_context(drafter, cache, _features(drafter, length, seed=a))
    committed = list(prompts)
    for r, news in enumerate([(1, 5, 3), (4, 2, 5)]):
        lasts = [(2 + 4 * a + r) % drafter.config.mask_token_id for a in range(3)]
        pendings = [_features(drafter, n, seed=10 * r + a) for a, n in enumerate(news)]
        features = torch.zeros(3, R, pendings[0].shape[-1], dtype=pendings[0].dtype)
        for a, pending in enumerate(pendings):
            features[a, : pending.shape[1]] = pending[0]
        lengths = torch.tensor([[committed[a], news[a], lasts[a], a] for a in range(3)])
        tokens = static.draft_rows(features, lengths, True, (0, 1, 2))
        for a in range(3):
            expected, _ = drafter.propose(torch.tensor([lasts[a]]), pendings[a], alone[a])
            assert tokens[a].tolist() == expected.tolist(), (r, a)
        committed = [c + n for c, n in zip(committed, news)]


def test_a_moved_row_drafts_what_it_drafts_in_its_old_cache_row():
    """The batched rounds keep their running rows in cache rows 0 .. A-1: a row moved from cache row 2 into row 0
    (``move_row`` of its committed entries, its cache then viewing row 0: ``view_row``) drafts, after committing new
    context, the logits and tokens it drafts in row 2 (bit for bit), and its cache's length and entries follow it."""
    target = tiny_target("llama", seed=5)
    drafter = tiny_drafter(target, fold_config=mode_config("fold")).bind_target(target)
    R = drafter.num_proposals + 1
    static = RowsDrafter(drafter, preallocated_cache(drafter, 128, "cpu", rows=3))
    caches = [row_cache(static.cache, drafter, row) for row in range(3)]
    for row, length in enumerate((40, 7, 60)):  # row 0 a shorter prompt of its own: the move overwrites it
        commit_context(drafter, caches[row], _features(drafter, length, seed=row))
    features = torch.zeros(1, R, _features(drafter, 1, 0).shape[-1], dtype=drafter.fc.weight.dtype)
    features[0, :3] = _features(drafter, 3, seed=9)[0]
    seen, original = [], drafter.proposal_logits
    drafter.proposal_logits = lambda hidden: seen.append(original(hidden)) or seen[-1]
    before = static.draft_rows(features, torch.tensor([[60, 3, 5, 2]]), True, (2,))  # in its own row 2, first
    static.move_row(2, 0, 60)
    view_row(caches[2], static.cache, 0)
    assert caches[2].get_seq_length() == 60  # the row's view moved, its length stayed (the host's truth)
    for layer, whole in zip(caches[2].layers, static.cache.layers):
        assert (layer.keys.data_ptr(), layer.values.data_ptr()) == (whole.keys[0].data_ptr(),
                                                                    whole.values[0].data_ptr())
    after = static.draft_rows(features, torch.tensor([[60, 3, 5, 0]]), True, (0,))  # moved into row 0
    del drafter.proposal_logits
    assert torch.equal(seen[1], seen[0]) and torch.equal(after, before)
    for layer in static.cache.layers:  # row 0 now holds row 2's entries, the 3 new ones included
        assert torch.equal(layer.keys[0, :, :63], layer.keys[2, :, :63])
        assert torch.equal(layer.values[0, :, :63], layer.values[2, :, :63])
    with pytest.raises(ValueError, match="not both rows of a 3-row cache"):
        static.move_row(3, 0, 10)


def test_the_step_refuses_rows_that_do_not_match_its_cache():
    target = tiny_target("llama", seed=5)
    drafter = tiny_drafter(target, fold_config=mode_config("fold")).bind_target(target)
    static = RowsDrafter(drafter, preallocated_cache(drafter, 64, "cpu", rows=2))
    features = torch.zeros(1, drafter.num_proposals + 1, 2 * target.config.hidden_size, dtype=torch.float64)
    with pytest.raises(ValueError, match="do not match"):
        static.draft_rows(features, torch.tensor([[5, 0, 1, 2]]), False, (2,))
    with pytest.raises(ValueError, match="the rows drafting step does not cover mode 'streaming'"):
        RowsDrafter(tiny_drafter(target, fold_config=mode_config("streaming")),
                    preallocated_cache(drafter, 64, "cpu", rows=2))


# ------------------------------------------------------------------------------------------------ in batched rounds
@pytest.fixture
def host_drafts(monkeypatch):
    """The rows of every host-driven ``propose_rows`` call of the batched rounds, recorded."""
    calls = []
    original = batched.propose_rows

    def recording(drafter, lasts, *args):
        calls.append(len(lasts))
        return original(drafter, lasts, *args)

    monkeypatch.setattr(batched, "propose_rows", recording)
    return calls


def _corrupting(drafter):
    """A copy of ``drafter`` whose proposals are corrupted at a slot depending on the round and the row (the same in
    every engine: one ``proposal_logits`` call a round over the drafting rows), so rows reject at different slots."""
    drafter = copy.deepcopy(drafter)
    original, calls = drafter.proposal_logits, [0]

    def corrupted(hidden):
        logits = original(hidden).clone()
        calls[0] += 1
        for a in range(logits.shape[0]):
            slot = (calls[0] + a) % 4  # slot 3: none this round
            if slot < logits.shape[1]:
                logits[a, slot] = logits[a, slot].flip(-1)
        return logits

    drafter.proposal_logits = corrupted
    return drafter, calls


@pytest.mark.parametrize("buckets", [False, True], ids=["rows", "buckets"])
@pytest.mark.parametrize("fused_layers", [True, None], ids=["fused", "modules"])
def test_static_batched_rounds_draft_every_row_in_one_step(pair, host_drafts, fused_layers, buckets, monkeypatch):
    """engine='static': the rows draft through the rows step (its fused layers' twins with fused_layers=True, the
    drafter's modules otherwise), never propose_rows; every row is its own greedy output alone, with a row shorter
    than the window, one reading far memory, per-row rejections that differ and a row stopping at its EOS; and each
    row proposes and accepts round by round exactly what the eager engine's propose_rows gives it. ``buckets``: the
    steps run row buckets as on the graphs engine (the parked cache rows of the rows that stopped beside the running
    ones), keyed by the bucket of the count of rows still running."""
    if buckets:
        monkeypatch.setattr(batched, "pads_rows", lambda engine: engine == "static")
    target, drafter = pair
    rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5), row_prompt(1, 90)]
    ids, mask = left_pad(rows)
    news = [greedy_alone(target, r, NEW, EOS) for r in rows]
    assert min(len(n) for n in news) < NEW == max(len(n) for n in news)  # a row stops early, another runs on
    outs = {}
    for engine in ("static", "eager"):
        corrupted, calls = _corrupting(drafter)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="batched rounds on engine 'static' verify host-length")
            outs[engine] = fold_hf.fast_generate(target, corrupted, ids, mask, max_new_tokens=NEW, engine=engine,
                                                 fused_layers=fused_layers if engine == "static" else None,
                                                 eos_token_id=EOS, return_stats=True, fold_config=mode_config("fold"))
        if engine == "static":
            steps = target.__dict__[SESSION_ATTR].steps
            keys = [key for key in steps if key[0] == "draft_rows"]
            verifies = [key for key in steps if key[0] == "rows"]
            assert not host_drafts and calls[0] > 0
        release_fast_state(target)
        assert torch.equal(outs[engine].sequences, expected_batch(ids, news, pad=EOS)), engine
    eager = outs["eager"].rows
    rounds = max(len(row.proposals) for row in eager)
    drafting = [r for r in range(rounds) if any(r < len(row.proposals) and row.proposals[r] for row in eager)]
    assert len(host_drafts) == len(drafting)  # the eager engine's drafts: propose_rows, once a round some row drafts
    running = {sum(len(row.proposals) > r for row in eager) for r in drafting}
    assert {4, 3} < running
    bucketed = {batched.row_bucket(A, len(rows), buckets) for A in running}
    assert {key[1] for key in keys} == bucketed, keys  # by the (bucket of the) count of rows still running
    if fused_layers:  # the fixed-shape verify: the same buckets (a round whose rows take no draft verifies too)
        assert {key[1] for key in verifies} >= bucketed and {key[1] for key in verifies} <= {1, 2, 3, 4} - (
            {3} if buckets else set()), verifies
    assert {key[2] for key in keys} == {True}  # some row reads far memory in every round
    patterns = [row.acceptance_lengths for row in outs["static"].rows]
    assert len({tuple(p) for p in patterns}) == len(rows) and {1, 2, 3} <= {n for p in patterns for n in p}, patterns
    for mine, theirs in zip(outs["static"].rows, outs["eager"].rows):
        assert mine.proposals == theirs.proposals and mine.acceptance_lengths == theirs.acceptance_lengths


@pytest.mark.parametrize("modes", [("fold", "window"), ("window", "dflash", "fold")], ids=lambda m: "-".join(m))
def test_the_rounds_read_a_steps_outputs_before_another_step_replays(pair, monkeypatch, modes):
    """The graphs engine's steps share one memory pool, so a step's outputs hold only until another step replays
    (after the rows step, the verify; a verify captured before it, e.g. in an earlier call of another reading mode,
    reused that memory on the H100 and every later mode accepted nothing). engine='static' with steps that overwrite
    each other's outputs as such a pool may (tests/shared_pool.py, installed for every test by tests/conftest.py;
    buckets as on the graphs engine), the modes one after the other in one
    session: every row proposes and accepts round by round what the eager engine's propose_rows gives it, and is its
    own greedy output."""
    from shared_pool import SharedPoolStep

    from fold_hf.generation.fast import session as session_module

    assert session_module.EagerStep is SharedPoolStep  # tests/conftest.py's steps_share_a_pool
    monkeypatch.setattr(batched, "pads_rows", lambda engine: engine == "static")
    target, drafter = pair
    rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5), row_prompt(1, 90)]
    ids, mask = left_pad(rows)
    news = [greedy_alone(target, r, NEW, EOS) for r in rows]
    kw = dict(max_new_tokens=NEW, eos_token_id=EOS, return_stats=True)
    eager = {}
    for mode in modes:
        eager[mode] = fold_hf.fast_generate(target, drafter, ids, mask, engine="eager", fold_config=mode_config(mode),
                                            **kw)
        release_fast_state(target)
    for mode in modes:  # one session: each mode's rows step after the steps of the modes before it
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="batched rounds on engine 'static' verify host-length")
            out = fold_hf.fast_generate(target, drafter, ids, mask, engine="static", fused_layers=True,
                                        fold_config=mode_config(mode), **kw)
        assert torch.equal(out.sequences, expected_batch(ids, news, pad=EOS)), mode
        assert any(n > 0 for row in out.rows for n in row.acceptance_lengths), mode  # not a batch that never accepts
        for a, (mine, theirs) in enumerate(zip(out.rows, eager[mode].rows)):
            assert mine.proposals == theirs.proposals, (mode, a)
            assert mine.acceptance_lengths == theirs.acceptance_lengths, (mode, a)
    steps = target.__dict__[SESSION_ATTR].steps
    assert any(k[0] == "draft_rows" for k in steps) and any(k[0] == "rows" for k in steps)  # both steps ran
    release_fast_state(target)


@pytest.mark.parametrize("why", ["streaming", "sampled"])
def test_what_the_rows_step_does_not_take_drafts_on_the_host_saying_why_once(pair, host_drafts, monkeypatch, why):
    target, drafter = pair
    monkeypatch.setattr(settings, "_WARNED", set())
    rows = [row_prompt(2, 23), row_prompt(0, 5)]
    ids, mask = left_pad(rows)
    kw = (dict(fold_config=mode_config("streaming")) if why == "streaming"
          else dict(do_sample=True, generator=[torch.Generator().manual_seed(i) for i in range(2)]))
    expected = {"streaming": "does not cover mode 'streaming'", "sampled": "drafts greedily"}[why]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=6, engine="static",
                                        fused_layers=True, return_stats=True, **kw)
    steps = target.__dict__[SESSION_ATTR].steps
    assert not [key for key in steps if key[0] == "draft_rows"]
    release_fast_state(target)
    said = [str(w.message) for w in record if "draft on the host (propose_rows)" in str(w.message)]
    assert len(said) == 1 and expected in said[0], said
    assert out.batched and host_drafts
    if why == "streaming":
        assert torch.equal(out.sequences, expected_batch(ids, [greedy_alone(target, r, 6) for r in rows], pad=-1))


# ------------------------------------------------------------------------------------------------ on the GPU
@pytest.mark.gpu(reason="CUDA graphs: the captured rows drafting step with the Triton FOLD read")
@pytest.mark.parametrize("mode", ["fold", "window", "dflash"])
def test_the_graphs_engine_captures_the_rows_step_and_every_row_is_its_own(mode):
    """On CUDA (fp32), graphs engine, 8 rows: the drafts run as captured rows steps (no propose_rows), every row is its
    own greedy output, and every row's proposals and acceptances equal the eager engine's (propose_rows)."""
    from fold_hf.generation.graphs import CapturedStep
    from tiny import pair_on_gpu

    with pair_on_gpu("llama") as (target, drafter):
        rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5), row_prompt(1, 90)] * 2
        ids, mask = left_pad(rows)
        news = [greedy_alone(target, r.cuda(), NEW, EOS) for r in rows]
        outs = {}
        for engine in ("graphs", "eager"):
            outs[engine] = fold_hf.fast_generate(target, drafter, ids.cuda(), mask.cuda(), max_new_tokens=NEW,
                                                 engine=engine, eos_token_id=EOS, return_stats=True,
                                                 fold_config=mode_config(mode))
            if engine == "graphs":
                steps = {k: s for k, s in target.__dict__[SESSION_ATTR].steps.items() if k[0] == "draft_rows"}
                assert steps and all(isinstance(s, CapturedStep) for s in steps.values())
                assert max(k[1] for k in steps) == 8
            release_fast_state(target)
            assert torch.equal(outs[engine].sequences.cpu(), expected_batch(ids, news, pad=EOS)), engine
        for mine, theirs in zip(outs["graphs"].rows, outs["eager"].rows):
            assert mine.proposals == theirs.proposals and mine.acceptance_lengths == theirs.acceptance_lengths


@pytest.mark.gpu(reason="CUDA graphs sharing one memory pool across calls of several reading modes")
def test_the_graphs_engine_switching_modes_in_one_session_drafts_as_each_mode_alone():
    """On CUDA (fp32), graphs engine, 8 rows, modes fold, window, dflash, fold one after the other in one session (as a
    benchmark comparing methods runs them): every call's rows propose and accept round by round what that mode's
    eager engine gives them (on an H100 every mode after the first accepted nothing at the Gemma-3 pair's suite:
    the rows step's proposals were read after a verify captured before it had replayed over them)."""
    from tiny import pair_on_gpu

    with pair_on_gpu("llama") as (target, drafter):
        rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5), row_prompt(1, 90)] * 2
        ids, mask = left_pad(rows)
        ids, mask = ids.cuda(), mask.cuda()
        kw = dict(max_new_tokens=NEW, eos_token_id=EOS, return_stats=True)
        modes = ("fold", "window", "dflash", "fold")
        eager = {}
        for mode in set(modes):
            eager[mode] = fold_hf.fast_generate(target, drafter, ids, mask, engine="eager",
                                                fold_config=mode_config(mode), **kw)
            release_fast_state(target)
        for mode in modes:
            out = fold_hf.fast_generate(target, drafter, ids, mask, engine="graphs", fold_config=mode_config(mode),
                                        **kw)
            assert torch.equal(out.sequences, eager[mode].sequences), mode
            for a, (mine, theirs) in enumerate(zip(out.rows, eager[mode].rows)):
                assert mine.proposals == theirs.proposals, (mode, a)
                assert mine.acceptance_lengths == theirs.acceptance_lengths, (mode, a)
        release_fast_state(target)


@pytest.mark.gpu(reason="bf16 Triton FOLD reads of the rows step inside a CUDA graph")
@pytest.mark.parametrize("mode", ["fold", "window", "dflash"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", ["tiny", "long"])
@pytest.mark.parametrize("reads", ["rows", "per_row"])
def test_the_captured_rows_step_reads_each_row_as_its_own_forward_on_the_gpu(dtype, mode, shape, reads):
    """8 rows, the step captured in a CUDA graph with the Triton read and fused layers, replayed twice with new
    lengths: each row's logits match the drafter's eager forward over that row alone (bf16: to bf16 rounding; fp32:
    tightly). ``tiny``: lengths 3 to 300 (W = 16: with FOLD most read far memory; the window and the drafter as
    trained read without a far branch). ``long``: the Gemma-3 pair's drafter shape (4 heads of 256 over 1 KV head,
    blocks of 8, W = 2048) at lengths 100 to 33,000 of a 34K cache. ``reads``: every row of a layer in one launch
    pair (``fold_read_rows_triton``, the session's default on CUDA) or one ``fold_read_triton`` per row."""
    from fold_hf import FoldConfig
    from fold_hf.generation.graphs import CapturedStep
    from fold_hf.generation.static_drafter import default_read_function, default_rows_read_function

    target = tiny_target("llama", seed=5).to("cuda", dtype)
    if shape == "tiny":
        drafter = tiny_drafter(target, fold_config=mode_config(mode))
        prompts, capacity = [3, 300, 17, 64, 9, 150, 33, 240], 512
    else:
        config = FoldConfig(mode=mode, window=2048, alpha=2.0, train_length=4096)
        drafter = tiny_drafter(target, fold_config=config, block=8, heads=4, kv_heads=1, head_dim=256)
        prompts, capacity = [3000, 33000, 100, 20000, 2100, 9000, 31000, 500], 34000
    drafter = drafter.to("cuda").bind_target(target)
    R, A = drafter.num_proposals + 1, len(prompts)
    static = RowsDrafter(drafter, preallocated_cache(drafter, capacity, "cuda", rows=A),
                         default_read_function("cuda"), layer_ops=default_layer_ops(torch.device("cuda")),
                         rows_read=default_rows_read_function("cuda") if reads == "rows" else None)
    assert (static.rows_read is not None) == (reads == "rows")
    mine = [row_cache(static.cache, drafter, a) for a in range(A)]
    alone = [drafter.new_cache() for _ in prompts]
    for a, length in enumerate(prompts):
        for cache in (mine[a], alone[a]):
            commit_context(drafter, cache, _features(drafter, length, seed=a).cuda())
    features = torch.zeros(A, R, 2 * target.config.hidden_size, device="cuda", dtype=dtype)
    lengths = torch.zeros(A, 4, dtype=torch.long, device="cuda")
    seen, original = [], drafter.proposal_logits
    step = logits = None
    committed = list(prompts)
    for r in range(2):
        news = [1 + (a + r) % R for a in range(A)]
        lasts = [(5 + a) % drafter.config.mask_token_id for a in range(A)]  # token ids inside the tiny vocabulary
        pendings = [_features(drafter, n, seed=50 * r + a).cuda() for a, n in enumerate(news)]
        for a, pending in enumerate(pendings):
            features[a, : news[a]] = pending[0]
        lengths.copy_(torch.tensor([[committed[a], news[a], lasts[a], a] for a in range(A)]))
        if step is None:  # the logits the graph writes at every replay: the tensor its capture allocated
            drafter.proposal_logits = lambda hidden: seen.append(original(hidden)) or seen[-1]
            with_far = any(static.needs_far(c + n) for c, n in zip(committed, news))
            assert with_far == (mode == "fold")
            step = CapturedStep(lambda: static.draft_rows(features, lengths, with_far, tuple(range(A))))
            del drafter.proposal_logits
            logits = seen[-1]
        step.replay()
        expected = [drafter.draft_logits(torch.tensor([lasts[a]], device="cuda"), pendings[a], alone[a])[0].float()
                    for a in range(A)]
        tol = dict(rtol=5e-2, atol=5e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
        for a in range(A):
            torch.testing.assert_close(logits[a].float(), expected[a], **tol, msg=f"round {r} row {a}")
        committed = [c + n for c, n in zip(committed, news)]


def test_the_modes_check_dry_run_finds_every_row_proposing_as_the_eager_engine(tmp_path):
    """``benchmarks/batched_modes_check.py --dry-run`` (a tiny pair, engines static and eager, three modes): every row
    of the static engine's rows step proposes round by round what the eager engine's ``propose_rows`` proposes."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "batched_modes_check.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--dry-run", "--batch", "3", "--new", "8",
                    "--alone", "1"], check=True, capture_output=True)
    rows = json.loads((tmp_path / "modes_check.json").read_text())["rows"]
    assert {(r["mode"], r["engine"]) for r in rows} == {(m, e) for m in ("window", "dflash", "fold")
                                                         for e in ("static", "eager")}
    for row in rows:
        assert row["rows_proposing_as_eager"] == 3 and row["first_differing_round"] == [None] * 3, row
