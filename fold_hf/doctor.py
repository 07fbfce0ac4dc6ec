"""`fold-hf doctor`: check a target–drafter pair and a FoldConfig before use, and say what would run.

Every check is reported (ok / warn / error) instead of stopping at the first problem, so one run lists
everything to fix. The target may be a full model or only its config (built on the meta device, no weights).
"""

from __future__ import annotations

import torch

from .embedded import recorded_training_length
from .modeling.drafter import FoldDrafter
from .modeling.fold_config import FoldConfig
from .modeling.validation import Check, pair_checks


def diagnose(target, drafter: FoldDrafter, fold_config: FoldConfig | None = None,
             context_length: int | None = None) -> list[Check]:
    """All checks of ``drafter`` against ``target`` under ``fold_config`` (the drafter's own when None)."""
    cfg = fold_config or drafter.fold_config
    dcfg = drafter.config
    checks = pair_checks(drafter, target)
    checks.append(family_check(drafter))

    rope = drafter.rope
    # a DeepSpec Gemma-4 drafter's proportional rope: a full-width table whose unrotated pairs have frequency 0
    params = dict(getattr(dcfg, "deepspec_rope", None) or getattr(dcfg, "rope_parameters", None) or {})
    checks.append(Check("rope", "ok", f"type {params.get('rope_type', 'default')}, theta {params.get('rope_theta')}, "
                                      f"{2 * int((rope.inv_freq != 0).sum())}/{rope.head_dim} rotary dims"))
    sliding = [i for i in range(len(drafter.layers)) if drafter.layers[i].self_attn.sliding_window is not None]
    if sliding:
        geometry = drafter.read_geometry(sliding[0], cfg)  # the one planner's rules (modeling.read_plan)
        applies = ("window + far memory" if geometry.far is not None
                   else "the CMR selection" if geometry.selection == "cmr" else "as released")
        checks.append(Check("sliding layers", "ok", f"layers {sliding} (window {dcfg.sliding_window}) read {applies}"))

    B = dcfg.block_size
    D = cfg.window + B
    length, source = cfg.train_length, "the config's train_length"
    recorded = recorded_training_length(drafter.name_or_path) if getattr(drafter, "name_or_path", None) else None
    if recorded is not None and recorded[0] != cfg.train_length:
        # the drafter's own record of what it saw beats a preset written for another drafter
        length, source = recorded[0], f"{recorded[1]}; the config says {cfg.train_length}"
        checks.append(Check("train_length", "warn", f"the drafter records a training length of {recorded[0]} "
                                                    f"({recorded[1]}) but the config says {cfg.train_length}: "
                                                    f"pass train_length={recorded[0]}"))
    inside = D <= length
    checks.append(Check("window vs training length", "ok" if inside else "warn",
                        f"W + B = {D} <= training length {length} ({source}): the window stays inside trained "
                        f"distances" if inside else f"W + B = {D} exceeds the training length {length} ({source}): "
                        f"window entries are read at distances the drafter never saw; lower window"))
    if cfg.mode == "yarn":  # ReRoPE's log base is 4096 for every model (B.3), not train_length
        checks.append(Check("train_length", "ok", f"{cfg.mode} uses train_length={cfg.train_length} as R"))

    T = context_length if context_length is not None else 4 * D
    geometry = drafter.read_geometry(len(drafter.layers) - 1, cfg)
    if geometry.selection in ("infllm", "cmr"):  # per-request selections: no read to plan without a request
        what = (f"window {cfg.window} + retrieved blocks at distance {geometry.far}" if geometry.selection == "infllm"
                else f"{cfg.retrieval_budget} entries chosen from the target's attention, renumbered")
        checks.append(Check("plan", "ok", f"mode {cfg.mode}, block {B}: reads {what} (docs/baselines.md)"))
        return checks + [_cache_check(drafter, dcfg)]
    read = drafter.plan_read(len(drafter.layers) - 1, T, T, B, device="cpu", fold_config=cfg)
    far = int(read.far_mask.any(-1).sum()) if read.far_stop else 0
    checks.append(Check("plan", "ok", f"mode {cfg.mode}, block {B}; at {T} context entries the last layer reads "
                                      f"{read.near_index.numel()} window entries"
                                      + (f" and a far memory of up to {read.far_stop} entries ({far}/{B} rows, "
                                         f"alpha {cfg.alpha})" if read.far_stop else "")))
    checks.append(_cache_check(drafter, dcfg))
    return checks


def _cache_check(drafter, dcfg) -> Check:
    per_entry = 2 * dcfg.num_key_value_heads * (dcfg.head_dim or dcfg.hidden_size // dcfg.num_attention_heads)
    per_entry *= len(drafter.layers) * torch.finfo(drafter.fc.weight.dtype).bits // 8
    return Check("cache", "ok", f"{per_entry * 1024 / 2**20:.2f} MiB per 1K context entries "
                                f"(one unrotated K/V copy, {drafter.fc.weight.dtype})")


def family_check(drafter: FoldDrafter) -> Check:
    """What the drafter's checkpoint family proposes per round (DeepSpec: kind, Markov head, confidence head)."""
    per_round = drafter.num_proposals
    if not drafter.is_deepspec:
        return Check("drafter family", "ok", f"z-lab DFlash: {per_round} drafted tokens per round "
                                             f"({per_round + 1} verified)")
    from .modeling.families.deepspec import describe

    d = describe(drafter.config)
    head = f"Markov rank {d['markov_rank']}" + (f" ({d['markov_head_type']})" if d["markov_rank"] else "")
    if d["confidence_head"]:
        conf = "confidence head" + (" with Markov features" if d["confidence_head_with_markov"] else "")
        conf += f", threshold {drafter.confidence_threshold:g}" + (" (whole blocks)" if not
                                                                    drafter.confidence_threshold else "")
    else:
        conf = "no confidence head"
    return Check("drafter family", "ok", f"DeepSpec {d['kind']} ({d['variant']}): {per_round} drafted tokens per "
                                         f"round ({per_round + 1} verified), {head}, {conf}")


def format_checks(checks: list[Check]) -> str:
    marks = {"ok": "  ok ", "warn": " WARN", "error": "ERROR"}
    width = max(len(c.name) for c in checks)
    return "\n".join(f"{marks[c.status]}  {c.name:{width}s}  {c.message}" for c in checks)
