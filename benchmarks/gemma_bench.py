"""Decode cost of a Gemma-4-12B-shape target on the fast loop: our AR step vs the memory floor, SD round vs AR step.

Random bf16 weights made on the GPU (acceptance means nothing, so rounds are timed from a context of T tokens
already in the caches: :func:`fold_hf.generation.fast.time_rounds`, no prefill), the graphs engine and the
library's default verify path. Rows per context (8K / 32K / 128K by default):

* ``our_ar``                  our AR step (block 1), ms
* ``our_sd_dflash`` / ``our_sd_fold``  our speculative round (block 7), drafter in dflash / fold (W, α) mode
* ``floor``                   bytes one AR step must read / copy bandwidth measured in this run: every weight
                              (the tied embedding once, as the lm_head) + keys and values of the global layers at T
                              + the sliding layers' last ``window`` entries (the cache stores values separately even
                              with ``attention_k_eq_v``, so both are counted)

Ratios written to ``gemma.json``: ``ar_over_floor`` and ``sd_fold_over_ar`` per context (issue #16's goals:
AR <= 1.5x the floor, SD round <= 1.3x the AR step at 32K).

The shape: no Gemma-4-12B config is available offline, so the defaults are Gemma-3-12B's dimensions (hidden 3840,
MLP 15360, 48 layers, 16 query / 8 KV heads of 256, window 1024, a global layer every sixth, vocab 262144) with
Gemma-4's global-layer features (head_dim 512, ``attention_k_eq_v`` with 4 global KV heads, proportional rope 0.25
at θ 1e6, final soft-capping 30, no per-layer inputs); every number is a flag. The drafter: a DeepSpec-like 5-layer
z-lab-layout :class:`FoldDrafter` (block 7, hidden 3840, 32/8 heads of 128, partial rope 0.25, 5 taps), i.e.
the shape of the paper's Gemma-4-12B DFlash drafter without its Gemma-4-specific attention (the DeepSpec family
is another branch).

Run on an H200 from the repo root:  python benchmarks/gemma_bench.py --out $OUT       (about 4-6 minutes)
CPU dry run (tiny shapes, static engine, no floor bandwidth):  python benchmarks/gemma_bench.py --dry-run --out /tmp/g
Quick re-measure at 32K with the fused layers, the module path's AR step and a top-kernel table (about a minute):
    python benchmarks/gemma_bench.py --contexts 32768 --rounds 16 --repeats 2 --modules-row --profile --out $OUT/gemma
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig  # noqa: E402
from fold_hf.generation.fast import release_fast_state, time_rounds  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# the pair's shape (flags of main, module docstring) and the dry run's tiny one
SHAPE = dict(layers=48, hidden=3840, mlp=15360, heads=16, kv_heads=8, head_dim=256, global_head_dim=512,
             global_kv_heads=4, window_target=1024, global_every=6, vocab=262144, drafter_heads=32,
             drafter_kv_heads=8, drafter_head_dim=128)
TINY_SHAPE = dict(layers=8, hidden=64, mlp=128, heads=4, kv_heads=2, head_dim=16, global_head_dim=32,
                  global_kv_heads=1, window_target=16, global_every=4, vocab=64, drafter_heads=4, drafter_kv_heads=2,
                  drafter_head_dim=16)


def shape_args(tiny: bool, max_positions: int) -> argparse.Namespace:
    """:func:`build_pair`'s ``args`` at the default shape (``tiny``: the dry run's) for ``max_positions``."""
    return argparse.Namespace(**(TINY_SHAPE if tiny else SHAPE), max_positions=max_positions)


def build_pair(args, device: str, dtype: torch.dtype):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    n = args.layers
    layer_types = ["full_attention" if (i + 1) % args.global_every == 0 else "sliding_attention" for i in range(n)]
    layer_types[-1] = "full_attention"
    cfg = Gemma4TextConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.mlp, num_hidden_layers=n,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        global_head_dim=args.global_head_dim, num_global_key_value_heads=args.global_kv_heads,
        attention_k_eq_v=True, sliding_window=args.window_target, layer_types=layer_types,
        final_logit_softcapping=30.0, hidden_size_per_layer_input=0, max_position_embeddings=args.max_positions,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    taps = [round(1 + i * (n - 4) / 4) for i in range(5)]
    with torch.device(device):
        target = Gemma4ForCausalLM._from_config(cfg, dtype=dtype).eval()
        target.generation_config.eos_token_id = None
        dcfg = FoldDrafterConfig(
            block_size=7, num_target_layers=n, target_layer_ids=taps, mask_token_id=4, vocab_size=args.vocab,
            hidden_size=args.hidden, intermediate_size=args.mlp, num_hidden_layers=5,
            num_attention_heads=args.drafter_heads, num_key_value_heads=args.drafter_kv_heads,
            head_dim=args.drafter_head_dim, max_position_embeddings=args.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25})
        drafter = FoldDrafter(dcfg, FoldConfig(mode="dflash")).to(dtype).eval()
    drafter.bind_target(target)
    return target, drafter


def floor_bytes(target, context: int) -> int:
    """Bytes one AR step reads at best (module docstring)."""
    weights = sum(p.numel() * p.element_size() for p in target.parameters())
    element = next(target.parameters()).element_size()
    cfg = target.config
    kv = 0
    for layer in target.model.layers:
        attn = layer.self_attn
        per_token = 2 * attn.k_proj.out_features * element
        kv += per_token * (context if attn.sliding_window is None else min(context, cfg.sliding_window))
    return weights + kv


def copy_bandwidth(gib: float = 4.0) -> float:
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * n * 2 * 10 / (start.elapsed_time(end) / 1e3)


def rounds_ms(target, drafter, context: int, args, engine: str, fused_layers=None) -> list[float]:
    """Round wall times (ms); [float("nan")] (and the traceback logged) if the rows fail, so that one broken
    configuration does not hide the others' numbers."""
    try:
        return _rounds_ms(target, drafter, context, args, engine, fused_layers)
    except Exception:
        import traceback

        log("FAILED row:\n" + traceback.format_exc())
        release_fast_state(target)
        return [float("nan")]


def _rounds_ms(target, drafter, context: int, args, engine: str, fused_layers=None) -> list[float]:
    time_rounds(target, drafter, context, args.rounds, engine=engine, fused_layers=fused_layers)  # captures
    seconds: list[float] = []
    for _ in range(args.repeats):
        seconds += time_rounds(target, drafter, context, args.rounds, engine=engine,
                               fused_layers=fused_layers).round_seconds[1:]
    return [s * 1e3 for s in seconds]


def attention_times(out: Path, context: int = 32768, repeats: int = 100) -> list[dict]:
    """Device time (CUDA graphs) of the decode kernel at the Gemma-4-like global layer (16 query / 4 KV heads of
    512) and at a drafter-like shape (32 / 8 of 128) for 1 and 7 rows over ``context`` cached keys: whether the
    verify's 7 rows cost the global layers more than the KV read (the SD round's ``_fold_split_kernel`` time)."""
    from fold_hf.kernels.fold_read.triton import decode_attention_triton

    rows = []
    for name, hq, hkv, d in (("global 16/4x512", 16, 4, 512), ("drafter-like 32/8x128", 32, 8, 128)):
        keys = torch.randn(1, hkv, context + 64, d, device="cuda", dtype=torch.bfloat16)
        values = torch.randn_like(keys)
        length = torch.tensor([context], device="cuda", dtype=torch.int32)
        for L in (1, 7):
            q = torch.randn(1, hq, L, d, device="cuda", dtype=torch.bfloat16)
            bk = torch.randn(1, hkv, L, d, device="cuda", dtype=torch.bfloat16)

            def fn():
                decode_attention_triton(q, keys, values, bk, bk, length, scaling=d ** -0.5,
                                        max_context_length=context + 64)

            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(10):
                    fn()
            graph.replay()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats // 10):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1e3 / repeats
            kv_bytes = 2 * keys.numel() * keys.element_size() * context / (context + 64)
            rows.append({"shape": name, "rows": L, "us": us, "kv_read_us_at_4.3TB/s": kv_bytes / 4.3e12 * 1e6})
            log(f"attention {json.dumps(rows[-1])}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "attention_times.json").write_text(json.dumps(rows, indent=2))
    return rows


def median(values: list[float]) -> float:
    return float(torch.tensor(values, dtype=torch.float64).median())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (static engine)")
    parser.add_argument("--contexts", default="8192,32768,131072")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--fold-window", type=int, default=4096, help="FOLD W (the paper's for this pair)")
    parser.add_argument("--alpha", type=float, default=2.0)
    parser.add_argument("--profile", action="store_true",
                        help="also write a torch.profiler top-kernel table of the AR step and the dflash round "
                             "(static engine) per context under OUT/profile/")
    parser.add_argument("--separate-row", action="store_true",
                        help="also the fused AR step with separate cuBLAS projections (our_ar_separate, issue 39)")
    parser.add_argument("--modules-row", action="store_true",
                        help="also time the AR step through the model's modules (fused_layers=False)")
    for name, default in SHAPE.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--attention-times", action="store_true",
                        help="only time the decode kernel at the global-layer and drafter-like shapes (GPU)")
    args = parser.parse_args(argv)
    if args.attention_times:
        attention_times(Path(args.out))
        return 0
    if args.dry_run:
        vars(args).update(TINY_SHAPE)
        args.contexts = "64" if args.contexts == "64" else "64,160"
        args.rounds, args.repeats, args.fold_window = 3, 1, 32
        device, dtype, engine = "cpu", torch.float32, "static"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("gemma_bench needs a CUDA GPU (or --dry-run)")
        device, dtype, engine = "cuda", torch.bfloat16, "graphs"
    contexts = [int(c) for c in args.contexts.split(",")]
    args.max_positions = max(contexts) + 4096
    torch.manual_seed(0)
    target, drafter = build_pair(args, device, dtype)
    log(f"random Gemma-4 target ({args.layers} layers, hidden {args.hidden}) and 5-layer drafter on {device}")
    bandwidth = copy_bandwidth() if device == "cuda" else None
    rows, ratios, profiles = [], {}, []
    modes = {"dflash": FoldConfig(mode="dflash"), "fold": FoldConfig(mode="fold", window=args.fold_window,
                                                                     alpha=args.alpha)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for context in contexts:
            ar = median(rounds_ms(target, None, context, args, engine))
            rows.append({"row": "our_ar", "context": context, "p50_ms": ar})
            log(f"our_ar @ {context}: {ar:.2f} ms")
            for mode, cfg in modes.items():
                drafter.set_fold_config(cfg)
                sd = median(rounds_ms(target, drafter, context, args, engine))
                rows.append({"row": f"our_sd_{mode}", "context": context, "p50_ms": sd})
                ratios[f"sd_{mode}_over_ar_{context}"] = sd / ar
                log(f"our_sd_{mode} @ {context}: {sd:.2f} ms ({sd / ar:.2f}x AR)")
            if bandwidth is not None:
                floor = floor_bytes(target, context) / bandwidth * 1e3
                rows.append({"row": "floor", "context": context, "p50_ms": floor})
                ratios[f"ar_over_floor_{context}"] = ar / floor
                log(f"floor @ {context}: {floor:.2f} ms (AR {ar / floor:.2f}x)")
            if args.modules_row:  # the same AR step through the model's modules
                release_fast_state(target)
                modules = median(rounds_ms(target, None, context, args, engine, fused_layers=False))
                rows.append({"row": "our_ar_modules", "context": context, "p50_ms": modules})
                if bandwidth is not None:
                    ratios[f"ar_modules_over_floor_{context}"] = modules / floor
                log(f"our_ar_modules @ {context}: {modules:.2f} ms")
            if args.separate_row:  # the fused AR step with each projection its own cuBLAS GEMM (issue 39's A/B)
                from e2e_bench import path_environment

                release_fast_state(target)
                with path_environment("separate"):
                    separate = median(rounds_ms(target, None, context, args, engine))
                release_fast_state(target)
                rows.append({"row": "our_ar_separate", "context": context, "p50_ms": separate})
                if bandwidth is not None:
                    ratios[f"ar_separate_over_floor_{context}"] = separate / floor
                log(f"our_ar_separate @ {context}: {separate:.2f} ms")
            if args.profile:
                from step_profile import profile_rounds

                release_fast_state(target)
                drafter.set_fold_config(modes["dflash"])
                for label, d in (("gemma4_ar", None), ("gemma4_sd_dflash", drafter)):
                    try:
                        summary = profile_rounds(target, d, context, Path(args.out) / "profile", label)
                    except Exception:
                        import traceback

                        log(f"FAILED profile {label}:\n" + traceback.format_exc())
                        continue
                    profiles.append({k: v for k, v in summary.items() if k != "top"})
            release_fast_state(target)
            if device == "cuda":
                torch.cuda.empty_cache()
    notes = sorted({str(w.message) for w in caught if "fold_hf" in str(w.message)})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers

    info = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
            "transformers": transformers.__version__, "engine": engine, "dry_run": args.dry_run,
            "bandwidth_tb_s": bandwidth / 1e12 if bandwidth else None}
    (out / "gemma.json").write_text(json.dumps({"machine": info, "args": vars(args), "ratios": ratios,
                                                "rows": rows, "profiles": profiles, "fold_hf_warnings": notes},
                                               indent=2))
    log("ratios: " + json.dumps(ratios, indent=2))
    for note in notes:
        log(f"warning seen: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
