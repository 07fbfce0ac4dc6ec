"""What a user waits for (issue 36): whole ``generate`` calls, call to return (prefill + decode), on one GPU.

The Llama-3.1-8B shape with random bf16 weights and a random z-lab-shape drafter (``e2e_bench.build_random_pair``):
random weights accept almost nothing (τ ≈ 1, printed per row), so the FOLD rows show what a call costs at that τ,
not the speedup of a trained pair; the AR rows and the prefill are what they would be with real weights. Rows, per
prompt length P and new-token count N, each a whole call timed with CUDA synchronisation around it:

* ``ours_fold``     ``target.generate(ids, assistant_model=drafter)`` (FOLD, W 2048, α 2; the fast loop)
* ``ours_ar``       ``target.generate(ids, fold_fast=True)`` (AR on the fast loop)
* ``hf``            ``target.generate(ids)`` without fold_hf in the way (transformers' own loop, sdpa)
* ``hf_assisted``   ``target.generate(ids, assistant_model=drafter, fold_fast=False)`` (transformers' assisted loop
                    with FOLD's candidate generator; only where ``--hf-assisted`` allows: it is slow)
* ``ttft_*``        the same calls with N = 1 (time to first token)

Every row is warmed up once at its prompt length with ``--warm-new`` tokens (cuDNN plans, the decode graphs) before ``--repeats`` timed calls; medians.
Writes ``whole_call.json`` and ``whole_call.csv`` under ``--out``.

    python benchmarks/whole_call_bench.py --out $OUT/whole_call        (about 5 minutes on an H200)
    python benchmarks/whole_call_bench.py --out /tmp/x --dry-run        (CPU, tiny shapes)
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fold_hf import FoldConfig  # noqa: E402
from fold_hf.generation.fast import release_fast_state  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def call(target, ids, new: int, kind: str, drafter):
    if kind == "ours_fold":
        return target.generate(ids, assistant_model=drafter, max_new_tokens=new, do_sample=False,
                               return_dict_in_generate=True)
    if kind == "ours_ar":
        return target.generate(ids, max_new_tokens=new, do_sample=False, fold_fast=True)
    if kind == "hf":
        return target.generate(ids, max_new_tokens=new, do_sample=False, attention_mask=torch.ones_like(ids))
    if kind == "hf_assisted":
        return target.generate(ids, assistant_model=drafter, max_new_tokens=new, do_sample=False, fold_fast=False)
    raise ValueError(kind)


def timed(fn, device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", default="4096,32768,131072")
    parser.add_argument("--new", default="64,256")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--long-repeats", type=int, default=1, help="timed calls per cell at prompts >= 100K")
    parser.add_argument("--hf-assisted", default="4096:64,32768:64", help="P:N cells of the hf_assisted row")
    parser.add_argument("--hf-max-prompt", type=int, default=131072, help="longest prompt of the hf rows")
    parser.add_argument("--warm-new", type=int, default=16,
                        help="new tokens of the warm-up call (1 warms the prefill only: the first decode then captures)")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = [int(p) for p in args.prompts.split(",") if p]
    news = [int(n) for n in args.new.split(",") if n]
    assisted = {tuple(int(x) for x in cell.split(":")) for cell in args.hf_assisted.split(",") if cell}
    if args.dry_run:
        from last_mile_bench import tiny_pair

        device = torch.device("cpu")
        target, drafter = tiny_pair()
        prompts, news, assisted, args.repeats = [64, 200], [4, 8], {(64, 4)}, 1
    else:
        from e2e_bench import build_random_pair, machine

        device = torch.device("cuda")
        target, drafter = build_random_pair(max(prompts) + max(news) + 64)
    drafter.set_fold_config(FoldConfig(mode="fold", window=2048, alpha=2.0))
    info = machine() if device.type == "cuda" else {"device": "cpu", "torch": torch.__version__}
    log(json.dumps(info))
    vocab = min(target.config.vocab_size, 120000)
    rows = []
    for P in prompts:
        ids = torch.randint(0, vocab, (1, P), device=device, generator=torch.Generator(device=device).manual_seed(P))
        kinds = ["ours_fold", "ours_ar"] + (["hf"] if P <= args.hf_max_prompt else [])
        for kind in kinds + (["hf_assisted"] if any(p == P for p, _ in assisted) else []):
            cells = [n for n in news if kind != "hf_assisted" or (P, n) in assisted]
            release_fast_state(target)
            call(target, ids, args.warm_new, kind, drafter)  # warm-up at this prompt length: prefill and decode graphs
            for new in [1] + cells:
                if kind == "hf_assisted" and new == 1:
                    continue
                seconds, result = [], None
                repeats = args.long_repeats if P >= 100_000 else args.repeats
                for _ in range(repeats):
                    s, result = timed(lambda: call(target, ids, new, kind, drafter), device)
                    seconds.append(s)
                tau = getattr(result, "tau", None) if kind == "ours_fold" else None
                if kind == "hf_assisted":
                    lengths = list(getattr(drafter, "last_acceptance_lengths", []) or [])
                    tau = sum(lengths) / len(lengths) if lengths else None
                row = {"row": "ttft_" + kind if new == 1 else kind, "prompt": P, "new": new,
                       "median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
                       "n": len(seconds), "tau": tau}
                rows.append(row)
                log(f"{row['row']:>18} P={P:>6} N={new:>3}: {row['median_s']:.3f} s"
                    + (f" (τ {tau:.2f})" if tau else ""))
                (out / "whole_call.json").write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
        release_fast_state(target)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with (out / "whole_call.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    table = {}
    for r in rows:
        table.setdefault((r["prompt"], r["new"]), {})[r["row"]] = r["median_s"]
    log("P, N: " + ", ".join(sorted({r['row'] for r in rows})))
    for key, cols in sorted(table.items()):
        log(f"{key}: " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(cols.items())))


if __name__ == "__main__":
    main()
