"""Token choice on the device: the logits processing of ``generate``, greedy or speculative sampling, capturable.

Everything here is tensor arithmetic with fixed shapes and no host read, so the fast loop runs it inside its
CUDA graphs. Random numbers come in as a buffer of uniforms in ``[0, 1)`` that the loop fills from a
``torch.Generator`` before each round (:meth:`Sampling.uniforms`), so a seeded run reproduces on every engine,
and a captured graph only reads a buffer.

Processing (what ``transformers`` applies, in its order): the repetition penalty over the tokens seen so far
(prompt and generated; a logit ``s`` becomes ``s * r`` when negative, ``s / r`` otherwise), the
``min_new_tokens`` mask (EOS ids at ``-inf`` while fewer new tokens exist), then, when sampling, temperature,
top-k, top-p (drop a token once the mass ranked above it reaches ``top_p``; the top token stays) and min-p
(drop tokens whose probability is below ``min_p`` times the top one's). Greedy takes the argmax of the
processed logits (penalty and mask only, as ``transformers`` does).

Speculative sampling (Leviathan et al., Chen et al.): proposal ``d_i`` drawn from the drafter's processed
distribution ``q_i`` is accepted with probability ``min(1, p_i(d_i) / q_i(d_i))``; the first rejection is replaced
by a draw from ``normalize(max(0, p_i - q_i))``; when every proposal is accepted (or the budget ends the block),
one more token is drawn from ``p``. Any ``q`` keeps the target's distribution, so a drafter may propose in
parallel (one ``q`` per slot from one forward) or step by step (a Markov head whose ``q_i`` depends on
``d_{i-1}``): the drafter only has to return the tokens it proposed and the ``q`` it drew them from.

Uniform layout of a round with ``K`` proposal slots: ``u[0:K]`` draw the proposals, ``u[K:2K]`` decide the
acceptances, ``u[2K]`` draws the round's last token; the same layout on every engine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from ..kernels.select.naive import verify_greedy_torch
from ..modeling.rope import compute_dtype

@dataclass(frozen=True)
class SamplingSettings:
    """The token-choice settings with ``transformers``' names and defaults, declared once: a
    :class:`~fold_hf.generation.request.GenerationRequest` carries them as the caller gave them, :class:`Sampling`
    checks them and keeps one spelling per behaviour."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_new_tokens: int | None = None


SAMPLING_SETTINGS = tuple(f.name for f in fields(SamplingSettings))


@dataclass(frozen=True)
class Sampling(SamplingSettings):
    """How a request picks tokens (greedy when ``do_sample`` is False; the penalty and ``min_new_tokens`` apply to
    both, as in ``transformers``); ``min_new_tokens`` is an int (None: 0)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_new_tokens", int(self.min_new_tokens or 0))
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        # one spelling per behaviour (captured steps are keyed by the Sampling): settings that change nothing are None
        for name, off in (("top_k", 0), ("top_p", 1.0), ("min_p", 0.0), ("repetition_penalty", 1.0)):
            if getattr(self, name) == off:
                object.__setattr__(self, name, None)
        if not self.do_sample and self.temperature != 1.0:
            object.__setattr__(self, "temperature", 1.0)

    @classmethod
    def from_settings(cls, do_sample=False, temperature=None, top_k=None, top_p=None, min_p=None,
                      repetition_penalty=None, min_new_tokens=None) -> "Sampling":
        """From ``generate``-style settings (None = unset; greedy drops the sampling-only ones)."""
        if not do_sample:
            temperature = top_k = top_p = min_p = None
        return cls(do_sample=bool(do_sample), temperature=1.0 if temperature is None else float(temperature),
                   top_k=top_k, top_p=top_p, min_p=min_p, repetition_penalty=repetition_penalty,
                   min_new_tokens=int(min_new_tokens or 0))

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty is not None and self.repetition_penalty != 1.0

    def uniforms(self, count: int, device, generator: torch.Generator | None, out: torch.Tensor | None = None):
        """``count`` uniforms on ``device`` from ``generator`` (its own device; the default generator when None),
        written into ``out`` when given (the graphs' static buffer)."""
        source = generator.device if generator is not None else torch.device(device)
        u = torch.rand(count, generator=generator, device=source, dtype=torch.float64)
        if out is None:
            return u.to(device)
        out.copy_(u, non_blocking=True)
        return out


def process(logits: torch.Tensor, sampling: Sampling, seen: torch.Tensor | None = None,
            eos_rows: torch.Tensor | None = None) -> torch.Tensor:
    """Processed scores ``[n, V]`` (fp32, fp64 for fp64 logits) from logits ``[n, V]``.

    Args:
        seen: ``[n, V]`` or ``[V]`` bool, tokens the repetition penalty applies to (row by row).
        eos_rows: ``[n, V]`` bool, entries to set to ``-inf`` (the ``min_new_tokens`` mask).
    """
    scores = logits.to(compute_dtype(logits.dtype))
    if sampling.penalized and seen is not None:
        r = sampling.repetition_penalty
        scores = torch.where(seen, torch.where(scores < 0, scores * r, scores / r), scores)
    if eos_rows is not None:
        scores = scores.masked_fill(eos_rows, -float("inf"))
    if not sampling.do_sample:
        return scores
    if sampling.temperature != 1.0:
        scores = scores / sampling.temperature
    scores = filter_top_k_top_p(scores, sampling.top_k, sampling.top_p)
    if sampling.min_p is not None and sampling.min_p > 0:
        probs = scores.softmax(-1)
        scores = scores.masked_fill(probs < sampling.min_p * probs.amax(-1, keepdim=True), -float("inf"))
    return scores


def _processes(sampling: Sampling, seen, eos_rows) -> bool:
    """Whether greedy :func:`process` changes the logits' values (a penalty or a mask applies); when it does not, it
    only converts them to fp32, which changes no argmax (bf16 / fp16 to fp32 is exact)."""
    return (sampling.penalized and seen is not None) or eos_rows is not None


def greedy_ops(device):
    """The greedy argmax / verify of logits on ``device``: :func:`fold_hf.kernels.greedy_select_ops` (the Triton
    kernels on CUDA, ``torch.argmax`` elsewhere)."""
    from ..kernels import greedy_select_ops

    return greedy_select_ops(device)


def filter_top_k_top_p(scores: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """Scores ``[n, V]`` with the tokens top-k and top-p drop set to ``-inf`` (transformers' rules, in its order).

    Top-k keeps every token scoring at least the k-th largest score (ties with it included). Top-p then ranks the
    remaining tokens by score, ties by token index (a higher index ranks higher: transformers' stable ascending
    sort puts the lower index first and drops from the bottom), and drops a token when the probability mass ranked
    strictly above it reaches ``top_p``; the top token stays.

    With top-k the rule is decided from the k candidates of one ``topk`` (:func:`_filter_candidates`: no sort
    of the vocabulary); top-p alone sorts the vocabulary (:func:`_filter_sorted`). Both are fixed-shape and
    capturable.
    """
    vocab = scores.shape[-1]
    k = top_k if top_k is not None and 0 < top_k < vocab else None
    p = top_p if top_p is not None and top_p < 1.0 else None
    if k is not None:
        return _filter_candidates(scores, k, p)
    if p is not None:
        return _filter_sorted(scores, p)
    return scores


def _filter_sorted(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p over the whole vocabulary ``[n, V]``, as transformers states it (stable ascending sort, cumulative
    mass, drop while it is <= 1 - top_p, keep the last)."""
    ordered, order = torch.sort(scores, dim=-1, stable=True)
    cumulative = _chunked_cumsum(ordered.softmax(-1), ordered.dtype)[0]
    drop_sorted = cumulative <= 1 - top_p
    drop_sorted[..., -1] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, -float("inf"))


def _filter_candidates(scores: torch.Tensor, k: int, top_p: float | None) -> torch.Tensor:
    """Top-k then top-p ``[n, V]`` decided on the ``k`` candidates of ``torch.topk`` (``k < V``).

    Every token scoring above the k-th score s_k is a candidate; tokens tied with s_k may lie outside the
    candidates, so their group is handled by counting (one pass over the vocabulary): with probability pi each,
    mass M ranked above the group and m members, the group keeps its c = ceil((top_p - M) / pi) highest-index
    members (clamped to [0, m]; at least one when it is the top group). When the cut falls above s_k, it falls
    inside the candidates: the group of the last kept candidate keeps its kept members (the higher indices).
    Either way the kept set is {score > t} plus the c highest-index tokens scoring exactly t, applied in a few
    elementwise passes and one integer cumsum (so which tied tokens ``topk`` returned does not matter).
    """
    values = torch.topk(scores, k, dim=-1).values  # [n, k], descending (which tied tokens: unspecified)
    kth = values[:, -1:]
    if top_p is None:
        return scores.masked_fill(scores < kth, -float("inf"))
    top = values[:, :1]
    weights = (values - top).exp()  # [n, k]
    tied_kth = (scores == kth).sum(-1, keepdim=True)  # the k-th group over the whole vocabulary
    outside = tied_kth - (values == kth).sum(-1, keepdim=True)  # its members that are not candidates
    total = weights.sum(-1, keepdim=True) + outside * (kth - top).exp()
    probs = weights / total
    above = torch.cat((probs.new_zeros(probs.shape[0], 1), probs.cumsum(-1)[:, :-1]), -1)  # mass ranked above
    high = values > kth  # a prefix: the candidates above the k-th group
    kept = (above < top_p) & high  # a prefix too (above is non-decreasing)
    n_high, n_kept = high.sum(-1, keepdim=True), kept.sum(-1, keepdim=True)
    # cut inside the candidates above s_k: the last kept candidate's group keeps its kept members
    last = (n_kept - 1).clamp_min(0)
    t_in = values.gather(-1, last)
    c_in = ((values == t_in) & kept).sum(-1, keepdim=True)
    # otherwise the cut falls in the k-th group
    mass_high = (probs * high).sum(-1, keepdim=True)
    pi = ((kth - top).exp() / total).clamp_min(torch.finfo(probs.dtype).tiny)
    c_kth = torch.ceil((top_p - mass_high) / pi).clamp(0, None)
    c_kth = torch.minimum(c_kth, tied_kth.to(c_kth.dtype)).long()
    c_kth = torch.where(n_high == 0, c_kth.clamp_min(1), c_kth)  # the top token stays
    inside = n_kept < n_high
    threshold = torch.where(inside, t_in, kth)
    count = torch.where(inside, c_in, c_kth)
    at = scores == threshold
    rank, members = _chunked_cumsum(at, torch.int32)  # members of the threshold group with index <= t, and all of them
    keep = (scores > threshold) | (at & (rank > members - count))  # the `count` highest-index members
    return torch.where(keep, scores, -float("inf"))


DRAW_CHUNK = 256


def _chunked_cumsum(values: torch.Tensor, dtype: torch.dtype):
    """(inclusive cumulative sum ``[n, V]`` in ``dtype`` of ``values`` ``[n, V]`` along each row, row totals
    ``[n, 1]``).

    Two levels (inside chunks of :data:`DRAW_CHUNK`, then over the chunk totals): a scan along a whole 128K-entry
    row runs one thread block per row on a GPU (about 200 us for 17 rows on an H200), the chunked one is a few
    parallel passes. Float sums round in a different order than one scan (same value in exact arithmetic)."""
    n, vocab = values.shape
    pad = -vocab % DRAW_CHUNK
    if pad:
        values = torch.nn.functional.pad(values.to(dtype), (0, pad))
    inner = values.reshape(n, -1, DRAW_CHUNK).cumsum(-1, dtype=dtype)  # [n, chunks, C]
    totals = inner[..., -1]  # [n, chunks]
    prefix = totals.cumsum(-1, dtype=dtype)
    before = torch.cat((prefix.new_zeros(n, 1), prefix[:, :-1]), -1)  # mass of the earlier chunks
    return (inner + before[..., None]).reshape(n, -1)[:, :vocab], prefix[:, -1:]


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws ``[n]`` from unnormalised probabilities ``[n, V]`` with uniforms ``u`` ``[n]``.

    Two levels, so no scan runs along a whole vocabulary row: cumulative sums inside chunks of
    :data:`DRAW_CHUNK` entries, then over the chunk totals; the chunk whose cumulative total first exceeds
    ``u * total``, then the entry inside it. The threshold stays below the total mass, so a zero-probability
    entry is never returned (up to rounding between the two levels, where the entry is clamped to the chunk)."""
    n, vocab = probs.shape
    pad = -vocab % DRAW_CHUNK
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    inner = probs.reshape(n, -1, DRAW_CHUNK).cumsum(-1)  # [n, chunks, C]
    chunk_cdf = inner[..., -1].to(torch.float64).cumsum(-1)  # [n, chunks]
    threshold = u.to(torch.float64)[:, None] * chunk_cdf[:, -1:]
    chunk = (chunk_cdf <= threshold).sum(-1, keepdim=True).clamp_max(chunk_cdf.shape[-1] - 1)  # [n, 1]
    before = torch.cat((chunk_cdf.new_zeros(n, 1), chunk_cdf[:, :-1]), -1).gather(-1, chunk)  # mass of earlier chunks
    rest = threshold - before  # [n, 1]
    row = inner.gather(1, chunk[:, :, None].expand(n, 1, DRAW_CHUNK))[:, 0]  # [n, C]
    offset = (row.to(torch.float64) <= rest).sum(-1).clamp_max(DRAW_CHUNK - 1)
    return (chunk[:, 0] * DRAW_CHUNK + offset).clamp_max(vocab - 1)


def pick(logits: torch.Tensor, sampling: Sampling, u: torch.Tensor | None = None, seen=None, eos_rows=None):
    """Tokens ``[n]`` and, when sampling, the distributions ``q`` ``[n, V]`` they were drawn from.

    This is the picker a drafter step receives: a parallel drafter calls it once on all its slots' logits, a
    step-by-step drafter once per slot (with that slot's uniform). Greedy on CUDA takes the argmax kernels of
    :func:`fold_hf.kernels.greedy_select_ops` (on the raw logits when nothing processes them), elsewhere
    ``torch.argmax`` of the processed scores."""
    if not sampling.do_sample:
        ops = greedy_ops(logits.device)
        unprocessed = ops.backend == "triton" and not _processes(sampling, seen, eos_rows)
        return ops.argmax_rows(logits if unprocessed else process(logits, sampling, seen, eos_rows)), None
    scores = process(logits, sampling, seen, eos_rows)
    q = scores.softmax(-1)
    return draw(q, u), q


def seen_rows(seen: torch.Tensor, proposals: torch.Tensor) -> torch.Tensor:
    """``[K + 1, V]`` tokens seen before each verify row: ``seen`` ``[V]`` plus proposals ``0 .. i-1`` for row i."""
    k = proposals.shape[0]
    steps = torch.zeros(k + 1, seen.shape[0], dtype=torch.int32, device=seen.device)
    if k:
        steps[1:].scatter_(1, proposals[:, None].to(seen.device), 1)
    return (steps.cumsum(0) > 0) | seen


def min_new_mask(eos_onehot: torch.Tensor, generated: torch.Tensor, rows: int, min_new_tokens: int):
    """``[rows, V]`` bool: EOS entries of the rows that predict new token ``generated + i < min_new_tokens``.

    Args:
        eos_onehot: ``[V]`` bool; generated: ``[1]`` long tensor (tokens generated before row 0)."""
    index = generated + torch.arange(rows, device=eos_onehot.device)
    return (index < min_new_tokens)[:, None] & eos_onehot[None, :]


def verify_sampled(target_scores: torch.Tensor, proposals: torch.Tensor, q: torch.Tensor, u: torch.Tensor,
                   limit: torch.Tensor | int):
    """Speculative sampling of one round on the device (no host read).

    Args:
        target_scores: ``[K + 1, V]`` processed target scores (:func:`process`) at the last committed token and
            each proposal.
        proposals: ``[K]`` proposed tokens, drawn from ``q``.
        q: ``[K, V]`` the drafter's processed distributions (rows sum to one).
        u: ``[2K + 1]`` uniforms; ``u[K:2K]`` decide acceptances, ``u[2K]`` the last token (``u[:K]`` drew the
            proposals).
        limit: how many proposals may be accepted (the budget; a long tensor ``[1]`` or an int <= K).

    Returns:
        (accepted count n ``[1]`` long, the round's last token ``[1]`` long): commit ``proposals[:n]`` then it.
    """
    k = proposals.shape[0]
    p = target_scores.softmax(-1)
    limit = torch.as_tensor(limit, device=p.device).view(1)
    if k:
        index = proposals[:, None]
        q_d = q.gather(-1, index).squeeze(-1).to(p.dtype)
        accept = u[k : 2 * k].to(p.dtype) * q_d < p[:k].gather(-1, index).squeeze(-1)  # u < p/q, no division
        matched = accept.long().cumprod(0).sum().view(1)
    else:
        matched = torch.zeros(1, dtype=torch.long, device=p.device)
    n = torch.minimum(matched, limit)
    p_n = p.index_select(0, n)  # [1, V]
    if k:
        # a rejection at slot n (< K) resamples from max(0, p_n - q_n); otherwise (all accepted, or the budget
        # ended the block) the last token comes from p_n itself
        rejected = (matched < limit).to(p.dtype)
        q_n = q.index_select(0, n.clamp_max(k - 1)).to(p.dtype)
        residual = (p_n - q_n * rejected).clamp_min(0)
        p_n = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    return n, draw(p_n, u[2 * k :])


def verify_greedy(target_scores: torch.Tensor, proposals: torch.Tensor, limit: torch.Tensor | int):
    """Greedy verification on the device by ``torch.argmax``: (accepted n ``[1]``, the target's argmax at every row
    ``[K + 1]``) (:func:`fold_hf.kernels.select.naive.verify_greedy_torch`; :meth:`TokenChoice.verify` takes
    :func:`greedy_ops`, the Triton kernels on CUDA)."""
    return verify_greedy_torch(target_scores, proposals, limit)


class TokenChoice:
    """One request's token choice on its device: the :class:`Sampling`, the random source, the tokens seen so far
    (for the repetition penalty) and the EOS mask (for ``min_new_tokens``).

    Its tensors can be a session's persistent buffers (``buffers``: ``seen`` ``[V]`` bool, ``eos`` ``[V]`` bool,
    ``u`` ``[2K + 1]`` fp64, ``q`` ``[K, V]``), refilled in place per request, so captured graphs that read them
    stay valid.

    Args:
        sampling: the request's settings.
        generator: random source for sampling (None: torch's default generator of the device).
        vocab: V; device: where the target's logits are.
        prompt: ``[1, P]`` prompt ids (seen by the penalty).
        eos: EOS ids (masked while fewer than ``min_new_tokens`` new tokens exist).
        proposals: K, proposal slots per round.
    """

    def __init__(self, sampling: Sampling, generator, vocab: int, device, prompt: torch.Tensor, eos,
                 proposals: int, buffers: dict | None = None) -> None:
        self.sampling, self.generator, self.proposals = sampling, generator, proposals
        device = torch.device(device)
        self.device = device
        b = buffers if buffers is not None else {}
        self.seen = b.get("seen")
        if self.seen is None:
            self.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.seen.zero_()
        if sampling.penalized:
            self.seen[prompt.reshape(-1).to(device)] = True
        self.eos = b.get("eos")
        if self.eos is None:
            self.eos = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.eos.zero_()
        eos = [e for e in eos if 0 <= e < vocab]
        self.masks_eos = sampling.min_new_tokens > 0 and bool(eos)
        if self.masks_eos:
            self.eos[torch.tensor(eos, device=device)] = True
        self.u = b.get("u")
        if self.u is None:
            self.u = torch.zeros(2 * proposals + 1, dtype=torch.float64, device=device)
        self.q = b.get("q")

    # ------------------------------------------------------------------ host-driven (every engine)
    def refill(self) -> None:
        """Draw this round's uniforms (sampling only): one host call, outside any captured graph."""
        if self.sampling.do_sample:
            self.sampling.uniforms(self.u.shape[0], self.device, self.generator, out=self.u)

    def first(self, logits: torch.Tensor) -> torch.Tensor:
        """The prefill's token ``[1]`` from the last position's logits ``[V]``."""
        logits = logits.to(self.device)
        u = self.sampling.uniforms(1, self.device, self.generator) if self.sampling.do_sample else None
        mask = self.eos_rows(0, 1)
        seen = self.seen if self.sampling.penalized else None
        token = pick(logits[None], self.sampling, u, seen, mask)[0]
        self.observe(token)
        return token

    def observe(self, committed: torch.Tensor) -> None:
        """Mark committed tokens as seen (eager engines; the static step returns :meth:`observed` instead)."""
        if self.sampling.penalized:
            self.seen[committed.reshape(-1).to(self.device)] = True

    # ------------------------------------------------------------------ device-side (capturable)
    def eos_rows(self, generated, rows: int):
        """``[rows, V]`` min_new_tokens mask for rows predicting new tokens ``generated + i`` (None when off)."""
        if not self.masks_eos:
            return None
        generated = torch.as_tensor(generated, device=self.device).view(1)
        return min_new_mask(self.eos, generated, rows, self.sampling.min_new_tokens)

    def picker(self, generated=0):
        """The function a drafter step calls to turn its logits ``[n, V]`` for slots ``first_slot ..`` into
        (proposals ``[n]``, q ``[n, V]`` or None); draws with ``u[first_slot : first_slot + n]``."""
        sampling = self.sampling
        seen = self.seen if sampling.penalized else None

        def choose(logits: torch.Tensor, first_slot: int = 0):
            n = logits.shape[0]
            seen_here = seen.to(logits.device) if seen is not None else None
            u = self.u[first_slot : first_slot + n].to(logits.device) if sampling.do_sample else None
            return pick(logits, sampling, u, seen_here)

        return choose

    def verify(self, logits: torch.Tensor, proposals: torch.Tensor, q: torch.Tensor | None, limit, generated=0,
               used: int | None = None):
        """(accepted n ``[1]``, the round's last token ``[1]``) from the target's logits ``[k + 1, V]`` at the last
        committed token and each of the ``k`` proposals.

        ``used`` proposal slots of the round's K (default k): sampling reads the acceptance uniforms of those
        slots and the last one, keeping the layout of the class docstring whatever k is.

        Greedy runs :func:`greedy_ops`: on CUDA the Triton argmax + prefix match (two launches, on the raw logits
        when no penalty or mask applies), elsewhere ``torch.argmax`` of the processed scores and
        :func:`verify_greedy`."""
        sampling = self.sampling
        k = proposals.shape[0]
        seen = seen_rows(self.seen, proposals) if sampling.penalized else None
        eos_rows = self.eos_rows(generated, k + 1)
        if not sampling.do_sample:
            ops = greedy_ops(logits.device)
            unprocessed = ops.backend == "triton" and not _processes(sampling, seen, eos_rows)
            scores = logits if unprocessed else process(logits, sampling, seen, eos_rows)
            return ops.greedy_verify(scores, proposals, limit)
        scores = process(logits, sampling, seen, eos_rows)
        K = self.proposals
        u = torch.cat((self.u[:k], self.u[K : K + k], self.u[2 * K :]))
        return verify_sampled(scores, proposals, q, u, limit)

    def observed(self, proposals: torch.Tensor, n: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The seen mask ``[V]`` after committing ``proposals[:n]`` and ``last`` (functional, for captured steps)."""
        counts = torch.zeros(self.seen.shape[0], dtype=torch.int32, device=self.seen.device)
        keep = (torch.arange(proposals.shape[0], device=proposals.device) < n).int()
        counts.scatter_add_(0, proposals, keep)
        counts.scatter_add_(0, last, torch.ones_like(last, dtype=torch.int32))
        return self.seen | (counts > 0)
