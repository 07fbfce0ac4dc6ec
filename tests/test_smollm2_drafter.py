"""The committed SmolLM2-135M drafter is the run its results folder documents (issue #38): the recipe's shape, the
held-out τ and size bars, the weights' digest, and the by-tier tables recomputed from the committed runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from mix_drafter_runs import assert_tables_are_the_runs

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "results" / "2026-12-06-nvidia-h100-smollm2-mix-drafter"


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
    assert_tables_are_the_runs(RUN, (2048, 8192), per_tier=48)
