"""The tables of ``benchmarks/results/2026-12-07-nvidia-h100-gemma3-all-methods-pose/README.md`` recomputed from the
run's records (per-request ``runs.jsonl`` of ``fold-hf bench``), the claim that its requests are the spread-position
run's (the same τ on every row), round C's training record, and the draft-vocabulary keys of
``benchmarks/results/latest/summary.json`` tied to the run.

Every mean is computed here from the records, request by request (τ; TPOT(AR) / TPOT against the AR of the same
process); the 95% intervals are percentile bootstraps over requests (``fold_hf.bench.summary._bootstrap_mean_ci``,
2,000 resamples, seed 0: the same the summary keys use)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from run_tables import ci, fmt_ci, marked_table, per_request, requests_at

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h100-gemma3-all-methods-pose"
POSE = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h100-gemma3-drafter-pose"
NAMES = {"fold-a2": "FOLD α=2", "fold-a4": "FOLD α=4", "fold-a1": "FOLD α=1", "window": "window only",
         "infllm": "InfLLM", "cmr": "CMR", "streaming": "StreamingLLM", "rerope": "ReRoPE", "yarn": "YaRN",
         "dflash": "drafter as trained (dflash)"}
CORE = ("fold-a2", "window", "dflash")
KINDS = ("c", "logs", "markup", "prose", "python", "structured")


def table(name: str) -> list[list[str]]:
    return marked_table(RUN / "README.md", name)


def mean(values) -> float:
    return statistics.mean(values)


def every_method() -> dict:
    """(request, method) -> record, FOLD α=2 / window / dflash from core/ and the other methods from methods/ (each
    with the speed against the AR of its own process)."""
    core, rest = per_request(RUN / "core" / "runs.jsonl"), per_request(RUN / "methods" / "runs.jsonl")
    assert {m for _, m in core} == {"ar", *CORE} and {m for _, m in rest} == {"ar"} | set(NAMES) - set(CORE)
    return {**{k: v for k, v in rest.items() if k[1] != "ar"}, **{k: v for k, v in core.items() if k[1] != "ar"}}


def test_the_requests_are_the_spread_position_runs():
    """τ is deterministic for a drafter, a code path and a request: the committed drafter's 384 rows here equal
    round B's of the spread-position run, so the rebuilt requests are that run's."""
    here = per_request(RUN / "core" / "runs.jsonl")
    there = per_request(POSE / "mixed" / "b" / "runs.jsonl")
    assert here.keys() == there.keys() and len(here) == 384
    assert all(here[k]["tau"] == there[k]["tau"] and here[k]["same_as_ar"] == there[k]["same_as_ar"] for k in here)
    assert "**the same τ on all 384\nrows**" in (RUN / "README.md").read_text()


def test_the_methods_table_is_the_runs():
    runs = every_method()
    at4, at32 = requests_at(runs, 4096), requests_at(runs, 32704)
    assert len(at4) == len(at32) == 48
    want = []
    for method, name in NAMES.items():
        tau32 = [runs[(i, method)]["tau"] for i in at32]
        delta = [runs[(i, "fold-a2")]["tau"] - runs[(i, method)]["tau"] for i in at32]
        want.append([name, f"{mean(runs[(i, method)]['tau'] for i in at4):.2f}", fmt_ci(mean(tau32), *ci(tau32)),
                     f"{mean(runs[(i, method)]['speed'] for i in at32):.2f}×",
                     "—" if method == "fold-a2" else fmt_ci(mean(delta), *ci(delta), sign=True),
                     f"{sum(runs[(i, method)]['same_as_ar'] for i in at4 + at32)} of 96"])
    assert table("methods-table") == want


def test_the_kinds_table_is_the_runs():
    runs = every_method()
    at32 = requests_at(runs, 32704)
    want = []
    for method, name in NAMES.items():
        cells = [name]
        for kind in KINDS:
            ids = [i for i in at32 if runs[(i, method)]["suite"] == f"mixed-{kind}"]
            assert len(ids) == 8
            cells.append(f"{mean(runs[(i, method)]['tau'] for i in ids):.2f}")
        want.append(cells)
    assert table("kinds-table") == want


def test_the_draft_vocabulary_table_and_keys_are_the_runs():
    """Section 3, and the draft-vocabulary keys of latest/summary.json: FOLD at 32K with the committed draft
    vocabulary (mean and bootstrap CI over the 48 requests, rounded to 4 places)."""
    core, dv = per_request(RUN / "core" / "runs.jsonl"), per_request(RUN / "core-dv" / "runs.jsonl")
    want = []
    for tier in (4096, 32704):
        ids = requests_at(core, tier)
        assert ids == requests_at(dv, tier) and len(ids) == 48
        cells = [f"{tier:,}"]
        for run in (core, dv):
            tau, speed = ([run[(i, "fold-a2")][k] for i in ids] for k in ("tau", "speed"))
            cells.append(f"{fmt_ci(mean(tau), *ci(tau))} / {mean(speed):.2f}× "
                         f"[{ci(speed)[0]:.2f}, {ci(speed)[1]:.2f}]")
        want.append(cells)
    assert table("dv-table") == want
    latest = json.loads((ROOT / "benchmarks" / "results" / "latest" / "summary.json").read_text())
    ids = requests_at(dv, 32704)
    for key, values in (("gemma3_fold_speedup_32k_draft_vocab", [dv[(i, "fold-a2")]["speed"] for i in ids]),
                        ("gemma3_fold_tau_32k_draft_vocab", [dv[(i, "fold-a2")]["tau"] for i in ids])):
        low, high = ci(values)
        assert latest[key] == round(mean(values), 4) and latest[key + "_requests"] == 48
        assert (latest[key + "_ci_low"], latest[key + "_ci_high"]) == (round(low, 4), round(high, 4))
    assert latest["gemma3_fold_speedup_32k_draft_vocab"] >= 1.6  # issue #38's speedup goal, with the vocabulary


def test_the_round_c_table_is_the_runs():
    c, b = per_request(RUN / "round-c" / "mixed" / "runs.jsonl"), per_request(RUN / "core" / "runs.jsonl")
    want = []
    for method in ("fold-a2", "dflash", "window"):
        for tier in (4096, 32704):
            ids = requests_at(b, tier)
            assert ids == requests_at(c, tier)
            tc, tb = [c[(i, method)]["tau"] for i in ids], [b[(i, method)]["tau"] for i in ids]
            delta = [x - y for x, y in zip(tc, tb)]
            want.append([NAMES[method], f"{tier:,}", f"{mean(tc):.2f}", f"{mean(tb):.2f}",
                         f"{mean(c[(i, method)]['speed'] for i in ids):.2f}×",
                         fmt_ci(mean(delta), *ci(delta), sign=True)])
    assert table("round-c-table") == want
    # the README's verdict: C is not better than the committed B where the 4K key is measured
    ids = requests_at(b, 4096)
    assert mean(c[(i, "dflash")]["tau"] for i in ids) < mean(b[(i, "dflash")]["tau"] for i in ids)


def test_round_c_training_record_is_the_recipe_stated():
    """Round C's training.json: warm from the committed drafter (carried as .gpu/initC), seed 4, the spread span
    5,120, 960 + 64 tokens, 4,096 windows, and its cosine schedule finished (every scheduled step done)."""
    training = json.loads((RUN / "round-c" / "training" / "training.json").read_text())
    settings, report = training["settings"], training["report"]
    assert settings["init_from"] == ".gpu/initC" and settings["seed"] == 4 and settings["position_span"] == 5120
    assert (settings["prompt_tokens"], settings["new_tokens"]) == (960, 64)
    assert report["data"]["sequences"] == 4096
    assert report["finished"] and report["step"] == settings["steps"] == 1703
    readme = (RUN / "README.md").read_text()
    assert "**1,703 of 1,703 steps, the cosine schedule\nfinished**" in readme
