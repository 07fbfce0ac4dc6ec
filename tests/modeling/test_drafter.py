"""FoldDrafter: cache behaviour, reductions at drafter level, other attention implementations, training forward."""

import pytest
import torch

from fold_hf import FoldConfig
from fold_hf.targets.taps import HiddenTaps
from fold_hf.training import dflash_loss, drafter_block_hidden, spread_positions
from tiny import MASK_ID, share, tiny_drafter, tiny_target


def block_embeds(target, last_token, B):
    ids = torch.full((1, B), MASK_ID)
    ids[0, 0] = last_token
    return target.get_input_embeddings()(ids)


def taps_of(target, drafter, ids):
    taps = HiddenTaps(target, drafter.config.target_layer_ids)
    with taps, torch.no_grad():
        target(ids)
    return taps.features()


@pytest.fixture(scope="module")
def pair():
    target = tiny_target("qwen3", seed=3)
    # shared by the module's tests: its fold config is restored after each (tests/conftest.py, restore_pairs)
    drafter = share(tiny_drafter(target, block=4, fold_config=FoldConfig(window=8, alpha=2.0)))
    drafter.bind_target(target)
    ids = torch.randint(0, MASK_ID, (1, 60), generator=torch.Generator().manual_seed(0))
    return target, drafter, ids, taps_of(target, drafter, ids)


def draft_hidden(drafter, target, feats, chunks, T, last_token=3, **cache_kw):
    cache = drafter.new_cache(**cache_kw)
    pos = 0
    for n in chunks:
        cache_feats = feats[:, pos : pos + n]
        drafter(block_embeds(target, last_token, drafter.block_size), cache_feats, cache=cache)
        pos += n
    assert pos == T
    with torch.no_grad():
        out = drafter(block_embeds(target, last_token, drafter.block_size), None, cache=cache).last_hidden_state
    return out, cache


@pytest.mark.parametrize("mode", ["fold", "dflash", "window", "streaming", "rerope", "yarn"])
def test_result_does_not_depend_on_how_context_was_committed(pair, mode):
    target, drafter, _, feats = pair
    drafter.set_fold_config(FoldConfig(mode=mode, window=8, budget=12 if mode == "streaming" else None))
    with torch.no_grad():
        once, _ = draft_hidden(drafter, target, feats, [50], 50)
        many, _ = draft_hidden(drafter, target, feats, [7, 1, 1, 13, 2, 26], 50)
    assert torch.allclose(once, many, rtol=0, atol=1e-12)


def test_fold_equals_dflash_when_context_fits_the_window(pair):
    target, drafter, _, feats = pair
    with torch.no_grad():
        drafter.set_fold_config(FoldConfig(window=16, alpha=4.0))
        fold, _ = draft_hidden(drafter, target, feats, [16], 16)
        drafter.set_fold_config(FoldConfig(mode="dflash"))
        dflash, _ = draft_hidden(drafter, target, feats, [16], 16)
        assert torch.equal(fold, dflash)
        drafter.set_fold_config(FoldConfig(window=16, alpha=4.0))
        fold_long, _ = draft_hidden(drafter, target, feats, [40], 40)
        drafter.set_fold_config(FoldConfig(mode="dflash"))
        dflash_long, _ = draft_hidden(drafter, target, feats, [40], 40)
    assert not torch.allclose(fold_long, dflash_long)


def test_cache_holds_unrotated_keys(pair):
    target, drafter, _, feats = pair
    drafter.set_fold_config(FoldConfig(window=8))
    with torch.no_grad():
        _, cache = draft_hidden(drafter, target, feats, [30], 30)
        context = drafter.context_features(feats[:, :30])
        attn = drafter.layers[0].self_attn
        expected = attn._heads(context, attn.k_proj, attn.num_kv_heads, attn.k_norm)
    keys, values = cache.layers[0].context()
    assert torch.equal(keys, expected)
    assert cache.get_seq_length() == 30


def test_rotated_copy_layout_reads_the_same_and_costs_a_third_more(pair):
    target, drafter, _, feats = pair
    drafter.set_fold_config(FoldConfig(window=8))
    with torch.no_grad():
        one, c1 = draft_hidden(drafter, target, feats, [50], 50)
        two, c2 = draft_hidden(drafter, target, feats, [50], 50, keep_rotated_copy=True)
    assert torch.allclose(one, two, rtol=0, atol=1e-12)
    assert c2.bytes_used() * 2 == c1.bytes_used() * 3  # K + V + rotated K vs K + V
    per_entry = 2 * drafter.config.num_key_value_heads * 8 * 8  # K and V, fp64
    assert c1.bytes_used() == per_entry * 50 * len(drafter.layers)
    assert c1.bytes_held() >= c1.bytes_used()


def test_cache_crop_semantics(pair):
    target, drafter, _, feats = pair
    with torch.no_grad():
        _, cache = draft_hidden(drafter, target, feats, [30], 30)
    cache.crop(0)
    assert cache.get_seq_length() == 30
    cache.crop(-4)
    assert cache.get_seq_length() == 26
    cache.crop(20)  # legacy: absolute length to keep
    assert cache.get_seq_length() == 20
    cache.crop(-100)
    assert cache.get_seq_length() == 0


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_other_attention_implementations_agree_in_dflash_mode(pair, impl):
    target, drafter, _, feats = pair
    drafter.set_fold_config(FoldConfig(mode="dflash"))
    with torch.no_grad():
        ours, _ = draft_hidden(drafter, target, feats, [30], 30)
        drafter.config._attn_implementation = impl
        try:
            theirs, _ = draft_hidden(drafter, target, feats, [30], 30)
            drafter.set_fold_config(FoldConfig(window=8))
            with pytest.raises(ValueError, match="attn_implementation"):
                draft_hidden(drafter, target, feats, [30], 30)
        finally:
            drafter.config._attn_implementation = "fold"
    # eager takes its softmax in fp32 even for fp64 inputs
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-10 if impl == "sdpa" else 1e-5)


def test_custom_mask_function_changes_what_is_read(pair):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    from fold_hf.modeling.attention import fold_mask

    target, drafter, _, feats = pair
    drafter.set_fold_config(FoldConfig(window=8))
    calls = []

    def window_only(fold_read=None, **kw):
        region = fold_mask(fold_read=fold_read, **kw).clone()
        calls.append(region.shape)
        region[region == 2] = 0  # drop the far memory
        return region

    with torch.no_grad():
        ALL_MASK_ATTENTION_FUNCTIONS.register("fold", window_only)
        try:
            masked, _ = draft_hidden(drafter, target, feats, [40], 40)
        finally:
            ALL_MASK_ATTENTION_FUNCTIONS.register("fold", fold_mask)
        drafter.set_fold_config(FoldConfig(mode="window", window=8))
        window, _ = draft_hidden(drafter, target, feats, [40], 40)
    assert calls and torch.allclose(masked, window, rtol=0, atol=1e-12)


def training_case(seed: int, sequences: int, anchors: torch.Tensor):
    """A dflash drafter (block 4; a sliding and a full layer) on a tiny Llama, ``sequences`` random 40-token
    sequences, their taps, and the embeddings of the blocks ``[last, mask x 3]`` at ``anchors [b, n]``
    (stacked ``[b, n * 4, H]``, as the training forward takes them)."""
    target = tiny_target("llama", seed=seed)
    drafter = tiny_drafter(target, block=4, fold_config=FoldConfig(mode="dflash"), layer_types=["sliding_attention",
                           "full_attention"], sliding_window=12)
    drafter.bind_target(target)
    ids = torch.randint(0, MASK_ID, (sequences, 40), generator=torch.Generator().manual_seed(seed - 3))
    feats = taps_of(target, drafter, ids)
    ids_blocks = torch.full((*anchors.shape, 4), MASK_ID)
    ids_blocks[:, :, 0] = ids.gather(1, anchors)
    embeds = target.get_input_embeddings()(ids_blocks.reshape(sequences, -1))
    return drafter, ids, feats, embeds


def test_training_forward_matches_inference_per_anchor():
    anchors = torch.tensor([3, 17, 30])
    drafter, ids, feats, embeds = training_case(4, 1, anchors[None])
    with torch.no_grad():
        train = drafter_block_hidden(drafter, feats, embeds, anchors).view(3, 4, -1)
        for i, a in enumerate(anchors.tolist()):
            cache = drafter.new_cache()
            infer = drafter(embeds[:, 4 * i : 4 * i + 4], feats[:, :a], cache=cache).last_hidden_state[0]
            assert torch.allclose(train[i], infer, rtol=0, atol=1e-10)


def test_a_batch_trains_like_its_sequences_one_by_one():
    """One batched forward (what train-drafter runs) gives every sequence the blocks, loss and gradient it gets
    alone: blocks at different anchors per sequence, a sliding layer, the loss = mean of the sequences' losses."""
    anchors = torch.tensor([[3, 17, 30], [5, 6, 38], [20, 21, 22]])  # the last block of row 1 overhangs L
    drafter, ids, feats, embeds = training_case(5, 3, anchors)
    with torch.no_grad():
        batched = drafter_block_hidden(drafter, feats, embeds, anchors)
        for s in range(3):
            alone = drafter_block_hidden(drafter, feats[s : s + 1], embeds[s : s + 1], anchors[s])
            assert torch.allclose(batched[s], alone[0], rtol=0, atol=1e-10)
    loss, info = dflash_loss(drafter, feats, ids, anchors)
    grads = torch.autograd.grad(loss, list(drafter.parameters()))
    losses = []
    for s in range(3):
        one, _ = dflash_loss(drafter, feats[s : s + 1], ids[s : s + 1], anchors[s])
        losses.append(one)
    mean = torch.stack(losses).mean()
    assert torch.allclose(loss, mean, rtol=1e-12, atol=0)
    for got, want in zip(grads, torch.autograd.grad(mean, list(drafter.parameters()))):
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-12)
    assert info["accuracy"].shape == (3,) and bool(((info["accuracy"] >= 0) & (info["accuracy"] <= 1)).all())


def test_spread_positions_cut_each_window_once_within_the_span():
    """PoSE as its paper states it, checked row by row: position 0 first, steps of 1 but at one cut, where the step is
    1 + the skip, the last position below the span; a span no longer than the window gives true positions."""
    gen = torch.Generator().manual_seed(0)
    rows = spread_positions(50, 200, count=400, generator=gen)
    assert rows.shape == (400, 50) and rows.dtype == torch.long
    skips, cuts = [], []
    for row in rows.tolist():
        steps = [b - a for a, b in zip(row, row[1:])]
        assert row[0] == 0 and row[-1] <= 199 and all(step >= 1 for step in steps)
        jumps = [j for j, step in enumerate(steps) if step != 1]
        assert len(jumps) <= 1
        if jumps:
            cuts.append(jumps[0] + 1)
            skips.append(steps[jumps[0]] - 1)
    # the skip is uniform over 0 .. 150 and the cut over 1 .. 49: both ends are reached, most rows are spread
    assert len(skips) > 380 and max(skips) >= 140 and min(cuts) <= 3 and max(cuts) >= 47
    assert torch.equal(spread_positions(50, 50, count=2), torch.arange(50).expand(2, -1))
    assert torch.equal(spread_positions(50, 10), torch.arange(50)[None])


def test_spread_positions_train_what_inference_reads_over_a_context_with_a_gap():
    """The training forward at spread positions (cut c, skip s) is the inference forward over a context that has s
    unread entries at index c (dropped by a mask function registered here): the entries from c on then sit s further
    on, and so does the block. Anchors before and after the cut; a sliding and a full layer."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    from fold_hf.modeling.attention import fold_mask

    cut, skip = 12, 9
    anchors = torch.tensor([5, 17, 30])
    drafter, ids, feats, embeds = training_case(6, 1, anchors[None])
    positions = torch.arange(40) + skip * (torch.arange(40) >= cut)
    gap = torch.randn(1, skip, feats.shape[-1], generator=torch.Generator().manual_seed(1), dtype=feats.dtype)
    dropped = []

    def without_the_gap(fold_read=None, **kw):
        region = fold_mask(fold_read=fold_read, **kw).clone()
        region[..., cut : cut + skip] = 0
        dropped.append(1)
        return region

    with torch.no_grad():
        train = drafter_block_hidden(drafter, feats, embeds, anchors, positions[None]).view(3, 4, -1)
        plain = drafter_block_hidden(drafter, feats, embeds, anchors).view(3, 4, -1)
        for i, a in enumerate(anchors.tolist()):
            block = embeds[:, 4 * i : 4 * i + 4]
            if a <= cut:  # the cut lies after the anchor: nothing it reads moved
                infer = drafter(block, feats[:, :a], cache=drafter.new_cache()).last_hidden_state[0]
            else:
                context = torch.cat((feats[:, :cut], gap, feats[:, cut:a]), dim=1)
                ALL_MASK_ATTENTION_FUNCTIONS.register("fold", without_the_gap)
                try:
                    infer = drafter(block, context, cache=drafter.new_cache()).last_hidden_state[0]
                finally:
                    ALL_MASK_ATTENTION_FUNCTIONS.register("fold", fold_mask)
                assert not torch.allclose(train[i], plain[i], rtol=0, atol=1e-6)  # the spread changed what it read
            assert torch.allclose(train[i], infer, rtol=0, atol=1e-10)
    assert dropped
    loss_true, _ = dflash_loss(drafter, feats, ids, anchors, positions=torch.arange(40)[None])
    loss_default, _ = dflash_loss(drafter, feats, ids, anchors)
    loss_spread, _ = dflash_loss(drafter, feats, ids, anchors, positions=positions[None])
    assert torch.equal(loss_true, loss_default) and not torch.equal(loss_spread, loss_default)
    # one row of positions serves every sequence of a batch ([L] or [1, L], as the docstring says)
    anchors2 = torch.tensor([[17, 30], [20, 33]])
    drafter, ids, feats, embeds = training_case(7, 2, anchors2)
    with torch.no_grad():
        shared = drafter_block_hidden(drafter, feats, embeds, anchors2, positions)
        each = drafter_block_hidden(drafter, feats, embeds, anchors2, positions.expand(2, -1))
    assert torch.equal(shared, each)


def test_slot_target_logits_pick_the_position_before_each_slot_token():
    from fold_hf.training import slot_target_logits

    logits = torch.randn(2, 10, 5, dtype=torch.float64)
    anchors = torch.tensor([[1, 7], [0, 4]])
    got = slot_target_logits(logits, anchors, block=4)
    assert got.shape == (2, 2, 3, 5)
    for s in range(2):
        for i in range(2):
            for k in range(1, 4):  # slot k predicts token a + k, read from position a + k - 1 (clamped to L - 1)
                assert torch.equal(got[s, i, k - 1], logits[s, min(int(anchors[s, i]) + k - 1, 9)])


def test_distillation_term_is_the_weighted_kl_to_the_target_per_slot():
    """dflash_loss(kl=w) - dflash_loss(kl=0) = w x the slot-weighted KL(p_target || q_drafter), written here as a
    float64 loop over sequences, blocks and slots (the loss takes the logits in fp32, hence the tolerance); and 0 when
    the target's distribution is the drafter's own."""
    import math

    anchors = torch.tensor([[3, 17, 30], [5, 12, 37]])  # block (37 .. 40) of row 1 overhangs L = 40
    drafter, ids, feats, embeds = training_case(7, 2, anchors)
    B, gamma, w = 4, 4.0, 0.7
    target_logits = torch.randn(2, 40, drafter.config.vocab_size, dtype=torch.float64,
                                generator=torch.Generator().manual_seed(0)) * 3
    with torch.no_grad():
        ce, _ = dflash_loss(drafter, feats, ids, anchors, gamma)
        both, info = dflash_loss(drafter, feats, ids, anchors, gamma, target_logits, kl=w)
        hidden = drafter_block_hidden(drafter, feats, embeds, anchors).view(2, 3, B, -1)[:, :, 1:]
        q = drafter.target_lm_head(hidden).double()  # [2, 3, B-1, V]
    per_seq = []
    for s in range(2):
        num = den = 0.0
        for i in range(3):
            a = int(anchors[s, i])
            for k in range(1, B):
                if a + k >= 40:
                    continue
                p = [math.exp(x) for x in target_logits[s, a + k - 1].tolist()]
                z = sum(p)
                p = [x / z for x in p]
                log_q = torch.log_softmax(q[s, i, k - 1], -1).tolist()
                kl = sum(pi * (math.log(pi) - lq) for pi, lq in zip(p, log_q))
                weight = math.exp(-(k - 1) / gamma)
                num += weight * kl
                den += weight
        per_seq.append(num / den)
    expected = sum(per_seq) / 2
    assert float(both - ce) == pytest.approx(w * expected, rel=1e-5)
    assert float(info["kl"]) == pytest.approx(expected, rel=1e-6)
    # the target agreeing with the drafter on every slot: no distillation term
    same = torch.zeros_like(target_logits)
    for s in range(2):
        for i in range(3):
            for k in range(1, B):
                if int(anchors[s, i]) + k < 40:
                    same[s, int(anchors[s, i]) + k - 1] = q[s, i, k - 1]
    with torch.no_grad():
        agree, info = dflash_loss(drafter, feats, ids, anchors, gamma, same, kl=w)
    assert float(info["kl"]) == pytest.approx(0.0, abs=1e-6) and float(agree) == pytest.approx(float(ce), rel=1e-6)
    with pytest.raises(ValueError, match="target's logits"):
        dflash_loss(drafter, feats, ids, anchors, gamma, None, kl=w)
