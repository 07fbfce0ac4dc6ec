"""Choose a drafter (a shape, or a retrained one against the committed one) by measured speed x τ (issue #38): the
bench runs of each candidate drafter on the same requests, side by side and request by request.

    python benchmarks/pick_drafter_shape.py NAME=RESULTS_DIR[:DRAFTER_DIR] ... [--method fold-a2] [--tiers 4096 32704]
        [--csv rows.csv]

Each RESULTS_DIR is a `fold-hf bench --drafter DRAFTER_DIR` results folder (its ``runs.jsonl`` files, found anywhere
under it: ``run/runs.jsonl``, ``shard*/runs.jsonl``) on the same requests. Per candidate and tier, every suite of the
requests pooled: τ of METHOD, its speedup over AR (mean over requests of TPOT(AR) / TPOT, AR of the same request in
the same run) and its whole-call speedup (TTFT + n x TPOT of AR over the same of METHOD: what a user waits for, the
prefill included), each with a 95% bootstrap CI; their mean over the tiers; the drafter's size (model.safetensors)
against the 30 MB bound. The speedup already holds both factors (τ tokens per round at the cost of a round with
this drafter), so the pick is the highest mean speedup among the candidates within the bound. Then every other
candidate against the pick on the requests both ran: Δτ = τ(pick) - τ(other) and speed = TPOT(other) / TPOT(pick)
with 95% bootstrap CIs (pairing removes the text-to-text spread, so these say more than overlapping per-candidate
CIs); the table says when the speed CI includes 1 (the pick is not settled there).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fold_hf.bench.summary import _bootstrap_mean_ci, rows_by_request  # noqa: E402

MAX_BYTES = 30_000_000


def read_runs(results: Path) -> dict[str, dict[str, dict]]:
    """``{request: {method: run row}}`` of every ``runs.jsonl`` under ``results`` (a request run twice keeps its
    last row, as a resumed bench does)."""
    files = sorted(Path(results).rglob("runs.jsonl"))
    if not files:
        raise ValueError(f"{results} holds no runs.jsonl (a `fold-hf bench` results folder)")
    return rows_by_request([json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()])


def _whole_call(row: dict) -> float:
    return row["ttft_s"] + row["new_tokens"] * row["tpot_s"]


def _stat(values: list[float]) -> dict:
    low, high = _bootstrap_mean_ci(values)
    return {"mean": sum(values) / len(values), "ci_low": low, "ci_high": high, "n": len(values)}


def tier_stats(by: dict[str, dict[str, dict]], method: str, tier: int) -> dict:
    """τ, speedup and whole-call speedup of ``method`` at ``tier`` over the requests that ran it and AR."""
    sel = [v for v in by.values() if method in v and "ar" in v and v[method]["tier"] == tier]
    if not sel:
        raise ValueError(f"no request at tier {tier} ran {method} and ar")
    return {"tau": _stat([v[method]["tau"] for v in sel]),
            "speedup": _stat([v["ar"]["tpot_s"] / v[method]["tpot_s"] for v in sel]),
            "whole_call": _stat([_whole_call(v["ar"]) / _whole_call(v[method]) for v in sel])}


def shape_table(candidates: dict[str, tuple[Path, Path | None]], method: str, tiers: list[int]) -> list[dict]:
    """One row per candidate, best first: ``{"name", "bytes", "within_bound", "runs", "tiers": {tier: stats},
    "speedup", "tau"}`` (``speedup`` and ``tau``: the means of the per-tier means)."""
    out = []
    for name, (results, drafter) in candidates.items():
        by = read_runs(results)
        at = {}
        for tier in tiers:
            try:
                at[tier] = tier_stats(by, method, tier)
            except ValueError as err:
                raise ValueError(f"{name}: {results}: {err}") from None
        size = (drafter / "model.safetensors").stat().st_size if drafter else None
        out.append({"name": name, "bytes": size, "within_bound": size is None or size <= MAX_BYTES, "runs": by,
                    "tiers": at, "speedup": sum(s["speedup"]["mean"] for s in at.values()) / len(at),
                    "tau": sum(s["tau"]["mean"] for s in at.values()) / len(at)})
    return sorted(out, key=lambda r: (not r["within_bound"], -r["speedup"]))


def against(pick: dict, other: dict, method: str, tier: int) -> dict | None:
    """``pick`` against ``other`` at ``tier`` on the requests both ran (None when they share none)."""
    both = [(p, other["runs"][r]) for r, p in pick["runs"].items()
            if r in other["runs"] and method in p and method in other["runs"][r] and p[method]["tier"] == tier]
    if not both:
        return None
    return {"delta_tau": _stat([p[method]["tau"] - o[method]["tau"] for p, o in both]),
            "speed": _stat([o[method]["tpot_s"] / p[method]["tpot_s"] for p, o in both])}


def _ci(s: dict, fmt: str = ".2f") -> str:
    return f"{s['mean']:{fmt}} [{s['ci_low']:{fmt}}, {s['ci_high']:{fmt}}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("candidates", nargs="+", metavar="NAME=RESULTS_DIR[:DRAFTER_DIR]")
    parser.add_argument("--method", default="fold-a2")
    parser.add_argument("--tiers", type=int, nargs="+", default=[4096, 32704])
    parser.add_argument("--csv", help="also write one row per candidate and tier here")
    args = parser.parse_args(argv)
    candidates = {}
    for item in args.candidates:
        name, _, paths = item.partition("=")
        results, _, drafter = paths.partition(":")
        candidates[name] = (Path(results), Path(drafter) if drafter else None)
    table = shape_table(candidates, args.method, args.tiers)
    print(f"{args.method}, every suite pooled: τ / speedup over AR (TPOT) / whole-call speedup, mean [95% CI]")
    for r in table:
        size = "size unknown" if r["bytes"] is None else f"{r['bytes'] / 1e6:.1f} MB"
        print(f"{r['name']:>12}  mean speedup {r['speedup']:.3f}  mean τ {r['tau']:.2f}  {size}"
              f"{'' if r['within_bound'] else ' (over 30 MB)'}")
        for t, s in sorted(r["tiers"].items()):
            print(f"{'':>14}{t:>6}: τ {_ci(s['tau'])}  speedup {_ci(s['speedup'])}  whole call {_ci(s['whole_call'])}"
                  f"  ({s['tau']['n']} requests)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["candidate", "method", "tier", "requests", "tau", "tau_ci_low", "tau_ci_high", "speedup",
                        "speedup_ci_low", "speedup_ci_high", "whole_call_speedup", "whole_call_ci_low",
                        "whole_call_ci_high", "bytes"])
            for r in table:
                for t, s in sorted(r["tiers"].items()):
                    w.writerow([r["name"], args.method, t, s["tau"]["n"]]
                               + [f"{s[k][x]:.4f}" for k in ("tau", "speedup", "whole_call")
                                  for x in ("mean", "ci_low", "ci_high")] + [r["bytes"]])
    best = table[0]
    if not best["within_bound"]:
        print("no candidate within 30 MB")
        return 1
    print(f"pick: {best['name']}")
    for other in table[1:]:
        for t in args.tiers:
            c = against(best, other, args.method, t)
            if c is None:
                print(f"  vs {other['name']} at {t}: no request ran by both")
                continue
            verdict = ("  (speed CI below 1: the other is faster here)" if c["speed"]["ci_high"] < 1.0 else
                       "  (speed CI includes 1: the pick is not settled here)" if c["speed"]["ci_low"] <= 1.0 else "")
            print(f"  vs {other['name']} at {t} ({c['speed']['n']} requests): Δτ {_ci(c['delta_tau'], '+.2f')}, "
                  f"speed {_ci(c['speed'])}{verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
