"""The packages' dependency graph is the README's package table, proven on built wheels in
fresh venvs.

rig-pci installs and imports alone (nothing NVIDIA comes with it); rig-nv-nvidia brings
rig-edge, rig-pci and rig-nv (and cffi) but not rig-nv-pci or rig-cli.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["rig-edge", "rig-pci", "rig-nv", "rig-nv-nvidia", "rig-nv-pci", "rig-cli"]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    for name in PACKAGES:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                "--outdir",
                str(out),
                str(ROOT / "packages" / name),
            ],
            check=True,
            capture_output=True,
        )
    return out


# The fresh venvs must see only what was installed into them, not this process's path.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True)
    return where / "bin" / "python"


def run(python: Path, *args: str, check: bool = True,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in its venv alone: this process's import path is not passed on."""
    return subprocess.run([str(python), *args], env=CLEAN_ENV, check=check, capture_output=True,
                          text=True, cwd=cwd)


def installed(python: Path) -> set[str]:
    out = run(python, "-m", "pip", "list", "--format", "freeze").stdout
    return {line.split("==")[0].lower() for line in out.splitlines()}


def test_each_package_builds_a_pure_python_typed_wheel(wheels: Path) -> None:
    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert len(built) == len(PACKAGES)
    assert all(name.endswith("-py3-none-any.whl") for name in built)
    import zipfile

    for whl in wheels.glob("*.whl"):
        assert any(n.endswith("/py.typed") for n in zipfile.ZipFile(whl).namelist()), whl


def test_rig_pci_installs_and_imports_alone(wheels: Path, tmp_path: Path) -> None:
    python = venv(tmp_path / "v")
    run(python, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), "rig-pci")
    assert {n for n in installed(python) if n.startswith("rig")} == {"rig-edge", "rig-pci"}
    code = (
        "import importlib.util, rig_pci; rig_pci.Machine.this().functions(); "
        "assert importlib.util.find_spec('rig_nv') is None; print('ok')"
    )
    out = run(python, "-c", code, check=False)
    assert out.stdout.strip() == "ok", out.stderr


def test_kernel_driver_backend_does_not_bring_the_pci_backend(wheels: Path, tmp_path: Path) -> None:
    python = venv(tmp_path / "v")
    # cffi comes from the package index; the rig packages only from the wheels built here.
    run(python, "-m", "pip", "install", "-q", "--find-links", str(wheels), "rig-nv-nvidia")
    rigs = {n for n in installed(python) if n.startswith("rig")}
    assert rigs == {"rig-edge", "rig-pci", "rig-nv", "rig-nv-nvidia"}
    out = run(python, "-c", "import rig_nv_nvidia; print(rig_nv_nvidia.count())", check=False)
    assert out.returncode == 0, out.stderr
    # The pre-built cffi modules (rig_nv.prebuilt) came with the wheels and are the ones used:
    # opening parses no C declarations (no pycparser).
    code = (
        "import sys, cffi, rig_nv_nvidia\n"
        "from rig_nv.layouts import SUPPORTED, rm_ffi\n"
        "from rig_nv_nvidia.layouts import ioctl_ffi\n"
        "for k in SUPPORTED:\n"
        "    assert not isinstance(rm_ffi(k), cffi.FFI), k\n"
        "    assert not isinstance(ioctl_ffi(k), cffi.FFI), k\n"
        "print('pycparser' in sys.modules)\n"
    )
    out = run(python, "-c", code, check=False)
    assert out.stdout.strip() == "False", out.stderr


def test_wheels_carry_the_generated_cffi_modules(wheels: Path) -> None:
    import zipfile

    for package, leaves in (("rig_nv", ["_ffi_libc", "_ffi_rm_570", "_ffi_rm_580"]),
                            ("rig_nv_nvidia", ["_ffi_ioctl"])):
        (whl,) = wheels.glob(f"{package}-*.whl")
        names = set(zipfile.ZipFile(whl).namelist())
        for leaf in leaves:
            assert f"{package}/{leaf}.py" in names, (whl.name, leaf)


def readme_install_lines() -> list[str]:
    """The README's Install section's ``pip install`` lines, in order."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("pip install ")]


def test_the_readme_installs_one_package_alone(tmp_path: Path) -> None:
    """Issue 22, trip 4: `pip install ./packages/rig-pci` alone failed (rig-edge is on no
    index) and the README did not say how to install one package. Its line for the
    kernel-driver path, run verbatim from the clone, installs that path and nothing more."""
    import shlex

    all_packages, one = readme_install_lines()
    assert all(f"./packages/{p}" in all_packages for p in PACKAGES)
    python = venv(tmp_path / "v")
    out = run(python, "-m", *shlex.split(one), check=False, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert {n for n in installed(python) if n.startswith("rig")} == {
        "rig-edge", "rig-pci", "rig-nv", "rig-nv-nvidia"}
    out = run(python, "-c", "import rig_nv_nvidia; print(rig_nv_nvidia.count() >= 0)",
              check=False)
    assert out.stdout.strip() == "True", out.stderr


def test_every_package_declares_its_classifiers_and_the_numpy_extra() -> None:
    """Issue 22, trip 4: classifiers, and a numpy extra where numpy serves (the examples and
    rig check)."""
    import tomllib

    for name in PACKAGES:
        project = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
        project = project["project"]
        assert "Programming Language :: Python :: 3.11" in project["classifiers"], name
        assert project["license"] == "MIT", name
        extras = project.get("optional-dependencies", {})
        if name in ("rig-nv-nvidia", "rig-cli"):
            assert [d.split(">")[0] for d in extras["numpy"]] == ["numpy"], name
