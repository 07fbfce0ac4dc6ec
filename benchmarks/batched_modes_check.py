"""Which engine drafts what for a batch, per reading mode (issue 35): one group of B suite requests of a real pair
decoded batched on engines ``graphs`` (captured rows drafting step and verify), ``static`` (the same steps uncaptured),
``static-notriton`` (``static`` with ``$FOLD_HF_DISABLE_TRITON=1``: the torch twins and the torch FOLD read) and
``eager`` (the host-driven ``propose_rows`` and host-length verify), and each row alone on ``graphs``; per mode
and engine, τ and how many rows propose round by round exactly what the eager engine proposes for them (the
independent statement: the drafter's own forward per row). A wrong rows step shows up as rows that propose
differently (and a lower τ) on ``graphs`` / ``static`` only.

    python benchmarks/batched_modes_check.py --pair gemma3-270m --suite requests.jsonl.gz --tier 32704 --out DIR
    python benchmarks/batched_modes_check.py --out /tmp/m --dry-run      (tiny pair on the CPU: checks it runs)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batched_bench import batch_of, log, pad_id, suite_requests, tiny_pair  # noqa: E402
from last_mile_bench import env_var  # noqa: E402

from fold_hf.generation import release_fast_state  # noqa: E402
from fold_hf.generation.fast import fast_generate  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", default="gemma3-270m")
    parser.add_argument("--suite", help="saved suite requests (.jsonl or .jsonl.gz)")
    parser.add_argument("--tier", type=int, default=32704)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--modes", default="window,dflash,fold")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (engines static and eager)")
    parser.add_argument("--alone", type=int, default=2, help="rows also decoded alone")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    from fold_hf.bench.methods import default_methods

    if args.dry_run:
        device = torch.device("cpu")
        target, drafter = tiny_pair(device)
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(0, 200, (40 + 13 * i,), generator=g).tolist() for i in range(args.batch)]
        engines = ("static", "eager")
    else:
        from fold_hf.pairs import load_pair

        device = torch.device(args.device)
        target, _, drafter = load_pair(args.pair, device=device)
        prompts = [r["input_ids"] for r in suite_requests(args.suite, args.tier, args.batch)]
        engines = (("graphs", "static", "static-notriton", "eager") if device.type == "cuda"
                   else ("static", "eager"))
    configs = {m.name: m.config for m in default_methods(drafter.fold_config.window, drafter.fold_config.train_length)}
    ids, mask = batch_of(prompts, pad_id(target))
    ids, mask = ids.to(device), mask.to(device)
    kw = dict(max_new_tokens=args.new, do_sample=False, eos_token_id=[], return_stats=True)
    report = {"pair": "tiny" if args.dry_run else args.pair, "batch": len(prompts), "new": args.new, "rows": []}
    for mode in [m for m in args.modes.split(",") if m]:
        config = configs.get(mode) or configs.get(f"{mode}-a2")
        runs = {}
        for engine in engines:
            plain = engine.removesuffix("-notriton")
            # "-notriton": the same engine with every Triton kernel off (torch twins, the torch FOLD read)
            with env_var({"FOLD_HF_DISABLE_TRITON": "1"} if plain != engine else {}), \
                    warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                out = fast_generate(target, drafter, ids, mask, fold_config=config, engine=plain, **kw)
            runs[engine] = out.rows
            release_fast_state(target)
            report["rows"].append({"mode": mode, "engine": engine, "warnings": sorted({str(w.message)[:300]
                                                                                      for w in said})})
        alone = []
        for prompt in prompts[: args.alone]:  # rows alone (single-prompt path)
            one = torch.tensor([prompt], device=device)
            alone.append(fast_generate(target, drafter, one, fold_config=config, engine=engines[0], **kw))
        release_fast_state(target)
        reference = runs["eager"]
        for engine, rows in runs.items():
            same = [mine.proposals == theirs.proposals for mine, theirs in zip(rows, reference)]
            first = [next((r for r, (a, b) in enumerate(zip(mine.proposals, theirs.proposals)) if a != b), None)
                     for mine, theirs in zip(rows, reference)]
            entry = next(e for e in report["rows"] if (e["mode"], e["engine"]) == (mode, engine))
            entry.update(tau=statistics.fmean(r.tau for r in rows), rows_proposing_as_eager=sum(same),
                         first_differing_round=first, taus=[r.tau for r in rows])
            log(f"{mode:8s} {engine:7s} tau {entry['tau']:.2f}  rows proposing as eager {sum(same)}/{len(rows)}  "
                f"first differing round {first}")
        log(f"{mode:8s} alone   tau {[round(a.tau, 3) for a in alone]} (the first rows; batched eager: "
            f"{[round(r.tau, 3) for r in reference[: len(alone)]]})")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "modes_check.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
