"""The decode step's projections on one GPU: cuBLAS (``F.linear``, plus the ``silu_mul`` kernel after gate|up)
against the skinny Triton GEMMs of :mod:`fold_hf.kernels.gemm.triton` over a sweep of tiles, at the Llama-3.1-8B
shape (or ``--shapes qwen35_9b``), 1 / 10 / 16 rows, bf16; ``--split-k`` adds the split-K plans of several rows
(``$FOLD_HF_SKINNY_SPLIT_K``, issue 39).

Each timing is a CUDA graph of ``--calls`` launches cycling over 8 distinct weights (so no launch finds its
weight in L2, as in a step where every layer has its own), replayed ``--reps`` times, p20/p50/p80 of the per-call
time over 15 measurements; ``floor_us`` is the weight bytes over the device-to-device copy bandwidth measured in
the same run. Every Triton configuration is checked against ``F.linear`` first (``rel_err``).

Writes ``skinny_gemm.csv`` and ``skinny_gemm.json`` (rows, best configuration per shape and row count) under
``--out``.

    python benchmarks/skinny_gemm_bench.py --out $OUT/gemm            (about 2 minutes on an H200)
    python benchmarks/skinny_gemm_bench.py --out $OUT/q --shapes qwen35_9b --rows 16 --split-k
    python benchmarks/skinny_gemm_bench.py --out /tmp/g --dry-run      (CPU interpreter: tiny shapes, fp32)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LLAMA_8B = [("qkv", 6144, 4096, False), ("o_proj", 4096, 4096, False), ("gate_up_silu", 28672, 4096, True),
            ("down", 4096, 14336, False)]
# (block_n, block_k, warps, stages, dot) for one row; more rows always run the dot path
ONE_ROW = [(16, 512, 4, 3, False), (8, 512, 4, 3, False), (16, 256, 4, 4, False), (32, 256, 4, 3, False),
           (16, 1024, 8, 2, False), (8, 1024, 4, 2, False), (32, 512, 8, 3, False), (16, 512, 2, 3, False),
           (16, 128, 4, 6, False), (16, 256, 4, 3, True), (32, 256, 4, 3, True)]
MANY_ROWS = [(16, 256, 4, 3, True), (16, 512, 4, 3, True), (32, 256, 4, 3, True), (16, 128, 4, 5, True),
             (32, 128, 4, 4, True), (64, 128, 4, 3, True)]
# Qwen3.5-9B's decode projections (issue 39): the merged in_proj q|k|v|z|b|a of a Gated DeltaNet layer, a full
# attention layer's q (with its gate)|k|v, o / out_proj, gate|up with the SiLU, down
QWEN35_9B = [("in_proj_qkvzba", 12352, 4096, False), ("attn_qkv", 10240, 4096, False), ("o_proj", 4096, 4096, False),
             ("gate_up_silu", 24576, 4096, True), ("down", 4096, 12288, False)]
SHAPES = {"llama31_8b": LLAMA_8B, "qwen35_9b": QWEN35_9B}
# --split-k: the split-K plans of several rows (issue 39; plain products only): the library's own
# ($FOLD_HF_SKINNY_SPLIT_K=1, "split auto") and forced split counts (block_n, block_k, warps, stages, dot, splits)
SPLIT_K_ROWS = ["auto", (64, 256, 4, 3, True, 2), (64, 256, 4, 3, True, 3), (64, 256, 4, 3, True, 4),
                (64, 256, 4, 3, True, 6), (64, 256, 4, 3, True, 8), (32, 256, 4, 3, True, 4),
                (128, 128, 8, 3, True, 4), (64, 128, 4, 4, True, 4), (64, 512, 8, 2, True, 4)]


def log(*args) -> None:
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def copy_bandwidth(device: torch.device) -> float:
    n = (1 << 31) // 2 if device.type == "cuda" else 1 << 20
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    return 2 * n * 2 * 10 / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn, weights, x, calls: int, reps: int, device: torch.device) -> list[float]:
    """Per-call microseconds, 15 measurements of ``reps`` replays of a graph of ``calls`` launches."""
    if device.type != "cuda":
        start = time.perf_counter()
        for i in range(calls):
            fn(x, weights[i % len(weights)])
        return [(time.perf_counter() - start) / calls * 1e6]
    for i in range(3):  # compile and warm up outside the capture
        fn(x, weights[i % len(weights)])
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn(x, weights[0])
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(x, weights[i % len(weights)])
    graph.replay()
    sync(device)
    out = []
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(15):
        begin.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        out.append(begin.elapsed_time(end) * 1e3 / (reps * calls))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rows", default="1,10,16")
    parser.add_argument("--calls", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--shapes", default="llama31_8b", choices=sorted(SHAPES))
    parser.add_argument("--split-k", action="store_true",
                        help="also the split-K plans of several rows (plain products)")
    parser.add_argument("--quick", action="store_true",
                        help="several rows: cuBLAS, today's plan and (with --split-k) the library's split plan only")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from fold_hf.kernels.gemm.naive import gate_up_silu_reference
    from fold_hf.kernels.gemm.triton import (PLAN_ENV, SPLIT_K_ENV, exact_plan, gate_up_silu_triton,
                                             skinny_linear_triton)
    from fold_hf.kernels.layer.triton import silu_mul_triton

    shapes = [("qkv", 96, 600, False), ("gate_up_silu", 192, 64, True)] if args.dry_run else SHAPES[args.shapes]
    one_row, many_rows = (ONE_ROW[:2], MANY_ROWS[:1]) if args.dry_run else (ONE_ROW, MANY_ROWS)
    split_rows = (SPLIT_K_ROWS[:2] if args.dry_run else SPLIT_K_ROWS) if args.split_k else []
    if args.quick:  # today's several-row plan (the exact plan's tiles), then the library's split plan
        today = exact_plan(torch.finfo(dtype).bits // 8)
        many_rows = [(today.block_n, today.block_k, today.num_warps, today.num_stages, True)]
        split_rows = split_rows[:1]
    calls = 2 if args.dry_run else args.calls
    bandwidth = copy_bandwidth(device)
    machine = {"gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "triton": __import__("triton").__version__,
               "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "bandwidth_tb_s": bandwidth / 1e12}
    log("machine", machine)
    rows_out, best = [], {}
    for name, N, K, silu in shapes:
        g = torch.Generator(device="cpu").manual_seed(0)
        weights = [(torch.randn(N, K, generator=g) / K**0.5).to(device=device, dtype=dtype)
                   for _ in range(2 if args.dry_run else 8)]
        floor_us = N * K * torch.finfo(dtype).bits / 8 / bandwidth * 1e6
        for rows in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(rows, K, generator=g).to(device=device, dtype=dtype)
            if silu:
                def cublas(x, w):
                    gate, up = torch.nn.functional.linear(x, w).chunk(2, -1)
                    return silu_mul_triton(gate, up) if device.type == "cuda" else torch.nn.functional.silu(gate) * up
                oracle = gate_up_silu_reference(x.double(), weights[0].double())
                triton_fn = gate_up_silu_triton
            else:
                def cublas(x, w):
                    return torch.nn.functional.linear(x, w)
                oracle = x.double() @ weights[0].double().T
                triton_fn = skinny_linear_triton
            variants = [("cublas", None)] + [(f"triton {c}", c) for c in (one_row if rows == 1 else many_rows)]
            if rows > 1 and not silu:
                variants += [("triton split auto" if c == "auto" else f"triton split {c}", c) for c in split_rows]
            for label, config in variants:
                os.environ.pop(SPLIT_K_ENV, None)
                if config is None:
                    os.environ.pop(PLAN_ENV, None)
                    fn = cublas
                elif config == "auto":  # the library's split-K plan for this shape
                    os.environ.pop(PLAN_ENV, None)
                    os.environ[SPLIT_K_ENV] = "1"
                    fn = triton_fn
                else:
                    os.environ[PLAN_ENV] = (",".join(str(v) for v in config[:4]) + (",dot" if config[4] else "")
                                            + (f",sk={config[5]}" if len(config) > 5 else ""))
                    fn = triton_fn
                try:
                    result = fn(x, weights[0])
                    rel = ((result.double() - oracle).norm() / oracle.norm()).item()
                    times = time_calls(fn, weights, x, calls, args.reps, device)
                except Exception as exc:  # a configuration that does not compile or launch is reported, not fatal
                    log(f"{name} rows={rows} {label}: {type(exc).__name__}: {str(exc)[:200]}")
                    continue
                row = {"shape": name, "N": N, "K": K, "rows": rows, "method": label, "p20_us": pct(times, 0.2),
                       "p50_us": pct(times, 0.5), "p80_us": pct(times, 0.8), "floor_us": floor_us,
                       "floor_over_p50": floor_us / pct(times, 0.5), "rel_err": rel, **machine}
                rows_out.append(row)
                log(f"{name:13s} rows={rows:2d} {label:32s} p50 {row['p50_us']:8.2f} us  floor {floor_us:7.2f}  "
                    f"({row['floor_over_p50']:.3f})  rel_err {rel:.2e}")
            os.environ.pop(PLAN_ENV, None)
            os.environ.pop(SPLIT_K_ENV, None)
            mine = [r for r in rows_out if r["shape"] == name and r["rows"] == rows and r["method"] != "cublas"
                    and r["rel_err"] < 2e-2]
            base = [r for r in rows_out if r["shape"] == name and r["rows"] == rows and r["method"] == "cublas"]
            if mine and base:
                top = min(mine, key=lambda r: r["p50_us"])
                best[f"{name}/{rows}"] = {"method": top["method"], "p50_us": top["p50_us"],
                                          "cublas_p50_us": base[0]["p50_us"], "floor_us": floor_us,
                                          "cublas_over_best": base[0]["p50_us"] / top["p50_us"]}
        del weights
    with open(out_dir / "skinny_gemm.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows_out[0]))
        writer.writeheader()
        writer.writerows(rows_out)
    (out_dir / "skinny_gemm.json").write_text(json.dumps({"machine": machine, "rows": rows_out, "best": best},
                                                         indent=1))
    for key, value in best.items():
        log("best", key, value)


if __name__ == "__main__":
    main()
