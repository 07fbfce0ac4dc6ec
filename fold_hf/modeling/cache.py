"""`FoldCache`: the drafter's context cache, keys stored once and unrotated.

FOLD reads far entries at a virtual position, so a rotated key would have to be un-rotated and
re-rotated every round. Storing keys unrotated serves every reading mode from one copy: the window
branch rotates its ``W + B`` keys on the fly (cheap), the far branch rotates the query instead of the
keys. The paper's vLLM implementation keeps its rotated KV cache *and* an unrotated K and V side cache
(2x our bytes per entry; up to 6 GiB); ``keep_rotated_copy=True`` adds rotated keys beside the unrotated K and V
(1.5x ours) so a two-copy layout's cost can be measured (:meth:`FoldCache.bytes_held`), but the default holds one
copy (docs/design.md §2).

Buffers are preallocated and grow by doubling; rollback rewinds a length (no copy).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .rope import RotaryTables


class FoldCacheLayer(CacheLayerMixin):
    """One drafter layer's context keys/values: ``[b, Hkv, capacity, D]`` buffers and a length."""

    is_sliding = False
    is_croppable = True
    is_compileable = False

    def __init__(self, rotated_copy_rope: RotaryTables | None = None, **kwargs) -> None:
        super().__init__()
        self.length = 0
        self.rotated_keys: torch.Tensor | None = None
        self._rotated_copy_rope = rotated_copy_rope

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h, _, d = key_states.shape
        capacity = max(64, key_states.shape[-2])
        self.keys = key_states.new_zeros(b, h, capacity, d)
        self.values = value_states.new_zeros(b, h, capacity, value_states.shape[-1])
        if self._rotated_copy_rope is not None:
            self.rotated_keys = key_states.new_zeros(b, h, capacity, d)
        self.is_initialized = True

    def _grow(self, needed: int) -> None:
        capacity = self.keys.shape[-2]
        if needed <= capacity:
            return
        new_capacity = max(needed, 2 * capacity)

        def grown(buf: torch.Tensor) -> torch.Tensor:
            out = buf.new_zeros(*buf.shape[:-2], new_capacity, buf.shape[-1])
            out[..., : self.length, :] = buf[..., : self.length, :]
            return out

        self.keys, self.values = grown(self.keys), grown(self.values)
        if self.rotated_keys is not None:
            self.rotated_keys = grown(self.rotated_keys)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append ``[b, Hkv, n, D]`` unrotated keys/values; returns views of all ``length`` entries."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if n:
            self._grow(self.length + n)
            self.keys[..., self.length : self.length + n, :] = key_states
            self.values[..., self.length : self.length + n, :] = value_states
            if self.rotated_keys is not None:
                pos = torch.arange(self.length, self.length + n, device=key_states.device)
                rotated = self._rotated_copy_rope.rotate(key_states, pos)
                self.rotated_keys[..., self.length : self.length + n, :] = rotated.to(key_states.dtype)
            self.length += n
        return self.keys[..., : self.length, :], self.values[..., : self.length, :]

    def context(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            raise RuntimeError("cache layer is empty")
        return self.keys[..., : self.length, :], self.values[..., : self.length, :]

    def rotated_context(self) -> torch.Tensor | None:
        return None if self.rotated_keys is None else self.rotated_keys[..., : self.length, :]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        """``crop(-n)`` forgets the last n entries; ``crop(0)`` does nothing; ``crop(m >= 0)`` keeps m (legacy)."""
        if tokens_to_remove < 0:
            self.length = max(0, self.length + tokens_to_remove)
        elif tokens_to_remove > 0:
            self.length = min(self.length, tokens_to_remove)

    def reset(self) -> None:
        self.length = 0

    def bytes_held(self) -> int:
        if not self.is_initialized:
            return 0
        held = [self.keys, self.values] + ([self.rotated_keys] if self.rotated_keys is not None else [])
        return sum(t.numel() * t.element_size() for t in held)

    def bytes_used(self) -> int:
        """Bytes of the ``length`` entries actually written (capacity slack excluded)."""
        if not self.is_initialized:
            return 0
        per_entry = sum(
            t[..., :1, :].numel() * t.element_size()
            for t in [self.keys, self.values] + ([self.rotated_keys] if self.rotated_keys is not None else [])
        )
        return per_entry * self.length


class FoldCache(Cache):
    """Context cache of a FOLD drafter (one :class:`FoldCacheLayer` per drafter layer).

    Args:
        num_layers: drafter layers.
        keep_rotated_copy: also keep keys rotated at their true positions (the paper's two-copy layout),
            only to measure its cost; reads stay identical.
        rope: the drafter's base rotary tables, needed with ``keep_rotated_copy``.
        request_length: input length plus generation limit of the current request (YaRN's P + G).
    """

    def __init__(
        self,
        num_layers: int,
        keep_rotated_copy: bool = False,
        rope: RotaryTables | None = None,
        request_length: int | None = None,
    ) -> None:
        if keep_rotated_copy and rope is None:
            raise ValueError("keep_rotated_copy=True needs the drafter's rope tables")
        copy_rope = rope if keep_rotated_copy else None
        super().__init__(layers=[FoldCacheLayer(copy_rope) for _ in range(num_layers)])
        self.keep_rotated_copy = keep_rotated_copy
        self.request_length = request_length
        self.retrieval = None  # per-request state of the infllm / cmr modes (fold_hf.modeling.retrieval)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if self.layers else 0

    def crop(self, max_length: int) -> None:
        """Rewind every layer: ``crop(-n)`` removes n entries, ``crop(0)`` is a no-op, ``crop(m > 0)`` keeps m."""
        for layer in self.layers:
            layer.crop(max_length)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.retrieval = None

    def bytes_held(self) -> int:
        """Bytes of every buffer this cache holds (allocated capacity, all copies)."""
        return sum(layer.bytes_held() for layer in self.layers)

    def bytes_used(self) -> int:
        """Bytes of the entries written so far, all copies (what a right-sized cache would hold)."""
        return sum(layer.bytes_used() for layer in self.layers)
