"""Which target family runs an architecture: an explicit table, and the questions the rest of the package asks it.

Every family module is imported here by name (no module looked up by a string), so the import graph
(``tests/test_import_graph.py``) sees each one. A family module gives ``ARCHITECTURES`` (the transformers class names
it runs), ``check(model, capacity)`` (raises :class:`~fold_hf.targets.base.UnsupportedTarget` naming why not), its
runner class (a :class:`~fold_hf.targets.base.StaticTarget`) and, where a text request through the model's own forward
must clear wrapper state first, ``prepare_text_request(model)``.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from torch import nn

from . import gemma, llama, qwen35
from .base import StaticTarget, UnsupportedTarget, batch_unsupported
from .taps import _unwrap


class Family(NamedTuple):
    """One target family: what the fast loop builds and asks for an architecture."""

    runner: type[StaticTarget]  # runner(target, capacity, tap_layer_ids, batch=1)
    check: Callable[[nn.Module, int | None], None]  # check(unwrapped model, capacity or None)
    prepare_text_request: Callable[[nn.Module], None] | None = None  # before a text request via the model's forward


LLAMA = Family(llama.LlamaStaticTarget, llama.check)
QWEN35 = Family(qwen35.Qwen35StaticTarget, qwen35.check, qwen35.prepare_text_request)
GEMMA = Family(gemma.GemmaStaticTarget, gemma.check)

# architecture class name -> family
FAMILIES: dict[str, Family] = {
    **dict.fromkeys(llama.ARCHITECTURES, LLAMA),
    **dict.fromkeys(qwen35.ARCHITECTURES, QWEN35),
    **dict.fromkeys(gemma.ARCHITECTURES, GEMMA),
}
ARCHITECTURES = tuple(FAMILIES)  # every architecture the fast loop runs


def family_of(target: nn.Module) -> Family | None:
    """The family of ``target`` (the model or a PEFT wrapper of one), or None for an architecture none runs."""
    return FAMILIES.get(type(_unwrap(target)).__name__)


def check_target(target: nn.Module, capacity: int | None = None) -> None:
    """Raise :class:`UnsupportedTarget` when no family's runner can run ``target`` (with ``capacity`` tokens)."""
    family = family_of(target)
    if family is None:
        raise UnsupportedTarget(
            f"the fast loop runs {', '.join(ARCHITECTURES)}; {type(_unwrap(target)).__name__} is not one "
            "of them (use fold_hf.generate, which runs any causal LM)")
    family.check(_unwrap(target), capacity)


def build_static_target(target: nn.Module, capacity: int, tap_layer_ids=(), batch: int = 1) -> StaticTarget:
    """The static runner of ``target``'s family over a cache of ``capacity`` tokens (``batch`` rows of it), tapping
    ``tap_layer_ids``; raises :class:`UnsupportedTarget` when no family runs it or, for ``batch > 1``, when its
    family keeps one row per cache (the runner's ``_setup`` says so; :func:`batch_unsupported_reason` asks first)."""
    family = family_of(target)
    if family is None:
        check_target(target, capacity)  # raises, naming what the fast loop runs
    return family.runner(target, capacity, tap_layer_ids, batch=batch)


def batch_unsupported_reason(target: nn.Module) -> str | None:
    """Why ``target``'s runner cannot hold several rows (batched rounds), or None when its family can."""
    family = family_of(target)
    if family is None:
        return f"{type(_unwrap(target)).__name__} does not run on the fast loop"
    if not family.runner.batched_rows:
        return batch_unsupported(family.runner.__name__)
    return None


def prepare_text_request(target: nn.Module) -> None:
    """Before a text-only request through the model's own forward (:class:`fold_hf.generation.loop.ForwardRunner`):
    the family's ``prepare_text_request(model)``, when it has one, clears wrapper state that such a request must not
    inherit (Qwen3.5's wrapper keeps the rope deltas of its last image request)."""
    family = family_of(target)
    if family is not None and family.prepare_text_request is not None:
        family.prepare_text_request(_unwrap(target))


__all__ = ["ARCHITECTURES", "FAMILIES", "Family", "batch_unsupported_reason", "build_static_target", "check_target",
           "family_of", "prepare_text_request"]
