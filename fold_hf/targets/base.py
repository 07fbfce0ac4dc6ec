"""`StaticTarget`: our own forward of a target over its own weights with a preallocated KV cache, family-free.

transformers' ``forward`` costs tens of milliseconds of Python per step at 8B scale (docs/design.md §6) and its
``DynamicCache`` reallocates; neither can be captured in a CUDA graph. A family runner (:mod:`fold_hf.targets.llama`,
:mod:`~fold_hf.targets.qwen35`, :mod:`~fold_hf.targets.gemma`; :mod:`fold_hf.targets.registry` says which runs an
architecture) calls the model's own submodules, so every weight is the model's own (no copies, PEFT wrappers
included) and the numerics follow the model's; only the cache and the attention are ours. This base class holds what
does not depend on the family:

* KV cache: one ``[batch, Hkv, capacity, D]`` key and value buffer per layer (``batch`` 1 but for a batched
  request's runner), keys stored rotated as transformers stores them. Rollback = rewind a length: entries past the
  length are never read and get overwritten.
* RoPE: the model's rotary embedding evaluated once for positions ``0 .. capacity-1`` (elementwise, so a table
  lookup gives the same values as calling it per step).
* Attention, two forms, around the family's ``_run_layers`` (its layers, given how to write and read the cache):
  - ``forward`` (host lengths): SDPA over the exact prefix ``[0, start + Lq)``; no mask for one query (flash
    decoding), a lower-right causal bias for several.
  - ``forward_static`` (device lengths, fixed shapes, CUDA-graph friendly): positions come from a device
    tensor; attention reads a fixed *bucket* of the cache ``[0, S)`` with a mask built on device from the
    positions. Buckets grow with the context (length dispatch, :func:`bucket_length`) so a short context does not
    pay for the whole capacity. The query heads of one KV head are stacked as rows, so GQA reads each KV head once.
    ``attention="triton"``: a split-context decode kernel
    (:func:`fold_hf.kernels.fold_read.triton.decode_attention_triton`; its torch twin off CUDA) reads the cache
    prefix ``[0, start)`` up to a length it loads from the device, plus the block's own keys causally, so no
    ``[Hkv, G * L, S]`` fp32 score tensor is written; the bucket then only sizes the kernel's splits.
    ``fused=True``: the family's fused layers (:meth:`StaticTarget.fused_unsupported` says why not).
  Exact mode (:meth:`StaticTarget.set_exact`, docs/exact-mode.md): the fused decode / verify forward with kernels
  whose reduction order does not depend on the number of rows (the Llama and Gemma families).
* Rows (a family with :attr:`StaticTarget.batched_rows`, issue 35): ``forward`` and ``prefill`` take ``row``, the
  cache row they fill; :meth:`StaticTarget.forward_rows` runs ``[A, L]`` tokens of ``A`` rows, each at its own
  position, as one forward (every projection reads its weights once for all rows; each row attends to its own
  prefix, no padding read); :meth:`StaticTarget.move_row` copies one cache row's state into another (every buffer
  of :meth:`StaticTarget.row_tensors`, a family adding its own per-row state), so batched rounds keep their running
  rows in cache rows ``0 .. A-1``.
* Taps: the outputs of the drafter's tapped layers (the last layer's after the final norm, as
  :class:`~fold_hf.targets.taps.HiddenTaps` captures them) concatenated ``[1, Lq, n_taps * H]``.
* cmr's query tap (:meth:`StaticTarget.keep_queries`).
"""

from __future__ import annotations

import abc
import math

import torch
import torch.nn.functional as F
from torch import nn

from .tensor_parallel import record_plan, tensor_parallel_size

PREFILL_CHUNK = 8192  # tokens per prefill forward; the fused prefill's rule (fused_prefill_chunk) may take more:
# the fused prefill (CUDA, Llama / Gemma families) of a narrow target takes longer chunks: its host time per chunk
# (~400 launches, ~10 ms on an H100 host) was more than its kernels' (Gemma-3-270M at 32K in 4 chunks of 8,192:
# 75.5 ms against 35.0 ms of kernels, benchmarks/results/2026-12-07-nvidia-h100-splitk-prefill-profile)
PREFILL_CHUNK_MAX = 65536
PREFILL_ACTIVATION_BYTES = 512 << 20  # the widest activation of a chunk (gate|up's product) stays within this
FUSED_PREFILL_ENV = "FOLD_HF_FUSED_PREFILL"  # 0: prefill chunks through the module kernels (every family)
PREFILL_ATTENTION_MIN_ROWS = 64  # more query rows than a verify block: the prefill attention kernels
TARGET_ATTENTIONS = ("bucket", "triton")


def fused_prefill_chunk(widest: int, element_bytes: int) -> int:
    """Prompt tokens per chunk of the fused prefill: the largest power of two whose widest activation (``widest``
    values a token of ``element_bytes`` each, e.g. the merged gate|up product) fits
    :data:`PREFILL_ACTIVATION_BYTES`, at least :data:`PREFILL_CHUNK` and at most :data:`PREFILL_CHUNK_MAX`
    (Llama-3.1-8B in bf16, 2 x 14,336 wide: 8,192; Gemma-3-270M, 2 x 2,048: 65,536)."""
    if widest < 1 or element_bytes < 1:
        raise ValueError(f"widest {widest} and element_bytes {element_bytes} must be positive")
    fits = PREFILL_ACTIVATION_BYTES // (widest * element_bytes)
    chunk = PREFILL_CHUNK
    while chunk * 2 <= min(fits, PREFILL_CHUNK_MAX):
        chunk *= 2
    return chunk


class UnsupportedTarget(ValueError):
    """The fast loop cannot run this target (the message says why)."""


def bucket_length(needed: int, capacity: int, minimum: int = 256) -> int:
    """Attention length of the static forward for ``needed`` keys: a multiple of a step that grows with the
    length (at most 1/8 of it), so the padding read is at most ~12.5% and few buckets (graphs) exist."""
    if needed > capacity:
        raise ValueError(f"{needed} keys do not fit the cache capacity {capacity}")
    step = max(minimum, 2 ** max(0, math.floor(math.log2(max(needed, 1))) - 3))
    return min(capacity, -(-needed // step) * step)


def batch_unsupported(family: str) -> str:
    """Why a family's runner takes one row at a time (the batch's rows are then decoded one after another)."""
    return f"{family} keeps one row per cache (batched rounds run the Llama, Qwen3.5 and Gemma families)"


class StaticTarget(abc.ABC):
    """Forward passes of a causal LM over a preallocated KV cache (batch 1): the family-free part (module docstring).

    A family runner is built as ``Runner(target, capacity, tap_layer_ids)`` (``target``: the transformers model or a
    PEFT wrapper of one; ``capacity``: cache length in tokens, prompt + generated + one block of slack;
    ``tap_layer_ids``: the drafter's tapped layers, ``hidden_states[l + 1]`` of each, or ``()``). It calls
    :meth:`_setup`, sets ``num_heads``, ``num_kv_heads``, ``head_dim``, ``scaling``, ``keys`` / ``values`` and the rope
    table ``cos`` / ``sin`` ``[capacity, D]``, and gives :meth:`_run_layers` (or its own forwards).
    """

    batched_rows = False  # a family whose _run_layers takes [A, L] rows at per-row positions (forward_rows) says so

    def _setup(self, model: nn.Module, config, decoder: nn.Module, capacity: int, tap_layer_ids,
               batch: int = 1) -> None:
        """What every family sets first: the model, its text ``config`` and ``decoder`` (with ``.layers`` and
        ``.norm``; a multimodal wrapper's text model), the embedding, head, capacity, taps, device and dtype, and
        ``batch``: the rows its caches hold (a family that is not :attr:`batched_rows` takes 1)."""
        if batch != 1 and not self.batched_rows:
            raise UnsupportedTarget(batch_unsupported(type(self).__name__))
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.batch = int(batch)
        self.model = model
        self.config = config  # the text model's config (a multimodal wrapper's config.text_config)
        self.decoder = decoder
        self.layers = decoder.layers
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.final_norm = decoder.norm
        self.capacity = int(capacity)
        self.tap_layer_ids = list(tap_layer_ids)
        weight = self.embed.weight
        self.device, self.dtype = weight.device, weight.dtype
        # ranks the weights are sharded over by transformers' tp_plan (1: not sharded): the runner then holds this
        # rank's heads; its modules do their collectives, the fused layers run the column / row-parallel projections
        # on this rank's weights (weight_layout.project) and the rest as modules (tensor_parallel.py)
        self.tensor_parallel = tensor_parallel_size(model)
        if self.tensor_parallel > 1:
            record_plan(model)  # each module's tp_plan style: the fused layers run the column / row-parallel ones
        self.length = 0  # tokens in the cache (host view; the static path keeps its own on device)
        self._decode_attention = None  # resolved on first use of attention="triton"
        self._decode_rows = False  # the rows' verify attention in one launch pair: resolved by _rows_decode
        self._row_indices: dict[tuple, torch.Tensor] = {}
        self._layer_ops = None  # resolved on first use of fused=True
        self._exact_kernels = None  # exact mode's kernels (LayerOps, attention, ...), resolved on its first step

    def local_heads(self, heads: int, what: str) -> int:
        """This rank's share of ``heads`` (all of them when the target is not sharded; ``what``: their name, for the
        error raised when they do not split over the ranks)."""
        if heads % self.tensor_parallel:
            raise UnsupportedTarget(f"{heads} {what} do not split over {self.tensor_parallel} tensor-parallel ranks")
        return heads // self.tensor_parallel

    def accept(self, n) -> None:
        """Acceptance of ``n`` drafts after a verify (int or ``[1]`` device tensor; after :meth:`forward_rows`, a list
        of ints, one per row). Nothing to do here: a KV cache rolls back by its length; families with recurrent
        state select each row's accepted position's state."""

    def step_state(self) -> list[torch.Tensor]:
        """Buffers a verify both reads and overwrites (:meth:`accept` commits a recurrent family's state into the
        buffer the next verify starts from), so that a captured step's warm-up runs can restore them
        (:class:`fold_hf.generation.graphs.CapturedStep`). Empty for a KV cache: its writes are idempotent."""
        return []

    # ------------------------------------------------------------------ cmr's query tap (a separate hook)
    query_keep = None  # (layer index, [1, Hq, rows, D] buffer) while a cmr request runs, else None

    def keep_queries_unsupported(self) -> str | None:
        """Why :meth:`keep_queries` cannot run on this target (None when it can): a family says so when its
        device-length forwards copy the kept layer's queries."""
        return f"{type(self).__name__}'s verify step does not keep its queries"

    def kept_query_keys(self, layer_idx: int) -> tuple[torch.Tensor, float]:
        """The key cache ``[1, Hkv, capacity, Dh]`` and logit scale that layer ``layer_idx``'s kept queries attend
        with (a family with shared KV or per-layer scales says which)."""
        return self.keys[layer_idx], self.scaling

    def keep_queries(self, layer_idx: int | None, rows: int = 0) -> torch.Tensor | None:
        """CMR's refreshes read the target's attention of one query (:mod:`fold_hf.generation.static_retrieval`):
        from now on :meth:`forward_static` copies layer ``layer_idx``'s rotated queries of its ``rows`` rows into
        the returned ``[1, Hq, rows, D]`` buffer (one small copy per verify, in that layer only); ``None`` stops.
        Only cmr requests turn this on, and the fast loop keys its captured verify steps by it, so every other
        mode's verify is unchanged."""
        if layer_idx is None:
            self.query_keep = None
            return None
        reason = self.keep_queries_unsupported()
        if reason is not None:
            raise UnsupportedTarget(reason)
        # one buffer per (layer, rows) for the runner's lifetime: captured steps of earlier requests read it
        buffers = self.__dict__.setdefault("_kept_queries", {})
        if (layer_idx, rows) not in buffers:
            heads, head_dim = self.kept_query_shape(layer_idx)
            buffers[(layer_idx, rows)] = torch.zeros(1, heads, rows, head_dim, device=self.device, dtype=self.dtype)
        self.query_keep = (layer_idx, buffers[(layer_idx, rows)])
        return self.query_keep[1]

    def kept_query_shape(self, layer_idx: int) -> tuple[int, int]:
        """(query heads, head dim) of layer ``layer_idx``."""
        return self.num_heads, self.head_dim

    def _keeping_queries(self, attend):
        """``attend`` that first copies the kept layer's queries (:meth:`keep_queries`), or ``attend`` itself."""
        keep = self.query_keep
        if keep is None:
            return attend
        layer, buffer = keep

        def attend_and_keep(i, q):
            if i == layer:
                buffer[:, :, : q.shape[2]].copy_(q)
            return attend(i, q)

        return attend_and_keep

    def fused_unsupported(self) -> str | None:
        """Why the fused-layer path cannot run this target (None when it can)."""
        return f"{type(self).__name__} has no fused layers"

    # ------------------------------------------------------------------ exact mode (issue 37, docs/exact-mode.md)
    exact = False  # set_exact(True): forward_static's fused decode / verify runs the row-count-invariant kernels

    def exact_unsupported(self) -> str | None:
        """Why exact mode cannot run this target, as a sentence naming exact mode (None when it can); a family that
        runs it says so."""
        return f"exact mode runs the Llama and Gemma families; {type(self.model).__name__} not yet"

    def _exact_basics_unsupported(self) -> str | None:
        """What exact mode needs of every family (None when it holds): its kernels on this device, the family's fused
        layers, and q|k|v and gate|up as one GEMM each; a family's :meth:`exact_unsupported` adds its own checks."""
        from ..kernels.exact import exact_unavailable_reason
        from .weight_layout import concat_projections_enabled

        reason = exact_unavailable_reason(self.device)
        if reason is None and self.tensor_parallel > 1:  # the ranks' partial sums add in an order of the collective's
            reason = (f"the target is sharded over {self.tensor_parallel} tensor-parallel ranks (an all-reduce may "
                      "add the ranks' partial sums in an order that depends on the row count)")
        if reason is None:
            reason = self.fused_unsupported()
            reason = None if reason is None else f"the fused layers cannot run this target ({reason})"
        if reason is None and not concat_projections_enabled():
            reason = "$FOLD_HF_CONCAT_PROJECTIONS=0 (exact mode runs q|k|v and gate|up as one GEMM each)"
        return reason

    def set_exact(self, exact: bool) -> None:
        """Exact mode on or off: on, :meth:`forward_static` (``fused=True``, ``attention="triton"``, the only form it
        then takes) computes a row's logits with the same bits for any number of rows (an AR step, a verify block).

        Raises:
            ExactUnavailable: :meth:`exact_unsupported` says why (no fallback: the caller asked for the guarantee).
        """
        if exact:
            from ..kernels.exact import ExactUnavailable

            reason = self.exact_unsupported()
            if reason is not None:
                raise ExactUnavailable(reason)
        self.exact = bool(exact)

    def _check_exact_forward(self, fused: bool, attention: str) -> None:
        """In exact mode, raise unless :meth:`forward_static` runs its one exact form (fused, Triton attention)."""
        if self.exact and not (fused and attention == "triton"):
            raise ValueError("exact mode runs forward_static with fused=True and attention='triton' (its kernels); "
                             f"got fused={fused}, attention={attention!r}")

    # ------------------------------------------------------------------ sizes
    @property
    def num_taps(self) -> int:
        return len(self.tap_layer_ids)

    @property
    def tap_width(self) -> int:
        return self.num_taps * self.config.hidden_size

    def bytes_held(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    # ------------------------------------------------------------------ the family's layers
    @abc.abstractmethod
    def _run_layers(self, input_ids: torch.Tensor, cos, sin, write_kv, attend, taps_out: torch.Tensor | None,
                    last_only: bool) -> torch.Tensor:
        """Shared body of every forward, the family's (each family defines it; the base cannot be built):
        ``input_ids [1, L]``, rope rows ``cos`` / ``sin`` ``[L, D]``; ``write_kv(i, k, v)`` stores the new entries of
        layer ``i``, ``attend(i, q)`` returns ``[1, Hq, L, D]``. Returns logits ``[L, V]`` (``[1, V]`` with
        ``last_only``)."""

    # ------------------------------------------------------------------ host-length forward
    def prefix_mask(self, L: int, start: int):
        """``(attn_mask, is_causal)`` of ``L`` queries at ``start ..`` over the prefix ``[0, start + L)``: none for one
        query, causal from 0, else lower-right causal (for a CPU verify block a boolean mask built once per forward:
        SDPA would materialize the bias object again in every layer)."""
        if L == 1:
            return None, False
        if start == 0:
            return None, True
        if self.device.type == "cpu" and L <= 64:  # a verify block (a prefill chunk keeps the bias object)
            mask = torch.ones(L, start + L, dtype=torch.bool)
            mask[:, start:] = torch.ones(L, L, dtype=torch.bool).tril()
            return mask, False
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(L, start + L), False

    def _attend_prefix(self, i: int, q: torch.Tensor, start: int, prefix_mask=None, row: int = 0) -> torch.Tensor:
        L = q.shape[2]
        keys = self.keys[i][row : row + 1, :, : start + L]
        values = self.values[i][row : row + 1, :, : start + L]
        mask, causal = prefix_mask if prefix_mask is not None else self.prefix_mask(L, start)
        probe = self.__dict__.get("attention_probe")  # cmr's refreshes (fold_hf.modeling.retrieval), else None
        if probe is not None and probe.armed and i == probe.layer_idx:
            probe.capture(q, keys, self.scaling)
        if L > PREFILL_ATTENTION_MIN_ROWS:  # a prefill chunk: flash-class attention (fold_hf.kernels.prefill_attention)
            from ..kernels.prefill_attention import prefill_attention

            return prefill_attention(q, keys, values, start, self.scaling)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=causal,
                                              scale=self.scaling, enable_gqa=True)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, start: int, taps_out: torch.Tensor | None = None,
                last_only: bool = False, row: int = 0) -> torch.Tensor:
        """Run ``input_ids [1, L]`` at positions ``start .. start+L-1``; the cache then holds ``start + L`` tokens.

        Args:
            taps_out: ``[1, L, n_taps * H]`` buffer receiving the tapped features, or None.
            last_only: return only the last row's logits.
            row: the cache row written and read (``< batch``).

        Returns:
            logits ``[L, V]`` (``[1, V]`` with ``last_only``) in the model's dtype.
        """
        L = input_ids.shape[1]
        if start + L > self.capacity:
            raise ValueError(f"{start + L} tokens exceed the cache capacity {self.capacity}")
        cos, sin = self.cos[start : start + L], self.sin[start : start + L]
        self._check_row(row)

        def write_kv(i, k, v):
            self.keys[i][row : row + 1, :, start : start + L] = k
            self.values[i][row : row + 1, :, start : start + L] = v

        mask = self.prefix_mask(L, start)
        logits = self._run_layers(input_ids, cos, sin, write_kv,
                                  lambda i, q: self._attend_prefix(i, q, start, mask, row), taps_out, last_only)
        self.length = start + L
        return logits

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk: int | None = None, on_taps=None,
                row: int = 0) -> torch.Tensor:
        """Fill cache row ``row`` with the prompt ``[1, P]`` in chunks of ``chunk`` tokens (None:
        :meth:`prefill_chunk`); returns the last position's logits ``[V]``.

        ``on_taps(features [1, c, n_taps * H], start)`` receives each chunk's tapped features (so a 128K prompt
        never holds all its taps at once).
        """
        P = input_ids.shape[1]
        logits = None
        fused = self._fused_prefill()
        chunk = chunk or self.prefill_chunk(fused)
        self._check_row(row)
        for start in range(0, P, chunk):
            piece = input_ids[:, start : start + chunk]
            taps = None
            if on_taps is not None and self.num_taps:
                taps = torch.empty(1, piece.shape[1], self.tap_width, device=self.device, dtype=self.dtype)
            if fused:
                logits = self._prefill_chunk_fused(piece, start, taps, row=row)
            else:
                logits = self.forward(piece, start, taps_out=taps, last_only=True, row=row)
            if taps is not None:
                on_taps(taps, start)
        return logits[-1]

    def prefill_chunk(self, fused: bool | None = None) -> int:
        """Prompt tokens per prefill forward by default: :func:`fused_prefill_chunk` of the decoder layers' widest
        ``nn.Linear`` output (doubled: gate|up run as one product) where the prefill runs the fused layers
        (``fused``, default :meth:`_fused_prefill`), else :data:`PREFILL_CHUNK` (the module path; on a CPU a sliding
        layer's masked attention holds ``[chunk, context]`` scores)."""
        if not (self._fused_prefill() if fused is None else fused):
            return PREFILL_CHUNK
        widest = max((m.out_features for layer in self.layers for m in layer.modules()
                      if isinstance(m, nn.Linear)), default=self.config.hidden_size)
        return fused_prefill_chunk(2 * widest, torch.finfo(self.dtype).bits // 8)

    def _check_row(self, row: int) -> None:
        if not 0 <= row < self.batch:
            raise ValueError(f"row {row} is not a row of this runner's cache (it holds {self.batch})")

    # ------------------------------------------------------------------ several rows at once (issue 35)
    @torch.no_grad()
    def forward_rows(self, input_ids: torch.Tensor, rows: list[int], starts: list[int],
                     taps_out: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``input_ids [A, L]``: its ``a``-th row is cache row ``rows[a]``'s tokens at positions
        ``starts[a] .. starts[a] + L - 1`` (the verify block of a batched round: each row's last committed token and
        its proposals, padded to ``L``). One forward through the layers (every projection's weights read once for
        the ``A`` rows); each row writes its entries into its cache row and attends causally to its own prefix
        ``[0, starts[a] + L)``, exactly the attention :meth:`forward` gives that row alone (no padding read). A
        row's entries past what it keeps are rolled back by its length as usual.

        Args:
            taps_out: ``[A, L, n_taps * H]`` buffer receiving the tapped features, or None.

        Returns:
            logits ``[A, L, V]`` in the model's dtype.
        """
        self.check_rows(input_ids, rows, starts)
        A, L = input_ids.shape
        if self.exact:  # the exact kernels, each row as its own verify step (the family's fused layers)
            positions = torch.stack([torch.arange(s, s + L, device=self.device) for s in starts])
            return self.forward_rows_static(input_ids, positions, rows, bucket_length(max(starts) + L, self.capacity),
                                            taps_out)
        cos = torch.stack([self.cos[s : s + L] for s in starts])  # [A, L, D]
        sin = torch.stack([self.sin[s : s + L] for s in starts])
        masks = [self.prefix_mask(L, start) for start in starts]  # built once per forward, not per layer

        def write_kv(i, k, v):  # k, v [A, Hkv, L, D]
            for a, (row, start) in enumerate(zip(rows, starts)):
                self.keys[i][row, :, start : start + L] = k[a]
                self.values[i][row, :, start : start + L] = v[a]

        def attend(i, q):  # q [A, Hq, L, D]
            return torch.cat([self._attend_prefix(i, q[a : a + 1], start, masks[a], row)
                              for a, (row, start) in enumerate(zip(rows, starts))])

        logits = self._run_layers(input_ids, cos, sin, write_kv, attend, taps_out, last_only=False)
        return logits if logits.dim() == 3 else logits[None]

    def check_rows(self, input_ids: torch.Tensor, rows: list[int], starts: list[int]) -> None:
        """Raise unless ``input_ids [A, L]`` can run as cache rows ``rows`` at ``starts`` (:meth:`forward_rows`)."""
        if not self.batched_rows:
            raise UnsupportedTarget(batch_unsupported(type(self).__name__))
        A, L = input_ids.shape
        if len(rows) != A or len(starts) != A:
            raise ValueError(f"{A} rows of tokens need {A} cache rows and starts, got {len(rows)} and {len(starts)}")
        for row, start in zip(rows, starts):
            self._check_row(row)
            if start + L > self.capacity:
                raise ValueError(f"row {row}: {start + L} tokens exceed the cache capacity {self.capacity}")

    def row_tensors(self) -> list[tuple[torch.Tensor, int, bool]]:
        """Every buffer holding one entry per cache row, once each: ``(tensor, row axis, by position)``, ``by
        position`` when the axis after the row's heads is a position (``[batch, H, capacity, D]``: :meth:`move_row`
        copies the row's first ``length`` positions) rather than a whole state (a ring, a recurrent state: copied
        whole). Here: every layer's key and value cache (row axis 0; a KV-shared layer's is its producer's tensor;
        a sliding layer's ring by position only when it is the capacity long, its slot then the position); a family
        with other per-row state adds it."""
        unique = {id(t): t for t in self.keys + self.values if t is not None}
        return [(t, 0, t.shape[2] == self.capacity) for t in unique.values()]

    @torch.no_grad()
    def move_row(self, source: int, dest: int, length: int) -> None:
        """Copy cache row ``source``'s state into cache row ``dest`` (batched rounds keep their running rows in cache
        rows ``0 .. A-1``: when a row stops, the last running row moves into its cache row,
        :mod:`fold_hf.generation.fast.batched`). ``length``: the tokens ``source`` holds (its entries past it are
        never read before they are written); every buffer of :meth:`row_tensors`. ``source`` is left as it was."""
        self._check_row(source)
        self._check_row(dest)
        if not 0 <= length <= self.capacity:
            raise ValueError(f"a row of {length} tokens does not fit the cache capacity {self.capacity}")
        if source == dest:
            return
        for tensor, axis, by_position in self.row_tensors():
            to, frm = tensor.select(axis, dest), tensor.select(axis, source)
            if by_position:
                to, frm = to[:, :length], frm[:, :length]
            to.copy_(frm)

    def _check_one_row(self) -> None:
        if self.batch != 1:
            raise ValueError(f"forward_static runs a one-row cache; this runner holds {self.batch} rows "
                             "(a batch's rounds run forward_rows)")

    def _check_rows_step(self, input_ids: torch.Tensor, positions: torch.Tensor, rows, bucket: int) -> None:
        """Raise unless :meth:`forward_rows_static` can run ``input_ids [A, L]`` at ``positions [A, L]`` in cache rows
        ``rows`` (one each, in this runner) with keys read up to ``bucket`` (at most the capacity)."""
        A, L = input_ids.shape
        if positions.shape != (A, L):
            raise ValueError(f"positions {tuple(positions.shape)} do not match the rows' tokens {(A, L)}")
        if len(rows) != A:
            raise ValueError(f"{A} rows of tokens need {A} cache rows, got {len(rows)}")
        for row in rows:
            self._check_row(row)
        if bucket > self.capacity:
            raise ValueError(f"bucket {bucket} exceeds the cache capacity {self.capacity}")

    def after_rows_step(self, rows, L: int) -> None:
        """A fixed-shape :meth:`forward_rows_static` of ``L`` tokens a row has just run (or been replayed from a CUDA
        graph, which runs no Python): what :meth:`accept` then commits is that of cache rows ``rows``, the running
        rows (the step's rows past them are parked rows fed to fill its row bucket). Nothing to do for a family whose
        verify leaves nothing pending (KV caches: a parked row's writes land past what its row holds); a recurrent
        family records the rows whose writes the next :meth:`accept` commits."""

    def fused_rows_unsupported(self) -> str | None:
        """Why :meth:`forward_rows_static` cannot run this target (None when the family gives it): a batch's verify
        on the static and graphs engines then runs :meth:`forward_rows` (host lengths), said once."""
        if type(self).forward_rows_static is StaticTarget.forward_rows_static:
            return f"{type(self).__name__} has no fused layers over rows (forward_rows_static)"
        return None

    def forward_rows_static(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: list[int], bucket: int,
                            taps_out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`forward_rows` with fixed shapes, nothing read on the host (CUDA-graph friendly): ``input_ids
        [A, L]`` of cache rows ``rows`` at ``positions [A, L]`` (device; each row's consecutive, its context length
        its first), keys read up to ``bucket`` (static, above every row's last position); the family's fused layers.
        Returns logits ``[A, L, V]``; raises :class:`UnsupportedTarget` where the family has none."""
        raise UnsupportedTarget(f"fused layers over rows: {self.fused_unsupported()}")

    def _rows_decode(self):
        """The verify attention of several cache rows in one launch pair
        (:func:`~fold_hf.kernels.fold_read.triton.decode_attention_rows_triton`) where the rows' decode attention is
        the Triton kernel (and ``$FOLD_HF_ROWS_KERNELS`` is not ``0``), else None (one call of the decode attention
        per row: its torch twin off CUDA)."""
        if self._decode_rows is False:
            from ..kernels import import_triton_module, rows_kernels_enabled, triton_kernels_enabled

            enabled = triton_kernels_enabled(self.device) and rows_kernels_enabled()
            module = import_triton_module("fold_read.triton") if enabled else None
            self._decode_rows = module.decode_attention_rows_triton if module is not None else None
        return self._decode_rows

    def _row_index(self, rows) -> torch.Tensor:
        """Cache rows ``rows`` as an int32 device tensor, made once per tuple (outside a capture: a graph's warm-up
        runs first) and kept, so a captured step reads a buffer that lives as long as the runner."""
        key = tuple(rows)
        index = self._row_indices.get(key)
        if index is None:
            index = self._row_indices[key] = torch.tensor(key, dtype=torch.int32, device=self.device)
        return index

    def _fused_prefill(self) -> bool:
        """Whether :meth:`prefill` runs its chunks through the family's fused layers (:meth:`_prefill_chunk_fused`)."""
        return False

    def _prefill_chunk_fused(self, input_ids: torch.Tensor, start: int, taps_out: torch.Tensor | None,
                             row: int = 0) -> torch.Tensor:
        """One prefill chunk ``[1, L]`` at positions ``start ..`` into cache row ``row`` through the family's fused
        layers (``_fused_layers``, the lm_head over the last position only), attending as
        :meth:`_prefill_attention` says; logits ``[1, V]`` of the last position."""
        L = input_ids.shape[1]
        if start + L > self.capacity:
            raise ValueError(f"{start + L} tokens exceed the cache capacity {self.capacity}")
        self._check_row(row)
        positions = torch.arange(start, start + L, device=self.device)
        with torch.no_grad():
            logits = self._fused_layers(input_ids, positions, start + L, taps_out, rows=(row,), last_only=True,
                                        **self._prefill_attention(row, start, L))
        self.length = start + L
        return logits

    def _prefill_attention(self, row: int, start: int, L: int) -> dict:
        """The keywords by which the family's ``_fused_layers`` runs a prefill chunk of ``L`` rows at ``start`` in
        cache row ``row`` (its cache writes and its attention over the row's cache); a family whose
        :meth:`_fused_prefill` can be True gives them."""
        raise NotImplementedError(f"{type(self).__name__} has no fused prefill")

    def _fused_prefill_allowed(self) -> bool:
        """What a family's :meth:`_fused_prefill` asks of every family: CUDA, ``$FOLD_HF_FUSED_PREFILL`` not ``0``
        and :meth:`fused_unsupported` None."""
        import os

        if self.device.type != "cuda" or os.environ.get(FUSED_PREFILL_ENV, "1") == "0":
            return False
        return self.fused_unsupported() is None

    # ------------------------------------------------------------------ device-length forward
    @torch.no_grad()
    def forward_static(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                       taps_out: torch.Tensor | None = None, attention: str = "bucket",
                       fused: bool = False) -> torch.Tensor:
        """CUDA-graph-friendly forward: nothing here reads a device value on the host.

        Args:
            input_ids: ``[1, L]`` tokens.
            positions: ``[L]`` long device tensor, consecutive positions of the tokens (start = cache length).
            bucket: S, keys read by the attention (static; ``positions[-1] < S <= capacity``); keys past each
                query's position are masked.
            taps_out: ``[1, L, n_taps * H]`` buffer for the tapped features, or None.
            attention: ``"bucket"`` (two matmuls over the bucket with a masked fp32 softmax) or ``"triton"``
                (the decode kernel over the prefix ``[0, positions[0])`` plus the block; its torch twin when the
                kernel cannot run here). Both give the causal attention of the block.
            fused: with ``attention="triton"``, run the layers' elementwise work as fused kernels (module
                docstring); raises :class:`UnsupportedTarget` when :meth:`fused_unsupported` says why not.

        Returns:
            logits ``[L, V]``.
        """
        if attention not in TARGET_ATTENTIONS:
            raise ValueError(f"attention must be one of {TARGET_ATTENTIONS}, got {attention!r}")
        self._check_one_row()
        self._check_exact_forward(fused, attention)
        if fused:
            if attention != "triton":
                raise ValueError("fused layers run with attention='triton' (the decode kernel)")
            return self._forward_static_fused(input_ids, positions, bucket, taps_out)
        L = input_ids.shape[1]
        cos, sin = self.cos[positions], self.sin[positions]
        if attention == "triton":
            return self._forward_static_decode(input_ids, positions, bucket, cos, sin, taps_out)
        group = self.num_heads // self.num_kv_heads
        key_index = torch.arange(bucket, device=positions.device)
        visible = (key_index[None, :] <= positions[:, None]).repeat(group, 1)  # rows ordered (head in group, query)
        hidden_keys = ~visible

        def write_kv(i, k, v):
            self.keys[i].index_copy_(2, positions, k)
            self.values[i].index_copy_(2, positions, v)

        def attend(i, q):
            q_rows = q.reshape(1, self.num_kv_heads, group * L, self.head_dim)
            keys = self.keys[i][:, :, :bucket]
            values = self.values[i][:, :, :bucket]
            scores = torch.matmul(q_rows, keys.transpose(-1, -2)).float() * self.scaling
            scores = scores.masked_fill(hidden_keys, -math.inf)
            probs = scores.softmax(-1).to(values.dtype)
            return torch.matmul(probs, values).reshape(1, self.num_heads, L, self.head_dim)

        return self._run_layers(input_ids, cos, sin, write_kv, self._keeping_queries(attend), taps_out,
                                last_only=False)

    def _forward_static_fused(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                              taps_out: torch.Tensor | None) -> torch.Tensor:
        """``forward_static`` with the family's fused layers; raises :class:`UnsupportedTarget` here."""
        raise UnsupportedTarget(f"fused layers: {self.fused_unsupported()}")

    def _forward_static_decode(self, input_ids, positions, bucket: int, cos, sin, taps_out) -> torch.Tensor:
        """``forward_static`` with the decode kernel: the new entries go into the cache as usual, and the kernel
        reads the cache before the block (length ``positions[0]``, loaded on the device) and the block itself."""
        if self._decode_attention is None:
            from ..kernels import default_decode_attention

            self._decode_attention = default_decode_attention(self.device)
        decode = self._decode_attention
        context_length = positions[:1].to(torch.int32)
        block_kv = {}

        def write_kv(i, k, v):
            self.keys[i].index_copy_(2, positions, k)
            self.values[i].index_copy_(2, positions, v)
            block_kv[i] = (k, v)

        def attend(i, q):
            k, v = block_kv.pop(i)
            out = decode(q, self.keys[i], self.values[i], k, v, context_length, scaling=self.scaling,
                         max_context_length=bucket)  # [1, L, Hq, D]
            return out.transpose(1, 2)

        return self._run_layers(input_ids, cos, sin, write_kv, self._keeping_queries(attend), taps_out,
                                last_only=False)
