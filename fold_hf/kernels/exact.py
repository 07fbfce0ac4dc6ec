"""The exact mode's kernels (issue 37, ``docs/exact-mode.md``): the ops whose reduction order does not depend on the
number of rows, for a target step whose logits must be the same bits alone (AR), in a verify block or in a batch.

* :func:`exact_layer_ops`: :class:`~fold_hf.kernels.LayerOps` with the exact GEMMs
  (:func:`~fold_hf.kernels.gemm.triton.exact_linear_triton`, ``exact_gate_up_silu_triton``: one fixed plan for every
  row count) and the fused layer kernels, which already are row-wise with a configuration fixed by the hidden size
  (``add_rms_norm_triton``: one program per row; the rope write and ``silu(gate) * up``: elementwise);
* :func:`exact_decode_attention`: :func:`~fold_hf.kernels.exact_attention.triton.exact_decode_attention_triton`
  (splits fixed by key position, merged in split order), the signature of ``decode_attention_triton``;
* :func:`exact_unavailable_reason`: why they cannot run on a device (None when they can).

The wiring (the request's ``exact=True``, the lm_head through ``exact_linear``) is the Llama target runner's
(:meth:`fold_hf.targets.llama.LlamaStaticTarget.exact_unsupported`). Off CUDA these functions raise
:class:`ExactUnavailable` (the torch twins compute the same rule but not in a fixed order), except under Triton's
interpreter (``TRITON_INTERPRET=1``: the CPU tests run the kernels there).
"""

from __future__ import annotations

import importlib.util
import os

import torch

from . import LayerOps, import_triton_module, triton_unavailable_reason


class ExactUnavailable(RuntimeError):
    """The exact kernels cannot run on this device (the message says why)."""


def exact_unavailable_reason(device: torch.device | str) -> str | None:
    """Why the exact kernels cannot run on ``device`` (None when they can): CUDA with Triton, or a CPU under Triton's
    interpreter (``TRITON_INTERPRET=1``)."""
    interpreted = torch.device(device).type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    if interpreted and importlib.util.find_spec("triton") is None:
        return "TRITON_INTERPRET=1 but Triton is not installed"
    reason = None if interpreted else triton_unavailable_reason(device)
    if reason is not None:
        return f"the exact mode runs Triton kernels on CUDA ({reason})"
    for name in ("layer.triton", "gemm.triton", "exact_attention.triton"):
        if import_triton_module(name) is None:
            return f"fold_hf.kernels.{name} failed to import"
    return None


def _require(device) -> None:
    reason = exact_unavailable_reason(device)
    if reason is not None:
        raise ExactUnavailable(reason)


def exact_layer_ops(device: torch.device | str) -> LayerOps:
    """The fused layers' ops for the exact mode on ``device``; ``skinny_linear`` is the exact GEMM for any number
    of rows (the runner sends its lm_head through it too), ``skinny_rows`` the gemm module's ``MAX_ROWS`` (a
    prefill chunk may stay on cuBLAS: AR and speculative decoding share the prefill)."""
    _require(device)
    layer, gemm = import_triton_module("layer.triton"), import_triton_module("gemm.triton")
    return LayerOps(layer.add_rms_norm_triton, layer.rope_write_triton, layer.silu_mul_triton,
                    layer.rotate_heads_triton, "triton-exact", skinny_linear=gemm.exact_linear_triton,
                    gate_up_silu=gemm.exact_gate_up_silu_triton, skinny_rows=gemm.MAX_ROWS)


def exact_decode_attention(device: torch.device | str):
    """The exact mode's decode / verify attention on ``device`` (signature of ``decode_attention_triton``; the
    block's keys must already be in the cache, as the static target's forwards write them before attending)."""
    _require(device)
    return import_triton_module("exact_attention.triton").exact_decode_attention_triton


__all__ = ["ExactUnavailable", "exact_decode_attention", "exact_layer_ops", "exact_unavailable_reason"]
