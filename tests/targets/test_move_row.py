"""``StaticTarget.move_row`` (issue 35): batched rounds keep their running rows in cache rows ``0 .. A-1`` (so their
fixed-shape steps are keyed by how many rows run), moving the last running row into the cache row a stopped row freed.
The moved row must go on exactly as it would have in its old cache row, for every per-row buffer of every family: the
Llama KV cache; Gemma's global caches, sliding rings (wrapped) and KV-shared layers; Qwen3.5's KV cache and every
linear layer's convolution window and recurrent state. The independent statement: the same row's own forward in the
cache row it left (which the move leaves as it was), bit for bit."""

import pytest
import torch
from tiny import VOCAB, tiny_target

from fold_hf.targets import gemma
from fold_hf.targets.registry import build_static_target

P = 21  # prompt tokens: past the tiny Gemma's ring (its window 8 + the slack 3 below), so its rings have wrapped


@pytest.fixture(autouse=True)
def short_rings(monkeypatch):
    """Gemma's sliding rings of window + 3 entries (not the capacity: the ring's slots are not positions)."""
    monkeypatch.setattr(gemma, "RING_SLACK", 3)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gemma4_shared", "qwen35"])
def test_a_moved_row_goes_on_as_in_its_old_cache_row(arch):
    target = tiny_target(arch, seed=2, dtype=torch.float32)
    runner = build_static_target(target, 64, batch=3)
    prompts = [torch.randint(0, VOCAB, (1, P), generator=torch.Generator().manual_seed(s)) for s in range(3)]
    for row, prompt in enumerate(prompts):
        runner.prefill(prompt, chunk=8, row=row)
    runner.move_row(2, 0, P)
    block = torch.randint(0, VOCAB, (1, 4), generator=torch.Generator().manual_seed(9))
    outs = {}
    for row in (0, 2, 1):  # two verify steps each, the first keeping 2 of its 4 tokens (a recurrent state commits)
        first = runner.forward(block, P, row=row)
        runner.accept(1)
        second = runner.forward(block[:, 1:], P + 2, row=row)
        runner.accept(0)
        outs[row] = torch.cat((first, second))
    assert torch.equal(outs[0], outs[2]), arch  # row 2's state, moved into row 0: the same logits, bit for bit
    assert not torch.allclose(outs[1], outs[2])  # another prompt's row reads otherwise (the check can fail)
    with pytest.raises(ValueError, match="row 3 is not a row of this runner's cache"):
        runner.move_row(3, 0, P)
    with pytest.raises(ValueError, match="does not fit the cache capacity"):
        runner.move_row(1, 0, 65)


def test_the_row_tensors_are_every_per_row_buffer_once():
    """``row_tensors`` lists each buffer once (a KV-shared Gemma layer reads its producer's tensor), positions only
    where the buffer's axis is the capacity long; Qwen3.5 adds its linear layers' states (row axis 1, whole)."""
    gemma = build_static_target(tiny_target("gemma4_shared", seed=2, dtype=torch.float32), 64, batch=2)
    tensors = gemma.row_tensors()
    assert len({id(t) for t, _, _ in tensors}) == len(tensors) == len({id(t) for t in gemma.keys + gemma.values})
    assert {(axis, by_position, t.shape[2] == 64) for t, axis, by_position in tensors} == {(0, True, True),
                                                                                          (0, False, False)}
    qwen = build_static_target(tiny_target("qwen35", seed=2, dtype=torch.float32), 64, batch=2)
    extra = [(t, axis, by_position) for t, axis, by_position in qwen.row_tensors() if t.dim() != 4 or axis != 0]
    assert [(t is qwen._conv_rows_all or t is qwen._recurrent_rows_all, axis, by_position)
            for t, axis, by_position in extra] == [(True, 1, False)] * 2
