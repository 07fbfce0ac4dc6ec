"""Draft vocabularies (fold_hf.modeling.draft_vocab): the drafter proposes from a subset of the vocabulary, the
output does not change.

The rule, stated independently here: a proposal slot's logit for token t is <hidden, W[t]> (soft-capped where the
head caps) when t is in the subset and -inf otherwise, so every proposal is in the subset; greedy output equals the
target's own greedy output on every path; sampling keeps the target's distribution (χ² against transformers'
processors, the subset excluding tokens the target samples often).
"""

import json
import math
import re

import pytest
import torch

import fold_hf
from fold_hf import DraftVocab, FoldConfig, FoldDrafter
from fold_hf.modeling import draft_vocab as draft_vocab_module
from sampling_reference import (FULL_WARP, NEW, PROMPT, VOCAB, chi2_statistic, chi2_threshold,
                                transformers_distribution)
from tiny import (GRID_NEW_TOKENS, fit_drafter, greedy_reference, grid_prompt, mode_config, tiny_drafter,
                  tiny_target, trained_pair)


def _loop_logits(weight, hidden, ids, softcap=None):
    """float64 statement: a dot product per (row, token) for the subset, -inf elsewhere."""
    V = weight.shape[0]
    rows = hidden.reshape(-1, hidden.shape[-1]).double()
    out = torch.full((rows.shape[0], V), -math.inf, dtype=torch.float64)
    for r in range(rows.shape[0]):
        for t in ids:
            z = float(sum(float(a) * float(b) for a, b in zip(rows[r], weight[t].double())))
            out[r, t] = math.tanh(z / softcap) * softcap if softcap else z
    return out.reshape(*hidden.shape[:-1], V)


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 7), (1, 7)])
def test_logits_are_the_subset_rows_of_the_head_and_minus_inf_elsewhere(shape, softcap):
    g = torch.Generator().manual_seed(3)
    V, H = 13, shape[-1]
    weight = torch.nn.Parameter(torch.randn(V, H, generator=g, dtype=torch.float64))
    hidden = torch.randn(*shape, generator=g, dtype=torch.float64)
    ids = [0, 4, 5, 11]
    vocab = DraftVocab(ids, V)
    got = vocab.logits(weight, hidden, softcap=softcap)
    want = _loop_logits(weight.detach(), hidden, ids, softcap)
    assert got.shape == (*shape[:-1], V)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got[..., ids], want[..., ids], rtol=1e-12, atol=1e-12)
    # the head's rows are copied once and refreshed after an in-place write to the weight
    with torch.no_grad():
        weight.mul_(2)
    torch.testing.assert_close(vocab.logits(weight, hidden)[..., ids], 2 * _loop_logits(weight.detach() / 2, hidden, ids)[..., ids],
                               rtol=1e-12, atol=1e-12)


def test_from_counts_ranks_by_count_then_id_and_keeps_the_always_ids():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    assert DraftVocab.from_counts(counts, 3).ids.tolist() == [0, 2, 5]  # 9, 9, then 5 at the lower id (0 before 3)
    assert DraftVocab.from_counts(counts, 3, always=[6]).ids.tolist() == [0, 2, 5, 6]
    assert DraftVocab.from_counts(counts, 8).ids.tolist() == list(range(8))
    with pytest.raises(ValueError, match="size must be in 1..8"):
        DraftVocab.from_counts(counts, 0)


def test_from_texts_counts_the_tokenizer_s_tokens():
    class Chars:
        def __call__(self, text, add_special_tokens=False):
            assert not add_special_tokens
            return {"input_ids": [ord(c) - 97 for c in text]}

        def __len__(self):
            return 26

    vocab = DraftVocab.from_texts(Chars(), ["abcab", "bbz", ""], 2)
    assert vocab.ids.tolist() == [0, 1] and vocab.vocab_size == 26  # b: 4, a: 2, then c and z: 1
    assert "8 tokens" in vocab.source
    with pytest.raises(ValueError, match="no tokens"):
        DraftVocab.from_texts(Chars(), [""], 2)
    with pytest.raises(ValueError, match=r"token id 25, outside the vocabulary \[0, 20\)"):  # z: another tokenizer's
        DraftVocab.from_texts(Chars(), ["abz"], 2, vocab_size=20)


def test_head_rows_are_padded_with_zero_rows_to_an_aligned_count():
    """The subset's rows of the head, then zero rows up to a multiple of ROW_ALIGN (an odd V' left cuBLAS without its
    tensor-core GEMMs: 5x slower drafts' logits at 56 rows on an H100); the logits keep V' real columns."""
    from fold_hf.modeling.draft_vocab import ROW_ALIGN

    weight = torch.nn.Parameter(torch.randn(300, 8, dtype=torch.float64))
    vocab = DraftVocab(list(range(1, 300, 2)), 300)  # 150 ids
    rows, ids = vocab.head_rows(weight)
    assert rows.shape == (-(-150 // ROW_ALIGN) * ROW_ALIGN, 8) and rows.shape[0] % ROW_ALIGN == 0
    assert torch.equal(rows[:150], weight.detach()[1::2]) and not rows[150:].any()
    hidden = torch.randn(3, 8, dtype=torch.float64)
    out = vocab.logits(weight, hidden)
    assert out.shape == (3, 300) and torch.isinf(out[:, 0::2]).all()
    assert torch.allclose(out[:, 1::2], hidden @ weight.detach()[1::2].T)


@pytest.mark.parametrize("ids, message", [([], "at least one"), ([0, 12], r"in \[0, 12\)"), ([-1], r"in \[0, 12\)"),
                                          ([3, 3], "unique")])
def test_bad_ids_are_refused(ids, message):
    with pytest.raises(ValueError, match=message):
        DraftVocab(ids, 12)


def test_a_vocabulary_of_another_size_is_refused_at_use():
    target, _ = trained_pair("llama")
    drafter = tiny_drafter(target).bind_target(target)
    with pytest.raises(ValueError, match="built for 50 tokens"):
        drafter.use_draft_vocab(DraftVocab([1, 2], 50))
    assert drafter.draft_vocab is None


def test_save_and_load_round_trip_and_saving_without_removes_the_file(tmp_path):
    target, drafter = trained_pair("llama")
    fresh = tiny_drafter(target).bind_target(target)
    fresh.use_draft_vocab(DraftVocab([1, 3, 4, 7], target.config.vocab_size, source="test"))
    fresh.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "draft_vocab.json").read_text())
    assert data == {"vocab_size": target.config.vocab_size, "source": "test", "ids": [1, 3, 4, 7]}
    loaded = FoldDrafter.from_pretrained(tmp_path).bind_target(target)
    assert loaded.draft_vocab.ids.tolist() == [1, 3, 4, 7]
    hidden = torch.randn(3, target.config.hidden_size, dtype=loaded.fc.weight.dtype)
    torch.testing.assert_close(loaded.proposal_logits(hidden), fresh.proposal_logits(hidden))
    loaded.use_draft_vocab(None).save_pretrained(tmp_path)
    assert not (tmp_path / "draft_vocab.json").exists()
    assert FoldDrafter.from_pretrained(tmp_path).draft_vocab is None


@pytest.fixture
def proposals(monkeypatch):
    """Every proposal's argmax token, recorded from the logits the draft vocabulary returns."""
    seen = []
    original = draft_vocab_module.DraftVocab.logits

    def recording(self, weight, hidden, softcap=None):
        out = original(self, weight, hidden, softcap)
        seen.extend(out.argmax(-1).flatten().tolist())
        return out

    monkeypatch.setattr(draft_vocab_module.DraftVocab, "logits", recording)
    return seen


@pytest.mark.parametrize("mode", ["fold", "dflash"])
def test_greedy_output_is_the_target_s_on_every_path(mode, proposals):
    """fold_hf.generate, fast_generate (eager and static) and target.generate(assistant_model=...) with half of the
    vocabulary removed from the drafts (the tokens the target's greedy outputs use most among them): every output
    equals the target's greedy output, every proposal is in the subset, and rounds both accept and reject."""
    target, drafter = trained_pair("llama")
    refs = [greedy_reference(target, grid_prompt(seed), GRID_NEW_TOKENS) for seed in range(3)]
    used = torch.bincount(torch.cat([r[0, grid_prompt(s).shape[1]:] for s, r in enumerate(refs)]),
                          minlength=target.config.vocab_size)
    keep = sorted(torch.sort(-used.double(), stable=True).indices[1::2].tolist())  # every other token by use
    drafter.set_fold_config(mode_config(mode))
    drafter.use_draft_vocab(DraftVocab(keep, target.config.vocab_size))
    try:
        rounds = []
        for seed, ref in enumerate(refs):
            ids = grid_prompt(seed)
            res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=GRID_NEW_TOKENS, return_stats=True)
            assert torch.equal(res.sequences, ref), f"fold_hf.generate, seed {seed}"
            rounds += res.acceptance_lengths
            for engine in ("eager", "static"):
                fast = fold_hf.fast_generate(target, drafter, input_ids=ids, max_new_tokens=GRID_NEW_TOKENS,
                                             engine=engine)
                assert torch.equal(fast, ref), f"fast_generate {engine}, seed {seed}"
            hf = target.generate(ids, assistant_model=drafter, max_new_tokens=GRID_NEW_TOKENS, do_sample=False)
            assert torch.equal(hf, ref), f"target.generate(assistant_model=...), seed {seed}"
    finally:
        drafter.use_draft_vocab(None)
    assert proposals and set(proposals) <= set(keep), sorted(set(proposals) - set(keep))
    assert max(rounds) >= 2 and min(rounds) == 1, rounds


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution_with_tokens_the_drafter_cannot_propose():
    """fold_hf.generate's speculative sampling with a drafter restricted to tokens {0, 2} of 4 (q is 0 at 1 and 3)
    against the exact distribution under transformers' processors (the setting of test_sampling.py's χ² test)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target = tiny_target("llama", seed=21, vocab=VOCAB, layers=4, dtype=torch.float64)
        drafter = fit_drafter(target, tiny_drafter(target, block=4, fold_config=FoldConfig(window=4)), steps=80)
        drafter.use_draft_vocab(DraftVocab([0, 2], VOCAB))
        draws, counts, accepted = 3_000, {}, 0
        for i in range(draws):
            res = fold_hf.generate(target, drafter, input_ids=PROMPT, max_new_tokens=NEW, do_sample=True,
                                   generator=torch.Generator().manual_seed(20_000 + i), return_stats=True,
                                   **FULL_WARP)
            key = tuple(res.new_tokens[0].tolist())
            counts[key] = counts.get(key, 0) + 1
            accepted += res.acceptance_lengths[0] - 1
    finally:
        torch.set_num_threads(threads)
    probs = transformers_distribution(target, FULL_WARP)
    stat, df = chi2_statistic(counts, probs, draws)
    assert stat < chi2_threshold(df), f"chi2 {stat:.1f} with {df} dof exceeds the p=1e-4 bound {chi2_threshold(df):.1f}"
    # tokens 1 and 3 still appear (from the target's corrections), and drafts were accepted
    assert any(t in (1, 3) for key in counts for t in key[1:])
    assert accepted > draws * 0.1


def test_committed_draft_vocabularies_fit_their_pairs():
    """The vocabularies under fold_hf/assets/draft-vocab: each for its pair's vocabulary size, sorted unique ids, the
    pair's end-of-sequence id kept, as large as its name says (+ that id)."""
    from pathlib import Path

    assets = Path(fold_hf.__file__).parent / "assets" / "draft-vocab"
    sizes = {"smollm2-135m": (49152, 2), "gemma3-270m": (262144, 1)}  # vocabulary, eos id (tokenizer configs)
    files = sorted(assets.glob("*.json"))
    assert [f.name for f in files] == ["gemma3-270m-16384.json", "gemma3-270m-32768.json", "smollm2-135m-8192.json"]
    for f in files:
        pair, size = f.stem.rsplit("-", 1)
        vocab = DraftVocab.load(f)
        V, eos = sizes[pair]
        assert vocab.vocab_size == V and len(vocab) == int(size) + 1 and eos in vocab.ids.tolist()
        assert "tokens of the mix's training side" in vocab.source


def test_cpu_results_tables_are_the_committed_files():
    """benchmarks/results/2026-12-06-cpu-draft-vocab: the coverage table from the two coverage.csv files and the round
    table from the four cpu_round_profile.json files."""
    import csv
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-12-06-cpu-draft-vocab"
    readme = (results / "README.md").read_text()
    for name, label in (("smollm2", "SmolLM2"), ("gemma3", "Gemma-3")):
        for r in csv.DictReader((results / f"coverage-{name}" / "coverage.csv").open()):
            if name == "smollm2" and r["size"] == "2049":
                continue  # in the CSV only
            pct = [f"{100 * float(r[k]):.1f}%" for k in ("train", "demo_input", "eval_prose", "eval_python", "eval_c")]
            row = f"| {label} | {int(r['size']):,} | {int(r['of']):,} | " + " | ".join(pct) + " |"
            assert row in readme, row
    for tag, label in (("none", "none (49,152)"), ("4096", "4,097"), ("8192", "8,193"), ("16384", "16,385")):
        report = json.loads((results / "round-profile" / f"{tag}.json").read_text())
        ms = report["ms"]
        assert report["threads"] == 2 and (report["draft_vocab"] is None) == (tag == "none")
        cells = [f"{ms[k]:.1f} ms" for k in ("ar_step", "verify", "draft", "draft_lm_head", "round")]
        row = f"| {label} | " + " | ".join(cells) + f" | {report['break_even_tau']:.2f} |"
        assert row in readme, row


def test_build_script_counts_the_training_side_and_reports_coverage(tmp_path, capsys):
    """benchmarks/build_draft_vocab.py end to end on a tiny mix and a word-level tokenizer saved to disk: the kept ids
    are the most frequent words of the training side (documents naming the excluded word left out), the end-of-sequence
    id is added, and coverage.csv holds the share of each evaluation kind's words inside the subset."""
    import csv
    import sys
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from fold_hf.data.mix import Doc, Mix, save_mix

    words = ["<eos>", "a", "b", "c", "d", "e"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(tmp_path / "tok")
    docs = [Doc("prose", "s", "g1", "one", "train", "a a a b b c"),
            Doc("prose", "s", "g2", "transformers/x.py", "train", "d d d d d d"),  # left out: names the excluded word
            Doc("prose", "s", "g3", "two", "eval", "a b e e"),
            Doc("python", "s", "g4", "three", "eval", "c c a")]
    save_mix(Mix(docs), tmp_path / "mix.jsonl.gz")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import build_draft_vocab

    assert build_draft_vocab.main(["--mix", str(tmp_path / "mix.jsonl.gz"), "--tokenizer", str(tmp_path / "tok"),
                                   "--sizes", "2", "--out", str(tmp_path / "out")]) == 0
    vocab = DraftVocab.load(tmp_path / "out" / "draft_vocab-2.json")
    assert vocab.ids.tolist() == [0, 1, 2] and vocab.vocab_size == 6  # a (3), b (2), and <eos>
    assert "1 naming 'transformers' left out" in vocab.source
    row = next(csv.DictReader((tmp_path / "out" / "coverage.csv").open()))
    assert float(row["train"]) == 5 / 6 and float(row["eval_prose"]) == 2 / 4 and float(row["eval_python"]) == 1 / 3


def _word_tokenizer(folder, words, config_vocab=None):
    """A word-level tokenizer saved to ``folder`` (ids = positions in ``words``; ``<eos>`` first), with a
    config.json naming ``config_vocab`` rows when given."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(folder)
    if config_vocab is not None:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": config_vocab}))


def test_text_sources_walk_folders_read_jsonl_and_say_what_they_skip(tmp_path):
    import gzip

    from fold_hf.data.texts import TextSources

    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.py").write_text("alpha")
    (tmp_path / "d" / "sub" / "b.md").write_text("beta")
    (tmp_path / "d" / "c.bin").write_bytes(b"\x00\x01")  # not a text suffix: not read from a folder
    (tmp_path / "d" / "e.txt").write_bytes(b"\xff\xfe\xfa")  # not UTF-8
    (tmp_path / "d" / "f.log").write_text("x\x00y")  # NUL bytes
    with gzip.open(tmp_path / "r.jsonl.gz", "wt") as fh:
        fh.write('{"text": "gamma"}\n\n{"other": 1}\nnot json\n{"text": "delta"}\n')
    (tmp_path / "named.dat").write_text("epsilon")  # named directly: read whatever its suffix
    sources = TextSources([tmp_path / "d", tmp_path / "r.jsonl.gz", tmp_path / "named.dat"])
    assert list(sources) == ["alpha", "beta", "gamma", "delta", "epsilon"]
    assert sources.read == 5 and sources.skipped == {
        "not UTF-8 text": 1, "binary (NUL bytes)": 1, 'JSON-lines record without a "text" string': 1,
        "JSON-lines record that is not JSON": 1}
    assert "5 texts" in sources.report() and "1 not UTF-8 text" in sources.report()
    assert [p.name for p in TextSources([tmp_path / "d"], extensions=["*"]).files()] == [
        "a.py", "c.bin", "e.txt", "f.log", "b.md"]
    with pytest.raises(FileNotFoundError, match="nowhere"):
        TextSources([tmp_path / "nowhere"])


def test_draft_vocab_command_ranks_the_texts_tokens_and_reports_coverage(tmp_path, capsys):
    """``fold-hf draft-vocab`` end to end with a word-level tokenizer: the kept ids are the most frequent words of the
    texts (ties by id) plus <eos>, counted by a plain loop here; the vocabulary's size is config.json's (the head may
    have more rows than the tokenizer); coverage.csv holds the share of counted and held-out words kept."""
    import csv
    from collections import Counter

    from fold_hf.cli import main

    words = ["<eos>", "a", "b", "c", "d", "e"]
    _word_tokenizer(tmp_path / "tok", words, config_vocab=8)
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "one.txt").write_text("a a a b b c")
    (tmp_path / "texts" / "two.md").write_text("d d d d e")
    (tmp_path / "held.txt").write_text("a b e e")
    assert main(["draft-vocab", "--texts", str(tmp_path / "texts"), "--tokenizer", str(tmp_path / "tok"),
                 "--size", "2", "3", "--held-out", str(tmp_path / "held.txt"), "--out", str(tmp_path / "out")]) == 0
    counted = Counter(w for text in ("a a a b b c", "d d d d e") for w in text.split())
    ranked = sorted(counted, key=lambda w: (-counted[w], words.index(w)))
    for size in (2, 3):
        vocab = DraftVocab.load(tmp_path / "out" / f"draft_vocab-{size}.json")
        assert vocab.vocab_size == 8
        assert vocab.ids.tolist() == sorted({0} | {words.index(w) for w in ranked[:size]})
    rows = {int(r["ids"]): r for r in csv.DictReader((tmp_path / "out" / "coverage.csv").open())}
    kept3 = set(ranked[:3])  # d, a, b
    assert float(rows[4]["coverage_counted"]) == pytest.approx(sum(counted[w] for w in kept3) / sum(counted.values()))
    assert float(rows[4]["coverage_held_out"]) == pytest.approx(2 / 4)  # a, b of "a b e e"
    out = capsys.readouterr().out
    assert "8 ids (" in out and "config vocab_size" in out and "use_draft_vocab(" in out

    (tmp_path / "out1").mkdir()
    assert main(["draft-vocab", "--texts", str(tmp_path / "texts" / "one.txt"), "--tokenizer", str(tmp_path / "tok"),
                 "--size", "5", "--vocab-size", "6", "--out", str(tmp_path / "out1")]) == 0
    assert DraftVocab.load(tmp_path / "out1").vocab_size == 6  # one size: OUT/draft_vocab.json
    assert "only 3 distinct tokens occur" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--pair", "smollm2-135m"], "--tokenizer and --pair name two tokenizers"),
    (["--size", "6"], r"--size must lie in \(0, 6\)"),
    (["--texts-empty"], "no text files under"),
    (["--texts-missing"], "no such file or folder"),
])
def test_draft_vocab_command_refuses_bad_input_in_one_line(tmp_path, capsys, extra, message):
    from fold_hf.cli import main

    _word_tokenizer(tmp_path / "tok", ["<eos>", "a", "b", "c", "d", "e"])
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "one.txt").write_text("a b")
    (tmp_path / "empty").mkdir()
    texts = {"--texts-empty": tmp_path / "empty", "--texts-missing": tmp_path / "missing"}.get(extra[0],
                                                                                             tmp_path / "texts")
    extra = [] if extra[0] in ("--texts-empty", "--texts-missing") else extra
    assert main(["draft-vocab", "--texts", str(texts), "--tokenizer", str(tmp_path / "tok"), "--out",
                 str(tmp_path / "out"), *extra]) == 2
    assert re.search(message, capsys.readouterr().err)
