"""The simulated GPU is written apart from the boot code (issue 8: "the two must
not share constants or helpers, or a shared mistake passes"): nothing under tests/sim, nor the
GSP peer it loads, imports rig_nv_pci or rig_nv, and rig_nv_pci imports nothing of the tests."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src" / "rig_nv_pci"


def imported(path: Path) -> set[str]:
    """The top-level package of every module ``path`` imports (relative imports as '.')."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add("." if node.level else (node.module or "").split(".")[0])
    return names


def test_the_simulator_imports_nothing_of_the_boot_code() -> None:
    files = sorted((TESTS / "sim").glob("*.py"))
    assert len(files) > 5
    for path in files:
        shared = imported(path) & {"rig_nv_pci", "rig_nv"}
        assert not shared, f"{path.name} imports {sorted(shared)}"


def test_the_boot_code_imports_nothing_of_the_simulator() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    for path in files:
        shared = imported(path) & {"sim", "support", "firmware_builders", "tests"}
        assert not shared, f"{path.relative_to(SRC)} imports {sorted(shared)}"
