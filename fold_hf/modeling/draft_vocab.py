"""A draft vocabulary: the drafter proposes only from a subset of the target's vocabulary (frequency-ranked, as in
FR-Spec, Zhao et al. 2025, arXiv 2502.14856).

Why: a z-lab drafter computes its proposals with the target's ``lm_head`` over ``B - 1`` slots, so a round reads the
whole ``[V, H]`` head a second time (Gemma-3-270M: 262,144 x 640 = 336 MB in bf16, about a tenth of the pair's FOLD
round at 32K; the Qwen3.5-9B shape: 248,320 x 4,096 = 2.03 GB, a third of what a round reads beyond the AR step;
SmolLM2 on a 2-core CPU: ~17 ms of a ~43 ms draft). The tokens a text actually uses are a small part of a large
vocabulary, so the head's rows of the ``V'`` most frequent tokens give nearly the same proposals for ``V' / V`` of
the bytes.

Output is unchanged: greedy verification compares the proposals with the target's own argmax over the whole
vocabulary, and the target's correction token comes from its full distribution, so greedy output equals AR's
whatever the subset. Sampling stays exact: the drafter samples from ``q`` restricted to the subset (zero elsewhere)
and speculative sampling accepts ``x ~ q`` with ``min(1, p(x) / q(x))`` and resamples from ``max(p - q, 0)``, which is
exact for any ``q`` (outside the subset the residual is ``p`` itself). Only τ can move (a token outside the subset
is never proposed).

Shapes: ``ids [V']`` long, sorted, unique, in ``[0, V)``; :meth:`DraftVocab.logits` maps ``hidden [..., H]`` to
``[..., V]`` with the subset's logits at ``ids`` and ``-inf`` elsewhere, so every picker (argmax, a sampler's
``q``, a DSpark Markov bias) works on full-vocabulary rows as before.

Saved beside a drafter as ``draft_vocab.json`` (``FoldDrafter.save_pretrained`` writes it when one is in use,
``from_pretrained`` reads it back): ``{"vocab_size": V, "ids": [...], "source": "..."}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from ..kernels.common import is_sharded, local
from ..kernels.gemm.cpu import linear  # F.linear, or a packed GEMM for a multi-row CPU fp32 product

FILE_NAME = "draft_vocab.json"
ROW_ALIGN = 64  # the head's subset rows are padded with zero rows to a multiple of this (see DraftVocab.head_rows)


def token_counts(tokenizer, texts: Iterable[str], vocab_size: int, progress=None) -> torch.Tensor:
    """``[vocab_size]`` float64 counts of the tokens ``tokenizer`` gives ``texts`` (no special tokens added);
    ``progress``: anything with ``update(1)``, called once a text (a tqdm bar). Raises ValueError when the tokenizer
    gives an id outside ``[0, vocab_size)`` (a tokenizer of another model than the head's)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if ids:
            ids = torch.as_tensor(ids, dtype=torch.long)
            if int(ids.max()) >= vocab_size or int(ids.min()) < 0:
                bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
                raise ValueError(f"the tokenizer gave token id {bad}, outside the vocabulary [0, {vocab_size}): is it "
                                 f"the tokenizer of the model whose head has {vocab_size} rows?")
            counts += torch.bincount(ids, minlength=vocab_size).double()
        if progress is not None:
            progress.update(1)
    return counts


def eos_ids(tokenizer) -> list[int]:
    """The tokenizer's end-of-sequence ids (none, one or several): the ids a draft vocabulary keeps whatever their count
    (a drafter that can propose the end of a text keeps its τ there)."""
    eos = tokenizer.eos_token_id
    return [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))


class DraftVocab:
    """The token ids ``[V']`` a drafter may propose, out of a vocabulary of ``vocab_size``."""

    def __init__(self, ids: Sequence[int] | torch.Tensor, vocab_size: int, source: str = "") -> None:
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        if ids.numel() == 0:
            raise ValueError("a draft vocabulary needs at least one token id")
        if int(vocab_size) <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        if int(ids.min()) < 0 or int(ids.max()) >= int(vocab_size):
            raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size}); got {int(ids.min())}.."
                             f"{int(ids.max())}")
        unique = torch.unique(ids)  # sorted
        if unique.numel() != ids.numel():
            raise ValueError(f"draft vocabulary ids must be unique ({ids.numel() - unique.numel()} repeated)")
        self.ids = unique
        self.vocab_size = int(vocab_size)
        self.source = source
        self._weights: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __len__(self) -> int:
        return int(self.ids.numel())

    def __repr__(self) -> str:
        return f"DraftVocab({len(self)} of {self.vocab_size} tokens{', ' + self.source if self.source else ''})"

    # ------------------------------------------------------------------ building
    @classmethod
    def from_counts(cls, counts: torch.Tensor, size: int, always: Iterable[int] = (), source: str = "") -> "DraftVocab":
        """The ``size`` most frequent ids of ``counts [V]`` (ties: the lower id first), plus ``always`` (e.g. the
        end-of-sequence ids: a drafter that can propose the end of a text keeps its τ there)."""
        counts = torch.as_tensor(counts).flatten().to(torch.float64)
        V = counts.numel()
        always = sorted({int(t) for t in always})
        if not 0 < size <= V:
            raise ValueError(f"size must be in 1..{V} (the vocabulary), got {size}")
        # rank by count, then by id (a stable sort of ids 0..V-1 by descending count)
        order = torch.sort(-counts, stable=True).indices
        chosen = set(order[:size].tolist()) | {t for t in always if 0 <= t < V}
        return cls(sorted(chosen), V, source=source)

    @classmethod
    def from_texts(cls, tokenizer, texts: Iterable[str], size: int, vocab_size: int | None = None,
                   always: Iterable[int] = (), source: str = "") -> "DraftVocab":
        """Count the tokens ``tokenizer`` gives ``texts`` (no special tokens added) and keep the ``size`` most frequent
        (:meth:`from_counts`). ``vocab_size``: the target's (its ``lm_head`` rows; default ``len(tokenizer)``)."""
        counts = token_counts(tokenizer, texts, int(vocab_size if vocab_size is not None else len(tokenizer)))
        n = int(counts.sum())
        if n == 0:
            raise ValueError("no tokens in the texts given: a draft vocabulary needs counts")
        return cls.from_counts(counts, size, always=always, source=source or f"top {size} of {n:,} tokens")

    def coverage(self, counts: torch.Tensor) -> float:
        """The share of the tokens counted in ``counts [vocab_size]`` (:func:`token_counts`) whose id is in the subset:
        how often a drafter proposing from it *could* propose the right token on such text (nan without tokens)."""
        total = float(counts.sum())
        return float(counts[self.ids].sum()) / total if total else float("nan")

    # ------------------------------------------------------------------ files
    def save(self, directory) -> Path:
        """Write ``directory/draft_vocab.json`` (the folder made if missing); returns its path."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / FILE_NAME
        path.write_text(json.dumps({"vocab_size": self.vocab_size, "source": self.source,
                                    "ids": self.ids.tolist()}) + "\n")
        return path

    @classmethod
    def load(cls, path) -> "DraftVocab":
        path = Path(path)
        if path.is_dir():
            path = path / FILE_NAME
        data = json.loads(path.read_text())
        missing = {"vocab_size", "ids"} - set(data)
        if missing:
            raise ValueError(f"{path}: a draft vocabulary file needs {sorted(missing)}")
        return cls(data["ids"], data["vocab_size"], source=data.get("source", ""))

    # ------------------------------------------------------------------ the head
    def check_head(self, weight: torch.Tensor) -> None:
        if weight.dim() != 2 or weight.shape[0] != self.vocab_size:
            raise ValueError(f"the draft vocabulary was built for {self.vocab_size} tokens, but the lm_head it would "
                             f"read has {tuple(weight.shape)} (rows = tokens)")

    def head_rows(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows [V'', H], ids [V'])`` on ``weight``'s device and dtype: the head's rows of the subset followed by
        zero rows up to ``V''``, the next multiple of :data:`ROW_ALIGN` (an output row of ``V'`` elements, 32,769 for
        the committed files, is misaligned for cuBLAS's tensor-core GEMMs, which then fall back to a scalar kernel
        ~5x slower at 56 rows); copied once per weight and kept for the vocabulary's life (a CUDA graph captured later
        reads these very tensors).

        A head sharded over tensor-parallel ranks (a DTensor, as transformers' ``tp_plan`` leaves a column-parallel
        lm_head) is gathered whole once here (a collective: every rank sets the same vocabulary at the same point, as
        ranks running the same program do) and the subset's rows kept on every rank, so the proposals' logits need no
        collective at all."""
        sharded = is_sharded(weight)
        part = local(weight)
        key = (part.data_ptr(), part.device, part.dtype, tuple(weight.shape), part._version)
        hit = self._weights.get(key)
        if hit is None:
            self.check_head(weight)
            if part.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the draft vocabulary's head rows must exist before a CUDA graph is captured: "
                                   "call drafter.use_draft_vocab(...) after drafter.bind_target(target)")
            ids = self.ids.to(part.device)
            padded = -(-len(self) // ROW_ALIGN) * ROW_ALIGN
            with torch.no_grad():
                whole = weight.detach().full_tensor() if sharded else weight.detach()
                rows = part.new_zeros(padded, weight.shape[1])
                rows[: len(self)] = whole.index_select(0, ids)
                hit = (rows, ids)
            self._weights[key] = hit  # all kept: a captured graph may read an earlier head's rows by address
        return hit

    def logits(self, weight: torch.Tensor, hidden: torch.Tensor, softcap: float | None = None) -> torch.Tensor:
        """``[..., V]`` logits of ``hidden [..., H]`` through the head rows of the subset (``softcap``: ``c * tanh(z /
        c)`` as the full head would apply), ``-inf`` at every id outside it."""
        rows, ids = self.head_rows(weight)
        # the owner whose in-place writes repack `rows`: this rank's part of a sharded head
        sub = linear(hidden.to(rows.device, rows.dtype), rows, owners=(local(weight),), tag="draft_vocab")  # [..., V'']
        sub = sub[..., : len(self)]  # the zero rows' logits dropped
        if softcap is not None:
            sub = torch.tanh(sub / softcap) * softcap
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, ids, sub)


__all__ = ["FILE_NAME", "ROW_ALIGN", "DraftVocab", "eos_ids", "token_counts"]
