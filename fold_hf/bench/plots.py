"""Plots of a benchmark summary: τ and speedup by input length, one panel per suite (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path


PLOT_METRICS = (("tau", "acceptance length τ (tokens per target forward)"), ("speedup", "speedup vs AR (TPOT ratio)"))


def write_plots(table: list[dict], out: Path, title: str) -> None:
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
            # clamped at 0: on constant values the bootstrap bounds equal the mean up to rounding, either side of it
            err = [[max(0.0, r[metric] - r[f"{metric}_ci_low"]) for r in sel],
                   [max(0.0, r[f"{metric}_ci_high"] - r[metric]) for r in sel]]
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
