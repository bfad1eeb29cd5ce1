"""Fixtures the rig-nv-pci tests share."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import debian_firmware
import pytest
from ssh_server import sshd  # noqa: F401  (a real SSH server on 127.0.0.1, for test_ssh.py)
from support import Opened, simulated_ga102

from rig_nv_pci import lock


@pytest.fixture(autouse=True)
def private_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's lock files in a directory of its own (a test's fixture may name another):
    the machine's rig-nv-pci.lock would make every test run on the machine, another
    engineer's among them, wait for the others' opens and changes."""
    own = tmp_path / "private-locks"
    own.mkdir()
    monkeypatch.setattr(lock, "directory", lambda: own)


@pytest.fixture
def ga102(tmp_path: Path) -> Iterator[Opened]:
    """A simulated GA102 whose GSP has booted, its simulated GSP-RM stopped afterwards (a
    module's own ``ga102`` fixture, where it has one, takes its place)."""
    opened = simulated_ga102(tmp_path)
    yield opened
    opened.sim_rm.stop()


@pytest.fixture(scope="session")
def nvidia_firmware() -> Iterator[Path]:
    """A directory of NVIDIA's own GSP 570.144 files: $RIG_NV_FIRMWARE where it is set, else
    fetched once a test run from Debian's firmware-nvidia-graphics into a temporary directory
    removed at the run's end (debian_firmware.fetch: some 10 s, 100 MB down, 90 MB on disk).
    Where the fetch fails, the tests that use it skip, saying why (pytest keeps a session
    fixture's skip for the run: one try)."""
    named = os.environ.get("RIG_NV_FIRMWARE")
    if named:
        yield Path(named)
        return
    with tempfile.TemporaryDirectory(prefix="rig-nv-firmware-") as into:
        try:
            debian_firmware.fetch(Path(into))
        except debian_firmware.FetchError as e:
            pytest.skip(f"NVIDIA's firmware is not here: {e} (or name a directory of it in "
                        "RIG_NV_FIRMWARE)")
        yield Path(into)
