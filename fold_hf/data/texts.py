"""Texts from a user's own files, for counting tokens (``fold-hf draft-vocab``): files, folders walked recursively
and JSON-lines files (optionally gzipped) whose records carry a ``"text"`` field.

A folder contributes its files whose suffix is in ``extensions`` (default :data:`TEXT_EXTENSIONS`; ``"*"``: every
file); a file named directly is always read. Files that are not UTF-8 text are skipped and counted, never silently:
:class:`TextSources` reports how many texts it read and skipped, and why.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

TEXT_EXTENSIONS = frozenset(
    ".txt .md .rst .tex .org .py .pyi .c .h .cc .cpp .hpp .cu .java .kt .scala .go .rs .js .ts .tsx .jsx .rb .php .pl "
    ".sh .bash .lua .r .jl .swift .m .cs .sql .html .htm .xml .css .scss .json .yaml .yml .toml .ini .cfg .csv .tsv "
    ".log .ipynb .jsonl".split())


class TextSources:
    """The texts under ``paths``, read lazily in a stable order (sorted within each folder).

    Args:
        paths: files, folders, ``.jsonl`` / ``.jsonl.gz`` files (one ``{"text": ...}`` record a line).
        extensions: the suffixes a folder's files must have (``{"*"}``: all).

    After iterating, ``read`` counts the texts given, ``skipped`` maps a reason to the count of files skipped for it.

    Raises:
        FileNotFoundError: a path that does not exist (at construction).
    """

    def __init__(self, paths: Iterable[str | Path], extensions: Iterable[str] | None = None) -> None:
        self.paths = [Path(p) for p in paths]
        missing = [str(p) for p in self.paths if not p.exists()]
        if missing:
            raise FileNotFoundError(f"no such file or folder: {', '.join(missing)}")
        exts = set(extensions) if extensions is not None else set(TEXT_EXTENSIONS)
        self.extensions = {e if e == "*" or e.startswith(".") else f".{e}" for e in exts}
        self.read = 0
        self.skipped: dict[str, int] = {}
        self._files: list[Path] | None = None

    def files(self) -> list[Path]:
        """Every file the texts come from, in reading order (the folders walked once, on the first call)."""
        if self._files is None:
            out: list[Path] = []
            for path in self.paths:
                if path.is_dir():
                    out += [f for f in sorted(path.rglob("*")) if f.is_file() and self._wanted(f)]
                else:
                    out.append(path)
            self._files = out
        return self._files

    def _wanted(self, path: Path) -> bool:
        return "*" in self.extensions or path.suffix.lower() in self.extensions or _is_jsonl(path)

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def __iter__(self) -> Iterator[str]:
        for path in self.files():
            if _is_jsonl(path):
                yield from self._records(path)
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                self._skip("not UTF-8 text")
                continue
            except OSError:
                self._skip("unreadable")
                continue
            if "\x00" in text:
                self._skip("binary (NUL bytes)")
                continue
            if text.strip():
                self.read += 1
                yield text

    def _records(self, path: Path) -> Iterator[str]:
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        self._skip("JSON-lines record that is not JSON")
                        continue
                    text = record.get("text") if isinstance(record, dict) else None
                    if not isinstance(text, str):
                        self._skip('JSON-lines record without a "text" string')
                        continue
                    if text.strip():
                        self.read += 1
                        yield text
        except (UnicodeDecodeError, OSError):
            self._skip("unreadable JSON-lines file")

    def report(self) -> str:
        """``"N texts"`` and what was skipped, for a progress line."""
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()))
        return f"{self.read:,} texts" + (f" ({skipped} skipped)" if skipped else "")


def _is_jsonl(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".jsonl") or name.endswith(".jsonl.gz")


__all__ = ["TEXT_EXTENSIONS", "TextSources"]
