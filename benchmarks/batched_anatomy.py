"""Where a batched call's time goes on a real pair (issue 35): one group of ``B`` requests of a saved suite's tier,
FOLD (or another method of :mod:`fold_hf.bench.methods`) and batched AR on one engine, each called twice to warm up,
then once inside :func:`~fold_hf.generation.rounds.round_phases` (each part synchronised: the drafts of all rows, the
one verify, the rest of the round on the host) and once timed as a whole call; and the session's fixed-shape steps by
key. Prints one JSON line per system and writes ``OUT/anatomy.json``.

    python benchmarks/batched_anatomy.py --pair gemma3-270m --suite requests.jsonl --tier 32704 --batch 8 --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batched_bench import batch_of, pad_id, session_steps, suite_requests  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", required=True)
    parser.add_argument("--suite", required=True, help="a saved suite's requests.jsonl")
    parser.add_argument("--tier", type=int, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=0, help="which group of --batch requests of the tier")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--method", default="fold-a2")
    parser.add_argument("--engine", default="graphs")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    from fold_hf.bench.methods import default_methods
    from fold_hf.generation.fast import fast_generate
    from fold_hf.generation.rounds import round_phases
    from fold_hf.pairs import load_pair

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target, _, drafter = load_pair(args.pair, device=device)
    config = {m.name: m.config for m in default_methods(drafter.fold_config.window,
                                                        drafter.fold_config.train_length)}[args.method]
    requests = suite_requests(args.suite, args.tier, None)[args.group * args.batch: (args.group + 1) * args.batch]
    ids, mask = batch_of([r["input_ids"] for r in requests], pad_id(target))
    ids, mask = ids.to(device), mask.to(device)
    kw = dict(max_new_tokens=args.new, do_sample=False, eos_token_id=[], return_stats=True, engine=args.engine)
    report = {"pair": args.pair, "tier": args.tier, "batch": len(requests), "engine": args.engine,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "systems": {}}
    for name, d in ((args.method, drafter), ("ar", None)):
        call = lambda: fast_generate(target, d, ids, mask, fold_config=config if d is not None else None, **kw)  # noqa
        call()
        before = set(session_steps(target))
        call()
        with round_phases() as phases:
            result = call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = call()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        rows = result.rows if hasattr(result, "rows") else [result]
        row = {"call_s": seconds, "rounds": phases.rounds,
               **{f"{k}_ms_per_round": round(v, 3) for k, v in phases.per_round_ms().items()},
               "first_token_s_last_row": max(r.ttft_s for r in rows),
               "decode_s": max(r.ttft_s + r.decode_s for r in rows) - max(r.ttft_s for r in rows),
               "tau_rows": [round(r.tau, 2) for r in rows] if d is not None else None,
               "steps": sorted(str(k) for k in session_steps(target)),
               "steps_built_after_first_call": sorted(str(k) for k in set(session_steps(target)) - before)}
        report["systems"][name] = row
        print(json.dumps({name: row}), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "anatomy.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
