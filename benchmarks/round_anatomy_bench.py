"""Where a speculative round's time goes, on one GPU (issues 16 and 19).

Usage (repo root, one GPU; about 2-3 minutes on an H200):

    python benchmarks/round_anatomy_bench.py --out $OUT/anatomy [--sections llama,gemma_attention]

``llama`` (random Llama-3.1-8B-shape bf16 target, z-lab DFlash-shape drafter, block 10, graphs engine, one
context, default 32K):

* ``loop``: :func:`time_rounds` p20/p50/p80 per round, AR / SD ``dflash`` / SD ``fold`` (what the headline
  ratios use);
* ``replay``: the captured round step replayed back to back with the session's state put back before each replay
  (no host work between replays): the device time of one round's graph;
* ``trace``: a torch.profiler trace of the graphs engine's rounds: per round the device span, the summed kernel
  time (so the bubbles inside the graph) and the idle time between rounds (the host's share);
* ``floor``: the bytes a round must read (target weights + KV, drafter weights + its cache, the shared lm_head
  once more) over the copy bandwidth measured here.

``attention``: the target's decode kernel (Gemma-4's global layer 16 / 4 heads of 512, Llama-3.1-8B 32 / 8 of 128,
Qwen3.5-9B's full-attention layer 16 / 4 of 256; 1 row and a speculative block) and the drafter's FOLD read
(window 2048, far memory, α 2) over the context's cached keys, each launch configuration in a CUDA graph, against
the KV read; the relative error of every configuration against the fp32 run of the same kernel is recorded (a fast
but wrong configuration shows it).

Writes ``anatomy.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_bench import build_random_pair  # noqa: E402
from kernel_bench import measure_bandwidth, percentiles, versions  # noqa: E402

from fold_hf import FoldConfig  # noqa: E402
from fold_hf.generation.fast import SESSION_ATTR, time_rounds  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def loop_rows(target, drafter, context: int, rounds: int, repeats: int) -> dict:
    time_rounds(target, drafter, context, rounds)  # captures
    seconds = []
    for _ in range(repeats):
        seconds += time_rounds(target, drafter, context, rounds).round_seconds[1:]
    p20, p50, p80 = percentiles(seconds)
    return {"p20_ms": p20 / 1e3, "p50_ms": p50 / 1e3, "p80_ms": p80 / 1e3, "n": len(seconds)}


def replay_rows(target, reps: int = 30) -> dict:
    """Device ms of each captured round step of the target's session, replayed back to back."""
    session = target.__dict__[SESSION_ATTR]
    saved = session.state.clone()
    out = {}
    for key, step in session.steps.items():
        if not (isinstance(key, tuple) and key and key[0] == "round") or not hasattr(step, "graph"):
            continue
        for _ in range(3):
            session.state.copy_(saved)
            step.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            session.state.copy_(saved)
            step.replay()
        b.record()
        torch.cuda.synchronize()
        out[repr(key[1:6])] = a.elapsed_time(b) / reps
    session.state.copy_(saved)
    return out


def trace_rows(target, drafter, context: int, rounds: int, out_dir: Path, name: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    time_rounds(target, drafter, context, rounds)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        res = time_rounds(target, drafter, context, rounds)
        torch.cuda.synchronize()
    path = out_dir / f"trace_{name}.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    path.unlink()  # tens of MB: only the summary below is kept
    kernels = sorted((e["ts"], e["dur"], e["name"]) for e in events
                     if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    launches = sorted(e["ts"] for e in events if e.get("name") in ("cudaGraphLaunch", "cudaGraphLaunch_v10000"))
    if not kernels:
        return {"error": "no kernel events in the trace"}
    # rounds: split the kernel stream at idle gaps longer than 20 us (a round's graph has none that long)
    groups, current = [], [kernels[0]]
    for k in kernels[1:]:
        prev_end = max(t + d for t, d, _ in current[-8:])
        if k[0] - prev_end > 20.0:
            groups.append(current)
            current = [k]
        else:
            current.append(k)
    groups.append(current)
    per = []
    for g in groups:
        start = g[0][0]
        end = max(t + d for t, d, _ in g)
        busy, last = 0.0, start
        for t, d, _ in g:  # union of intervals
            s, e = max(t, last), t + d
            if e > s:
                busy += e - s
                last = max(last, e)
        per.append({"kernels": len(g), "span_us": end - start, "busy_us": busy, "start": start, "end": end})
    gaps = [b["start"] - a["end"] for a, b in zip(per, per[1:])]
    big = [p for p in per if p["kernels"] > 50]
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    return {"groups": len(per), "round_groups": len(big), "graph_launches": len(launches),
            "kernels_per_round_p50": med([p["kernels"] for p in big]),
            "span_us_p50": med([p["span_us"] for p in big]), "busy_us_p50": med([p["busy_us"] for p in big]),
            "gap_between_groups_us_p50": med(gaps), "gaps_us": [round(g, 1) for g in gaps][:40],
            "small_groups": [{"kernels": p["kernels"], "span_us": round(p["span_us"], 1)} for p in per
                             if p["kernels"] <= 50][:20],
            "round_seconds_p50_ms": med(res.round_seconds[1:]) * 1e3}


def llama(args, out: Path, report: dict) -> None:
    target, drafter = build_random_pair(args.context + 4096)
    bandwidth = measure_bandwidth("cuda")
    cfg, dcfg = target.config, drafter.config
    element = 2
    target_weights = (sum(p.numel() for p in target.parameters()) - target.get_input_embeddings().weight.numel())
    head = target.get_output_embeddings().weight.numel()
    drafter_own = sum(p.numel() for n, p in drafter.named_parameters() if "lm_head" not in n and "embed" not in n)
    kv_target = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * 128 * element * args.context
    kv_drafter = dcfg.num_hidden_layers * 2 * dcfg.num_key_value_heads * dcfg.head_dim * element * args.context
    ar_bytes = target_weights * element + kv_target
    sd_bytes = ar_bytes + (drafter_own + head) * element + kv_drafter
    report["llama"] = {"bandwidth_tb_s": bandwidth / 1e12,
                       "floor_ms": {"ar": ar_bytes / bandwidth * 1e3, "sd": sd_bytes / bandwidth * 1e3,
                                    "drafter_part": (sd_bytes - ar_bytes) / bandwidth * 1e3},
                       "drafter_params_own": drafter_own}
    log(f"floors: {report['llama']['floor_ms']}")
    modes = {"ar": None, "dflash": FoldConfig(mode="dflash"),
             "fold": FoldConfig(mode="fold", window=2048, alpha=2.0)}
    for name, fc in modes.items():
        draft = None
        if fc is not None:
            drafter.set_fold_config(fc)
            draft = drafter
        row = {"loop": loop_rows(target, draft, args.context, args.rounds, args.repeats)}
        row["replay_ms"] = replay_rows(target)
        row["trace"] = trace_rows(target, draft, args.context, 12, out, name)
        report["llama"][name] = row
        log(f"llama {name}: {json.dumps(row)[:900]}")
        (out / "anatomy.json").write_text(json.dumps(report, indent=1))


def _graph_us(fn, reps: int = 100) -> float:
    """Device microseconds of ``fn`` replayed in a CUDA graph (10 calls a graph)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps // 10):
        graph.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


# (name, query heads, KV heads, head dim, rows, kernel); ``decode``: the target's verify attention, ``fold``: the
# drafter's FOLD read (window 2048, far memory, alpha 2)
ATTENTION_SHAPES = (
    ("gemma4 global", 16, 4, 512, (1, 7), "decode"),
    ("llama 8b", 32, 8, 128, (1, 10), "decode"),
    ("qwen3.5 full", 16, 4, 256, (1, 16), "decode"),
    ("llama drafter", 32, 8, 128, (10,), "fold"),
    ("qwen3.5 drafter", 16, 4, 256, (16,), "fold"),
)


def _configs(kind: str, hq: int, hkv: int, rows: int, d: int) -> list[dict]:
    if kind == "fold":
        # tiles and window programs, then fewer / more context splits (each split writes [rows, Dv] fp32 partials
        # per branch: at 64 packed rows of 256 that is ~30% of the KV bytes it reads at the default split), row
        # blocks of 32 and 2 stages at wide heads
        return [dict()] + [dict(block_n=n, num_warps=w, window_splits=ws)
                           for n, w, ws in itertools.product((32, 64), (4, 8), (8, 16, 32))] + [
            dict(num_splits=sp) for sp in (16, 33, 132)] + (
            [dict(block_m=32), dict(num_stages=2), dict(num_warps=4, num_stages=2),
             dict(num_warps=4, num_stages=2, num_splits=33)] if d > 128 else [])
    if d > 256:
        return [dict(), dict(block_m=32, block_n=32, num_stages=2, num_warps=8),
                dict(block_m=16, block_n=16, num_stages=2, num_warps=8)]
    return [dict()] + [dict(block_n=n, num_stages=st, num_warps=w)
                       for n, st, w in itertools.product((32, 64, 128), (2, 3), (4, 8))] + [
        dict(num_splits=sp) for sp in (33, 66, 132)]


def attention_sweep(args, out: Path, report: dict) -> None:
    from fold_hf.kernels.fold_read.triton import decode_attention_triton, fold_read_triton

    context = args.context
    bandwidth = report.get("llama", {}).get("bandwidth_tb_s", 4.27) * 1e12
    rows_out, best = [], {}
    for name, hq, hkv, d, row_counts, kind in ATTENTION_SHAPES:
        if args.attention_shapes and not any(part in name for part in args.attention_shapes.split(",")):
            continue
        keys = torch.randn(1, hkv, context + 64, d, device="cuda", dtype=torch.bfloat16)
        values = torch.randn_like(keys)
        length = torch.tensor([context], device="cuda", dtype=torch.int32)
        kv_us = 2 * hkv * context * d * 2 / bandwidth * 1e6
        if kind == "fold":
            pos = torch.arange(context + 64, dtype=torch.float64, device="cuda")[:, None]
            inv = 1.0 / 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
            angles = torch.cat((pos * inv, pos * inv), -1)
            cos, sin = angles.cos().float(), angles.sin().float()
        for L in row_counts:
            q = torch.randn(1, hq, L, d, device="cuda", dtype=torch.bfloat16) * d ** -0.5
            bk = torch.randn(1, hkv, L, d, device="cuda", dtype=torch.bfloat16)
            if kind == "decode":
                def call(q=q, bk=bk, **kw):
                    return decode_attention_triton(q, keys, values, bk, bk, length, scaling=1.0,
                                                   max_context_length=context + 64, **kw)
                ref = decode_attention_triton(q.float(), keys.float(), values.float(), bk.float(), bk.float(),
                                              context, scaling=1.0)
            else:
                qf = torch.randn_like(q)

                def call(q=q, qf=qf, bk=bk, **kw):
                    return fold_read_triton(q, qf, keys, values, bk, bk, cos, sin, length, length, 2048, 2.0, **kw)
                ref = fold_read_triton(q.float(), qf.float(), keys.float(), values.float(), bk.float(), bk.float(),
                                       cos, sin, context, context, 2048, 2.0)
            done = []
            for kw in _configs(kind, hq, hkv, L, d):
                try:
                    got = call(**kw)
                    torch.cuda.synchronize()
                    err = ((got.float() - ref).norm() / ref.norm()).item()
                    row = {"shape": name, "kind": kind, "rows": L, **kw, "us": round(_graph_us(lambda: call(**kw)), 2),
                           "rel_err": err, "kv_read_us": round(kv_us, 2)}
                    done.append(row)
                except Exception as exc:  # a configuration that does not fit (shared memory) is recorded as such
                    row = {"shape": name, "kind": kind, "rows": L, **kw, "error": f"{type(exc).__name__}: {str(exc)[:120]}"}
                rows_out.append(row)
            if done:
                fastest = min(done, key=lambda r: r["us"])
                best[f"{name} L={L}"] = {"default_us": done[0]["us"], "best": fastest, "kv_read_us": round(kv_us, 2)}
                log(f"attention {name} L={L}: default {done[0]['us']} us, best {fastest}, kv read {kv_us:.1f} us")
        del keys, values
        torch.cuda.empty_cache()
        report["attention"] = {"best": best, "rows": rows_out}
        (out / "anatomy.json").write_text(json.dumps(report, indent=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sections", default="llama,attention")
    parser.add_argument("--attention-shapes", default="",
                        help="comma list of substrings: only the attention shapes whose names hold one (e.g. drafter)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("round_anatomy_bench needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": versions(), "context": args.context}
    for section in args.sections.split(","):
        try:
            {"llama": llama, "attention": attention_sweep}[section](args, out, report)
        except Exception as exc:
            import traceback

            traceback.print_exc()
            report[f"{section}_error"] = repr(exc)
        (out / "anatomy.json").write_text(json.dumps(report, indent=1))
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
