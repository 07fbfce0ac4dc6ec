"""`RowsDrafter`: the drafts of every running row of a batched round in one fixed-shape step (engines ``static`` and
``graphs``; :mod:`fold_hf.generation.fast.batched`).

It is the single-prompt :class:`~fold_hf.generation.static_drafter.StaticDrafter` with a row axis ``A``: the same
layers (the drafter's own :class:`~fold_hf.modeling.drafter_layer.DrafterLayer` forward, or the fused restatement
``_layers_fused``), the same views, rotations and read functions; what it changes is where a row's entries live and
how a row is read:

* one preallocated cache ``[batch, Hkv, capacity, Dh]`` per layer (:func:`row_cache`; each row of the batch keeps a
  :class:`~fold_hf.modeling.cache.FoldCache` viewing its own row of it, which the prompt's taps fill at prefill), so
  every row's new context entries go in with one scatter a layer and nothing is copied between rounds (but when a
  row stops: the batched rounds keep their running rows in cache rows ``0 .. A-1``, moving a running row's entries
  into the stopped row's cache row with :meth:`RowsDrafter.move_row` and pointing its cache there, :func:`view_row`);
* shared by the rows: the block embedding, ``fc`` over each row's new context features (a fixed ``R = proposals + 1``
  rows per row, only the first ``d_new`` of them counting: the rest lies past the row's length and is overwritten
  next round), every projection and the lm_head over ``[A, B]``;
* per row: its committed length and last token, read from the device (``lengths [A, 4]``, never baked in a graph),
  the rope rows of its block, and its own FOLD read (window boundary and far memory with its own normalization and
  α): all rows' reads of a layer in one call of the rows read (``fold_read_rows_triton``: one split launch and one
  merge launch over every row's cache row at its length, read on the device, capturable), or where there is none
  (the ``static`` engine off CUDA) one call of the read function per row and layer (its torch twin);
* proposals: the argmax of every row's slots (a DSpark Markov head: slot by slot, row by row).

It covers the reading modes of :data:`ROWS_MODES` (the other modes keep per-request state or tables one request
owns), greedy drafting without a confidence cut (:func:`rows_drafter_unsupported`); the batched rounds draft
anything else with :func:`~fold_hf.modeling.drafter_rows.propose_rows`, and say so once.
"""

from __future__ import annotations

import torch

from ..modeling.cache import FoldCache
from ..modeling.drafter import FoldDrafter
from .static_drafter import StaticDrafter, _View, preallocated_cache, static_drafter_unsupported

ROWS_MODES = ("fold", "window", "dflash", "rerope")


def rows_drafter_unsupported(drafter: FoldDrafter) -> str | None:
    """Why :class:`RowsDrafter` cannot draft for ``drafter`` as configured (None when it can)."""
    reason = static_drafter_unsupported(drafter)
    if reason is not None:
        return reason
    mode = drafter.fold_config.mode
    if mode not in ROWS_MODES:
        return (f"mode {mode!r} (the rows step covers {', '.join(ROWS_MODES)}; the others keep a selection or rope "
                f"tables of one request)")
    if drafter.confidence_threshold > 0:
        return "a DeepSpec confidence cut (each row would keep its own count of proposals)"
    return None


def row_cache(whole: FoldCache, drafter: FoldDrafter, row: int, request_length: int | None = None) -> FoldCache:
    """A :class:`FoldCache` over row ``row`` of ``whole`` (layers ``[batch, Hkv, capacity, Dh]``, from
    :func:`~fold_hf.generation.static_drafter.preallocated_cache` with ``rows=batch``): its layers hold views
    ``[1, Hkv, capacity, Dh]`` of that row (length 0), so what the prefill commits to it lands in ``whole``."""
    cache = drafter.new_cache(request_length=request_length)
    for layer, source in zip(cache.layers, whole.layers):
        layer.device, layer.is_initialized, layer.length = source.keys.device, True, 0
    view_row(cache, whole, row)
    return cache


def view_row(cache: FoldCache, whole: FoldCache, row: int) -> None:
    """Point the layers of ``cache`` (a :func:`row_cache`) at row ``row`` of ``whole``; their lengths stay."""
    for layer, source in zip(cache.layers, whole.layers):
        layer.keys, layer.values = source.keys[row : row + 1], source.values[row : row + 1]


class RowsDrafter(StaticDrafter):
    """The rows step (module docstring) of ``drafter`` over ``cache`` (:func:`preallocated_cache` with ``rows`` =
    the batch); ``read_function``, ``tables`` and ``layer_ops`` as for :class:`StaticDrafter`; ``rows_read``: a
    function with the contract of :func:`~fold_hf.kernels.fold_read.triton.fold_read_rows_triton` reading every
    row of a layer in one call, or None (one ``read_function`` call per row)."""

    def __init__(self, drafter: FoldDrafter, cache: FoldCache, read_function=None, tables=None,
                 layer_ops=None, rows_read=None) -> None:
        reason = rows_drafter_unsupported(drafter)
        if reason is not None:
            raise ValueError(f"the rows drafting step does not cover {reason}")
        super().__init__(drafter, cache, read_function, tables, layer_ops)
        self.batch = cache.layers[0].keys.shape[0]
        self.rows_read = rows_read

    @torch.no_grad()
    def move_row(self, source: int, dest: int, length: int) -> None:
        """Copy the first ``length`` entries (the committed ones) of cache row ``source`` into cache row ``dest``
        (the batched rounds' move of a running row, :meth:`fold_hf.targets.base.StaticTarget.move_row`)."""
        if not (0 <= source < self.batch and 0 <= dest < self.batch):
            raise ValueError(f"rows {source} and {dest}: not both rows of a {self.batch}-row cache")
        for layer in self.cache.layers:
            for buffer in (layer.keys, layer.values):
                buffer[dest, :, :length].copy_(buffer[source, :, :length])

    @torch.no_grad()
    def draft_rows(self, new_features: torch.Tensor, lengths: torch.Tensor, with_far: bool,
                   rows: tuple[int, ...]) -> torch.Tensor:
        """Commit each row's new context rows and draft one block per row; graph-capturable.

        Args:
            new_features: ``[A, R, n_taps * H]`` tapped features of each row's accepted tokens since its last draft
                (``R`` = proposals + 1; row ``a``'s first ``lengths[a, 1]`` count).
            lengths: long ``[A, 4]``, per row: entries committed before this round (d_len), rows of
                ``new_features`` to commit (d_new), the last committed token, the row's cache row.
            with_far: run the far branch (some row's context exceeds a window minus the block: :meth:`needs_far`);
                a row whose far memory is empty reads nothing from it.
            rows: the cache rows, ``lengths[:, 3]`` on the host (baked into a captured step: each row's read is its
                own call over its cache row); the batched rounds pass ``0 .. A-1``, their running rows, so they key
                the step by ``A`` alone.

        Returns:
            ``[A, R - 1]`` greedy proposals (long).
        """
        if len(rows) != lengths.shape[0] or max(rows) >= self.batch:
            raise ValueError(f"rows {rows} do not match lengths {tuple(lengths.shape)} of a {self.batch}-row cache")
        layers = self._layers if self.ops is None else self._layers_fused
        hidden = layers(self._rows_round(new_features, lengths, rows), with_far)
        return self._rows_tokens(hidden, lengths[:, 2])

    def _rows_round(self, new_features: torch.Tensor, lengths: torch.Tensor, rows: tuple[int, ...]) -> dict:
        """:meth:`_round` of ``A`` rows (the modes of :data:`ROWS_MODES`: true positions only): every tensor with a
        leading row axis, each row's read length its own."""
        drafter = self.drafter
        d_len, d_new, last, cache_rows = lengths.unbind(1)  # [A] each
        context_length = d_len + d_new
        true_positions = context_length[:, None] + self.block_offsets  # [A, B]
        cos, sin = self.plain_tables
        # the reads take their lengths as int32 (the kernels' type): converted once a round, not per row and layer
        views = {"true": _View((cos[true_positions], sin[true_positions]), context_length.to(torch.int32),
                               self.plain_tables)}
        return dict(entry_positions=d_len[:, None] + self.row_offsets, context=drafter.context_features(new_features),
                    hidden=drafter.embed_block(drafter.block_ids(last)).to(self.dtype),
                    row_scale=self._row_scale(true_positions), views=views, infllm=None, phase=None, rows=rows,
                    cache_rows=cache_rows, read_rows=cache_rows.to(torch.int32) if self.rows_read is not None else None)

    def _write(self, cache_layer, rnd: dict, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Row ``a``'s new entries ``keys`` / ``values [A, Hkv, R, Dh]`` at its entry positions ``[A, R]`` of its
        cache row: one scatter for all rows."""
        index = (rnd["cache_rows"][:, None], rnd["entry_positions"])
        cache_layer.keys.transpose(1, 2).index_put_(index, keys.transpose(1, 2))
        cache_layer.values.transpose(1, 2).index_put_(index, values.transpose(1, 2))

    def _read(self, query_near, query_far, keys, values, block_keys, block_values, view: _View, geometry,
              rnd: dict) -> torch.Tensor:
        """Each row's read of its cache row at its own length (queries ``[A, Hq, B, Dh]``, block ``[A, Hkv, B, Dh]``,
        cache ``[batch, Hkv, capacity, Dh]``); returns ``[A, B, Hq, Dh]``."""
        if self.rows_read is not None:  # every row in one call: its cache row and length read on the device
            return self.rows_read(query_near, query_far, keys, values, block_keys, block_values, *view.tables,
                                  view.length, view.length, rnd["read_rows"], geometry.window, geometry.alpha)
        outs = []
        for a, row in enumerate(rnd["rows"]):
            length = view.length[a : a + 1]
            far = query_far[a : a + 1] if query_far is not None else None
            outs.append(self.read(query_near[a : a + 1], far, keys[row : row + 1], values[row : row + 1],
                                  block_keys[a : a + 1], block_values[a : a + 1], *view.tables, length, length,
                                  geometry.window, geometry.alpha))
        return torch.cat(outs)

    def _rows_tokens(self, hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """Greedy proposals ``[A, R - 1]`` from the final-normed blocks ``[A, B, H]`` (the lm_head once over every
        row's slots; a Markov head chains each row's slots from its ``last [A]`` token)."""
        drafter = self.drafter
        base = drafter.proposal_logits(hidden[:, drafter.first_proposal_slot :])  # [A, R - 1, V]
        if getattr(drafter, "markov_head", None) is None:
            return drafter.pick_proposals(base, last)[0]
        return torch.stack([drafter.pick_proposals(base[a], last[a : a + 1])[0] for a in range(base.shape[0])])
