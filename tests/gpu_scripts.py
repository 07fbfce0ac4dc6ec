"""The GPU scripts' dry runs (``benchmarks/gpu/*.sh`` with ``DRY=1``) and the ``fold-hf`` commands they print, parsed
by the real CLI with the sub-commands stubbed: an option the parser does not know fails the test that reads them."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPU = ROOT / "benchmarks" / "gpu"
# knobs of the scripts a developer's shell may have set: a dry run starts without them
SCRIPT_KNOBS = ("PAIR", "INIT", "MIX", "REQUESTS", "NEW", "OLD", "METHODS", "DRAFTERS", "TIERS", "PART")


def dry_run(script: str, out, **env) -> subprocess.CompletedProcess:
    """``DRY=1 bash benchmarks/gpu/SCRIPT OUT`` from the repo root with ``env`` (the script knobs unset otherwise)."""
    run_env = {k: v for k, v in os.environ.items() if k not in SCRIPT_KNOBS}
    run_env.update({"DRY": "1", **env})
    return subprocess.run(["bash", str(GPU / script), str(out)], cwd=ROOT, env=run_env, capture_output=True,
                          text=True, timeout=60)


def parsed_commands(stdout: str, monkeypatch) -> list[dict]:
    """Every printed command (``+ CUDA_VISIBLE_DEVICES=.. python -m fold_hf.cli ...``) through ``fold_hf.cli.main``
    with cmd_train / cmd_bench stubbed: their argparse namespaces in order, each with ``gpu`` (the command's
    CUDA_VISIBLE_DEVICES) and ``timeout`` (N of a ``timeout -s INT N`` prefix, else None); a command the parser
    refuses raises SystemExit."""
    import fold_hf.cli as cli

    commands = [shlex.split(line[2:]) for line in stdout.splitlines() if line.startswith("+ ")]
    assert commands and all(c[0].startswith("CUDA_VISIBLE_DEVICES=") for c in commands)
    limits = []  # a command run under `timeout -s INT N` (train_mix.sh's training): N, else None
    for i, c in enumerate(commands):
        timed = c[1:4] == ["timeout", "-s", "INT"]
        limits.append(int(c[4]) if timed else None)
        if timed:
            commands[i] = [c[0], *c[5:]]
    assert all(c[1:4] == ["python", "-m", "fold_hf.cli"] for c in commands), commands
    seen = []
    for name in ("cmd_train", "cmd_bench"):
        monkeypatch.setattr(cli, name, lambda args: seen.append(vars(args)) or 0)
    for command, limit in zip(commands, limits):
        assert cli.main(command[4:]) == 0
        seen[-1]["gpu"] = command[0].split("=", 1)[1]
        seen[-1]["timeout"] = limit
    return seen
