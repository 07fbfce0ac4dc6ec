"""Greedy token selection on logits rows in pure torch: the twins of :mod:`fold_hf.kernels.select.triton` and the
path every device without Triton takes.

* :func:`argmax_rows_reference`, :func:`greedy_verify_reference`: the kernels' two-level chunk plan stated in torch
  (per chunk of ``block`` entries: the maximum and its first index, or NaN and the first NaN's index; then over the
  chunks in order), with the kernels' outputs; the oracles of their tests next to an independent Python loop;
* :func:`argmax_rows_torch`, :func:`verify_greedy_torch`, :func:`greedy_verify_torch`: what the decode loops ran
  before the kernels (``torch.argmax``, then eq / cumprod / sum / minimum and the gather of the round's last token),
  kept as the CPU path so its results do not change.

All of them are ``torch.argmax``'s semantics: ties to the smallest index, NaN as the maximum (the first NaN of a row),
a row of ``-inf`` gives 0.
"""

from __future__ import annotations

import torch

from ..common import compute_dtype

BLOCK = 2048  # the kernels' default chunk (fold_hf.kernels.select.triton.BLOCK)
_INT32_MAX = torch.iinfo(torch.int32).max


def _as_limit(limit, device) -> torch.Tensor:
    return torch.as_tensor(limit, device=device).view(1)


def _first_max(values: torch.Tensor, indices: torch.Tensor, valid: torch.Tensor):
    """Over the last dim: (NaN where a NaN is present else the maximum, the index of the first NaN else of the
    first maximum); ``indices`` the entries' indices, ``valid`` the entries that exist."""
    nan = values.isnan() & valid
    first_nan = torch.where(nan, indices, _INT32_MAX).amin(-1)
    clean = values.masked_fill(nan | ~valid, -float("inf"))
    best = clean.amax(-1)
    first = torch.where((clean == best[..., None]) & valid, indices, _INT32_MAX).amin(-1)
    has_nan = first_nan < _INT32_MAX
    return torch.where(has_nan, torch.full_like(best, float("nan")), best), torch.where(has_nan, first_nan, first)


def argmax_partials_reference(scores: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 1: (chunk values ``[n, chunks]`` fp32 (fp64 for fp64 scores), first indices ``[n, chunks]`` long) of
    ``scores`` ``[n, V]``: each chunk's maximum and the index of its first occurrence, or NaN and its first NaN's."""
    rows, vocab = scores.shape
    chunks = -(-vocab // block)
    x = scores.to(compute_dtype(scores.dtype))
    x = torch.nn.functional.pad(x, (0, chunks * block - vocab), value=-float("inf")).view(rows, chunks, block)
    offsets = torch.arange(chunks * block, device=scores.device).view(chunks, block)
    return _first_max(x, offsets.expand(rows, chunks, block), (offsets < vocab).expand(rows, chunks, block))


def argmax_rows_reference(scores: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """``[n]`` long: each row's first maximum (NaN as the maximum) of ``scores`` ``[n, V]``, by chunk partials
    (:func:`argmax_partials_reference`) reduced over the chunks in order, as the kernels do."""
    if scores.dim() != 2 or scores.shape[1] == 0:
        raise ValueError(f"scores must be [n, V] with V > 0, got {tuple(scores.shape)}")
    values, indices = argmax_partials_reference(scores, block)
    return _first_max(values, indices, torch.ones_like(indices, dtype=torch.bool))[1]


def greedy_verify_reference(scores: torch.Tensor, proposals: torch.Tensor, limit, block: int = BLOCK,
                            return_posterior: bool = False):
    """Twin of :func:`fold_hf.kernels.select.triton.greedy_verify_triton`.

    Args:
        scores: ``[K + 1, V]`` target scores; proposals: ``[K]`` long; limit: int or long tensor ``[1]`` (>= 0).

    Returns:
        (n ``[1]`` long = min(leading proposals equal to the rows' argmax, limit), ``posterior[n]`` ``[1]`` long),
        and ``posterior`` ``[K + 1]`` long with ``return_posterior``.
    """
    posterior = argmax_rows_reference(scores, block)
    k = proposals.shape[0]
    rows = torch.arange(k, device=posterior.device)
    matched = torch.where(proposals.to(posterior.device) != posterior[:k], rows, k).amin(-1, keepdim=True) if k \
        else posterior.new_zeros(1)
    n = torch.minimum(matched, _as_limit(limit, posterior.device))
    final = posterior.gather(0, n)
    return (n, final, posterior) if return_posterior else (n, final)


def argmax_rows_torch(scores: torch.Tensor) -> torch.Tensor:
    """``[n]`` long: ``scores.argmax(-1)`` of ``scores`` ``[n, V]`` (the path without Triton)."""
    return scores.argmax(-1)


def verify_greedy_torch(scores: torch.Tensor, proposals: torch.Tensor, limit):
    """Greedy verification by ``torch.argmax`` (the path without Triton): (accepted n ``[1]`` long, the argmax of
    every row ``[K + 1]`` long) from ``scores`` ``[K + 1, V]``, ``proposals`` ``[K]`` and ``limit`` (int or long
    tensor ``[1]``)."""
    posterior = scores.argmax(-1)
    k = proposals.shape[0]
    matched = (proposals == posterior[:k]).long().cumprod(0).sum().view(1)
    n = torch.minimum(matched, _as_limit(limit, posterior.device))
    return n, posterior


def greedy_verify_torch(scores: torch.Tensor, proposals: torch.Tensor, limit):
    """(n ``[1]`` long, the round's last token ``posterior[n]`` ``[1]`` long): :func:`verify_greedy_torch` and the
    gather, the signature of :func:`fold_hf.kernels.select.triton.greedy_verify_triton`."""
    n, posterior = verify_greedy_torch(scores, proposals, limit)
    return n, posterior.gather(0, n)


__all__ = ["argmax_partials_reference", "argmax_rows_reference", "argmax_rows_torch", "greedy_verify_reference",
           "greedy_verify_torch", "verify_greedy_torch"]
