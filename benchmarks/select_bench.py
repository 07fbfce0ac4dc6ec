"""Greedy selection of a decode step on its own: the target's logits ``[rows, V]`` (bf16, V = 128256 as
Llama-3.1's) to the accepted count and the round's last token, per call inside a CUDA graph of many calls.

Methods (each checked against ``torch`` before it is timed: the same n and last token, the same argmax):

* ``torch_verify``  the path before the Triton kernels: ``logits.float()`` (process()'s copy), ``argmax(-1)``,
  eq / cumprod / sum / minimum (``verify_greedy``) and the gather of ``posterior[n]``;
* ``triton_verify`` :func:`fold_hf.kernels.select.triton.greedy_verify_triton` on the raw logits (two launches);
* ``torch_argmax`` / ``triton_argmax``: the argmax alone (a drafter's greedy picks), ``logits.float().argmax(-1)``
  against :func:`~fold_hf.kernels.select.triton.argmax_rows_triton`.

The proposals match the first half of the rows' argmax (a partial match) and the limit is a device tensor, as in the
graphs engine. A graph holds ``--calls`` calls reading the same logits (they stay in L2, as the lm_head's output
just written does in a step); each of ``--replays`` replays gives one time per call, reported as p20 / p50 / p80.
``--blocks`` / ``--warps`` sweep the Triton stage-1 chunk and warps.

    python benchmarks/select_bench.py --out $OUT/select       (seconds on an H200)

Writes ``select.csv`` (gpu, versions, date, rows, vocab, method, block, warps, p20/p50/p80 us) and ``select.json``.
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


def time_graph(fn, calls: int, replays: int) -> dict:
    """p20 / p50 / p80 microseconds per call of ``fn`` in a CUDA graph of ``calls`` calls, over ``replays``
    replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()  # compile, allocate, warm the caches outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    del graph
    return {k.replace("_ms", "_us"): v * 1e3 for k, v in percentiles(times).items() if k != "n"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rows", default="1,11,16", help="rows of logits (K + 1 of a round with K proposals)")
    parser.add_argument("--blocks", default="2048", help="Triton stage-1 chunks (powers of two)")
    parser.add_argument("--warps", default="4", help="Triton stage-1 warps")
    parser.add_argument("--calls", type=int, default=100, help="calls captured in one graph")
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("select_bench needs a CUDA GPU")
    import triton

    from fold_hf.kernels.select.naive import greedy_verify_torch
    from fold_hf.kernels.select.triton import argmax_rows_triton, greedy_verify_triton

    info = machine()
    info["triton"] = triton.__version__
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for rows in (int(r) for r in args.rows.split(",")):
        k = rows - 1
        logits = (torch.randn(rows, args.vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
        posterior = logits.float().argmax(-1)
        proposals = posterior[:k].clone()
        if k:
            proposals[k // 2] = (proposals[k // 2] + 1) % args.vocab  # a partial match: n = k // 2
        limit = torch.full((1,), k, dtype=torch.long, device="cuda")
        want = [int(t) for t in greedy_verify_torch(logits.float(), proposals, limit)]
        cases = [("torch_verify", None, None, lambda: greedy_verify_torch(logits.float(), proposals, limit)),
                 ("torch_argmax", None, None, lambda: logits.float().argmax(-1))]
        for block in (int(b) for b in args.blocks.split(",")):
            for warps in (int(w) for w in args.warps.split(",")):
                got = [int(t) for t in greedy_verify_triton(logits, proposals, limit, block=block, num_warps=warps)]
                if got != want:
                    raise SystemExit(f"triton_verify rows {rows} block {block} warps {warps}: {got} != {want}")
                if not torch.equal(argmax_rows_triton(logits, block=block, num_warps=warps), posterior):
                    raise SystemExit(f"triton_argmax rows {rows} block {block} warps {warps} differs from torch")
                cases += [
                    ("triton_verify", block, warps,
                     lambda b=block, w=warps: greedy_verify_triton(logits, proposals, limit, block=b, num_warps=w)),
                    ("triton_argmax", block, warps,
                     lambda b=block, w=warps: argmax_rows_triton(logits, block=b, num_warps=w)),
                ]
        for method, block, warps, fn in cases:
            timing = time_graph(fn, args.calls, args.replays)
            row = {**{key: info[key] for key in ("gpu", "torch", "triton", "cuda", "date")}, "rows": rows,
                   "vocab": args.vocab, "method": method, "block": block, "warps": warps, **timing,
                   "replays": args.replays, "calls": args.calls, "equal": True}
            results.append(row)
            setting = f" block {block} warps {warps}" if block else ""
            log(f"rows {rows:>2} {method}{setting}: p50 {timing['p50_us']:.2f} us "
                f"(p20 {timing['p20_us']:.2f}, p80 {timing['p80_us']:.2f})")
    (out_dir / "select.json").write_text(json.dumps({"machine": info, "rows": results}, indent=2))
    with (out_dir / "select.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
