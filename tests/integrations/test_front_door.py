"""The front door: after `import fold_hf`, target.generate(assistant_model=drafter) decodes on the fast loop whenever the
request allows it (else transformers' loop, with one warning naming the reason); the fast loop samples, with the
repetition penalty and min_new_tokens, as transformers' own processors state the rule; a seed reproduces a run on
every engine."""

import warnings

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LogitsProcessorList, TemperatureLogitsWarper

import fold_hf
from fold_hf.generation import fast_generate, release_fast_state
from fold_hf.generation.routing import NOT_ROUTED, route_generate
from tiny import MASK_ID, VOCAB, greedy_reference, mode_config, trained_pair

NEW = 20


@pytest.fixture  # per test: the shared pair's config is restored after every test (tests/conftest.py)
def pair():
    target, drafter = trained_pair("llama")
    drafter.set_fold_config(mode_config("fold"))
    return target, drafter


def prompt(seed: int, length: int = 40) -> torch.Tensor:
    return torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(3000 + seed))


def routed(target) -> bool:
    """Whether the fast loop ran since the last release (it leaves its session on the target)."""
    return target.__dict__.get("_fold_fast_session") is not None


def fold_warnings(record) -> list[str]:
    return [str(w.message) for w in record if str(w.message).startswith("fold_hf")]


def test_default_call_with_a_drafter_runs_the_fast_loop(pair):
    target, drafter = pair
    ids = prompt(0)
    ref = greedy_reference(target, ids, NEW)
    release_fast_state(target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=NEW)
    assert routed(target) and torch.equal(out, ref)
    assert sum(drafter.last_acceptance_lengths) == NEW - 1  # the rounds after the prefill's token
    release_fast_state(target)
    assert torch.equal(target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, fold_fast=False), ref)
    assert not routed(target)
    assert torch.equal(target.generate(ids, max_new_tokens=NEW), ref) and not routed(target)  # no drafter: plain
    assert torch.equal(target.generate(ids, max_new_tokens=NEW, fold_fast=True), ref) and routed(target)  # AR
    release_fast_state(target)


UNSUPPORTED = [
    (dict(num_beams=2), "num_beams=2"),
    (dict(do_sample=True, num_return_sequences=2), "num_return_sequences=2"),
    (dict(no_repeat_ngram_size=2), "no_repeat_ngram_size=2"),
    (dict(bad_words_ids=[[3]]), "bad_words_ids"),
    (dict(do_sample=True, typical_p=0.5), "typical_p=0.5"),
    (dict(max_time=5.0), "max_time=5.0"),
    (dict(return_dict_in_generate=True, output_scores=True), "output_scores"),
    (dict(return_dict_in_generate=True, output_logits=True), "output_logits"),
    (dict(logits_processor=LogitsProcessorList([TemperatureLogitsWarper(0.5)])), "logits_processor"),
    (dict(prefix_allowed_tokens_fn=lambda batch, ids: [1]), "prefix_allowed_tokens_fn"),
    (dict(speculation_type="dflash"), "speculation_type='dflash'"),
]


@pytest.mark.parametrize("kw,reason", UNSUPPORTED, ids=[r for _, r in UNSUPPORTED])
def test_each_request_the_fast_loop_cannot_take_names_its_reason(pair, kw, reason):
    target, drafter = pair
    result, why = route_generate(target, (prompt(1),), {"assistant_model": drafter, "max_new_tokens": 4, **kw})
    assert result is NOT_ROUTED and reason in why, why


def test_other_targets_name_their_reason(pair):  # batches are routed (tests/generation/test_batch.py)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)).eval()
    result, why = route_generate(gpt2, (prompt(2),), {"max_new_tokens": 4})
    assert result is NOT_ROUTED and "GPT2LMHeadModel" in why


def test_an_unsupported_request_runs_transformers_loop_with_one_warning(pair):
    target, drafter = pair
    ids = prompt(3)
    release_fast_state(target)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=12, no_repeat_ngram_size=2)
    messages = fold_warnings(record)
    assert len(messages) == 1 and "no_repeat_ngram_size=2" in messages[0] and "fold_fast=False" in messages[0]
    assert not routed(target)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ref = target.generate(ids, assistant_model=drafter, max_new_tokens=12, no_repeat_ngram_size=2,
                              fold_fast=False)
    assert not fold_warnings(record) and torch.equal(out, ref)


def test_penalty_and_min_new_tokens_follow_transformers_greedy(pair):
    """transformers' own processors state the rule: plain greedy generate with the same settings."""
    target, drafter = pair
    for seed in range(3):
        ids = prompt(10 + seed)
        free = greedy_reference(target, ids, NEW)[0, ids.shape[1]:].tolist()
        for kw in (dict(repetition_penalty=1.5), dict(repetition_penalty=0.7),
                   dict(eos_token_id=free[2], min_new_tokens=9), dict(eos_token_id=[free[1], free[4]], min_length=48)):
            ref = target.generate(ids, max_new_tokens=NEW, **kw)
            routed_out = target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, **kw)
            assert torch.equal(routed_out, ref), (seed, kw)
            loop_kw = dict(kw)
            if "min_length" in loop_kw:
                loop_kw["min_new_tokens"] = loop_kw.pop("min_length") - ids.shape[1]
            for engine in ("eager", "static"):
                out = fast_generate(target, drafter, ids, max_new_tokens=NEW, engine=engine, **loop_kw)
                assert torch.equal(out, ref), (seed, kw, engine)
            assert torch.equal(fold_hf.generate(target, drafter, ids, max_new_tokens=NEW, **loop_kw), ref)


SAMPLED = dict(do_sample=True, temperature=0.8, top_k=9, top_p=0.9, min_p=0.05, repetition_penalty=1.2)


def test_a_seed_reproduces_a_sampled_run_on_every_engine(pair):
    target, drafter = pair
    for seed in range(3):
        ids = prompt(20 + seed, 30 + 40 * seed)
        runs = [fold_hf.generate(target, drafter, ids, max_new_tokens=NEW, return_stats=True,
                                 generator=torch.Generator().manual_seed(seed), **SAMPLED)]
        for engine in ("eager", "static", "eager"):
            runs.append(fast_generate(target, drafter, ids, max_new_tokens=NEW, engine=engine, return_stats=True,
                                      generator=torch.Generator().manual_seed(seed), **SAMPLED))
        for run in runs[1:]:
            assert torch.equal(run.sequences, runs[0].sequences), seed
            assert run.acceptance_lengths == runs[0].acceptance_lengths, seed
        other = fast_generate(target, drafter, ids, max_new_tokens=NEW, generator=torch.Generator().manual_seed(99),
                              **SAMPLED)
        assert not torch.equal(other, runs[0].sequences)  # the seed matters


def test_the_models_generation_config_sampling_is_honoured(pair):
    """A model whose generation config samples (as Llama-3.1-8B-Instruct's does) gets sampling on the fast loop, with
    the settings transformers would apply (its default top-k 50 included), seeded by torch's global seed."""
    target, drafter = pair
    config = target.generation_config
    saved = (config.do_sample, config.temperature, config.top_p)
    config.do_sample, config.temperature, config.top_p = True, 0.6, 0.9
    try:
        ids = prompt(30)
        outs = []
        for seed in (5, 5, 6):
            release_fast_state(target)
            torch.manual_seed(seed)
            outs.append(target.generate(ids, assistant_model=drafter, max_new_tokens=NEW))
            assert routed(target)
        torch.manual_seed(5)
        direct = fast_generate(target, drafter, ids, max_new_tokens=NEW, do_sample=True, temperature=0.6, top_p=0.9,
                               top_k=50)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], direct)
        assert not torch.equal(outs[0], outs[2])
    finally:
        config.do_sample, config.temperature, config.top_p = saved
        release_fast_state(target)


@pytest.mark.gpu(reason="CUDA graphs: the captured sampled round")
def test_graphs_engine_reproduces_the_static_engine_when_sampling():
    """GPU only: the captured sampled round (uniforms read from a buffer the loop refills) gives the uncaptured
    round's tokens for the same seed, and the default call routes there."""
    from tiny import pair_on_gpu

    with pair_on_gpu("llama") as (target, drafter):
        for seed, length in enumerate([10, 300]):
            ids = prompt(40 + seed, length).cuda()
            runs = [fast_generate(target, drafter, ids, max_new_tokens=NEW, engine=engine, return_stats=True,
                                  generator=torch.Generator(device="cuda").manual_seed(seed), **SAMPLED)
                    for engine in ("static", "graphs", "graphs")]
            for run in runs[1:]:
                assert torch.equal(run.sequences, runs[0].sequences), (seed, length)
                assert run.acceptance_lengths == runs[0].acceptance_lengths
            torch.manual_seed(seed)
            routed_out = target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, **SAMPLED)
            torch.manual_seed(seed)
            direct = fast_generate(target, drafter, ids, max_new_tokens=NEW, **SAMPLED)
            assert torch.equal(routed_out, direct)


def test_the_routed_call_runs_what_fast_generate_runs(pair, monkeypatch):
    """A routed sampled call decodes on the session fast_generate built (no rebuild, so no new capture) with the same
    Sampling (transformers' default top-k 50 included: the captured steps are keyed by it), and its routing reads the
    request without rebuilding transformers' default configs per call."""
    from transformers import GenerationConfig

    from fold_hf.generation import fast

    target, drafter = pair
    calls = []
    decode = fast.api.decode_request

    def spy(session, *args, **kwargs):
        calls.append((session, args[4], len(session.steps)))  # args: drafter, ids, budget, out, sampling, ...
        return decode(session, *args, **kwargs)

    monkeypatch.setattr(fast.api, "decode_request", spy)
    ids = prompt(50)
    release_fast_state(target)
    fast_generate(target, drafter, ids, max_new_tokens=NEW, do_sample=True, temperature=0.6, top_p=0.9, top_k=50)
    target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, do_sample=True, temperature=0.6, top_p=0.9)
    to_dict = GenerationConfig.to_dict
    built = []
    monkeypatch.setattr(GenerationConfig, "to_dict", lambda self, *a, **k: built.append(1) or to_dict(self, *a, **k))
    target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, do_sample=True, temperature=0.6, top_p=0.9)
    (direct, sampling, steps), *routed_calls = calls
    for session, routed_sampling, routed_steps in routed_calls:
        assert session is direct and routed_sampling == sampling and routed_steps == steps
    assert len(built) <= 2, f"{len(built)} GenerationConfig.to_dict calls in one routed call"
    release_fast_state(target)
