"""`fold_hf.generate`: our own speculative decoding loop (batch 1).

One code path for every method: with a drafter, each round drafts a block, verifies it with one
target forward and commits the accepted prefix plus the target's token; without one (``drafter=None``)
the same loop verifies an empty block, which is plain autoregressive decoding (DFlash's "block 1").
Only accepted positions reach the drafter's cache, so a rejection costs the target cache a rewind and
the drafter nothing.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from ..modeling.drafter import FoldDrafter
from ..modeling.fold_config import FoldConfig
from ..modeling.validation import validate_batch
from .stats import GenerationResult
from .taps import HiddenTaps, _unwrap
from .verify import greedy_accept, process_logits, speculative_accept


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _eos_ids(target, eos_token_id) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, torch.Tensor):
        eos_token_id = eos_token_id.tolist()
    if isinstance(eos_token_id, int):
        return {eos_token_id}
    return {int(e) for e in eos_token_id}


class _StopStrings:
    """Finds the first token at which the decoded continuation contains a stop string."""

    def __init__(self, stop_strings: Sequence[str] | str | None, tokenizer) -> None:
        if isinstance(stop_strings, str):
            stop_strings = [stop_strings]
        self.strings = [s for s in (stop_strings or []) if s]
        if self.strings and tokenizer is None:
            raise ValueError("stop_strings needs tokenizer=... to decode the generated tokens")
        self.tokenizer = tokenizer

    def cut(self, new_tokens: list[int], checked: int) -> int | None:
        """Index (exclusive) of the token that completes a stop string, searching tokens >= ``checked``."""
        if not self.strings:
            return None
        for end in range(max(1, checked), len(new_tokens) + 1):
            text = self.tokenizer.decode(new_tokens[:end])
            if any(s in text for s in self.strings):
                return end
        return None


def _forward_parameters(target) -> set[str]:
    try:
        return set(inspect.signature(_unwrap(target).forward).parameters)
    except (TypeError, ValueError):
        return set()


@torch.no_grad()
def generate(
    target,
    drafter: FoldDrafter | None = None,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int | None = 256,
    max_length: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    stop_strings: Sequence[str] | str | None = None,
    tokenizer=None,
    streamer=None,
    generator: torch.Generator | None = None,
    fold_config: FoldConfig | None = None,
    return_stats: bool = False,
):
    """Speculative decoding of ``target`` with a FOLD ``drafter`` (or plain AR when ``drafter`` is None).

    Args:
        target: a transformers causal LM (batch 1).
        drafter: a :class:`FoldDrafter` for this target, or None for the autoregressive baseline.
        input_ids: ``[1, P]`` prompt.
        attention_mask: ``[1, P]``; must be all ones (no padding in batch 1).
        max_new_tokens / max_length: generation limit (``max_new_tokens`` wins when both are set).
        do_sample, temperature, top_k, top_p: sampling; speculative sampling keeps the target's processed
            distribution exactly. Greedy output equals the target's own greedy output.
        eos_token_id: int or list; defaults to the target's generation config.
        stop_strings, tokenizer: stop once the continuation contains a stop string.
        streamer: a transformers streamer (``put``/``end``).
        generator: random source for sampling.
        fold_config: reading mode for this call only (the drafter's own is restored afterwards).
        return_stats: return a :class:`GenerationResult` instead of the ``[1, P + N]`` sequences.
    """
    if input_ids is None:
        raise ValueError("input_ids is required")
    validate_batch(input_ids)
    if attention_mask is not None and not bool(torch.all(attention_mask != 0)):
        raise ValueError("attention_mask has padding; batch-1 generation takes unpadded prompts")
    prompt_len = input_ids.shape[1]
    if max_new_tokens is None:
        if max_length is None:
            raise ValueError("give max_new_tokens or max_length")
        max_new_tokens = max_length - prompt_len
    if max_new_tokens < 1:
        raise ValueError(f"nothing to generate: max_new_tokens={max_new_tokens} (prompt has {prompt_len} tokens)")
    if drafter is not None and not isinstance(drafter, FoldDrafter):
        raise ValueError(f"drafter must be a FoldDrafter, got {type(drafter).__name__}")
    if drafter is not None:
        drafter.bind_target(target)
    previous_config = None
    if fold_config is not None:
        if drafter is None:
            raise ValueError("fold_config was given without a drafter")
        previous_config = drafter.fold_config
        drafter.set_fold_config(fold_config)
    try:
        return _generate(target, drafter, input_ids, max_new_tokens, do_sample, temperature, top_k, top_p,
                         _eos_ids(target, eos_token_id), _StopStrings(stop_strings, tokenizer), streamer,
                         generator, return_stats)
    finally:
        if previous_config is not None:
            drafter.set_fold_config(previous_config)


def _generate(target, drafter, input_ids, budget, do_sample, temperature, top_k, top_p, eos, stops, streamer,
              generator, return_stats):
    device = input_ids.device
    prompt_len = input_ids.shape[1]
    sample_kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)

    def pick(logits: torch.Tensor) -> torch.Tensor:
        """One token ``[1]`` from ``[V]`` logits."""
        if do_sample:
            return torch.multinomial(process_logits(logits, **sample_kw), 1, generator=generator)
        return logits.argmax(-1, keepdim=True)

    taps = HiddenTaps(target, drafter.config.target_layer_ids, device=drafter.device) if drafter is not None else None
    target_cache = DynamicCache(config=getattr(target, "config", None))
    params = _forward_parameters(target)
    cache_name = "cache" if "cache" in params else "past_key_values"
    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
    if streamer is not None:
        streamer.put(input_ids.cpu())

    start = _clock(device)
    if taps is not None:
        with taps:
            out = target(input_ids=input_ids, **{cache_name: target_cache}, use_cache=True, **extra)
        pending_context = taps.features()
    else:
        out = target(input_ids=input_ids, **{cache_name: target_cache}, use_cache=True, **extra)
        pending_context = None
    last = pick(out.logits[0, -1])
    first_token_at = _clock(device)

    new_tokens: list[int] = [int(last)]
    acceptance: list[int] = []
    finish = "length"
    if streamer is not None:
        streamer.put(last.cpu())
    if int(last) in eos:
        finish = "eos"
    elif stops.cut(new_tokens, 1) is not None:
        finish = "stop_string"

    drafter_cache = drafter.new_cache(request_length=prompt_len + budget) if drafter is not None else None
    position = prompt_len  # position of `last`, the newest token, not yet seen by the target
    per_round = drafter.proposals_per_round if drafter is not None else 0

    def sample_pick(logits: torch.Tensor):
        """Draft tokens ``[m]`` drawn from ``logits [m, V]`` and the distribution q ``[m, V]`` they were drawn from."""
        probs = process_logits(logits, **sample_kw)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1), probs

    proposals: list[list[int]] = []
    while finish == "length" and len(new_tokens) < budget:
        k = min(per_round, budget - len(new_tokens) - 1)
        draft_probs = None
        if k > 0:
            # the drafter's family decides which slots predict and how (Markov head: slot by slot)
            drafts, draft_probs = drafter.propose(last, pending_context, drafter_cache, block_start=position,
                                                  limit=k, pick=sample_pick if do_sample else None)
            pending_context = None  # committed to the drafter cache by the draft
            drafts = drafts.to(device)
            k = drafts.shape[0]  # a confidence threshold may propose fewer
        else:
            drafts = last.new_empty(0)
        proposals.append(drafts.tolist())
        verify_ids = torch.cat((last, drafts))[None]
        if taps is not None:
            with taps:
                out = target(input_ids=verify_ids, **{cache_name: target_cache}, use_cache=True)
            features = taps.features()
        else:
            out = target(input_ids=verify_ids, **{cache_name: target_cache}, use_cache=True)
        logits = out.logits[0, -(k + 1):]
        # with a target split across devices the logits sit on the lm_head's device, not the input's
        drafts_there = drafts.to(logits.device)
        if do_sample:
            target_probs = process_logits(logits, **sample_kw)
            if k > 0:
                n, commit = speculative_accept(drafts_there, draft_probs.to(logits.device), target_probs, generator)
            else:
                n, commit = 0, torch.multinomial(target_probs[0], 1, generator=generator)
        else:
            n, commit = greedy_accept(drafts_there, logits)
        if k > n:
            target_cache.crop(-(k - n))
        if taps is not None:
            accepted = features[:, : n + 1]
            pending_context = accepted if pending_context is None else torch.cat((pending_context, accepted), 1)
        position += n + 1
        acceptance.append(n + 1)
        committed = commit.tolist()
        checked = len(new_tokens) + 1
        new_tokens.extend(committed)
        for i, tok in enumerate(committed):
            if tok in eos:
                del new_tokens[checked + i :]
                finish = "eos"
                break
        cut = stops.cut(new_tokens, checked)
        if cut is not None:
            del new_tokens[cut:]
            finish = "stop_string"
        if streamer is not None:
            shown = new_tokens[checked - 1 :]
            if shown:
                streamer.put(torch.tensor(shown))
        last = commit[-1:].to(device)
    end = _clock(device)
    if streamer is not None:
        streamer.end()

    sequences = torch.cat((input_ids, torch.tensor([new_tokens], dtype=input_ids.dtype, device=device)), dim=1)
    if not return_stats:
        return sequences
    return GenerationResult(
        sequences=sequences,
        acceptance_lengths=acceptance,
        ttft_s=first_token_at - start,
        decode_s=end - first_token_at,
        num_prompt_tokens=prompt_len,
        mode=drafter.fold_config.mode if drafter is not None else "ar",
        finish_reason=finish,
        proposals=proposals,
    )
