"""`fold-hf doctor` reports every problem of a pair and config, and what would run."""

import json

from fold_hf import FoldConfig
from fold_hf.cli import main
from fold_hf.doctor import diagnose
from tiny import drafter_config, tiny_drafter, tiny_target


def test_healthy_pair_is_all_ok_and_describes_the_plan():
    target = tiny_target("qwen3")
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16, train_length=64), layer_types=[
        "sliding_attention", "full_attention"], sliding_window=12)
    checks = {c.name: c for c in diagnose(target, drafter, context_length=100)}
    assert all(c.status == "ok" for c in checks.values()), [c for c in checks.values() if c.status != "ok"]
    assert "far memory" in checks["plan"].message and "window + far memory" in checks["sliding layers"].message
    window_only = {c.name: c for c in diagnose(target, drafter, FoldConfig(mode="window", window=16),
                                                context_length=100)}
    assert "far memory" not in window_only["plan"].message  # the plan follows the config asked about


def test_every_problem_is_listed_at_once():
    target = tiny_target("llama")
    cfg = drafter_config(target)
    cfg.num_target_layers, cfg.target_layer_ids, cfg.mask_token_id = 8, [1, 7], 99
    from fold_hf import FoldDrafter

    drafter = FoldDrafter(cfg, FoldConfig(window=200, train_length=64))
    bad = {c.name: c.status for c in diagnose(target, drafter) if c.status != "ok"}
    assert bad == {"target layers": "error", "tapped layers": "error", "mask token": "error",
                   "window vs training length": "warn"}


def test_cli_checks_a_target_config_without_weights(tmp_path, capsys):
    target = tiny_target("llama")
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16, train_length=64))
    drafter.save_pretrained(tmp_path / "drafter")
    target.config.save_pretrained(tmp_path / "target")
    assert main(["doctor", "--drafter", str(tmp_path / "drafter"), "--target-config", str(tmp_path / "target")]) == 0
    out = capsys.readouterr().out
    assert "ERROR" not in out and "plan" in out
    config = json.loads((tmp_path / "target" / "config.json").read_text())
    config["hidden_size"] = 64
    (tmp_path / "target" / "config.json").write_text(json.dumps(config))
    assert main(["doctor", "--drafter", str(tmp_path / "drafter"), "--target-config", str(tmp_path / "target")]) == 1
    assert "ERROR  hidden size" in capsys.readouterr().out


def test_cli_reports_a_broken_checkpoint_as_an_error_line(tmp_path, capsys):
    target = tiny_target("llama")
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16, train_length=64))
    drafter.save_pretrained(tmp_path / "drafter")
    target.config.save_pretrained(tmp_path / "target")
    weights = tmp_path / "drafter" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated download
    assert main(["doctor", "--drafter", str(tmp_path / "drafter"), "--target-config", str(tmp_path / "target")]) == 1
    out = capsys.readouterr().out
    assert "ERROR  checkpoint" in out and "model.safetensors" in out
