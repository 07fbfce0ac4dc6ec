"""`fold-hf doctor`: check a target–drafter pair and a FoldConfig before use, and say what would run.

Every check is reported (ok / warn / error) instead of stopping at the first problem, so one run lists
everything to fix. The target may be a full model or only its config (built on the meta device, no weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .modeling.drafter import FoldDrafter
from .modeling.fold_config import FoldConfig


@dataclass
class Check:
    name: str
    status: str  # "ok", "warn" or "error"
    message: str


def _text_config(target):
    cfg = target.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def diagnose(target, drafter: FoldDrafter, fold_config: FoldConfig | None = None,
             context_length: int | None = None) -> list[Check]:
    """All checks of ``drafter`` against ``target`` under ``fold_config`` (the drafter's own when None)."""
    cfg = fold_config or drafter.fold_config
    dcfg, tcfg = drafter.config, _text_config(target)
    checks: list[Check] = []

    def add(name, ok, good, bad, level="error"):
        checks.append(Check(name, "ok" if ok else level, good if ok else bad))

    t_hidden, t_layers, t_vocab = tcfg.hidden_size, tcfg.num_hidden_layers, tcfg.vocab_size
    add("hidden size", dcfg.hidden_size == t_hidden, f"{dcfg.hidden_size} on both sides",
        f"drafter {dcfg.hidden_size} vs target {t_hidden}")
    add("target layers", dcfg.num_target_layers == t_layers, f"drafter trained on a {t_layers}-layer target",
        f"drafter expects num_target_layers={dcfg.num_target_layers}, target has {t_layers}")
    bad_taps = [i for i in dcfg.target_layer_ids if not 0 <= i < t_layers]
    add("tapped layers", not bad_taps, f"{dcfg.target_layer_ids} (hidden_states[i + 1] of the target)",
        f"{bad_taps} out of range for {t_layers} layers")
    add("fc input", drafter.fc.in_features == len(dcfg.target_layer_ids) * dcfg.hidden_size,
        f"{len(dcfg.target_layer_ids)} taps x {dcfg.hidden_size}",
        f"fc takes {drafter.fc.in_features} features, taps give {len(dcfg.target_layer_ids) * dcfg.hidden_size}")
    mask = dcfg.mask_token_id
    add("mask token", mask is not None and 0 <= mask < t_vocab, f"id {mask} inside the {t_vocab}-token vocabulary",
        f"mask_token_id {mask!r} is missing or outside the {t_vocab}-token vocabulary")
    d_vocab = getattr(dcfg, "vocab_size", None)
    add("vocabulary", d_vocab in (None, t_vocab), f"{t_vocab} tokens", f"drafter vocab {d_vocab} vs target {t_vocab}")

    rope = drafter.rope
    params = dict(getattr(dcfg, "rope_parameters", None) or {})
    checks.append(Check("rope", "ok", f"type {params.get('rope_type', 'default')}, theta {params.get('rope_theta')}, "
                                      f"{rope.rotary_dim}/{rope.head_dim} rotary dims"))
    sliding = [i for i in range(len(drafter.layers)) if drafter.layers[i].self_attn.sliding_window is not None]
    if sliding:
        applies = "window + far memory" if cfg.layers == "all" and cfg.mode in ("fold", "rerope") else "as released"
        checks.append(Check("sliding layers", "ok", f"layers {sliding} (window {dcfg.sliding_window}) read {applies}"))

    B = dcfg.block_size
    D = cfg.window + B
    add("window vs training length", D <= cfg.train_length,
        f"W + B = {D} <= training length {cfg.train_length}: the window stays inside trained distances",
        f"W + B = {D} exceeds the training length {cfg.train_length}: window entries are read at distances "
        f"the drafter never saw; lower window", level="warn")
    if cfg.mode in ("yarn", "rerope"):
        checks.append(Check("train_length", "ok", f"{cfg.mode} uses train_length={cfg.train_length} as R"))

    T = context_length if context_length is not None else 4 * D
    read = drafter.plan_read(len(drafter.layers) - 1, T, T, B, device="cpu")
    far = int(read.far_mask.any(-1).sum()) if read.far_stop else 0
    checks.append(Check("plan", "ok", f"mode {cfg.mode}, block {B}; at {T} context entries the last layer reads "
                                      f"{read.near_index.numel()} window entries"
                                      + (f" and a far memory of up to {read.far_stop} entries ({far}/{B} rows, "
                                         f"alpha {cfg.alpha})" if read.far_stop else "")))
    per_entry = 2 * dcfg.num_key_value_heads * (dcfg.head_dim or dcfg.hidden_size // dcfg.num_attention_heads)
    per_entry *= len(drafter.layers) * torch.finfo(drafter.fc.weight.dtype).bits // 8
    checks.append(Check("cache", "ok", f"{per_entry * 1024 / 2**20:.2f} MiB per 1K context entries "
                                       f"(one unrotated K/V copy, {drafter.fc.weight.dtype})"))
    return checks


def format_checks(checks: list[Check]) -> str:
    marks = {"ok": "  ok ", "warn": " WARN", "error": "ERROR"}
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{marks[c.status]}  {c.name:{width}s}  {c.message}" for c in checks)
