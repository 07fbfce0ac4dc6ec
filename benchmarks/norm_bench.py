"""The residual add + RMSNorm kernel of a decode step alone (one row of 4096, bf16, as between the Llama-3.1-8B
projections), per launch inside a CUDA graph of many launches, for each ``num_warps``: the kernel is latency-bound
(8 KB in, 16 KB out), so its cost is its launch, its dependent loads and its cross-warp reduction.

    python benchmarks/norm_bench.py --out $OUT/norm       (seconds on an H200)
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import log, machine, percentiles  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--warps", default="1,2,4,8,16")
    parser.add_argument("--launches", type=int, default=200)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("norm_bench needs a CUDA GPU")
    from fold_hf.kernels.layer.naive import add_rms_norm_reference
    from fold_hf.kernels.layer.triton import add_rms_norm_triton

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows_out = []
    for rows in (int(r) for r in args.rows.split(",")):
        hidden = torch.randn(1, rows, args.hidden, device="cuda").to(torch.bfloat16)
        delta = torch.randn_like(hidden)
        weight = (torch.randn(args.hidden, device="cuda") * 0.1 + 1).to(torch.bfloat16)
        want = add_rms_norm_reference(hidden, delta, weight, 1e-5)
        for warps in (int(w) for w in args.warps.split(",")):
            got = add_rms_norm_triton(hidden, delta, weight, 1e-5, num_warps=warps)
            err = max((g.float() - w.float()).abs().max().item() for g, w in zip(got, want))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                h = hidden
                for _ in range(args.launches):  # each launch reads the one before's sum
                    h, _ = add_rms_norm_triton(h, delta, weight, 1e-5, num_warps=warps)
            graph.replay()
            times = []
            for _ in range(20):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3 / args.launches)
            row = {"rows": rows, "warps": warps, **{k.replace("_ms", "_us"): v * 1e3 if v else v
                                                   for k, v in percentiles(times).items() if k != "n"},
                   "max_abs_err_vs_twin": err}
            rows_out.append(row)
            log(f"rows {rows:>2} warps {warps:>2}: {row['p50_us']:.2f} us a launch (err {err:.3g})")
            del graph
    (out_dir / "norm.json").write_text(json.dumps({"machine": machine(), "rows": rows_out}, indent=2))
    with (out_dir / "norm.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows_out[0]))
        writer.writeheader()
        writer.writerows(rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
