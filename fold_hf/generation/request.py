"""What both entry points (:func:`fold_hf.generate`, :func:`fold_hf.generation.fast.fast_generate`) take and check
for one request before their decode loop runs: :class:`GenerationRequest` (their shared keyword arguments, read in
one place), the prompt and the token budget, and the drafter bound to the target with the call's reading mode
(restored afterwards)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ..modeling.fold_config import FoldConfig
from ..modeling.validation import validate_batch
from .sampling import Sampling, SamplingSettings
from .tracker import StopStrings, Tracker, eos_ids


@dataclasses.dataclass(frozen=True)
class GenerationRequest(SamplingSettings):
    """The settings of one call of :func:`fold_hf.generate` or :func:`fold_hf.fast_generate`: their keyword
    arguments, with the same names and defaults (``generate(target, drafter, ids, max_new_tokens=8)`` builds
    ``GenerationRequest(max_new_tokens=8)``; ``generate(..., request=GenerationRequest(...))`` passes one whole,
    keyword arguments beside it override its fields).

    Frozen (``dataclasses.replace`` derives one); the sampling settings are declared once, in
    :class:`~fold_hf.generation.sampling.SamplingSettings`.

    Attributes:
        max_new_tokens / max_length: generation limit (``max_new_tokens`` wins when both are set; ``max_length``
            counts the prompt's ``L`` columns, padding included).
        do_sample, temperature, top_k, top_p, min_p: sampling; speculative sampling keeps the target's processed
            distribution exactly. Greedy output equals the target's own greedy output.
        repetition_penalty, min_new_tokens: as in ``transformers`` (greedy or sampled).
        eos_token_id: int or list; defaults to the target's generation config.
        pad_token_id: fills a batch's rows that stopped early (default: the target's generation config's, else the
            first EOS id).
        stop_strings, tokenizer: stop once the continuation contains a stop string.
        streamer: a transformers streamer (``put``/``end``; one prompt only).
        generator: random source for sampling (a seeded generator reproduces the run; a batch's rows draw from it
            in turn), or for a batch one generator per row (a list of ``B``): row ``i`` then draws from
            ``generator[i]`` only, so it samples the tokens it samples alone with that generator.
        fold_config: reading mode for this call only (the drafter's own is restored afterwards).
        return_stats: return a :class:`GenerationResult` (a batch: a :class:`BatchGenerationResult`) instead of the
            sequences.
        exact: exact mode (docs/exact-mode.md): the target's logits for a token have the same bits whether it is
            decoded alone or in a verify block, so greedy speculative output equals greedy AR output in exact mode
            bit for bit (bf16 included). Only :func:`fold_hf.fast_generate`'s static and graphs engines on a
            Llama-family target run it; everything else refuses it with a ValueError naming why.
    """

    max_new_tokens: int | None = 256
    max_length: int | None = None
    eos_token_id: int | Sequence[int] | None = None
    pad_token_id: int | None = None
    stop_strings: Sequence[str] | str | None = None
    tokenizer: Any = None
    streamer: Any = None
    generator: torch.Generator | Sequence[torch.Generator] | None = None
    fold_config: FoldConfig | None = None
    return_stats: bool = False
    exact: bool = False

    @classmethod
    def of(cls, caller: str, request: GenerationRequest | None, settings: dict) -> GenerationRequest:
        """The request of a call to ``caller``: ``request`` (default: every default) with the keyword arguments
        ``settings`` over it; TypeError for a name that is not a setting (as Python says it for a signature)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [name for name in settings if name not in names]
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        if request is not None and not isinstance(request, cls):
            raise TypeError(f"request must be a GenerationRequest, got {type(request).__name__}")
        return dataclasses.replace(request, **settings) if request is not None else cls(**settings)

    def check(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> int:
        """New tokens per row for the prompt ``input_ids`` ``[B, L]`` (:func:`new_token_budget`), after checking
        the sampling settings: ValueError before any work for a request that cannot run."""
        budget = new_token_budget(input_ids, attention_mask, self.max_new_tokens, self.max_length)
        self.sampling()
        if isinstance(self.generator, (list, tuple)):
            rows = input_ids.shape[0]
            if len(self.generator) != rows:
                raise ValueError(f"generator: {len(self.generator)} generators for a batch of {rows} prompts (give "
                                 "one generator, or one per row)")
            for g in self.generator:
                if not isinstance(g, torch.Generator):
                    raise TypeError(f"generator: a list of torch.Generator, got a {type(g).__name__} in it")
        elif self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator (or one per row), got {type(self.generator).__name__}")
        return budget

    def row_generator(self, row: int) -> torch.Generator | None:
        """Row ``row``'s random source: :attr:`generator`, or its ``row``-th entry when there is one per row."""
        if isinstance(self.generator, (list, tuple)):
            return self.generator[row]
        return self.generator

    def for_row(self, row: int, budget: int) -> GenerationRequest:
        """This request for row ``row`` of its batch alone: ``budget`` new tokens, the row's own generator."""
        return dataclasses.replace(self, max_new_tokens=budget, max_length=None, generator=self.row_generator(row))

    def sampling(self) -> Sampling:
        return Sampling.from_settings(self.do_sample, self.temperature, self.top_k, self.top_p, self.min_p,
                                      self.repetition_penalty, self.min_new_tokens)

    def tracker(self, target) -> Tracker:
        """A fresh :class:`Tracker` for one row: its EOS ids, stop strings and streamer."""
        return Tracker(eos_ids(target, self.eos_token_id), StopStrings(self.stop_strings, self.tokenizer),
                       self.streamer)


def takes_request(function):
    """Give ``function(..., request=None, **settings)`` the signature it reads: its own parameters, then every
    :class:`GenerationRequest` field as a keyword-only parameter with its default (``help()``, ``inspect``)."""
    signature = inspect.signature(function)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fields = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
              for f in dataclasses.fields(GenerationRequest)]
    fields.sort(key=lambda p: p.name not in ("max_new_tokens", "max_length"))  # the limits first, as documented
    function.__signature__ = signature.replace(parameters=own + fields)
    return function


def new_token_budget(input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                     max_new_tokens: int | None, max_length: int | None) -> int:
    """The number of tokens to generate per row of the prompt ``input_ids`` ``[B, L]`` (left-padded by
    ``attention_mask`` ``[B, L]``, if given; ``max_new_tokens`` wins over ``max_length``, which counts the ``L``
    columns, as transformers does); ValueError when the prompt or the limits do not allow one."""
    if input_ids is None:
        raise ValueError("input_ids is required")
    validate_batch(input_ids, attention_mask)
    prompt_len = input_ids.shape[1]
    if max_new_tokens is None:
        if max_length is None:
            raise ValueError("give max_new_tokens or max_length")
        max_new_tokens = max_length - prompt_len
    if max_new_tokens < 1:
        raise ValueError(f"nothing to generate: max_new_tokens={max_new_tokens} (prompt has {prompt_len} tokens)")
    return max_new_tokens


def context_limit(target) -> int | None:
    """The target's context in tokens: ``max_position_embeddings`` of its (text) config, None when it has none."""
    config = getattr(target, "config", None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limit = getattr(text, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) and limit > 0 else None


def past_context_message(target, prompt_len: int, max_new_tokens: int) -> str | None:
    """What to warn when a request runs past the target's context (None when it fits or the target names none).

    Warn, not refuse: transformers decodes such a prompt too (its tokenizer warns "Token indices sequence length is
    longer than the specified maximum ..."), and a model may be used past its nominal context on purpose; but the
    positions past it were never trained, so the user is told once, with the limit."""
    limit = context_limit(target)
    if limit is None or prompt_len + max_new_tokens <= limit:
        return None
    where = "config.max_position_embeddings"
    if prompt_len > limit:
        return (f"fold_hf: the prompt has {prompt_len} tokens, more than the target's context of {limit} tokens "
                f"({where}); it is decoded anyway, as transformers does, but positions past {limit} were never "
                f"trained and the output may degrade: keep prompt + max_new_tokens within {limit}")
    return (f"fold_hf: the prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) run past the target's "
            f"context of {limit} tokens ({where}); the tokens past {limit} are decoded at positions the target was "
            f"never trained on: keep prompt + max_new_tokens within {limit}")


def warn_past_context(target, prompt_len: int, max_new_tokens: int, stacklevel: int = 3) -> None:
    """One UserWarning (:func:`past_context_message`) when the request runs past the target's context."""
    message = past_context_message(target, prompt_len, max_new_tokens)
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=stacklevel)


@contextlib.contextmanager
def drafter_for_call(target, drafter, fold_config: FoldConfig | None):
    """Bind ``drafter`` (None: AR) to ``target`` and read in ``fold_config`` for this call only: the drafter's own
    config is back when the block ends, however it ends."""
    if drafter is not None:
        drafter.bind_target(target)
    previous = None
    if fold_config is not None:
        if drafter is None:
            raise ValueError("fold_config was given without a drafter")
        previous = drafter.fold_config
        drafter.set_fold_config(fold_config)
    try:
        yield
    finally:
        if previous is not None:
            drafter.set_fold_config(previous)
