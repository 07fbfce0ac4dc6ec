"""The sliding layers' ring attention (split + merge, :mod:`fold_hf.kernels.gemma.triton`) alone, at the shapes the
Gemma targets run it, for several split-program counts (``$FOLD_HF_RING_PROGRAMS``) in one process.

Shapes (``--shapes``, default all):

* ``gemma4_ar``: the Gemma-4-12B-like AR step, 16 query / 8 KV heads of 256 over a ring of 1,024 slots, 1 token;
* ``gemma4_verify``: the same, a 7-token verify block;
* ``gemma3_rows_ar`` / ``gemma3_rows_verify``: the Gemma-3-270M pair batched, 8 rows of 4 query / 1 KV head of 256
  over rings of 512 slots, 1 / 8 tokens a row (``ring_attention_rows_triton``).

Each (shape, programs) is captured in a CUDA graph of ``--calls`` launch pairs and replayed; the time of one call
(split + merge) is the replay's over ``--calls``, median of ``--repeats`` (``select_bench.time_graph``). Call ``i``
of the graph reads copy ``i`` of the rings (``--calls`` copies, over 300 MB at the Gemma-4 shape), so, as in a decode
step, where each layer reads its own ring once, the keys come from memory, not from the L2 cache a repeated read of
one 8.4 MB ring would hit. Beside it the bytes a call must read (the rings' keys and values) over that time. Every
setting's output is checked against the default's (the split only moves the merge's boundaries: fp32-rounding-close,
not bitwise). Writes ``ring.csv`` and ``ring.json`` under ``--out``.

    python benchmarks/ring_bench.py --out $OUT/ring                       (CUDA, about 20 s)
    python benchmarks/ring_bench.py --out /tmp/ring --dry-run             (tiny shapes, Triton's interpreter, no timing)
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from last_mile_bench import env_var  # noqa: E402
from select_bench import time_graph  # noqa: E402

SHAPES = {  # rows A, query heads, KV heads, ring slots R, head dim, tokens L
    "gemma4_ar": (1, 16, 8, 1024, 256, 1),
    "gemma4_verify": (1, 16, 8, 1024, 256, 7),
    "gemma3_rows_ar": (8, 4, 1, 512, 256, 1),
    "gemma3_rows_verify": (8, 4, 1, 512, 256, 8),
}
DRY_SHAPES = {"tiny_ar": (1, 4, 2, 200, 32, 1), "tiny_rows": (3, 4, 2, 170, 32, 3)}  # 4 / 3 key chunks


def inputs(shape, device, dtype, seed=0):
    """Query ``[A, Hq, L, D]``, rings ``[A, Hkv, R, D]`` filled, positions past a wrapped ring, the cache rows."""
    A, Hq, Hkv, R, D, L = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(A, Hq, L, D, generator=g).to(device, dtype)
    k = torch.randn(A, Hkv, R, D, generator=g).to(device, dtype)
    v = torch.randn(A, Hkv, R, D, generator=g).to(device, dtype)
    top = 3 * R + 5  # every slot written, the ring wrapped
    positions = (top - L + 1 + torch.arange(L)).repeat(A, 1).to(device)
    rows = torch.arange(A, device=device)
    return q, k, v, positions, rows


def call(q, k, v, positions, rows, window):
    from fold_hf.kernels.gemma.triton import ring_attention_rows_triton, ring_attention_triton

    scaling = q.shape[-1] ** -0.5
    if q.shape[0] == 1:
        return ring_attention_triton(q, k, v, positions[0], window, scaling)
    return ring_attention_rows_triton(q, k, v, positions, rows, window, scaling)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=None, help="comma list of " + ", ".join(SHAPES))
    parser.add_argument("--programs", default="64,128,256,512,1024", help="values of $FOLD_HF_RING_PROGRAMS")
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes in Triton's interpreter, no timing")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    from fold_hf.kernels.gemma.triton import DEFAULT_RING_PROGRAMS, RING_PROGRAMS_ENV

    table = DRY_SHAPES if args.dry_run else SHAPES
    names = args.shapes.split(",") if args.shapes else list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; known: {sorted(table)}")
    programs = [int(p) for p in args.programs.split(",")]
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("ring_bench times CUDA graphs: run it on a GPU, or --dry-run here")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    rows = []
    for name in names:
        shape = table[name]
        A, Hq, Hkv, R, D, L = shape
        args_ = (*inputs(shape, device, dtype), R)
        ring_bytes = 2 * A * Hkv * R * D * torch.finfo(dtype).bits // 8
        copies = [] if args.dry_run else [(args_[1].clone(), args_[2].clone()) for _ in range(args.calls)]
        reference = None
        for p in [DEFAULT_RING_PROGRAMS] + [p for p in programs if p != DEFAULT_RING_PROGRAMS]:
            with env_var(RING_PROGRAMS_ENV, str(p)):
                out, ms = call(*args_), None
                if not args.dry_run:  # call i of the graph reads copy i of the rings
                    q, _, _, positions, rows_, window = args_
                    cycle = itertools.cycle(copies)
                    ms = time_graph(lambda: call(q, *next(cycle), positions, rows_, window), args.calls,
                                    args.repeats)["p50_us"] / 1e3
            if reference is None:
                reference = out.float()
            diff = (out.float() - reference).abs().max().item()
            if diff > (1e-4 if dtype == torch.float32 else 2e-2):
                raise SystemExit(f"{name} with {p} programs differs from the default by {diff}")
            row = {"shape": name, "programs": p, "default": p == DEFAULT_RING_PROGRAMS, "rows": A, "q_heads": Hq,
                   "kv_heads": Hkv, "slots": R, "head_dim": D, "tokens": L, "ms": ms,
                   "gb_s": None if ms is None else ring_bytes / ms / 1e6, "max_diff_vs_default": diff}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)",
            "torch": torch.__version__, "dtype": str(dtype)}
    (out_dir / "ring.json").write_text(json.dumps({"machine": meta, "rows": rows}, indent=1))
    with open(out_dir / "ring.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return rows


if __name__ == "__main__":
    main()
