"""An independent, loop-based statement of the FOLD equations (paper Eqs. 1-4), in float64.

Written from the definitions, not from the package code: each logit is built by rotating query and
key as complex pairs at the positions the definition gives, and the masses are summed directly.
"""

from __future__ import annotations

import math

import torch


def rope_complex(x: torch.Tensor, pos: float, theta: float, rotary_dim: int) -> torch.Tensor:
    """Rotate vector ``x [D]`` by position ``pos`` (pairs i, i + rotary_dim/2), float64."""
    x = x.double().clone()
    half = rotary_dim // 2
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    z = torch.complex(x[:half], x[half:rotary_dim]) * torch.exp(1j * pos * inv)
    x[:half], x[half:rotary_dim] = z.real, z.imag
    return x


def fold_naive(q, k_ctx, v_ctx, k_blk, v_blk, *, t: int, W: int, B: int, alpha: float, theta: float,
               rotary_dim: int, scaling: float, far: bool = True, single_softmax: bool = False,
               D: int | None = None, far_D: int | None = None):
    """Full-attention FOLD layer. q ``[Hq, Lq, d]``, k/v ``[Hkv, T|Lq, d]``; returns ``[Lq, Hq, d]``.

    ``D`` bounds the window (``p - j < D``); far entries sit at the virtual position ``t - far_D`` (default ``D``;
    a sliding layer's window is its own, its far memory at the pair's shared ``W + B``)."""
    Hq, Lq, _ = q.shape
    Hkv, T, _ = k_ctx.shape
    G = Hq // Hkv
    D = W + B if D is None else D
    far_D = D if far_D is None else far_D
    out = torch.zeros(Lq, Hq, v_ctx.shape[-1], dtype=torch.float64)
    for h in range(Hq):
        kv = h // G
        for r in range(Lq):
            p = t + r
            qp = rope_complex(q[h, r], p, theta, rotary_dim)
            near_s, near_v, far_s, far_v = [], [], [], []
            for j in range(T):
                if p - j < D:
                    near_s.append(scaling * qp.dot(rope_complex(k_ctx[kv, j], j, theta, rotary_dim)))
                    near_v.append(v_ctx[kv, j].double())
                elif far:
                    far_s.append(scaling * qp.dot(rope_complex(k_ctx[kv, j], t - far_D, theta, rotary_dim)))
                    far_v.append(v_ctx[kv, j].double())
            for rr in range(Lq):
                near_s.append(scaling * qp.dot(rope_complex(k_blk[kv, rr], t + rr, theta, rotary_dim)))
                near_v.append(v_blk[kv, rr].double())
            ns, nv = torch.stack(near_s), torch.stack(near_v)
            if single_softmax or not far_s:
                s = torch.cat((ns, torch.stack(far_s))) if far_s else ns
                vv = torch.cat((nv, torch.stack(far_v))) if far_s else nv
                out[r, h] = torch.softmax(s, 0) @ vv
                continue
            fs, fv = torch.stack(far_s), torch.stack(far_v)
            m = max(ns.max().item(), fs.max().item())
            z_near = torch.exp(ns - m).sum()
            o_near = (torch.exp(ns - m) / z_near) @ nv
            if math.isinf(alpha):
                top = int(fs.argmax())
                z_far = torch.exp(fs[top] - m)
                o_far = fv[top]
            else:
                e = torch.exp(alpha * (fs - m))
                z_far = e.sum() ** (1.0 / alpha)
                o_far = (e / e.sum()) @ fv
            out[r, h] = (z_near * o_near + z_far * o_far) / (z_near + z_far)
    return out
