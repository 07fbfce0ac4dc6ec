"""A target sharded by transformers' tensor parallelism (``from_pretrained(..., tp_plan="auto")`` under ``torchrun``,
issue 41), as the fast loop sees it: family-free.

transformers leaves every sharded weight a DTensor and every sharded module taking and returning plain tensors: a
column-parallel projection (q, k, v, gate, up) returns this rank's share of its output (its heads), a row-parallel
one (o, down) the all-reduced sum, the row-parallel embedding and the gathered lm_head whole tensors. So a runner
that calls the model's modules (never a kernel over a shard's weight: :func:`~fold_hf.kernels.common.is_sharded`)
works on each rank with its own heads: its KV cache holds this rank's KV heads, everything after a row-parallel
projection is replicated, the logits are whole and identical on every rank, and every rank takes the same
acceptance (greedy; sampling with the same seed). The drafter, replicated, reads the target's embedding and lm_head
through their modules. Every family's runner takes this from :meth:`~fold_hf.targets.base.StaticTarget._setup`
(``tensor_parallel``, ``local_heads``, ``sharded_reason``).
"""

from __future__ import annotations

from torch import nn

from ..kernels.common import is_sharded


def tensor_parallel_size(model: nn.Module) -> int:
    """Ranks ``model``'s weights are sharded over (1: not sharded)."""
    for parameter in model.parameters():
        if is_sharded(parameter):
            return parameter.device_mesh.size()
    return 1


__all__ = ["tensor_parallel_size"]
