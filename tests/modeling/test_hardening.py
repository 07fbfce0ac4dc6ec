"""Issue #6 hardening: every window boundary named explicitly, the whole drafter against a naive restatement,
generation edge cases on both paths, and checkpoints that must be refused with an error naming file and field.

Complements test_properties.py (hypothesis over random geometry), test_generation_features.py and
test_loader.py; what they already cover is not repeated here.
"""

import json
import math
import pickle
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fold_hf
from fold_hf import FoldConfig, FoldDrafter
from fold_hf.modeling.fold_read import fold_attention_reference
from fold_hf.modeling import RotaryTables, plan_layer_read
from naive import fold_naive
from tiny import MASK_ID, greedy_reference, tiny_drafter, tiny_target
from tiny import prompt as tiny_prompt

THETA = 10000.0

# the context lengths at which the read changes shape (docs/design.md §2): the W most recent entries are in every row's
# window, the B-1 before them in the window of the first rows only, anything older is far for every row
BOUNDARIES = {
    "W-1": lambda W, B: W - 1,
    "W": lambda W, B: W,
    "W+1": lambda W, B: W + 1,
    "W+B-1": lambda W, B: W + B - 1,
    "W+B": lambda W, B: W + B,
    "W+B+1": lambda W, B: W + B + 1,
}


def tables(head_dim: int, rotary_dim: int | None = None) -> RotaryTables:
    rd = rotary_dim or head_dim
    return RotaryTables(1.0 / THETA ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd), 1.0, head_dim)


def layer_inputs(T, B, Hq=4, Hkv=2, d=8, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda *s: (torch.randn(*s, generator=g, dtype=torch.float64) * scale).to(dtype)  # noqa: E731
    return mk(1, Hq, B, d), mk(1, Hkv, T, d), mk(1, Hkv, T, d), mk(1, Hkv, B, d), mk(1, Hkv, B, d)


def plan(cfg, T, B, rope):
    return plan_layer_read(cfg, num_context=T, block_start=T, query_length=B, block_size=B, rope=rope)


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


# ------------------------------------------------------------------------------------------ the read, per boundary
@pytest.mark.parametrize("boundary", list(BOUNDARIES))
@pytest.mark.parametrize("W, B", [(1, 1), (1, 4), (5, 3), (8, 4), (3, 7)])
def test_read_at_every_boundary_matches_the_equations(boundary, W, B):
    T = BOUNDARIES[boundary](W, B)
    q, kc, vc, kb, vb = tensors = layer_inputs(T, B, seed=T * 31 + B)
    rope = tables(8)
    for alpha in (1.0, 2.0, 7.5, 64.0, math.inf):
        out = fold_attention_reference(*tensors, plan(FoldConfig(window=W, alpha=alpha), T, B, rope), 8**-0.5)
        ref = fold_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, W=W, B=B, alpha=alpha, theta=THETA, rotary_dim=8,
                         scaling=8**-0.5)
        assert torch.isfinite(out).all()
        assert rel_err(out[0], ref) < 1e-12, (boundary, alpha)
    dflash = fold_attention_reference(*tensors, plan(FoldConfig(mode="dflash", window=W), T, B, rope), 8**-0.5)
    fold = fold_attention_reference(*tensors, plan(FoldConfig(window=W, alpha=3.0), T, B, rope), 8**-0.5)
    if T <= W:  # exact reduction: nothing is far yet
        assert torch.equal(fold, dflash)
    elif T == W + 1 and B == 1:  # one far entry, j = t - D: its virtual distance D + r is its true distance
        assert torch.allclose(fold, dflash, rtol=0, atol=1e-12)
    else:  # the last row reads entry 0 (or more) as far at a distance other than its own: the read departs
        assert not torch.allclose(fold[:, -1], dflash[:, -1], rtol=0, atol=1e-9)
    one = fold_attention_reference(*tensors, plan(FoldConfig(window=W, alpha=1.0), T, B, rope), 8**-0.5)
    single = fold_naive(q[0], kc[0], vc[0], kb[0], vb[0], t=T, W=W, B=B, alpha=1.0, theta=THETA, rotary_dim=8,
                        scaling=8**-0.5, single_softmax=True)
    assert rel_err(one[0], single) < 1e-12


@pytest.mark.parametrize("boundary", list(BOUNDARIES))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(W=st.integers(2, 10), B=st.integers(2, 6), alpha=st.floats(1.0, 64.0), seed=st.integers(0, 2**16))
def test_permutations_at_every_boundary(boundary, W, B, alpha, seed):
    """Far entries are position-free (any permutation of them leaves the read unchanged); window entries are not."""
    T = BOUNDARIES[boundary](W, B)
    q, kc, vc, kb, vb = layer_inputs(T, B, seed=seed)
    read = plan(FoldConfig(window=W, alpha=alpha), T, B, tables(8))
    base = fold_attention_reference(q, kc, vc, kb, vb, read, 8**-0.5)
    far_for_every_row = max(0, T - (W + B) + 1)
    if far_for_every_row >= 2:  # only W+B+1 among the boundaries has two entries far for every row
        g = torch.Generator().manual_seed(seed)
        perm = torch.cat((torch.randperm(far_for_every_row, generator=g), torch.arange(far_for_every_row, T)))
        moved = fold_attention_reference(q, kc[:, :, perm], vc[:, :, perm], kb, vb, read, 8**-0.5)
        assert torch.allclose(moved, base, rtol=0, atol=1e-12)
    if T >= 2:  # the two newest entries are in every row's window: swapping them moves their rotary positions
        swap = torch.arange(T)
        swap[[T - 1, T - 2]] = swap[[T - 2, T - 1]]
        moved = fold_attention_reference(q, kc[:, :, swap], vc[:, :, swap], kb, vb, read, 8**-0.5)
        assert not torch.allclose(moved, base, rtol=0, atol=1e-9)


def convex_hull_check(out, vc, vb, slack):
    """Attention output is a weighted average of values: inside [min v, max v] per channel (batch 1)."""
    values = torch.cat((vc, vb), dim=2).double()  # [1, Hkv, N, Dv]
    lo, hi = values.amin(dim=(1, 2)), values.amax(dim=(1, 2))  # [1, Dv]
    o = out.double()  # [1, Lq, Hq, Dv]
    assert bool((o >= lo[:, None, None] - slack).all() and (o <= hi[:, None, None] + slack).all())


@pytest.mark.parametrize("boundary", list(BOUNDARIES))
@pytest.mark.parametrize("sign_far", [1.0, -1.0])
def test_logits_of_1e4_in_fp32_and_large_bf16_values(boundary, sign_far):
    """Logits reaching +-1e4 (window and far branch pushed to opposite extremes) stay finite and convex."""
    W, B = 6, 4
    T = BOUNDARIES[boundary](W, B) + 5  # a few entries further so the far memory is populated at every boundary
    q, kc, vc, kb, vb = layer_inputs(T, B, seed=T)
    # unit-norm queries/keys and scaling 1e4: every logit lies in [-1e4, 1e4] and the extremes are reached
    q, kc, kb = (x / x.norm(dim=-1, keepdim=True) for x in (q, kc, kb))
    kc = kc.clone()
    kc[:, :, : T - (W + B)] *= sign_far  # flip the far keys: their logits move to the other extreme
    for alpha in (1.0, 4.0, 64.0, math.inf):
        read = plan(FoldConfig(window=W, alpha=alpha), T, B, tables(8))
        args = [x.float() for x in (q, kc, vc, kb, vb)]
        out = fold_attention_reference(*args, read, scaling=1e4)
        assert torch.isfinite(out).all()
        convex_hull_check(out, args[2], args[4], slack=1e-4)
        # bf16: values of magnitude ~1e3, logits ~1e4 (bf16 keeps the exponent range of fp32)
        big = [x.bfloat16() for x in (q * 30, kc * 30, vc * 1e3, kb * 30, vb * 1e3)]
        out16 = fold_attention_reference(*big, read, scaling=10.0)
        assert out16.dtype == torch.bfloat16 and torch.isfinite(out16).all()
        convex_hull_check(out16, big[2], big[4], slack=40.0)


# ------------------------------------------------------------------------------------- the drafter, per boundary
def naive_drafter_hidden(drafter, feats, noise, W, alpha, mode="fold"):
    """The drafter's forward restated from docs/design.md §4 with the loop-based FOLD read of tests/naive.py.

    feats ``[1, T, n_taps * H]`` (all context at once), noise ``[1, B, H]``; returns ``[B, H]`` after the final norm.
    """
    T, B = feats.shape[1], noise.shape[1]
    context = drafter.hidden_norm(drafter.fc(feats))[0]  # [T, H]
    hidden = noise[0]
    for layer in drafter.layers:
        attn = layer.self_attn
        hd = attn.head_dim

        def heads(x, proj, n, norm=None):
            y = proj(x).view(x.shape[0], n, hd)
            return (norm(y) if norm is not None else y).transpose(0, 1)  # [n, L, hd]

        x = layer.input_layernorm(hidden)
        q = heads(x, attn.q_proj, attn.num_heads, attn.q_norm)
        kb, vb = heads(x, attn.k_proj, attn.num_kv_heads, attn.k_norm), heads(x, attn.v_proj, attn.num_kv_heads)
        kc = heads(context, attn.k_proj, attn.num_kv_heads, attn.k_norm)
        vc = heads(context, attn.v_proj, attn.num_kv_heads)
        window = W if mode == "fold" else 10**9  # dflash: every entry inside the window, at its true distance
        o = fold_naive(q, kc, vc, kb, vb, t=T, W=window, B=B, alpha=alpha, theta=THETA, rotary_dim=hd,
                       scaling=hd**-0.5)  # [B, Hq, hd]
        hidden = hidden + attn.o_proj(o.reshape(B, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return drafter.norm(hidden)


@pytest.fixture(scope="module")
def boundary_pair():
    target = tiny_target("qwen3", seed=21)
    drafter = tiny_drafter(target, block=4, seed=22)
    drafter.bind_target(target)
    return target, drafter


@pytest.mark.parametrize("boundary", list(BOUNDARIES))
def test_drafter_forward_with_fold_cache_matches_naive_restatement(boundary_pair, boundary):
    target, drafter = boundary_pair
    W, B = 6, drafter.block_size
    T = BOUNDARIES[boundary](W, B)
    g = torch.Generator().manual_seed(T)
    feats = torch.randn(1, T, 2 * target.config.hidden_size, generator=g, dtype=torch.float64)
    ids = torch.full((1, B), MASK_ID)
    ids[0, 0] = 3
    noise = target.get_input_embeddings()(ids)
    with torch.no_grad():
        for mode, alpha in (("fold", 2.0), ("fold", 1.0), ("fold", 64.0), ("dflash", 1.0)):
            drafter.set_fold_config(FoldConfig(mode=mode, window=W, alpha=alpha))
            cache = drafter.new_cache()
            # commit all but the newest entry first, then the newest with the block, as generation does
            if T > 1:
                drafter(noise, feats[:, : T - 1], cache=cache)
            out = drafter(noise, feats[:, T - 1 :] if T else None, cache=cache).last_hidden_state[0]
            assert cache.get_seq_length() == T
            ref = naive_drafter_hidden(drafter, feats, noise, W, alpha, mode)
            assert torch.isfinite(out).all()
            assert rel_err(out, ref) < 1e-10, (boundary, mode, alpha)


# ------------------------------------------------------------------------------------------ generation edge cases


def prompt(seed, length):
    return tiny_prompt(seed, length, offset=5000)


def both_paths(target, drafter, ids, **kw):
    ours = fold_hf.generate(target, drafter, input_ids=ids, return_stats=True, **kw)
    hf = target.generate(ids, assistant_model=drafter, do_sample=False, **kw)
    return ours, hf


@pytest.mark.parametrize("length", [1, 15, 16, 17, 19, 20, 21])  # 1 token; W-1, W, W+1; W+B-1, W+B, W+B+1
def test_prompt_lengths_at_the_window_boundaries_on_both_paths(tiny_pair, length):
    target, drafter = tiny_pair
    ids = prompt(length, length)
    ref = greedy_reference(target, ids, 30)
    ours, hf = both_paths(target, drafter, ids, max_new_tokens=30)
    assert torch.equal(ours.sequences, ref) and torch.equal(hf, ref)
    assert max(ours.acceptance_lengths) >= 2  # the drafter did contribute: the context crossed the boundary in blocks


def test_max_length_reached_mid_block_on_both_paths(tiny_pair):
    target, drafter = tiny_pair
    ids = prompt(1, 23)
    mid_block = 0
    for extra in range(6, 16):
        max_length = ids.shape[1] + extra
        ref = target.generate(ids, max_length=max_length, do_sample=False)
        assert ref.shape[1] == max_length
        ours = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=None, max_length=max_length,
                                return_stats=True)
        hf = target.generate(ids, assistant_model=drafter, max_length=max_length, do_sample=False)
        assert torch.equal(ours.sequences, ref) and torch.equal(hf, ref), extra
        # the same drafts without the limit: did the limit cut a round that would have accepted more?
        free = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=40, return_stats=True)
        committed = 1 + torch.tensor(free.acceptance_lengths).cumsum(0)
        mid_block += int(extra not in committed.tolist())
    assert mid_block >= 3  # the limit fell inside a block several times


def test_eos_inside_an_accepted_block_ends_exactly_there_on_both_paths(tiny_pair):
    target, drafter = tiny_pair
    found = 0
    for seed in range(40):
        ids = prompt(100 + seed, 30)
        free = fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=40, return_stats=True, eos_token_id=[])
        new = free.sequences[0, ids.shape[1]:].tolist()
        # token index i (in the new tokens) accepted as a draft that is not the last token of its round
        starts = [1]
        for a in free.acceptance_lengths:
            starts.append(starts[-1] + a)
        inside = [i for s, e in zip(starts, starts[1:]) for i in range(s, e - 1)]
        inside = [i for i in inside if new[i] not in new[:i] and new[i] != ids[0, -1].item()]
        if not inside:
            continue
        i = inside[0]
        eos = new[i]
        ref = target.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=eos)
        assert ref.shape[1] == ids.shape[1] + i + 1 and ref[0, -1].item() == eos
        ours, hf = both_paths(target, drafter, ids, max_new_tokens=40, eos_token_id=eos)
        assert torch.equal(ours.sequences, ref), seed
        assert torch.equal(hf, ref), seed
        assert ours.finish_reason == "eos"
        assert 1 + sum(ours.acceptance_lengths) > ours.num_new_tokens  # the round did commit past the eos
        found += 1
        if found == 3:
            break
    assert found == 3, "no eos landed inside an accepted block: the test did not exercise its case"


def test_one_drafter_two_targets_on_the_hf_path(tiny_pair):
    target, drafter = tiny_pair
    other = tiny_target("llama", seed=99)
    ids = prompt(7, 30)
    for t in (other, target, other, target):
        out = t.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False)
        assert torch.equal(out, greedy_reference(t, ids, 20))


# --------------------------------------------------------------------------------------------- bad checkpoints
@pytest.fixture(scope="module")
def small_target():
    return tiny_target("qwen3", seed=7, dtype=torch.float32)


@pytest.fixture
def checkpoint(tmp_path, small_target):
    """A valid drafter checkpoint for ``small_target`` (written by save_pretrained)."""
    drafter = tiny_drafter(small_target, seed=3).float()
    drafter.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


class _Marker:
    """Unpickling (or importing) this creates a file: proof that code from the checkpoint ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_pickle_weights_are_refused_without_unpickling(checkpoint, tmp_path):
    marker = tmp_path / "unpickled"
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / "pytorch_model.bin").write_bytes(pickle.dumps({"fc.weight": _Marker(marker)}))
    assert not marker.exists()
    pickle.loads((checkpoint / "pytorch_model.bin").read_bytes())  # the trap works when unpickled ...
    assert marker.exists()
    marker.unlink()
    with pytest.raises(ValueError, match=r"(?s)pickle.*pytorch_model.bin.*safetensors") as err:
        FoldDrafter.from_pretrained(checkpoint)
    assert str(checkpoint) in str(err.value)
    assert not marker.exists()  # ... and the loader never unpickled it
    # an index that points at the pickle file is no way around it
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight":
                                                                                        "pytorch_model.bin"}}))
    with pytest.raises(ValueError, match="pytorch_model.bin"):
        FoldDrafter.from_pretrained(checkpoint)
    assert not marker.exists()


def test_remote_code_in_a_checkpoint_is_never_run(checkpoint, tmp_path, small_target):
    marker = tmp_path / "imported"
    code = f"from pathlib import Path\nPath({str(marker)!r}).touch()\nclass DFlashDraftModel: pass\n"
    for name in ("modeling_dflash.py", "configuration_dflash.py", "dflash.py", "__init__.py"):
        (checkpoint / name).write_text(code)
    config = json.loads((checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_dflash.DFlashConfig",
                          "AutoModel": "modeling_dflash.DFlashDraftModel"}
    config["trust_remote_code"] = True
    (checkpoint / "config.json").write_text(json.dumps(config))
    drafter = FoldDrafter.from_pretrained(checkpoint)
    assert not marker.exists()
    assert type(drafter) is FoldDrafter
    ids = torch.randint(0, MASK_ID, (1, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(fold_hf.generate(small_target, drafter, input_ids=ids, max_new_tokens=6),
                       greedy_reference(small_target, ids, 6))
    with pytest.raises(TypeError, match="trust_remote_code"):
        FoldDrafter.from_pretrained(checkpoint, trust_remote_code=True)
    assert not marker.exists()


def _edit_config(checkpoint, edit):
    config = json.loads((checkpoint / "config.json").read_text())
    edit(config)
    (checkpoint / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda c: c["dflash_config"].pop("mask_token_id"), "mask_token_id"),
        (lambda c: c["dflash_config"].update(block_size=1), "block_size"),
        (lambda c: c["dflash_config"].pop("block_size"), "block_size"),
        (lambda c: c["dflash_config"].update(target_layer_ids=[]), "target_layer_ids"),
        (lambda c: c.pop("num_target_layers"), "num_target_layers"),
        (lambda c: c.pop("vocab_size"), "vocab_size"),
        (lambda c: (c.pop("rope_parameters", None), c.pop("rope_theta", None)), "rope_theta"),
        (lambda c: c.pop("dflash_config"), "block_size"),
    ],
)
def test_config_missing_a_required_dflash_field_is_refused(checkpoint, edit, field):
    """No silent default for a field the drafter cannot work without; the error names file and field."""
    _edit_config(checkpoint, edit)
    with pytest.raises(ValueError, match=field) as err:
        FoldDrafter.from_pretrained(checkpoint)
    assert str(checkpoint / "config.json") in str(err.value)


def test_shape_mismatch_names_file_tensor_and_both_shapes(checkpoint):
    _edit_config(checkpoint, lambda c: c.update(num_key_value_heads=1))
    with pytest.raises(ValueError) as err:
        FoldDrafter.from_pretrained(checkpoint)
    message = str(err.value)
    assert str(checkpoint / "model.safetensors") in message
    assert "self_attn.k_proj.weight" in message or "self_attn.v_proj.weight" in message
    assert "(16, 32)" in message and "(8, 32)" in message  # 2 KV heads x 8 in the file, 1 x 8 from the config


@pytest.mark.parametrize("change, field", [(dict(hidden_size=48, head_dim=12), "hidden_size"),
                                           (dict(vocab_size=13), "vocab_size"),
                                           (dict(layers=4), "num_target_layers")])
def test_drafter_for_another_target_names_field_and_checkpoint(checkpoint, change, field):
    drafter = FoldDrafter.from_pretrained(checkpoint)
    change = dict(change)
    other = tiny_target("qwen3", seed=8, dtype=torch.float32, vocab=change.pop("vocab_size", 12),
                        layers=change.pop("layers", 6))
    if change:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        cfg = Qwen3Config(**{**other.config.to_dict(), **change})
        other = Qwen3ForCausalLM(cfg).float().eval()
        other.generation_config.eos_token_id = None
    ids = torch.randint(0, 11, (1, 10), generator=torch.Generator().manual_seed(0))
    for run in (lambda: fold_hf.generate(other, drafter, input_ids=ids, max_new_tokens=4),
                lambda: other.generate(ids, assistant_model=drafter, max_new_tokens=4, do_sample=False)):
        with pytest.raises(ValueError, match=field) as err:
            run()
        assert str(checkpoint / "config.json") in str(err.value)
