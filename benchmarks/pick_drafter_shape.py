"""Choose a drafter shape by measured speed x τ (issue #38): the bench results of each candidate drafter, side by side.

    python benchmarks/pick_drafter_shape.py NAME=RESULTS_DIR[:DRAFTER_DIR] ... [--method fold-a2] [--tiers 4096 32704]

Each RESULTS_DIR is a `fold-hf bench --drafter DRAFTER_DIR` run (its summary.json) on the same requests. Per
candidate: τ and speedup over AR (mean of TPOT_AR / TPOT per request, 95% bootstrap CI) of METHOD at each tier,
their mean over the tiers, and the drafter's size (model.safetensors) against the 30 MB bound. The speedup already
holds both factors (τ tokens per round at the cost of a round with this drafter), so the pick is the highest mean
speedup among the shapes within the bound; the table says when its CI overlaps the runner-up's at a tier.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MAX_BYTES = 30_000_000


def shape_table(candidates: dict[str, tuple[Path, Path | None]], method: str, tiers: list[int]) -> list[dict]:
    """One row per candidate: ``{"name", "bytes", "within_bound", "tiers": {tier: row}, "speedup", "tau"}``."""
    out = []
    for name, (results, drafter) in candidates.items():
        rows = json.loads((results / "summary.json").read_text())["rows"]
        at = {r["tier"]: r for r in rows if r["method"] == method and r["tier"] in tiers}
        missing = sorted(set(tiers) - set(at))
        if missing:
            raise ValueError(f"{name}: {results / 'summary.json'} has no {method} rows at tiers {missing}")
        size = (drafter / "model.safetensors").stat().st_size if drafter else None
        out.append({"name": name, "bytes": size, "within_bound": size is None or size <= MAX_BYTES, "tiers": at,
                    "speedup": sum(r["speedup"] for r in at.values()) / len(at),
                    "tau": sum(r["tau"] for r in at.values()) / len(at)})
    return sorted(out, key=lambda r: (not r["within_bound"], -r["speedup"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="+", metavar="NAME=RESULTS_DIR[:DRAFTER_DIR]")
    parser.add_argument("--method", default="fold-a2")
    parser.add_argument("--tiers", type=int, nargs="+", default=[4096, 32704])
    args = parser.parse_args(argv)
    candidates = {}
    for item in args.candidates:
        name, _, paths = item.partition("=")
        results, _, drafter = paths.partition(":")
        candidates[name] = (Path(results), Path(drafter) if drafter else None)
    table = shape_table(candidates, args.method, args.tiers)
    for r in table:
        cells = "  ".join(f"{t}: τ {x['tau']:.2f} speedup {x['speedup']:.2f} [{x['speedup_ci_low']:.2f}, "
                          f"{x['speedup_ci_high']:.2f}]" for t, x in sorted(r["tiers"].items()))
        size = "size unknown" if r["bytes"] is None else f"{r['bytes'] / 1e6:.1f} MB"
        print(f"{r['name']:>12}  mean speedup {r['speedup']:.3f}  mean τ {r['tau']:.2f}  {size}"
              f"{'' if r['within_bound'] else ' (over 30 MB)'}  {cells}")
    best = table[0]
    if not best["within_bound"]:
        print("no candidate within 30 MB")
        return 1
    print(f"pick: {best['name']}")
    if len(table) > 1:
        second = table[1]
        overlap = [t for t in args.tiers if best["tiers"][t]["speedup_ci_low"] <= second["tiers"][t]["speedup_ci_high"]]
        if overlap:
            print(f"  its speedup CI overlaps {second['name']}'s at tiers {overlap}: the pick is not settled there")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
