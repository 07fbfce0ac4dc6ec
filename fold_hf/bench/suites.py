"""The request suites of a benchmark run, built from evaluation sources only (:mod:`fold_hf.data`).

* ``code``: an installed package's source arranged like Long Code Arena: other files first, files of the cut
  file's directory nearest, the cut file's prefix last; the target continues the file.
* ``books``: spans of held-out Gutenberg plays; the target continues the text.
* ``retrieval``: a span whose end restarts a passage from its first quarter, so the continuation copies content
  thousands of tokens back (where the far memory matters).
* ``mixed``: the evaluation side of the data mix (:mod:`fold_hf.data.mix`), six kinds of text (Python, C/C++,
  markup, structured data, logs, prose), always nested; each request is tagged with its kind and its suite is
  ``mixed-<kind>`` (:func:`build_mixed_suite`).

A request is ``{"id", "suite", "tier", "input_ids", "new_tokens"}`` (plus ``"family"`` in nested suites); files
of requests are JSON lines. Nothing heavy is imported at module level (the CLI reads :data:`SUITES`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SUITES = ("code", "books", "retrieval", "mixed")
MIXED_KINDS = ("python", "c", "markup", "structured", "logs", "prose")
MIXED_TIERS = (1024, 2048, 4096, 8192, 16384, 32704)  # 32,704 + 64 new tokens = a 32K context
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
    if suite == "mixed":
        return build_mixed_suite(tokenizer, tiers, per_tier, new_tokens, seed, bos_token_id=bos_token_id)[0]
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

    def neighbours():
        near = [i for i in by_dir.get(str(Path(path).parent), []) if i != cut_idx]
        return near, [i for i in range(len(files)) if i not in near and i != cut_idx]

    return _continue_after_context(tokenizer, rng, tier, f"# file: {path}\n", text, neighbours,
                                   lambda i: _encode(tokenizer, f"# file: {files[i][0]}\n{files[i][1]}\n"),
                                   min_lines=40, margin=10)


def _continue_after_context(tokenizer, rng, length: int, header: str, text: str, neighbours, encode_piece,
                            min_lines: int, margin: int) -> list[int] | None:
    """The last ``length`` tokens of: other documents (``neighbours()`` gives (near, far); near ones last, right
    before the cut one), then ``header`` and ``text`` up to a line in its second half (at least ``margin`` lines
    before its end); None when ``text`` has fewer than ``min_lines`` lines or everything is shorter than ``length``."""
    lines = text.splitlines(keepends=True)
    if len(lines) < min_lines:
        return None
    cut = rng.randrange(len(lines) // 2, len(lines) - margin)
    tail = _encode(tokenizer, header + "".join(lines[:cut]))
    if len(tail) >= length:
        return tail[-length:]
    near, far = neighbours()
    rng.shuffle(near)
    rng.shuffle(far)
    context: list[int] = []
    for item in near + far:
        context = encode_piece(item) + context
        if len(context) + len(tail) >= length:
            break
    ids = context + tail
    return ids[-length:] if len(ids) >= length else None


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


def build_mixed_suite(tokenizer, tiers=MIXED_TIERS, per_tier: int = 48, new_tokens: int = 128, seed: int = 0,
                      kinds=MIXED_KINDS, bos_token_id: int | None = None, mix=None, train_texts=None,
                      threshold: float | None = None, log=None) -> tuple[list[dict], dict]:
    """The ``mixed`` suite: ``per_tier`` requests at every tier, kinds in turn (request k is of kind
    ``kinds[k % len(kinds)]``), nested (request k of every tier is the last ``tier`` tokens of one input built at
    the longest tier; with ``bos_token_id``, that token then the last ``tier - 1``).

    An input is Long-Code-Arena-like for every kind: evaluation documents of the kind, those of the cut document's
    group (package, directory, page) nearest, then the cut document's head up to a line in its second half; the
    target continues it.

    ``mix``: a :class:`fold_hf.data.mix.Mix` holding the evaluation side (default: gathered here);
    ``train_texts``: the training side to check against (default: gathered here with the same caps as
    ``python -m fold_hf.data.mix export``). Evaluation documents sharing more than ``threshold`` of their n-grams with
    it (:func:`fold_hf.data.overlap.contaminated`) are dropped before any request is built, and named in the info.

    Returns:
        (requests, info): requests as :func:`build_suite`'s plus ``"kind"``, ``"suite"`` = ``mixed-<kind>``;
        info ``{"kinds": {kind: families}, "eval_documents", "dropped_for_overlap": {name: fraction},
        "dropped_per_kind", "missing_sources"}``.
    """
    import sys

    from ..data.mix import gather
    from ..data.overlap import THRESHOLD, contaminated

    log = log or (lambda m: print(m, file=sys.stderr))
    if mix is None:
        mix = gather(splits=("eval",), log=log)
    docs = [d for d in mix.side("eval") if d.kind in kinds]
    if train_texts is None:
        train_texts = (d.text for d in gather(splits=("train",), log=log).docs)
    dirty = contaminated({d.name: d.text for d in docs}, train_texts, THRESHOLD if threshold is None else threshold)
    kind_of = {d.name: d.kind for d in docs}
    dropped = {k: sum(kind_of[n] == k for n in dirty) for k in kinds}
    if dirty:
        log(f"mixed suite: {len(dirty)} of {len(docs)} evaluation documents share more than {threshold or THRESHOLD:.0%} "
            f"of their 13-grams with the training side and are left out (per kind: {dropped}): "
            + ", ".join(f"{n} ({f:.0%})" for n, f in sorted(dirty.items())[:10]) + (" ..." if len(dirty) > 10 else ""))
    by_kind: dict[str, list] = {}
    for d in docs:
        if d.name not in dirty:
            by_kind.setdefault(d.kind, []).append(d)
    absent = [k for k in kinds if k not in by_kind]
    if absent:
        raise ValueError(f"the mix's evaluation side has no {', '.join(absent)} documents here "
                         f"(missing sources: {mix.missing or 'none'}); pass kinds= without them")
    longest = max(tiers)
    rng = random.Random(f"mixed-{seed}")
    cache: dict[str, list[int]] = {}
    families = []
    for k in range(per_tier):
        kind = kinds[k % len(kinds)]
        for _ in range(200):
            ids = _mixed_request(tokenizer, by_kind[kind], rng, longest, cache)
            if ids is not None:
                break
        else:
            raise ValueError(f"cannot build a {kind} request of {longest} tokens from {len(by_kind[kind])} evaluation "
                             "documents")
        families.append((kind, ids))
    requests = [{"id": f"mixed-{tier}-{k}", "suite": f"mixed-{kind}", "kind": kind, "tier": tier,
                 "input_ids": ids[-tier:] if bos_token_id is None else [bos_token_id] + ids[len(ids) - tier + 1:],
                 "new_tokens": new_tokens, "family": f"mixed-{longest}-{k}"}
                for tier in sorted(tiers) for k, (kind, ids) in enumerate(families)]
    info = {"kinds": {kind: sum(kd == kind for kd, _ in families) for kind in kinds},
            "eval_documents": sum(map(len, by_kind.values())), "dropped_for_overlap": dirty,
            "dropped_per_kind": dropped,
            "missing_sources": mix.missing}
    return requests, info


def _mixed_request(tokenizer, docs, rng, length: int, cache: dict) -> list[int] | None:
    cut_doc = rng.choice(docs)

    def neighbours():
        return ([d for d in docs if d.group == cut_doc.group and d.name != cut_doc.name],
                [d for d in docs if d.group != cut_doc.group])

    def encode_piece(d):
        if d.name not in cache:
            cache[d.name] = _encode(tokenizer, f"=== {d.name} ===\n{d.text}\n\n")
        return cache[d.name]

    return _continue_after_context(tokenizer, rng, length, f"=== {cut_doc.name} ===\n", cut_doc.text, neighbours,
                                   encode_piece, min_lines=8, margin=2)


def save_requests(requests: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for req in requests:
            fh.write(json.dumps(req) + "\n")


def load_requests(path: str | Path) -> list[dict]:
    """The requests of a saved suite: one JSON object per line, plain or gzipped (``.gz``, as the GPU staging carries
    them)."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]
