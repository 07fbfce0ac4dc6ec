"""The numbers of ``benchmarks/results/2026-12-07-cpu-smollm2-mixed-2k/README.md`` (the SmolLM2 pair on the mixed
suite's 2K tier on the 2-core CPU; issue #38) recomputed from the per-request records committed beside it: the per-kind
table, the pooled τ and speedup with their bootstrap CIs (written here as a loop, not through fold_hf's summary), the
whole-call ratio, the outputs equal to AR, and the α = 2 against α = 4 comparison. Run this file as a script to print
them."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "2026-12-07-cpu-smollm2-mixed-2k"
README = RUN / "README.md"


def records(part: str) -> dict:
    rows = [json.loads(line) for line in (RUN / part / "runs.jsonl").read_text().splitlines() if line.strip()]
    return {(r["request"], r["method"]): r for r in rows}


def bootstrap(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean."""
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def speed_rows() -> list[str]:
    by = records("idle")
    requests = sorted({q for q, _m in by})
    kinds: dict[str, list[str]] = {}
    for q in requests:
        kinds.setdefault(by[(q, "ar")]["suite"].removeprefix("mixed-"), []).append(q)
    speed = {q: by[(q, "ar")]["tpot_s"] / by[(q, "fold-a2")]["tpot_s"] for q in requests}
    tau = {q: by[(q, "fold-a2")]["tau"] for q in requests}
    out = [f"| {k} | {len(qs)} | {statistics.mean(tau[q] for q in qs):.2f} | "
           f"{statistics.mean(speed[q] for q in qs):.2f}× |" for k, qs in sorted(kinds.items())]
    t, s = [tau[q] for q in requests], [speed[q] for q in requests]
    (tl, th), (sl, sh) = bootstrap(t), bootstrap(s)
    out.append(f"| **all** | {len(requests)} | **{statistics.mean(t):.2f}** [{tl:.2f}, {th:.2f}] | "
               f"**{statistics.mean(s):.2f}×** [{sl:.2f}, {sh:.2f}] |")
    same = sum(bool(by[(q, "fold-a2")]["same_as_ar"]) for q in requests)
    out.append(f"**{same} of {len(requests)} equal AR's**")
    out.append(f"{min(s):.2f}× to {max(s):.2f}× per request; {sum(v > 1 for v in s)} of {len(s)} above 1")
    whole = [(by[(q, "ar")]["tpot_s"] * by[(q, "ar")]["new_tokens"] + by[(q, "ar")]["ttft_s"])
             / (by[(q, "fold-a2")]["tpot_s"] * by[(q, "fold-a2")]["new_tokens"] + by[(q, "fold-a2")]["ttft_s"])
             for q in requests]
    wl, wh = bootstrap(whole)
    out.append(f"**{statistics.mean(whole):.2f}× [{wl:.2f}, {wh:.2f}]**")
    return out


def alpha_rows() -> list[str]:
    by = records("alpha")
    requests = sorted({q for q, _m in by})
    delta = [by[(q, "fold-a2")]["tau"] - by[(q, "fold-a4")]["tau"] for q in requests]
    wins = sum(d > 1e-9 for d in delta)
    losses = sum(d < -1e-9 for d in delta)
    # the CI as the bench wrote it (alpha/paired.csv, fold_hf's paired bootstrap), checked against this loop's
    paired = next(line.split(",") for line in (RUN / "alpha" / "paired.csv").read_text().splitlines()
                  if line.startswith("all,"))
    low, high = float(paired[5]), float(paired[6])
    mine = bootstrap(delta)
    assert abs(mine[0] - low) < 0.01 and abs(mine[1] - high) < 0.01, (mine, low, high)
    assert abs(float(paired[4]) - statistics.mean(delta)) < 1e-9
    return [f"**τ(α = 2) − τ(α = 4) = {statistics.mean(delta):+.3f} [{low:+.3f}, {high:+.3f}]**".replace("-", "−"),
            f"({wins} wins, {len(delta) - wins - losses} ties, {losses} losses for α = 2"]


def test_cpu_mixed_readme_numbers_come_from_its_records():
    text = README.read_text()
    for row in speed_rows() + alpha_rows():
        assert row in text, row


def test_cpu_mixed_records_are_the_runs_described():
    """48 requests, six kinds of eight, 64 new tokens at the 2,048-token tier; both parts fp32 on the CPU."""
    for part, methods in (("idle", {"ar", "fold-a2"}), ("alpha", {"ar", "fold-a2", "fold-a4"})):
        by = records(part)
        assert {m for _q, m in by} == methods and len({q for q, _m in by}) == 48
        assert {(r["tier"], r["new_tokens"], r["dtype"]) for r in by.values()} == {(2048, 64, "float32")}
    machine = json.loads((RUN / "idle" / "machine.json").read_text())
    assert machine["gpu"] is None and machine["transformers"] == "5.25.0"


if __name__ == "__main__":
    print("\n".join(speed_rows() + alpha_rows()))
