"""Issue 22, bullet 1: the examples in examples/ run as written, and the README shows them.

On the CPU each example runs up to its open (the opener stands in, raising); every cubin it
names is committed for each architecture rig knows and parses as one. The GPU test (marked
``gpu``) runs each whole. mypy --strict checks examples/ (mypy.ini's files).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))
ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]


class ReachedTheOpen(Exception):
    """Raised by the stand-in opener: the example got as far as opening a GPU."""


class Opener:
    def open(self) -> Any:
        raise ReachedTheOpen


def test_there_are_the_four_examples() -> None:
    assert SCRIPTS == ["peers.py", "saxpy_step.py", "triton_softmax.py", "vadd.py"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_example_runs_up_to_the_open(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import rig_nv_nvidia

    monkeypatch.setattr(rig_nv_nvidia, "gpu", lambda i: Opener())
    monkeypatch.setattr(rig_nv_nvidia, "count", lambda: 2)
    monkeypatch.setattr(rig_nv_nvidia, "reaches", lambda a, b: True)
    with pytest.raises(ReachedTheOpen):
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_cubin_an_example_names_is_committed_for_every_architecture(script: str) -> None:
    from rig_nv import cubin

    names = set(re.findall(r'f"(\w+)\.\{d\d?\.arch\}\.cubin"', (EXAMPLES / script).read_text()))
    assert names, script
    if script.startswith("triton_"):  # Triton-compiled: its metadata beside each cubin
        for name in names:
            for arch in ARCHS:
                parsed = cubin.parse((EXAMPLES / "cubins" / f"{name}.{arch}.cubin").read_bytes())
                meta = json.loads((EXAMPLES / "cubins" / f"{name}.{arch}.json").read_text())
                kernel = meta["metadata"]["name"]
                assert parsed.arch.rstrip("a") == arch and kernel in parsed.kernels, (name, arch)
                assert f"def {kernel}(" in (EXAMPLES / "triton" / "build.py").read_text()
        return
    for name in names:
        source = (EXAMPLES / f"{name}.cu").read_text()
        for arch in ARCHS:
            parsed = cubin.parse((EXAMPLES / "cubins" / f"{name}.{arch}.cubin").read_bytes())
            assert parsed.arch == arch and name in parsed.kernels, (name, arch)
        assert f"void {name}(" in source


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_readme_examples_are_taken_from_the_example_files() -> None:
    """Each README python block is, line for line, a run of lines of one example file."""
    blocks = python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    sources = [(EXAMPLES / s).read_text() for s in SCRIPTS]
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip() and line != "..."]
        assert any(all(line in src.splitlines() for line in lines) for src in sources), block


@pytest.mark.gpu
@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="no NVIDIA kernel driver here")
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_example_runs_whole_on_the_gpu(script: str) -> None:
    # The packages' sources first, then whatever path this run has (cffi may live there).
    srcs = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    have = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(srcs + have)}
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(script.removesuffix(".py") + ":"), out.stdout  # its own name
