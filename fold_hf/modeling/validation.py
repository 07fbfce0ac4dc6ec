"""Checks that a drafter fits a target, raised as ValueError before any work is done."""

from __future__ import annotations

from torch import nn


def _target_text_config(target: nn.Module):
    config = target.config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def validate_pair(drafter, target: nn.Module) -> None:
    """Raise ``ValueError`` naming the mismatch when ``drafter`` cannot draft for ``target``."""
    dcfg = drafter.config
    tcfg = _target_text_config(target)
    t_hidden = getattr(tcfg, "hidden_size", None)
    t_layers = getattr(tcfg, "num_hidden_layers", None)
    t_vocab = getattr(tcfg, "vocab_size", None)
    if t_hidden is not None and dcfg.hidden_size != t_hidden:
        raise ValueError(f"drafter hidden_size {dcfg.hidden_size} does not match the target's {t_hidden}")
    if t_layers is not None and dcfg.num_target_layers != t_layers:
        raise ValueError(
            f"drafter num_target_layers {dcfg.num_target_layers} does not match the target's num_hidden_layers {t_layers}"
        )
    n_layers = t_layers if t_layers is not None else dcfg.num_target_layers
    bad = [i for i in dcfg.target_layer_ids if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"target_layer_ids {bad} out of range for a target with {n_layers} layers")
    if dcfg.mask_token_id is None:
        raise ValueError("drafter config has no mask_token_id (dflash_config.mask_token_id)")
    embed = target.get_input_embeddings()
    head = target.get_output_embeddings()
    if embed is None or head is None:
        raise ValueError("the target must expose input embeddings and an lm_head (get_output_embeddings())")
    n_embed = embed.weight.shape[0]
    if not 0 <= dcfg.mask_token_id < n_embed:
        raise ValueError(f"mask_token_id {dcfg.mask_token_id} is outside the target's embedding table ({n_embed} rows)")
    d_vocab = getattr(dcfg, "vocab_size", None)
    if t_vocab is not None and d_vocab is not None and d_vocab != t_vocab:
        raise ValueError(f"drafter vocab_size {d_vocab} does not match the target's {t_vocab}")
    if embed.weight.shape[1] != dcfg.hidden_size:
        raise ValueError(f"target embedding width {embed.weight.shape[1]} does not match drafter hidden {dcfg.hidden_size}")


def validate_batch(input_ids) -> None:
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] != 1:
        raise ValueError(f"batch size {input_ids.shape[0]} is not supported yet: FOLD speculative decoding runs batch 1")
    if input_ids.shape[1] < 1:
        raise ValueError("input_ids is empty: give at least one prompt token")
