"""The gated delta rule of Qwen3.5's linear-attention layers (Gated DeltaNet).

* :mod:`.naive`: the torch twins: :func:`~.naive.gated_delta_states_reference` (every position's state over a block);
* the fused Gated DeltaNet step of Qwen3.5's fast-loop layers: verify, commit and the gated RMSNorm of its output
  (``gated_delta_*`` and ``gated_rms_norm_*`` in both modules, chosen by :func:`fold_hf.kernels.default_hybrid_ops`);
* :mod:`.triton`: the Triton kernels (imported only through :func:`default_gated_delta` /
  :func:`fold_hf.kernels.import_triton_module`, never on the CPU path).
"""

from __future__ import annotations

import torch

from .naive import gated_delta_states_reference


def default_gated_delta(device: torch.device | str):
    """The Triton kernel on CUDA when it imports (and ``FOLD_HF_DISABLE_TRITON`` is not ``1``), else the
    reference."""
    from .. import import_triton_module, triton_kernels_enabled

    module = import_triton_module("gated_delta.triton") if triton_kernels_enabled(device) else None
    return module.gated_delta_states_triton if module is not None else gated_delta_states_reference


__all__ = ["default_gated_delta", "gated_delta_states_reference"]
