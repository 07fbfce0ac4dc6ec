"""The TTFT benchmarks of issue 36 (``benchmarks/last_mile_bench.py``'s prefill section and
``benchmarks/family_prefill_bench.py``): their dry runs on the CPU write the protocol's rows (a timed first call
and the median of the repeats, ours and transformers') and headline keys; the sliding-window pair count of the
compute floor against a loop."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("P,window", [(1, None), (7, None), (40, 16), (16, 16), (15, 16), (72, 1), (9, 100)])
def test_family_bench_attention_pairs_match_a_loop(P, window):
    sys.path.insert(0, str(BENCHMARKS))
    from family_prefill_bench import attention_pairs

    expected = sum(1 for q in range(P) for k in range(P) if k <= q and (window is None or q - k < window))
    assert attention_pairs(P, window) == expected


def test_last_mile_bench_prefill_dry_run_writes_first_call_and_warm_rows(tmp_path):
    """``last_mile_bench.py --dry-run --prefill-only``: per length a timed first call and two warm calls for ours
    and transformers' (and the chunk rows at the A/B length, which the dry run sets to 128); ``ttft_s`` is the warm
    median, and the headline has the ``_first_call`` keys."""
    script = BENCHMARKS / "last_mile_bench.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--dry-run", "--prefill-only",
                    "--no-profile"], check=True, capture_output=True)
    report = json.loads((tmp_path / "last_mile.json").read_text())
    rows = {(r["row"], r["prompt"]): r for r in report["prefill"]}
    assert set(rows) == {(name, P) for name in ("ours", "hf") for P in (64, 128)} | {
        ("ours[chunk 64]", 128), ("ours[chunk 128]", 128)}, set(rows)
    for row in rows.values():
        assert row["first_call_s"] > 0 and row["repeats"] == 2 and len(row["warm_s"]) == 2
        assert row["ttft_s"] == row["warm_median_s"] == min(row["warm_s"])  # the lower middle of two
        assert row["fraction_of_floor"] == pytest.approx(row["floor_s"] / row["warm_median_s"])
        assert row["first_call_fraction_of_floor"] == pytest.approx(row["floor_s"] / row["first_call_s"])
    assert {"prefill_over_hf_8b_32k_first_call", "prefill_fraction_of_compute_floor_8b_32k_first_call",
            "prefill_over_hf_8b_128k_first_call"} <= set(report["headline"])
    csv_rows = list(csv.DictReader((tmp_path / "last_mile_prefill.csv").open()))
    assert len(csv_rows) == 6 and all(float(r["first_call_s"]) > 0 and float(r["warm_median_s"]) > 0
                                      for r in csv_rows)


def test_family_prefill_bench_dry_run_writes_every_family(tmp_path):
    """``family_prefill_bench.py --dry-run --module-prefill``: tiny Qwen3.5, Gemma-4 and Gemma-3 targets, two
    lengths past the sliding window and the prefill chunk, ours, ours with the module-path prefill and transformers'
    each with a first call and two warm calls; the headline gives ours / HF and ours / ours_module for every family
    and length."""
    script = BENCHMARKS / "family_prefill_bench.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--dry-run", "--module-prefill"],
                   check=True, capture_output=True)
    report = json.loads((tmp_path / "family_prefill.json").read_text())
    assert report["errors"] == {}
    keys = {(r["family"], r["P"], r["system"]) for r in report["rows"]}
    families = ("qwen35_9b", "gemma4_12b", "gemma3_270m")
    systems = ("ours", "ours_module", "hf")
    assert keys == {(f, P, s) for f in families for P in (40, 72) for s in systems}
    for row in report["rows"]:
        assert row["first_call_s"] > 0 and row["repeats"] == 2 and len(row["warm_s"]) == 2, row
        assert row["floor_s"] > 0
    for family in families:
        for P in (40, 72):
            ours, module, hf = (next(r for r in report["rows"] if (r["family"], r["P"], r["system"]) == (family, P, s))
                                for s in systems)
            assert report["headline"][f"prefill_over_hf_{family}_{P}"] == round(
                ours["warm_median_s"] / hf["warm_median_s"], 4)
            assert report["headline"][f"prefill_over_hf_{family}_{P}_first_call"] == round(
                ours["first_call_s"] / hf["first_call_s"], 4)
            assert report["headline"][f"fused_over_module_prefill_{family}_{P}"] == round(
                ours["warm_median_s"] / module["warm_median_s"], 4)
    rows = list(csv.DictReader((tmp_path / "family_prefill.csv").open()))
    assert len(rows) == 18 and {r["system"] for r in rows} == set(systems)


def test_family_prefill_bench_profile_dry_run(tmp_path):
    """``--profile`` (the Gemma-3-270M prefill's kernels against its wall time): one profiled call of ours per P with
    its wall time, op count and top ops (CPU ops in the dry run), their times summing to the reported total."""
    script = BENCHMARKS / "family_prefill_bench.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path), "--dry-run", "--families", "gemma3_270m",
                    "--skip-hf", "--profile"], check=True, capture_output=True)
    report = json.loads((tmp_path / "family_prefill.json").read_text())
    assert report["errors"] == {} and set(report["profiles"]) == {"gemma3_270m_40", "gemma3_270m_72"}
    for prof in report["profiles"].values():
        assert prof["wall_s"] > 0 and prof["kernels"] > 0 and 0 < len(prof["top"]) <= 25
        assert all(r["us"] > 0 and r["calls"] > 0 for r in prof["top"])
        assert sum(r["us"] for r in prof["top"]) <= prof["kernel_ms"] * 1e3 + 0.1  # kernel_ms: 0.1 us rounding
