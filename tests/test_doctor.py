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


def test_a_preset_written_for_another_target_is_named(tmp_path, capsys):
    """Issue #40: ``--config llama3.1-8b-dflash`` on another target said nothing about it."""
    target = tiny_target("llama")
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16, train_length=64))
    drafter.save_pretrained(tmp_path / "drafter")
    target.config.save_pretrained(tmp_path / "target")
    args = ["doctor", "--drafter", str(tmp_path / "drafter"), "--target-config", str(tmp_path / "target")]
    main(args + ["--config", "llama3.1-8b-dflash"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(" WARN  preset")]
    assert len(lines) == 1
    assert "llama3.1-8b-dflash describes NousResearch/Meta-Llama-3.1-8B-Instruct" in lines[0]
    assert "window 2048" in lines[0] and "training length 3072" in lines[0]
    # the same preset on a target directory that is the preset's target: no preset line
    target.config.save_pretrained(tmp_path / "Meta-Llama-3.1-8B-Instruct")
    main(args[:3] + ["--target-config", str(tmp_path / "Meta-Llama-3.1-8B-Instruct"), "--config", "llama3.1-8b-dflash"])
    assert " WARN  preset" not in capsys.readouterr().out
    # no --config: the drafter's own config, nothing to compare
    main(args)
    assert " WARN  preset" not in capsys.readouterr().out


def test_the_preset_check_names_the_fitting_preset():
    from fold_hf.commands import preset_check

    check = preset_check("llama3.1-8b-dflash", "SmolLM2-135M-Instruct (embedded)")
    assert check.status == "warn" and "the preset for this target is smollm2-135m-dflash" in check.message
    assert preset_check("smollm2-135m-dflash", "SmolLM2-135M-Instruct (embedded)") is None
    assert preset_check("qwen3-8b-dflash", "x", "Qwen/Qwen3-8B") is None
    assert preset_check("not-a-preset", "x") is None  # a directory or file: no claim about a target


def test_doctor_on_the_embedded_pair_loads_no_target_weights(real_pair, monkeypatch, capsys):
    import fold_hf.modeling.gguf_target as gguf_target

    def refuse(*args, **kwargs):
        raise AssertionError("doctor loaded the target's weights")

    monkeypatch.setattr(gguf_target, "load_gguf_target", refuse)
    monkeypatch.setattr(gguf_target, "load_smollm2", refuse)
    assert main(["doctor", "--config", "llama3.1-8b-dflash"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct (embedded)" in out and " WARN  preset" in out
    assert "the preset for this target is smollm2-135m-dflash" in out


def test_doctor_help_states_the_default_context_as_the_code_computes_it(capsys):
    import re

    import pytest

    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "4 x (W + B)" in help_text and "no target weights are loaded" in help_text
    # the code's default: 4 x (W + B) context entries
    target = tiny_target("llama")
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16, train_length=64))
    plan = next(c for c in diagnose(target, drafter) if c.name == "plan").message
    assert re.search(rf"at {4 * (16 + drafter.block_size)} context entries", plan), plan
