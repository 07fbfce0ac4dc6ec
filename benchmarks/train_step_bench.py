"""Speed of one `fold-hf train-drafter` step on the GPU: batched drafter forward vs one sequence at a time.

Usage (repo root, one GPU, about a minute; no checkpoint needed):

    python benchmarks/train_step_bench.py --out $OUT/train_step

A random target of SmolLM2-135M's shape (30 layers, hidden 576, 9 heads / 3 KV, MLP 1536, vocab 49152) and
random DFlash drafters (``--layers``) train on random 768-token sequences with the recipe's settings (block 8,
48 anchors per sequence, bf16 autocast, AdamW). Timed per step, after warm-up: the target's tapped forward, the
drafter's loss, backward and optimizer step, either as ``batched`` (one forward over the batch, what
`train_drafter` runs) or ``per_sequence`` (a forward and backward per sequence, what it ran until 2026-11-30).
The speed of a step does not depend on the weights, so random ones measure it. Writes ``train_step.csv`` and
``train_step.json`` (steps/s, sequences/s, peak memory).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_bench import versions  # noqa: E402

from fold_hf import FoldConfig  # noqa: E402
from fold_hf.targets.taps import HiddenTaps  # noqa: E402
from fold_hf.modeling.drafter import FoldDrafter  # noqa: E402
from fold_hf.train_drafter import TrainSettings, drafter_config_for  # noqa: E402
from fold_hf.training import dflash_loss, sample_anchors  # noqa: E402


def smollm2_shaped_target(device, layers: int = 30):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, tie_word_embeddings=True)
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def time_steps(target, layers: int, intermediate: int, batch: int, mode: str, steps: int, warmup: int, device,
               length: int = 768) -> dict:
    settings = TrainSettings(layers=layers, intermediate_size=intermediate, block_size=8, batch=batch, anchors=48,
                             prompt_tokens=length * 2 // 3, new_tokens=length - length * 2 // 3, mask_token_id=16)
    drafter = FoldDrafter(drafter_config_for(target, settings), FoldConfig(mode="dflash")).to(device, torch.float32)
    drafter.bind_target(target)
    drafter.train()
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
    taps = HiddenTaps(target, drafter.config.target_layer_ids)
    gen = torch.Generator().manual_seed(0)
    L = settings.prompt_tokens + settings.new_tokens
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        seqs = torch.randint(0, 49152, (batch, L), generator=gen).to(device)
        with torch.no_grad(), taps:
            target(seqs)
        features = taps.features()
        anchors = torch.stack([sample_anchors(L, 8, 48, generator=gen, min_context=settings.prompt_tokens - 1)
                               for _ in range(batch)])
        anchors = anchors.to(device)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            if mode == "batched":
                loss, _ = dflash_loss(drafter, features, seqs, anchors)
                loss.backward()
            else:
                for i in range(batch):
                    loss, info = dflash_loss(drafter, features[i : i + 1], seqs[i : i + 1], anchors[i])
                    (loss / batch).backward()
                    loss.item(), info["accuracy"].tolist()  # the old loop's per-sequence host reads
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    seconds = (time.perf_counter() - start) / steps
    return dict(layers=layers, intermediate=intermediate, batch=batch, mode=mode, drafter_params_m=round(
        sum(p.numel() for n, p in drafter.named_parameters() if "target" not in n) / 1e6, 2),
        step_ms=round(seconds * 1e3, 1), steps_per_s=round(1 / seconds, 2),
        sequences_per_s=round(batch / seconds, 1),
        peak_gib=round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if cuda else None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--drafters", default="4:1024,6:768", help="layers:MLP width of each drafter timed")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--length", type=int, default=768, help="tokens per training sequence")
    parser.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_step_bench.py needs a CUDA GPU (or --device cpu for a smoke run)")
    args.out.mkdir(parents=True, exist_ok=True)
    target = smollm2_shaped_target(device)
    rows = []
    batches = [int(x) for x in args.batches.split(",")]
    for spec in args.drafters.split(","):
        layers, intermediate = (int(x) for x in spec.split(":"))
        for batch in batches:
            for mode in ("batched", "per_sequence"):
                if mode == "per_sequence" and batch != batches[0]:
                    continue  # the old loop is only timed at the first batch size
                row = time_steps(target, layers, intermediate, batch, mode, args.steps, 3, device, args.length)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = dict(gpu=gpu, **versions(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    with open(args.out / "train_step.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(meta) + list(rows[0]))
        writer.writeheader()
        writer.writerows({**meta, **r} for r in rows)
    (args.out / "train_step.json").write_text(json.dumps({"machine": meta, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
