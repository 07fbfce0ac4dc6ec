"""Capture the target's hidden states at the drafter's tapped layers.

``output_hidden_states=True`` would keep every layer of a long prompt (34 GB for Llama-3.1-8B at
128K tokens); forward hooks on the tapped decoder layers keep only what the drafter reads. The value
captured for layer ``l`` is what transformers returns as ``hidden_states[l + 1]``: the layer's output,
and for the last layer the output after the final norm.
"""

from __future__ import annotations

import torch
from torch import nn

from ..modeling.target_layers import decoder_layers, unwrap as _unwrap  # noqa: F401  (re-exported)


class HiddenTaps:
    """Context manager collecting ``[b, L, H]`` outputs of the tapped layers during target forwards.

    ``features()`` concatenates them in tap order: ``[b, L, n_taps * H]``, on ``device`` (default: the first
    tap's device).
    """

    def __init__(self, target: nn.Module, layer_ids: list[int], device: torch.device | str | None = None) -> None:
        layers, self._norm = decoder_layers(target)
        # a target split across devices (device_map) leaves each tap on its layer's device: gather them straight
        # onto the drafter's device, one copy per tap, instead of via the first tap's device
        self.device = torch.device(device) if device is not None else None
        self.layer_ids = list(layer_ids)
        self._last = len(layers) - 1
        self._layers = layers
        self._captured: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> "HiddenTaps":
        for lid in dict.fromkeys(self.layer_ids):
            self._handles.append(self._layers[lid].register_forward_hook(self._hook(lid)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, lid: int):
        def capture(module, args, output):
            hidden = output[0] if isinstance(output, (tuple, list)) else output
            if lid == self._last and self._norm is not None:
                hidden = self._norm(hidden)
            self._captured[lid] = hidden.detach()

        return capture

    def features(self) -> torch.Tensor:
        missing = [lid for lid in self.layer_ids if lid not in self._captured]
        if missing:
            raise RuntimeError(f"target layers {missing} did not run during the forward")
        device = self.device or self._captured[self.layer_ids[0]].device
        out = torch.cat([self._captured[lid].to(device) for lid in self.layer_ids], dim=-1)
        self._captured.clear()
        return out
