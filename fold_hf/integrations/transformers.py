"""fold_hf's one integration with transformers: :func:`install` (explicit, idempotent), :func:`uninstall`.

What :func:`install` does, and nothing else in fold_hf touches transformers' classes:

* registers the ``"fold"`` attention and mask (:func:`fold_hf.modeling.attention.register`);
* wraps four ``GenerationMixin`` methods: ``generate`` (routing: with a :class:`FoldDrafter` assistant, or
  ``fold_fast=True``, the request runs on the fast loop whenever it can, else transformers' loop with one warning
  naming the reason; ``fold_fast=False`` keeps transformers' loop; ``exact=True``: the fast loop in exact mode or a
  ValueError), ``_get_candidate_generator`` (a FoldDrafter
  assistant drafts with :class:`~fold_hf.generation.assisted.FoldCandidateGenerator`), ``_assisted_decoding`` (hook
  clean-up; the hybrid-cache rollback where transformers has none) and ``_validate_generation_mode`` (our pair check).

``import fold_hf`` patches nothing. Creating or loading a :class:`FoldDrafter` calls :func:`install` (so
``target.generate(assistant_model=drafter)`` works whatever was imported); call ``fold_hf.install()`` yourself to
route ``target.generate(..., fold_fast=True)`` without a drafter. A transformers release that renamed one of these
hooks makes :func:`install` raise :class:`fold_hf.compat.UpstreamChanged` instead of running transformers' own loop.
"""

from __future__ import annotations

import functools
import warnings

from transformers.generation.utils import GenerationMixin

from ..compat import require_generation_hooks
from ..generation.assisted import FoldCandidateGenerator
from ..generation.routing import NOT_ROUTED, route_generate, transformers_path
from ..modeling import attention
from ..modeling.drafter import FoldDrafter
from ..modeling.validation import validate_pair
from ..targets.rollback import make_rollback_cache, target_has_linear_state

_INSTALLED_ATTR = "_fold_hf_installed"


def _wrap_get_candidate_generator(original):
    @functools.wraps(original)
    def _get_candidate_generator(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                                 assistant_model=None, *args, **kwargs):
        if isinstance(assistant_model, FoldDrafter) and getattr(generation_config, "speculation_type", None) != "dflash":
            generator = FoldCandidateGenerator(self, assistant_model, generation_config, logits_processor,
                                               tokenizer=kwargs.get("target_tokenizer"))
            generator.rollback_cache = assistant_model.__dict__.get("_fold_rollback_cache")
            assistant_model._active_candidate_generator = generator
            return generator
        if isinstance(assistant_model, FoldDrafter):
            if assistant_model.is_deepspec:
                raise ValueError("speculation_type='dflash' runs transformers' z-lab DFlash generator, whose block "
                                 "semantics differ from a DeepSpec drafter's (its anchor slot predicts): leave "
                                 "speculation_type unset to draft with fold_hf's generator")
            assistant_model.bind_target(self)
        return original(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                        assistant_model, *args, **kwargs)

    return _get_candidate_generator


def _wrap_assisted_decoding(original):
    @functools.wraps(original)
    def _assisted_decoding(self, *args, **kwargs):
        assistant = kwargs.get("assistant_model")
        if isinstance(assistant, FoldDrafter):
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            if cache is not None and make_rollback_cache(cache):
                assistant._fold_rollback_cache = cache
        try:
            return original(self, *args, **kwargs)
        finally:
            generator = getattr(assistant, "_active_candidate_generator", None)
            if generator is not None:
                generator.close()
                assistant._active_candidate_generator = None
            if isinstance(assistant, FoldDrafter):
                assistant.__dict__.pop("_fold_rollback_cache", None)

    return _assisted_decoding


def _wrap_validate_generation_mode(original):
    @functools.wraps(original)
    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs):
        assistant = (generation_mode_kwargs or {}).get("assistant_model")
        if not isinstance(assistant, FoldDrafter):
            return original(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs)
        validate_pair(assistant, self)  # our message names the field, before transformers' own checks
        # transformers refuses assisted decoding on stateful models; for linear-attention targets our strategy owns
        # the rollback (rollback.py), so the check is lifted for this call only (FoldDrafter assistants only)
        lift = (getattr(self, "_is_stateful", False) and target_has_linear_state(self)
                and getattr(generation_config, "speculation_type", None) != "dflash")
        if lift:
            self._is_stateful = False
        try:
            return original(self, generation_mode, generation_config, generation_mode_kwargs, *args, **kwargs)
        finally:
            if lift:
                del self._is_stateful

    return _validate_generation_mode


def _wrap_generate(original):
    @functools.wraps(original)
    def generate(self, *args, fold_fast: bool | None = None, exact: bool = False, **kwargs):
        """transformers' ``generate``; with a FoldDrafter assistant (or ``fold_fast=True``) on fold_hf's fast loop
        when the request allows it (``fold_fast=False``: transformers' loop, always). ``exact=True``: the fast loop
        in exact mode (docs/exact-mode.md), or a ValueError naming why the request cannot run there."""
        assistant = kwargs.get("assistant_model")
        if exact:
            if fold_fast is False:
                raise ValueError("exact=True runs on fold_hf's fast loop; fold_fast=False asks for transformers' "
                                 "loop")
            result, reason = route_generate(self, args, kwargs, exact=True)
            if result is NOT_ROUTED:
                raise ValueError(f"exact=True runs on fold_hf's fast loop, which cannot take this request: {reason}")
            return result
        if fold_fast is False or (fold_fast is None and not isinstance(assistant, FoldDrafter)):
            return original(self, *args, **kwargs)
        result, reason = route_generate(self, args, kwargs)
        if result is not NOT_ROUTED:
            return result
        warnings.warn(f"fold_hf: target.generate runs {transformers_path(self, kwargs)}, not the fast loop, because of "
                      f"{reason}; "
                      "pass fold_fast=False to choose transformers' loop without this warning",
                      UserWarning, stacklevel=2)
        return original(self, *args, **kwargs)

    return generate


_WRAPPERS = {
    "_get_candidate_generator": _wrap_get_candidate_generator,
    "_assisted_decoding": _wrap_assisted_decoding,
    "generate": _wrap_generate,
    "_validate_generation_mode": _wrap_validate_generation_mode,
}


def is_installed() -> bool:
    """Whether :func:`install` has wrapped ``GenerationMixin`` (and not been undone)."""
    return bool(getattr(GenerationMixin, _INSTALLED_ATTR, None))


def install() -> None:
    """Register the ``"fold"`` attention and wrap transformers' generate, candidate-generator choice, assisted
    decoding and mode validation (module docstring); idempotent. Raises :class:`fold_hf.compat.UpstreamChanged` when
    this transformers lacks a hook it needs."""
    attention.register()
    if is_installed():
        return
    require_generation_hooks()
    originals = {name: getattr(GenerationMixin, name) for name in _WRAPPERS}
    for name, wrap in _WRAPPERS.items():
        setattr(GenerationMixin, name, wrap(originals[name]))
    setattr(GenerationMixin, _INSTALLED_ATTR, originals)


def uninstall() -> None:
    """Restore transformers' own methods (undoes :func:`install`; the attention registration stays, it is inert)."""
    originals = getattr(GenerationMixin, _INSTALLED_ATTR, None)
    if not originals:
        return
    for name, method in originals.items():
        setattr(GenerationMixin, name, method)
    setattr(GenerationMixin, _INSTALLED_ATTR, None)


__all__ = ["install", "is_installed", "uninstall"]
