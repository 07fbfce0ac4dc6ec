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
from fold_hf.targets.base import bucket_length
from fold_hf.targets.registry import batch_unsupported_reason, build_static_target
from tiny import (
    GEMMA_WINDOW,
    MASK_ID,
    batched_rows_call,
    expected_batch,
    greedy_alone,
    left_pad,
    oracle_tokens,
    tiny_drafter,
    tiny_target,
)

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


def _rows_and_model_outputs(arch: str, dtype):
    """A tiny ``arch`` target, the taps (1 and 5: after gemma4_shared's first KV-shared layer), one sequence per
    length of ``LENGTHS`` (+ 12 tokens to verify), and the model's own logits ``[n, V]`` and taps over each."""
    target = tiny_target(arch, seed=2, dtype=dtype)
    taps = (1, 5)
    seqs = [row_prompt(10 + n, n + 12) for n in LENGTHS]
    with torch.no_grad():
        full = [target(s[None], output_hidden_states=True) for s in seqs]
    want = [f.logits[0] for f in full]
    want_taps = [torch.cat([f.hidden_states[t + 1][0] for t in taps], -1) for f in full]
    return target, taps, seqs, want, want_taps


# ------------------------------------------------------------------------------------------------ the runner
@pytest.mark.parametrize("arch", ["gemma3", "gemma4", "gemma4_shared", "gemma4_moe", "gemma4_cg"])
def test_forward_rows_gives_each_row_its_own_logits_at_its_own_position(arch):
    """Three rows at three cache lengths (one inside its first window, two with wrapped rings) verify blocks of 4 in
    one ``forward_rows``, a rejected block first (rolled back by the length): each row's logits and taps equal the
    model's own forward over the row's whole sequence and that row run alone through ``forward`` of a one-row runner;
    then two rows in the other order, narrower."""
    target, taps, seqs, want, want_taps = _rows_and_model_outputs(arch, torch.float32)
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


def fused_step(runner, ids, positions, bucket, taps_out=None):
    """``forward_static`` through the fused layers (their torch twins here) of a one-row runner."""
    return runner.forward_static(ids, positions, bucket, taps_out, attention="triton", fused=True)


def owned_caches(runner):
    """(layer, key cache, value cache) of every layer that writes its own cache (rings and global caches)."""
    return [(i, runner.keys[i], runner.values[i]) for i in range(len(runner.layers)) if runner.kv_source[i] == i]


@pytest.mark.parametrize("arch", ["gemma3", "gemma4", "gemma4_shared", "gemma4_moe", "gemma4_cg"])
def test_forward_rows_static_gives_each_row_its_own_fused_step(arch):
    """The fused layers over rows (``forward_rows_static``; the fused ops' torch twins, fp64): three rows at three
    cache lengths (5: inside its first window; 40 and 23: rings wrapped) verify blocks of 4 at device positions in
    one step, a rejected block first: each row's logits and taps equal that row's own fused ``forward_static``
    through a one-row runner and the model's own forward over the row's whole sequence, and its cache row (rings,
    global entries; KV-shared layers write none) holds what the one-row runner's cache holds; then rows 2 and 0 only,
    in that order (cache rows not the step's rows), narrower."""
    target, taps, seqs, want, want_taps = _rows_and_model_outputs(arch, torch.float64)
    runner = build_static_target(target, 64, taps, batch=3)
    singles = [build_static_target(target, 64, taps) for _ in LENGTHS]
    assert runner.fused_rows_unsupported() is None and runner.fused_unsupported() is None
    for i, (n, s) in enumerate(zip(LENGTHS, seqs)):
        runner.prefill(s[None, :n], chunk=16, row=i)
        singles[i].prefill(s[None, :n], chunk=16)
    garbage = torch.full((3, 4), 3, dtype=torch.long)
    tight = dict(rtol=1e-10, atol=1e-10)
    for block in range(2):
        starts = [n + 4 * block for n in LENGTHS]
        positions = torch.tensor(starts)[:, None] + torch.arange(4)
        bucket = bucket_length(max(starts) + 4, 64)
        runner.forward_rows_static(garbage, positions, [0, 1, 2], bucket)  # rejected: rewritten by the next block
        ids = torch.stack([s[p : p + 4] for s, p in zip(seqs, starts)])
        out = torch.zeros(3, 4, runner.tap_width, dtype=torch.float64)
        logits = runner.forward_rows_static(ids, positions, [0, 1, 2], bucket, taps_out=out)
        assert logits.shape == (3, 4, target.config.get_text_config().vocab_size)
        for i, p in enumerate(starts):
            fused_step(singles[i], garbage[i : i + 1], positions[i], bucket)
            single_taps = torch.zeros(1, 4, runner.tap_width, dtype=torch.float64)
            torch.testing.assert_close(logits[i], fused_step(singles[i], ids[i : i + 1], positions[i], bucket,
                                                             single_taps), **tight)
            torch.testing.assert_close(out[i], single_taps[0], **tight)
            torch.testing.assert_close(logits[i], want[i][p : p + 4], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out[i], want_taps[i][p : p + 4], rtol=1e-5, atol=1e-5)
            for (layer, keys, values), (_, one_keys, one_values) in zip(owned_caches(runner),
                                                                        owned_caches(singles[i])):
                torch.testing.assert_close(keys[i], one_keys[0], **tight, msg=f"row {i}, layer {layer}")
                torch.testing.assert_close(values[i], one_values[0], **tight, msg=f"row {i}, layer {layer}")
    starts = [LENGTHS[2] + 8, LENGTHS[0] + 8]  # rows 2 and 0 only, two tokens each
    positions = torch.tensor(starts)[:, None] + torch.arange(2)
    ids = torch.stack([seqs[2][starts[0] : starts[0] + 2], seqs[0][starts[1] : starts[1] + 2]])
    logits = runner.forward_rows_static(ids, positions, [2, 0], bucket_length(max(starts) + 2, 64))
    torch.testing.assert_close(logits[0], want[2][starts[0] : starts[0] + 2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1], want[0][starts[1] : starts[1] + 2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("order", [(0, 1, 2), (1, 2, 0)])
def test_each_row_of_the_fused_step_attends_at_its_own_context_length(order):
    """Each row's attention launches read that row's own context length and positions (the decode kernel of a global
    layer: its first position, from the device; the ring kernel of a sliding layer: its positions), never row 0's:
    the launches are recorded, and with the shortest row first or a long row first each row's logits are its own
    fused step's (one-row runner). The tiny Gemma-3 with a global layer (its window 8 against rows of 5 to 40)."""
    target = tiny_target("gemma3", seed=4, dtype=torch.float64)
    lengths = [LENGTHS[a] for a in order]
    seqs = [row_prompt(20 + n, n + 4) for n in lengths]
    runner = build_static_target(target, 64, batch=3)
    singles = [build_static_target(target, 64) for _ in lengths]
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        runner.prefill(s[None, :n], chunk=16, row=i)
        singles[i].prefill(s[None, :n], chunk=16)
    runner._fused_ops_ready()
    seen = {"decode": [], "ring": []}
    decode, ring = runner._decode_attention, runner._hybrid_ops.ring_attention

    def recording_decode(q, keys, values, k, v, context_length, **kw):
        seen["decode"].append((context_length.tolist(), keys.data_ptr()))
        return decode(q, keys, values, k, v, context_length, **kw)

    def recording_ring(q, keys, values, positions, window, scaling):
        seen["ring"].append((positions.tolist(), keys.data_ptr()))
        return ring(q, keys, values, positions, window, scaling)

    runner._decode_attention, runner._hybrid_ops.ring_attention = recording_decode, recording_ring
    positions = torch.tensor(lengths)[:, None] + torch.arange(3)
    ids = torch.stack([s[n : n + 3] for s, n in zip(seqs, lengths)])
    bucket = bucket_length(max(lengths) + 3, 64)
    logits = runner.forward_rows_static(ids, positions, [0, 1, 2], bucket)
    globals_ = [i for i, w in enumerate(runner.windows) if w is None]
    slidings = [i for i, w in enumerate(runner.windows) if w is not None]
    assert globals_ and slidings
    row_bytes = [runner.keys[i][1].data_ptr() - runner.keys[i][0].data_ptr() for i in range(len(runner.layers))]
    assert [length for length, _ in seen["decode"]] == [[n] for _ in globals_ for n in lengths]
    assert [p for p, _ in seen["ring"]] == [list(range(n, n + 3)) for _ in slidings for n in lengths]
    for kind, layers in (("decode", globals_), ("ring", slidings)):  # each row's launch reads its own cache row
        for j, (_, pointer) in enumerate(seen[kind]):
            layer = layers[j // 3]
            assert pointer == runner.keys[layer].data_ptr() + (j % 3) * row_bytes[layer], (kind, j)
    for i in range(3):
        torch.testing.assert_close(logits[i], fused_step(singles[i], ids[i : i + 1], positions[i], bucket),
                                   rtol=1e-10, atol=1e-10)


def test_the_fused_rows_step_reads_nothing_on_the_host():
    """``forward_rows_static`` runs on fake tensors (no values exist: any host read of a device value raises), so the
    graphs engine can capture it; on a Gemma-4 with per-layer inputs and KV-shared layers."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    # fp64: the CPU linears' MKL packed path (fp32) would fail once on fake tensors and stay off for the process
    runner = build_static_target(tiny_target("gemma4_shared", seed=2, dtype=torch.float64), 64, (1, 5), batch=2)
    ids = torch.zeros(2, 4, dtype=torch.long)
    positions = torch.tensor([[20], [7]]) + torch.arange(4)
    runner.forward_rows_static(ids, positions, [0, 1], 64)  # the one-time set-up (it probes the activation)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        taps = mode.from_tensor(torch.zeros(2, 4, runner.tap_width, dtype=torch.float64))
        logits = runner.forward_rows_static(mode.from_tensor(ids), mode.from_tensor(positions), [0, 1], 64, taps)
        assert logits.shape[:2] == (2, 4)
    with pytest.raises(ValueError, match="ring slack"):
        runner.forward_rows_static(torch.zeros(2, SLACK + 2, dtype=torch.long),
                                   torch.arange(SLACK + 2).repeat(2, 1), [0, 1], 64)


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


def test_the_static_engine_verifies_the_rows_through_the_fused_layers(monkeypatch, forwards):
    """engine='static' with the fused layers (their torch twins here; the graphs engine captures the same step): the
    batch's verify is the session's fixed-shape rows step (``forward_rows_static``), not the host-length
    ``forward_rows``, nothing says it verifies host-length, and every row (one stopping early at its EOS, so the
    running rows change) is still transformers' greedy output of that row alone; on Gemma-3 and on a Gemma-4 with
    per-layer inputs and KV-shared layers."""
    monkeypatch.setattr(settings, "_WARNED", set())
    for arch in ("gemma3", "gemma4_shared"):
        target = tiny_target(arch, seed=3, dtype=torch.float32)
        drafter = tiny_drafter(target, taps=(1, 5), seed=7)
        rows, eos, early, news = rows_and_eos(target)
        ids, mask = left_pad(rows)
        out, keys, said = batched_rows_call(target, drafter, ids, mask, NEW, eos, engine="static",
                                            fused_layers=True)
        assert not said and out.batched and not forwards, arch  # the fused rows step, never forward_rows
        assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos)), arch
        assert out.finish_reason[early] == "eos"
        assert {key[1] for key in keys} >= {3, 2}, keys  # all three rows, then the two still running


def test_the_static_engine_without_fused_layers_says_once_that_it_verifies_host_length(monkeypatch, forwards):
    """engine='static' with the fused layers off (their default off CUDA): the batch is still batched, its verify
    runs ``forward_rows``, the reason is said once per process, and every row is its own greedy output."""
    monkeypatch.setattr(settings, "_WARNED", set())
    target = tiny_target("gemma4", seed=3, dtype=torch.float32)
    drafter = tiny_drafter(target, taps=(1, 5), seed=7)
    rows = [row_prompt(i, n) for i, n in enumerate(LENGTHS)]
    ids, mask = left_pad(rows)
    want = expected_batch(ids, [alone(target, r) for r in rows], pad=-1)
    said = (r"batched rounds on engine 'static' verify host-length \(engine 'eager'\): the fused layers are off here "
            r"\(off by default off CUDA; fused_layers=True runs their twins\)")
    for attempt in range(2):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, engine="static",
                                        return_stats=True)
        release_fast_state(target)
        messages = [str(w.message) for w in record if "verify host-length" in str(w.message)]
        assert len(messages) == (1 if attempt == 0 else 0), messages  # once per process
        if attempt == 0:
            assert re.fullmatch(said, messages[0]), messages
        assert out.batched and torch.equal(out.sequences, want)
        assert max(len(r) for r in forwards) == 3
        forwards.clear()


@pytest.mark.gpu(reason="CUDA graphs and the fused Triton kernels: the captured batched verify over rows")
@pytest.mark.parametrize("arch", ["gemma3", "gemma4_shared"])
def test_the_graphs_engine_verifies_gemma_rows_as_one_captured_step_on_the_gpu(arch):
    """On CUDA (fp32): the graphs engine's captured batched verify through the Gemma fused layers over rows (Triton
    ring, decode and norm-rope kernels per row, rings wrapped), 8 rows (block rows past one skinny GEMM's 16), rows
    stopping at their EOS (the running rows change the captured step): every row is transformers' greedy output of
    that row alone, and nothing verifies host-length."""
    target = tiny_target(arch, seed=3, dtype=torch.float32).cuda()
    drafter = tiny_drafter(target, taps=(1, 5), seed=7).cuda()
    rows = [row_prompt(i, n) for i, n in enumerate((5, 40, 23, 9, 31, 12, 50, 17))]
    ids, mask = left_pad(rows)
    eos = 2
    news = [alone(target, r.cuda(), eos=eos) for r in rows]
    out, keys, said = batched_rows_call(target, drafter, ids, mask, NEW, eos)
    assert not said and out.batched and keys
    assert torch.equal(out.sequences.cpu(), expected_batch(ids, news, pad=eos))


@pytest.mark.parametrize("arch", ["gemma3", "gemma4_shared"])
def test_the_rows_attention_in_one_launch_is_each_rows_own(interpreter, arch):
    """A batch's verify with every row's norms, rope and cache writes of a layer in one launch
    (``head_norm_rope_write_rows_triton``) and its attention in one launch pair (``ring_attention_rows_triton`` on
    the sliding layers, ``decode_attention_rows_triton`` on the global ones: what CUDA runs), in Triton's
    interpreter, fp32, against the same step attending row by row through the kernels' torch twins: three rows at
    lengths 5, 40 (rings wrapped) and 23 in cache rows 2, 0, 1, blocks of 4; logits and cache rows to fp32 rounding,
    and the logits those of the model's own forward."""
    from fold_hf.kernels.fold_read.triton import decode_attention_rows_triton
    from fold_hf.kernels.gemma.triton import ring_attention_rows_triton
    from fold_hf.kernels.hybrid.triton import head_norm_rope_write_rows_triton

    target, taps, seqs, want, _ = _rows_and_model_outputs(arch, torch.float32)
    rows = [2, 0, 1]
    logits, caches = {}, {}
    rows_kernels = (head_norm_rope_write_rows_triton, ring_attention_rows_triton, decode_attention_rows_triton)
    for name, kernels in (("row_by_row", None), ("rows", rows_kernels)):
        runner = build_static_target(target, 64, taps, batch=3)
        for n, s, row in zip(LENGTHS, seqs, rows):
            runner.prefill(s[None, :n], chunk=16, row=row)
        runner._rows_kernels = kernels
        positions = torch.tensor(LENGTHS)[:, None] + torch.arange(4)
        ids = torch.stack([s[p : p + 4] for s, p in zip(seqs, LENGTHS)])
        logits[name] = runner.forward_rows_static(ids, positions, rows, bucket_length(max(LENGTHS) + 4, 64))
        caches[name] = [(keys[rows].clone(), values[rows].clone()) for _, keys, values in owned_caches(runner)]
    torch.testing.assert_close(logits["rows"], logits["row_by_row"], rtol=1e-4, atol=1e-4)
    for i, n in enumerate(LENGTHS):
        torch.testing.assert_close(logits["rows"][i], want[i][n : n + 4], rtol=1e-3, atol=1e-3)
    for (k1, v1), (k2, v2) in zip(caches["rows"], caches["row_by_row"]):  # later layers' entries from inputs that
        torch.testing.assert_close(k1, k2, rtol=1e-4, atol=1e-4)  # carry the earlier layers' fp32 rounding
        torch.testing.assert_close(v1, v2, rtol=1e-4, atol=1e-4)
