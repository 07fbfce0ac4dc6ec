"""Batched rounds on the Gemma family (issue 35): the Gemma runner holds ``batch`` cache rows (sliding rings, global
caches, KV-shared layers reading their producer's row) and ``forward_rows`` runs several rows at their own positions.

Independent statements: the transformers model's own forward over a row's whole sequence (logits and tapped hidden
states), the row run alone through a one-row runner, and transformers' own greedy ``generate`` of each row alone
(fp32). The tiny targets' window is 8 and the rings get a slack of 3 (R = 11), so a row of 40 tokens has wrapped its
rings several times while a row of 5 has not filled its window.
"""

import re
import warnings

import pytest
import torch

import fold_hf
from fold_hf.generation import BatchGenerationResult, release_fast_state
from fold_hf.generation.fast import batched as batched_module
from fold_hf.generation.fast import settings
from fold_hf.targets import gemma
from fold_hf.targets.registry import batch_unsupported_reason, build_static_target
from tiny import GEMMA_WINDOW, MASK_ID, expected_batch, greedy_alone, left_pad, oracle_tokens, tiny_drafter, tiny_target

NEW = 14
SLACK = 3
LENGTHS = (5, 40, 23)  # shorter than the window; far longer (its rings wrap); in between


@pytest.fixture(autouse=True)
def small_ring(monkeypatch):
    monkeypatch.setattr(gemma, "RING_SLACK", SLACK)


def row_prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, MASK_ID, (length,), generator=torch.Generator().manual_seed(7000 + seed))








def alone(target, row: torch.Tensor, eos=None) -> list[int]:
    return greedy_alone(target, row, NEW, eos)


@pytest.fixture
def forwards(monkeypatch):
    """The cache rows of every batched verify forward (``forward_rows``), recorded."""
    seen = []
    original = gemma.GemmaStaticTarget.forward_rows

    def recording(self, input_ids, rows, starts, taps_out=None):
        seen.append(list(rows))
        return original(self, input_ids, rows, starts, taps_out)

    monkeypatch.setattr(gemma.GemmaStaticTarget, "forward_rows", recording)
    return seen


# ------------------------------------------------------------------------------------------------ the runner
@pytest.mark.parametrize("arch", ["gemma3", "gemma4", "gemma4_shared", "gemma4_moe", "gemma4_cg"])
def test_forward_rows_gives_each_row_its_own_logits_at_its_own_position(arch):
    """Three rows at three cache lengths (one inside its first window, two with wrapped rings) verify blocks of 4 in
    one ``forward_rows``, a rejected block first (rolled back by the length): each row's logits and taps equal the
    model's own forward over the row's whole sequence and that row run alone through ``forward`` of a one-row runner;
    then two rows in the other order, narrower."""
    target = tiny_target(arch, seed=2, dtype=torch.float32)
    taps = (1, 5)  # 5: after gemma4_shared's first KV-shared layer
    seqs = [row_prompt(10 + n, n + 12) for n in LENGTHS]
    with torch.no_grad():
        full = [target(s[None], output_hidden_states=True) for s in seqs]
    want = [f.logits[0] for f in full]
    want_taps = [torch.cat([f.hidden_states[t + 1][0] for t in taps], -1) for f in full]
    runner = build_static_target(target, 64, taps, batch=3)
    singles = [build_static_target(target, 64, taps) for _ in LENGTHS]
    for i, (n, s) in enumerate(zip(LENGTHS, seqs)):
        last = runner.prefill(s[None, :n], chunk=16, row=i)
        torch.testing.assert_close(last, want[i][n - 1], rtol=1e-4, atol=1e-4)
        singles[i].prefill(s[None, :n], chunk=16)
    garbage = torch.full((3, 4), 3, dtype=torch.long)
    for block in range(2):
        starts = [n + 4 * block for n in LENGTHS]
        runner.forward_rows(garbage, [0, 1, 2], starts)  # rejected: every entry it wrote is past what is kept
        ids = torch.stack([s[p : p + 4] for s, p in zip(seqs, starts)])
        out = torch.zeros(3, 4, runner.tap_width)
        logits = runner.forward_rows(ids, [0, 1, 2], starts, taps_out=out)
        assert logits.shape == (3, 4, target.config.get_text_config().vocab_size)
        for i, p in enumerate(starts):
            torch.testing.assert_close(logits[i], want[i][p : p + 4], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out[i], want_taps[i][p : p + 4], rtol=1e-4, atol=1e-4)
            single_taps = torch.zeros(1, 4, runner.tap_width)
            torch.testing.assert_close(logits[i], singles[i].forward(ids[i : i + 1], p, taps_out=single_taps),
                                       rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out[i], single_taps[0], rtol=1e-5, atol=1e-5)
    starts = [LENGTHS[2] + 8, LENGTHS[0] + 8]  # rows 2 and 0 only, two tokens each
    ids = torch.stack([seqs[2][starts[0] : starts[0] + 2], seqs[0][starts[1] : starts[1] + 2]])
    logits = runner.forward_rows(ids, [2, 0], starts)
    torch.testing.assert_close(logits[0], want[2][starts[0] : starts[0] + 2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[1], want[0][starts[1] : starts[1] + 2], rtol=1e-4, atol=1e-4)


def test_the_caches_hold_the_rows():
    """Every cache (ring or global) holds ``batch`` rows, KV-shared layers share their producer's tensor (so its rows),
    ``bytes_held`` counts each tensor once; a batched runner has no device-length step of one row."""
    target = tiny_target("gemma4_shared", seed=2, dtype=torch.float32)
    one, three = build_static_target(target, 64), build_static_target(target, 64, batch=3)
    assert batch_unsupported_reason(target) is None and three.batched_rows
    assert three.bytes_held() == 3 * one.bytes_held()
    for i, window in enumerate(three.windows):
        assert three.keys[i].shape == (3, three.kv_heads[i], 64 if window is None else GEMMA_WINDOW + SLACK,
                                       three.head_dims[i])
        assert three.keys[i] is three.keys[three.kv_source[i]]
    assert any(three.kv_source[i] != i for i in range(len(three.layers)))
    with pytest.raises(ValueError, match="one-row cache"):
        three.forward_static(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 64)
    with pytest.raises(ValueError, match="row 3 is not a row of this runner's cache"):
        three.prefill(torch.zeros(1, 4, dtype=torch.long), row=3)


# ------------------------------------------------------------------------------------------------ batched rounds
def rows_and_eos(target):
    """Three prompts of :data:`LENGTHS` and an EOS id that stops one row early (after a few rounds) while another runs
    to the budget without it: the first fitting token of transformers' greedy outputs. Returns the prompts, the id,
    the row that stops early and each row's new tokens from transformers' greedy ``generate`` with that EOS."""
    rows = [row_prompt(i, n) for i, n in enumerate(LENGTHS)]
    free = [alone(target, r) for r in rows]

    def first(tokens, token):
        return tokens.index(token) if token in tokens else NEW

    for early in range(len(rows)):
        for k in range(2, NEW - 4):
            eos = free[early][k]
            later = [first(free[r], eos) for r in range(len(rows)) if r != early]
            if first(free[early], eos) == k and min(later) > k and max(later) == NEW:
                news = [alone(target, r, eos=eos) for r in rows]
                assert len(news[early]) == k + 1 and max(len(n) for n in news) == NEW, news
                return rows, eos, early, news
    raise AssertionError(f"no token of {free} stops one row early and leaves another running")


def force_oracle(monkeypatch, rows, news):
    """Every batched draft becomes :func:`tiny.oracle_tokens` of its row's greedy output (one slot corrupted, picked
    by the position, or none): acceptances of every length, at different rounds per row. A row is told by its
    position (the rows' positions never overlap: :data:`LENGTHS` apart by more than the budget)."""
    refs = [(len(r), torch.cat((r, torch.tensor(n)))[None]) for r, n in zip(rows, news)]
    original = batched_module.propose_rows

    def propose_rows(drafter, lasts, pendings, caches, block_starts, counts, picks):
        out = original(drafter, lasts, pendings, caches, block_starts, counts, picks)
        forced = []
        for (tokens, scores), start in zip(out, block_starts):
            (ref,) = [ref for length, ref in refs if length <= start < length + NEW]
            forced.append((torch.tensor(oracle_tokens(ref, start, tokens.shape[0])), scores))
        return forced

    monkeypatch.setattr(batched_module, "propose_rows", propose_rows)


@pytest.mark.parametrize("drafts", ["random", "oracle"])
@pytest.mark.parametrize("arch", ["gemma3", "gemma4_shared"])
def test_each_batched_row_is_its_own_greedy_output(arch, drafts, forwards, monkeypatch):
    """A tiny Gemma-3 (soft-capping) and a Gemma-4 with per-layer inputs and KV-shared layers, left-padded prompts of
    mixed lengths, one row stopping early at its EOS, drafts from a random drafter (nearly all rejected) or forced to
    the row's greedy tokens with one slot wrong (acceptances of every length, different per row): every row of
    ``fast_generate`` and of ``target.generate(assistant_model=...)`` is transformers' greedy output of that row
    alone, and the rows were verified together."""
    target = tiny_target(arch, seed=3, dtype=torch.float32)
    drafter = tiny_drafter(target, taps=(1, 5), seed=7)
    rows, eos, early, news = rows_and_eos(target)
    if drafts == "oracle":
        force_oracle(monkeypatch, rows, [alone(target, r) for r in rows])
    ids, mask = left_pad(rows)
    want = expected_batch(ids, news, pad=eos)
    out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, eos_token_id=eos, return_stats=True)
    release_fast_state(target)
    assert isinstance(out, BatchGenerationResult) and out.batched
    assert torch.equal(out.sequences, want)
    assert out.finish_reason[early] == "eos" and "length" in out.finish_reason
    patterns = [tuple(row.acceptance_lengths) for row in out.rows]
    accepted = [n for p in patterns for n in p]
    if drafts == "random":
        assert accepted.count(1) >= len(accepted) // 2, patterns  # rejections, in every row
    else:
        assert set(accepted) == {1, 2, 3, 4} and len(set(patterns)) == 3, patterns  # every length, per row its own
    assert max(len(r) for r in forwards) == 3  # verified together
    # each round verifies the rows still running, in cache rows 0 .. A-1 (a stopped row's freed by the last running
    # row's move): each row in one verify per round of its own, none after it stopped
    running = [sum(len(p) > k for p in patterns) for k in range(len(forwards))]
    assert forwards == [list(range(n)) for n in running], forwards
    assert len(forwards) > len(patterns[early])  # the others went on without it
    forwards.clear()
    routed = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=NEW, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos)
    release_fast_state(target)
    assert torch.equal(routed, want)
    assert max(len(r) for r in forwards) == 3


def test_the_static_engine_says_once_that_it_verifies_host_length(monkeypatch, forwards):
    """engine='static' (fused layers asked for: they run Gemma's one-row step, not rows; then the default): the batch
    is still batched, its verify runs ``forward_rows``, the reason is said once per process (not again by the second
    request), and every row is still its own greedy output."""
    monkeypatch.setattr(settings, "_WARNED", set())
    target = tiny_target("gemma4", seed=3, dtype=torch.float32)
    drafter = tiny_drafter(target, taps=(1, 5), seed=7)
    rows = [row_prompt(i, n) for i, n in enumerate(LENGTHS)]
    ids, mask = left_pad(rows)
    want = expected_batch(ids, [alone(target, r) for r in rows], pad=-1)
    said = (r"batched rounds on engine 'static' verify host-length \(engine 'eager'\): GemmaStaticTarget has no fused "
            r"layers over rows \(forward_rows_static\)")
    for fused in (True, None):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, engine="static",
                                        fused_layers=fused, return_stats=True)
        release_fast_state(target)
        messages = [str(w.message) for w in record if "verify host-length" in str(w.message)]
        assert len(messages) == (1 if fused else 0), messages  # once per process
        if fused:
            assert re.fullmatch(said, messages[0]), messages
        assert out.batched and torch.equal(out.sequences, want)
        assert max(len(r) for r in forwards) == 3
        forwards.clear()
