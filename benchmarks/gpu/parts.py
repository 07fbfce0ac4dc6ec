"""What one GPU call carries, and how many parts a staged file needs beside it.

A device call carries the working tree: tracked files that are present, untracked files git does not ignore, and the
paths named in ``carry``, at most 64 MiB in all. ``stage-gemma3.sh`` cuts the GGUF into as few parts as fit beside the
tree (less 8 MB of slack for the tree to grow): run it after ``slim.sh out`` so the committed drafters (48 MB) are not counted.

    python3 benchmarks/gpu/parts.py tree              bytes the working tree carries now
    python3 benchmarks/gpu/parts.py parts BYTES       parts of a BYTES file that fit one per call beside that tree
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 1024 * 1024
# room for the tree to grow between staging and the calls (results folders land in between: on 2026-12-06 the
# slim tree had grown 2.3 MB since the parts were cut, and they no longer fitted)
SLACK = 8_000_000


def carried_files(root: str | Path) -> list[Path]:
    """Tracked files present in the work tree plus untracked files git does not ignore."""
    root = Path(root)
    names = []
    for args in (["ls-files", "-z"], ["ls-files", "-z", "--others", "--exclude-standard"]):
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True).stdout
        names += [n for n in out.decode().split("\0") if n]
    return [root / n for n in dict.fromkeys(names) if (root / n).is_file() and not (root / n).is_symlink()]


def carried_bytes(root: str | Path) -> int:
    return sum(p.stat().st_size for p in carried_files(root))


def parts_needed(payload: int, tree: int, limit: int = LIMIT, slack: int = SLACK) -> int:
    """Fewest parts of a ``payload``-byte file such that one part (``split -n N`` makes parts of at most
    ``ceil(payload / N)`` bytes) plus the tree plus the slack fit in ``limit``; ValueError when no part fits."""
    free = limit - tree - slack
    if free <= 1_000_000:
        raise ValueError(f"the work tree ({tree} bytes) leaves {free} bytes for parts in a {limit}-byte call: "
                         "run benchmarks/gpu/slim.sh out first")
    return -(-payload // free)


def main(argv: list[str]) -> int:
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if argv[:1] == ["tree"]:
        print(carried_bytes(root))
    elif argv[:1] == ["parts"] and len(argv) == 2:
        print(parts_needed(int(argv[1]), carried_bytes(root)))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main(sys.argv[1:]))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(1)
