"""The drafter layer, stated once: norms, q/k/v projections with their q/k norms, the attention call through a
read the caller gives, o_proj, the MLP and the residuals (pre-norm, or Gemma-4-style sandwich norms).

Every drafter path runs its layers through :class:`DrafterLayer`'s forward: :meth:`FoldDrafter.forward
<fold_hf.modeling.drafter.FoldDrafter.forward>` (a planned read of a growing :class:`~fold_hf.modeling.cache.FoldCache`),
:class:`~fold_hf.generation.static_drafter.StaticDrafter`'s captured step (device-length reads of preallocated
buffers) and the training forward (:mod:`fold_hf.training`); they differ only in the read they pass. Family
differences (k_eq_v values, sandwich norms, per-layer MLP widths, a fixed logit scale) are config fields read here;
the families' own modules live in :mod:`fold_hf.modeling.families`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.gemm.cpu import linear_module
from .drafter_config import FoldDrafterConfig
from .rope import compute_dtype


class RMSNorm(nn.Module):
    """RMS norm times a learned weight (``with_scale=False``: no weight, as DeepSpec Gemma-4's ``v_norm``)."""

    def __init__(self, dim: int, eps: float, with_scale: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim)) if with_scale else None
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(compute_dtype(dtype))  # fp32 (fp64 for fp64 inputs)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x.to(dtype) if self.weight is None else self.weight * x.to(dtype)


class DrafterMLP(nn.Module):
    def __init__(self, config: FoldDrafterConfig, layer_idx: int = 0) -> None:
        super().__init__()
        # a family may give each layer its own width (DeepSpec Gemma-4's double-wide MLPs)
        per_layer = getattr(config, "layer_intermediate_sizes", None)
        h, i = config.hidden_size, (per_layer[layer_idx] if per_layer else config.intermediate_size)
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        from transformers.activations import ACT2FN

        self.act = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # several CPU rows run a packed GEMM (kernels/gemm/cpu.py; F.linear elsewhere and under autograd)
        gate = self.act(linear_module(self.gate_proj, x))
        return linear_module(self.down_proj, gate * linear_module(self.up_proj, x))


class DrafterAttention(nn.Module):
    def __init__(self, config: FoldDrafterConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        # a family may fix the logit scale (DeepSpec's Gemma-4 drafter: 1.0, its q/k norms carry the scale)
        fixed_scale = getattr(config, "attention_logit_scale", None)
        self.scaling = float(fixed_scale) if fixed_scale is not None else self.head_dim**-0.5
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.is_causal = False
        self.rope = None  # set by FoldDrafter: the drafter's base rotary tables
        self.sliding_window = config.sliding_window if config.is_sliding_layer(layer_idx) else None
        bias = bool(getattr(config, "attention_bias", False))
        h = config.hidden_size
        # attention_k_eq_v (DeepSpec Gemma-4): no v_proj, values = v_norm(k_proj(x)) with a scale-free v_norm
        self.k_eq_v = bool(getattr(config, "attention_k_eq_v", False))
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = None if self.k_eq_v else nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.v_norm = RMSNorm(self.head_dim, config.rms_norm_eps, with_scale=False) if self.k_eq_v else None

    def _heads(self, x: torch.Tensor, proj: nn.Linear, n: int, norm: RMSNorm | None) -> torch.Tensor:
        b, L, _ = x.shape
        y = linear_module(proj, x).view(b, L, n, self.head_dim)
        if norm is not None:
            y = norm(y)
        return y.transpose(1, 2)

    def project_queries(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, L, H]`` normed block hidden -> unrotated queries ``[b, Hq, L, D]`` (after q_norm)."""
        return self._heads(x, self.q_proj, self.num_heads, self.q_norm)

    def project_keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``[b, L, H]`` (context features or normed block hidden) -> unrotated keys and values, each
        ``[b, Hkv, L, D]``: ``k_norm(k_proj(x))`` and ``v_proj(x)``, or ``v_norm(k_proj(x))`` with k_eq_v."""
        if not self.k_eq_v:
            return (self._heads(x, self.k_proj, self.num_kv_heads, self.k_norm),
                    self._heads(x, self.v_proj, self.num_kv_heads, None))
        b, L, _ = x.shape
        raw = linear_module(self.k_proj, x).view(b, L, self.num_kv_heads, self.head_dim)
        return self.k_norm(raw).transpose(1, 2), self.v_norm(raw).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, context: torch.Tensor | None, read) -> torch.Tensor:
        """The attention half of the layer: ``hidden [b, Lq, H]`` (the normed block), ``context [b, n, H]`` new context
        features or None -> the o_proj output ``[b, Lq, H]``.

        ``read(attn, q, k_new, v_new, k_blk, v_blk) -> [b, Lq, Hq, D]`` is the caller's read: it stores the new context
        entries (``k_new`` / ``v_new [b, Hkv, n, D]``, None when nothing is new) in its cache and reads the cache and
        the block (queries ``q [b, Hq, Lq, D]``, block keys / values ``[b, Hkv, Lq, D]``, all unrotated): the eager
        forward through a planned read, the static step through device-length views (:class:`~fold_hf.generation.
        static_drafter.StaticDrafter`), training through a block mask."""
        q = self.project_queries(hidden)
        k_blk, v_blk = self.project_keys_values(hidden)
        k_new = v_new = None
        if context is not None and context.shape[1]:
            k_new, v_new = self.project_keys_values(context)
        out = read(self, q, k_new, v_new, k_blk, v_blk)
        return linear_module(self.o_proj, out.reshape(*out.shape[:2], -1))


class DrafterLayer(nn.Module):
    """Pre-norm layer (z-lab, DeepSpec Qwen3): ``h += attn(in_norm(h))``, ``h += mlp(post_attn_norm(h))``.

    ``config.sandwich_norms`` (DeepSpec Gemma-4): ``h += post_attn_norm(attn(in_norm(h)))``,
    ``h += post_ff_norm(mlp(pre_ff_norm(h)))``, then ``h *= layer_scalar``. Every path (inference forward, static
    step, training forward) goes through :meth:`forward` (the fused static step restates it with fused kernels:
    ``StaticDrafter._layers_fused`` in :mod:`fold_hf.generation.static_drafter`).
    """

    def __init__(self, config: FoldDrafterConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = DrafterAttention(config, layer_idx)
        self.mlp = DrafterMLP(config, layer_idx)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.sandwich_norms = bool(getattr(config, "sandwich_norms", False))
        if self.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.register_buffer("layer_scalar", torch.ones(1))

    def attention_residual(self, hidden: torch.Tensor, attention_out: torch.Tensor) -> torch.Tensor:
        """``hidden`` plus the layer's attention output ``[b, L, H]`` (o_proj already applied)."""
        if self.sandwich_norms:
            attention_out = self.post_attention_layernorm(attention_out)
        return hidden + attention_out

    def mlp_residual(self, hidden: torch.Tensor) -> torch.Tensor:
        """The MLP half of the layer on ``hidden [b, L, H]`` (and the layer scalar)."""
        if self.sandwich_norms:
            hidden = hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))
            return hidden * self.layer_scalar.to(hidden.dtype)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))

    def forward(self, hidden: torch.Tensor, context: torch.Tensor | None, read) -> torch.Tensor:
        """One layer on the block ``hidden [b, Lq, H]`` with new context features ``context [b, n, H]`` (or None),
        reading through ``read`` (see :meth:`DrafterAttention.forward`); returns the next hidden ``[b, Lq, H]``."""
        hidden = self.attention_residual(hidden, self.self_attn(self.input_layernorm(hidden), context, read))
        return self.mlp_residual(hidden)
