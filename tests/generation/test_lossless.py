"""Greedy speculative decoding returns exactly the target's own greedy output, every mode, both paths."""

import pytest
import torch

import fold_hf
from tiny import (GRID_NEW_TOKENS, GRID_PROMPT_LENGTHS, fit_drafter, greedy_reference, grid_greedy, grid_loop,
                  grid_prompt, mode_config, tiny_drafter, tiny_target, trained_pair)
from tiny import prompt as tiny_prompt

MODES = ["fold", "dflash", "window", "streaming", "rerope", "yarn"]
PROMPT_LENGTHS = GRID_PROMPT_LENGTHS
NEW_TOKENS = GRID_NEW_TOKENS
pytestmark = pytest.mark.xdist_group("lossless-grid")


def prompt(seed: int, length: int) -> torch.Tensor:
    return tiny_prompt(seed, length, offset=1000)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("mode", MODES)
def test_greedy_lossless_both_paths(arch, mode):
    target, drafter = trained_pair(arch)
    rounds = []
    for seed in range(len(GRID_PROMPT_LENGTHS)):
        ids, ref = grid_prompt(seed), grid_greedy(arch, seed)
        res = grid_loop(arch, mode, seed)
        assert torch.equal(res.sequences, ref), f"fold_hf.generate differs: {arch} {mode} seed {seed}"
        assert sum(res.acceptance_lengths) == NEW_TOKENS - 1  # the first token comes from the prefill
        drafter.set_fold_config(mode_config(mode))
        hf = target.generate(ids, assistant_model=drafter, max_new_tokens=NEW_TOKENS, do_sample=False)
        assert torch.equal(hf, ref), f"target.generate(assistant_model=...) differs: {arch} {mode} seed {seed}"
        assert drafter.last_acceptance_lengths == res.acceptance_lengths  # same drafts on both paths
        rounds += res.acceptance_lengths
    # both partial acceptance (rollback) and multi-token acceptance must have happened
    assert max(rounds) >= 2 and min(rounds) == 1, rounds


def test_autoregressive_baseline_is_the_block_one_case():
    target, _ = trained_pair("llama")
    for seed, length in enumerate(PROMPT_LENGTHS[:3]):
        ids = prompt(seed, length)
        res = fold_hf.generate(target, None, input_ids=ids, max_new_tokens=NEW_TOKENS, return_stats=True)
        assert torch.equal(res.sequences, greedy_reference(target, ids, NEW_TOKENS))
        assert res.acceptance_lengths == [1] * (NEW_TOKENS - 1) and res.mode == "ar"


@pytest.mark.parametrize("variant", ["sliding_all", "sliding_full", "partial_rotary", "gqa_1kv", "block_8"])
def test_drafter_variants_are_lossless(variant):
    target = tiny_target("qwen3", seed=11)
    kw = {}
    layers = "all"
    if variant.startswith("sliding"):
        kw = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=12)
        layers = variant.split("_")[1]
    elif variant == "partial_rotary":
        kw = dict(partial_rotary_factor=0.5)
    elif variant == "gqa_1kv":
        kw = dict(kv_heads=1)
    block = 8 if variant == "block_8" else 4
    drafter = fit_drafter(target, tiny_drafter(target, block=block, **kw), steps=60)
    for seed, length in enumerate([20, 120]):
        ids = prompt(seed, length)
        ref = greedy_reference(target, ids, 30)
        for mode in ("fold", "dflash", "rerope"):
            cfg = mode_config(mode, layers=layers)
            res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=30, fold_config=cfg)
            assert torch.equal(res, ref), (variant, mode, seed)
