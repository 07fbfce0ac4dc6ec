"""Exact mode (issue 37, ``docs/exact-mode.md``) on one GPU: the cost of one Llama-3.1-8B layer's pieces, default
path against the row-count-invariant kernels, and the bit-identity of each row across row counts.

Shape: hidden 4096, 32 query / 8 KV heads of 128, intermediate 14336, vocab 128256, bf16, context 32K, random
weights. For ``M`` = 1 (an AR step) and ``M`` = k + 1 = 16 (a verify block) it times, per piece:

* default (what the fused static target runs today): ``decode_linear_triton`` for q|k|v, o and down (the one-row
  CUDA-core GEMM, or cuBLAS for a block's q|k|v and down), ``gate_up_silu_triton``, the split decode attention
  ``decode_attention_triton`` (splits sized by the bucket, the block's keys read apart), cuBLAS ``lm_head``;
* exact: ``exact_linear_triton`` / ``exact_gate_up_silu_triton`` (one plan for every row count),
  ``exact_decode_attention_triton`` (splits fixed by key position), ``exact_linear_triton`` for the lm_head;
* the two RMSNorms of a layer (``add_rms_norm_triton``, the same kernel on both paths).

Each timing is a CUDA graph of ``--calls`` launches cycling over distinct weights / KV caches (so no call finds its
operand in L2, as in a step), replayed ``--reps`` times, p50 of 15 measurements. Bit identity: every piece's
output rows for ``M`` = 16 against each row computed alone (``M`` = 1) and within ``M`` = 5 (the attention: the
block at ``T`` against each row as an AR step at ``T + r``); the default path's pieces are checked the same way (the
audit's claim that they are not invariant). The per-layer and per-step ratios summed from the pieces
(``*_pieces``) leave out what the two paths share (embedding, rope, residual adds) and launch gaps: the
end-to-end ``exact_ar_over_default_8b_32k`` / ``exact_sd_round_over_default_8b_32k`` of the issue come from the
wired engine.

Writes ``exact_mode.csv`` (one row per piece, path and ``M``) and ``exact_mode.json`` (summary) under ``--out``.

    python benchmarks/exact_mode_bench.py --out $OUT/exact            (a few minutes on an H200)
    python benchmarks/exact_mode_bench.py --out $OUT/exact --quick    (fewer calls and replays)
    python benchmarks/exact_mode_bench.py --out /tmp/e --tiny         (CPU, Triton interpreter, tiny shapes, fp32)
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
from skinny_gemm_bench import log, pct, time_calls  # noqa: E402

LLAMA_8B = dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336, vocab=128256, context=32768,
                layers=32)
TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, vocab=200, context=100, layers=2)


def time_us(fn, operands: list, calls: int, reps: int, device: torch.device) -> float:
    """p50 microseconds per call of ``fn(operand)``, cycling over ``operands`` (one CUDA graph of ``calls``;
    :func:`skinny_gemm_bench.time_calls`)."""
    return pct(time_calls(lambda _, op: fn(op), operands, None, calls, reps, device), 0.5)


def row_mismatches(fn, x: torch.Tensor, counts=(5, 16)) -> int:
    """Rows of ``fn(x[:M])`` (``M`` in ``counts``) whose bits differ from ``fn(x[r : r + 1])``."""
    alone = [fn(x[r : r + 1])[0] for r in range(max(counts))]
    bad = 0
    for M in counts:
        out = fn(x[:M])
        bad += sum(not torch.equal(out[r], alone[r]) for r in range(M))
    return bad


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def gemm_pieces(shape: dict, device, dtype, copies: int):
    """(name, kind, weights, K, reference fn) for the layer's GEMMs and the lm_head; ``weights``: ``copies``
    random ``[N, K]`` weights made on the device (the 8B lm_head is a GiB each)."""
    from fold_hf.kernels.gemm.naive import gate_up_silu_reference

    H, I, V = shape["hidden"], shape["intermediate"], shape["vocab"]
    qkv = (shape["heads"] + 2 * shape["kv_heads"]) * shape["head_dim"]
    g = torch.Generator(device=device).manual_seed(0)
    specs = [("qkv", qkv, H, "linear"), ("o_proj", H, shape["heads"] * shape["head_dim"], "linear"),
             ("gate_up_silu", 2 * I, H, "gate_up"), ("down", H, I, "linear"), ("lm_head", V, H, "lm_head")]
    for name, n, k, kind in specs:
        weights = [(torch.randn(n, k, generator=g, device=device, dtype=dtype) * k**-0.5) for _ in range(copies)]
        yield name, kind, weights, k, gate_up_silu_reference if kind == "gate_up" else torch.nn.functional.linear


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer calls and replays")
    parser.add_argument("--tiny", action="store_true", help="CPU: Triton interpreter, tiny shapes, fp32")
    parser.add_argument("--rows", default="1,16", help="row counts to time (AR step, verify block)")
    parser.add_argument("--context", type=int, default=None, help="keys before the block (default 32768)")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = dict(TINY if args.tiny or device.type != "cuda" else LLAMA_8B)
    if args.context:
        shape["context"] = args.context
    calls, reps, copies = (2, 1, 2) if args.tiny else ((8, 3, 2) if args.quick else (16, 5, 4))

    from fold_hf.kernels.exact_attention.naive import exact_decode_attention_reference
    from fold_hf.kernels.exact_attention.triton import exact_decode_attention_triton
    from fold_hf.kernels.fold_read.triton import decode_attention_triton
    from fold_hf.kernels.gemm.triton import (
        decode_linear_triton,
        exact_gate_up_silu_triton,
        exact_linear_triton,
        gate_up_silu_triton,
    )
    from fold_hf.kernels.layer.triton import add_rms_norm_triton

    paths = {"default": {"linear": decode_linear_triton, "gate_up": gate_up_silu_triton,
                         "lm_head": torch.nn.functional.linear, "attention": decode_attention_triton},
             "exact": {"linear": exact_linear_triton, "gate_up": exact_gate_up_silu_triton,
                       "lm_head": exact_linear_triton, "attention": exact_decode_attention_triton}}
    machine = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
               "torch": torch.__version__, "triton": __import__("triton").__version__, "dtype": str(dtype),
               "date": time.strftime("%Y-%m-%dT%H:%M:%S"), **shape}
    log("machine", machine)
    row_counts = [int(r) for r in args.rows.split(",")]
    check_counts = (5, 16) if not args.tiny else (2, 4)
    rows_out = []

    def record(piece, path, M, us, rel, mismatches):
        row = {"piece": piece, "path": path, "rows": M, "p50_us": us, "rel_err": rel,
               "row_mismatches": mismatches, "invariant": mismatches == 0, **machine}
        rows_out.append(row)
        log(f"{piece:13s} {path:8s} M={M:2d} p50 {us:9.2f} us  rel_err {rel:.1e}  mismatching rows {mismatches}")

    g = torch.Generator().manual_seed(1)
    max_rows = max(row_counts + list(check_counts))
    for name, kind, weights, K, ref in gemm_pieces(shape, device, dtype, copies):  # the same weights for both paths
        x_all = torch.randn(max_rows, K, generator=g).to(device=device, dtype=dtype)
        w0 = weights[0]
        for path, ops in paths.items():
            fn = ops[kind]
            bad = row_mismatches(lambda rows: fn(rows, w0), x_all, check_counts)
            for M in row_counts:
                x = x_all[:M]
                rel = rel_err(fn(x, w0), ref(x.float(), w0.float()))
                record(name, path, M, time_us(lambda w: fn(x, w), weights, calls, reps, device), rel, bad)
        del weights, w0

    # attention over the context: the block at T = context - M (its keys in the cache), the default kernel's bucket
    # the whole context (as a graph per bucket runs it)
    Hq, Hkv, D, S = shape["heads"], shape["kv_heads"], shape["head_dim"], shape["context"]
    caches = [(torch.randn(1, Hkv, S, D, generator=g).to(device=device, dtype=dtype),
               torch.randn(1, Hkv, S, D, generator=g).to(device=device, dtype=dtype)) for _ in range(copies)]
    q_all = torch.randn(1, Hq, max_rows, D, generator=g).to(device=device, dtype=dtype)
    scaling = D**-0.5
    for path, ops in paths.items():
        attend = ops["attention"]

        def run(q, kv, T):
            kc, vc = kv
            L = q.shape[2]
            return attend(q, kc, vc, kc[:, :, T : T + L], vc[:, :, T : T + L],
                          torch.tensor([T], device=device, dtype=torch.int32), scaling, max_context_length=S)

        T0 = S - max_rows
        alone = [run(q_all[:, :, r : r + 1], caches[0], T0 + r)[0, 0] for r in range(max(check_counts))]
        bad = 0
        for M in check_counts:
            block = run(q_all[:, :, :M], caches[0], T0)
            bad += sum(not torch.equal(block[0, r], alone[r]) for r in range(M))
        for M in row_counts:
            q, T = q_all[:, :, :M].contiguous(), S - M
            want = exact_decode_attention_reference(q.float(), caches[0][0].float(), caches[0][1].float(), None, None,
                                                    T, scaling)
            rel = rel_err(run(q, caches[0], T), want)
            ctx = torch.tensor([T], device=device, dtype=torch.int32)
            us = time_us(lambda kv: attend(q, kv[0], kv[1], kv[0][:, :, T : T + M], kv[1][:, :, T : T + M], ctx,
                                           scaling, max_context_length=S), caches, calls, reps, device)
            record("attention", path, M, us, rel, bad)
    del caches

    # the layer's two RMSNorms: one kernel on both paths (row-wise, configuration fixed by the hidden size)
    H = shape["hidden"]
    nw = torch.randn(H, generator=g).to(device=device, dtype=dtype)
    x_all = torch.randn(max_rows, H, generator=g).to(device=device, dtype=dtype)
    d_all = torch.randn(max_rows, H, generator=g).to(device=device, dtype=dtype)
    bad = row_mismatches(lambda rows: add_rms_norm_triton(rows[:, 0], rows[:, 1], nw, 1e-5)[1],
                         torch.stack([x_all, d_all], 1), check_counts)
    for M in row_counts:
        x, d = x_all[:M], d_all[:M]
        s = (x.float() + d.float()).to(dtype).float()
        want = nw.float() * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5))
        rel = rel_err(add_rms_norm_triton(x, d, nw, 1e-5)[1], want)
        us = time_us(lambda w: add_rms_norm_triton(x, d, w, 1e-5), [nw], calls, reps, device)
        for path in paths:
            record("rms_norm_x2", path, M, 2 * us, rel, bad)

    summary = summarize(rows_out, row_counts, shape)
    with open(out_dir / "exact_mode.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows_out[0]))
        writer.writeheader()
        writer.writerows(rows_out)
    (out_dir / "exact_mode.json").write_text(json.dumps({"machine": machine, "summary": summary}, indent=1))
    for key, value in summary.items():
        log(key, value)
    return summary


LAYER_PIECES = ("qkv", "o_proj", "gate_up_silu", "down", "attention", "rms_norm_x2")


def summarize(rows: list[dict], row_counts: list[int], shape: dict) -> dict:
    """Per row count: one layer's pieces summed per path, the step (layers x layer + lm_head) summed per path, their
    ratios; and whether every exact piece kept its rows' bits across row counts (``exact_invariant``)."""
    p50 = {(r["piece"], r["path"], r["rows"]): r["p50_us"] for r in rows}
    tag = "8b_32k" if shape["hidden"] == LLAMA_8B["hidden"] and shape["context"] == 32768 else "shape"
    out = {"exact_invariant": all(r["invariant"] for r in rows if r["path"] == "exact"),
           "default_pieces_not_invariant": sorted({r["piece"] for r in rows
                                                  if r["path"] == "default" and not r["invariant"]})}
    for M in row_counts:
        layer = {path: sum(p50[(piece, path, M)] for piece in LAYER_PIECES) for path in ("default", "exact")}
        step = {path: shape["layers"] * layer[path] + p50[("lm_head", path, M)] for path in ("default", "exact")}
        kind = "ar" if M == 1 else f"verify{M}"
        out[f"layer_us_default_m{M}"], out[f"layer_us_exact_m{M}"] = layer["default"], layer["exact"]
        out[f"exact_{kind}_layer_over_default_{tag}_pieces"] = layer["exact"] / layer["default"]
        out[f"exact_{kind}_over_default_{tag}_pieces"] = step["exact"] / step["default"]
    return out


if __name__ == "__main__":
    main()
