"""The tables of ``benchmarks/results/2026-12-07-cpu-amd-onednn-gemm/README.md`` recomputed from the files beside it
(``cpu_round_profile.json`` of ``benchmarks/cpu_round_profile.py --backends onednn,mkl,off``, the two demo outputs),
and the script's backend switch (which environment each backend name sets, and that it restores the caller's)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from run_tables import marked_table

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "2026-12-07-cpu-amd-onednn-gemm"
sys.path.insert(0, str(ROOT / "benchmarks"))

import cpu_round_profile  # noqa: E402

from fold_hf.kernels.gemm import cpu as cpu_gemm  # noqa: E402

ROW = re.compile(r"^(?P<name>\S.*?)\s{2,}(?P<tau>\d+\.\d+)\s+(?P<toks>\d+\.\d+)\s.*?(?P<speed>\d+\.\d+)x.*?"
                 r"(?P<same>True|False)\s*$")


def demo_rows(name: str) -> dict[str, dict]:
    """The method lines of a ``fold-hf demo`` output: method -> τ, tok/s (median), speedup (median), same as AR."""
    rows = {}
    for line in (RUN / name).read_text().splitlines():
        match = ROW.match(line)
        if match:
            rows[match["name"].strip()] = {"tau": match["tau"], "toks": match["toks"], "speed": match["speed"],
                                           "same": match["same"]}
    return rows


def test_the_profile_table_is_the_json():
    report = json.loads((RUN / "cpu_round_profile.json").read_text())
    assert report["cpu_vendor"] == "AuthenticAMD" and report["default_backend"] == "onednn"
    blocks = [report["backends"][b] for b in ("onednn", "mkl", "off")]

    def cells(part: str, ratio: bool) -> list[str]:
        return [f"{b['ms'][part]:.1f}" + (f" ({b['x_ar_step'][part]:.2f})" if ratio else "") for b in blocks]

    want = [["AR step (1 row)", *cells("ar_step", False)], ["verify of 8 rows", *cells("verify", True)],
            ["drafter round", *cells("draft", True)], ["of which the lm_head over 7 rows", *cells("draft_lm_head", False)],
            ["whole round (`time_rounds`)", *cells("round", True)],
            ["break-even τ (round / AR round)", *[f"{b['break_even_tau']:.2f}" for b in blocks]]]
    assert marked_table(RUN / "README.md", "profile-table") == want
    # the README's claim: oneDNN's round is the cheapest of the three in the same process
    assert blocks[0]["ms"]["round"] < min(blocks[1]["ms"]["round"], blocks[2]["ms"]["round"])


def test_the_demo_table_is_the_three_outputs():
    runs = [demo_rows(name) for name in ("demo-before.txt", "demo-after-1.txt", "demo-after-2.txt")]
    want = []
    for method in runs[2]:
        cells = [f"{run[method]['toks']} / {run[method]['speed']}×" if method in run else "—" for run in runs]
        same = " / ".join(run[method]["same"] if method in run else "—" for run in runs)
        want.append([method, runs[2][method]["tau"], *cells, same])
    assert marked_table(RUN / "README.md", "demo-table") == want
    assert all(row["same"] == "True" for run in runs for row in run.values())  # every output AR's
    assert all(run[m]["tau"] == runs[2][m]["tau"] for run in runs for m in run)  # same τ: only the speed moved


@pytest.mark.parametrize("backend, packed, chosen", [("onednn", None, "onednn"), ("mkl", None, "mkl"),
                                                     ("off", "0", None), ("default", None, None)])
def test_the_profile_scripts_backend_switch(backend, packed, chosen, monkeypatch):
    monkeypatch.delenv(cpu_gemm.BACKEND_ENV, raising=False)
    monkeypatch.setenv(cpu_gemm.PACKED_ENV, "auto")
    saved = {cpu_gemm.BACKEND_ENV: None, cpu_gemm.PACKED_ENV: "auto"}
    cpu_round_profile._select(backend, saved)
    assert os.environ.get(cpu_gemm.BACKEND_ENV) == chosen
    assert os.environ.get(cpu_gemm.PACKED_ENV) == (packed or "auto")
    cpu_round_profile._select("default", saved)
    assert cpu_gemm.BACKEND_ENV not in os.environ and os.environ[cpu_gemm.PACKED_ENV] == "auto"
