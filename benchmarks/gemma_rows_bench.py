"""The Gemma family's batched verify (issue 35): host-length ``forward_rows`` against the fused layers over rows
(``forward_rows_static``, launched eagerly and replayed as a CUDA graph, what the graphs engine does), and one row's
fused ``forward_static`` (captured), at the Gemma-3-270M shape with random weights (bf16, CUDA).

    python benchmarks/gemma_rows_bench.py --context 32768 --rows 1,8 --width 8

Prints per call: milliseconds per verify forward of ``B`` rows of ``W`` tokens (rows at contexts ``context - 37 a``),
and how far the host-length and fused logits are apart (bf16: both round, random weights put near-ties everywhere).
The real pair's weights are not needed (timings depend on the shapes only).
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers as tf

from fold_hf.generation.graphs import CapturedStep
from fold_hf.targets.base import bucket_length
from fold_hf.targets.gemma import GemmaStaticTarget


def gemma3_270m(vocab: int = 262144) -> tf.Gemma3ForCausalLM:
    """Gemma-3-270M's text shape (18 layers, 5 sliding of window 512 to 1 global, 4 query heads of 256, 1 KV head)."""
    layer_types = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    config = tf.Gemma3TextConfig(vocab_size=vocab, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                                 num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                                 query_pre_attn_scalar=256, max_position_embeddings=65536, layer_types=layer_types,
                                 rope_theta=1e6)
    torch.manual_seed(0)
    return tf.Gemma3ForCausalLM(config).to("cuda", torch.bfloat16).eval()


def milliseconds(fn, repeats: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=32768)
    parser.add_argument("--rows", default="1,8")
    parser.add_argument("--width", type=int, default=8, help="verify block width W (1 + proposals)")
    args = parser.parse_args()
    model = gemma3_270m()
    ctx, W = args.context, args.width
    for B in (int(b) for b in args.rows.split(",")):
        runner = GemmaStaticTarget(model, ctx + 64, batch=B)
        starts = [ctx - 37 * a for a in range(B)]
        for a, start in enumerate(starts):
            runner.prefill(torch.randint(0, 1000, (1, start), device="cuda"), row=a)
        ids = torch.randint(0, 1000, (B, W), device="cuda")
        positions = torch.tensor(starts, device="cuda")[:, None] + torch.arange(W, device="cuda")
        bucket = bucket_length(max(starts) + W, runner.capacity)
        rows = list(range(B))
        host = milliseconds(lambda: runner.forward_rows(ids, rows, starts))
        eager = milliseconds(lambda: runner.forward_rows_static(ids, positions, rows, bucket))
        graph = milliseconds(CapturedStep(lambda: runner.forward_rows_static(ids, positions, rows, bucket)).replay)
        a = runner.forward_rows(ids, rows, starts).float()
        b = runner.forward_rows_static(ids, positions, rows, bucket).float()
        print(f"ctx {ctx} B={B} W={W}: host-length forward_rows {host:.2f} ms, forward_rows_static eager {eager:.2f} "
              f"ms, captured {graph:.2f} ms; max |diff| {(a - b).abs().max().item():.3g}, argmax agree "
              f"{(a.argmax(-1) == b.argmax(-1)).float().mean().item():.3f}", flush=True)
        if B == 1:
            one = GemmaStaticTarget(model, ctx + 64)
            one.prefill(torch.randint(0, 1000, (1, ctx), device="cuda"))
            p1 = torch.arange(ctx, ctx + W, device="cuda")
            step = CapturedStep(lambda: one.forward_static(ids[:1], p1, bucket, attention="triton", fused=True))
            replay = step.replay
            print(f"ctx {ctx} B=1 forward_static fused captured {milliseconds(replay):.2f} ms", flush=True)
            del one
        del runner
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
