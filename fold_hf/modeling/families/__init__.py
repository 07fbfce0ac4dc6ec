"""Drafter families: what differs between checkpoint families (config fields, weight names, forward details).

The shared drafter (:mod:`fold_hf.modeling.drafter`) is z-lab DFlash's layout; :mod:`.deepspec` adds DeepSpec's
DFlash/DSpark drafters (own embedding and lm_head, anchor slot predicts, Markov and confidence heads, Gemma-4
attention and norms).
"""

from . import deepspec

__all__ = ["deepspec"]
