"""Summaries of benchmark runs: per suite, tier and method τ and speedup over AR with bootstrap CIs, paired
comparisons of one method against the others, and τ retention with length in nested suites.

Speedup = mean over requests of TPOT_AR / TPOT_method (each method paired with the AR run of the same request);
95% CIs from 2,000 bootstrap resamples with a fixed seed.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
from pathlib import Path

import torch

from .plots import write_plots


def _bootstrap_mean_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    gen = torch.Generator().manual_seed(seed)
    v = torch.tensor(values, dtype=torch.float64)
    idx = torch.randint(0, len(v), (resamples, len(v)), generator=gen)
    means = v[idx].mean(1).sort().values
    return float(means[int(0.025 * resamples)]), float(means[int(0.975 * resamples) - 1])


def rows_by_request(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """``{request id: {method: run row}}`` of bench run rows (a request and method run twice keep the last row, as a
    resumed bench appends it)."""
    by: dict[str, dict[str, dict]] = {}
    for row in rows:
        by.setdefault(row["request"], {})[row["method"]] = row
    return by


def summarize(run_files: list[str | Path], out_dir: str | Path, title: str = "", focus: str | None = None,
              headline: str | None = None) -> dict:
    """Merge run files, compute the table, write ``summary.json``, ``summary.csv``, ``paired.csv`` and PNG plots.

    ``focus``: the method compared request by request with every other one (:func:`paired_comparison`; default
    ``fold-a2`` when present, else the first ``fold`` method). ``headline``: a key prefix (``gemma3``): the flat keys
    of :func:`headline_keys` are added at the top of ``summary.json``."""
    rows = []
    for f in run_files:
        rows += [json.loads(line) for line in Path(f).read_text().splitlines() if line.strip()]
    # runs from before the engine was recorded used the loop
    engine = _one_setting(rows, "engine", "loop", "engines", "their timings do not pair")
    dtype = _one_setting(rows, "dtype", "unrecorded", "dtypes", "their timings and outputs do not pair")
    exact = _one_setting(rows, "exact", False, "exact modes", "exact mode's outputs and timings are its own")
    by_request = rows_by_request(rows)
    methods = sorted({r["method"] for r in rows} - {"ar"}, key=lambda m: (not m.startswith("fold"), m))
    table = []
    for suite in sorted({r["suite"] for r in rows}):
        for tier in sorted({r["tier"] for r in rows if r["suite"] == suite}):
            reqs = [v for v in by_request.values() if "ar" in v and v["ar"]["suite"] == suite and v["ar"]["tier"] == tier]
            for method in methods:
                paired = [v for v in reqs if method in v and v[method]["tpot_s"] > 0 and v["ar"]["tpot_s"] > 0]
                if not paired:
                    continue
                speedups = [v["ar"]["tpot_s"] / v[method]["tpot_s"] for v in paired]
                taus = [v[method]["tau"] for v in paired]
                lo, hi = _bootstrap_mean_ci(speedups)
                tlo, thi = _bootstrap_mean_ci(taus)
                table.append({
                    "suite": suite, "tier": tier, "method": method, "requests": len(paired),
                    "tau": sum(taus) / len(taus), "tau_ci_low": tlo, "tau_ci_high": thi,
                    "speedup": sum(speedups) / len(speedups), "speedup_ci_low": lo, "speedup_ci_high": hi,
                    "tpot_ms": 1000 * sum(v[method]["tpot_s"] for v in paired) / len(paired),
                    "ar_tpot_ms": 1000 * sum(v["ar"]["tpot_s"] for v in paired) / len(paired),
                    "differ_from_ar": sum(not v[method]["same_as_ar"] for v in paired),
                })
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    machine = {}
    for f in run_files:
        meta = Path(f).parent / "machine.json"
        if meta.is_file():
            machine = json.loads(meta.read_text())
    if focus is None:
        focus = "fold-a2" if "fold-a2" in methods else next((m for m in methods if m.startswith("fold")), None)
    paired = paired_comparison(by_request, focus) if focus is not None else []
    retention = length_retention(rows)
    summary = {"title": title, "date": _dt.date.today().isoformat(), "machine": machine,
               "engine": engine, "dtype": dtype, "exact": bool(exact), "rows": table,
               "averages": _averages(table), "paired": {"focus": focus, "rows": paired},
               "length_retention": retention}
    if headline:
        summary.update(headline_keys(rows, headline, focus=focus or "fold-a2"))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for name, data in (("summary.csv", table), ("paired.csv", paired)):
        with (out / name).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(data[0]) if data else ["suite"])
            writer.writeheader()
            writer.writerows(data)
    write_plots(table, out, title)
    return summary


def _one_setting(rows: list[dict], key: str, default: str, plural: str, why: str) -> str | None:
    """The one value of ``key`` over ``rows`` (``default`` where a row lacks it), None without rows; ValueError when
    the rows mix values."""
    values = sorted({r.get(key, default) for r in rows})
    if len(values) > 1:
        raise ValueError(f"the run files mix {plural} {values}: {why}; summarize them apart")
    return values[0] if values else None


def length_retention(rows: list[dict]) -> list[dict]:
    """For nested suites (``build_suite(nested=True)``): per suite and method, τ at the longest tier over τ at the
    shortest, computed per family (the same text at both lengths) and averaged, with a 95% bootstrap CI; empty
    when no row names a family."""
    tau: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r.get("family") is not None and r["method"] != "ar":
            tau.setdefault((r["suite"], r["method"], r["family"]), {})[r["tier"]] = r["tau"]
    out = []
    for suite, method in sorted({(s, m) for s, m, _ in tau}):
        by_family = [t for (s, m, _), t in tau.items() if (s, m) == (suite, method) and len(t) > 1]
        if not by_family:
            continue
        short, long = min(min(t) for t in by_family), max(max(t) for t in by_family)
        ratios = [t[long] / t[short] for t in by_family if short in t and long in t]
        lo, hi = _bootstrap_mean_ci(ratios)
        out.append({"suite": suite, "method": method, "short_tier": short, "long_tier": long,
                    "families": len(ratios), "tau_ratio": sum(ratios) / len(ratios), "tau_ratio_ci_low": lo,
                    "tau_ratio_ci_high": hi})
    return out


def paired_comparison(by_request: dict[str, dict[str, dict]], focus: str) -> list[dict]:
    """``focus`` against every other method on the same requests, per suite and over all suites.

    Per request, ``delta_tau`` = τ(focus) - τ(other) and ``speed_ratio`` = TPOT(other) / TPOT(focus) (> 1: focus
    is faster); rows give their means with 95% bootstrap CIs and how many requests focus wins, ties and loses
    on τ. Pairing removes the request-to-request spread (the tiers and suites hold different texts), so a CI
    that excludes 0 (or 1) says which method reads better on these inputs even where the per-method CIs overlap.

    Args:
        by_request: ``{request id: {method: run row}}`` (rows as ``run_bench`` writes them).
        focus: the method compared with the others.
    """
    reqs = [v for v in by_request.values() if focus in v and v[focus]["tpot_s"] > 0]
    others = sorted({m for v in reqs for m in v} - {focus, "ar"})
    out = []
    for suite in sorted({v[focus]["suite"] for v in reqs}) + ["all"]:
        chosen = [v for v in reqs if suite == "all" or v[focus]["suite"] == suite]
        for other in others:
            both = [v for v in chosen if other in v and v[other]["tpot_s"] > 0]
            if not both:
                continue
            deltas = [v[focus]["tau"] - v[other]["tau"] for v in both]
            ratios = [v[other]["tpot_s"] / v[focus]["tpot_s"] for v in both]
            dlo, dhi = _bootstrap_mean_ci(deltas)
            rlo, rhi = _bootstrap_mean_ci(ratios)
            out.append({"suite": suite, "focus": focus, "other": other, "requests": len(both),
                        "delta_tau": sum(deltas) / len(deltas), "delta_tau_ci_low": dlo, "delta_tau_ci_high": dhi,
                        "speed_ratio": sum(ratios) / len(ratios), "speed_ratio_ci_low": rlo,
                        "speed_ratio_ci_high": rhi, "tau_wins": sum(d > 0 for d in deltas),
                        "tau_ties": sum(d == 0 for d in deltas), "tau_losses": sum(d < 0 for d in deltas)})
    return out


def _tier_of(rows: list[dict], k: int) -> int:
    """The one tier of ``rows`` that rounds to ``k`` K tokens (32704 and 32768 are both 32K); ValueError if none or
    several."""
    tiers = sorted({r["tier"] for r in rows if round(r["tier"] / 1024) == k})
    if len(tiers) != 1:
        raise ValueError(f"the rows have {'no tier' if not tiers else f'tiers {tiers}'} at {k}K")
    return tiers[0]


def headline_keys(rows: list[dict], prefix: str = "gemma3", focus: str = "fold-a2", window: str = "window",
                  drafter: str = "dflash") -> dict[str, float | int]:
    """The issue-#38 keys of a run's rows (every suite of the rows pooled), each with ``_ci_low``/``_ci_high`` (95%,
    :func:`_bootstrap_mean_ci`) and ``_requests``:

    * ``<prefix>_tau_4k_dflash``: mean τ of ``drafter`` (the drafter as trained) at the 4K tier;
    * ``<prefix>_fold_tau_32k``: mean τ of ``focus`` at the 32K tier;
    * ``<prefix>_fold_speedup_32k``: mean over requests of TPOT(AR) / TPOT(``focus``) at 32K (AR of the same request);
    * ``<prefix>_fold_minus_window_tau_32k``: mean over requests of τ(``focus``) - τ(``window``) at 32K, paired by
      request (only requests both ran).
    """
    by = rows_by_request(rows)
    t4, t32 = _tier_of(rows, 4), _tier_of(rows, 32)

    def at(tier: int, *methods: str) -> list[dict[str, dict]]:
        return [v for _, v in sorted(by.items()) if all(m in v and v[m]["tier"] == tier for m in methods)]

    samples = {
        "tau_4k_dflash": [v[drafter]["tau"] for v in at(t4, drafter)],
        "fold_tau_32k": [v[focus]["tau"] for v in at(t32, focus)],
        "fold_speedup_32k": [v["ar"]["tpot_s"] / v[focus]["tpot_s"] for v in at(t32, focus, "ar")],
        "fold_minus_window_tau_32k": [v[focus]["tau"] - v[window]["tau"] for v in at(t32, focus, window)],
    }
    out: dict[str, float | int] = {}
    for name, values in samples.items():
        if not values:
            raise ValueError(f"no request at the tier of {prefix}_{name} has the methods it needs")
        low, high = _bootstrap_mean_ci(values)
        key = f"{prefix}_{name}"
        out.update({key: sum(values) / len(values), f"{key}_ci_low": low, f"{key}_ci_high": high,
                    f"{key}_requests": len(values)})
    return out


def _averages(table: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for method in sorted({r["method"] for r in table}):
        sel = [r for r in table if r["method"] == method]
        out[method] = {"tau": sum(r["tau"] for r in sel) / len(sel),
                       "speedup": sum(r["speedup"] for r in sel) / len(sel),
                       "differ_from_ar": sum(r["differ_from_ar"] for r in sel)}
    return out
