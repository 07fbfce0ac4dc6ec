import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import fold_hf  # noqa: E402,F401  (registers the attention and the assistant strategy)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run on the GPU machine)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine (see README, 'GPU tests')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
