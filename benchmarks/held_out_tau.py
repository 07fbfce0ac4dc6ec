"""Held-out τ of one or more drafters of a pair on the same windows: the check `fold-hf train-drafter` runs after its
last step (``fold_hf.train_drafter.evaluate_tau``: greedy, the drafter as trained (dflash), the loop path), run
afterwards — e.g. on the CPU when a GPU call stopped before it — so drafters of different rounds are compared on
identical windows.

    python benchmarks/held_out_tau.py --pair gemma3-270m --mix-file .stage/gmix/mix.jsonl.gz \\
        new=fold_hf/assets/gemma3-270m-dflash old=.gpu/old-drafter --out held_out.json

Windows: ``--requests`` (16) windows of ``--prompt-tokens`` (960) tokens of the mix's evaluation side (each kind's
first 40 group streams, a group's documents joined, as `train-drafter --sources mix` holds them out), drawn with
``--seed`` (2: the seed `train-drafter` uses for a run of seed 1), the pair's BOS first where it has one;
``--new-tokens`` (128) new tokens. The target in ``--dtype`` (float32 by default: every output is then AR's, and τ
does not depend on bf16 near-ties), each drafter in bf16 as committed. Writes ``{"how": ..., NAME: {requests,
prompt_tokens, new_tokens, tau_mean, identical_to_ar, seconds, dtype, sha256, drafter}}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import torch


def held_out_windows(mix_file: str | Path) -> list[str]:
    """The texts `train-drafter --sources mix` holds out (``fold_hf.data.mix.held_out_texts``) from a saved mix."""
    from fold_hf.data.mix import held_out_texts, load_mix

    return held_out_texts(load_mix(mix_file))


def measure(target, tokenizer, drafters: dict[str, str | Path], texts: list[str], *, prompt_tokens: int,
            new_tokens: int, requests: int, seed: int, bos_token_id: int | None) -> dict[str, dict]:
    """``{name: row}`` for each drafter folder, every drafter on the same ``requests`` windows."""
    from fold_hf import FoldDrafter
    from fold_hf.train_drafter import TrainSettings, evaluate_tau

    settings = TrainSettings(prompt_tokens=prompt_tokens, bos_token_id=bos_token_id)
    out = {}
    for name, folder in drafters.items():
        weights = Path(folder) / "model.safetensors"
        if not weights.is_file():
            raise SystemExit(f"{name}: no weights at {weights} (parts joined? cat model.safetensors.part-* > ...)")
        drafter = FoldDrafter.from_pretrained(folder).to(torch.bfloat16)
        started = time.time()
        row = evaluate_tau(target, tokenizer, drafter, texts, settings, requests=requests, new_tokens=new_tokens,
                           seed=seed)
        row.update(seconds=time.time() - started, dtype=str(next(target.parameters()).dtype),
                   sha256=hashlib.sha256(weights.read_bytes()).hexdigest(), drafter=str(folder))
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("drafters", nargs="+", metavar="NAME=DIR")
    parser.add_argument("--pair", default="gemma3-270m")
    parser.add_argument("--mix-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=960)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    drafters = {}
    for spec in args.drafters:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            parser.error(f"drafters are NAME=DIR, got {spec!r}")
        drafters[name] = folder
    import transformers

    from fold_hf.pairs import get_pair

    pair = get_pair(args.pair)
    target, tokenizer = pair.load_target(args.device)
    target = target.to(getattr(torch, args.dtype))
    rows = measure(target, tokenizer, drafters, held_out_windows(args.mix_file), prompt_tokens=args.prompt_tokens,
                   new_tokens=args.new_tokens, requests=args.requests, seed=args.seed,
                   bos_token_id=pair.bos_token_id(tokenizer))
    how = (f"benchmarks/held_out_tau.py (fold_hf.train_drafter.evaluate_tau: greedy, dflash, the loop path) on "
           f"{args.requests} windows of {args.prompt_tokens} tokens drawn with seed {args.seed} from the mix's "
           f"evaluation side ({args.mix_file}, each kind's first 40 group streams), {args.new_tokens} new "
           f"tokens; {pair.title} in {args.dtype}, each drafter in bf16; {args.device}, transformers "
           f"{transformers.__version__}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    Path(args.out).write_text(json.dumps({"how": how, **rows}, indent=1, ensure_ascii=False) + "\n")
    for name, row in rows.items():
        print(f"{name}: τ {row['tau_mean']:.3f}, {row['identical_to_ar']} of {row['requests']} outputs AR's "
              f"({row['seconds']:.0f} s, sha256 {row['sha256'][:8]}…)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
