"""Fixture trees the rig-pci tests share: ``make_device(**kwargs)`` writes, under the test's
tmp_path, a function 0000:01:00.0 with a 1 MiB register BAR 0 and a 4 MiB prefetchable BAR 1
(``kwargs`` as rig_pci.testing.add_function takes them) and returns its sysfs directory, whose
name is its bus address. ``sshd`` is a real SSH server on 127.0.0.1 (ssh_server.py)."""

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rig_pci.testing import add_function

sys.path.insert(0, str(Path(__file__).parent))
from ssh_server import sshd  # noqa: F401  (the fixture)


@pytest.fixture
def make_device(tmp_path: Path) -> Callable[..., Path]:
    def make(**kwargs: object) -> Path:
        return add_function(
            tmp_path,
            "0000:01:00.0",
            vendor=0x1234,
            device=0x5678,
            class_code=0x030200,
            bars={0: (0xF000_0000, 1 << 20, False), 1: (0xE000_0000, 4 << 20, True)},
            **kwargs,  # type: ignore[arg-type]
        )

    return make
