"""Time one layer of the target's verify attention: the default bucket attention vs the opt-in decode kernel (GPU).

Usage (repo root, one GPU; about 1-2 minutes on an H200):

    python benchmarks/decode_attention_bench.py --out $OUT/decode

For the Llama-3.1-8B target shape (32 query heads, 8 KV heads, head_dim 128, bf16), query lengths L = 1 (AR)
and 10 (a speculative block), and contexts T = 8K, 32K, 128K, it times, each captured in a CUDA graph (as the
fast loop replays them) with the L2 flushed before every replay:

* ``bucket``: what ``StaticTarget.forward_static`` runs by default: two matmuls over the length bucket with a
  masked fp32 softmax;
* ``triton``: ``decode_attention_triton`` with the length read from the device and splits sized for the bucket
  (what ``target_attention="triton"`` runs), plus a small sweep of ``num_splits`` x ``num_stages`` x ``block_n`` x ``num_warps``
  (each config's relative error against the fp64 twin is recorded: a config that is fast but wrong shows it);
* ``--merge-sweep``: the merge pass's launch shapes with the default split pass; ``--chain 32`` captures 32 calls a
  graph (one step's layers, the launches back to back) and reports per call;
* ``floor``: K + V bytes of the T entries / the copy bandwidth measured in the same run.

Writes ``decode_attention.csv`` and ``decode_attention.json`` (rows and the best config per shape) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_bench import graphed, measure_bandwidth, percentiles, time_cuda, versions  # noqa: E402

from fold_hf.targets.base import bucket_length  # noqa: E402
from fold_hf.kernels import decode_attention_reference  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def bucket_attention(q, keys, values, positions, bucket: int, scaling: float):
    """The default path of ``StaticTarget.forward_static`` for one layer: q ``[1, Hq, L, D]``, cache buffers
    ``[1, Hkv, capacity, D]`` already holding the block at ``positions [L]`` -> ``[1, Hq, L, D]``."""
    _, Hq, L, D = q.shape
    Hkv = keys.shape[1]
    group = Hq // Hkv
    key_index = torch.arange(bucket, device=q.device)
    hidden_keys = ~(key_index[None, :] <= positions[:, None]).repeat(group, 1)
    q_rows = q.reshape(1, Hkv, group * L, D)
    scores = torch.matmul(q_rows, keys[:, :, :bucket].transpose(-1, -2)).float() * scaling
    probs = scores.masked_fill(hidden_keys, -math.inf).softmax(-1).to(values.dtype)
    return torch.matmul(probs, values[:, :, :bucket]).reshape(1, Hq, L, D)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--contexts", default="8192,32768,131072")
    parser.add_argument("--query-lengths", default="1,10")
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--no-sweep", action="store_true", help="time the default kernel config only")
    parser.add_argument("--merge-sweep", action="store_true",
                        help="also time the merge pass's launch shapes (value dims per program, warps, the early "
                             "load of the partial outputs) with the default split pass")
    parser.add_argument("--chain", type=int, default=1,
                        help="calls per captured graph, timed per call (32 = a step's layers: the launches' ramps "
                             "overlap as in the step)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention_bench needs a CUDA GPU")
    from fold_hf.kernels.fold_read.launch import default_num_splits
    from fold_hf.kernels.fold_read.triton import decode_attention_triton

    device = torch.device("cuda")
    Hq, Hkv, D, scaling = 32, 8, 128, 128**-0.5
    bandwidth = measure_bandwidth(device)
    log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; {json.dumps(versions())}")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    rows, best = [], {}
    g = torch.Generator(device="cpu").manual_seed(0)
    for T in (int(c) for c in args.contexts.split(",")):
        for L in (int(x) for x in args.query_lengths.split(",")):
            capacity = T + 256
            bucket = bucket_length(T + L, capacity)
            keys = torch.randn(1, Hkv, capacity, D, generator=g).to(device, torch.bfloat16)
            values = torch.randn(1, Hkv, capacity, D, generator=g).to(device, torch.bfloat16)
            q = torch.randn(1, Hq, L, D, generator=g).to(device, torch.bfloat16)
            positions = torch.arange(T, T + L, device=device)
            length = positions[:1].to(torch.int32)
            block_k, block_v = keys[:, :, T : T + L], values[:, :, T : T + L]
            floor_us = 2 * Hkv * T * D * 2 / bandwidth * 1e6
            oracle = decode_attention_reference(q.double(), keys.double(), values.double(), block_k.double(),
                                                block_v.double(), T, scaling=scaling)

            def record(name, replay, out, **config):
                calls = args.chain if name == "triton" else 1
                times = [t / calls for t in time_cuda(replay, args.reps, warmup=3, flush=flush)]
                p20, p50, p80 = percentiles(times)
                err = ((out.double() - oracle).norm() / oracle.norm()).item()
                row = {"impl": name, "T": T, "L": L, "bucket": bucket, "p20_us": p20, "p50_us": p50, "p80_us": p80,
                       "floor_us": floor_us, "fraction_of_floor": floor_us / p50, "rel_err": err, **config}
                rows.append(row)
                log(f"T={T:>6} L={L:>2} {name:>7} {json.dumps(config)}: p50 {p50:7.1f} us "
                    f"(floor {floor_us:6.1f}), rel err {err:.1e}")
                return row

            # [1, L, Hq, D] like the kernel and the twin
            record("bucket", *graphed(
                lambda: bucket_attention(q, keys, values, positions, bucket, scaling).transpose(1, 2)))
            splits0 = default_num_splits(bucket, Hkv, 64, device)
            configs = [dict(num_splits=None, num_stages=None, block_n=None, num_warps=None),
                       # the merge pass as it was before 2026-11-30's single-load merge (8 splits per load)
                       dict(num_splits=None, num_stages=None, block_n=None, num_warps=None, merge_split_chunk=8)]
            if args.merge_sweep:
                configs += [dict(merge_early_acc=False), dict(merge_dv_block=32),
                            dict(merge_dv_block=32, merge_early_acc=False), dict(merge_warps=4),
                            dict(merge_dv_block=128), dict(merge_dv_block=128, merge_early_acc=False)]
            if not args.no_sweep:
                configs += [dict(num_splits=s, num_stages=st, block_n=bn, num_warps=w)
                            for s in (max(1, splits0 // 2), splits0, 2 * splits0) for st in (2, 3) for bn in (32, 64) for w in (4, 8)]
            for config in configs:
                def call(config=config):
                    for _ in range(args.chain):
                        out = decode_attention_triton(q, keys, values, block_k, block_v, length, scaling=scaling,
                                                      max_context_length=bucket, **config)
                    return out

                row = record("triton", *graphed(call), **config)
                key = f"T={T},L={L}"
                if row["rel_err"] < 1e-2 and (key not in best or row["p50_us"] < best[key]["p50_us"]):
                    best[key] = row
            del keys, values
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fields = ["impl", "T", "L", "bucket", "num_splits", "num_stages", "block_n", "num_warps", "merge_split_chunk",
              "merge_dv_block", "merge_warps", "merge_early_acc",
              "p20_us", "p50_us", "p80_us", "floor_us", "fraction_of_floor", "rel_err"]
    with (out / "decode_attention.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "decode_attention.json").write_text(json.dumps({"versions": versions(), "bandwidth_tb_s": bandwidth / 1e12,
                                                           "best_triton": best, "rows": rows}, indent=2))
    log("best triton config per shape: " + json.dumps({k: {c: v.get(c) for c in ("num_splits", "num_stages", "block_n",
                                                                              "num_warps", "p50_us",
                                                                              "fraction_of_floor")}
                                                       for k, v in best.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
