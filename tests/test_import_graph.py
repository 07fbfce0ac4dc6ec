"""The package's import graph, read from the source (every import statement, lazy ones inside functions too):
no cycle between modules, no cycle between the package's parts, and no arrow from a lower layer up to a higher one.

Layers, lowest first: ``import_utils`` and ``compat`` (what we read of transformers' internals); ``kernels`` (takes tensors, imports nothing from ``modeling``);
``modeling``; ``targets`` (our forward of each target family, the registry of families, taps, rollback); ``generation`` / ``training`` / ``data`` / ``doctor``; ``integrations`` (the one place that patches
transformers); the package root; ``bench`` /
``train_drafter``; ``commands`` (what each CLI command does); ``cli`` (argparse and dispatch). A part not listed here (a new module) must still not close a cycle.

One arrow is exempt, by design and checked here: :data:`INSTALL_EDGE`, the lazy import inside ``FoldDrafter.__init__``
that installs the transformers integration when a drafter is created (so ``target.generate(assistant_model=drafter)``
works whatever was imported).

Modules are imported by import statements, so the graph sees them: ``importlib.import_module`` takes a literal name (an
edge of the graph like an import statement) except in the few lazy imports of :data:`COMPUTED_IMPORTS`, and never
names a module under ``fold_hf.targets`` (the target families are imported by ``fold_hf.targets.registry``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import fold_hf

PACKAGE = Path(fold_hf.__file__).parent

LAYER = {
    "fold_hf.import_utils": 0,
    "fold_hf.compat": 0,
    "fold_hf.kernels": 1,
    "fold_hf.modeling": 2,
    "fold_hf.targets": 2.5,
    "fold_hf.generation": 3,
    "fold_hf.training": 3,
    "fold_hf.data": 3,
    "fold_hf.doctor": 3,
    "fold_hf.integrations": 3.5,
    "fold_hf": 4,
    "fold_hf.bench": 5,
    "fold_hf.train_drafter": 5,
    "fold_hf.commands": 6,
    "fold_hf.cli": 7,
}


INSTALL_EDGE = ("fold_hf.modeling.drafter", "fold_hf.integrations.transformers")

# the imports by a computed name that stay, each bounded: the lazy public names of a package that calls
# ``lazy_attributes(__name__, _EXPORTS, globals())`` (``fold_hf.import_utils`` imports the keys of that package's
# ``_EXPORTS`` table, literal module names, checked at the package) and kernels' Triton modules
# (``fold_hf.kernels.<name>``)
COMPUTED_IMPORTS = {
    "fold_hf.import_utils": "exports[name]",
    "fold_hf.kernels": "f'{__name__}.{name}'",
}
LAZY = "lazy_attributes"  # the call that makes a package's _EXPORTS keys imports
FAMILIES = "fold_hf.targets"  # no module under it is imported by a string


def _dynamic_imports(tree: ast.AST) -> list[ast.Call]:
    """Every ``importlib.import_module(...)``, ``import_module(...)`` and ``__import__(...)`` call."""
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                calls.append(node)
    return calls


def _absolute(name: str, module: str, is_package: bool) -> str:
    """``name`` as ``import_module(name, package)`` resolves it from inside ``module`` (a relative name from the
    module's package)."""
    if not name.startswith("."):
        return name
    package = module.split(".") if is_package else module.split(".")[:-1]
    level = len(name) - len(name.lstrip("."))
    base = package[: len(package) - level + 1]
    return ".".join(base + ([name.lstrip(".")] if name.lstrip(".") else []))


def _literal_targets(module: str, tree: ast.AST, is_package: bool) -> list[str]:
    """The module names a lazy import of ``module``'s public names can reach: the keys of its ``_EXPORTS`` table
    (``{".modeling": ("FoldDrafter", ...)}``), which must be literal strings."""
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            keys = node.value.keys if isinstance(node.value, ast.Dict) else [None]
            if not all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys):
                return [f"<{module}._EXPORTS has a key that is not a literal string>"]
            return [_absolute(k.value, module, is_package) for k in keys]
    return [f"<{module} has no _EXPORTS table>"]


def _same(expression: str, node: ast.expr) -> bool:
    """Whether ``node`` is the expression written ``expression`` (compared as trees, not as text)."""
    return ast.dump(ast.parse(expression, mode="eval").body) == ast.dump(node)


def computed_import_problems(module: str, source: str, is_package: bool = False) -> list[str]:
    """What is wrong with ``module``'s imports by name: a computed name outside :data:`COMPUTED_IMPORTS`, or a name
    (literal, or a value of its ``_EXPORTS`` table) under :data:`FAMILIES`."""
    tree = ast.parse(source)
    problems = []
    lazy = [node for node in ast.walk(tree) if isinstance(node, ast.Call) and getattr(node.func, "id", None) == LAZY]
    for call in lazy:  # the package's _EXPORTS keys are imported by name (by fold_hf.import_utils)
        problems += [f"{module}:{call.lineno} imports {n} by a string"
                     for n in _literal_targets(module, tree, is_package)
                     if n.startswith("<") or n == FAMILIES or n.startswith(FAMILIES + ".")]
    for call in _dynamic_imports(tree):
        arg = call.args[0]
        where = f"{module}:{call.lineno}"
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names = [_absolute(arg.value, module, is_package)]
        elif module in COMPUTED_IMPORTS and _same(COMPUTED_IMPORTS[module], arg):
            names = []  # bounded: see COMPUTED_IMPORTS
        else:
            problems.append(f"{where} imports a computed name {ast.unparse(arg)} (import the module by name)")
            continue
        problems += [f"{where} imports {n} by a string" for n in names
                     if n.startswith("<") or n == FAMILIES or n.startswith(FAMILIES + ".")]
    return problems


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_edges(exempt: bool = True) -> dict[str, set[str]]:
    """module -> the fold_hf modules it imports (a ``from pkg import name`` of a submodule counts as that module);
    ``exempt``: leave out :data:`INSTALL_EDGE`."""
    mods = modules()
    edges = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        literal_calls = {c for c in _dynamic_imports(tree)
                         if isinstance(c.args[0], ast.Constant) and isinstance(c.args[0].value, str)}
        for node in ast.walk(tree):
            found = []
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                found.append(module)
                found += [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in mods]
            elif isinstance(node, ast.Import):
                found += [alias.name for alias in node.names]
            elif node in literal_calls:  # importlib.import_module("fold_hf...") is an import too
                found.append(_absolute(node.args[0].value, name, path.name == "__init__.py"))
            for target in found:
                if not target or not (target == "fold_hf" or target.startswith("fold_hf.")):
                    continue
                while target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    targets.add(target)
        edges[name] = targets
    if exempt:
        edges.get(INSTALL_EDGE[0], set()).discard(INSTALL_EDGE[1])
    return edges


def part(module: str) -> str:
    """``fold_hf.kernels.fold_read.naive`` -> ``fold_hf.kernels``; ``fold_hf.cli`` -> itself."""
    return ".".join(module.split(".")[:2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def part_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    parts: dict[str, set[str]] = {}
    for module, targets in edges.items():
        parts.setdefault(part(module), set()).update(part(t) for t in targets if part(t) != part(module))
    return parts


def test_kernels_import_nothing_from_modeling_or_above():
    edges = import_edges()
    upward = sorted(f"{m} -> {t}" for m, targets in edges.items() if part(m) == "fold_hf.kernels"
                    for t in targets if part(t) not in ("fold_hf.kernels", "fold_hf.import_utils"))
    assert not upward, "kernels/ must take tensors and import nothing above it: " + ", ".join(upward)


def test_no_cycle_between_modules_or_parts():
    edges = import_edges()
    assert not cycles(edges), f"import cycles between modules: {cycles(edges)}"
    parts = part_edges(edges)
    assert not cycles(parts), f"import cycles between the package's parts: {cycles(parts)}"


def test_no_upward_arrow_between_layers():
    parts = part_edges(import_edges())
    upward = sorted(f"{a} -> {b}" for a, targets in parts.items() for b in targets
                    if a in LAYER and b in LAYER and LAYER[b] >= LAYER[a])
    assert not upward, "imports from a layer up to a higher (or the same) one: " + ", ".join(upward)


def test_the_install_edge_is_the_only_exemption_and_is_lazy():
    """The drafter reaches the integration only from inside ``FoldDrafter.__init__`` (a function-level import), and
    without the exemption the checker would see the cycle it closes."""
    import ast as _ast

    edges = import_edges(exempt=False)
    assert INSTALL_EDGE[1] in edges[INSTALL_EDGE[0]]
    assert cycles(edges), "the install edge no longer closes a cycle: drop the exemption"
    tree = _ast.parse((PACKAGE / "modeling" / "drafter.py").read_text())
    top_level = {n.module for n in tree.body if isinstance(n, _ast.ImportFrom)}
    assert "integrations.transformers" not in top_level
    init = next(f for c in tree.body if isinstance(c, _ast.ClassDef) and c.name == "FoldDrafter"
                for f in c.body if isinstance(f, _ast.FunctionDef) and f.name == "__init__")
    assert any(isinstance(n, _ast.ImportFrom) and n.module == "integrations.transformers" for n in _ast.walk(init))


def test_the_checker_sees_an_upward_arrow_and_a_cycle():
    edges = {"fold_hf.kernels.fold_read.naive": {"fold_hf.modeling.read_plan"},
             "fold_hf.modeling.read_plan": {"fold_hf.modeling.rope"},
             "fold_hf.modeling.attention": {"fold_hf.kernels"}, "fold_hf.kernels": set(),
             "fold_hf.modeling.rope": set()}
    assert cycles(edges) == []  # no module cycle ...
    assert cycles(part_edges(edges)) == [["fold_hf.kernels", "fold_hf.modeling"]]  # ... but the parts close one
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]


def test_one_rotate_half():
    """rope's channel swap is written once (fold_hf.kernels.common.rotate_half); everything else calls it."""
    written = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                     if "torch.cat((-" in p.read_text() and p.name != "common.py")
    assert not written, f"rotate_half written again in {written}: use fold_hf.kernels.common.rotate_half"


def test_no_module_imported_by_a_computed_name_and_no_family_by_a_string():
    """Every import by name is visible to the graph: a literal (an edge above) or one of :data:`COMPUTED_IMPORTS`, and
    none reaches a target family module, so the family registry imports its families by import statements."""
    problems = []
    for name, path in modules().items():
        problems += computed_import_problems(name, path.read_text(), path.name == "__init__.py")
    assert not problems, "; ".join(problems)


def test_the_registry_imports_every_family():
    """Each module under fold_hf/targets that declares ``ARCHITECTURES`` (a family) is imported by the registry."""
    families = sorted(name for name, path in modules().items() if name.startswith("fold_hf.targets.")
                      and any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "ARCHITECTURES"
                                                                for t in n.targets)
                              for n in ast.parse(path.read_text()).body))
    assert {"fold_hf.targets.llama", "fold_hf.targets.qwen35", "fold_hf.targets.gemma"} <= set(families)
    registry = import_edges()["fold_hf.targets.registry"]
    assert not set(families) - {"fold_hf.targets.registry"} - registry, f"families the registry misses: {families}"


def test_the_checker_sees_a_family_imported_by_a_string():
    """The registry of before (a table of module paths, ``importlib.import_module(path)``), a literal family name, and
    a computed name in a package that has no such lazy import all fail; a lazy export table may not name a family."""
    old = ('import importlib\nFAMILIES = {"Gemma3ForCausalLM": "fold_hf.targets.gemma"}\n'
           "def family(name):\n    return importlib.import_module(FAMILIES[name]).register()[name]\n")
    assert computed_import_problems("fold_hf.generation.static_target", old)
    literal = "from importlib import import_module\nqwen = import_module('..targets.qwen35', __name__)\n"
    assert computed_import_problems("fold_hf.generation.loop", literal)
    assert computed_import_problems("fold_hf.targets.registry", "import importlib\nimportlib.import_module('.gemma', __package__)\n")
    exports = ('from .import_utils import lazy_attributes\n_EXPORTS = {".targets.gemma": ("x",)}\n'
               "__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS, globals())\n")
    assert computed_import_problems("fold_hf", exports, is_package=True) == [
        "fold_hf:3 imports fold_hf.targets.gemma by a string"]
    computed = "import importlib\ndef load(name):\n    return importlib.import_module(name)\n"
    assert computed_import_problems("fold_hf", computed, is_package=True)
    assert not computed_import_problems("fold_hf", exports.replace(".targets.gemma", ".modeling"), is_package=True)
