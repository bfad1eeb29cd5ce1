"""Fixtures the rig-nv-pci tests share."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.append(str(Path(__file__).parents[2] / "rig-pci/tests"))
from ssh_server import sshd  # noqa: F401  (a real SSH server on 127.0.0.1, for test_ssh.py)
from test_held import Opened, simulated_ga102


@pytest.fixture
def ga102(tmp_path: Path) -> Iterator[Opened]:
    """A simulated GA102 whose GSP has booted, its simulated GSP-RM stopped afterwards (a
    module's own ``ga102`` fixture, where it has one, takes its place)."""
    opened = simulated_ga102(tmp_path)
    yield opened
    opened.sim_rm.stop()
