"""Quick timing of the Gated DeltaNet verify at the Qwen3.5-9B layer shape: the token-by-token kernel it replaced
(gdn_before.py) against the chunked / one-token kernel, and the commit over 24 layers, default launch plans, one
process (hybrid_bench.py --kernel-sweep is the full sweep, with the same timer and shape).

Then the verify as a round runs it ("cold"): 24 layers with their own state, conv window, inputs and pending rows,
each launch behind a write of a 128 MiB buffer (what a round's weight GEMMs do to the L2 between two linear layers),
less that write timed alone: whether the verify's cost inside a round (24.9 us a layer at 16 rows in the 2026-12-07
profile, 14.8 us here warm) is its inputs coming cold from HBM.

    python benchmarks/gdn_quick.py [ROWS ...]        (default 16 1; one GPU)"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gdn_before import steps_pending, steps_verify  # noqa: E402
from hybrid_bench import GDN_LAYER, graph_us  # noqa: E402

from fold_hf.kernels.gated_delta import naive as ref  # noqa: E402
from fold_hf.kernels.gated_delta import triton as tri  # noqa: E402


HK, HV, DK, DV, K = GDN_LAYER.values()
C = 2 * HK * DK + HV * DV
g = torch.Generator(device="cuda").manual_seed(0)


def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(dtype)


state = rnd(HV, DK, DV, dtype=torch.float32, scale=0.1)
conv, w, al, dt = rnd(C, K - 1), rnd(C, K, scale=0.5), rnd(HV, scale=0.3), rnd(HV, scale=0.3)
states, convs = state.expand(24, HV, DK, DV).contiguous(), conv.expand(24, C, K - 1).contiguous()
for L in [int(x) for x in (sys.argv[1:] or ["16", "1"])]:
    qkv, b, a = rnd(L, C), rnd(L, HV), rnd(L, HV)
    p, p2 = (ref.gated_delta_pending(24, 64, HK, DK, HV, DV, C, torch.bfloat16, torch.float32, "cuda") for _ in "ab")
    want = ref.gated_delta_verify_reference(qkv, b, a, conv, w, al, dt, state, HK, DK, p2, 0)
    bp = steps_pending(64, HK, DK, HV, DV, C)
    err_b = float((steps_verify(qkv, b, a, conv, w, al, dt, state, HK, DK, bp) - want).abs().max())
    t_b = graph_us(lambda: steps_verify(qkv, b, a, conv, w, al, dt, state, HK, DK, bp))
    err = float((tri.gated_delta_verify_triton(qkv, b, a, conv, w, al, dt, state, HK, DK, p, 0) - want).abs().max())
    t_c = graph_us(lambda: tri.gated_delta_verify_triton(qkv, b, a, conv, w, al, dt, state, HK, DK, p, 0))
    n = torch.tensor([L - 1], device="cuda")
    t_m = graph_us(lambda: tri.gated_delta_commit_triton(n, p, L, states, convs))
    print(f"{torch.cuda.get_device_name()} L={L}: before {t_b:.2f} us (err {err_b:.1e}), now {t_c:.2f} us "
          f"(err {err:.1e}), commit of 24 layers at n={L - 1} {t_m:.2f} us", flush=True)
    layers = [(rnd(L, C), rnd(L, HV), rnd(L, HV)) for _ in range(24)]
    flush = torch.empty(64 * 2**20, device="cuda", dtype=torch.bfloat16)  # 128 MiB, over the L2 of an H100 / H200

    def cold(verify: bool = True) -> None:
        for i, (q_, b_, a_) in enumerate(layers):
            flush.fill_(float(i))
            if verify:
                tri.gated_delta_verify_triton(q_, b_, a_, convs[i], w, al, dt, states[i], HK, DK, p, i)

    t_flush = graph_us(lambda: cold(False), repeats=20, per_graph=1)
    t_cold = graph_us(cold, repeats=20, per_graph=1)
    print(f"{torch.cuda.get_device_name()} L={L}: cold (24 layers, L2 flushed between): "
          f"{(t_cold - t_flush) / 24:.2f} us a layer (flushes alone {t_flush:.1f} us)", flush=True)
