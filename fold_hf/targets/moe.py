"""Routed experts as one capturable step: fixed shapes, no host synchronisation (family-free).

transformers (5.24) keeps the experts of an MoE block (Qwen3.5-MoE's ``Qwen3_5MoeExperts``, Gemma-4's
``Gemma4TextExperts``) as two stacked parameters: ``gate_up_proj [E, 2 I, H]`` (gate rows then up rows, "concatenated"
layout) and ``down_proj [E, H, I]``, plus ``act_fn``; a router gives each token ``top_k_index [N, k]`` and
``top_k_weights [N, k]``. How the model runs them is ``config._experts_implementation``:

* ``"eager"`` (the class's own forward): ``one_hot(...).nonzero()``, then a Python loop over the experts that were
  hit, ``torch.where`` per expert: shapes depend on the routing and the loop reads device values on the host, so it
  cannot be captured in a CUDA graph;
* ``"grouped_mm"`` (the default here when ``torch.nn.functional.grouped_mm`` exists): tokens sorted by expert, offsets
  from ``histc``; capturable only where ``grouped_mm`` itself runs (its fallback for other dtypes/devices loops over
  ``offs.tolist()`` on the host), and it takes no fp64;
* ``"batched_mm"``: gather of the selected experts' weights and two batched matmuls, which is the formulation here.

:func:`stacked_experts` is that gather + ``bmm`` (gpt-fast's MoE step): ``S = N * k`` (token, expert) pairs, the
weights of each pair's expert gathered by the device indices (``gate_up_proj[index]``), ``bmm`` for the gate/up and
down projections, the pairs weighted and summed per token. Every shape is fixed by ``N`` and ``k``; nothing is read
on the host. Cost: the gather copies ``S`` expert matrices (a verify of L rows with top-k reads and writes ``L * k``
of them, an expert chosen twice is copied twice), so it suits decode and short verify blocks; it is the price of a
capturable step without a fused expert kernel.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.common import is_sharded
from .tensor_parallel import all_reduce, local


def experts_unsupported(experts: nn.Module) -> str | None:
    """Why :func:`stacked_experts` cannot run ``experts`` (an experts module of transformers' stacked layout), or
    None when it can."""
    name = type(experts).__name__
    gate_up = getattr(experts, "gate_up_proj", None)
    down = getattr(experts, "down_proj", None)
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return f"experts {name} do not keep stacked gate_up_proj / down_proj parameters"
    if is_sharded(gate_up) or is_sharded(down):
        reason = _split_unsupported(gate_up, down)
        if reason is not None:
            return f"experts {name} {reason}"
        gate_up, down = local(gate_up), local(down)  # this rank's share of every expert: checked below
    if gate_up.dim() != 3 or down.dim() != 3:
        return f"experts {name}: gate_up_proj {tuple(gate_up.shape)} / down_proj {tuple(down.shape)} are not 3-D"
    if getattr(experts, "is_transposed", False):
        return f"experts {name} store transposed weights"
    if getattr(experts, "has_bias", False):
        return f"experts {name} have biases"
    if not getattr(experts, "has_gate", True):
        return f"experts {name} have no gate projection"
    if not getattr(experts, "is_concatenated", True):
        return f"experts {name} interleave their gate and up rows"
    if getattr(experts, "has_post_expert_norm", False):
        return f"experts {name} apply a norm after each expert"
    if not callable(getattr(experts, "act_fn", None)):
        return f"experts {name} have no act_fn"
    e, two_i, h = gate_up.shape
    if two_i % 2 or tuple(down.shape) != (e, h, two_i // 2):
        return f"experts {name}: gate_up_proj {tuple(gate_up.shape)} and down_proj {tuple(down.shape)} do not pair"
    return None


def _split_unsupported(gate_up: torch.Tensor, down: torch.Tensor) -> str | None:
    """Why :func:`stacked_experts` cannot run experts sharded over ranks (DTensors), or None for transformers'
    tensor-parallel experts plan: every rank holds its share of every expert's intermediate features, ``gate_up_proj``
    split as two halves (``_StridedShard(dim=1, split_factor=2)``: this rank's gate rows, then its up rows) and
    ``down_proj`` on its input features (``Shard(dim=2)``), so that each rank's sum is a partial sum of the output."""
    if not (is_sharded(gate_up) and is_sharded(down)) or gate_up.device_mesh.ndim != 1:
        return "are sharded in a layout stacked_experts does not take (one of the two weights, or a mesh of several dims)"
    (split,), (row,) = gate_up.placements, down.placements
    if getattr(split, "dim", None) == 0 or getattr(row, "dim", None) == 0:
        return ("are split by expert over ranks (expert parallelism: each rank holds some experts); stacked_experts "
                "needs every expert on every rank")
    if type(split).__name__ != "_StridedShard" or split.dim != 1 or getattr(split, "split_factor", None) != 2 \
            or type(row).__name__ != "Shard" or row.dim != 2:
        return f"are sharded as gate_up_proj {split} / down_proj {row}; stacked_experts takes _StridedShard(1, 2) / Shard(2)"
    return None


def stacked_experts(experts: nn.Module, hidden: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """``sum_j w[n, j] * down[e](act(gate[e] x_n) * up[e] x_n)`` with ``e = top_k_index[n, j]``, for every token.

    Experts sharded by transformers' tensor-parallel plan (:func:`_split_unsupported`): each rank runs its share of
    every expert's intermediate features, and the ranks' partial outputs are summed (one all-reduce), as the model's
    own experts module does.

    Args:
        experts: a module with ``gate_up_proj [E, 2 I, H]``, ``down_proj [E, H, I]``, ``act_fn``
            (:func:`experts_unsupported` is None).
        hidden: ``[N, H]`` tokens.
        top_k_index: ``[N, k]`` long, the chosen experts (device tensor; never read on the host).
        top_k_weights: ``[N, k]`` their weights.

    Returns:
        ``[N, H]`` in ``hidden``'s dtype.
    """
    n, k = top_k_index.shape
    sharded = is_sharded(experts.gate_up_proj)
    # this rank's parts when sharded: [E, 2 I / N, H] and [E, H, I / N]
    gate_up_proj, down_proj = local(experts.gate_up_proj), local(experts.down_proj)
    flat = top_k_index.reshape(-1)  # [S], S = n * k, pair s = (token s // k, slot s % k)
    rows = hidden.unsqueeze(1).expand(n, k, hidden.shape[-1]).reshape(n * k, -1, 1)  # [S, H, 1]
    gate_up = torch.bmm(gate_up_proj[flat], rows).squeeze(-1)  # [S, 2 I]
    gate, up = gate_up.chunk(2, dim=-1)
    inner = (experts.act_fn(gate) * up).unsqueeze(-1)  # [S, I, 1]
    out = torch.bmm(down_proj[flat], inner).squeeze(-1)  # [S, H]
    out = out * top_k_weights.reshape(-1, 1).to(out.dtype)
    out = out.view(n, k, -1).sum(dim=1)
    if sharded:
        all_reduce(out, experts.gate_up_proj)  # the ranks' shares of the intermediate: partial sums
    return out.to(hidden.dtype)


__all__ = ["experts_unsupported", "stacked_experts"]
