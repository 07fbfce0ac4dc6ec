"""τ of FOLD on the demo's pinned input (``fold-hf demo``'s 2,048 tokens, 64 new tokens, greedy, fp32, CPU) for
W in {256, 512, 768, 1024} x α in {1, 2, 4}, and the window-only read at W 512; prints one line each
(``demo_input_sweep.log`` beside this file). Run from the repository root:

    OMP_NUM_THREADS=2 PYTHONPATH=. python benchmarks/results/2026-12-07-cpu-smollm2-mixed-2k/alpha/demo_input_sweep.py
"""

import time

import torch

from fold_hf import FoldConfig, fast_generate
from fold_hf.commands import demo_prompt
from fold_hf.pairs import load_pair

torch.set_num_threads(2)
target, tokenizer, drafter = load_pair(device=torch.device("cpu"))
ids = demo_prompt(tokenizer, 2048)


def tau(config: FoldConfig, new_tokens: int = 64) -> float:
    result = fast_generate(target, drafter, input_ids=ids, max_new_tokens=new_tokens, fold_config=config,
                           return_stats=True, eos_token_id=[])
    return sum(result.acceptance_lengths) / len(result.acceptance_lengths)


for window in (256, 512, 768, 1024):
    for alpha in (1.0, 2.0, 4.0):
        start = time.time()
        value = tau(FoldConfig(mode="fold", window=window, alpha=alpha))
        print(window, alpha, round(value, 3), f"{time.time() - start:.1f}s", flush=True)
print("window-only 512", tau(FoldConfig(mode="window", window=512)))
