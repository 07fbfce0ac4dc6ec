"""The tables of ``benchmarks/results/2026-12-07-nvidia-h100-gemma3-drafter-pose/README.md`` recomputed from the
run's records (per-request ``runs.jsonl`` of ``fold-hf bench``), issue #38's headline keys in
``benchmarks/results/latest/summary.json`` tied to the run, and the committed Gemma-3 drafter tied to its round B
(weights' sha256, training.json, card, preset).

Every mean is computed here from the records, request by request (τ; TPOT(AR) / TPOT against the AR of the same
process); the 95% intervals are percentile bootstraps over requests (``fold_hf.bench.summary._bootstrap_mean_ci``,
2,000 resamples, seed 0: the same the summary keys use). The replaced drafter's rows are its own run
(``2026-12-07-nvidia-h100-gemma3-drafter-round2/mixed/new``, the same 96 requests, the same kind of machine)."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

from run_tables import ci, fmt_ci, marked_table, per_request, records, requests_at

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h100-gemma3-drafter-pose"
ROUND2 = ROOT / "benchmarks" / "results" / "2026-12-07-nvidia-h100-gemma3-drafter-round2"
TIERS = (4096, 32704)
NAMES = {"fold-a2": "FOLD α=2", "window": "window only", "dflash": "drafter as trained (dflash)"}
SHA_B = "5e43683d0524f41a5c2c4463d9088f3a214e12e5afa7dd35c61c27a2bbcf43d8"
SHA_A = "eccc4cb5fba5ac60a2f88fec7506d302ef1c65ffabb073ff00ec4a3c8f45b56f"
SHA_ROUND2 = "577c31aa8a60d832891e89c143317a2701b6b1bd7366c48a9dd6a95e4dd98bf6"


def runs() -> tuple[dict, dict, dict]:
    """Round B (committed), round A, and the replaced round-2 drafter."""
    return (per_request(RUN / "mixed" / "b" / "runs.jsonl"), per_request(RUN / "mixed" / "a" / "runs.jsonl"),
            per_request(ROUND2 / "mixed" / "new" / "runs.jsonl"))


def paired(values_a: list[float], values_b: list[float]) -> str:
    delta = [a - b for a, b in zip(values_a, values_b)]
    return fmt_ci(statistics.mean(delta), *ci(delta), sign=True)


def drafter_table() -> list[list[str]]:
    b, a, old = runs()
    rows = []
    for method in ("fold-a2", "dflash", "window"):
        for tier in TIERS:
            ids = requests_at(b, tier)
            assert len(ids) == 48 and ids == requests_at(a, tier) == requests_at(old, tier)
            tau = {name: [run[(i, method)]["tau"] for i in ids] for name, run in (("b", b), ("a", a), ("old", old))}
            speed = {name: [run[(i, method)]["speed"] for i in ids] for name, run in (("b", b), ("old", old))}
            rows.append([NAMES[method], f"{tier:,}", fmt_ci(statistics.mean(tau["b"]), *ci(tau["b"])),
                         f"{statistics.mean(tau['a']):.2f}", f"{statistics.mean(tau['old']):.2f}",
                         f"{statistics.mean(speed['b']):.2f}× / {statistics.mean(speed['old']):.2f}×",
                         paired(tau["b"], tau["old"]), paired(tau["b"], tau["a"])])
    return rows


def kinds_table() -> list[list[str]]:
    b, _, old = runs()
    rows = []
    for kind in ("python", "c", "markup", "structured", "logs", "prose"):
        cells = [kind]
        for method, tier in (("dflash", 4096), ("dflash", 32704), ("fold-a2", 4096), ("fold-a2", 32704),
                             ("window", 32704)):
            ids = [i for i in requests_at(b, tier) if b[(i, method)]["suite"] == f"mixed-{kind}"]
            assert len(ids) == 8
            cells.append(f"{statistics.mean(old[(i, method)]['tau'] for i in ids):.2f} → "
                         f"{statistics.mean(b[(i, method)]['tau'] for i in ids):.2f}")
        rows.append(cells)
    return rows


def table(name: str) -> list[list[str]]:
    return marked_table(RUN / "README.md", name)


def test_the_drafter_table_is_the_runs():
    assert table("drafter-table") == drafter_table()


def test_the_kinds_table_is_the_runs():
    assert table("kinds-table") == kinds_table()


def test_every_record_is_a_whole_request_of_the_mixed_suite():
    """Both rounds: 96 requests x (AR + dflash, FOLD, window), 64 new tokens each, fast engine, bf16, not exact; the
    outputs differing from AR are the README's count (bf16 near-ties)."""
    readme = (RUN / "README.md").read_text()
    for folder in ("a", "b"):
        rows = records(RUN / "mixed" / folder / "runs.jsonl")
        assert len(rows) == 384 and {r["method"] for r in rows} == {"ar", "dflash", "fold-a2", "window"}
        assert all(r["new_tokens"] == 64 and r["engine"] == "fast" and r["dtype"] == "bfloat16" and not r["exact"]
                   for r in rows)
    b = records(RUN / "mixed" / "b" / "runs.jsonl")
    differ = {m: sum(not r["same_as_ar"] for r in b if r["method"] == m) for m in ("fold-a2", "dflash", "window")}
    assert (f"{differ['fold-a2']} of 96 FOLD outputs differ from AR ({differ['dflash']} for the drafter as trained, "
            f"{differ['window']} for the window)") in readme


def test_latest_summary_headline_keys_are_round_b():
    """latest/summary.json: issue #38's four keys (+ CIs, request counts) from round B's records, as `fold-hf
    summarize --headline gemma3` writes them (the library's headline_keys), rounded to 4 places; and the README's
    goal lines quote them."""
    from fold_hf.bench.summary import headline_keys

    latest = json.loads((ROOT / "benchmarks" / "results" / "latest" / "summary.json").read_text())
    keys = headline_keys(records(RUN / "mixed" / "b" / "runs.jsonl"), "gemma3")
    assert len(keys) == 16 and all(latest[k] == (round(v, 4) if isinstance(v, float) else v) for k, v in keys.items())
    # an independent statement of two of them: the mean of τ, and of TPOT(AR) / TPOT, over the 48 requests
    b = per_request(RUN / "mixed" / "b" / "runs.jsonl")
    ids = requests_at(b, 4096)
    assert abs(statistics.mean(b[(i, "dflash")]["tau"] for i in ids) - keys["gemma3_tau_4k_dflash"]) < 1e-12
    ids = requests_at(b, 32704)
    assert abs(statistics.mean(b[(i, "fold-a2")]["speed"] for i in ids) - keys["gemma3_fold_speedup_32k"]) < 1e-12
    readme = (RUN / "README.md").read_text()
    assert f"τ at 4K {keys['gemma3_tau_4k_dflash']:.3f}" in readme
    assert f"FOLD τ at 32K {keys['gemma3_fold_tau_32k']:.2f}" in readme
    assert f"{keys['gemma3_fold_speedup_32k']:.2f}× AR per token at 32K" in readme


def test_the_held_out_table_is_the_cpu_measurement():
    """Section 2: the three drafters' held-out τ on the same 16 windows (training/held_out.json, the CPU runs; the
    round-2 drafter's row is its run's own measurement), each row naming the weights it read."""
    held = json.loads((RUN / "training" / "held_out.json").read_text())
    round2 = json.loads((ROUND2 / "training" / "held_out.json").read_text())["new"]
    assert held["round2"] == round2 and round2["sha256"] == SHA_ROUND2
    assert (held["b"]["sha256"], held["a"]["sha256"]) == (SHA_B, SHA_A)
    assert {h["prompt_tokens"] for h in held.values() if isinstance(h, dict)} == {960}
    want = [[f"{name} (sha256 {held[key]['sha256'][:8]}…)", f"{held[key]['tau_mean']:.2f}",
             f"{held[key]['identical_to_ar']} of {held[key]['requests']}"]
            for key, name in (("b", "round B (committed)"), ("a", "round A"), ("round2", "round 2 (replaced)"))]
    assert table("heldout-table") == want
    training = json.loads((RUN / "training" / "b" / "training.json").read_text())
    assert training["report"]["held_out"]["tau_mean"] == held["b"]["tau_mean"]


def test_the_committed_drafter_is_round_b():
    """fold_hf/assets/gemma3-270m-dflash: the weights round B measured (sha256), its training.json the run's copy
    (PoSE over 5,120 positions, 960 + 64 tokens, warm from round A), its card naming the recipe and the Gemma terms,
    the shape unchanged, and its preset's R the span (what `fold-hf doctor` reads from the training record)."""
    from fold_hf.embedded import recorded_training_length

    folder = ROOT / "fold_hf" / "assets" / "gemma3-270m-dflash"
    assert hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() == SHA_B
    assert f"`{SHA_B}`" in (RUN / "README.md").read_text()
    training = json.loads((folder / "training.json").read_text())
    assert json.loads((RUN / "training" / "b" / "training.json").read_text()) == training
    settings, report = training["settings"], training["report"]
    assert (settings["prompt_tokens"], settings["new_tokens"], settings["position_span"]) == (960, 64, 5120)
    assert settings["seed"] == 3 and (report["step"], settings["steps"]) == (1243, 1631) and not report["finished"]
    a = json.loads((RUN / "training" / "a" / "training.json").read_text())
    assert a["settings"]["position_span"] == 5120 and a["settings"]["seed"] == 2 and a["report"]["step"] == 1624
    card = (folder / "README.md").read_text()
    assert "Gemma Terms of Use" in card and "rope positions spread over 5120 (PoSE)" in card and SHA_A[:8] in card
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 4 and config["intermediate_size"] == 512
    assert config["dflash_config"]["block_size"] == 8
    assert recorded_training_length(folder)[0] == 5120
    assert json.loads((folder / "fold_config.json").read_text())["train_length"] == 5120
    assert (folder / "model.safetensors").stat().st_size <= 30_000_000
