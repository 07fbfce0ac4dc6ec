"""The committed SmolLM2-135M drafter is the run its results folder documents (issue #38): the recipe's shape, the
held-out τ and size bars, the weights' digest, and the by-tier tables recomputed from the committed runs."""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "2026-12-06-nvidia-h100-smollm2-mix-drafter"
KINDS = {f"mixed-{k}" for k in ("python", "c", "markup", "structured", "logs", "prose")}


def test_committed_smollm2_drafter_is_the_documented_run():
    from fold_hf.pairs import get_pair
    from fold_hf.train_drafter import TrainSettings

    folder = get_pair("smollm2-135m").drafter_dir
    config = json.loads((folder / "config.json").read_text())
    recipe = TrainSettings()
    assert config["num_hidden_layers"] == recipe.layers == 6 and config["intermediate_size"] == 448
    assert config["dflash_config"]["block_size"] == recipe.block_size
    assert config["dflash_config"]["mask_token_id"] == 16
    assert config["hidden_size"] == 576 and config["num_target_layers"] == 30
    training = json.loads((folder / "training.json").read_text())
    report = training["report"]
    assert training["settings"]["prompt_tokens"] + training["settings"]["new_tokens"] == 768  # ≤ 1,024 (issue #38)
    assert report["finished"] and report["held_out"]["tau_mean"] >= 3.0
    assert training["settings"]["init_from"] and training["settings"]["kl"] == 0.5
    assert (folder / "model.safetensors").stat().st_size <= 30_000_000
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    readme = (RUN / "README.md").read_text()
    assert digest in readme and digest in (folder / "README.md").read_text()
    assert "Apache-2.0" in (folder / "README.md").read_text()
    assert f"**{report['held_out']['tau_mean']:.2f}**" in readme
    assert json.loads((RUN / "training" / "training.json").read_text()) == training
    assert f"**{report['step']:,} steps**" in readme and f"{training['settings']['kl']:g} × KL" in readme


def test_smollm2_run_tables_are_the_committed_runs():
    """Both drafters' by-tier tables (mean τ, mean TPOT(AR) / TPOT request by request, every kind pooled) recomputed
    from the two committed runs.jsonl; each run holds every kind at both tiers."""
    readme = (RUN / "README.md").read_text()
    tables = readme.split("**retrained\ndrafter**")[1].split("Per kind")[0].split("**replaced drafter**")
    assert len(tables) == 2
    for name, table in zip(("new", "old"), tables):
        runs = [json.loads(line) for line in (RUN / name / "run" / "runs.jsonl").read_text().splitlines()]
        ar = {r["request"]: r["tpot_s"] for r in runs if r["method"] == "ar"}
        for method in ("fold-a2", "dflash", "window"):
            cells = []
            for tier in (2048, 8192):
                sel = [r for r in runs if r["method"] == method and r["tier"] == tier]
                assert {r["suite"] for r in sel} == KINDS and len(sel) == 48
                tau = statistics.mean(r["tau"] for r in sel)
                speed = statistics.mean(ar[r["request"]] / r["tpot_s"] for r in sel)
                cells.append(f"{tau:.2f} / {speed:.2f}×")
            assert f"| {method} | " + " | ".join(cells) + " |" in table, (name, method)
