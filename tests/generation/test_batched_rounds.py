"""Batched rounds (issue 35): the rows of a batch decoded together on the fast loop, one target forward per round.

The independent statements: each row decoded alone by transformers' own greedy ``generate`` (fp32 / fp64), the
transformers model's own forward over a row's whole sequence (for ``forward_rows``), and the target's exact sampled
distribution under transformers' processors (χ², per row). Batched rounds must also draft, accept and stop each row
exactly as the row alone does (acceptance lengths and proposals compared round by round)."""

import copy
import warnings

import pytest
import torch
from test_batch import alone, expected_batch, left_pad, pair, row_prompt  # noqa: F401  (pair: test_batch's fixture)
from sampling_reference import FULL_WARP, VOCAB, chi2_statistic, chi2_threshold, transformers_distribution

import fold_hf
from fold_hf import FoldConfig
from fold_hf.generation import BatchGenerationResult, batch, release_fast_state
from fold_hf.generation.fast import SESSION_ATTR
from fold_hf.targets.base import StaticTarget, UnsupportedTarget, bucket_length
from fold_hf.targets.registry import build_static_target
from tiny import fit_drafter, mode_config, tiny_drafter, tiny_target

NEW = 12
# short (5 < the window W = 16), far longer than W (90), medium (23): rows 0 and 2 padded
ROWS = [row_prompt(0, 5), row_prompt(1, 90), row_prompt(2, 23)]


@pytest.fixture
def forwards(monkeypatch):
    """The rows of every batched verify forward (``forward_rows``), recorded."""
    seen = []
    original = StaticTarget.forward_rows

    def recording(self, input_ids, rows, starts, taps_out=None):
        seen.append((list(rows), list(starts), input_ids.shape[1]))
        return original(self, input_ids, rows, starts, taps_out)

    monkeypatch.setattr(StaticTarget, "forward_rows", recording)
    return seen


def batched(target, drafter, ids, mask, **kw):
    kw.setdefault("max_new_tokens", NEW)
    out = fold_hf.fast_generate(target, drafter, ids, mask, return_stats=True, **kw)
    assert isinstance(out, BatchGenerationResult) and out.batched
    release_fast_state(target)
    return out


def alone_fast(target, drafter, row: torch.Tensor, **kw):
    kw.setdefault("max_new_tokens", NEW)
    out = fold_hf.fast_generate(target, drafter, row[None], engine="eager", return_stats=True, **kw)
    release_fast_state(target)
    return out


# ------------------------------------------------------------------------------------------------ the runner
def test_forward_rows_gives_each_row_its_own_logits_at_its_own_position():
    """``forward_rows`` over three rows at three different cache lengths equals the transformers model's own forward
    over each row's whole sequence (fp64), and leaves each row's cache as that forward would (a second block on top
    of it is right too)."""
    target = tiny_target("llama", seed=5)
    lengths = [7, 40, 19]
    seqs = [torch.randint(0, 10, (n + 8,), generator=torch.Generator().manual_seed(n)) for n in lengths]
    runner = build_static_target(target, 64, (), batch=3)
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        runner.prefill(s[None, :n], row=i)
    with torch.no_grad():
        full = [target(s[None]).logits[0] for s in seqs]
    for block in range(2):  # two blocks of 4 tokens per row
        starts = [n + 4 * block for n in lengths]
        ids = torch.stack([s[p : p + 4] for s, p in zip(seqs, starts)])
        logits = runner.forward_rows(ids, [0, 1, 2], starts)
        assert logits.shape == (3, 4, target.config.vocab_size)
        for i, (f, p) in enumerate(zip(full, starts)):
            torch.testing.assert_close(logits[i], f[p : p + 4], rtol=0, atol=1e-10)
    # a subset of rows, in another order: rows 2 and 0 only
    starts = [lengths[2] + 8 - 2, lengths[0] + 8 - 2]
    ids = torch.stack([seqs[2][starts[0] : starts[0] + 2], seqs[0][starts[1] : starts[1] + 2]])
    logits = runner.forward_rows(ids, [2, 0], starts)
    torch.testing.assert_close(logits[0], full[2][starts[0] : starts[0] + 2], rtol=0, atol=1e-10)
    torch.testing.assert_close(logits[1], full[0][starts[1] : starts[1] + 2], rtol=0, atol=1e-10)


def test_the_runner_refuses_what_it_does_not_hold(monkeypatch):
    target = tiny_target("llama", seed=5)
    runner = build_static_target(target, 32, (), batch=2)
    with pytest.raises(ValueError, match="row 2 is not a row of this runner's cache"):
        runner.prefill(torch.zeros(1, 4, dtype=torch.long), row=2)
    with pytest.raises(ValueError, match="exceed the cache capacity 32"):
        runner.forward_rows(torch.zeros(2, 4, dtype=torch.long), [0, 1], [3, 30])
    with pytest.raises(ValueError, match="one-row cache"):
        runner.forward_static(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 32)
    from fold_hf.targets.qwen35 import Qwen35StaticTarget

    monkeypatch.setattr(Qwen35StaticTarget, "batched_rows", False)  # every family holds rows now: one that says not
    qwen35 = tiny_target("qwen35", seed=5)
    with pytest.raises(UnsupportedTarget, match="keeps one row per cache"):
        build_static_target(qwen35, 32, (), batch=2)


# ------------------------------------------------------------------------------------------------ greedy
@pytest.mark.parametrize("mode", ["fold", "dflash", "window", "streaming", "rerope", "infllm"])
def test_each_row_is_its_own_greedy_output_and_drafts_as_alone(pair, forwards, mode):
    """Every row equals transformers' greedy output of the row alone; it proposes and accepts round by round exactly
    what it does decoded alone; and the rows really ran together (verify forwards over several rows)."""
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    out = batched(target, drafter, ids, mask, fold_config=mode_config(mode))
    assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r) for r in ROWS], pad=-1)), mode
    for i, r in enumerate(ROWS):
        single = alone_fast(target, drafter, r, fold_config=mode_config(mode))
        assert out.rows[i].acceptance_lengths == single.acceptance_lengths, (mode, i)
        assert out.rows[i].proposals == single.proposals, (mode, i)
        assert out.rows[i].mode == mode
    assert max(len(rows) for rows, _, _ in forwards) == 3
    assert sum(len(rows) for rows, _, _ in forwards) == sum(len(row.acceptance_lengths) for row in out.rows)


def test_an_early_eos_row_leaves_the_batch_and_the_others_go_on(pair, forwards):
    target, drafter = pair
    rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5)]
    ids, mask = left_pad(rows)
    eos = 2  # row 1 generates it second, row 2 ninth, row 0 never (the rows' greedy outputs, asserted below)
    news = [alone(target, r, eos=eos) for r in rows]
    assert [len(n) for n in news] == [NEW, 2, 9], news
    out = batched(target, drafter, ids, mask, eos_token_id=eos)
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos))
    assert out.finish_reason == ["length", "eos", "eos"]
    # each round verifies the rows still running, in cache rows 0 .. A-1 (a stopped row's freed by the last running
    # row's move): a row is not verified again once it stopped
    rounds = [sum(len(row.acceptance_lengths) > r for row in out.rows) for r in range(len(forwards))]
    assert [verified for verified, _, _ in forwards] == [list(range(n)) for n in rounds], forwards
    assert len(forwards) == len(out.rows[0].acceptance_lengths) and rounds[-1] == 1


@pytest.mark.parametrize("engine", ["eager", "static"])
@pytest.mark.parametrize("processing", [dict(repetition_penalty=8.0), dict(min_new_tokens=6)],
                         ids=["repetition_penalty", "min_new_tokens"])
def test_processed_greedy_rows_are_each_their_own_output(pair, engine, processing):
    """Greedy rows whose scores are processed (a repetition penalty over the row's own tokens, or EOS masked until
    min_new_tokens): acceptance runs row by row (the plain-argmax acceptance of all rows at once does not apply),
    and every row is transformers' greedy output of that row alone with the same processing (EOS = 2, which rows 1
    and 2 generate early unprocessed)."""
    target, drafter = pair
    rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5)]
    ids, mask = left_pad(rows)
    news = [target.generate(r[None], max_new_tokens=NEW, do_sample=False, eos_token_id=2, pad_token_id=2,
                            **processing)[0, len(r):].tolist() for r in rows]
    news = [n[: n.index(2) + 1] if 2 in n else n for n in news]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="batched rounds on engine")
        out = batched(target, drafter, ids, mask, eos_token_id=2, engine=engine, **processing)
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=2)), (out.sequences, news)
    if "min_new_tokens" in processing:
        assert min(len(n) for n in news) >= 6 and any(len(n) < NEW for n in news)  # the mask held EOS back
    else:  # the penalty changes what the rows generate
        assert news != [alone(target, r, eos=2) for r in rows]


def test_rows_with_different_budgets_left_by_max_length(pair):
    """max_length counts the padded width: every row gets the same number of new tokens, as in transformers."""
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    out = batched(target, drafter, ids, mask, max_new_tokens=None, max_length=ids.shape[1] + 7)
    assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r)[:7] for r in ROWS], pad=-1))


def test_forced_rejections_that_differ_per_row(pair):
    """A drafter whose proposals are corrupted at a slot that depends on the row's position: rows reject at
    different slots in different rounds, and every row is still its own greedy output."""
    target, drafter = pair
    drafter = copy.deepcopy(drafter)
    original = drafter.draft_logits

    def corrupted(last, pending, cache, block_start):
        logits = original(last, pending, cache, block_start=block_start).clone()
        slot = block_start % 4  # slot 3: no corruption in this round
        if slot < logits.shape[1]:
            logits[0, slot] = logits[0, slot].flip(-1)  # the least likely token becomes the proposal
        return logits

    drafter.draft_logits = corrupted
    ids, mask = left_pad(ROWS)
    out = batched(target, drafter, ids, mask)
    assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r) for r in ROWS], pad=-1))
    patterns = [row.acceptance_lengths for row in out.rows]
    assert len({tuple(p) for p in patterns}) == 3, patterns
    assert {1, 2, 3} <= {n for p in patterns for n in p}, patterns  # rejections at the first and later slots


def test_a_deepspec_drafter_with_a_confidence_cut(tmp_path_factory):
    """A DSpark drafter (Qwen3 target, the Llama family) whose confidence threshold cuts blocks to different lengths
    per row: rows verify blocks of different widths in one forward, and each is its own greedy output."""
    from deepspec_tiny import deepspec_config, deepspec_weights, target_bigram, write_checkpoint

    from fold_hf import FoldDrafter

    target = tiny_target("qwen3", seed=3)
    V = target.config.vocab_size
    cfg = deepspec_config(target, "qwen3", block=4, markov_rank=V, confidence=True, with_markov=True)
    weights = deepspec_weights(cfg, target, seed=7, bigram=target_bigram(target))  # proposals often accepted
    directory = write_checkpoint(tmp_path_factory.mktemp("dspark"), cfg, weights, dtype=torch.float64)
    drafter = FoldDrafter.from_pretrained(directory).bind_target(target)
    drafter.set_fold_config(mode_config("fold"))
    drafter.set_confidence_threshold(0.6)
    rows = [row_prompt(3, 12), row_prompt(4, 100), row_prompt(5, 40)]
    ids, mask = left_pad(rows)
    out = batched(target, drafter, ids, mask, max_new_tokens=30)
    news = [target.generate(r[None], max_new_tokens=30, do_sample=False)[0, len(r):].tolist() for r in rows]
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=-1))
    sizes = {len(p) for row in out.rows for p in row.proposals}
    assert len(sizes) >= 2, sizes  # the cut left blocks of several sizes
    for i, r in enumerate(rows):
        single = alone_fast(target, drafter, r, max_new_tokens=30)
        assert out.rows[i].proposals == single.proposals


def test_ar_batch_without_a_drafter(pair):
    target, _ = pair
    ids, mask = left_pad(ROWS)
    out = batched(target, None, ids, mask)
    assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r) for r in ROWS], pad=-1))
    assert all(set(row.acceptance_lengths) == {1} for row in out.rows)


def test_routed_generate_runs_batched_rounds(pair, forwards):
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="fold_hf: batch of")  # no row-by-row warning: it is batched
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
    assert SESSION_ATTR in target.__dict__
    release_fast_state(target)
    assert torch.equal(out, expected_batch(ids, [alone(target, r) for r in ROWS], pad=-1))
    assert max(len(rows) for rows, _, _ in forwards) == 3


@pytest.mark.parametrize("mode", ["fold", "window"])
def test_the_static_engine_verifies_the_batch_as_a_fixed_shape_step(pair, forwards, mode):
    """engine='static' with the fused layers (their torch twins here): the batched verify runs as the session's
    fixed-shape steps (the graphs engine captures the same function), not through forward_rows, and every row is
    still its own greedy output with the eager engine's proposals and acceptances."""
    from fold_hf.generation.fast.session import session_for  # noqa: F401  (the session the steps live in)

    target, drafter = pair
    ids, mask = left_pad(ROWS)
    eos = 2  # row 1 stops early: the running rows change, and the step with them
    rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5)]
    ids, mask = left_pad(rows)
    news = [alone(target, r, eos=eos) for r in rows]
    out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, engine="static", fused_layers=True,
                                return_stats=True, eos_token_id=eos, fold_config=mode_config(mode))
    session = target.__dict__[SESSION_ATTR]
    keys = [key for key in session.steps if key[0] == "rows"]
    release_fast_state(target)
    assert out.batched and not forwards  # verified by the steps, not forward_rows
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos))
    assert {key[1] for key in keys} >= {3, 2}, keys  # all three rows, then the two still running (their count)
    eager = batched(target, drafter, ids, mask, eos_token_id=eos, fold_config=mode_config(mode))
    for mine, theirs in zip(out.rows, eager.rows):
        assert mine.proposals == theirs.proposals and mine.acceptance_lengths == theirs.acceptance_lengths


def test_a_batch_wider_than_the_skinny_gemm_projects_through_cublas(pair):
    """The skinny GEMMs take 1 to ``skinny_rows`` rows (a verify block, :mod:`fold_hf.kernels.gemm.triton`); a batched
    verify of A rows of L tokens has A * L rows, so past ``skinny_rows`` its projections go to ``F.linear``. The ops
    here are the GEMMs' torch twins held to the Triton kernels' row contract (the 2026-12-05 H200 run raised "the
    skinny GEMM takes 1 to 16 rows, got 20" at B = 2, block 10)."""
    from fold_hf.kernels import default_layer_ops
    from fold_hf.kernels.gemm.naive import gate_up_silu_reference, skinny_linear_reference
    from fold_hf.targets.llama import LlamaStaticTarget

    target, drafter = pair
    limit, seen = 8, []

    def held(fn):
        def call(x, *args):
            rows = x.reshape(-1, x.shape[-1]).shape[0]
            seen.append(rows)
            assert 1 <= rows <= limit, f"the skinny GEMM takes 1 to {limit} rows, got {rows}"
            return fn(x, *args)
        return call

    ops = default_layer_ops(torch.device("cpu"))
    ops.skinny_linear, ops.gate_up_silu = held(skinny_linear_reference), held(gate_up_silu_reference)
    ops.skinny_rows = limit
    original = LlamaStaticTarget._fused_ops

    def fused_ops(self, exact):
        layer_ops, attention = original(self, exact)
        return (ops, attention) if not exact else (layer_ops, attention)

    rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5)]  # 3 rows of a 4-token block: 12 > 8 rows
    ids, mask = left_pad(rows)
    news = [alone(target, r) for r in rows]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LlamaStaticTarget, "_fused_ops", fused_ops)
        out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, engine="static",
                                    fused_layers=True, fold_config=mode_config("fold"))
    release_fast_state(target)
    assert torch.equal(out, expected_batch(ids, news, pad=-1))
    assert seen and max(seen) <= limit  # the skinny path ran (one row left, or AR) and never past its contract


def test_the_static_engines_steps_serve_the_next_request_of_the_session(pair):
    """A second batch of the same shapes on the same session replays the steps the first one built (the same
    running rows, widths and buckets): they read the session's buffers, so the second batch's rows are its own."""
    target, drafter = pair
    first = [row_prompt(6, 23), row_prompt(7, 50), row_prompt(8, 5)]
    second = [row_prompt(9, 23), row_prompt(10, 50), row_prompt(11, 5)]  # the same lengths, other tokens
    release_fast_state(target)
    for rows in (first, second):
        ids, mask = left_pad(rows)
        out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, engine="static",
                                    fused_layers=True, return_stats=True)
        assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r) for r in rows], pad=-1))
    steps = [key for key in target.__dict__[SESSION_ATTR].steps if key[0] == "rows"]
    release_fast_state(target)
    assert len(steps) == len(set(steps)) and steps  # one step per key, built by the first batch and replayed


def _keys_by_round(out, prompts, capacity: int, slots: int) -> tuple[set, set]:
    """The verify steps' keys ``("rows", A, W, bucket, True)`` the rounds of ``out`` need (``A`` rows running, block
    width ``W`` = ``slots + 1`` always: a row with fewer proposals is padded to a full block, the bucket of the longest
    running row) and the running counts of the rounds in which some row drafts (the rows drafting step's ``A``)."""
    rows = out.rows
    verify, drafting = set(), set()
    for r in range(max(len(row.proposals) for row in rows)):
        running = [(row, len(p)) for row, p in zip(rows, prompts) if len(row.proposals) > r]
        assert max(len(row.proposals[r]) for row, _ in running) <= slots
        width = 1 + slots
        longest = max(length + sum(row.acceptance_lengths[:r]) for row, length in running)
        verify.add(("rows", len(running), width, bucket_length(longest + width, capacity), True))
        if any(row.proposals[r] for row, _ in running):
            drafting.add(len(running))
    return verify, drafting


def test_the_static_engines_steps_are_keyed_by_how_many_rows_run(pair):
    """engine='static' (the fused layers' twins: the verify and the rows drafting step are both session steps, run
    eagerly here through the keys the graphs engine captures): rows stop at their EOS in different rounds, and the
    steps built are keyed by how many rows run (the running rows are cache rows 0 .. A-1, a stopped row's cache row
    taking the last running row's state), not by which: one verify step per count and bucket (the block width is
    always a full block, so rows nearing their budget build none), one rows drafting step per count (and far read).
    A second call whose rows stop in another order (the same prompts permuted: another cache row stops first) builds
    no step. Every row is its own greedy output alone in both."""
    target, drafter = pair
    eos = 2
    prompts = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5)]  # stop at their 12th (never), 2nd, 9th token
    release_fast_state(target)
    built = []
    for order in ([0, 1, 2], [1, 2, 0]):  # the second call's cache row 0 stops first, the first call's row 1
        rows = [prompts[i] for i in order]
        ids, mask = left_pad(rows)
        news = [alone(target, r, eos=eos) for r in rows]
        out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, engine="static",
                                    fused_layers=True, eos_token_id=eos, return_stats=True,
                                    fold_config=mode_config("fold"))
        assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos)), order
        stopped = [len(row.acceptance_lengths) for row in out.rows]
        assert len(set(stopped)) == 3 and stopped.index(min(stopped)) == order.index(1), stopped  # in three rounds
        session = target.__dict__[SESSION_ATTR]
        verify, drafting = _keys_by_round(out, rows, session.capacity, drafter.num_proposals)
        keys = list(session.steps)
        assert {key for key in keys if key[0] == "rows"} == verify, (keys, verify)
        draft_keys = [key for key in keys if key[0] == "draft_rows"]
        assert {key[1] for key in draft_keys} == drafting and len(draft_keys) <= 2 * len(drafting), draft_keys
        assert {key[1] for key in keys if key[0] == "rows"} == {3, 2, 1}, keys
        built.append(keys)
    release_fast_state(target)
    assert built[1] == built[0]  # the second call replayed the first call's steps, none built


@pytest.mark.gpu(reason="CUDA graphs: the captured batched verify")
@pytest.mark.parametrize("engine", ["graphs", "eager", None])
def test_batched_rounds_on_the_gpu_are_each_row_alone(engine):
    """On CUDA (fp32): the graphs engine's captured batched verify (fused Triton layers; the default engine of a
    batch on CUDA) and the eager engine give every row its own greedy output, with rows stopping early (the running
    rows change the captured step) and more verify rows than one skinny GEMM takes."""
    from tiny import pair_on_gpu

    with pair_on_gpu("llama") as (target, drafter):
        rows = [row_prompt(2, 23), row_prompt(5, 50), row_prompt(0, 5), row_prompt(1, 90)] * 2  # 8 rows of 4
        ids, mask = left_pad(rows)
        news = [target.generate(r[None].cuda(), max_new_tokens=NEW, do_sample=False, eos_token_id=2,
                                pad_token_id=2)[0, len(r):].tolist() for r in rows]
        out = fold_hf.fast_generate(target, drafter, ids.cuda(), mask.cuda(), max_new_tokens=NEW, engine=engine,
                                    eos_token_id=2, return_stats=True, fold_config=mode_config("fold"))
        assert out.batched
        assert torch.equal(out.sequences.cpu(), expected_batch(ids, news, pad=2))


def test_the_static_engine_without_fused_layers_says_it_verifies_host_length(pair, monkeypatch):
    from fold_hf.generation.fast import settings

    monkeypatch.setattr(settings, "_WARNED", set())  # said once per process: another test may have said it already
    target, drafter = pair
    ids, mask = left_pad(ROWS[:2])
    with pytest.warns(UserWarning, match="batched rounds on engine 'static' verify host-length"):
        out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=4, engine="static",
                                    return_stats=True)
    release_fast_state(target)
    assert out.batched


# ------------------------------------------------------------------------------------------------ sampling
@pytest.fixture(scope="module")
def sampling_pair():
    """test_sampling's four-token pair (fp64), whose sampled distribution is known exactly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = tiny_target("llama", seed=21, vocab=VOCAB, layers=4, dtype=torch.float64)
    drafter = fit_drafter(target, tiny_drafter(target, block=4, fold_config=FoldConfig(window=4)), steps=80)
    yield target, drafter
    torch.set_num_threads(threads)


SAMPLED_PROMPTS = [torch.tensor([0, 2, 1, 1, 3, 0]), torch.tensor([3, 1, 0, 2, 2, 1, 0, 3, 1])]
SAMPLED_NEW = 4


def test_one_generator_per_row_samples_what_each_row_samples_alone(sampling_pair):
    """With a generator per row, a batched row draws exactly the tokens (and acceptances) of the row alone with that
    generator, draw by draw, rejections at every slot among them."""
    target, drafter = sampling_pair
    ids, mask = left_pad(SAMPLED_PROMPTS)
    seen = set()
    for i in range(60):
        gens = [torch.Generator().manual_seed(20_000 + 2 * i + r) for r in range(2)]
        out = batched(target, drafter, ids, mask, max_new_tokens=SAMPLED_NEW, do_sample=True, generator=gens,
                      **FULL_WARP)
        for r, prompt in enumerate(SAMPLED_PROMPTS):
            single = alone_fast(target, drafter, prompt, max_new_tokens=SAMPLED_NEW, do_sample=True,
                                generator=torch.Generator().manual_seed(20_000 + 2 * i + r), **FULL_WARP)
            assert out.rows[r].sequences.tolist() == single.sequences.tolist(), (i, r)
            assert out.rows[r].acceptance_lengths == single.acceptance_lengths, (i, r)
            seen.add(single.acceptance_lengths[0])
    assert seen == {1, 2, 3}, seen


@pytest.mark.slow
def test_each_sampled_row_keeps_the_target_distribution(sampling_pair):
    """χ² per row against the exact distribution under transformers' processors, one shared generator (the rows'
    draws interleave)."""
    target, drafter = sampling_pair
    ids, mask = left_pad(SAMPLED_PROMPTS)
    draws = 2_000
    generator = torch.Generator().manual_seed(99)
    counts = [{}, {}]
    for _ in range(draws):
        out = batched(target, drafter, ids, mask, max_new_tokens=SAMPLED_NEW, do_sample=True, generator=generator,
                      **FULL_WARP)
        for r in range(2):
            key = tuple(out.rows[r].new_tokens[0].tolist())
            counts[r][key] = counts[r].get(key, 0) + 1
    for r, prompt in enumerate(SAMPLED_PROMPTS):
        probs = transformers_distribution(target, FULL_WARP, prompt=prompt[None])
        stat, df = chi2_statistic(counts[r], probs, draws)
        assert stat < chi2_threshold(df), f"row {r}: chi2 {stat:.1f} with {df} dof exceeds {chi2_threshold(df):.1f}"


# ------------------------------------------------------------------------------------------------ what is refused
def test_a_generator_list_must_have_one_per_row(pair):
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    with pytest.raises(ValueError, match="2 generators for a batch of 3 prompts"):
        fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=2, do_sample=True,
                              generator=[torch.Generator(), torch.Generator()])
    with pytest.raises(TypeError, match="a list of torch.Generator"):
        fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=2, do_sample=True, generator=[1, 2, 3])


@pytest.mark.parametrize("why", ["cmr", "qwen35"])
def test_what_batched_rounds_do_not_take_runs_row_by_row_naming_why(pair, monkeypatch, why):
    target, drafter = pair
    kw = {}
    expected = {"cmr": "mode 'cmr' reads the target's attention of one row at a time",
                "qwen35": "Qwen35StaticTarget keeps one row per cache"}[why]
    if why == "cmr":
        kw["fold_config"] = mode_config("cmr")
    else:  # every family we run holds rows now; a runner class that says it does not is taken row by row
        from fold_hf.targets.qwen35 import Qwen35StaticTarget

        monkeypatch.setattr(Qwen35StaticTarget, "batched_rows", False)
        target = tiny_target("qwen35", seed=5, dtype=torch.float32)
        drafter = tiny_drafter(target)
    ids, mask = left_pad(ROWS[:2])
    monkeypatch.setattr(batch, "_WARNED", False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=6, return_stats=True, **kw)
    release_fast_state(target)
    assert not out.batched
    said = [str(w.message) for w in record if "rows are decoded one after another" in str(w.message)]
    assert len(said) == 1 and expected in said[0], said
    news = [target.generate(r[None], max_new_tokens=6, do_sample=False)[0, len(r):].tolist() for r in ROWS[:2]]
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=-1))


# ------------------------------------------------------------------------------------------------ the benchmark
def test_batched_bench_dry_run_writes_every_section(tmp_path):
    """``benchmarks/batched_bench.py --dry-run``: the shape section's AR / verify rows against their floor, the
    suite section's methods per batch size over a saved suite's tier, and the pair section's four systems per batch
    size, every system's rows equal to the rows decoded one at a time (fp32),
    and the ratios named by both terms."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "batched_bench.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--dry-run", "--batches", "1,3",
                    "--methods", "fold,dflash"],
                   check=True, capture_output=True)
    report = json.loads((tmp_path / "batched.json").read_text())
    pair = {(r["system"], r["batch"]): r for r in report["rows"] if r["section"] == "pair"}
    assert set(pair) == {(s, b) for s in ("fold_batched", "fold_rows", "ar_batched", "hf_batched") for b in (1, 3)}
    assert all(r["rows_differing_from_fold_rows"] == 0 and r["call_s"] > 0 for r in pair.values())
    for system in ("fold_batched", "ar_batched"):  # where a batched round's time goes
        anatomy = pair[(system, 3)]
        assert anatomy["rounds"] > 0 and anatomy["verify_ms_per_round"] > 0
        assert anatomy["round_ms_per_round"] >= anatomy["draft_ms_per_round"] + anatomy["verify_ms_per_round"]
    shape = {(r["system"], r.get("engine"), r["batch"]) for r in report["rows"] if r["section"] == "shape"}
    assert shape == {(s, e, b) for s in ("ar_step", "verify", "draft_rows") for e in ("eager", "static")
                     for b in (1, 3)}
    assert {"fold_batched_over_fold_rows_time_b3", "fold_batched_over_ar_batched_throughput_b3",
            "ar_batched_over_hf_batched_throughput_b3", "batched_ar_over_floor_static_t64_b3",
            "batched_round_over_ar_eager_t64_b3"} <= set(report["ratios"])
    # the suite section: AR and the methods per B over a saved suite's tier (the tiny drafter is random: τ 1;
    # "fold" is the alias of fold-a2)
    suite = {(r["system"], r["batch"]): r for r in report["rows"] if r["section"] == "suite"}
    assert set(suite) == {(s, b) for s in ("ar", "fold-a2", "dflash") for b in (1, 3)}
    assert all(r["tier"] == 40 and r["requests"] == 3 and r["rows_differing_from_ar"] == 0 for r in suite.values())
    assert all(r["rows_differing_from_ar_alone"] == 0 and not r["exact"] for r in suite.values())  # fp32: = AR alone
    assert all(len(r["tau_rows"]) == 3 and all(t >= 1 for t in r["tau_rows"]) for (s, _), r in suite.items()
               if s != "ar")
    assert {"fold-a2_over_ar_throughput_b3", "fold-a2_speedup_b3_over_b1",
            "fold-a2_over_ar_decode_throughput_b3"} <= set(report["ratios"])
    # the decoding phase is part of the call: shorter than the whole call, and its tokens are all but each row's first
    assert all(0 < r["decode_seconds"] < r["seconds"] for r in suite.values())
    assert all(r["decode_tokens_per_s"] == pytest.approx((3 * r["new_tokens"] - 3) / r["decode_seconds"])
               for r in suite.values())
    assert report["ratios"]["dflash_speedup_b3_over_b1"] == pytest.approx(
        report["ratios"]["dflash_over_ar_throughput_b3"] / report["ratios"]["dflash_over_ar_throughput_b1"])
    assert (tmp_path / "batched.csv").read_text().startswith("batch,")
    assert (tmp_path / "batched_throughput.png").stat().st_size > 0
    # the ceilings (benchmarks/batched_ceiling.py) beside the rows: per method and B; recomputed for fold-a2 at B = 3
    ceilings = {(c["method"], c["batch"]): c for c in report["ceilings"]}
    assert set(ceilings) == {(m, b) for m in ("fold-a2", "dflash") for b in (1, 3)}
    ar, fold = suite[("ar", 3)], suite[("fold-a2", 3)]
    prefill = ar["seconds"] - ar["decode_seconds"]
    rounds_times_step = ar["decode_seconds"] / min(fold["tau_rows"])  # one batch of 3: new / min τ rounds
    c = ceilings[("fold-a2", 3)]
    assert c["ceiling_free_decoding"] == pytest.approx(ar["seconds"] / prefill)
    assert c["ceiling_one_step_rounds"] == pytest.approx(ar["seconds"] / (prefill + rounds_times_step))
    assert c["round_over_ar_step_for_goal"] == pytest.approx((ar["seconds"] / 1.3 - prefill) / rounds_times_step)


def test_the_decoding_phase_runs_from_the_last_rows_first_token_to_the_last_rows_end():
    """``batched_bench.decode_phase``: rows prefilled one after another (first tokens at 1, 2 and 3 s from the call's
    start) that end at 6, 5 and 4 s decode for 6 - 3 = 3 s; a single row for its own decode time."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from batched_bench import decode_phase

    rows = [SimpleNamespace(ttft_s=t, decode_s=d) for t, d in ((1.0, 5.0), (2.0, 3.0), (3.0, 1.0))]
    assert decode_phase(rows) == pytest.approx(3.0)
    assert decode_phase(rows[1:2]) == pytest.approx(3.0)


def test_batched_anatomy_dry_run_splits_each_call_and_profiles_it(tmp_path):
    """``benchmarks/batched_anatomy.py --dry-run --profile``: per system the rounds and their parts (drafts + verify +
    host = the round), a decoding phase inside the call, the session's steps, and a profile table of its ops."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "batched_anatomy.py"
    subprocess.run([sys.executable, str(script), "--dry-run", "--profile", "--new", "8", "--engine", "static",
                    "--rows-kernels", "1,0", "--out", str(tmp_path)], check=True, capture_output=True)
    report = json.loads((tmp_path / "anatomy.json").read_text())
    names = {f"{name}[rows_kernels={s}]" for name in ("fold-a2", "ar") for s in "10"}
    assert report["batch"] == 3 and set(report["systems"]) == names
    for name, row in report["systems"].items():
        assert row["rounds"] > 0 and 0 < row["decode_s"] < row["call_s"]
        parts = row["draft_ms_per_round"] + row["verify_ms_per_round"] + row["other_ms_per_round"]
        assert parts == pytest.approx(row["round_ms_per_round"], abs=0.01)
        by_rows = row["by_running_rows"]  # the same rounds by running rows: they add up to the whole
        assert set(by_rows) <= {"1", "2", "3"} and sum(p["rounds"] for p in by_rows.values()) == row["rounds"]
        assert sum(p["rounds"] * p["round"] for p in by_rows.values()) == pytest.approx(
            row["rounds"] * row["round_ms_per_round"], rel=1e-3, abs=0.02)
        for part in by_rows.values():
            assert part["draft"] + part["verify"] + part["other"] == pytest.approx(part["round"], abs=0.01)
        assert not name.startswith("fold") or any("draft_rows" in key for key in row["steps"])  # its rows step
        plain = name.replace("[rows_kernels=", "_rows_kernels").rstrip("]")  # no brackets or "=" in file names
        assert (tmp_path / f"profile_{plain}.txt").read_text().startswith("ops and kernels:")
    systems = report["systems"]
    assert len(systems["fold-a2[rows_kernels=1]"]["tau_rows"]) == 3
    assert systems["ar[rows_kernels=0]"]["tau_rows"] is None
    assert systems["fold-a2[rows_kernels=1]"]["tau_rows"] == systems["fold-a2[rows_kernels=0]"]["tau_rows"]
    for name, row in systems.items():  # the rows are prefilled one after another: the last first token is the latest
        assert len(row["first_token_s_rows"]) == 3
        assert max(row["first_token_s_rows"]) == pytest.approx(row["first_token_s_last_row"], abs=1e-4)
    assert set(report["ratios"]) == {f"fold-a2[rows_kernels={s}]" for s in "10"}
    for s in "10":  # each drafting system against batched AR of its own setting, recomputed from the two rows
        fold, ar = systems[f"fold-a2[rows_kernels={s}]"], systems[f"ar[rows_kernels={s}]"]
        got = report["ratios"][f"fold-a2[rows_kernels={s}]"]
        assert got["call_speedup_over_ar"] == pytest.approx(ar["call_s"] / fold["call_s"], abs=1e-4)
        assert got["call_speedup_ceiling_at_this_prefill"] == pytest.approx(
            ar["call_s"] / ar["first_token_s_last_row"], abs=1e-4)
        assert got["prefill_extra_ms_per_row"] == pytest.approx(
            1e3 * (fold["first_token_s_last_row"] - ar["first_token_s_last_row"]) / 3, abs=0.01)
        assert got["decode_speedup_over_ar"] == pytest.approx(ar["decode_s"] / fold["decode_s"], abs=1e-4)


def test_batched_anatomy_with_a_draft_vocabulary_adds_the_method_with_it_against_the_same_ar(tmp_path):
    """``batched_anatomy.py --draft-vocab FILE``: the method again with the drafter proposing from the vocabulary
    (system ``fold-a2+dv``), its ratios taken against the same batched AR; the vocabulary named in the report."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from fold_hf.modeling.draft_vocab import DraftVocab

    DraftVocab(list(range(0, 256, 3)), 256, source="every third id").save(tmp_path / "dv")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "batched_anatomy.py"
    subprocess.run([sys.executable, str(script), "--dry-run", "--new", "8", "--engine", "static", "--draft-vocab",
                    str(tmp_path / "dv" / "draft_vocab.json"), "--out", str(tmp_path / "out")], check=True,
                   capture_output=True)
    report = json.loads((tmp_path / "out" / "anatomy.json").read_text())
    systems = report["systems"]
    assert set(systems) == {"fold-a2", "fold-a2+dv", "ar"} and "86 of 256" in report["draft_vocab"]
    assert set(report["ratios"]) == {"fold-a2", "fold-a2+dv"}
    got = report["ratios"]["fold-a2+dv"]
    assert got["call_speedup_over_ar"] == pytest.approx(systems["ar"]["call_s"] / systems["fold-a2+dv"]["call_s"],
                                                         abs=1e-4)
    assert len(systems["fold-a2+dv"]["tau_rows"]) == 3 and all(t >= 1 for t in systems["fold-a2+dv"]["tau_rows"])


def test_the_rows_kernels_switch_turns_every_row_axis_kernel_off(interpreter, monkeypatch):
    """``$FOLD_HF_ROWS_KERNELS``: 1 (default) gives the rows drafting step, the Llama and the Gemma runners and the
    layer ops their row-axis kernels where the Triton kernels run (here: CUDA pretended, the kernels imported for the
    interpreter); 0 gives none of them (one-row kernels row by row); other values are refused."""
    import fold_hf.kernels as kernels
    from fold_hf.generation.static_drafter import default_rows_read_function
    from fold_hf.kernels.fold_read.triton import decode_attention_rows_triton, fold_read_rows_triton
    from fold_hf.targets.llama import LlamaStaticTarget
    from tiny import tiny_target

    from fold_hf.kernels.gemma.triton import ring_attention_rows_triton
    from fold_hf.kernels.hybrid.triton import head_norm_rope_write_rows_triton
    from fold_hf.targets.gemma import GemmaStaticTarget

    monkeypatch.setattr(kernels, "triton_kernels_enabled", lambda device: True)
    target = tiny_target("llama", layers=2, dtype=torch.float32)
    gemma = tiny_target("gemma3", layers=2, dtype=torch.float32)
    for value, on in (("1", True), ("", True), ("0", False)):
        monkeypatch.setenv("FOLD_HF_ROWS_KERNELS", value)
        assert kernels.rows_kernels_enabled() is on
        assert default_rows_read_function("cuda") is (fold_read_rows_triton if on else None)
        assert LlamaStaticTarget(target, 16, batch=2)._rows_decode() is (decode_attention_rows_triton if on else None)
        assert GemmaStaticTarget(gemma, 16, batch=2)._rows_attention() == ((
            head_norm_rope_write_rows_triton, ring_attention_rows_triton, decode_attention_rows_triton) if on else None)
        assert (kernels.default_layer_ops(torch.device("cuda")).rope_write_rows is not None) is on
    monkeypatch.setenv("FOLD_HF_ROWS_KERNELS", "yes")
    with pytest.raises(ValueError, match="FOLD_HF_ROWS_KERNELS must be 0 or 1"):
        kernels.rows_kernels_enabled()


def test_the_verify_keeps_the_calls_last_attention_bucket_near_the_end():
    """A batched verify's attention bucket (a graph key): the call's last bucket (of the most keys a row can reach)
    once the longest row is within 1/8 of it, so rows of a 32,704-token prompt never cross the 32,768 boundary
    mid-call; further from it, the bucket of the keys needed (a multiple of 1/8 of the length, at least 256)."""
    from types import SimpleNamespace

    from fold_hf.generation.fast.batched import _Verify

    verify = object.__new__(_Verify)
    verify.runner = SimpleNamespace(capacity=33024)
    verify.final = 32704 + 64 + 8 + 1
    assert verify._bucket(32704 + 8) == 33024  # not 32,768: the bucket the rows end in
    assert verify._bucket(32777) == 33024
    assert verify._bucket(20000) == 20480  # 10 steps of 2,048
    assert verify._bucket(300) == 512
    verify.final = None  # no call bound: the growing buckets alone
    assert verify._bucket(32712) == 32768 and verify._bucket(32769) == 33024
    verify.runner, verify.final = SimpleNamespace(capacity=4096), 1100  # a short call: its last bucket is 1,280
    assert verify._bucket(1150) == 1280 and verify._bucket(1000) == 1024  # 1,000 <= 7/8 of 1,280: its own bucket
