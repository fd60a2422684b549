"""Dependencies run one way, read statically from the source (every `import`, at module level or
inside a function; those under `if TYPE_CHECKING:` excluded, since they never run):

- no cycle between omnitune's subpackages and top-level modules (omnitune.search, omnitune.store,
  omnitune.report, ...), function-level imports included: a cycle there is a layer that knows
  the layer above it;
- no cycle between any two modules (a package's __init__ and its submodules included);
- omnitune.runtime, which serves configs on an inference hot path, imports at module level only
  the standard library, torch and light omnitune modules, and never anything heavy, even lazily.

tests/test_runtime.py checks the runtime's imports in a fresh interpreter as well.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "omnitune"

# Third-party packages that the runtime must never import, even inside a function.
HEAVY = {"optuna", "pandas", "rich", "typer", "sqlite_utils", "sqlalchemy", "matplotlib", "click"}
# What the runtime may import at module level besides the standard library and omnitune.
RUNTIME_MODULE_LEVEL = {"torch"}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str  # an omnitune module, or the top-level name of another package
    line: int
    module_level: bool


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> list[tuple[ast.AST, bool]]:
    """Every import statement that can run, with whether it runs when the module is imported."""
    found: list[tuple[ast.AST, bool]] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_statement(other, module_level)
                continue
            visit_statement(child, module_level)

    def visit_statement(child: ast.AST, module_level: bool) -> None:
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            found.append((child, module_level))
        inner = module_level and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        visit(child, inner)

    visit(tree, True)
    return found


def _targets(node: ast.AST, package: str) -> list[str]:
    """The omnitune modules (or other top-level packages) an import statement loads by name.
    `from package import module` depends on the module; `from package import name` on the
    package (its __init__), as `import package.module` depends on the module alone."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    targets = []
    for name in names:
        if name.split(".")[0] != "omnitune":
            targets.append(name.split(".")[0])
            continue
        # The deepest omnitune module the name stands for (a name imported from a module is not one).
        while name not in MODULES and "." in name:
            name = name.rpartition(".")[0]
        targets.append(name)
    return list(dict.fromkeys(targets))


def _edges() -> list[Edge]:
    edges = []
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node, module_level in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(node, package):
                if target != name:
                    edges.append(Edge(name, target, node.lineno, module_level))
    return edges


EDGES = _edges()


def _unit(module: str) -> str:
    """omnitune.search.driver → omnitune.search; omnitune.report → omnitune.report."""
    return ".".join(module.split(".")[:2])


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _explain(component: set[str], unit=lambda m: m) -> str:
    lines = [f"  {e.source}:{e.line} imports {e.target}" for e in EDGES
             if e.target in MODULES and unit(e.source) in component and unit(e.target) in component
             and unit(e.source) != unit(e.target)]
    return "\n".join(sorted(set(lines)))


def _package_cycles() -> list[set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in EDGES:
        if edge.target in MODULES and _unit(edge.source) != _unit(edge.target):
            graph[_unit(edge.source)].add(_unit(edge.target))
    return _cycles(graph)


def test_no_cycle_between_subpackages():
    cycles = _package_cycles()
    assert not cycles, "package cycles:\n" + "\n\n".join(f"{sorted(c)}:\n{_explain(c, _unit)}" for c in cycles)


def test_the_runtime_never_imports_the_kernels_even_lazily():
    # One way only: the kernels ask the runtime for their configs, so whatever launches kernels
    # (the layers too) lives beside them. The registry's loading a kernel module by name, for its
    # spec, is no import statement and is not counted.
    edges = [e for e in EDGES if _unit(e.source) == "omnitune.runtime" and _unit(e.target) == "omnitune.kernels"]
    assert not edges, [f"{e.source}:{e.line} imports {e.target}" for e in edges]


def test_no_cycle_between_modules():
    graph: dict[str, set[str]] = defaultdict(set)
    for edge in EDGES:
        if edge.target in MODULES:
            graph[edge.source].add(edge.target)
    cycles = _cycles(graph)
    assert not cycles, "module cycles:\n" + "\n\n".join(f"{sorted(c)}:\n{_explain(c)}" for c in cycles)


def _runtime_closure(module_level_only: bool) -> dict[str, list[Edge]]:
    """Everything importing omnitune.runtime (and its submodules) loads, transitively: the
    external packages reached, each with the chain's last import."""
    start = [m for m in MODULES if m == "omnitune.runtime" or m.startswith("omnitune.runtime.")]
    seen, todo = set(start), list(start)
    external: dict[str, list[Edge]] = defaultdict(list)
    while todo:
        module = todo.pop()
        for edge in EDGES:
            if edge.source != module or (module_level_only and not edge.module_level):
                continue
            if edge.target in MODULES:
                if edge.target not in seen:
                    seen.add(edge.target)
                    todo.append(edge.target)
            elif edge.target not in sys.stdlib_module_names and edge.target != "__future__":
                external[edge.target].append(edge)
    return external


def test_runtime_imports_only_the_standard_library_and_torch_at_module_level():
    external = _runtime_closure(module_level_only=True)
    extra = {name: edges for name, edges in external.items() if name not in RUNTIME_MODULE_LEVEL}
    assert not extra, {name: [f"{e.source}:{e.line}" for e in edges] for name, edges in extra.items()}


@pytest.mark.parametrize("heavy", sorted(HEAVY))
def test_runtime_never_imports_anything_heavy_even_lazily(heavy):
    # The kernel modules the registry loads by name for their specs are not followed: what they
    # import is theirs.
    edges = [e for e in _runtime_closure(module_level_only=False).get(heavy, [])]
    assert not edges, [f"{e.source}:{e.line}" for e in edges]


def test_the_import_reader_sees_what_it_must():
    """The checks above are only as good as the reader: it finds a known module-level import,
    a function-level one, and skips TYPE_CHECKING blocks."""
    by_source = defaultdict(set)
    for edge in EDGES:
        by_source[edge.source].add((edge.target, edge.module_level))
    assert ("omnitune.spec", True) in by_source["omnitune.runtime"]
    assert ("omnitune.registry", False) in by_source["omnitune.runtime"]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pandas\nelse:\n    import json\n")
    assert [type(n).__name__ for n, _ in _imports(tree)] == ["ImportFrom", "Import"]
