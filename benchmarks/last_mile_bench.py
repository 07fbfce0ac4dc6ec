"""The last mile (issue 19) on one GPU: AR step and speculative round against the memory floor, prefill against the
compute floor, peak memory per request, and the profile that explains them.

Random Llama-3.1-8B-shape target (bf16, built on the GPU) and the z-lab DFlash-shape drafter, as
``e2e_bench.py``. Everything is measured in this one run:

* ``floor`` per AR step: (the target's weights read per step, embedding excluded + its KV bytes at T) / the
  device-to-device copy bandwidth measured here; ``our_ar`` the graphs engine's AR step (p50 over rounds);
  ``our_ar[separate_proj]`` the same with ``$FOLD_HF_CONCAT_PROJECTIONS=0`` (q, k, v, gate and up as five GEMMs,
  the layout before this issue) at ``--ab-context``; ``[cublas]`` rows (``$FOLD_HF_SKINNY_GEMM=0``): the decode
  projections on cuBLAS instead of the skinny Triton GEMMs; ``[no_pdl]`` rows (``$FOLD_HF_PDL=0``): every Triton
  kernel launched without programmatic dependent launch; ``--variants`` rows (:data:`VARIANTS`, opt-in settings,
  AR at ``--variant-contexts`` and the fold round): ``[torch_select]`` (``$FOLD_HF_TRITON_SELECT=0``) the greedy
  argmax and verify on ``torch.argmax`` as before the selection kernels (the 2026-12-02 run also timed, and took
  out, ``[qkv_rope]`` and ``[fused_merge]``: benchmarks/results/2026-12-02-nvidia-h200-select);
  ``[merge_one_program]`` / ``[merge_dv32]`` one / four attention-merge programs a row (default two), ``[norm8]`` /
  ``[norm32]`` the add + RMSNorm's warps (default 16), ``[default]`` the default again in a fresh session after them;
* ``our_sd_fold`` / ``our_sd_dflash``: the speculative round (block 10, W 2048, α 2) at ``--sd-context``;
  ``[one_at_a_time]`` rows (``$FOLD_HF_PIPELINE_ROUNDS=0``): each round's result read before the next is queued;
* prefill: time to first token of a P-token prompt for our fast loop (``fast_generate(..., max_new_tokens=1)``)
  and transformers' ``generate`` (sdpa), both timed from call to return (one token: the prefill and its first
  token; ``prefill_s`` keeps our loop's own prefill clock beside it). Protocol (:func:`ttft_calls`), per prompt
  length and per system: one warm-up call AT THAT LENGTH, timed and reported as ``first_call_s`` (cuDNN builds an
  execution plan per new shape inside it), then ``--prefill-repeats`` timed calls whose median is ``ttft_s``
  (``warm_median_s``); the headline's keys take the warm medians and ``*_first_call`` keys the first calls. A
  process warm-up at a quarter of the shortest length runs first (kernels compiled, cuBLAS picked: not per-shape
  costs). Our session stays allocated between calls except at ``--peak-context``, where every call of ours frees
  it first (the cache is then allocated inside the call and counted in its peak and its time, as transformers'
  is in each of its calls); the ``hf`` rows run after our session is released. Compute floor: bf16 FLOPs of the
  layer weights over every prompt token + the lm_head over the last one + causal attention
  (2 · Hq · D · P (P + 1) per layer), at the peak bf16 matmul throughput measured here (best of 8192³ GEMMs);
  peak GPU memory (``torch.cuda.max_memory_allocated`` during a call, weights included; ``peak_gib`` the most of
  the row's calls, ``first_call_peak_gib`` the first's); ``--chunks`` adds our prefill at other chunk sizes at
  ``--ab-context`` (every prefill row follows the protocol);
* profile (``torch.profiler``, CUDA kernels, the ``static`` engine so every launch is seen): top kernels of one
  AR step and one ``fold`` round at ``--sd-context``, and of our prefill at ``--ab-context`` (which attention
  kernel the prefill runs). With PDL a kernel's time counts from its early start (its programs wait on the one
  before), so the kernel sums overlap; ``ar_<T>[no_pdl]`` is the same step without PDL, kernels back to back; ``ar_<T>[<variant>]`` each variant's step.

Writes ``last_mile.json`` (``headline``: the issue's keys; ``rows``; ``prefill``; ``profile``; ``machine``),
``last_mile.csv`` (the decode rows) and ``last_mile_prefill.csv`` (the prefill rows) under ``--out``, and logs as
it goes (a run cut by a time limit keeps what it measured: the JSON is rewritten after every section).

    python benchmarks/last_mile_bench.py --out $OUT/perf          (about 3 minutes on an H200)
    python benchmarks/last_mile_bench.py --out /tmp/x --dry-run   (CPU: tiny shapes, checks the script runs)
    python benchmarks/last_mile_bench.py --out $OUT/perf --prefill-only --no-profile --chunks ''
        --prefill 8192,32768,131072 --prefill-repeats 3,3,1         (TTFT only, about 1.5 minutes)
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

from e2e_bench import build_random_pair, log, machine, percentiles  # noqa: E402

from fold_hf import FoldConfig  # noqa: E402
from fold_hf.generation.fast import fast_generate, release_fast_state, time_rounds  # noqa: E402

GIB = 2**30


# ------------------------------------------------------------------------------------------------ device facts
def copy_bandwidth(device: torch.device, gib: float = 4.0) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted); on CPU a small copy's (dry run)."""
    n = int(gib * GIB) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps = 10 if device.type == "cuda" else 2
    start = sync_clock(device)
    for _ in range(reps):
        dst.copy_(src)
    seconds = sync_clock(device) - start
    return 2 * n * 2 * reps / seconds


def peak_matmul_flops(device: torch.device, n: int = 8192, reps: int = 10) -> float:
    """Best bf16 dense matmul throughput (FLOP/s) of ``n x n x n`` GEMMs on ``device``."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    best = math.inf
    for _ in range(reps):
        start = sync_clock(device)
        a @ b
        best = min(best, sync_clock(device) - start)
    return 2 * n**3 / best


def sync_clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def reset_peak(device: torch.device) -> float:
    """Reset the peak counter; returns GiB allocated now (0 on CPU)."""
    if device.type != "cuda":
        return 0.0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device) / GIB


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


# ------------------------------------------------------------------------------------------------ model facts
def shape_facts(target) -> dict:
    cfg = target.config
    embed = target.get_input_embeddings().weight
    head = target.get_output_embeddings().weight
    params = sum(p.numel() for p in target.parameters())
    layer_params = params - embed.numel() - head.numel()
    element = embed.element_size()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return dict(layers=cfg.num_hidden_layers, q_heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
                head_dim=head_dim, layer_params=layer_params, head_params=head.numel(),
                weight_bytes_per_step=(params - embed.numel()) * element,
                kv_bytes_per_token=cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * element)


def drafter_facts(target, drafter) -> dict:
    """Bytes a speculative round reads beyond the AR step's (the round's floor = the AR floor + these): the
    drafter's own weights (its fc, layers and norms; its embedding and lm_head are the target's), the target's
    ``lm_head`` read again for the drafter's proposals, and the drafter's one unrotated cache per context token."""
    cfg = drafter.config
    element = target.get_output_embeddings().weight.element_size()
    own = sum(p.numel() for n, p in drafter.named_parameters() if "lm_head" not in n and "embed" not in n)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return dict(drafter_bytes_per_round=(own + target.get_output_embeddings().weight.numel()) * element,
                drafter_kv_bytes_per_token=cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * element)


def round_floor_ms(facts: dict, context: int, bandwidth: float) -> float:
    """The SD round's byte floor at ``context`` (target weights + KV, drafter weights + the lm_head + its cache)."""
    return (facts["weight_bytes_per_step"] + facts["drafter_bytes_per_round"]
            + (facts["kv_bytes_per_token"] + facts["drafter_kv_bytes_per_token"]) * context) / bandwidth * 1e3


def prefill_flops(facts: dict, prompt: int) -> float:
    """Dense FLOPs of a prefill of ``prompt`` tokens: layer weights over every token, the lm_head over the last,
    causal attention (QKᵀ and PV over the P (P + 1) / 2 visible pairs, 2 FLOPs a multiply-add, per query head)."""
    weights = 2 * facts["layer_params"] * prompt + 2 * facts["head_params"]
    attention = facts["layers"] * 2 * 2 * facts["q_heads"] * facts["head_dim"] * prompt * (prompt + 1) / 2
    return weights + attention


# ------------------------------------------------------------------------------------------------ decode timings
def our_round_seconds(target, drafter, context: int, rounds: int, repeats: int, engine: str) -> list[float]:
    time_rounds(target, drafter, context, rounds, engine=engine)  # captures the graphs of this length
    seconds: list[float] = []
    for _ in range(repeats):
        seconds += time_rounds(target, drafter, context, rounds, engine=engine).round_seconds[1:]
    return seconds


class env_var:
    """``os.environ[name] = value`` for a ``with`` block (``name`` may also be a dict of several settings)."""

    def __init__(self, name, value: str | None = None) -> None:
        self.values = dict(name) if isinstance(name, dict) else {name: value}
        self.saved: dict = {}

    def __enter__(self):
        self.saved = {name: os.environ.get(name) for name in self.values}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# opt-in settings timed against the default at --variant-contexts (AR) and --sd-context (round): row name suffix ->
# the environment of the variant
VARIANTS = {
    "torch_select": {"FOLD_HF_TRITON_SELECT": "0"},  # the greedy argmax / verify on torch (before the kernels)
    "merge_one_program": {"FOLD_HF_MERGE_DV": "128"},  # one merge program per row (before 2026-12-02's dv 64)
    "merge_dv32": {"FOLD_HF_MERGE_DV": "32"},  # four merge programs per row
    "norm8": {"FOLD_HF_NORM_WARPS": "8"},  # 8 warps for the add + RMSNorm of a 4096 row (before 2026-12-02's 16)
    "norm32": {"FOLD_HF_NORM_WARPS": "32"},  # 32 warps (1024 threads, 4 columns each)
    "default": {},  # the default again, in a fresh session after the variants (the rows' order moves them ~1%)
}


# prefill settings timed against the default at --prefill-variant-contexts (rows ours[<name>]; issue 36)
PREFILL_VARIANTS = {
    "before": {"FOLD_HF_PREFILL_ATTENTION": "sdpa", "FOLD_HF_FUSED_PREFILL": "0"},  # the prefill before issue 36
    "sdpa": {"FOLD_HF_PREFILL_ATTENTION": "sdpa"},  # SDPA with a lower-right causal bias (PyTorch's FA2)
    "flash": {"FOLD_HF_PREFILL_ATTENTION": "flash"},  # prefix + diagonal on FA2, merged by log-sum-exp
    "cudnn": {"FOLD_HF_PREFILL_ATTENTION": "cudnn"},  # prefix + diagonal on cuDNN, merged by log-sum-exp
    "triton": {"FOLD_HF_PREFILL_ATTENTION": "triton"},  # our flash-attention kernel with a query offset
    "modules": {"FOLD_HF_FUSED_PREFILL": "0"},  # the layers' module kernels instead of the fused elementwise ops
}


# ------------------------------------------------------------------------------------------------ prefill
def our_prefill(target, prompt: torch.Tensor, chunk: int, engine: str, fresh: bool, drafter=None) -> dict:
    """TTFT of our fast loop (AR, one new token; ``prompt`` ``[1, P]``): ``ttft_s`` the call's wall time (as
    transformers' is timed), ``prefill_s`` the loop's own clock (prefill and first token, without the call's
    setup), and the call's peak memory; ``fresh`` frees the session first (the cache is then allocated inside the
    call and counted in its peak)."""
    device = prompt.device
    if fresh:
        release_fast_state(target)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    before = reset_peak(device)
    start = sync_clock(device)
    result = fast_generate(target, drafter, input_ids=prompt, max_new_tokens=1, return_stats=True, engine=engine,
                           prefill_chunk=chunk, eos_token_id=[])
    wall = sync_clock(device) - start
    return dict(ttft_s=wall, prefill_s=result.ttft_s, wall_s=wall, peak_gib=peak_gib(device),
                allocated_before_gib=before)


def hf_prefill(target, prompt: torch.Tensor) -> dict:
    """TTFT of transformers' ``generate`` (one new token: the prefill and its first token) and its peak memory."""
    device = prompt.device
    if device.type == "cuda":
        torch.cuda.empty_cache()
    before = reset_peak(device)
    start = sync_clock(device)
    try:
        target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=1, do_sample=False,
                        fold_fast=False)
    except torch.OutOfMemoryError as err:
        return dict(ttft_s=None, wall_s=None, peak_gib=peak_gib(device), allocated_before_gib=before,
                    error=f"out of memory: {str(err)[:200]}")
    wall = sync_clock(device) - start
    return dict(ttft_s=wall, wall_s=wall, peak_gib=peak_gib(device), allocated_before_gib=before)


PREFILL_FIELDS = ["gpu", "torch", "transformers", "date", "row", "prompt", "chunk", "repeats", "first_call_s",
                  "warm_median_s", "floor_s", "fraction_of_floor", "first_call_fraction_of_floor",
                  "first_call_peak_gib", "peak_gib", "error"]


def rounded(value, digits: int = 3):
    return None if value is None else round(value, digits)


def ttft_calls(call, repeats: int) -> dict:
    """The TTFT protocol at one prompt length: ``call()`` (a dict with ``ttft_s``, ``peak_gib``, as
    :func:`our_prefill`) once as the warm-up, timed, then ``repeats`` times more; returns the warm-up's row with
    ``first_call_s``, ``warm_s`` (the repeats' times), ``warm_median_s`` and ``ttft_s`` (= the median, or the first
    call's time when ``repeats`` is 0), ``first_call_peak_gib`` and ``peak_gib`` (the most of all calls). A call
    that fails (an ``error`` key) ends the row."""
    first = call()
    row = {**first, "first_call_s": first.get("ttft_s"), "first_call_peak_gib": first.get("peak_gib"),
           "first_call_prefill_s": first.get("prefill_s"), "repeats": 0, "warm_s": []}
    warm = []
    for _ in range(repeats if first.get("ttft_s") is not None else 0):
        res = call()
        if res.get("ttft_s") is None:
            row["error"] = res.get("error")
            break
        warm.append(res)
    times = [r["ttft_s"] for r in warm]
    peaks = [p for p in [first.get("peak_gib")] + [r.get("peak_gib") for r in warm] if p is not None]
    row.update(repeats=len(warm), warm_s=times, warm_median_s=median(times),
               ttft_s=median(times) if times else first.get("ttft_s"), peak_gib=max(peaks) if peaks else None)
    if warm and warm[0].get("prefill_s") is not None:
        row["prefill_s"] = median([r["prefill_s"] for r in warm])
    return row


def median(values: list[float]) -> float | None:
    """The median (the lower middle of an even count: a time that was measured); None for no values."""
    return sorted(values)[(len(values) - 1) // 2] if values else None


def prefill_repeats(spec: str, lengths: list[int]) -> dict[int, int]:
    """``--prefill-repeats``: one count for every length, or one per ``--prefill`` length in its order."""
    counts = [int(c) for c in spec.split(",") if c]
    if len(counts) == 1:
        counts = counts * len(lengths)
    if len(counts) != len(lengths):
        raise SystemExit(f"--prefill-repeats {spec!r}: give one count or one per --prefill length ({len(lengths)})")
    return dict(zip(lengths, counts))


# ------------------------------------------------------------------------------------------------ profile
def kernel_table(prof, per: int, cuda: bool = True) -> list[dict]:
    """Per-``per`` device time and calls of each kernel (CUDA; CPU ops in a dry run), largest first."""
    out = []
    for evt in prof.key_averages():
        if cuda:
            device_us = getattr(evt, "self_device_time_total", None)
            if device_us is None:
                device_us = evt.self_cuda_time_total
            if device_us <= 0 or "CUDA" not in str(getattr(evt, "device_type", "")):
                continue
        else:
            device_us = evt.self_cpu_time_total
            if device_us <= 0:
                continue
        out.append({"kernel": evt.key[:160], "us": round(device_us / per, 2), "calls": round(evt.count / per, 2)})
    return sorted(out, key=lambda r: -r["us"])


def profiled(fn, per_fn) -> dict:
    """Kernels of ``fn()`` (CUDA activities), divided by ``per_fn(result)`` (rounds)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        result = fn()
        if cuda:
            torch.cuda.synchronize()
    per = max(1, per_fn(result))
    table = kernel_table(prof, per, cuda)
    return {"per": per, "kernels": round(sum(r["calls"] for r in table), 1),
            "kernel_ms": round(sum(r["us"] for r in table) / 1e3, 4), "top": table[:25]}


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--contexts", default="8192,32768,131072", help="AR step contexts")
    parser.add_argument("--sd-context", type=int, default=32768)
    parser.add_argument("--ab-context", type=int, default=32768, help="A/B rows (separate projections, chunks)")
    parser.add_argument("--prefill", default="8192,32768,131072", help="prompt lengths of the TTFT rows")
    parser.add_argument("--prefill-repeats", default="",
                        help="timed calls after each length's warm-up: one count, or one per --prefill length "
                             "(e.g. 3,3,1); default 3 below 64K tokens and 1 from there (a 128K call is ~11 s)")
    parser.add_argument("--peak-context", type=int, default=131072)
    parser.add_argument("--chunks", default="4096,16384", help="extra prefill chunk sizes at --ab-context")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"opt-in settings to time against the default (of {', '.join(VARIANTS)}; '' for none)")
    parser.add_argument("--variant-contexts", default="8192,32768", help="AR contexts of the --variants rows")
    parser.add_argument("--prefill-only", action="store_true", help="only the prefill section (no AR / SD rows)")
    parser.add_argument("--prefill-variants", default="",
                        help=f"prefill settings to time against the default (of {', '.join(PREFILL_VARIANTS)})")
    parser.add_argument("--prefill-variant-contexts", default="32768", help="prompt lengths of those rows")
    parser.add_argument("--prefill-fold", action="store_true",
                        help="also our TTFT with the drafter (its context projection in the prefill) at each P")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, a tiny Llama and drafter and short contexts: checks that every section runs")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {unknown}; known: {sorted(VARIANTS)}")
    variant_contexts = {int(c) for c in args.variant_contexts.split(",") if c}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        device, engine = torch.device("cpu"), "static"
        target, drafter = tiny_pair()
        for name in ("contexts", "prefill", "chunks"):
            setattr(args, name, "64,128")
        variant_contexts = {128}
        args.sd_context = args.ab_context = args.peak_context = 128
        args.rounds, args.repeats, args.prefill_repeats = 3, 1, "2"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("last_mile_bench needs a CUDA GPU (or --dry-run)")
        device, engine = torch.device("cuda"), "graphs"
        longest = max(int(c) for c in (args.contexts + "," + args.prefill).split(",") if c)
        target, drafter = build_random_pair(longest + 4096)
    torch.manual_seed(0)
    log(json.dumps(machine() if device.type == "cuda" else {"device": "cpu", "torch": torch.__version__}))
    facts = {**shape_facts(target), **drafter_facts(target, drafter)}
    bandwidth = copy_bandwidth(device, 4.0 if device.type == "cuda" else 0.01)
    peak_flops = peak_matmul_flops(device, 8192 if device.type == "cuda" else 256)
    log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, peak bf16 matmul {peak_flops / 1e12:.0f} TFLOP/s")
    report = {"machine": machine() if device.type == "cuda" else cpu_machine(), "dry_run": args.dry_run,
              "bandwidth_tb_s": bandwidth / 1e12, "peak_matmul_tflop_s": peak_flops / 1e12, "facts": facts,
              "rows": [], "prefill": [], "profile": {}, "headline": {}}

    def save() -> None:
        report["headline"] = headline(report)
        (out / "last_mile.json").write_text(json.dumps(report, indent=2))
        with (out / "last_mile.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=["row", "context", "p20_ms", "p50_ms", "p80_ms", "n"],
                                    extrasaction="ignore")
            writer.writeheader()
            writer.writerows(report["rows"])
        with (out / "last_mile_prefill.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=PREFILL_FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**{k: report["machine"].get(k) for k in ("gpu", "torch", "transformers", "date")},
                              **r} for r in report["prefill"])

    def add(name: str, context: int, seconds: list[float]) -> None:
        row = {"row": name, "context": context, **percentiles(seconds)}
        report["rows"].append(row)
        log(f"{name:>24} @ {context:>6}: p50 {row['p50_ms'] and round(row['p50_ms'], 3)} ms")

    # ---- AR steps against the memory floor; SD rounds at one context
    contexts = [int(c) for c in args.contexts.split(",") if c]
    for context in ([] if args.prefill_only else sorted(set(contexts) | {args.sd_context})):
        floor_ms = (facts["weight_bytes_per_step"] + facts["kv_bytes_per_token"] * context) / bandwidth * 1e3
        report["rows"].append({"row": "floor", "context": context, "p20_ms": floor_ms, "p50_ms": floor_ms,
                               "p80_ms": floor_ms, "n": 1})
        if context in contexts:
            add("our_ar", context, our_round_seconds(target, None, context, args.rounds, args.repeats, engine))
        if context == args.ab_context:
            release_fast_state(target)  # the graphs are captured per session: a fresh one reads the setting
            with env_var("FOLD_HF_CONCAT_PROJECTIONS", "0"):
                add("our_ar[separate_proj]", context,
                    our_round_seconds(target, None, context, args.rounds, args.repeats, engine))
            release_fast_state(target)
            with env_var("FOLD_HF_SKINNY_GEMM", "0"):
                add("our_ar[cublas]", context,
                    our_round_seconds(target, None, context, args.rounds, args.repeats, engine))
            release_fast_state(target)
            with env_var("FOLD_HF_PDL", "0"):
                add("our_ar[no_pdl]", context,
                    our_round_seconds(target, None, context, args.rounds, args.repeats, engine))
            release_fast_state(target)
            with env_var("FOLD_HF_PIPELINE_ROUNDS", "0"):  # read at every call: no new session needed
                add("our_ar[one_at_a_time]", context,
                    our_round_seconds(target, None, context, args.rounds, args.repeats, engine))
        if context == args.sd_context:
            floor_ms = round_floor_ms(facts, context, bandwidth)
            report["rows"].append({"row": "round_floor", "context": context, "p20_ms": floor_ms, "p50_ms": floor_ms,
                                   "p80_ms": floor_ms, "n": 1})
            for mode, cfg in (("fold", FoldConfig(mode="fold", window=2048, alpha=2.0)),
                              ("dflash", FoldConfig(mode="dflash"))):
                drafter.set_fold_config(cfg)
                release_fast_state(target)  # a fresh session, as the A/B rows get (the row order moved a round ~1%)
                add(f"our_sd_{mode}", context,
                    our_round_seconds(target, drafter, context, args.rounds, args.repeats, engine))
            if context == args.ab_context:
                with env_var("FOLD_HF_PIPELINE_ROUNDS", "0"):
                    add("our_sd_fold[one_at_a_time]", context,
                        our_round_seconds(target, drafter, context, args.rounds, args.repeats, engine))
                release_fast_state(target)
                with env_var("FOLD_HF_SKINNY_GEMM", "0"):
                    add("our_sd_fold[cublas]", context,
                        our_round_seconds(target, drafter, context, args.rounds, args.repeats, engine))
                release_fast_state(target)
                with env_var("FOLD_HF_PDL", "0"):
                    add("our_sd_fold[no_pdl]", context,
                        our_round_seconds(target, drafter, context, args.rounds, args.repeats, engine))
        for variant in variants:
            # a fresh session per variant: the graphs (and the layer ops) read the settings when they are built
            if context in contexts and context in variant_contexts:
                release_fast_state(target)
                with env_var(VARIANTS[variant]):
                    add(f"our_ar[{variant}]", context,
                        our_round_seconds(target, None, context, args.rounds, args.repeats, engine))
            if context == args.sd_context:
                release_fast_state(target)
                drafter.set_fold_config(FoldConfig(mode="fold", window=2048, alpha=2.0))
                with env_var(VARIANTS[variant]):
                    add(f"our_sd_fold[{variant}]", context,
                        our_round_seconds(target, drafter, context, args.rounds, args.repeats, engine))

        release_fast_state(target)
        save()

    # ---- profile of one AR step and one fold round (static engine: every launch visible)
    if not args.no_profile and not args.prefill_only:
        drafter.set_fold_config(FoldConfig(mode="fold", window=2048, alpha=2.0))
        sd_context = args.sd_context
        profiles = [("ar", None, "", {"FOLD_HF_PDL": "1"}, sd_context),
                    ("sd_fold", drafter, "", {"FOLD_HF_PDL": "1"}, sd_context),
                    ("ar", None, "[no_pdl]", {"FOLD_HF_PDL": "0"}, sd_context)]
        profiles += [("ar", None, f"[{v}]", VARIANTS[v], sd_context) for v in variants]
        profiles += [("ar", None, "", {}, c) for c in sorted(set(contexts) - {sd_context}) if c <= 32768]
        for step, draft, tag, settings, context in profiles:
            key = f"{step}_{context}{tag}"
            release_fast_state(target)
            with env_var(settings):
                time_rounds(target, draft, context, 3, engine="static")
                report["profile"][key] = profiled(
                    lambda draft=draft: time_rounds(target, draft, context, 4, engine="static"),
                    lambda result: len(result.acceptance_lengths))
            log(f"profile {key}: {report['profile'][key]['kernels']} kernels, "
                f"{report['profile'][key]['kernel_ms']} ms of kernels per round")
        release_fast_state(target)
        save()

    # ---- prefill: TTFT against the compute floor, peak memory (protocol: the module docstring, ttft_calls)
    prefill = [int(p) for p in args.prefill.split(",") if p]
    repeats = (prefill_repeats(args.prefill_repeats, prefill) if args.prefill_repeats
               else {P: 3 if P < 65536 else 1 for P in prefill})
    vocab_cap = min(target.config.vocab_size, 32000)
    if prefill:  # kernels compiled and cuBLAS picked once, at a length no row uses (no per-shape plans of a row)
        warm = torch.randint(0, vocab_cap, (1, max(16, min(prefill) // 4)), device=device)
        our_prefill(target, warm, 8192, engine, fresh=True)
        if not args.skip_hf:
            hf_prefill(target, warm)
    for P in sorted(prefill):
        prompt = torch.randint(0, vocab_cap, (1, P), device=device)
        floor_s = prefill_flops(facts, P) / peak_flops
        fresh = P == args.peak_context
        n = repeats[P]
        runs = [("ours", 8192, ttft_calls(lambda: our_prefill(target, prompt, 8192, engine, fresh=fresh), n))]
        if P == args.ab_context:
            runs += [(f"ours[chunk {c}]", c, ttft_calls(lambda c=c: our_prefill(target, prompt, c, engine, fresh=False),
                                                        n))
                     for c in (int(c) for c in args.chunks.split(",") if c)]
        if P in {int(c) for c in args.prefill_variant_contexts.split(",") if c}:
            for variant in (v for v in args.prefill_variants.split(",") if v):
                with env_var(PREFILL_VARIANTS[variant]):
                    runs.append((f"ours[{variant}]", 8192,
                                 ttft_calls(lambda: our_prefill(target, prompt, 8192, engine, fresh=False), n)))
        if args.prefill_fold:
            drafter.set_fold_config(FoldConfig(mode="fold", window=2048, alpha=2.0))
            runs.append(("ours_fold", 8192, ttft_calls(
                lambda: our_prefill(target, prompt, 8192, engine, fresh=False, drafter=drafter), n)))
        release_fast_state(target)
        if not args.skip_hf:
            runs.append(("hf", None, ttft_calls(lambda: hf_prefill(target, prompt), n)))
        for name, chunk, res in runs:
            res.update(row=name, prompt=P, chunk=chunk, floor_s=floor_s,
                       fraction_of_floor=floor_s / res["ttft_s"] if res.get("ttft_s") else None,
                       first_call_fraction_of_floor=floor_s / res["first_call_s"] if res.get("first_call_s") else None)
            report["prefill"].append(res)
            log(f"prefill {name:>16} P={P:>6}: first call {rounded(res['first_call_s'])} s, "
                f"warm median {rounded(res['warm_median_s'])} s of {res['repeats']} (floor {floor_s:.3f} s, "
                f"fraction warm {rounded(res['fraction_of_floor'])} / "
                f"first {rounded(res['first_call_fraction_of_floor'])})"
                f", peak {rounded(res['peak_gib'], 2)} GiB" + (f", {res['error']}" if res.get("error") else ""))
        save()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if not args.no_profile and args.ab_context in prefill:
        prompt = torch.randint(0, vocab_cap, (1, args.ab_context), device=device)
        our_prefill(target, prompt, 8192, engine, fresh=False)
        report["profile"][f"prefill_{args.ab_context}"] = profiled(
            lambda: our_prefill(target, prompt, 8192, engine, fresh=False), lambda result: 1)
        release_fast_state(target)
    save()
    log("headline: " + json.dumps(report["headline"], indent=2))
    log("done")
    return 0


def headline(report: dict) -> dict:
    rows, prefill = report["rows"], report["prefill"]

    def p50(name, context):
        return next((r["p50_ms"] for r in rows if r["row"] == name and r["context"] == context
                     and r["p50_ms"] is not None), None)

    def ratio(a, b):
        return None if a is None or b is None else round(a / b, 4)

    def pre(name, P, key):
        return next((r.get(key) for r in prefill if r["row"] == name and r["prompt"] == P), None)

    out = {}
    for context, tag in ((8192, "8k"), (32768, "32k"), (131072, "128k")):
        out[f"our_ar_step_over_floor_8b_{tag}"] = ratio(p50("our_ar", context), p50("floor", context))
    out["sd_round_over_our_ar_step_8b_32k"] = ratio(p50("our_sd_fold", 32768), p50("our_ar", 32768))
    out["sd_round_over_round_floor_8b_32k"] = ratio(p50("our_sd_fold", 32768), p50("round_floor", 32768))
    out["fold_round_over_dflash_round_8b_32k"] = ratio(p50("our_sd_fold", 32768), p50("our_sd_dflash", 32768))
    out["prefill_fraction_of_compute_floor_8b_32k"] = pre("ours", 32768, "fraction_of_floor")
    out["peak_gib_128k_ours"] = pre("ours", 131072, "peak_gib")
    out["peak_gib_128k_hf"] = pre("hf", 131072, "peak_gib")
    # context for the headline: the A/B of this projection layout, HF's prefill, the chunk sweep
    out["our_ar_separate_proj_over_concat_8b_32k"] = ratio(p50("our_ar[separate_proj]", 32768), p50("our_ar", 32768))
    out["our_ar_one_at_a_time_over_queued_8b_32k"] = ratio(p50("our_ar[one_at_a_time]", 32768), p50("our_ar", 32768))
    out["sd_fold_one_at_a_time_over_queued_8b_32k"] = ratio(p50("our_sd_fold[one_at_a_time]", 32768),
                                                            p50("our_sd_fold", 32768))
    out["our_ar_cublas_over_skinny_8b_32k"] = ratio(p50("our_ar[cublas]", 32768), p50("our_ar", 32768))
    out["sd_fold_cublas_over_skinny_8b_32k"] = ratio(p50("our_sd_fold[cublas]", 32768), p50("our_sd_fold", 32768))
    out["our_ar_no_pdl_over_pdl_8b_32k"] = ratio(p50("our_ar[no_pdl]", 32768), p50("our_ar", 32768))
    out["sd_fold_no_pdl_over_pdl_8b_32k"] = ratio(p50("our_sd_fold[no_pdl]", 32768), p50("our_sd_fold", 32768))
    for variant in VARIANTS:
        key = variant.replace("+", "_and_")
        for context, tag in ((8192, "8k"), (32768, "32k")):
            out[f"our_ar_{key}_over_default_8b_{tag}"] = ratio(p50(f"our_ar[{variant}]", context),
                                                                p50("our_ar", context))
        out[f"sd_fold_{key}_over_default_8b_32k"] = ratio(p50(f"our_sd_fold[{variant}]", 32768),
                                                          p50("our_sd_fold", 32768))
    out["hf_prefill_fraction_of_compute_floor_8b_32k"] = pre("hf", 32768, "fraction_of_floor")
    for P, tag in ((8192, "8k"), (32768, "32k"), (131072, "128k")):  # issue 36: TTFT ours / transformers' (warm)
        out[f"prefill_over_hf_8b_{tag}"] = ratio(pre("ours", P, "ttft_s"), pre("hf", P, "ttft_s"))
    for P, tag in ((8192, "8k"), (131072, "128k")):
        out[f"prefill_fraction_of_compute_floor_8b_{tag}"] = pre("ours", P, "fraction_of_floor")
    # the same from each length's first call (the warm-up: cuDNN's plans for the length built inside it)
    for P, tag in ((8192, "8k"), (32768, "32k"), (131072, "128k")):
        out[f"prefill_over_hf_8b_{tag}_first_call"] = ratio(pre("ours", P, "first_call_s"),
                                                             pre("hf", P, "first_call_s"))
        out[f"prefill_fraction_of_compute_floor_8b_{tag}_first_call"] = pre("ours", P, "first_call_fraction_of_floor")
    out["hf_prefill_fraction_of_compute_floor_8b_32k_first_call"] = pre("hf", 32768, "first_call_fraction_of_floor")
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def cpu_machine() -> dict:
    """The dry run's ``machine``: the CPU, the versions and the date."""
    import datetime

    import transformers

    return {"device": "cpu", "gpu": "cpu (dry run)", "torch": torch.__version__,
            "transformers": transformers.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds")}


def tiny_pair():
    """A small Llama and a drafter of its shape on the CPU (``--dry-run``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fold_hf import FoldDrafter, FoldDrafterConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(cfg).eval()
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    dcfg = FoldDrafterConfig(block_size=4, num_target_layers=4, target_layer_ids=[1, 2], mask_token_id=255,
                             vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             max_position_embeddings=4096)
    drafter = FoldDrafter(dcfg, FoldConfig(mode="dflash")).eval()
    drafter.bind_target(target)
    return target, drafter


if __name__ == "__main__":
    sys.exit(main())
