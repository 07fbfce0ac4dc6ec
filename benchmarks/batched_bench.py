"""Batched rounds (issue 35): a batch of long prompts, whole calls, batched against one row at a time and against
transformers' batched ``generate``; and, on a GPU, the batched verify forward at the Llama-3.1-8B shape against its
memory floor.

Section ``pair`` (any device; the real pair of ``--pair``, default the embedded SmolLM2-135M pair): ``B`` prompts of
``--tokens`` tokens each (distinct windows of the demo's pinned input, so the rows differ), ``--new`` new tokens, greedy.
Per ``B`` in ``--batches`` it times whole calls (call to return, prefill included), every system once per repeat in
turn, median of ``--repeats``:

* ``fold_batched``: ``fast_generate(target, drafter, ids, mask)``, the rows in batched rounds (FOLD, the drafter's
  own window and α);
* on CUDA ``fold_batched_graphs`` / ``ar_batched_graphs``: the same with ``engine="graphs"`` (the rows' drafts and the
  batched verify each captured as a CUDA graph; acceptance on the host);
* ``fold_rows``: the same rows one call each (the eager engine, as the batch runs; on CUDA also ``fold_rows_graphs``,
  the default single-prompt engine);
* ``ar_batched``: ``fast_generate(target, None, ids, mask)``, batched AR on the same machinery;
* ``hf_batched``: transformers' own ``target.generate(ids, attention_mask=mask)`` (AR, its own batching).

Tokens/s = new tokens of all rows / the call's time. One more call of ``fold_batched`` and ``ar_batched`` per B runs
inside ``round_phases`` (not timed as a call): where a batched round's time goes (all rows' drafts, the one verify
forward, the rest), ``*_ms_per_round``. Every system's rows are compared with ``fold_rows``' (greedy:
equal in fp32; in bf16 the count that differ is reported). Ratios name both terms: ``fold_batched_over_fold_rows``
(time), ``fold_batched_over_ar_batched`` (throughput), ``ar_batched_over_hf_batched`` (throughput).

Section ``shape`` (``--shape``, CUDA): a random Llama-3.1-8B-shape target in bf16 (``e2e_bench.build_random_pair``) and
its cache of ``B`` rows at context ``T`` (``--contexts``): the batched verify with one token per row (the batched AR
step) and with a block per row, on the eager engine (host lengths) and the graphs engine (the fused layers' captured
step), p50 over ``--steps`` calls, against the memory floor (weights once + ``B`` rows' KV at ``T``, at the copy
bandwidth measured here); the drafter's proposals for the ``B`` rows at ``T`` beside it, per engine (``draft_rows``:
``propose_rows`` on the host for ``eager``, the rows drafting step for ``static`` / ``graphs``, captured in ``graphs``);
the round estimate = verify + drafts of the same engine (acceptance and the host's work between rounds left out); for
``B`` up to
``--hf-max-batch``, transformers' own batched AR step (``generate`` on a DynamicCache of ``T`` entries per row, sdpa)
and our batched AR throughput over it. ``summary`` holds issue 35's keys at B = 8, T = 32K (graphs engine):
``batched_ar_over_floor_8b_32k_b8``, ``batched_sd_round_over_ar_8b_32k_b8``,
``batched_ar_over_hf_batched_throughput_8b_32k_b8``.

Section ``suite`` (``--suite FILE``, any device; the real pair of ``--pair``): the requests of a saved suite
(``fold-hf bench``'s ``requests.jsonl``, :func:`fold_hf.bench.suites.save_requests`) at tier ``--tier``, in groups of
``B`` (``--batches``; B = 1 is each request alone), every method of ``--methods`` (default ``fold-a2,dflash,window``,
:mod:`fold_hf.bench.methods`, at the drafter's window and training length) and batched AR, whole calls on the fast
loop's default engine (graphs on CUDA), ``--new`` new tokens a row with EOS off (every row runs its budget, as the
suite runs do). Each method and B: every row's τ (mean acceptance length, from the row's own statistics),
tokens/s over all groups (whole calls, what a user waits for: at 32K and 64 new tokens the prefill is most of it),
decode tokens/s (tokens after each row's first over the decoding phase, :func:`decode_phase`: the part speculation
can speed up), the rows whose tokens differ from batched AR's at the same B. Ratios:
``{method}_over_ar_throughput_b{B}``, ``{method}_over_ar_decode_throughput_b{B}``, and
``{method}_speedup_b{B}_over_b1`` (whether batching keeps, loses or adds to the whole-call speedup over AR). A method's warm-up (graph capture, compilation) is one untimed call on the first group.
For the Gemma-3 pair at 32K and B = 8 the ``fold-a2`` ratio is issue 35's
``gemma3_batched_fold_over_ar_throughput_32k_b8`` (goal >= 1.3), written to ``summary`` when that is the run, with
``gemma3_batched_fold_over_ar_decode_throughput_32k_b8`` (the same, decoding phase only) beside it.

Writes ``batched.json``, ``batched.csv`` and ``batched_throughput.png`` (tokens/s by B, every system) under
``--out``; ``--plot-only DIR`` redraws the plot from a run's ``batched.json``.

    python benchmarks/batched_bench.py --out $OUT/batched                          (CPU: the pair section)
    python benchmarks/batched_bench.py --out $OUT/batched --shape --batches 1,2,4,8,16 --contexts 8192,32768
    python benchmarks/batched_bench.py --out $OUT/suite --pair gemma3-270m --suite requests.jsonl --tier 32768 \
        --batches 1,8 --new 64
    python benchmarks/batched_bench.py --out /tmp/b --dry-run                      (tiny shapes: checks it runs)
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts (e2e_bench, batched_ceiling)

from fold_hf.generation import release_fast_state  # noqa: E402
from fold_hf.generation.fast import fast_generate  # noqa: E402

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def machine(device: torch.device) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
    else:
        info["device"] = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return info


def batch_of(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``[B, L]`` ids and mask of ``rows``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def demo_rows(tokenizer, count: int, tokens: int) -> list[list[int]]:
    """``count`` distinct ``tokens``-token windows of the demo's pinned input (starts spread over it)."""
    from fold_hf.demo import demo_text

    ids = tokenizer(demo_text(), add_special_tokens=False)["input_ids"]
    if len(ids) < tokens + count:
        raise SystemExit(f"--tokens {tokens}: the demo input has {len(ids)} tokens")
    stride = (len(ids) - tokens) // max(count - 1, 1)
    return [ids[i * stride : i * stride + tokens] for i in range(count)]


def pad_id(target) -> int:
    """The id a batch is left-padded with: the target's pad id, else its (first) EOS id, else 0."""
    pad = target.generation_config.pad_token_id or target.generation_config.eos_token_id or 0
    return pad[0] if isinstance(pad, list) else int(pad)


def new_rows(sequences: torch.Tensor, width: int) -> list[list[int]]:
    return [row[width:].tolist() for row in sequences]


# ------------------------------------------------------------------------------------------------ pair section
def pair_section(args, device: torch.device, report: dict, save) -> None:
    from fold_hf.pairs import load_pair

    if args.dry_run:
        target, drafter = tiny_pair(device)
        tokenizer = None
    else:
        target, tokenizer, drafter = load_pair(args.pair, device=device)
    pad = pad_id(target)
    systems = ["fold_batched", "fold_rows", "ar_batched", "hf_batched"]
    if device.type == "cuda":  # the captured batched verify, and one call per row on the single-prompt default
        systems[1:1] = ["fold_batched_graphs", "ar_batched_graphs"]
        systems.insert(4, "fold_rows_graphs")
    for B in args.batches:
        if args.dry_run:
            g = torch.Generator().manual_seed(B)
            prompts = [torch.randint(0, 200, (args.tokens,), generator=g).tolist() for _ in range(B)]
        else:
            prompts = demo_rows(tokenizer, B, args.tokens)
        ids, mask = batch_of(prompts, pad)
        ids, mask = ids.to(device), mask.to(device)
        width = ids.shape[1]
        kw = dict(max_new_tokens=args.new, do_sample=False)

        def fold_batched():
            return fast_generate(target, drafter, ids, mask, **kw)

        def fold_rows(engine="eager"):
            outs = [fast_generate(target, drafter, ids[i : i + 1, mask[i] != 0], engine=engine, **kw)
                    for i in range(B)]
            return [o[0, int(mask[i].sum()):].tolist() for i, o in enumerate(outs)]

        def ar_batched():
            return fast_generate(target, None, ids, mask, **kw)

        def hf_batched():
            return target.generate(ids, attention_mask=mask, pad_token_id=pad, **kw)

        calls = {"fold_batched": lambda: new_rows(fold_batched(), width), "fold_rows": fold_rows,
                 "fold_batched_graphs": lambda: new_rows(fast_generate(target, drafter, ids, mask, engine="graphs",
                                                                       **kw), width),
                 "ar_batched_graphs": lambda: new_rows(fast_generate(target, None, ids, mask, engine="graphs", **kw),
                                                       width),
                 "fold_rows_graphs": lambda: fold_rows("graphs"), "ar_batched": lambda: new_rows(ar_batched(), width),
                 "hf_batched": lambda: new_rows(hf_batched(), width)}
        times: dict[str, list[float]] = {s: [] for s in systems}
        outputs: dict[str, list[list[int]]] = {}
        for s in systems:  # warm-up: sessions built, kernels compiled (not timed)
            outputs[s] = calls[s]()
        for _ in range(args.repeats):
            for s in systems:
                start = sync(device)
                outputs[s] = calls[s]()
                times[s].append(sync(device) - start)
        from fold_hf.generation.rounds import round_phases

        anatomy = {}
        for s, call in (("fold_batched", fold_batched), ("ar_batched", ar_batched)):  # where a round's time goes
            with round_phases() as phases:
                call()
            anatomy[s] = {f"{k}_ms_per_round": v for k, v in phases.per_round_ms().items()}
            anatomy[s]["rounds"] = phases.rounds
        release_fast_state(target)
        reference = outputs["fold_rows"]
        for s in systems:
            med = statistics.median(times[s])
            new_tokens = sum(len(r) for r in outputs[s])
            differ = sum(a != b for a, b in zip(outputs[s], reference))
            row = {"section": "pair", "pair": args.pair if not args.dry_run else "tiny", "system": s, "batch": B,
                   "prompt_tokens": args.tokens, "new_tokens": args.new, "call_s": med,
                   "call_s_min": min(times[s]), "call_s_max": max(times[s]), "tokens_per_s": new_tokens / med,
                   "rows_differing_from_fold_rows": differ, "repeats": args.repeats, **anatomy.get(s, {})}
            report["rows"].append(row)
            log(f"B={B:2d} {s:17s} {med:8.3f} s  {new_tokens / med:8.1f} tok/s  rows differing {differ}")
            if s in anatomy:
                a = anatomy[s]
                log(f"      {a['rounds']} rounds: {a['round_ms_per_round']:.1f} ms each = draft {a['draft_ms_per_round']:.1f}"
                    f" + verify {a['verify_ms_per_round']:.1f} + other {a['other_ms_per_round']:.1f}")
        by = {r["system"]: r for r in report["rows"] if r["section"] == "pair" and r["batch"] == B}
        report["ratios"][f"fold_batched_over_fold_rows_time_b{B}"] = by["fold_batched"]["call_s"] / by["fold_rows"]["call_s"]
        report["ratios"][f"fold_batched_over_ar_batched_throughput_b{B}"] = (
            by["fold_batched"]["tokens_per_s"] / by["ar_batched"]["tokens_per_s"])
        report["ratios"][f"ar_batched_over_hf_batched_throughput_b{B}"] = (
            by["ar_batched"]["tokens_per_s"] / by["hf_batched"]["tokens_per_s"])
        if "fold_batched_graphs" in by:
            report["ratios"][f"fold_batched_graphs_over_fold_rows_graphs_time_b{B}"] = (
                by["fold_batched_graphs"]["call_s"] / by["fold_rows_graphs"]["call_s"])
            report["ratios"][f"fold_batched_graphs_over_ar_batched_graphs_throughput_b{B}"] = (
                by["fold_batched_graphs"]["tokens_per_s"] / by["ar_batched_graphs"]["tokens_per_s"])
        save()


# ------------------------------------------------------------------------------------------------ shape section
def copy_bandwidth(device: torch.device, gib: float) -> float:
    n = int(gib * 2**30) // 2
    a = torch.empty(n, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(5):
        start = sync(device)
        b.copy_(a)
        best = min(best, sync(device) - start)
    return 2 * a.numel() * a.element_size() / best


def timed(fn, steps: int, device: torch.device) -> float:
    """p50 seconds of ``fn()`` over ``steps`` calls after 3 untimed ones."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(steps):
        start = sync(device)
        fn()
        samples.append(sync(device) - start)
    return statistics.median(samples)


def shape_section(args, device: torch.device, report: dict, save) -> None:
    from fold_hf.generation.fast.batched import _Verify
    from fold_hf.generation.fast.session import session_for
    from fold_hf.generation.rounds import num_proposals

    hf_steps = None
    if args.dry_run:
        target, drafter = tiny_pair(device)
        contexts = [64]
    else:
        from e2e_bench import build_random_pair, hf_ar_steps

        hf_steps = None if args.hf_steps == 0 else hf_ar_steps

        contexts = args.contexts
        target, drafter = build_random_pair(max(contexts) + 64)
    bandwidth = copy_bandwidth(device, 4.0 if device.type == "cuda" else 0.01)
    report["bandwidth_gb_s"] = bandwidth / 1e9
    weights = sum(p.numel() * p.element_size() for name, p in target.named_parameters() if "embed_tokens" not in name)
    block = num_proposals(drafter) + 1
    taps = tuple(drafter.config.target_layer_ids)
    engines = ["eager", "graphs"] if device.type == "cuda" else ["eager", "static"]
    for B in args.batches:
        for T in contexts:
            for engine in engines:  # the batched verify: host-length, and the fused layers' fixed-shape step
                session = session_for(target, T + block + 1, taps, engine, batch=B)
                runner = session.runner
                for k, v in zip(runner.keys, runner.values):  # the context's entries (random; values time the same)
                    k[:, :, :T].normal_()
                    v[:, :, :T].normal_()
                kv_bytes = sum(k[:, :, :T].numel() * k.element_size() for k in runner.keys + runner.values)
                floor = (weights + kv_bytes) / bandwidth
                verify = _Verify(session, True if engine != "eager" else None)
                taps_out = torch.zeros(B, block, runner.tap_width, device=device, dtype=runner.dtype)
                for L, name in ((1, "ar_step"), (block, "verify")):
                    ids = torch.randint(0, min(1000, target.config.vocab_size), (B, L), device=device)
                    p50 = timed(lambda: verify(ids, list(range(B)), [T] * B, taps_out[:, :L]), args.steps, device)
                    report["rows"].append({"section": "shape", "system": name, "engine": engine, "batch": B,
                                           "context": T, "rows_per_seq": L, "p50_ms": p50 * 1e3,
                                           "floor_ms": floor * 1e3, "over_floor": p50 / floor})
                    log(f"B={B:2d} T={T:6d} {name:8s} {engine:6s} p50 {p50 * 1e3:8.2f} ms  floor {floor * 1e3:7.2f} ms"
                        f"  x{p50 / floor:.2f}")
                p50 = timed(drafts(session, drafter, B, T, block), args.steps, device)
                report["rows"].append({"section": "shape", "system": "draft_rows", "engine": engine, "batch": B,
                                       "context": T, "p50_ms": p50 * 1e3})
                log(f"B={B:2d} T={T:6d} draft    {engine:6s} p50 {p50 * 1e3:8.2f} ms  ({B} rows, one drafter forward)")
                del session, runner, verify
                release_fast_state(target)
            if hf_steps is not None and B <= args.hf_max_batch:  # transformers' own batched AR step, same shape
                release_fast_state(target)
                torch.cuda.empty_cache()
                p50 = statistics.median(hf_steps(target, T, args.hf_steps, batch=B))
                report["rows"].append({"section": "shape", "system": "hf_ar_step", "engine": "hf", "batch": B,
                                       "context": T, "p50_ms": p50 * 1e3})
                log(f"B={B:2d} T={T:6d} hf_ar_step (transformers generate, DynamicCache) p50 {p50 * 1e3:8.2f} ms")
                torch.cuda.empty_cache()
            by = {(r["system"], r.get("engine")): r for r in report["rows"] if r["section"] == "shape"
                  and r["batch"] == B and r["context"] == T}
            for engine in engines:
                ar, ver = by[("ar_step", engine)], by[("verify", engine)]
                report["ratios"][f"batched_ar_over_floor_{engine}_t{T}_b{B}"] = ar["over_floor"]
                report["ratios"][f"batched_verify_over_ar_{engine}_t{T}_b{B}"] = ver["p50_ms"] / ar["p50_ms"]
                report["ratios"][f"batched_round_over_ar_{engine}_t{T}_b{B}"] = (
                    (ver["p50_ms"] + by[("draft_rows", engine)]["p50_ms"]) / ar["p50_ms"])
                if ("hf_ar_step", "hf") in by:  # both make B tokens a step: throughput ratio = step-time ratio
                    report["ratios"][f"ar_batched_{engine}_over_hf_batched_throughput_t{T}_b{B}"] = (
                        by[("hf_ar_step", "hf")]["p50_ms"] / ar["p50_ms"])
            if T == 32768 and B == 8 and "graphs" in engines:  # issue 35's summary keys (the graphs engine)
                r = report["ratios"]
                report["summary"] = {
                    "batched_ar_over_floor_8b_32k_b8": r["batched_ar_over_floor_graphs_t32768_b8"],
                    "batched_sd_round_over_ar_8b_32k_b8": r["batched_round_over_ar_graphs_t32768_b8"],
                    "batched_ar_over_hf_batched_throughput_8b_32k_b8":
                        r.get("ar_batched_graphs_over_hf_batched_throughput_t32768_b8")}
            save()


def drafts(session, drafter, B: int, T: int, block: int):
    """A call drafting for ``B`` rows whose drafter caches hold ``T`` random entries, as ``session``'s engine drafts a
    batched round (all ``block`` rows of the last verify committed): ``propose_rows`` on the host (``eager``), else the
    rows drafting step (:meth:`~fold_hf.generation.static_drafter_rows.RowsDrafter.draft_rows`, a CUDA graph in
    ``graphs``) with the fused drafter layers on CUDA."""
    from fold_hf.generation.static_drafter import preallocated_cache
    from fold_hf.modeling.drafter_rows import propose_rows

    device, width = session.device, session.runner.tap_width
    if session.engine == "eager":
        caches = [preallocated_cache(drafter, T + block + 1, device, T + block) for _ in range(B)]
        for cache in caches:  # the context's entries (random; they time the same as real ones)
            for layer in cache.layers:
                layer.keys[:, :, : T - block].normal_()
                layer.values[:, :, : T - block].normal_()
                layer.length = T - block
        last = torch.zeros(1, dtype=torch.long, device=device)
        new = torch.randn(1, block, width, device=device, dtype=session.runner.dtype)
        greedy = lambda logits, first_slot=0: (logits.argmax(-1), None)  # noqa: E731

        def host():  # the caches keep their length: every call commits the same block again
            for cache in caches:
                for layer in cache.layers:
                    layer.length = T - block
            return propose_rows(drafter, [last] * B, [new] * B, caches, [T] * B, [block - 1] * B, [greedy] * B)

        return host
    static = session.rows_drafter(drafter, fused=device.type == "cuda")
    if static is None:
        raise RuntimeError(f"engine {session.engine!r} has no rows drafting step here (the warning above says why)")
    for layer in static.cache.layers:
        layer.keys[:, :, : T - block].normal_()
        layer.values[:, :, : T - block].normal_()
    features, lengths = session.draft_row_buffers(B, static.verify_rows)
    features.normal_()
    lengths.copy_(torch.tensor([[T - block, block, 0, a] for a in range(B)]))
    rows, with_far = tuple(range(B)), static.needs_far(T)
    step = session.step(("draft_rows", B, with_far), lambda: static.draft_rows(features, lengths, with_far, rows))
    return step.replay


# ------------------------------------------------------------------------------------------------ suite section
def suite_requests(path, tier: int, limit: int | None) -> list[dict]:
    """The requests of the saved suite ``path`` whose tier is ``tier`` (at most ``limit``), in the file's order."""
    from fold_hf.bench.suites import load_requests

    requests = [r for r in load_requests(path) if int(r["tier"]) == tier]
    if not requests:
        raise SystemExit(f"{path} has no request of tier {tier}")
    return requests[:limit] if limit else requests


def session_steps(target) -> dict:
    """The fast session's fixed-shape steps (CUDA graphs on the graphs engine) by key; empty without a session."""
    from fold_hf.generation.fast import SESSION_ATTR

    session = target.__dict__.get(SESSION_ATTR)
    return dict(session.steps) if session is not None else {}


def suite_section(args, device: torch.device, report: dict, save) -> None:
    """Section ``suite`` (module docstring): methods x B over a suite's tier, whole calls, per-row τ."""
    from fold_hf.bench.methods import default_methods, resolve_methods

    if args.dry_run:  # a saved suite of two tiers, random ids; the section reads the --tokens tier back
        from fold_hf.bench.suites import save_requests

        target, drafter = tiny_pair(device)
        g = torch.Generator().manual_seed(7)
        saved = [{"id": f"tiny-{tier}-{i}", "suite": "tiny", "tier": tier, "new_tokens": args.new,
                  "input_ids": torch.randint(0, 200, (tier,), generator=g).tolist()}
                 for tier in (args.tokens // 2, args.tokens) for i in range(max(args.batches))]
        save_requests(saved, Path(args.out) / "tiny_requests.jsonl")
        requests = suite_requests(Path(args.out) / "tiny_requests.jsonl", args.tokens, None)
        pair = "tiny"
    else:
        from fold_hf.pairs import load_pair

        target, _, drafter = load_pair(args.pair, device=device)
        requests = suite_requests(args.suite, args.tier, args.max_requests)
        pair = args.pair
    pad = pad_id(target)
    wanted = resolve_methods(args.methods)
    methods = {m.name: m.config for m in default_methods(drafter.fold_config.window, drafter.fold_config.train_length)}
    unknown = [m for m in wanted if m not in methods or methods[m] is None]
    if unknown:
        raise SystemExit(f"--methods: {unknown} are not speculative methods of fold_hf.bench.methods")
    systems = {"ar": None, **{m: methods[m] for m in wanted}}
    tier = len(requests[0]["input_ids"])
    kw = dict(max_new_tokens=args.new, do_sample=False, eos_token_id=[], return_stats=True, exact=args.exact)
    throughput: dict[tuple[str, int], float] = {}
    alone: list[list[int]] = []  # AR of every request alone (B = 1, run first when --batches has 1)
    decode_throughput: dict[tuple[str, int], float] = {}
    for B in args.batches:
        groups = [requests[i : i + B] for i in range(0, len(requests) - B + 1, B)]  # whole groups only
        if not groups:
            raise SystemExit(f"B = {B}: fewer than {B} requests of tier {args.tier}")
        reference: list[list[int]] = []
        for name, config in systems.items():
            method_drafter = drafter if config is not None else None

            def call(group, method_drafter=method_drafter, config=config):
                ids, mask = batch_of([r["input_ids"] for r in group], pad)
                result = fast_generate(target, method_drafter, ids.to(device), mask.to(device), fold_config=config,
                                       **kw)
                rows = result.rows if hasattr(result, "rows") else [result]
                return ([row.new_tokens[0].tolist() for row in rows], [row.tau for row in rows],
                        decode_phase(rows))

            call(groups[0])  # warm-up: the session, its graphs and kernels (not timed)
            steps_before = len(session_steps(target))
            tokens, taus, elapsed, decoding, group_s = [], [], 0.0, 0.0, []
            for group in groups:
                start = sync(device)
                out, tau, decode_s = call(group)
                group_s.append(sync(device) - start)
                elapsed += group_s[-1]
                decoding += decode_s
                tokens += out
                taus += tau
            if name == "ar":
                reference = tokens
                if B == 1:
                    alone = tokens
            new = sum(len(t) for t in tokens)
            after_first = new - len(tokens)  # the first token of every row comes from its prefill
            throughput[name, B] = new / elapsed
            decode_throughput[name, B] = after_first / decoding
            differ = sum(a != b for a, b in zip(tokens, reference))
            row = {"section": "suite", "pair": pair, "system": name, "batch": B, "tier": tier, "requests": len(tokens),
                   "new_tokens": args.new, "seconds": elapsed, "tokens_per_s": new / elapsed,
                   "decode_seconds": decoding, "decode_tokens_per_s": after_first / decoding,
                   "tau_mean": statistics.fmean(taus) if config is not None else 1.0,
                   "tau_rows": taus if config is not None else None, "rows_differing_from_ar": differ,
                   # against AR of the request alone (B = 1): exact mode's promise is 0 at every B and method
                   "rows_differing_from_ar_alone": (sum(a != b for a, b in zip(tokens, alone)) if alone else None),
                   "exact": bool(args.exact),
                   "group_seconds": group_s,
                   # fixed-shape steps (graphs) the timed calls built that the warm-up had not: their captures are
                   # in the timed seconds
                   "steps_built_while_timed": len(session_steps(target)) - steps_before}
            report["rows"].append(row)
            log(f"suite B={B:2d} {name:8s} {new / elapsed:8.1f} tok/s (decode {after_first / decoding:8.1f})  "
                f"tau {row['tau_mean']:.2f}  rows differing from AR {differ}/{len(tokens)} "
                f"(from AR alone {row['rows_differing_from_ar_alone']})  steps built while timed "
                f"{row['steps_built_while_timed']}")
            save()
        release_fast_state(target)
        for name in wanted:
            report["ratios"][f"{name}_over_ar_throughput_b{B}"] = throughput[name, B] / throughput["ar", B]
            report["ratios"][f"{name}_over_ar_decode_throughput_b{B}"] = (decode_throughput[name, B]
                                                                         / decode_throughput["ar", B])
    if 1 in args.batches:
        for B in args.batches:
            for name in wanted:
                if B != 1:
                    report["ratios"][f"{name}_speedup_b{B}_over_b1"] = (
                        report["ratios"][f"{name}_over_ar_throughput_b{B}"]
                        / report["ratios"][f"{name}_over_ar_throughput_b1"])
    # how far each method could go at these slowest rows' τ (benchmarks/batched_ceiling.py, issue #35's 1.3x goal)
    from batched_ceiling import ceilings, describe

    report["ceilings"] = ceilings(report, goal=1.3)
    for c in report["ceilings"]:
        log("suite " + describe(c))
    if (pair == "gemma3-270m" and not args.exact and tier >= 32 * 1024 - 64  # 32,704 + 64
            and "fold-a2" in wanted and 8 in args.batches):
        summary = report.setdefault("summary", {})
        summary["gemma3_batched_fold_over_ar_throughput_32k_b8"] = report["ratios"]["fold-a2_over_ar_throughput_b8"]
        summary["gemma3_batched_fold_over_ar_decode_throughput_32k_b8"] = report["ratios"][
            "fold-a2_over_ar_decode_throughput_b8"]
    save()


def decode_phase(rows) -> float:
    """Seconds a call spent decoding after every row had its first token: from the last row's first token (the rows
    are prefilled one after another, each row's first token comes from its prefill) to the last row's end, from the
    rows' own statistics (``ttft_s`` from the call's start, ``decode_s`` after it). One row: its ``decode_s``."""
    return max(row.ttft_s + row.decode_s for row in rows) - max(row.ttft_s for row in rows)


def tiny_pair(device: torch.device):
    """A small Llama and a drafter of its shape (``--dry-run``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=4096, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(cfg).eval().to(device)
    target.generation_config.eos_token_id = None
    target.generation_config.pad_token_id = 0
    dcfg = FoldDrafterConfig(block_size=4, num_target_layers=4, target_layer_ids=[1, 3], mask_token_id=255,
                             vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    drafter = FoldDrafter(dcfg, FoldConfig(window=16)).eval().to(device)
    drafter.bind_target(target)
    return target, drafter


def plot_pair(report: dict, path: Path) -> bool:
    """``batched_throughput.png``: tokens/s of every system of the pair section by batch size (y from 0); False when
    matplotlib is missing or there is no pair row."""
    rows = [r for r in report["rows"] if r["section"] == "pair"]
    if not rows:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log('matplotlib is not installed: no plot written (pip install "fold-hf[demo]")')
        return False
    labels = {"fold_batched": "FOLD, batched rounds", "fold_batched_graphs": "FOLD, batched rounds (graphs)",
              "ar_batched_graphs": "AR, batched (graphs)", "fold_rows": "FOLD, one call per row",
              "fold_rows_graphs": "FOLD, one call per row (graphs)", "ar_batched": "AR, batched (ours)",
              "hf_batched": "AR, transformers' batched generate"}
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for system, label in labels.items():
        points = sorted((r["batch"], r["tokens_per_s"]) for r in rows if r["system"] == system)
        if points:
            ax.plot(*zip(*points), marker="o", label=label)
    ax.set_xlabel("prompts in the batch (B)")
    ax.set_ylabel("new tokens per second, whole calls")
    ax.set_ylim(bottom=0)
    ax.set_xticks(sorted({r["batch"] for r in rows}))
    machine = report["machine"]
    ax.set_title(f"{rows[0]['pair']}: {rows[0]['prompt_tokens']}-token prompts, {rows[0]['new_tokens']} new tokens\n"
                 f"{machine['device']}, {machine['date'][:10]}", fontsize=9)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pair", default="smollm2-135m")
    parser.add_argument("--batches", default="1,2,4,8")
    parser.add_argument("--tokens", type=int, default=1024, help="prompt tokens per row")
    parser.add_argument("--new", type=int, default=64, help="new tokens per row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", action="store_true", help="the 8B-shape section instead (CUDA)")
    parser.add_argument("--contexts", default="8192,32768", help="contexts of the shape section")
    parser.add_argument("--steps", type=int, default=20, help="timed forwards per shape row")
    parser.add_argument("--hf-steps", type=int, default=12,
                        help="transformers' AR steps per shape row (0: none; B <= --hf-max-batch)")
    parser.add_argument("--hf-max-batch", type=int, default=8, help="largest B of the shape section's HF rows")
    parser.add_argument("--suite", help="the suite section: a saved suite's requests.jsonl")
    parser.add_argument("--tier", type=int, default=32768, help="the suite section's tier (prompt tokens)")
    parser.add_argument("--methods", default="fold-a2,dflash,window", help="the suite section's methods (and AR)")
    parser.add_argument("--max-requests", type=int, default=None, help="the suite section's requests at most")
    parser.add_argument("--exact", action="store_true",
                        help="the suite section in exact mode (issue 37): every row's output = AR of its request alone")
    parser.add_argument("--dry-run", action="store_true", help="tiny random pair: checks that every section runs")
    parser.add_argument("--plot-only", action="store_true", help="redraw --out's plot from its batched.json")
    args = parser.parse_args(argv)
    if args.plot_only:
        report = json.loads((Path(args.out) / "batched.json").read_text())
        plot_pair(report, Path(args.out) / "batched_throughput.png")
        return report
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    args.methods = [m for m in args.methods.split(",") if m]
    if args.dry_run:
        args.tokens, args.new, args.repeats, args.steps = 40, 6, 1, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.shape and device.type != "cuda" and not args.dry_run:
        raise SystemExit("--shape needs a CUDA GPU (or --dry-run)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(device), "args": {k: v for k, v in vars(args).items()}, "rows": [], "ratios": {}}
    log(json.dumps(report["machine"]))

    def save() -> None:
        (out / "batched.json").write_text(json.dumps(report, indent=2))
        fields = sorted({key for row in report["rows"] for key in row})
        with (out / "batched.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(report["rows"])

    with torch.no_grad():
        if args.shape or args.dry_run:
            shape_section(args, device, report, save)
        if args.suite or args.dry_run:
            suite_section(args, device, report, save)
        if not (args.shape or args.suite) or args.dry_run:
            pair_section(args, device, report, save)
    save()
    plot_pair(report, out / "batched_throughput.png")
    for key, value in report["ratios"].items():
        log(f"{key} = {value:.3f}")
    return report


if __name__ == "__main__":
    main()
