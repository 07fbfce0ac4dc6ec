"""Tiny DeepSpec-layout checkpoints written by the tests, and a float64 reference of their block logits.

Both are written from the format description (issue #15, DeepSpec's public code as read), not from fold_hf:
the writer lays out ``config.json`` and ``model.safetensors`` as DeepSpec releases them, the reference computes
the block logits with plain float64 tensor algebra.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

VOCAB = 12
MASK_ID = VOCAB - 1


def tiny_gemma4_target(seed: int = 0, layers: int = 4, sliding_window: int = 512, dtype=torch.float64):
    """A Gemma-4 text target (sliding + full layers, k_eq_v full layer, soft-capped logits). Its default sliding
    window (512) exceeds every prompt + generation length of the tests; tests/modeling/test_deepspec.py also builds it with
    the Gemma tests' window of 8 for the fast loop."""
    torch.manual_seed(seed)
    types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    cfg = Gemma4TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
                           num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=sliding_window,
                           layer_types=types, max_position_embeddings=4096, bos_token_id=None, eos_token_id=None,
                           pad_token_id=None, hidden_size_per_layer_input=0, vocab_size_per_layer_input=VOCAB,
                           final_logit_softcapping=30.0, tie_word_embeddings=False)
    model = Gemma4ForCausalLM(cfg)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.to(dtype).eval()


def _deepspec_fields(block: int, layers: int, num_target_layers: int, taps, markov_rank: int, confidence: bool,
                     with_markov: bool) -> dict:
    fields = dict(num_target_layers=num_target_layers, num_hidden_layers=layers, block_size=block,
                  layer_types=["full_attention"] * layers, mask_token_id=MASK_ID, target_layer_ids=list(taps),
                  num_anchors=512, enable_confidence_head=confidence, markov_rank=markov_rank,
                  tie_word_embeddings=False)
    if confidence:
        fields["confidence_head_with_markov"] = with_markov
    if markov_rank:
        fields["markov_head_type"] = "vanilla"
    return fields


def deepspec_config(target, kind: str = "qwen3", block: int = 4, layers: int = 2, taps=(1, 3), markov_rank: int = 0,
                    confidence: bool = False, with_markov: bool = False) -> dict:
    """The ``config.json`` dict DeepSpec writes: the target's text config plus its top-level fields."""
    tcfg = target.config.to_dict()
    for key in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "output_hidden_states"):
        tcfg.pop(key, None)
    fields = _deepspec_fields(block, layers, target.config.num_hidden_layers, taps, markov_rank, confidence,
                              with_markov)
    if kind == "qwen3":
        tcfg["architectures"] = ["Qwen3DSparkModel"]
    else:
        tcfg["architectures"] = ["Gemma4DSparkModel"]
        fields.update(target_model_type="gemma4", target_text_model_type=target.config.model_type)
        # what DeepSpec's Gemma-4 config carries (transformers 5.2x keeps these two as constructor-only kwargs)
        tcfg.update(global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True)
    tcfg.update(fields)
    return tcfg


def deepspec_weights(config: dict, target, seed: int = 0, bigram: dict[int, int] | None = None) -> dict:
    """Random weights under DeepSpec's names (embedding and lm_head copied from the target, as released).

    ``bigram``: make the Markov head (rank V) propose ``bigram[x]`` after ``x`` (a strong bias), so drafts get
    accepted often."""
    g = torch.Generator().manual_seed(seed)
    gemma = "Gemma4DSparkModel" in config["architectures"]
    H, V, L = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    Hq = config["num_attention_heads"]
    D = config["global_head_dim"] if gemma else config["head_dim"]
    Hkv = config["num_global_key_value_heads"] if gemma else config["num_key_value_heads"]
    inter = config["intermediate_size"]
    n_taps = len(config["target_layer_ids"])

    def rnd(*shape, std=0.2):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def norm(n):
        return 1.0 + rnd(n, std=0.1)

    w = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().clone(),
         "lm_head.weight": target.get_output_embeddings().weight.detach().clone(),
         "fc.weight": rnd(H, n_taps * H), "hidden_norm.weight": norm(H), "norm.weight": norm(H)}
    for i in range(L):
        p = f"layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rnd(Hq * D, H)
        w[p + "self_attn.k_proj.weight"] = rnd(Hkv * D, H)
        if not gemma:
            w[p + "self_attn.v_proj.weight"] = rnd(Hkv * D, H)
        w[p + "self_attn.o_proj.weight"] = rnd(H, Hq * D)
        w[p + "self_attn.q_norm.weight"] = norm(D)
        w[p + "self_attn.k_norm.weight"] = norm(D)
        w[p + "mlp.gate_proj.weight"] = rnd(inter, H)
        w[p + "mlp.up_proj.weight"] = rnd(inter, H)
        w[p + "mlp.down_proj.weight"] = rnd(H, inter)
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = norm(H)
            w[p + "post_feedforward_layernorm.weight"] = norm(H)
            w[p + "layer_scalar"] = torch.tensor([0.75 + 0.1 * i], dtype=torch.float64)
    r = config["markov_rank"]
    if r:
        if bigram is not None:
            assert r == V
            w1 = torch.eye(V, dtype=torch.float64) * 6.0
            w2 = torch.zeros(V, V, dtype=torch.float64)
            for x, y in bigram.items():
                w2[y, x] = 1.0
        else:
            w1, w2 = rnd(V, r, std=0.5), rnd(V, r, std=0.5)
        w["markov_head.markov_w1.weight"] = w1
        w["markov_head.markov_w2.weight"] = w2
    if config["enable_confidence_head"]:
        width = H + (r if config.get("confidence_head_with_markov") else 0)
        w["confidence_head.proj.weight"] = rnd(1, width, std=0.5)
        w["confidence_head.proj.bias"] = torch.tensor([1.0], dtype=torch.float64)
    return {k: v.to(torch.float64).contiguous() for k, v in w.items()}


def write_checkpoint(directory: Path, config: dict, weights: dict, dtype=torch.float32) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.to(dtype).contiguous() for k, v in weights.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    return directory


def target_bigram(target, prompts: int = 12, length: int = 40, seed: int = 5) -> dict[int, int]:
    """The target's most frequent greedy successor of each token (for a Markov head that drafts well)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB, VOCAB)
    with torch.no_grad():
        for _ in range(prompts):
            ids = torch.randint(0, MASK_ID, (1, 8), generator=g)
            out = target.generate(ids, max_new_tokens=length, do_sample=False)[0]
            for a, b in zip(out[:-1].tolist(), out[1:].tolist()):
                counts[a, b] += 1
    return {x: int(counts[x].argmax()) for x in range(VOCAB)}


# ------------------------------------------------------------------------------------- float64 reference
def _rms(x, weight=None, eps=1e-6):
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def _rope(x, positions, inv_freq):
    """Rotate ``x [..., L, D]`` at ``positions [L]``: pairs (i, i + D/2) turn by ``pos * inv_freq[i]``."""
    half = x.shape[-1] // 2
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # [L, D/2]
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), -1)


def reference_block(config: dict, w: dict, features: torch.Tensor, anchor: int, anchor_pos: int,
                    threshold: float = 0.0):
    """Float64 DeepSpec drafting of one block from the format description.

    Args:
        config: the checkpoint's ``config.json`` dict. w: its weights (float64).
        features: ``[n, n_taps * H]`` tapped target hidden states of context positions 0..n-1.
        anchor: the last committed token; anchor_pos: its position (= n in decoding).

    Returns:
        (base logits ``[B, V]`` of every slot, greedy proposals ``[B]`` (Markov argmax step by step),
        confidence-kept count).
    """
    gemma = "Gemma4DSparkModel" in config["architectures"]
    H, B = config["hidden_size"], config["block_size"]
    Hq = config["num_attention_heads"]
    D = config["global_head_dim"] if gemma else config["head_dim"]
    Hkv = config["num_global_key_value_heads"] if gemma else config["num_key_value_heads"]
    eps = config["rms_norm_eps"]
    if gemma:
        full = config["rope_parameters"]["full_attention"]
        theta, rotary_pairs = full["rope_theta"], int(full["partial_rotary_factor"] * D // 2)
        act = lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))  # noqa: E731
        scale = 1.0
    else:
        theta = config.get("rope_theta") or config["rope_parameters"]["rope_theta"]
        rotary_pairs = D // 2
        act = torch.nn.functional.silu
        scale = D**-0.5
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    inv_freq[rotary_pairs:] = 0.0
    n = features.shape[0]
    ctx = _rms(features.to(torch.float64) @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    ids = torch.tensor([anchor] + [config["mask_token_id"]] * (B - 1))
    x = w["embed_tokens.weight"][ids]
    if gemma:
        x = x * math.sqrt(H)
    pos = torch.cat((torch.arange(n), anchor_pos + torch.arange(B)))
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rms((h @ w[p + "self_attn.q_proj.weight"].T).view(B, Hq, D), w[p + "self_attn.q_norm.weight"], eps)
        both = torch.cat((ctx, h))  # [n + B, H]: context and block rows
        kraw = (both @ w[p + "self_attn.k_proj.weight"].T).view(n + B, Hkv, D)
        k = _rms(kraw, w[p + "self_attn.k_norm.weight"], eps)
        v = _rms(kraw) if gemma else (both @ w[p + "self_attn.v_proj.weight"].T).view(n + B, Hkv, D)
        q = _rope(q.transpose(0, 1), pos[n:], inv_freq)  # [Hq, B, D]
        k = _rope(k.transpose(0, 1), pos, inv_freq)  # [Hkv, n + B, D]
        v = v.transpose(0, 1)
        group = Hq // Hkv
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        att = torch.softmax(q @ k.transpose(-1, -2) * scale, -1)  # every block row reads all context and the block
        o = (att @ v).transpose(0, 1).reshape(B, Hq * D) @ w[p + "self_attn.o_proj.weight"].T
        mlp = lambda y: (act(y @ w[p + "mlp.gate_proj.weight"].T) * (y @ w[p + "mlp.up_proj.weight"].T)  # noqa: E731
                         ) @ w[p + "mlp.down_proj.weight"].T
        if gemma:
            x = x + _rms(o, w[p + "post_attention_layernorm.weight"], eps)
            x = x + _rms(mlp(_rms(x, w[p + "pre_feedforward_layernorm.weight"], eps)),
                         w[p + "post_feedforward_layernorm.weight"], eps)
            x = x * w[p + "layer_scalar"]
        else:
            x = x + o
            x = x + mlp(_rms(x, w[p + "post_attention_layernorm.weight"], eps))
    out = _rms(x, w["norm.weight"], eps)
    logits = out @ w["lm_head.weight"].T
    if gemma and config.get("final_logit_softcapping"):
        c = config["final_logit_softcapping"]
        logits = torch.tanh(logits / c) * c
    tokens, prev = [], anchor
    for s in range(B):
        z = logits[s]
        if config["markov_rank"]:
            z = z + w["markov_head.markov_w2.weight"] @ w["markov_head.markov_w1.weight"][prev]
        prev = int(z.argmax())
        tokens.append(prev)
    kept = B
    if config["enable_confidence_head"] and threshold > 0:
        prevs = [anchor] + tokens[:-1]
        for s in range(B):
            feat = out[s]
            if config.get("confidence_head_with_markov"):
                feat = torch.cat((feat, w["markov_head.markov_w1.weight"][prevs[s]]))
            c = torch.sigmoid(feat @ w["confidence_head.proj.weight"][0] + w["confidence_head.proj.bias"][0])
            if c < threshold:
                kept = s
                break
    return logits, torch.tensor(tokens), kept


def markov_step_distributions(config: dict, w: dict, base_logits: torch.Tensor, anchor: int,
                              tokens: list[int]) -> torch.Tensor:
    """``[k, V]`` softmax of slot i's logits biased by the token before it (anchor, then ``tokens``)."""
    rows, prev = [], anchor
    for s, tok in enumerate(tokens):
        z = base_logits[s].to(torch.float64)
        if config["markov_rank"]:
            z = z + w["markov_head.markov_w2.weight"] @ w["markov_head.markov_w1.weight"][prev]
        rows.append(torch.softmax(z, -1))
        prev = tok
    return torch.stack(rows)
