"""How far a batched speculative call could go, from a `batched_bench.py` suite run (issue #35): the whole-call
speedup over batched AR that free decoding would give, the one that rounds costing a single batched AR step would give
at the measured τ, and the round cost (in batched AR steps) a goal needs.

A batch runs until its slowest row is done, so a batch of rows with τ_1 .. τ_B takes about new / min(τ) rounds
(the rows' τ are the suite rows' `tau_rows`, consecutive groups of B in request order, as `batched_bench.py` batches
them). From the AR row of the same process: its prefill and set-up time (`seconds - decode_seconds`, shared by every
method: the same prompts are prefilled the same way) and its decoding step (`decode_seconds / (groups × new)`;
every ceiling uses rounds × step, the same whether the first token, which comes from the prefill, is counted or not).
`batched_bench.py` stores these rows in its report (`ceilings`). Then, for each method:

- free decoding: `AR seconds / AR prefill` (no decoder reaches past this);
- one-step rounds: `AR seconds / (AR prefill + rounds × AR step)` (the verify alone costs at least an AR step);
- the round a goal G needs: `(AR seconds / G - AR prefill) / (rounds × AR step)` in AR steps (≤ 0: out of reach);
- the round measured: `decode_seconds / rounds` in AR steps.

    python benchmarks/batched_ceiling.py RUN/batched.json [--goal 1.3] [--csv OUT.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys


def ceilings(report: dict, goal: float) -> list[dict]:
    """One dict per speculative suite row of ``report`` (a ``batched.json``) at a batch with an AR row."""
    suite = [r for r in report["rows"] if r.get("section") == "suite"]
    out = []
    for ar in (r for r in suite if r["system"] == "ar"):
        B, new = ar["batch"], ar["new_tokens"]
        groups = -(-ar["requests"] // B)
        prefill = ar["seconds"] - ar["decode_seconds"]
        step = ar["decode_seconds"] / (groups * new)
        for row in suite:
            if row["system"] == "ar" or row["batch"] != B or row["new_tokens"] != new or not row.get("tau_rows"):
                continue
            taus = row["tau_rows"]
            slowest = [min(taus[g * B:(g + 1) * B]) for g in range(groups)]
            rounds = sum(new / t for t in slowest)
            out.append({
                "method": row["system"], "batch": B, "new_tokens": new, "requests": ar["requests"],
                "slowest_tau": slowest, "rounds": rounds, "ar_seconds": ar["seconds"], "ar_prefill_seconds": prefill,
                "ar_step_ms": 1e3 * step,
                "measured": ar["seconds"] / row["seconds"],
                "measured_round_over_ar_step": row["decode_seconds"] / (rounds * step),
                "ceiling_free_decoding": ar["seconds"] / prefill,
                "ceiling_one_step_rounds": ar["seconds"] / (prefill + rounds * step),
                "goal": goal,
                "round_over_ar_step_for_goal": (ar["seconds"] / goal - prefill) / (rounds * step),
            })
    return out


def describe(r: dict) -> str:
    """One line for a row of :func:`ceilings` (what this script prints, and ``batched_bench.py`` logs)."""
    need = r["round_over_ar_step_for_goal"]
    return (f"B={r['batch']} new={r['new_tokens']} {r['method']:>8}: slowest τ "
            f"{' '.join(f'{t:.2f}' for t in r['slowest_tau'])}; measured {r['measured']:.3f}x with rounds of "
            f"{r['measured_round_over_ar_step']:.2f} AR steps; ceilings: free decoding "
            f"{r['ceiling_free_decoding']:.3f}x, one-step rounds {r['ceiling_one_step_rounds']:.3f}x; "
            f"{r['goal']}x needs rounds of " + (f"{need:.2f} AR steps" if need > 0 else "less than nothing: out of reach"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("batched_json")
    parser.add_argument("--goal", type=float, default=1.3, help="whole-call speedup over batched AR (issue #35: 1.3)")
    parser.add_argument("--csv", help="also write the rows here")
    args = parser.parse_args(argv)
    rows = ceilings(json.load(open(args.batched_json)), args.goal)
    if not rows:
        print(f"{args.batched_json}: no suite rows with per-row τ beside an AR row", file=sys.stderr)
        return 1
    for r in rows:
        print(describe(r))
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
