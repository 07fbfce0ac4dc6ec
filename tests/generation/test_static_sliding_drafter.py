"""Drafters with sliding-window layers (the Qwen3.5 z-lab drafter's layout) get the static, capturable drafting step:
the fast loop's static engine drafts exactly what the foundation loop's eager drafter drafts, every reading mode,
FOLD on all layers or on the full-attention layers only, contexts on both sides of the sliding window and of W."""

import functools
import warnings

import pytest
import torch

import fold_hf
from fold_hf.generation import fast_generate
from fold_hf.generation.static_drafter import static_drafter_unsupported
from tiny import MASK_ID, fit_drafter, greedy_reference, mode_config, tiny_drafter, tiny_target

MODES = ["fold", "dflash", "window", "streaming", "rerope", "yarn"]


@functools.lru_cache(maxsize=None)
def sliding_pair():
    target = tiny_target("qwen3", seed=11)
    drafter = tiny_drafter(target, block=4, layer_types=["sliding_attention", "full_attention"], sliding_window=12)
    return target, fit_drafter(target, drafter, steps=60)


def prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(4000 + seed))


# FoldConfig.layers only changes the modes with a far memory
@pytest.mark.parametrize("mode, layers", [(m, "all") for m in MODES] + [("fold", "full"), ("rerope", "full")])
def test_static_sliding_drafter_matches_the_foundation_loop(mode, layers):
    target, drafter = sliding_pair()
    cfg = mode_config(mode, layers=layers)
    assert static_drafter_unsupported(drafter.set_fold_config(cfg)) is None
    rounds = []
    # 6 < sliding window - B (8) < 12 < W (16) < 40: no far memory, sliding far only, both far memories
    for seed, length in enumerate([6, 12, 40]):
        ids = prompt(seed, length)
        ref = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=20, return_stats=True, fold_config=cfg)
        assert torch.equal(ref.sequences, greedy_reference(target, ids, 20))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the static step runs: no "drafts eagerly" warning
            res = fast_generate(target, drafter, input_ids=ids, max_new_tokens=20, return_stats=True,
                                fold_config=cfg, engine="static")
        assert torch.equal(res.sequences, ref.sequences), (mode, layers, length)
        assert res.acceptance_lengths == ref.acceptance_lengths, (mode, layers, length)
        rounds += ref.acceptance_lengths
    assert max(rounds) >= 2, rounds  # the drafts are exercised (equal acceptance = equal drafts up to the miss)


def test_static_sliding_step_equals_eager_drafts():
    """Draft by draft: the static step's tokens equal the eager drafter's greedy tokens at several context lengths."""
    from fold_hf.generation.static_drafter import StaticDrafter, commit_context, preallocated_cache
    from fold_hf.kernels import default_layer_ops
    from fold_hf.targets.taps import HiddenTaps

    target, drafter = sliding_pair()
    for mode in ("fold", "streaming", "rerope"):
        drafter.set_fold_config(mode_config(mode))
        for length in (5, 10, 30):
            ids = prompt(10 + length, length + 4)
            with HiddenTaps(target, drafter.config.target_layer_ids) as taps:
                target(ids)
            features = taps.features()
            eager_cache = drafter.new_cache(request_length=128)
            want = drafter.draft_logits(ids[0, length:length + 1], features[:, :length], eager_cache,
                                        block_start=length)[0].argmax(-1)
            for ops in (None, default_layer_ops("cpu")):  # the drafter's modules, then the fused ops' twins
                cache = preallocated_cache(drafter, 128, "cpu", 128)
                static = StaticDrafter(drafter, cache, layer_ops=ops)
                static.start_request(128)
                commit_context(drafter, cache, features[:, : length - 4])
                state = torch.tensor([0, length - 4, 4, int(ids[0, length]), 0, 0, 0, 0])
                new = features[:, length - 4 : length].clone()
                got = static.draft(new, state, static.needs_far(length))
                assert torch.equal(got, want), (mode, length, ops)
