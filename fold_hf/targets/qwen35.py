"""The Qwen3.5 target family on the fast loop: config fields, layers and the verify step with per-position states.

Qwen3.5 (``Qwen3_5ForCausalLM``, ``model_type`` ``qwen3_5_text``; the dense text model) interleaves Gated
DeltaNet linear-attention layers with a full-attention layer every fourth (``config.layer_types``:
``"linear_attention"`` / ``"full_attention"``, from ``full_attention_interval`` = 4). What the fast loop reads
from the model, all its own modules and weights (PEFT included):

* config: ``layer_types``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
  ``linear_num_key_heads`` (Hk), ``linear_num_value_heads`` (Hv), ``linear_key_head_dim`` (Dk),
  ``linear_value_head_dim`` (Dv), ``linear_conv_kernel_dim`` (K), ``hidden_act`` (silu), ``rope_parameters``
  (``partial_rotary_factor`` 0.25, ``mrope_section``: text positions are equal in every section, so the rope is
  the plain partial rope of the table ``rotary_emb`` computes);
* full-attention layer ``self_attn``: ``q_proj`` (``[2 * Hq * D, H]``: query and output gate interleaved per
  head), ``k_proj``, ``v_proj``, ``q_norm`` / ``k_norm`` (zero-centred RMSNorm over D), ``o_proj``; output
  ``o_proj(attn * sigmoid(gate))``;
* linear layer ``linear_attn``: ``in_proj_qkv`` (``[2 * Hk * Dk + Hv * Dv, H]``), ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``, ``conv1d`` (depthwise, kernel K, no bias), ``A_log``, ``dt_bias``, ``norm`` (gated RMSNorm over
  Dv), ``out_proj``; per token: causal depthwise conv + silu over the qkv projection, L2-normed q and k (q scaled
  by ``Dk ** -0.5``), ``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)``, the gated delta rule
  (:mod:`fold_hf.kernels.gated_delta`), ``out_proj(norm(o, z))``;
* both: ``input_layernorm``, ``post_attention_layernorm``, ``mlp`` (the module), final ``norm``, ``lm_head``.

State per linear layer: the convolution window (the last ``K - 1`` qkv projections, model dtype) and the
recurrent state ``[Hv, Dk, Dv]`` (fp32; fp64 for fp64 models). The verify step computes the state after *every*
block position (the convolution windows are slices of one ``[C, K - 1 + L]`` buffer, the recurrent states come
out of the kernel) and :meth:`Qwen35StaticTarget.accept` copies the accepted position's into place, on the device,
inside the captured verify graph: a rejection costs no replay and no host read. The prompt is prefilled through
the model's own forward (transformers' cache and kernels, chunked) and its states copied in. A runner of ``batch``
rows keeps these states per row and takes batched rounds (:mod:`fold_hf.targets.qwen35_rows`: ``forward_rows``, and
``accept`` with one count per row).

Fused layers (:meth:`Qwen35StaticTarget._forward_static_fused`, the fast loop's default on CUDA): the projections
as the Llama family runs them (:mod:`fold_hf.targets.weight_layout`, :meth:`~Qwen35StaticTarget.merged_projections`):
a linear layer's ``in_proj_qkv|in_proj_z|in_proj_b|in_proj_a``, a full-attention layer's q|k|v and the MLP's gate|up
each one GEMM over a buffer the model's parameters are views of, a step's products of 1 to 16 rows through the
skinny Triton GEMMs on CUDA (gate|up ending in ``silu(gate) * up``), more rows cuBLAS, an AR step in ``pdl_scope``;
a PEFT / quantized projection runs as its module, warned once; the lm_head and the MoE block stay the modules. The
rest runs as fused kernels (:mod:`fold_hf.kernels.hybrid.triton`, :mod:`fold_hf.kernels.gated_delta.triton`; torch
twins off CUDA); the Gated DeltaNet verify writes no state, keeps the block's prepared inputs, and
:meth:`~Qwen35StaticTarget.accept` re-runs the accepted prefix from the committed state for every linear layer in
one launch: in bytes cheaper than writing every position's state and selecting one for any block of two or more
rows (the arithmetic at the 9B shape: docs/targets-qwen35.md).

The same runner takes the MoE variant and the multimodal wrappers (text-only ids):

* ``Qwen3_5MoeForCausalLM``: the cache is dense Qwen3.5's; only the MLP differs: every layer's ``mlp`` is a
  ``Qwen3_5MoeSparseMoeBlock``: a router ``gate`` (``softmax`` in fp32 over ``E`` experts, top-k, the k weights
  renormalised to sum to 1; the model's own module), the routed experts (stacked ``gate_up_proj [E, 2 I, H]`` /
  ``down_proj [E, H, I]``, run by :func:`~fold_hf.targets.moe.stacked_experts`: gather by the device
  indices + batched matmuls, no host read, fixed shapes) and a shared expert (the model's MLP module) scaled by
  ``sigmoid(shared_expert_gate(x))``: ``mlp(x) = experts(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)``.
* ``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration``: the config nests the text model's
  fields in ``config.text_config``; the text decoder is ``model.model.language_model`` (a ``Qwen3_5TextModel``, whose
  layers the drafter's ``target_layer_ids`` index), ``lm_head`` is the wrapper's. For text-only ids the wrapper's
  multimodal rope has all three position streams equal to the 1-D position (what its ``generate`` computes for a
  text prompt, rope deltas 0), so the runner is the text model's; the prefill passes the 1-D positions explicitly so
  that rope deltas left on the wrapper by an earlier multimodal call cannot shift them. Images and videos are not
  taken by the fast loop (``fast_generate`` takes token ids only; ``target.generate`` with ``pixel_values`` runs
  transformers' loop, saying why).

Not covered (``check`` says so): activations other than silu, experts stored in another layout
(:func:`~fold_hf.targets.moe.experts_unsupported`).
"""

from __future__ import annotations

import torch

from ..compat import has_norm_epsilon, norm_epsilon
from ..modeling.rope import compute_dtype
from .base import StaticTarget, UnsupportedTarget
from .common import HybridFusedOps, tap_writer, wrapped_text_parts
from .moe import experts_unsupported, stacked_experts
from .qwen35_rows import FUSED_MAX_ROWS, Qwen35Rows
from .taps import HiddenTaps, _unwrap
from .weight_layout import MergedLinears, decode_gemm, gated_mlp, merged_linears, project

# the multimodal wrappers: text config in config.text_config, text decoder at model.model.language_model
WRAPPERS = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM") + WRAPPERS
# the norms the fused kernels compute (the MoE variant's classes are the same code under another name, 5.24)
NORMS = ("Qwen3_5RMSNorm", "Qwen3_5MoeRMSNorm")
GATED_NORMS = ("Qwen3_5RMSNormGated", "Qwen3_5MoeRMSNormGated")
LAYER_TYPES = ("linear_attention", "full_attention")


def text_parts(model):
    """(text config, text decoder) of a Qwen3.5 causal LM or of its multimodal wrapper; raises
    :class:`UnsupportedTarget` on an unexpected layout."""
    return wrapped_text_parts(model, WRAPPERS)


def prepare_text_request(model) -> None:
    """A text-only request through the wrapper's own forward: drop the rope deltas its last image request left on it.
    ``Qwen3_5Model.forward`` adds ``model.model.rope_deltas`` to the positions of every call with a non-empty cache,
    so a text request after an image request would read shifted positions after its first forward; transformers'
    ``generate`` resets them (to 0) for a text prompt, and so does this (to None: the text model's own positions)."""
    inner = getattr(model, "model", None)
    if type(model).__name__ in WRAPPERS and getattr(inner, "rope_deltas", None) is not None:
        inner.rope_deltas = None


def _is_sparse_moe(mlp) -> bool:
    return all(hasattr(mlp, name) for name in ("gate", "experts", "shared_expert", "shared_expert_gate"))


def _moe_unsupported(mlp) -> str | None:
    """Why :meth:`Qwen35StaticTarget._sparse_moe` cannot run this MLP, or None."""
    router = mlp.gate
    if not isinstance(getattr(router, "weight", None), torch.Tensor) or not hasattr(router, "top_k"):
        return f"router {type(router).__name__} is not a top-k router with a weight"
    reason = experts_unsupported(mlp.experts)
    if reason is not None:
        return reason
    gate = mlp.shared_expert_gate
    if getattr(gate, "out_features", None) != 1:
        return f"shared_expert_gate {type(gate).__name__} does not give one gate per token"
    return None


def check(model, capacity: int | None = None) -> None:
    """Raise :class:`UnsupportedTarget` when :class:`Qwen35StaticTarget` cannot run ``model``."""
    name = type(model).__name__
    config, decoder = text_parts(model)
    types = list(getattr(config, "layer_types", None) or [])
    if len(types) != len(decoder.layers) or any(t not in LAYER_TYPES for t in types):
        raise UnsupportedTarget(f"{name}: config.layer_types {types} must list {LAYER_TYPES} per layer")
    if "full_attention" not in types:
        raise UnsupportedTarget(f"{name} has no full-attention layer")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedTarget(f"{name}: hidden_act {config.hidden_act!r}; the linear layers' step uses silu")
    rope_type = getattr(decoder.rotary_emb, "rope_type", "default")
    if rope_type != "default":
        raise UnsupportedTarget(f"{name}: rope_type {rope_type!r}; the fast loop needs a fixed rope table")
    for i, layer in enumerate(decoder.layers):
        if types[i] == "linear_attention" and getattr(layer.linear_attn.conv1d, "bias", None) is not None:
            raise UnsupportedTarget(f"{name}: layer {i} conv1d has a bias")
        if _is_sparse_moe(layer.mlp):
            reason = _moe_unsupported(layer.mlp)
            if reason is not None:
                raise UnsupportedTarget(f"{name}: layer {i} MoE block: {reason}")


class Qwen35StaticTarget(Qwen35Rows, HybridFusedOps, StaticTarget):
    """:class:`~fold_hf.targets.base.StaticTarget` for Qwen3.5 (same interface; ``batch`` rows: :class:`Qwen35Rows`).

    Attention layers keep ``[batch, Hkv, capacity, D]`` key/value buffers (``None`` at linear layers); linear layers
    keep ``conv_rows[i] [batch, C, K - 1]`` and ``recurrent_rows[i] [batch, Hv, Dk, Dv]`` (``conv[i]`` /
    ``recurrent[i]``: row 0's). Every forward over a block leaves its per-position states pending until
    :meth:`accept` selects one per row.
    """

    def __init__(self, target, capacity: int, tap_layer_ids=(), batch: int = 1) -> None:
        model = _unwrap(target)
        check(model, capacity)
        config, decoder = text_parts(model)
        self._setup(model, config, decoder, capacity, tap_layer_ids, batch)  # config: a wrapper's config.text_config
        self.layer_types = list(config.layer_types)
        attn = next(layer.self_attn for layer, t in zip(self.layers, self.layer_types) if t == "full_attention")
        self.num_heads = self.local_heads(config.num_attention_heads, "query heads")
        self.num_kv_heads = self.local_heads(config.num_key_value_heads, "KV heads")
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.state_dtype = compute_dtype(self.dtype)
        import sys

        module = sys.modules[type(attn).__module__]
        self._apply_rope = module.apply_rotary_pos_emb
        shape = (self.batch, self.num_kv_heads, self.capacity, self.head_dim)
        full = [t == "full_attention" for t in self.layer_types]
        self.keys = [torch.zeros(shape, device=self.device, dtype=self.dtype) if f else None for f in full]
        self.values = [torch.zeros(shape, device=self.device, dtype=self.dtype) if f else None for f in full]
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_dim = config.linear_key_head_dim
        self.v_dim = config.linear_value_head_dim
        self.kernel = config.linear_conv_kernel_dim
        self.conv_dim = 2 * self.num_k_heads * self.k_dim + self.num_v_heads * self.v_dim
        # every linear layer's states in one tensor (views per layer), so the fused commit is one launch
        self._init_linear_states(full)
        self._fused_pending = None  # rows of the last fused verify whose inputs wait for accept()
        self._rows_kernels = False  # the rows' attention kernels of a batch's verify: resolved by _rows_attention
        self._delta_pending = None  # the fused path's buffers (built on its first use)
        self._hybrid_ops = None
        with torch.no_grad():
            # text positions: the same in the three mrope sections ([3, 1, capacity], as 5.17 and 5.24 both take)
            positions = torch.arange(self.capacity, device=self.device).expand(3, 1, self.capacity)
            probe = torch.empty(1, 1, self.head_dim, device=self.device, dtype=self.dtype)
            cos, sin = self.decoder.rotary_emb(probe, positions)
        self.cos, self.sin = cos.reshape(-1, self.capacity, cos.shape[-1])[0], sin.reshape(
            -1, self.capacity, sin.shape[-1])[0]  # [capacity, rotary dims]
        self._gated_delta = None

    def keep_queries_unsupported(self) -> str | None:
        """The default device-length forward keeps the queries through its ``attend`` (this family's
        :meth:`_run_layers` calls it with the rotated queries) and the fused forward copies them itself."""
        return None

    def fused_unsupported(self) -> str | None:
        from ..kernels.layer.naive import is_silu

        norms = [self.final_norm] + [n for layer in self.layers
                                     for n in (layer.input_layernorm, layer.post_attention_layernorm)]
        for i, layer in enumerate(self.layers):
            if self.layer_types[i] == "full_attention":
                norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
                if norm_epsilon(layer.self_attn.q_norm) != norm_epsilon(layer.self_attn.k_norm):
                    return f"layer {i}: q_norm and k_norm have different eps"
            else:
                gated = layer.linear_attn.norm
                if type(gated).__name__ not in GATED_NORMS or not has_norm_epsilon(gated):
                    return f"layer {i}: gated norm {type(gated).__name__} is not transformers' Qwen3_5RMSNormGated"
                if gated.weight.dtype != self.dtype or getattr(gated, "activation", "silu") != "silu":
                    return f"layer {i}: gated norm in {gated.weight.dtype} / {getattr(gated, 'activation', None)}"
            mlp = layer.mlp
            if _is_sparse_moe(mlp):
                continue  # the MoE step runs on the modules and stacked_experts, in the fused path too
            if not all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
                return f"MLP {type(mlp).__name__} is not gate/up/down"
            if not is_silu(mlp.act_fn):
                return f"MLP activation {type(mlp.act_fn).__name__} is not SiLU"
        for norm in norms:
            if type(norm).__name__ not in NORMS or not has_norm_epsilon(norm):
                return f"norm {type(norm).__name__} is not Qwen3.5's zero-centred RMSNorm"
            if norm.weight.dtype != self.dtype:
                return f"norm weights in {norm.weight.dtype}, activations in {self.dtype}"
        if self.cos.shape[-1] % 2:
            return f"odd rotary width {self.cos.shape[-1]}"
        return None

    # ------------------------------------------------------------------ MLP / MoE
    def _mlp(self, layer, normed: torch.Tensor) -> torch.Tensor:
        """The layer's MLP of ``normed [1, L, H]``: the module (dense), or :meth:`_sparse_moe`."""
        if _is_sparse_moe(layer.mlp):
            return self._sparse_moe(layer.mlp, normed)
        return layer.mlp(normed)

    @staticmethod
    def _sparse_moe(mlp, hidden: torch.Tensor) -> torch.Tensor:
        """``Qwen3_5MoeSparseMoeBlock`` of ``hidden [1, L, H]`` as a capturable step: the model's router, shared
        expert and shared gate modules, the routed experts by :func:`~fold_hf.targets.moe.stacked_experts`
        (no host read: the experts are gathered by the router's device indices). Same order of operations as the
        model: ``experts(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)``."""
        x = hidden.reshape(-1, hidden.shape[-1])
        shared = mlp.shared_expert(x)
        _, weights, index = mlp.gate(x)
        routed = stacked_experts(mlp.experts, x, index, weights)
        shared = torch.sigmoid(mlp.shared_expert_gate(x)) * shared
        return (routed + shared).reshape(hidden.shape)

    # ------------------------------------------------------------------ fused layers
    def _forward_static_fused(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                              taps_out: torch.Tensor | None) -> torch.Tensor:
        """``forward_static`` with the decode kernel and the fused ops of :mod:`fold_hf.kernels.hybrid.triton`
        (torch twins off CUDA) over ``input_ids [1, L]`` at ``positions [L]``. Linear layers run their input
        projections as one GEMM, one fused Gated DeltaNet kernel (conv, norms, gates, delta rule; no state written)
        and the fused gated norm; the block's inputs wait in the pending buffers for :meth:`accept`. An AR step (one
        token) launches its Triton kernels that take it with programmatic dependent launch
        (:func:`fold_hf.kernels.common.pdl_scope`), as the Llama family's. Returns logits ``[L, V]``."""
        from ..kernels.common import pdl_scope

        self._fused_ops_ready()
        L = input_ids.shape[1]
        if L > FUSED_MAX_ROWS:
            raise ValueError(f"a fused Qwen3.5 step takes at most {FUSED_MAX_ROWS} rows, got {L}")
        with pdl_scope(L == 1):
            return self._fused_layers(input_ids, positions, bucket, taps_out)

    def merged_projections(self, i: int) -> tuple[MergedLinears | None, MergedLinears | None]:
        """Layer ``i``'s (input projections, gate|up) as one GEMM each (:func:`~fold_hf.targets.weight_layout.
        merged_linears`; the first call lays the weights out, nothing is held twice): a linear layer's
        ``in_proj_qkv|in_proj_z|in_proj_b|in_proj_a`` (``[C + Hv Dv + 2 Hv, H]``), a full-attention layer's q|k|v
        (``[2 Hq D + 2 Hkv D, H]``, q with its interleaved output gate); gate|up ``[2 I, H]`` (None for the MoE
        block). None where a projection is not a plain Linear in the model dtype (PEFT, quantized: warned once, the
        layer runs its modules) or ``$FOLD_HF_CONCAT_PROJECTIONS=0``."""
        layer = self.layers[i]
        if self.layer_types[i] == "linear_attention":
            lin = layer.linear_attn
            names, owner, tag = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"), lin, "qkvzba"
        else:
            names, owner, tag = ("q_proj", "k_proj", "v_proj"), layer.self_attn, "qkv"
        inputs = merged_linears({name: getattr(owner, name) for name in names}, self.dtype, tag)
        mlp = layer.mlp
        gate_up = None if _is_sparse_moe(mlp) else merged_linears(
            {"gate_proj": mlp.gate_proj, "up_proj": mlp.up_proj}, self.dtype, "gate_up")
        return inputs, gate_up

    def forward_rows_static(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: list[int], bucket: int,
                            taps_out: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`~fold_hf.targets.base.StaticTarget.forward_rows_static`: the fused layers over ``input_ids [A, L]``
        at ``positions [A, L]`` (device), row ``a`` in cache row ``rows[a]`` (:meth:`_fused_layers`); each row's
        Gated DeltaNet writes wait in that row's pending buffers for :meth:`accept` (one count per running row: the
        rows :meth:`after_rows_step` names, all of them by default). Returns logits ``[A, L, V]``."""
        self._check_distinct_rows(rows)
        self._check_rows_step(input_ids, positions, rows, bucket)
        L = input_ids.shape[1]
        if L > FUSED_MAX_ROWS:
            raise ValueError(f"a fused Qwen3.5 step takes at most {FUSED_MAX_ROWS} rows, got {L}")
        self._fused_ops_ready()
        with torch.no_grad():
            return self._fused_layers(input_ids, positions, bucket, taps_out, rows=tuple(int(r) for r in rows))

    def _fused_ops_ready(self) -> None:
        """:meth:`~fold_hf.targets.common.HybridFusedOps._fused_ops_ready`, and row 0's pending buffers as the one-row
        step's."""
        super()._fused_ops_ready()
        if self._delta_pending is None:
            self._delta_pending = self._pending_buffers()[0]

    def _rows_attention(self):
        """``(head_norm_rope_write_rows_triton, decode_attention_rows_triton)``: the full-attention layers' q / k
        norms, rope and cache writes of a batch's rows in one launch and their attention in one launch pair, where
        the Triton kernels run (CUDA; ``$FOLD_HF_ROWS_KERNELS`` not ``0``), else None (per row)."""
        return self._rows_kernels_of(("hybrid.triton", "head_norm_rope_write_rows_triton"))

    def _fused_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int,
                      taps_out: torch.Tensor | None, rows: tuple[int, ...] | None = None) -> torch.Tensor:
        """The fused layers of :meth:`_forward_static_fused` (``input_ids [1, L]`` at ``positions [L]``, the
        one-row runner's row 0; logits ``[L, V]``) and of :meth:`forward_rows_static` (``input_ids [A, L]`` at
        ``positions [A, L]``, row ``a`` in cache row ``rows[a]``; logits ``[A, L, V]``), their checks done. The
        embedding, projections, norms, MLP and lm_head run once over the ``A * L`` tokens (1 to ``skinny_rows`` of
        them through the skinny GEMMs where the device has them, more through cuBLAS:
        :func:`~fold_hf.targets.weight_layout.decode_gemm`, the Llama family's rule); each row's Gated DeltaNet
        verify (from its committed state, into its pending buffers), and its norm-rope-write and decode attention
        at its own context length (its first position, read on the device) are what that row runs alone: on CUDA
        one launch (pair) per layer for all rows (the row-axis kernels), else one per row."""
        ops, layer_ops, decode = self._hybrid_ops, self._layer_ops, self._decode_attention
        A, L = input_ids.shape
        one = rows is None
        rows = (0,) if one else rows
        # a batch's verify on CUDA: every row's attention of a layer in one launch pair, cache rows read on the device
        rows_attention = self._rows_attention() if A > 1 else None
        if rows_attention is not None:
            row_index, row_lengths = self._row_index(rows), positions[:, 0].to(torch.int32)
        else:  # one row's launches after another: each row's positions [L] and context length, on the device
            row_positions = [positions] if one else [positions[a] for a in range(A)]
            lengths = [p[:1].to(torch.int32) for p in row_positions]
        tap = tap_writer(self.tap_layer_ids, self.config.hidden_size, taps_out)
        skinny = decode_gemm(layer_ops, A * L)

        self._drop_pending()
        hidden = self.embed(input_ids)
        delta = None
        D = self.head_dim
        for i, layer in enumerate(self.layers):
            norm = layer.input_layernorm
            hidden, normed = ops.residual_norm(hidden, delta, norm.weight, norm_epsilon(norm), 1.0)
            if i > 0:
                tap(i - 1, hidden)
            inputs, gate_up = self.merged_projections(i)
            if self.layer_types[i] == "linear_attention":
                lin = layer.linear_attn
                if inputs is not None:  # one GEMM; qkv, z, b and a are strided views of its rows, read in place
                    qkv, z, b, a = inputs(normed, skinny)
                else:
                    qkv, z, b, a = (m(normed) for m in (lin.in_proj_qkv, lin.in_proj_z, lin.in_proj_b,
                                                        lin.in_proj_a))
                if one:  # the one-row runner's row 0 (its pending buffers are the captured AR step's)
                    out = ops.gated_delta_verify(qkv[0], b[0], a[0], self.conv[i], lin.conv1d.weight.reshape(
                        self.conv_dim, -1), lin.A_log, lin.dt_bias, self.recurrent[i], self.num_k_heads, self.k_dim,
                        self._delta_pending, self._linear_slot[i])
                else:  # each row from its own state (one launch for all rows on CUDA)
                    out = self._delta_verify(i, lin, qkv, b, a, rows)
                z = z.reshape(A * L, self.num_v_heads, self.v_dim)
                out = ops.gated_rms_norm(out.reshape(A * L, self.num_v_heads, self.v_dim), z, lin.norm.weight,
                                         norm_epsilon(lin.norm))
                delta = project(skinny, lin.out_proj, out.reshape(A, L, -1))
            else:
                attn = layer.self_attn
                if inputs is not None:
                    both, k, v = inputs(normed, skinny)
                else:
                    both, k, v = attn.q_proj(normed), attn.k_proj(normed), attn.v_proj(normed)
                both = both.view(A, L, self.num_heads, 2 * D)
                query, gate = both[..., :D], both[..., D:]
                k = k.view(A, L, self.num_kv_heads, D)
                v = v.view(A, L, self.num_kv_heads, D)
                if rows_attention is not None:  # every row's norms, rope, cache writes, then attention, at once
                    head_rows, decode_rows = rows_attention
                    q, kn, vn = head_rows(query, k, v, attn.q_norm.weight, attn.k_norm.weight,
                                          norm_epsilon(attn.q_norm), 1.0, self.cos, self.sin, positions, self.keys[i],
                                          self.values[i], row_index)
                    out = decode_rows(q, self.keys[i], self.values[i], kn, vn, row_lengths, row_index,
                                      scaling=self.scaling, max_context_length=bucket)  # [A, L, Hq, D]
                else:
                    outs = []
                    for n, r in enumerate(rows):
                        here = slice(r, r + 1)
                        keys, values = self.keys[i][here], self.values[i][here]
                        q, kn, vn = ops.head_norm_rope_write(query[n : n + 1], k[n : n + 1], v[n : n + 1],
                                                             attn.q_norm.weight, attn.k_norm.weight,
                                                             norm_epsilon(attn.q_norm), 1.0, self.cos, self.sin,
                                                             row_positions[n], keys, values)
                        if self.query_keep is not None and i == self.query_keep[0]:  # cmr only (one row)
                            self.query_keep[1][:, :, :L].copy_(q)
                        outs.append(decode(q, keys, values, kn, vn, lengths[n], scaling=self.scaling,
                                           max_context_length=bucket))  # [1, L, Hq, D]
                    out = outs[0] if A == 1 else torch.cat(outs)
                delta = project(skinny, attn.o_proj, ops.sigmoid_mul(out, gate).reshape(A, L, -1))
            norm = layer.post_attention_layernorm
            hidden, normed = ops.residual_norm(hidden, delta, norm.weight, norm_epsilon(norm), 1.0)
            mlp = layer.mlp
            if _is_sparse_moe(mlp):
                delta = self._sparse_moe(mlp, normed)
            else:  # with the skinny GEMMs gate|up and silu(gate) * up are one launch
                delta = gated_mlp(mlp, normed, gate_up, skinny, layer_ops.silu_mul, layer_ops.gate_up_silu)
        hidden, normed = ops.residual_norm(hidden, delta, self.final_norm.weight, norm_epsilon(self.final_norm),
                                           1.0)
        tap(len(self.layers) - 1, normed)  # the last layer's tap is after the final norm, as HiddenTaps gives it
        if one:
            self._fused_pending = L
            return self.lm_head(normed)[0]
        self._delta_rows = (rows, L)
        return self.lm_head(normed)

    # ------------------------------------------------------------------ layers
    def _run_layers(self, input_ids, cos, sin, write_kv, attend, taps_out, last_only):
        """:meth:`StaticTarget._run_layers` over ``input_ids [A, L]`` (``A`` > 1: :meth:`forward_rows`, rope rows
        ``[A, L, d]``; the linear layers run the rows' own states, :meth:`_linear`). Returns logits ``[L, V]`` (or
        ``[1, V]`` with ``last_only``), ``[A, L, V]`` for ``A > 1``."""
        hidden = self.embed(input_ids)
        A, L = input_ids.shape
        if cos.dim() == 2:
            cos, sin = cos[None], sin[None]
        tap = tap_writer(self.tap_layer_ids, hidden.shape[-1], taps_out)
        last_layer = len(self.layers) - 1
        self._drop_pending()
        for i, layer in enumerate(self.layers):
            residual = hidden
            normed = layer.input_layernorm(hidden)
            if self.layer_types[i] == "linear_attention":
                hidden = residual + self._linear(i, layer, normed)
            else:
                attn = layer.self_attn
                query, gate = torch.chunk(attn.q_proj(normed).view(A, L, -1, 2 * self.head_dim), 2, dim=-1)
                gate = gate.reshape(A, L, -1)
                q = attn.q_norm(query).transpose(1, 2)
                k = attn.k_norm(attn.k_proj(normed).view(A, L, -1, self.head_dim)).transpose(1, 2)
                v = attn.v_proj(normed).view(A, L, -1, self.head_dim).transpose(1, 2)
                q, k = self._apply_rope(q, k, cos, sin)
                write_kv(i, k, v)
                out = attend(i, q).transpose(1, 2).reshape(A, L, -1)
                hidden = residual + attn.o_proj(out * torch.sigmoid(gate))
            hidden = hidden + self._mlp(layer, layer.post_attention_layernorm(hidden))
            if taps_out is not None and i in self.tap_layer_ids:
                tap(i, self.final_norm(hidden) if i == last_layer else hidden)
        hidden = self.final_norm(hidden[:, -1:] if last_only else hidden)
        logits = self.lm_head(hidden)
        return logits[0] if A == 1 else logits

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, chunk: int | None = None, on_taps=None,
                row: int = 0) -> torch.Tensor:
        """The prompt ``[1, P]`` through the model's own forward (transformers' cache and kernels), ``chunk``
        tokens at a time (None: :meth:`prefill_chunk`, here 8,192); its keys, values, convolution and
        recurrent states are then copied into the static buffers. ``on_taps(features [1, c, n_taps * H], start)``
        per chunk. Returns the last logits ``[V]``.
        ``row``: the cache row filled (its attention entries and linear states; the other rows are left alone).

        Every chunk gets its 1-D positions explicitly (the text model expands them to its rope streams, as for no
        ``position_ids``): a multimodal wrapper would otherwise add the rope deltas an earlier image request left on
        it to the chunks after the first."""
        self._check_row(row)
        import inspect

        from transformers import DynamicCache

        P = input_ids.shape[1]
        if P > self.capacity:
            raise ValueError(f"{P} tokens exceed the cache capacity {self.capacity}")
        chunk = chunk or self.prefill_chunk()  # the module path's: PREFILL_CHUNK
        params = set(inspect.signature(self.model.forward).parameters)
        cache_name = "cache" if "cache" in params else "past_key_values"
        cache = DynamicCache(config=self.model.config)
        taps = HiddenTaps(self.model, self.tap_layer_ids, device=self.device) if (
            on_taps is not None and self.num_taps) else None
        logits = None
        for start in range(0, P, chunk):
            piece = input_ids[:, start : start + chunk]
            kw = {cache_name: cache, "use_cache": True, "logits_to_keep": 1,
                  "position_ids": torch.arange(start, start + piece.shape[1], device=piece.device)[None]}
            if taps is not None:
                with taps:
                    out = self.model(input_ids=piece, **kw)
                on_taps(taps.features().to(self.dtype), start)
            else:
                out = self.model(input_ids=piece, **kw)
            logits = out.logits[0, -1]
        for i, layer in enumerate(cache.layers):
            if self.layer_types[i] == "full_attention":
                self.keys[i][row : row + 1, :, :P] = layer.keys
                self.values[i][row : row + 1, :, :P] = layer.values
            else:
                conv = layer.conv_states[0][0]  # [C, K'] (K' = K, zero-padded on the left for short prompts)
                tail = conv[:, -(self.kernel - 1):]
                self.conv_rows[i][row].zero_()
                self.conv_rows[i][row][:, self.kernel - 1 - tail.shape[1]:] = tail
                self.recurrent_rows[i][row].copy_(layer.recurrent_states[0][0])
        self._drop_pending()
        self.length = P
        return logits


__all__ = ["ARCHITECTURES", "WRAPPERS", "Qwen35StaticTarget", "check", "prepare_text_request", "text_parts"]
