"""A target sharded by transformers' tensor parallelism (issue 41): the fast loop's AR step and speculative round on
N ranks against one rank, and against the memory floor of N GPUs (docs/tensor-parallel.md).

Three steps (``benchmarks/gpu/tensor_parallel.sh`` runs them on a two-GPU machine):

1. ``--make DIR``: a random Llama-3.1-8B-shape target and the z-lab DFlash-shape drafter (``e2e_bench``), bf16,
   saved with ``save_pretrained`` (``--shape llama70b-layers --layers K``: K layers of the Llama-3.1-70B shape,
   hidden 8192, 64 query / 8 KV heads, MLP 28672, with a two-layer drafter of that width; ``--tiny``: a small Llama
   and drafter, fp32, for the CPU).
2. under ``torchrun --nproc_per_node N``: ``--model DIR --out OUT``: every rank loads the target (N > 1:
   ``tp_plan="auto"``; N = 1: whole, on its device) and the drafter (replicated), then ``time_rounds`` per context in
   ``--contexts``: ``--rounds`` AR steps and ``fold`` rounds (W 2048, α 2) on ``--engine`` (default ``graphs`` on
   CUDA, ``static`` on the CPU; a step the engine cannot run is retried on ``static`` and the reason kept), p50,
   for each setting of ``--fused`` (``1``: the fused layers, on a sharded target with the column / row-parallel
   projections on each rank's weights; ``0``: the module path; default ``1,0`` on CUDA, ``0`` on the CPU).
   Floor per rank: (the target's weights read per step, embedding excluded, + its KV bytes at T) / N / the
   device-to-device copy bandwidth measured on that rank. Rank 0 writes ``OUT/tensor_parallel.json``.
3. ``--compare ONE MANY --out OUT``: ``tp{N}_ar_over_one_gpu_{T}`` (the sharded AR step over the one-rank step) and
   ``tp{N}_sd_round_over_tp_ar_{T}`` (the sharded fold round over the sharded AR step) into ``OUT/compare.json``,
   from the fused rows where they ran (else the module path's), and the module path's as ``..._module_path_{T}``
   beside them when both ran.

    python benchmarks/tensor_parallel_bench.py --make /tmp/tp8b
    torchrun --nproc_per_node 1 benchmarks/tensor_parallel_bench.py --model /tmp/tp8b --out $OUT/tp1
    torchrun --nproc_per_node 2 benchmarks/tensor_parallel_bench.py --model /tmp/tp8b --out $OUT/tp2
    python benchmarks/tensor_parallel_bench.py --compare $OUT/tp1 $OUT/tp2 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


SHAPES = ("llama31-8b", "llama70b-layers")


def make(directory: Path, tiny: bool, shape: str = "llama31-8b", layers: int = 8) -> None:
    from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig

    if tiny:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096,
                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        target = LlamaForCausalLM(cfg).eval()
        dcfg = FoldDrafterConfig(block_size=4, num_target_layers=4, target_layer_ids=[1, 2], mask_token_id=255,
                                 vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                 max_position_embeddings=4096)
        drafter = FoldDrafter(dcfg, FoldConfig(mode="dflash")).eval()
    elif shape == "llama70b-layers":
        from transformers import LlamaConfig, LlamaForCausalLM

        device = "cuda" if torch.cuda.is_available() else "cpu"
        positions = 131072 + 4096
        cfg = LlamaConfig(hidden_size=8192, intermediate_size=28672, num_hidden_layers=layers, num_attention_heads=64,
                          num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                          max_position_embeddings=positions, tie_word_embeddings=False, bos_token_id=None,
                          eos_token_id=None, pad_token_id=None)
        taps = sorted({min(layers - 1, i * layers // 3 + 1) for i in range(3)})
        with torch.device(device):
            target = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
            dcfg = FoldDrafterConfig(block_size=10, num_target_layers=layers, target_layer_ids=taps,
                                     mask_token_id=128002, vocab_size=128256, hidden_size=8192,
                                     intermediate_size=28672, num_hidden_layers=2, num_attention_heads=64,
                                     num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                                     max_position_embeddings=positions)
            drafter = FoldDrafter(dcfg, FoldConfig(mode="dflash")).to(torch.bfloat16).eval()
    else:
        from e2e_bench import build_random_pair

        target, drafter = build_random_pair(131072 + 4096, device="cuda" if torch.cuda.is_available() else "cpu")
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    target.save_pretrained(directory / "target")
    drafter.save_pretrained(directory / "drafter")
    log(f"saved to {directory}")


def load(directory: Path, world: int, device: torch.device):
    from transformers import AutoModelForCausalLM

    from fold_hf import FoldDrafter

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    if world > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tp_plan argument's spelling moved between releases
            try:
                from transformers import DistributedConfig

                target = AutoModelForCausalLM.from_pretrained(directory / "target", dtype=dtype,
                                                              distributed_config=DistributedConfig(tp_plan="auto"))
            except (ImportError, TypeError):
                target = AutoModelForCausalLM.from_pretrained(directory / "target", dtype=dtype, tp_plan="auto")
    else:
        target = AutoModelForCausalLM.from_pretrained(directory / "target", dtype=dtype).to(device)
    drafter = FoldDrafter.from_pretrained(directory / "drafter", dtype=dtype).to(device).bind_target(target)
    return target.eval(), drafter.eval()


def copy_bandwidth(device: torch.device) -> float:
    n = (2**30 if device.type == "cuda" else 2**22) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        b.copy_(a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * a.numel() * a.element_size() / min(times[1:])


def rank_run(args) -> None:
    import torch.distributed as dist

    from fold_hf import FoldConfig
    from fold_hf.generation.fast import release_fast_state, time_rounds

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    torch.set_num_threads(max(1, torch.get_num_threads() // max(world, 1)) if not cuda else torch.get_num_threads())
    target, drafter = load(Path(args.model), world, device)
    drafter.set_fold_config(FoldConfig(mode="fold", window=2048, alpha=2.0))
    from fold_hf.targets.registry import build_static_target

    probe = build_static_target(target, 16, ())
    facts = {"world": world, "tensor_parallel": probe.tensor_parallel, "kv_heads_per_rank": probe.num_kv_heads,
             "fused": probe.fused_unsupported()}
    del probe
    weights = sum(p.numel() * p.element_size() for n, p in target.named_parameters() if "embed_tokens" not in n)
    cfg = target.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    bandwidth = copy_bandwidth(device)
    engine = args.engine or ("graphs" if cuda else "static")
    fused_settings = [x == "1" for x in (args.fused or ("1,0" if cuda else "0")).split(",") if x]
    rows, notes = [], []
    for T in args.contexts:
        kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * T * (2 if cuda else 4)
        floor_ms = (weights + kv) / world / bandwidth * 1e3
        for fused in fused_settings:
            for name, assistant in (("ar", None), ("sd_fold", drafter)):
                used = engine
                kw = dict(fused_layers=fused, target_attention="triton" if fused else None)
                try:
                    res = time_rounds(target, assistant, T, args.rounds, engine=engine, **kw)
                except Exception as err:  # noqa: BLE001 - recorded and retried on the static engine, said below
                    notes.append(f"{name} at {T} on {engine} (fused {fused}): {type(err).__name__}: {err}"
                                 .splitlines()[0])
                    used = "static"
                    release_fast_state(target)
                    res = time_rounds(target, assistant, T, args.rounds, engine="static", **kw)
                p50 = statistics.median(res.round_seconds[2:] or res.round_seconds) * 1e3
                rows.append({"row": name, "context": T, "fused": fused, "engine": used, "p50_ms": p50,
                             "floor_ms": floor_ms, "over_floor": p50 / floor_ms if name == "ar" else None})
                log(f"N={world} {name:8s} T={T:6d} {'fused' if fused else 'modules'} {used:7s} p50 {p50:8.3f} ms  "
                    f"floor/rank {floor_ms:7.3f} ms")
                release_fast_state(target)
    if rank == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        info = {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "device": torch.cuda.get_device_name(device) if cuda else "cpu (gloo)",
                "bandwidth_gb_s": bandwidth / 1e9}
        (out / "tensor_parallel.json").write_text(json.dumps({"machine": info, "facts": facts, "rows": rows,
                                                              "notes": notes}, indent=2))
    for note in notes:
        log(f"note: {note}")
    dist.barrier()
    dist.destroy_process_group()
    if world > 1:
        # leave without the interpreter's finalization: the target's sharded parameters keep transformers' device-mesh
        # groups referenced, and a gloo worker thread destroyed during finalization can abort a rank after its work
        # is done and written (SIGABRT, "terminate called without an active exception": the fresh-clone CI of
        # 6aab94b, oldest transformers, once); everything this run writes is written and flushed above
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def compare(one: Path, many: Path, out: Path) -> dict:
    a = json.loads((one / "tensor_parallel.json").read_text())
    b = json.loads((many / "tensor_parallel.json").read_text())
    n = b["facts"]["world"]
    by_a = {(r["row"], r["context"], r.get("fused", False)): r for r in a["rows"]}
    by_b = {(r["row"], r["context"], r.get("fused", False)): r for r in b["rows"]}
    keys = {}

    def tag(T: int) -> str:
        return f"{T // 1024}k" if T % 1024 == 0 else str(T)

    fused_ran = any(f for _, _, f in by_b)
    for (row, T, fused), r in by_b.items():
        # the headline keys from the fused rows where they ran; the module path's beside them, named so
        suffix = "" if fused == fused_ran else "_module_path"
        if row == "ar" and (row, T, fused) in by_a:
            keys[f"tp{n}_ar_over_one_gpu{suffix}_{tag(T)}"] = r["p50_ms"] / by_a[(row, T, fused)]["p50_ms"]
            keys[f"tp{n}_ar_over_floor{suffix}_{tag(T)}"] = r["over_floor"]
        if row == "sd_fold" and ("ar", T, fused) in by_b:
            keys[f"tp{n}_sd_round_over_tp_ar{suffix}_{tag(T)}"] = r["p50_ms"] / by_b[("ar", T, fused)]["p50_ms"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps({"keys": keys, "one": a, "many": b}, indent=2))
    for key, value in keys.items():
        print(f"{key} = {value:.3f}")
    return keys


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make", help="write a random target + drafter here")
    parser.add_argument("--tiny", action="store_true", help="with --make: a small fp32 pair (CPU)")
    parser.add_argument("--shape", choices=SHAPES, default="llama31-8b", help="with --make: the target's shape")
    parser.add_argument("--layers", type=int, default=8, help="with --shape llama70b-layers: how many layers")
    parser.add_argument("--fused", default=None, help="fused-layer settings to time in turn, e.g. 1,0")
    parser.add_argument("--model", help="under torchrun: the directory --make wrote")
    parser.add_argument("--compare", nargs=2, metavar=("ONE", "MANY"))
    parser.add_argument("--out")
    parser.add_argument("--contexts", default="8192,32768")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--engine", default=None)
    args = parser.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    if args.make:
        make(Path(args.make), args.tiny, args.shape, args.layers)
    elif args.compare:
        compare(Path(args.compare[0]), Path(args.compare[1]), Path(args.out))
    elif args.model:
        rank_run(args)
    else:
        parser.error("give --make, --model (under torchrun) or --compare")


if __name__ == "__main__":
    with torch.no_grad():
        main()
