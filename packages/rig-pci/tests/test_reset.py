"""Function.reset on fixture trees: bus mastering off, Linux's reset written, the wait until
the function answers again, and the two errors."""

import struct
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from rig_edge import RigError
from rig_pci import Function
from rig_pci.testing import fixture_machine

MakeDevice = Callable[..., Path]


def command(dev: Path) -> int:
    return int(struct.unpack_from("<H", (dev / "config").read_bytes(), 4)[0])


def set_vendor(dev: Path, vendor: int) -> None:
    with open(dev / "config", "r+b") as f:
        f.write(struct.pack("<H", vendor))


def test_reset_turns_bus_mastering_off_then_writes_reset(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    dev = make_device()
    machine, sysfs = fixture_machine(tmp_path)
    seen = []
    sysfs.on_reset = lambda bus: seen.append((bus, command(dev)))
    with Function.take(machine, dev.name) as f:
        f.bus_master(True)
        assert command(dev) & 0x4
        f.reset()
    # Linux's reset saw the command register with bus mastering (bit 2) off, memory space on.
    assert seen == [(dev.name, 0x0002)]
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{dev.name}/reset", "1")]


def test_reset_waits_until_the_function_answers(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    machine, sysfs = fixture_machine(tmp_path)

    def in_reset(bus: str) -> None:
        set_vendor(dev, 0xFFFF)  # config reads all-ones while the function resets...
        threading.Timer(0.05, set_vendor, (dev, 0x1234)).start()  # ...then it answers

    sysfs.on_reset = in_reset
    with Function.take(machine, dev.name) as f:
        f.reset(timeout_s=5)
        assert f.alive()


def test_reset_that_never_comes_back_fails(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    machine, sysfs = fixture_machine(tmp_path)
    sysfs.on_reset = lambda bus: set_vendor(dev, 0xFFFF)
    with (
        Function.take(machine, dev.name) as f,
        pytest.raises(RigError, match=r"0000:01:00.0 does not respond after its reset"),
    ):
        f.reset(timeout_s=0.05)


def test_no_reset_file_means_linux_has_no_reset(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device(reset=False)
    machine, sysfs = fixture_machine(tmp_path)
    with Function.take(machine, dev.name) as f:
        f.bus_master(True)
        with pytest.raises(RigError, match="Linux has no reset for it"):
            f.reset()
    assert sysfs.writes == [] and command(dev) & 0x4  # nothing changed
