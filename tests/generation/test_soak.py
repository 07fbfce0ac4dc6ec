"""A CPU subset of the lossless soak (benchmarks/soak.py): six real prompts of every kind, every reading mode on
both generate paths, each output identical to the target's own greedy output.

The full soak (300 prompts) runs on the GPU machine. The SmolLM2 pair comes from the same fold_hf cache as
test_real_pair.py (``$FOLD_HF_CACHE``, default ``~/.cache/fold_hf``): fetched and de-quantized once.
"""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SOAK_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def load_soak():
    spec = importlib.util.spec_from_file_location("fold_soak", SOAK_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


soak = load_soak()
WINDOW, BLOCK = 8, 8  # small window: prompts of 7..40 tokens sit at W-1 .. W+B+1 or reach the far memory


@pytest.fixture(scope="module")
def prompts(real_pair):
    _, tokenizer, _ = real_pair
    built = soak.build_prompts(tokenizer, count=40, window=WINDOW, block_size=BLOCK, seed=1, min_tokens=12,
                               max_tokens=40)
    boundary = [p for p in built if p["kind"] == "boundary"]
    lengths = {len(p["input_ids"]) for p in boundary}
    assert lengths == {WINDOW - 1, WINDOW, WINDOW + 1, WINDOW + BLOCK - 1, WINDOW + BLOCK, WINDOW + BLOCK + 1}
    first = {kind: next(p for p in built if p["kind"] == kind) for kind in ("chat", "midword", "span")}
    spans = [p for p in built if p["kind"] == "span"]
    chosen = [boundary[1], boundary[-2], first["chat"], first["midword"], spans[0], spans[1]]  # W-1, W+B+1, ...
    assert len({p["id"] for p in chosen}) == 6
    return chosen


def test_prompt_kinds_are_what_they_claim(real_pair, prompts):
    _, tokenizer, _ = real_pair
    chat = next(p for p in prompts if p["kind"] == "chat")
    assert tokenizer.decode(chat["input_ids"]).endswith("<|im_start|>assistant\n")
    mid = next(p for p in prompts if p["kind"] == "midword")
    text = tokenizer.decode(mid["input_ids"])
    assert text[-1].isalpha() and text[-2].isalpha()
    special = set(tokenizer.all_special_ids)
    assert all(p["input_ids"][-1] not in special for p in prompts)


def test_soak_subset_every_mode_both_paths_identical_to_ar(real_pair, prompts, tmp_path):
    target, tokenizer, drafter = real_pair
    configs = soak.mode_configs(WINDOW, 64)
    names = list(configs)
    runs = tmp_path / "runs-float32"
    runs.mkdir()
    with (runs / "shard-0of1.jsonl").open("w") as fh:
        for k, prompt in enumerate(prompts):
            # a CPU verifies a block at the cost of reading every weight once (~0.25 s here), so the modes take turns:
            # prompt k runs modes k and k + 6 on every path, each prompt kind meets every path, each mode one kind
            # (every mode's losslessness on many prompts is the tiny grids' job: test_lossless, test_fast_loop)
            turn = {name: configs[name] for name in names[k :: len(prompts)]}
            record = soak.run_prompt(target, tokenizer, drafter, prompt, turn, new_tokens=6)
            fh.write(json.dumps(record) + "\n")
            different = {k: v["divergence"] for k, v in record["runs"].items() if not v["same"]}
            assert not different, f"{prompt['id']}: {different}"
    summary = soak.summarize(tmp_path, "float32", tie_gap=1e-3, planned=len(prompts))
    assert summary["prompts_done"] == 6 and summary["different"] == 0
    assert set(summary["by_mode_path"]) == {f"{m}/{p}" for m in soak.MODES for p in soak.PATHS}
    assert all(c["identical"] == 1 for c in summary["by_mode_path"].values())
    assert any(c["tau"] > 1 for c in summary["by_mode_path"].values())  # the drafter did contribute


def test_a_difference_is_reported_with_its_round_and_logit_gap(real_pair, prompts):
    target, tokenizer, _ = real_pair
    ids = torch.tensor([prompts[-1]["input_ids"]])
    ar = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
    ar = ar.tolist()
    sd = list(ar)
    sd[5] = (ar[5] + 1) % target.config.vocab_size  # as if token 5 had been decided differently
    d = soak.first_divergence(target, tokenizer, ids, ar, sd, acceptance=[2, 3, 2])
    # token 0 from the prefill, round 1 commits tokens 1-2, round 2 tokens 3-5: token 5 is its third
    assert (d["token_index"], d["round"], d["index_in_round"]) == (5, 2, 2)
    assert d["ar_token"] == ar[5] and d["sd_token"] == sd[5]
    assert d["ar_minus_sd_logit"] > 0 and d["top2_gap"] >= 0  # greedy AR took the argmax


def test_workers_share_prompts_by_claims_and_take_over_a_dead_workers_prompt(tmp_path):
    import subprocess
    import sys

    assert soak.claim_prompt(tmp_path, "p1")
    assert not soak.claim_prompt(tmp_path, "p1"), "a prompt this process holds is not handed out again"
    # a claim held by another running soak worker stays with it; once that worker is gone, its prompt is taken over
    other = subprocess.Popen([sys.executable, "-c", "print(flush=True); import time; time.sleep(60)", "soak-worker"],
                             stdout=subprocess.PIPE)
    try:
        other.stdout.readline()  # the worker runs (its command line is in /proc), as when it writes a claim
        (tmp_path / "p2.claim").write_text(f"{other.pid}\n")
        assert not soak.claim_prompt(tmp_path, "p2")
    finally:
        other.kill()
        other.wait()
    assert soak.claim_prompt(tmp_path, "p2")
    (tmp_path / "p3.claim").write_text("not a pid\n")  # a torn claim file: taken over, never a crash
    assert soak.claim_prompt(tmp_path, "p3")


def test_summarize_only_merges_runs_of_several_workers_and_runs_nothing(tmp_path):
    prompts = [{"id": f"p{k}", "kind": "span", "source": "stdlib", "input_ids": [1, 2, 3]} for k in range(3)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    runs = tmp_path / "runs-float32"
    runs.mkdir()
    entry = {"same": True, "tau": 2.0, "rounds": 3, "seconds": 0.5}
    for worker, ids in (("shard-11-0of2.jsonl", ["p0"]), ("shard-12-1of2.jsonl", ["p2"])):
        (runs / worker).write_text("".join(json.dumps({"id": i, "kind": "span", "source": "stdlib", "length": 3,
                                                       "ar": [5], "ar_seconds": 0.1,
                                                       "runs": {"fold-a2/fast": entry}}) + "\n" for i in ids))
    assert soak.main(["--out", str(tmp_path), "--device", "cpu", "--summarize-only"]) == 0
    summary = json.loads((tmp_path / "summary-float32.json").read_text())
    assert summary["prompts_done"] == 2 and summary["prompts_planned"] == 3 and summary["identical"] == 2
    assert not (tmp_path / "claims-float32").exists(), "--summarize-only must not start a worker"
    assert len((tmp_path / "runs-float32-merged.jsonl").read_text().splitlines()) == 2
