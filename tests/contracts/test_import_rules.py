"""The layering of the product packages, checked on every import statement (read with ``ast``).

Imports flow one way (DESIGN §2): the generated stubs at the bottom, then ``common``, then the
service packages, then ``bench`` (which runs the services' policy code in simulation), then the
operator tools at the top.

* The stubs (``halcyon.v1``, ``halcyon.oip``, and the ``halcyon`` package itself) import
  nothing of ours but each other.
* ``common`` imports only the stubs and itself.
* ``gateway``, ``worker`` and ``controller`` import ``common``, the stubs and themselves: never
  each other, never ``bench`` or ``halcyon.tools``.
* ``bench`` does not import ``halcyon.tools``.
* No import cycle, anywhere, function-local and ``TYPE_CHECKING`` imports included.

A failure names the file, line and statement of every offending import, or every module of a
cycle with the imports that close it. The checker itself is proven on a small synthetic package
(the last tests): it finds what it must.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.import_graph import ImportGraph, cycles, scan, violations

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "gateway", "worker", "controller", "bench", "halcyon")
SERVICES = ("gateway", "worker", "controller")

ALLOWED: dict[str, set[str]] = {
    "stubs": {"stubs"},
    "common": {"common", "stubs"},
    **{s: {s, "common", "stubs"} for s in SERVICES},
    "bench": {"bench", *SERVICES, "common", "stubs"},
    "tools": {"tools", "bench", *SERVICES, "common", "stubs"},
}


def layer(module: str) -> str:
    if module == "halcyon" or module.startswith(("halcyon.v1", "halcyon.oip")):
        return "stubs"
    if module.startswith("halcyon."):
        return "tools"  # halcyon.tools and the package's __main__
    return module.split(".")[0]


def describe_cycles(graph: ImportGraph, found: list[list[str]]) -> str:
    """Each cycle as its modules and the imports among them (file:line: statement)."""
    parts = []
    for component in found:
        members = set(component)
        closing = [str(e) for e in graph.edges if e.source in members and e.target in members]
        parts.append(" <-> ".join(component) + "\n    " + "\n    ".join(closing))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def graph() -> ImportGraph:
    return scan(ROOT, PACKAGES)


def test_the_scan_sees_every_package(graph: ImportGraph) -> None:
    assert {m.split(".")[0] for m in graph.modules} == set(PACKAGES)
    assert "halcyon.tools.cli" in graph.modules and "halcyon.v1.infer_pb2" in graph.modules


def test_every_import_respects_the_layers(graph: ImportGraph) -> None:
    bad = violations(graph, layer, ALLOWED)
    assert not bad, "imports against the layering (DESIGN §2):\n" + "\n".join(map(str, bad))


def test_no_import_cycle(graph: ImportGraph) -> None:
    found = cycles(graph)
    assert not found, "import cycles:\n" + describe_cycles(graph, found)


# -- the checker, on a package made for it ----------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_a_function_local_import_against_the_layers(tmp_path: Path) -> None:
    _write(tmp_path, {
        "low/__init__.py": "",
        "low/a.py": "import os\n\n\ndef f():\n    from high.b import thing\n    return thing\n",
        "high/__init__.py": "",
        "high/b.py": "from low import a\nthing = a\n",
    })  # fmt: skip
    graph = scan(tmp_path, ["low", "high"])
    bad = violations(graph, lambda m: m.split(".")[0], {"low": {"low"}, "high": {"high", "low"}})
    assert [str(e) for e in bad] == [
        f"{Path('low/a.py')}:5: low.a imports high.b (from high.b import thing)"
    ]


def test_the_checker_names_a_cycle_through_relative_and_type_checking_imports(
    tmp_path: Path,
) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "from .c import C\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n",
        "pkg/c.py": "from pkg import b\nclass C: ...\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/d.py": "from .. import b\nfrom ..c import C\n",
    })  # fmt: skip
    graph = scan(tmp_path, ["pkg"])
    found = cycles(graph)
    assert found == [["pkg.b", "pkg.c"]]
    text = describe_cycles(graph, found)
    assert "pkg.b <-> pkg.c" in text
    assert f"{Path('pkg/b.py')}:3: pkg.b imports pkg.c (from .c import C)" in text
    assert f"{Path('pkg/c.py')}:1: pkg.c imports pkg.b (from pkg import b)" in text
    # the relative imports of a subpackage resolve to their modules, not to the package
    assert {e.target for e in graph.edges if e.source == "pkg.sub.d"} == {"pkg.b", "pkg.c"}
