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
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="local directory"):
        FoldConfig.from_pretrained("nobody/not-a-real-repo-fold")
