"""Pieces more than one target family uses: the tap writer of a forward, the text parts of a multimodal wrapper, the
resolution of the hybrid families' fused ops and row-axis kernels.

Family-free: what a family knows of its own architectures (wrapper class names, config fields) it passes in.
"""

from __future__ import annotations

import torch
from torch import nn

from .base import UnsupportedTarget


def tap_writer(tap_layer_ids, hidden_size: int, taps_out: torch.Tensor | None):
    """``tap(layer_id, value)``: writes ``value [1, L, H]`` into every slot of ``taps_out [1, L, n_taps * H]`` that
    taps layer ``layer_id`` (one layer may fill several slots; ``H = hidden_size``); does nothing when ``taps_out``
    is None."""
    slots: dict[int, list[int]] = {}
    for slot, lid in enumerate(tap_layer_ids):
        slots.setdefault(lid, []).append(slot)
    H = hidden_size

    def tap(layer_id: int, value: torch.Tensor) -> None:
        if taps_out is not None:
            for slot in slots.get(layer_id, ()):
                taps_out[:, :, slot * H : (slot + 1) * H] = value

    return tap


def wrapped_text_parts(model: nn.Module, wrappers: tuple[str, ...]):
    """(text config, text decoder) of a causal LM (``config``, ``model.model``) or, when its class is one of
    ``wrappers``, of a multimodal wrapper (``config.text_config``, ``model.model.language_model``); raises
    :class:`UnsupportedTarget` on an unexpected layout."""
    name = type(model).__name__
    if name in wrappers:
        config = getattr(model.config, "text_config", None)
        decoder = getattr(getattr(model, "model", None), "language_model", None)
        where = ".model.language_model"
    else:
        config, decoder, where = model.config, getattr(model, "model", None), ".model"
    if config is None or decoder is None or not hasattr(decoder, "layers") or not hasattr(decoder, "rotary_emb"):
        raise UnsupportedTarget(f"{name} has no {where}.layers / {where}.rotary_emb or no text config "
                                "(unexpected transformers layout)")
    return config, decoder


class HybridFusedOps:
    """``_fused_ops_ready`` and ``_rows_kernels_of`` of the families whose fused layers run the hybrid ops (Qwen3.5,
    Gemma): a mixin reading the runner's ``fused_unsupported``, ``device``, ``_rows_decode`` and its ``_hybrid_ops``
    / ``_layer_ops`` / ``_decode_attention`` slots (None until resolved) and ``_rows_kernels`` (False until
    resolved)."""

    def _fused_ops_ready(self) -> None:
        """Resolve the fused layers' ops on their first use (the hybrid ops of :func:`fold_hf.kernels.
        default_hybrid_ops`, the layer ops' GEMMs, the decode attention of the full-attention layers); raises
        :class:`UnsupportedTarget` where ``fused_unsupported`` says why."""
        if self._hybrid_ops is None:
            from ..kernels import default_hybrid_ops, default_layer_ops

            reason = self.fused_unsupported()
            if reason is not None:
                raise UnsupportedTarget(f"fused layers: {reason}")
            self._hybrid_ops = default_hybrid_ops(self.device)
            self._layer_ops = default_layer_ops(self.device)
        if self._decode_attention is None:
            from ..kernels import default_decode_attention

            self._decode_attention = default_decode_attention(self.device)

    def _rows_kernels_of(self, *functions: tuple[str, str]) -> tuple | None:
        """The Triton functions ``(module, name)`` of :mod:`fold_hf.kernels` (e.g. ``("hybrid.triton",
        "head_norm_rope_write_rows_triton")``) followed by the decode attention over rows
        (:meth:`~fold_hf.targets.base.StaticTarget._rows_decode`): the row-axis kernels of a batch's verify, resolved
        once into the runner's ``_rows_kernels`` slot (``False`` until then); None where they do not run (not CUDA,
        ``$FOLD_HF_ROWS_KERNELS=0``, or a module that does not import: the rows then run one after another)."""
        if self._rows_kernels is False:
            from ..kernels import import_triton_module

            decode_rows = self._rows_decode()
            modules = [import_triton_module(module) if decode_rows is not None else None for module, _ in functions]
            self._rows_kernels = (None if None in modules else
                                  (*(getattr(m, name) for m, (_, name) in zip(modules, functions)), decode_rows))
        return self._rows_kernels
