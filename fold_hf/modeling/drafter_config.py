"""Configuration of a DFlash-style drafter, read from and written to the z-lab checkpoint layout.

z-lab ``config.json`` (docs/design.md §4) is a Qwen3 config with ``architectures: ["DFlashDraftModel"]`` and
DFlash fields either at the top level (older checkpoints: ``block_size``) or inside ``dflash_config``
(newer: ``{mask_token_id, target_layer_ids, block_size?}``). ``num_target_layers`` is top level.
"""

from __future__ import annotations

import copy
from typing import Any

from transformers import Qwen3Config

DFLASH_ARCHITECTURE = "DFlashDraftModel"


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's default taps: one per drafter layer, spread evenly over 1 .. L-3 ([L // 2] for one)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


class FoldDrafterConfig(Qwen3Config):
    """Qwen3 config plus DFlash fields, exposed at the top level where transformers' native DFlash
    generator reads them (``block_size``, ``mask_token_id``, ``target_layer_ids``).

    ``dflash_layout`` remembers whether the checkpoint nested its DFlash fields (``"nested"``) or kept
    ``block_size`` at the top level (``"top"``), so ``save_pretrained`` writes the layout it read.
    """

    def __init__(
        self,
        block_size: int = 16,
        num_target_layers: int | None = None,
        target_layer_ids: list[int] | None = None,
        mask_token_id: int | None = None,
        dflash_layout: str = "nested",
        **kwargs: Any,
    ) -> None:
        kwargs.pop("dflash_config", None)
        super().__init__(**kwargs)
        self.block_size = int(block_size)
        self.num_target_layers = num_target_layers
        self.target_layer_ids = list(target_layer_ids) if target_layer_ids is not None else None
        self.mask_token_id = mask_token_id
        self.dflash_layout = dflash_layout

    @classmethod
    def from_zlab_dict(cls, raw: dict[str, Any], source: str = "config.json") -> "FoldDrafterConfig":
        """Normalize a z-lab ``config.json`` dict (either layout) into a config; errors name the field."""
        data = copy.deepcopy(raw)
        nested = data.pop("dflash_config", None) or {}
        if not isinstance(nested, dict):
            raise ValueError(f"{source}: 'dflash_config' must be an object, got {type(nested).__name__}")
        layout = "top" if "block_size" in data else "nested"
        block_size = nested.get("block_size", data.pop("block_size", None))
        data.pop("block_size", None)
        if block_size is None:
            raise ValueError(f"{source}: no DFlash 'block_size' (top level or in 'dflash_config')")
        mask_token_id = nested.get("mask_token_id", data.pop("mask_token_id", None))
        target_layer_ids = nested.get("target_layer_ids", data.pop("target_layer_ids", None))
        num_target_layers = data.pop("num_target_layers", nested.get("num_target_layers"))
        if num_target_layers is None:
            raise ValueError(f"{source}: missing 'num_target_layers'")
        for key in ("architectures", "model_type", "auto_map", "transformers_version", "dtype", "torch_dtype"):
            data.pop(key, None)
        if "hidden_size" not in data or "num_hidden_layers" not in data:
            raise ValueError(f"{source}: not a drafter config (needs 'hidden_size' and 'num_hidden_layers')")
        if target_layer_ids is None:
            target_layer_ids = default_target_layer_ids(int(num_target_layers), int(data["num_hidden_layers"]))
        sliding_window = data.get("sliding_window")
        layer_types = data.get("layer_types")
        if layer_types and "sliding_attention" in layer_types and sliding_window:
            # Qwen3Config drops sliding_window unless use_sliding_window is set; the layer types need it
            data["use_sliding_window"] = True
        cfg = cls(
            block_size=int(block_size),
            num_target_layers=int(num_target_layers),
            target_layer_ids=[int(i) for i in target_layer_ids],
            mask_token_id=None if mask_token_id is None else int(mask_token_id),
            dflash_layout=layout,
            **data,
        )
        if layer_types:
            cfg.layer_types = list(layer_types)
            cfg.sliding_window = sliding_window
        return cfg

    def to_zlab_dict(self) -> dict[str, Any]:
        """The ``config.json`` of the z-lab layout this config was read from."""
        data = self.to_dict()
        for key in ("block_size", "mask_token_id", "target_layer_ids", "dflash_layout", "num_target_layers"):
            data.pop(key, None)
        for key in ("_attn_implementation_autoset", "transformers_version", "use_cache", "_name_or_path"):
            data.pop(key, None)
        data["architectures"] = [DFLASH_ARCHITECTURE]
        data["model_type"] = "qwen3"
        data["num_target_layers"] = self.num_target_layers
        dflash = {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)}
        if self.dflash_layout == "top":
            data["block_size"] = self.block_size
        else:
            dflash["block_size"] = self.block_size
        data["dflash_config"] = dflash
        return data

    def is_sliding_layer(self, layer_idx: int) -> bool:
        types = getattr(self, "layer_types", None)
        return bool(types) and types[layer_idx] == "sliding_attention" and bool(self.sliding_window)
