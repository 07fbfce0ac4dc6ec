"""Where a decode step's GPU time goes: kernels of our AR step and speculative round, by target path.

Random Llama-3.1-8B-shape target and DFlash-shape drafter (as ``e2e_bench.py``), a context of T tokens in the
caches, the ``static`` engine (the graph path's kernels without capture, so the profiler sees each launch).
For each target path (``bucket``: bucket attention; ``triton``: decode-kernel attention; ``fused``: decode kernel
plus the fused norm/rope/MLP kernels) and each step (``ar``, ``sd_fold``) it records every CUDA kernel over a
few rounds and writes, per round: kernel count, summed kernel time, time in GEMM/GEMV kernels and the bandwidth
they achieve on the weight bytes, and the top kernels.

Writes ``profile.csv`` (one row per path and step) and ``profile_<path>_<step>.txt`` (top kernels) under
``--out``. Kernel time excludes launch gaps; a CUDA-graph replay runs the same kernels back to back, so the
difference between this sum and the graphs engine's round time is what remains of the gaps.

    python benchmarks/profile_step.py --out $OUT --context 32768      (about 1 minute on an H200)
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import TARGET_PATHS, build_random_pair, copy_bandwidth, log, machine, path_environment  # noqa: E402

from fold_hf import FoldConfig  # noqa: E402
from fold_hf.generation.fast import release_fast_state, time_rounds  # noqa: E402

GEMM_MARKERS = ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "splitk")


def kernel_table(prof, rounds: int) -> list[dict]:
    out = []
    for evt in prof.key_averages():
        device_us = getattr(evt, "self_device_time_total", None)
        if device_us is None:
            device_us = evt.self_cuda_time_total
        if device_us <= 0 or "CUDA" not in str(getattr(evt, "device_type", "")):
            continue
        out.append({"kernel": evt.key, "us_per_round": device_us / rounds, "calls_per_round": evt.count / rounds})
    return sorted(out, key=lambda r: -r["us_per_round"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--paths", default="bucket,triton,fused,fused_drafter")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_step needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target, drafter = build_random_pair(args.context + 4096)
    drafter.set_fold_config(FoldConfig(mode="fold", window=2048, alpha=2.0))
    bandwidth = copy_bandwidth()
    embed = target.get_input_embeddings().weight
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters()) - embed.numel() * 2
    log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; target weight bytes per step {weight_bytes / 1e9:.2f} GB")
    rows = []
    for path in [p for p in args.paths.split(",") if p]:
        for step, draft in (("ar", None), ("sd_fold", drafter)):
            kw = dict(engine="static", **TARGET_PATHS[path])
            with path_environment(path):
                time_rounds(target, draft, args.context, 3, **kw)  # compile kernels, build buffers
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    result = time_rounds(target, draft, args.context, args.rounds, **kw)
                    torch.cuda.synchronize()
            rounds = len(result.acceptance_lengths)
            table = kernel_table(prof, rounds)
            total_us = sum(r["us_per_round"] for r in table)
            gemm_us = sum(r["us_per_round"] for r in table if any(m in r["kernel"].lower() for m in GEMM_MARKERS))
            weights_read = weight_bytes + (sum(p.numel() * 2 for p in draft.parameters()) if draft else 0)
            row = {"path": path, "step": step, "context": args.context, "rounds": rounds,
                   "kernels_per_round": round(sum(r["calls_per_round"] for r in table), 1),
                   "kernel_ms_per_round": total_us / 1e3, "gemm_ms_per_round": gemm_us / 1e3,
                   "gemm_weight_gb_s": weights_read / (gemm_us * 1e-6) / 1e9 if gemm_us else None,
                   "weight_floor_ms": weights_read / bandwidth * 1e3}
            rows.append(row)
            log(f"{path:>7} {step:>8}: {row['kernels_per_round']:.0f} kernels, {row['kernel_ms_per_round']:.2f} ms "
                f"of kernels ({row['gemm_ms_per_round']:.2f} ms GEMM at {row['gemm_weight_gb_s'] or 0:.0f} GB/s; "
                f"weight floor {row['weight_floor_ms']:.2f} ms)")
            with open(out / f"profile_{path}_{step}.txt", "w") as f:
                f.write(f"{path} {step} T={args.context}: per round, {rounds} rounds\n")
                for r in table[:40]:
                    f.write(f"{r['us_per_round']:10.1f} us {r['calls_per_round']:7.1f} x  {r['kernel'][:150]}\n")
        release_fast_state(target)
        torch.cuda.empty_cache()
    meta = machine()
    with open(out / "profile.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["gpu", "torch", "date", *rows[0]])
        writer.writeheader()
        for row in rows:
            writer.writerow({"gpu": meta.get("gpu"), "torch": meta.get("torch"), "date": meta.get("date"), **row})
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
