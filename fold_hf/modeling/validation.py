"""Checks that a drafter fits a target, raised as ValueError before any work is done."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn


@dataclass
class Check:
    """One finding about a pair or a config: ``status`` is ``"ok"``, ``"warn"`` or ``"error"``."""

    name: str
    status: str
    message: str


def target_text_config(target: nn.Module):
    """The target's text config (the config itself for text-only models)."""
    config = target.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def pair_checks(drafter, target: nn.Module) -> list[Check]:
    """Every fit check of ``drafter`` against ``target``, in order, each ok or error (none raises)."""
    dcfg = drafter.config
    tcfg = target_text_config(target)
    t_hidden = getattr(tcfg, "hidden_size", None)
    t_layers = getattr(tcfg, "num_hidden_layers", None)
    t_vocab = getattr(tcfg, "vocab_size", None)
    checks: list[Check] = []

    def add(name: str, ok: bool, good: str, bad: str) -> None:
        checks.append(Check(name, "ok" if ok else "error", good if ok else bad))

    if getattr(drafter, "is_deepspec", False):
        from .families.deepspec import target_family_check

        add("target family", *target_family_check(drafter, tcfg))
    add("hidden size", t_hidden is None or dcfg.hidden_size == t_hidden, f"{dcfg.hidden_size} on both sides",
        f"drafter hidden_size {dcfg.hidden_size} does not match the target's {t_hidden}")
    add("target layers", t_layers is None or dcfg.num_target_layers == t_layers,
        f"drafter trained on a {dcfg.num_target_layers}-layer target",
        f"drafter num_target_layers {dcfg.num_target_layers} does not match the target's num_hidden_layers {t_layers}")
    n_layers = t_layers if t_layers is not None else dcfg.num_target_layers
    bad = [i for i in dcfg.target_layer_ids if not 0 <= i < n_layers]
    add("tapped layers", not bad, f"{dcfg.target_layer_ids} (hidden_states[i + 1] of the target)",
        f"target_layer_ids {bad} out of range for a target with {n_layers} layers")
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    add("target embeddings", embed is not None and head is not None, "input embeddings and lm_head found",
        "the target must expose input embeddings and an lm_head (get_output_embeddings())")
    n_embed = embed.weight.shape[0] if embed is not None else t_vocab
    mask = dcfg.mask_token_id
    if mask is None:
        add("mask token", False, "", "drafter config has no mask_token_id (dflash_config.mask_token_id)")
    else:
        add("mask token", n_embed is None or 0 <= mask < n_embed, f"id {mask} inside the {n_embed}-row embedding",
            f"mask_token_id {mask} is outside the target's embedding table ({n_embed} rows)")
    d_vocab = getattr(dcfg, "vocab_size", None)
    add("vocabulary", t_vocab is None or d_vocab is None or d_vocab == t_vocab, f"{t_vocab} tokens",
        f"drafter vocab_size {d_vocab} does not match the target's {t_vocab}")
    if embed is not None:
        width = embed.weight.shape[1]
        add("embedding width", width == dcfg.hidden_size, f"{width}",
            f"target embedding width {width} does not match drafter hidden {dcfg.hidden_size}")
    return checks


def validate_pair(drafter, target: nn.Module) -> None:
    """Raise ``ValueError`` naming the first mismatch when ``drafter`` cannot draft for ``target``."""
    for check in pair_checks(drafter, target):
        if check.status == "error":
            raise ValueError(check.message + _drafter_source(drafter))


def _drafter_source(drafter) -> str:
    """`` (drafter config: <dir>/config.json)`` for a drafter loaded from disk, else nothing."""
    from pathlib import Path

    origin = getattr(drafter, "name_or_path", None) or ""
    if not origin:
        return ""
    config_file = Path(origin) / "config.json"
    return f" (drafter config: {config_file if config_file.is_file() else origin})"


def validate_batch(input_ids, attention_mask=None) -> None:
    """Raise ``ValueError`` unless ``input_ids`` is a ``[B, L]`` prompt whose ``attention_mask`` (``[B, L]``, if
    given) pads on the left only (transformers' convention for decoder-only models) and leaves each row a token."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] < 1:
        raise ValueError("input_ids is empty: give at least one prompt token")
    if attention_mask is None:
        return
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids {tuple(input_ids.shape)}:"
                         " they must match")
    real = attention_mask != 0
    empty = ~real.any(dim=1)
    if bool(empty.any()):
        raise ValueError(f"attention_mask row {int(empty.nonzero()[0])} is all zeros: every row needs at least one "
                         "prompt token")
    # right padding or a hole: a 0 after a 1 in some row (left padding is 0s then 1s, never 1 then 0)
    after_one = real[:, :-1] & ~real[:, 1:]
    if bool(after_one.any()):
        row = int(after_one.any(dim=1).nonzero()[0])
        raise ValueError(f"attention_mask row {row} has padding after a prompt token (right padding or a hole): "
                         "pad on the left (left padding, tokenizer.padding_side = 'left'), as transformers' "
                         "decoder-only generate expects")
