"""Bad input raises ValueError naming the problem before any work is done."""

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig
from tiny import MASK_ID, drafter_config, tiny_drafter, tiny_target
from fold_hf import FoldDrafter


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", seed=2)


class ForwardCounter:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_hook(self.hook)

    def hook(self, *args):
        self.calls += 1


def expect_error_before_work(target, message, fn):
    counter = ForwardCounter(target)
    try:
        with pytest.raises(ValueError, match=message):
            fn()
    finally:
        counter.handle.remove()
    assert counter.calls == 0, "the target ran before the error"


def prompt(batch=1, length=12):
    return torch.randint(0, MASK_ID, (batch, length), generator=torch.Generator().manual_seed(0))


def test_batch_larger_than_one(target):
    drafter = tiny_drafter(target)
    expect_error_before_work(target, "batch size 2", lambda: fold_hf.generate(target, drafter, input_ids=prompt(2)))


@pytest.mark.parametrize("field, kw", [("alpha", dict(alpha=0.5)), ("window", dict(window=0)), ("mode", dict(mode="x"))])
def test_bad_fold_config(target, field, kw):
    with pytest.raises(ValueError, match=field):
        FoldConfig(**kw)
    drafter = tiny_drafter(target)
    cfg = FoldConfig()
    object.__setattr__(cfg, list(kw)[0], list(kw.values())[0])  # smuggle a bad value past __init__
    expect_error_before_work(target, field, lambda: fold_hf.generate(target, drafter, input_ids=prompt(),
                                                                     fold_config=cfg))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(hidden_size=48, head_dim=12), "hidden_size"),
        (dict(num_target_layers=5), "num_target_layers"),
        (dict(target_layer_ids=[1, 9]), "target_layer_ids"),
        (dict(mask_token_id=None), "mask_token_id"),
        (dict(mask_token_id=500), "mask_token_id"),
        (dict(vocab_size=13), "vocab_size"),
    ],
)
def test_pair_mismatch(target, change, message):
    cfg = drafter_config(target)
    for key, value in change.items():
        setattr(cfg, key, value)
    drafter = FoldDrafter(cfg).double().eval()
    expect_error_before_work(target, message, lambda: fold_hf.generate(target, drafter, input_ids=prompt()))
    expect_error_before_work(target, message,
                             lambda: target.generate(prompt(), assistant_model=drafter, max_new_tokens=4))


def test_padding_and_empty_prompts(target):
    drafter = tiny_drafter(target)
    mask = torch.ones(1, 12, dtype=torch.long)
    mask[0, 0] = 0
    expect_error_before_work(target, "padding", lambda: fold_hf.generate(target, drafter, input_ids=prompt(),
                                                                         attention_mask=mask))
    expect_error_before_work(target, "empty", lambda: fold_hf.generate(target, drafter,
                                                                       input_ids=torch.zeros(1, 0, dtype=torch.long)))
    expect_error_before_work(target, "max_new_tokens", lambda: fold_hf.generate(target, drafter, input_ids=prompt(),
                                                                                max_new_tokens=0))


def test_wrong_drafter_type(target):
    expect_error_before_work(target, "FoldDrafter", lambda: fold_hf.generate(target, target, input_ids=prompt()))
