"""The stand-in GPU path (fake_gpu.py) is importable by the tests beside it, and ``dev`` is a
device on it, stopped after the test."""

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def dev() -> Iterator[tuple[Any, Any]]:
    """(device, stand-in path) of a rig_nv.Device over fake_gpu.py."""
    from fake_gpu import open_fake

    d, path = open_fake()
    try:
        yield d, path
    finally:
        d.stop()
