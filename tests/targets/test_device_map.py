"""A target dispatched by accelerate (``device_map``) with a FOLD assistant, on both generate paths.

CI has one device, so the map splits the target between ``cpu`` and ``disk``: offloaded layers, the final norm and
the lm_head keep their weights on ``meta`` and accelerate's hooks load them per forward. That is the case where a
drafter reading the target's modules by their weights' device breaks; the split across two GPUs is checked by
``benchmarks/multi_gpu_check.py``.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

import fold_hf
from fold_hf import FoldConfig
from tiny import MASK_ID, tiny_drafter, trained_pair

pytest.importorskip("accelerate", reason="device_map needs accelerate")

# the trained drafter taps layers 1 and 3; the second drafter taps the last layer, whose captured state passes
# through the offloaded final norm
DEVICE_MAP = {
    "model.embed_tokens": "cpu",
    "model.rotary_emb": "cpu",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "cpu",
    "model.layers.3": "disk",
    "model.layers.4": "cpu",
    "model.layers.5": "disk",
    "model.norm": "disk",
    "lm_head": "disk",
}


@pytest.fixture(scope="module")
def dispatched(tmp_path_factory):
    plain, drafter = trained_pair("llama")
    folder = tmp_path_factory.mktemp("tiny-target")
    plain.save_pretrained(folder)
    target = AutoModelForCausalLM.from_pretrained(folder, device_map=DEVICE_MAP, offload_folder=folder / "offload",
                                                  dtype=torch.float64).eval()
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = None
    return plain, target, drafter


def test_the_map_really_offloads(dispatched):
    _, target, _ = dispatched
    assert set(target.hf_device_map.values()) == {"cpu", "disk"}
    assert target.lm_head.weight.device.type == "meta"
    assert target.model.layers[3].mlp.up_proj.weight.device.type == "meta"


@pytest.mark.parametrize("mode", ["fold", "dflash"])
def test_dispatched_target_is_lossless_on_both_paths(dispatched, mode):
    plain, target, drafter = dispatched
    drafter.set_fold_config(FoldConfig(mode=mode, window=16))
    rounds = []
    for seed, length in enumerate([12, 60]):
        ids = torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(seed))
        reference = plain.generate(ids, max_new_tokens=24, do_sample=False)
        ours = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, return_stats=True)
        hf = target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)
        assert torch.equal(ours.sequences, reference), (mode, length)
        assert torch.equal(hf, reference), (mode, length)
        rounds += ours.acceptance_lengths
    # some drafts accepted and some rolled back: verification ran blocks and the caches were cropped
    assert max(rounds) > 1 and min(rounds) < drafter.block_size


def test_tap_of_the_last_layer_reads_through_the_offloaded_final_norm(dispatched):
    plain, target, _ = dispatched
    drafter = tiny_drafter(plain, FoldConfig(window=16), seed=3, taps=(2, 5))
    ids = torch.randint(0, MASK_ID, (1, 40), generator=torch.Generator().manual_seed(7))
    reference = plain.generate(ids, max_new_tokens=16, do_sample=False)
    with torch.no_grad():
        expected = drafter.bind_target(plain).draft_logits(ids[0, -1:], _features(plain, drafter, ids[:, :-1]),
                                                           drafter.new_cache())
        got = drafter.bind_target(target).draft_logits(ids[0, -1:], _features(target, drafter, ids[:, :-1]),
                                                       drafter.new_cache())
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=16), reference)
    assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=16, do_sample=False), reference)


def _features(target, drafter, ids):
    """``[1, n, n_taps * H]`` tapped hidden states of ``ids`` ``[1, n]``."""
    from fold_hf.targets.taps import HiddenTaps

    taps = HiddenTaps(target, drafter.config.target_layer_ids)
    with taps, torch.no_grad():
        target(ids)
    return taps.features()
