"""How a read with few KV heads should be split: the FOLD read and the target's verify attention at a small pair's
shape, per launch configuration, in CUDA graphs (issue 38: the Gemma-3-270M pair's round at 32K).

At few KV heads (Gemma-3-270M: 4 query heads, 1 KV head of 256) the default split (about two programs per SM for
each KV head) cuts 32K entries into ~264 chunks of ~128 entries, and every chunk writes fp32 partials of each of its
``G * Lq`` rows (both branches for FOLD) that the merge reads back: as many bytes as the keys and values themselves.
This bench times, per read kind and ``--splits`` value (``default`` = the library's plan), ``--layers`` reads over
distinct caches captured in one CUDA graph (so the caches do not sit in L2: 4 x 33.5 MB at the default shape), and
reports per read: ``us`` (p50 over ``--reps`` replays / layers), ``floor_us`` (the keys and values it must read /
the copy bandwidth measured here), ``programs`` and ``waves`` (the split launch's programs as the library plans them,
and over the SM count: :func:`launch_programs`), and ``rel_err`` against the float64 statement of the read
(:func:`~fold_hf.kernels.fold_read.naive.fold_read_geometry_reference` /
:func:`~fold_hf.kernels.fold_read.naive.decode_attention_reference`).

Kinds: ``fold`` (W, α = 2), ``window`` (W, no far memory), ``dflash`` (every entry rotated at its position),
``verify`` (the target's block of ``Lq`` rows over rotated keys), ``ar`` (the same, one row).

    python benchmarks/read_splits_bench.py --out $OUT/splits              (about a minute, one GPU)
    python benchmarks/read_splits_bench.py --out /tmp/s --dry-run         (CPU, TRITON_INTERPRET=1, tiny shapes)

``--rows A`` times the batched reads instead (``fold_read_rows_triton`` / ``decode_attention_rows_triton``: ``A``
rows of a batch at the same length in one launch, as a batched round drafts and verifies), ``--block-m`` sweeps the
packed rows per program. The Qwen3.5-9B drafter's read (16 query / 4 KV heads of 256, a 16-row block, W 4096):
``--hq 16 --hkv 4 --lq 16 --window 4096``; the Gemma-3-270M pair's batched draft: ``--rows 8``.

Writes ``read_splits.csv`` and ``read_splits.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# launch plans in plain Python (no Triton): the setting it reads at every plan, which --split-kv-ratio sets
from fold_hf.kernels.fold_read.launch import SPLIT_KV_RATIO_ENV  # noqa: E402

KINDS = ("fold", "window", "dflash", "verify", "ar")


def options(text: str) -> list:
    """A comma list of ints, ``default`` standing for None (the library's plan)."""
    return [None if s == "default" else int(s) for s in text.split(",")]


def ratios(text: str) -> list:
    """A comma list of ``$FOLD_HF_SPLIT_KV_RATIO`` values as strings, ``default`` standing for None (unset)."""
    return [None if s == "default" else str(float(s)) for s in text.split(",")]


def tables(positions: int, rotary: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary, 2, dtype=torch.float64, device=device) / rotary))
    angles = torch.arange(positions, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def make_inputs(kind: str, args, device, dtype, seed: int) -> dict:
    """One layer's inputs: ``A = max(args.rows, 1)`` reads (batch rows) of ``args.lq`` rows (1 for ``ar``)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = 1 if kind == "ar" else args.lq
    capacity = args.context + args.slack
    A = max(args.rows, 1)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    scale = args.head_dim ** -0.5
    inputs = {"q": rnd(A, args.hq, rows, args.head_dim, scale=scale),
              "k": rnd(A, args.hkv, capacity, args.head_dim), "v": rnd(A, args.hkv, capacity, args.head_dim),
              "bk": rnd(A, args.hkv, rows, args.head_dim), "bv": rnd(A, args.hkv, rows, args.head_dim),
              "length": torch.tensor([args.context] * A, dtype=torch.int32, device=device),
              "rows": torch.arange(A, dtype=torch.int32, device=device)}
    if kind == "fold":
        inputs["qf"] = rnd(A, args.hq, rows, args.head_dim, scale=scale)
    return inputs


def call(kind: str, x: dict, args, cos, sin, splits, tuning: dict):
    from fold_hf.kernels.fold_read.triton import (decode_attention_rows_triton, decode_attention_triton,
                                                  fold_read_rows_triton, fold_read_triton)

    if args.rows:
        if kind in ("verify", "ar"):
            return decode_attention_rows_triton(x["q"], x["k"], x["v"], x["bk"], x["bv"], x["length"], x["rows"],
                                                num_splits=splits, **tuning)
        window = None if kind == "dflash" else args.window
        return fold_read_rows_triton(x["q"], x.get("qf"), x["k"], x["v"], x["bk"], x["bv"], cos, sin, x["length"],
                                     x["length"], x["rows"], window, 2.0, num_splits=splits, **tuning)
    if kind in ("verify", "ar"):
        return decode_attention_triton(x["q"], x["k"], x["v"], x["bk"], x["bv"], x["length"], num_splits=splits,
                                       **tuning)
    window = None if kind == "dflash" else args.window
    return fold_read_triton(x["q"], x.get("qf"), x["k"], x["v"], x["bk"], x["bv"], cos, sin, x["length"],
                            x["length"], window, 2.0, num_splits=splits, **tuning)


def reference(kind: str, x: dict, args, cos, sin) -> torch.Tensor:
    """The float64 statement of the read, one batch row at a time (``[A, Lq, Hq, Dv]``)."""
    from fold_hf.kernels.fold_read.naive import decode_attention_reference, fold_read_geometry_reference

    d = {k: (v.double() if v.is_floating_point() else v) for k, v in x.items()}
    T = args.context
    window = None if kind == "dflash" else args.window
    outs = []
    for a in range(d["q"].shape[0]):
        one = {k: v[a:a + 1] for k, v in d.items() if k not in ("length", "rows")}
        if kind in ("verify", "ar"):
            outs.append(decode_attention_reference(one["q"], one["k"], one["v"], one["bk"], one["bv"], T))
        else:
            outs.append(fold_read_geometry_reference(one["q"], one.get("qf"), one["k"], one["v"], one["bk"],
                                                     one["bv"], cos.double(), sin.double(), T, T, window, 2.0))
    return torch.cat(outs)


def kv_bytes(kind: str, args, elem: int) -> int:
    entries = min(args.context, args.window + args.lq) if kind == "window" else args.context
    return max(args.rows, 1) * entries * args.hkv * 2 * args.head_dim * elem


def launch_programs(kind: str, args, splits, tuning: dict, device, dtype) -> dict:
    """The split launch's programs as the library plans them (``launch_plan`` and the window's programs, the same
    arguments ``_fold_read`` / ``_decode_attention`` pass) and the device's SM count: ``programs`` (row blocks x
    heads x splits) and ``waves`` (programs over SMs) — whether a read fills whole waves of the GPU."""
    from fold_hf.kernels.fold_read import launch

    rows = 1 if kind == "ar" else args.lq
    heads = max(args.rows, 1) * args.hkv
    G = args.hq // args.hkv
    span = args.context + args.slack  # the lengths are device tensors here: the splits cover the capacity
    decode = kind in ("verify", "ar")
    window = None if kind in ("dflash", "verify", "ar") else args.window
    plan = launch.launch_plan(G * rows, args.head_dim, args.head_dim, heads, span, dtype, device, splits,
                              tuning.get("block_m"), tuning.get("block_n"), tuning.get("num_warps"),
                              tuning.get("num_stages"), decode=decode, branches=2 if kind == "fold" else 1,
                              pipelined=window is not None or decode)
    _, per_head = launch.read_splits(plan.num_splits, window, kind == "fold", tuning.get("window_splits"))
    programs = plan.row_blocks * heads * per_head
    sms = launch.multiprocessor_count(device)
    return {"programs": programs, "waves": round(programs / sms, 2)}


def sweep(args, rows: list, device, dtype, cos, sin, bandwidth: float, cuda: bool) -> None:
    """Every kind and configuration of ``args``, timed and checked, appended to ``rows`` (printed as it goes)."""
    for kind in args.kinds.split(","):
        layers = [make_inputs(kind, args, device, dtype, seed) for seed in range(args.layers)]
        want = reference(kind, layers[0], args, cos, sin).float()
        configs = [(s, m, n, w, st, ws, kr) for s in options(args.splits) for m in options(args.block_m)
                   for n in options(args.block_n) for w in options(args.warps) for st in options(args.stages)
                   for ws in (options(args.window_splits) if kind in ("fold", "window") else [None])
                   for kr in ratios(args.split_kv_ratio)]
        for splits, block_m, block_n, warps, stages, wsplits, ratio in configs:
            tuning = {k: v for k, v in (("block_m", block_m), ("block_n", block_n), ("num_warps", warps),
                                        ("num_stages", stages), ("window_splits", wsplits)) if v is not None}
            row = {"kind": kind, "splits": splits or "default", **{k: v for k, v in tuning.items()}}
            if ratio is None:
                os.environ.pop(SPLIT_KV_RATIO_ENV, None)
            else:
                os.environ[SPLIT_KV_RATIO_ENV] = ratio
                row["split_kv_ratio"] = float(ratio)
            try:
                row.update(launch_programs(kind, args, splits, tuning, device, dtype))
                got = call(kind, layers[0], args, cos, sin, splits, tuning).float()
                row["rel_err"] = float((got - want).norm() / want.norm())
                if cuda:
                    for x in layers:  # compile outside the capture
                        call(kind, x, args, cos, sin, splits, tuning)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        for x in layers:
                            call(kind, x, args, cos, sin, splits, tuning)
                    times = []
                    for _ in range(args.reps):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        graph.replay()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end) * 1e3 / args.layers)
                    times.sort()
                    row["us"] = round(times[len(times) // 2], 2)
                    row["floor_us"] = round(1e6 * kv_bytes(kind, args, 2) / bandwidth, 2)
                    row["over_floor"] = round(row["us"] / row["floor_us"], 2)
            except Exception as exc:  # a configuration that does not launch says why; the others still run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--context", type=int, default=32704)
    parser.add_argument("--slack", type=int, default=200, help="cache entries beyond the context (capacity)")
    parser.add_argument("--hq", type=int, default=4)
    parser.add_argument("--hkv", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--lq", type=int, default=8, help="block rows (the drafter's block, the verify's)")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--splits", default="default,264,132,66,33,16")
    parser.add_argument("--block-m", default="default", help="comma list: packed rows per program (default: the plan's)")
    parser.add_argument("--block-n", default="default", help="comma list: key tile sizes (default: the plan's)")
    parser.add_argument("--warps", default="default")
    parser.add_argument("--stages", default="default")
    parser.add_argument("--window-splits", default="default", help="FOLD/window reads: programs for the window")
    parser.add_argument("--split-kv-ratio", default="default",
                        help="comma list of $FOLD_HF_SPLIT_KV_RATIO values for the default split (fewest bytes a "
                             "split reads over the partials it writes; default 8, 0 = no bound)")
    parser.add_argument("--rows", type=int, default=0, help="A > 0: the batched reads of A rows in one launch")
    parser.add_argument("--layers", type=int, default=4, help="reads over distinct caches per graph")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--dry-run", action="store_true")
    return parser


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.context, args.slack, args.window, args.layers, args.reps = 200, 24, 48, 1, 1
        args.splits = "default,4"
    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    cos, sin = tables(args.context + args.slack + args.lq, args.head_dim, device)
    bandwidth = float("nan")
    if cuda:
        from kernel_bench import measure_bandwidth

        bandwidth = measure_bandwidth(device)
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    saved_ratio = os.environ.get(SPLIT_KV_RATIO_ENV)  # --split-kv-ratio sets it per config; restored after
    try:
        sweep(args, rows, device, dtype, cos, sin, bandwidth, cuda)
    finally:
        if saved_ratio is None:
            os.environ.pop(SPLIT_KV_RATIO_ENV, None)
        else:
            os.environ[SPLIT_KV_RATIO_ENV] = saved_ratio
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with (out / "read_splits.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    meta = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "copy_bandwidth_gbs": None if math.isnan(bandwidth) else round(bandwidth / 1e9, 1),
            "args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rows": rows}
    (out / "read_splits.json").write_text(json.dumps(meta, indent=1))
    return rows


if __name__ == "__main__":
    main()
