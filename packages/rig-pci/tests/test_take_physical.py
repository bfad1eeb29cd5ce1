"""Taking a function physically, on fixture sysfs trees whose resource files are regular files
(mmap maps them as it maps a BAR): the refusals, config space, BAR windows at exact widths,
the one release."""

import fcntl
import gc
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from rig_edge import Misuse, RigError
from rig_pci import Function, Machine
from rig_pci.function import held
from rig_pci.sysfs import SysfsTransport
from rig_pci.testing import add_process, set_lockdown

MakeDevice = Callable[..., Path]


def test_take_reads_and_writes_config_space(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        assert f.how == "physically" and not f.maps_host
        assert f.config.read16(0) == 0x1234 and f.config.read16(2) == 0x5678
        assert f.config.read32(8) >> 8 == 0x030200
        f.config.write16(4, 0x0406)
        assert f.alive()
    assert struct.unpack_from("<H", (dev / "config").read_bytes(), 4)[0] == 0x0406


def test_bar_window_reads_and_writes_at_exact_widths(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    dev = make_device()
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        w = f.window(0)
        assert w.size == 1 << 20
        w.write8(0x10, 0xAB)
        w.write16(0x12, 0xBEEF)
        w.write32(0x14, 0xDEADBEEF)
        w.write64(0x18, 0x0123_4567_89AB_CDEF)
        assert (w.read8(0x10), w.read16(0x12), w.read32(0x14), w.read64(0x18)) == (
            0xAB,
            0xBEEF,
            0xDEADBEEF,
            0x0123_4567_89AB_CDEF,
        )
        assert w.read32(0x10) == 0xBEEF00AB  # little-endian, as PCI is
        part = f.window(1, 0x1000, 0x1000, write_combined=True)
        part.write32(0, 0xCAFEF00D)
        # BAR 0 is not prefetchable: Linux offers no resource0_wc, so it maps uncached.
        f.window(0, write_combined=True).write8(0x20, 0x5A)
    data = (dev / "resource0").read_bytes()
    assert data[0x10:0x21] == bytes.fromhex("ab00efbeefbeadde efcdab8967452301 5a".replace(" ", ""))
    # The write-combined window is the BAR's resource1_wc file, 0x1000 bytes in.
    assert struct.unpack_from("<I", (dev / "resource1_wc").read_bytes(), 0x1000)[0] == 0xCAFEF00D


def test_window_misuse_touches_nothing(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        w = f.window(0)
        for bad in (lambda: w.read32(2), lambda: w.read16(1 << 20), lambda: w.read(0, 3)):
            with pytest.raises(Misuse):
                bad()
        with pytest.raises(Misuse):
            w.write8(0, 0x100)
        with pytest.raises(Misuse):
            f.window(3)  # no such BAR
        with pytest.raises(Misuse):
            f.window(0, 0x800)  # not page-aligned
        with pytest.raises(Misuse):
            f.window(0, 0, 2 << 20)  # past the BAR's end
    assert (dev / "resource0").read_bytes() == bytes(1 << 20)


def test_dead_function_reads_all_ones(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        assert f.alive()
        with open(dev / "config", "r+b") as cfg:
            cfg.write(b"\xff" * 256)  # as a function that fell off the bus reads
        assert not f.alive()


def test_refused_while_a_kernel_driver_holds_it(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device(driver="nvidia")
    with pytest.raises(RigError, match=r"0000:01:00.0 .*cannot be taken: the kernel driver nvidia"):
        Function.take(Machine.at(tmp_path), dev.name)
    assert not held(Machine.at(tmp_path), dev.name)


def test_refused_behind_a_translating_iommu(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device(iommu_group=12)
    with pytest.raises(RigError, match=r"behind an IOMMU \(group 12\): bind it to vfio-pci"):
        Function.take(Machine.at(tmp_path), dev.name)


def test_identity_iommu_group_is_taken_physically(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device(iommu_group=12, iommu_type="identity")  # iommu=pt: no translation
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        assert f.how == "physically"


def test_refused_when_the_kernel_is_locked_down(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    set_lockdown(tmp_path, "integrity")
    with pytest.raises(RigError, match=r"locked down \(integrity\)"):
        Function.take(Machine.at(tmp_path), dev.name)
    set_lockdown(tmp_path, "none")
    Function.take(Machine.at(tmp_path), dev.name).close()


def test_refused_when_files_cannot_be_opened(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    (dev / "resource1").unlink()
    with pytest.raises(RigError, match=r"devices/0000:01:00.0/resource1 cannot be opened"):
        Function.take(Machine.at(tmp_path), dev.name)
    assert not held(Machine.at(tmp_path), dev.name)  # nothing kept


def test_refused_without_pagemap_on_a_machine_sharing_memory(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    dev = make_device()
    machine = Machine(SysfsTransport(tmp_path, shares_memory=True))
    with pytest.raises(RigError, match=r"/proc/self/pagemap cannot be opened"):
        Function.take(machine, dev.name)
    add_process(tmp_path, 1, "init")
    (tmp_path / "proc/self").mkdir()
    (tmp_path / "proc/self/pagemap").touch()
    Function.take(machine, dev.name).close()


def test_one_holder_at_a_time(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    machine = Machine.at(tmp_path)
    f = Function.take(machine, dev.name)
    with pytest.raises(RigError, match="this process holds it already"):
        Function.take(machine, dev.name)
    f.close()
    # Another process's take holds the config file's flock.
    other = os.open(dev / "config", os.O_RDONLY)
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with pytest.raises(RigError, match="another holder"):
            Function.take(machine, dev.name)
    finally:
        os.close(other)
    Function.take(machine, dev.name).close()


def test_released_exactly_once(tmp_path: Path, make_device: MakeDevice) -> None:
    dev = make_device()
    machine = Machine.at(tmp_path)
    fds_before = len(os.listdir("/proc/self/fd"))
    f = Function.take(machine, dev.name)
    w = f.window(0)
    assert held(machine, dev.name) and not f.closed
    f.close()
    f.close()  # again: nothing
    assert f.closed and not held(machine, dev.name)
    assert len(os.listdir("/proc/self/fd")) == fds_before
    with pytest.raises(Misuse):
        w.read32(0)  # its window went with it
    with pytest.raises(Misuse):
        f.window(0)
    with Function.take(machine, dev.name) as g:
        assert "physically" in repr(g)
    assert g.closed and "released" in repr(g)


def test_a_forgotten_function_is_released_when_collected(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    dev = make_device()
    machine = Machine.at(tmp_path)
    Function.take(machine, dev.name)  # dropped at once
    gc.collect()
    assert not held(machine, dev.name)
    Function.take(machine, dev.name).close()


def test_dma_is_refused_where_the_memory_is_not_this_process(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    dev = make_device()
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        with pytest.raises(RigError, match="memory is not this process's"):
            f.alloc_dma(4096)
        with pytest.raises(Misuse):
            f.alloc_dma(0)
        with pytest.raises(RigError, match="memory is not this process's"):
            f.map_host(0x10000, 4096)
