"""The tables of ``benchmarks/results/2026-12-07-nvidia-h100-gemma3-drafter-round2/README.md`` recomputed from the
run's records (per-request ``runs.jsonl`` of ``fold-hf bench``, ``batched.json`` of ``batched_bench.py``), and the
run's drafter (committed until the spread-position rounds of the same day) tied to the run (its weights' sha256, its
training.json).

Every mean and ratio is computed here from the records, request by request (τ, TPOT(AR) / TPOT against the AR of the
same process); the 95% intervals are percentile bootstraps over requests (``fold_hf.bench.summary._bootstrap_mean_ci``,
2,000 resamples, seed 0: the same the summary keys use). The replaced drafter's rows are the committed run it was
measured in (``2026-12-06-nvidia-h100-gemma3-split-fix/run``, the same 96 requests)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from run_tables import ci, fmt_ci, marked_table, per_request, records, requests_at, slowest_row_terms

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h100-gemma3-drafter-round2"
OLD = ROOT / "benchmarks" / "results" / "2026-12-06-nvidia-h100-gemma3-split-fix" / "run" / "runs.jsonl"
PREVIOUS_BATCHED = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h100-prefill-chunk-batched-modes" / "after-fix"
TIERS = (4096, 32704)
NAMES = {"fold-a2": "FOLD α=2", "fold-a1": "FOLD α=1", "fold-a4": "FOLD α=4", "window": "window only",
         "dflash": "drafter as trained (dflash)", "yarn": "YaRN", "rerope": "ReRoPE", "infllm": "InfLLM", "cmr": "CMR",
         "streaming": "StreamingLLM"}


def new_runs() -> dict[tuple[str, str], dict]:
    runs = {}
    for folder in ("new", "others"):  # two processes over the same 96 requests, each with its own AR
        runs.update({k: v for k, v in per_request(RUN / "mixed" / folder / "runs.jsonl").items() if k[1] != "ar"})
    return runs


def drafter_table() -> list[list[str]]:
    new, old = new_runs(), per_request(OLD)
    rows = []
    for method in ("fold-a2", "dflash", "window"):
        for tier in TIERS:
            ids = requests_at(new, tier)
            assert len(ids) == 48 and all((i, method) in old for i in ids)
            t_new = [new[(i, method)]["tau"] for i in ids]
            t_old = [old[(i, method)]["tau"] for i in ids]
            s_new = [new[(i, method)]["speed"] for i in ids]
            s_old = [old[(i, method)]["speed"] for i in ids]
            delta = [a - b for a, b in zip(t_new, t_old)]
            rows.append([NAMES[method], f"{tier:,}", fmt_ci(statistics.mean(t_new), *ci(t_new)),
                         f"{statistics.mean(t_old):.2f}", f"{statistics.mean(s_new):.2f}× / {statistics.mean(s_old):.2f}×",
                         fmt_ci(statistics.mean(delta), *ci(delta), sign=True)])
    return rows


def methods_table() -> list[list[str]]:
    runs = new_runs()
    rows = []
    for method in ("fold-a2", "fold-a1", "fold-a4", "window", "dflash", "yarn", "rerope", "infllm", "cmr",
                   "streaming"):
        cells = [NAMES[method]]
        for tier in TIERS:
            ids = requests_at(runs, tier)
            taus = [runs[(i, method)]["tau"] for i in ids]
            speeds = [runs[(i, method)]["speed"] for i in ids]
            delta = [runs[(i, "fold-a2")]["tau"] - t for i, t in zip(ids, taus)]
            cells += [f"{statistics.mean(taus):.2f}", fmt_ci(statistics.mean(speeds), *ci(speeds)) + "×",
                      "—" if method == "fold-a2" else fmt_ci(statistics.mean(delta), *ci(delta), sign=True)]
        rows.append(cells)
    return rows


def kinds_table() -> list[list[str]]:
    new, old = new_runs(), per_request(OLD)
    rows = []
    for kind in ("python", "c", "markup", "structured", "logs", "prose"):
        cells = [kind]
        for method, tier in (("dflash", 4096), ("fold-a2", 4096), ("fold-a2", 32704), ("window", 32704)):
            ids = [i for i in requests_at(new, tier) if new[(i, method)]["suite"] == f"mixed-{kind}"]
            assert len(ids) == 8
            cells.append(f"{statistics.mean(old[(i, method)]['tau'] for i in ids):.2f} → "
                         f"{statistics.mean(new[(i, method)]['tau'] for i in ids):.2f}")
        rows.append(cells)
    return rows


def draft_vocab_table() -> list[list[str]]:
    plain, dv = per_request(RUN / "mixed" / "new" / "runs.jsonl"), per_request(RUN / "mixed" / "new-dv" / "runs.jsonl")
    rows = []
    for tier in TIERS:
        ids = requests_at(dv, tier)
        assert len(ids) == 48
        for name, runs in (("FOLD α=2", plain), ("FOLD α=2 + draft vocabulary", dv)):
            taus = [runs[(i, "fold-a2")]["tau"] for i in ids]
            speeds = [runs[(i, "fold-a2")]["speed"] for i in ids]
            rows.append([f"{tier:,}", name, fmt_ci(statistics.mean(taus), *ci(taus)),
                         fmt_ci(statistics.mean(speeds), *ci(speeds)) + "×"])
    return rows


def batched_table() -> list[list[str]]:
    rows = []
    for new in (64, 256):
        now = json.load(open(RUN / "batched" / f"new{new}" / "batched.json"))
        before = json.load(open(PREVIOUS_BATCHED / ("new64" if new == 64 else "new256b") / "batched.json"))
        for B in ((1, 8) if new == 64 else (8,)):
            for method in ("fold-a2", "window"):
                cells = [f"{new}, {B}, {NAMES[method]}"]
                for report in (before, now):
                    row, = [r for r in report["rows"] if r["system"] == method and r["batch"] == B]
                    ratios = report["ratios"]
                    cells.append(f"{row['tau_mean']:.2f} ({min(row['tau_rows']):.2f}) / "
                                 f"{ratios[f'{method}_over_ar_throughput_b{B}']:.3f}× / "
                                 f"{ratios[f'{method}_over_ar_decode_throughput_b{B}']:.3f}×")
                rows.append(cells)
    return rows


def table(name: str) -> list[list[str]]:
    return marked_table(RUN / "README.md", name)


def test_the_drafter_table_is_the_runs():
    assert table("drafter-table") == drafter_table()


def test_the_methods_table_is_the_runs():
    assert table("methods-table") == methods_table()


def test_the_kinds_table_is_the_runs():
    assert table("kinds-table") == kinds_table()


def test_the_draft_vocabulary_table_is_the_runs():
    assert table("dv-table") == draft_vocab_table()


def test_the_batched_table_is_the_runs():
    assert table("batched-table") == batched_table()


def test_every_output_of_the_new_drafter_matches_ar_where_the_run_says():
    """bf16 near-ties aside (the run's README says how many differ), every record is a whole 64-token request of the
    mixed suite on the fast engine."""
    for folder in ("new", "new-dv", "others"):
        for r in records(RUN / "mixed" / folder / "runs.jsonl"):
            assert r["new_tokens"] == 64 and r["engine"] == "fast" and r["dtype"] == "bfloat16" and not r["exact"]


def test_the_round_2_drafter_is_the_one_the_spread_position_run_replaced():
    """This run's drafter (committed from 2026-12-07 until the spread-position rounds of the same day,
    ``tests/test_gemma3_drafter_pose_run.py``): the weights' sha256 in this README and in the later run's (as the
    replaced drafter), its training.json the recipe this README states (960 + 64 tokens, seed 1, 3,096 steps)."""
    sha = "577c31aa8a60d832891e89c143317a2701b6b1bd7366c48a9dd6a95e4dd98bf6"
    assert f"`{sha}`" in (RUN / "README.md").read_text()
    later = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h100-gemma3-drafter-pose" / "README.md"
    assert "replacing round 2's `577c31aa…`" in later.read_text()
    training = json.loads((RUN / "training" / "training.json").read_text())
    settings, report = training["settings"], training["report"]
    assert (settings["prompt_tokens"], settings["new_tokens"]) == (960, 64) and settings["seed"] == 1
    assert report["finished"] and report["step"] == settings["steps"] == 3096


def test_the_ceiling_sentence_is_the_batched_rows():
    """Section 6's last paragraph, recomputed from the rows (a batch of 8 ends with its slowest row: rounds ≈ new /
    min τ; every method shares AR's prefill): the slowest rows, the one-step-round ceiling, the round 1.3x needs."""
    readme = (RUN / "README.md").read_text()
    for new in (64, 256):
        terms = slowest_row_terms(json.load(open(RUN / "batched" / f"new{new}" / "batched.json")), "fold-a2")
        ar, fold, prefill, step, slowest, rounds = (terms[k] for k in ("ar", "row", "prefill", "step", "slowest",
                                                                        "rounds"))
        if new == 64:
            assert f"free decoding\nstill gives only {ar['seconds'] / prefill:.3f}×" in readme
            assert ar["seconds"] / prefill < 1.3
        else:
            assert "τ " + " / ".join(f"{t:.2f}" for t in slowest) + " at 256 tokens" in readme
            assert f"could reach\n{ar['seconds'] / (prefill + rounds * step):.3f}×" in readme
            need = (ar["seconds"] / 1.3 - prefill) / (rounds * step)
            measured = fold["decode_seconds"] / (rounds * step)
            assert f"≤ {need:.2f} batched AR steps (measured {measured:.2f})" in readme


def test_latest_summary_batched_keys_are_this_run():
    """latest/summary.json: issue #35's batched keys (the batched runs' ratios, rounded to 4 places) — not re-measured
    with the drafter that replaced this one (issue #38's four headline keys moved to that run,
    tests/test_gemma3_drafter_pose_run.py; the draft-vocabulary keys to the run of every method on it,
    tests/test_gemma3_all_methods_pose_run.py)."""
    latest = json.loads((ROOT / "benchmarks" / "results" / "latest" / "summary.json").read_text())
    new64 = json.load(open(RUN / "batched" / "new64" / "batched.json"))["ratios"]
    new256 = json.load(open(RUN / "batched" / "new256" / "batched.json"))["ratios"]
    assert latest["gemma3_batched_fold_over_ar_throughput_32k_b8"] == round(new64["fold-a2_over_ar_throughput_b8"], 4)
    assert latest["gemma3_batched_fold_over_ar_decode_throughput_32k_b8"] == round(
        new64["fold-a2_over_ar_decode_throughput_b8"], 4)
    assert latest["gemma3_batched_fold_over_ar_throughput_32k_b8_new256"] == round(
        new256["fold-a2_over_ar_throughput_b8"], 4)
    assert latest["gemma3_batched_fold_over_ar_decode_throughput_32k_b8_new256"] == round(
        new256["fold-a2_over_ar_decode_throughput_b8"], 4)
    assert latest["gemma3_batched_fold_speedup_b8_over_b1_32k"] == round(new64["fold-a2_speedup_b8_over_b1"], 4)


def test_the_held_out_table_is_the_cpu_measurement():
    """Section 2: both drafters' held-out τ on the same 16 windows (training/held_out.json, written by the CPU run),
    the new drafter's equal to what its training.json reports."""
    held = json.loads((RUN / "training" / "held_out.json").read_text())
    assert held["new"]["prompt_tokens"] == held["old"]["prompt_tokens"] == 960
    want = [[f"{name} (sha256 {held[key]['sha256'][:8]}…)", f"{held[key]['tau_mean']:.2f}",
             f"{held[key]['identical_to_ar']} of {held[key]['requests']}"]
            for key, name in (("new", "new (committed)"), ("old", "replaced (2026-12-06)"))]
    assert table("heldout-table") == want
    training = json.loads((RUN / "training" / "training.json").read_text())
    assert training["report"]["held_out"]["tau_mean"] == held["new"]["tau_mean"]
