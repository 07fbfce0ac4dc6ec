"""The pure-torch FOLD read against the paper's equations and its exact reductions."""

import math

import pytest
import torch

from fold_hf import FoldConfig
from fold_hf.modeling.fold_read import fold_attention_reference
from fold_hf.modeling import RotaryTables, plan_layer_read
from naive import fold_naive

THETA = 10000.0


def tables(head_dim=8, rotary_dim=None):
    rd = rotary_dim or head_dim
    inv = 1.0 / THETA ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd)
    return RotaryTables(inv, 1.0, head_dim)


def inputs(T, Lq=4, Hq=4, Hkv=2, d=8, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype)  # noqa: E731
    return mk(1, Hq, Lq, d), mk(1, Hkv, T, d), mk(1, Hkv, T, d), mk(1, Hkv, Lq, d), mk(1, Hkv, Lq, d)


def run(cfg, T, Lq=4, B=4, rope=None, t=None, sliding=None, **kw):
    q, kc, vc, kb, vb = inputs(T, Lq=Lq, **kw)
    rope = rope or tables(q.shape[-1])
    read = plan_layer_read(cfg, num_context=T, block_start=T if t is None else t, query_length=Lq,
                           block_size=B, rope=rope, sliding_window=sliding)
    out = fold_attention_reference(q, kc, vc, kb, vb, read, scaling=q.shape[-1] ** -0.5)
    return out, (q, kc, vc, kb, vb), read


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


GRID = [(a, T, (4, 2)) for a in (1.0, 2.0, 4.0, 16.0, math.inf) for T in (5, 16, 19, 20, 21, 23, 24, 25, 40)]
GRID += [(2.0, T, h) for T in (21, 40) for h in ((4, 1), (2, 2), (8, 2))]


@pytest.mark.parametrize("alpha, T, heads", GRID)
def test_matches_paper_equations(alpha, T, heads):
    W, B = 16, 4
    out, (q, kc, vc, kb, vb), _ = run(FoldConfig(window=W, alpha=alpha), T, B=B, Hq=heads[0], Hkv=heads[1])
    ref = fold_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, W=W, B=B, alpha=alpha, theta=THETA, rotary_dim=8,
                     scaling=8**-0.5)
    assert rel_err(out[0], ref) < 1e-12


@pytest.mark.parametrize("rotary_dim", [4, 6])
def test_partial_rotary_rotates_only_the_rotary_dims(rotary_dim):
    W, B, T = 8, 4, 30
    out, (q, kc, vc, kb, vb), _ = run(FoldConfig(window=W, alpha=2.0), T, B=B, rope=tables(8, rotary_dim))
    ref = fold_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, W=W, B=B, alpha=2.0, theta=THETA,
                     rotary_dim=rotary_dim, scaling=8**-0.5)
    assert rel_err(out[0], ref) < 1e-12


@pytest.mark.parametrize("T", [1, 7, 15, 16])
def test_context_within_window_equals_dflash(T):
    W = 16
    fold, *_ = run(FoldConfig(window=W, alpha=3.0), T)
    dflash, *_ = run(FoldConfig(mode="dflash", window=W), T)
    assert torch.equal(fold, dflash)


def test_alpha_one_is_one_softmax_over_position_mapped_logits():
    W, B, T = 12, 4, 50
    out, (q, kc, vc, kb, vb), _ = run(FoldConfig(window=W, alpha=1.0), T, B=B)
    ref = fold_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, W=W, B=B, alpha=1.0, theta=THETA, rotary_dim=8,
                     scaling=8**-0.5, single_softmax=True)
    assert rel_err(out[0], ref) < 1e-12


def test_large_alpha_approaches_a_top1_memory_read():
    cfg = dict(window=12)
    top1, *_ = run(FoldConfig(alpha=math.inf, **cfg), 60, scale=2.0)
    errs = [rel_err(run(FoldConfig(alpha=a, **cfg), 60, scale=2.0)[0], top1) for a in (2.0, 16.0, 256.0, 4096.0)]
    assert errs == sorted(errs, reverse=True)
    assert errs[-1] < 1e-6


def test_window_boundary_depends_on_the_row():
    W, B = 16, 4
    T = W + B + 2  # entries 0..T-1; block rows at T..T+3
    _, _, read = run(FoldConfig(window=W), T, B=B)
    region = read.region_mask()
    D = W + B
    for r in range(4):
        for j in range(T):
            expected = 1 if (T + r) - j < D else 2
            assert region[r, j].item() == expected, (r, j)
    # the W most recent entries are in every row's window; the B-1 before them only in the first rows
    assert bool((region[:, T - W : T] == 1).all())
    assert region[0, T - W - 1] == 1 and region[3, T - W - 1] == 2


def test_empty_far_memory_contributes_nothing():
    # T = W + 1 and D = W + B = 20: only the last row (p = 20) reaches entry 0 at distance D
    out_fold, _, read = run(FoldConfig(window=16, alpha=2.0), 17, Lq=4, B=4)
    out_window, *_ = run(FoldConfig(mode="window", window=16), 17, Lq=4, B=4)
    assert read.far_mask.any(-1).tolist() == [False, False, False, True]
    assert torch.equal(out_fold[:, :3], out_window[:, :3])
    assert not torch.allclose(out_fold[:, 3], out_window[:, 3])


def test_far_entries_are_position_free_and_window_entries_are_not():
    W, B, T = 8, 4, 40
    cfg = FoldConfig(window=W, alpha=2.0)
    q, kc, vc, kb, vb = inputs(T)
    read = plan_layer_read(cfg, num_context=T, block_start=T, query_length=4, block_size=B, rope=tables())
    base = fold_attention_reference(q, kc, vc, kb, vb, read, 8**-0.5)
    far_only = T - (W + B)  # entries 0..far_only-1 are far for every row
    perm = torch.cat((torch.randperm(far_only, generator=torch.Generator().manual_seed(3)), torch.arange(far_only, T)))
    permuted = fold_attention_reference(q, kc[:, :, perm], vc[:, :, perm], kb, vb, read, 8**-0.5)
    assert rel_err(permuted, base) < 1e-12
    swap = torch.arange(T)
    swap[[T - 1, T - 5]] = swap[[T - 5, T - 1]]
    moved = fold_attention_reference(q, kc[:, :, swap], vc[:, :, swap], kb, vb, read, 8**-0.5)
    assert rel_err(moved, base) > 1e-6


# One bf16 rounding of the output is 2^-9 relative; accumulating the logits, the exponentials and the weighted sums
# in bf16 (8 mantissa bits) instead of fp32 gives ~1.6e-2 here: the tolerance sits between the two.
BF16_OUTPUT_TOLERANCE = 2.0**-8


def bf16_read(T=300, **kw):
    """The reference's bf16 read and the fp64 read of the same (bf16-rounded) inputs, so that only the arithmetic
    differs."""
    _, (q, kc, vc, kb, vb), read = run(FoldConfig(window=32, alpha=2.0), T, **kw)
    low = [x.bfloat16() for x in (q, kc, vc, kb, vb)]
    exact = fold_attention_reference(*(x.double() for x in low), read, 8**-0.5)
    return fold_attention_reference(*low, read, 8**-0.5), exact, low, read


def test_bf16_inputs_accumulate_in_fp32():
    out, exact, _, _ = bf16_read()
    assert out.dtype == torch.bfloat16
    assert rel_err(out, exact) < BF16_OUTPUT_TOLERANCE


def test_the_bf16_tolerance_rejects_a_bf16_accumulator(monkeypatch):
    """The mutant the test above names: the same read with every accumulation in the input dtype (bf16)."""
    import fold_hf.modeling.fold_read as fold_read
    import fold_hf.modeling.rope as rope

    _, exact, low, read = bf16_read()
    for module in (fold_read, rope):
        monkeypatch.setattr(module, "compute_dtype", lambda dtype: dtype)
    mutant = fold_attention_reference(*low, read, 8**-0.5)
    assert rel_err(mutant, exact) > 2 * BF16_OUTPUT_TOLERANCE


@pytest.mark.parametrize("big", [1e4, -1e4])
def test_extreme_logits_stay_finite(big):
    out, *_ = run(FoldConfig(window=8, alpha=4.0), 50, dtype=torch.float32, scale=abs(big) ** 0.5)
    assert torch.isfinite(out).all()


def test_sliding_layer_keeps_native_window_and_reads_far_memory_only_when_asked():
    S, T, B = 10, 40, 4
    native, (q, kc, vc, kb, vb), read_native = run(FoldConfig(mode="dflash", window=16), T, B=B, sliding=S)
    assert read_native.far_stop == 0 and bool((read_native.region_mask()[:, : T - S] == 0).all())
    full_only, *_ = run(FoldConfig(window=16, layers="full"), T, B=B, sliding=S)
    assert torch.equal(full_only, native)
    every, _, read = run(FoldConfig(window=16, layers="all", alpha=2.0), T, B=B, sliding=S)
    # the sliding layer keeps its window S; its far memory sits at the pair's shared position t - (W + B)
    ref = fold_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, W=None, B=B, alpha=2.0, theta=THETA, rotary_dim=8,
                     scaling=8**-0.5, D=S, far_D=16 + B)
    assert rel_err(every[0], ref) < 1e-12


def test_window_mode_drops_far_entries():
    W, B, T = 8, 4, 30
    out, (q, kc, vc, kb, vb), _ = run(FoldConfig(mode="window", window=W), T, B=B)
    ref = fold_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, W=W, B=B, alpha=1.0, theta=THETA, rotary_dim=8,
                     scaling=8**-0.5, far=False)
    assert rel_err(out[0], ref) < 1e-12


# ReRoPE (distance D at every row, log 4096 scaling, scopes): tests/modeling/test_baselines.py


def test_streaming_keeps_sinks_and_recent_renumbered():
    T, budget, sinks = 30, 10, 4
    out, (q, kc, vc, kb, vb), read = run(FoldConfig(mode="streaming", window=8, budget=budget, sinks=sinks), T)
    keep = torch.cat((torch.arange(sinks), torch.arange(T - (budget - sinks), T)))
    assert read.near_index.tolist() == keep.tolist()
    # the same as dflash over the kept entries only, renumbered 0..budget-1
    dense, *_ = run(FoldConfig(mode="dflash", window=8), budget)
    q2, kc2, vc2, kb2, vb2 = q, kc[:, :, keep], vc[:, :, keep], kb, vb
    read2 = plan_layer_read(FoldConfig(mode="dflash", window=8), num_context=budget, block_start=budget,
                            query_length=4, block_size=4, rope=tables())
    assert rel_err(out, fold_attention_reference(q2, kc2, vc2, kb2, vb2, read2, 8**-0.5)) < 1e-12
    del dense


def test_yarn_rescales_rope_per_request():
    from fold_hf.modeling.rope import yarn_factor

    assert yarn_factor(1000, 16, 4096) == 1.0
    assert yarn_factor(8000, 16, 4096) == math.ceil(8016 / 256) * 256 / 4096
