"""``benchmarks/hybrid_bench.py``'s floors (issue 39): the round floor of each reading mode against a count written
from the rule (every drafter parameter but those it shares with the target, the target's lm_head once more, and per
drafter layer the cache entries it reads), and the headline's round-over-its-floor keys."""

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3_5TextConfig"):
    pytest.skip("this transformers has no Qwen3.5", allow_module_level=True)


@pytest.mark.parametrize("context", [8, 40, 200])
def test_round_floor_counts_the_drafter_the_head_and_each_layers_reads(context):
    sys.path.insert(0, str(BENCHMARKS))
    import hybrid_bench as hb

    from fold_hf import FoldConfig

    target, drafter = hb.build_qwen35_pair(True, 256, 16, "cpu")  # 5 sliding layers (window 16) + 1 full
    head = target.lm_head.weight
    shared = {target.model.embed_tokens.weight.data_ptr(), head.data_ptr()}
    own = sum(p.numel() * 4 for p in drafter.parameters() if p.data_ptr() not in shared)
    assert own > 0
    kv_per_entry = 2 * 2 * 16 * 4  # K and V, 2 KV heads of 16, fp32
    reads = {"dflash": 5 * min(16, context) + context,  # the sliding layers their windows, the full one everything
             "fold": 6 * context,  # layers="all": every layer reads a far memory
             "fold_full_only": 5 * min(16, context) + context}
    configs = {"dflash": FoldConfig(mode="dflash"), "fold": FoldConfig(mode="fold", window=8, alpha=2.0),
               "fold_full_only": FoldConfig(mode="fold", window=8, alpha=2.0, layers="full")}
    for name, config in configs.items():
        want = hb.floor_bytes(target, context) + own + head.numel() * 4 + reads[name] * kv_per_entry
        assert hb.round_floor_bytes(target, drafter, config, context) == want, name


def test_round_floor_with_a_draft_vocabulary_counts_its_rows_of_the_head():
    """With a draft vocabulary of V' ids the drafts' logits read V' rows of the head, not V: the floor drops by
    exactly (V - V') rows, nothing else moves."""
    sys.path.insert(0, str(BENCHMARKS))
    import hybrid_bench as hb

    from fold_hf import FoldConfig
    from fold_hf.modeling.draft_vocab import DraftVocab

    target, drafter = hb.build_qwen35_pair(True, 256, 16, "cpu")
    head = target.lm_head.weight
    config = FoldConfig(mode="fold", window=8, alpha=2.0)
    full = hb.round_floor_bytes(target, drafter, config, 40)
    drafter.use_draft_vocab(DraftVocab([1, 5, 9, 60], head.shape[0]))
    assert hb.round_floor_bytes(target, drafter, config, 40) == full - (head.shape[0] - 4) * head.shape[1] * 4
    drafter.use_draft_vocab(None)
    assert hb.round_floor_bytes(target, drafter, config, 40) == full


def test_dry_run_with_a_draft_vocabulary_writes_the_dv_rows_and_keys(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    import hybrid_bench as hb

    assert hb.main(["--dry-run", "--pairs", "qwen35_9b", "--contexts", "64", "--draft-vocab-size", "20",
                    "--out", str(tmp_path)]) == 0
    import json

    result = json.loads((tmp_path / "hybrid.json").read_text())
    rows = {r["row"] for r in result["rows"]}
    assert {"our_sd_dflash_dv", "our_sd_fold_dv", "floor_sd_fold_dv", "our_sd_fold", "our_ar"} <= rows
    floors = {r["row"]: r["p50_ms"] for r in result["rows"] if r["row"].startswith("floor_sd")}
    assert set(floors) == {"floor_sd_dflash", "floor_sd_fold", "floor_sd_dflash_dv", "floor_sd_fold_dv"}
    assert "qwen35_9b_sd_fold_dv_over_ar_64" in result["headline"]
    with pytest.raises(SystemExit, match="draft-vocab-size"):
        hb.main(["--dry-run", "--pairs", "qwen35_9b", "--contexts", "64", "--draft-vocab-size", "10000000",
                 "--out", str(tmp_path)])


def test_dry_run_profiles_every_sd_mode_with_and_without_the_draft_vocabulary(tmp_path):
    """--profile writes one table per AR step and SD mode (and per mode with the vocabulary), each with its rounds."""
    sys.path.insert(0, str(BENCHMARKS))
    import hybrid_bench as hb
    import json

    assert hb.main(["--dry-run", "--pairs", "qwen35_9b", "--contexts", "64", "--draft-vocab-size", "20",
                    "--sd-modes", "fold", "--profile", "--out", str(tmp_path)]) == 0
    labels = {p["label"] for p in json.loads((tmp_path / "hybrid.json").read_text())["profiles"]}
    assert labels == {"qwen35_9b_ar", "qwen35_9b_sd_fold", "qwen35_9b_sd_fold_dv"}
    for label in labels:
        table = json.loads((tmp_path / "profile" / f"{label}.json").read_text())
        assert table["rounds"] >= 1 and table["top"], label


def test_headline_gives_the_round_over_its_floor_and_the_floors_ratio():
    sys.path.insert(0, str(BENCHMARKS))
    import hybrid_bench as hb

    rows = [{"pair": "p", "row": r, "context": 64, "p50_ms": ms}
            for r, ms in (("floor", 4.0), ("our_ar", 5.0), ("our_sd_fold", 7.5), ("floor_sd_fold", 5.0))]
    head = hb.headline(rows)
    assert head["p_sd_fold_over_ar_64"] == pytest.approx(1.5)
    assert head["p_sd_fold_over_its_floor_64"] == pytest.approx(1.5)
    assert head["p_sd_fold_floor_over_ar_floor_64"] == pytest.approx(1.25)
    assert head["p_ar_over_floor_64"] == pytest.approx(1.25)


def test_qwen35_rows_bench_writes_three_ways_that_agree(tmp_path):
    """``benchmarks/qwen35_rows_bench.py --tiny`` (issue 35): per batch size a row for each way of leaving the rows'
    states (writes replayed, per-position states copied, the fused rows step), with the two ways' logits and states
    apart by fp32 rounding only (the same rule), written as CSV and JSON."""
    import csv
    import json

    sys.path.insert(0, str(BENCHMARKS))
    import qwen35_rows_bench as qb

    assert qb.main(["--tiny", "--context", "120", "--rows", "1,3", "--width", "4", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "qwen35_rows.csv")))
    assert [(r["rows"], r["way"]) for r in rows] == [(b, w) for b in ("1", "3") for w in ("writes", "states", "fused")]
    for r in rows:
        assert float(r["argmax_agree"]) == 1.0 and float(r["logits_max_abs_diff"]) < 1e-5
        assert float(r["state_max_abs_diff"]) < 1e-6 * max(1.0, float(r["state_scale"]))
        if r["way"] == "states":
            assert float(r["logits_max_abs_diff"]) == 0 and float(r["state_max_abs_diff"]) == 0
    assert json.loads((tmp_path / "qwen35_rows.json").read_text())["rows"][0]["way"] == "writes"


def test_issue39_h200_script_runs_only_on_an_h200(tmp_path):
    """benchmarks/gpu/issue39_h200.sh (the first call of a session): on any card but an H200 it runs nothing; on an
    H200 the two benches of issue 39 at 32K (dry run: their commands)."""
    from gpu_scripts import dry_run

    h100 = dry_run("issue39_h200.sh", tmp_path, GPU_NAME="NVIDIA H100 80GB HBM3")
    assert h100.returncode == 0 and "not an H200: nothing run" in h100.stdout and "+ python" not in h100.stdout
    h200 = dry_run("issue39_h200.sh", tmp_path, GPU_NAME="NVIDIA H200")
    commands = [line for line in h200.stdout.splitlines() if line.startswith("+ python")]
    assert h200.returncode == 0 and len(commands) == 2
    assert "benchmarks/hybrid_bench.py --pairs qwen35_9b,llama31_8b --contexts 32768" in commands[0]
    assert "benchmarks/gemma_bench.py --contexts 32768" in commands[1] and "--profile" in commands[1]
    assert not list(tmp_path.iterdir())  # a dry run leaves nothing in OUT


def test_drafter_reads_and_solve_scripts_dry_runs(tmp_path):
    """benchmarks/gpu/drafter_reads.sh and issue39_solve.sh (one device call each): their commands, every flag one
    that the benches take (each command parsed by the bench's own parser), nothing left in OUT."""
    import shlex

    from gpu_scripts import dry_run

    sys.path.insert(0, str(BENCHMARKS))
    import read_splits_bench

    reads = dry_run("drafter_reads.sh", tmp_path)
    commands = [line for line in reads.stdout.splitlines() if line.startswith("+ timeout")]
    assert reads.returncode == 0 and len(commands) == 4
    sweeps = [c for c in commands if "read_splits_bench.py" in c]
    assert len(sweeps) == 3 and any("--rows 8" in c for c in sweeps)
    assert any("hybrid_bench.py" in c and "--profile" in c for c in commands)
    waves = dry_run("drafter_reads.sh", tmp_path, PART="waves")
    wave_lines = waves.stdout.splitlines()
    assert waves.returncode == 0 and any("gdn_quick.py 16 1" in line for line in wave_lines)
    sweeps += [line for line in wave_lines if "read_splits_bench.py" in line]
    assert sum("read_splits_bench.py" in line for line in wave_lines) == 4
    rounds = [line for line in wave_lines if "hybrid_bench.py" in line]  # default and one wave's window programs
    assert len(rounds) == 2 and {line.split("--out ")[1].rsplit("/", 1)[1] for line in rounds} == {
        "hybrid-wsdefault", "hybrid-ws4"}
    solve = dry_run("issue39_solve.sh", tmp_path)
    lines = solve.stdout.splitlines()
    assert solve.returncode == 0 and "solve=rows" in lines and "solve=blocks" in lines
    assert any("gdn_quick.py 16 64" in line for line in lines)
    assert len({line for line in lines if "hybrid_bench.py" in line and "--out" in line}) == 3
    sweeps += [line for line in lines if "read_splits_bench.py" in line]
    assert any("--split-kv-ratio default,4,2,0" in line for line in sweeps)
    parser = read_splits_bench.build_parser()
    for line in sweeps:  # every sweep's flags are the bench's own
        argv = shlex.split(line)
        args = parser.parse_args(argv[argv.index("benchmarks/read_splits_bench.py") + 1:])
        assert args.kinds == "fold" and args.out
    assert not list(tmp_path.iterdir())


def test_issue39_split_k_script_dry_run(tmp_path):
    """benchmarks/gpu/issue39_splitk.sh (one device call): the split-K GPU tests, both GEMM sweeps with --split-k (their
    flags the bench's own), the two Qwen3.5 rounds with the split plan; nothing left in OUT."""
    from gpu_scripts import dry_run

    result = dry_run("issue39_splitk.sh", tmp_path)
    lines = [line for line in result.stdout.splitlines() if line.startswith("+ timeout")]
    assert result.returncode == 0 and any("float64_product_on_gpu" in line for line in lines)
    sweeps = [line for line in lines if "skinny_gemm_bench.py" in line]
    assert len(sweeps) == 2 and all("--split-k" in line for line in sweeps)
    assert {line.split("--shapes ")[1].split()[0] for line in sweeps} == {"qwen35_9b", "llama31_8b"}
    rounds = {line.split("--out ")[1].rsplit("/", 1)[1] for line in lines if "hybrid_bench.py" in line}
    assert rounds == {"hybrid-splitk-wsdefault", "hybrid-splitk-ws4"}
    assert not list(tmp_path.iterdir())
