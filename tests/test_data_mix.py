"""The data mix of issue #38 (fold_hf.data.mix): the split rule, caps, duplicates, missing sources, the overlap check,
the mixed suite built from the evaluation side, and the headline keys of a run with their bootstrap CIs.

Everything runs on synthetic sources and a byte-level tokenizer (offline, seconds); one test reads the real sources
of this machine that need no download (the stdlib and the installed packages)."""

import json
import math
import random

import pytest
import torch

from fold_hf.bench.suites import build_mixed_suite
from fold_hf.bench.summary import _bootstrap_mean_ci, headline_keys, summarize
from fold_hf.data.mix import (
    FORCED,
    KINDS,
    Candidate,
    Doc,
    Mix,
    gather,
    group_streams,
    load_mix,
    mix_windows,
    parse_weights,
    save_mix,
    split_of,
)
from fold_hf.data.overlap import contaminated, overlap_fraction, shingles, train_shingles


class ByteTokenizer:
    """One token per UTF-8 byte (what the suite and the windows need of a tokenizer)."""

    def __call__(self, text, add_special_tokens=False):
        if isinstance(text, list):  # a batch, as fast tokenizers take it
            return {"input_ids": [list(t.encode("utf-8")) for t in text]}
        return {"input_ids": list(text.encode("utf-8"))}

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    lines = []
    for i in range(n // 8):
        lines.append(" ".join(f"w{rng.randrange(10**6)}" for _ in range(8)))
    return "\n".join(lines) + "\n"


def synthetic_sources(groups_per_kind: int = 12, docs_per_group: int = 3, chars: int = 600) -> dict:
    def source(kind):
        def find():
            return [Candidate(kind, f"synthetic-{kind}", f"{kind}-g{g}", f"{kind}/g{g}/f{d}",
                              text=words(KINDS.index(kind) * 100000 + g * 100 + d, chars // 7))
                    for g in range(groups_per_kind) for d in range(docs_per_group)]
        return find
    return {f"synthetic-{k}": source(k) for k in KINDS}


def test_the_split_rule_is_fixed_by_kind_and_group():
    assert split_of("python", "stdlib") == "train" and split_of("python", "transformers") == "eval"
    assert set(FORCED.values()) == {"train", "eval"}
    sides = [split_of("c", f"dir{i}") for i in range(2000)]
    assert sides == [split_of("c", f"dir{i}") for i in range(2000)]  # deterministic
    assert 0.15 < sides.count("eval") / len(sides) < 0.25  # the 20% rule
    assert all(split_of("c", f"dir{i}", eval_percent=0) == "train" for i in range(100))


def test_gather_keeps_groups_on_one_side_caps_kinds_and_drops_duplicates():
    sources = synthetic_sources()
    dup = Candidate("prose", "dup", "prose-g0", "prose/dup", text=sources["synthetic-prose"]()[0].text)
    sources["dup"] = lambda: [dup]
    said = []
    mix = gather(sources, max_chars=10**9, log=said.append)
    assert not said and mix.missing == {}
    by_group = {}
    for d in mix.docs:
        by_group.setdefault((d.kind, d.group), set()).add(d.split)
        assert d.split == split_of(d.kind, d.group)
    assert all(len(s) == 1 for s in by_group.values())
    texts = [d.text for d in mix.docs]
    assert len(texts) == len(set(texts)) == len(KINDS) * 12 * 3  # the duplicate is kept once
    # a cap keeps many groups, not the first few: round-robin over the groups in hash order
    capped = gather(sources, max_chars=3000, splits=("train",), log=said.append)
    for kind in KINDS:
        docs = [d for d in capped.docs if d.kind == kind]
        assert 3000 <= sum(len(d.text) for d in docs) < 3000 + max(len(d.text) for d in docs)
        assert len({d.group for d in docs}) == len(docs)  # one file per group before any group's second


def test_a_missing_source_is_named_once_and_the_mix_says_its_kinds():
    sources = {"synthetic-python": synthetic_sources()["synthetic-python"], "absent": lambda: [],
               "broken": lambda: (_ for _ in ()).throw(FileNotFoundError("no such sdist"))}
    said = []
    mix = gather(sources, log=said.append)
    assert len(said) == 2 and "'absent'" in said[0] and "'broken'" in said[1] and "no such sdist" in said[1]
    assert set(mix.missing) == {"absent", "broken"}
    assert mix.kinds("train") == ["python"] and set(mix.counts()) <= {"train", "eval"}


def test_mix_file_round_trip_and_weighted_windows(tmp_path):
    mix = gather(synthetic_sources(chars=3000), log=lambda m: None)
    path = save_mix(mix, tmp_path / "mix.jsonl.gz")
    again = load_mix(path)
    assert again.docs == mix.docs and again.missing == mix.missing
    train = mix.side("train")
    streams = group_streams(train)
    assert set(streams) == set(KINDS)
    rows = mix_windows(ByteTokenizer(), train, count=64, length=200, seed=0, weights={"python": 1.0, "logs": 0.0},
                       bos_token_id=7)
    assert rows.shape == (64, 200) and bool((rows[:, 0] == 7).all())
    python_text = "".join(streams["python"])
    for row in rows.tolist():  # every window comes from a Python stream (weight 0 leaves logs out)
        assert bytes(row[1:]).decode("utf-8", errors="ignore")[5:40] in python_text
    assert parse_weights("python=1, prose=2.5") == {"python": 1.0, "prose": 2.5}
    with pytest.raises(ValueError, match="unknown kind 'poetry'"):
        parse_weights("poetry=1")


def test_the_overlap_check_catches_a_planted_copy():
    train = [words(i, 3000) for i in range(5)]
    clean = words(99, 3000)
    planted = words(98, 1500) + train[2][: len(train[2]) // 2]  # half of it pasted from a training document
    licence = "Licensed under the Apache License, Version 2.0 (the License); you may not use this file except " \
              "in compliance with the License.\n"
    header_only = licence + words(97, 3000)  # a shared header alone stays under the threshold
    found = contaminated({"clean": clean, "planted": planted, "header": header_only}, train + [licence + words(96, 50)])
    assert set(found) == {"planted"} and 0.3 < found["planted"] < 0.7
    # independently: the planted half's n-grams are all in the training side, the clean text's none
    grams = train_shingles(train)
    assert overlap_fraction(train[2], grams) == 1.0 and overlap_fraction(clean, grams) == 0.0
    assert shingles("too short") == set()


def test_mixed_suite_nests_tiers_takes_kinds_in_turn_and_drops_contaminated_documents():
    mix = gather(synthetic_sources(groups_per_kind=30, chars=2500), log=lambda m: None)
    eval_docs = mix.side("eval")
    victim = next(d for d in eval_docs if d.kind == "logs")
    train_texts = [d.text for d in mix.side("train")] + [victim.text]  # plant an eval document in the training side
    kinds = ("python", "c", "markup", "structured", "logs", "prose")
    said = []
    requests, info = build_mixed_suite(ByteTokenizer(), tiers=(256, 512, 8192), per_tier=12, new_tokens=16,
                                       kinds=kinds, mix=mix, train_texts=train_texts, log=said.append)
    assert info["dropped_for_overlap"] == {victim.name: 1.0} and victim.name in said[0]
    assert info["kinds"] == {k: 2 for k in kinds}
    assert len(requests) == 36
    by_id = {r["id"]: r for r in requests}
    for k in range(12):
        long = by_id[f"mixed-8192-{k}"]
        assert long["kind"] == kinds[k % 6] and long["suite"] == f"mixed-{kinds[k % 6]}"
        for tier in (256, 512):
            short = by_id[f"mixed-{tier}-{k}"]
            assert short["input_ids"] == long["input_ids"][-tier:] and short["family"] == long["family"]
            assert len(short["input_ids"]) == tier and short["new_tokens"] == 16
        text = ByteTokenizer().decode(long["input_ids"])
        assert victim.name not in text and victim.text[:200] not in text
        names = [line[4:-4] for line in text.splitlines() if line.startswith("=== ") and line.endswith(" ===")]
        assert names and all(n.startswith(long["kind"] + "/") for n in names)  # one kind per request
        assert all(split_of(long["kind"], "/".join(n.split("/")[:2]).replace("/", "-")) == "eval" for n in names)
    with_bos, _ = build_mixed_suite(ByteTokenizer(), tiers=(256, 2048), per_tier=6, kinds=kinds, mix=mix,
                                    train_texts=train_texts, bos_token_id=3, log=said.append)
    bos = {r["id"]: r for r in with_bos}
    assert bos["mixed-256-0"]["input_ids"] == [3] + bos["mixed-2048-0"]["input_ids"][-255:]
    with pytest.raises(ValueError, match="no poetry documents|has no"):
        build_mixed_suite(ByteTokenizer(), tiers=(256,), per_tier=1, kinds=("python", "poetry"), mix=mix,
                          train_texts=train_texts, log=said.append)


def test_the_real_sources_here_split_disjointly():
    """The stdlib and the installed packages (no download): every group on one side, stdlib train, transformers
    eval, and both sides hold Python."""
    from fold_hf.data.mix import SOURCES

    mix = gather({k: SOURCES[k] for k in ("stdlib", "site-packages-python")}, max_chars=400_000,
                 log=lambda m: None)
    sides = {}
    for d in mix.docs:
        sides.setdefault(d.group, set()).add(d.split)
        assert d.split == split_of("python", d.group)
    assert all(len(s) == 1 for s in sides.values())
    # the cap may stop before a given group: whichever of the two is read is on its fixed side
    assert sides.get("stdlib", {"train"}) == {"train"} and sides.get("transformers", {"eval"}) == {"eval"}
    assert mix.kinds("train") == ["python"] and mix.kinds("eval") == ["python"]


# ---------------------------------------------------------------------------------------------- headline keys


def loop_bootstrap(values, resamples=2000, seed=0):
    """The percentile bootstrap written as a float64 loop over the same index draws as _bootstrap_mean_ci."""
    idx = torch.randint(0, len(values), (resamples, len(values)), generator=torch.Generator().manual_seed(seed))
    means = sorted(math.fsum(values[j] for j in row) / len(values) for row in idx.tolist())
    return means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def synthetic_rows(n=48, seed=0):
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        for tier in (1024, 4096, 32704):
            req = f"mixed-{tier}-{k}"
            base = dict(request=req, suite="mixed-prose", tier=tier, family=f"f{k}", same_as_ar=True)
            ar = rng.uniform(0.010, 0.012)
            fold_tau, window_tau = rng.uniform(2, 4), rng.uniform(1.5, 3)
            rows += [dict(base, method="ar", tau=1.0, tpot_s=ar),
                     dict(base, method="fold-a2", tau=fold_tau, tpot_s=ar / rng.uniform(1.2, 2.0)),
                     dict(base, method="dflash", tau=rng.uniform(2, 4), tpot_s=ar / 1.5)]
            if k % 5:  # window missing on some requests: the paired key pairs only those both ran
                rows.append(dict(base, method="window", tau=window_tau, tpot_s=ar / 1.3))
    return rows


def test_headline_keys_match_an_independent_computation(tmp_path):
    rows = synthetic_rows()
    keys = headline_keys(rows, "gemma3")
    by = {}
    for r in rows:
        by.setdefault(r["request"], {})[r["method"]] = r
    at32 = [v for k, v in sorted(by.items()) if v["ar"]["tier"] == 32704]
    at4 = [v for k, v in sorted(by.items()) if v["ar"]["tier"] == 4096]
    expect = {
        "tau_4k_dflash": [v["dflash"]["tau"] for v in at4],
        "fold_tau_32k": [v["fold-a2"]["tau"] for v in at32],
        "fold_speedup_32k": [v["ar"]["tpot_s"] / v["fold-a2"]["tpot_s"] for v in at32],
        "fold_minus_window_tau_32k": [v["fold-a2"]["tau"] - v["window"]["tau"] for v in at32 if "window" in v],
    }
    assert len(expect["fold_minus_window_tau_32k"]) == 48 - 10
    for name, values in expect.items():
        key = f"gemma3_{name}"
        assert keys[key] == pytest.approx(math.fsum(values) / len(values), rel=1e-12)
        low, high = loop_bootstrap(values)
        assert keys[f"{key}_ci_low"] == pytest.approx(low, rel=1e-12)
        assert keys[f"{key}_ci_high"] == pytest.approx(high, rel=1e-12)
        assert keys[f"{key}_requests"] == len(values) and low < keys[key] < high
    # the whole file: summarize(headline=...) puts the same keys at the top of summary.json
    run = tmp_path / "run" / "runs.jsonl"
    run.parent.mkdir()
    run.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summarize([run], tmp_path / "out", headline="gemma3")
    written = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {k: written[k] for k in keys} == keys


def test_headline_ci_of_constant_differences_is_the_constant():
    rows = [dict(r) for r in synthetic_rows(n=10)]
    for r in rows:
        if r["method"] == "window":
            r["tau"] = 0.0
    for r in rows:  # fold - window = 0.75 on every request
        if r["method"] == "fold-a2":
            r["tau"] = 0.75
    keys = headline_keys(rows, "gemma3")
    for suffix in ("", "_ci_low", "_ci_high"):
        assert keys[f"gemma3_fold_minus_window_tau_32k{suffix}"] == 0.75
    assert _bootstrap_mean_ci([2.5] * 7) == (2.5, 2.5)
    with pytest.raises(ValueError, match="no tier at 32K"):
        headline_keys([r for r in rows if r["tier"] != 32704])


def test_summarize_cli_merges_the_headline_keys(tmp_path, capsys):
    from fold_hf.cli import main

    run = tmp_path / "res" / "shard0" / "runs.jsonl"
    run.parent.mkdir(parents=True)
    run.write_text("".join(json.dumps(r) + "\n" for r in synthetic_rows(n=6)))
    latest = tmp_path / "latest.json"
    latest.write_text(json.dumps({"other_key": 1.5}))
    assert main(["summarize", str(tmp_path / "res"), "--headline", "gemma3", "--headline-into", str(latest)]) == 0
    merged = json.loads(latest.read_text())
    assert merged["other_key"] == 1.5 and {"gemma3_fold_tau_32k", "gemma3_fold_tau_32k_ci_low",
                                           "gemma3_fold_speedup_32k_ci_high", "gemma3_tau_4k_dflash",
                                           "gemma3_fold_minus_window_tau_32k_ci_low"} <= set(merged)
    assert "16 headline keys merged" in capsys.readouterr().out


def test_doc_is_plain_data():
    d = Doc("prose", "s", "g", "n", "train", "text")
    assert Mix([d]).counts() == {"train": {"prose": {"docs": 1, "chars": 4, "groups": 1}}}


def test_train_drafter_on_the_mix_with_distillation_then_resumes_from_its_weights(tmp_path):
    """train-drafter's recipe on mix documents (weighted windows), the KL term on, then a warm start from the
    written drafter (--init-from): zero steps give back exactly the weights it started from."""
    import fold_hf
    from fold_hf.train_drafter import TrainSettings, train_drafter
    from tiny import tiny_target

    class CharTokenizer:
        def __call__(self, text, add_special_tokens=False):
            if isinstance(text, list):
                return {"input_ids": [[ord(c) % 11 for c in t] for t in text]}
            return {"input_ids": [ord(c) % 11 for c in text]}

    target = tiny_target("llama", dtype=torch.float32)
    docs = [Doc(kind, "synthetic", f"{kind}-{g}", f"{kind}/{g}", "train",
                "".join(chr(97 + (g * 7 + j * (1 + KINDS.index(kind))) % 20) for j in range(300)))
            for kind in ("python", "prose") for g in range(3)]

    def settings(**kw):
        return TrainSettings(layers=1, block_size=4, intermediate_size=32, prompt_tokens=24, new_tokens=16,
                             sequences=6, gen_batch=3, batch=2, anchors=4, warmup=1, kl=0.5,
                             mix_weights={"python": 1.0, "prose": 1.0}, **kw)

    report = train_drafter(target, CharTokenizer(), tmp_path / "a", docs, settings(steps=3, position_span=160),
                           log=lambda *a: None)
    assert report["finished"] and report["step"] == 3 and math.isfinite(report["final_loss"])
    saved = json.loads((tmp_path / "a" / "drafter" / "training.json").read_text())
    assert saved["settings"]["position_span"] == 160
    assert "spread over 160 (PoSE)" in (tmp_path / "a" / "drafter" / "README.md").read_text()
    # the saved preset's training length R is the span of positions seen (24 + 16 tokens without a span)
    assert json.loads((tmp_path / "a" / "drafter" / "fold_config.json").read_text())["train_length"] == 160
    # the card's table names both lengths, and the drafter's own record (what `fold-hf doctor` checks a preset's R
    # against) is the span, not the 40 tokens a window holds
    card = (tmp_path / "a" / "drafter" / "README.md").read_text()
    assert "| training length | 40 tokens (24 real tokens + 16 the target generated); rope positions spread over " \
           "160 (PoSE) |" in card
    from fold_hf.embedded import recorded_training_length

    assert recorded_training_length(tmp_path / "a" / "drafter")[0] == 160
    data = torch.load(tmp_path / "a" / "data.pt")
    assert data.shape == (6, 40)
    first = fold_hf.FoldDrafter.from_pretrained(tmp_path / "a" / "drafter")
    again = train_drafter(target, CharTokenizer(), tmp_path / "b", docs,
                          settings(steps=0, init_from=str(tmp_path / "a" / "drafter")), log=lambda *a: None)
    assert again["step"] == 0
    assert json.loads((tmp_path / "b" / "drafter" / "fold_config.json").read_text())["train_length"] == 40
    second = fold_hf.FoldDrafter.from_pretrained(tmp_path / "b" / "drafter")
    own = {k: v for k, v in first.state_dict().items()}
    assert own.keys() == second.state_dict().keys()
    assert all(torch.equal(v, second.state_dict()[k]) for k, v in own.items())


def test_the_shape_pick_takes_the_fastest_drafter_within_30_mb(tmp_path, capsys):
    """Candidates' bench runs pooled over every suite request by request (a per-suite summary row must not stand for
    the tier), the pick is the fastest within 30 MB, and the pick against each other candidate is paired by request."""
    import importlib.util
    import statistics
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("pick", root / "benchmarks" / "pick_drafter_shape.py")
    pick = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pick)

    def candidate(name, tpot, size):  # tpot(suite, tier, k) -> the fold-a2 TPOT of request k; AR TPOT is 1.0 ms
        res, drafter = tmp_path / name / "res", tmp_path / name / "drafter"
        (res / "run").mkdir(parents=True)
        drafter.mkdir()
        (drafter / "model.safetensors").write_bytes(b"\0" * size)
        rows = []
        for suite in ("code", "prose"):
            for tier in (4096, 32704):
                for k in range(4):
                    common = {"request": f"{suite}-{tier}-{k}", "suite": suite, "tier": tier, "new_tokens": 64}
                    rows.append({**common, "method": "ar", "tau": 1.0, "tpot_s": 1e-3, "ttft_s": 0.1})
                    t = tpot(suite, tier, k)
                    rows.append({**common, "method": "fold-a2", "tau": 1e-3 / t + 1, "tpot_s": t, "ttft_s": 0.1})
        (res / "run" / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return f"{name}={res}:{drafter}"

    # L4's code requests are fast and its prose requests slow: a summary row of one suite would misstate it
    l4 = lambda suite, tier, k: (0.4e-3 if suite == "code" else 0.9e-3) * (1 + 0.01 * k)
    args = [candidate("L2", lambda s, t, k: 0.8e-3 * (1 + 0.02 * k), 20_000_000), candidate("L4", l4, 24_000_000),
            candidate("L6", lambda s, t, k: 0.3e-3, 34_000_000)]
    table = pick.shape_table({a.split("=")[0]: (Path(a.split("=")[1].split(":")[0]), Path(a.split(":")[1]))
                              for a in args}, "fold-a2", [4096, 32704])
    assert [r["name"] for r in table] == ["L4", "L2", "L6"]  # L6 is fastest but over 30 MB
    expected = statistics.mean(1e-3 / l4(s, 4096, k) for s in ("code", "prose") for k in range(4))
    assert table[0]["tiers"][4096]["speedup"]["mean"] == pytest.approx(expected)
    assert table[0]["tiers"][4096]["tau"]["n"] == 8
    whole = statistics.mean((0.1 + 64e-3) / (0.1 + 64 * l4(s, 32704, k)) for s in ("code", "prose") for k in range(4))
    assert table[0]["tiers"][32704]["whole_call"]["mean"] == pytest.approx(whole)
    assert pick.main(args + ["--csv", str(tmp_path / "rows.csv")]) == 0
    out = capsys.readouterr().out
    assert "pick: L4" in out and "(over 30 MB)" in out
    speed = statistics.mean(0.8e-3 * (1 + 0.02 * k) / l4(s, 4096, k) for s in ("code", "prose") for k in range(4))
    assert f"vs L2 at 4096 (8 requests): Δτ" in out and f"speed {speed:.2f} [" in out
    assert "vs L6 at 4096 (8 requests)" in out and "the other is faster here" in out
    assert len((tmp_path / "rows.csv").read_text().splitlines()) == 1 + 3 * 2
    with pytest.raises(ValueError, match="no request at tier 8192 ran fold-a2"):
        pick.main([args[0], "--tiers", "8192"])
    with pytest.raises(ValueError, match="holds no runs.jsonl"):
        pick.main([f"x={tmp_path}/empty"])


def test_saved_requests_read_back_plain_or_gzipped(tmp_path):
    """A suite saved by ``save_requests`` reads back the same from the plain file and from its gzip (the form the GPU
    staging carries: ``.stage/*/requests-mixed*.jsonl.gz``), written here with the gzip module directly."""
    import gzip

    from fold_hf.bench.suites import load_requests, save_requests

    requests = [{"request": "a/1", "tier": 2048, "prompt_ids": [1, 2, 3]}, {"request": "b/2", "tier": 8192, "text": "é\n"}]
    save_requests(requests, tmp_path / "r.jsonl")
    with gzip.open(tmp_path / "r.jsonl.gz", "wb") as fh:
        fh.write((tmp_path / "r.jsonl").read_bytes() + b"\n")
    assert load_requests(tmp_path / "r.jsonl") == requests == load_requests(str(tmp_path / "r.jsonl.gz"))
