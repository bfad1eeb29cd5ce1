"""GPU tests of the kernel-driver path: marked ``gpu``, skipped where /dev/nvidiactl is absent.

Each test gets a freshly opened device of GPU 0 and stops it afterwards, so a failing test
cannot leave the next one a half-used device.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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
