"""Everything fold_hf reads from transformers beyond its public API, in one place.

Supported: transformers ``>=5.17,<6`` (CI runs the family and integration tests on 5.17 and the whole suite on the
newest release pip resolves). What moved between those releases, and how each reader copes:

* norm epsilons: ``variance_epsilon`` (Llama, Qwen3, Qwen3.5's gated norm, Gemma-4 from 5.25) or ``eps`` (Qwen3.5,
  Gemma-3, Gemma-4 before 5.25): :func:`norm_epsilon`;
* linear-attention cache layers (Qwen3.5's Gated DeltaNet): ``conv_states`` / ``recurrent_states`` /
  ``has_previous_state`` dicts in both; 5.25 adds a token count ``cumulative_length_linear`` (what
  ``cache.get_seq_length()`` reads when layer 0 is a linear layer) and records the recurrent state of every verified
  position itself (``activate_past_recording(recurrent_states_to_keep=n)``, then ``crop(-m)``):
  :func:`linear_state_snapshot`, :func:`linear_state_restore`, :func:`native_linear_rollback`;
* the private generate hooks the assistant strategy wraps (:data:`GENERATION_HOOKS`) and the one routing reads
  (``_prepare_generation_config``): :func:`require_generation_hooks` raises :class:`UpstreamChanged` naming the
  missing one, so a release that renames a hook fails loudly at install instead of running transformers' own loop.
"""

from __future__ import annotations

import functools
import inspect

import torch
import transformers
from packaging.version import Version

SUPPORTED_RANGE = ">=5.17,<6"
OLDEST_SUPPORTED = Version("5.17")
TRANSFORMERS_VERSION = Version(transformers.__version__)

# GenerationMixin methods the assistant strategy wraps (fold_hf.integrations.transformers) or routing calls
GENERATION_HOOKS = ("generate", "_get_candidate_generator", "_assisted_decoding", "_validate_generation_mode",
                    "_prepare_generation_config")


class UpstreamChanged(RuntimeError):
    """transformers no longer has something fold_hf reads (a private hook, a cache field, a module attribute)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"fold_hf: {what} (transformers {transformers.__version__}; fold_hf supports "
                         f"transformers{SUPPORTED_RANGE} and is tested on 5.17 and the newest release): please report "
                         "this with your transformers version")


# ---------------------------------------------------------------------------------------------- modules
def norm_epsilon(norm) -> float:
    """The epsilon of an RMSNorm module of transformers (``variance_epsilon`` or ``eps``, whichever it has)."""
    for name in ("variance_epsilon", "eps"):
        value = getattr(norm, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    raise UpstreamChanged(f"{type(norm).__name__} has neither `variance_epsilon` nor `eps`")


def has_norm_epsilon(norm) -> bool:
    """Whether :func:`norm_epsilon` can read ``norm``."""
    try:
        norm_epsilon(norm)
    except UpstreamChanged:
        return False
    return True


# ---------------------------------------------------------------------------------------------- caches
def is_linear_layer(layer) -> bool:
    """Whether a transformers cache layer holds linear-attention state (``conv_states`` / ``recurrent_states``)."""
    return isinstance(getattr(layer, "recurrent_states", None), dict) and isinstance(
        getattr(layer, "conv_states", None), dict)


def linear_state_snapshot(layer) -> dict:
    """A copy of everything a forward changes in a linear-attention cache layer: its conv and recurrent states,
    ``has_previous_state`` and, where the release keeps one (5.25), its token count."""
    saved = {"conv": {i: (s.clone() if s is not None else None) for i, s in layer.conv_states.items()},
             "recurrent": {i: (s.clone() if s is not None else None) for i, s in layer.recurrent_states.items()},
             "had_previous": dict(getattr(layer, "has_previous_state", {}))}
    count = getattr(layer, "cumulative_length_linear", None)
    if count is not None:
        saved["count"] = count.clone() if torch.is_tensor(count) else count
    return saved


def linear_state_restore(layer, saved: dict) -> None:
    """Put :func:`linear_state_snapshot`'s copy back, in place where the shapes allow (static addresses stay)."""
    for states, values in ((layer.conv_states, saved["conv"]), (layer.recurrent_states, saved["recurrent"])):
        for i, value in values.items():
            if value is None:
                continue
            current = states.get(i)
            if current is not None and current.shape == value.shape:
                current.copy_(value)
            else:
                states[i] = value
    if hasattr(layer, "has_previous_state"):
        layer.has_previous_state.update(saved["had_previous"])
    if "count" in saved:
        current = layer.cumulative_length_linear
        if torch.is_tensor(current):
            current.copy_(saved["count"])
        else:
            layer.cumulative_length_linear = saved["count"]


@functools.lru_cache(maxsize=None)
def native_linear_rollback() -> bool:
    """Whether this transformers' linear-attention cache layers roll back their recurrent state themselves (5.25:
    ``activate_past_recording(recurrent_states_to_keep=n)`` records the state after each verified position and
    ``crop(-m)`` restores it); on older releases fold_hf snapshots and replays (:mod:`fold_hf.targets.rollback`)."""
    from transformers import cache_utils

    mixin = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    activate = getattr(mixin, "activate_past_recording", None)
    if activate is None:
        return False
    return "recurrent_states_to_keep" in inspect.signature(activate).parameters


def activate_linear_recording(cache, positions: int) -> None:
    """Make ``cache`` (with linear-attention layers, on a release where :func:`native_linear_rollback`) record the
    state after each of the last ``positions`` positions of every forward, so that ``crop(-m)``, ``m <= positions``,
    rolls the recurrent state back."""
    if not native_linear_rollback():
        raise UpstreamChanged("linear-attention cache layers without `activate_past_recording(recurrent_states_to_keep=)`")
    cache.activate_past_recording(recurrent_states_to_keep=int(positions))


# ---------------------------------------------------------------------------------------------- generate hooks
def require_generation_hooks() -> None:
    """Raise :class:`UpstreamChanged` when a GenerationMixin method fold_hf wraps or calls is gone."""
    from transformers.generation.utils import GenerationMixin

    missing = [name for name in GENERATION_HOOKS if not callable(getattr(GenerationMixin, name, None))]
    if missing:
        raise UpstreamChanged(f"GenerationMixin has no {', '.join(missing)}: target.generate(assistant_model="
                              "<FoldDrafter>) cannot be routed to FOLD")


__all__ = ["GENERATION_HOOKS", "OLDEST_SUPPORTED", "SUPPORTED_RANGE", "TRANSFORMERS_VERSION", "UpstreamChanged",
           "activate_linear_recording", "has_norm_epsilon", "is_linear_layer", "linear_state_restore",
           "linear_state_snapshot", "native_linear_rollback", "norm_epsilon", "require_generation_hooks"]
