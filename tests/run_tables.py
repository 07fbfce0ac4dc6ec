"""A results README's marked tables: a table between ``<!-- NAME: what it is -->`` and ``<!-- /NAME -->`` lines, read
back as its body's cells (the run tests recompute the same cells from the run's files)."""

from __future__ import annotations

import re
from pathlib import Path


def marked_table(readme: Path, name: str) -> list[list[str]]:
    """The cells of the table marked ``name`` in ``readme``, row by row, past its header and rule."""
    text = readme.read_text()
    block = re.search(rf"<!-- {name}: .*? -->\n(.*?)<!-- /{name} -->", text, re.S).group(1)
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in block.strip().splitlines()[2:]]


def slowest_row_terms(report: dict, method: str, batch: int = 8) -> dict:
    """The terms of a batched run's ceilings over batched AR, stated here independently of
    ``benchmarks/batched_ceiling.py``: from the ``suite`` rows of a ``batched_bench.py`` report at ``batch``, AR's row
    and ``method``'s, AR's prefill and set-up (``seconds - decode_seconds``, shared by every method), AR's step
    (``decode_seconds`` over groups × new tokens), the slowest row of each group of ``batch`` consecutive requests,
    and the rounds a batch of them takes (new / that row's τ, summed over the groups)."""
    rows = [r for r in report["rows"] if r.get("section", "suite") == "suite" and r["batch"] == batch]
    ar, = [r for r in rows if r["system"] == "ar"]
    row, = [r for r in rows if r["system"] == method]
    groups, new = ar["requests"] // batch, ar["new_tokens"]
    slowest = [min(row["tau_rows"][batch * g:batch * (g + 1)]) for g in range(groups)]
    return {"ar": ar, "row": row, "prefill": ar["seconds"] - ar["decode_seconds"],
            "step": ar["decode_seconds"] / (groups * new), "slowest": slowest, "rounds": sum(new / t for t in slowest)}
