"""Rows of the Qwen3.5 runner (issue 35): the linear-attention state of every cache row, the Gated DeltaNet block
over ``A`` rows, and the acceptance that leaves each row's state at its own accepted position.

:class:`Qwen35Rows` is mixed into :class:`~fold_hf.targets.qwen35.Qwen35StaticTarget`. A runner of ``batch = B``
rows holds, per linear layer, a convolution window ``[B, C, K - 1]`` (model dtype) and a recurrent state
``[B, Hv, Dk, Dv]`` (fp32; fp64 for fp64 models), every layer's in one tensor; ``conv[i]`` / ``recurrent[i]`` are
row 0's (the one-row forwards: ``forward_static`` and the fused layers, which run at ``batch = 1`` only).

A host-length forward over cache rows ``rows`` (:meth:`~fold_hf.targets.base.StaticTarget.forward` with ``row=``,
:meth:`~fold_hf.targets.base.StaticTarget.forward_rows` over ``[A, L]``) runs each row's block from that row's
committed state and writes no state: for a block of at most :data:`FUSED_MAX_ROWS` tokens (a verify) each row's
Gated DeltaNet step is the fused verify (:func:`~fold_hf.kernels.gated_delta.naive.gated_delta_verify_reference`
and its Triton twin), which keeps the block's keys, decays, the writes ``d_t`` and raw projections in that row's
pending buffers; :meth:`Qwen35Rows.accept` then replays, for each row, the writes of its own accepted prefix into its
state (``S <- e^{g_t} S + k_t d_t^T``, the commit kernel on the row's ``[:, row]`` view of the all-layer states)
and shifts its convolution window. At the Qwen3.5-9B shape, 8 rows and 16-token blocks that is ~8 x 24 x 16 x 16 KiB
of writes a round instead of 8 x 24 x 16 states of 2 MiB (6.1 GiB) kept for a selection. A longer block keeps every
position's state (:func:`~fold_hf.kernels.gated_delta.default_gated_delta`) and accept copies the chosen one.
``accept(n)`` after a one-row forward (an int or a ``[1]`` device tensor), ``accept([n_0, .., n_{A-1}])`` after
``forward_rows`` (one count per row, in the order of its ``rows``). The rule is the one-row rule: the block's first
``n + 1`` tokens are kept, so the recurrent state is the one after block position ``n`` and the convolution window
the ``K - 1`` projections ending there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.gated_delta.naive import gated_delta_pending, l2norm

FUSED_MAX_ROWS = 64  # rows of one verify block whose writes are kept for the commit (the pending buffers' rows)


class Qwen35Rows:
    """The rows part of the Qwen3.5 runner (module docstring)."""

    batched_rows = True  # forward_rows: [A, L] rows, each from its own state at its own position (issue 35)
    _state_rows: tuple[int, ...] = (0,)  # the cache rows of the forward in progress (row 0 for a one-row forward)

    def _init_linear_states(self, full: list[bool]) -> None:
        """Allocate every linear layer's convolution and recurrent states, ``batch`` rows each (module docstring)."""
        B = self.batch
        self.linear_ids = [i for i, f in enumerate(full) if not f]
        n_linear = len(self.linear_ids)
        self._conv_rows_all = torch.zeros(n_linear, B, self.conv_dim, self.kernel - 1, device=self.device,
                                          dtype=self.dtype)
        self._recurrent_rows_all = torch.zeros(n_linear, B, self.num_v_heads, self.k_dim, self.v_dim,
                                               device=self.device, dtype=self.state_dtype)
        # row 0 of every layer in one tensor (contiguous at batch 1, the only batch the fused commit runs at)
        self._conv_all, self._recurrent_all = self._conv_rows_all[:, 0], self._recurrent_rows_all[:, 0]
        slot = {i: n for n, i in enumerate(self.linear_ids)}
        self.conv_rows = [None if f else self._conv_rows_all[slot[i]] for i, f in enumerate(full)]
        self.recurrent_rows = [None if f else self._recurrent_rows_all[slot[i]] for i, f in enumerate(full)]
        self.conv = [None if f else self._conv_all[slot[i]] for i, f in enumerate(full)]
        self.recurrent = [None if f else self._recurrent_all[slot[i]] for i, f in enumerate(full)]
        self._linear_slot = slot
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per-position states (blocks > 64)
        self._pending_rows: tuple[int, ...] = ()
        self._delta_rows: tuple[tuple[int, ...], int] | None = None  # (rows, L) of a verify awaiting its commit
        self._row_buffers: list[dict] | None = None  # each row's pending buffers (built on first use)
        self._pending_whole: dict | None = None  # the same, every row's: [B, NL, P, ...]
        self._delta_ops = None
        self._delta_rows_ops = False  # (verify, commit) of a batch's rows in one launch, None, or False: unresolved

    @staticmethod
    def _check_distinct_rows(rows) -> None:
        if len(set(rows)) != len(rows):
            raise ValueError(f"cache rows {list(rows)} repeat a row (each row's state advances once per forward)")

    def _drop_pending(self) -> None:
        """Forget whatever the last forward left for :meth:`accept` (a new forward or a prefill starts)."""
        self._pending.clear()
        self._delta_rows = None
        self._fused_pending = None

    def _gated_delta_ops(self):
        """The Gated DeltaNet verify and commit (:func:`~fold_hf.kernels.default_hybrid_ops`: Triton on CUDA, the
        torch twins elsewhere), resolved once; the fused layers' own when they have run."""
        if self._delta_ops is None:
            if self._hybrid_ops is not None:
                self._delta_ops = self._hybrid_ops
            else:
                from ..kernels import default_hybrid_ops

                self._delta_ops = default_hybrid_ops(self.device)
        return self._delta_ops

    def after_rows_step(self, rows, L: int) -> None:
        """:meth:`~fold_hf.targets.base.StaticTarget.after_rows_step`: the writes :meth:`accept` commits are those of
        cache rows ``rows`` (the running rows; a parked row's stay uncommitted, its state where it was)."""
        self._delta_rows = (tuple(int(r) for r in rows), int(L))

    def _pending_buffers(self) -> list[dict]:
        """Each cache row's buffers for the commit (:func:`~fold_hf.kernels.gated_delta.naive.gated_delta_pending`,
        :data:`FUSED_MAX_ROWS` rows per linear layer; views of one allocation, ~63 MB a row at the Qwen3.5-9B shape);
        row 0's are also the fused layers'."""
        if self._row_buffers is None:
            B, NL = self.batch, len(self.linear_ids)
            whole = gated_delta_pending(B * NL, FUSED_MAX_ROWS, self.num_k_heads, self.k_dim, self.num_v_heads,
                                        self.v_dim, self.conv_dim, self.dtype, self.state_dtype, self.device)
            self._pending_whole = {name: t.view(B, NL, *t.shape[1:]) for name, t in whole.items()}
            self._row_buffers = [{name: t[r] for name, t in self._pending_whole.items()} for r in range(B)]
        return self._row_buffers

    def _delta_rows_kernels(self):
        """``(gated_delta_verify_rows_triton, gated_delta_commit_rows_triton)``: a batch's rows of a Gated DeltaNet
        layer in one launch, their commit in one launch pair, where the Gated DeltaNet ops are the Triton kernels
        (CUDA) and ``$FOLD_HF_ROWS_KERNELS`` is not ``0``; else None (one launch per row)."""
        if self._delta_rows_ops is False:
            from ..kernels import import_triton_module, rows_kernels_enabled

            module = None
            if self._gated_delta_ops().backend == "triton" and rows_kernels_enabled():
                module = import_triton_module("gated_delta.triton")
            self._delta_rows_ops = None if module is None else (module.gated_delta_verify_rows_triton,
                                                                module.gated_delta_commit_rows_triton)
        return self._delta_rows_ops

    def _delta_verify(self, i: int, lin, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                      rows: tuple[int, ...]) -> torch.Tensor:
        """Linear layer ``i``'s Gated DeltaNet verify of ``qkv [A, L, C]``, ``b`` / ``a [A, L, Hv]`` (strided rows
        allowed), row ``n`` from cache row ``rows[n]``'s committed state into its pending buffers (the state is not
        written): the rows kernel in one launch (:meth:`_delta_rows_kernels`) or one launch per row. Returns
        ``[A, L, Hv, Dv]`` in the state dtype."""
        weight = lin.conv1d.weight.reshape(self.conv_dim, -1)
        slot = self._linear_slot[i]
        buffers = self._pending_buffers()
        kernels = self._delta_rows_kernels() if len(rows) > 1 else None
        if kernels is not None:
            return kernels[0](qkv, b, a, self.conv_rows[i], weight, lin.A_log, lin.dt_bias, self.recurrent_rows[i],
                              self._row_index(rows), self.num_k_heads, self.k_dim, self._pending_whole, slot)
        verify = self._gated_delta_ops().gated_delta_verify
        runs = [verify(qkv[n], b[n], a[n], self.conv_rows[i][r], weight, lin.A_log, lin.dt_bias,
                       self.recurrent_rows[i][r], self.num_k_heads, self.k_dim, buffers[r], slot)
                for n, r in enumerate(rows)]
        return runs[0][None] if len(runs) == 1 else torch.stack(runs)

    def row_tensors(self) -> list[tuple[torch.Tensor, int, bool]]:
        """:meth:`~fold_hf.targets.base.StaticTarget.row_tensors`: the attention layers' key and value caches, and
        every linear layer's convolution window and recurrent state (row axis 1 of the all-layer tensors; whole)."""
        return super().row_tensors() + [(self._conv_rows_all, 1, False), (self._recurrent_rows_all, 1, False)]

    def bytes_held(self) -> int:
        tensors = [t for t in self.keys + self.values if t is not None] + [self._conv_rows_all,
                                                                          self._recurrent_rows_all]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ------------------------------------------------------------------ host-length forwards over rows
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, start: int, taps_out: torch.Tensor | None = None,
                last_only: bool = False, row: int = 0) -> torch.Tensor:
        self._check_row(row)
        self._state_rows = (row,)
        try:
            return super().forward(input_ids, start, taps_out, last_only, row)
        finally:
            self._state_rows = (0,)

    @torch.no_grad()
    def forward_rows(self, input_ids: torch.Tensor, rows: list[int], starts: list[int],
                     taps_out: torch.Tensor | None = None) -> torch.Tensor:
        self._check_distinct_rows(rows)
        self._state_rows = tuple(int(r) for r in rows)
        try:
            return super().forward_rows(input_ids, rows, starts, taps_out)
        finally:
            self._state_rows = (0,)

    # ------------------------------------------------------------------ linear attention
    def _linear(self, i: int, layer, hidden: torch.Tensor) -> torch.Tensor:
        """Gated DeltaNet over the block ``hidden [A, L, H]`` of cache rows :attr:`_state_rows`, each from its
        committed state, which stays as it is until :meth:`accept` (module docstring). Returns ``[A, L, H]``."""
        rows = self._state_rows
        lin = layer.linear_attn
        A, L = hidden.shape[:2]
        qkv = lin.in_proj_qkv(hidden)  # [A, L, C]
        z = lin.in_proj_z(hidden)
        b = lin.in_proj_b(hidden)
        a = lin.in_proj_a(hidden)
        if L <= FUSED_MAX_ROWS:
            out = self._delta_verify(i, lin, qkv, b, a, rows)  # [A, L, Hv, Dv]
            self._delta_rows = (rows, L)
        else:
            out = self._linear_states(i, lin, qkv, b, a)
        out = lin.norm(out.to(hidden.dtype).reshape(-1, self.v_dim), z.reshape(-1, self.v_dim))
        return lin.out_proj(out.reshape(A, L, -1))

    def _linear_states(self, i: int, lin, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """A block longer than :data:`FUSED_MAX_ROWS` (``qkv [A, L, C]``, ``b`` / ``a [A, L, Hv]``): every row's
        state after every position kept pending for :meth:`accept` to copy. Returns ``[A, L, Hv, Dv]``."""
        from ..kernels.gated_delta import default_gated_delta

        if self._gated_delta is None:
            self._gated_delta = default_gated_delta(self.device)
        rows = self._state_rows
        A, L = qkv.shape[:2]
        cd = self.state_dtype
        # slices, not an index tensor: a one-row step stays capturable
        conv = self.conv_rows[i]
        committed = conv[rows[0] : rows[0] + 1] if A == 1 else torch.cat([conv[r : r + 1] for r in rows])
        window = torch.cat((committed, qkv.transpose(1, 2).to(self.dtype)), dim=2)  # [A, C, K - 1 + L]
        mixed = F.conv1d(window.to(lin.conv1d.weight.dtype), lin.conv1d.weight, groups=self.conv_dim)
        mixed = F.silu(mixed).transpose(1, 2).to(qkv.dtype)  # [A, L, C]
        kd = self.num_k_heads * self.k_dim
        q = mixed[..., :kd].reshape(A, L, self.num_k_heads, self.k_dim).to(cd)
        k = mixed[..., kd : 2 * kd].reshape(A, L, self.num_k_heads, self.k_dim).to(cd)
        v = mixed[..., 2 * kd :].reshape(A, L, self.num_v_heads, self.v_dim).to(cd)
        q = l2norm(q) * (self.k_dim ** -0.5)
        k = l2norm(k)
        beta = b.sigmoid().to(cd)
        g = (-lin.A_log.float().exp() * F.softplus(a.float() + lin.dt_bias)).to(cd)
        recurrent = self.recurrent_rows[i]
        runs = [self._gated_delta(q[n], k[n], v[n], g[n], beta[n], recurrent[r]) for n, r in enumerate(rows)]
        # window [A, C, K - 1 + L]; each row's states [L, Hv, Dk, Dv] as the kernel gave them (no stacked copy)
        self._pending[i] = (window, [s for _, s in runs])
        self._pending_rows = rows
        return runs[0][0][None] if A == 1 else torch.stack([o for o, _ in runs])

    @torch.no_grad()
    def accept(self, n) -> None:
        """Commit, for each row of the last forward, the state after its block position ``n`` (the accepted drafts:
        the block's first ``n + 1`` tokens are kept). ``n``: an int or a ``[1]`` long device tensor after a one-row
        forward; a list of ints, one per row, after :meth:`forward_rows`. After a verify block (fused or host-length)
        each row's accepted writes are replayed into its state (one launch for every layer, per row); after a longer
        block each row's kept per-position state is copied into its row."""
        if self._fused_pending is not None:
            if not isinstance(n, torch.Tensor):
                n = torch.tensor([int(n)], device=self.device)
            self._hybrid_ops.gated_delta_commit(n.reshape(1).to(self.device), self._delta_pending,
                                                self._fused_pending, self._recurrent_all, self._conv_all)
            self._fused_pending = None
            return
        if self._delta_rows is None and not self._pending:
            return
        if self._delta_rows is not None:
            rows, L = self._delta_rows
        else:
            rows, L = self._pending_rows, next(iter(self._pending.values()))[1][0].shape[0]
        if isinstance(n, torch.Tensor):  # on the device (a captured one-row step): no host read
            if len(rows) != 1:
                raise ValueError(f"accept takes one count per row of the last forward ({len(rows)}) as a list")
            counts, on_device = None, n.reshape(1).to(self.device)
        else:
            counts = [int(c) for c in n] if isinstance(n, (list, tuple)) else [int(n)]
            if len(counts) != len(rows):
                raise ValueError(f"{len(counts)} accepted counts for the {len(rows)} rows of the last forward")
            for a, c in enumerate(counts):
                if not 0 <= c < L:
                    raise ValueError(f"row {rows[a]}: {c} accepted drafts of a block of {L} tokens")
        if self._delta_rows is not None:
            if counts is not None:
                on_device = torch.tensor(counts, device=self.device)
            buffers = self._pending_buffers()
            kernels = self._delta_rows_kernels() if len(rows) > 1 else None
            if kernels is not None:  # every row in one launch pair
                kernels[1](on_device, self._pending_whole, L, self._recurrent_rows_all, self._conv_rows_all,
                           self._row_index(rows))
            commit = self._gated_delta_ops().gated_delta_commit
            for a, row in enumerate(rows if kernels is None else ()):  # the row's [:, row] views of the states
                commit(on_device[a : a + 1], buffers[row], L, self._recurrent_rows_all[:, row],
                       self._conv_rows_all[:, row])
            self._delta_rows = None
            return
        K1 = self.kernel - 1
        if counts is None:
            columns = on_device + 1 + torch.arange(K1, device=self.device)
            for i, (window, states) in self._pending.items():
                self.conv_rows[i][rows[0]].copy_(window[0].index_select(1, columns))
                self.recurrent_rows[i][rows[0]].copy_(states[0].index_select(0, on_device)[0])
        else:
            for i, (window, states) in self._pending.items():
                for a, (row, c) in enumerate(zip(rows, counts)):
                    self.conv_rows[i][row].copy_(window[a, :, c + 1 : c + 1 + K1])
                    self.recurrent_rows[i][row].copy_(states[a][c])
        self._pending.clear()

    def step_state(self) -> list[torch.Tensor]:
        """The committed convolution and recurrent states (every row): a verify reads them and :meth:`accept`
        overwrites them."""
        return [t for t in self.conv_rows + self.recurrent_rows if t is not None]
