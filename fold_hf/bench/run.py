"""Running a benchmark: AR and every method on each request, in one process, appended per request to
``runs.jsonl``.

Each method is paired with an AR run of the same request on the same machine; a request's rows are written
together, so a run resumes where it stopped and runs from several jobs (shards) merge by request id.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .methods import BENCH_ENGINES, Method


def machine_info() -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    else:
        info["gpu"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info


def run_bench(target, drafter, requests: list[dict], methods: list[Method], out_dir: str | Path,
              max_minutes: float | None = None, log=print, engine: str = "loop", warmup: bool | None = None,
              exact: bool = False) -> Path:
    """Run every method on every request not yet in ``out_dir/runs.jsonl``; returns that file.

    ``engine``: ``"loop"`` decodes with the foundation loop (:func:`fold_hf.generate`: transformers' forward,
    the torch read), ``"fast"`` with :func:`fold_hf.fast_generate` (static caches, CUDA graphs and the Triton
    kernels on a GPU), which is what the speedups of a GPU run should time. ``warmup`` (default: on for
    ``fast``) runs each method once on the request before the timed run, so graph capture and kernel compilation
    stay out of the timings; the tokens are the same either way. ``exact``: every method and AR in exact mode
    (``fast`` only; docs/exact-mode.md), so a row's ``same_as_ar`` holds the mode's guarantee (greedy speculative
    output = exact AR output) on every request, bf16 included; rows record ``exact``.
    """
    if engine not in BENCH_ENGINES:
        raise ValueError(f"engine must be one of {BENCH_ENGINES}, got {engine!r}")
    if exact and engine != "fast":
        raise ValueError("exact mode runs on the fast engine (engine='fast')")
    if engine == "fast":
        from ..generation.fast import fast_generate, fast_unsupported

        reason = fast_unsupported(target, drafter)
        if reason is not None:
            raise ValueError(f"engine='fast' cannot run this pair: {reason}; use engine='loop'")
        decode = fast_generate
    else:
        from ..generation.loop import generate as decode
    warmup = engine == "fast" if warmup is None else warmup
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs.jsonl"
    done = set()
    if runs.is_file():
        for line in runs.read_text().splitlines():
            if line.strip():
                done.add(json.loads(line)["request"])
    meta = out / "machine.json"
    if not meta.is_file():
        meta.write_text(json.dumps(machine_info(), indent=2))
    device = next(target.parameters()).device
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    todo = [r for r in requests if r["id"] not in done]
    started = time.time()
    for req in tqdm(todo, desc="bench requests", unit="req"):
        if max_minutes is not None and (time.time() - started) / 60 > max_minutes:
            log(f"stopping after {max_minutes} minutes; {len(todo)} requests were left, run again to resume")
            break
        ids = torch.tensor([req["input_ids"]], device=device)
        rows = []
        reference = None
        for method in methods:
            kwargs = dict(input_ids=ids, max_new_tokens=req["new_tokens"], fold_config=method.config, eos_token_id=[],
                          **({"exact": True} if exact else {}))
            method_drafter = drafter if method.config is not None else None
            if warmup:
                decode(target, method_drafter, **kwargs)
            res = decode(target, method_drafter, return_stats=True, **kwargs)
            tokens = res.new_tokens[0].tolist()
            if reference is None:
                reference = tokens
            rows.append({"request": req["id"], "suite": req["suite"], "tier": req["tier"], "method": method.name,
                         "tau": res.tau, "tpot_s": res.tpot_s, "ttft_s": res.ttft_s, "rounds": res.rounds,
                         "new_tokens": res.num_new_tokens, "same_as_ar": tokens == reference, "engine": engine,
                         "exact": exact,
                         "dtype": dtype, **({"family": req["family"]} if "family" in req else {})})
        with runs.open("a") as fh:  # a request is written whole, so pairing with its AR run survives restarts
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    return runs
