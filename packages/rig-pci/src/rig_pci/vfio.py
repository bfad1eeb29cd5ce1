"""Taking a function behind an IOMMU, through VFIO (Linux Documentation/driver-api/vfio.rst).

The group's rules: the function is bound to vfio-pci; every other function of its IOMMU group
is bound to vfio-pci or to no driver (else the group is not *viable* and VFIO refuses it);
this process can read and write the group's file /dev/vfio/N, which one process opens at a
time; and the IOMMU supports VFIO's type-1 v2 interface. The process then holds the group in a
container of its own, maps DMA memory through the container and reaches the function's config
space and BARs through the device file VFIO gives it.

Every ioctl goes through :class:`Ioctl`, one small class, so tests replace it with a fake that
answers as the kernel does. The numbers and struct layouts are linux/vfio.h's (include/uapi/
linux/vfio.h): every VFIO ioctl is ``_IO(VFIO_TYPE, VFIO_BASE + n)`` with ``VFIO_TYPE`` ';'
and ``VFIO_BASE`` 100, and passes its struct by pointer with ``argsz`` first.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from rig_edge import RigError
from rig_pci.dma import DmaMemory, memlock_allows
from rig_pci.listing import link_name
from rig_pci.window import FileWindow, MappedWindow, Window, place

# linux/vfio.h
VFIO_API_VERSION = 0
VFIO_TYPE1v2_IOMMU = 3
VFIO_TYPE = ord(";")
VFIO_BASE = 100


def _io(nr: int) -> int:
    """``_IO(VFIO_TYPE, VFIO_BASE + nr)`` (include/uapi/asm-generic/ioctl.h: no direction, no
    size, so the type in bits 8-15 and the number in bits 0-7)."""
    return VFIO_TYPE << 8 | (VFIO_BASE + nr)


VFIO_GET_API_VERSION = _io(0)  # 0x3b64
VFIO_CHECK_EXTENSION = _io(1)  # 0x3b65
VFIO_SET_IOMMU = _io(2)  # 0x3b66
VFIO_GROUP_GET_STATUS = _io(3)  # 0x3b67
VFIO_GROUP_SET_CONTAINER = _io(4)  # 0x3b68
VFIO_GROUP_UNSET_CONTAINER = _io(5)  # 0x3b69
VFIO_GROUP_GET_DEVICE_FD = _io(6)  # 0x3b6a
VFIO_DEVICE_GET_INFO = _io(7)  # 0x3b6b
VFIO_DEVICE_GET_REGION_INFO = _io(8)  # 0x3b6c
VFIO_DEVICE_RESET = _io(11)  # 0x3b6f
VFIO_IOMMU_MAP_DMA = _io(13)  # 0x3b71
VFIO_IOMMU_UNMAP_DMA = _io(14)  # 0x3b72

# struct vfio_group_status { __u32 argsz; __u32 flags; }
GROUP_STATUS = struct.Struct("=II")
VFIO_GROUP_FLAGS_VIABLE = 1 << 0
VFIO_GROUP_FLAGS_CONTAINER_SET = 1 << 1

# struct vfio_device_info { __u32 argsz, flags, num_regions, num_irqs, cap_offset; }
DEVICE_INFO = struct.Struct("=IIIII")
VFIO_DEVICE_FLAGS_RESET = 1 << 0
VFIO_DEVICE_FLAGS_PCI = 1 << 1

# struct vfio_region_info { __u32 argsz, flags, index, cap_offset; __u64 size, offset; }
REGION_INFO = struct.Struct("=IIIIQQ")
VFIO_REGION_INFO_FLAG_READ = 1 << 0
VFIO_REGION_INFO_FLAG_WRITE = 1 << 1
VFIO_REGION_INFO_FLAG_MMAP = 1 << 2

# enum { VFIO_PCI_BAR0_REGION_INDEX ... VFIO_PCI_BAR5_REGION_INDEX, VFIO_PCI_ROM_REGION_INDEX,
#        VFIO_PCI_CONFIG_REGION_INDEX, ... }
VFIO_PCI_BAR0_REGION_INDEX = 0
VFIO_PCI_CONFIG_REGION_INDEX = 7

# struct vfio_iommu_type1_dma_map { __u32 argsz, flags; __u64 vaddr, iova, size; }
DMA_MAP = struct.Struct("=IIQQQ")
VFIO_DMA_MAP_FLAG_READ = 1 << 0
VFIO_DMA_MAP_FLAG_WRITE = 1 << 1
# struct vfio_iommu_type1_dma_unmap { __u32 argsz, flags; __u64 iova, size; } (data[] unused)
DMA_UNMAP = struct.Struct("=IIQQ")

_NAMES = {
    VFIO_GET_API_VERSION: "VFIO_GET_API_VERSION",
    VFIO_CHECK_EXTENSION: "VFIO_CHECK_EXTENSION",
    VFIO_SET_IOMMU: "VFIO_SET_IOMMU",
    VFIO_GROUP_GET_STATUS: "VFIO_GROUP_GET_STATUS",
    VFIO_GROUP_SET_CONTAINER: "VFIO_GROUP_SET_CONTAINER",
    VFIO_GROUP_UNSET_CONTAINER: "VFIO_GROUP_UNSET_CONTAINER",
    VFIO_GROUP_GET_DEVICE_FD: "VFIO_GROUP_GET_DEVICE_FD",
    VFIO_DEVICE_GET_INFO: "VFIO_DEVICE_GET_INFO",
    VFIO_DEVICE_GET_REGION_INFO: "VFIO_DEVICE_GET_REGION_INFO",
    VFIO_DEVICE_RESET: "VFIO_DEVICE_RESET",
    VFIO_IOMMU_MAP_DMA: "VFIO_IOMMU_MAP_DMA",
    VFIO_IOMMU_UNMAP_DMA: "VFIO_IOMMU_UNMAP_DMA",
}


class Ioctl:
    """``ioctl(2)``: the only place rig-pci calls it. ``arg`` is an integer passed as is, or a
    buffer passed by pointer, which the kernel may fill. Returns the call's result; raises
    :class:`OSError` with the errno. Tests replace it with a fake kernel."""

    def __call__(self, fd: int, request: int, arg: int | bytearray = 0) -> int:
        if isinstance(arg, bytearray):
            return int(fcntl.ioctl(fd, request, arg, True))
        return int(fcntl.ioctl(fd, request, arg))


@dataclass(frozen=True)
class RegionInfo:
    """A VFIO region: where it lies in the device file and what it allows."""

    index: int
    flags: int
    size: int
    offset: int

    @property
    def mappable(self) -> bool:
        return bool(self.flags & VFIO_REGION_INFO_FLAG_MMAP)


def region_info_request(index: int) -> bytearray:
    """A ``struct vfio_region_info`` asking for region ``index``."""
    return bytearray(REGION_INFO.pack(REGION_INFO.size, 0, index, 0, 0, 0))


def parse_region_info(buf: bytes | bytearray) -> RegionInfo:
    """The region a filled ``struct vfio_region_info`` describes."""
    _argsz, flags, index, _cap, size, offset = REGION_INFO.unpack_from(buf)
    return RegionInfo(index, flags, size, offset)


def _call(ioctl: Ioctl, fd: int, request: int, arg: int | bytearray = 0) -> int:
    try:
        return ioctl(fd, request, arg)
    except OSError as e:
        raise RigError(f"{_NAMES.get(request, hex(request))} failed: {e.strerror}") from e


def _group_blockers(root: Path, group: int, address: str) -> list[str]:
    """The functions of ``group`` other than ``address`` bound to a driver VFIO does not
    accept, as "ADDRESS (DRIVER)"."""
    devices = root / "sys/kernel/iommu_groups" / str(group) / "devices"
    try:
        names = sorted(os.listdir(devices))
    except OSError:
        return []
    out = []
    for name in names:
        driver = link_name(devices / name / "driver")
        if name != address and driver not in (None, "vfio-pci", "pci-stub", "pcieport"):
            out.append(f"{name} ({driver})")
    return out


def _open(path: Path, shown: str, why: dict[int, str]) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        hint = why.get(e.errno or 0, "")
        raise RigError(f"{shown} cannot be opened: {e.strerror}{hint}") from e


class VfioAccess:
    """A function this process holds through VFIO (see the module's group rules)."""

    how = "VFIO"
    maps_host = True

    def __init__(self, root: Path, address: str, group: int, ioctl: Ioctl) -> None:
        """Take ``address`` of IOMMU group ``group`` through the VFIO files under ``root``.

        Raises :class:`rig_edge.RigError` naming what refused: the VFIO files, the API
        version, the IOMMU's type, the group's viability, the device. Gives back what it
        opened before raising.
        """
        self._ioctl = ioctl
        self._address = address
        self._fds: list[int] = []
        self._regions: dict[int, RegionInfo] = {}
        try:
            self._take(root, address, group)
        except BaseException:
            self.close()
            raise

    def _take(self, root: Path, address: str, group: int) -> None:
        ioctl = self._ioctl
        self.container = _open(
            root / "dev/vfio/vfio",
            "/dev/vfio/vfio",
            {errno.ENOENT: " (is the vfio module loaded?)"},
        )
        self._fds.append(self.container)
        version = _call(ioctl, self.container, VFIO_GET_API_VERSION)
        if version != VFIO_API_VERSION:
            raise RigError(f"VFIO's API is version {version}, not {VFIO_API_VERSION}")
        if not _call(ioctl, self.container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU):
            raise RigError("the IOMMU does not offer VFIO's type-1 v2 interface")
        shown = f"/dev/vfio/{group}"
        self.group = _open(
            root / "dev/vfio" / str(group),
            shown,
            {
                errno.EBUSY: f" (another process holds IOMMU group {group})",
                errno.EACCES: f" (grant this user read and write access to {shown})",
                errno.EPERM: f" (grant this user read and write access to {shown})",
                errno.ENOENT: " (is the function bound to vfio-pci?)",
            },
        )
        self._fds.append(self.group)
        status = bytearray(GROUP_STATUS.pack(GROUP_STATUS.size, 0))
        _call(ioctl, self.group, VFIO_GROUP_GET_STATUS, status)
        _argsz, flags = GROUP_STATUS.unpack(status)
        if not flags & VFIO_GROUP_FLAGS_VIABLE:
            blockers = _group_blockers(root, group, address)
            held = f": {', '.join(blockers)} {'is' if len(blockers) == 1 else 'are'} bound"
            raise RigError(
                f"IOMMU group {group} is not viable (every function in it must be bound to "
                f"vfio-pci or to no driver{held if blockers else ''})"
            )
        container = bytearray(struct.pack("=i", self.container))
        _call(ioctl, self.group, VFIO_GROUP_SET_CONTAINER, container)
        _call(ioctl, self.container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU)
        self.device = _call(
            ioctl, self.group, VFIO_GROUP_GET_DEVICE_FD, bytearray(address.encode() + b"\0")
        )
        self._fds.append(self.device)
        info = bytearray(DEVICE_INFO.pack(DEVICE_INFO.size, 0, 0, 0, 0))
        _call(ioctl, self.device, VFIO_DEVICE_GET_INFO, info)
        _argsz, self._device_flags, self.regions, _irqs, _cap = DEVICE_INFO.unpack(info)
        if not self._device_flags & VFIO_DEVICE_FLAGS_PCI:
            raise RigError("VFIO's device is not a PCI device")
        cfg = self.region(VFIO_PCI_CONFIG_REGION_INDEX)
        self._config = FileWindow(self.device, cfg.offset, cfg.size, f"{address} config space")

    def region(self, index: int) -> RegionInfo:
        """Region ``index`` of the device (BARs 0-5, the ROM, config space: linux/vfio.h)."""
        if index not in self._regions:
            buf = region_info_request(index)
            _call(self._ioctl, self.device, VFIO_DEVICE_GET_REGION_INFO, buf)
            self._regions[index] = parse_region_info(buf)
        return self._regions[index]

    @property
    def can_reset(self) -> bool:
        return bool(self._device_flags & VFIO_DEVICE_FLAGS_RESET)

    def config(self) -> Window:
        return self._config

    def window(self, bar: int, offset: int, length: int, write_combined: bool,
               at: int | None = None) -> Window:
        # vfio-pci maps BARs uncached whatever was asked (drivers/vfio/pci/vfio_pci_core.c).
        region = self.region(VFIO_PCI_BAR0_REGION_INDEX + bar)
        name = f"{self._address} BAR {bar}"
        if offset + length > region.size:
            raise RigError(f"{name}: VFIO shows 0x{region.size:x} bytes of it")
        if at is not None:
            # Only a mapping can lie at an address: a region VFIO reads and writes for the
            # process instead (no MMAP flag) cannot be placed.
            if not region.mappable:
                raise RigError(f"{name}: VFIO does not let it be mapped, so it cannot be "
                               f"placed at 0x{at:x}")
            return place(self.device, region.offset + offset, length, at, name)
        if region.mappable:
            try:
                m = mmap.mmap(self.device, length, offset=region.offset + offset)
                return MappedWindow(m, name)
            except OSError:
                pass  # an area VFIO keeps unmapped (an MSI-X table): read and write through it
        return FileWindow(self.device, region.offset + offset, length, name)

    def reset(self) -> None:
        _call(self._ioctl, self.device, VFIO_DEVICE_RESET)

    dma_granule = mmap.PAGESIZE

    def _map(self, host: int, length: int) -> None:
        """VFIO_IOMMU_MAP_DMA of ``length`` bytes at ``host`` to the same bus address.

        The bus address (IOVA) is the host address: unique in the process, and a caller's own
        memory maps without a second address space to keep.
        """
        flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE
        arg = bytearray(DMA_MAP.pack(DMA_MAP.size, flags, host, host, length))
        self._ioctl(self.container, VFIO_IOMMU_MAP_DMA, arg)

    def _unmap(self, host: int, length: int) -> None:
        arg = bytearray(DMA_UNMAP.pack(DMA_UNMAP.size, 0, host, length))
        _call(self._ioctl, self.container, VFIO_IOMMU_UNMAP_DMA, arg)

    def map_host(self, address: int, length: int) -> DmaMemory | None:
        if not memlock_allows(length):
            return None
        try:
            self._map(address, length)
        except OSError as e:
            if e.errno == errno.ENOMEM:  # past RLIMIT_MEMLOCK, or the IOMMU's own room
                return None
            raise RigError(f"VFIO_IOMMU_MAP_DMA failed: {e.strerror}") from e
        ranges = ((address, length),)
        return DmaMemory(address, length, ranges, lambda: self._unmap(address, length))

    def alloc_dma(self, n: int, at: int | None) -> DmaMemory | None:
        from rig_pci import libc

        if not memlock_allows(n):
            return None
        flags = libc.MAP_PRIVATE | libc.MAP_ANONYMOUS | (libc.MAP_FIXED if at is not None else 0)
        try:
            host = libc.mmap(at or 0, n, libc.PROT_READ | libc.PROT_WRITE, flags)
        except OSError as e:
            if e.errno == errno.ENOMEM:
                return None
            raise RigError(f"mmap of {n} bytes failed: {e.strerror}") from e

        def give_back() -> None:
            if at is None:
                libc.munmap(host, n)
            else:
                libc.reserve(host, n)

        try:
            libc.madvise(host, n, libc.MADV_DONTFORK)
            self._map(host, n)
        except OSError as e:
            give_back()
            if e.errno == errno.ENOMEM:
                return None
            raise RigError(f"VFIO_IOMMU_MAP_DMA failed: {e.strerror}") from e

        def release() -> None:
            self._unmap(host, n)  # raises, keeping the memory, if the device may still reach it
            give_back()

        return DmaMemory(host, n, ((host, n),), release)

    def close(self) -> None:
        # The device first, then the group (which leaves its container), then the container.
        while self._fds:
            os.close(self._fds.pop())
