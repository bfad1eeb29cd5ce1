"""Taking a function through VFIO, with a fake kernel answering the ioctls (rig_pci.testing's
FakeVfio, written from linux/vfio.h apart from rig_pci.vfio) and a regular file standing for
VFIO's device file."""

import errno
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from rig_edge import RigError
from rig_pci import Function, Machine, libc
from rig_pci import vfio as v
from rig_pci.sysfs import SysfsTransport
from rig_pci.testing import (
    FakeVfio,
    add_function,
    add_vfio,
    config_space,
    inaccessible,
    mappings,
)

MakeDevice = Callable[..., Path]
R, W, MMAP = 1, 2, 4  # VFIO_REGION_INFO_FLAG_READ, _WRITE, _MMAP
SHIFT = FakeVfio.REGION_SHIFT


def vfio_device(tmp_path: Path, make_device: MakeDevice, **fake: object) -> tuple[Path, FakeVfio]:
    dev = make_device(driver="vfio-pci", iommu_group=12)
    add_vfio(tmp_path, 12)
    device_file = tmp_path / "vfio-device"
    with open(device_file, "wb") as f:
        f.truncate(8 << SHIFT)
        f.seek(7 << SHIFT)
        f.write(config_space(0x1234, 0x5678, 0x030200))
    regions = {0: (R | W | MMAP, 1 << 20), 1: (R | W, 4 << 20), 7: (R | W, 256)}
    return dev, FakeVfio(device_file, regions=regions, **fake)  # type: ignore[arg-type]


def test_request_numbers_are_linux_vfio_h() -> None:
    # _IO(';', 100 + n) from include/uapi/linux/vfio.h.
    assert (v.VFIO_GET_API_VERSION, v.VFIO_GROUP_GET_STATUS, v.VFIO_DEVICE_GET_REGION_INFO) == (
        0x3B64,
        0x3B67,
        0x3B6C,
    )
    assert (v.VFIO_DEVICE_RESET, v.VFIO_IOMMU_MAP_DMA, v.VFIO_IOMMU_UNMAP_DMA) == (
        0x3B6F,
        0x3B71,
        0x3B72,
    )
    # sizeof the structs, as the kernel's minsz checks them.
    assert (v.GROUP_STATUS.size, v.REGION_INFO.size, v.DMA_MAP.size, v.DMA_UNMAP.size) == (
        8,
        32,
        32,
        24,
    )


def test_region_info_is_parsed_as_the_kernel_fills_it() -> None:
    buf = v.region_info_request(7)
    assert struct.unpack("<IIIIQQ", buf) == (32, 0, 7, 0, 0, 0)
    struct.pack_into("<IIIIQQ", buf, 0, 32, R | W | MMAP, 7, 0, 4096, 7 << 40)
    info = v.parse_region_info(buf)
    assert (info.index, info.size, info.offset, info.mappable) == (7, 4096, 7 << 40, True)


def test_take_through_vfio_follows_the_group_rules(tmp_path: Path, make_device: MakeDevice) -> None:
    dev, fake = vfio_device(tmp_path, make_device)
    with Function.take(Machine.at(tmp_path, ioctl=fake), dev.name) as f:
        assert f.how == "VFIO" and f.maps_host
        assert fake.calls == [
            "GET_API_VERSION",
            "CHECK_EXTENSION",
            "GROUP_GET_STATUS",
            "GROUP_SET_CONTAINER",
            "SET_IOMMU",
            "GROUP_GET_DEVICE_FD 0000:01:00.0",
            "DEVICE_GET_INFO",
            "DEVICE_GET_REGION_INFO",
        ]
        # Config space through VFIO's config region (index 7).
        assert f.config.read16(0) == 0x1234 and f.alive()
        # BAR 0 allows mmap: a mapped window of the region; BAR 1 does not: read and written.
        w0, w1 = f.window(0), f.window(1)
        w0.write32(0x40, 0x11223344)
        w1.write64(0x80, 0x5566778899AABBCC)
        assert w0.read32(0x40) == 0x11223344 and w1.read64(0x80) == 0x5566778899AABBCC
    data = fake.device.read_bytes()
    assert struct.unpack_from("<I", data, (0 << SHIFT) + 0x40)[0] == 0x11223344
    assert struct.unpack_from("<Q", data, (1 << SHIFT) + 0x80)[0] == 0x5566778899AABBCC


def test_group_that_is_not_viable_is_refused_naming_who_breaks_it(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    dev, fake = vfio_device(tmp_path, make_device, viable=False)
    add_function(
        tmp_path,
        "0000:01:00.1",
        vendor=0x1234,
        device=0x5679,
        class_code=0x040300,
        driver="snd_hda_intel",
        iommu_group=12,
    )
    with pytest.raises(RigError, match=r"group 12 is not viable .*0000:01:00.1 \(snd_hda_intel\)"):
        Function.take(Machine.at(tmp_path, ioctl=fake), dev.name)
    assert "GROUP_SET_CONTAINER" not in fake.calls


@pytest.mark.parametrize(
    ("fake", "match"),
    [
        ({"api_version": 1}, "VFIO's API is version 1"),
        ({"type1v2": False}, "type-1 v2"),
    ],
)
def test_refused_when_vfio_lacks_what_rig_needs(
    tmp_path: Path, make_device: MakeDevice, fake: dict[str, object], match: str
) -> None:
    dev, kernel = vfio_device(tmp_path, make_device, **fake)
    with pytest.raises(RigError, match=match):
        Function.take(Machine.at(tmp_path, ioctl=kernel), dev.name)


def test_refused_when_the_group_file_is_missing(tmp_path: Path, make_device: MakeDevice) -> None:
    dev, fake = vfio_device(tmp_path, make_device)
    (tmp_path / "dev/vfio/12").unlink()
    with pytest.raises(RigError, match=r"/dev/vfio/12 cannot be opened: .*bound to vfio-pci"):
        Function.take(Machine.at(tmp_path, ioctl=fake), dev.name)


def test_vfio_reset_and_its_absence(tmp_path: Path, make_device: MakeDevice) -> None:
    dev, fake = vfio_device(tmp_path, make_device)
    with Function.take(Machine.at(tmp_path, ioctl=fake), dev.name) as f:
        f.reset()
    assert "DEVICE_RESET" in fake.calls
    fake2 = FakeVfio(fake.device, regions=fake.regions, reset=False)
    with (
        Function.take(Machine.at(tmp_path, ioctl=fake2), dev.name) as f,
        pytest.raises(RigError, match="Linux has no reset for it"),
    ):
        f.reset()
    assert "DEVICE_RESET" not in fake2.calls


def test_dma_memory_is_mapped_at_its_host_address(tmp_path: Path, make_device: MakeDevice) -> None:
    dev, fake = vfio_device(tmp_path, make_device)
    machine = Machine(SysfsTransport(tmp_path, shares_memory=True, ioctl=fake))
    with Function.take(machine, dev.name) as f:
        m = f.alloc_dma(5000)
        assert m is not None
        assert m.length == 8192 and m.bus == ((m.host, 8192),)
        assert fake.mapped == {m.host: (m.host, 8192)}
        view = m.view()
        assert bytes(view) == bytes(8192)  # zeroed
        view[100] = 7
        view.release()
        assert m.bus_address(100) == m.host + 100
        m.free()
        m.free()  # once
        assert fake.mapped == {} and fake.calls.count("IOMMU_UNMAP_DMA") == 1
        kept = f.alloc_dma(4096)
        assert kept is not None
    assert kept.freed and fake.mapped == {}  # the release freed it


def test_dma_past_the_locked_memory_limit_is_none(tmp_path: Path, make_device: MakeDevice) -> None:
    dev, fake = vfio_device(tmp_path, make_device, map_errno=errno.ENOMEM)
    machine = Machine(SysfsTransport(tmp_path, shares_memory=True, ioctl=fake))
    with Function.take(machine, dev.name) as f:
        assert f.alloc_dma(4096) is None  # VFIO's pin refused past RLIMIT_MEMLOCK
        fake.map_errno = errno.EFAULT
        with pytest.raises(RigError, match="VFIO_IOMMU_MAP_DMA failed"):
            f.alloc_dma(4096)


def test_a_window_placed_at_a_reserved_address_maps_the_region_at_its_mmap_offset(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    """BAR 0 (a region VFIO lets the process map) placed at the address asked for: the device
    file mapped there from the region's offset plus the window's; closing it puts the
    reservation back. BAR 1, which VFIO reads and writes for the process, cannot be placed,
    and asking changes nothing."""
    dev, fake = vfio_device(tmp_path, make_device)
    n = 8 * libc.PAGE
    base = libc.mmap(0, n, libc.PROT_NONE, libc.MAP_PRIVATE | libc.MAP_ANONYMOUS
                     | libc.MAP_NORESERVE)
    try:
        with Function.take(Machine.at(tmp_path, ioctl=fake), dev.name) as f:
            at = base + 2 * libc.PAGE
            w = f.window(0, libc.PAGE, 2 * libc.PAGE, at=at)
            [placed] = [m for m in mappings(base, base + n) if m.path]
            assert (placed.start, placed.end, placed.perms) == (at, at + 2 * libc.PAGE, "rw-s")
            assert placed.path == str(fake.device)
            w.write32(0x40, 0x11223344)
            libc.view(at + libc.PAGE, 4)[:] = b"host"  # the window's second page, by address
            data = fake.device.read_bytes()
            assert struct.unpack_from("<I", data, (0 << SHIFT) + libc.PAGE + 0x40)[0] == 0x11223344
            assert data[(0 << SHIFT) + 2 * libc.PAGE:][:4] == b"host"
            w.close()
            assert inaccessible(base, base + n)
            with pytest.raises(RigError, match=r"BAR 1: VFIO does not let it be mapped, so it "
                               rf"cannot be placed at 0x{at:x}"):
                f.window(1, 0, libc.PAGE, at=at)
            assert inaccessible(base, base + n)
            f.window(0, 0, libc.PAGE, at=base)  # left open: the release closes it
        assert inaccessible(base, base + n)
    finally:
        libc.munmap(base, n)
