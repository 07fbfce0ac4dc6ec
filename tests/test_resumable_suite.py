"""FOLD_HF_TESTS_DONE_FILE (tests/conftest.py): a test suite longer than one GPU-machine call runs in parts."""

import os
from pathlib import Path

pytest_plugins = ["pytester"]


def test_passed_tests_are_recorded_and_deselected_by_the_next_run(pytester, tmp_path, monkeypatch):
    pytester.makeconftest(Path(__file__).with_name("conftest.py").read_text())
    pytester.makepyfile(test_part="def test_passes():\n    pass\n\n\ndef test_fails():\n    assert False\n")
    done = tmp_path / "done.txt"
    monkeypatch.setenv("FOLD_HF_TESTS_DONE_FILE", str(done))
    # the copied conftest's fixtures import the test helpers (tiny.py) from this folder
    here = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)
    assert set(done.read_text().split()) == {"test_part.py::test_passes"}
    # the next call runs only what has not passed yet; a failure stays to be run again
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(failed=1, deselected=1)
