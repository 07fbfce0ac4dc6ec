"""Retraining either committed drafter on the data mix (issue #38): ``benchmarks/gpu/train_mix.sh`` and
``benchmarks/gpu/bench_mix.sh`` take ``PAIR`` (gemma3-270m, the default, or smollm2-135m).

Their dry runs (``DRY=1``) print the ``fold-hf`` commands a GPU call would run; each is parsed by the real CLI (with
the sub-command stubbed), so an option the parser does not know, or a pair-specific piece that is wrong (``--pair``,
the warm start, the folders under /root), fails here. The last test runs ``train-drafter --pair smollm2-135m
--sources mix`` for real on the CPU (the real SmolLM2 target, tiny settings: no tiny SmolLM2 GGUF exists).
"""

import json
import re
import subprocess

import pytest
from gpu_scripts import GPU, ROOT, dry_run, parsed_commands

PAIRS = {"gemma3-270m": "g3", "smollm2-135m": "s2"}  # pair -> the prefix of its folders under /root


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_train_mix_dry_run_for_each_pair(pair, tmp_path, monkeypatch):
    """Data on both GPUs (--generate-only, the pair, the mix), then the warm-started training on GPU 0: --pair, the
    pair's committed drafter as --init-from, --sources mix, --kl, the time budget, the shards just generated, the
    pair's own folders; the parser's defaults are the pair's (Gemma's BOS windows of 768, SmolLM2's 512)."""
    from fold_hf.pairs import get_pair

    result = dry_run("train_mix.sh", tmp_path, PAIR=pair, GPUS="2", SEQUENCES="8192", KL="0.5", TIME_BUDGET="12")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    seen = parsed_commands(result.stdout, monkeypatch)
    assert [a["command"] for a in seen] == ["train-drafter"] * 3
    assert all(a["pair"] == pair for a in seen)
    assert all(a["sources"] == "mix" and a["mix_file"] == "/root/cache/mix.jsonl.gz" for a in seen)
    data, train = sorted(seen[:2], key=lambda a: a["gpu"]), seen[2]  # the two shards start at once (either order)
    tag = PAIRS[pair]
    assert [a["generate_only"] for a in seen] == [True, True, False]
    assert [a["out"] for a in data] == [f"/root/{tag}mixdata/gpu0", f"/root/{tag}mixdata/gpu1"]
    assert [a["gpu"] for a in data + [train]] == ["0", "1", "0"] and [a["seed"] for a in data] == [0, 1000]
    assert all(a["sequences"] == 4096 for a in data)
    assert train["data"] == [f"{a['out']}/data.pt" for a in data]
    assert train["out"] == f"/root/{tag}mix/A"
    assert ROOT / train["init_from"] == get_pair(pair).drafter_dir  # the pair's committed drafter
    assert train["kl"] == 0.5 and train["time_budget"] == 12 and train["lr"] == 3e-4
    expected = {"gemma3-270m": (768, 4, 16), "smollm2-135m": (512, 16, 32)}[pair]
    assert (train["prompt_tokens"], train["mask_token_id"], train["batch"]) == expected
    if pair != "gemma3-270m":
        assert not re.search(r"gemma|g3mix|g3data", result.stdout, re.I)


def test_train_mix_default_pair_is_gemma_and_a_fresh_shape_is_the_pairs(tmp_path, monkeypatch):
    """Without PAIR the script is the Gemma one it was; INIT=none trains the pair's own shape unless LAYERS etc.
    are given (not Gemma's 4 x 512 for SmolLM2)."""
    seen = parsed_commands(dry_run("train_mix.sh", tmp_path).stdout, monkeypatch)
    assert {a["pair"] for a in seen} == {"gemma3-270m"} and seen[-1]["out"] == "/root/g3mix/A"
    fresh = dry_run("train_mix.sh", tmp_path, PAIR="smollm2-135m", INIT="none", RUN="L5", LAYERS="5")
    assert "--init-from" not in fresh.stdout
    train = parsed_commands(fresh.stdout, monkeypatch)[-1]
    assert train["init_from"] is None and train["out"] == "/root/s2mix/L5" and train["lr"] == 6e-4
    assert (train["layers"], train["intermediate"], train["block_size"]) == (5, 448, 8)


def test_train_mix_window_lengths_reach_both_steps(tmp_path, monkeypatch):
    """PROMPT_TOKENS / NEW_TOKENS go to the data generation and the training alike (the held-out windows and the
    training length follow them): 960 + 64 keeps Gemma's 1,024 tokens with a 4x shorter generation."""
    seen = parsed_commands(dry_run("train_mix.sh", tmp_path, GPUS="1", PROMPT_TOKENS="960", NEW_TOKENS="64").stdout,
                           monkeypatch)
    assert [a["generate_only"] for a in seen] == [True, False]
    assert all((a["prompt_tokens"], a["new_tokens"]) == (960, 64) for a in seen)
    # the training (not the data) is interrupted before the call's limit, so what it trained is copied out
    assert seen[0]["timeout"] is None and 60 <= seen[1]["timeout"] <= 560
    # the training stops itself (--max-minutes) a minute before the signal, whatever MINUTES says
    long = parsed_commands(dry_run("train_mix.sh", tmp_path, GPUS="1", MINUTES="30").stdout, monkeypatch)[-1]
    assert long["max_minutes"] * 60 <= long["timeout"] - 59
    default = parsed_commands(dry_run("train_mix.sh", tmp_path, GPUS="1").stdout, monkeypatch)
    assert all((a["prompt_tokens"], a["new_tokens"]) == (768, 256) for a in default)
    assert default[-1]["position_span"] is None  # true positions unless asked


def test_time_budget_call_fits_the_schedule_into_what_the_call_leaves(tmp_path, monkeypatch):
    """TIME_BUDGET=call: the training's --time-budget is what the call leaves after the data less half a minute, so
    the cosine schedule ends before --max-minutes (the clock) stops it; a number stays the number (over all calls)."""
    result = dry_run("train_mix.sh", tmp_path, GPUS="1", TIME_BUDGET="call", CALL_SECONDS="420", MINUTES="7")
    assert result.returncode == 0, result.stderr
    train = parsed_commands(result.stdout, monkeypatch)[-1]
    # the dry run takes no time for the data: the whole 420 - 60 s are left
    assert abs(train["max_minutes"] - 6.0) < 0.05 and train["time_budget"] == round(train["max_minutes"] - 0.5, 2)
    assert f"TIME_BUDGET=call: a schedule of {train['time_budget']:g} minutes" in result.stdout
    fixed = parsed_commands(dry_run("train_mix.sh", tmp_path, GPUS="1", TIME_BUDGET="4", CALL_SECONDS="420").stdout,
                            monkeypatch)[-1]
    assert fixed["time_budget"] == 4
    assert parsed_commands(dry_run("train_mix.sh", tmp_path, GPUS="1").stdout, monkeypatch)[-1]["time_budget"] is None


def test_train_mix_position_span_reaches_the_training_only(tmp_path, monkeypatch):
    """POSITION_SPAN (PoSE) changes the training's rope positions, not the data the target generates."""
    seen = parsed_commands(dry_run("train_mix.sh", tmp_path, GPUS="1", POSITION_SPAN="4096").stdout, monkeypatch)
    assert [a["generate_only"] for a in seen] == [True, False]
    assert seen[1]["position_span"] == 4096 and "--position-span" not in dry_run(
        "train_mix.sh", tmp_path, GPUS="1").stdout


def test_unknown_pair_is_refused_and_train_gemma3_stays_gemma(tmp_path, monkeypatch):
    bad = dry_run("train_mix.sh", tmp_path, PAIR="llama-7b")
    assert bad.returncode == 2 and "PAIR=llama-7b: unknown" in bad.stderr and "+ " not in bad.stdout
    # an exported PAIR (smollm2_session.sh exports one) does not turn the Gemma-only script into another pair's
    result = dry_run("train_gemma3.sh", tmp_path, PAIR="smollm2-135m")
    assert result.returncode == 0, result.stderr
    assert {a["pair"] for a in parsed_commands(result.stdout, monkeypatch)} == {"gemma3-270m"}


@pytest.mark.parametrize("gpus", ["1", "2"])
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_bench_mix_dry_run_old_against_new(pair, gpus, tmp_path, monkeypatch):
    """The measurement after train_mix.sh: the committed drafter and the retrained one on the same cut requests,
    fast engine, dflash / fold-a2 / window; at once on two GPUs, one after the other (half the minutes each) on one."""
    from fold_hf.pairs import get_pair

    result = dry_run("bench_mix.sh", tmp_path, PAIR=pair, GPUS=gpus, MINUTES="6")
    assert result.returncode == 0, result.stderr
    seen = sorted(parsed_commands(result.stdout, monkeypatch), key=lambda a: a["out"], reverse=True)
    tag = PAIRS[pair]
    assert [a["command"] for a in seen] == ["bench", "bench"] and all(a["pair"] == pair for a in seen)
    old, new = seen
    assert old["out"] == f"/root/{tag}mixcmp/old" and new["out"] == f"/root/{tag}mixcmp/new"
    assert ROOT / old["drafter"] == get_pair(pair).drafter_dir and new["drafter"] == f"/root/{tag}mix/A/drafter"
    for a in seen:
        assert a["requests"] == f"/root/{tag}mixcmp/requests.jsonl" and a["engine"] == "fast"
        assert a["methods"] == ["dflash", "fold-a2", "window"]
        assert a["max_minutes"] == (6.0 if gpus == "2" else 3.0)
    assert [a["gpu"] for a in seen] == (["0", "1"] if gpus == "2" else ["0", "0"])


def test_bench_mix_every_method_on_one_drafter(tmp_path, monkeypatch):
    """DRAFTERS=old METHODS=all: one bench of the committed drafter with every method (no --methods: the bench's
    default, all) for the whole MINUTES on one GPU; DRAFTERS=new runs the retrained one alone; other names refused."""
    from fold_hf.pairs import get_pair

    result = dry_run("bench_mix.sh", tmp_path, GPUS="1", MINUTES="8", DRAFTERS="old", METHODS="all")
    assert result.returncode == 0, result.stderr
    (only,) = parsed_commands(result.stdout, monkeypatch)
    assert ROOT / only["drafter"] == get_pair("gemma3-270m").drafter_dir and only["out"] == "/root/g3mixcmp/old"
    assert only["methods"] is None and only["max_minutes"] == 8.0
    result = dry_run("bench_mix.sh", tmp_path, GPUS="2", MINUTES="4", DRAFTERS="new", METHODS="fold-a2 rerope")
    (only,) = parsed_commands(result.stdout, monkeypatch)
    assert only["drafter"] == "/root/g3mix/A/drafter" and only["methods"] == ["fold-a2", "rerope"]
    assert only["max_minutes"] == 4.0 and only["gpu"] == "0"
    bad = dry_run("bench_mix.sh", tmp_path, DRAFTERS="old newest")
    assert bad.returncode == 2 and "DRAFTERS: old and / or new, got newest" in bad.stderr


def test_bench_mix_cuts_the_requests_to_its_tiers_interleaved(tmp_path):
    """The script's request cut (its python block, run here on a small gzipped suite): the tiers given (the script
    passes TIERS, default per pair); text k of every tier before text k + 1; a tier the file lacks is refused."""
    import gzip

    script = (GPU / "bench_mix.sh").read_text()
    code = re.search(r"<<'EOF'[^\n]*\n(.*?)\nEOF\n", script, re.S).group(1)
    (tmp_path / "cut.py").write_text(code)
    rows = [{"id": f"mixed-{tier}-{k}", "tier": tier, "input_ids": [k] * 3} for tier in (1024, 2048, 4096, 8192)
            for k in range(3)]
    src = tmp_path / "requests.jsonl.gz"
    with gzip.open(src, "wt") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    assert "tiers=${TIERS:-4096 32704}" in script and "tiers=${TIERS:-2048 8192}" in script
    for tiers, expected in ((["2048", "8192"], (2048, 8192)), (["1024", "8192"], (1024, 8192))):
        dst = tmp_path / "cut.jsonl"
        subprocess.run(["python3", str(tmp_path / "cut.py"), str(src), str(dst), *tiers], check=True,
                       capture_output=True)
        ids = [json.loads(line)["id"] for line in dst.read_text().splitlines()]
        assert ids == [f"mixed-{t}-{k}" for k in range(3) for t in expected]
    bad = subprocess.run(["python3", str(tmp_path / "cut.py"), str(src), str(tmp_path / "x.jsonl"), "32704"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "no requests at tiers [32704]" in bad.stderr


def test_env_sh_keeps_the_smollm2_requests_beside_gemmas():
    """env.sh copies .stage/s2mix/*.gz into /root/cache, the mixed requests renamed (requests-mixed-smollm2...), so
    they never replace Gemma's requests-mixed.jsonl.gz; bench_mix.sh reads them under that name."""
    env = (GPU / "env.sh").read_text()
    loop = re.search(r"for f in \.stage/s2mix/\*\.gz; do\n(.*?)\ndone", env, re.S)
    assert loop and "${n/requests-mixed/requests-mixed-smollm2}" in loop.group(1)
    assert "/root/cache/requests-mixed-smollm2.jsonl.gz" in (GPU / "bench_mix.sh").read_text()
    assert "stop_until_gguf_whole" in (GPU / "train_lib.sh").read_text()


@pytest.mark.slow
def test_train_drafter_cli_on_the_smollm2_pair_with_the_mix_and_a_warm_start(tmp_path):
    """What train_mix.sh runs for PAIR=smollm2-135m, on the CPU with the real SmolLM2 target and tiny settings:
    windows of the mix's training side only (no BOS: SmolLM2's pair has none), the committed drafter loaded as the
    warm start (--max-minutes 0 stops before the first step, so the saved weights are exactly the committed ones),
    the KL weight and the mix in training.json and the model card, whose licence is SmolLM2's Apache-2.0."""
    import torch
    from safetensors.torch import load_file

    from fold_hf.cli import main
    from fold_hf.data.mix import Doc, Mix, save_mix
    from fold_hf.pairs import get_pair

    def doc(kind, g, split):  # distinct, tokenizer-friendly code lines per group
        text = "\n".join(f"def {kind}_{g}_{i}(x):\n    return x * {(g * 37 + i * 11) % 97} + {i}" for i in range(150))
        return Doc(kind, "synthetic", f"{kind}-{g}", f"{kind}/{g}", split, text)

    docs = [doc(k, g, "train") for k in ("python", "logs") for g in range(2)]
    held = doc("prose", 9, "eval")
    mix_file = save_mix(Mix(docs + [held], {}), tmp_path / "mix.jsonl.gz")
    pair = get_pair("smollm2-135m")
    out = tmp_path / "train"
    assert main(["train-drafter", "--pair", "smollm2-135m", "--out", str(out), "--device", "cpu", "--sources", "mix",
                 "--mix-file", str(mix_file), "--kl", "0.5", "--init-from", str(pair.drafter_dir),
                 "--prompt-tokens", "24", "--new-tokens", "16", "--sequences", "4", "--gen-batch", "2", "--steps", "2",
                 "--batch", "2", "--anchors", "4", "--warmup", "1", "--max-minutes", "0"]) == 0
    saved = json.loads((out / "drafter" / "training.json").read_text())["settings"]
    assert saved["kl"] == 0.5 and saved["init_from"] == str(pair.drafter_dir) and saved["bos_token_id"] is None
    assert saved["mask_token_id"] == 16 and saved["layers"] == 6 and saved["intermediate_size"] == 448
    weights = load_file(out / "drafter" / "model.safetensors")
    committed = load_file(pair.drafter_dir / "model.safetensors")
    assert weights.keys() == committed.keys()
    assert all(torch.equal(weights[k].float(), committed[k].float()) for k in weights)
    card = (out / "drafter" / "README.md").read_text()
    assert "data mix" in card and "kinds python, logs" in card
    assert "Apache-2.0" in card and "Warm start from" in card and "gemma" not in card.lower()
    data = torch.load(out / "data.pt")
    assert data.shape == (4, 40)
    tokenizer = pair.tokenizer()
    train_ids = [tokenizer(d.text, add_special_tokens=False)["input_ids"] for d in docs]
    held_ids = tokenizer(held.text, add_special_tokens=False)["input_ids"]
    for row in data[:, :24].tolist():  # no BOS first: the window's 24 tokens are all from a training document
        assert any(_contains(ids, row) for ids in train_ids) and not _contains(held_ids, row)


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


@pytest.mark.parametrize("gpus", ["1", "2"])
def test_bench_mix_with_a_draft_vocabulary_runs_each_drafter_with_and_without_it(gpus, tmp_path, monkeypatch):
    """DRAFT_VOCAB=FILE: NAME and NAME-dv per drafter, the same drafter folder and requests, --draft-vocab FILE on the
    -dv run only (on one GPU one after the other, half the minutes each); a missing file is refused."""
    from fold_hf.pairs import get_pair

    vocab = str(ROOT / "fold_hf" / "assets" / "draft-vocab" / "gemma3-270m-32768.json")
    result = dry_run("bench_mix.sh", tmp_path, GPUS=gpus, MINUTES="6", DRAFTERS="old", METHODS="fold-a2 window",
                     DRAFT_VOCAB=vocab)
    assert result.returncode == 0, result.stderr
    seen = sorted(parsed_commands(result.stdout, monkeypatch), key=lambda a: a["out"])
    assert [a["out"] for a in seen] == ["/root/g3mixcmp/old", "/root/g3mixcmp/old-dv"]
    plain, dv = seen
    assert plain["draft_vocab"] is None and dv["draft_vocab"] == vocab
    for a in seen:
        assert ROOT / a["drafter"] == get_pair("gemma3-270m").drafter_dir and a["methods"] == ["fold-a2", "window"]
        assert a["max_minutes"] == (6.0 if gpus == "2" else 3.0)
    bad = dry_run("bench_mix.sh", tmp_path, DRAFTERS="old", DRAFT_VOCAB=str(tmp_path / "none.json"))
    assert bad.returncode == 2 and "DRAFT_VOCAB: no file" in bad.stderr


def test_the_scripts_log_writes_each_line_as_it_comes(tmp_path):
    """train_lib.sh's ``log FILE`` (the GPU branch): progress bars cut at carriage returns, every 50th rate line kept,
    every line in the file while the command still runs (the block-buffered tr | awk of before lost a killed call's
    training log past 4 KiB)."""
    text = (GPU / "train_lib.sh").read_text()
    body = re.search(r"\n(  log\(\) \{\n  +python3 .*?\n  \}\n)", text, re.S).group(1)
    script = tmp_path / "t.sh"
    script.write_text(body + f"""
( printf 'loading\\r'; for i in $(seq 1 120); do printf '%d/120 [00:01, 7.5step/s]\\r' $i; done
  printf 'loss 1.5\\n'; sleep 2; echo late ) | log {tmp_path}/out.log &
sleep 1; cp {tmp_path}/out.log {tmp_path}/early.log; wait
""")
    subprocess.run(["bash", str(script)], check=True, timeout=60)
    early = (tmp_path / "early.log").read_text().splitlines()
    final = (tmp_path / "out.log").read_text().splitlines()
    assert early == final[:-1] and final[-1] == "late"  # all but the last line there while the command ran
    assert final[0] == "loading" and "loss 1.5" in final
    assert [line for line in final if "step/s" in line] == ["50/120 [00:01, 7.5step/s]", "100/120 [00:01, 7.5step/s]"]
