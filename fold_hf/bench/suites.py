"""The request suites of a benchmark run, built from evaluation sources only (:mod:`fold_hf.data`).

* ``code``: an installed package's source arranged like Long Code Arena: other files first, files of the cut
  file's directory nearest, the cut file's prefix last; the target continues the file.
* ``books``: spans of held-out Gutenberg plays; the target continues the text.
* ``retrieval``: a span whose end restarts a passage from its first quarter, so the continuation copies content
  thousands of tokens back (where the far memory matters).

A request is ``{"id", "suite", "tier", "input_ids", "new_tokens"}`` (plus ``"family"`` in nested suites); files
of requests are JSON lines. Nothing heavy is imported at module level (the CLI reads :data:`SUITES`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SUITES = ("code", "books", "retrieval")
DEFAULT_TIERS = (1024, 2048, 4096, 8192)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_suite(tokenizer, suite: str, tiers, per_tier: int, new_tokens: int, seed: int = 0,
                package: str = "transformers", nested: bool = False, bos_token_id: int | None = None) -> list[dict]:
    """Requests ``{"id", "suite", "tier", "input_ids", "new_tokens"}`` of exactly ``tier`` prompt tokens.

    ``nested``: request ``k`` of every tier is the last ``tier`` tokens of one input built at the longest tier, so
    every tier continues the same text at the same point and differences between tiers come from the input's
    length alone (by default each tier draws its own texts). Requests then also carry ``"family"``, the id of
    that longest input. In the retrieval suite a short suffix may no longer hold the distant content the
    continuation copies: there the shorter tiers are a different task, not only a shorter input.

    ``bos_token_id``: every request starts with this token followed by the last ``tier - 1`` tokens of its text
    (for targets trained with BOS first, e.g. Gemma); nested tiers then share their text's suffixes after it."""
    if bos_token_id is not None:
        plain = build_suite(tokenizer, suite, tiers, per_tier, new_tokens, seed, package, nested)
        return [{**req, "input_ids": [bos_token_id] + req["input_ids"][1:]} for req in plain]
    if nested:
        longest = build_suite(tokenizer, suite, [max(tiers)], per_tier, new_tokens, seed, package)
        return [{**req, "id": f"{suite}-{tier}-{k}", "tier": tier, "input_ids": req["input_ids"][-tier:],
                 "family": req["id"]}
                for tier in tiers for k, req in enumerate(longest)]
    from ..data import book_split, package_sources, shakespeare_texts

    rng = random.Random(f"{suite}-{seed}")
    requests = []
    if suite == "books":
        _, held = book_split(shakespeare_texts())
        docs = [_encode(tokenizer, t) for t in held.values()]
    else:
        files = package_sources(package)
        by_dir: dict[str, list[int]] = {}
        for i, (path, _) in enumerate(files):
            by_dir.setdefault(str(Path(path).parent), []).append(i)
    for tier in tiers:
        made = 0
        attempts = 0
        while made < per_tier:
            attempts += 1
            if attempts > per_tier * 2000:  # retrieval needs a function early in a file; most start with a licence
                raise ValueError(f"cannot build {per_tier} {suite} requests of {tier} tokens")
            if suite == "books":
                doc = rng.choice(docs)
                if len(doc) < tier + new_tokens:
                    continue
                start = rng.randrange(0, len(doc) - tier - new_tokens)
                ids = doc[start : start + tier]
            elif suite == "code":
                ids = _code_request(tokenizer, files, by_dir, rng, tier)
                if ids is None:
                    continue
            else:
                ids = _retrieval_request(tokenizer, files, rng, tier)
                if ids is None:
                    continue
            requests.append({"id": f"{suite}-{tier}-{made}", "suite": suite, "tier": tier, "input_ids": ids,
                             "new_tokens": new_tokens})
            made += 1
    return requests


def _code_request(tokenizer, files, by_dir, rng, tier):
    cut_idx = rng.randrange(len(files))
    path, text = files[cut_idx]
    lines = text.splitlines(keepends=True)
    if len(lines) < 40:
        return None
    cut = rng.randrange(len(lines) // 2, len(lines) - 10)
    tail = _encode(tokenizer, f"# file: {path}\n" + "".join(lines[:cut]))
    if len(tail) >= tier:
        return tail[-tier:]
    near = [i for i in by_dir.get(str(Path(path).parent), []) if i != cut_idx]
    far = [i for i in range(len(files)) if i not in near and i != cut_idx]
    rng.shuffle(near)
    rng.shuffle(far)
    context: list[int] = []
    for i in near + far:  # nearest files are placed last, right before the cut file
        piece = _encode(tokenizer, f"# file: {files[i][0]}\n{files[i][1]}\n")
        context = piece + context
        if len(context) + len(tail) >= tier:
            break
    ids = context + tail
    return ids[-tier:] if len(ids) >= tier else None


def _retrieval_request(tokenizer, files, rng, tier, cue_chars: int = 80):
    """A code span whose end restarts a function from its first quarter: the answer is ~tier tokens back."""
    text = ""
    while len(text) < tier * 8:
        path, body = files[rng.randrange(len(files))]
        text += f"# file: {path}\n{body}\n"
    return retrieval_prompt(tokenizer, text, rng, tier, cue_chars)


def retrieval_prompt(tokenizer, text: str, rng, tier: int, cue_chars: int = 80) -> list[int] | None:
    """``tier`` token ids: the start of ``text`` whose end restarts a function (``def``) from its first quarter
    (``rng`` picks which), so the continuation copies content ~``tier`` tokens back; None when ``text`` is too short
    or has no function there."""
    marker = "\n\n# (the first function above, repeated)\n"
    body_ids = _encode(tokenizer, text)[:tier]
    body_text = tokenizer.decode(body_ids)
    quarter = len(body_text) // 4
    # the front of the body is trimmed to make room for the cue, so the function starts after the first 1/16
    starts = [m for m in range(len(body_text) // 16, quarter) if body_text.startswith(("\ndef ", "\n    def "), m)]
    if not starts:
        return None
    s = rng.choice(starts) + 1
    cue = body_text[s : s + cue_chars]
    ids = body_ids + _encode(tokenizer, marker + cue)
    return ids[-tier:] if len(ids) >= tier else None


def save_requests(requests: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for req in requests:
            fh.write(json.dumps(req) + "\n")


def load_requests(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]
