"""`fold-hf bench`: τ and speedup of every reading mode against AR, by input length, on real long inputs.

Suites (built from evaluation sources only, :mod:`fold_hf.data`):

* ``code``: an installed package's source arranged like Long Code Arena: other files first, files of
  the cut file's directory nearest, the cut file's prefix last; the target continues the file.
* ``books``: spans of held-out Gutenberg plays; the target continues the text.
* ``retrieval``: a span whose end restarts a passage from its first quarter, so the continuation copies
  content thousands of tokens back (where the far memory matters).

Every request runs AR and every method in the same process, one after the other, so each method is
paired with an AR run of the same request on the same machine. Results are appended per request to
``runs.jsonl`` (a run resumes where it stopped; runs from several jobs merge by request id).
:func:`summarize` computes τ, speedup = mean over requests of TPOT_AR / TPOT_method with 95% bootstrap
CIs (2,000 paired resamples, fixed seed), and the number of outputs differing from AR; it writes JSON,
CSV and PNG plots.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import platform
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .generation.loop import generate
from .modeling.fold_config import FoldConfig

SUITES = ("code", "books", "retrieval")
DEFAULT_TIERS = (1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class Method:
    name: str
    config: FoldConfig | None  # None: autoregressive


def window_sweep_methods(windows, train_length: int, alpha: float = 2.0) -> list[Method]:
    """AR, then FOLD (α = ``alpha``) and the window-only ablation at each window W, named ``fold-a2-w{W}`` and
    ``window-w{W}``: how much of FOLD's gain over the window comes from the far memory as W changes."""
    methods = [Method("ar", None)]
    for w in windows:
        methods.append(Method(f"fold-a{alpha:g}-w{w}", FoldConfig(mode="fold", alpha=alpha, window=w,
                                                                 train_length=train_length)))
        methods.append(Method(f"window-w{w}", FoldConfig(mode="window", window=w, train_length=train_length)))
    return methods


def default_methods(window: int, train_length: int, budget: int | None = None) -> list[Method]:
    """AR, FOLD at α ∈ {1, 2, 4} and every baseline, all at the same window."""
    base = dict(window=window, train_length=train_length)
    return [
        Method("ar", None),
        Method("fold-a1", FoldConfig(mode="fold", alpha=1.0, **base)),
        Method("fold-a2", FoldConfig(mode="fold", alpha=2.0, **base)),
        Method("fold-a4", FoldConfig(mode="fold", alpha=4.0, **base)),
        Method("dflash", FoldConfig(mode="dflash", **base)),
        Method("window", FoldConfig(mode="window", **base)),
        Method("streaming", FoldConfig(mode="streaming", budget=budget or window, **base)),
        Method("rerope", FoldConfig(mode="rerope", **base)),
        Method("yarn", FoldConfig(mode="yarn", **base)),
    ]


# ---------------------------------------------------------------------------------------------- suites
def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_suite(tokenizer, suite: str, tiers, per_tier: int, new_tokens: int, seed: int = 0,
                package: str = "transformers", nested: bool = False, bos_token_id: int | None = None) -> list[dict]:
    """Requests ``{"id", "suite", "tier", "input_ids", "new_tokens"}`` of exactly ``tier`` prompt tokens.

    ``nested``: request ``k`` of every tier is the last ``tier`` tokens of one input built at the longest tier, so
    every tier continues the same text at the same point and differences between tiers come from the input's
    length alone (by default each tier draws its own texts). Requests then also carry ``"family"``, the id of
    that longest input. In the retrieval suite a short suffix may no longer hold the distant content the
    continuation copies: there the shorter tiers are a different task, not only a shorter input.

    ``bos_token_id``: every request starts with this token followed by the last ``tier - 1`` tokens of its text
    (for targets trained with BOS first, e.g. Gemma); nested tiers then share their text's suffixes after it."""
    if bos_token_id is not None:
        plain = build_suite(tokenizer, suite, tiers, per_tier, new_tokens, seed, package, nested)
        return [{**req, "input_ids": [bos_token_id] + req["input_ids"][1:]} for req in plain]
    if nested:
        longest = build_suite(tokenizer, suite, [max(tiers)], per_tier, new_tokens, seed, package)
        return [{**req, "id": f"{suite}-{tier}-{k}", "tier": tier, "input_ids": req["input_ids"][-tier:],
                 "family": req["id"]}
                for tier in tiers for k, req in enumerate(longest)]
    from .data import book_split, package_sources, shakespeare_texts

    rng = random.Random(f"{suite}-{seed}")
    requests = []
    if suite == "books":
        _, held = book_split(shakespeare_texts())
        docs = [_encode(tokenizer, t) for t in held.values()]
    else:
        files = package_sources(package)
        by_dir: dict[str, list[int]] = {}
        for i, (path, _) in enumerate(files):
            by_dir.setdefault(str(Path(path).parent), []).append(i)
    for tier in tiers:
        made = 0
        attempts = 0
        while made < per_tier:
            attempts += 1
            if attempts > per_tier * 2000:  # retrieval needs a function early in a file; most start with a licence
                raise ValueError(f"cannot build {per_tier} {suite} requests of {tier} tokens")
            if suite == "books":
                doc = rng.choice(docs)
                if len(doc) < tier + new_tokens:
                    continue
                start = rng.randrange(0, len(doc) - tier - new_tokens)
                ids = doc[start : start + tier]
            elif suite == "code":
                ids = _code_request(tokenizer, files, by_dir, rng, tier)
                if ids is None:
                    continue
            else:
                ids = _retrieval_request(tokenizer, files, rng, tier)
                if ids is None:
                    continue
            requests.append({"id": f"{suite}-{tier}-{made}", "suite": suite, "tier": tier, "input_ids": ids,
                             "new_tokens": new_tokens})
            made += 1
    return requests


def _code_request(tokenizer, files, by_dir, rng, tier):
    cut_idx = rng.randrange(len(files))
    path, text = files[cut_idx]
    lines = text.splitlines(keepends=True)
    if len(lines) < 40:
        return None
    cut = rng.randrange(len(lines) // 2, len(lines) - 10)
    tail = _encode(tokenizer, f"# file: {path}\n" + "".join(lines[:cut]))
    if len(tail) >= tier:
        return tail[-tier:]
    near = [i for i in by_dir.get(str(Path(path).parent), []) if i != cut_idx]
    far = [i for i in range(len(files)) if i not in near and i != cut_idx]
    rng.shuffle(near)
    rng.shuffle(far)
    context: list[int] = []
    for i in near + far:  # nearest files are placed last, right before the cut file
        piece = _encode(tokenizer, f"# file: {files[i][0]}\n{files[i][1]}\n")
        context = piece + context
        if len(context) + len(tail) >= tier:
            break
    ids = context + tail
    return ids[-tier:] if len(ids) >= tier else None


def _retrieval_request(tokenizer, files, rng, tier, cue_chars: int = 80):
    """A code span whose end restarts a function from its first quarter: the answer is ~tier tokens back."""
    text = ""
    while len(text) < tier * 8:
        path, body = files[rng.randrange(len(files))]
        text += f"# file: {path}\n{body}\n"
    marker = "\n\n# (the first function above, repeated)\n"
    body_ids = _encode(tokenizer, text)[:tier]
    body_text = tokenizer.decode(body_ids)
    quarter = len(body_text) // 4
    # the front of the body is trimmed to make room for the cue, so the function starts after the first 1/16
    starts = [m for m in range(len(body_text) // 16, quarter) if body_text.startswith(("\ndef ", "\n    def "), m)]
    if not starts:
        return None
    s = rng.choice(starts) + 1
    cue = body_text[s : s + cue_chars]
    ids = body_ids + _encode(tokenizer, marker + cue)
    return ids[-tier:] if len(ids) >= tier else None


def save_requests(requests: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for req in requests:
            fh.write(json.dumps(req) + "\n")


def load_requests(path: str | Path) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ---------------------------------------------------------------------------------------------- running
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


BENCH_ENGINES = ("loop", "fast")


def run_bench(target, drafter, requests: list[dict], methods: list[Method], out_dir: str | Path,
              max_minutes: float | None = None, log=print, engine: str = "loop", warmup: bool | None = None) -> Path:
    """Run every method on every request not yet in ``out_dir/runs.jsonl``; returns that file.

    ``engine``: ``"loop"`` decodes with the foundation loop (:func:`fold_hf.generate`: transformers' forward,
    the torch read), ``"fast"`` with :func:`fold_hf.fast_generate` (static caches, CUDA graphs and the Triton
    kernels on a GPU), which is what the speedups of a GPU run should time. ``warmup`` (default: on for
    ``fast``) runs each method once on the request before the timed run, so graph capture and kernel compilation
    stay out of the timings; the tokens are the same either way.
    """
    import time

    if engine not in BENCH_ENGINES:
        raise ValueError(f"engine must be one of {BENCH_ENGINES}, got {engine!r}")
    if engine == "fast":
        from .generation.fast import fast_generate, fast_unsupported

        reason = fast_unsupported(target, drafter)
        if reason is not None:
            raise ValueError(f"engine='fast' cannot run this pair: {reason}; use engine='loop'")
        decode = fast_generate
    else:
        decode = generate
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
            kwargs = dict(input_ids=ids, max_new_tokens=req["new_tokens"], fold_config=method.config, eos_token_id=[])
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
                         "dtype": dtype, **({"family": req["family"]} if "family" in req else {})})
        with runs.open("a") as fh:  # a request is written whole, so pairing with its AR run survives restarts
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    return runs


# ---------------------------------------------------------------------------------------------- summary
def _bootstrap_mean_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    gen = torch.Generator().manual_seed(seed)
    v = torch.tensor(values, dtype=torch.float64)
    idx = torch.randint(0, len(v), (resamples, len(v)), generator=gen)
    means = v[idx].mean(1).sort().values
    return float(means[int(0.025 * resamples)]), float(means[int(0.975 * resamples) - 1])


def summarize(run_files: list[str | Path], out_dir: str | Path, title: str = "", focus: str | None = None) -> dict:
    """Merge run files, compute the table, write ``summary.json``, ``summary.csv``, ``paired.csv`` and PNG plots.

    ``focus``: the method compared request by request with every other one (:func:`paired_comparison`; default
    ``fold-a2`` when present, else the first ``fold`` method)."""
    rows = []
    for f in run_files:
        rows += [json.loads(line) for line in Path(f).read_text().splitlines() if line.strip()]
    # runs from before the engine was recorded used the loop
    engine = _one_setting(rows, "engine", "loop", "engines", "their timings do not pair")
    dtype = _one_setting(rows, "dtype", "unrecorded", "dtypes", "their timings and outputs do not pair")
    by_request: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_request.setdefault(row["request"], {})[row["method"]] = row
    methods = sorted({r["method"] for r in rows} - {"ar"}, key=lambda m: (not m.startswith("fold"), m))
    table = []
    for suite in sorted({r["suite"] for r in rows}):
        for tier in sorted({r["tier"] for r in rows if r["suite"] == suite}):
            reqs = [v for v in by_request.values() if "ar" in v and v["ar"]["suite"] == suite and v["ar"]["tier"] == tier]
            for method in methods:
                paired = [v for v in reqs if method in v and v[method]["tpot_s"] > 0 and v["ar"]["tpot_s"] > 0]
                if not paired:
                    continue
                speedups = [v["ar"]["tpot_s"] / v[method]["tpot_s"] for v in paired]
                taus = [v[method]["tau"] for v in paired]
                lo, hi = _bootstrap_mean_ci(speedups)
                tlo, thi = _bootstrap_mean_ci(taus)
                table.append({
                    "suite": suite, "tier": tier, "method": method, "requests": len(paired),
                    "tau": sum(taus) / len(taus), "tau_ci_low": tlo, "tau_ci_high": thi,
                    "speedup": sum(speedups) / len(speedups), "speedup_ci_low": lo, "speedup_ci_high": hi,
                    "tpot_ms": 1000 * sum(v[method]["tpot_s"] for v in paired) / len(paired),
                    "ar_tpot_ms": 1000 * sum(v["ar"]["tpot_s"] for v in paired) / len(paired),
                    "differ_from_ar": sum(not v[method]["same_as_ar"] for v in paired),
                })
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    machine = {}
    for f in run_files:
        meta = Path(f).parent / "machine.json"
        if meta.is_file():
            machine = json.loads(meta.read_text())
    if focus is None:
        focus = "fold-a2" if "fold-a2" in methods else next((m for m in methods if m.startswith("fold")), None)
    paired = paired_comparison(by_request, focus) if focus is not None else []
    retention = length_retention(rows)
    summary = {"title": title, "date": _dt.date.today().isoformat(), "machine": machine,
               "engine": engine, "dtype": dtype, "rows": table,
               "averages": _averages(table), "paired": {"focus": focus, "rows": paired},
               "length_retention": retention}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    for name, data in (("summary.csv", table), ("paired.csv", paired)):
        with (out / name).open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(data[0]) if data else ["suite"])
            writer.writeheader()
            writer.writerows(data)
    _plot(table, out, title)
    return summary


def _one_setting(rows: list[dict], key: str, default: str, plural: str, why: str) -> str | None:
    """The one value of ``key`` over ``rows`` (``default`` where a row lacks it), None without rows; ValueError when
    the rows mix values."""
    values = sorted({r.get(key, default) for r in rows})
    if len(values) > 1:
        raise ValueError(f"the run files mix {plural} {values}: {why}; summarize them apart")
    return values[0] if values else None


def length_retention(rows: list[dict]) -> list[dict]:
    """For nested suites (``build_suite(nested=True)``): per suite and method, τ at the longest tier over τ at the
    shortest, computed per family (the same text at both lengths) and averaged, with a 95% bootstrap CI; empty
    when no row names a family."""
    tau: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if r.get("family") is not None and r["method"] != "ar":
            tau.setdefault((r["suite"], r["method"], r["family"]), {})[r["tier"]] = r["tau"]
    out = []
    for suite, method in sorted({(s, m) for s, m, _ in tau}):
        by_family = [t for (s, m, _), t in tau.items() if (s, m) == (suite, method) and len(t) > 1]
        if not by_family:
            continue
        short, long = min(min(t) for t in by_family), max(max(t) for t in by_family)
        ratios = [t[long] / t[short] for t in by_family if short in t and long in t]
        lo, hi = _bootstrap_mean_ci(ratios)
        out.append({"suite": suite, "method": method, "short_tier": short, "long_tier": long,
                    "families": len(ratios), "tau_ratio": sum(ratios) / len(ratios), "tau_ratio_ci_low": lo,
                    "tau_ratio_ci_high": hi})
    return out


def paired_comparison(by_request: dict[str, dict[str, dict]], focus: str) -> list[dict]:
    """``focus`` against every other method on the same requests, per suite and over all suites.

    Per request, ``delta_tau`` = τ(focus) - τ(other) and ``speed_ratio`` = TPOT(other) / TPOT(focus) (> 1: focus
    is faster); rows give their means with 95% bootstrap CIs and how many requests focus wins, ties and loses
    on τ. Pairing removes the request-to-request spread (the tiers and suites hold different texts), so a CI
    that excludes 0 (or 1) says which method reads better on these inputs even where the per-method CIs overlap.

    Args:
        by_request: ``{request id: {method: run row}}`` (rows as ``run_bench`` writes them).
        focus: the method compared with the others.
    """
    reqs = [v for v in by_request.values() if focus in v and v[focus]["tpot_s"] > 0]
    others = sorted({m for v in reqs for m in v} - {focus, "ar"})
    out = []
    for suite in sorted({v[focus]["suite"] for v in reqs}) + ["all"]:
        chosen = [v for v in reqs if suite == "all" or v[focus]["suite"] == suite]
        for other in others:
            both = [v for v in chosen if other in v and v[other]["tpot_s"] > 0]
            if not both:
                continue
            deltas = [v[focus]["tau"] - v[other]["tau"] for v in both]
            ratios = [v[other]["tpot_s"] / v[focus]["tpot_s"] for v in both]
            dlo, dhi = _bootstrap_mean_ci(deltas)
            rlo, rhi = _bootstrap_mean_ci(ratios)
            out.append({"suite": suite, "focus": focus, "other": other, "requests": len(both),
                        "delta_tau": sum(deltas) / len(deltas), "delta_tau_ci_low": dlo, "delta_tau_ci_high": dhi,
                        "speed_ratio": sum(ratios) / len(ratios), "speed_ratio_ci_low": rlo,
                        "speed_ratio_ci_high": rhi, "tau_wins": sum(d > 0 for d in deltas),
                        "tau_ties": sum(d == 0 for d in deltas), "tau_losses": sum(d < 0 for d in deltas)})
    return out


def _averages(table: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for method in sorted({r["method"] for r in table}):
        sel = [r for r in table if r["method"] == method]
        out[method] = {"tau": sum(r["tau"] for r in sel) / len(sel),
                       "speedup": sum(r["speedup"] for r in sel) / len(sel),
                       "differ_from_ar": sum(r["differ_from_ar"] for r in sel)}
    return out


PLOT_METRICS = (("tau", "acceptance length τ (tokens per target forward)"), ("speedup", "speedup vs AR (TPOT ratio)"))


def _plot(table: list[dict], out: Path, title: str) -> None:
    """``tau_by_length.png`` and ``speedup_by_length.png`` (:func:`plot_figure`); nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional: the table is written regardless, and the user is told
        print('matplotlib is not installed: no plots written (pip install "fold-hf[demo]")')
        return
    for metric, _ in PLOT_METRICS:
        fig = plot_figure(table, metric, title)
        if fig is None:
            return
        fig.savefig(out / f"{metric}_by_length.png", dpi=110, bbox_inches="tight")
        plt.close(fig)


def plot_figure(table: list[dict], metric: str, title: str = ""):
    """One panel per suite of ``metric`` (``tau`` or ``speedup``) by input length, every method with its 95% CI.

    Honest axes: the y axis starts at 0 and always shows 1.0, where a dashed AR line sits (AR's τ is 1 and its
    speedup 1×), so a small gap is not zoomed into a large one; each length's tick says how many requests its points
    average (n); the legend sits outside the panels."""
    import matplotlib.pyplot as plt

    suites = sorted({r["suite"] for r in table})
    if not suites:
        return None
    label = dict(PLOT_METRICS)[metric]
    methods = sorted({r["method"] for r in table}, key=lambda m: (not m.startswith("fold"), m))
    top = max([1.0] + [r[f"{metric}_ci_high"] for r in table if r[f"{metric}_ci_high"] == r[f"{metric}_ci_high"]])
    fig, axes = plt.subplots(1, len(suites), figsize=(4.5 * len(suites), 4), squeeze=False, sharey=True)
    for ax, suite in zip(axes[0], suites):
        rows = [r for r in table if r["suite"] == suite]
        for method in methods:
            sel = sorted((r for r in rows if r["method"] == method), key=lambda r: r["tier"])
            if not sel:
                continue
            x = [r["tier"] for r in sel]
            y = [r[metric] for r in sel]
            err = [[r[metric] - r[f"{metric}_ci_low"] for r in sel], [r[f"{metric}_ci_high"] - r[metric] for r in sel]]
            style = "-o" if method.startswith("fold") else "--."
            ax.errorbar(x, y, yerr=err, fmt=style, capsize=3, label=method, linewidth=2 if method == "fold-a2" else 1)
        ax.axhline(1.0, color="black", linestyle=":", linewidth=1.2, label="AR")
        tiers = sorted({r["tier"] for r in rows})
        counts = {t: sorted({r["requests"] for r in rows if r["tier"] == t}) for t in tiers}
        ax.set_xscale("log", base=2)
        ax.set_xticks(tiers)
        ax.set_xticklabels([(f"{t // 1024}K" if t % 1024 == 0 else str(t)) + "\nn=" +
                            "-".join(str(c) for c in (counts[t][0], counts[t][-1])[: 1 if len(counts[t]) == 1 else 2])
                            for t in tiers])
        ax.minorticks_off()
        ax.set_ylim(0.0, top * 1.08)
        ax.set_title(suite)
        ax.set_xlabel("input length (tokens); n = requests per point")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(label)
    legend = {}  # every method once, whichever panel drew it
    for ax in axes[0]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(name, handle)
    handles, labels = list(legend.values()), list(legend)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.suptitle(title + (" (mean and 95% CI)" if title else "mean and 95% CI"))
    fig.tight_layout()
    return fig
