"""Overlap between training and evaluation documents: shared word n-grams, sampled the same way on both sides.

A document's shingles are the CRC-32 hashes of its whitespace-separated word 13-grams, kept when the hash is
divisible by ``keep`` (a deterministic 1-in-``keep`` sample: both sides keep the same n-grams, so a span of ``m``
shared words shows up as about ``(m - n + 1) / keep`` shared shingles, and the sets stay small). An evaluation
document is contaminated when more than ``threshold`` of its shingles occur in the training side; licence headers
and common idioms stay well under the default 0.2, a pasted training file does not.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

NGRAM = 13
KEEP = 4
THRESHOLD = 0.2


def shingles(text: str, n: int = NGRAM, keep: int = KEEP) -> set[int]:
    """Hashes of the word ``n``-grams of ``text`` kept by the 1-in-``keep`` rule."""
    words = text.split()
    out = set()
    for i in range(len(words) - n + 1):
        h = zlib.crc32(" ".join(words[i : i + n]).encode("utf-8", "surrogatepass"))
        if h % keep == 0:
            out.add(h)
    return out


def train_shingles(texts: Iterable[str], n: int = NGRAM, keep: int = KEEP) -> set[int]:
    found: set[int] = set()
    for text in texts:
        found |= shingles(text, n, keep)
    return found


def overlap_fraction(text: str, train: set[int], n: int = NGRAM, keep: int = KEEP) -> float:
    """Share of ``text``'s shingles present in ``train`` (0.0 for a text too short to have any)."""
    own = shingles(text, n, keep)
    return len(own & train) / len(own) if own else 0.0


def contaminated(eval_docs: dict[str, str], train_texts: Iterable[str], threshold: float = THRESHOLD,
                 n: int = NGRAM, keep: int = KEEP) -> dict[str, float]:
    """``{name: shared fraction}`` of the evaluation documents over ``threshold`` against the training texts."""
    train = train_shingles(train_texts, n, keep)
    out = {}
    for name, text in eval_docs.items():
        frac = overlap_fraction(text, train, n, keep)
        if frac > threshold:
            out[name] = frac
    return out
