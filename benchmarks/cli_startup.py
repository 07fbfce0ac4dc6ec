"""Wall time of `fold-hf --help` (and of the commands' own help) against `import torch`, in fresh processes.

Usage: python benchmarks/cli_startup.py [--repeats 5] [--out FILE.json]

Each command runs ``--repeats`` times in a new interpreter (``python -m fold_hf.cli`` is what the ``fold-hf`` script
runs); the median and min are reported with the machine's load average, since a shared machine inflates every
number. ``fold-hf --help`` imports neither torch nor transformers; ``fold-hf bench --help`` does (it lists the method
names from :func:`fold_hf.bench.default_methods`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "fold-hf --help": [sys.executable, "-m", "fold_hf.cli", "--help"],
    "fold-hf doctor --help": [sys.executable, "-m", "fold_hf.cli", "doctor", "--help"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "fold-hf bench --help": [sys.executable, "-m", "fold_hf.cli", "bench", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="runs per command (default: 5)")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    rows = {}
    for name, cmd in COMMANDS.items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            times.append(time.perf_counter() - start)
        rows[name] = {"median_s": statistics.median(times), "min_s": min(times), "runs_s": times}
        print(f"{name:28s} median {rows[name]['median_s']:6.2f} s  min {rows[name]['min_s']:6.2f} s", flush=True)
    report = {"commands": rows, "load_average": os.getloadavg(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "machine": platform.machine()}
    print(f"load average {report['load_average']}, {report['cpus']} CPUs")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
