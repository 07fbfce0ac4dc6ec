"""What one round of a real pair costs at B = 1, method by method (issue 38: the Gemma-3 pair's FOLD speedup is
round-cost-limited as much as τ-limited).

The pair's target and committed drafter (``fold_hf.pairs.load_pair``, bf16 on the GPU), the graphs engine, rounds
timed from a context of T tokens already in the caches (:func:`fold_hf.generation.fast.time_rounds`: no prefill,
acceptance meaningless, the round's cost is what is timed). Rows per context and method (``ar`` and the
:func:`fold_hf.bench.methods.default_methods` names: ``dflash``, ``fold-a2``, ``window``, ...):

* ``round_ms`` p20 / p50 / p80 of the round's wall time (AR: one step), and ``over_ar`` = p50 / AR's p50 at that
  context: the break-even τ of the method (a method with mean τ above it is faster than AR per token);
* ``floor_ms``: the bytes a round must read (target weights once, the tied embedding once as the lm_head, the
  target's KV: every full-attention layer's T entries, every sliding layer's window; for a drafting method the
  drafter's own weights, the lm_head read again for its logits and the entries its read plan touches: T for
  ``fold``/``dflash``/``rerope``/``yarn``, W for ``window``) over the copy bandwidth measured in this run;
* with ``--profile-context`` (default the last context): the static engine's kernels of a few rounds under
  ``torch.profiler`` per method (``profile_<method>.txt``: launches per round, summed device time, top kernels),
  so the gap between ``round_ms`` and the summed kernel time is the launches' share.

Writes ``pair_rounds.json`` and ``pair_rounds.csv`` under ``--out``.

    python benchmarks/pair_rounds_bench.py --pair gemma3-270m --out $OUT/rounds          (about a minute, one GPU)
    python benchmarks/pair_rounds_bench.py --pair gemma3-270m --random-target --out $OUT/rounds
                                   (no GGUF staged: the target's architecture with random bf16 weights; the round's
                                    cost does not depend on the weights' values)
    python benchmarks/pair_rounds_bench.py --dry-run --out /tmp/pr                        (CPU, the embedded pair)
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batched_anatomy import file_name  # noqa: E402
from kernel_bench import measure_bandwidth, percentiles  # noqa: E402
from last_mile_bench import env_var  # noqa: E402

from fold_hf.modeling.draft_vocab import DraftVocab  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def target_bytes(target, context: int) -> int:
    """Bytes an AR step of ``target`` reads at best at ``context``: every parameter once (a tied embedding counts
    once, as the lm_head) plus the KV entries each layer attends to (sliding layers: their window)."""
    weights = sum(p.numel() * p.element_size() for p in target.parameters())  # a tied weight is yielded once
    cfg = getattr(target.config, "text_config", target.config)
    layers = cfg.num_hidden_layers
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * layers
    window = getattr(cfg, "sliding_window", None) or context
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_entry = 2 * cfg.num_key_value_heads * head_dim * next(target.parameters()).element_size()
    kv = sum(per_entry * (min(window, context) if t == "sliding_attention" else context) for t in types)
    return weights + kv


def drafter_bytes(drafter, target, context: int, mode: str, window: int) -> int:
    """Bytes a drafter forward adds: its own weights, the lm_head again, and the cached entries its read touches."""
    shared = {id(p) for p in target.parameters()}
    own = sum(p.numel() * p.element_size() for p in drafter.parameters() if id(p) not in shared)
    head = target.get_output_embeddings().weight
    cfg = drafter.config
    per_entry = 2 * cfg.num_key_value_heads * cfg.head_dim * head.element_size() * cfg.num_hidden_layers
    entries = min(window, context) if mode in ("window", "streaming", "cmr", "infllm") else context
    # the proposals read the head's rows of the draft vocabulary only, when the drafter has one
    rows = head.shape[0] if drafter.draft_vocab is None else len(drafter.draft_vocab)
    return own + rows * head.shape[1] * head.element_size() + per_entry * entries


# The Gemma-3-270M GGUF's configuration as transformers 5.25 reads it (``AutoConfig.from_pretrained(dir,
# gguf_file=...)``), for --random-target: no GGUF needed on the GPU machine to time rounds
GEMMA3_270M_CONFIG = dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=32768,
    rms_norm_eps=1e-6, query_pre_attn_scalar=256, sliding_window=512, tie_word_embeddings=True,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
    bos_token_id=2, eos_token_id=1, pad_token_id=0)


def random_pair(key: str, device, drafter_dir=None):
    """``(target, None, drafter)``: the pair's target architecture with random bf16 weights made on ``device``, and
    its committed drafter (real weights) bound to it."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from fold_hf.modeling import FoldDrafter
    from fold_hf.pairs import get_pair

    if key != "gemma3-270m":
        raise SystemExit(f"--random-target knows gemma3-270m's configuration only, not {key}")
    cfg = Gemma3TextConfig(**GEMMA3_270M_CONFIG)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        target = Gemma3ForCausalLM._from_config(cfg, dtype=torch.bfloat16).eval()
    target.generation_config.eos_token_id = None
    drafter = FoldDrafter.from_pretrained(drafter_dir or get_pair(key).drafter_dir, dtype=torch.bfloat16,
                                          device=device)
    drafter.bind_target(target)
    return target, None, drafter


def bench_window(key: str | None, drafter) -> int:
    """The W ``fold-hf bench`` reads with for the pair ``key`` (its CLI default), else the drafter's own."""
    from fold_hf.pairs import PAIRS

    pair = PAIRS.get(key) if key else None
    return int(pair.cli_defaults.get("bench", {}).get("window") or drafter.fold_config.window) if pair else int(
        drafter.fold_config.window)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="gemma3-270m")
    parser.add_argument("--drafter", help="a drafter folder (default the pair's committed one)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 32704])
    parser.add_argument("--methods", nargs="+", default=["ar", "dflash", "fold-a2", "window"])
    parser.add_argument("--window", type=int,
                        help="W of the reading modes (default: the pair's `fold-hf bench` default, Gemma 512; the "
                             "drafter's saved FoldConfig for the embedded pair)")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile-context", type=int, help="default the last of --contexts; 0: no profile")
    parser.add_argument("--variants", nargs="*", default=[],
                        help="ENV=VALUE settings to time each method under besides the default, in this process "
                             "(e.g. FOLD_HF_SPLIT_RULE=flat: the read splits before 2026-12-06); rows named "
                             "method[ENV=VALUE]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--random-target", action="store_true",
                        help="the target's architecture with random weights (no GGUF; gemma3-270m)")
    parser.add_argument("--draft-vocab", metavar="FILE",
                        help="also time every method with the drafter proposing from this draft vocabulary "
                             "(rows named METHOD[draft_vocab]; benchmarks/build_draft_vocab.py)")
    parser.add_argument("--dry-run", action="store_true", help="the embedded pair on the CPU, static engine")
    args = parser.parse_args(argv)

    from fold_hf.bench.methods import default_methods
    from fold_hf.generation.fast import release_fast_state
    from fold_hf.pairs import load_pair

    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    engine = "graphs" if cuda else "static"
    if args.dry_run:
        args.contexts, args.rounds, args.repeats = [128, 256], 3, 1
        target, _, drafter = load_pair(None, device=device, drafter_dir=args.drafter)
        pair = "embedded"
    elif args.random_target:
        target, _, drafter = random_pair(args.pair, device, args.drafter)
        pair = f"{args.pair} (random target weights)"
    else:
        target, _, drafter = load_pair(args.pair, device=device, drafter_dir=args.drafter)
        pair = args.pair
    window = args.window or bench_window(args.pair if not args.dry_run else None, drafter)
    known = {m.name: m.config for m in default_methods(window, drafter.fold_config.train_length)}
    unknown = [m for m in args.methods if m not in known]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {sorted(known)}")
    profile_context = args.contexts[-1] if args.profile_context is None else args.profile_context
    bandwidth = measure_bandwidth(device) if cuda else float("nan")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"pair": pair, "device": torch.cuda.get_device_name() if cuda else "cpu", "engine": engine,
              "torch": torch.__version__, "copy_bandwidth_gbs": round(bandwidth / 1e9, 1),
              "block_size": drafter.block_size, "window": window, "rows": []}
    log(f"{pair} on {report['device']}, copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    for variant in args.variants:
        if "=" not in variant:
            parser.error(f"--variants takes ENV=VALUE, got {variant!r}")
    settings = [None] + list(args.variants) + (["draft_vocab"] if args.draft_vocab else [])
    vocab = DraftVocab.load(args.draft_vocab) if args.draft_vocab else None
    if vocab is not None:
        report["draft_vocab"] = repr(vocab)
    for context, setting, name in itertools.product(args.contexts, settings, args.methods):
        label = name if setting is None else f"{name}[{setting}]"
        drafter.use_draft_vocab(vocab if setting == "draft_vocab" else None)
        with env_var(dict([setting.split("=", 1)]) if setting and "=" in setting else {}):
            row = time_method(target, drafter, known[name], label, context, args, engine, bandwidth, cuda,
                              out if context == profile_context else None)
        ar = [r for r in report["rows"] if r["context"] == context and r["method"] == ("ar" if setting is None
                                                                                      else f"ar[{setting}]")]
        row["over_ar"] = round(row["round_ms_p50"] / ar[0]["round_ms_p50"], 4) if ar else None
        report["rows"].append(row)
        log(json.dumps(row))
    release_fast_state(target)
    drafter.use_draft_vocab(None)
    (out / "pair_rounds.json").write_text(json.dumps(report, indent=1))
    with (out / "pair_rounds.csv").open("w", newline="") as fh:
        fields = list(dict.fromkeys(k for r in report["rows"] for k in r))
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(report["rows"])
    return report


def time_method(target, drafter, config, label: str, context: int, args, engine: str, bandwidth: float, cuda: bool,
                profile_dir: Path | None) -> dict:
    """One row (named ``label``): the method's rounds at ``context`` (captured afresh), their percentiles and floor, and with
    ``profile_dir`` the static engine's kernels."""
    from fold_hf.generation.fast import release_fast_state, time_rounds
    from step_profile import profile_rounds

    d = None
    if config is not None:
        drafter.set_fold_config(config)
        d = drafter
    release_fast_state(target)  # the runners resolve their kernels (and the split rule) again
    time_rounds(target, d, context, args.rounds, engine=engine)  # captures
    seconds = []
    for _ in range(args.repeats):
        seconds += time_rounds(target, d, context, args.rounds, engine=engine).round_seconds[1:]
    p20, p50, p80 = percentiles(seconds)  # seconds in, milliseconds out
    floor = target_bytes(target, context)
    if d is not None:
        floor += drafter_bytes(drafter, target, context, config.mode, config.window)
    row = {"context": context, "method": label, "round_ms_p20": round(p20, 4), "round_ms_p50": round(p50, 4),
           "round_ms_p80": round(p80, 4), "floor_ms": round(1e3 * floor / bandwidth, 4) if cuda else None,
           "over_floor": round(p50 / (1e3 * floor / bandwidth), 3) if cuda else None}
    if profile_dir is not None:
        summary = profile_rounds(target, d, context, profile_dir, f"profile_{file_name(row['method'])}", rounds=4)
        row["launches_per_round"] = round(summary["launches_per_round"], 1)
        row["kernel_ms_per_round"] = round(summary["device_us_per_round"] / 1e3, 4)
    return row



if __name__ == "__main__":
    main()
