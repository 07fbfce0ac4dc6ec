"""Bytes held by the drafter's context cache: one unrotated copy (ours), a rotated key copy beside it, and the paper's
vLLM layout (rotated KV cache plus an unrotated K/V side cache).

Measured on a real FoldCache filled with a few entries of the drafter shape, then scaled per entry (the cache
holds a fixed number of bytes per entry). Usage:

    python benchmarks/cache_bytes.py            # Llama-3.1-8B and Qwen3.5-9B drafter shapes, bf16
"""

from __future__ import annotations

import argparse
import json

import torch

from fold_hf.modeling.cache import FoldCache
from fold_hf.modeling.rope import RotaryTables

SHAPES = {
    # name: (drafter layers reading the memory, KV heads, head_dim)
    "llama3.1-8b-dflash": (5, 8, 128),
    # the Qwen3.5-9B drafter's config is not available offline: 4 KV heads of 256 assumed, as benchmarks/kernel_bench.py
    "qwen3.5-9b-dflash (all 6 layers, 4 KV heads assumed)": (6, 4, 256),
}


def bytes_per_entry(layers: int, kv_heads: int, head_dim: int, keep_rotated_copy: bool,
                    dtype=torch.bfloat16) -> int:
    rope = RotaryTables(1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim), 1.0, head_dim)
    cache = FoldCache(layers, keep_rotated_copy=keep_rotated_copy, rope=rope)
    n = 16
    for i in range(layers):
        cache.layers[i].update(torch.zeros(1, kv_heads, n, head_dim, dtype=dtype),
                               torch.zeros(1, kv_heads, n, head_dim, dtype=dtype))
    return cache.bytes_used() // n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[8192, 32768, 131072, 262144])
    args = parser.parse_args()
    rows = []
    for name, (layers, kv, d) in SHAPES.items():
        one = bytes_per_entry(layers, kv, d, False)
        two = bytes_per_entry(layers, kv, d, True)
        for n in args.entries:
            rows.append({"shape": name, "entries": n, "ours_unrotated_kv_GiB": round(one * n / 2**30, 3),
                         "plus_rotated_keys_GiB": round(two * n / 2**30, 3),
                         "paper_rotated_kv_plus_side_kv_GiB": round(2 * one * n / 2**30, 3)})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
