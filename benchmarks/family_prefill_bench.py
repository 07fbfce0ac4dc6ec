"""Time to first token on long prompts for the Qwen3.5-9B, Gemma-4-12B and Gemma-3-270M shapes (issue 36): our
fast loop vs transformers' ``generate``, against the compute floor (GPU).

Random bf16 targets built on the GPU at the shapes of ``hybrid_bench.py`` (``qwen35_config``: Qwen3.5-9B text, 24
Gated DeltaNet + 8 full-attention layers) and ``gemma_bench.py`` (``build_pair``: Gemma-3-12B dimensions with
Gemma-4's global layers, 40 sliding layers of window 1024 + 8 global). Per family and prompt length P (8K and 32K
by default, ``--prompts``):

* ``ours``: ``fast_generate(target, None, ids, max_new_tokens=1)`` (AR, the prefill in chunks of ``--chunk``, the
  graphs engine), the session freed before every call so each call allocates its cache (as transformers' does);
* ``ours_module`` (``--module-prefill``): ``ours`` with ``$FOLD_HF_FUSED_PREFILL=0``, the prefill chunks through
  the module kernels instead of the fused layers (``fused_over_module_prefill_*`` in the headline);
* ``hf``: ``target.generate(ids, max_new_tokens=1, fold_fast=False)`` (the target's attention implementation,
  sdpa), after our session is released.

TTFT is each call's wall time, call to return (one token: the prefill and its first token). The protocol of
``last_mile_bench.py`` (:func:`last_mile_bench.ttft_calls`): per family, a process warm-up at P/4 of the shortest
length for both systems; then per P and system one warm-up call at that length, timed (``first_call_s``), and the
median of ``--repeats`` timed calls (``warm_median_s``); ``peak_gib`` is the most
``torch.cuda.max_memory_allocated`` of the row's calls (weights included).

Compute floor (``floor_s``): the prefill's FLOPs at the peak bf16 GEMM throughput measured in this run (best of
8192³ matmuls), FLOPs = 2 x the decoder layers' parameters x P (every weight touched once a token; the embedding
is a lookup) + 2 x the lm_head's parameters (the last token's logits) + attention: a full-attention layer
2 (QKᵀ, PV) x 2 x Hq x D x P (P + 1) / 2 (causal pairs), a sliding layer of window W the same over
sum_i min(i + 1, W) pairs (W keys, itself included), a Gated DeltaNet layer 6 x Hv x Dk x Dv x P (read, update and
read out the Dk x Dv state per token and value head; the chunked kernels' extra intra-chunk work not counted, so
the floor is a lower bound there).

Writes ``family_prefill.csv`` (gpu, versions, date, family, P, system, first_call_s, warm_median_s, peak_gib,
floor_s, ...) and ``family_prefill.json`` (``headline``: ours / HF per family and P, warm and first call;
``rows``; ``facts``; ``warnings``: what fold_hf warned per family, e.g. an attention variant it could not run;
``machine``) under ``--out``, rewritten after each family.

    python benchmarks/family_prefill_bench.py --out $OUT/family          (about 2-3 minutes on an H200)
    python benchmarks/family_prefill_bench.py --out $OUT/g3 --families gemma3_270m --skip-hf --profile
    python benchmarks/family_prefill_bench.py --out /tmp/f --dry-run    (CPU: tiny shapes, checks the script runs)
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import log  # noqa: E402
from gemma_bench import build_pair, shape_args  # noqa: E402
from hybrid_bench import build_qwen35_pair  # noqa: E402
from last_mile_bench import (cpu_machine, env_var, hf_prefill, our_prefill, peak_matmul_flops,  # noqa: E402
                             prefill_repeats, rounded, ttft_calls)

from fold_hf.generation.fast import release_fast_state  # noqa: E402
from fold_hf.targets.base import FUSED_PREFILL_ENV  # noqa: E402

FAMILIES = ("qwen35_9b", "gemma4_12b", "gemma3_270m")
FIELDS = ["gpu", "torch", "transformers", "date", "family", "P", "system", "first_call_s", "warm_median_s",
          "repeats", "peak_gib", "first_call_peak_gib", "floor_s", "fraction_of_floor", "error"]


def build_target(family: str, tiny: bool, max_positions: int, device: str):
    """The family's random target (its drafter, built by the shared builders, dropped)."""
    if family == "qwen35_9b":
        target, _drafter = build_qwen35_pair(tiny, max_positions, 16 if tiny else 2048, device)
    elif family == "gemma4_12b":
        target, _drafter = build_pair(shape_args(tiny, max_positions), device,
                                      torch.float32 if tiny else torch.bfloat16)
    elif family == "gemma3_270m":  # the real Gemma-3 pair's target shape (random weights)
        target = gemma3_270m(tiny, max_positions, device)
    else:
        raise SystemExit(f"--families: unknown {family!r} (of {', '.join(FAMILIES)})")
    target.generation_config.pad_token_id = 0
    return target


def gemma3_270m(tiny: bool, max_positions: int, device: str):
    """Gemma-3-270M's text shape (18 layers, 5 sliding of window 512 to 1 global, 4 query heads of 256, 1 KV
    head, bf16), or a tiny twin of it (fp32) for ``--dry-run``."""
    import transformers as tf

    layer_types = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    if tiny:
        config = tf.Gemma3TextConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                                     num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                                     query_pre_attn_scalar=16, max_position_embeddings=max_positions,
                                     layer_types=layer_types[:6], rope_theta=1e6)
    else:
        config = tf.Gemma3TextConfig(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                     num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                                     query_pre_attn_scalar=256, max_position_embeddings=max_positions,
                                     layer_types=layer_types, rope_theta=1e6)
    torch.manual_seed(0)
    return tf.Gemma3ForCausalLM(config).to(device, torch.float32 if tiny else torch.bfloat16).eval()


def attention_pairs(P: int, window: int | None) -> int:
    """Query-key pairs a causal layer computes over a P-token prompt: P (P + 1) / 2, or with a window of W keys
    (the query itself included) sum_i min(i + 1, W)."""
    if window is None or window >= P:
        return P * (P + 1) // 2
    return window * (window + 1) // 2 + (P - window) * window


def prefill_flops(target, P: int) -> float:
    """The prefill's FLOPs (module docstring): weights, the last token's lm_head, attention per layer type."""
    cfg = target.config
    layers = target.model.layers
    flops = 2 * sum(p.numel() for p in layers.parameters()) * P
    flops += 2 * target.get_output_embeddings().weight.numel()
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        if attn is not None:
            flops += 2 * 2 * cfg.num_attention_heads * attn.head_dim * attention_pairs(
                P, getattr(attn, "sliding_window", None))
        else:  # Gated DeltaNet: the recurrent state's multiply-adds
            linear = layer.linear_attn
            flops += 6 * linear.num_v_heads * linear.head_k_dim * linear.head_v_dim * P
    return flops


def target_facts(target) -> dict:
    cfg = target.config
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers)
    return {"architecture": type(target).__name__, "params": sum(p.numel() for p in target.parameters()),
            "layer_types": {t: types.count(t) for t in sorted(set(types))},
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            "sliding_window": getattr(cfg, "sliding_window", None),
            # transformers' Gated DeltaNet takes these kernels when installed, else its torch code (ours runs the
            # same forward for Qwen3.5's prefill)
            "installed": {m: importlib.util.find_spec(m) is not None for m in ("fla", "causal_conv1d", "kernels")}}


def run_family(family: str, args, device: torch.device, engine: str, peak_flops: float, report: dict,
               save) -> None:
    prompts = sorted(args.prompt_list)
    target = build_target(family, args.dry_run, max(prompts) + 4096, device.type)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    report["facts"][family] = target_facts(target)
    log(f"{family}: random target built on {device} ({report['facts'][family]['params'] / 1e9:.2f} B params)")
    vocab_cap = min(target.config.vocab_size, 32000)
    warm = torch.randint(0, vocab_cap, (1, max(16, prompts[0] // 4)), device=device)  # kernels compiled once
    our_prefill(target, warm, args.chunk, engine, fresh=True)
    release_fast_state(target)
    if not args.skip_hf:
        hf_prefill(target, warm)
    for P in prompts:
        prompt = torch.randint(0, vocab_cap, (1, P), device=device)
        floor_s = prefill_flops(target, P) / peak_flops
        n = args.repeats_by_prompt[P]
        runs = [("ours", ttft_calls(lambda: our_prefill(target, prompt, args.chunk, engine, fresh=True), n))]
        if args.module_prefill:  # the same calls with the prefill chunks through the module kernels
            with env_var(FUSED_PREFILL_ENV, "0"):
                runs.append(("ours_module", ttft_calls(
                    lambda: our_prefill(target, prompt, args.chunk, engine, fresh=True), n)))
        release_fast_state(target)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if not args.skip_hf:
            runs.append(("hf", ttft_calls(lambda: hf_prefill(target, prompt), n)))
        if args.profile:  # one more warm call of ours under the profiler: its kernels against its wall time
            prof = report["profiles"][f"{family}_{P}"] = prefill_profile(target, prompt, args.chunk, engine)
            log(f"{family} P={P}: profiled call {rounded(prof['wall_s'])} s wall, {prof['kernel_ms']} ms of "
                f"{prof['kernels']} kernels; top: " + "; ".join(f"{r['us'] / 1e3:.2f} ms x{r['calls']:g} "
                                                                  f"{r['kernel'][:60]}" for r in prof["top"][:6]))
            release_fast_state(target)
        for system, res in runs:
            row = {"family": family, "P": P, "system": system, "floor_s": floor_s,
                   "fraction_of_floor": floor_s / res["ttft_s"] if res.get("ttft_s") else None,
                   "first_call_fraction_of_floor": floor_s / res["first_call_s"] if res.get("first_call_s") else None,
                   **{k: res.get(k) for k in ("first_call_s", "warm_median_s", "warm_s", "repeats", "peak_gib",
                                              "first_call_peak_gib", "prefill_s", "first_call_prefill_s", "error")}}
            report["rows"].append(row)
            log(f"{family} {system:>4} P={P:>6}: first call {rounded(row['first_call_s'])} s, warm median "
                f"{rounded(row['warm_median_s'])} s of {row['repeats']} (floor {floor_s:.3f} s, fraction "
                f"{rounded(row['fraction_of_floor'])}), peak {rounded(row['peak_gib'], 2)} GiB"
                + (f", {row['error']}" if row.get("error") else ""))
        save()
    release_fast_state(target)
    del target
    if device.type == "cuda":
        torch.cuda.empty_cache()


def prefill_profile(target, prompt: torch.Tensor, chunk: int, engine: str) -> dict:
    """One warm call of ours (``our_prefill``, fresh session) under torch.profiler: ``wall_s`` (the call, profiler
    on), ``kernel_ms`` (the device time of every kernel summed: well under the wall when the host bounds it),
    ``kernels`` (launches) and the ``top`` 25 kernels by device time (CPU ops in a dry run)."""
    from last_mile_bench import profiled

    walls = []

    def call():
        res = our_prefill(target, prompt, chunk, engine, fresh=True)
        walls.append(res["wall_s"])
        return res

    out = profiled(call, lambda _res: 1)
    return {"wall_s": walls[0], **out}


def headline(rows: list[dict]) -> dict:
    """Ours / HF TTFT per family and P (warm medians; ``_first_call``: the first calls), and each system's
    fraction of the compute floor."""

    def get(family, P, system, key):
        return next((r.get(key) for r in rows if (r["family"], r["P"], r["system"]) == (family, P, system)), None)

    out = {}
    for family, P in dict.fromkeys((r["family"], r["P"]) for r in rows):
        tag = f"{family}_{P // 1024}k" if P % 1024 == 0 else f"{family}_{P}"
        for suffix, key in (("", "warm_median_s"), ("_first_call", "first_call_s")):
            ours, hf = get(family, P, "ours", key), get(family, P, "hf", key)
            out[f"prefill_over_hf_{tag}{suffix}"] = round(ours / hf, 4) if ours and hf else None
            module = get(family, P, "ours_module", key)
            if module:
                out[f"fused_over_module_prefill_{tag}{suffix}"] = round(ours / module, 4) if ours else None
        out[f"prefill_fraction_of_compute_floor_{tag}"] = rounded(get(family, P, "ours", "fraction_of_floor"), 4)
        out[f"hf_prefill_fraction_of_compute_floor_{tag}"] = rounded(get(family, P, "hf", "fraction_of_floor"), 4)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--prompts", default="8192,32768", help="prompt lengths")
    parser.add_argument("--repeats", default="3", help="timed calls after each length's warm-up: one count, or one "
                                                       "per --prompts length (e.g. 3,2)")
    parser.add_argument("--chunk", type=int, default=None,
                        help="our prefill's chunk (default: the library's, StaticTarget.prefill_chunk)")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--module-prefill", action="store_true",
                        help=f"also time ours with ${FUSED_PREFILL_ENV}=0 (system ours_module: the prefill chunks "
                             "through the module kernels, not the fused layers)")
    parser.add_argument("--profile", action="store_true",
                        help="also one profiled call of ours per family and P: its top kernels and their device "
                             "time against the call's wall time (family_prefill.json, \"profiles\")")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, static engine: checks the script")
    args = parser.parse_args(argv)
    if args.dry_run:
        device, engine = torch.device("cpu"), "static"
        args.prompts, args.repeats, args.chunk = "40,72", "2", 32  # past the tiny window (16), several chunks
    else:
        if not torch.cuda.is_available():
            raise SystemExit("family_prefill_bench needs a CUDA GPU (or --dry-run)")
        device, engine = torch.device("cuda"), "graphs"
    args.prompt_list = [int(p) for p in args.prompts.split(",") if p]
    args.repeats_by_prompt = prefill_repeats(args.repeats, args.prompt_list)
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown --families {unknown}; known: {list(FAMILIES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import fold_hf

    fold_hf.install()  # fold_fast=False is a keyword of the installed generate
    from e2e_bench import machine

    info = machine() if device.type == "cuda" else cpu_machine()
    torch.manual_seed(0)
    peak_flops = peak_matmul_flops(device, 8192 if device.type == "cuda" else 256)
    log(json.dumps(info) + f"; peak bf16 matmul {peak_flops / 1e12:.0f} TFLOP/s")
    report = {"machine": info, "dry_run": args.dry_run, "engine": engine, "chunk": args.chunk,
              "peak_matmul_tflop_s": peak_flops / 1e12, "repeats": args.repeats_by_prompt, "facts": {},
              "rows": [], "errors": {}, "warnings": {}, "headline": {}, "profiles": {}}

    def save() -> None:
        report["headline"] = headline(report["rows"])
        (out / "family_prefill.json").write_text(json.dumps(report, indent=2, default=str))
        with (out / "family_prefill.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**{k: info.get(k) for k in ("gpu", "torch", "transformers", "date")}, **r}
                             for r in report["rows"])

    for family in families:
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                run_family(family, args, device, engine, peak_flops, report, save)
            except Exception:  # one family's failure is logged and recorded; the other still runs
                report["errors"][family] = traceback.format_exc()
                log(f"FAILED {family}:\n{report['errors'][family]}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        # what the fast loop said about this family (a variant it could not run names its reason once)
        report["warnings"][family] = sorted({str(w.message)[:400] for w in caught
                                             if "fold_hf" in str(w.filename) or "fold_hf" in str(w.message)})
        for note in report["warnings"][family]:
            log(f"{family} warning: {note}")
        log(f"{family}: {time.perf_counter() - started:.1f} s")
        save()
    log("headline: " + json.dumps(report["headline"], indent=2))
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
