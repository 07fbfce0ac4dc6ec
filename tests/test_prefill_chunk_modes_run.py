"""The tables of ``benchmarks/results/2026-12-07-nvidia-h100-prefill-chunk-batched-modes/README.md``, recomputed from
the run's CSV and JSON records (each table sits between ``<!-- name: ... -->`` markers), and the run's claims about
the bug it found (every method after the first in a process accepting nothing before the fix, none after)."""

import csv
import json
import re
from pathlib import Path

from run_tables import marked_table, slowest_row_terms

RUN = (Path(__file__).resolve().parents[1] / "benchmarks" / "results"
       / "2026-12-07-nvidia-h100-prefill-chunk-batched-modes")
NAMES = {"fold-a2": "FOLD", "window": "window", "dflash": "dflash"}


def table(name: str) -> list[list[str]]:
    return marked_table(RUN / "README.md", name)


def test_the_prefill_table_is_the_three_processes():
    want = []
    for process in ("default", "c8192", "default2"):
        report = json.load(open(RUN / "prefill" / process / "family_prefill.json"))
        rows = {r["system"]: r for r in csv.DictReader(open(RUN / "prefill" / process / "family_prefill.csv"))
                if r["P"] == "32768"}
        ours, hf = rows["ours"], rows.get("hf")
        chunk = report["chunk"] or 65536  # None: the library's default (StaticTarget.prefill_chunk: 65,536 here)
        ms = lambda r, k="warm_median_s": f"{1e3 * float(r[k]):.1f} ms"  # noqa: E731
        want.append([process, f"{chunk:,}", ms(ours), ms(ours, "floor_s"),
                     f"{float(ours['warm_median_s']) / float(ours['floor_s']):.2f}",
                     ms(hf) if hf else "—",
                     f"{float(ours['warm_median_s']) / float(hf['warm_median_s']):.3f}" if hf else "—",
                     f"{float(ours['peak_gib']):.2f} / " + (f"{float(hf['peak_gib']):.2f}" if hf else "—")])
    assert table("prefill-table") == want
    # the claim: one chunk is at least 1.75x faster than four at 32K, in both processes
    default, c8192, default2 = (float(r[2].split()[0]) for r in want)
    assert c8192 / default > 1.75 and c8192 / default2 > 1.75


def test_the_rule_gave_one_chunk_in_the_default_processes():
    for process, chunk in (("default", None), ("c8192", 8192), ("default2", None)):
        assert json.load(open(RUN / "prefill" / process / "family_prefill.json"))["chunk"] == chunk


def rows_of(folder: str) -> list[dict]:
    return json.load(open(RUN / folder / "batched.json"))["rows"]


def test_the_batched_table_is_the_after_fix_runs():
    want = []
    sources = [("new64", 64, 1), ("new64", 64, 8), ("new256b", 256, 8)]
    for folder, new, B in sources:
        report = json.load(open(RUN / "after-fix" / folder / "batched.json"))
        for method in ("fold-a2", "window", "dflash"):
            row, = [r for r in report["rows"] if r["system"] == method and r["batch"] == B]
            ratios = report["ratios"]
            want.append([f"{new}, {B}, {NAMES[method]}", f"{row['tau_mean']:.2f} ({min(row['tau_rows']):.2f})",
                         f"{ratios[f'{method}_over_ar_throughput_b{B}']:.3f}×",
                         f"{ratios[f'{method}_over_ar_decode_throughput_b{B}']:.3f}×",
                         f"{row['rows_differing_from_ar']}/{row['requests']}"])
    want.sort(key=lambda r: (int(r[0].split(",")[0]), int(r[0].split(",")[1]),
                             ["FOLD", "window", "dflash"].index(r[0].split(", ")[2])))
    assert table("batched-table") == want


def test_before_the_fix_the_second_method_accepted_nothing_and_after_it_every_method_does():
    before = {r["system"]: r for r in rows_of("before-fix/new64")}
    assert before["fold-a2"]["tau_mean"] > 2 and set(before["window"]["tau_rows"]) == {1.0}
    assert before["window"]["rows_differing_from_ar"] == 0  # the outputs were right, no proposal accepted
    log = (RUN / "order-check.log").read_text()
    taus = [(m.group(1), float(m.group(2))) for m in re.finditer(r"suite B= 8 (\S+)\s.*?tau (\d\.\d\d)", log)]
    speculative = [t for t in taus if t[0] != "ar"]
    assert [t for t, _ in speculative] == ["fold-a2", "window", "window", "fold-a2", "dflash", "window"]
    assert all(tau > 1.3 for _, tau in speculative[0::2]) and all(tau == 1.0 for _, tau in speculative[1::2])
    for folder in ("new64", "new256", "new256b"):  # after: every method of every process accepts
        for row in rows_of(f"after-fix/{folder}"):
            if row["system"] != "ar":
                assert row["tau_mean"] > 1.3 and min(row["tau_rows"]) > 1.1, (folder, row["system"], row["batch"])
    assert "28 passed" in (RUN / "after-fix" / "gpu_tests.log").read_text()
    assert "61 passed" in (RUN / "prefill" / "gpu_tests.log").read_text()


def test_the_ceiling_table_is_the_after_fix_runs_recomputed_from_their_rows():
    """Section 4: a batch ends with its slowest row (rounds ≈ new / min τ of its rows), every method shares AR's
    prefill; recomputed here from the rows, independently of benchmarks/batched_ceiling.py."""
    want = []
    for folder in ("new64", "new256b"):
        report = json.load(open(RUN / "after-fix" / folder / "batched.json"))
        for method in ("fold-a2", "window", "dflash"):
            terms = slowest_row_terms(report, method)  # 24 requests, 3 batches of 8
            ar, row, prefill, step, slowest, rounds = (terms[k] for k in ("ar", "row", "prefill", "step", "slowest",
                                                                          "rounds"))
            assert len(slowest) == 3
            need = (ar["seconds"] / 1.3 - prefill) / (rounds * step)
            want.append([f"{ar['new_tokens']}, {NAMES[method]}", " / ".join(f"{t:.2f}" for t in slowest),
                         f"{ar['seconds'] / row['seconds']:.3f}×", f"{row['decode_seconds'] / (rounds * step):.2f}",
                         f"{ar['seconds'] / prefill:.3f}×", f"{ar['seconds'] / (prefill + rounds * step):.3f}×",
                         f"{need:.2f}" if need > 0 else "out of reach"])
    assert table("ceiling-table") == want
    # the claims: at 64 new tokens 1.3x is out of reach of any decoder (the shared prefill alone); at 256 it needs
    # FOLD's rounds at most ~1.1 batched AR steps (the verify alone costs about one)
    assert all(r[6] == "out of reach" and float(r[4][:-1]) < 1.3 for r in want if r[0].startswith("64,"))
    fold256, = [r for r in want if r[0] == "256, FOLD"]
    assert 1.0 < float(fold256[6]) < 1.15 < float(fold256[3])


def test_even_a_prefill_at_its_compute_floor_leaves_64_tokens_short_of_the_goal():
    """Section 4's sentence: every prefill at the compute floor of section 1 (random weights, same shape), rounds of
    one AR step, the slowest rows' τ of new64: FOLD's whole call over AR's is 1.145x < 1.3."""
    floor, = [float(r["floor_s"]) for r in csv.DictReader(open(RUN / "prefill" / "default" / "family_prefill.csv"))
              if r["P"] == "32768" and r["system"] == "ours"]
    terms = slowest_row_terms(json.load(open(RUN / "after-fix" / "new64" / "batched.json")), "fold-a2")
    prefills = 24 * floor
    ceiling = (prefills + terms["ar"]["decode_seconds"]) / (prefills + terms["rounds"] * terms["step"])
    assert f"would reach {ceiling:.3f}×" in (RUN / "README.md").read_text()
    assert ceiling < 1.3


def test_the_ceiling_script_prints_the_tables_numbers(capsys):
    """benchmarks/batched_ceiling.py on new256b: the same ceilings as the table (recomputed above from the rows)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("batched_ceiling", RUN.parents[2] / "benchmarks" / "batched_ceiling.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(RUN / "after-fix" / "new256b" / "batched.json")]) == 0
    printed = capsys.readouterr().out
    for row in table("ceiling-table"):
        if row[0].startswith("256,"):
            assert f"free decoding {row[4][:-1]}x, one-step rounds {row[5][:-1]}x" in printed
            assert f"needs rounds of {row[6]} AR steps" in printed
    assert script.main([str(RUN / "prefill" / "default" / "family_prefill.json")]) == 1  # no suite rows: said
