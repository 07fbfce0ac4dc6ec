"""Batches (issue 35): a left-padded ``[B, L]`` batch decodes on fold_hf.generate, fast_generate (batched rounds on
its eager engine, row by row on the others; tests/generation/test_batched_rounds.py) and the routed
target.generate(assistant_model=drafter), and every row equals that row decoded alone, without padding, by
the target's own greedy generate (transformers' AR), laid out as transformers' batched generate returns it: left
padding kept, rows that stopped early filled with the pad id on the right."""

import copy
import warnings

import pytest
import torch

import fold_hf
from fold_hf.generation import BatchGenerationResult, GenerationResult, batch, release_fast_state
from fold_hf.generation.fast import SESSION_ATTR
from tiny import MASK_ID, expected_batch, greedy_alone, left_pad, mode_config, trained_pair

NEW = 12


@pytest.fixture(scope="module")
def pair():
    """The trained tiny llama pair, copied in fp32."""
    target, drafter = trained_pair("llama")
    target, drafter = copy.deepcopy(target).float(), copy.deepcopy(drafter).float()
    drafter.set_fold_config(mode_config("fold"))
    return target, drafter


def row_prompt(seed: int, length: int) -> torch.Tensor:
    return torch.randint(0, MASK_ID, (length,), generator=torch.Generator().manual_seed(5000 + seed))


def alone(target, row: torch.Tensor, eos=None) -> list[int]:
    return greedy_alone(target, row, NEW, eos)


ROWS = [row_prompt(0, 5), row_prompt(1, 70), row_prompt(2, 23)]  # short, much longer, medium (padded rows: 0, 2)








def run(path: str, target, drafter, ids, mask, **kw):
    if path == "generate":
        return fold_hf.generate(target, drafter, ids, mask, max_new_tokens=NEW, **kw)
    if path.startswith("fast-"):
        out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, engine=path[5:], **kw)
        release_fast_state(target)
        return out
    assert path == "routed"
    release_fast_state(target)
    return_stats = kw.pop("return_stats", False)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="fold_hf: target.generate runs transformers'")
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=NEW,
                              do_sample=False, return_dict_in_generate=return_stats, **kw)
    assert SESSION_ATTR in target.__dict__, "the routed batch did not take the fast loop"
    release_fast_state(target)
    return out


PATHS = ["generate", "fast-eager", "fast-static", "routed"]


@pytest.fixture
def quiet():
    """The once-per-process batch warning, already said (tests that count it reset it themselves)."""
    saved, batch._WARNED = batch._WARNED, True
    yield
    batch._WARNED = saved


@pytest.mark.parametrize("path", PATHS)
def test_each_row_equals_the_row_decoded_alone(pair, path, quiet):
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    # no EOS: every row runs to the budget
    news = [alone(target, r) for r in ROWS]
    assert all(len(n) == NEW for n in news)
    out = run(path, target, drafter, ids, mask)
    assert torch.equal(out, expected_batch(ids, news, pad=-1))
    # an EOS forced on row 2: the token it generates at step 2; the rows stop where each alone stops
    eos = news[2][1]
    news = [alone(target, r, eos=eos) for r in ROWS]
    assert len(news[2]) <= 2 and news[2][-1] == eos and max(len(n) for n in news) > 2  # row 2 padded on the right
    out = run(path, target, drafter, ids, mask, eos_token_id=eos, return_stats=True)
    assert torch.equal(out.sequences, expected_batch(ids, news, pad=eos))  # pad id: the first EOS id
    if path == "routed":
        assert out.finish_reason[2] == "eos" and len(out.acceptance_lengths) == 3
        assert drafter.last_acceptance_lengths == out.acceptance_lengths
        return
    assert isinstance(out, BatchGenerationResult) and len(out.rows) == 3 and out.num_prompt_tokens == ids.shape[1]
    assert out.finish_reason[2] == "eos" and len(out.tau) == 3
    for row, prompt_row, new in zip(out.rows, ROWS, news):  # each row's own result, unpadded
        assert row.sequences[0].tolist() == prompt_row.tolist() + new
        assert row.finish_reason == ("eos" if new[-1] == eos else "length")


@pytest.mark.parametrize("path", ["generate", "fast-eager"])
def test_a_pad_token_id_fills_the_rows_that_stopped(pair, path, quiet):
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    eos = alone(target, ROWS[0])[1]
    news = [alone(target, r, eos=eos) for r in ROWS]
    out = run(path, target, drafter, ids, mask, eos_token_id=eos, pad_token_id=MASK_ID)
    assert torch.equal(out, expected_batch(ids, news, pad=MASK_ID))


@pytest.mark.parametrize("path", ["generate", "fast-eager", "routed"])
def test_one_padded_prompt(pair, path):
    target, drafter = pair
    ids, mask = left_pad([ROWS[2], ROWS[1]])
    ids, mask = ids[:1], mask[:1]  # one row, left-padded
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="fold_hf: batch")  # one prompt is not a batch: no warning
        out = run(path, target, drafter, ids, mask)
    assert torch.equal(out, expected_batch(ids, [alone(target, ROWS[2])], pad=-1))
    if path != "routed":
        stats = run(path, target, drafter, ids, mask, return_stats=True)
        assert isinstance(stats, GenerationResult) and torch.equal(stats.sequences, out)
        assert stats.num_prompt_tokens == ids.shape[1] and stats.num_new_tokens == NEW


def test_one_unpadded_prompt_returns_as_before(pair):
    target, drafter = pair
    ids = ROWS[0][None]
    for mask in (None, torch.ones_like(ids)):
        result = fold_hf.generate(target, drafter, ids, mask, max_new_tokens=NEW, return_stats=True)
        assert isinstance(result, GenerationResult) and result.sequences.shape == (1, len(ROWS[0]) + NEW)
        assert result.num_prompt_tokens == len(ROWS[0])


@pytest.mark.parametrize("path", ["generate", "fast-eager", "routed"])
def test_right_padding_is_refused_naming_left_padding(pair, path):
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    mask[0] = mask[0].flip(0)  # row 0's ones first, then zeros: right padding
    with pytest.raises(ValueError, match="left padding"):
        run(path, target, drafter, ids, mask)
    release_fast_state(target)


def test_the_batch_warning_is_said_once_per_process(pair, monkeypatch):
    target, drafter = pair
    monkeypatch.setattr(batch, "_WARNED", False)
    ids, mask = left_pad(ROWS[:2])
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fold_hf.generate(target, drafter, ids, mask, max_new_tokens=2)
        fold_hf.generate(target, None, ids, mask, max_new_tokens=2)  # row by row again: not said again
        release_fast_state(target)
    said = [str(w.message) for w in record if "rows are decoded one after another" in str(w.message)]
    assert said == ["fold_hf: batch of 2 prompts: rows are decoded one after another (fold_hf.generate runs the "
                    "model's own forward a row at a time; fast_generate runs batched rounds; issue 35)"]


def test_a_streamer_with_a_batch_is_refused(pair, quiet):
    target, drafter = pair
    ids, mask = left_pad(ROWS[:2])

    class Streamer:
        def put(self, value):
            raise AssertionError("nothing may be decoded")

        def end(self):
            pass

    for entry in (fold_hf.generate, fold_hf.fast_generate):
        with pytest.raises(ValueError, match="streamer with a batch of 2 prompts"):
            entry(target, drafter, ids, mask, max_new_tokens=4, streamer=Streamer())


def test_sampled_rows_draw_from_the_generator_in_row_order(pair, quiet):
    target, drafter = pair
    ids, mask = left_pad(ROWS)
    settings = dict(max_new_tokens=NEW, do_sample=True, temperature=1.5)
    out = fold_hf.generate(target, drafter, ids, mask, generator=torch.Generator().manual_seed(7), **settings)
    generator = torch.Generator().manual_seed(7)  # the same generator serves row 0, then row 1, then row 2
    news = [fold_hf.generate(target, drafter, r[None], generator=generator, **settings)[0, len(r):].tolist()
            for r in ROWS]
    assert torch.equal(out, expected_batch(ids, news, pad=-1))
