"""Independent statements of a sampled distribution, shared by the sampling tests (tests/generation/test_sampling.py,
tests/generation/test_batched_rounds.py, tests/modeling/test_deepspec.py): the exact distribution of a few new tokens
of a tiny target under transformers' own logits processors (float64, every sequence enumerated) and the χ² test that
compares draws with it."""

import itertools
import math

import torch

from fold_hf.generation import process_logits

VOCAB = 4
NEW = 4  # first token from the prefill, then one round of 2 drafts + 1 target token (block 4)
PROMPT = torch.tensor([[0, 2, 1, 1, 3, 0]])
FULL_WARP = dict(temperature=0.8, top_k=3, top_p=0.95, min_p=0.1, repetition_penalty=1.3)


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


def transformers_distribution(target, settings: dict, prompt: torch.Tensor = PROMPT) -> dict:
    """The exact distribution of the NEW tokens under transformers' own processors (the independent statement of the
    rule: repetition penalty over prompt and generated tokens, then temperature, top-k, top-p, min-p), float64, after
    ``prompt`` ``[1, P]``."""
    from transformers import (LogitsProcessorList, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                              TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    processors = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]),
                                      TemperatureLogitsWarper(settings["temperature"]),
                                      TopKLogitsWarper(settings["top_k"]), TopPLogitsWarper(settings["top_p"]),
                                      MinPLogitsWarper(settings["min_p"])])
    seqs = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW)))
    ids = torch.cat((prompt.expand(len(seqs), -1), seqs), dim=1)
    with torch.no_grad():
        logits = target(ids).logits.double()
    P = prompt.shape[1]
    prob = torch.ones(len(seqs), dtype=torch.float64)
    for j in range(NEW):
        scores = processors(ids[:, : P + j], logits[:, P + j - 1].clone())
        prob *= scores.softmax(-1).gather(-1, seqs[:, j : j + 1]).squeeze(-1)
    return {tuple(s.tolist()): float(pi) for s, pi in zip(seqs, prob)}
