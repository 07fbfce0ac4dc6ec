"""The tables of ``benchmarks/results/2026-12-07-cpu-smollm2-window-sweep-2k/README.md``, recomputed from the two runs'
records: mean τ per method (W = 512 from the 2026-12-07 mixed-2K run's ``fold-a2``), 95% percentile-bootstrap CIs
(2,000 resamples of the requests, seed 0; differences paired by request), written out here as a loop."""

import json
import random
from pathlib import Path

from run_tables import marked_table

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
RUN = RESULTS / "2026-12-07-cpu-smollm2-window-sweep-2k"
KINDS = ["c", "logs", "markup", "prose", "python", "structured"]


def records() -> dict:
    """method -> request -> (tau, kind, same_as_ar)."""
    out = {}
    rows = [json.loads(line) for line in (RUN / "runs.jsonl").read_text().splitlines() if line.strip()]
    base = [json.loads(line) for line in
            (RESULTS / "2026-12-07-cpu-smollm2-mixed-2k" / "idle" / "runs.jsonl").read_text().splitlines() if line]
    rows += [dict(r, method="fold-a2-w512") for r in base if r["method"] == "fold-a2"]
    for r in rows:
        out.setdefault(r["method"], {})[r["request"]] = (r["tau"], r["suite"].removeprefix("mixed-"), r["same_as_ar"])
    return out


def mean_ci(values, resamples=2000, seed=0):
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        total = 0.0
        for _ in values:
            total += rng.choice(values)
        means.append(total / len(values))
    means.sort()
    return sum(values) / len(values), means[int(0.025 * resamples)], means[int(0.975 * resamples)]


def table(name: str) -> list[list[str]]:
    return marked_table(RUN / "README.md", name)


def fmt(ci, signed=False):
    f = (lambda v: f"{v:+.2f}".replace("-", "−")) if signed else (lambda v: f"{v:.2f}")
    return f"{f(ci[0])} [{f(ci[1])}, {f(ci[2])}]"


def test_every_output_is_ar_and_every_request_ran_every_method():
    data = records()
    assert len(data["ar"]) == 48
    for method, by_request in data.items():
        assert set(by_request) == set(data["ar"]), method
        assert all(same for _, _, same in by_request.values()), method


def test_the_window_sweep_table():
    data = records()
    requests = sorted(data["ar"])

    def taus(method):
        return [data[method][q][0] for q in requests]

    want = []
    for w in (256, 512, 768):
        fold = taus(f"fold-a2-w{w}")
        if w == 512:
            want.append(["512", fmt(mean_ci(fold)), "—", "—", "—"])
            continue
        window = taus(f"window-w{w}")
        preset = taus("fold-a2-w512")
        want.append([str(w), fmt(mean_ci(fold)), fmt(mean_ci(window)),
                     fmt(mean_ci([a - b for a, b in zip(fold, window)]), True),
                     fmt(mean_ci([a - b for a, b in zip(fold, preset)]), True)])
    assert table("window-sweep-table") == want


def test_the_kinds_table():
    data = records()
    methods = ["fold-a2-w256", "fold-a2-w512", "fold-a2-w768", "window-w256", "window-w768"]
    want = []
    for kind in KINDS:
        row = [kind]
        for m in methods:
            values = [tau for tau, k, _ in data[m].values() if k == kind]
            assert len(values) == 8
            row.append(f"{sum(values) / len(values):.2f}")
        want.append(row)
    assert table("window-kinds-table") == want
