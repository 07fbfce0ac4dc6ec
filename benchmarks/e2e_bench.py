"""End-to-end decode cost on a GPU: HF generate vs our fast loop, AR step and speculative round, by context.

Default (``--pair random8b``): Llama-3.1-8B shape with random bf16 weights made on the GPU, and a random drafter
of the z-lab Llama DFlash shape (5 layers, hidden 4096, block 10, 32/8 heads, 5 taps). Acceptance of random
weights means nothing, so rounds are timed, not requests: our rows decode a fixed number of rounds from a
context of T tokens already in the caches (no prefill, :func:`fold_hf.generation.fast.time_rounds`); HF rows
time steps on a ``DynamicCache`` filled with T entries. Speedups multiply by a τ given with ``--tau`` (from
the real pair; stated in the output). Rows, per context:

* ``hf_ar``            transformers ``generate`` AR, sdpa, DynamicCache: ms per token
* ``hf_assisted_dflash`` transformers ``generate(assistant_model=drafter)``, drafter in ``dflash`` mode, real
                       prefill (only for ``--hf-assisted-contexts``): ms per round
* ``our_ar``           our AR step (graphs engine; ``our_ar_eager`` the eager engine)
* ``our_sd_dflash`` / ``our_sd_fold``  our speculative round (fold: α, W from the flags)
* ``floor``            (weights read per step + KV bytes at T) / copy bandwidth measured in this run
* unsuffixed ``our_*`` rows use ``fast_generate``'s defaults (on CUDA: the decode-kernel verify attention with the
  fused norm/rope/MLP kernels); ``--target-paths bucket,triton,fused`` adds the same rows for
  ``[bucket]`` (``target_attention="bucket"``, the matmul attention over a length bucket, module kernels),
  ``[triton]`` (decode kernel, module kernels: ``fused_layers=False``) and ``[fused]`` (decode kernel and fused
  kernels, spelled out), timed in the same run; ``[exact]`` (exact mode, docs/exact-mode.md) adds issue 37's
  ``exact_ar_over_default_8b_32k`` and ``exact_sd_round_over_default_8b_32k`` to the headline

Writes ``e2e.csv`` (gpu, versions, date, row, context, p20/p50/p80 ms, peak GiB) and ``e2e.json`` (the rows and
the headline ratios) under ``--out``.

``--pair smollm2``: the real pair (SmolLM2-135M GGUF target + the committed drafter) on bench requests; reports
tokens, τ, TPOT and speedups of our loop against HF AR and our AR, and checks that the fast loop's tokens and
acceptance lengths equal the foundation loop's (``fold_hf.generate``).

``--target-paths`` adds ``our_ar[path]`` / ``our_<method>[path]`` rows and token checks there too.

Run from the repo root:  python benchmarks/e2e_bench.py --out $OUT        (about 4-5 minutes on an H200)
                         python benchmarks/e2e_bench.py --pair smollm2 --out $OUT   (about 2-3 minutes)
                         add ``--target-paths bucket,triton`` to either (about 2x the time)
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as dt
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fold_hf  # noqa: E402
from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig  # noqa: E402
from fold_hf.generation.fast import drafter_cache_of, fast_generate, release_fast_state, time_rounds  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p20_ms": None, "p50_ms": None, "p80_ms": None, "n": 0}
    v = torch.tensor(values, dtype=torch.float64) * 1000
    q = torch.quantile(v, torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64)).tolist()
    return {"p20_ms": q[0], "p50_ms": q[1], "p80_ms": q[2], "n": len(values)}


def copy_bandwidth(gib: float = 4.0) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 10
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 * reps / seconds


class TimingStreamer:
    """Records the wall time of every ``put`` after the prompt (one per token for AR, per round when assisted)."""

    def __init__(self):
        self.times: list[float] = []
        self.seen_prompt = False

    def put(self, value):
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self):
        pass

    def intervals(self, skip: int = 1) -> list[float]:
        return [b - a for a, b in zip(self.times[skip:-1], self.times[skip + 1 :])]


# ---------------------------------------------------------------------------------------------- random 8B
def build_random_pair(max_positions: int, block: int = 10, device: str = "cuda"):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                      max_position_embeddings=max_positions, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):  # initialised on the GPU: seconds, not minutes ("meta": shapes only)
        target = LlamaForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
        target.generation_config.eos_token_id = None
        target.generation_config.pad_token_id = 0
        dcfg = FoldDrafterConfig(block_size=block, num_target_layers=32, target_layer_ids=[1, 8, 15, 22, 29],
                                 mask_token_id=128002, vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                 num_hidden_layers=5, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                 rope_theta=500000.0, max_position_embeddings=max_positions)
        drafter = FoldDrafter(dcfg, FoldConfig(mode="dflash")).to(torch.bfloat16).eval()
    if device != "meta":
        drafter.bind_target(target)
    return target, drafter


def hf_filled_cache(target, context: int, batch: int = 1):
    from transformers import DynamicCache

    cfg = target.config
    cache = DynamicCache(config=cfg)
    shape = (batch, cfg.num_key_value_heads, context, cfg.hidden_size // cfg.num_attention_heads)
    for layer in range(cfg.num_hidden_layers):
        cache.update(torch.zeros(shape, dtype=torch.bfloat16, device="cuda"),
                     torch.zeros(shape, dtype=torch.bfloat16, device="cuda"), layer)
    return cache


def hf_ar_steps(target, context: int, steps: int, batch: int = 1) -> list[float]:
    """Seconds between transformers' ``generate`` AR steps (greedy, its DynamicCache filled with ``context`` entries
    per row, ``batch`` rows decoded together; each step yields ``batch`` tokens)."""
    cache = hf_filled_cache(target, context, batch)
    ids = torch.randint(0, 1000, (batch, context + 1), device="cuda")
    streamer = TimingStreamer()
    # transformers renamed past_key_values to cache after 5.17
    cache_name = "cache" if "cache" in inspect.signature(type(target).forward).parameters else "past_key_values"
    target.generate(ids, **{cache_name: cache}, max_new_tokens=steps, do_sample=False, streamer=streamer,
                    attention_mask=torch.ones_like(ids))
    del cache
    torch.cuda.empty_cache()
    return streamer.intervals(skip=1)


def hf_assisted_rounds(target, drafter, context: int, rounds: int) -> list[float]:
    drafter.set_fold_config(FoldConfig(mode="dflash"))
    ids = torch.randint(0, 1000, (1, context), device="cuda")
    streamer = TimingStreamer()
    target.generate(ids, assistant_model=drafter, max_new_tokens=rounds, do_sample=False, streamer=streamer,
                    attention_mask=torch.ones_like(ids), fold_fast=False)  # transformers' assisted loop
    torch.cuda.empty_cache()
    return streamer.intervals(skip=1)


# the target's verify-step variants, by name; rows get the suffix [name] except for "default" (what fast_generate
# picks on its own: on CUDA the decode kernel with fused layers)
TARGET_PATHS = {"default": {},
                "bucket": dict(target_attention="bucket", fused_layers=False),
                "triton": dict(target_attention="triton", fused_layers=False),
                "fused": dict(target_attention="triton", fused_layers=True),
                # "fused": fused target layers, drafter on its modules (FOLD_HF_FUSED_DRAFTER=0, the default before
                # 2026-11-30's GPU run); "fused_drafter": the drafter's static step fused too (the default since)
                "fused_drafter": dict(target_attention="triton", fused_layers=True),
                # exact mode (issue 37, docs/exact-mode.md): the row-count-invariant kernels on the fused step
                "exact": dict(exact=True),
                # the fused layers with every projection its own cuBLAS GEMM (no merged weights, no skinny GEMMs):
                # the Qwen3.5 / Gemma fused step before issue 39, an A/B row for hybrid_bench.py and gemma_bench.py
                "separate": dict(target_attention="triton", fused_layers=True)}
PATH_ENV = {"fused": {"FOLD_HF_FUSED_DRAFTER": "0"}, "fused_drafter": {"FOLD_HF_FUSED_DRAFTER": "1"},
            "separate": {"FOLD_HF_SKINNY_GEMM": "0", "FOLD_HF_CONCAT_PROJECTIONS": "0"}}


@contextlib.contextmanager
def path_environment(path: str):
    """The environment a target path needs for the duration of a call."""
    saved = {k: os.environ.get(k) for k in PATH_ENV.get(path, {})}
    os.environ.update(PATH_ENV.get(path, {}))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def our_rounds(target, drafter, context: int, rounds: int, repeats: int, engine: str = "graphs",
               path: str = "default") -> list[float]:
    kw = dict(engine=engine, **(TARGET_PATHS[path] if engine != "eager" else {}))
    with path_environment(path):
        time_rounds(target, drafter, context, rounds, **kw)  # captures the graphs of this length
        seconds: list[float] = []
        for _ in range(repeats):
            seconds += time_rounds(target, drafter, context, rounds, **kw).round_seconds[1:]
    return seconds


def target_paths(args) -> list[str]:
    """The library's default path first, then each path named by ``--target-paths``."""
    extra = [a for a in (args.target_paths or "").split(",") if a and a != "default"]
    unknown = [a for a in extra if a not in TARGET_PATHS]
    if unknown:
        raise SystemExit(f"--target-paths: unknown {unknown}; choose from {sorted(TARGET_PATHS)}")
    return ["default"] + extra


def suffix(attention: str) -> str:
    return "" if attention == "default" else f"[{attention}]"


def run_random8b(args) -> None:
    contexts = [int(c) for c in args.contexts.split(",")]
    assisted = {int(c) for c in args.hf_assisted_contexts.split(",") if c}
    target, drafter = build_random_pair(max(contexts) + 4096)
    log("random Llama-3.1-8B-shape target and DFlash-shape drafter built on the GPU")
    bandwidth = copy_bandwidth()
    log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    cfg = target.config
    embed_bytes = target.get_input_embeddings().weight.numel() * 2
    weight_bytes = sum(p.numel() * p.element_size() for p in target.parameters()) - embed_bytes
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 2  # bf16 keys and values
    rows: list[dict] = []
    cache_bytes: dict[str, dict] = {}

    def add(name: str, context: int, seconds: list[float], **extra):
        row = {"row": name, "context": context, **percentiles(seconds),
               "peak_gib": torch.cuda.max_memory_allocated() / 2**30, **extra}
        rows.append(row)
        log(f"{name:>20} @ {context:>6}: p50 {row['p50_ms'] if row['p50_ms'] is None else round(row['p50_ms'], 2)} ms")
        torch.cuda.reset_peak_memory_stats()

    modes = {"dflash": FoldConfig(mode="dflash"),
             "fold": FoldConfig(mode="fold", window=args.window, alpha=args.alpha)}
    for context in contexts:
        floor_s = (weight_bytes + kv_per_token * context) / bandwidth
        rows.append({"row": "floor", "context": context, "p20_ms": floor_s * 1e3, "p50_ms": floor_s * 1e3,
                     "p80_ms": floor_s * 1e3, "n": 1, "peak_gib": None})
        torch.cuda.reset_peak_memory_stats()
        for attention in target_paths(args):
            for mode, fold_config in modes.items():
                drafter.set_fold_config(fold_config)
                add(f"our_sd_{mode}{suffix(attention)}", context,
                    our_rounds(target, drafter, context, args.rounds, args.repeats, path=attention))
                dcache = drafter_cache_of(target)
                cache_bytes.setdefault(str(context), {})[mode] = dcache.bytes_used() if dcache is not None else None
            add(f"our_ar{suffix(attention)}", context,
                our_rounds(target, None, context, args.rounds, args.repeats, path=attention))
        if args.eager:
            add("our_ar_eager", context, our_rounds(target, None, context, args.rounds, 2, engine="eager"))
        release_fast_state(target)
        torch.cuda.empty_cache()
        if not args.skip_hf:
            add("hf_ar", context, hf_ar_steps(target, context, args.hf_steps))
            if context in assisted:
                add("hf_assisted_dflash", context, hf_assisted_rounds(target, drafter, context, args.hf_steps))
    # keep_rotated_copy adds rotated keys beside our unrotated K and V: 1.5x ours per entry; the paper's layout (its
    # rotated KV cache plus an unrotated K and V side cache) holds both K and V twice: 2x ours
    probe = fold_hf.FoldCache(1, keep_rotated_copy=True, rope=drafter.rope)
    probe.update(torch.zeros(1, 8, 4, 128), torch.zeros(1, 8, 4, 128), 0)
    rotated_key_copy_over_one = probe.bytes_used() / (2 * 8 * 4 * 128 * 4)
    write_outputs(args, rows, {
        "bandwidth_tb_s": bandwidth / 1e12,
        "weight_bytes_read_per_step": weight_bytes,
        "kv_bytes_per_token": kv_per_token,
        "drafter_cache_bytes_used": cache_bytes,
        "rotated_key_copy_over_ours": rotated_key_copy_over_one,
        "tau_assumed": args.tau,
        "window": args.window, "alpha": args.alpha, "rounds": args.rounds, "repeats": args.repeats,
        "target_paths": target_paths(args),
    }, headline(rows, cache_bytes, args.tau, target_paths(args)))


def headline(rows: list[dict], cache_bytes: dict, tau: float, attentions=("default",)) -> dict:
    def p50(name, context):
        for row in rows:
            if row["row"] == name and row["context"] == context and row["p50_ms"] is not None:
                return row["p50_ms"]
        return None

    def ratio(a, b):
        return None if a is None or b is None else a / b

    k32, k128 = 32768, 131072
    by_ctx = cache_bytes.get(str(k128), {})
    out = {
        "our_ar_step_over_floor_8b_32k": ratio(p50("our_ar", k32), p50("floor", k32)),
        "sd_round_over_our_ar_step_8b_32k": ratio(p50("our_sd_fold", k32), p50("our_ar", k32)),
        "sd_dflash_round_over_our_ar_step_8b_32k": ratio(p50("our_sd_dflash", k32), p50("our_ar", k32)),
        "our_ar_speedup_over_hf_ar_8b_32k": ratio(p50("hf_ar", k32), p50("our_ar", k32)),
        "fold_round_over_dflash_round_128k": ratio(p50("our_sd_fold", k128), p50("our_sd_dflash", k128)),
        "fold_cache_bytes_over_dflash_cache_bytes_128k": ratio(by_ctx.get("fold"), by_ctx.get("dflash")),
    }
    for attention in attentions:
        if attention == "default":
            continue
        tag = suffix(attention)
        out[f"our_ar{tag}_step_over_floor_8b_32k"] = ratio(p50(f"our_ar{tag}", k32), p50("floor", k32))
        out[f"sd_round{tag}_over_our_ar{tag}_step_8b_32k"] = ratio(p50(f"our_sd_fold{tag}", k32),
                                                                  p50(f"our_ar{tag}", k32))
        for context in sorted({r["context"] for r in rows}):
            for row in ("our_ar", "our_sd_fold", "our_sd_dflash"):
                out[f"{row}{tag}_over_{row}_{context}"] = ratio(p50(f"{row}{tag}", context), p50(row, context))
        if attention == "exact":  # issue 37's cost keys: exact mode over the default path, same run
            out["exact_ar_over_default_8b_32k"] = ratio(p50("our_ar[exact]", k32), p50("our_ar", k32))
            out["exact_sd_round_over_default_8b_32k"] = ratio(p50("our_sd_fold[exact]", k32), p50("our_sd_fold", k32))
    for context in sorted({r["context"] for r in rows}):
        sd = p50("our_sd_fold", context)
        out[f"projected_speedup_fold_over_our_ar_at_tau_{tau}_{context}"] = ratio(
            None if p50("our_ar", context) is None else tau * p50("our_ar", context), sd)
        out[f"projected_speedup_fold_over_hf_ar_at_tau_{tau}_{context}"] = ratio(
            None if p50("hf_ar", context) is None else tau * p50("hf_ar", context), sd)
    return out


# ---------------------------------------------------------------------------------------------- SmolLM2 pair
def run_smollm2(args) -> None:
    from fold_hf.bench import build_suite
    from fold_hf import load_embedded_pair

    target, tokenizer, drafter = load_embedded_pair(torch.device("cuda"))
    own = drafter.fold_config
    log(f"SmolLM2 pair loaded; drafter reads with {own}")
    tiers = [int(t) for t in args.smollm2_tiers.split(",")]
    requests = build_suite(tokenizer, args.suite, tiers, per_tier=args.per_tier, new_tokens=args.new_tokens)
    methods = {"dflash": FoldConfig(mode="dflash", window=own.window), "fold": own}
    rows, checks = [], []

    def timed_fast(drafter_or_none, ids, cfg, attention="default"):
        kw = dict(input_ids=ids, max_new_tokens=args.new_tokens, return_stats=True, eos_token_id=[],
                  **TARGET_PATHS[attention])
        if cfg is not None:
            kw["fold_config"] = cfg
        with path_environment(attention):
            fast_generate(target, drafter_or_none, **kw)  # captures the graphs of this length
            return fast_generate(target, drafter_or_none, **kw)

    for req in requests:
        ids = torch.tensor([req["input_ids"]], device="cuda")
        streamer = TimingStreamer()
        target.generate(ids, max_new_tokens=args.new_tokens, do_sample=False, streamer=streamer,
                        attention_mask=torch.ones_like(ids), eos_token_id=None)
        hf_tpot = sum(streamer.intervals(0)) / max(1, len(streamer.intervals(0)))
        found_ar = fold_hf.generate(target, None, input_ids=ids, max_new_tokens=args.new_tokens, return_stats=True,
                                    eos_token_id=[])
        our_ar = timed_fast(None, ids, None)
        checks.append({"request": req["id"], "method": "ar",
                       "same_tokens": torch.equal(our_ar.sequences, found_ar.sequences)})
        for attention in target_paths(args)[1:]:
            tagged = timed_fast(None, ids, None, attention)
            checks.append({"request": req["id"], "method": f"ar{suffix(attention)}",
                           "same_tokens": torch.equal(tagged.sequences, found_ar.sequences)})
            rows.append({"request": req["id"], "tier": req["tier"], "method": f"our_ar{suffix(attention)}",
                         "tpot_ms": tagged.tpot_s * 1e3,
                         "speedup_vs_our_ar": our_ar.tpot_s / tagged.tpot_s if tagged.tpot_s else None})
        rows.append({"request": req["id"], "tier": req["tier"], "method": "hf_ar", "tpot_ms": hf_tpot * 1e3})
        rows.append({"request": req["id"], "tier": req["tier"], "method": "foundation_ar",
                     "tpot_ms": found_ar.tpot_s * 1e3})
        rows.append({"request": req["id"], "tier": req["tier"], "method": "our_ar", "tpot_ms": our_ar.tpot_s * 1e3})
        for name, cfg in methods.items():
            found = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=args.new_tokens,
                                     return_stats=True, eos_token_id=[], fold_config=cfg)
            ours = timed_fast(drafter, ids, cfg)
            checks.append({"request": req["id"], "method": name,
                           "same_tokens": torch.equal(ours.sequences, found.sequences),
                           "same_tau": ours.acceptance_lengths == found.acceptance_lengths,
                           "same_as_ar": torch.equal(ours.sequences, found_ar.sequences)})
            rows.append({"request": req["id"], "tier": req["tier"], "method": f"foundation_{name}",
                         "tpot_ms": found.tpot_s * 1e3, "tau": found.tau})
            rows.append({"request": req["id"], "tier": req["tier"], "method": f"our_{name}",
                         "tpot_ms": ours.tpot_s * 1e3, "tau": ours.tau,
                         "speedup_vs_hf_ar": hf_tpot / ours.tpot_s if ours.tpot_s else None,
                         "speedup_vs_our_ar": our_ar.tpot_s / ours.tpot_s if ours.tpot_s else None})
            for attention in target_paths(args)[1:]:
                tagged = timed_fast(drafter, ids, cfg, attention)
                checks.append({"request": req["id"], "method": f"{name}{suffix(attention)}",
                               "same_tokens": torch.equal(tagged.sequences, found.sequences),
                               "same_tau": tagged.acceptance_lengths == found.acceptance_lengths})
                rows.append({"request": req["id"], "tier": req["tier"], "method": f"our_{name}{suffix(attention)}",
                             "tpot_ms": tagged.tpot_s * 1e3, "tau": tagged.tau,
                             "speedup_vs_hf_ar": hf_tpot / tagged.tpot_s if tagged.tpot_s else None,
                             "speedup_vs_our_ar": our_ar.tpot_s / tagged.tpot_s if tagged.tpot_s else None})
        log(f"{req['id']}: " + ", ".join(f"{r['method']} {r['tpot_ms']:.2f}ms" for r in rows
                                          if r["request"] == req["id"]))
        write_smollm2(args, rows, checks)  # after every request: a run cut by a time limit keeps what it measured
    write_smollm2(args, rows, checks, final=True)


def write_smollm2(args, rows: list[dict], checks: list[dict], final: bool = False) -> None:
    """``smollm2_fast.json`` (machine, per-method means, rows, token checks) and ``smollm2_fast.csv`` under --out."""
    summary = {}
    for method in sorted({r["method"] for r in rows}):
        sel = [r for r in rows if r["method"] == method]
        summary[method] = {k: sum(r[k] for r in sel) / len(sel) for k in ("tpot_ms", "tau", "speedup_vs_hf_ar",
                                                                           "speedup_vs_our_ar")
                           if all(r.get(k) is not None for r in sel)}
    summary["requests_with_different_tokens"] = sum(not c["same_tokens"] for c in checks)
    summary["requests_with_different_tau"] = sum(not c.get("same_tau", True) for c in checks)
    summary["requests_done"] = len({r["request"] for r in rows})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "smollm2_fast.json").write_text(json.dumps({"machine": machine(), "summary": summary, "rows": rows,
                                                       "checks": checks}, indent=2))
    with (out / "smollm2_fast.csv").open("w", newline="") as fh:
        fields = ["request", "tier", "method", "tpot_ms", "tau", "speedup_vs_hf_ar", "speedup_vs_our_ar"]
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    if final:
        log(json.dumps(summary, indent=2))


# ---------------------------------------------------------------------------------------------- output
def machine() -> dict:
    import transformers

    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda": torch.version.cuda, "date": dt.datetime.now().isoformat(timespec="seconds")}


def write_outputs(args, rows: list[dict], details: dict, ratios: dict) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine()
    with (out / "e2e.csv").open("w", newline="") as fh:
        fields = ["gpu", "torch", "transformers", "date", "row", "context", "p20_ms", "p50_ms", "p80_ms", "n",
                  "peak_gib"]
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**{k: info[k] for k in ("gpu", "torch", "transformers", "date")}, **row})
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in ratios.items()}
    (out / "e2e.json").write_text(json.dumps({"machine": info, "headline": clean, "details": details, "rows": rows},
                                             indent=2))
    log("headline: " + json.dumps(clean, indent=2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", choices=("random8b", "smollm2"), default="random8b")
    parser.add_argument("--contexts", default="8192,32768,131072")
    parser.add_argument("--rounds", type=int, default=16, help="rounds per timed call (our rows)")
    parser.add_argument("--repeats", type=int, default=4, help="timed calls per row (our rows)")
    parser.add_argument("--hf-steps", type=int, default=12, help="tokens / rounds per HF row")
    parser.add_argument("--hf-assisted-contexts", default="8192", help="contexts of the HF assisted row ('' = none)")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--eager", action="store_true", help="also time our eager engine's AR step")
    parser.add_argument("--target-paths", default="",
                        help="comma list of extra target paths to time (and, for smollm2, check): bucket (matmul "
                             "attention), triton (decode kernel attention, module kernels), fused (decode kernel + "
                             "fused norm/rope/MLP), fused_drafter (also the drafter's step, experimental); rows get "
                             "[name]")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--alpha", type=float, default=2.0)
    parser.add_argument("--tau", type=float, default=3.0, help="τ of the real pair, for projected speedups")
    parser.add_argument("--suite", default="code")
    parser.add_argument("--smollm2-tiers", default="1024,4096")
    parser.add_argument("--per-tier", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("e2e_bench needs a CUDA GPU")
    torch.manual_seed(0)
    log(json.dumps(machine()))
    if args.pair == "smollm2":
        run_smollm2(args)
    else:
        run_random8b(args)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
