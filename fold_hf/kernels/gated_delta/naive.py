"""The gated delta rule over a short block with the recurrent state at *every* position (torch reference).

Gated DeltaNet (Qwen3.5's linear-attention layers) keeps one state ``S [Hv, Dk, Dv]`` per layer. Per token ``t``
and value head ``h`` (query/key head ``h // (Hv / Hk)``)::

    S   <- S * exp(g_t)                         # gated decay, g_t <= 0
    S   <- S + k_t (beta_t (v_t - S^T k_t))^T    # delta rule: write v_t at k_t, replacing what k_t read
    o_t  = S^T q_t

A speculative verify runs a block of ``L`` tokens but only the first ``n + 1`` are kept; rather than undo and
replay, the verify keeps ``S`` after every position and acceptance selects ``states[n]`` (what serving engines
do for multi-token prediction on hybrid models). ``q`` and ``k`` arrive already L2-normalized and ``q`` already
scaled by ``Dk ** -0.5`` (as transformers' ``torch_recurrent_gated_delta_rule`` prepares them); all math in fp32
(fp64 stays fp64).

:func:`gated_delta_states_reference` is the contract and the oracle of the Triton kernel
(:func:`fold_hf.kernels.gated_delta.triton.gated_delta_states_triton`, same signature).

The fused verify of a whole Gated DeltaNet step after the projections (conv + silu + L2 norms + gates + the delta
rule, :func:`gated_delta_verify_reference`) writes no state; it keeps each token's write ``delta_t = beta_t (v_t -
(e^{g_t} S_{t-1})^T k_t)`` (``[Hv, Dv]``, what the token adds at ``k_t``), and the commit of the accepted prefix
(:func:`gated_delta_commit_reference`) replays ``S <- e^{g_t} S + k_t delta_t^T`` from the committed state for
``t <= n`` (rank-one updates, no reads of ``S``) instead of keeping ``L`` states of ``[Hv, Dk, Dv]``: the twins of :func:`fold_hf.kernels.gated_delta.triton.gated_delta_verify_triton` and
:func:`~fold_hf.kernels.gated_delta.triton.gated_delta_commit_triton` (the fused Qwen3.5
layers). The layer's output then goes through a gated RMSNorm ``w * norm(o) * silu(z)``
(:func:`gated_rms_norm_reference`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_delta_states_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                                 beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated delta rule over ``L`` tokens from ``state``, keeping every intermediate state.

    Args:
        query: ``[L, Hk, Dk]`` L2-normalized and scaled queries.
        key: ``[L, Hk, Dk]`` L2-normalized keys.
        value: ``[L, Hv, Dv]`` values (``Hv`` a multiple of ``Hk``).
        g: ``[L, Hv]`` log decay (``<= 0``).
        beta: ``[L, Hv]`` write strength in ``(0, 1)``.
        state: ``[Hv, Dk, Dv]`` state before the first token (fp32 or fp64; not modified).

    Returns:
        (outputs ``[L, Hv, Dv]``, states ``[L, Hv, Dk, Dv]``, state after each token), in ``state.dtype``.
    """
    dtype = state.dtype
    L, Hk, _ = key.shape
    Hv = value.shape[1]
    group = Hv // Hk
    q = query.to(dtype).repeat_interleave(group, dim=1)
    k = key.to(dtype).repeat_interleave(group, dim=1)
    v, g, beta = value.to(dtype), g.to(dtype), beta.to(dtype)
    S = state
    outputs, states = [], []
    for t in range(L):
        S = S * g[t].exp()[:, None, None]
        read = torch.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - read) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        outputs.append(torch.einsum("hkv,hk->hv", S, q[t]))
        states.append(S)
    return torch.stack(outputs), torch.stack(states)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """As transformers' Qwen3.5 ``l2norm`` (FLA's): ``x * rsqrt(sum(x^2) + eps)`` over the last dim."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_prepare_reference(qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
                                  conv_weight: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                                  num_k_heads: int, k_dim: int, state_dtype: torch.dtype):
    """The per-token inputs of the delta rule from the block's projections (Qwen3.5's ``Qwen3_5GatedDeltaNet``).

    Args:
        qkv: ``[L, C]`` ``in_proj_qkv`` output (``C = 2 Hk Dk + Hv Dv``), model dtype.
        b, a: ``[L, Hv]`` ``in_proj_b`` / ``in_proj_a`` outputs.
        conv_state: ``[C, K - 1]`` the last ``K - 1`` projections before the block.
        conv_weight: ``[C, K]`` depthwise causal convolution (no bias).
        a_log, dt_bias: ``[Hv]``.

    Returns:
        ``q [L, Hk, Dk]`` (L2-normed, scaled by ``Dk ** -0.5``), ``k [L, Hk, Dk]`` (L2-normed), ``v [L, Hv, Dv]``,
        ``g [L, Hv]`` (log decay), ``beta [L, Hv]``, all in ``state_dtype``: conv + silu in the model dtype, then
        the fp32 math of the fast loop.
    """
    L, C = qkv.shape
    K = conv_weight.shape[-1]
    window = torch.cat((conv_state, qkv.transpose(0, 1).to(conv_state.dtype)), dim=1)  # [C, K - 1 + L]
    mixed = F.conv1d(window[None].to(conv_weight.dtype), conv_weight[:, None, :], groups=C)
    mixed = F.silu(mixed)[0].transpose(0, 1).to(qkv.dtype)  # [L, C]
    kd = num_k_heads * k_dim
    q = mixed[:, :kd].reshape(L, num_k_heads, k_dim).to(state_dtype)
    k = mixed[:, kd : 2 * kd].reshape(L, num_k_heads, k_dim).to(state_dtype)
    hv = b.shape[-1]
    v = mixed[:, 2 * kd :].reshape(L, hv, -1).to(state_dtype)
    q = l2norm(q) * (k_dim ** -0.5)
    k = l2norm(k)
    beta = b.sigmoid().to(state_dtype)
    g = (-a_log.float().exp() * F.softplus(a.float() + dt_bias)).to(state_dtype)
    assert K == conv_state.shape[1] + 1
    return q, k, v, g, beta


def _delta_steps(S, q, k, v, g, beta):
    """The gated delta rule from ``S [Hv, Dk, Dv]`` over ``L`` tokens; returns (outputs ``[L, Hv, Dv]``, each
    token's write ``delta [L, Hv, Dv]``)."""
    group = v.shape[1] // k.shape[1]
    q = q.repeat_interleave(group, dim=1)
    k = k.repeat_interleave(group, dim=1)
    outputs, deltas = [], []
    for t in range(v.shape[0]):
        S = S * g[t].exp()[:, None, None]
        read = torch.einsum("hkv,hk->hv", S, k[t])
        delta = (v[t] - read) * beta[t][:, None]
        S = S + k[t][:, :, None] * delta[:, None, :]
        outputs.append(torch.einsum("hkv,hk->hv", S, q[t]))
        deltas.append(delta)
    return torch.stack(outputs), torch.stack(deltas)


def gated_delta_verify_reference(qkv, b, a, conv_state, conv_weight, a_log, dt_bias, state, num_k_heads: int,
                                 k_dim: int, pending: dict, layer: int) -> torch.Tensor:
    """One Gated DeltaNet layer over a verify block, state untouched, inputs kept for the commit.

    Args:
        qkv, b, a, conv_state, conv_weight, a_log, dt_bias: as :func:`gated_delta_prepare_reference`.
        state: ``[Hv, Dk, Dv]`` committed recurrent state (fp32, fp64 for fp64 models); not modified.
        pending: the commit's buffers (:func:`gated_delta_pending`); row ``layer`` receives the block's ``k``,
            ``g``, each token's write ``delta`` and the raw ``qkv`` rows.

    Returns:
        ``[L, Hv, Dv]`` outputs ``S_t^T q_t`` in the state dtype.
    """
    q, k, v, g, beta = gated_delta_prepare_reference(qkv, b, a, conv_state, conv_weight, a_log, dt_bias, num_k_heads,
                                                     k_dim, state.dtype)
    L = qkv.shape[0]
    out, delta = _delta_steps(state, q, k, v, g, beta)
    for name, value in (("k", k), ("g", g), ("delta", delta), ("qkv", qkv)):
        pending[name][layer, :L] = value
    return out


def gated_delta_pending(num_layers: int, rows: int, num_k_heads: int, k_dim: int, num_v_heads: int, v_dim: int,
                        conv_dim: int, dtype: torch.dtype, state_dtype: torch.dtype, device) -> dict:
    """Buffers for what the commit needs of the last verify of every linear layer: ``k [NL, rows, Hk, Dk]``,
    ``g [NL, rows, Hv]``, the writes ``delta [NL, rows, Hv, Dv]`` (state dtype) and the raw projections
    ``qkv [NL, rows, C]`` (model dtype)."""
    z = dict(device=device, dtype=state_dtype)
    return {"k": torch.zeros(num_layers, rows, num_k_heads, k_dim, **z),
            "g": torch.zeros(num_layers, rows, num_v_heads, **z),
            "delta": torch.zeros(num_layers, rows, num_v_heads, v_dim, **z),
            "qkv": torch.zeros(num_layers, rows, conv_dim, device=device, dtype=dtype)}


def gated_delta_commit_reference(n: torch.Tensor, pending: dict, length: int, states: torch.Tensor,
                                 conv_states: torch.Tensor) -> None:
    """Commit the first ``n + 1`` tokens of the last verify (``length`` rows) of every linear layer, in place.

    Args:
        n: ``[1]`` long device tensor, accepted drafts (``0 <= n < length``).
        pending: buffers filled by the verify (:func:`gated_delta_pending`).
        states: ``[NL, Hv, Dk, Dv]`` committed recurrent states, advanced by tokens ``0 .. n``:
            ``S <- e^{g_t} S + k_t delta_t^T``.
        conv_states: ``[NL, C, K - 1]`` convolution windows, shifted to end at token ``n``.
    """
    group = states.shape[1] // pending["k"].shape[2]
    active = (torch.arange(length, device=n.device) <= n).to(states.dtype)
    for layer in range(states.shape[0]):
        S = states[layer]
        k = pending["k"][layer, :length].repeat_interleave(group, dim=1)
        for t in range(length):
            decay = (pending["g"][layer, t] * active[t]).exp()[:, None, None]
            S = S * decay + k[t][:, :, None] * (pending["delta"][layer, t] * active[t])[:, None, :]
        states[layer].copy_(S)
    K1 = conv_states.shape[2]
    window = torch.cat((conv_states, pending["qkv"][:, :length].transpose(1, 2).to(conv_states.dtype)), 2)
    columns = n.reshape(1) + 1 + torch.arange(K1, device=n.device)
    conv_states.copy_(window.index_select(2, columns))


def gated_rms_norm_reference(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's ``RMSNormGated``: ``(w * norm(x.to(dtype)).to(dtype) * silu(gate.float())).to(dtype)``.

    Args:
        x: ``[..., Dv]`` (fp32 kernel output; rounded to ``gate``'s dtype first, as the model's layer feeds it).
        gate: ``[..., Dv]`` in the model dtype (the ``z`` projection, per head).
        weight: ``[Dv]`` in the model dtype.

    Returns:
        ``[..., Dv]`` in ``gate``'s dtype.
    """
    dtype = gate.dtype
    xf = x.to(dtype).to(torch.promote_types(dtype, torch.float32))
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * normed.to(dtype)
    return (out * F.silu(gate.to(xf.dtype))).to(dtype)


__all__ = ["gated_delta_commit_reference", "gated_delta_pending", "gated_delta_prepare_reference",
           "gated_delta_states_reference", "gated_delta_verify_reference", "gated_rms_norm_reference", "l2norm"]
