"""The import graph of the product packages, read from source with ``ast`` (nothing is imported).

What it decides: what counts as one module importing another, for the layering rules of
``tests/contracts/test_import_rules.py``.

* Every ``import`` and ``from … import`` statement counts, wherever it is: at module level,
  inside a function (a deferred import is still a dependency) or under ``TYPE_CHECKING``.
* ``from a.b import c`` is an edge to the module ``a.b.c`` when that is a module, else to
  ``a.b``; relative imports are resolved against the importing module's package. Only edges
  between the scanned packages are kept: the standard library and third parties are not ours.
* An import by a string (``importlib.import_module(name)``) is not an edge: it is how the
  ``halcyon`` command loads a subcommand only when it runs.

:func:`cycles` finds the strongly connected components of more than one module (or a module
importing itself): each is an import cycle, named module by module.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Edge", "ImportGraph", "cycles", "scan", "violations"]


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target``: at ``path``:``line``, written as ``statement``."""

    source: str
    target: str
    path: Path
    line: int
    statement: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.source} imports {self.target} ({self.statement})"


@dataclass
class ImportGraph:
    modules: dict[str, Path]  # module name -> its source file
    edges: list[Edge]

    def successors(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            out[edge.source].add(edge.target)
        return out


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _package_of(module: str, path: Path) -> str:
    """The package a relative import in ``module`` starts from."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a scanned module, if any."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imported(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> list[str]:
    """The dotted names an import statement reaches (``from a import b`` gives ``a.b``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = _package_of(module, path).split(".")
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" if alias.name != "*" else base for alias in node.names]


def scan(root: Path, packages: Iterable[str]) -> ImportGraph:
    """Every module of ``packages`` (directories under ``root``) and the imports among them."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                modules[_module_name(root, path)] = path
    edges: dict[tuple[str, str, int], Edge] = {}  # one edge per statement and target
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, module, path):
                target = _resolve(name, modules)
                if target is not None and target != module:
                    edge = Edge(
                        module, target, path.relative_to(root), node.lineno, ast.unparse(node)
                    )
                    edges.setdefault((module, target, node.lineno), edge)
    return ImportGraph(modules, list(edges.values()))


def violations(
    graph: ImportGraph, layer_of: Callable[[str], str], allowed: Mapping[str, set[str]]
) -> list[Edge]:
    """The edges from a module of layer L to one whose layer is not in ``allowed[L]``."""
    return [
        edge for edge in graph.edges if layer_of(edge.target) not in allowed[layer_of(edge.source)]
    ]


def cycles(graph: ImportGraph) -> list[list[str]]:
    """The import cycles: strongly connected components of two or more modules (Tarjan's
    algorithm, iterative: a deep package must not hit the recursion limit)."""
    succ = {name: sorted(targets) for name, targets in graph.successors().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(succ):
        if start in index:
            continue
        work: list[tuple[str, int]] = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(succ[node]):
                work.append((node, i + 1))
                nxt = succ[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found
