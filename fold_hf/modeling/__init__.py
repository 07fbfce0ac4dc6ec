"""Configs, the FOLD drafter, its cache, attention geometry and checkpoint loading."""

from .cache import FoldCache, FoldCacheLayer
from .draft_vocab import DraftVocab
from .drafter import FoldDrafter
from .drafter_config import FoldDrafterConfig, default_target_layer_ids
from .fold_config import MODES, FoldConfig
from .read_plan import LayerRead, plan_layer_read
from .rope import RotaryTables

__all__ = [
    "MODES",
    "DraftVocab",
    "FoldCache",
    "FoldCacheLayer",
    "FoldConfig",
    "FoldDrafter",
    "FoldDrafterConfig",
    "LayerRead",
    "RotaryTables",
    "default_target_layer_ids",
    "plan_layer_read",
]
