"""Issue 33, hole 3: what a whole ``target.generate(ids, assistant_model=drafter)`` call costs beyond
``fold_hf.fast_generate`` for the same request (call to return, the same rounds), on a Gemma-3-270M-shape target
(random bf16 weights: the shape is what the per-call cost depends on) with the committed Gemma-3 drafter.

Each path is warmed up once with 16 new tokens, then timed over ``--repeats`` whole calls of ``--new`` tokens
(median and spread). ``cProfile`` of one call of each path (host time, cumulative) says where the difference goes.

    python benchmarks/front_door_overhead.py --out $OUT/front_door_overhead          (GPU)
    python benchmarks/front_door_overhead.py --out /tmp/x --dry-run                    (CPU, tiny shapes)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fold_hf  # noqa: E402
from fold_hf import FoldConfig, FoldDrafter  # noqa: E402

DRAFTER = Path(fold_hf.__file__).parent / "assets" / "gemma3-270m-dflash"


def gemma3_270m_shape(device, dry_run: bool):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    size = dict(hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                num_key_value_heads=1, head_dim=256, vocab_size=262144)
    if dry_run:
        size.update(intermediate_size=128, num_hidden_layers=18)
    cfg = Gemma3TextConfig(**size, sliding_window=512, max_position_embeddings=32768, query_pre_attn_scalar=256,
                           rope_theta=1_000_000.0, bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0)
    with torch.device(device):
        target = Gemma3ForCausalLM(cfg).to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    target.generation_config.eos_token_id = [1, 106]
    return target


def timed(fn, repeats: int, device) -> list[float]:
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def profile(fn) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(40)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        args.prompt, args.new, args.repeats = 256, 8, 2
    target = gemma3_270m_shape(device, args.dry_run)
    drafter = FoldDrafter.from_pretrained(DRAFTER, fold_config=FoldConfig(mode="fold", window=512, alpha=2.0))
    drafter = drafter.to(device=device, dtype=next(target.parameters()).dtype).eval()
    vocab = target.config.vocab_size
    ids = torch.randint(5, min(vocab, 200_000), (1, args.prompt), device=device,
                        generator=torch.Generator(device=device).manual_seed(0))
    calls = {
        "target.generate(assistant_model)": lambda n: target.generate(ids, assistant_model=drafter, max_new_tokens=n,
                                                                     do_sample=False),
        "fast_generate": lambda n: fold_hf.fast_generate(target, drafter, ids, max_new_tokens=n),
        "fast_generate(eos as generate)": lambda n: fold_hf.fast_generate(
            target, drafter, ids, max_new_tokens=n, eos_token_id=target.generation_config.eos_token_id),
    }
    report = {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "prompt": args.prompt,
              "new": args.new, "rows": {}}
    for name, call in calls.items():
        call(16)  # warm-up, as the measurement
    for name, call in calls.items():
        seconds = timed(lambda: call(args.new), args.repeats, device)
        report["rows"][name] = {"median_ms": statistics.median(seconds) * 1e3, "min_ms": min(seconds) * 1e3,
                                "max_ms": max(seconds) * 1e3}
        print(f"{name:>34}: median {report['rows'][name]['median_ms']:.1f} ms "
              f"[{report['rows'][name]['min_ms']:.1f}, {report['rows'][name]['max_ms']:.1f}]", flush=True)
    for name, call in list(calls.items())[:2]:
        (out / f"profile_{name.split('(')[0].replace('.', '_')}.txt").write_text(profile(lambda: call(args.new)))
    (out / "front_door_overhead.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
