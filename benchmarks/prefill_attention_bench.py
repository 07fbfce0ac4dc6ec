"""Prefill attention variants (issue 36) on one GPU: correctness against the fp32 reference and time per layer.

Variants (:mod:`fold_hf.kernels.prefill_attention`): ``sdpa`` (SDPA with a lower-right causal bias: the path before
this issue), ``cudnn`` / ``flash`` (prefix + causal diagonal block as two flash calls merged by log-sum-exp in one
Triton launch; the ``[expand]`` rows repeat the key heads first instead of passing GQA to the kernel, the
``[torch_merge]`` rows merge with torch's elementwise kernels), ``triton[BMxBNxWxS]`` (our
kernel at a tile config), and ``whole_causal``: one ``SDPA(is_causal=True)`` over the whole prompt, what
transformers' prefill runs (no chunks), as the yardstick.

* correctness: max |variant - reference| / max |reference| at odd lengths, chunk boundaries, GQA, windows, dtypes;
* timing: attention of one layer over a whole P-token prompt in chunks of C (the sum over the chunks, CUDA events,
  best of ``--repeats``), as TFLOP/s of causal attention (2 · 2 · Hq · D · P (P + 1) / 2 [· window bound]).

Writes ``prefill_attention.json`` under ``--out``.

    python benchmarks/prefill_attention_bench.py --out $OUT/attn
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fold_hf.kernels.prefill_attention import prefill_attention_naive, prefill_attention_sdpa  # noqa: E402
from fold_hf.kernels.prefill_attention.split import prefill_attention_split  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def variants(triton_configs, window: int | None):
    from fold_hf.kernels.prefill_attention.triton import prefill_attention_triton

    out = {"sdpa": lambda q, k, v, s, sc: prefill_attention_sdpa(q, k, v, s, sc, window)}
    if window is None:
        for backend in ("cudnn", "flash"):
            out[backend] = lambda q, k, v, s, sc, b=backend: prefill_attention_split(q, k, v, s, sc, backend=b)
            out[f"{backend}[expand]"] = lambda q, k, v, s, sc, b=backend: prefill_attention_split(
                q, k, v, s, sc, backend=b, gqa_native=False)
            out[f"{backend}[torch_merge]"] = lambda q, k, v, s, sc, b=backend: prefill_attention_split(
                q, k, v, s, sc, backend=b, merge="torch")
    out["triton"] = lambda q, k, v, s, sc: prefill_attention_triton(q, k, v, s, sc, window)
    for cfg in triton_configs:
        name = "triton[" + "x".join(map(str, cfg)) + "]"
        out[name] = lambda q, k, v, s, sc, c=cfg: prefill_attention_triton(q, k, v, s, sc, window, config=c)
    return out


def check(report, triton_configs) -> None:
    cases = []
    for Hq, Hkv, D in ((32, 8, 128), (16, 4, 256), (8, 8, 64), (12, 4, 128)):
        for start, L in ((0, 1000), (777, 333), (8192, 4097), (4096, 8192), (129, 64 + 1)):
            for window in (None, 1000):
                for dtype in (torch.bfloat16, torch.float16, torch.float32):
                    if dtype == torch.float32 and (start, L) not in ((777, 333), (129, 65)):
                        continue
                    if dtype == torch.float16 and (Hq, Hkv, D) != (32, 8, 128):
                        continue
                    cases.append((Hq, Hkv, D, start, L, window, dtype))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for Hq, Hkv, D, start, L, window, dtype in cases:
        S = start + L
        cap = S + 37  # keys as a view of a longer cache
        q = torch.randn(1, L, Hq, D, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
        kc = torch.randn(1, Hkv, cap, D, device="cuda", dtype=dtype, generator=gen)
        vc = torch.randn(1, Hkv, cap, D, device="cuda", dtype=dtype, generator=gen)
        k, v = kc[:, :, :S], vc[:, :, :S]
        scale = D ** -0.5
        ref = prefill_attention_naive(q.float(), k.float(), v.float(), start, scale, window)
        denom = ref.abs().max().item()
        for name, fn in variants([], window).items():
            row = dict(Hq=Hq, Hkv=Hkv, D=D, start=start, L=L, window=window, dtype=str(dtype).split(".")[-1],
                       variant=name)
            try:
                out = fn(q, k, v, start, scale)
                torch.cuda.synchronize()
                row["rel_err"] = (out.float() - ref).abs().max().item() / denom
                row["finite"] = bool(torch.isfinite(out).all())
            except Exception as err:  # noqa: BLE001 - recorded: which variant cannot run which case
                row["error"] = f"{type(err).__name__}: {str(err)[:160]}"
            report["check"].append(row)
        del ref
    bad = [r for r in report["check"] if "rel_err" in r and not r["variant"].startswith("sdpa")
           and r["rel_err"] > (2e-2 if r["dtype"] != "float32" else 1e-4)]
    log(f"check: {len(report['check'])} rows, {len(bad)} over tolerance, "
        f"{sum('error' in r for r in report['check'])} errors")
    for r in bad[:20]:
        log(f"  over tolerance: {r}")
    for r in [r for r in report["check"] if "error" in r][:12]:
        log(f"  error: {r}")


def time_layer(fn, Hq, Hkv, D, P, chunk, window, repeats, dtype=torch.bfloat16) -> float:
    """Seconds of one layer's attention over a P-token prompt in chunks (best of ``repeats``)."""
    kc = torch.randn(1, Hkv, P, D, device="cuda", dtype=dtype)
    vc = torch.randn(1, Hkv, P, D, device="cuda", dtype=dtype)
    q = torch.randn(1, min(chunk, P), Hq, D, device="cuda", dtype=dtype).transpose(1, 2)
    scale = D ** -0.5
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for start in range(0, P, chunk):
            L = min(chunk, P - start)
            fn(q[:, :, :L], kc[:, :, : start + L], vc[:, :, : start + L], start, scale)
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    return best


def attention_flops(Hq, D, P, window) -> float:
    pairs = P * (P + 1) / 2 if window is None else sum(min(p + 1, window) for p in range(0, P, 64)) * 64
    return 4 * Hq * D * pairs


def timings(report, shapes, contexts, chunks, triton_configs, repeats) -> None:
    for shape_name, (Hq, Hkv, D, window) in shapes.items():
        for P in contexts:
            flops = attention_flops(Hq, D, P, window)
            whole = lambda q, k, v, s, sc: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                q, k, v, is_causal=True, scale=sc, enable_gqa=True)
            if window is None:
                try:
                    sec = time_layer(whole, Hq, Hkv, D, P, P, None, repeats)
                    report["timing"].append(dict(shape=shape_name, P=P, chunk=P, variant="whole_causal", s=sec,
                                                 tflop_s=flops / sec / 1e12))
                    log(f"{shape_name} P={P} whole_causal: {sec * 1e3:.2f} ms ({flops / sec / 1e12:.0f} TFLOP/s)")
                except Exception as err:  # noqa: BLE001
                    log(f"{shape_name} P={P} whole_causal: {type(err).__name__}: {str(err)[:120]}")
            for chunk in chunks:
                if chunk > P:
                    continue
                for name, fn in variants(triton_configs, window).items():
                    if name.endswith("[expand]") and P > 32768:
                        continue
                    row = dict(shape=shape_name, P=P, chunk=chunk, variant=name)
                    try:
                        fn(torch.randn(1, Hq, 256, D, device="cuda", dtype=torch.bfloat16),
                           torch.randn(1, Hkv, 512, D, device="cuda", dtype=torch.bfloat16),
                           torch.randn(1, Hkv, 512, D, device="cuda", dtype=torch.bfloat16), 256, D ** -0.5)
                        sec = time_layer(fn, Hq, Hkv, D, P, chunk, window, repeats)
                        row.update(s=sec, tflop_s=flops / sec / 1e12)
                        log(f"{shape_name} P={P} chunk={chunk} {name}: {sec * 1e3:.2f} ms "
                            f"({flops / sec / 1e12:.0f} TFLOP/s)")
                    except Exception as err:  # noqa: BLE001
                        row["error"] = f"{type(err).__name__}: {str(err)[:160]}"
                        log(f"{shape_name} P={P} chunk={chunk} {name}: {row['error']}")
                    report["timing"].append(row)
                    torch.cuda.empty_cache()


SHAPES = {  # name -> (Hq, Hkv, D, window) of the attention layers the prefill runs
    "llama3_8b": (32, 8, 128, None),
    "qwen35_9b_full": (16, 4, 256, None),
    "gemma_global_d256": (16, 8, 256, None),
    "gemma_sliding_1024": (16, 8, 256, 1024),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--contexts", default="32768,131072")
    parser.add_argument("--chunks", default="8192,16384")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--other-contexts", default="32768", help="contexts of the shapes other than llama3_8b")
    parser.add_argument("--other-chunks", default="8192", help="chunk sizes of the shapes other than llama3_8b")
    parser.add_argument("--triton-configs", default="128x64x8x3,128x128x8x3,128x64x4x3,64x64x4x3,128x32x4x4",
                        help="tile configs timed beside the default ('' for none)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-check", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers
    import triton

    report = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                          "transformers": transformers.__version__, "cuda": torch.version.cuda,
                          "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%dT%H:%M:%S")},
              "check": [], "timing": []}
    log(json.dumps(report["machine"]))
    configs = [tuple(int(x) for x in c.split("x")) for c in args.triton_configs.split(",") if c]

    def save():
        (out / "prefill_attention.json").write_text(json.dumps(report, indent=1))

    if not args.skip_check:
        check(report, configs)
        save()
    contexts = [int(c) for c in args.contexts.split(",") if c]
    chunks = [int(c) for c in args.chunks.split(",") if c]
    for name in args.shapes.split(","):
        ctx = contexts if name == "llama3_8b" else [int(c) for c in args.other_contexts.split(",") if c]
        chk = chunks if name == "llama3_8b" else [int(c) for c in args.other_chunks.split(",") if c]
        timings(report, {name: SHAPES[name]}, ctx, chk, configs if name == "llama3_8b" else configs[:2],
                args.repeats)
        save()
    log("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
