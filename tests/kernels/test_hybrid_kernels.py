"""The fused Qwen3.5 / Gemma layer kernels (fold_hf/kernels/hybrid/, gemma/ and gated_delta/ triton.py) against their
torch twins (their naive.py), and the twins against independent statements: the transformers
modules they replace (norms, gated norm, activations, rope) and the per-position gated delta rule (itself checked
against a float64 loop and transformers' rule in tests/targets/test_qwen35.py). Kernels run in Triton's interpreter on the CPU
(odd shapes, every kernel dtype) and on the GPU (gpu-marked)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fold_hf import compat
from fold_hf.kernels.gated_delta import gated_delta_states_reference
from fold_hf.kernels.gated_delta import naive as gdn
from fold_hf.kernels.gemma import naive as gemma
from fold_hf.kernels.hybrid import naive as ref

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _tol(dtype):
    # one rounding step apart at most (order of a reduction, rsqrt vs the module's): an ulp of the dtype
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32, device="cpu", scale=1.0):
    return (torch.randn(*shape, generator=_gen(seed)) * scale).to(dtype).to(device)


# ---------------------------------------------------------------------------------------------- twins vs modules
def test_twins_equal_the_transformers_modules():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.gemma4.modeling_gemma4 import Gemma4RMSNorm
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated, apply_rotary_pos_emb

    x, d = _randn(3, 5, 24, seed=1), _randn(3, 5, 24, seed=2)
    g3 = Gemma3RMSNorm(24)
    g4 = Gemma4RMSNorm(24)
    g4v = Gemma4RMSNorm(24, with_scale=False)
    with torch.no_grad():
        g3.weight.normal_(generator=_gen(3))
        g4.weight.normal_(generator=_gen(4))
        total, normed = ref.residual_norm_reference(x, d, g3.weight, compat.norm_epsilon(g3), 1.0,
                                                    delta_weight=g3.weight, norm_delta=True,
                                                    scalar=torch.tensor([0.5]))
        torch.testing.assert_close(total, (x + g3(d)) * 0.5, atol=0, rtol=0)
        torch.testing.assert_close(normed, g3((x + g3(d)) * 0.5), atol=1e-6, rtol=1e-6)
        _, normed = ref.residual_norm_reference(x, None, g4.weight, compat.norm_epsilon(g4), 0.0)
        torch.testing.assert_close(normed, g4(x), atol=1e-6, rtol=1e-6)
        _, normed = ref.residual_norm_reference(x, None, None, compat.norm_epsilon(g4v), 0.0)
        torch.testing.assert_close(normed, g4v(x), atol=1e-6, rtol=1e-6)
        gated = Qwen3_5RMSNormGated(8, eps=1e-6)
        gated.weight.normal_(generator=_gen(5))
        o, z = _randn(6, 8, seed=6), _randn(6, 8, seed=7)
        torch.testing.assert_close(gdn.gated_rms_norm_reference(o, z, gated.weight, 1e-6), gated(o, z), atol=0, rtol=0)
        torch.testing.assert_close(gemma.gelu_tanh_mul_reference(o, z), F.gelu(o, approximate="tanh") * z)
        # partial rope (Qwen3.5: the first R dims rotate), positions picked from a table
        q, k = _randn(1, 3, 2, 16, seed=8), _randn(1, 3, 1, 16, seed=9)
        cos, sin = _randn(10, 6, seed=10), _randn(10, 6, seed=11)
        positions = torch.tensor([7, 8, 9])
        kc, vc = torch.zeros(1, 1, 4, 16), torch.zeros(1, 1, 4, 16)
        qo, ko, vo = ref.head_norm_rope_write_reference(q, k, k, None, None, 1e-6, 0.0, cos, sin, positions, kc, vc,
                                                        norm_qk=False)
        want_q, want_k = apply_rotary_pos_emb(q, k, cos[positions][None], sin[positions][None], unsqueeze_dim=2)
        torch.testing.assert_close(qo, want_q.transpose(1, 2), atol=0, rtol=0)
        torch.testing.assert_close(ko, want_k.transpose(1, 2), atol=0, rtol=0)
        torch.testing.assert_close(kc[0, :, positions % 4], ko[0], atol=0, rtol=0)  # a ring of 4 slots
        torch.testing.assert_close(vc[0, :, positions % 4], k.transpose(1, 2)[0], atol=0, rtol=0)


def _delta_inputs(L, HK, HV, DK, DV, K=4, dtype=torch.float32, device="cpu", seed=0):
    C = 2 * HK * DK + HV * DV
    qkv = _randn(L, C, seed=seed, dtype=dtype, device=device)
    b = _randn(L, HV, seed=seed + 1, dtype=dtype, device=device)
    a = _randn(L, HV, seed=seed + 2, dtype=dtype, device=device)
    conv = _randn(C, K - 1, seed=seed + 3, dtype=dtype, device=device)
    weight = _randn(C, K, seed=seed + 4, dtype=dtype, device=device, scale=0.5)
    a_log = _randn(HV, seed=seed + 5, dtype=dtype, device=device, scale=0.3)
    dt_bias = _randn(HV, seed=seed + 6, dtype=dtype, device=device, scale=0.3)
    state = _randn(HV, DK, DV, seed=seed + 7, device=device, scale=0.1)
    return qkv, b, a, conv, weight, a_log, dt_bias, state


def test_gated_delta_verify_and_commit_twins_equal_the_per_position_rule():
    """Verify outputs = the per-position rule's outputs on the prepared inputs; commit(n) = its state n and the
    convolution window ending at token n, for every n (independent: gated_delta_states_reference)."""
    L, HK, HV, DK, DV = 5, 2, 4, 8, 6
    qkv, b, a, conv, weight, a_log, dt_bias, state = _delta_inputs(L, HK, HV, DK, DV)
    q, k, v, g, beta = gdn.gated_delta_prepare_reference(qkv, b, a, conv, weight, a_log, dt_bias, HK, DK,
                                                         torch.float32)
    want_out, want_states = gated_delta_states_reference(q, k, v, g, beta, state)
    window = torch.cat((conv, qkv.t()), 1)
    for n in range(L):
        pending = gdn.gated_delta_pending(2, 8, HK, DK, HV, DV, qkv.shape[1], qkv.dtype, torch.float32, "cpu")
        out = gdn.gated_delta_verify_reference(qkv, b, a, conv, weight, a_log, dt_bias, state, HK, DK, pending, 1)
        torch.testing.assert_close(out, want_out, atol=0, rtol=0)
        states = torch.stack((torch.zeros_like(state), state))
        convs = torch.stack((torch.zeros_like(conv), conv))
        gdn.gated_delta_commit_reference(torch.tensor([n]), pending, L, states, convs)
        torch.testing.assert_close(states[1], want_states[n], atol=0, rtol=0)
        torch.testing.assert_close(convs[1], window[:, n + 1 : n + 4], atol=0, rtol=0)
        assert torch.equal(states[0], torch.zeros_like(state))  # a layer whose pending rows are zero stays put


# ---------------------------------------------------------------------------------------------- kernels
def _check_kernels(device, dtype, H, heads, D, R, ring, L):
    from fold_hf.kernels.gated_delta import triton as gdn_tri
    from fold_hf.kernels.gemma import triton as gemma_tri
    from fold_hf.kernels.hybrid import triton as tri

    tol = _tol(dtype)
    x, d = _randn(L, H, seed=1, dtype=dtype, device=device), _randn(L, H, seed=2, dtype=dtype, device=device)
    w, w2 = _randn(H, seed=3, dtype=dtype, device=device), _randn(H, seed=4, dtype=dtype, device=device)
    scalar = torch.tensor([0.75], dtype=dtype, device=device)
    for kw in (dict(), dict(offset=1.0, norm_delta=True, delta_weight=w2, scalar=scalar),
               dict(norm_delta=True, delta_weight=None, norm_out=False), dict(weight_none=True)):
        kw = dict(kw)
        weight = None if kw.pop("weight_none", False) else w
        got = tri.residual_norm_triton(x, d, weight, 1e-6, **kw)
        want = ref.residual_norm_reference(x, d, weight, 1e-6, **kw)
        for g_, w_ in zip(got, want):
            if w_ is None:
                assert g_ is None
            else:
                torch.testing.assert_close(g_, w_, **tol)
    got = tri.residual_norm_triton(x, None, w, 1e-6, 1.0)
    torch.testing.assert_close(got[1], ref.residual_norm_reference(x, None, w, 1e-6, 1.0)[1], **tol)
    # heads: a strided query (half of a [.., 2D] projection, as Qwen3.5's q|gate), ring cache write
    both = _randn(1, L, heads, 2 * D, seed=5, dtype=dtype, device=device)
    query, gate = both[..., :D], both[..., D:]
    key = _randn(1, L, 2, D, seed=6, dtype=dtype, device=device)
    value = _randn(1, L, 2, D, seed=7, dtype=dtype, device=device)
    qw, kw_ = _randn(D, seed=8, dtype=dtype, device=device), _randn(D, seed=9, dtype=dtype, device=device)
    cos, sin = _randn(64, R, seed=10, dtype=dtype, device=device), _randn(64, R, seed=11, dtype=dtype, device=device)
    positions = torch.arange(40, 40 + L, device=device)
    for offset, norm_value in ((1.0, False), (0.0, True)):
        caches = [torch.zeros(1, 2, ring, D, dtype=dtype, device=device) for _ in range(4)]
        got = tri.head_norm_rope_write_triton(query, key, value, qw, kw_, 1e-6, offset, cos, sin, positions,
                                              caches[0], caches[1], norm_value=norm_value)
        want = ref.head_norm_rope_write_reference(query, key, value, qw, kw_, 1e-6, offset, cos, sin, positions,
                                                  caches[2], caches[3], norm_value=norm_value)
        for g_, w_ in zip(list(got) + caches[:2], list(want) + caches[2:]):
            torch.testing.assert_close(g_, w_, **tol)
    # no caches (a Gemma prefill chunk's sliding layer): the same q, k, v, nothing written; one cache alone refused
    got = tri.head_norm_rope_write_triton(query, key, value, qw, kw_, 1e-6, 0.0, cos, sin, positions, None, None,
                                          norm_value=True)
    for g_, w_ in zip(got, want):  # want: the last loop's (offset 0, norm_value), written into caches there
        torch.testing.assert_close(g_, w_, **tol)
    with pytest.raises(ValueError, match="both caches or neither"):
        tri.head_norm_rope_write_triton(query, key, value, qw, kw_, 1e-6, 0.0, cos, sin, positions, caches[0], None)
    got_q, none_k, _ = tri.head_norm_rope_write_triton(query, None, None, qw, None, 1e-6, 0.0, cos, sin, positions,
                                                       None, None)
    assert none_k is None
    torch.testing.assert_close(got_q, ref.head_norm_rope_write_reference(
        query, None, None, qw, None, 1e-6, 0.0, cos, sin, positions, None, None)[0], **tol)
    torch.testing.assert_close(tri.sigmoid_mul_triton(query, gate), ref.sigmoid_mul_reference(query, gate), **tol)
    up = _randn(L, 3, 2 * H, seed=12, dtype=dtype, device=device)
    torch.testing.assert_close(gemma_tri.gelu_tanh_mul_triton(up[..., :H], up[..., H:]),
                               gemma.gelu_tanh_mul_reference(up[..., :H], up[..., H:]), **tol)
    # ring attention: a ring of `ring` slots holding the last positions (top = 40 + L - 1), window 5 / 9. The kernel
    # keeps its scores in fp32 (as SDPA does in the model's own path) where the twin's bf16/fp16 matmul rounds them
    # to the dtype: with unscaled logits of ~50 (scale 1.0, head dim 256) that rounding (ulp 0.25) moves softmax
    # weights by up to 28%, so the oracle is the twin on the same values in fp32, and the kernel's output is
    # compared at the dtype's tolerance (an H200 run with the bf16 twin as oracle: 25 of 65,536 values off by 0.04).
    rq = _randn(1, heads, L, D, seed=15, dtype=dtype, device=device)
    kr = _randn(1, heads // 2 or 1, ring, D, seed=16, dtype=dtype, device=device)
    vr = _randn(1, heads // 2 or 1, ring, D, seed=17, dtype=dtype, device=device)

    def ring_oracle(pos, window, scale):
        return gemma.ring_attention_reference(rq.float(), kr.float(), vr.float(), pos, window, scale).to(dtype)

    if heads % kr.shape[1] == 0:
        for window in (5, 9):
            torch.testing.assert_close(gemma_tri.ring_attention_triton(rq, kr, vr, positions, window, D ** -0.5),
                                       ring_oracle(positions, window, D ** -0.5), **tol)
        early = torch.arange(0, L, device=device)  # a ring not yet wrapped: slots past the top are empty
        torch.testing.assert_close(gemma_tri.ring_attention_triton(rq, kr, vr, early, 4, 1.0),
                                   ring_oracle(early, 4, 1.0), **tol)
    o = _randn(L, heads, D, seed=13, device=device)
    z = _randn(L, heads, D, seed=14, dtype=dtype, device=device)
    torch.testing.assert_close(gdn_tri.gated_rms_norm_triton(o, z, qw, 1e-6),
                               gdn.gated_rms_norm_reference(o, z, qw, 1e-6), **tol)
    # z read in place from a merged input projection's rows (qwen35.py: [L, C | Hv Dv | 2 Hv], strided tokens)
    rows = _randn(L, 5 + heads * D + 3, seed=18, dtype=dtype, device=device)
    strided = rows[:, 5 : 5 + heads * D].reshape(L, heads, D)
    assert strided.data_ptr() == rows[:, 5:].data_ptr()  # a view: the kernel reads it in place
    torch.testing.assert_close(gdn_tri.gated_rms_norm_triton(o, strided, qw, 1e-6),
                               gdn.gated_rms_norm_reference(o, strided, qw, 1e-6), **tol)


def _check_delta(device, dtype, L, HK, HV, DK, DV, K):
    from fold_hf.kernels.gated_delta import triton as gdn_tri

    qkv, b, a, conv, weight, a_log, dt_bias, state = _delta_inputs(L, HK, HV, DK, DV, K, dtype, device, seed=L)
    C = qkv.shape[1]
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    pend = [gdn.gated_delta_pending(3, L + 2, HK, DK, HV, DV, C, dtype, torch.float32, device) for _ in range(2)]
    out = gdn_tri.gated_delta_verify_triton(qkv, b, a, conv, weight, a_log, dt_bias, state, HK, DK, pend[0], 2)
    want = gdn.gated_delta_verify_reference(qkv, b, a, conv, weight, a_log, dt_bias, state, HK, DK, pend[1], 2)
    torch.testing.assert_close(out, want, **tol)
    for name in pend[0]:
        torch.testing.assert_close(pend[0][name], pend[1][name], **tol)
    for n in sorted({0, L - 1, L // 2}):
        states = [torch.stack((state * 0.5, state, state * 2)) for _ in range(2)]
        convs = [torch.stack((conv, conv, conv)) for _ in range(2)]
        nt = torch.tensor([n], device=device)
        gdn_tri.gated_delta_commit_triton(nt, pend[1], L, states[0], convs[0])
        gdn.gated_delta_commit_reference(nt, pend[1], L, states[1], convs[1])
        torch.testing.assert_close(states[0], states[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(convs[0], convs[1], atol=0, rtol=0)
    # one cache row of all-row tensors [NL, B, ...] (qwen35_rows: the commit of row 1 on its [:, 1] views, strided
    # over layers): that row's states as the contiguous commit's, the other rows untouched
    n = L // 2
    nt = torch.tensor([n], device=device)
    state_rows = torch.stack((state * 0.5, state, state * 2))[:, None].repeat(1, 3, 1, 1, 1)  # [3, 3, Hv, Dk, Dv]
    state_rows[:, 0] *= -1
    conv_rows = torch.stack((conv, conv * 2, conv))[:, None].repeat(1, 3, 1, 1)
    before_s, before_c = state_rows.clone(), conv_rows.clone()
    want_s, want_c = state_rows[:, 1].clone(), conv_rows[:, 1].clone()
    gdn.gated_delta_commit_reference(nt, pend[1], L, want_s, want_c)
    gdn_tri.gated_delta_commit_triton(nt, pend[1], L, state_rows[:, 1], conv_rows[:, 1])
    torch.testing.assert_close(state_rows[:, 1], want_s, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(conv_rows[:, 1], want_c, atol=0, rtol=0)
    for other in (0, 2):
        assert torch.equal(state_rows[:, other], before_s[:, other]) and torch.equal(conv_rows[:, other],
                                                                                   before_c[:, other])
    with pytest.raises(ValueError, match="must be contiguous"):
        gdn_tri.gated_delta_commit_triton(nt, pend[1], L, state_rows[:, 1].transpose(2, 3), conv_rows[:, 1])


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (24, 3, 16, 6, 5, 1)), (torch.bfloat16, (24, 3, 16, 6, 5, 1)),
                                         (torch.float16, (40, 2, 10, 10, 16, 3)),
                                         (torch.float32, (40, 2, 10, 10, 16, 3))])
def test_layer_kernels_in_interpreter(interpreter, dtype, shape):
    """(hidden, heads, head dim, rotary dims, ring slots, rows): odd sizes, partial rope, rings that wrap."""
    H, heads, D, R, ring, L = shape
    _check_kernels("cpu", dtype, H, heads, D, R, ring, L)


def test_ring_attention_row_blocks_in_interpreter(interpreter):
    """More query rows (4 heads per KV head x 20 rows) than one program takes: two row blocks, a wrapped ring."""
    from fold_hf.kernels.gemma import triton as gemma_tri

    q = _randn(1, 4, 20, 8, seed=1)
    kr, vr = _randn(1, 1, 24, 8, seed=2), _randn(1, 1, 24, 8, seed=3)
    positions = torch.arange(50, 70)
    torch.testing.assert_close(gemma_tri.ring_attention_triton(q, kr, vr, positions, 4, 0.5),
                               gemma.ring_attention_reference(q, kr, vr, positions, 4, 0.5), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("programs", ["1", "3", "7", "128", "4096"])
def test_ring_attention_split_programs_in_interpreter(interpreter, programs, monkeypatch):
    """``$FOLD_HF_RING_PROGRAMS`` deals a ring of 13 key chunks (head dim 32: 64-key chunks, 800 slots, wrapped) over
    one split to one split a chunk: the output is the reference's whatever the split, one row or three rows of a
    batch in permuted cache rows; a bad value is refused."""
    from fold_hf.kernels.gemma import triton as gemma_tri

    monkeypatch.setenv(gemma_tri.RING_PROGRAMS_ENV, programs)
    q = _randn(3, 4, 2, 32, seed=4)
    kr, vr = _randn(4, 2, 800, 32, seed=5), _randn(4, 2, 800, 32, seed=6)
    positions = torch.tensor([[2000, 2001], [900, 901], [799, 800]])
    rows = torch.tensor([2, 0, 3])
    tol = dict(atol=1e-5, rtol=1e-5)
    one = gemma_tri.ring_attention_triton(q[:1], kr[:1], vr[:1], positions[0], 700, 32 ** -0.5)
    torch.testing.assert_close(one, gemma.ring_attention_reference(q[:1], kr[:1], vr[:1], positions[0], 700,
                                                                   32 ** -0.5), **tol)
    got = gemma_tri.ring_attention_rows_triton(q, kr, vr, positions, rows, 700, 32 ** -0.5)
    for a in range(3):
        r = int(rows[a])
        want = gemma.ring_attention_reference(q[a : a + 1], kr[r : r + 1], vr[r : r + 1], positions[a], 700,
                                              32 ** -0.5)
        torch.testing.assert_close(got[a : a + 1], want, **tol)
    monkeypatch.setenv(gemma_tri.RING_PROGRAMS_ENV, "0")
    with pytest.raises(ValueError, match=gemma_tri.RING_PROGRAMS_ENV):
        gemma_tri.ring_attention_triton(q[:1], kr[:1], vr[:1], positions[0], 700, 1.0)


def test_ring_bench_dry_run_checks_every_split_against_the_default(tmp_path):
    """``benchmarks/ring_bench.py --dry-run`` (interpreter, tiny shapes of 3-4 key chunks): a row per shape and
    programs value, the outputs of every split close to the default's, the CSV beside the JSON."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "ring_bench.py"
    subprocess.run([sys.executable, str(script), "--dry-run", "--programs", "2,128", "--out", str(tmp_path)],
                   check=True, capture_output=True)
    rows = json.loads((tmp_path / "ring.json").read_text())["rows"]
    assert {(r["shape"], r["programs"]) for r in rows} == {(s, p) for s in ("tiny_ar", "tiny_rows") for p in (2, 128)}
    assert all(r["max_diff_vs_default"] < 1e-4 for r in rows)
    assert any(r["max_diff_vs_default"] > 0 for r in rows)  # another split moved the merge's boundaries
    assert (tmp_path / "ring.csv").read_text().startswith("shape,programs,default")


def _check_delta_rows(device, dtype, A, L, HK, HV, DK, DV, K):
    """The verify and commit of ``A`` rows of a batch in one launch each (row axis, rows in permuted cache rows of
    ``B = A + 1``, inputs strided as a merged projection's rows) against each row's one-row torch reference."""
    from fold_hf.kernels.gated_delta import triton as gdn_tri

    B, NL, layer = A + 1, 3, 1
    per_row = [_delta_inputs(L, HK, HV, DK, DV, K, dtype, device, seed=10 * a + L) for a in range(A)]
    C = per_row[0][0].shape[1]
    weight, a_log, dt_bias = per_row[0][4:7]
    wide = torch.zeros(A, L, C + 2 * HV + 5, dtype=dtype, device=device)  # [qkv | b | a | spare]: strided views
    for a, inputs in enumerate(per_row):
        wide[a, :, :C], wide[a, :, C : C + HV], wide[a, :, C + HV : C + 2 * HV] = inputs[0], inputs[1], inputs[2]
    qkv, b, a_ = wide[..., :C], wide[..., C : C + HV], wide[..., C + HV : C + 2 * HV]
    cache_rows = list(range(B))[::-1][:A]  # rows B-1 .. 1: not the batch order
    conv_rows = torch.zeros(B, C, K - 1, dtype=dtype, device=device)
    state_rows = torch.zeros(B, HV, DK, DV, device=device)
    for a, r in enumerate(cache_rows):
        conv_rows[r], state_rows[r] = per_row[a][3], per_row[a][7]
    whole = gdn.gated_delta_pending(B * NL, L + 2, HK, DK, HV, DV, C, dtype, torch.float32, device)
    whole = {name: t.view(B, NL, *t.shape[1:]) for name, t in whole.items()}
    index = torch.tensor(cache_rows, dtype=torch.int32, device=device)
    out = gdn_tri.gated_delta_verify_rows_triton(qkv, b, a_, conv_rows, weight, a_log, dt_bias, state_rows, index,
                                                 HK, DK, whole, layer)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    refs = []
    for a, r in enumerate(cache_rows):
        pend = gdn.gated_delta_pending(NL, L + 2, HK, DK, HV, DV, C, dtype, torch.float32, device)
        want = gdn.gated_delta_verify_reference(per_row[a][0], per_row[a][1], per_row[a][2], per_row[a][3], weight,
                                                a_log, dt_bias, per_row[a][7], HK, DK, pend, layer)
        torch.testing.assert_close(out[a], want, **tol)
        for name in pend:
            torch.testing.assert_close(whole[name][r, layer], pend[name][layer], **tol)
        refs.append(pend)
    assert all(torch.equal(whole[name][0], torch.zeros_like(whole[name][0])) for name in whole)  # row 0: none
    counts = [(3 * a + 1) % L for a in range(A)]
    states = torch.randn(NL, B, HV, DK, DV, generator=_gen(5), device="cpu").to(device) * 0.1
    convs = torch.randn(NL, B, C, K - 1, generator=_gen(6)).to(dtype).to(device)
    want_s, want_c = states.clone(), convs.clone()
    for a, r in enumerate(cache_rows):
        gdn.gated_delta_commit_reference(torch.tensor([counts[a]], device=device), refs[a], L, want_s[:, r],
                                         want_c[:, r])
    gdn_tri.gated_delta_commit_rows_triton(torch.tensor(counts, device=device), whole, L, states, convs, index)
    torch.testing.assert_close(states, want_s, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(convs, want_c, **tol)
    assert torch.equal(states[:, 0], want_s[:, 0]) and torch.equal(convs[:, 0], want_c[:, 0])  # row 0 untouched


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (3, 4, 2, 4, 8, 6, 4)), (torch.bfloat16, (2, 1, 1, 2, 8, 8, 3)),
                                         (torch.float32, (2, 17, 1, 2, 16, 16, 4))])
def test_gated_delta_rows_kernels_in_interpreter(interpreter, dtype, shape):
    """(rows, block, key heads, value heads, Dk, Dv, conv kernel): a verify block, an AR step, a block past 16."""
    _check_delta_rows("cpu", dtype, *shape)


@pytest.mark.parametrize("dtype,shape", [(torch.float32, (1, 1, 1, 8, 8, 4)), (torch.bfloat16, (5, 2, 6, 12, 20, 4)),
                                         (torch.float32, (3, 1, 2, 16, 9, 2))])
def test_gated_delta_kernels_in_interpreter(interpreter, dtype, shape):
    """(rows, key heads, value heads, Dk, Dv, conv kernel): one row, odd dims, a conv of 2."""
    _check_delta("cpu", dtype, *shape)


def _check_chunked_verify_against_float64(device, L, HK, HV, DK, DV, spread):
    """Keys that nearly repeat (every row the same projection + ``spread`` noise), write strengths near 1 and
    decays near 1: the hardest case for the chunked verify's triangular solve (A's entries near 1). Outputs and
    the committed state after every n in a few, against the per-position rule in float64 on the same prepared
    inputs (written from the recurrence, gated_delta_states_reference)."""
    from fold_hf.kernels.gated_delta import triton as gdn_tri

    C, K = 2 * HK * DK + HV * DV, 4
    qkv = (_randn(1, C, seed=1) + spread * _randn(L, C, seed=2)).to(device)
    b = (4.0 + _randn(L, HV, seed=3, scale=0.1)).to(device)  # beta ~ 0.98
    a = (-6.0 + _randn(L, HV, seed=4, scale=0.1)).to(device)  # softplus ~ 2.5e-3: decays ~ 0.997
    conv = _randn(C, K - 1, seed=5, device=device)
    weight = _randn(C, K, seed=6, device=device, scale=0.5)
    a_log, dt_bias = _randn(HV, seed=7, device=device, scale=0.3), torch.zeros(HV, device=device)
    state = _randn(HV, DK, DV, seed=8, device=device, scale=0.1)
    q, k, v, g, beta = gdn.gated_delta_prepare_reference(qkv, b, a, conv, weight, a_log, dt_bias, HK, DK,
                                                         torch.float64)
    want_out, want_states = gated_delta_states_reference(q, k, v, g, beta, state.double())
    pending = gdn.gated_delta_pending(2, L + 3, HK, DK, HV, DV, C, qkv.dtype, torch.float32, device)
    out = gdn_tri.gated_delta_verify_triton(qkv, b, a, conv, weight, a_log, dt_bias, state, HK, DK, pending, 1)
    scale = float(want_out.abs().max())
    torch.testing.assert_close(out.double(), want_out, atol=2e-5 * scale, rtol=0)
    for n in sorted({0, 1, L // 2, L - 1}):
        states = torch.stack((state, state))
        gdn_tri.gated_delta_commit_triton(torch.tensor([n], device=device), pending, L, states,
                                          torch.stack((conv, conv)))
        torch.testing.assert_close(states[1].double(), want_states[n], atol=2e-5 * float(want_states[n].abs().max()),
                                   rtol=0)


@pytest.mark.parametrize("solve", ["rows", "blocks"])
@pytest.mark.parametrize("L,spread", [(16, 0.02), (33, 0.02), (16, 1.0), (2, 0.0), (11, 0.02)])
def test_chunked_verify_on_nearly_repeating_keys_in_interpreter(interpreter, monkeypatch, L, spread, solve):
    """(block rows, key noise): the Qwen3.5 verify block (16), a block past 32 rows (64-row tiles), random keys,
    two identical tokens, a block that is not a whole number of solve blocks; each with the triangular solve row by
    row and by blocks ($FOLD_HF_GDN_SOLVE)."""
    from fold_hf.kernels.gated_delta import triton as gdn_tri

    monkeypatch.setenv(gdn_tri.SOLVE_ENV, solve)
    _check_chunked_verify_against_float64("cpu", L, 2, 4, 16, 16, spread)


def test_solve_blocks_setting(monkeypatch):
    """Blocks of about sqrt(L) rows (a power of two) under ``blocks``; none under ``rows`` or below 4 rows."""
    from fold_hf.kernels.gated_delta import triton as gdn_tri

    monkeypatch.delenv(gdn_tri.SOLVE_ENV, raising=False)
    assert gdn_tri._solve_block(16) == 0
    monkeypatch.setenv(gdn_tri.SOLVE_ENV, "blocks")
    assert [gdn_tri._solve_block(L) for L in (2, 3, 5, 16, 17, 33, 64)] == [0, 0, 4, 4, 8, 8, 8]
    monkeypatch.setenv(gdn_tri.SOLVE_ENV, "tiles")
    with pytest.raises(ValueError, match="FOLD_HF_GDN_SOLVE"):
        gdn_tri._solve_block(16)


@pytest.mark.gpu(reason="the kernels compiled for CUDA at the Qwen3.5-9B / Gemma-4 shapes")
@pytest.mark.parametrize("dtype", DTYPES)
def test_hybrid_kernels_on_gpu(dtype):
    _check_kernels("cuda", dtype, 3840, 16, 256, 64, 1088, 16)
    _check_kernels("cuda", dtype, 4096, 8, 512, 512, 4096, 7)
    _check_delta("cuda", dtype if dtype != torch.float16 else torch.bfloat16, 16, 16, 32, 128, 128, 4)
    _check_delta("cuda", torch.float32, 1, 16, 32, 128, 128, 4)
    for L in (16, 64):
        _check_chunked_verify_against_float64("cuda", L, 16, 32, 128, 128, 0.02)
    from fold_hf.kernels.gated_delta import triton as gdn_tri

    with pytest.MonkeyPatch.context() as mp:  # the triangular solve by blocks ($FOLD_HF_GDN_SOLVE=blocks)
        mp.setenv(gdn_tri.SOLVE_ENV, "blocks")
        for L in (16, 64):
            _check_chunked_verify_against_float64("cuda", L, 16, 32, 128, 128, 0.02)
        _check_delta("cuda", torch.float32, 16, 16, 32, 128, 128, 4)
    _check_delta_rows("cuda", torch.float32, 8, 16, 16, 32, 128, 128, 4)
    _check_delta_rows("cuda", torch.bfloat16, 3, 1, 16, 32, 128, 128, 4)


@pytest.mark.gpu(reason="bf16 fused layers of whole targets on CUDA against their module path")
@pytest.mark.parametrize("arch", ["qwen35", "gemma3", "gemma4"])
def test_fused_step_matches_the_module_step_in_bf16_on_gpu(arch):
    """One verify of 7 rows after a prefill: the fused step's logits and (Qwen3.5) committed states after accept(n)
    agree with the module step's in bf16 (the fp32 tests check exactness; this catches bf16-only kernel paths)."""
    from fold_hf.targets.registry import build_static_target
    from tiny import tiny_target

    if arch == "qwen35":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        torch.manual_seed(0)
        target = Qwen3_5ForCausalLM(Qwen3_5TextConfig(
            vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, linear_key_head_dim=64, linear_value_head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=None, pad_token_id=None))
    else:
        target = tiny_target(arch, seed=1, dtype=torch.float32)
    target = target.to(torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 10, (1, 40), generator=_gen(0)).cuda()
    positions = torch.arange(33, 40, device="cuda")
    outs = []
    for fused in (False, True):
        runner = build_static_target(target, capacity=64)
        runner.prefill(ids[:, :33])
        logits = runner.forward_static(ids[:, 33:], positions, 64, attention="triton", fused=fused).float()
        runner.accept(torch.tensor([3], device="cuda"))
        states = [t.float().clone() for t in runner.step_state()]
        outs.append((logits, states))
    (want, want_states), (got, got_states) = outs
    scale = want.abs().max()
    torch.testing.assert_close(got, want, atol=0.05 * scale, rtol=0.05)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.85
    for g_, w_ in zip(got_states, want_states):
        torch.testing.assert_close(g_, w_, atol=0.05 * (w_.abs().max() + 1e-3), rtol=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("what", ["ring", "global", "queries only"])
def test_head_norm_rope_write_rows_in_one_launch_is_each_rows_own(interpreter, dtype, what):
    """``head_norm_rope_write_rows_triton`` (the Gemma family's batched verify on CUDA): three rows of blocks of 4 at
    their own positions (2, 37, 70), heads read in place from one projection of the rows' tokens, written into cache
    rows 2, 0, 3 of a 4-row cache (a ring of 24 slots: slot p mod 24; a global cache of 96), or queries alone (a
    KV-shared layer): each row's q / k / v and its cache row equal the one-row kernel's for that row alone, bit for
    bit; the cache row no row writes is untouched."""
    from fold_hf.kernels.hybrid import triton as tri

    A, L, Hq, Hkv, D, R = 3, 4, 4, 2, 32, 16
    starts, rows = [2, 37, 70], [2, 0, 3]
    slots = 24 if what == "ring" else 96
    proj = _randn(A, L, (Hq + 2 * Hkv) * D, seed=20, dtype=dtype)
    q, k, v = (t.view(A, L, -1, D) for t in proj.split((Hq * D, Hkv * D, Hkv * D), -1))
    if what == "queries only":
        k = v = None
    qw, kw_ = _randn(D, seed=21, dtype=dtype), _randn(D, seed=22, dtype=dtype)
    cos, sin = _randn(100, R, seed=23, dtype=dtype), _randn(100, R, seed=24, dtype=dtype)
    positions = torch.tensor(starts)[:, None] + torch.arange(L)
    caches = [_randn(4, Hkv, slots, D, seed=25 + i, dtype=dtype) for i in range(2)]
    got_caches = [c.clone() for c in caches]
    got = tri.head_norm_rope_write_rows_triton(q, k, v, qw, kw_, 1e-6, 1.0, cos, sin, positions, *got_caches,
                                               torch.tensor(rows, dtype=torch.int32), norm_value=True)
    assert got[0].shape == (A, Hq, L, D) and (got[1] is None) == (k is None)
    for a, row in enumerate(rows):
        mine = [c[row : row + 1].clone() for c in caches]
        want = tri.head_norm_rope_write_triton(q[a : a + 1], None if k is None else k[a : a + 1],
                                               None if v is None else v[a : a + 1], qw, kw_, 1e-6, 1.0, cos, sin,
                                               positions[a], *mine, norm_value=True)
        for g_, w_ in zip(got, want):
            assert (g_ is None and w_ is None) or torch.equal(g_[a : a + 1], w_), (what, a)
        for g_, w_ in zip(got_caches, mine):
            assert torch.equal(g_[row], w_[0]), (what, row)
    for g_, c in zip(got_caches, caches):
        assert torch.equal(g_[1], c[1])
