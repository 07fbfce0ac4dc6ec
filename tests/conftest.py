import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import fold_hf  # noqa: E402,F401  (registers the attention and the assistant strategy)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run on the GPU machine)")


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


def pytest_collection_modifyitems(config, items):
    done = _passed_before()
    if done:
        kept = [item for item in items if item.nodeid not in done]
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine (see README, 'GPU tests')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def interpreter():
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed (the kernel tests run on the GPU machine or under TRITON_INTERPRET=1)")
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the GPU tests cover the kernel")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("set TRITON_INTERPRET=1 to run the kernel in Triton's interpreter on the CPU")
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
