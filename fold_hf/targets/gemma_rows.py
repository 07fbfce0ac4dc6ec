"""The host-length forwards of the Gemma target family (:class:`~fold_hf.targets.gemma.GemmaStaticTarget`): one cache
row (``forward``, and so ``prefill``'s chunks) or several at once (``forward_rows``, batched rounds, issue 35).

Every cache holds ``batch`` rows: a global layer's ``[B, Hkv, capacity, D]``, a sliding layer's ring
``[B, Hkv, R, D]`` (position p of a row in slot ``p mod R`` of that row), a KV-shared layer's its producer's tensor (so
row b of a shared layer reads row b of its producer). A row's forward is :meth:`GemmaRows._row_attention`'s pair of
closures over its own cache row and positions: global layers attend (SDPA) to the row's exact prefix; sliding layers
read the row's ring entries inside the window of its first query, append the new rows, attend with the window's mask
and then store the last ``R`` new rows in the row's ring. :meth:`GemmaRows.forward_rows` runs the layers once over
``[A, L]`` tokens (embedding, per-layer inputs, projections, norms, MLP and lm_head shared by the rows) and gives each
row that same pair at its own start, so each row writes its own ring slots / global entries and attends to exactly
what it attends to alone (the device-length rows step, ``forward_rows_static``, is the fused layers'
:mod:`fold_hf.targets.gemma_fused`; in exact mode ``forward_rows`` runs it). A mixin: it reads the runner's attributes that :mod:`fold_hf.targets.gemma` sets
(``windows``, ``kv_source``, ``scalings``, ``keys`` / ``values``) and its ``_run_layers``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.prefill_attention import prefill_attention
from .base import PREFILL_ATTENTION_MIN_ROWS, bucket_length


class GemmaRows:
    """``forward``, ``forward_rows`` (and the row closures under both) of
    :class:`~fold_hf.targets.gemma.GemmaStaticTarget`."""

    batched_rows = True  # forward_rows: [A, L] rows at their own positions (issue 35)

    def _ring_slots(self, i: int, positions: torch.Tensor) -> torch.Tensor:
        return positions % self.keys[i].shape[2]

    def _row_attention(self, row: int, start: int, L: int):
        """``(write_kv, attend)`` of cache row ``row`` at positions ``start .. start+L-1``, for that row's
        ``k, v [1, Hkv, L, D]`` and ``q [1, Hq, L, D]`` (attend returns ``[1, Hq, L, D]``; a sliding layer's new
        rows enter the row's ring after its attention has read the entries they overwrite)."""
        device = self.device
        positions = torch.arange(start, start + L, device=device)
        pending = {}
        here = slice(row, row + 1)

        def write_kv(i, k, v):
            if self.windows[i] is None:
                self.keys[i][here, :, start : start + L] = k
                self.values[i][here, :, start : start + L] = v
            else:  # the ring's entries inside the first query's window, read before the new rows overwrite any
                past = torch.arange(max(0, start - self.windows[i] + 1), start, device=device)
                slots = self._ring_slots(i, past)
                pending[i] = (torch.cat((self.keys[i][here, :, slots], k), 2),
                              torch.cat((self.values[i][here, :, slots], v), 2), torch.cat((past, positions)))

        def attend(i, q):
            src = self.kv_source[i]
            window = self.windows[i]
            if window is None:
                keys = self.keys[src][here, :, : start + L]
                values = self.values[src][here, :, : start + L]
                probe = self.__dict__.get("attention_probe")  # cmr's refreshes (fold_hf.modeling.retrieval)
                if probe is not None and probe.armed and i == probe.layer_idx:
                    probe.capture(q, keys, self.scalings[i])
                return self._attend_prefix_sdpa(q, keys, values, start, self.scalings[i])
            keys, values, key_pos = pending[src]
            if L > PREFILL_ATTENTION_MIN_ROWS:  # a prefill chunk: keys at consecutive positions, the window's kernel
                return prefill_attention(q, keys, values, keys.shape[2] - L, self.scalings[i], window)
            visible = (key_pos[None, :] <= positions[:, None]) & (positions[:, None] - key_pos[None, :] < window)
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=visible, scale=self.scalings[i],
                                                  enable_gqa=True)

        def attend_and_store(i, q):
            out = attend(i, q)
            if self.windows[i] is not None and self.kv_source[i] == i:
                keys, values, _ = pending[i]
                keep = min(L, self.keys[i].shape[2])
                slots = self._ring_slots(i, positions[L - keep :])
                self.keys[i][here, :, slots] = keys[:, :, keys.shape[2] - keep :]
                self.values[i][here, :, slots] = values[:, :, values.shape[2] - keep :]
            return out

        return write_kv, attend_and_store

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, start: int, taps_out: torch.Tensor | None = None,
                last_only: bool = False, row: int = 0) -> torch.Tensor:
        """Run ``input_ids [1, L]`` at positions ``start .. start+L-1`` in cache row ``row`` (any L: prefill chunks
        or a verify of at most ``RING_SLACK + 1`` rows that may be rolled back). Global layers: SDPA over the exact
        prefix; sliding layers: the ring's entries inside the window of the first query plus the new rows, then the
        last ``R`` new rows enter the ring."""
        self._check_row(row)
        L = input_ids.shape[1]
        if start + L > self.capacity:
            raise ValueError(f"{start + L} tokens exceed the cache capacity {self.capacity}")
        write_kv, attend = self._row_attention(row, start, L)
        logits = self._run_layers(input_ids, torch.arange(start, start + L, device=self.device), write_kv, attend,
                                  taps_out, last_only)
        self.length = start + L
        return logits

    @torch.no_grad()
    def forward_rows(self, input_ids: torch.Tensor, rows: list[int], starts: list[int],
                     taps_out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`~fold_hf.targets.base.StaticTarget.forward_rows`: ``input_ids [A, L]``, row ``a`` being cache row
        ``rows[a]`` at positions ``starts[a] ..``; one pass through the layers, each row's cache writes and attention
        its own (:meth:`_row_attention`). Returns logits ``[A, L, V]``, soft-capped as the model."""
        self.check_rows(input_ids, rows, starts)
        A, L = input_ids.shape
        positions = torch.tensor(starts, device=self.device)[:, None] + torch.arange(L, device=self.device)
        if self.exact:  # the exact kernels, each row as its own verify step (the fused layers over rows)
            return self.forward_rows_static(input_ids, positions, rows, bucket_length(max(starts) + L, self.capacity),
                                            taps_out)
        per_row = [self._row_attention(row, start, L) for row, start in zip(rows, starts)]

        def write_kv(i, k, v):  # k, v [A, Hkv, L, D]
            for a, (write, _) in enumerate(per_row):
                write(i, k[a : a + 1], v[a : a + 1])

        def attend(i, q):  # q [A, Hq, L, D]
            return torch.cat([row_attend(i, q[a : a + 1]) for a, (_, row_attend) in enumerate(per_row)])

        logits = self._run_layers(input_ids, positions, write_kv, attend, taps_out, last_only=False)
        return logits if logits.dim() == 3 else logits[None]

    def _attend_prefix_sdpa(self, q, keys, values, start: int, scaling: float) -> torch.Tensor:
        L = q.shape[2]
        if L > PREFILL_ATTENTION_MIN_ROWS:  # a prefill chunk (fold_hf.kernels.prefill_attention)
            return prefill_attention(q, keys, values, start, scaling)
        if L == 1:
            mask, causal = None, False
        elif start == 0:
            mask, causal = None, True
        else:
            from torch.nn.attention.bias import causal_lower_right

            mask, causal = causal_lower_right(L, start + L), False
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal, scale=scaling,
                                              enable_gqa=True)
