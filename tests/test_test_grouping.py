"""The test suite relies on pytest-xdist's ``--dist loadgroup`` (the README's test command): tests marked
``xdist_group`` share one worker, so the real pair, the lossless grid and the tensor-parallel ranks are built once.
pytest 9.2 with pytest-xdist 3.8 ignores the marks without a word (pytest-dev/pytest-xdist#1386); this fails if the
installed pair does."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_xdist_group_marks_keep_a_group_on_one_worker(tmp_path):
    pytest.importorskip("xdist")
    (tmp_path / "test_grouped.py").write_text(
        "import os, pytest\n"
        "pytestmark = pytest.mark.xdist_group('one')\n"
        "@pytest.mark.parametrize('i', range(8))\n"
        "def test_x(i):\n"
        "    with open(os.path.join(os.path.dirname(__file__), f'w{i}'), 'w') as fh:\n"
        "        fh.write(os.environ['PYTEST_XDIST_WORKER'])\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    workers = {(tmp_path / f"w{i}").read_text() for i in range(8)}
    assert len(workers) == 1, (f"the 8 tests of one xdist_group ran on {sorted(workers)}: --dist loadgroup ignores "
                               "xdist_group with this pytest / pytest-xdist (pytest-dev/pytest-xdist#1386)")
