"""Decode cost of a Qwen3.5 (hybrid linear-attention) target on the fast loop, next to Llama-3.1-8B (GPU).

Random bf16 weights made on the GPU, paper shapes (acceptance of random weights means nothing, so rounds are
timed, not requests, by :func:`fold_hf.generation.fast.time_rounds`: the caches hold T entries, no prefill):

* ``qwen35_9b``: Qwen3.5-9B text shape (32 layers: 24 Gated DeltaNet + 8 full attention, hidden 4096, MLP 12288,
  16 / 4 heads of 256 with partial rope 0.25, linear 16 key / 32 value heads of 128, conv 4, vocab 248,320) with
  a z-lab Qwen3.5-9B-DFlash drafter shape (6 layers: 5 sliding-window of ``--sliding-window`` + 1 full, 16 / 4
  heads of 256, rotary 64, block 16, 5 taps; an assumption, as in ``kernel_bench.py``), W = 4096 (the preset);
* ``llama31_8b``: the Llama-3.1-8B shape and its z-lab drafter shape of ``e2e_bench.py`` (block 10), W = 2048.

Rows per pair and context (8K / 32K / 128K): ``our_ar`` (our AR step, graphs engine), ``our_sd_dflash`` and
``our_sd_fold`` (our captured speculative round), and ``floor`` = (weights read per step + KV bytes at T +
linear-attention state read and written) / the copy bandwidth measured in this run. The headline gives, per
pair and context, AR / floor and SD round / AR (the issue's goals: AR <= 1.5x the floor, SD round <= 1.3x AR at
32K). Writes ``hybrid.csv`` (gpu, versions, date, pair, row, context, p20/p50/p80 ms, peak GiB) and
``hybrid.json`` under ``--out``.

GPU (repo root; about 5-7 minutes on an H200):   python benchmarks/hybrid_bench.py --out $OUT/hybrid
Quick re-measure of Qwen3.5 at 32K with the fused layers, the module path's AR step and a top-kernel table
(about a minute):   python benchmarks/hybrid_bench.py --pairs qwen35_9b --contexts 32768 --rounds 24 --repeats 2
                        --modules-row --profile --out $OUT/hybrid
With a draft vocabulary (``--draft-vocab-size 32768``: each SD row again with the drafter proposing from 32,768 of
the head's rows, ``fold_hf.DraftVocab``; evenly spaced ids, since with random weights only their number matters to the
timing; the round's floor counts those rows): rows ``our_sd_<mode>_dv``, keys ``<pair>_sd_<mode>_dv_over_ar_<T>``.
CPU dry run (tiny shapes, static engine, no timing meaning; seconds):   python benchmarks/hybrid_bench.py --dry-run
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

from e2e_bench import build_random_pair, copy_bandwidth, machine, path_environment, percentiles  # noqa: E402

from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig  # noqa: E402
from fold_hf.modeling.draft_vocab import DraftVocab  # noqa: E402
from fold_hf.generation.fast import release_fast_state, time_rounds  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def qwen35_config(tiny: bool, max_positions: int):
    from transformers import Qwen3_5TextConfig

    if tiny:
        shape = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                     linear_key_head_dim=8, linear_value_head_dim=8)
    else:
        shape = dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                     num_attention_heads=16, num_key_value_heads=4, head_dim=256, linear_num_key_heads=16,
                     linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128)
    return Qwen3_5TextConfig(**shape, linear_conv_kernel_dim=4, max_position_embeddings=max_positions,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                              "partial_rotary_factor": 0.25},
                             tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def build_qwen35_pair(tiny: bool, max_positions: int, sliding_window: int, device: str):
    from transformers import Qwen3_5ForCausalLM

    cfg = qwen35_config(tiny, max_positions)
    dtype = torch.float32 if tiny else torch.bfloat16
    L = cfg.num_hidden_layers
    taps = [1, 3, 5] if tiny else [1, 8, 15, 22, 29]
    dshape = (dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
              if tiny else dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=16,
                                num_key_value_heads=4, head_dim=256))
    with torch.device(device):
        target = Qwen3_5ForCausalLM._from_config(cfg, dtype=dtype).eval()
        target.generation_config.eos_token_id = None
        dcfg = FoldDrafterConfig(block_size=4 if tiny else 16, num_target_layers=L, target_layer_ids=taps,
                                 mask_token_id=cfg.vocab_size - 1, vocab_size=cfg.vocab_size, num_hidden_layers=6,
                                 layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                 sliding_window=sliding_window, use_sliding_window=True,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                  "partial_rotary_factor": 0.25},
                                 max_position_embeddings=max_positions, **dshape)
        drafter = FoldDrafter(dcfg, FoldConfig(mode="dflash")).to(dtype).eval()
    drafter.bind_target(target)
    return target, drafter


def floor_bytes(target, context: int) -> int:
    """Bytes one AR step must read: weights except the embedding, the KV of the full-attention layers at T, and
    every linear layer's recurrent + conv state read and written."""
    cfg = target.config
    embed = target.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in target.parameters()) - embed.numel() * embed.element_size()
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n_full = sum(t == "full_attention" for t in types)
    kv = n_full * 2 * cfg.num_key_value_heads * head_dim * embed.element_size() * context
    n_linear = len(types) - n_full
    state = 0
    if n_linear:
        rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim * 4
        conv = (2 * cfg.linear_num_key_heads * cfg.linear_key_head_dim
                + cfg.linear_num_value_heads * cfg.linear_value_head_dim) * (cfg.linear_conv_kernel_dim - 1)
        state = n_linear * 2 * (rec + conv * embed.element_size())
    return weights + kv + state


def round_floor_bytes(target, drafter, config: FoldConfig, context: int) -> int:
    """Bytes one speculative round must read: :func:`floor_bytes` plus the drafter's own weights (not the embedding
    and ``lm_head`` it shares), the target's ``lm_head`` once more (the drafts' logits), the drafter's context
    cache where each layer reads it in ``config``'s mode (a full-attention layer all ``context`` entries; a sliding
    layer its window, or all entries where a far memory is read: ``fold`` / ``rerope`` with ``layers="all"``).
    Nothing for the verify's block rows beyond the AR step's (their KV writes are kilobytes) nor for a hybrid
    target's rollback (a round can read and write each recurrent state once, as the AR step does; ours reads it
    once more in the commit, 50 MB at the 9B shape). With a draft vocabulary (``drafter.draft_vocab``) the drafts'
    logits read its ``V'`` rows of the head instead of all ``V``."""
    dcfg = drafter.config
    head = target.get_output_embeddings().weight
    shared = {id(target.get_input_embeddings().weight), id(head)}
    own = sum(p.numel() * p.element_size() for p in drafter.parameters() if id(p) not in shared)
    elem = head.element_size()
    head_rows = head.shape[0] if drafter.draft_vocab is None else len(drafter.draft_vocab)
    types = getattr(dcfg, "layer_types", None) or ["full_attention"] * dcfg.num_hidden_layers
    window = getattr(dcfg, "sliding_window", None) or context
    far_everywhere = config.mode in ("fold", "rerope") and getattr(config, "layers", "all") == "all"
    head_dim = getattr(dcfg, "head_dim", None) or dcfg.hidden_size // dcfg.num_attention_heads
    entries = sum(context if t == "full_attention" or far_everywhere else min(window, context) for t in types)
    cache = entries * 2 * dcfg.num_key_value_heads * head_dim * elem
    return floor_bytes(target, context) + own + head_rows * head.shape[1] * elem + cache


def timed(target, drafter, context: int, rounds: int, repeats: int, engine: str, fused_layers=None) -> list[float]:
    """Round wall times (s) after a capturing call; [] (and the traceback logged) if the rows fail, so that one
    broken configuration does not hide the others' numbers."""
    try:
        return _timed(target, drafter, context, rounds, repeats, engine, fused_layers)
    except Exception:
        import traceback

        log("FAILED row:\n" + traceback.format_exc())
        release_fast_state(target)
        return []


def _timed(target, drafter, context: int, rounds: int, repeats: int, engine: str, fused_layers=None) -> list[float]:
    time_rounds(target, drafter, context, rounds, engine=engine, fused_layers=fused_layers)  # captures the graphs
    seconds: list[float] = []
    for _ in range(repeats):
        seconds += time_rounds(target, drafter, context, rounds, engine=engine,
                               fused_layers=fused_layers).round_seconds[1:]
    return seconds


def run(args) -> dict:
    device = "cpu" if args.dry_run else "cuda"
    engine = "static" if args.dry_run else "graphs"
    contexts = [int(c) for c in args.contexts.split(",")]
    bandwidth = copy_bandwidth() if device == "cuda" else float("nan")
    log(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    rows: list[dict] = []
    result_profiles: list[dict] = []
    max_positions = max(contexts) + 4096
    pairs = [p for p in args.pairs.split(",") if p]
    for pair in pairs:
        if pair == "qwen35_9b":
            target, drafter = build_qwen35_pair(args.dry_run, max_positions, args.sliding_window, device)
            window = args.qwen_window
        elif pair == "llama31_8b":
            if args.dry_run:
                log("llama31_8b: skipped in the dry run (e2e_bench.py builds it on the GPU only)")
                continue
            target, drafter = build_random_pair(max_positions)
            window = args.llama_window
        else:
            raise SystemExit(f"--pairs: unknown {pair!r} (qwen35_9b, llama31_8b)")
        log(f"{pair}: random target and drafter built on {device}")
        modes = {"dflash": FoldConfig(mode="dflash"), "fold": FoldConfig(mode="fold", window=window, alpha=2.0)}
        modes = {m: c for m, c in modes.items() if m in args.sd_modes.split(",")}
        draft_vocab = None
        if args.draft_vocab_size:  # random weights: which ids does not matter to the timing, only how many
            vocab_size = target.get_output_embeddings().weight.shape[0]
            if not 0 < args.draft_vocab_size < vocab_size:
                raise SystemExit(f"--draft-vocab-size must lie in (0, {vocab_size}), got {args.draft_vocab_size}")
            ids = torch.linspace(0, vocab_size - 1, args.draft_vocab_size).round().long().unique()
            draft_vocab = DraftVocab(ids, vocab_size, source="evenly spaced ids: a timing stand-in")
            log(f"{pair}: SD rows also with {draft_vocab!r} (rows our_sd_<mode>_dv)")

        def add(name: str, context: int, seconds: list[float]) -> None:
            peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
            row = {"pair": pair, "row": name, "context": context, **percentiles(seconds), "peak_gib": peak}
            rows.append(row)
            p50 = row["p50_ms"]
            log(f"{pair} {name:>14} @ {context:>6}: p50 {p50 if p50 is None else round(p50, 3)} ms")
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()

        for context in contexts:
            floor_ms = floor_bytes(target, context) / bandwidth * 1e3
            rows.append({"pair": pair, "row": "floor", "context": context, "p20_ms": floor_ms, "p50_ms": floor_ms,
                         "p80_ms": floor_ms, "n": 1, "peak_gib": None})
            for mode, cfg in modes.items():
                drafter.set_fold_config(cfg)
                for suffix, vocab in (("", None), ("_dv", draft_vocab)):
                    if suffix and vocab is None:
                        continue
                    drafter.use_draft_vocab(vocab)
                    add(f"our_sd_{mode}{suffix}", context,
                        timed(target, drafter, context, args.rounds, args.repeats, engine))
                    sd_floor = round_floor_bytes(target, drafter, cfg, context) / bandwidth * 1e3
                    rows.append({"pair": pair, "row": f"floor_sd_{mode}{suffix}", "context": context,
                                 "p20_ms": sd_floor, "p50_ms": sd_floor, "p80_ms": sd_floor, "n": 1, "peak_gib": None})
                drafter.use_draft_vocab(None)
            add("our_ar", context, timed(target, None, context, args.rounds, args.repeats, engine))
            if args.modules_row and pair == "qwen35_9b":  # the same AR step through the model's modules
                release_fast_state(target)
                add("our_ar_modules", context, timed(target, None, context, args.rounds, args.repeats, engine,
                                                     fused_layers=False))
            if args.separate_row:  # the fused AR step with each projection its own cuBLAS GEMM (issue 39's A/B)
                release_fast_state(target)
                with path_environment("separate"):
                    add("our_ar_separate", context, timed(target, None, context, args.rounds, args.repeats, engine))
                release_fast_state(target)
            if args.profile:
                from step_profile import profile_rounds

                release_fast_state(target)
                # the AR step, then every SD mode timed above (and again with the draft vocabulary, if given)
                profiled = [(f"{pair}_ar", None, None, None)]
                for mode, cfg in modes.items():
                    profiled.append((f"{pair}_sd_{mode}", drafter, cfg, None))
                    if draft_vocab is not None:
                        profiled.append((f"{pair}_sd_{mode}_dv", drafter, cfg, draft_vocab))
                for label, d, cfg, vocab in profiled:
                    if d is not None:
                        d.set_fold_config(cfg)
                        d.use_draft_vocab(vocab)
                    try:
                        result_profiles.append(profile_rounds(target, d, context, Path(args.out) / "profile", label))
                    except Exception:
                        import traceback

                        log(f"FAILED profile {label}:\n" + traceback.format_exc())
                    release_fast_state(target)
                drafter.use_draft_vocab(None)
            release_fast_state(target)
        del target, drafter
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows, "bandwidth_tb_s": bandwidth / 1e12, "headline": headline(rows),
            "profiles": [{k: v for k, v in p.items() if k != "top"} for p in result_profiles]}


GDN_LAYER = dict(HK=16, HV=32, DK=128, DV=128, K=4)  # Qwen3.5-9B's linear-attention layer (kernel timings)


def graph_us(fn, repeats: int = 200, per_graph: int = 20) -> float:
    """Device microseconds of one call of ``fn``: ``per_graph`` calls captured in a CUDA graph, replayed
    ``repeats // per_graph`` times (the launches' host cost, ~50 us a call, would otherwise be what is timed)."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replays = max(1, repeats // per_graph)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * per_graph)


def kernel_sweep(out: Path, repeats: int = 200) -> list[dict]:
    """Time the fused Gated DeltaNet verify and commit at the Qwen3.5-9B layer shape (16 key / 32 value heads of
    128, conv 4) for 1, 16 and 64 rows over launch configurations (``$FOLD_HF_GDN_BV`` / ``$FOLD_HF_GDN_WARPS`` /
    ``$FOLD_HF_GDN_DOT``), next to the token-by-token verify the chunked one replaced (benchmarks/gdn_before.py)
    and the per-position-state kernel before it; each configuration is checked against the torch twin."""
    import os

    from fold_hf.kernels.gated_delta import naive as ref
    from fold_hf.kernels.gated_delta import triton as tri
    from fold_hf.kernels.gated_delta.triton import gated_delta_states_triton

    HK, HV, DK, DV, K = GDN_LAYER.values()
    C = 2 * HK * DK + HV * DV
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)

    def event_us(fn) -> float:
        return graph_us(fn, repeats)

    from gdn_before import steps_pending, steps_verify

    rows = []
    state = rnd(HV, DK, DV, dtype=torch.float32, scale=0.1)
    conv, weight = rnd(C, K - 1), rnd(C, K, scale=0.5)
    a_log, dt_bias = rnd(HV, scale=0.3), rnd(HV, scale=0.3)
    for L in (1, 16, 64):
        qkv, b, a = rnd(L, C), rnd(L, HV), rnd(L, HV)
        pending = ref.gated_delta_pending(24, 64, HK, DK, HV, DV, C, torch.bfloat16, torch.float32, "cuda")
        want = ref.gated_delta_verify_reference(qkv, b, a, conv, weight, a_log, dt_bias, state, HK, DK,
                                                ref.gated_delta_pending(24, 64, HK, DK, HV, DV, C, torch.bfloat16,
                                                                        torch.float32, "cuda"), 0)
        states = state.expand(24, HV, DK, DV).contiguous()
        convs = conv.expand(24, C, K - 1).contiguous()
        n = torch.tensor([L - 1], device="cuda")
        q, k, v, gg, beta = ref.gated_delta_prepare_reference(qkv, b, a, conv, weight, a_log, dt_bias, HK, DK,
                                                               torch.float32)
        if L <= 16:
            rows.append({"kernel": "per_position_states (before)", "rows": L,
                         "us": event_us(lambda: gated_delta_states_triton(q, k, v, gg, beta, state))})
        before = steps_pending(64, HK, DK, HV, DV, C)
        got = steps_verify(qkv, b, a, conv, weight, a_log, dt_bias, state, HK, DK, before)
        rows.append({"kernel": "token by token BV=32 warps=4 (before, f2c4b56)", "rows": L,
                     "verify_us": event_us(lambda: steps_verify(qkv, b, a, conv, weight, a_log, dt_bias, state, HK,
                                                                DK, before)),
                     "max_abs_err_vs_twin": float((got - want).abs().max())})
        configs = [(bv, w, "ieee") for bv, w in ((16, 1), (16, 2), (32, 1), (32, 2), (32, 4), (64, 4))]
        configs += [(32, 4, "tf32x3"), (64, 4, "tf32x3")] if L > 1 else []
        for bv, warps, prec in configs:
            os.environ["FOLD_HF_GDN_BV"], os.environ["FOLD_HF_GDN_WARPS"] = str(bv), str(warps)
            os.environ["FOLD_HF_GDN_DOT"] = prec
            name = f"fused BV={bv} warps={warps}" + (f" dot={prec}" if L > 1 else "")
            try:
                got = tri.gated_delta_verify_triton(qkv, b, a, conv, weight, a_log, dt_bias, state, HK, DK, pending, 0)
                error = float((got - want).abs().max())
                verify = event_us(lambda: tri.gated_delta_verify_triton(qkv, b, a, conv, weight, a_log, dt_bias,
                                                                        state, HK, DK, pending, 0))
                commit = event_us(lambda: tri.gated_delta_commit_triton(n, pending, L, states, convs))
            except Exception as exc:  # a configuration that does not compile is a result too
                rows.append({"kernel": name, "rows": L, "error": repr(exc)[:200]})
                continue
            rows.append({"kernel": name, "rows": L, "verify_us": verify, "commit_24_layers_us": commit,
                         "max_abs_err_vs_twin": error})
    os.environ.pop("FOLD_HF_GDN_DOT", None)
    os.environ.pop("FOLD_HF_GDN_BV", None)
    os.environ.pop("FOLD_HF_GDN_WARPS", None)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_sweep.json").write_text(json.dumps(rows, indent=2))
    for row in rows:
        log("sweep " + json.dumps(row))
    return rows


def headline(rows: list[dict]) -> dict:
    p50 = {(r["pair"], r["row"], r["context"]): r["p50_ms"] for r in rows}
    out = {}
    for (pair, row, context), value in p50.items():
        if row != "our_ar" or not value:
            continue
        floor = p50.get((pair, "floor", context))
        out[f"{pair}_ar_over_floor_{context}"] = value / floor if floor else None
        for name in ("modules", "separate"):  # --modules-row, --separate-row
            other = p50.get((pair, f"our_ar_{name}", context))
            if other:
                out[f"{pair}_ar_{name}_over_floor_{context}"] = other / floor if floor else None
        for mode in ("dflash", "fold", "dflash_dv", "fold_dv"):  # _dv: with --draft-vocab-size
            sd = p50.get((pair, f"our_sd_{mode}", context))
            out[f"{pair}_sd_{mode}_over_ar_{context}"] = sd / value if sd else None
            sd_floor = p50.get((pair, f"floor_sd_{mode}", context))
            if sd and sd_floor and floor:  # the round against its own floor, and what the floors alone give
                out[f"{pair}_sd_{mode}_over_its_floor_{context}"] = sd / sd_floor
                out[f"{pair}_sd_{mode}_floor_over_ar_floor_{context}"] = sd_floor / floor
    return out


def write(args, result: dict) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine() if torch.cuda.is_available() else {"gpu": "cpu (dry run)", "torch": torch.__version__,
                                                         "transformers": __import__("transformers").__version__,
                                                         "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with (out / "hybrid.csv").open("w", newline="") as fh:
        fields = ["gpu", "torch", "transformers", "date", "pair", "row", "context", "p20_ms", "p50_ms", "p80_ms",
                  "n", "peak_gib"]
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in result["rows"]:
            writer.writerow({**{k: info.get(k) for k in ("gpu", "torch", "transformers", "date")}, **row})
    (out / "hybrid.json").write_text(json.dumps({"machine": info, **result}, indent=2, default=str))
    log("headline: " + json.dumps(result["headline"], indent=2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="hybrid-bench")
    parser.add_argument("--pairs", default="qwen35_9b,llama31_8b")
    parser.add_argument("--contexts", default=None, help="comma list (default 8192,32768,131072; dry run 64,160)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--sliding-window", type=int, default=None, help="drafter sliding window (default 2048)")
    parser.add_argument("--qwen-window", type=int, default=None, help="FOLD W for Qwen3.5 (default 4096)")
    parser.add_argument("--llama-window", type=int, default=2048)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (static engine)")
    parser.add_argument("--profile", action="store_true",
                        help="also write a torch.profiler top-kernel table of the AR step and of each --sd-modes round "
                             "(with and without --draft-vocab-size; static engine) per context under OUT/profile/")
    parser.add_argument("--sd-modes", default="dflash,fold", help="speculative rows to time (dflash, fold)")
    parser.add_argument("--kernel-sweep", action="store_true",
                        help="then time the fused Gated DeltaNet kernels' launch configurations (GPU only)")
    parser.add_argument("--sweep-only", action="store_true", help="with --kernel-sweep: no pair rows, the sweep alone")
    parser.add_argument("--separate-row", action="store_true",
                        help="also the fused AR step with separate cuBLAS projections (our_ar_separate, issue 39)")
    parser.add_argument("--draft-vocab-size", type=int, default=0, metavar="N",
                        help="also time each SD row with the drafter proposing from N of the head's rows "
                             "(fold_hf.DraftVocab; rows our_sd_<mode>_dv, keys ..._sd_<mode>_dv_over_ar_...)")
    parser.add_argument("--modules-row", action="store_true",
                        help="also time Qwen3.5's AR step through the model's modules (fused_layers=False)")
    args = parser.parse_args(argv)
    dry = args.dry_run
    args.contexts = args.contexts or ("64,160" if dry else "8192,32768,131072")
    args.rounds = args.rounds or (3 if dry else 40)
    args.repeats = args.repeats or (1 if dry else 3)
    args.sliding_window = args.sliding_window or (16 if dry else 2048)
    args.qwen_window = args.qwen_window or (32 if dry else 4096)
    if args.sweep_only:
        if not args.kernel_sweep or dry:
            parser.error("--sweep-only goes with --kernel-sweep on a GPU")
        kernel_sweep(Path(args.out))
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        write(args, run(args))
        if args.kernel_sweep and not dry:
            kernel_sweep(Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
