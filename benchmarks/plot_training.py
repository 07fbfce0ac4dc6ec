"""Training curves of `fold-hf train-drafter` runs, read back from their logs (the progress bar's loss and
slot-1 accuracy), as one PNG: loss and acc1 against step, one line per run.

    python benchmarks/plot_training.py NAME=LOG [NAME=LOG ...] --out curves.png

The logs are what `benchmarks/gpu/train.sh` collects (`train-A.log`, `train-B.log`); a log of a run resumed over
several calls holds every call's lines, in order.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

PROGRESS = re.compile(r"(\d+)/(\d+) \[[^\]]*?acc1=([0-9.]+), loss=([0-9.]+)\]")


def read_curve(log: str | Path) -> list[tuple[int, float, float]]:
    """``(step, loss, acc1)`` of every progress line of a train-drafter log, by step (a step logged twice keeps
    its last line)."""
    points: dict[int, tuple[float, float]] = {}
    for match in PROGRESS.finditer(Path(log).read_text(errors="replace")):
        step, _, acc1, loss = match.groups()
        points[int(step)] = (float(loss), float(acc1))
    return [(step, loss, acc1) for step, (loss, acc1) in sorted(points.items())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="NAME=LOG")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for spec in args.runs:
        name, sep, log = spec.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=LOG, got {spec!r}")
        curve = read_curve(log)
        if not curve:
            raise SystemExit(f"{log}: no progress lines with loss and acc1")
        steps = [p[0] for p in curve]
        ax_loss.plot(steps, [p[1] for p in curve], label=name)
        ax_acc.plot(steps, [p[2] for p in curve], label=name)
        print(f"{name}: {len(curve)} points, last step {steps[-1]}, loss {curve[-1][1]:.3f}, acc1 {curve[-1][2]:.2f}")
    ax_loss.set(xlabel="step", ylabel="DFlash loss (weighted over slots)", yscale="log", title="training loss")
    ax_acc.set(xlabel="step", ylabel="slot-1 accuracy", title="first drafted token correct", ylim=(0, 1))
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
