"""Where a transformers causal LM keeps its decoder layers: found once here for every part that hooks the target
(the hidden-state taps of :mod:`fold_hf.targets.taps`, the target-attention probe of
:mod:`fold_hf.modeling.retrieval`)."""

from __future__ import annotations

from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The transformers model under PEFT or similar wrappers."""
    seen = set()
    while id(model) not in seen:
        seen.add(id(model))
        base = getattr(model, "get_base_model", None)
        if callable(base):
            inner = base()
            if inner is not model:
                model = inner
                continue
        break
    return model


def decoder_layers(target: nn.Module) -> tuple[nn.ModuleList, nn.Module | None]:
    """The target's decoder layer list and its final norm (None when not found)."""
    model = unwrap(target)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    candidates = [decoder, getattr(model, "model", None), model]
    n_layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    for module in candidates:
        if module is None:
            continue
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and (n_layers is None or len(layers) == n_layers):
            return layers, getattr(module, "norm", None)
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers:
            return module, None
    raise ValueError("cannot find the target's decoder layers to tap hidden states from")
