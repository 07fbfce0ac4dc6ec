"""DeepSpec drafters (``deepseek-ai/DeepSpec``, MIT): DFlash (``markov_rank`` 0) and DSpark (``markov_rank`` > 0),
for Qwen3-like and Gemma-4-like targets. Everything FOLD needs to know about the family lives here; the drafter
layers, the context cache, the reading modes, verification and rollback are the shared ones.

Checkpoint layout (as released, read without ``trust_remote_code``):

* ``config.json``: the target's *text* config plus top-level ``architectures`` (``Qwen3DSparkModel`` /
  ``Gemma4DSparkModel``), ``num_target_layers``, ``num_hidden_layers``, ``block_size``, ``layer_types`` (all
  ``full_attention``), ``mask_token_id``, ``target_layer_ids``, ``num_anchors``, ``enable_confidence_head``,
  ``confidence_head_with_markov`` (when the confidence head is on), ``markov_rank``, ``markov_head_type`` (when
  ``markov_rank`` > 0), ``tie_word_embeddings: false``; Gemma adds ``target_model_type``, ``target_text_model_type``.
* weights without a ``model.`` prefix: ``embed_tokens.weight`` and ``lm_head.weight`` (the drafter's own copies of
  the target's), ``fc.weight``, ``hidden_norm.weight``, ``norm.weight``, per layer ``layers.i.self_attn.{q,k,v,o}_proj``
  (Gemma with ``attention_k_eq_v``: no ``v_proj``), ``layers.i.self_attn.{q,k}_norm``, ``layers.i.mlp.{gate,up,down}_proj``,
  ``layers.i.{input,post_attention}_layernorm`` (Gemma also ``pre_feedforward_layernorm``,
  ``post_feedforward_layernorm`` and the ``layer_scalar`` buffer), ``markov_head.markov_w1.weight`` ``[V, r]``,
  ``markov_head.markov_w2.weight`` ``[V, r]``, ``confidence_head.proj.{weight,bias}``.

Forward differences from z-lab DFlash:

* the block is ``[x_t, mask, ..., mask]`` at positions ``t .. t+B-1`` and **every** slot is a prediction: slot i
  predicts ``x_{t+i+1}``, so a round proposes B tokens and verifies B + 1 (z-lab: slot 0 predicts nothing, B - 1);
* embedding and ``lm_head`` are the drafter's own (Gemma: embedding times ``sqrt(hidden)`` in the weight dtype,
  logits soft-capped ``c * tanh(z / c)`` with ``final_logit_softcapping``);
* DSpark's Markov head biases the block logits step by step from the anchor:
  ``z_i += W2 W1[x_{i-1}]`` with ``x_{-1}`` = the anchor ``x_t`` and ``x_{i-1}`` the token proposed at slot i - 1
  (greedy: argmax step by step; sampling: sample step by step, ``softmax(z_i)`` is the draft distribution q_i);
* the confidence head ``sigmoid(proj([h_i; W1[x_{i-1}]]))`` (``[h_i]`` without ``confidence_head_with_markov``)
  may cut the proposal at the first slot below a threshold (DeepSpec's default 0 keeps the whole block);
* Gemma-4: head_dim = ``global_head_dim``, KV heads = ``num_global_key_value_heads`` with ``attention_k_eq_v``
  (values = scale-free ``v_norm(k_proj(x))``), attention scaling 1.0, sandwich norms plus ``layer_scalar``, and the
  full-attention rope: proportional (``partial_rotary_factor`` 0.25, θ 1e6), which rotates frequency pairs
  ``(i, i + D/2)`` for ``i < 0.25 D / 2`` at ``θ^(-2i/D)`` and leaves the other channels unrotated. FOLD's
  far query is rotated by the same tables, so it too turns only the rotary channels.
"""

from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

FAMILY = "deepspec"
ARCHITECTURES = ("Qwen3DSparkModel", "Gemma4DSparkModel")
# top-level fields DeepSpec adds to the target's text config
DEEPSPEC_FIELDS = ("num_target_layers", "block_size", "mask_token_id", "target_layer_ids", "num_anchors",
                   "enable_confidence_head", "confidence_head_with_markov", "markov_rank", "markov_head_type",
                   "target_model_type", "target_text_model_type")
MARKOV_HEAD_TYPES = ("vanilla",)  # DeepSpec also has "gated" and "rnn": not read (clear error)


def is_deepspec_dict(raw: dict) -> bool:
    """Whether a ``config.json`` dict is in the DeepSpec layout."""
    archs = raw.get("architectures") or []
    if any(a in ARCHITECTURES or "DSpark" in str(a) for a in archs):
        return True
    return "markov_rank" in raw and "dflash_config" not in raw


def variant_of(raw: dict) -> str:
    """``"gemma4"`` or ``"qwen3"``: the target family a DeepSpec drafter was built for."""
    archs = " ".join(str(a) for a in raw.get("architectures") or [])
    kinds = " ".join(str(raw.get(k, "")) for k in ("model_type", "target_model_type", "target_text_model_type"))
    return "gemma4" if "Gemma4" in archs or "gemma4" in kinds else "qwen3"


def _require(raw: dict, field: str, source: str, why: str):
    if field not in raw or raw[field] is None:
        raise ValueError(f"{source}: missing '{field}' ({why})")
    return raw[field]


def config_from_dict(raw: dict, source: str = "config.json"):
    """A :class:`~fold_hf.modeling.drafter_config.FoldDrafterConfig` for a DeepSpec ``config.json`` dict; errors name
    the file and field. The dict itself is kept (``deepspec_source``) so ``save_pretrained`` writes it back."""
    from ..drafter_config import FoldDrafterConfig

    block_size = int(_require(raw, "block_size", source, "tokens per drafted block"))
    if block_size < 1:
        raise ValueError(f"{source}: 'block_size' must be >= 1, got {block_size}")
    mask_token_id = int(_require(raw, "mask_token_id", source, "the token filling block slots 1..B-1"))
    num_target_layers = int(_require(raw, "num_target_layers", source, "layers of the target the drafter reads"))
    target_layer_ids = [int(i) for i in _require(raw, "target_layer_ids", source, "the tapped target layers")]
    if not target_layer_ids:
        raise ValueError(f"{source}: 'target_layer_ids' is empty")
    if any(i < 0 for i in target_layer_ids):
        raise ValueError(f"{source}: 'target_layer_ids' {target_layer_ids}: -1 (the embedding output) is not supported "
                         "by fold_hf's taps")
    markov_rank = int(raw.get("markov_rank", 0) or 0)
    if markov_rank < 0:
        raise ValueError(f"{source}: 'markov_rank' must be >= 0, got {markov_rank}")
    head_type = raw.get("markov_head_type")
    if markov_rank > 0:
        if head_type is None:
            raise ValueError(f"{source}: 'markov_rank' {markov_rank} > 0 needs 'markov_head_type'")
        if str(head_type).lower() not in MARKOV_HEAD_TYPES:
            raise ValueError(f"{source}: 'markov_head_type' {head_type!r} is not supported (fold_hf reads "
                             f"{list(MARKOV_HEAD_TYPES)})")
    confidence = bool(raw.get("enable_confidence_head", False))
    with_markov = bool(raw.get("confidence_head_with_markov", False)) if confidence else False
    if with_markov and markov_rank == 0:
        raise ValueError(f"{source}: 'confidence_head_with_markov' needs a Markov head ('markov_rank' is 0)")
    if any(t != "full_attention" for t in raw.get("layer_types") or []):
        raise ValueError(f"{source}: 'layer_types' {raw['layer_types']}: DeepSpec drafters use full_attention layers")
    variant = variant_of(raw)
    if variant == "gemma4":
        kwargs, extra = _gemma4_kwargs(raw, source)
    else:
        kwargs, extra = _qwen3_kwargs(raw, source)
    cfg = FoldDrafterConfig(block_size=block_size, num_target_layers=num_target_layers,
                            target_layer_ids=target_layer_ids, mask_token_id=mask_token_id, dflash_layout="top",
                            **kwargs)
    extra.update(drafter_family=FAMILY, deepspec_variant=variant, markov_rank=markov_rank,
                 markov_head_type=str(head_type).lower() if markov_rank else None,
                 enable_confidence_head=confidence, confidence_head_with_markov=with_markov,
                 num_anchors=raw.get("num_anchors"), deepspec_source=copy.deepcopy(raw))
    for key, value in extra.items():
        setattr(cfg, key, value)
    return cfg


def _qwen3_kwargs(raw: dict, source: str) -> tuple[dict, dict]:
    data = copy.deepcopy(raw)
    for key in DEEPSPEC_FIELDS + ("architectures", "model_type", "auto_map", "transformers_version", "dtype",
                                  "torch_dtype", "_attn_implementation", "tie_word_embeddings"):
        data.pop(key, None)
    for field in ("hidden_size", "num_hidden_layers", "vocab_size"):
        _require(raw, field, source, "a drafter dimension")
    if "rope_theta" not in raw and not raw.get("rope_parameters"):
        raise ValueError(f"{source}: missing 'rope_theta' (or 'rope_parameters'): the drafter's rope base")
    data.pop("sliding_window", None)
    data["use_sliding_window"] = False
    data["layer_types"] = ["full_attention"] * int(raw["num_hidden_layers"])
    return data, {}


def _gemma4_kwargs(raw: dict, source: str) -> tuple[dict, dict]:
    need = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
            "global_head_dim", "rms_norm_eps", "rope_parameters")
    for field in need:
        _require(raw, field, source, "a Gemma-4 drafter field")
    if raw.get("enable_moe_block"):
        raise ValueError(f"{source}: 'enable_moe_block' true: DeepSpec Gemma-4 drafters have dense MLPs")
    if int(raw.get("hidden_size_per_layer_input") or 0):
        raise ValueError(f"{source}: 'hidden_size_per_layer_input' must be 0 for a DeepSpec Gemma-4 drafter")
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    kv_heads = raw.get("num_global_key_value_heads") if k_eq_v else raw.get("num_key_value_heads")
    if kv_heads is None:
        field = "num_global_key_value_heads" if k_eq_v else "num_key_value_heads"
        raise ValueError(f"{source}: missing '{field}' (KV heads of the drafter's full-attention layers)")
    rope = raw["rope_parameters"]
    full = rope.get("full_attention", rope) if isinstance(rope, dict) else None
    if not isinstance(full, dict) or "rope_theta" not in full:
        raise ValueError(f"{source}: 'rope_parameters.full_attention' must give 'rope_theta' (and the rope_type)")
    rope_type = full.get("rope_type", "default")
    if rope_type not in ("default", "proportional"):
        raise ValueError(f"{source}: 'rope_parameters.full_attention.rope_type' {rope_type!r} is not supported "
                         "(default or proportional)")
    n_layers = int(raw["num_hidden_layers"])
    hidden = int(raw["hidden_size"])
    width = int(raw["intermediate_size"])
    shared = int(raw.get("num_kv_shared_layers") or 0)
    double = bool(raw.get("use_double_wide_mlp", False))
    # Gemma4TextMLP doubles the width of KV-sharing ("reuse") layers, counted from the end of the drafter's layers
    reuse = [shared > 0 and (shared >= n_layers or i >= n_layers - shared) for i in range(n_layers)]
    kwargs = dict(hidden_size=hidden, intermediate_size=width, num_hidden_layers=n_layers,
                  num_attention_heads=int(raw["num_attention_heads"]), num_key_value_heads=int(kv_heads),
                  head_dim=int(raw["global_head_dim"]), rms_norm_eps=float(raw["rms_norm_eps"]),
                  hidden_act=raw.get("hidden_activation", "gelu_pytorch_tanh"), vocab_size=int(raw["vocab_size"]),
                  max_position_embeddings=int(raw.get("max_position_embeddings", 131072)),
                  attention_bias=bool(raw.get("attention_bias", False)), rope_theta=float(full["rope_theta"]),
                  layer_types=["full_attention"] * n_layers, use_sliding_window=False,
                  pad_token_id=raw.get("pad_token_id"), tie_word_embeddings=False)
    softcap = raw.get("final_logit_softcapping")
    extra = dict(attention_k_eq_v=k_eq_v, attention_logit_scale=1.0, sandwich_norms=True,
                 final_logit_softcapping=None if softcap is None else float(softcap),
                 embed_scale=math.sqrt(hidden),
                 layer_intermediate_sizes=[width * (2 if double and r else 1) for r in reuse],
                 deepspec_rope=dict(rope_type=rope_type, rope_theta=float(full["rope_theta"]),
                                    partial_rotary_factor=float(full.get("partial_rotary_factor", 1.0))))
    if softcap is not None and float(softcap) <= 0:
        raise ValueError(f"{source}: 'final_logit_softcapping' must be positive, got {softcap}")
    return kwargs, extra


def is_deepspec(config) -> bool:
    return getattr(config, "drafter_family", None) == FAMILY


# ---------------------------------------------------------------------------------------------- rope
def rotary_tables(config, yarn: tuple[float, int] | None = None):
    """The drafter's rotary tables, or None when the shared default (``RotaryTables.from_config``) applies.

    Gemma-4's proportional rope is a full-width table whose last ``D/2 - rotary pairs`` frequencies are 0 (those
    channels never turn, at any position, near or far). ``yarn = (factor, R)``: YaRN applied to the rotary
    frequencies (the zero ones stay zero), transformers' yarn rule over the full head dim.
    """
    from ..rope import RotaryTables

    params = getattr(config, "deepspec_rope", None)
    if params is None:
        return None
    with torch.device("cpu"):  # models are built on the meta device when loading
        return _rotary_tables(config, params, yarn)


def _rotary_tables(config, params: dict, yarn):
    from ..rope import RotaryTables

    head_dim = int(config.head_dim)
    theta = params["rope_theta"]
    pairs = head_dim // 2
    rotary_pairs = int(params["partial_rotary_factor"] * head_dim // 2) if params["rope_type"] == "proportional" \
        else pairs
    inv = 1.0 / (theta ** (torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / head_dim))
    scaling = 1.0
    if yarn is not None:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        factor, train_length = yarn
        cfg = copy.copy(config)
        cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": theta, "factor": float(factor),
                               "original_max_position_embeddings": int(train_length)}
        cfg.partial_rotary_factor = 1.0
        with torch.device("cpu"):
            yarn_inv, scaling = ROPE_INIT_FUNCTIONS["yarn"](cfg, torch.device("cpu"))
        inv = yarn_inv.to(torch.float64)
    inv = inv.clone()
    inv[rotary_pairs:] = 0.0
    return RotaryTables(inv, scaling, head_dim)


# ---------------------------------------------------------------------------------------------- modules
class MarkovHead(nn.Module):
    """DSpark's vanilla Markov head: ``bias(x) = W2 W1[x]`` (``markov_w1`` ``[V, r]`` embedding, ``markov_w2``
    ``[V, r]`` linear without bias)."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)

    def prev_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` token ids -> ``[..., r]``."""
        return self.markov_w1(token_ids.long().to(self.markov_w1.weight.device))

    def bias(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` previous token ids -> logit bias ``[..., V]``."""
        return self.markov_w2(self.prev_embeddings(token_ids))


class ConfidenceHead(nn.Module):
    """``proj`` ``[1, H (+ r)]`` with bias: the logit of "this slot's proposal is accepted"."""

    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


def build_modules(drafter, config) -> None:
    """Attach the family's own modules to a FoldDrafter: embedding, lm_head, Markov and confidence heads."""
    V, H = config.vocab_size, config.hidden_size
    drafter.embed_tokens = nn.Embedding(V, H)
    drafter.lm_head = nn.Linear(H, V, bias=False)
    rank = int(config.markov_rank or 0)
    drafter.markov_head = MarkovHead(V, rank) if rank > 0 else None
    drafter.confidence_head = None
    if config.enable_confidence_head:
        drafter.confidence_head = ConfidenceHead(H + (rank if config.confidence_head_with_markov else 0))


def embed(drafter, ids: torch.Tensor) -> torch.Tensor:
    """Block embeddings ``[b, L, H]`` of ``ids [b, L]`` (Gemma: times sqrt(hidden) in the weight dtype)."""
    weight = drafter.embed_tokens.weight
    out = drafter.embed_tokens(ids.to(weight.device))
    scale = getattr(drafter.config, "embed_scale", None)
    if scale is not None:
        # sqrt(hidden) rounded to the weight dtype, as DeepSpec multiplies; a Python float (no host-to-device copy
        # inside a captured step)
        out = out * float(torch.tensor(scale, dtype=weight.dtype))
    return out


def logits(drafter, hidden: torch.Tensor) -> torch.Tensor:
    """``[..., H]`` final-normed slots -> base logits ``[..., V]`` (soft-capped for Gemma-4), before the Markov bias."""
    head = drafter.lm_head
    out = head(hidden.to(head.weight.device, head.weight.dtype))
    cap = getattr(drafter.config, "final_logit_softcapping", None)
    if cap is not None:
        out = torch.tanh(out / cap) * cap
    return out


def confidence_logits(drafter, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
    """``[n]`` confidence logits of the proposal slots ``hidden [n, H]`` whose previous tokens are ``prev_tokens [n]``."""
    head = drafter.confidence_head
    features = hidden.to(head.proj.weight.dtype)
    if drafter.config.confidence_head_with_markov:
        prev = drafter.markov_head.prev_embeddings(prev_tokens).to(features.dtype)
        features = torch.cat((features, prev.to(features.device)), -1)
    return head(features.to(head.proj.weight.device))


def confident_length(drafter, hidden: torch.Tensor, tokens: torch.Tensor, last: torch.Tensor,
                     threshold: float) -> torch.Tensor:
    """Device tensor ``[1]``: slots kept before the first one whose ``sigmoid(confidence)`` is below ``threshold``
    (all of them when none is, or when there is no confidence head or the threshold is <= 0). ``hidden [n, H]``,
    ``tokens [n]`` the proposals, ``last [1]`` the anchor token."""
    n = tokens.shape[0]
    if drafter.confidence_head is None or threshold <= 0 or n == 0:
        return torch.full((1,), n, dtype=torch.long, device=tokens.device)
    prev = torch.cat((last.reshape(1).to(tokens.device), tokens[:-1]))
    below = confidence_logits(drafter, hidden, prev).sigmoid().to(tokens.device) < threshold
    return (~below).long().cumprod(0).sum().view(1)


def markov_chain(drafter, base: torch.Tensor, last: torch.Tensor, pick) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Proposals of one block with the Markov head: slot i's logits ``base[i] + W2 W1[x_{i-1}]`` (``x_{-1}`` =
    ``last``), its token picked before the next slot is biased.

    Args:
        base: ``[n, V]`` base logits of the proposal slots.
        last: ``[1]`` the anchor token.
        pick: ``(logits [m, V], first_slot) -> (tokens [m], scores [m, V] or None)`` (argmax, or a sampler returning
            q; ``first_slot`` = the slot, so a sampler uses that slot's uniform).

    Returns:
        (tokens ``[n]``, stacked scores ``[n, V]`` or None). Device ops only (no host read): capturable.
    """
    head = drafter.markov_head
    prev = last.reshape(1)
    tokens, scores = [], []
    for i in range(base.shape[0]):
        step = base[i : i + 1] + head.bias(prev).to(base.device, base.dtype)
        token, score = pick(step, i)
        tokens.append(token.reshape(1))
        scores.append(score)
        prev = token.reshape(1)
    tokens = torch.cat(tokens)
    return tokens, (torch.cat(scores) if scores and scores[0] is not None else None)


# ---------------------------------------------------------------------------------------------- checks
def check_weights(config, state: dict, origin: dict, directory: Path) -> None:
    """Errors naming the file and field when the weights disagree with ``config.json``'s DeepSpec fields."""
    cfg_file = directory / "config.json"
    where = sorted({str(p) for p in origin.values()}) or [str(directory)]
    files = where[0] if len(where) == 1 else f"{directory} (safetensors)"
    if "lm_head.weight" not in state:
        raise ValueError(f"{files}: no 'lm_head.weight' (DeepSpec drafters carry their own lm_head copy)")
    if "embed_tokens.weight" not in state:
        raise ValueError(f"{files}: no 'embed_tokens.weight' (DeepSpec drafters carry their own embedding copy)")
    rank = int(config.markov_rank or 0)
    w1 = state.get("markov_head.markov_w1.weight")
    if rank > 0 and w1 is None:
        raise ValueError(f"{cfg_file}: 'markov_rank' is {rank} but {files} has no 'markov_head.markov_w1.weight'")
    if rank == 0 and w1 is not None:
        raise ValueError(f"{cfg_file}: 'markov_rank' is 0 but {origin.get('markov_head.markov_w1.weight', files)} "
                         f"holds a Markov head of rank {w1.shape[-1]}")
    if rank > 0 and w1.shape[-1] != rank:
        raise ValueError(f"{cfg_file}: 'markov_rank' is {rank} but {origin['markov_head.markov_w1.weight']} has "
                         f"'markov_head.markov_w1.weight' of rank {w1.shape[-1]} (shape {tuple(w1.shape)})")
    has_conf = "confidence_head.proj.weight" in state
    if has_conf != bool(config.enable_confidence_head):
        raise ValueError(f"{cfg_file}: 'enable_confidence_head' is {bool(config.enable_confidence_head)} but the "
                         f"weights {'hold' if has_conf else 'lack'} 'confidence_head.proj.weight'")
    missing_scalars = [k for k in _layer_scalar_keys(config) if k not in state]
    if missing_scalars:
        warnings.warn(f"{files}: no {missing_scalars[0]} (and {len(missing_scalars) - 1} more): Gemma-4 layer scalars "
                      "taken as 1.0, DeepSpec's initial value", UserWarning, stacklevel=3)
        for key in missing_scalars:
            state[key] = torch.ones(1)
            origin[key] = directory


def _layer_scalar_keys(config) -> list[str]:
    if not getattr(config, "sandwich_norms", False):
        return []
    return [f"layers.{i}.layer_scalar" for i in range(config.num_hidden_layers)]


def target_family_check(drafter, target_config) -> tuple[bool, str, str]:
    """(ok, good message, bad message): a Gemma-4 drafter needs a Gemma-4 target, a Qwen3 drafter a Qwen3 one."""
    want = drafter.config.deepspec_variant
    got = str(getattr(target_config, "model_type", "") or "")
    ok = got.startswith(want) or not got
    return (ok, f"DeepSpec {want} drafter on a {got or 'config-less'} target",
            f"DeepSpec drafter built for a {want} target (config.json architectures / target_text_model_type) "
            f"given a {got} target")


def describe(config) -> dict[str, Any]:
    """The DeepSpec fields ``fold-hf doctor`` reports."""
    rank = int(config.markov_rank or 0)
    return {"kind": "DSpark" if rank else "DFlash", "variant": config.deepspec_variant,
            "drafted_per_round": int(config.block_size), "markov_rank": rank,
            "markov_head_type": config.markov_head_type,
            "confidence_head": bool(config.enable_confidence_head),
            "confidence_head_with_markov": bool(config.confidence_head_with_markov)}
