"""Issue 24: rig_nv_pci in layers, its import graph without a circle. Every import counts, those
under TYPE_CHECKING and inside functions too: a circle a type checker or a late import hides
is still two modules that cannot be read apart."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "rig_nv_pci"

def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    """Each module of rig_nv_pci -> the modules of rig_nv_pci it imports (``from pkg import
    name`` names the submodule where ``name`` is one)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    out.add(sub if sub in modules else node.module)
        # a package's __init__ is imported before any of its modules: an edge to it is no
        # circle of the module's making
        edges[name] = {m for m in out if m != name and not name.startswith(m + ".")}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary circle's modules, found by a depth-first walk from each module."""
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def walk(start: str, at: str, trail: list[str]) -> None:
        for nxt in sorted(edges.get(at, ())):
            if nxt == start:
                key = tuple(sorted(trail))
                if key not in seen:
                    seen.add(key)
                    found.append(list(trail))
            elif nxt not in trail and nxt > start:
                walk(start, nxt, [*trail, nxt])

    for start in sorted(edges):
        walk(start, start, [start])
    return found


def test_the_import_graph_has_no_circle() -> None:
    """Issue 24: no circle at all, path.export and path.peers included (they take the parts
    they need, not PciPath)."""
    edges = graph()
    assert len(edges) > 30 and "rig_nv_pci.boot.ampere" in edges
    assert {"rig_nv_pci.path.export", "rig_nv_pci.path.peers"} <= edges["rig_nv_pci.path.pci"]
    found = circles(edges)
    assert found == [], f"import circles: {found}"


def test_the_circle_check_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]


def test_every_module_docstring_is_a_dozen_lines_or_fewer() -> None:
    """Issue 24: a module docstring says what the module holds and its rules in a dozen lines
    or fewer; the rest of its notes lie in docs/rig-nv-pci-modules/, which it names."""
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
        if doc is not None and len(doc.strip("\n").splitlines()) > 12:
            long[module_name(path)] = len(doc.strip("\n").splitlines())
    assert long == {}
    docs = SRC.parents[2] / "docs" / "rig-nv-pci-modules"
    for path in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
        for word in doc.split():
            if word.startswith("docs/rig-nv-pci-modules/"):
                assert (docs.parent.parent / word.rstrip(".")).is_file(), (path, word)
