"""SD round cost of the retrieval baselines (InfLLM, CMR) against FOLD and DFlash, as the paper reports it (§4.2:
"an SD round takes 12.3 ms with FOLD, 0.3 ms more than with DFlash and less than with InfLLM (13.7 ms) and CMR
(14.0 ms)").

Pair: Llama-3.1-8B shape with random bf16 weights made on the GPU and a random drafter of the z-lab Llama DFlash
shape (``benchmarks/e2e_bench.py``'s ``build_random_pair``: 5 layers, block 10, 5 taps). Random weights accept
nothing, so rounds are timed, not requests: :func:`fold_hf.generation.fast.time_rounds` decodes ``--rounds``
rounds from a context of T entries already in the caches (no prefill), ``--repeats`` times after one warm-up call
that captures the graphs; the first round of each call is dropped. Rows, per context: ``dflash``, ``fold`` (W, α
from the flags), ``infllm`` (W; the paper's blocks of 128, 128 initial entries, 16 blocks, 4 representatives),
``cmr`` (2,048 entries; refreshes every 8 rounds, so ``--rounds`` of 16 or more includes refresh rounds) and
``ar``; each with p20/p50/p80 and mean ms per round, the difference to DFlash's p50 and the overhead over FOLD
as the paper reports it (mean round, % over FOLD).

How each runs (the ``engine`` column): every method runs captured steps (draft and verify in CUDA graphs).
``infllm``'s selection (block representatives, top-k, its statistics) and ``cmr``'s (chunk selection, the refresh
from the target's attention of the query at t - 1, which only cmr's verify keeps) run on the device inside the
captured draft step (:mod:`fold_hf.generation.static_retrieval`); cmr's refresh rounds replay their own captured
step. A method whose step could not be captured says so in the ``notes`` (the fast loop's warning).

Writes ``baseline_rounds.json`` / ``.csv`` and ``baseline_rounds.md`` (the table) under ``--out``.

GPU:  python benchmarks/baseline_rounds_bench.py --out $OUT            (about 2-3 minutes on an H200)
CPU dry run (tiny random pair, host engines):  python benchmarks/baseline_rounds_bench.py --tiny --out /tmp/brb
"""

from __future__ import annotations

import argparse
import csv
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


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"p20_ms": None, "p50_ms": None, "p80_ms": None, "mean_ms": None, "n": 0}
    v = torch.tensor(values, dtype=torch.float64) * 1000
    q = torch.quantile(v, torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64)).tolist()
    return {"p20_ms": q[0], "p50_ms": q[1], "p80_ms": q[2], "mean_ms": float(v.mean()), "n": len(values)}


def tiny_pair(max_positions: int, block: int = 4):
    """A small random Llama pair on the CPU (dry run)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=64, rope_theta=10000.0, max_position_embeddings=max_positions,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(cfg).eval()
    target.generation_config.eos_token_id = None
    dcfg = FoldDrafterConfig(block_size=block, num_target_layers=4, target_layer_ids=[1, 2], mask_token_id=63,
                             vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                             max_position_embeddings=max_positions)
    drafter = FoldDrafter(dcfg, FoldConfig(mode="dflash")).eval()
    drafter.bind_target(target)
    return target, drafter


def methods(window: int, alpha: float, budget: int, extra: dict) -> dict[str, FoldConfig | None]:
    return {
        "dflash": FoldConfig(mode="dflash", window=window),
        "fold": FoldConfig(mode="fold", window=window, alpha=alpha),
        "infllm": FoldConfig(mode="infllm", window=window, extra=dict(extra)),
        "cmr": FoldConfig(mode="cmr", window=window, budget=budget, extra=dict(extra)),
        "ar": None,
    }


def engine_of(name: str, engine: str, notes: list[str]) -> str:
    """The engine a method ran on: ``engine``, unless the fast loop warned that its step was not captured."""
    if any("eager" in n and "uncaptured" in n for n in notes):
        return f"{engine}, host draft"
    if any("host-length (eager) rounds" in n for n in notes):
        return "eager rounds"
    return engine


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--contexts", default="8192,32768,131072")
    parser.add_argument("--rounds", type=int, default=24, help="rounds per timed call (>= 16 includes CMR refreshes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--alpha", type=float, default=2.0)
    parser.add_argument("--budget", type=int, default=2048, help="CMR's entries")
    parser.add_argument("--methods", default="dflash,fold,infllm,cmr,ar")
    parser.add_argument("--tiny", action="store_true", help="CPU dry run on a tiny random pair (small contexts)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    contexts = [int(c) for c in args.contexts.split(",")]
    extra: dict = {}
    if args.tiny:
        # the paper's retrieval settings scaled down so that selection and refreshes happen at tiny contexts
        contexts = [c for c in contexts if c <= 1024] or [600]
        extra = dict(infllm_block=16, infllm_init=16, infllm_topk=4, infllm_repr=4, cmr_chunk=16)
        args.window, args.budget = min(args.window, 64), min(args.budget, 128)
        target, drafter = tiny_pair(max(contexts) + 512)
        engine = "static"
    else:
        if not torch.cuda.is_available():
            raise SystemExit("baseline_rounds_bench needs a CUDA GPU (or --tiny for a CPU dry run)")
        from e2e_bench import build_random_pair

        target, drafter = build_random_pair(max(contexts) + 4096)
        engine = "graphs"
    log(f"pair built ({'tiny, CPU' if args.tiny else 'Llama-3.1-8B shape, random bf16, CUDA'}); engine {engine}")
    chosen = methods(args.window, args.alpha, args.budget, extra)
    names = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(names) - set(chosen))
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {sorted(chosen)}")
    rows = []
    for context in contexts:
        for name in names:
            cfg = chosen[name]
            if cfg is not None:
                drafter.set_fold_config(cfg)
            use = drafter if cfg is not None else None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", UserWarning)
                time_rounds(target, use, context, args.rounds, engine=engine)  # warm-up: captures the graphs
                seconds: list[float] = []
                for _ in range(args.repeats):
                    seconds += time_rounds(target, use, context, args.rounds, engine=engine).round_seconds[1:]
            notes = sorted({str(w.message) for w in caught})
            row = {"method": name, "context": context, "engine": engine_of(name, engine, notes),
                   **percentiles(seconds), "notes": notes}
            rows.append(row)
            log(f"{name:>7} @ {context:>6}: p50 {row['p50_ms']:.2f} ms per round ({row['engine']})")
        release_fast_state(target)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    for row in rows:
        base = next((r for r in rows if r["method"] == "dflash" and r["context"] == row["context"]), None)
        row["delta_vs_dflash_ms"] = None if base is None else row["p50_ms"] - base["p50_ms"]
        fold = next((r for r in rows if r["method"] == "fold" and r["context"] == row["context"]), None)
        row["over_fold_pct"] = None if fold is None else 100 * (row["mean_ms"] / fold["mean_ms"] - 1)
    meta = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "window": args.window,
            "alpha": args.alpha, "budget": args.budget, "rounds": args.rounds, "repeats": args.repeats,
            "tiny": args.tiny, "extra": extra}
    (out / "baseline_rounds.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    with open(out / "baseline_rounds.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "context", "engine", "p20_ms", "p50_ms", "p80_ms", "mean_ms",
                                               "n", "delta_vs_dflash_ms", "over_fold_pct"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| context | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for context in contexts:
        cells = []
        for name in names:
            r = next(r for r in rows if r["method"] == name and r["context"] == context)
            delta = "" if r["delta_vs_dflash_ms"] is None or name == "dflash" else f" ({r['delta_vs_dflash_ms']:+.2f})"
            cells.append(f"{r['p50_ms']:.2f}{delta}")
        lines.append(f"| {context} | " + " | ".join(cells) + " |")
    table = "SD round, p50 ms (difference to DFlash)\n\n" + "\n".join(lines) + "\n"
    # the paper's way (§4.2): mean SD round and its overhead over FOLD
    paper = [m for m in names if m != "ar"]
    if "fold" in paper:
        lines = ["| context | " + " | ".join(paper) + " |", "|---|" + "---|" * len(paper)]
        for context in contexts:
            cells = []
            for name in paper:
                r = next(r for r in rows if r["method"] == name and r["context"] == context)
                over = "" if name == "fold" else f" ({r['over_fold_pct']:+.1f}%)"
                cells.append(f"{r['mean_ms']:.2f}{over}")
            lines.append(f"| {context} | " + " | ".join(cells) + " |")
        table += "\nSD round, mean ms (% over FOLD), as the paper reports it\n\n" + "\n".join(lines) + "\n"
    engines = sorted({(r["method"], r["engine"]) for r in rows})
    table += "\nEngines: " + ", ".join(f"{m} {e}" for m, e in engines) + "\n"
    (out / "baseline_rounds.md").write_text(table)
    print(table)
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
