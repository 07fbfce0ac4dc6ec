"""Speculative sampling keeps the target's distribution (temperature / top-k / top-p included)."""

import math

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig
from fold_hf.generation import process_logits, speculative_accept
from sampling_reference import (FULL_WARP, NEW, PROMPT, VOCAB, chi2_statistic, chi2_threshold, exact_distribution,
                                transformers_distribution)
from tiny import fit_drafter, tiny_drafter, tiny_target



@pytest.fixture(scope="module")
def pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thread start-up dominates forwards this small
    target = tiny_target("llama", seed=21, vocab=VOCAB, layers=4, dtype=torch.float64)
    drafter = fit_drafter(target, tiny_drafter(target, block=4, fold_config=FoldConfig(window=4)), steps=80)
    yield target, drafter
    torch.set_num_threads(threads)


def test_host_process_logits_is_transformers_warping_for_any_leading_shape():
    """fold_hf.generation.process_logits (the host signature of sampling.process) on ``[..., V]`` logits equals
    transformers' temperature, top-k and top-p warpers row by row, then softmax (float64)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(3, 5, 9, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 2
    got = process_logits(logits, temperature=0.8, top_k=4, top_p=0.9)
    rows = TemperatureLogitsWarper(0.8)(None, logits.reshape(-1, 9).clone())
    want = TopPLogitsWarper(0.9)(None, TopKLogitsWarper(4)(None, rows)).softmax(-1).reshape(logits.shape)
    assert got.shape == logits.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_rejection_step_alone_preserves_the_target_marginal():
    """speculative_accept over many draws: the first committed token follows p_1 whatever q is."""
    g = torch.Generator().manual_seed(0)
    V, k, n = 5, 3, 20_000
    target_probs = torch.softmax(torch.randn(k + 1, V, generator=g), -1)
    draft_probs = torch.softmax(torch.randn(k, V, generator=g) * 2, -1)
    counts = torch.zeros(V)
    for _ in range(n):
        drafts = torch.multinomial(draft_probs, 1, generator=g).squeeze(-1)
        _, commit = speculative_accept(drafts, draft_probs, target_probs, g)
        counts[commit[0]] += 1
    probs = {i: float(p) for i, p in enumerate(target_probs[0])}
    stat, df = chi2_statistic({i: int(c) for i, c in enumerate(counts)}, probs, n)
    assert stat < chi2_threshold(df)


@pytest.mark.slow
def test_hf_path_sampling_runs_and_respects_limits(pair):
    target, drafter = pair
    torch.manual_seed(0)
    out = target.generate(PROMPT, assistant_model=drafter, do_sample=True, max_new_tokens=12, temperature=0.8)
    assert out.shape == (1, PROMPT.shape[1] + 12)
    assert bool((out >= 0).all() and (out < VOCAB).all())




# One χ² test, on the foundation loop: every engine runs the same sampling rule (fold_hf.generation.sampling) on the
# same uniforms, so the fast engines are held to it draw by draw (test_engines_draw_what_the_loop_draws) instead of
# by χ² tests of their own; the graphs engine has its own χ² test on the GPU below.
CHI2_DRAWS = 4_000
REPLAYED_DRAWS = 120


def draw_generator(i: int) -> torch.Generator:
    """The random source of draw ``i`` (one per draw, so any engine can replay any draw)."""
    return torch.Generator().manual_seed(10_000 + i)


@pytest.mark.slow
def test_speculative_sampling_keeps_the_target_distribution(pair):
    """fold_hf.generate's speculative sampling (temperature, top-k, top-p, min-p and the repetition penalty) against
    the exact distribution under transformers' processors: the first token from the prefill, then a round of two
    proposals and the target's token. A mutant that samples a rejection from p instead of the residual fails it."""
    target, drafter = pair
    counts: dict = {}
    accepted = 0
    for i in range(CHI2_DRAWS):
        res = fold_hf.generate(target, drafter, input_ids=PROMPT, max_new_tokens=NEW, do_sample=True,
                               generator=draw_generator(i), return_stats=True, **FULL_WARP)
        key = tuple(res.new_tokens[0].tolist())
        counts[key] = counts.get(key, 0) + 1
        accepted += res.acceptance_lengths[0] - 1
    probs = transformers_distribution(target, FULL_WARP)
    assert abs(sum(probs.values()) - 1) < 1e-9
    stat, df = chi2_statistic(counts, probs, CHI2_DRAWS)
    assert stat < chi2_threshold(df), f"chi2 {stat:.1f} with {df} dof exceeds the p=1e-4 bound {chi2_threshold(df):.1f}"
    assert accepted > CHI2_DRAWS * 0.2, "drafts were rarely accepted: the test would not exercise speculative acceptance"


@pytest.mark.parametrize("engine", ["eager", "static"])
def test_engines_draw_what_the_loop_draws(pair, engine):
    """With the same random source, the fast loop's CPU engines commit the foundation loop's tokens with its
    acceptance lengths, draw by draw (rejections at every slot and whole acceptances among them), so the χ² test of
    the loop holds for them too."""
    from fold_hf.generation import fast_generate

    target, drafter = pair
    seen_acceptances = set()
    for i in range(REPLAYED_DRAWS):
        kw = dict(input_ids=PROMPT, max_new_tokens=NEW, do_sample=True, return_stats=True, **FULL_WARP)
        loop = fold_hf.generate(target, drafter, generator=draw_generator(i), **kw)
        fast = fast_generate(target, drafter, generator=draw_generator(i), engine=engine, **kw)
        assert torch.equal(fast.sequences, loop.sequences), (engine, i)
        assert fast.acceptance_lengths == loop.acceptance_lengths, (engine, i)
        seen_acceptances.add(loop.acceptance_lengths[0])
    assert seen_acceptances == {1, 2, 3}, seen_acceptances  # rejected at the first or second slot, or none


@pytest.mark.gpu(reason="CUDA graphs: the captured round's speculative sampling")
def test_graphs_engine_samples_the_target_distribution(pair):
    """GPU only (CUDA graphs): the captured round's speculative sampling against transformers' processors."""
    import copy

    from fold_hf.generation import fast_generate, release_fast_state

    target, drafter = pair
    gpu_target = copy.deepcopy(target).to("cuda", torch.float32)
    gpu_drafter = copy.deepcopy(drafter).to("cuda", torch.float32)
    n = 4_000
    gen = torch.Generator(device="cuda").manual_seed(4321)
    counts: dict = {}
    prompt = PROMPT.cuda()
    for _ in range(n):
        out = fast_generate(gpu_target, gpu_drafter, input_ids=prompt, max_new_tokens=NEW, do_sample=True,
                            generator=gen, engine="graphs", **FULL_WARP)
        key = tuple(out[0, PROMPT.shape[1]:].tolist())
        counts[key] = counts.get(key, 0) + 1
    release_fast_state(gpu_target)
    probs = transformers_distribution(target, FULL_WARP)
    stat, df = chi2_statistic(counts, probs, n)
    assert stat < chi2_threshold(df), f"chi2 {stat:.1f} with {df} dof exceeds the p=1e-4 bound {chi2_threshold(df):.1f}"


def top_k_top_p_reference(row: list, top_k, top_p) -> list:
    """transformers' top-k then top-p rule for one row, as a float64 loop: top-k keeps every score >= the k-th
    largest (ties included); top-p ranks the kept tokens by (score, index) descending (its stable ascending sort,
    dropped from the bottom), keeps a token while the mass ranked strictly above it is < top_p, and keeps the top
    token. Returns the kept mask."""
    keep = [s != -math.inf for s in row]
    if top_k:
        kth = sorted(row, reverse=True)[top_k - 1]
        keep = [k and s >= kth for k, s in zip(keep, row)]
    if top_p is not None and top_p < 1:
        top = max(row)
        weight = [math.exp(s - top) if k else 0.0 for s, k in zip(row, keep)]
        total = sum(weight)
        order = sorted((i for i in range(len(row)) if keep[i]), key=lambda i: (row[i], i), reverse=True)
        above = 0.0
        for rank, i in enumerate(order):
            keep[i] = rank == 0 or above < top_p
            above += weight[i] / total
    return keep


def top_p_margin(row: list, top_k, top_p) -> float:
    """Distance of the closest mass-above value to top_p (rounding decides cases closer than ~1e-6)."""
    keep = top_k_top_p_reference(row, top_k, None)
    top = max(row)
    weight = [math.exp(s - top) if k else 0.0 for s, k in zip(row, keep)]
    total = sum(weight)
    order = sorted((i for i in range(len(row)) if keep[i]), key=lambda i: (row[i], i), reverse=True)
    above, margin = 0.0, math.inf
    for i in order:
        margin = min(margin, abs(above - top_p))
        above += weight[i] / total
    return margin


@pytest.mark.parametrize("ties", [False, True])
def test_top_k_top_p_mask_matches_the_loop_statement(ties):
    """The device filters (candidates from one topk when top-k is set, the sorted vocabulary otherwise) keep
    exactly the tokens of transformers' rule, tied scores (at the k-th score and at the top-p cut) included."""
    from fold_hf.generation.sampling import _filter_candidates, _filter_sorted, filter_top_k_top_p

    g = torch.Generator().manual_seed(7 + ties)
    rows, vocab = 64, 40
    if ties:  # few distinct values: tie groups straddle the k-th score and the top-p cut
        scores = torch.randint(-4, 3, (rows, vocab), generator=g).float() * 0.7
    else:
        scores = torch.randn(rows, vocab, generator=g) * 2
    scores[::5, ::7] = -math.inf  # masked entries (min_new_tokens' EOS mask)
    compared = 0
    for top_k, top_p in [(5, 0.5), (12, 0.9), (3, 0.99), (20, 0.3), (7, None), (None, 0.6), (None, 0.95)]:
        got = filter_top_k_top_p(scores, top_k, top_p) != -math.inf
        if top_k is not None and top_p is not None:
            sorted_way = _filter_sorted(scores.masked_fill(scores < torch.topk(scores, top_k).values[:, -1:],
                                                           -math.inf), top_p) != -math.inf
        else:
            sorted_way = None
        for r in range(rows):
            row = scores[r].double().tolist()
            if top_p is not None and top_p_margin(row, top_k, top_p) < 1e-5:
                continue  # fp32 rounding decides it
            want = top_k_top_p_reference(row, top_k, top_p)
            assert got[r].tolist() == want, (top_k, top_p, r)
            if sorted_way is not None:
                assert sorted_way[r].tolist() == want, ("sorted", top_k, top_p, r)
            compared += 1
        if top_k is not None and top_p is not None:
            assert torch.equal(got, _filter_candidates(scores, top_k, top_p) != -math.inf)
    assert compared > 0.9 * rows * 7


def test_reference_rule_is_transformers_rule():
    """The loop statement above agrees with transformers' TopK/TopP warpers (float64, no ties: their sort order
    among ties is the implementation's)."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(3)
    scores = torch.randn(32, 30, generator=g, dtype=torch.float64) * 2
    for top_k, top_p in [(5, 0.5), (12, 0.9), (25, 0.3)]:
        hf = TopPLogitsWarper(top_p)(None, TopKLogitsWarper(top_k)(None, scores.clone())) != -math.inf
        for r in range(scores.shape[0]):
            assert hf[r].tolist() == top_k_top_p_reference(scores[r].tolist(), top_k, top_p)


def test_two_level_draw_follows_the_distribution():
    """draw(): chunked inverse CDF, never a zero-probability entry (padding of a vocabulary that is not a
    multiple of the chunk included), frequencies match (chi-square)."""
    from fold_hf.generation.sampling import DRAW_CHUNK, draw

    g = torch.Generator().manual_seed(11)
    vocab = 3 * DRAW_CHUNK + 37
    probs = torch.rand(vocab, generator=g) ** 4
    probs[: DRAW_CHUNK + 5] = 0  # a whole empty chunk, then zeros inside the next
    probs[-3:] = 0
    edges = torch.tensor([0.0, 1e-12, 0.5, 1 - 2**-53], dtype=torch.float64)
    picked = draw(probs.expand(len(edges), -1), edges)
    assert bool((probs[picked] > 0).all())
    n = 40_000
    u = torch.rand(n, generator=g, dtype=torch.float64)
    idx = draw(probs.expand(n, -1), u)
    assert bool((probs[idx] > 0).all())
    counts = torch.bincount(idx, minlength=vocab)
    expected = (probs / probs.sum()).double()
    # pool the vocabulary into 40 cells of equal expected mass
    cells = torch.bucketize(expected.cumsum(0), torch.linspace(0, 1, 41, dtype=torch.float64)[1:-1])
    obs = {int(c): int(counts[cells == c].sum()) for c in cells.unique()}
    exp = {int(c): float(expected[cells == c].sum()) for c in cells.unique()}
    stat, df = chi2_statistic(obs, exp, n)
    assert stat < chi2_threshold(df)


@pytest.mark.gpu(reason="CUDA topk/cumsum at a real vocabulary: the device filter against the loop statement")
def test_device_filter_at_llama3_vocabulary_matches_the_loop_statement():
    """GPU only: bf16-quantised logits at V = 128256 (many exact ties) through the CUDA filter, float64, against the
    loop statement of transformers' rule, with and without top-k."""
    from fold_hf.generation.sampling import filter_top_k_top_p

    g = torch.Generator().manual_seed(5)
    scores = ((torch.randn(4, 128256, generator=g) * 3).to(torch.bfloat16).double() / 0.6)
    for top_k, top_p in [(50, 0.9), (1000, 0.95), (None, 0.5)]:
        got = (filter_top_k_top_p(scores.cuda(), top_k, top_p) != -math.inf).cpu()
        for r in range(scores.shape[0]):
            row = scores[r].tolist()
            if top_p_margin(row, top_k, top_p) < 1e-9:
                continue
            assert got[r].tolist() == top_k_top_p_reference(row, top_k, top_p), (top_k, top_p, r)


def test_the_default_sampled_processing_sorts_no_vocabulary():
    """generate's default sampling (top-k 50 with top-p) decides its cut from one topk: no sort of a vocabulary
    row, and the draws scan chunks, not whole rows (the profiler lists every aten op with its shapes)."""
    from torch.profiler import ProfilerActivity, profile

    from fold_hf.generation.sampling import Sampling, pick

    vocab = 3000
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(2)) * 3
    sampling = Sampling(do_sample=True, temperature=0.6, top_k=50, top_p=0.9)
    u = torch.rand(6, dtype=torch.float64)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        pick(logits, sampling, u)
    ops = [(e.name, e.input_shapes) for e in prof.events()]
    sorts = [shapes for name, shapes in ops if name == "aten::sort"]
    assert not any(s and s[0] and s[0][-1] >= vocab for s in sorts), sorts
    row_scans = [shapes for name, shapes in ops if name == "aten::cumsum" and shapes and shapes[0]
                   and shapes[0][-1] >= vocab and len(shapes[0]) == 2]
    assert not row_scans, row_scans
    top_p_only = Sampling(do_sample=True, temperature=0.6, top_p=0.9)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        pick(logits, top_p_only, u)
    assert any(e.name == "aten::sort" for e in prof.events())  # top-p alone sorts (the check above can fail)
