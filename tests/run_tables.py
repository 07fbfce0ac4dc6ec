"""A results README's marked tables: a table between ``<!-- NAME: what it is -->`` and ``<!-- /NAME -->`` lines, read
back as its body's cells (the run tests recompute the same cells from the run's files), and the readers of a run's
per-request records those tests recompute them from."""

from __future__ import annotations

import json
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


def records(path: Path) -> list[dict]:
    """The records of a ``runs.jsonl`` (``fold-hf bench``), one per line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def per_request(path: Path) -> dict[tuple[str, str], dict]:
    """(request, method) -> the record, each given ``speed`` = TPOT(AR) / TPOT (the AR of its own process)."""
    rows = records(path)
    ar = {r["request"]: r["tpot_s"] for r in rows if r["method"] == "ar"}
    return {(r["request"], r["method"]): dict(r, speed=ar[r["request"]] / r["tpot_s"]) for r in rows}


def requests_at(runs: dict, tier: int) -> list[str]:
    """The requests of ``tier`` that ran FOLD α=2, sorted."""
    return sorted({r for (r, m), v in runs.items() if v["tier"] == tier and m == "fold-a2"})


def ci(values: list[float]) -> tuple[float, float]:
    """The 95% percentile bootstrap of the mean the summary keys use (2,000 resamples, seed 0)."""
    from fold_hf.bench.summary import _bootstrap_mean_ci

    return _bootstrap_mean_ci(values)


def fmt_ci(mean: float, low: float, high: float, sign: bool = False) -> str:
    """``mean [low, high]`` to 2 places (signed with ``sign``)."""
    f = "{:+.2f}" if sign else "{:.2f}"
    return f"{f.format(mean)} [{f.format(low)}, {f.format(high)}]"
