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
"""

from __future__ import annotations

import torch


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

