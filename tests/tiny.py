"""Tiny random targets and drafters built inside the tests (no hub, no files)."""

from __future__ import annotations

import contextlib
import functools
import random
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

import fold_hf
from fold_hf import FoldConfig, FoldDrafter, FoldDrafterConfig
from fold_hf.targets.taps import HiddenTaps
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
    elif arch in GEMMA_ARCHS + GEMMA_VARIANTS + ("gemma4_tp",):  # gemma4_tp: tests/targets/test_tensor_parallel.py
        model = tiny_gemma(arch, common)
    elif arch in QWEN35_VARIANTS:
        model = tiny_qwen35(arch)
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model = model.to(dtype).eval()
    if hasattr(model, "set_experts_implementation") and any(hasattr(m, "gate_up_proj") for m in model.modules()):
        # the experts' own loop (transformers' default grouped GEMM takes no fp64): the model's reference for the MoE
        model.set_experts_implementation("eager")
    return model


GEMMA_ARCHS = ("gemma3", "gemma4", "gemma4_shared")
# the multimodal wrappers around the same text configs (text-only ids; Gemma-4's image / audio placeholders are ids 7
# and 9 of the tiny vocabulary, which the wrapper replaces by its pad id 0) and Gemma-4 with its MoE block
GEMMA_VARIANTS = ("gemma3_cg", "gemma4_cg", "gemma4_moe")
GEMMA_WINDOW = 8  # the tiny Gemma targets' sliding window (tokens)
GEMMA4_PLACEHOLDERS = {"image_token_id": 7, "audio_token_id": 9}
GEMMA3_IMAGE_ID = VOCAB + 5  # outside the vocabulary: the Gemma-3 wrapper embeds it as id 0

# Qwen3.5: the dense text model of tests/targets/test_qwen35.py (8 layers, 6 linear-attention), its multimodal wrapper, the MoE
# variant (4 experts, top-2, shared expert) and the MoE wrapper
QWEN35_VARIANTS = ("qwen35", "qwen35_cg", "qwen35_moe", "qwen35_moe_cg")
QWEN35_TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=8, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8,
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4,
                   max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                   pad_token_id=None)
QWEN35_MOE = dict(moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
# a tiny vision tower for the wrappers (never run: text-only ids); its placeholder ids lie outside the vocabulary
QWEN35_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
                     temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
QWEN35_VISION_IDS = dict(image_token_id=VOCAB + 5, video_token_id=VOCAB + 6, vision_start_token_id=VOCAB + 7,
                         vision_end_token_id=VOCAB + 8)


def _spread_moe(model) -> None:
    """Routers, experts and MoE norms drawn wide enough that the routing and every expert term change the logits
    (at transformers' init, std 0.02, the experts' output is ~1e-3 of the residual stream and an error in the MoE step
    would not change a greedy token)."""
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "gate_up_proj"):  # the stacked experts
                module.gate_up_proj.normal_(std=0.2)
                module.down_proj.normal_(std=0.2)
            for name in ("router", "gate"):  # Gemma-4's router.proj / Qwen3.5-MoE's gate.weight
                router = getattr(module, name, None)
                if hasattr(module, "experts") and router is not None:
                    weight = router.proj.weight if hasattr(router, "proj") else router.weight
                    weight.normal_(std=1.0)
                    if hasattr(router, "per_expert_scale"):
                        router.per_expert_scale.uniform_(0.5, 1.5)
            if hasattr(module, "shared_expert_gate"):
                module.shared_expert_gate.weight.normal_(std=1.0)
            for name in ("pre_feedforward_layernorm_2", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"):
                norm = getattr(module, name, None)
                if norm is not None and getattr(norm, "weight", None) is not None:
                    norm.weight.uniform_(0.5, 1.5)


def tiny_qwen35(arch: str):
    """Tiny Qwen3.5 targets (:data:`QWEN35_VARIANTS`) from transformers' configs (seeded by the caller)."""
    import transformers as tf

    text = dict(QWEN35_TEXT)
    if "moe" in arch:
        text.pop("intermediate_size")
        text.update(QWEN35_MOE)
    if arch == "qwen35":
        return tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**text))
    if arch == "qwen35_moe":
        model = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**text))
    elif arch == "qwen35_cg":
        return tf.Qwen3_5ForConditionalGeneration(tf.Qwen3_5Config(text_config=text, vision_config=QWEN35_VISION,
                                                                   **QWEN35_VISION_IDS))
    else:
        model = tf.Qwen3_5MoeForConditionalGeneration(tf.Qwen3_5MoeConfig(
            text_config=text, vision_config=QWEN35_VISION, **QWEN35_VISION_IDS))
    _spread_moe(model)
    return model


def tiny_gemma(arch: str, common: dict):
    """Tiny Gemma-3 / Gemma-4 text targets with sliding layers (window 8) and global ones (Gemma-3: five sliding then
    one global; Gemma-4: global every third layer and last).

    ``gemma3``: (1 + w) norms, query_pre_attn_scalar scaling, final logit soft-capping (and
    attn_logit_softcapping set, which transformers' Gemma-3 attention does not apply).
    ``gemma4``: global layer with its own head_dim 16, one KV head, ``attention_k_eq_v``, proportional partial
    rope (0.25), per-layer inputs (PLE), final soft-capping. ``gemma4_shared``: ``gemma4`` with the last two layers
    reusing earlier layers' keys and values (``num_kv_shared_layers=2``). ``gemma4_tp``: ``gemma4_shared`` with two
    global KV heads (so that every layer's heads split over two tensor-parallel ranks).
    """
    import transformers as tf

    common = dict(common, head_dim=8, sliding_window=GEMMA_WINDOW)
    common.pop("tie_word_embeddings")
    if arch in ("gemma3", "gemma3_cg"):
        text = dict(query_pre_attn_scalar=8, final_logit_softcapping=30.0, attn_logit_softcapping=20.0, **common)
        if arch == "gemma3":
            return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**text))
        # the wrapper applies no final soft-capping (5.24): the test of its logits sees the difference
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=8,
                      patch_size=4)
        return tf.Gemma3ForConditionalGeneration(tf.Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=1, image_token_index=GEMMA3_IMAGE_ID,
            boi_token_index=VOCAB + 6, eoi_token_index=VOCAB + 7, tie_word_embeddings=False))
    n = common["num_hidden_layers"]
    layer_types = ["sliding_attention" if (i + 1) % 3 else "full_attention" for i in range(n)]
    layer_types[-1] = "full_attention"
    shared = 2 if arch in ("gemma4_shared", "gemma4_tp") else 0
    text = dict(global_head_dim=16, num_global_key_value_heads=2 if arch == "gemma4_tp" else 1, attention_k_eq_v=True, final_logit_softcapping=30.0,
                hidden_size_per_layer_input=4, vocab_size_per_layer_input=common["vocab_size"], layer_types=layer_types,
                num_kv_shared_layers=shared, **common)
    if arch == "gemma4_cg":
        text["pad_token_id"] = 0  # the wrapper substitutes its placeholders by the pad id
        return tf.Gemma4ForConditionalGeneration(tf.Gemma4Config(
            text_config=text, vision_config=None, audio_config=None, tie_word_embeddings=False, **GEMMA4_PLACEHOLDERS))
    if arch == "gemma4_moe":
        text.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)
        model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**text))
        _spread_moe(model)
        return model
    return tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**text))


def drafter_config(target, block: int = 4, layers: int = 2, taps=(1, 3), sliding_window=None,
                   layer_types=None, partial_rotary_factor=None, heads: int = 4, kv_heads: int = 2,
                   **extra) -> FoldDrafterConfig:
    tcfg = target.config.get_text_config()  # a multimodal wrapper's text model
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
            prompt = torch.randint(0, target.config.get_text_config().vocab_size - 1, (1, 8), generator=g)
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
_SHARED_DTYPES: list = []  # (model, dtype it was shared in)


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def share(drafter, *models):
    """Register ``drafter`` as shared between tests: its current fold config is restored after every test, and it
    (and ``models``, e.g. its target) must keep its dtype: ``.float()`` / ``.to(dtype)`` on a shared model changes
    it in place for every later test of the process, so a test that needs another dtype takes a copy."""
    _SHARED.append((drafter, drafter.fold_config))
    for model in (drafter, *models):
        _SHARED_DTYPES.append((model, _dtype(model)))
    return drafter


def restore_shared() -> None:
    for drafter, config in _SHARED:
        if drafter.fold_config != config:
            drafter.set_fold_config(config)
    changed = []
    for model, dtype in _SHARED_DTYPES:
        now = _dtype(model)
        if now != dtype:
            changed.append((type(model).__name__, dtype, now))
            model.to(dtype)  # put it back, so the error names this test only
    assert not changed, (f"this test changed the dtype of a model shared between tests: {changed} (name, was, now); "
                         "take copy.deepcopy(model) before .float() / .to(dtype)")


@functools.lru_cache(maxsize=None)
def trained_pair(arch: str = "llama", block: int = 4):
    """A tiny target (fp64) and a drafter fitted to it, built once per process and shared by the tests."""
    target = tiny_target(arch)
    drafter = share(fit_drafter(target, tiny_drafter(target, block=block)), target)
    return target, drafter


def prompt(seed: int, length: int, offset: int = 0) -> torch.Tensor:
    """``[1, length]`` random token ids below the mask id, seeded by ``offset + seed``."""
    return torch.randint(0, MASK_ID, (1, length), generator=torch.Generator().manual_seed(offset + seed))


# The lossless grid: prompts of these lengths (the window is 16: most exceed it), NEW_TOKENS each, every reading
# mode, both archs. Computed once per process and shared by tests/generation/test_lossless.py (the loop and transformers'
# path against greedy) and tests/generation/test_fast_loop.py (the fast engines against the loop); both files are in the
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


def check_graph_engine_settings(arch: str, monkeypatch, env: str, values, prompts) -> None:
    """The graphs engine with the fused layers on the GPU pair (fp32) under each value of ``$env``: AR and the
    ``fold`` speculative loop give HF greedy's tokens for every ``(seed, length)`` prompt, and every value gives the
    first one's acceptance lengths (a setting that changes a kernel's launch, not its result)."""
    with pair_on_gpu(arch) as (target, drafter):
        for seed, length in prompts:
            ids = prompt(seed, length).cuda()
            expected = greedy_reference(target, ids, 40)
            runs = {}
            for value in values:
                monkeypatch.setenv(env, value)
                fold_hf.generation.release_fast_state(target)
                kw = dict(input_ids=ids, max_new_tokens=40, engine="graphs", target_attention="triton",
                          fused_layers=True)
                assert torch.equal(fold_hf.generation.fast_generate(target, None, **kw), expected), (length, value)
                runs[value] = fold_hf.generation.fast_generate(target, drafter, **kw, return_stats=True,
                                                              fold_config=mode_config("fold"))
                assert torch.equal(runs[value].sequences, expected), (arch, length, value)
            first = runs[values[0]].acceptance_lengths
            assert all(run.acceptance_lengths == first for run in runs.values()), (arch, length)
        fold_hf.generation.release_fast_state(target)


def with_skinny_gemms(monkeypatch, seen: list[int]):
    """The fused layers' ops (``fold_hf.kernels.default_layer_ops``) get the Triton skinny GEMMs (Triton's
    interpreter on the CPU) in place of F.linear; ``seen`` records each launch's row count. Returns the original
    ``default_layer_ops`` (to put back mid-test)."""
    import fold_hf.kernels as kernels
    from fold_hf.kernels.gemm import triton as triton_gemm

    def counting(fn):
        def run(x, weight, bias=None):
            seen.append(x.reshape(-1, x.shape[-1]).shape[0])
            return fn(x, weight, bias)
        return run

    original = kernels.default_layer_ops

    def with_gemms(device):
        ops = original(device)
        return kernels.LayerOps(ops.add_rms_norm, ops.rope_write, ops.silu_mul, ops.rotate_heads, "torch+gemm",
                                skinny_linear=counting(triton_gemm.skinny_linear_triton),
                                gate_up_silu=counting(triton_gemm.gate_up_silu_triton),
                                gate_up_gelu=counting(triton_gemm.gate_up_gelu_tanh_triton),
                                skinny_rows=triton_gemm.MAX_ROWS)

    monkeypatch.setattr(kernels, "default_layer_ops", with_gemms)
    return original


# ---- forced rejections and the generate paths, shared by the target-family tests

def oracle_tokens(ref: torch.Tensor, position: int, k: int) -> list[int]:
    """The target's greedy tokens after ``position`` (from ``ref``, its greedy output) with one slot, picked by
    ``position`` (seeded), corrupted; the pick ``k`` corrupts none (everything accepted). Drafting these makes every
    acceptance count 1 .. k + 1 occur, so a target's state rolls back by every amount."""
    tokens = ref[0, position + 1 : position + 1 + k].tolist()
    tokens += [0] * (k - len(tokens))
    j = random.Random(position).randrange(k + 1)
    if j < k:
        tokens[j] = (tokens[j] + 1) % MASK_ID
    return tokens


PATHS = ("generate", "assisted", "routed", "fast-eager", "fast-static", "fast-fused")


def run_path(path: str, target, drafter, ids: torch.Tensor, new: int, fold_config: FoldConfig | None = None):
    """(sequences, acceptance lengths) of one way of decoding ``ids`` with ``drafter`` (the fast loop's state on
    ``target`` is released afterwards): ``generate``
    (:func:`fold_hf.generate`), ``assisted`` (transformers' assisted loop, ``fold_fast=False``), ``routed`` (the
    default ``target.generate``, which must take the fast loop: its fallback warning is an error here),
    ``fast-eager`` / ``fast-static`` (:func:`fold_hf.fast_generate`), ``fast-fused`` (the static engine with the fused
    layers, their torch twins off CUDA)."""
    if fold_config is not None:
        drafter.set_fold_config(fold_config)
    if path == "generate":
        res = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=new, return_stats=True)
        return res.sequences, res.acceptance_lengths
    if path in ("assisted", "routed"):
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="fold_hf: target.generate runs transformers'")
            out = target.generate(ids, assistant_model=drafter, max_new_tokens=new, do_sample=False,
                                  **({"fold_fast": False} if path == "assisted" else {}))
        ran_fast = fold_hf.generation.fast._SESSION_ATTR in target.__dict__
        assert ran_fast == (path == "routed"), (path, ran_fast)  # the routed call took the fast loop, the other not
        fold_hf.generation.release_fast_state(target)
        return out, list(drafter.last_acceptance_lengths)
    extra = dict(target_attention="triton", fused_layers=True) if path == "fast-fused" else {}
    res = fold_hf.fast_generate(target, drafter, ids, max_new_tokens=new, engine=path.split("-")[1].replace(
        "fused", "static"), return_stats=True, **extra)
    fold_hf.generation.release_fast_state(target)
    return res.sequences, res.acceptance_lengths


# ------------------------------------------------------------------ batches (issue 35's tests)
PAD_FILL = 0  # what the left padding's input ids hold (their mask is 0: any id)


def left_pad(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` (1-D id tensors) left-padded as transformers batches them: ``(ids [B, L], attention_mask [B, L])``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_FILL, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask


def greedy_alone(target, row: torch.Tensor, new: int, eos=None) -> list[int]:
    """The row's new tokens from the target's own greedy generate, the row alone and unpadded (transformers stops a
    batch-1 run at its EOS, which it keeps)."""
    extra = dict(eos_token_id=eos, pad_token_id=eos) if eos is not None else {}
    out = target.generate(row[None], max_new_tokens=new, do_sample=False, **extra)
    return out[0, len(row):].tolist()


def batched_rows_call(target, drafter, ids: torch.Tensor, mask: torch.Tensor, new: int, eos: int,
                      engine: str = "graphs", **kw):
    """``fast_generate`` of a left-padded batch on ``engine`` (``graphs``: on CUDA), the stats kept: ``(result, the
    session's rows step keys, the messages saying a batch verifies host-length)``; the fast state released after."""
    from fold_hf.generation.fast import SESSION_ATTR

    if engine == "graphs":
        ids, mask = ids.cuda(), mask.cuda()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = fold_hf.fast_generate(target, drafter, ids, mask, max_new_tokens=new, engine=engine, eos_token_id=eos,
                                    return_stats=True, **kw)
    keys = [key for key in target.__dict__[SESSION_ATTR].steps if key[0] == "rows"]
    fold_hf.generation.release_fast_state(target)
    return out, keys, [str(w.message) for w in record if "host-length" in str(w.message)]


def expected_batch(ids: torch.Tensor, news: list[list[int]], pad: int) -> torch.Tensor:
    """transformers' batched layout written out: the padded prompts, then each row's new tokens, then pad ids up to
    the longest row."""
    width = max(len(n) for n in news)
    tail = torch.tensor([n + [pad] * (width - len(n)) for n in news], dtype=torch.long)
    return torch.cat([ids, tail], dim=1)


def assert_step_reads_nothing_on_the_host(runner, start: int, rows: int = 4) -> None:
    """The device-length verify step (bucket, decode-kernel twin, fused twins) and ``accept`` run on fake tensors
    (``FakeTensorMode``: no values exist, so any ``nonzero``, ``.item()``, ``.tolist()`` or value-dependent shape
    raises), i.e. the step can be captured in a CUDA graph. The fused path's one-time set-up (it probes the
    activation's values) runs first on real tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ids = torch.zeros(1, rows, dtype=torch.long)
    positions = torch.arange(start, start + rows)
    runner.forward_static(ids, positions, runner.capacity, attention="triton", fused=True)
    runner.accept(0)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_ids, fake_positions = mode.from_tensor(ids), mode.from_tensor(positions)
        for attention, fused in (("bucket", False), ("triton", False), ("triton", True)):
            logits = runner.forward_static(fake_ids, fake_positions, runner.capacity, attention=attention,
                                           fused=fused)
            assert logits.shape[0] == rows, (attention, fused)
            runner.accept(mode.from_tensor(torch.tensor([rows - 1])))
