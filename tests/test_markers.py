"""The test tiers hold: every gpu marker says why the test needs a GPU."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def gpu_markers_without_reason(source: str) -> list[str]:
    """Names of test functions marked ``@pytest.mark.gpu`` with no ``reason=``."""
    bare = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            if isinstance(target, ast.Attribute) and target.attr == "gpu" and ast.unparse(target) == "pytest.mark.gpu":
                if not (isinstance(deco, ast.Call) and any(k.arg == "reason" for k in deco.keywords)):
                    bare.append(node.name)
    return bare


def test_every_gpu_test_says_why():
    bare = {path.name: names for path in sorted(TESTS.rglob("test_*.py"))
            if (names := gpu_markers_without_reason(path.read_text()))}
    assert not bare, f'give each its reason, @pytest.mark.gpu(reason="..."): {bare}'


def test_the_check_sees_a_bare_marker():
    source = ("import pytest\n@pytest.mark.gpu\ndef test_a():\n    pass\n"
              "@pytest.mark.gpu(reason='CUDA graphs')\ndef test_b():\n    pass\n")
    assert gpu_markers_without_reason(source) == ["test_a"]
