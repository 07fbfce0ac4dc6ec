import json
import math

import pytest

from fold_hf import FoldConfig


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(mode="bogus"), "mode"),
        (dict(window=0), "window"),
        (dict(window=-3), "window"),
        (dict(window=2.5), "window"),
        (dict(alpha=0.5), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(alpha="abc"), "alpha"),
        (dict(sinks=-1), "sinks"),
        (dict(budget=3, sinks=4), "budget"),
        (dict(train_length=1), "train_length"),
        (dict(layers="some"), "layers"),
    ],
)
def test_bad_fields_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        FoldConfig(**kwargs)


def test_round_trip_through_directory_and_file(tmp_path):
    cfg = FoldConfig(mode="rerope", window=384, alpha=4.0, sinks=2, budget=100, train_length=512, layers="full",
                     target_model="t", drafter_model="d")
    path = cfg.save_pretrained(tmp_path / "x")
    assert path.name == "fold_config.json"
    assert FoldConfig.from_pretrained(tmp_path / "x") == cfg
    assert FoldConfig.from_pretrained(path) == cfg
    assert FoldConfig.from_pretrained(tmp_path / "x", window=64).window == 64


def test_infinite_alpha_survives_json(tmp_path):
    FoldConfig(alpha=math.inf).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "fold_config.json").read_text())["alpha"] == "inf"
    assert math.isinf(FoldConfig.from_pretrained(tmp_path).alpha)


def test_unknown_field_in_file_is_rejected(tmp_path):
    (tmp_path / "fold_config.json").write_text(json.dumps({"mode": "fold", "windw": 3}))
    with pytest.raises(ValueError, match="windw"):
        FoldConfig.from_pretrained(tmp_path)


def test_missing_directory_file_and_offline_hub_id(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="fold_config.json"):
        FoldConfig.from_pretrained(tmp_path)
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub read the variable when it was imported: offline now, not after ~20 s of network retries
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="local directory"):
        FoldConfig.from_pretrained("nobody/not-a-real-repo-fold")


@pytest.mark.parametrize(
    "name, window, train_length, drafter",
    [
        ("llama3.1-8b-dflash", 2048, 3072, "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"),
        ("qwen3.5-9b-dflash", 4096, 40000, "z-lab/Qwen3.5-9B-DFlash"),
        ("gemma4-12b-dflash", 4096, 4096, "deepseek-ai/dflash_gemma4_12b_block7"),
        ("qwen3-8b-dflash", 2048, 4096, "deepseek-ai/dflash_qwen3_8b_block7"),
        ("qwen3-8b-dspark", 2048, 4096, "deepseek-ai/dspark_qwen3_8b_block7"),
    ],
)
def test_paper_presets_by_short_name(name, window, train_length, drafter, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # presets never touch the Hub
    cfg = FoldConfig.from_pretrained(name)
    assert (cfg.mode, cfg.window, cfg.alpha, cfg.train_length, cfg.drafter_model) == (
        "fold", window, 2.0, train_length, drafter)
    assert cfg.target_model and cfg.streaming_budget == 2048
    assert FoldConfig.from_pretrained(name, alpha=4.0).alpha == 4.0


def test_embedded_drafter_config_matches_its_preset():
    from fold_hf.embedded import DEFAULT_DRAFTER

    shipped = FoldConfig.from_pretrained(DEFAULT_DRAFTER)
    preset = FoldConfig.from_pretrained("smollm2-135m-dflash")
    assert (shipped.window, shipped.alpha, shipped.train_length) == (preset.window, preset.alpha, preset.train_length)


@pytest.mark.parametrize("pair_key", ["smollm2-135m", "gemma3-270m"])
def test_committed_drafters_read_with_fold_as_their_pairs_are_benchmarked(pair_key):
    """A committed drafter's own preset (what `load_pair(...)` and `FoldDrafter.from_pretrained` give a user) is the
    FOLD reading its pair's results were measured with: mode fold, alpha 2, the pair's window W and training length R
    (until 2026-12-07 the Gemma drafter's said dflash, W 2048, R 4096: a user's generate read it as trained)."""
    from fold_hf.cli import _apply_pair_defaults, build_parser
    from fold_hf.pairs import get_pair

    argv = ["bench", "--pair", pair_key, "--out", "x"]
    parser = build_parser()
    _apply_pair_defaults(parser, argv)  # what `fold-hf bench --pair ...` runs with
    bench = parser.parse_args(argv)
    shipped = FoldConfig.from_pretrained(get_pair(pair_key).drafter_dir)
    assert (shipped.mode, shipped.alpha) == ("fold", 2.0)
    assert (shipped.window, shipped.train_length) == (bench.window, bench.train_length)
    # and R is what the drafter's own training record says it saw (`fold-hf doctor` warns otherwise): the Gemma
    # drafter's position span (PoSE, 5,120), SmolLM2's 768 tokens
    from fold_hf.embedded import recorded_training_length

    assert recorded_training_length(get_pair(pair_key).drafter_dir)[0] == shipped.train_length
