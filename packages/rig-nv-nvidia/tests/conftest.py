"""GPU tests of the kernel-driver path: marked ``gpu``, skipped where /dev/nvidiactl is absent.

Each test gets a freshly opened device of GPU 0 and stops it afterwards, so a failing test
cannot leave the next one a half-used device. CPU tests get ``kernel``, a stand-in driver.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # fake_kernel.py, for the CPU tests

HAS_GPU = os.path.exists("/dev/nvidiactl")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="no NVIDIA kernel driver here (/dev/nvidiactl is absent)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)


@pytest.fixture
def device() -> Iterator[object]:
    import rig_nv_nvidia

    d = rig_nv_nvidia.gpu(0).open()
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A stand-in of NVIDIA's kernel driver (fake_kernel.py) under a fresh process state; the
    files it leaves open are closed after the test."""
    from fake_kernel import FakeKernel

    k = FakeKernel(tmp_path).install(monkeypatch)
    try:
        yield k
    finally:
        k.close()
