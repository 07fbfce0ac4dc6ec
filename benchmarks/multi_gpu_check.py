"""A target split across two GPUs (``device_map="auto"``) with a FOLD assistant: lossless on both generate paths.

Self-contained: builds a random Llama-style target (about 1.4B parameters, fp32 so that block verification and
one-token steps agree to the last bit on random weights), saves it, reloads it with ``device_map="auto"`` and a
``max_memory`` that forces it across ``cuda:0`` and ``cuda:1``, trains a one-layer DFlash drafter for a few seconds on
the target's greedy continuations of the check's prompts (so that drafts are mostly accepted and sometimes rolled
back), then checks that
greedy output equals plain ``target.generate`` through ``fold_hf.generate`` and ``target.generate(assistant_model=...)``,
with the drafter on the lm_head's device and on ``cuda:0``, and that sampling runs across devices.

Run from the repository root on a machine with 2 GPUs (about 1-2 minutes on 2 H200s)::

    python benchmarks/multi_gpu_check.py --out $OUT

Writes ``$OUT/multi_gpu_check.log`` (what is printed) and ``$OUT/multi_gpu_check.json``; exit status 1 when an
output differs. ``--smoke`` runs the same checks on a tiny target split between ``cpu`` and ``disk`` (no GPU needed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fold_hf  # noqa: E402
from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig  # noqa: E402
from fold_hf.targets.taps import HiddenTaps, decoder_layers  # noqa: E402
from fold_hf.modeling.drafter import execution_device  # noqa: E402
from fold_hf.training import dflash_loss, sample_anchors  # noqa: E402


class Log:
    def __init__(self, path: Path) -> None:
        self.file = path.open("w")

    def __call__(self, *parts) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def sync() -> float:
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    return time.perf_counter()


def target_config(smoke: bool):
    from transformers import LlamaConfig

    if smoke:
        shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                     num_key_value_heads=2)
    else:  # ~1.4B parameters: 5.6 GB in fp32, split over two GPUs by max_memory
        shape = dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=20,
                     num_attention_heads=16, num_key_value_heads=8)
    return LlamaConfig(**shape, max_position_embeddings=8192, rope_theta=10000.0, tie_word_embeddings=False,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, initializer_range=0.05)


def build_and_reload(cfg, folder: Path, smoke: bool, log: Log):
    """Random target saved to ``folder`` and reloaded across devices; returns (model, device map)."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    torch.manual_seed(0)
    build_device = "cpu" if smoke else "cuda:0"
    with torch.device(build_device):
        model = LlamaForCausalLM(cfg).to(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    del model
    if not smoke:
        torch.cuda.empty_cache()
    log(f"target: random Llama, {params / 1e9:.2f}B parameters, fp32, {cfg.num_hidden_layers} layers")
    if smoke:
        layers = cfg.num_hidden_layers
        device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "disk", "lm_head": "disk"}
        device_map.update({f"model.layers.{i}": ("cpu" if i < layers // 2 else "disk") for i in range(layers)})
        model = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map, offload_folder=folder / "offload",
                                                     dtype=torch.float32)
    else:
        half = params * 4 / 2 / 2**30
        max_memory = {0: f"{half:.1f}GiB", 1: f"{2 * half + 8:.0f}GiB"}
        log(f"device_map='auto', max_memory={max_memory}")
        model = AutoModelForCausalLM.from_pretrained(folder, device_map="auto", max_memory=max_memory,
                                                     dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model, dict(model.hf_device_map)


def describe_placement(model, drafter_layers: list[int], log: Log) -> dict:
    device_map = model.hf_device_map
    by_device: dict[str, list[str]] = {}
    for name, dev in device_map.items():
        by_device.setdefault(str(dev), []).append(name)
    for dev, names in by_device.items():
        layers = [n for n in names if n.startswith("model.layers.")]
        others = [n for n in names if not n.startswith("model.layers.")]
        span = f"layers {layers[0].split('.')[-1]}..{layers[-1].split('.')[-1]}" if layers else "no layers"
        log(f"  device {dev}: {span} ({len(layers)}), {', '.join(others) or '-'}")
    layer_list, _ = decoder_layers(model)
    taps = {lid: str(execution_device(layer_list[lid])) for lid in drafter_layers}
    placement = {
        "embedding": str(execution_device(model.get_input_embeddings())),
        "lm_head": str(execution_device(model.get_output_embeddings())),
        "taps": taps,
        "devices": sorted(by_device),
    }
    log(f"  embedding on {placement['embedding']}, lm_head on {placement['lm_head']}, tapped layers {taps}")
    return placement


def train_drafter(target, cfg, device: torch.device, sequences: list[tuple[torch.Tensor, int]], steps: int,
                  log: Log, smoke: bool) -> FoldDrafter:
    """One-layer DFlash drafter fitted to the target's greedy continuations of the check's own prompts.

    Random weights give no text a small drafter could generalize over, so it memorizes the continuations it will be
    asked to draft: drafts are then mostly accepted and sometimes rolled back, which is what the check must exercise.
    ``sequences``: ``([1, P + N] tokens, P)`` pairs.
    """
    layers = cfg.num_hidden_layers
    taps = [1, layers // 2, layers - 2]
    dcfg = FoldDrafterConfig(block_size=8, num_target_layers=layers, target_layer_ids=taps,
                             mask_token_id=cfg.vocab_size - 1, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                             intermediate_size=cfg.intermediate_size // 2, num_hidden_layers=1,
                             num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
                             head_dim=cfg.hidden_size // cfg.num_attention_heads, rope_theta=10000.0,
                             max_position_embeddings=8192)
    torch.manual_seed(1)
    drafter = FoldDrafter(dcfg, FoldConfig(window=32 if smoke else 256, alpha=2.0)).to(device, torch.float32)
    drafter.bind_target(target)
    g = torch.Generator().manual_seed(0)
    start = sync() if device.type == "cuda" else time.perf_counter()
    tapper = HiddenTaps(target, taps, device=device)
    features = []
    with torch.no_grad():
        for seq, _ in sequences:
            with tapper:
                target(seq)
            features.append(tapper.features())
    drafter.train()
    optimizer = torch.optim.Adam(drafter.parameters(), lr=2e-3)
    for step in range(steps):
        i = step % len(sequences)
        seq, prompt_len = sequences[i]
        # anchors inside the continuation, where the check drafts
        anchors = sample_anchors(seq.shape[1], drafter.block_size, 32, generator=g, min_context=prompt_len - 1)
        loss, stats = dflash_loss(drafter, features[i], seq.to(device), anchors.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    drafter.eval()
    end = sync() if device.type == "cuda" else time.perf_counter()
    acc = [round(a, 2) for a in stats["accuracy"].tolist()]
    log(f"drafter: 1 layer, block 8, taps {taps}, fitted {steps} steps in {end - start:.1f}s on the check's "
        f"continuations, last slot accuracy {acc}")
    return drafter


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    a, b = a.reshape(-1).cpu(), b.reshape(-1).cpu()
    if a.shape != b.shape:
        return min(a.numel(), b.numel())
    diff = (a != b).nonzero()
    return int(diff[0]) if diff.numel() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[64, 1024])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="tiny target split between cpu and disk (no GPU)")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "multi_gpu_check.log")
    if not args.smoke and torch.cuda.device_count() < 2:
        log(f"needs 2 GPUs, found {torch.cuda.device_count()} (use --smoke for the CPU/disk version)")
        return 2
    import transformers

    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{torch.cuda.device_count()} GPU(s): {[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}")
    t0 = time.perf_counter()
    cfg = target_config(args.smoke)
    report: dict = {"checks": [], "smoke": args.smoke}
    with tempfile.TemporaryDirectory() as tmp:
        target, device_map = build_and_reload(cfg, Path(tmp) / "target", args.smoke, log)
        devices = {str(d) for d in device_map.values()}
        head_device = execution_device(target.get_output_embeddings())
        first_device = execution_device(target.get_input_embeddings())
        g = torch.Generator().manual_seed(3)
        prompts, references = [], []
        for length in args.prompt_tokens:
            ids = torch.randint(0, cfg.vocab_size - 1, (1, length), generator=g).to(first_device)
            start = time.perf_counter()
            references.append(target.generate(ids, max_new_tokens=args.new_tokens, do_sample=False))
            prompts.append((ids, time.perf_counter() - start))
        drafter = train_drafter(target, cfg, head_device, [(r, p.shape[1]) for r, (p, _) in zip(references, prompts)],
                                args.train_steps, log, args.smoke)
        log("placement:")
        report["placement"] = describe_placement(target, drafter.config.target_layer_ids, log)
        if not args.smoke and not {"0", "1"} <= devices:
            log(f"FAIL: the target did not span two GPUs: {sorted(devices)}")
            return 1
        report["seconds_setup"] = round(time.perf_counter() - t0, 1)

        ok = True
        for (ids, plain_s), plain in zip(prompts, references):
            length = ids.shape[1]
            ar = fold_hf.generate(target, None, input_ids=ids, max_new_tokens=args.new_tokens, return_stats=True)
            runs = [("fold_hf.generate AR", ar.sequences, None, ar.tpot_s)]
            for place in ([head_device, first_device] if head_device != first_device else [head_device]):
                drafter.to(place)
                for mode in ("fold", "dflash"):
                    config = drafter.fold_config.replace(mode=mode)
                    res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=args.new_tokens,
                                           fold_config=config, return_stats=True)
                    runs.append((f"fold_hf.generate {mode}, drafter on {place}", res.sequences, res.tau, res.tpot_s))
                drafter.set_fold_config(drafter.fold_config.replace(mode="fold"))
                start = time.perf_counter()
                hf = target.generate(ids, assistant_model=drafter, max_new_tokens=args.new_tokens, do_sample=False,
                                     fold_fast=False)
                hf_s = time.perf_counter() - start
                rounds = drafter.last_acceptance_lengths
                runs.append((f"target.generate(assistant_model) fold, drafter on {place} (ms incl. prefill)", hf,
                             sum(rounds) / max(1, len(rounds)), hf_s / args.new_tokens))
            drafter.to(head_device)
            sampler = torch.Generator(device=head_device).manual_seed(0)
            sampled = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=args.new_tokens, do_sample=True,
                                       temperature=0.8, top_p=0.95, generator=sampler, return_stats=True)
            sampled_ok = sampled.num_new_tokens == args.new_tokens
            log(f"\nprompt {length} tokens, {args.new_tokens} new; plain target.generate {plain_s:.2f}s "
                f"({plain_s / args.new_tokens * 1e3:.1f} ms/token incl. prefill)")
            log(f"  {'path':74s} {'tau':>5s} {'ms/tok':>7s}  same as plain")
            for name, seq, tau, per_token in runs:
                diff = first_difference(seq, plain)
                same = diff is None
                ok &= same
                tau_text = f"{tau:5.2f}" if tau is not None else "    -"
                log(f"  {name:74s} {tau_text} {per_token * 1e3:7.1f}  {same}" + ("" if same else f" (first diff {diff})"))
                report["checks"].append({"prompt_tokens": length, "path": name, "same_as_plain": same, "tau": tau,
                                         "ms_per_token": round(per_token * 1e3, 2)})
            log(f"  sampling (T=0.8, top-p 0.95) across devices: {sampled.num_new_tokens} tokens, tau {sampled.tau:.2f}")
            ok &= sampled_ok
            report["checks"].append({"prompt_tokens": length, "path": "sampling", "ok": sampled_ok,
                                     "tau": sampled.tau})
    report["ok"] = bool(ok)
    report["seconds_total"] = round(time.perf_counter() - t0, 1)
    (out / "multi_gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    log(f"\n{'PASS' if ok else 'FAIL'}: every greedy output {'equals' if ok else 'does NOT equal'} plain "
        f"target.generate; {report['seconds_total']}s total")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
