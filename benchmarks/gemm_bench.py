"""Weight-streaming GEMMs of one decoding step at the Llama-3.1-8B shape: 1 row (AR) vs a verify block (GPU only).

Usage (repo root, one GPU; under a minute on an H200):

    python benchmarks/gemm_bench.py --out $OUT/gemm

Why: at 32K a speculative round's GEMMs cost ~0.5 ms more than an AR step's on the same weights (profile_step.py,
2026-11-30: cuBLAS picks 64x16 tiles and extra split-K reductions for 10 rows where 1 row gets 64x8), although
both stream the same bytes. This times ``torch.nn.functional.linear`` (bf16, weights ``[N, K]``) for every
projection of a layer and the lm_head, at M = 1, 10, 16 rows, with the default BLAS backend and with cuBLASLt,
each call replayed from a CUDA graph with the L2 flushed before it, and reports the fraction of the weight-read
floor (weight bytes / copy bandwidth measured in the same run). Also the projections concatenated (q|k|v and
gate|up), to show what one GEMM per group would save. Writes ``gemm_bench.csv`` and ``gemm_bench.json``.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_bench import graphed, measure_bandwidth, percentiles, time_cuda, versions  # noqa: E402

HIDDEN, KV, INTERMEDIATE, VOCAB = 4096, 1024, 14336, 128256
# name, N (out features), K (in features), GEMMs of this kind per layer (lm_head: once per step)
PROJECTIONS = [
    ("q_proj", HIDDEN, HIDDEN, 1), ("k_proj", KV, HIDDEN, 1), ("v_proj", KV, HIDDEN, 1), ("o_proj", HIDDEN, HIDDEN, 1),
    ("gate_proj", INTERMEDIATE, HIDDEN, 1), ("up_proj", INTERMEDIATE, HIDDEN, 1), ("down_proj", HIDDEN, INTERMEDIATE, 1),
    ("lm_head", VOCAB, HIDDEN, 0),
    ("qkv_concat", HIDDEN + 2 * KV, HIDDEN, 0), ("gate_up_concat", 2 * INTERMEDIATE, HIDDEN, 0),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--rows", default="1,10,16")
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gemm_bench.py needs a CUDA GPU")
    device = torch.device("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(device)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    bandwidth = measure_bandwidth(device)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    backends = ["default"]
    if hasattr(torch.backends.cuda, "preferred_blas_library"):
        backends.append("cublaslt")
    initial_backend = torch.backends.cuda.preferred_blas_library() if len(backends) > 1 else None
    rows = []
    try:
        for name, n, k, per_layer in PROJECTIONS:
            weight = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
            floor_us = weight.numel() * weight.element_size() / bandwidth * 1e6
            for m in (int(x) for x in args.rows.split(",")):
                x = torch.randn(1, m, k, device=device, dtype=torch.bfloat16)
                expected = F.linear(x.float(), weight.float())
                for backend in backends:
                    if backend == "cublaslt":
                        torch.backends.cuda.preferred_blas_library("cublaslt")
                    elif initial_backend is not None:
                        torch.backends.cuda.preferred_blas_library(initial_backend)
                    replay, out = graphed(lambda: F.linear(x, weight))
                    replay()
                    err = float((out.float() - expected).norm() / expected.norm())
                    p20, p50, p80 = percentiles(time_cuda(replay, args.reps, 3, flush))
                    rows.append(dict(gpu=gpu, torch=versions()["torch"], date=date, gemm=name, N=n, K=k, M=m,
                                     per_layer=per_layer, backend=backend, p20_us=round(p20, 2),
                                     p50_us=round(p50, 2), p80_us=round(p80, 2), floor_us=round(floor_us, 2),
                                     fraction_of_floor=round(floor_us / p50, 3), rel_err=err))
                    print(f"{name:15s} M={m:2d} {backend:9s} p50 {p50:8.1f} us  floor {floor_us:7.1f} us  "
                          f"({floor_us / p50:.2f})  rel err {err:.1e}", flush=True)
                    del replay, out
            del weight
            torch.cuda.empty_cache()
    finally:
        if initial_backend is not None:
            torch.backends.cuda.preferred_blas_library(initial_backend)
    with open(args.out / "gemm_bench.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    def layer_us(m, backend):
        return sum(r["p50_us"] * r["per_layer"] for r in rows if r["M"] == m and r["backend"] == backend)

    summary = {"gpu": gpu, **versions(), "date": date, "bandwidth_GBps": round(bandwidth / 1e9, 1),
               "layer_gemm_us": {f"M={m},{b}": round(layer_us(m, b), 1) for m in {r["M"] for r in rows}
                                 for b in backends}}
    (args.out / "gemm_bench.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
