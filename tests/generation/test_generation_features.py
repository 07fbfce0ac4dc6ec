"""generate() features on every path: eos lists, stop strings, streamers, dict outputs, limits, repeated calls.

The paths: fold_hf.generate (the loop over the model's forward), target.generate with the drafter (routed to the fast
loop) and target.generate(..., fold_fast=False) (transformers' assisted loop with FOLD's candidate generator)."""

import warnings

import pytest
import torch

import fold_hf
from tiny import greedy_reference
from tiny import prompt as tiny_prompt


def prompt(seed=0, length=40):
    return tiny_prompt(seed, length)


class Collect:
    def __init__(self):
        self.chunks = []
        self.ended = False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


def routed(target):
    """Whether the last target.generate call ran on the fast loop (it leaves its session on the target)."""
    return target.__dict__.get("_fold_fast_session") is not None


def all_paths(target, drafter, ids, **kw):
    """(fold_hf.generate, target.generate routed to the fast loop, transformers' assisted loop)."""
    ours = fold_hf.generate(target, drafter, input_ids=ids, **kw)
    fold_hf.generation.release_fast_state(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a routed request gives no warning
        fast = target.generate(ids, assistant_model=drafter, do_sample=False, **kw)
    assert routed(target)
    fold_hf.generation.release_fast_state(target)
    hf = target.generate(ids, assistant_model=drafter, do_sample=False, fold_fast=False, **kw)
    assert not routed(target)
    return ours, fast, hf


def test_eos_list_stops_exactly_where_the_target_stops(tiny_pair):
    target, drafter = tiny_pair
    for seed in range(6):
        ids = prompt(seed)
        free = greedy_reference(target, ids, 40)[0, ids.shape[1] :].tolist()
        # two ids that the continuation reaches; transformers 5.17's assisted loop ends at once on a prompt whose
        # last token is an EOS (its first round has no candidates), so such ids are avoided
        eos = [t for t in (free[7], free[15]) if t != ids[0, -1].item()]
        if not eos:
            continue
        ref = target.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=eos)
        for out in all_paths(target, drafter, ids, max_new_tokens=40, eos_token_id=eos):
            assert torch.equal(out, ref)
        assert ref[0, -1].item() in eos


def test_stop_strings_spanning_blocks(tiny_pair, char_tokenizer):
    target, drafter = tiny_pair
    for seed in range(6):
        ids = prompt(seed)
        free = greedy_reference(target, ids, 40)[0, ids.shape[1] :].tolist()
        stop = "".join(chr(97 + t) for t in free[10:13])  # three tokens: usually crosses a block boundary
        ref = target.generate(ids, max_new_tokens=40, do_sample=False, stop_strings=[stop], tokenizer=char_tokenizer)
        for path, out in enumerate(all_paths(target, drafter, ids, max_new_tokens=40, stop_strings=[stop],
                                             tokenizer=char_tokenizer)):
            assert torch.equal(out, ref), (seed, path)
        assert char_tokenizer.decode(ref[0, ids.shape[1] :]).endswith(stop)


def test_streamer_receives_prompt_then_every_token(tiny_pair):
    target, drafter = tiny_pair
    ids = prompt(3)
    for run in ("ours", "fast", "hf"):
        streamer = Collect()
        if run == "ours":
            out = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=30, streamer=streamer)
        else:
            out = target.generate(ids, assistant_model=drafter, max_new_tokens=30, do_sample=False, streamer=streamer,
                                  fold_fast=run == "fast")
        assert streamer.ended
        assert streamer.chunks[0] == ids[0].tolist()
        assert sum(streamer.chunks[1:], []) == out[0, ids.shape[1] :].tolist()


def test_return_dict_in_generate(tiny_pair):
    target, drafter = tiny_pair
    ids = prompt(4)
    ref = greedy_reference(target, ids, 25)
    stats = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=25, return_stats=True)
    fast = target.generate(ids, assistant_model=drafter, max_new_tokens=25, return_dict_in_generate=True)
    assert torch.equal(fast.sequences, ref) and fast["sequences"] is fast.sequences
    assert fast.acceptance_lengths == stats.acceptance_lengths and fast.tau == pytest.approx(stats.tau)
    assert fast.finish_reason == "length"
    # scores are transformers' loop's: the request runs there, saying why
    with pytest.warns(UserWarning, match="output_scores") as record:
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=25, do_sample=False,
                              return_dict_in_generate=True, output_scores=True)
    assert len([w for w in record if str(w.message).startswith("fold_hf")]) == 1
    assert torch.equal(out.sequences, ref)
    assert len(out.scores) == 25


@pytest.mark.parametrize("new_tokens", [1, 2, 3, 5])
def test_limits_smaller_than_a_block_and_one_token_prompt(tiny_pair, new_tokens):
    target, drafter = tiny_pair
    for ids in (prompt(5, 1), prompt(6, 16), prompt(7, 60)):  # 1 token, exactly W, beyond W
        ref = greedy_reference(target, ids, new_tokens)
        for out in all_paths(target, drafter, ids, max_new_tokens=new_tokens):
            assert torch.equal(out, ref)
    ids = prompt(8, 20)
    ref = target.generate(ids, max_length=20 + new_tokens, do_sample=False)
    assert torch.equal(fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=None,
                                        max_length=20 + new_tokens), ref)
    for fast in (True, False):
        assert torch.equal(target.generate(ids, assistant_model=drafter, max_length=20 + new_tokens, do_sample=False,
                                           fold_fast=fast), ref)


def test_repeated_calls_share_no_state(tiny_pair):
    target, drafter = tiny_pair
    ids_a, ids_b = prompt(9, 70), prompt(10, 25)
    first = fold_hf.generate(target, drafter, input_ids=ids_a, max_new_tokens=30, return_stats=True)
    fold_hf.generate(target, drafter, input_ids=ids_b, max_new_tokens=30)
    target.generate(ids_b, assistant_model=drafter, max_new_tokens=30, do_sample=False)
    target.generate(ids_b, assistant_model=drafter, max_new_tokens=30, do_sample=False, fold_fast=False)
    again = fold_hf.generate(target, drafter, input_ids=ids_a, max_new_tokens=30, return_stats=True)
    assert torch.equal(first.sequences, again.sequences)
    assert first.acceptance_lengths == again.acceptance_lengths
    # no hooks left behind on the target
    from fold_hf.targets.taps import decoder_layers

    layers, _ = decoder_layers(target)
    assert all(len(layer._forward_hooks) == 0 for layer in layers)


def test_one_drafter_two_targets(tiny_pair):
    from tiny import tiny_target

    target, drafter = tiny_pair
    other = tiny_target("llama", seed=99)
    ids = prompt(11, 30)
    for t in (other, target, other):
        assert torch.equal(fold_hf.generate(t, drafter, input_ids=ids, max_new_tokens=20), greedy_reference(t, ids, 20))
    wrong = tiny_target("llama", seed=1, layers=4)
    with pytest.raises(ValueError, match="num_target_layers"):
        fold_hf.generate(wrong, drafter, input_ids=ids)


def test_stats_object(tiny_pair):
    target, drafter = tiny_pair
    res = fold_hf.generate(target, drafter, input_ids=prompt(12, 50), max_new_tokens=33, return_stats=True)
    assert res.num_new_tokens == 33 and res.num_prompt_tokens == 50
    assert res.tau == pytest.approx(sum(res.acceptance_lengths) / len(res.acceptance_lengths))
    assert all(1 <= a <= drafter.block_size for a in res.acceptance_lengths)
    assert res.ttft_s > 0 and res.tpot_s > 0 and res.finish_reason == "length"
    assert set(res.summary()) >= {"tau", "tpot_s", "ttft_s", "rounds"}
