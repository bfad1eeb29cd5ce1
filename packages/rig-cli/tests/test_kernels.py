"""The built-in kernel's cubins: one per architecture rig knows, each what its name says, and
all of them in the wheel."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rig_cli.check import kernel_archs, kernel_for

PACKAGE = Path(__file__).resolve().parents[1]
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]


def test_a_cubin_for_each_architecture() -> None:
    assert kernel_archs() == ARCHS
    assert kernel_for("sm_75") is None
    build = (PACKAGE / "build.sh").read_text()
    assert "for sm in 80 86 89 90 100 120; do" in build


@pytest.mark.parametrize("arch", ARCHS)
def test_each_cubin_is_vadd_for_its_architecture(arch: str) -> None:
    from rig_nv.cubin import parse

    cubin = kernel_for(arch)
    assert cubin is not None and len(cubin) < 16 << 10  # small: they are committed
    parsed = parse(cubin)
    assert parsed.arch == arch
    vadd = parsed.kernel("vadd")
    assert [(p.offset, p.size) for p in vadd.params] == [(0, 8), (8, 8), (16, 8), (24, 4)]


def test_the_wheel_carries_the_cubins(tmp_path: Path) -> None:
    pytest.importorskip("hatchling")
    subprocess.run(
        [sys.executable, "-c",
         f"from hatchling.build import build_wheel; build_wheel({str(tmp_path)!r})"],
        cwd=PACKAGE, check=True, capture_output=True,
    )
    (wheel,) = tmp_path.glob("rig_cli-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for arch in ARCHS:
        assert f"rig_cli/kernels/vadd.{arch}.cubin" in names
    assert "rig_cli/kernels/vadd.cu" in names and "rig_cli/py.typed" in names
