"""A LoRA-adapted target (peft.PeftModel) with a FOLD assistant: hidden states come from the adapted model."""

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig
from fold_hf.targets.taps import HiddenTaps
from tiny import MASK_ID, trained_pair

peft = pytest.importorskip("peft", reason="peft is an optional extra (pip install -e '.[peft]')")

# peft itself still calls this transformers alias; the warning is about peft, not about fold_hf
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def lora_pair():
    base, drafter = trained_pair("llama")
    torch.manual_seed(0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0,
                             init_lora_weights=False)  # random adapters, so the adapted model really differs
    model = peft.get_peft_model(base, config).eval()
    yield model, drafter
    model.unload()  # leave the shared tiny target as it was


def test_taps_read_the_adapted_model(lora_pair):
    model, drafter = lora_pair
    ids = torch.randint(0, MASK_ID, (1, 20), generator=torch.Generator().manual_seed(0))
    taps = HiddenTaps(model, drafter.config.target_layer_ids)
    with taps, torch.no_grad():
        out = model(ids, output_hidden_states=True)
    features = taps.features()
    expected = torch.cat([out.hidden_states[i + 1] for i in drafter.config.target_layer_ids], -1)
    assert torch.equal(features, expected)
    with model.disable_adapter(), taps, torch.no_grad():
        model(ids)
    assert not torch.allclose(taps.features(), features)


def test_lora_target_is_lossless_on_both_paths(lora_pair):
    model, drafter = lora_pair
    drafter.set_fold_config(FoldConfig(window=16))
    for seed, length in enumerate([12, 60]):
        ids = torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(seed))
        ref = model.generate(input_ids=ids, max_new_tokens=24, do_sample=False)
        ours = fold_hf.generate(model, drafter, input_ids=ids, max_new_tokens=24)
        hf = model.generate(input_ids=ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)
        assert torch.equal(ours, ref) and torch.equal(hf, ref)
