"""Issue 22, trips 2 and 4: the docs a newcomer reads stand on their own.

The API reference builds from the docstrings with warnings as errors; every public callable
has a docstring; nothing points at files a clone does not have; LICENSE, CHANGELOG and
CONTRIBUTING exist and each wheel's MIT declaration has its license text beside it; each
package README is a page at most.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["rig_edge", "rig_pci", "rig_nv", "rig_nv_nvidia", "rig_nv_pci", "rig_cli"]
PAGE_WORDS = 600  # a page of prose


def test_the_api_reference_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("sphinx")
    out = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-E", "-q", "-b", "html",
                          str(ROOT / "docs" / "api"), str(tmp_path)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    device = (tmp_path / "rig_nv.html").read_text()
    for name in ("rig_nv.Device.launch", "rig_nv.Step.submit", "rig_nv.Image"):
        assert f'id="{name}"' in device, name
    assert 'id="rig_edge.Region.view"' in (tmp_path / "rig_edge.html").read_text()


def public_callables() -> list[tuple[str, object]]:
    """Each name in a package's __all__, and each public method or property of its classes."""
    found: list[tuple[str, object]] = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            thing = getattr(module, name)
            if not (inspect.isclass(thing) or inspect.isfunction(thing)):
                continue
            found.append((f"{module_name}.{name}", thing))
            if inspect.isclass(thing) and not issubclass(thing, BaseException):
                for attr, member in vars(thing).items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(member, property) or inspect.isfunction(member):
                        found.append((f"{module_name}.{name}.{attr}", member))
    return found


def test_every_public_call_has_a_docstring() -> None:
    missing = [name for name, thing in public_callables() if not inspect.getdoc(thing)]
    assert missing == []


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    keep = (".py", ".md", ".toml", ".sh", ".c", ".cu", ".yml", ".ini", ".rst", ".txt")
    return [ROOT / n for n in names
            if n.endswith(keep) and not n.startswith("docs/results/") and (ROOT / n).exists()]


@pytest.mark.parametrize("needle", ["../shared", "DESIGN.md", "project notes",
                                    "project's notes", "/work/"])
def test_nothing_points_outside_the_repository(needle: str) -> None:
    me = Path(__file__).resolve()
    hits = [str(p.relative_to(ROOT)) for p in tracked_text_files()
            if p != me and needle in p.read_text(errors="replace")]
    assert hits == []


def test_license_changelog_and_contributing_are_there() -> None:
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("MIT License")
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")
    assert "gpu" in (ROOT / "CONTRIBUTING.md").read_text()
    for package in sorted((ROOT / "packages").iterdir()):
        assert 'license = "MIT"' in (package / "pyproject.toml").read_text(), package.name
        assert (package / "LICENSE").read_text() == license_text, package.name  # in its wheel


@pytest.mark.parametrize("package", sorted(p.name for p in (ROOT / "packages").iterdir()))
def test_each_package_readme_is_a_page_at_most(package: str) -> None:
    words = len((ROOT / "packages" / package / "README.md").read_text().split())
    assert words <= PAGE_WORDS
