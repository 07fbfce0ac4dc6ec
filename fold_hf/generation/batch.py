"""Batches of prompts (issue 35): a left-padded ``input_ids`` ``[B, L]`` split into its rows, and the rows' results
put back together as transformers' batched ``generate`` returns them (:func:`assemble`). The fast loop runs the rows
in batched rounds where it can (:mod:`fold_hf.generation.fast.batched`); everywhere else :func:`decode_rows` decodes
each row alone, one after another, on the path a single prompt takes, and says once why. Both entry points
(:func:`fold_hf.generate`, :func:`fold_hf.fast_generate`) and the routed ``target.generate`` come here for ``B > 1``
or a padded prompt (docs/generate-paths.md, "Batches")."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import torch

from .request import GenerationRequest
from .stats import BatchGenerationResult, GenerationResult

_WARNED = False  # the "rows are decoded one after another" warning is said once per process


def needs_rows(input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> bool:
    """Whether a request takes the row-by-row path: more than one row, or a row with (left) padding."""
    if input_ids is None or input_ids.dim() != 2:
        return False
    return input_ids.shape[0] > 1 or (attention_mask is not None and not bool(torch.all(attention_mask != 0)))


def pad_token_id(target, request: GenerationRequest) -> int | None:
    """What fills a row that stopped early: the request's ``pad_token_id``, else the target's generation config's,
    else the first EOS id (the request's, else the generation config's); None when there is none of them."""
    config = getattr(target, "generation_config", None)
    for value in (request.pad_token_id, getattr(config, "pad_token_id", None), request.eos_token_id,
                  getattr(config, "eos_token_id", None)):
        if isinstance(value, torch.Tensor):
            value = value.flatten().tolist()
        if isinstance(value, (list, tuple)):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return None


def unpadded_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Each row of the left-padded ``input_ids`` ``[B, L]`` without its padding: ``[1, P_i]`` (already validated)."""
    return [input_ids[i : i + 1] if attention_mask is None else input_ids[i : i + 1, attention_mask[i] != 0]
            for i in range(input_ids.shape[0])]


def check_batch(target, request: GenerationRequest, batch: int) -> int | None:
    """What fills a batch's rows that stop early (:func:`pad_token_id`), after refusing what a batch cannot take."""
    if request.streamer is not None and batch > 1:
        raise ValueError(f"streamer with a batch of {batch} prompts: a streamer takes one prompt (transformers' "
                         "streamers refuse batches too); decode the rows one call each to stream them")
    pad = pad_token_id(target, request)
    if pad is None and batch > 1 and request.stop_strings:
        raise ValueError("a batch with stop_strings needs a pad_token_id to fill the rows that stop early: the "
                         "target's generation config has no pad_token_id and no eos_token_id; pass pad_token_id=...")
    return pad


def decode_rows(decode_one: Callable[[torch.Tensor, GenerationRequest], GenerationResult], target,
                input_ids: torch.Tensor, attention_mask: torch.Tensor | None, request: GenerationRequest,
                budget: int, why: str = "batched rounds are not built for this path"):
    """Decode each row of ``input_ids`` ``[B, L]`` (left padding marked by ``attention_mask``'s zeros, already
    validated) alone with ``decode_one(row [1, P_i], request) -> GenerationResult``, ``budget`` new tokens at most
    per row, rows in order (a shared sampling generator serves row 0 first). ``why``: why the rows do not run in
    batched rounds (said once per process).

    Returns:
        what :func:`assemble` returns.
    """
    pad = check_batch(target, request, input_ids.shape[0])
    _warn_once(input_ids.shape[0], why)
    results = [decode_one(row, dataclasses.replace(request.for_row(i, budget), return_stats=True))
               for i, row in enumerate(unpadded_rows(input_ids, attention_mask))]
    return assemble(input_ids, results, request, pad, batched=False)


def assemble(input_ids: torch.Tensor, results: list[GenerationResult], request: GenerationRequest, pad: int | None,
             batched: bool):
    """The batch's result from each row's own :class:`GenerationResult`.

    Returns:
        ``[B, L + N]`` sequences (``N`` the most new tokens of any row; each row's left padding kept, a row that
        stopped early filled on the right with ``pad``), or with ``request.return_stats`` a
        :class:`BatchGenerationResult` (``B > 1``) or, for one padded row, its :class:`GenerationResult` whose
        ``sequences`` are ``[1, L + N]`` and ``num_prompt_tokens`` is ``L``.
    """
    batch, width = input_ids.shape
    longest = max(result.num_new_tokens for result in results)
    if pad is None and any(result.num_new_tokens < longest for result in results):  # no EOS ids: cannot happen
        raise ValueError("rows stopped at different lengths and there is no pad_token_id to fill them: pass "
                         "pad_token_id=...")
    sequences = input_ids.new_full((batch, width + longest), pad if pad is not None else 0)
    sequences[:, :width] = input_ids
    for i, result in enumerate(results):
        sequences[i, width : width + result.num_new_tokens] = result.new_tokens[0].to(sequences.device)
    if not request.return_stats:
        return sequences
    if batch == 1:
        return dataclasses.replace(results[0], sequences=sequences, num_prompt_tokens=width)
    return BatchGenerationResult(sequences=sequences, rows=results, num_prompt_tokens=width, batched=batched)


def _warn_once(batch: int, why: str) -> None:
    global _WARNED
    if batch > 1 and not _WARNED:
        _WARNED = True
        warnings.warn(f"fold_hf: batch of {batch} prompts: rows are decoded one after another ({why}; issue 35)",
                      UserWarning, stacklevel=4)
