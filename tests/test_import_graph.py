"""The package's import graph, read from the source (every import statement, lazy ones inside functions too):
no cycle between modules, no cycle between the package's parts, and no arrow from a lower layer up to a higher one.

Layers, lowest first: ``import_utils`` and ``compat`` (what we read of transformers' internals); ``kernels`` (takes tensors, imports nothing from ``modeling``);
``modeling``; ``generation`` / ``training`` / ``data`` / ``doctor``; ``integrations`` (the one place that patches
transformers); the package root; ``bench`` /
``train_drafter``; ``commands`` (what each CLI command does); ``cli`` (argparse and dispatch). A part not listed here (a new module) must still not close a cycle.

One arrow is exempt, by design and checked here: :data:`INSTALL_EDGE`, the lazy import inside ``FoldDrafter.__init__``
that installs the transformers integration when a drafter is created (so ``target.generate(assistant_model=drafter)``
works whatever was imported).
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
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            found = []
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                found.append(module)
                found += [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in mods]
            elif isinstance(node, ast.Import):
                found += [alias.name for alias in node.names]
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
