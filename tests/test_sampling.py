"""Speculative sampling keeps the target's distribution (temperature / top-k / top-p included)."""

import itertools
import math

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig
from fold_hf.generation import process_logits, speculative_accept
from tiny import fit_drafter, tiny_drafter, tiny_target

VOCAB = 4
NEW = 4  # first token from the prefill, then one round of 2 drafts + 1 target token (block 4)
PROMPT = torch.tensor([[0, 2, 1, 1, 3, 0]])


def chi2_threshold(df: int, z: float = 3.719) -> float:
    """Upper quantile of chi-square(df) at one-sided p = 1e-4 (z = 3.719), Wilson-Hilferty approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2_statistic(counts: dict, probs: dict, n: int) -> tuple[float, int]:
    """Pearson statistic with cells of expected count < 5 pooled; returns (statistic, degrees of freedom)."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for key, p in probs.items():
        exp, obs = p * n, counts.get(key, 0)
        if exp < 5:
            pooled_obs += obs
            pooled_exp += exp
            continue
        stat += (obs - exp) ** 2 / exp
        cells += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        cells += 1
    return stat, cells - 1


def exact_distribution(target, warp: dict) -> dict:
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW)))
    ids = torch.cat((PROMPT.expand(len(seqs), -1), seqs), dim=1)
    with torch.no_grad():
        logits = target(ids).logits[:, PROMPT.shape[1] - 1 : -1]
    probs = process_logits(logits, **warp).double()
    p = probs.gather(-1, seqs[..., None]).squeeze(-1).prod(-1)
    return {tuple(s.tolist()): float(pi) for s, pi in zip(seqs, p)}


@pytest.fixture(scope="module")
def pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thread start-up dominates forwards this small
    target = tiny_target("llama", seed=21, vocab=VOCAB, layers=4, dtype=torch.float64)
    drafter = fit_drafter(target, tiny_drafter(target, block=4, fold_config=FoldConfig(window=4)), steps=80)
    yield target, drafter
    torch.set_num_threads(threads)


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


FULL_WARP = dict(temperature=0.8, top_k=3, top_p=0.95, min_p=0.1, repetition_penalty=1.3)


def transformers_distribution(target, settings: dict) -> dict:
    """The exact distribution of the NEW tokens under transformers' own processors (the independent statement of the
    rule: repetition penalty over prompt and generated tokens, then temperature, top-k, top-p, min-p), float64."""
    from transformers import (LogitsProcessorList, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                              TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]),
                                      TemperatureLogitsWarper(settings["temperature"]),
                                      TopKLogitsWarper(settings["top_k"]), TopPLogitsWarper(settings["top_p"]),
                                      MinPLogitsWarper(settings["min_p"])])
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW)))
    ids = torch.cat((PROMPT.expand(len(seqs), -1), seqs), dim=1)
    with torch.no_grad():
        logits = target(ids).logits.double()
    P = PROMPT.shape[1]
    prob = torch.ones(len(seqs), dtype=torch.float64)
    for j in range(NEW):
        scores = processors(ids[:, : P + j], logits[:, P + j - 1].clone())
        prob *= scores.softmax(-1).gather(-1, seqs[:, j : j + 1]).squeeze(-1)
    return {tuple(s.tolist()): float(pi) for s, pi in zip(seqs, prob)}


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
