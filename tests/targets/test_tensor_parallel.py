"""A target sharded by transformers' tensor parallelism (issue 41), on this CPU: two processes over gloo, each loading
the tiny Llama with ``tp_plan="auto"`` (its q/k/v/gate/up column-parallel, o/down row-parallel, the embedding and
lm_head sharded), every generate path run on both ranks. The independent statement: the unsharded target's own greedy
``generate``, row by row; and the unsharded fast loop's acceptance lengths (the replicated drafter drafts on the same
taps, so it proposes what it proposes unsharded)."""

import json
import os
import socket
import warnings

import pytest
import torch
import torch.multiprocessing as mp

from tiny import mode_config, prompt, tiny_target, trained_pair

NEW = 10
PROMPTS = [(0, 9), (1, 60)]  # (seed, length): shorter and longer than the window W = 16
PATHS = ["generate", "fast-eager", "fast-static", "routed", "ar", "batched"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_sharded(directory: str):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tp_plan argument's spelling moved between releases
        try:
            from transformers import DistributedConfig

            kw = dict(distributed_config=DistributedConfig(tp_plan="auto"))
            return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kw)
        except (ImportError, TypeError):
            return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, tp_plan="auto")


def _rank(rank: int, world: int, port: int, target_dir: str, drafter_dir: str, gemma_dir: str, out_dir: str) -> None:
    """One rank: load the sharded target and the drafter, run every path, write what it decoded."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import fold_hf
    from fold_hf import FoldDrafter
    from fold_hf.generation import release_fast_state
    from fold_hf.targets.registry import build_static_target

    target = _load_sharded(target_dir)
    drafter = FoldDrafter.from_pretrained(drafter_dir).bind_target(target)
    drafter.set_fold_config(mode_config("fold"))
    runner = build_static_target(target, 32, ())
    facts = {"tensor_parallel": runner.tensor_parallel, "kv_heads": runner.num_kv_heads,
             "fused": runner.fused_unsupported()}
    out: dict = {}
    for seed, length in PROMPTS:
        ids = prompt(seed, length)
        for path in PATHS:
            if path == "batched":
                continue
            if path == "generate":
                res = fold_hf.generate(target, drafter, ids, max_new_tokens=NEW, return_stats=True)
            elif path == "routed":
                seq = target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
                res = None
                out[f"{path}/{seed}"] = {"tokens": seq[0, length:].tolist(), "acceptance": None}
                release_fast_state(target)
                continue
            else:
                engine = "eager" if path in ("fast-eager", "ar") else "static"
                res = fold_hf.fast_generate(target, None if path == "ar" else drafter, ids, max_new_tokens=NEW,
                                            engine=engine, return_stats=True)
                release_fast_state(target)
            out[f"{path}/{seed}"] = {"tokens": res.new_tokens[0].tolist(), "acceptance": res.acceptance_lengths}
    rows = [prompt(seed, length)[0] for seed, length in PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    res = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, return_stats=True)
    for i, (seed, _) in enumerate(PROMPTS):
        out[f"batched/{seed}"] = {"tokens": res.rows[i].new_tokens[0].tolist(),
                                  "acceptance": res.rows[i].acceptance_lengths, "batched": res.batched}
    # a family whose runner does not hold shards: the fast loop says why; fold_hf.generate (the model's own
    # forward) decodes it
    from fold_hf.generation.fast import fast_unsupported

    gemma = _load_sharded(gemma_dir)
    facts["gemma_reason"] = fast_unsupported(gemma, None)
    ids = prompt(2, 20)
    out["gemma/generate"] = {"tokens": fold_hf.generate(gemma, None, ids, max_new_tokens=NEW)[0, 20:].tolist(),
                             "acceptance": None}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"facts": facts, "out": out}, fh)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    """Both ranks' results, and the unsharded pair."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    target, drafter = trained_pair("llama")
    target = target.float()
    drafter = drafter.float()
    root = tmp_path_factory.mktemp("tp")
    target_dir, drafter_dir, gemma_dir, out_dir = root / "target", root / "drafter", root / "gemma", root / "out"
    out_dir.mkdir()
    target.save_pretrained(target_dir)
    drafter.save_pretrained(drafter_dir)
    gemma = tiny_target("gemma3", seed=6, dtype=torch.float32)
    gemma.save_pretrained(gemma_dir)
    mp.start_processes(_rank, args=(2, _free_port(), str(target_dir), str(drafter_dir), str(gemma_dir), str(out_dir)),
                       nprocs=2, join=True, start_method="spawn")
    ranks = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, target, drafter, gemma


def test_the_runner_holds_its_own_heads(sharded_runs):
    ranks, target, _, _ = sharded_runs
    for rank in ranks:
        assert rank["facts"]["tensor_parallel"] == 2
        assert rank["facts"]["kv_heads"] == target.config.num_key_value_heads // 2
        assert "tensor-parallel ranks runs its modules" in rank["facts"]["fused"]


@pytest.mark.parametrize("path", PATHS)
def test_every_path_on_both_ranks_is_the_unsharded_greedy_output(sharded_runs, path):
    """Each rank decodes exactly the unsharded target's greedy tokens, and the drafter proposes and gets accepted
    what it does on the unsharded target (the same acceptance lengths as the unsharded fast loop)."""
    import fold_hf
    from fold_hf.generation import release_fast_state

    ranks, target, drafter, _ = sharded_runs
    drafter = drafter.float().bind_target(target)
    drafter.set_fold_config(mode_config("fold"))
    for seed, length in PROMPTS:
        ids = prompt(seed, length)
        want = target.generate(ids, max_new_tokens=NEW, do_sample=False)[0, length:].tolist()
        unsharded = fold_hf.fast_generate(target, None if path == "ar" else drafter, ids, max_new_tokens=NEW,
                                          engine="eager", return_stats=True)
        release_fast_state(target)
        for r, rank in enumerate(ranks):
            got = rank["out"][f"{path}/{seed}"]
            assert got["tokens"] == want, (path, seed, r)
            if got["acceptance"] is not None:
                assert got["acceptance"] == unsharded.acceptance_lengths, (path, seed, r)
            if path == "batched":
                assert got["batched"]
    if path not in ("ar", "routed"):
        accepted = [n for rank in ranks for s, _ in PROMPTS for n in rank["out"][f"{path}/{s}"]["acceptance"]]
        assert max(accepted) > 1  # proposals were accepted: the drafter ran on the sharded target's taps


def test_a_family_that_does_not_hold_shards_is_refused_by_name_and_runs_on_the_loop(sharded_runs):
    ranks, _, _, gemma = sharded_runs
    ids = prompt(2, 20)
    want = gemma.generate(ids, max_new_tokens=NEW, do_sample=False)[0, 20:].tolist()
    for rank in ranks:
        assert "is sharded over 2 tensor-parallel ranks; the fast loop runs sharded targets of the Llama family" in \
            rank["facts"]["gemma_reason"]
        assert rank["out"]["gemma/generate"]["tokens"] == want


def test_the_benchmark_runs_on_one_and_two_ranks(tmp_path):
    """``benchmarks/tensor_parallel_bench.py`` on the CPU (gloo, a tiny pair): one rank and two under
    ``torch.distributed.run``, then the comparison keys, named by both terms."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "tensor_parallel_bench.py"
    subprocess.run([sys.executable, str(script), "--make", str(tmp_path / "m"), "--tiny"], check=True,
                   capture_output=True)
    for n in (1, 2):
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "--master_port",
                        str(_free_port()), str(script), "--model", str(tmp_path / "m"), "--out", str(tmp_path / f"tp{n}"),
                        "--contexts", "64", "--rounds", "3"], check=True, capture_output=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    report = json.loads((tmp_path / "tp2" / "tensor_parallel.json").read_text())
    assert report["facts"]["tensor_parallel"] == 2 and report["facts"]["kv_heads_per_rank"] == 1
    assert {(r["row"], r["context"]) for r in report["rows"]} == {("ar", 64), ("sd_fold", 64)}
    subprocess.run([sys.executable, str(script), "--compare", str(tmp_path / "tp1"), str(tmp_path / "tp2"), "--out",
                    str(tmp_path)], check=True, capture_output=True)
    keys = json.loads((tmp_path / "compare.json").read_text())["keys"]
    assert set(keys) == {"tp2_ar_over_one_gpu_64", "tp2_ar_over_floor_64", "tp2_sd_round_over_tp_ar_64"}
    assert all(v > 0 for v in keys.values())
