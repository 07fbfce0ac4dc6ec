"""Programmatic dependent launch on the decode chain alone: one CUDA graph of the fused target layers' kernels at the
Llama-3.1-8B shape (batch 1, one row), timed with and without PDL and for each place a kernel lets its successor
launch (``$FOLD_HF_PDL_MODE``, :data:`fold_hf.kernels.triton_pdl.MODES`).

Per layer, as ``targets.llama._forward_static_fused`` launches them: residual add + RMSNorm -> q|k|v (skinny GEMM) ->
rope and cache write -> decode attention (split + merge) over ``--context`` cached entries -> o -> add + norm ->
gate|up + SiLU -> down; ``--layers`` layers with their own random bf16 weights (so nothing stays in L2 between
layers), then the final norm. No lm_head, embedding or sampling: this is the chain PDL changes. Also the same chain
launched eagerly (no graph), where each launch's host time shows.

Every variant's output is checked bit for bit against the variant without PDL.

    python benchmarks/pdl_chain_bench.py --out $OUT/chain         (about a minute on an H200)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import log, machine, percentiles  # noqa: E402

VARIANTS = [
    ("no_pdl", {"FOLD_HF_PDL": "0"}),
    ("after_wait", {"FOLD_HF_PDL": "1", "FOLD_HF_PDL_MODE": "after_wait"}),
    ("at_exit", {"FOLD_HF_PDL": "1", "FOLD_HF_PDL_MODE": "at_exit"}),
    ("before_wait", {"FOLD_HF_PDL": "1", "FOLD_HF_PDL_MODE": "before_wait"}),
]
KEYS = ("FOLD_HF_PDL", "FOLD_HF_PDL_MODE")


def build(layers: int, context: int, device: torch.device, shape: dict):
    H, I, Hq, Hkv, D = (shape[k] for k in ("hidden", "intermediate", "q_heads", "kv_heads", "head_dim"))
    g = torch.Generator(device=device).manual_seed(0)

    def rnd(*size, scale=1.0):
        return (torch.randn(*size, generator=g, device=device) * scale).to(torch.bfloat16)

    weights = [(rnd((Hq + 2 * Hkv) * D, H, scale=H**-0.5), rnd(H, Hq * D, scale=H**-0.5),
                rnd(2 * I, H, scale=H**-0.5), rnd(H, I, scale=I**-0.5)) for _ in range(layers)]
    norm = rnd(H, scale=0.1) + 1
    angles = torch.arange(context + 8, device=device, dtype=torch.float32)[:, None] * torch.logspace(
        0, -4, D // 2, device=device)[None, :]
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    caches = [(rnd(1, Hkv, context + 8, D), rnd(1, Hkv, context + 8, D)) for _ in range(layers)]
    return weights, norm, cos, sin, caches


def chain(x, weights, norm, cos, sin, positions, caches, shape):
    from fold_hf.kernels.fold_read.triton import decode_attention_triton
    from fold_hf.kernels.gemm.triton import decode_linear_triton, gate_up_silu_triton
    from fold_hf.kernels.layer.triton import add_rms_norm_triton, rope_write_triton

    Hq, Hkv, D = shape["q_heads"], shape["kv_heads"], shape["head_dim"]
    hidden, delta = x, None
    length = positions[:1].to(torch.int32)
    for (qkv_w, o_w, gu_w, down_w), (key_cache, value_cache) in zip(weights, caches):
        hidden, normed = add_rms_norm_triton(hidden, delta, norm, 1e-5)
        q, k, v = decode_linear_triton(normed, qkv_w).split([Hq * D, Hkv * D, Hkv * D], -1)
        q, k, v = (t.view(1, 1, -1, D) for t in (q, k, v))
        q, k, v = rope_write_triton(q, k, v, cos, sin, positions, key_cache, value_cache)
        out = decode_attention_triton(q, key_cache, value_cache, k, v, length, scaling=D**-0.5,
                                      max_context_length=key_cache.shape[2])
        hidden, normed = add_rms_norm_triton(hidden, decode_linear_triton(out.reshape(1, 1, -1), o_w), norm, 1e-5)
        delta = decode_linear_triton(gate_up_silu_triton(normed, gu_w), down_w)
    return add_rms_norm_triton(hidden, delta, norm, 1e-5)[1]


def time_graph(fn, replays: int) -> list[float]:
    from fold_hf.kernels.common import pdl_scope

    with pdl_scope():  # as the fused target layers' AR step
        return _time_graph(fn, replays)


def _time_graph(fn, replays: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times, out, graph


def time_eager(fn, reps: int) -> list[float]:
    from fold_hf.kernels.common import pdl_scope

    with pdl_scope():
        return _time_eager(fn, reps)


def _time_eager(fn, reps: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--replays", type=int, default=40)
    parser.add_argument("--variants", default="", help="comma-separated names of VARIANTS (default all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("pdl_chain_bench needs a CUDA GPU")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    shape = dict(hidden=4096, intermediate=14336, q_heads=32, kv_heads=8, head_dim=128)
    weights, norm, cos, sin, caches = build(args.layers, args.context, device, shape)
    x = torch.randn(1, 1, shape["hidden"], device=device).to(torch.bfloat16)
    positions = torch.tensor([args.context], device=device)
    weight_bytes = sum(w.numel() * w.element_size() for layer in weights for w in layer)
    kv_bytes = sum(k.numel() * k.element_size() * args.context // k.shape[2] * 2 for k, _ in caches)
    log(json.dumps(machine()))
    wanted = {v for v in args.variants.split(",") if v}
    saved = {k: os.environ.get(k) for k in KEYS}
    rows, reference = [], None

    def fn():
        return chain(x, weights, norm, cos, sin, positions, caches, shape)

    for name, env in VARIANTS:
        if wanted and name not in wanted:
            continue
        for k in KEYS:
            os.environ.pop(k, None)
        os.environ.update(env)
        try:
            graph_s, out, graph = time_graph(fn, args.replays)
            eager_s = time_eager(fn, 10)
        except Exception as exc:  # noqa: BLE001 - a variant that does not compile is a result too
            log(f"{name}: {type(exc).__name__}: {exc}")
            rows.append({"variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        same = None
        if reference is None:
            reference = out.clone()
        else:
            same = bool(torch.equal(out, reference))
        del graph
        row = {"variant": name, **{f"graph_{k}": v for k, v in percentiles(graph_s).items()},
               **{f"eager_{k}": v for k, v in percentiles(eager_s).items()}, "bitwise_equal_to_first": same}
        rows.append(row)
        log(f"{name:>16}: graph p50 {row['graph_p50_ms']:.3f} ms, eager p50 {row['eager_p50_ms']:.3f} ms, "
            f"equal {same}")
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    report = {"machine": machine(), "layers": args.layers, "context": args.context, "weight_bytes": weight_bytes,
              "kv_bytes": kv_bytes, "rows": rows}
    (out_dir / "pdl_chain.json").write_text(json.dumps(report, indent=2))
    fields = sorted({k for r in rows for k in r}, key=lambda k: (k != "variant", k))
    with (out_dir / "pdl_chain.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    log(f"bytes per chain: weights {weight_bytes / 1e9:.2f} GB, KV {kv_bytes / 1e9:.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
