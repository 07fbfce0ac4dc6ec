"""A short torch.profiler table of the fast loop's rounds (used by hybrid_bench.py and gemma_bench.py ``--profile``).

The rounds run on the ``static`` engine (the same kernels as the captured ``graphs`` engine, launched one by one, so
the profiler names every kernel): the table lists the top kernels by device time over ``rounds`` rounds, with the
number of kernel launches per round (what CUDA graphs still pay a few microseconds each for) and the device time
per round. Written as text (``<label>.txt``) and JSON rows (``<label>.json``) under ``out``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fold_hf.generation.fast import time_rounds


def _device_time(evt) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(evt, name, None)
        if value is not None:
            return float(value)
    return 0.0


def profile_rounds(target, drafter, context: int, out: Path, label: str, rounds: int = 4, top: int = 25,
                   fused_layers=None) -> dict:
    """Profile ``rounds`` static-engine rounds (after one warm-up call) and write the top-``top`` table."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    time_rounds(target, drafter, context, rounds, engine="static", fused_layers=fused_layers)  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        result = time_rounds(target, drafter, context, rounds, engine="static", fused_layers=fused_layers)
        if cuda:
            torch.cuda.synchronize()
    n_rounds = max(1, len(result.round_seconds))
    events = [e for e in prof.key_averages() if (_device_time(e) > 0 if cuda else e.cpu_time_total > 0)]
    if cuda:
        kernels = [e for e in events if getattr(e, "device_type", None) is not None
                   and "cuda" in str(e.device_type).lower()]
        kernels = kernels or events
        key = _device_time
    else:  # dry run: aten ops on the CPU stand in for kernels
        kernels = [e for e in events if e.key.startswith("aten::")]
        key = (lambda e: float(e.self_cpu_time_total))
    kernels.sort(key=key, reverse=True)
    total = sum(key(e) for e in kernels)
    launches = sum(e.count for e in kernels)
    rows = [{"kernel": e.key[:90], "calls_per_round": e.count / n_rounds, "us_per_round": key(e) / n_rounds,
             "share": key(e) / total if total else None} for e in kernels[:top]]
    summary = {"label": label, "context": context, "rounds": n_rounds, "launches_per_round": launches / n_rounds,
               "device_us_per_round": total / n_rounds, "wall_ms_per_round_static": 1e3 * sum(result.round_seconds)
               / n_rounds, "top": rows}
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"{label} @ {context}: {summary['launches_per_round']:.0f} launches / round, "
             f"{summary['device_us_per_round']:.0f} us device time / round, static-engine wall "
             f"{summary['wall_ms_per_round_static']:.2f} ms / round",
             f"{'us/round':>10} {'calls':>7} {'share':>6}  kernel"]
    for r in rows:
        lines.append(f"{r['us_per_round']:10.1f} {r['calls_per_round']:7.1f} {100 * (r['share'] or 0):5.1f}%  "
                     f"{r['kernel']}")
    (out / f"{label}.txt").write_text("\n".join(lines) + "\n")
    (out / f"{label}.json").write_text(json.dumps(summary, indent=2))
    print("\n".join(lines[:12]), flush=True)
    return summary
