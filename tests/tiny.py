"""Tiny random targets and drafters built inside the tests (no hub, no files)."""

from __future__ import annotations

import contextlib
import functools

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

import fold_hf
from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig
from fold_hf.generation.taps import HiddenTaps
from fold_hf.training import dflash_loss, sample_anchors

VOCAB = 12
MASK_ID = VOCAB - 1


def tiny_target(arch: str = "llama", seed: int = 0, vocab: int = VOCAB, layers: int = 6, dtype=torch.float64):
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(rope_theta=10000.0, **common))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, rope_theta=10000.0, **common))
    elif arch in GEMMA_ARCHS:
        model = tiny_gemma(arch, common)
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.to(dtype).eval()


GEMMA_ARCHS = ("gemma3", "gemma4", "gemma4_shared")
GEMMA_WINDOW = 8  # the tiny Gemma targets' sliding window (tokens)


def tiny_gemma(arch: str, common: dict):
    """Tiny Gemma-3 / Gemma-4 text targets with sliding layers (window 8) and global ones (Gemma-3: five sliding then
    one global; Gemma-4: global every third layer and last).

    ``gemma3``: (1 + w) norms, query_pre_attn_scalar scaling, final logit soft-capping (and
    attn_logit_softcapping set, which transformers' Gemma-3 attention does not apply).
    ``gemma4``: global layer with its own head_dim 16, one KV head, ``attention_k_eq_v``, proportional partial
    rope (0.25), per-layer inputs (PLE), final soft-capping. ``gemma4_shared``: ``gemma4`` with the last two layers
    reusing earlier layers' keys and values (``num_kv_shared_layers=2``).
    """
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Gemma4ForCausalLM, Gemma4TextConfig

    common = dict(common, head_dim=8, sliding_window=GEMMA_WINDOW)
    common.pop("tie_word_embeddings")
    if arch == "gemma3":
        return Gemma3ForCausalLM(Gemma3TextConfig(query_pre_attn_scalar=8, final_logit_softcapping=30.0,
                                                  attn_logit_softcapping=20.0, **common))
    n = common["num_hidden_layers"]
    layer_types = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(n)]
    layer_types[-1] = "full_attention"
    shared = 2 if arch == "gemma4_shared" else 0
    return Gemma4ForCausalLM(Gemma4TextConfig(global_head_dim=16, num_global_key_value_heads=1,
                                              attention_k_eq_v=True, final_logit_softcapping=30.0,
                                              hidden_size_per_layer_input=4, vocab_size_per_layer_input=common[
                                                  "vocab_size"], layer_types=layer_types,
                                              num_kv_shared_layers=shared, **common))


def drafter_config(target, block: int = 4, layers: int = 2, taps=(1, 3), sliding_window=None,
                   layer_types=None, partial_rotary_factor=None, heads: int = 4, kv_heads: int = 2,
                   **extra) -> FoldDrafterConfig:
    tcfg = target.config
    kw = dict(block_size=block, num_target_layers=tcfg.num_hidden_layers, target_layer_ids=list(taps),
              mask_token_id=tcfg.vocab_size - 1, vocab_size=tcfg.vocab_size, hidden_size=tcfg.hidden_size,
              intermediate_size=64, num_hidden_layers=layers, num_attention_heads=heads,
              num_key_value_heads=kv_heads, head_dim=8, rope_theta=10000.0, max_position_embeddings=4096)
    if partial_rotary_factor is not None:
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": partial_rotary_factor}
        kw.pop("rope_theta")
    if layer_types is not None:
        kw.update(layer_types=list(layer_types), sliding_window=sliding_window, use_sliding_window=True)
    kw.update(extra)
    return FoldDrafterConfig(**kw)


def tiny_drafter(target, fold_config: FoldConfig | None = None, seed: int = 1, **cfg_kw) -> FoldDrafter:
    torch.manual_seed(seed)
    drafter = FoldDrafter(drafter_config(target, **cfg_kw), fold_config or FoldConfig(window=16))
    return drafter.to(next(target.parameters()).dtype).eval()


# the retrieval baselines at the tests' scale: InfLLM blocks of 8 (8 initial entries, 2 retrieved, 2 representatives),
# CMR 4 chunks of 8 refreshed every 3 rounds, so that selection and refreshes happen within short prompts
SMALL_RETRIEVAL = dict(infllm_block=8, infllm_init=8, infllm_topk=2, infllm_repr=2, cmr_chunk=8, cmr_refresh=3)
TEST_BUDGETS = {"streaming": 24, "cmr": 32}


def mode_config(mode: str, **kw) -> FoldConfig:
    """The tests' reading config: W = 16, α = 2, a 24-entry budget for ``streaming``, training length 64; ``infllm``
    and ``cmr`` at :data:`SMALL_RETRIEVAL` (CMR: 32 entries)."""
    if mode in ("infllm", "cmr"):
        kw.setdefault("extra", dict(SMALL_RETRIEVAL))
    return FoldConfig(mode=mode, window=16, alpha=2.0, budget=TEST_BUDGETS.get(mode), train_length=64, **kw)


def greedy_reference(target, input_ids, max_new_tokens):
    return target.generate(input_ids, max_new_tokens=max_new_tokens, do_sample=False)


def fit_drafter(target, drafter, steps: int = 150, seq_len: int = 48, seed: int = 0, lr: float = 3e-3):
    """Train ``drafter`` briefly on the target's own greedy continuations so drafts get accepted."""
    g = torch.Generator().manual_seed(seed)
    drafter.bind_target(target)
    drafter.train()
    opt = torch.optim.Adam(drafter.parameters(), lr=lr)
    texts = []
    with torch.no_grad():
        for i in range(8):
            prompt = torch.randint(0, target.config.vocab_size - 1, (1, 8), generator=g)
            texts.append(target.generate(prompt, max_new_tokens=seq_len - 8, do_sample=False))
    taps = HiddenTaps(target, drafter.config.target_layer_ids)
    feats = []
    with torch.no_grad():
        for ids in texts:
            with taps:
                target(ids)
            feats.append(taps.features())
    for step in range(steps):
        i = step % len(texts)
        anchors = sample_anchors(texts[i].shape[1], drafter.block_size, 16, generator=g)
        loss, _ = dflash_loss(drafter, feats[i], texts[i], anchors)
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval()
    return drafter


# drafters shared between tests, with the fold config each was built with (tests/conftest.py restores it after
# every test, so no test sees a shared model left in another mode)
_SHARED: list = []


def share(drafter):
    """Register ``drafter`` as shared between tests: its current fold config is restored after every test."""
    _SHARED.append((drafter, drafter.fold_config))
    return drafter


def restore_shared() -> None:
    for drafter, config in _SHARED:
        if drafter.fold_config != config:
            drafter.set_fold_config(config)


@functools.lru_cache(maxsize=None)
def trained_pair(arch: str = "llama", block: int = 4):
    """A tiny target (fp64) and a drafter fitted to it, built once per process and shared by the tests."""
    target = tiny_target(arch)
    drafter = share(fit_drafter(target, tiny_drafter(target, block=block)))
    return target, drafter


def prompt(seed: int, length: int, offset: int = 0) -> torch.Tensor:
    """``[1, length]`` random token ids below the mask id, seeded by ``offset + seed``."""
    return torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(offset + seed))


# The lossless grid: prompts of these lengths (the window is 16: most exceed it), NEW_TOKENS each, every reading
# mode, both archs. Computed once per process and shared by tests/test_lossless.py (the loop and transformers'
# path against greedy) and tests/test_fast_loop.py (the fast engines against the loop); both files are in the
# xdist group "lossless-grid", so they share one worker's cache.
GRID_PROMPT_LENGTHS = (10, 37, 90, 170, 300)
GRID_NEW_TOKENS = 40
GRID_SEED_OFFSET = 1000


def grid_prompt(seed: int) -> torch.Tensor:
    return prompt(seed, GRID_PROMPT_LENGTHS[seed], offset=GRID_SEED_OFFSET)


@functools.lru_cache(maxsize=None)
def grid_greedy(arch: str, seed: int) -> torch.Tensor:
    """The target's own greedy output (``target.generate``) for grid prompt ``seed``."""
    target, _ = trained_pair(arch)
    return greedy_reference(target, grid_prompt(seed), GRID_NEW_TOKENS)


@functools.lru_cache(maxsize=None)
def grid_loop(arch: str, mode: str, seed: int):
    """``fold_hf.generate(..., return_stats=True)`` (the foundation loop) for grid prompt ``seed`` in ``mode``."""
    target, drafter = trained_pair(arch)
    return fold_hf.generate(target, drafter, input_ids=grid_prompt(seed), max_new_tokens=GRID_NEW_TOKENS,
                            return_stats=True, fold_config=mode_config(mode))


def char_tokenizer():
    """One character per token id of the tiny vocabulary: 'a' = 0, 'b' = 1, ..."""
    from tokenizers import Tokenizer, decoders
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(BPE({chr(97 + i): i for i in range(VOCAB)}, merges=[]))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@contextlib.contextmanager
def pair_on_gpu(arch: str = "llama"):
    """The trained tiny pair moved to CUDA in fp32 for a GPU test, moved back (and its fast-loop state freed)
    afterwards so the CPU tests keep their fp64 pair."""
    target, drafter = trained_pair(arch)
    target.to("cuda", torch.float32)
    drafter.to("cuda", torch.float32)
    try:
        yield target, drafter
    finally:
        target.to("cpu", torch.float64)
        drafter.to("cpu", torch.float64)
        fold_hf.generation.release_fast_state(target)
