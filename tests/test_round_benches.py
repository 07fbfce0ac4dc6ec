"""The two round-cost benches of issue 38 (the Gemma-3 pair's round at 32K): ``benchmarks/pair_rounds_bench.py``'s
byte floors against counts written from the rule, its random target against the committed drafter's target, and
``benchmarks/read_splits_bench.py``'s dry run (Triton's interpreter: every read kind matches its float64 statement,
or the bench's own correctness column would hide a broken configuration)."""

import json
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ASSETS = Path(__file__).resolve().parents[1] / "fold_hf" / "assets"


def bench(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    return __import__(name)


def tiny_gemma3(window: int = 8):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=window,
                           layer_types=["sliding_attention"] * 3 + ["full_attention"], tie_word_embeddings=True,
                           max_position_embeddings=256)
    torch.manual_seed(0)
    return Gemma3ForCausalLM(cfg).eval()


@pytest.mark.parametrize("context", [5, 8, 40])
def test_target_floor_counts_each_weight_once_and_each_layers_entries(context):
    prb = bench("pair_rounds_bench")
    target = tiny_gemma3(window=8)
    # every parameter tensor once: the tied lm_head is the embedding (fp32: 4 bytes)
    unique = {p.data_ptr(): p.numel() for p in target.parameters()}
    weights = 4 * sum(unique.values())
    assert target.lm_head.weight.data_ptr() in unique
    per_entry = 2 * 2 * 16 * 4  # K and V, 2 KV heads of 16
    entries = 3 * min(8, context) + context  # three sliding layers their window, the full layer everything
    assert prb.target_bytes(target, context) == weights + per_entry * entries


@pytest.mark.parametrize("mode, window, context, entries", [("fold", 6, 40, 40), ("dflash", 6, 40, 40),
                                                            ("window", 6, 40, 6), ("window", 60, 40, 40)])
def test_drafter_floor_adds_its_own_weights_the_head_and_its_reads(mode, window, context, entries):
    prb = bench("pair_rounds_bench")
    from tiny import trained_pair

    target, drafter = trained_pair("llama")
    shared = {p.data_ptr() for p in target.parameters()}
    elem = next(target.parameters()).element_size()
    own = sum(p.numel() * elem for p in drafter.parameters() if p.data_ptr() not in shared)
    assert own > 0
    head = target.get_output_embeddings().weight
    cfg = drafter.config
    per_entry = 2 * cfg.num_key_value_heads * cfg.head_dim * elem * cfg.num_hidden_layers
    want = own + head.numel() * elem + per_entry * entries
    assert prb.drafter_bytes(drafter, target, context, mode, window) == want
    # with a draft vocabulary of 3 tokens the proposals read 3 rows of the head instead of all of them
    from fold_hf import DraftVocab

    drafter.use_draft_vocab(DraftVocab([0, 4, 9], head.shape[0]))
    try:
        got = prb.drafter_bytes(drafter, target, context, mode, window)
    finally:
        drafter.use_draft_vocab(None)
    assert got == want - (head.shape[0] - 3) * head.shape[1] * elem


def test_random_target_is_the_architecture_the_committed_drafter_reads():
    """``--random-target`` times rounds without the GGUF: its configuration must be the one the committed Gemma
    drafter was trained against (taps inside the layers, the hidden size and vocabulary it shares)."""
    prb = bench("pair_rounds_bench")
    cfg = prb.GEMMA3_270M_CONFIG
    drafter = json.loads((ASSETS / "gemma3-270m-dflash" / "config.json").read_text())
    assert drafter["hidden_size"] == cfg["hidden_size"] and drafter["vocab_size"] == cfg["vocab_size"]
    assert max(drafter["dflash_config"]["target_layer_ids"]) < cfg["num_hidden_layers"]
    assert drafter["num_target_layers"] == cfg["num_hidden_layers"]
    assert cfg["layer_types"].count("full_attention") == 3 and cfg["layer_types"][-1] == "full_attention"
    with pytest.raises(SystemExit, match="gemma3-270m"):
        prb.random_pair("smollm2-135m", torch.device("cpu"))


def test_read_splits_dry_run_matches_every_reads_statement(interpreter, tmp_path):
    rsb = bench("read_splits_bench")
    rows = rsb.main(["--dry-run", "--out", str(tmp_path)])
    assert {r["kind"] for r in rows} == set(rsb.KINDS)
    assert len(rows) == 2 * len(rsb.KINDS)  # the default split and 4 splits of each kind
    for row in rows:
        assert "error" not in row, row
        assert row["rel_err"] < 1e-5, row
    saved = json.loads((tmp_path / "read_splits.json").read_text())
    assert saved["rows"] == rows and (tmp_path / "read_splits.csv").is_file()


def test_read_splits_counts_the_entries_each_kind_must_read():
    rsb = bench("read_splits_bench")
    import argparse

    args = argparse.Namespace(context=1000, window=64, lq=8, hkv=2, head_dim=16, rows=0)
    assert rsb.kv_bytes("fold", args, 2) == 1000 * 2 * 2 * 16 * 2
    assert rsb.kv_bytes("window", args, 2) == 72 * 2 * 2 * 16 * 2  # W + the block's rows
    assert rsb.kv_bytes("verify", args, 2) == rsb.kv_bytes("dflash", args, 2) == rsb.kv_bytes("fold", args, 2)
    args.rows = 3  # the batched reads: every row reads its own cache row
    assert rsb.kv_bytes("fold", args, 2) == 3 * 1000 * 2 * 2 * 16 * 2


def test_read_splits_dry_run_batched_reads_and_packed_row_tiles(interpreter, tmp_path):
    """--rows: the batched launches, each row against its own float64 statement; --block-m: the packed-row tile."""
    rsb = bench("read_splits_bench")
    rows = rsb.main(["--dry-run", "--out", str(tmp_path), "--rows", "3", "--kinds", "fold,verify",
                     "--hq", "4", "--hkv", "2", "--head-dim", "32", "--block-m", "default,16",
                     "--split-kv-ratio", "default,0"])
    assert len(rows) == 2 * 2 * 2 * 2 and {r.get("block_m") for r in rows} == {None, 16}
    assert {r.get("split_kv_ratio") for r in rows} == {None, 0.0}
    import os

    assert rsb.SPLIT_KV_RATIO_ENV not in os.environ  # the last config (default) left it unset
    for row in rows:
        assert "error" not in row, row
        assert row["rel_err"] < 1e-5, row


def test_rounds_read_with_the_window_the_pairs_bench_uses():
    prb = bench("pair_rounds_bench")

    class Drafter:
        class fold_config:
            window = 2048

    assert prb.bench_window("gemma3-270m", Drafter) == 512  # `fold-hf bench --pair gemma3-270m`'s W
    assert prb.bench_window(None, Drafter) == 2048


@pytest.mark.parametrize("rows", [0, 3])
def test_read_splits_counts_the_programs_the_launch_makes(interpreter, monkeypatch, rows):
    """``launch_programs`` (the programs and waves columns of read_splits_bench) against what the read really launches:
    the plan and split count it passes to the kernel, captured from the read (interpreter, tiny shapes)."""
    import argparse
    import math

    import torch

    from fold_hf.kernels.fold_read import triton as fr

    rsb = bench("read_splits_bench")
    seen = []
    real_plan, real_partials = fr.launch_plan, fr.partials
    monkeypatch.setattr(fr, "launch_plan", lambda *a, **k: seen.append(real_plan(*a, **k)) or seen[-1])
    monkeypatch.setattr(fr, "partials", lambda b, heads, splits, n, dv, dev: seen.append((heads, splits))
                        or real_partials(b, heads, splits, n, dv, dev))
    args = argparse.Namespace(context=200, slack=24, window=48, lq=5, hq=4, hkv=2, head_dim=16, rows=rows)
    cos, sin = rsb.tables(args.context + args.slack + args.lq, args.head_dim, "cpu")
    for kind in ("fold", "window", "dflash", "verify", "ar"):
        other = {"block_m": 16} | ({"window_splits": 2} if kind in ("fold", "window") else {})
        for splits, tuning in ((None, {}), (3, other)):
            seen.clear()
            x = rsb.make_inputs(kind, args, torch.device("cpu"), torch.float32, 0)
            rsb.call(kind, x, args, cos, sin, splits, tuning)
            plan, (heads, num_splits) = seen
            got = rsb.launch_programs(kind, args, splits, tuning, torch.device("cpu"), torch.float32)
            assert got["programs"] == plan.row_blocks * heads * num_splits, (kind, splits, tuning)
            assert got["waves"] == round(got["programs"] / 4, 2)  # the plan's 4 "SMs" off CUDA
            assert heads == max(rows, 1) * args.hkv and math.isfinite(got["waves"])
