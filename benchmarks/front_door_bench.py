"""What users get: ms per token, τ and speedup of each way to call fold_hf, greedy and sampled.

Call paths, per request (each warmed up once on that request, so graph capture is not timed):

* ``generate``                     ``target.generate(...)``, no drafter (transformers' loop): the baseline
* ``generate+drafter``             ``target.generate(..., assistant_model=drafter)``: routed to the fast loop
* ``generate+drafter[hf]``         the same with ``fold_fast=False``: transformers' assisted loop, our drafter
* ``fold_hf.generate``             our loop over the model's own forward
* ``fast_generate``                :func:`fold_hf.generation.fast.fast_generate` called directly

each greedy and sampled (``--temperature 0.6 --top-p 0.9 --top-k 50``: Llama-3.1-8B-Instruct's generation config
with transformers' default top-k, i.e. what ``generate`` applies; every path gets the same settings and the same
global seed, so the routed call and ``fast_generate`` draw the same tokens). ms/token = decode time after the first
token / (tokens - 1), taken from a streamer's put times (the prefill is excluded on every path); ms/round = ms/token
x τ (what a path costs per verification round, independent of luck in τ); speedup = ms/token of ``generate`` with
the same sampling / the path's.

Also measured (the issue's goals, printed as ratios at the end):

* ``rounds``: :func:`~fold_hf.generation.fast.time_rounds` p50 at each context, greedy, sampled (top-k + top-p) and
  sampled top-p only (no top-k: the sorted-vocabulary filter): **sampled round / greedy round**;
* ``ops``: the token-choice work of one round alone on ``[rows, V]`` logits (each captured in a CUDA graph on the
  GPU): greedy verify, sampled processing with top-k (candidates from one topk) and without (vocabulary sort),
  the speculative verify, the drafter's pick, the draw — where a sampled round's extra time goes;
* **default generate / fast_generate** per mode (ms/token and ms/round), and whether both gave the same tokens.

Pairs: ``smollm2`` (the embedded real pair, held-out requests from ``fold_hf.bench.build_suite``; on the GPU machine
source benchmarks/gpu/env.sh first so FOLD_HF_SMOLLM2_GGUF points at the GGUF), ``random8b`` (the Llama-3.1-8B
shape with random bf16 weights and a random z-lab-shaped drafter of block ``--block``: timings only, τ ≈ 1 means
nothing), ``tiny`` (a random tiny pair on the CPU: a dry run of the script).

  . benchmarks/gpu/env.sh; python benchmarks/front_door_bench.py --pair smollm2 --out $OUT/fd-smollm2   (H200 ~3 min)
  python benchmarks/front_door_bench.py --pair random8b --out $OUT/fd-8b                               (H200 ~3 min)
  python benchmarks/front_door_bench.py --pair tiny --out /tmp/fd                                      (CPU dry run)

Writes ``front_door.json`` (machine, rows, the per-path table, rounds, ops, ratios) and ``front_door.csv`` under
``--out`` after every request, and prints the tables.
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
from fold_hf.generation import sampling as choice_ops  # noqa: E402
from fold_hf.generation.sampling import Sampling  # noqa: E402
from fold_hf.kernels import greedy_select_ops  # noqa: E402

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
        target, drafter = build_random_pair(max(contexts) + 2 * args.new_tokens + 64, block=args.block)
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
    """(sequences, τ or None, ms/token) of one call on ``path`` (torch's global seed set to ``seed`` first; every
    path draws from the default generator, so the routed call and fast_generate see the same uniforms)."""
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
        res = call(target, drafter, ids, return_stats=True, **common)
        out, tau = res.sequences, res.tau
    tpot = streamer.tpot_s()
    return out, tau, tpot * 1e3 if tpot else None


def table(rows: list[dict], paths) -> list[dict]:
    """Mean τ, ms/token, ms/round and speedup per (sampling, path)."""
    summary = []
    for mode in ("greedy", "sampled"):
        for path in paths:
            sel = [r for r in rows if r["mode"] == mode and r["path"] == path and r["ms_per_token"]]
            if not sel:
                continue

            def mean(key, sel=sel):
                vals = [r[key] for r in sel if r.get(key) is not None]
                return sum(vals) / len(vals) if vals else None

            summary.append({"mode": mode, "path": path, "requests": len(sel), "tau": mean("tau"),
                            "ms_per_token": mean("ms_per_token"), "ms_per_round": mean("ms_per_round"),
                            "speedup_vs_generate": mean("speedup"),
                            "same_as_generate": all(r.get("same_as_generate", True) for r in sel),
                            "same_as_fast_generate": all(r.get("same_as_fast", True) for r in sel)})
    return summary


def ratios(summary: list[dict], rounds: list[dict]) -> dict:
    """The issue's goals as numbers: sampled round / greedy round per context, default generate / fast_generate."""
    out = {}
    by = {(r["context"], r["mode"]): r["p50_ms"] for r in rounds}
    for context in sorted({r["context"] for r in rounds}):
        greedy = by.get((context, "round_greedy"))
        for mode in ("round_sampled", "round_sampled_top_p_only"):
            if greedy and by.get((context, mode)):
                out[f"{mode}/round_greedy@{context}"] = by[(context, mode)] / greedy
    cells = {(s["mode"], s["path"]): s for s in summary}
    for mode in ("greedy", "sampled"):
        routed, direct = cells.get((mode, "generate+drafter")), cells.get((mode, "fast_generate"))
        if routed and direct:
            out[f"{mode}: default generate / fast_generate (ms/token)"] = routed["ms_per_token"] / direct["ms_per_token"]
            if routed["ms_per_round"] and direct["ms_per_round"]:
                out[f"{mode}: default generate / fast_generate (ms/round)"] = (routed["ms_per_round"]
                                                                             / direct["ms_per_round"])
    sampled_fast, greedy_fast = cells.get(("sampled", "fast_generate")), cells.get(("greedy", "fast_generate"))
    if sampled_fast and greedy_fast and sampled_fast["ms_per_round"] and greedy_fast["ms_per_round"]:
        out["fast_generate: sampled / greedy (ms/round)"] = sampled_fast["ms_per_round"] / greedy_fast["ms_per_round"]
    return out


def time_ops(vocab: int, rows: int, device, reps: int) -> list[dict]:
    """Per-call time of the token-choice work of one round on ``[rows, vocab]`` bf16 logits (random, scaled like a
    trained model's: a few tokens stand out), each captured in a CUDA graph on the GPU (eager on the CPU)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=g) * 3).to(device=device, dtype=torch.bfloat16)
    k = rows - 1
    proposals = torch.randint(0, vocab, (k,), generator=g).to(device)
    q = torch.softmax(torch.randn(k, vocab, generator=g) * 3, -1).to(device)
    u = torch.rand(2 * k + 1, generator=g, dtype=torch.float64).to(device)
    limit = torch.full((1,), k, device=device, dtype=torch.long)
    greedy = Sampling()
    topk_p = Sampling(do_sample=True, temperature=0.6, top_k=50, top_p=0.9)
    top_p = Sampling(do_sample=True, temperature=0.6, top_p=0.9)
    probs = torch.softmax(logits.float(), -1)

    def cumsum_draw(p, uu):  # the one-level inverse CDF this session replaced (for comparison)
        cdf = p.cumsum(-1)
        return (cdf <= uu.to(cdf.dtype)[:, None] * cdf[:, -1:]).sum(-1).clamp_max(p.shape[-1] - 1)

    cases = {
        "greedy verify, torch path (process + argmax + match)": lambda: choice_ops.verify_greedy(
            choice_ops.process(logits, greedy), proposals, limit),
        # what TokenChoice.verify runs: the Triton selection kernels on CUDA (fold_hf.kernels.greedy_select_ops)
        "greedy verify (the loops' path)": lambda: greedy_select_ops(device).greedy_verify(logits, proposals, limit),
        "process sampled top-k 50 + top-p (candidates)": lambda: choice_ops.process(logits, topk_p),
        "process sampled top-p only (vocabulary sort)": lambda: choice_ops.process(logits, top_p),
        "temperature + softmax only": lambda: (logits.float() / 0.6).softmax(-1),
        "torch.topk(50)": lambda: torch.topk(logits.float(), 50, dim=-1),
        "torch.sort (full vocabulary)": lambda: torch.sort(logits.float(), dim=-1),
        "sampled verify (process + accept + residual + draw)": lambda: choice_ops.verify_sampled(
            choice_ops.process(logits, topk_p), proposals, q, u, limit),
        "drafter pick sampled (process + softmax + draw)": lambda: choice_ops.pick(logits[:k], topk_p, u[:k]),
        "drafter pick greedy": lambda: choice_ops.pick(logits[:k], greedy),
        f"draw two-level [{rows}, V]": lambda: choice_ops.draw(probs, u[:rows]),
        f"draw cumsum [{rows}, V] (previous)": lambda: cumsum_draw(probs, u[:rows]),
        "draw two-level [1, V]": lambda: choice_ops.draw(probs[:1], u[:1]),
        "draw cumsum [1, V] (previous)": lambda: cumsum_draw(probs[:1], u[:1]),
    }
    results = []
    for name, fn in cases.items():
        if device.type == "cuda":
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graph.replay()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(reps):
                graph.replay()
            torch.cuda.synchronize()
            us = (time.perf_counter() - start) / reps * 1e6
        else:
            fn()
            start = time.perf_counter()
            for _ in range(max(1, reps // 20)):
                fn()
            us = (time.perf_counter() - start) / max(1, reps // 20) * 1e6
        results.append({"op": name, "rows": rows, "vocab": vocab, "us": us})
        log(f"op {name}: {us:.1f} us")
    return results


def write(args, rows, rounds, ops, paths, final=False):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import transformers

    summary = table(rows, paths)
    payload = {"date": dt.datetime.now(dt.timezone.utc).isoformat(), "pair": args.pair, "argv": sys.argv[1:],
               "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
               "torch": torch.__version__, "transformers": transformers.__version__, "final": final,
               "new_tokens": args.new_tokens, "temperature": args.temperature, "top_p": args.top_p,
               "top_k": args.top_k, "table": summary, "rounds": rounds, "ops": ops,
               "ratios": ratios(summary, rounds), "rows": rows}
    (out / "front_door.json").write_text(json.dumps(payload, indent=1))
    if rows:
        keys = sorted({k for r in rows for k in r})
        with open(out / "front_door.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, keys)
            writer.writeheader()
            writer.writerows(rows)
    return payload


DEFAULT_PATHS = {"smollm2": "generate,generate+drafter,fold_hf.generate,fast_generate",
                 "random8b": "generate,generate+drafter,fast_generate",
                 "tiny": ",".join(PATHS)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", choices=("smollm2", "random8b", "tiny"), default="smollm2")
    parser.add_argument("--tiers", default="1024,4096", help="smollm2: prompt lengths")
    parser.add_argument("--suite", default="code", help="smollm2: bench suite of the (held-out) requests")
    parser.add_argument("--per-tier", type=int, default=2)
    parser.add_argument("--contexts", default="8192", help="random8b: prompt lengths")
    parser.add_argument("--block", type=int, default=16, help="random8b: drafter block size (rows = block + 1)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--top-k", type=int, default=50, help="sampled requests' top-k (transformers' default)")
    parser.add_argument("--paths", default=None, help=f"comma list of {PATHS} (default per pair)")
    parser.add_argument("--round-rounds", type=int, default=48, help="rounds per round_* timing")
    parser.add_argument("--op-reps", type=int, default=200, help="replays per ops timing")
    parser.add_argument("--max-minutes", type=float, default=2.6, help="stop starting requests after this")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and args.pair != "tiny" else "cpu")
    target, drafter, requests = build_pair(args, device)
    log(f"{args.pair} pair on {device}; {len(requests)} requests")
    paths = [p for p in (args.paths or DEFAULT_PATHS[args.pair]).split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}; choose from {PATHS}")
    sampled = dict(do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    modes = {"greedy": dict(do_sample=False), "sampled": sampled}
    rows, rounds = [], []
    vocab = target.config.vocab_size
    ops = time_ops(vocab, drafter.block_size + 1, device, args.op_reps)
    # per-round cost, greedy vs sampled, at each request length (the captured round on CUDA)
    engine = "graphs" if device.type == "cuda" else "eager"
    round_modes = (("greedy", Sampling()), ("sampled", Sampling.from_settings(**sampled)),
                   ("sampled_top_p_only", Sampling.from_settings(do_sample=True, temperature=args.temperature,
                                                                  top_p=args.top_p)))
    for context in sorted({tier for _, tier, _ in requests}):
        for mode, sampling in round_modes:
            time_rounds(target, drafter, context, 4, engine=engine, sampling=sampling)  # capture
            res = time_rounds(target, drafter, context, args.round_rounds, engine=engine, sampling=sampling)
            ms = sorted(res.round_seconds)[len(res.round_seconds) // 2] * 1e3
            rounds.append({"context": context, "mode": f"round_{mode}", "p50_ms": ms})
            log(f"round at {context}: {mode} {ms:.3f} ms (p50)")
    release_fast_state(target)
    for seed, (rid, tier, ids) in enumerate(requests):
        ids = ids.to(device)
        for mode, sample in modes.items():
            base, outs = None, {}
            for path in paths:
                run_path(path, target, drafter, ids, args.new_tokens, sample, seed)  # warm-up (graph capture)
                out, tau, ms = run_path(path, target, drafter, ids, args.new_tokens, sample, seed)
                row = {"request": rid, "tier": tier, "mode": mode, "path": path, "tau": tau, "ms_per_token": ms,
                       "ms_per_round": ms * tau if ms and tau else None, "new_tokens": out.shape[1] - ids.shape[1]}
                if path == "generate":
                    base = (out, ms)
                outs[path] = out
                if base is not None and ms:
                    row["speedup"] = base[1] / ms
                    if mode == "greedy":
                        row["same_as_generate"] = bool(torch.equal(out.to(base[0].device), base[0]))
                rows.append(row)
            if "generate+drafter" in outs and "fast_generate" in outs:  # same seed, same settings: same tokens
                routed = next(r for r in rows[::-1] if r["request"] == rid and r["mode"] == mode
                              and r["path"] == "generate+drafter")
                routed["same_as_fast"] = bool(torch.equal(outs["generate+drafter"], outs["fast_generate"]))
            log(f"{rid} {mode}: " + ", ".join(f"{r['path']} {r['ms_per_token']:.2f}ms tau {r['tau'] or 0:.2f}"
                                             for r in rows if r["request"] == rid and r["mode"] == mode))
        write(args, rows, rounds, ops, paths)
        if time.time() - T0 > args.max_minutes * 60:
            log("time limit: stopping after this request")
            break
    payload = write(args, rows, rounds, ops, paths, final=True)
    print("\n| mode | path | τ | ms/token | ms/round | speedup vs generate | tokens = generate |")
    print("|---|---|---|---|---|---|---|")
    for s in payload["table"]:
        per_round = f"{s['ms_per_round']:.3f}" if s["ms_per_round"] else "-"
        speedup = f"{s['speedup_vs_generate']:.2f}x" if s["speedup_vs_generate"] else "-"
        print(f"| {s['mode']} | {s['path']} | {s['tau']:.2f} | {s['ms_per_token']:.3f} | {per_round} | "
              f"{speedup} | {s['same_as_generate'] if s['mode'] == 'greedy' else '-'} |")
    for r in rounds:
        print(f"round {r['context']} {r['mode']}: {r['p50_ms']:.3f} ms")
    print("\n| op (one round's token choice) | rows x V | us |")
    print("|---|---|---|")
    for o in ops:
        print(f"| {o['op']} | {o['rows']} x {o['vocab']} | {o['us']:.1f} |")
    print()
    for name, value in payload["ratios"].items():
        print(f"RATIO {name}: {value:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
