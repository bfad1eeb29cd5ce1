"""Fixture machines, so that code reaching /sys/bus/pci can be tested without hardware.

``add_function(root, ...)`` writes one function the way Linux shows it (its config space,
resource files standing for its BARs, ``reset``, ``driver_override``, its driver's and IOMMU
group's links); ``add_driver``, ``add_vfio``, ``add_process`` and ``set_lockdown`` write the
rest of a tree. ``Machine.at(root)`` then lists and takes from it.

:func:`fixture_machine` gives a machine whose sysfs writes are recorded, in order, and act as
the kernel's would (unbind drops the driver link, a probe binds the override's driver, a write
to ``reset`` runs a hook), for testing flows of writes. :class:`FakeVfio` answers VFIO's
ioctls as Linux does, written from linux/vfio.h on its own (its numbers and layouts are not
rig_pci.vfio's), with a regular file standing for the device. :func:`mappings` and
:func:`inaccessible` read this process's /proc/self/maps, to show where a window was placed and
that a range a caller reserved is whole again once it is closed.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from rig_pci.listing import (
    DEVICES,
    IORESOURCE_MEM,
    IORESOURCE_MEM_64,
    IORESOURCE_PREFETCH,
    link_name,
)
from rig_pci.machine import Machine
from rig_pci.sysfs import SysfsTransport
from rig_pci.vfio import Ioctl

DRIVERS = "sys/bus/pci/drivers"


def config_space(vendor: int, device: int, class_code: int, *, command: int = 0x0006) -> bytes:
    """256 bytes of a type-0 config header (include/uapi/linux/pci_regs.h offsets): vendor
    and device ids, the command register, revision and class code."""
    cfg = bytearray(256)
    struct.pack_into("<HHH", cfg, 0x00, vendor, device, command)
    struct.pack_into("<I", cfg, 0x08, class_code << 8)
    return bytes(cfg)


def add_driver(root: Path, name: str) -> Path:
    """Write a kernel driver's sysfs directory (bind, unbind, new_id, remove_id) and the bus's
    drivers_probe file; returns the directory."""
    drv = root / DRIVERS / name
    drv.mkdir(parents=True, exist_ok=True)
    for f in ("bind", "unbind", "new_id", "remove_id"):
        (drv / f).touch()
    (root / "sys/bus/pci/drivers_probe").touch()
    return drv


def bind(root: Path, address: str, driver: str | None) -> None:
    """Link (or unlink, for ``None``) the function's ``driver`` as the kernel does."""
    real = Path(os.path.realpath(root / DEVICES / address))
    link = real / "driver"
    if link.is_symlink():
        link.unlink()
    if driver is not None:
        drv = add_driver(root, driver)
        os.symlink(os.path.relpath(drv, real), link)
        (drv / address).unlink(missing_ok=True)
        os.symlink(os.path.relpath(real, drv), drv / address)


def add_function(
    root: Path,
    address: str,
    *,
    vendor: int,
    device: int,
    class_code: int,
    bars: dict[int, tuple[int, int, bool]] | None = None,
    driver: str | None = None,
    iommu_group: int | None = None,
    iommu_type: str = "DMA-FQ",
    runtime_status: str | None = "active",
    reset: bool = True,
    override: str | None = None,
    drm: tuple[str, ...] = (),
    parent: str | None = None,
    config: bytes | None = None,
    subsystem: tuple[int, int, int] | None = None,
) -> Path:
    """Write a function's sysfs directory under ``root``; returns the directory.

    ``bars`` maps index → (address, size, prefetchable); each memory BAR gets a sparse
    ``resourceN`` file of its size (and ``resourceN_wc`` when prefetchable), which mmap maps as
    it maps a BAR. ``config`` holds a config header; ``reset`` is written unless ``reset`` is
    false (Linux shows none for a function it cannot reset); ``driver_override`` shows
    ``override`` or "(null)"; ``iommu_group`` links the group (of ``iommu_type``) and lists the
    function in its devices/; ``drm`` names DRM nodes (card0, renderD128) under drm/;
    ``parent`` puts it below the bridge at that address (as a switch's port); ``config``
    replaces its config space (4096 bytes for extended capabilities); ``subsystem`` writes
    its subsystem_vendor, subsystem_device and revision files.
    """
    top = root / "sys/devices/pci0000:00"
    real = (Path(os.path.realpath(root / DEVICES / parent)) if parent else top) / address
    real.mkdir(parents=True, exist_ok=True)
    (real / "vendor").write_text(f"0x{vendor:04x}\n")
    (real / "device").write_text(f"0x{device:04x}\n")
    (real / "class").write_text(f"0x{class_code:06x}\n")
    (real / "config").write_bytes(config or config_space(vendor, device, class_code))
    if subsystem is not None:
        for name, value in zip(("subsystem_vendor", "subsystem_device", "revision"),
                               subsystem, strict=True):
            (real / name).write_text(f"0x{value:04x}\n" if name != "revision"
                                     else f"0x{value:02x}\n")
    (real / "driver_override").write_text((override or "(null)") + "\n")
    if reset:
        (real / "reset").touch()
    lines = []
    for i in range(13):
        if bars and i in bars:
            addr, size, pref = bars[i]
            flags = IORESOURCE_MEM | IORESOURCE_MEM_64 | (IORESOURCE_PREFETCH if pref else 0)
            lines.append(f"0x{addr:016x} 0x{addr + size - 1:016x} 0x{flags:016x}")
            for name in (f"resource{i}", *((f"resource{i}_wc",) if pref else ())):
                with open(real / name, "wb") as f:
                    f.truncate(size)
        else:
            lines.append(f"0x{0:016x} 0x{0:016x} 0x{0:016x}")
    (real / "resource").write_text("\n".join(lines) + "\n")
    if runtime_status is not None:
        (real / "power").mkdir(exist_ok=True)
        (real / "power" / "runtime_status").write_text(runtime_status + "\n")
    for node in drm:
        (real / "drm" / node).mkdir(parents=True, exist_ok=True)
    if iommu_group is not None:
        grp = root / "sys/kernel/iommu_groups" / str(iommu_group)
        (grp / "devices").mkdir(parents=True, exist_ok=True)
        (grp / "type").write_text(iommu_type + "\n")
        os.symlink(os.path.relpath(grp, real), real / "iommu_group")
        os.symlink(os.path.relpath(real, grp / "devices"), grp / "devices" / address)
    devices = root / DEVICES
    devices.mkdir(parents=True, exist_ok=True)
    (root / "sys/bus/pci/drivers_probe").touch()
    (root / "proc").mkdir(exist_ok=True)
    os.symlink(os.path.relpath(real, devices), devices / address)
    if driver is not None:
        bind(root, address, driver)
    return real


def set_lockdown(root: Path, mode: str) -> None:
    """Show the kernel's lockdown in ``mode`` ("none", "integrity", "confidentiality")."""
    path = root / "sys/kernel/security/lockdown"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(" ".join(f"[{m}]" if m == mode else m for m in
                             ("none", "integrity", "confidentiality")) + "\n")


def add_vfio(root: Path, group: int) -> None:
    """Write /dev/vfio/vfio and the group's /dev/vfio/N (regular files: :class:`FakeVfio`
    answers their ioctls)."""
    vfio = root / "dev/vfio"
    vfio.mkdir(parents=True, exist_ok=True)
    (vfio / "vfio").touch()
    (vfio / str(group)).touch()


def add_process(
    root: Path,
    pid: int,
    comm: str,
    *,
    fds: dict[int, str] | None = None,
    maps: Sequence[str] = (),
) -> None:
    """Write /proc/PID of a process named ``comm`` holding ``fds`` (fd → machine path) open
    and the machine paths ``maps`` mapped."""
    proc = root / "proc" / str(pid)
    (proc / "fd").mkdir(parents=True, exist_ok=True)
    (proc / "comm").write_text(comm + "\n")
    for fd, target in (fds or {}).items():
        os.symlink(target, proc / "fd" / str(fd))
    lines = [
        f"7f00{i:08x}000-7f00{i:08x}fff rw-s 00000000 00:05 {100 + i} {path}"
        for i, path in enumerate(maps)
    ]
    lines.append("7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]")
    (proc / "maps").write_text("\n".join(lines) + "\n")


class FixtureSysfs(SysfsTransport):
    """A fixture tree's transport that records every sysfs write (machine path, text), in
    order, in :attr:`writes`, and acts on it as the kernel would.

    ``driver_override`` keeps what was written ("(null)" when cleared); ``drivers/X/unbind``
    and ``bind`` unlink and link the driver; ``drivers_probe`` binds the override's driver, if
    loaded, else the function's entry in :attr:`native` (its driver by ID matching), else
    nothing; a write to ``reset`` calls :attr:`on_reset` with the function's address.
    """

    def __init__(self, root: Path, *, ioctl: Ioctl | None = None) -> None:
        super().__init__(root, shares_memory=False, ioctl=ioctl)
        self.writes: list[tuple[str, str]] = []
        self.native: dict[str, str] = {}
        self.on_reset: Callable[[str], None] | None = None

    def write(self, path: Path, text: str) -> None:
        super().write(path, text)
        shown = self.shown(path)
        self.writes.append((shown, text))
        parts = shown.strip("/").split("/")
        address = text.strip()
        if parts[-1] == "driver_override":
            path.write_text((address or "(null)") + "\n")
        elif parts[:4] == ["sys", "bus", "pci", "drivers"] and parts[-1] == "unbind":
            if link_name(self.function_path(address) / "driver") == parts[4]:
                bind(self.root, address, None)
        elif parts[:4] == ["sys", "bus", "pci", "drivers"] and parts[-1] == "bind":
            bind(self.root, address, parts[4])
        elif shown == "/sys/bus/pci/drivers_probe":
            if link_name(self.function_path(address) / "driver") is None:
                override = (self.function_path(address) / "driver_override").read_text().strip()
                if override != "(null)":
                    if (self.root / DRIVERS / override).is_dir():
                        bind(self.root, address, override)
                elif address in self.native:
                    bind(self.root, address, self.native[address])
        elif parts[-1] == "reset" and self.on_reset is not None:
            self.on_reset(Path(os.path.realpath(path)).parent.name)


def fixture_machine(root: Path, *, ioctl: Ioctl | None = None) -> tuple[Machine, FixtureSysfs]:
    """A machine on the fixture tree under ``root`` whose writes are recorded (see
    :class:`FixtureSysfs`), and its transport; ``ioctl`` replaces VFIO's ioctls."""
    t = FixtureSysfs(root, ioctl=ioctl)
    return Machine(t), t


@dataclass
class FakeVfio:
    """VFIO's ioctls as Linux answers them, for :class:`rig_pci.vfio.Ioctl`'s place.

    ``viable`` is the group's viability; ``regions`` maps a region index to (flags, size);
    the fake lays region ``i`` at offset ``i << 24`` of the file ``device`` (a regular file
    standing for VFIO's device file; config space is region 7). ``reset`` says whether the
    device offers VFIO_DEVICE_RESET. ``map_errno`` makes VFIO_IOMMU_MAP_DMA fail. Every call
    is recorded in ``calls`` by name; mappings live in ``mapped`` (iova → (vaddr, size)).
    """

    device: Path
    viable: bool = True
    regions: dict[int, tuple[int, int]] = field(default_factory=dict)
    reset: bool = True
    map_errno: int | None = None
    api_version: int = 0
    type1v2: bool = True
    calls: list[str] = field(default_factory=list)
    mapped: dict[int, tuple[int, int]] = field(default_factory=dict)
    container_of: dict[int, int] = field(default_factory=dict)

    # linux/vfio.h: _IO(';', 100 + n)
    NAMES: ClassVar[dict[int, str]] = {
        0x3B64: "GET_API_VERSION",
        0x3B65: "CHECK_EXTENSION",
        0x3B66: "SET_IOMMU",
        0x3B67: "GROUP_GET_STATUS",
        0x3B68: "GROUP_SET_CONTAINER",
        0x3B6A: "GROUP_GET_DEVICE_FD",
        0x3B6B: "DEVICE_GET_INFO",
        0x3B6C: "DEVICE_GET_REGION_INFO",
        0x3B6F: "DEVICE_RESET",
        0x3B71: "IOMMU_MAP_DMA",
        0x3B72: "IOMMU_UNMAP_DMA",
    }
    REGION_SHIFT: ClassVar[int] = 24

    def __call__(self, fd: int, request: int, arg: int | bytearray = 0) -> int:
        name = self.NAMES.get(request)
        if name is None:
            raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))
        self.calls.append(name)
        return getattr(self, "_" + name.lower())(fd, arg)  # type: ignore[no-any-return]

    @staticmethod
    def _buf(arg: int | bytearray) -> bytearray:
        if not isinstance(arg, bytearray):
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        return arg

    def _get_api_version(self, fd: int, arg: int | bytearray) -> int:
        return self.api_version

    def _check_extension(self, fd: int, arg: int | bytearray) -> int:
        return int(arg == 3 and self.type1v2)  # VFIO_TYPE1v2_IOMMU

    def _set_iommu(self, fd: int, arg: int | bytearray) -> int:
        if arg != 3:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return 0

    def _group_get_status(self, fd: int, arg: int | bytearray) -> int:
        buf = self._buf(arg)
        argsz, _ = struct.unpack_from("<II", buf)
        if argsz < 8:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        flags = (1 if self.viable else 0) | (2 if fd in self.container_of else 0)
        struct.pack_into("<I", buf, 4, flags)
        return 0

    def _group_set_container(self, fd: int, arg: int | bytearray) -> int:
        if not self.viable:
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        (self.container_of[fd],) = struct.unpack_from("<i", self._buf(arg))
        return 0

    def _group_get_device_fd(self, fd: int, arg: int | bytearray) -> int:
        name = bytes(self._buf(arg)).split(b"\0")[0].decode()
        self.calls[-1] += f" {name}"
        if fd not in self.container_of:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return os.open(self.device, os.O_RDWR | os.O_CLOEXEC)

    def _device_get_info(self, fd: int, arg: int | bytearray) -> int:
        buf = self._buf(arg)
        flags = (1 if self.reset else 0) | 2  # VFIO_DEVICE_FLAGS_RESET, _PCI
        struct.pack_into("<III", buf, 4, flags, 9, 5)  # flags, num_regions, num_irqs
        return 0

    def _device_get_region_info(self, fd: int, arg: int | bytearray) -> int:
        buf = self._buf(arg)
        argsz, _, index = struct.unpack_from("<III", buf)
        if argsz < 32 or index >= 9:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        flags, size = self.regions.get(index, (0, 0))
        struct.pack_into("<IIIIQQ", buf, 0, argsz, flags, index, 0, size,
                         index << self.REGION_SHIFT)
        return 0

    def _device_reset(self, fd: int, arg: int | bytearray) -> int:
        if not self.reset:
            raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))
        return 0

    def _iommu_map_dma(self, fd: int, arg: int | bytearray) -> int:
        argsz, flags, vaddr, iova, size = struct.unpack_from("<IIQQQ", self._buf(arg))
        if argsz < 32 or flags != 3:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if self.map_errno is not None:
            raise OSError(self.map_errno, os.strerror(self.map_errno))
        self.mapped[iova] = (vaddr, size)
        return 0

    def _iommu_unmap_dma(self, fd: int, arg: int | bytearray) -> int:
        buf = self._buf(arg)
        _argsz, _flags, iova, size = struct.unpack_from("<IIQQ", buf)
        if self.mapped.pop(iova, (0, -1))[1] != size:
            struct.pack_into("<Q", buf, 16, 0)
        return 0


@dataclass(frozen=True)
class Mapping:
    """A line of /proc/self/maps: ``[start, end)``, its permissions (``"rw-s"``, ``"---p"``)
    and the file it maps (``""`` for anonymous memory)."""

    start: int
    end: int
    perms: str
    path: str


def mappings(low: int, high: int) -> list[Mapping]:
    """This process's mappings that meet ``[low, high)``, by address (/proc/self/maps)."""
    out = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        if start < high and low < end:
            out.append(Mapping(start, end, fields[1], fields[5] if len(fields) > 5 else ""))
    return out


def inaccessible(low: int, high: int) -> bool:
    """Whether every byte of ``[low, high)`` lies in an inaccessible, anonymous, private
    mapping (as a reservation is: ``PROT_NONE``, ``MAP_PRIVATE | MAP_ANONYMOUS``), with no hole
    and nothing else mapped there."""
    at = low
    for m in mappings(low, high):
        if m.start > at or m.perms != "---p" or m.path:
            return False
        at = m.end
    return at >= high
