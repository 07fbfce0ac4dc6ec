"""Triton kernel of the gated delta rule with per-position states (contract:
:func:`fold_hf.kernels.gated_delta.gated_delta_states_reference`). Imported only when Triton is usable.

One program per (value head, block of ``BV`` value columns) holds ``S[:, cols]`` (``[Dk, BV]`` fp32) in registers
and walks the ``L`` block tokens, writing the output and the state after each token: the state is read once and
written ``L`` times, no ``[L, Hv, Dk, Dv]`` intermediate is recomputed. Columns of ``S`` are independent in the
delta rule (the read ``S^T k`` and the update are per column), which is what makes the split exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _gated_delta_kernel(q_ptr, k_ptr, v_ptr, g_ptr, b_ptr, s_ptr, o_ptr, states_ptr, L,
                        HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr):
    h = tl.program_id(0)
    vb = tl.program_id(1)
    hk = h // (HV // HK)
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    mk = rk < DK
    mv = rv < DV
    m2 = mk[:, None] & mv[None, :]
    s_off = h * DK * DV + rk[:, None] * DV + rv[None, :]
    S = tl.load(s_ptr + s_off, mask=m2, other=0.0).to(tl.float32)
    for t in range(0, L):
        k = tl.load(k_ptr + (t * HK + hk) * DK + rk, mask=mk, other=0.0).to(tl.float32)
        q = tl.load(q_ptr + (t * HK + hk) * DK + rk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + (t * HV + h) * DV + rv, mask=mv, other=0.0).to(tl.float32)
        gate = tl.load(g_ptr + t * HV + h).to(tl.float32)
        beta = tl.load(b_ptr + t * HV + h).to(tl.float32)
        S = S * tl.exp(gate)
        read = tl.sum(S * k[:, None], axis=0)
        delta = (v - read) * beta
        S = S + k[:, None] * delta[None, :]
        out = tl.sum(S * q[:, None], axis=0)
        tl.store(o_ptr + (t * HV + h) * DV + rv, out, mask=mv)
        tl.store(states_ptr + t * HV * DK * DV + s_off, S, mask=m2)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def gated_delta_states_triton(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor,
                              beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`~fold_hf.kernels.gated_delta.gated_delta_states_reference` (fp32 state)."""
    if state.dtype != torch.float32:
        raise ValueError(f"the Triton gated delta kernel keeps an fp32 state, got {state.dtype}")
    L, HK, DK = key.shape
    HV, DV = value.shape[1], value.shape[2]
    if HV % HK:
        raise ValueError(f"{HV} value heads are not a multiple of {HK} key heads")
    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    g, beta, state = g.contiguous(), beta.contiguous(), state.contiguous()
    out = torch.empty(L, HV, DV, device=state.device, dtype=torch.float32)
    states = torch.empty(L, HV, DK, DV, device=state.device, dtype=torch.float32)
    BK = _next_pow2(DK)
    BV = min(_next_pow2(DV), max(16, 4096 // BK))
    grid = (HV, triton.cdiv(DV, BV))
    _gated_delta_kernel[grid](query, key, value, g, beta, state, out, states, L, HK=HK, HV=HV, DK=DK, DV=DV,
                              BK=BK, BV=BV)
    return out, states
