"""`fold-hf`: demo, bench, summarize, doctor, draft-vocab and train-drafter, on the embedded pair (SmolLM2-135M-Instruct + its
DFlash drafter) unless told otherwise.

torch and transformers are imported inside the commands, so ``fold-hf --help`` answers at once."""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .commands import DTYPES, CliError, cmd_bench, cmd_demo, cmd_doctor, cmd_draft_vocab, cmd_summarize, cmd_train
from .embedded import DEMO_TRAIN_LENGTH, DEMO_WINDOW

__all__ = ["CliError", "build_parser", "main"]


def _parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard must be i/n (e.g. 0/2), got {text!r}") from None
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard i/n needs 0 <= i < n, got {text!r}")
    return index, count


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
    """Every method ``fold-hf bench`` runs (:func:`fold_hf.bench.methods.method_names`; new modes appear here)."""
    from .bench.methods import method_names

    return method_names()


def bench_method_choices() -> tuple[str, ...]:
    """What ``--methods`` accepts: every method and the reading modes' names as aliases (``fold`` -> ``fold-a2``)."""
    from .bench.methods import method_choices

    return method_choices()


def _bench_suites() -> tuple[str, ...]:
    from .bench.suites import SUITES

    return tuple(SUITES)


def _bench_engines() -> tuple[str, ...]:
    from .bench.methods import BENCH_ENGINES

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
    demo.add_argument("--repeats", type=int, default=3,
                      help="timed runs of each method (after a warm-up), interleaved; medians and min-max are shown")
    demo.add_argument("--draft-vocab", metavar="FILE",
                      help="also run FOLD with the drafter proposing only from this draft vocabulary "
                           "(draft_vocab.json: fold-hf draft-vocab); outputs stay equal to AR")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="τ and speedup of every reading mode vs AR by input length",
                           description="AR and every reading mode on the same real requests (greedy, batch 1); "
                                       "appends per request to OUT/run/runs.jsonl (resumable), writes summary.json, "
                                       "summary.csv and plots.")
    bench.add_argument("--out", metavar="DIR",
                       help="results folder (default: ./fold-hf-bench/<date>-<machine>, printed at the start)")
    bench.add_argument("--device", help="cpu, cuda, ... (default: cuda when present, else cpu)")
    bench.add_argument("--drafter", metavar="DIR", help="drafter directory (default: the embedded one)")
    bench.add_argument("--draft-vocab", metavar="FILE",
                       help="every drafting method proposes only from this draft vocabulary (draft_vocab.json: "
                            "fold-hf draft-vocab); outputs are unchanged, τ and the round's cost may move")
    bench.add_argument("--requests", metavar="FILE", help="requests JSONL (default: OUT/requests.jsonl, built when "
                                                          "missing)")
    bench.add_argument("--build-only", action="store_true", help="only build the requests file, then stop")
    bench.add_argument("--suites", nargs="+", default=["code", "books", "retrieval"], metavar="SUITE",
                       choices=_LazyChoices(_bench_suites), help="request suites, any of: %(choices)s")
    bench.add_argument("--tiers", type=int, nargs="+", default=[1024, 2048, 4096, 8192], metavar="TOKENS",
                       help="input lengths")
    bench.add_argument("--per-tier", type=int, default=8, help="requests per suite and input length")
    bench.add_argument("--mixed-per-tier", type=int, default=48,
                       help="requests per input length of the mixed suite, taken over its six kinds in turn")
    bench.add_argument("--nested", action="store_true",
                       help="every tier's request k is a suffix of one input built at the longest tier (same text, "
                            "same continuation point), so tiers differ in length only")
    bench.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    bench.add_argument("--window", type=int, default=DEMO_WINDOW, help="window W of every windowed mode")
    bench.add_argument("--train-length", type=int, default=DEMO_TRAIN_LENGTH,
                       help="the drafter's training length R (yarn, rerope)")
    bench.add_argument("--budget", type=int, help="entries streaming and cmr keep (default: 2048, the paper's B.3)")
    bench.add_argument("--methods", nargs="+", metavar="METHOD", choices=_LazyChoices(bench_method_choices),
                       help="methods to run (AR always runs), any of: %(choices)s; a mode's name runs its method "
                            "(fold: fold-a2) (default: all)")
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
    bench.add_argument("--exact", action="store_true",
                       help="exact mode (docs/exact-mode.md; --engine fast, CUDA): AR and every method with the "
                            "row-count-invariant kernels, so differ_from_ar counts outputs that differ from exact AR "
                            "(its guarantee: none, bf16 included)")
    _add_pair_option(bench)
    bench.add_argument("--window-sweep", type=int, nargs="+", metavar="W",
                       help="instead of every method: FOLD (alpha 2) and the window-only ablation at each window W "
                            "(methods fold-a2-wW, window-wW)")
    bench.set_defaults(func=cmd_bench)

    dv = sub.add_parser("draft-vocab", help="build a draft vocabulary (the most frequent tokens of your texts)",
                        description="Count the tokens a tokenizer gives your texts and keep the most frequent ids (plus "
                                    "end-of-sequence) as a draft vocabulary: a drafter proposing only from it reads "
                                    "that many rows of the lm_head instead of all (FR-Spec). Writes OUT/draft_vocab.json "
                                    "(OUT/draft_vocab-<N>.json for several sizes) and OUT/coverage.csv.")
    dv.add_argument("--texts", nargs="+", metavar="PATH", required=True,
                    help="files, folders (walked; files with --extensions) and .jsonl[.gz] files of {\"text\": ...}")
    dv.add_argument("--out", required=True, metavar="DIR", help="the folder for the files (made if missing)")
    dv.add_argument("--size", type=int, nargs="+", default=[32768], metavar="N", help="ids to keep")
    dv.add_argument("--tokenizer", metavar="DIR", help="a tokenizer or model folder, or a Hub id (AutoTokenizer)")
    dv.add_argument("--pair", choices=("smollm2-135m", "gemma3-270m"),
                    help="a GGUF pair's tokenizer instead (default: the embedded smollm2-135m)")
    dv.add_argument("--vocab-size", type=int, metavar="V",
                    help="the target's lm_head rows (default: the vocab_size of --tokenizer's model config where "
                         "it has one, else the tokenizer's length)")
    dv.add_argument("--held-out", nargs="+", metavar="PATH",
                    help="texts not counted, on which to report the coverage (the share of their tokens kept)")
    dv.add_argument("--extensions", nargs="+", metavar="EXT",
                    help="the suffixes of a folder's files to read (default: common text and code suffixes; * all)")
    dv.set_defaults(func=cmd_draft_vocab)

    summ = sub.add_parser("summarize", help="merge the runs.jsonl of a results folder into the tables and plots")
    summ.add_argument("out", metavar="DIR", help="results folder holding runs.jsonl or */runs.jsonl")
    summ.add_argument("--title", default="", help="plot title")
    summ.add_argument("--focus", metavar="METHOD",
                      help="method compared request by request with the others (default: fold-a2)")
    summ.add_argument("--headline", metavar="PREFIX",
                      help="add the flat keys PREFIX_tau_4k_dflash, PREFIX_fold_tau_32k, PREFIX_fold_speedup_32k, "
                           "PREFIX_fold_minus_window_tau_32k (each with _ci_low/_ci_high) to summary.json")
    summ.add_argument("--headline-into", metavar="JSON",
                      help="also merge those keys into this flat JSON (benchmarks/results/latest/summary.json)")
    summ.set_defaults(func=cmd_summarize)

    doctor = sub.add_parser("doctor", help="check a target-drafter pair and a FoldConfig; print what would run",
                            description="Checks a pair and a FoldConfig with the target built on the meta device from "
                                        "its config (no target weights are loaded) and says what would run.")
    doctor.add_argument("--drafter", metavar="DIR", help="drafter directory (default: the embedded one)")
    doctor.add_argument("--target-config", metavar="DIR",
                        help="a target's config directory, checked on the meta device without weights "
                             "(default: the embedded SmolLM2 target)")
    doctor.add_argument("--config", metavar="NAME",
                        help="FoldConfig: preset name, directory, file or Hub repo id (default: the drafter's)")
    doctor.add_argument("--context", type=int,
                        help="context length to describe the plan at (default: 4 x (W + B))")
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
    train.add_argument("--time-budget", type=float, metavar="MINUTES",
                       help="fit the step count (at most --steps) into this many minutes of training over all "
                            "resumed calls, measured on the first steps, so the schedule and held-out τ finish")
    train.add_argument("--generate-only", action="store_true",
                       help="generate OUT/data.pt (--sequences continuations, windows drawn with --seed) and stop")
    train.add_argument("--data", nargs="+", metavar="DATA_PT",
                       help="train on these data.pt files (one per GPU from --generate-only) instead of generating")
    train.add_argument("--sources", choices=("classic", "mix"), default="classic",
                       help="windows of: classic = stdlib + even-numbered plays (the committed drafters' data); mix = "
                            "the training side of the broad data mix (fold_hf.data.mix: seven kinds of text)")
    train.add_argument("--mix-file", metavar="JSONL_GZ",
                       help="--sources mix: the staged mix (`python -m fold_hf.data.mix export`); without it the mix "
                            "is gathered from this machine")
    train.add_argument("--mix-weights", metavar="KIND=W,...",
                       help="--sources mix: window weight per kind (kinds not named get 0; default "
                            "python=1,c=1,code-other=0.5,markup=1,structured=0.75,logs=0.75,prose=1.5)")
    train.add_argument("--kl", type=float, default=0.0,
                       help="weight of the distillation term, KL(target || drafter) per block slot, added to the CE")
    train.add_argument("--position-span", type=int, metavar="N",
                       help="spread each window's rope positions over N (PoSE: one random cut, the rest moved by a "
                            "random skip), so the drafter sees distances up to N-1 while reading at most "
                            "--prompt-tokens + --new-tokens tokens (default: true positions)")
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
