"""``benchmarks/held_out_tau.py``: held-out τ of several drafters on the same windows, after a training run.

On a tiny Llama target (fp32) and two tiny drafters saved as a run saves them: each row names the weights it read by
their sha256 (hashlib over the file), every greedy output is AR's (the target in fp32), τ lies in [1, B], the same
drafter under two names gives the same row (the windows are the same for every drafter), and the held-out texts are
each kind's first 40 group streams of the mix's evaluation side (as ``train-drafter --sources mix`` holds them out).
"""

import hashlib
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import held_out_tau  # noqa: E402
from tiny import VOCAB, tiny_drafter, tiny_target  # noqa: E402

from fold_hf.data.mix import Doc, Mix, save_mix  # noqa: E402


class CharTokenizer:
    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % VOCAB for c in text]}


def test_held_out_texts_are_each_kinds_first_40_evaluation_streams(tmp_path):
    docs = [Doc("prose", "s", f"g{g:02d}", f"n{g}", "eval", f"text {g}") for g in range(45)]
    docs += [Doc("prose", "s", "t", "n", "train", "training text"), Doc("logs", "s", "l", "n", "eval", "a log")]
    path = save_mix(Mix(docs), tmp_path / "mix.jsonl.gz")
    texts = held_out_tau.held_out_windows(path)
    assert len(texts) == 41 and not any("training text" in t for t in texts)
    assert sum("a log" in t for t in texts) == 1 and sum(t.endswith("text 44") for t in texts) == 0


def test_every_drafter_on_the_same_windows_lossless_and_named_by_its_weights(tmp_path):
    target = tiny_target("llama", dtype=torch.float32)
    folders = {}
    for seed in (1, 2):
        folders[seed] = tmp_path / f"d{seed}"
        tiny_drafter(target, seed=seed).save_pretrained(folders[seed])
    texts = ["".join(chr(97 + (i * 7 + j * 3) % 26) for j in range(200)) for i in range(4)]
    rows = held_out_tau.measure(target, CharTokenizer(), {"a": folders[1], "b": folders[2], "a_again": folders[1]},
                                texts, prompt_tokens=24, new_tokens=12, requests=3, seed=2, bos_token_id=None)
    block = tiny_drafter(target).config.block_size
    for name, seed in (("a", 1), ("b", 2)):
        row = rows[name]
        assert row["sha256"] == hashlib.sha256((folders[seed] / "model.safetensors").read_bytes()).hexdigest()
        assert row["identical_to_ar"] == row["requests"] == 3 and 1.0 <= row["tau_mean"] <= block
        assert (row["prompt_tokens"], row["new_tokens"], row["dtype"]) == (24, 12, "torch.float32")
    assert {k: v for k, v in rows["a_again"].items() if k != "seconds"} == {
        k: v for k, v in rows["a"].items() if k != "seconds"}
    assert rows["a"]["sha256"] != rows["b"]["sha256"]


def test_a_drafter_without_weights_or_a_bad_spec_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no weights"):
        held_out_tau.measure(tiny_target("llama", dtype=torch.float32), CharTokenizer(), {"x": tmp_path}, ["abc" * 50],
                             prompt_tokens=8, new_tokens=4, requests=1, seed=0, bos_token_id=None)
    with pytest.raises(SystemExit):
        held_out_tau.main(["nodir", "--mix-file", "x", "--out", str(tmp_path / "o.json")])
