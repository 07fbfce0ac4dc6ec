"""What both entry points (:func:`fold_hf.generate`, :func:`fold_hf.generation.fast.fast_generate`) check and set
up for one request before their decode loop runs: the prompt and the token budget, and the drafter bound to the
target with the call's reading mode (restored afterwards)."""

from __future__ import annotations

import contextlib
import warnings

import torch

from ..modeling.fold_config import FoldConfig
from ..modeling.validation import validate_batch


def new_token_budget(input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                     max_new_tokens: int | None, max_length: int | None) -> int:
    """The number of tokens to generate for a batch-1, unpadded prompt ``input_ids`` ``[1, P]``
    (``max_new_tokens`` wins over ``max_length``); ValueError when the prompt or the limits do not allow one."""
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
