"""The methods a benchmark run compares and the engines that decode them.

Nothing heavy is imported here: the CLI reads the names while building its parser; a method's
:class:`~fold_hf.modeling.fold_config.FoldConfig` is built when the methods are asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..modeling.fold_config import FoldConfig

BENCH_ENGINES = ("loop", "fast")

# name -> the FoldConfig fields of the method besides window and training length (None: autoregressive);
# "budget" marks the modes that read a budget of entries instead of the window
_DEFAULT_METHODS: dict[str, dict | None] = {
    "ar": None,
    "fold-a1": dict(mode="fold", alpha=1.0),
    "fold-a2": dict(mode="fold", alpha=2.0),
    "fold-a4": dict(mode="fold", alpha=4.0),
    "dflash": dict(mode="dflash"),
    "window": dict(mode="window"),
    "streaming": dict(mode="streaming", budget=True),
    "rerope": dict(mode="rerope"),
    "yarn": dict(mode="yarn"),
    "infllm": dict(mode="infllm"),
    "cmr": dict(mode="cmr", budget=True),
}


# a reading mode's name (FoldConfig.mode) -> the method that runs it where the two names differ (``fold`` is FOLD
# at the paper's alpha = 2); every other mode's method has the mode's name
MODE_ALIASES = {"fold": "fold-a2"}


@dataclass(frozen=True)
class Method:
    name: str
    config: FoldConfig | None  # None: autoregressive


def method_names() -> tuple[str, ...]:
    """The names :func:`default_methods` returns, in its order (without building any config)."""
    return tuple(_DEFAULT_METHODS)


def method_choices() -> tuple[str, ...]:
    """What ``fold-hf bench --methods`` accepts: every method name and the mode names of :data:`MODE_ALIASES`."""
    return (*_DEFAULT_METHODS, *MODE_ALIASES)


def resolve_methods(names) -> list[str]:
    """``--methods`` as method names (a mode alias becomes its method), in the order given, without repeats."""
    out = []
    for name in names:
        name = MODE_ALIASES.get(name, name)
        if name not in out:
            out.append(name)
    return out


def default_methods(window: int, train_length: int, budget: int | None = None) -> list[Method]:
    """AR, FOLD at α ∈ {1, 2, 4} and every baseline of the paper's Appendix B.3: ``fold``, ``rerope``, ``infllm``
    (and ``window``) read the window W; ``streaming`` and ``cmr`` read ``budget`` entries (2,048 when None)."""
    from ..modeling.fold_config import FoldConfig

    methods = []
    for name, fields in _DEFAULT_METHODS.items():
        if fields is None:
            methods.append(Method(name, None))
            continue
        fields = dict(fields)
        if fields.pop("budget", False):
            fields["budget"] = budget
        methods.append(Method(name, FoldConfig(window=window, train_length=train_length, **fields)))
    return methods


def window_sweep_methods(windows, train_length: int, alpha: float = 2.0) -> list[Method]:
    """AR, then FOLD (α = ``alpha``) and the window-only ablation at each window W, named ``fold-a2-w{W}`` and
    ``window-w{W}``: how much of FOLD's gain over the window comes from the far memory as W changes."""
    from ..modeling.fold_config import FoldConfig

    methods = [Method("ar", None)]
    for w in windows:
        methods.append(Method(f"fold-a{alpha:g}-w{w}", FoldConfig(mode="fold", alpha=alpha, window=w,
                                                                 train_length=train_length)))
        methods.append(Method(f"window-w{w}", FoldConfig(mode="window", window=w, train_length=train_length)))
    return methods
