"""Markdown summary of a ``benchmarks/hybridperf_gpu.sh`` run: rows and ratios of both targets, the profile tables'
heads and the Gated DeltaNet kernel sweep.   python benchmarks/hybridperf_summary.py OUT_DIR"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _fmt(x, digits=2):
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def summary(root: Path) -> str:
    lines = [f"# hybridperf run: {root}", ""]
    tests = root / "gpu_tests.log"
    if tests.exists():
        tail = [line for line in tests.read_text().splitlines() if line.strip()][-3:]
        lines += ["## GPU tests", "", *[f"    {line}" for line in tail], ""]
    gemma = _load(root / "gemma" / "gemma.json")
    lines += ["## Gemma-4-like target (ms, p50)", ""]
    if gemma:
        rows = {(r["row"], r["context"]): r["p50_ms"] for r in gemma["rows"]}
        for (row, context), value in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            lines.append(f"- {row} @ {context}: {_fmt(value)}")
        lines += [f"- {k}: {_fmt(v)}" for k, v in gemma["ratios"].items()]
    else:
        lines.append("- no gemma.json (see gemma.log)")
    hybrid = _load(root / "hybrid" / "hybrid.json")
    lines += ["", "## Qwen3.5-9B (ms, p50)", ""]
    if hybrid:
        for r in hybrid["rows"]:
            lines.append(f"- {r['pair']} {r['row']} @ {r['context']}: {_fmt(r['p50_ms'])}")
        lines += [f"- {k}: {_fmt(v)}" for k, v in hybrid["headline"].items()]
    else:
        lines.append("- no hybrid.json (see hybrid.log)")
    for sub in ("gemma", "hybrid"):
        for table in sorted((root / sub / "profile").glob("*.txt")):
            head = table.read_text().splitlines()[:14]
            lines += ["", f"## profile {table.stem}", "", *[f"    {line}" for line in head]]
    sweep = _load(root / "hybrid" / "kernel_sweep.json")
    if sweep:
        lines += ["", "## Gated DeltaNet kernels at the 9B layer shape (us)", ""]
        for r in sweep:
            lines.append("- " + ", ".join(f"{k}={_fmt(v, 1) if isinstance(v, float) else v}" for k, v in r.items()))
    timing = root / "timing.log"
    if timing.exists():
        lines += ["", "timing: " + "; ".join(timing.read_text().split("\n")).strip("; ")]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
