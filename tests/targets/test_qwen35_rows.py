"""Batched rounds over the Qwen3.5 hybrid target (issue 35): Gated DeltaNet layers keep a recurrent and a convolution
state per cache row, and each row's acceptance leaves its own state at its own accepted position.

Independent statements: the transformers model's own forward over a row's whole accepted text (the runner's rows),
the row run alone through the one-row runner, and transformers' own greedy ``generate`` of each row alone, unpadded
(fp32) for whole batched calls. Rejections come from a random drafter (most rounds reject, differently per row) and
from an oracle with errors whose corrupted slot depends on the row and the position, so every row accepts 1 .. k + 1
tokens in a pattern of its own: restoring a row's state at another position (or another row's state) changes its
next logits and its tokens."""

from __future__ import annotations

import copy
import random
import warnings

import pytest
import torch
from test_qwen35 import BLOCK, MASK, TOL, prompt, qwen35_drafter, qwen35_target
from tiny import batched_rows_call, expected_batch, greedy_alone, left_pad

import fold_hf
from fold_hf.generation import BatchGenerationResult, release_fast_state
from fold_hf.generation.fast import SESSION_ATTR, batched as batched_module
from fold_hf.generation.fast import settings
from fold_hf.targets.base import StaticTarget
from fold_hf.targets.qwen35 import Qwen35StaticTarget

NEW = 20
LENGTHS = (6, 37, 19)  # shorter than the drafter's window (16), longer, between: rows 0 and 2 are padded


@pytest.fixture(scope="module")
def pair():
    """The tiny Qwen3.5 target with its projections drawn wide (std 0.5: at transformers' init, std 0.02, the linear
    layers' state barely moves a greedy token, so restoring a row's state one position off would go unseen; here it
    changes ~1 in 6 of the next tokens), and a random (untrained) drafter, in fp32."""
    target = copy.deepcopy(qwen35_target())
    torch.manual_seed(3)
    with torch.no_grad():
        for module in target.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(std=0.5)
    target = target.float()
    drafter = qwen35_drafter(target).float()
    return target, drafter


def rows_of(lengths=LENGTHS, seed: int = 40) -> list[torch.Tensor]:
    return [prompt(seed + i, n)[0] for i, n in enumerate(lengths)]








def alone(target, row: torch.Tensor, eos=None) -> list[int]:
    return greedy_alone(target, row, NEW, eos)


@pytest.fixture
def verified(monkeypatch):
    """The cache rows of every batched verify forward (``forward_rows``), recorded."""
    seen = []
    original = StaticTarget.forward_rows

    def recording(self, input_ids, rows, starts, taps_out=None):
        seen.append(list(rows))
        return original(self, input_ids, rows, starts, taps_out)

    monkeypatch.setattr(StaticTarget, "forward_rows", recording)
    return seen


def oracle_rows(monkeypatch, refs: list[torch.Tensor]) -> None:
    """Every batched draft becomes row ``r``'s greedy continuation (from ``refs[r]``, its transformers output) with
    one slot corrupted, picked by (row, position); the pick ``k`` corrupts none. Rows are told apart by their
    drafter caches, in the order of the first round (every row drafts in it)."""
    original = batched_module.propose_rows
    order: dict[int, int] = {}

    def propose_rows(drafter, lasts, pendings, caches, positions, counts, pickers):
        out = original(drafter, lasts, pendings, caches, positions, counts, pickers)
        for cache in caches:
            order.setdefault(id(cache), len(order))
        forced = []
        for (tokens, q), cache, position, k in zip(out, caches, positions, counts):
            row = order[id(cache)]
            drafts = refs[row][position + 1 : position + 1 + k].tolist()
            drafts += [0] * (k - len(drafts))
            j = random.Random(f"{row}-{position}").randrange(k + 1)
            if j < k:
                drafts[j] = (drafts[j] + 1) % MASK
            forced.append((torch.tensor(drafts, device=tokens.device), q))
        return forced

    monkeypatch.setattr(batched_module, "propose_rows", propose_rows)


def run_batched(target, drafter, ids, mask, **kw):
    out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, return_stats=True, **kw)
    assert isinstance(out, BatchGenerationResult) and out.batched
    release_fast_state(target)
    return out


# ------------------------------------------------------------------------------------------------ the runner
def test_forward_rows_is_each_row_alone_and_accept_keeps_each_rows_position():
    """Three rows at three lengths: ``forward_rows`` gives each row the logits of that row run alone through the
    one-row runner and of transformers' forward over its whole text; ``accept`` with a different count per row
    (in another row order) leaves each row's state where the row alone leaves it, so the next block is right too."""
    target = qwen35_target()  # fp64
    lengths = [7, 30, 13]
    seqs, runner, singles, full = _rows_and_singles(target, lengths, 64, 4)
    starts = list(lengths)
    for counts, rows in (([0, 3, 1], [0, 1, 2]), ([2, 0, 3], [2, 0, 1]), ([1, 1, 0], [1, 2, 0])):
        ids = torch.stack([seqs[r][starts[r] : starts[r] + 4] for r in rows])
        logits = runner.forward_rows(ids, rows, [starts[r] for r in rows])
        assert logits.shape == (3, 4, target.config.vocab_size)
        for a, r in enumerate(rows):
            own = singles[r].forward(ids[a : a + 1], starts[r])
            torch.testing.assert_close(logits[a], own, rtol=0, atol=1e-12)
            torch.testing.assert_close(logits[a], full[r][starts[r] : starts[r] + 4], **TOL)
        runner.accept([counts[r] for r in rows])
        for r in range(3):
            singles[r].accept(counts[r])
            starts[r] += counts[r] + 1
    for r in range(3):  # each row's committed state is the row alone's
        for i in runner.linear_ids:
            torch.testing.assert_close(runner.recurrent_rows[i][r], singles[r].recurrent[i], rtol=0, atol=0)
            torch.testing.assert_close(runner.conv_rows[i][r], singles[r].conv[i], rtol=0, atol=0)
    # one row through the batched runner's one-row forward: its own state, the others' untouched
    before = runner._recurrent_rows_all.clone()
    logits = runner.forward(seqs[1][None, starts[1] : starts[1] + 2], starts[1], row=1)
    torch.testing.assert_close(logits, full[1][starts[1] : starts[1] + 2], **TOL)
    runner.accept(1)
    assert torch.equal(runner._recurrent_rows_all[:, [0, 2]], before[:, [0, 2]])
    assert not torch.equal(runner._recurrent_rows_all[:, 1], before[:, 1])


def _rows_and_singles(target, lengths, capacity, block):
    device = next(target.parameters()).device
    seqs = [prompt(10 + i, n + 3 * block)[0].to(device) for i, n in enumerate(lengths)]
    runner = Qwen35StaticTarget(target, capacity, (), batch=len(lengths))
    singles = [Qwen35StaticTarget(target, capacity, ()) for _ in lengths]
    for i, (n, s) in enumerate(zip(lengths, seqs)):
        runner.prefill(s[None, :n], row=i)
        singles[i].prefill(s[None, :n])
    with torch.no_grad():
        full = [target(s[None]).logits[0] for s in seqs]
    return seqs, runner, singles, full


def test_a_verify_block_keeps_writes_not_states_and_a_longer_block_keeps_states():
    """A block of up to FUSED_MAX_ROWS tokens keeps each row's writes (no per-position state: the commit replays
    them into the row's [:, row] views); a longer one keeps every position's state. Both: each row = transformers'
    forward over its text, and the committed states = the row alone's (fp64)."""
    from fold_hf.targets.qwen35_rows import FUSED_MAX_ROWS

    target = qwen35_target()  # fp64
    lengths, L = [9, 21], FUSED_MAX_ROWS + 6
    seqs, runner, singles, full = _rows_and_singles(target, lengths, 2 * L + 40, L)
    starts = list(lengths)
    for size, counts in ((4, [2, 0]), (L, [L - 1, 17]), (3, [1, 2])):
        ids = torch.stack([seqs[r][starts[r] : starts[r] + size] for r in range(2)])
        logits = runner.forward_rows(ids, [0, 1], starts)
        long = size > FUSED_MAX_ROWS
        assert bool(runner._pending) == long and (runner._delta_rows is None) == long
        for r in range(2):
            torch.testing.assert_close(logits[r], full[r][starts[r] : starts[r] + size], **TOL)
            torch.testing.assert_close(singles[r].forward(ids[r : r + 1], starts[r]), logits[r], rtol=0, atol=1e-12)
        runner.accept(counts)
        for r in range(2):
            singles[r].accept(counts[r])
            starts[r] += counts[r] + 1
            for i in runner.linear_ids:  # (a 70-token conv1d over 2 rows and over 1 may round apart in fp64)
                torch.testing.assert_close(runner.recurrent_rows[i][r], singles[r].recurrent[i], rtol=0, atol=1e-15)
                torch.testing.assert_close(runner.conv_rows[i][r], singles[r].conv[i], rtol=0, atol=1e-15)
        assert not runner._pending and runner._delta_rows is None


def _check_rows_triton(device, monkeypatch):
    """The batched verify on the Triton Gated DeltaNet kernels (fp32): the chunked verify and the commit of a
    batch's rows in one launch (the kernels' row axis), host-length and in the fused layers over rows. Every row's
    logits are transformers' forward over its text, block after block with a different count per row, and its
    committed state is the torch twins' within fp32."""
    import fold_hf.kernels as kernels

    def triton_hybrid_ops(device):
        return kernels.HybridOps("triton", **{
            op: getattr(kernels.import_triton_module(f"{package}.triton"), f"{op}_triton")
            for op, package in kernels.HYBRID_OP_PACKAGES.items()})

    target = copy.deepcopy(qwen35_target()).float().to(device)
    lengths = [7, 30, 13]
    seqs, twins, _, full = _rows_and_singles(target, lengths, 64, 4)
    twins._delta_ops = kernels.default_hybrid_ops("cpu")  # the torch twins, resolved before the patch
    assert twins._delta_ops.backend == "torch"
    monkeypatch.setattr(kernels, "default_hybrid_ops", triton_hybrid_ops)
    # host-length rows (block 1) and the fused layers over rows (blocks 2, 3): both verify through _delta_verify
    seqs, runner, _, _ = _rows_and_singles(target, lengths, 64, 4)
    starts = list(lengths)
    for block, (counts, rows) in enumerate((([0, 3, 1], [0, 1, 2]), ([2, 0, 3], [2, 0, 1]), ([1, 1, 0], [1, 2]))):
        ids = torch.stack([seqs[r][starts[r] : starts[r] + 4] for r in rows]).to(device)
        positions = torch.tensor([starts[r] for r in rows], device=device)[:, None] + torch.arange(4, device=device)
        if block == 0:
            logits = runner.forward_rows(ids, rows, [starts[r] for r in rows])
        else:
            logits = runner.forward_rows_static(ids, positions, rows, 64)
            assert runner._hybrid_ops.backend == "triton"
        twins.forward_rows(ids, rows, [starts[r] for r in rows])
        assert runner._delta_ops.backend == "triton" and runner._delta_rows_ops is not None  # rows in one launch
        for a, r in enumerate(rows):
            torch.testing.assert_close(logits[a], full[r][starts[r] : starts[r] + 4], atol=1e-4, rtol=1e-4)
        runner.accept([counts[r] for r in rows])
        twins.accept([counts[r] for r in rows])
        for r in rows:
            starts[r] += counts[r] + 1
        # (the layers after the first see inputs an fp32 rounding apart, so their windows are too)
        torch.testing.assert_close(runner._recurrent_rows_all, twins._recurrent_rows_all, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(runner._conv_rows_all, twins._conv_rows_all, atol=1e-5, rtol=1e-5)
        if block == 0:  # the same inputs to the first layer
            torch.testing.assert_close(runner._conv_rows_all[0], twins._conv_rows_all[0], atol=0, rtol=0)


def test_rows_verify_with_the_triton_kernels_in_interpreter(interpreter, monkeypatch):
    _check_rows_triton("cpu", monkeypatch)


@pytest.mark.gpu(reason="the Triton Gated DeltaNet kernels compiled for CUDA")
def test_rows_verify_with_the_triton_kernels_on_gpu(monkeypatch):
    _check_rows_triton("cuda", monkeypatch)


def test_the_runner_holds_its_rows_and_refuses_what_does_not_fit():
    target = qwen35_target()
    one, three = Qwen35StaticTarget(target, 64), Qwen35StaticTarget(target, 64, batch=3)
    assert three.bytes_held() == 3 * one.bytes_held()
    assert fold_hf.targets.registry.batch_unsupported_reason(target) is None
    assert three.fused_rows_unsupported() is None  # forward_rows_static: the fused layers over rows
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="repeat a row"):
        three.forward_rows(ids, [1, 1], [4, 4])
    positions = torch.tensor([[4, 5, 6], [9, 10, 11]])
    with pytest.raises(ValueError, match="repeat a row"):
        three.forward_rows_static(ids, positions, [1, 1], 16)
    with pytest.raises(ValueError, match="do not match"):
        three.forward_rows_static(ids, positions[:, :2], [0, 1], 16)
    with pytest.raises(ValueError, match="at most 64 rows"):
        three.forward_rows_static(torch.zeros(2, 65, dtype=torch.long), torch.zeros(2, 65, dtype=torch.long), [0, 1],
                                  16)
    three.forward_rows(ids, [0, 2], [4, 4])
    with pytest.raises(ValueError, match="2 accepted counts for the 1 rows|1 accepted counts for the 2 rows"):
        three.accept([1])
    with pytest.raises(ValueError, match="4 accepted drafts of a block of 3"):
        three.accept([1, 4])


# ------------------------------------------------------------------------------------------------ whole calls
def test_random_drafter_every_row_is_its_own_greedy_output(pair, verified):
    """Mixed lengths, left padding, a random drafter (nearly every round rejects, at different rounds per row):
    every row equals transformers' greedy generate of that row alone, and the rows ran together."""
    target, drafter = pair
    rows = rows_of()
    ids, mask = left_pad(rows)
    out = run_batched(target, drafter, ids, mask)
    assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r) for r in rows], pad=-1))
    assert max(len(v) for v in verified) == 3
    assert min(n for row in out.rows for n in row.acceptance_lengths) == 1


def test_forced_rejections_that_differ_per_row(pair, verified, monkeypatch):
    """An oracle with errors: each row accepts 1 .. k + 1 tokens in a pattern of its own, so the rows of one verify
    restore their states at different positions; every row is still its own greedy output."""
    target, drafter = pair
    rows = rows_of()
    ids, mask = left_pad(rows)
    refs = [target.generate(r[None], max_new_tokens=NEW + BLOCK, do_sample=False)[0] for r in rows]
    oracle_rows(monkeypatch, refs)
    out = run_batched(target, drafter, ids, mask)
    assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r) for r in rows], pad=-1))
    patterns = [row.acceptance_lengths for row in out.rows]
    assert len({tuple(p) for p in patterns}) == 3, patterns
    for p in patterns:
        assert set(p) >= set(range(1, BLOCK + 1)), patterns  # every row rolls back by every amount
    assert max(len(v) for v in verified) == 3


def test_an_early_eos_row_leaves_the_batch(pair, verified):
    """One row stops at its EOS early, another never: each row is transformers' greedy output (its EOS kept, the
    shorter rows padded with it), and the stopped row is not verified again."""
    target, drafter = pair
    rows = rows_of((23, 9, 31), seed=60)
    plain = [alone(target, r) for r in rows]
    eos = next(t for t in range(MASK) if any(t in n[:NEW // 2] for n in plain) and any(t not in n for n in plain))
    news = [alone(target, r, eos=eos) for r in rows]
    early = min(range(3), key=lambda i: len(news[i]))
    assert len(news[early]) <= NEW // 2 and max(len(n) for n in news) == NEW, news
    ids, mask = left_pad(rows)
    out = run_batched(target, drafter, ids, mask, eos_token_id=eos)
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos))
    assert out.finish_reason[early] == "eos"
    # each round verifies the rows still running, in cache rows 0 .. A-1 (the stopped row's freed by the last running
    # row's move): the stopped row is not verified again
    running = [sum(len(row.acceptance_lengths) > k for row in out.rows) for k in range(len(verified))]
    assert verified == [list(range(n)) for n in running] and running[-1] < 3, verified
    assert len(verified) == max(len(row.acceptance_lengths) for row in out.rows)


def test_routed_generate_takes_batched_rounds(pair, verified):
    """``target.generate(..., attention_mask, assistant_model=drafter)`` over a padded batch takes the fast loop's
    batched rounds, and every row is transformers' greedy output of that row alone."""
    target, drafter = pair
    rows = rows_of(seed=80)
    ids, mask = left_pad(rows)
    release_fast_state(target)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="fold_hf: target.generate runs transformers'")
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
    assert SESSION_ATTR in target.__dict__, "the routed batch did not take the fast loop"
    release_fast_state(target)
    news = [alone(target, r) for r in rows]
    pad = target.generation_config.pad_token_id
    assert torch.equal(out, expected_batch(ids, news, pad=-1 if pad is None else pad))
    assert max(len(v) for v in verified) == 3


def test_static_engine_without_fused_layers_verifies_host_length_said_once(pair, verified, monkeypatch):
    """On the static engine with the fused layers off (their default off CUDA) the batched verify runs host-length
    ``forward_rows``, saying so once with the reason; the rows are still their own greedy outputs."""
    target, drafter = pair
    rows = rows_of((11, 26), seed=90)
    ids, mask = left_pad(rows)
    monkeypatch.setattr(settings, "_WARNED", set(), raising=False)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = run_batched(target, drafter, ids, mask, engine="static")
    said = [str(w.message) for w in record if "verify host-length" in str(w.message)]
    assert len(said) == 1 and "the fused layers are off here" in said[0], said
    assert torch.equal(out.sequences, expected_batch(ids, [alone(target, r) for r in rows], pad=-1))
    assert max(len(v) for v in verified) == 2


@pytest.mark.parametrize("oracle", [False, True])
def test_static_engine_verifies_the_rows_through_the_fused_layers(pair, verified, monkeypatch, oracle):
    """engine='static' with the fused layers (their torch twins here; the graphs engine captures the same step): the
    batch's verify is the session's fixed-shape rows step (``forward_rows_static``: each row's Gated DeltaNet
    verify from its own state, its attention at its own length), never the host-length ``forward_rows``, and
    nothing says host-length. One row stops early at its EOS, so the step runs three rows, then two (the graphs
    engine's row buckets and their parked rows: the GPU test). Every row is transformers' greedy output of that row
    alone, with a random drafter or an oracle rejecting at per-row slots."""
    target, drafter = pair
    rows = rows_of((23, 9, 31), seed=60)
    plain = [alone(target, r) for r in rows]
    eos = next(t for t in range(MASK) if any(t in n[:NEW // 2] for n in plain) and any(t not in n for n in plain))
    news = [alone(target, r, eos=eos) for r in rows]
    if oracle:
        refs = [target.generate(r[None], max_new_tokens=NEW + BLOCK, do_sample=False)[0] for r in rows]
        oracle_rows(monkeypatch, refs)
    ids, mask = left_pad(rows)
    monkeypatch.setattr(settings, "_WARNED", set(), raising=False)
    out, keys, said = batched_rows_call(target, drafter, ids, mask, NEW, eos, engine="static", fused_layers=True)
    assert not said and out.batched and not verified  # the fused rows step, never forward_rows
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos))
    assert {key[1] for key in keys} >= {3, 2}, keys  # three rows, then the two still running
    if oracle:
        patterns = [tuple(row.acceptance_lengths) for row in out.rows]
        assert len(set(patterns)) == 3, patterns


def test_parked_rows_of_a_row_bucket_commit_nothing(pair, verified, monkeypatch):
    """The graphs engine's row buckets on the static engine (``pads_rows`` forced; CPU, fused twins): four rows, one
    stopping early at its EOS, so three run in a bucket of four (a parked row fed its last token); the batched rounds
    tell the runner the running rows after each step (``after_rows_step``), so a parked row's writes are not
    committed, and every row is still transformers' greedy output of that row alone."""
    target, drafter = pair
    rows = rows_of((23, 9, 31, 14), seed=60)
    plain = [alone(target, r) for r in rows]
    eos = next(t for t in range(MASK) if any(t in n[:NEW // 2] for n in plain) and any(t not in n for n in plain))
    news = [alone(target, r, eos=eos) for r in rows]
    seen = []
    original = Qwen35StaticTarget.after_rows_step

    def recording(self, running, L):
        seen.append(len(list(running)))
        return original(self, list(running), L)

    monkeypatch.setattr(Qwen35StaticTarget, "after_rows_step", recording)
    monkeypatch.setattr(batched_module, "pads_rows", lambda engine: True)
    ids, mask = left_pad(rows)
    out, keys, said = batched_rows_call(target, drafter, ids, mask, NEW, eos, engine="static", fused_layers=True)
    assert not said and out.batched and not verified
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos))
    assert ("rows", 4) in {key[:2] for key in keys} and 3 in seen, (keys, seen)  # three running in a bucket of 4
    assert min(len(r.acceptance_lengths) for r in out.rows) < max(len(r.acceptance_lengths) for r in out.rows)


def test_forward_rows_static_is_each_row_alone_and_a_parked_row_keeps_its_state():
    """The fused layers over rows (torch twins, fp64): three rows at three lengths verify a rejected block and then
    the true one at device positions; each row's logits equal its one-row runner's fused step and transformers'
    forward over its text, and after ``accept`` its state is the one-row runner's. A row of the step left out by
    ``after_rows_step`` (a parked row) keeps its state."""
    target = qwen35_target()  # fp64
    lengths = [7, 30, 13]
    seqs, runner, singles, full = _rows_and_singles(target, lengths, 64, 4)
    starts = list(lengths)
    garbage = torch.full((3, 4), 3, dtype=torch.long)
    for counts in ([0, 3, 1], [2, 0, 3]):
        positions = torch.tensor(starts)[:, None] + torch.arange(4)
        runner.forward_rows_static(garbage, positions, [0, 1, 2], 64)
        runner.accept([0, 0, 0])  # the block's first token is the true one: keep it alone
        ids = torch.stack([seqs[r][starts[r] : starts[r] + 4] for r in range(3)])
        for r in range(3):
            singles[r].forward_static(garbage[r : r + 1], positions[r], 64, attention="triton", fused=True)
            singles[r].accept(0)
        # (the garbage's first token stands for the true one: rewind both to before it by re-running from there)
        starts = [s + 1 for s in starts]
        positions = torch.tensor(starts)[:, None] + torch.arange(4)
        ids = torch.stack([seqs[r][starts[r] : starts[r] + 4] for r in range(3)])
        logits = runner.forward_rows_static(ids, positions, [0, 1, 2], 64)
        for r in range(3):
            one = singles[r].forward_static(ids[r : r + 1], positions[r], 64, attention="triton", fused=True)
            torch.testing.assert_close(logits[r], one, rtol=0, atol=1e-12)
        runner.accept(counts)
        for r in range(3):
            singles[r].accept(counts[r])
            starts[r] += counts[r] + 1
            for i in runner.linear_ids:
                torch.testing.assert_close(runner.recurrent_rows[i][r], singles[r].recurrent[i], rtol=0, atol=1e-15)
                torch.testing.assert_close(runner.conv_rows[i][r], singles[r].conv[i], rtol=0, atol=0)
    before = runner._recurrent_rows_all.clone(), runner._conv_rows_all.clone()
    positions = torch.tensor(starts)[:, None] + torch.arange(4)
    runner.forward_rows_static(torch.stack([seqs[r][starts[r] : starts[r] + 4] for r in range(3)]), positions,
                               [0, 1, 2], 64)
    runner.after_rows_step([0, 1], 4)  # row 2 was parked
    runner.accept([3, 3])
    assert torch.equal(runner._recurrent_rows_all[:, 2], before[0][:, 2])
    assert torch.equal(runner._conv_rows_all[:, 2], before[1][:, 2])
    assert not torch.equal(runner._recurrent_rows_all[:, 0], before[0][:, 0])


def test_the_rows_attention_in_one_launch_is_each_rows_own(interpreter):
    """A batch's fused verify with the full-attention layers' norms, rope and cache writes of every row in one launch
    (``head_norm_rope_write_rows_triton``) and their attention in one launch pair (``decode_attention_rows_triton``:
    what CUDA runs), in Triton's interpreter, fp32, against the same step attending row by row through the kernels'
    torch twins: three rows at lengths 7, 30, 13 in cache rows 2, 0, 1; logits, caches and committed states to fp32
    rounding, and the logits those of the model's own forward."""
    from fold_hf.kernels.fold_read.triton import decode_attention_rows_triton
    from fold_hf.kernels.hybrid.triton import head_norm_rope_write_rows_triton

    target = copy.deepcopy(qwen35_target()).float()
    lengths, rows, counts = [7, 30, 13], [2, 0, 1], [1, 3, 0]
    seqs = [prompt(10 + i, n + 12)[0] for i, n in enumerate(lengths)]
    with torch.no_grad():
        full = [target(s[None]).logits[0] for s in seqs]
    results = {}
    for name, kernels in (("row_by_row", None), ("rows", (head_norm_rope_write_rows_triton,
                                                         decode_attention_rows_triton))):
        runner = Qwen35StaticTarget(target, 64, (), batch=3)
        for n, s, row in zip(lengths, seqs, rows):
            runner.prefill(s[None, :n], row=row)
        runner._rows_kernels = kernels
        positions = torch.tensor(lengths)[:, None] + torch.arange(4)
        ids = torch.stack([s[p : p + 4] for s, p in zip(seqs, lengths)])
        logits = runner.forward_rows_static(ids, positions, rows, 64)
        runner.accept(counts)
        full_layers = [i for i, t in enumerate(runner.layer_types) if t == "full_attention"]
        results[name] = (logits, [runner.keys[i][rows].clone() for i in full_layers],
                         [runner.values[i][rows].clone() for i in full_layers], runner._recurrent_rows_all.clone())
    (got, keys, values, states), (want, keys0, values0, states0) = results["rows"], results["row_by_row"]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(got[i], full[i][n : n + 4], rtol=1e-4, atol=1e-4)
    for a, b in zip(keys + values, keys0 + values0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states, states0, rtol=1e-4, atol=1e-5)


def test_the_fused_rows_step_reads_nothing_on_the_host():
    """``forward_rows_static`` and the rows' commit run on fake tensors (no values exist: any host read of a device
    value raises), so the graphs engine can capture the step and the commit follows a replay without a sync."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    runner = Qwen35StaticTarget(qwen35_target(), 64, (), batch=2)  # fp64 (see the Gemma twin of this test)
    ids = torch.zeros(2, 4, dtype=torch.long)
    positions = torch.tensor([[20], [7]]) + torch.arange(4)
    runner.forward_rows_static(ids, positions, [0, 1], 64)  # the one-time set-up (it probes the activation)
    runner.accept([0, 0])
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        logits = runner.forward_rows_static(mode.from_tensor(ids), mode.from_tensor(positions), [0, 1], 64)
        assert logits.shape[:2] == (2, 4)
        runner.after_rows_step([0, 1], 4)
        runner.accept([1, 3])


@pytest.mark.gpu(reason="CUDA graphs and the fused Triton kernels: the captured batched verify over Qwen3.5 rows")
def test_the_graphs_engine_verifies_qwen35_rows_as_one_captured_step_on_the_gpu(pair):
    """On CUDA (fp32): the graphs engine's captured batched verify through the Qwen3.5 fused layers over rows (the
    chunked Gated DeltaNet verify and decode kernels per row, each row's commit after each replay), 8 rows, rows
    stopping at their EOS (parked rows fill the buckets): every row is transformers' greedy output of that row
    alone, and nothing verifies host-length."""
    target, drafter = copy.deepcopy(pair[0]).cuda(), copy.deepcopy(pair[1]).cuda()
    rows = rows_of((5, 40, 23, 9, 31, 12, 50, 17), seed=70)
    plain = [alone(target, r.cuda()) for r in rows]
    eos = next(t for t in range(MASK) if sum(t in n[:NEW // 2] for n in plain) >= 2)
    news = [alone(target, r.cuda(), eos=eos) for r in rows]
    ids, mask = left_pad(rows)
    out, keys, said = batched_rows_call(target, drafter, ids, mask, NEW, eos)
    assert not said and out.batched and keys
    assert torch.equal(out.sequences.cpu(), expected_batch(ids, news, pad=eos))
