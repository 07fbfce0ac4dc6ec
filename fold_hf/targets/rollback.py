"""Rollback of recurrent (linear-attention) state after a verification round, on transformers' own caches.

A hybrid target (Qwen3.5: Gated DeltaNet layers with a full-attention layer every fourth) keeps, besides its KV
cache, a convolution state ``[b, conv_dim, kernel]`` and a recurrent state ``[b, Hv, Dk, Dv]`` per linear-attention
layer. A verify forward over ``[last, d_1 .. d_k]`` advances both past every draft; when only ``n < k`` drafts
are accepted, the KV layers are cropped as usual but the recurrent state cannot be "cropped": it is a sum over
every position.

transformers 5.25 rolls the recurrent state back itself (``activate_past_recording(recurrent_states_to_keep=n)``
records the state after each verified position, ``crop(-m)`` puts the right one back): where it does
(:func:`fold_hf.compat.native_linear_rollback`) both the round loop and ``target.generate(assistant_model=...)`` use
that. On older releases (5.17) ``activate_past_recording()`` rolls back only the *convolution* state, so the
rollback here is snapshot and recompute, family-free, on any cache whose layers carry ``conv_states`` /
``recurrent_states`` dicts (read through :mod:`fold_hf.compat`):

1. :meth:`LinearStateRollback.snapshot` clones every linear layer's states before the verify forward
   (Qwen3.5-9B: 24 layers x (32 x 128 x 128 fp32 + 8192 x 4) = ~50 MB per round, a copy, no compute);
2. after a partial acceptance, :meth:`LinearStateRollback.rollback` crops the attention layers by the whole
   verified block, restores the snapshot, and replays the ``n + 1`` accepted tokens through the target, so
   every state is exactly the target's state after the accepted prefix. A fully accepted block costs nothing.

The fast path (:mod:`fold_hf.targets.qwen35`) instead computes the state at every block position
during the verify and selects the accepted one, without a replay.
"""

from __future__ import annotations

import torch

from ..compat import is_linear_layer as _is_linear_layer
from ..compat import linear_state_restore, linear_state_snapshot, native_linear_rollback


def has_linear_state(cache) -> bool:
    """Whether ``cache`` (a transformers Cache) has linear-attention layers (conv / recurrent states)."""
    return any(_is_linear_layer(layer) for layer in getattr(cache, "layers", ()))


def target_has_linear_state(target) -> bool:
    """Whether the target's config declares linear-attention layers (Qwen3.5, Qwen3-Next style ``layer_types``)."""
    from .taps import _unwrap

    config = getattr(_unwrap(target), "config", None)
    config = getattr(config, "text_config", None) or config
    return any(t in ("linear_attention", "conv", "hybrid", "hybrid_sliding")
               for t in (getattr(config, "layer_types", None) or ()))


def crop_attention_layers(cache, tokens: int) -> None:
    """Remove the last ``tokens`` entries from every attention (KV) layer of ``cache``; linear-only layers are left
    alone, layers holding both crop only their attention part."""
    if tokens <= 0:
        return
    for layer in cache.layers:
        if not _is_linear_layer(layer):
            layer.crop(-tokens)
            continue
        if not hasattr(layer, "keys"):
            continue  # linear only
        # a hybrid layer class (linear + attention): the attention base's crop, e.g. DynamicLayer.crop
        base = next(cls for cls in type(layer).__mro__
                    if "crop" in cls.__dict__ and "LinearAttention" not in cls.__name__)
        base.crop(layer, -tokens)


class LinearStateRollback:
    """Snapshot / restore / replay of the linear-attention states of one transformers cache (batch 1): the
    release-independent rollback (on 5.25 the round loop uses transformers' own recording instead)."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self.layers = [layer for layer in cache.layers if _is_linear_layer(layer)]
        self._saved: list | None = None

    def snapshot(self) -> None:
        """Clone every linear layer's conv and recurrent states (layers not yet initialized are recorded as None)."""
        self._saved = [linear_state_snapshot(layer) for layer in self.layers]

    def restore(self) -> None:
        """Put the snapshot back, in place where the shapes allow (static addresses stay valid)."""
        if self._saved is None:
            raise RuntimeError("restore() without a snapshot()")
        for layer, saved in zip(self.layers, self._saved):
            linear_state_restore(layer, saved)
        self._saved = None

    def discard(self) -> None:
        self._saved = None

    def rollback(self, target, verified: int, accepted_ids: torch.Tensor, cache_name: str = "past_key_values",
                 extra: dict | None = None) -> None:
        """Undo a verify forward of ``verified`` tokens, then replay ``accepted_ids [1, n + 1]`` (its accepted
        prefix) through ``target`` so the KV and linear states hold exactly the accepted tokens."""
        crop_attention_layers(self.cache, verified)
        self.restore()
        target(input_ids=accepted_ids, **{cache_name: self.cache}, use_cache=True, **(extra or {}))


class _RollbackCacheMixin:
    """Mixed into a transformers cache for ``target.generate(assistant_model=<FoldDrafter>)`` over a hybrid target.

    transformers' assisted loop calls ``cache.crop(-m)`` after each verification and (5.24) refuses a cache that
    is not ``is_croppable``. Here ``crop`` crops the attention layers back to the length recorded by the
    snapshot and restores the linear states; the accepted tokens are then replayed by the candidate generator
    (:meth:`replay_pending`), which knows them. ``activate_past_recording`` is a no-op: the convolution states
    stay fixed-size (and static) because the snapshot already covers them.
    """

    _fold_rollback: LinearStateRollback
    _fold_length_before: int = 0
    _fold_replay: int = 0

    def activate_past_recording(self, **kwargs):  # noqa: D401 - transformers' API
        return None

    @property
    def is_croppable(self) -> bool:
        return True

    def fold_snapshot(self) -> None:
        self._fold_rollback.snapshot()
        self._fold_length_before = self.get_seq_length()

    def crop(self, max_length: int) -> None:
        rollback = self._fold_rollback
        if max_length < 0 and rollback._saved is not None:
            verified = self.get_seq_length() - self._fold_length_before
            crop_attention_layers(self, verified)
            rollback.restore()
            self._fold_replay = verified + max_length  # accepted tokens, to replay
        elif max_length > 0:
            raise ValueError("crop takes a negative count of tokens to remove on this cache")
        else:
            rollback.discard()
            self._fold_replay = 0

    def fold_replay(self, target, input_ids: torch.Tensor, cache_name: str, extra: dict | None = None) -> None:
        """After a partial acceptance: run the accepted tokens (``input_ids[:, -(n + 2):-1]``; the last token of
        ``input_ids`` is the target's own, not yet in the cache) through the target again."""
        count, self._fold_replay = self._fold_replay, 0
        if count > 0:
            target(input_ids=input_ids[:, -(count + 1):-1], **{cache_name: self}, use_cache=True, **(extra or {}))


_ROLLBACK_CLASSES: dict[type, type] = {}


def make_rollback_cache(cache) -> bool:
    """Turn a transformers cache with linear-attention layers into one that rolls back (in place: the object keeps
    its identity and contents, its class becomes a subclass adding :class:`_RollbackCacheMixin`). Returns whether
    it did (False for caches without linear layers, and on a release whose cache rolls back itself:
    :func:`fold_hf.compat.native_linear_rollback`)."""
    if native_linear_rollback():
        return False
    if isinstance(cache, _RollbackCacheMixin):
        return True
    if not has_linear_state(cache):
        return False
    base = type(cache)
    cls = _ROLLBACK_CLASSES.get(base)
    if cls is None:
        cls = type(f"FoldRollback{base.__name__}", (_RollbackCacheMixin, base), {})
        _ROLLBACK_CLASSES[base] = cls
    cache.__class__ = cls
    cache._fold_rollback = LinearStateRollback(cache)
    return True
