"""The results folder of a drafter retrained on the data mix (issue #38) against the one it replaced: its README's two
by-tier tables ("**retrained\\ndrafter**" then "**replaced drafter**", before "Per kind"), recomputed from the
committed ``new/run/runs.jsonl`` and ``old/run/runs.jsonl``. Used by the Gemma-3 and SmolLM2 drafter tests."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

KINDS = {f"mixed-{k}" for k in ("python", "c", "markup", "structured", "logs", "prose")}


def assert_tables_are_the_runs(results: Path, tiers: tuple[int, int], per_tier: int | None = None) -> None:
    """For each drafter and each of fold-a2 / dflash / window, the row ``| method | τ / speedup× | ... |`` of its
    table: mean τ and mean TPOT(AR) / TPOT request by request over every kind at each tier (every kind present; with
    ``per_tier``, exactly that many requests)."""
    readme = (results / "README.md").read_text()
    tables = readme.split("**retrained\ndrafter**")[1].split("Per kind")[0].split("**replaced drafter**")
    assert len(tables) == 2
    for name, table in zip(("new", "old"), tables):
        runs = [json.loads(line) for line in (results / name / "run" / "runs.jsonl").read_text().splitlines()]
        ar = {r["request"]: r["tpot_s"] for r in runs if r["method"] == "ar"}
        for method in ("fold-a2", "dflash", "window"):
            cells = []
            for tier in tiers:
                sel = [r for r in runs if r["method"] == method and r["tier"] == tier]
                assert {r["suite"] for r in sel} == KINDS
                assert per_tier is None or len(sel) == per_tier, (name, method, tier, len(sel))
                tau = statistics.mean(r["tau"] for r in sel)
                speed = statistics.mean(ar[r["request"]] / r["tpot_s"] for r in sel)
                cells.append(f"{tau:.2f} / {speed:.2f}×")
            assert f"| {method} | " + " | ".join(cells) + " |" in table, (name, method)
