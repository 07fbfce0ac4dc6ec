"""Targets sharded by transformers' tensor parallelism (issue 41), on this CPU: two processes over gloo, each loading
a tiny target of every family with ``tp_plan="auto"`` (transformers' plans: q/k/v/gate/up column-parallel, o/down
row-parallel; Qwen3.5's linear-attention projections column-parallel with gathered outputs), every generate path run
on both ranks. The families: Llama, Gemma-3 (sliding rings + global layers), Gemma-4 (global layers with their own
head_dim and k = v, per-layer inputs, KV-shared layers) and Qwen3.5 (Gated DeltaNet + gated attention). The
independent statement: the unsharded target's own greedy ``generate``; and the unsharded fast loop's acceptance
lengths (the replicated drafter drafts on the same taps, so it proposes what it proposes unsharded)."""

import copy
import json
import os
import socket
import warnings

import pytest
import torch
import torch.multiprocessing as mp

from tiny import fit_drafter, mode_config, prompt, tiny_drafter, tiny_target, trained_pair

NEW = 10
PROMPTS = [(0, 9), (1, 60)]  # (seed, length): shorter and longer than the window W = 16 (and Gemma's window 8)
PATHS = ["generate", "fast-eager", "fast-static", "fused", "ar-fused", "routed", "ar", "batched", "batched-fused",
         "sampled", "draft-vocab"]
# draft-vocab: the drafter proposing from a subset of the vocabulary (fold_hf.DraftVocab): the sharded lm_head's rows
# of the subset gathered once on every rank, the proposals' logits then computed without a collective
# fused, ar-fused, batched-fused: the fused layers (their CPU twins) with the column / row-parallel projections on each
# rank's weights (weight_layout.project) and one all-reduce per row-parallel projection
# one worker runs this file: the module fixture below spawns two ranks that load every family (a minute), and with
# the tests spread over two pytest-xdist workers each worker built it once (2 x 63 s in the 2026-12-06 full run)
pytestmark = pytest.mark.xdist_group("tensor-parallel")

FAMILIES = ["llama", "gemma3", "gemma4_tp", "qwen35", "qwen35_moe"]  # gemma4_tp: tiny Gemma-4 with 2 global KV heads
RING_SLACK = 3  # the Gemma rings' slack on the ranks: the tiny rings wrap (a verify of a block of 4 rows fits)


def _pair(family: str):
    """The family's tiny target and a drafter fitted to it (fp32): Gemma's drafters tap layers 1 and 5, as the Gemma
    tests' pairs (their drafts are accepted)."""
    if family == "llama":  # a copy: trained_pair's models are shared by the process (fp64), and .float() is in place
        target, drafter = (copy.deepcopy(m) for m in trained_pair("llama"))
    else:
        target = tiny_target(family)
        taps = (1, 5) if family.startswith("gemma") else (1, 3)
        drafter = fit_drafter(target, tiny_drafter(target, taps=taps), steps=80, seq_len=40)
    return target.float(), drafter.float()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_sharded(directory: str, **distributed):
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tp_plan argument's spelling moved between releases
        try:
            from transformers import DistributedConfig

            kw = dict(distributed_config=DistributedConfig(tp_plan="auto", **distributed))
            return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, **kw)
        except (ImportError, TypeError):
            return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, tp_plan="auto")


def _decode_every_path(target, drafter) -> dict:
    """Every path's new tokens and acceptance lengths for :data:`PROMPTS` (``path/seed`` keys)."""
    import fold_hf
    from fold_hf.generation import release_fast_state

    out: dict = {}
    for seed, length in PROMPTS:
        ids = prompt(seed, length)
        for path in PATHS:
            if path.startswith("batched"):
                continue
            if path == "sampled":  # the same seed on every rank: every rank draws the same tokens
                res = _sampled(target, drafter, ids, seed)
            elif path == "draft-vocab":
                res = _with_draft_vocab(target, drafter, ids)
            elif path == "generate":
                res = fold_hf.generate(target, drafter, ids, max_new_tokens=NEW, return_stats=True)
            elif path == "routed":
                seq = target.generate(ids, assistant_model=drafter, max_new_tokens=NEW, do_sample=False)
                out[f"{path}/{seed}"] = {"tokens": seq[0, length:].tolist(), "acceptance": None}
                release_fast_state(target)
                continue
            else:
                engine = "eager" if path in ("fast-eager", "ar") else "static"
                res = fold_hf.fast_generate(target, None if path.startswith("ar") else drafter, ids,
                                            max_new_tokens=NEW, engine=engine, return_stats=True,
                                            **(dict(fused_layers=True, target_attention="triton")
                                               if path in ("fused", "ar-fused") else {}))
                release_fast_state(target)
            out[f"{path}/{seed}"] = {"tokens": res.new_tokens[0].tolist(), "acceptance": res.acceptance_lengths}
    rows = [prompt(seed, length)[0] for seed, length in PROMPTS]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    for path, engine, fused in (("batched", "eager", None), ("batched-fused", "static", True)):
        res = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=NEW, return_stats=True, engine=engine,
                                    fused_layers=fused)
        release_fast_state(target)
        for i, (seed, _) in enumerate(PROMPTS):
            out[f"{path}/{seed}"] = {"tokens": res.rows[i].new_tokens[0].tolist(),
                                     "acceptance": res.rows[i].acceptance_lengths, "batched": res.batched}
    return out


def _draft_vocab(drafter):
    """A draft vocabulary of three quarters of the ids (the first half and every other id after it)."""
    from fold_hf import DraftVocab

    V = drafter.target_lm_head.weight.shape[0]
    return DraftVocab(sorted(set(range(V // 2)) | set(range(0, V, 2))), V, source="test subset")


def _with_draft_vocab(target, drafter, ids: torch.Tensor):
    """Greedy on the static engine with the drafter proposing from :func:`_draft_vocab` (unset after)."""
    import fold_hf
    from fold_hf.generation import release_fast_state

    drafter.use_draft_vocab(_draft_vocab(drafter))
    try:
        return fold_hf.fast_generate(target, drafter, ids, max_new_tokens=NEW, engine="static", return_stats=True)
    finally:
        drafter.use_draft_vocab(None)
        release_fast_state(target)


def _sampled(target, drafter, ids: torch.Tensor, seed: int):
    """Sampled speculative decoding (temperature 1, top-k 0) seeded by ``seed``, on the static engine."""
    import fold_hf
    from fold_hf.generation import release_fast_state

    res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=NEW, do_sample=True, temperature=1.0, top_k=0,
                                generator=torch.Generator().manual_seed(100 + seed), engine="static",
                                return_stats=True)
    release_fast_state(target)
    return res


def _rank(rank: int, world: int, port: int, root: str) -> None:
    """One rank: load every family's sharded target and its drafter, run every path, write what it decoded."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # a file rendezvous: a TCP port chosen by _free_port() can be taken before rank 0 binds it (a suspected CI
    # flake, 2026-12-06); MASTER_PORT stays set for code that reads it
    dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=world)
    from fold_hf import FoldDrafter
    from fold_hf.kernels.common import is_sharded
    from fold_hf.targets import gemma
    from fold_hf.targets.base import UnsupportedTarget
    from fold_hf.targets.registry import build_static_target

    from fold_hf.targets import weight_layout
    from fold_hf.targets.tensor_parallel import local

    gemma.RING_SLACK = RING_SLACK
    reductions = []  # the row-parallel projections the fused layers ran on this rank's weights (one all-reduce each)
    counted = weight_layout.all_reduce
    weight_layout.all_reduce = lambda tensor, like: (reductions.append(1), counted(tensor, like))[1]
    report: dict = {}
    for family in FAMILIES:
        target = _load_sharded(os.path.join(root, family, "target"))
        drafter = FoldDrafter.from_pretrained(os.path.join(root, family, "drafter")).bind_target(target)
        drafter.set_fold_config(mode_config("fold"))
        runner = build_static_target(target, 32, ())
        facts = {"tensor_parallel": runner.tensor_parallel, "num_heads": runner.num_heads,
                 "kv_heads": list(getattr(runner, "kv_heads", [runner.num_kv_heads])),
                 "fused": runner.fused_unsupported(), "exact": runner.exact_unsupported()}
        facts["experts_sharded"] = any(is_sharded(p) for n, p in target.named_parameters() if ".experts." in n)
        head = drafter.target_lm_head.weight
        rows, _ = _draft_vocab(drafter).head_rows(head)  # the subset's rows: whole and plain on every rank
        facts["draft_vocab_rows"] = {"head_sharded": is_sharded(head), "rows_sharded": is_sharded(rows),
                                     "rows": torch.equal(rows[: len(_draft_vocab(drafter))],
                                                         head.full_tensor()[_draft_vocab(drafter).ids]
                                                         if is_sharded(head) else head[_draft_vocab(drafter).ids])}
        reductions.clear()
        weight_layout._WARNED.clear()  # (each reason is warned once per process)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report[family] = {"facts": facts, "out": _decode_every_path(target, drafter)}
        facts["separate_projections"] = sorted({str(w.message) for w in caught if "separate modules" in str(w.message)})
        facts["row_parallel_reductions"] = len(reductions)
        # after the fused paths: the first attention layer's q|k|v one buffer of this rank's rows
        attn = next(layer.self_attn for layer in runner.layers if hasattr(layer, "self_attn"))
        qkv = [local(getattr(attn, n).weight) for n in ("q_proj", "k_proj", "v_proj") if hasattr(attn, n)]
        facts["qkv_merged"] = weight_layout.rows_of_one_buffer(qkv) is not None
    # heads that do not split over the ranks (the tiny Gemma-4's one global KV head): refused by name
    try:
        build_static_target(_load_sharded(os.path.join(root, "gemma4-one-kv-head")), 32, ())
        report["indivisible"] = None
    except UnsupportedTarget as err:
        report["indivisible"] = str(err)
    # experts sharded by transformers' expert-parallel plan: refused by name (stacked_experts reads whole weights)
    try:
        build_static_target(_load_sharded(os.path.join(root, "qwen35_moe", "target"), enable_expert_parallel=True),
                            32, ())
        report["expert_parallel"] = None
    except UnsupportedTarget as err:
        report["expert_parallel"] = str(err)
    with open(os.path.join(root, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded_runs(tmp_path_factory):
    """Both ranks' reports, and every family's unsharded pair (fp32)."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    root = tmp_path_factory.mktemp("tp")
    pairs = {}
    for family in FAMILIES:
        target, drafter = _pair(family)
        target.save_pretrained(root / family / "target")
        drafter.save_pretrained(root / family / "drafter")
        pairs[family] = (target, drafter)
    tiny_target("gemma4_shared", seed=6, dtype=torch.float32).save_pretrained(root / "gemma4-one-kv-head")
    mp.start_processes(_rank, args=(2, _free_port(), str(root)), nprocs=2, join=True, start_method="spawn")
    ranks = [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, pairs


@pytest.mark.parametrize("family", FAMILIES)
def test_the_runner_holds_its_own_heads(sharded_runs, family):
    ranks, pairs = sharded_runs
    config = pairs[family][0].config
    for rank in ranks:
        facts = rank[family]["facts"]
        assert facts["tensor_parallel"] == 2
        assert facts["num_heads"] == config.num_attention_heads // 2
        if family.startswith("gemma"):  # per layer: sliding layers' KV heads, global layers' own (Gemma-4: 2)
            layers = pairs[family][0].model.layers
            whole = [layers[i].self_attn.k_proj.out_features // layers[i].self_attn.head_dim
                     if hasattr(layers[i].self_attn, "k_proj") else None for i in range(len(layers))]
            produced = [w for w in whole if w is not None]
            assert facts["kv_heads"][: len(produced)] == [w // 2 for w in produced]
        else:
            assert facts["kv_heads"] == [config.num_key_value_heads // 2]
        assert facts["fused"] is None  # the fused layers take a sharded target (the paths below run them)
        assert facts["row_parallel_reductions"] > 0  # o_proj / down_proj on this rank's weights + one all-reduce
        if family.startswith("qwen35"):  # the linear layers' projections gather their outputs: run as modules
            assert facts["separate_projections"] and all("colwise_gather_output" in m
                                                         for m in facts["separate_projections"])
        else:  # q|k|v and gate|up: one GEMM each over this rank's rows
            assert facts["separate_projections"] == [] and facts["qkv_merged"]
        if not family.startswith("qwen35"):  # (exact mode does not run Qwen3.5 at all)
            assert "sharded over 2 tensor-parallel ranks" in facts["exact"]  # exact mode refuses it, naming why


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_path_on_both_ranks_is_the_unsharded_greedy_output(sharded_runs, family, path):
    """Each rank decodes exactly the unsharded target's greedy tokens, and the drafter proposes and gets accepted
    what it does on the unsharded target (the same acceptance lengths as the unsharded fast loop). Sampled: every
    rank draws the tokens the unsharded target draws with the same seed (and so the same as every other rank)."""
    import fold_hf
    from fold_hf.generation import release_fast_state

    ranks, pairs = sharded_runs
    target, drafter = pairs[family]
    drafter = drafter.bind_target(target)
    drafter.set_fold_config(mode_config("fold"))
    for seed, length in PROMPTS:
        ids = prompt(seed, length)
        if path == "sampled":  # the unsharded run with the same seed draws the same tokens
            unsharded = _sampled(target, drafter, ids, seed)
            want = unsharded.new_tokens[0].tolist()
        elif path == "draft-vocab":  # the greedy tokens, and the acceptance of the unsharded run with the same subset
            want = target.generate(ids, max_new_tokens=NEW, do_sample=False)[0, length:].tolist()
            unsharded = _with_draft_vocab(target, drafter, ids)
        else:
            want = target.generate(ids, max_new_tokens=NEW, do_sample=False)[0, length:].tolist()
            unsharded = fold_hf.fast_generate(target, None if path.startswith("ar") else drafter, ids,
                                              max_new_tokens=NEW, engine="eager", return_stats=True)
            release_fast_state(target)
        for r, rank in enumerate(ranks):
            got = rank[family]["out"][f"{path}/{seed}"]
            assert got["tokens"] == want, (family, path, seed, r)
            if got["acceptance"] is not None:
                assert got["acceptance"] == unsharded.acceptance_lengths, (family, path, seed, r)
            if path.startswith("batched"):
                assert got["batched"]
    if path not in ("ar", "ar-fused", "routed"):
        accepted = [n for rank in ranks for s, _ in PROMPTS for n in rank[family]["out"][f"{path}/{s}"]["acceptance"]]
        assert max(accepted) > 1  # proposals were accepted: the drafter ran on the sharded target's taps


@pytest.mark.parametrize("family", FAMILIES)
def test_a_draft_vocabulary_on_a_sharded_head_keeps_its_rows_whole_on_every_rank(sharded_runs, family):
    """The lm_head transformers' plan shards by vocabulary (a DTensor) gives every rank the subset's rows of the whole
    head, as plain tensors equal to the gathered head's rows (the decoding itself: the draft-vocab path above)."""
    ranks, _ = sharded_runs
    for rank in ranks:
        facts = rank[family]["facts"]["draft_vocab_rows"]
        assert facts["head_sharded"]  # transformers' plan: the lm_head column-parallel (a DTensor)
        assert facts["rows"] and not facts["rows_sharded"]


def test_the_moe_experts_are_sharded_as_transformers_plans_them(sharded_runs):
    """Where transformers' plan shards the experts (5.17: gate_up_proj packed column-parallel, down_proj row-parallel;
    5.25 leaves them whole), the ranks ran them sharded, each its share of every expert with the partial outputs
    summed (moe.stacked_experts), and every path above still decoded the unsharded output."""
    ranks, pairs = sharded_runs
    plan = type(pairs["qwen35_moe"][0].config).base_model_tp_plan or {}
    planned = any(".experts." in key for key in plan)
    for rank in ranks:
        assert rank["qwen35_moe"]["facts"]["experts_sharded"] == planned
        assert not any(rank[f]["facts"]["experts_sharded"] for f in FAMILIES if f != "qwen35_moe")


def test_heads_that_do_not_split_over_the_ranks_are_refused_by_name(sharded_runs):
    ranks, _ = sharded_runs
    for rank in ranks:
        assert rank["indivisible"] is not None
        assert "1 KV heads of layer 2 do not split over 2 tensor-parallel ranks" in rank["indivisible"]


def test_experts_sharded_by_expert_parallelism_are_refused_by_name(sharded_runs):
    ranks, _ = sharded_runs
    for rank in ranks:
        assert rank["expert_parallel"] is not None
        assert "are split by expert over ranks (expert parallelism" in rank["expert_parallel"]


def test_the_benchmark_runs_on_one_and_two_ranks(tmp_path):
    """``benchmarks/tensor_parallel_bench.py`` on the CPU (gloo, a tiny pair): one rank and two under
    ``torch.distributed.run``, then the comparison keys, named by both terms."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "tensor_parallel_bench.py"

    def run(*args, **kw):  # a failing command fails the test with its own output (not only its exit status)
        done = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, **kw)
        assert done.returncode == 0, f"{args[:3]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"

    run(script, "--make", tmp_path / "m", "--tiny")
    for n in (1, 2):
        # --standalone: torchrun's own rendezvous picks a free port (a port chosen here beforehand can be taken
        # by another process before the ranks bind it: the fresh-clone CI of d627d3f failed here once, under load)
        run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", n, script, "--model", tmp_path / "m",
            "--out", tmp_path / f"tp{n}", "--contexts", 64, "--rounds", 3, "--fused", "1,0",
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    report = json.loads((tmp_path / "tp2" / "tensor_parallel.json").read_text())
    assert report["facts"]["tensor_parallel"] == 2 and report["facts"]["kv_heads_per_rank"] == 1
    assert report["notes"] == []  # every row ran on the engine asked for (no retry)
    assert {(r["row"], r["context"], r["fused"]) for r in report["rows"]} == {
        (row, 64, fused) for row in ("ar", "sd_fold") for fused in (True, False)}
    run(script, "--compare", tmp_path / "tp1", tmp_path / "tp2", "--out", tmp_path)
    keys = json.loads((tmp_path / "compare.json").read_text())["keys"]
    assert set(keys) == {f"tp2_{k}{path}_64" for k in ("ar_over_one_gpu", "ar_over_floor", "sd_round_over_tp_ar")
                         for path in ("", "_module_path")}
    assert all(v > 0 for v in keys.values())
