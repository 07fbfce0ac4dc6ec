"""The example notebooks: the Colab one is checked against the API without running (it needs a GPU and the Hub); the
offline one runs end to end on the embedded pair, as a user would run it.

Static check of a notebook: every code cell compiles (shell and magic lines aside); every name it takes from
``fold_hf`` imports and resolves attribute by attribute; every keyword it passes to a ``fold_hf`` callable is one that
callable accepts; every attribute it reads from a ``FoldConfig``, ``FoldDrafter`` or ``GenerationResult`` it made
exists; and every ``FoldConfig`` it builds from literals (preset names included) builds.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

import fold_hf
from fold_hf import FoldConfig, FoldDrafter, GenerationResult

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the test extra (pip install -e '.[test]')")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
COLAB = EXAMPLES / "llama31_8b_colab.ipynb"
OFFLINE = EXAMPLES / "offline_smollm2.ipynb"


def _code_cells(path: Path) -> list[str]:
    """Source of each code cell, shell (``!``) and magic (``%``) lines replaced by ``pass``."""
    nb = nbformat.read(path, as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines = []
        for line in cell.source.splitlines():
            stripped = line.lstrip()
            if stripped.startswith(("!", "%")):
                line = line[: len(line) - len(stripped)] + "pass"
            lines.append(line)
        cells.append("\n".join(lines))
    return cells


def _resolve(dotted: str):
    """The object a dotted ``fold_hf...`` name refers to (ImportError / AttributeError when it does not exist)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


# sample instances: attribute reads on notebook variables of these types are checked against them
def _sample_instances() -> dict[type, object]:
    from tiny import tiny_drafter, tiny_target

    target = tiny_target(layers=4)
    drafter = tiny_drafter(target)
    # a drafter as the notebooks read it: after a call through transformers' loop
    target.generate(torch.zeros(1, 4, dtype=torch.long), assistant_model=drafter, max_new_tokens=4, do_sample=False)
    return {
        FoldConfig: FoldConfig(),
        FoldDrafter: drafter,
        GenerationResult: GenerationResult(sequences=torch.zeros(1, 2, dtype=torch.long)),
    }


def _same_function(obj, function) -> bool:
    return getattr(obj, "__func__", obj) is getattr(function, "__func__", function)


def _returned_type(obj, call: ast.Call):
    """The fold_hf type a call to ``obj`` returns, when the notebook's later attribute reads can be checked."""
    if obj is fold_hf.generate:
        stats = [k for k in call.keywords if k.arg == "return_stats"]
        return GenerationResult if stats and isinstance(stats[0].value, ast.Constant) and stats[0].value.value else None
    if obj in (FoldConfig, FoldDrafter):
        return obj
    if _same_function(obj, FoldConfig.from_pretrained) or _same_function(obj, FoldConfig.replace):
        return FoldConfig
    if _same_function(obj, FoldDrafter.from_pretrained):
        return FoldDrafter
    return None


class _ApiChecker(ast.NodeVisitor):
    """Walks a notebook's cells in order, tracking fold_hf aliases and variables of fold_hf types."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}  # notebook name -> dotted fold_hf name
        self.types: dict[str, type] = {}  # notebook variable -> fold_hf type
        self.used: set[str] = set()
        self.errors: list[str] = []
        self.samples = _sample_instances()

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "fold_hf":
                self._resolve_or_report(alias.name)
                self.aliases[(alias.asname or alias.name).split(".")[0]] = alias.name if alias.asname else "fold_hf"

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] == "fold_hf":
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                self._resolve_or_report(name)
                self.aliases[alias.asname or alias.name] = name

    def _resolve_or_report(self, name: str):
        self.used.add(name)
        try:
            return _resolve(name)
        except (ImportError, AttributeError) as err:
            self.errors.append(f"{name}: {type(err).__name__}: {err}")
            return None

    def _lookup(self, node: ast.AST) -> tuple[str | None, object]:
        """(readable name, object) of a fold_hf name or an attribute chain on a fold_hf-typed variable; the name is
        None when the expression is neither; the object is None when it does not exist (an error is recorded)."""
        dotted = _dotted(node)
        if dotted is None:
            return None, None
        head, _, rest = dotted.partition(".")
        if head in self.aliases:
            name = self.aliases[head] + ("." + rest if rest else "")
            return name, self._resolve_or_report(name)
        if head in self.types and rest:
            obj = self.samples[self.types[head]]
            for attr in rest.split("."):
                if not hasattr(obj, attr):
                    self.errors.append(f"{dotted}: {type(obj).__name__} has no attribute {attr!r}")
                    return dotted, None
                obj = getattr(obj, attr)
            return dotted, obj
        return None, None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name, _ = self._lookup(node)
        if name is None:
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        for child in [*node.args, *node.keywords]:
            self.visit(child)
        name, obj = self._lookup(node.func)
        if name is None:
            self.visit(node.func)
            return
        if obj is None or not callable(obj):
            return
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            for keyword in node.keywords:
                if keyword.arg is not None and keyword.arg not in params:
                    self.errors.append(f"{name}(): no keyword argument {keyword.arg!r}")
        if obj is FoldConfig or _same_function(obj, FoldConfig.from_pretrained) or _same_function(obj, FoldConfig.replace):
            self._build_config(name, obj, node)

    def _build_config(self, name: str, obj, node: ast.Call) -> None:
        """Build a FoldConfig the notebook makes from literals: invalid fields and unknown presets fail here."""
        try:
            args = [ast.literal_eval(a) for a in node.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
        except ValueError:
            return  # not all literals
        try:
            if _same_function(obj, FoldConfig.replace):
                FoldConfig().replace(**kwargs)
            elif _same_function(obj, FoldConfig.from_pretrained):
                from fold_hf.modeling.presets import PRESETS

                if args and args[0] not in PRESETS and not Path(args[0]).exists():
                    self.errors.append(f"{name}({args[0]!r}): neither a preset name nor a local path")
                    return
                FoldConfig.from_pretrained(*args, **kwargs)
            else:
                FoldConfig(*args, **kwargs)
        except (TypeError, ValueError) as err:
            self.errors.append(f"{name}(...): {err}")

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        kind = None
        if isinstance(node.value, ast.Call):
            _, obj = self._lookup(node.value.func)
            kind = _returned_type(obj, node.value) if obj is not None else None
        elif isinstance(node.value, ast.Attribute):  # e.g. base = drafter.fold_config
            _, obj = self._lookup(node.value)
            kind = next((cls for cls in self.samples if isinstance(obj, cls)), None)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if kind is None:
                    self.types.pop(target.id, None)
                else:
                    self.types[target.id] = kind


def _check_notebook(path: Path) -> _ApiChecker:
    checker = _ApiChecker()
    for i, source in enumerate(_code_cells(path)):
        tree = compile(source, f"{path.name}[cell {i}]", "exec", ast.PyCF_ONLY_AST)
        compile(tree, f"{path.name}[cell {i}]", "exec")
        checker.visit(tree)
    return checker


@pytest.mark.parametrize("path", [COLAB, OFFLINE], ids=lambda p: p.name)
def test_notebook_cells_compile_and_use_only_existing_fold_hf_api(path):
    checker = _check_notebook(path)
    assert not checker.errors, "\n".join(checker.errors)
    # the check saw the API the notebooks are about
    assert {"fold_hf.FoldConfig", "fold_hf.FoldDrafter", "fold_hf.generate"} <= checker.used


def test_colab_notebook_runs_the_llama_preset_on_both_paths():
    source = "\n".join(_code_cells(COLAB))
    assert 'FoldConfig.from_pretrained("llama3.1-8b-dflash")' in source
    assert "FoldDrafter.from_pretrained(config.drafter_model, fold_config=config" in source
    assert "assistant_model=drafter" in source and "return_stats=True" in source


def test_the_checker_catches_a_wrong_name_keyword_attribute_and_preset(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import fold_hf\nfrom fold_hf import FoldConfig\n"
        "cfg = FoldConfig.from_pretrained('llama3-8b')\n"
        "res = fold_hf.generate(None, None, max_tokens=3, return_stats=True)\n"
        "print(res.acceptance_rate, fold_hf.generate_fast)\n"
    )]
    path = tmp_path / "bad.ipynb"
    nbformat.write(nb, path)
    errors = "\n".join(_check_notebook(path).errors)
    for expected in ("'llama3-8b'", "max_tokens", "acceptance_rate", "generate_fast"):
        assert expected in errors


def test_notebooks_are_committed_without_outputs():
    for path in (COLAB, OFFLINE):
        nb = nbformat.read(path, as_version=4)
        assert all(not cell.get("outputs") for cell in nb.cells if cell.cell_type == "code"), path.name


@pytest.mark.slow
def test_offline_notebook_executes_on_the_embedded_pair(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient", reason="needs the test extra (pip install -e '.[test]')")
    pytest.importorskip("ipykernel", reason="needs the test extra (pip install -e '.[test]')")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("FOLD_HF_NOTEBOOK_OUT", str(tmp_path))
    # the kernel imports this checkout's fold_hf, as the tests do
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    nb = nbformat.read(OFFLINE, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=900, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on any failing cell; the notebook asserts outputs equal AR
    text = "\n".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
                     if out.get("output_type") == "stream")
    for length in (256, 768, 2048):  # inside the window, the drafter's training length, well past it
        assert f"{length:6d}  FOLD" in text and f"{length:6d}  original drafter" in text
    for fold_fast in (True, False):  # the front door's fast loop and transformers' assisted loop
        assert f"target.generate(assistant_model=drafter, fold_fast={fold_fast}) == plain greedy: True" in text
    plot = tmp_path / "tau_by_length.png"
    assert plot.is_file() and plot.stat().st_size > 10_000
