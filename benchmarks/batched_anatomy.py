"""Where a batched call's time goes on a real pair (issue 35): one group of ``B`` requests of a saved suite's tier,
FOLD (or another method of :mod:`fold_hf.bench.methods`) and batched AR on one engine, each called twice to warm up,
then once inside :func:`~fold_hf.generation.rounds.round_phases` (each part synchronised: the drafts of all rows, the
one verify, the rest of the round on the host) and once timed as a whole call; and the session's fixed-shape steps by
key. Prints one JSON line per system and writes ``OUT/anatomy.json``; with ``--profile`` one more call of each system
under ``torch.profiler`` (CPU and CUDA), its kernels and ops by total device time in ``OUT/profile_<system>.txt``
(:func:`file_name`; what a FOLD call spends that batched AR's does not, e.g. before the last row's first token).

    python benchmarks/batched_anatomy.py --pair gemma3-270m --suite requests.jsonl --tier 32704 --batch 8 --out DIR

``--draft-vocab FILE`` adds the method with the drafter proposing from a draft vocabulary (system ``METHOD+dv``);
``--drafter DIR`` loads another drafter folder than the pair's committed one.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from batched_bench import batch_of, pad_id, session_steps, suite_requests, sync  # noqa: E402
from last_mile_bench import env_var  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair")
    parser.add_argument("--suite", help="a saved suite's requests.jsonl")
    parser.add_argument("--tier", type=int)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=0, help="which group of --batch requests of the tier")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--method", default="fold-a2")
    parser.add_argument("--engine", default="graphs")
    parser.add_argument("--out", required=True)
    parser.add_argument("--profile", action="store_true", help="one more call per system under torch.profiler")
    parser.add_argument("--rows-kernels", default="1",
                        help="settings of $FOLD_HF_ROWS_KERNELS to run in turn, e.g. 1,0 (the row-axis kernels against "
                             "the one-row kernels row by row, in this process; systems named name[rows_kernels=S])")
    parser.add_argument("--drafter", help="a drafter folder (default the pair's committed one)")
    parser.add_argument("--draft-vocab", metavar="FILE",
                        help="also the method with the drafter proposing from this draft vocabulary (system "
                             "METHOD+dv; fold_hf.DraftVocab, benchmarks/build_draft_vocab.py)")
    parser.add_argument("--dry-run", action="store_true", help="batched_bench's tiny random pair, random prompts")
    args = parser.parse_args(argv)
    if not args.dry_run and not (args.pair and args.suite and args.tier):
        parser.error("--pair, --suite and --tier are required (or --dry-run)")

    from fold_hf.bench.methods import default_methods
    from fold_hf.generation import release_fast_state
    from fold_hf.generation.fast import fast_generate
    from fold_hf.kernels import ROWS_KERNELS_ENV
    from fold_hf.pairs import load_pair

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.dry_run:
        from batched_bench import tiny_pair

        target, drafter = tiny_pair(device)
        g = torch.Generator().manual_seed(0)
        requests = [{"input_ids": torch.randint(0, 200, (n,), generator=g).tolist()} for n in (40, 23, 31)]
        args.pair, args.tier = "tiny", 40
    else:
        every = suite_requests(args.suite, args.tier, None)
        requests = every[args.group * args.batch: (args.group + 1) * args.batch]
        if not requests:  # said before the pair loads
            raise SystemExit(f"--group {args.group}: the tier {args.tier} of {args.suite} has {len(every)} requests, "
                             f"groups 0..{max(0, -(-len(every) // args.batch) - 1)} of {args.batch}")
        target, _, drafter = load_pair(args.pair, device=device, drafter_dir=args.drafter)
    config = {m.name: m.config for m in default_methods(drafter.fold_config.window,
                                                        drafter.fold_config.train_length)}[args.method]
    ids, mask = batch_of([r["input_ids"] for r in requests], pad_id(target))
    ids, mask = ids.to(device), mask.to(device)
    kw = dict(max_new_tokens=args.new, do_sample=False, eos_token_id=[], return_stats=True, engine=args.engine)
    report = {"pair": args.pair, "tier": args.tier, "batch": len(requests), "engine": args.engine,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "systems": {}}
    settings = [x for x in args.rows_kernels.split(",") if x]
    vocab = None
    if args.draft_vocab:
        from fold_hf.modeling.draft_vocab import DraftVocab

        vocab = DraftVocab.load(args.draft_vocab)
        report["draft_vocab"] = repr(vocab)
    systems = [(args.method, drafter, None), ("ar", None, None)]
    if vocab is not None:  # named without brackets: ratios() pairs it with the AR of its rows-kernels setting
        systems.insert(1, (f"{args.method}+dv", drafter, vocab))
    runs = [(setting, name, d, v) for setting in settings for name, d, v in systems]
    for setting, name, d, v in runs:
        if len(settings) > 1:
            name = f"{name}[rows_kernels={setting}]"
        release_fast_state(target)  # the runners resolve their kernels again under this setting
        if d is not None:
            d.use_draft_vocab(v)
        with env_var(ROWS_KERNELS_ENV, setting):
            row = measure(target, d, ids, mask, config, kw, device)
        report["systems"][name] = row
        print(json.dumps({name: row}), flush=True)
        if args.profile:
            with env_var(ROWS_KERNELS_ENV, setting):
                profile_call(lambda d=d: fast_generate(target, d, ids, mask, fold_config=config if d is not None
                                                       else None, **kw), device,
                             Path(args.out) / f"profile_{file_name(name)}.txt")
    report["ratios"] = ratios(report["systems"], len(requests))
    print(json.dumps({"ratios": report["ratios"]}), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "anatomy.json").write_text(json.dumps(report, indent=1))
    return report


def ratios(systems: dict, batch: int) -> dict:
    """Each drafting system against batched AR of the same ``$FOLD_HF_ROWS_KERNELS`` setting: its whole-call speedup
    (AR call / its call), the **ceiling** of that speedup at this prefill (AR call / AR's last first token: a system
    whose decode phase took no time and whose prefill cost AR's), and its prefill cost beyond AR's per row."""
    out = {}
    for name, row in systems.items():
        ar = systems.get(name.replace(name.split("[")[0], "ar", 1))
        if ar is None or ar is row:
            continue
        out[name] = {"call_speedup_over_ar": round(ar["call_s"] / row["call_s"], 4),
                     "call_speedup_ceiling_at_this_prefill": round(ar["call_s"] / ar["first_token_s_last_row"], 4),
                     "prefill_extra_ms_per_row": round(1e3 * (row["first_token_s_last_row"]
                                                              - ar["first_token_s_last_row"]) / batch, 2),
                     "decode_speedup_over_ar": round(ar["decode_s"] / row["decode_s"], 4)}
    return out


def measure(target, d, ids, mask, config, kw, device) -> dict:
    """One system's anatomy (module docstring): two warm-up calls, one inside round_phases, one timed."""
    from fold_hf.generation.fast import fast_generate
    from fold_hf.generation.rounds import round_phases

    call = lambda: fast_generate(target, d, ids, mask, fold_config=config if d is not None else None, **kw)  # noqa
    call()
    before = set(session_steps(target))
    call()
    with round_phases() as phases:
        call()
    start = sync(device)
    result = call()
    seconds = sync(device) - start
    rows = result.rows if hasattr(result, "rows") else [result]
    row = {"call_s": seconds, "rounds": phases.rounds,
           **{f"{k}_ms_per_round": round(v, 3) for k, v in phases.per_round_ms().items()},
           # the same by running rows A (a batch shrinks as rows stop): {A: {rounds, round, draft, verify, other}}
           "by_running_rows": {str(a): {k: (v if k == "rounds" else round(v, 3)) for k, v in parts.items()}
                               for a, parts in phases.per_rows_ms().items()},
           "first_token_s_last_row": max(r.ttft_s for r in rows),
           "first_token_s_rows": [round(r.ttft_s, 4) for r in rows],  # the rows are prefilled one after another
           "decode_s": max(r.ttft_s + r.decode_s for r in rows) - max(r.ttft_s for r in rows),
           "tau_rows": [round(r.tau, 2) for r in rows] if d is not None else None,
           "steps": sorted(str(k) for k in session_steps(target)),
           "steps_built_after_first_call": sorted(str(k) for k in set(session_steps(target)) - before)}
    return row


def file_name(system: str) -> str:
    """A system's name as a plain file name (``fold-a2[rows_kernels=1]`` -> ``fold-a2_rows_kernels1``): brackets and
    ``=`` are awkward in shells and are not brought back from the device machine."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", system.replace("=", "")).strip("_")


def profile_call(call, device: torch.device, path: Path, rows: int = 40) -> None:
    """One ``call()`` under ``torch.profiler``: its ops and kernels by total device time (CPU time off CUDA), and the
    count of every op, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        call()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"ops and kernels: {sum(e.count for e in events)} calls\n"
                    + events.table(sort_by=key, row_limit=rows, max_name_column_width=60) + "\n"
                    + events.table(sort_by="count", row_limit=rows, max_name_column_width=60))


if __name__ == "__main__":
    main()
