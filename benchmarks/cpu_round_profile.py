"""Where a FOLD round's time goes on a CPU: verify vs drafter vs the rest, against one AR step (the demo's setting).

The embedded pair (SmolLM2-135M fp32 + the committed drafter, ``W`` 512) at a ``--context``-token context, the
fast loop's eager engine (the CPU default). Timed in one process, interleaved, median of ``--reps``:

* ``ar_step``      the target's forward of 1 row at the context (what an AR token costs)
* ``verify``       the target's forward of B rows (the block: last token + B-1 drafts)
* ``draft``        the drafter's round (:meth:`FoldDrafter.draft_logits`: commit the accepted rows, read, B-1 logits)
* ``draft_lm_head`` the part of ``draft`` that is the target's lm_head over the B-1 drafted rows (with
  ``--draft-vocab FILE``: its rows of that draft vocabulary only, ``fold_hf.DraftVocab``)
* ``round``        a whole speculative round of :func:`~fold_hf.generation.fast.time_rounds` (greedy)
* ``ar_round``     a whole AR round of the same function
* ``overhead``     round - verify - draft (token choice, bookkeeping, Python)

Prints each in ms and as a multiple of ``ar_step``, the break-even τ (round / ar_round: FOLD beats AR in tokens/s
when τ exceeds it), and writes ``cpu_round_profile.json`` under ``--out``.

``--backends onednn,mkl,off`` times the multi-row CPU products' backends (``fold_hf/kernels/gemm/cpu.py``: oneDNN's
packed GEMM, MKL's, ``F.linear``) in one process, interleaved pass by pass (each pass runs every part under every
backend in turn), so their ratios share the machine's load; the report then has one block per backend.

  OMP_NUM_THREADS=2 python benchmarks/cpu_round_profile.py --out /tmp/cpu_profile   (about a minute, idle 2 cores)
  OMP_NUM_THREADS=2 python benchmarks/cpu_round_profile.py --out /tmp/b --backends onednn,mkl,off   (~3 minutes)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fold_hf import FoldConfig  # noqa: E402
from fold_hf.generation.fast import release_fast_state, time_rounds  # noqa: E402
from fold_hf.generation.fast.session import session_for  # noqa: E402
from fold_hf.kernels.gemm import cpu as cpu_gemm  # noqa: E402


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


@torch.no_grad()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--draft-vocab", metavar="FILE",
                        help="the drafter proposes from this draft vocabulary (benchmarks/build_draft_vocab.py)")
    parser.add_argument("--backends", default="default",
                        help="comma-separated multi-row product backends timed interleaved in this process: onednn, "
                             "mkl, off (F.linear), default (whatever the environment selects; the default)")
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    bad = set(backends) - {"onednn", "mkl", "off", "default"}
    if bad:
        parser.error(f"--backends: unknown {sorted(bad)} (onednn, mkl, off, default)")
    if args.threads:
        torch.set_num_threads(args.threads)
    from fold_hf import load_embedded_pair

    target, _, drafter = load_embedded_pair(torch.device("cpu"))
    drafter.set_fold_config(drafter.fold_config.replace(window=args.window) if drafter.fold_config.mode == "fold"
                            else FoldConfig(window=args.window, alpha=2.0))
    if args.draft_vocab:
        drafter.use_draft_vocab(args.draft_vocab)
    T, B = args.context, drafter.block_size
    # caches of T entries (time_rounds fills nothing: timing on CPU does not depend on the values)
    time_rounds(target, drafter, T, 2, engine="eager")
    session = session_for(target, T + 64, tuple(drafter.config.target_layer_ids), "eager")
    runner = session.runner
    dcache, _ = session.drafter_slot(drafter, T + 64)
    for layer in dcache.layers:
        layer.length = T
    one = torch.zeros(1, 1, dtype=torch.long)
    block = torch.zeros(1, B, dtype=torch.long)
    taps = torch.zeros(1, B, runner.tap_width)
    pending = torch.zeros(1, 4, runner.tap_width)
    last = torch.zeros(1, dtype=torch.long)

    def draft():
        for layer in dcache.layers:
            layer.length = T  # every call commits `pending` again at the same place
        drafter.draft_logits(last, pending, dcache, block_start=T + 4)

    rows = torch.zeros(1, B - 1, drafter.target_lm_head.weight.shape[1])
    parts = {"ar_step": lambda: runner.forward(one, T), "verify": lambda: runner.forward(block, T, taps_out=taps),
             "draft": draft, "draft_lm_head": lambda: drafter.proposal_logits(rows)}
    results = {b: {k: [] for k in (*parts, "round", "ar_round")} for b in backends}
    saved = {k: os.environ.get(k) for k in (cpu_gemm.BACKEND_ENV, cpu_gemm.PACKED_ENV)}
    try:
        for _ in range(3):  # interleaved passes: a shared machine's load hits every part and backend alike
            for backend in backends:
                _select(backend, saved)
                for name, fn in parts.items():
                    results[backend][name].append(median_ms(fn, args.reps))
                res = time_rounds(target, drafter, T, args.reps, engine="eager")
                results[backend]["round"].append(statistics.median(res.round_seconds) * 1e3)
                res = time_rounds(target, None, T, args.reps, engine="eager")
                results[backend]["ar_round"].append(statistics.median(res.round_seconds) * 1e3)
    finally:
        _select("default", saved)
    release_fast_state(target)
    report = {"context": T, "block": B, "window": args.window, "threads": torch.get_num_threads(),
              "draft_vocab": None if drafter.draft_vocab is None else repr(drafter.draft_vocab),
              "cpu_vendor": cpu_gemm.cpu_vendor(), "default_backend": cpu_gemm.packed_backend()}
    blocks = {b: _block(results[b]) for b in backends}
    if backends == ["default"]:
        report.update(blocks["default"])
    else:
        report["backends"] = blocks
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cpu_round_profile.json").write_text(json.dumps(report, indent=1))
    for backend, block_report in blocks.items():
        if len(blocks) > 1:
            print(f"== {backend}")
        ms = block_report["ms"]
        for k, v in ms.items():
            print(f"{k:10s} {v:8.2f} ms  {v / ms['ar_step']:5.2f}x AR step")
        print(f"break-even tau (round / AR round): {block_report['break_even_tau']:.2f}")
    return 0


def _select(backend: str, saved: dict) -> None:
    """Set the environment the CPU products read for ``backend`` (``default``: as it was when the script started)."""
    wanted = dict(saved)
    if backend == "off":
        wanted[cpu_gemm.PACKED_ENV] = "0"
    elif backend != "default":
        wanted[cpu_gemm.BACKEND_ENV] = backend
    for key, value in wanted.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _block(results: dict) -> dict:
    ms = {k: min(v) for k, v in results.items()}  # the least disturbed pass
    ms["overhead"] = ms["round"] - ms["verify"] - ms["draft"]
    return {"ms": ms, "x_ar_step": {k: v / ms["ar_step"] for k, v in ms.items()},
            "break_even_tau": ms["round"] / ms["ar_round"], "passes": results}


if __name__ == "__main__":
    raise SystemExit(main())
