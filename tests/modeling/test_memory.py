"""Memory: repeated generate calls hold nothing new, the drafter keeps no per-call cache, and FoldCache reports
the bytes of the tensors it actually holds."""

import gc
import weakref

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig
from fold_hf.generation import fast
from fold_hf.modeling import RotaryTables
from tiny import tiny_drafter, tiny_target, trained_pair
from tiny import prompt as tiny_prompt

MODES = [FoldConfig(window=16, alpha=2.0), FoldConfig(mode="dflash", window=16),
         FoldConfig(mode="streaming", window=16, budget=24), FoldConfig(mode="yarn", window=16, train_length=64)]


def prompt(seed, length):
    return tiny_prompt(seed, length)


def live_tensors() -> tuple[int, int]:
    """(count, bytes) of every live torch tensor the garbage collector can see, storages counted once."""
    gc.collect()
    count, storages = 0, {}
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.Tensor):  # type(), not isinstance: proxies warn on __class__
            continue
        try:
            if obj.is_meta:
                continue
            storage = obj.untyped_storage()
        except (ReferenceError, RuntimeError):
            continue
        count += 1
        storages[(storage.device, storage.data_ptr())] = storage.nbytes()
    return count, sum(storages.values())


def run_both_paths(target, drafter, ids, cfg):
    fold_hf.generate(target, drafter, input_ids=ids, max_new_tokens=24, fold_config=cfg)
    drafter.set_fold_config(cfg)
    # transformers' assisted loop (the routed fast loop keeps its session on purpose: test_fast_loop covers it)
    target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False, fold_fast=False)


def run_every_path(target, drafter, ids, cfg):
    """Both paths above and the default ``target.generate`` call, routed to the fast loop (which keeps a session)."""
    run_both_paths(target, drafter, ids, cfg)
    target.generate(ids, assistant_model=drafter, max_new_tokens=24, do_sample=False)


def test_repeated_generate_calls_do_not_grow_live_tensors():
    target, drafter = trained_pair("llama")
    requests = [(prompt(1, 90), MODES[0]), (prompt(2, 30), MODES[1]), (prompt(3, 120), MODES[2]),
                (prompt(4, 60), MODES[3])]
    with torch.no_grad():
        for ids, cfg in requests:  # warm-up: lazily built tables (yarn rope, device caches) exist afterwards
            run_both_paths(target, drafter, ids, cfg)
        before = live_tensors()
        for _ in range(2):
            for ids, cfg in requests:
                run_both_paths(target, drafter, ids, cfg)
        after = live_tensors()
    assert after == before, f"live tensors (count, bytes) grew from {before} to {after}"


def test_repeated_fast_calls_keep_only_the_sessions_steps():
    """The fast loop's session (static engine, the graphs engine's logic on CPU) keeps per target its buffers, one
    static drafter per reading mode and one step per (bucket, mode): built once, then reused. A request longer
    than the session's capacity replaces the session, so the steps of the shorter requests are built again once
    in the new one (a bounded cache, not a per-call leak); from then on repeated calls hold no new tensor."""
    target = tiny_target("llama", dtype=torch.float32)
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16))
    requests = [(prompt(1, 100), MODES[0]), (prompt(2, 30), MODES[1]), (prompt(3, 250), MODES[3])]

    def one_pass():
        for ids, cfg in requests:
            fold_hf.fast_generate(target, drafter, ids, max_new_tokens=24, engine="static", fold_config=cfg)
        return target.__dict__[fast._SESSION_ATTR]

    try:
        with torch.no_grad():
            first = one_pass()
            grown = live_tensors()
            assert first.capacity == 512 and len(first.static_drafters) == 1  # rebuilt for the 250-token request
            session = one_pass()
            before, steps = live_tensors(), set(session.steps)
            assert session is first and len(session.static_drafters) == 3 and before[1] > grown[1]
            for _ in range(2):
                assert one_pass() is session
            after = live_tensors()
        assert set(session.steps) == steps
        assert after == before, f"live tensors (count, bytes) grew from {before} to {after}"
    finally:
        fast.release_fast_state(target)


def test_drafter_keeps_no_reference_to_per_call_caches(monkeypatch):
    target, drafter = trained_pair("llama")
    made = []
    original = drafter.new_cache

    def tracked(*args, **kwargs):
        cache = original(*args, **kwargs)
        made.append(weakref.ref(cache))
        return cache

    monkeypatch.setattr(drafter, "new_cache", tracked)
    fast.release_fast_state(target)
    with torch.no_grad():
        for _ in range(2):
            run_every_path(target, drafter, prompt(5, 70), MODES[0])
    # one cache per foundation-loop call and per call of transformers' assisted loop; the routed target.generate runs
    # the fast loop, whose session (kept on the target, not the drafter) builds one and reuses it on the second call
    assert len(made) == 5
    gc.collect()
    alive = [ref() for ref in made if ref() is not None]
    assert alive == [target.__dict__[fast._SESSION_ATTR].drafter_cache], "a FoldCache outlived its generate call"
    del alive
    fast.release_fast_state(target)
    gc.collect()
    assert all(ref() is None for ref in made), "something besides the fast loop's session holds a FoldCache"


def tensors_reachable(obj, seen=None) -> list[torch.Tensor]:
    """Tensors an object holds through its attributes, lists, tuples and dicts."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, RotaryTables):  # the drafter's rope tables, shared, not held by the cache
        return []
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("fold_hf"):
        children = list(vars(obj).values())
    else:
        return []
    return [t for child in children for t in tensors_reachable(child, seen)]


def storage_bytes(tensors) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


@pytest.mark.parametrize("keep_rotated_copy", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_reports_the_bytes_of_the_tensors_it_holds(keep_rotated_copy, dtype):
    target = tiny_target("qwen3", seed=5, dtype=dtype)
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=8))
    drafter.bind_target(target)
    cache = drafter.new_cache(keep_rotated_copy=keep_rotated_copy)
    assert cache.bytes_held() == cache.bytes_used() == 0
    noise = torch.randn(1, drafter.block_size, 32, dtype=dtype)
    length = 0
    # appends that force the buffers to grow past their first capacity (64) twice, with crops in between
    steps = [("add", 10), ("add", 50), ("crop", -7), ("add", 1), ("add", 90), ("crop", -40), ("add", 3),
             ("add", 200), ("crop", 100), ("crop", 0)]
    held_before_crop = None
    with torch.no_grad():
        for op, n in steps:
            if op == "add":
                feats = torch.randn(1, n, 2 * 32, dtype=dtype)
                drafter(noise, feats, cache=cache)
                length += n
            else:
                held_before_crop = cache.bytes_held()
                cache.crop(n)
                length = length + n if n < 0 else (min(length, n) if n > 0 else length)
                assert cache.bytes_held() == held_before_crop  # a crop rewinds, it frees nothing
            held = tensors_reachable(cache)
            assert cache.get_seq_length() == length
            assert cache.bytes_held() == storage_bytes(held)
            # entries written so far, every copy: each buffer is [b, Hkv, capacity, D], length of capacity used
            used = sum(t.numel() * t.element_size() * length // t.shape[-2] for t in held)
            assert cache.bytes_used() == used
            per_entry = (3 if keep_rotated_copy else 2) * 2 * 8 * torch.finfo(dtype).bits // 8  # Hkv=2, D=8
            assert cache.bytes_used() == per_entry * length * len(drafter.layers)


@pytest.mark.gpu(reason="GPU memory: torch.cuda.memory_allocated across calls")
def test_repeated_generate_calls_do_not_grow_gpu_memory():
    device = torch.device("cuda")
    target = tiny_target("llama", dtype=torch.float32).to(device)
    drafter = tiny_drafter(target, fold_config=FoldConfig(window=16)).to(device)
    requests = [(prompt(1, 300).to(device), MODES[0]), (prompt(2, 40).to(device), MODES[1]),
                (prompt(3, 500).to(device), MODES[3])]
    with torch.no_grad():
        # two warm-up passes (see test_repeated_fast_calls_keep_only_the_sessions_steps): the first ends in a
        # session sized for the 500-token request, the second builds every request's steps in that session
        for _ in range(2):
            for ids, cfg in requests:
                run_every_path(target, drafter, ids, cfg)
        torch.cuda.synchronize()
        gc.collect()
        session = target.__dict__[fast._SESSION_ATTR]
        steps = set(session.steps)
        before = torch.cuda.memory_allocated(device)
        for _ in range(3):
            for ids, cfg in requests:
                run_every_path(target, drafter, ids, cfg)
        torch.cuda.synchronize()
        gc.collect()
        after = torch.cuda.memory_allocated(device)
        assert target.__dict__[fast._SESSION_ATTR] is session and set(session.steps) == steps
    assert after == before, f"allocated device memory grew from {before} to {after} bytes"
