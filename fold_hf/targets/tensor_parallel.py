"""A target sharded by transformers' tensor parallelism (``from_pretrained(..., tp_plan="auto")`` under ``torchrun``,
issue 41), as the fast loop sees it: family-free.

transformers leaves every sharded weight a DTensor and every sharded module taking and returning plain tensors: a
column-parallel projection (q, k, v, gate, up) returns this rank's share of its output (its heads), a row-parallel
one (o, down) the all-reduced sum, the row-parallel embedding and the gathered lm_head whole tensors. So a runner
works on each rank with its own heads: its KV cache holds this rank's KV heads, everything after a row-parallel
projection is replicated, the logits are whole and identical on every rank, and every rank takes the same
acceptance (greedy; sampling with the same seed). The drafter, replicated, reads the target's embedding and lm_head
through their modules. Every family's runner takes this from :meth:`~fold_hf.targets.base.StaticTarget._setup`
(``tensor_parallel``, ``local_heads``; the plan's styles recorded by :func:`record_plan`).

The module path calls the sharded modules (their forwards do the collectives). The fused layers run what the plan
makes column- or row-parallel (style ``colwise`` with a ``Shard(0)`` weight, ``rowwise`` with ``Shard(1)``) on this
rank's weights (:func:`local`): q|k|v and gate|up merged from the ranks' rows (:mod:`~fold_hf.targets.weight_layout`,
whose buffers the shards' local parts become views of, :func:`relink`), o / down through the skinny GEMMs or cuBLAS
and one :func:`all_reduce` each (:func:`~fold_hf.targets.weight_layout.project`); any other style (e.g. Qwen3.5's
``colwise_gather_output`` linear-attention projections) runs as its module, warned once. Exact mode refuses a
sharded target (an all-reduce may add the partial sums in an order that depends on the message size).
"""

from __future__ import annotations

import re
import weakref

import torch
from torch import nn

from ..kernels.common import is_sharded, local  # local: re-exported (weight_layout, moe)

# module -> the style transformers' tp_plan gave it ("colwise", "rowwise", "colwise_gather_output", ...), recorded by
# record_plan when a runner is built over a sharded model
_STYLES: "weakref.WeakKeyDictionary[nn.Module, str]" = weakref.WeakKeyDictionary()


def tensor_parallel_size(model: nn.Module) -> int:
    """Ranks ``model``'s weights are sharded over (1: not sharded)."""
    for parameter in model.parameters():
        if is_sharded(parameter):
            return parameter.device_mesh.size()
    return 1


def record_plan(model: nn.Module) -> None:
    """Remember the style transformers' plan (``model.tp_plan``: patterns of module names, ``*`` a layer index) gave
    each module of a sharded ``model``, for :func:`plan_style`."""
    plan = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {}
    patterns = [(re.compile(re.escape(key).replace(r"\*", r"[^.]+") + "$"), style) for key, style in plan.items()]
    for name, module in model.named_modules():
        for pattern, style in patterns:
            if pattern.match(name):
                _STYLES[module] = style
                break


def plan_style(module: nn.Module) -> str | None:
    """The tp_plan style of ``module`` (:func:`record_plan`), or None (not in the plan, or its model not recorded)."""
    return _STYLES.get(module)


def column_shard(module: nn.Module) -> bool:
    """Whether ``module`` is a column-parallel projection whose output stays this rank's share (style ``colwise``,
    weight ``Shard(0)``): its local weight's product is what the module returns."""
    weight = getattr(module, "weight", None)
    return is_sharded(weight) and plan_style(module) == "colwise" and _sharded_on(weight, 0)


def row_shard(module: nn.Module) -> bool:
    """Whether ``module`` is a row-parallel projection (style ``rowwise``, weight ``Shard(1)``): it takes this rank's
    share of its input features and returns the sum over the ranks of the local products, plus its (whole) bias."""
    weight = getattr(module, "weight", None)
    return is_sharded(weight) and plan_style(module) == "rowwise" and _sharded_on(weight, 1)


def _sharded_on(weight, dim: int) -> bool:
    placements = weight.placements
    return weight.device_mesh.ndim == 1 and type(placements[0]).__name__ == "Shard" and placements[0].dim == dim


def relink(param: torch.Tensor, view: torch.Tensor) -> None:
    """Point ``param`` at ``view`` (which holds its values): a plain parameter's data, a sharded one's local part."""
    if is_sharded(param):
        param._local_tensor.data = view
    else:
        param.data = view


def all_reduce(tensor: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over the ranks of ``like``'s (a sharded weight's) mesh, in place; returns it."""
    torch.distributed.all_reduce(tensor, group=like.device_mesh.get_group())
    return tensor


__all__ = ["all_reduce", "column_shard", "local", "plan_style", "record_plan", "relink", "row_shard",
           "tensor_parallel_size"]
