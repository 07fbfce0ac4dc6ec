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


def test_a_bad_batch(target):
    drafter = tiny_drafter(target)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1] = 0
    expect_error_before_work(target, "row 1 is all zeros",
                             lambda: fold_hf.generate(target, drafter, input_ids=prompt(2), attention_mask=mask))
    expect_error_before_work(target, "must match",
                             lambda: fold_hf.generate(target, drafter, input_ids=prompt(2), attention_mask=mask[:1]))
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_tokens'"):
        fold_hf.generate(target, drafter, input_ids=prompt(), max_tokens=4)


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
    mask[0, -1] = 0  # right padding (left padding decodes: tests/generation/test_batch.py)
    expect_error_before_work(target, "left padding", lambda: fold_hf.generate(target, drafter, input_ids=prompt(),
                                                                         attention_mask=mask))
    expect_error_before_work(target, "empty", lambda: fold_hf.generate(target, drafter,
                                                                       input_ids=torch.zeros(1, 0, dtype=torch.long)))
    expect_error_before_work(target, "max_new_tokens", lambda: fold_hf.generate(target, drafter, input_ids=prompt(),
                                                                                max_new_tokens=0))


def test_wrong_drafter_type(target):
    expect_error_before_work(target, "FoldDrafter", lambda: fold_hf.generate(target, target, input_ids=prompt()))


ENTRY_POINTS = {"generate": fold_hf.generate, "fast_generate": fold_hf.fast_generate}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_both_entry_points_refuse_the_same_requests(target, entry):
    run = ENTRY_POINTS[entry]
    drafter = tiny_drafter(target)
    mask = torch.ones(1, 12, dtype=torch.long)
    mask[0, 3] = 0
    cases = [
        ("input_ids is required", drafter, dict(input_ids=None)),
        ("streamer with a batch of 2 prompts", drafter, dict(input_ids=prompt(2), streamer=object())),
        ("left padding", drafter, dict(input_ids=prompt(), attention_mask=mask)),
        ("give max_new_tokens or max_length", drafter, dict(input_ids=prompt(), max_new_tokens=None)),
        ("nothing to generate", drafter, dict(input_ids=prompt(), max_new_tokens=None, max_length=12)),
        ("fold_config was given without a drafter", None, dict(input_ids=prompt(), fold_config=FoldConfig())),
    ]
    for message, chosen, kwargs in cases:
        kwargs = {"max_new_tokens": 4, **kwargs}
        expect_error_before_work(target, message, lambda: run(target, chosen, **kwargs))


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_the_call_config_is_read_during_the_call_and_restored_even_when_it_raises(target, entry):
    drafter = tiny_drafter(target)
    own = FoldConfig(mode="fold", window=6, alpha=2.0, train_length=16)
    drafter.set_fold_config(own)
    call = FoldConfig(mode="window", window=4, train_length=16)
    seen = []

    class Streamer:  # the first tokens reach it mid-call; it stops the request by raising
        def put(self, value):
            seen.append(drafter.fold_config)
            if len(seen) == 2:
                raise _Interrupt

        def end(self):
            pass

    with pytest.raises(_Interrupt):
        ENTRY_POINTS[entry](target, drafter, input_ids=prompt(), max_new_tokens=8, fold_config=call,
                            streamer=Streamer())
    assert seen == [call, call]
    assert drafter.fold_config == own
