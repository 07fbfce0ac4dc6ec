"""What users get: ms per token, τ and speedup of each way to call fold_hf, greedy and sampled.

Call paths, per request (each warmed up once on that request, so graph capture is not timed):

* ``generate``                     ``target.generate(...)``, no drafter (transformers' loop): the baseline
* ``generate+drafter``             ``target.generate(..., assistant_model=drafter)``: routed to the fast loop
* ``generate+drafter[hf]``         the same with ``fold_fast=False``: transformers' assisted loop, our drafter
* ``fold_hf.generate``             our loop over the model's own forward
* ``fast_generate``                :func:`fold_hf.generation.fast.fast_generate` called directly

each greedy and sampled (``--temperature 0.6 --top-p 0.9`` by default, Llama-3.1-8B-Instruct's generation
config). ms/token = decode time after the first token / (tokens - 1), taken from a streamer's put times (the
prefill is excluded on every path); speedup = ms/token of ``generate`` with the same sampling / the path's.
Greedy rows also say whether the path's tokens equal plain ``generate``'s. Per-round rows
(``round_greedy`` / ``round_sampled``: :func:`~fold_hf.generation.fast.time_rounds` at each context, the same
rounds with sampling on or off) give the sampling overhead of a captured round.

Pairs: ``smollm2`` (the embedded real pair, real requests from ``fold_hf.bench.build_suite``), ``random8b`` (the
Llama-3.1-8B shape with random bf16 weights and a random z-lab-shaped drafter: timings only, τ ≈ 1 means
nothing), ``tiny`` (a random tiny pair on the CPU: a dry run of the script).

  python benchmarks/front_door_bench.py --pair smollm2 --out $OUT            (H200: ~3 minutes)
  python benchmarks/front_door_bench.py --pair random8b --out $OUT           (H200: ~5 minutes)
  python benchmarks/front_door_bench.py --pair tiny --out /tmp/fd            (CPU dry run, ~1 minute)

Writes ``front_door.json`` (machine, rows, the per-path table) and ``front_door.csv`` under ``--out`` after every
request, and prints the table.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fold_hf  # noqa: E402
from fold_hf.generation.fast import fast_generate, release_fast_state, time_rounds  # noqa: E402
from fold_hf.generation.sampling import Sampling  # noqa: E402

PATHS = ("generate", "generate+drafter", "generate+drafter[hf]", "fold_hf.generate", "fast_generate")
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


class TimingStreamer:
    """Wall time of every put after the prompt's (a token per AR step, the kept tokens per round otherwise)."""

    def __init__(self, device):
        self.device, self.times, self.tokens, self.prompt_seen = device, [], [], False

    def put(self, value):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())
        self.tokens.append(value.numel())

    def end(self):
        pass

    def tpot_s(self) -> float | None:
        """Seconds per token after the first put (the prefill's token)."""
        after = sum(self.tokens[1:])
        return (self.times[-1] - self.times[0]) / after if after else None


def build_pair(args, device):
    if args.pair == "smollm2":
        from fold_hf.bench import build_suite
        from fold_hf import load_embedded_pair

        target, tokenizer, drafter = load_embedded_pair(device)
        tiers = [int(t) for t in args.tiers.split(",")]
        requests = build_suite(tokenizer, args.suite, tiers, per_tier=args.per_tier, new_tokens=args.new_tokens)
        return target, drafter, [(r["id"], r["tier"], torch.tensor([r["input_ids"]])) for r in requests]
    if args.pair == "random8b":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from e2e_bench import build_random_pair

        contexts = [int(c) for c in args.contexts.split(",")]
        target, drafter = build_random_pair(max(contexts) + 2 * args.new_tokens + 64)
        drafter.set_fold_config(fold_hf.FoldConfig(window=2048, alpha=2.0))
        vocab = target.config.vocab_size
        g = torch.Generator().manual_seed(0)
        return target, drafter, [(f"random-{c}", c, torch.randint(0, vocab - 2, (1, c), generator=g))
                                 for c in contexts]
    # tiny: a random pair on the CPU, for a dry run of the script
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                      pad_token_id=0, tie_word_embeddings=False)
    target = LlamaForCausalLM(cfg).eval()
    target.generation_config.eos_token_id = None
    dcfg = fold_hf.FoldDrafterConfig(block_size=4, num_target_layers=4, target_layer_ids=[1, 3], mask_token_id=95,
                                     vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=4096)
    drafter = fold_hf.FoldDrafter(dcfg, fold_hf.FoldConfig(window=64)).eval()
    drafter.bind_target(target)
    g = torch.Generator().manual_seed(0)
    return target, drafter, [(f"tiny-{c}", c, torch.randint(0, 94, (1, c), generator=g)) for c in (64, 200)]


def run_path(path: str, target, drafter, ids, new_tokens: int, sample: dict, seed: int):
    """(sequences, τ or None, ms/token) of one call on ``path``."""
    device = ids.device
    streamer = TimingStreamer(device)
    common = dict(max_new_tokens=new_tokens, streamer=streamer, **sample)
    torch.manual_seed(seed)
    tau = None
    if path == "generate":
        out = target.generate(ids, attention_mask=torch.ones_like(ids), **common)
        tau = 1.0
    elif path in ("generate+drafter", "generate+drafter[hf]"):
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter,
                              fold_fast=path == "generate+drafter", **common)
        lengths = drafter.last_acceptance_lengths
        tau = sum(lengths) / len(lengths) if lengths else None
    else:
        call = fold_hf.generate if path == "fold_hf.generate" else fast_generate
        gen = torch.Generator(device=device).manual_seed(seed)
        res = call(target, drafter, ids, return_stats=True, generator=gen, **common)
        out, tau = res.sequences, res.tau
    tpot = streamer.tpot_s()
    return out, tau, tpot * 1e3 if tpot else None


def table(rows: list[dict]) -> list[dict]:
    """Mean τ, ms/token and speedup per (sampling, path)."""
    summary = []
    for mode in ("greedy", "sampled"):
        for path in PATHS:
            sel = [r for r in rows if r["mode"] == mode and r["path"] == path and r["ms_per_token"]]
            if not sel:
                continue
            mean = lambda k: sum(r[k] for r in sel if r.get(k) is not None) / max(1, sum(r.get(k) is not None for r in sel))  # noqa: E731
            summary.append({"mode": mode, "path": path, "requests": len(sel), "tau": mean("tau"),
                            "ms_per_token": mean("ms_per_token"), "speedup_vs_generate": mean("speedup"),
                            "same_as_generate": all(r.get("same_as_generate", True) for r in sel)})
    return summary


def write(args, rows, rounds, final=False):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers

    summary = table(rows)
    payload = {"date": dt.datetime.now(dt.timezone.utc).isoformat(), "pair": args.pair,
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__, "final": final,
               "new_tokens": args.new_tokens, "temperature": args.temperature, "top_p": args.top_p,
               "table": summary, "rounds": rounds, "rows": rows}
    (out / "front_door.json").write_text(json.dumps(payload, indent=1))
    if rows:
        keys = sorted({k for r in rows for k in r})
        with open(out / "front_door.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, keys)
            writer.writeheader()
            writer.writerows(rows)
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", choices=("smollm2", "random8b", "tiny"), default="smollm2")
    parser.add_argument("--tiers", default="1024,4096", help="smollm2: prompt lengths")
    parser.add_argument("--suite", default="code", help="smollm2: bench suite of the requests")
    parser.add_argument("--per-tier", type=int, default=3)
    parser.add_argument("--contexts", default="8192,32768", help="random8b: prompt lengths")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--round-rounds", type=int, default=32, help="rounds per round_* timing")
    parser.add_argument("--max-minutes", type=float, default=9.0)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and args.pair != "tiny" else "cpu")
    target, drafter, requests = build_pair(args, device)
    log(f"{args.pair} pair on {device}; {len(requests)} requests")
    paths = [p for p in args.paths.split(",") if p]
    sampled = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p)
    modes = {"greedy": dict(do_sample=False), "sampled": sampled}
    rows, rounds = [], []
    # per-round cost, greedy vs sampled, at each request length (the captured round on CUDA)
    engine = "graphs" if device.type == "cuda" else "eager"
    for context in sorted({tier for _, tier, _ in requests}):
        for mode, sampling in (("greedy", Sampling()), ("sampled", Sampling.from_settings(**sampled, top_k=50))):
            time_rounds(target, drafter, context, 4, engine=engine, sampling=sampling)  # capture
            res = time_rounds(target, drafter, context, args.round_rounds, engine=engine, sampling=sampling)
            ms = sorted(res.round_seconds)[len(res.round_seconds) // 2] * 1e3
            rounds.append({"context": context, "mode": f"round_{mode}", "p50_ms": ms})
            log(f"round at {context}: {mode} {ms:.3f} ms (p50)")
    release_fast_state(target)
    for seed, (rid, tier, ids) in enumerate(requests):
        ids = ids.to(device)
        for mode, sample in modes.items():
            base = None
            for path in paths:
                run_path(path, target, drafter, ids, args.new_tokens, sample, seed)  # warm-up (graph capture)
                out, tau, ms = run_path(path, target, drafter, ids, args.new_tokens, sample, seed)
                row = {"request": rid, "tier": tier, "mode": mode, "path": path, "tau": tau, "ms_per_token": ms,
                       "new_tokens": out.shape[1] - ids.shape[1]}
                if path == "generate":
                    base = (out, ms)
                if base is not None and ms:
                    row["speedup"] = base[1] / ms
                    if mode == "greedy":
                        row["same_as_generate"] = bool(torch.equal(out.to(base[0].device), base[0]))
                rows.append(row)
            log(f"{rid} {mode}: " + ", ".join(f"{r['path']} {r['ms_per_token']:.2f}ms tau {r['tau'] or 0:.2f}"
                                             for r in rows if r["request"] == rid and r["mode"] == mode))
        write(args, rows, rounds)
        if time.time() - T0 > args.max_minutes * 60:
            log("time limit: stopping after this request")
            break
    summary = write(args, rows, rounds, final=True)
    print("\n| mode | path | τ | ms/token | speedup vs generate | tokens = generate |")
    print("|---|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['mode']} | {s['path']} | {s['tau']:.2f} | {s['ms_per_token']:.3f} | "
              f"{s['speedup_vs_generate']:.2f}x | {s['same_as_generate'] if s['mode'] == 'greedy' else '-'} |")
    for r in rounds:
        print(f"round {r['context']} {r['mode']}: {r['p50_ms']:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
