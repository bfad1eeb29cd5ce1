"""Taking a function physically, on fixture sysfs trees whose resource files are regular files
(mmap maps them as it maps a BAR): the refusals, config space, BAR windows at exact widths
(and placed at an address the caller reserved), the one release."""

import ctypes
import errno
import fcntl
import gc
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rig_edge import Misuse, RigError
from rig_pci import Function, Machine, libc
from rig_pci.function import held
from rig_pci.sysfs import SysfsTransport
from rig_pci.testing import add_process, inaccessible, mappings, set_lockdown
from rig_pci.window import PlacedWindow

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


# ---- a window placed at an address the caller reserved (Function.window's at) ------------------


@pytest.fixture
def reserved() -> Iterator[int]:
    """16 pages of the process reserved as a caller reserves a range (inaccessible, unbacked),
    given back after the test."""
    n = 16 * libc.PAGE
    base = libc.mmap(0, n, libc.PROT_NONE, libc.MAP_PRIVATE | libc.MAP_ANONYMOUS
                     | libc.MAP_NORESERVE)
    yield base
    libc.munmap(base, n)


def test_a_window_placed_at_a_reserved_address_maps_the_bar_there_until_closed(
    tmp_path: Path, make_device: MakeDevice, reserved: int
) -> None:
    """The BAR's resource file (write-combined: resource1_wc) mapped at the address asked for:
    what the window writes is in the BAR's file, and what the file holds the process reads at
    that address; closing it puts the reservation back, whole."""
    dev = make_device()
    end = reserved + 16 * libc.PAGE
    at = reserved + 4 * libc.PAGE
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        w = f.window(1, 2 * libc.PAGE, 3 * libc.PAGE, write_combined=True, at=at)
        assert isinstance(w, PlacedWindow) and w.address == at and w.size == 3 * libc.PAGE
        assert ctypes.addressof(ctypes.c_char.from_buffer(w.buffer())) == at
        [placed] = [m for m in mappings(reserved, end) if m.path]
        assert (placed.start, placed.end) == (at, at + 3 * libc.PAGE)
        assert placed.perms == "rw-s" and placed.path == str(dev.resolve() / "resource1_wc")
        assert inaccessible(reserved, at) and inaccessible(at + 3 * libc.PAGE, end)
        w.write32(0x10, 0xCAFEF00D)
        w.write64(2 * libc.PAGE - 8, 0x0123_4567_89AB_CDEF)  # its second page
        data = (dev / "resource1_wc").read_bytes()
        assert struct.unpack_from("<I", data, 2 * libc.PAGE + 0x10)[0] == 0xCAFEF00D
        assert struct.unpack_from("<Q", data, 4 * libc.PAGE - 8)[0] == 0x0123_4567_89AB_CDEF
        with open(dev / "resource1_wc", "r+b") as bar:  # the device's side writes; the host reads
            bar.seek(2 * libc.PAGE + 0x20)
            bar.write(b"the BAR")
        assert bytes(libc.view(at + 0x20, 7)) == b"the BAR" and w.read8(0x20) == ord("t")
        w.close()
        assert inaccessible(reserved, end)
        with pytest.raises(Misuse, match="closed"):
            w.read32(0)
        w.close()  # again: nothing
        assert inaccessible(reserved, end)
        # A window left open goes with the function, which puts the reservation back too.
        f.window(0, 0, libc.PAGE, at=reserved)
        assert mappings(reserved, reserved + libc.PAGE)[0].path.endswith("resource0")
    assert inaccessible(reserved, end)


@pytest.mark.parametrize(
    ("offset", "length", "where"),
    [
        (0, 0x1000, 0x800),  # the address inside a page
        (0, 0x1800, 0),  # a length of a page and a half (not rounded over the caller's memory)
        (0x800, 0x1000, 0),  # the BAR's offset inside a page
        (0, 0, 0),  # nothing
    ],
)
def test_a_placed_window_not_page_aligned_is_refused_changing_nothing(
    tmp_path: Path, make_device: MakeDevice, reserved: int, offset: int, length: int, where: int
) -> None:
    dev = make_device()
    end = reserved + 16 * libc.PAGE
    before = mappings(reserved, end)
    with Function.take(Machine.at(tmp_path), dev.name) as f:
        with pytest.raises(Misuse, match="page-aligned"):
            f.window(1, offset, length, at=reserved + libc.PAGE + where)
        assert mappings(reserved, end) == before and inaccessible(reserved, end)
        with pytest.raises(Misuse, match="page-aligned"):
            f.window(1, 0, libc.PAGE, at=0)  # no address: mmap would choose one
    assert mappings(reserved, end) == before
    assert (dev / "resource1").read_bytes() == bytes(4 << 20)


def test_a_placed_window_the_kernel_refuses_leaves_the_range_reserved(
    tmp_path: Path, make_device: MakeDevice, reserved: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A MAP_FIXED mmap that fails may have unmapped what lay there first: the range is
    reserved again, and the refusal names the BAR and the address."""
    dev = make_device()
    end = reserved + 16 * libc.PAGE
    real = libc.mmap

    def refusing(addr: int, n: int, prot: int, flags: int, fd: int = -1, off: int = 0) -> int:
        if flags & libc.MAP_SHARED:
            libc.munmap(addr, n)  # the kernel took the old mapping down, then failed
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return real(addr, n, prot, flags, fd, off)

    with Function.take(Machine.at(tmp_path), dev.name) as f:
        monkeypatch.setattr(libc, "mmap", refusing)
        with pytest.raises(RigError, match=rf"0000:01:00.0 BAR 1 .*: 0x2000 bytes cannot be "
                           rf"mapped at 0x{reserved + libc.PAGE:x}: Cannot allocate memory"):
            f.window(1, 0, 2 * libc.PAGE, at=reserved + libc.PAGE)
        assert inaccessible(reserved, end)
