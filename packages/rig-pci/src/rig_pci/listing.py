"""What a machine lists of a PCI function, and how it is read from sysfs (/sys/bus/pci).

:class:`FunctionInfo` and :class:`Bar` are what every transport answers; :func:`list_functions`
and :func:`read_function` read them from a sysfs tree (Documentation/ABI/testing/sysfs-bus-pci).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path

from rig_edge import Misuse, RigError

# Linux include/linux/ioport.h resource flags, as /sys/bus/pci/devices/*/resource shows them.
IORESOURCE_IO = 0x00000100
IORESOURCE_MEM = 0x00000200
IORESOURCE_PREFETCH = 0x00002000
IORESOURCE_MEM_64 = 0x00100000

DEVICES = "sys/bus/pci/devices"


@dataclass(frozen=True)
class Bar:
    """A base address register: where its window lies on the bus and how large it is."""

    index: int
    address: int
    size: int
    flags: int

    @property
    def prefetchable(self) -> bool:
        """Whether the window is prefetchable (IORESOURCE_PREFETCH in sysfs' resource flags)."""
        return bool(self.flags & IORESOURCE_PREFETCH)

    @property
    def is_memory(self) -> bool:
        """Whether the window is memory space, not I/O space (IORESOURCE_MEM)."""
        return bool(self.flags & IORESOURCE_MEM)

    @property
    def is_64bit(self) -> bool:
        """Whether the BAR holds a 64-bit address (IORESOURCE_MEM_64)."""
        return bool(self.flags & IORESOURCE_MEM_64)


@dataclass(frozen=True)
class FunctionInfo:
    """One PCI function as the machine lists it.

    ``address`` is the bus address ``DDDD:BB:DD.F``; ``class_code`` the 24-bit class
    (0x030200 for a 3D controller); ``driver`` the bound kernel driver's name or ``None``;
    ``iommu_group`` the IOMMU group number or ``None``; ``runtime_status`` Linux's runtime power
    state (``"active"``, ``"suspended"``, ...) or ``None`` where the kernel shows none or it
    cannot be read.
    """

    address: str
    vendor: int
    device: int
    class_code: int
    bars: tuple[Bar, ...]
    driver: str | None
    iommu_group: int | None
    runtime_status: str | None

    @property
    def sort_key(self) -> tuple[int, int, int, int]:
        """(domain, bus, device, function) as numbers: the machine's bus order."""
        return parse_address(self.address)


def parse_address(address: str) -> tuple[int, int, int, int]:
    """Split ``DDDD:BB:DD.F`` into numbers; raises :class:`rig_edge.Misuse` (a
    :class:`ValueError`) if malformed."""
    try:
        domain, bus, rest = address.split(":")
        dev, fn = rest.split(".")
        return int(domain, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        raise Misuse(f"{address!r} is not a PCI bus address (DDDD:BB:DD.F)") from None


def _hex(path: Path) -> int:
    return int(path.read_text().strip(), 16)


def _bars(path: Path) -> tuple[Bar, ...]:
    bars = []
    # Lines 0-5 of the resource file are BARs 0-5; the ROM and bridge windows follow.
    for index, line in enumerate(path.read_text().splitlines()[:6]):
        start, end, flags = (int(word, 16) for word in line.split())
        if start or end:
            bars.append(Bar(index, start, end - start + 1, flags))
    return tuple(bars)


def link_name(path: Path) -> str | None:
    """The last component of the symbolic link ``path`` points to, or ``None`` without one."""
    try:
        return Path(os.readlink(path)).name
    except FileNotFoundError:
        return None


def read_function(path: Path, address: str) -> FunctionInfo:
    """The function whose sysfs directory is ``path``; raises :class:`OSError` if its files
    cannot be read."""
    group = link_name(path / "iommu_group")
    try:
        status: str | None = (path / "power" / "runtime_status").read_text().strip()
    except OSError as e:
        if e.errno in (errno.EMFILE, errno.ENFILE):
            raise
        # No power state shown, or one that cannot be read: the function is still listed (its
        # own files name it), so later functions keep their numbers.
        status = None
    return FunctionInfo(
        address=address,
        vendor=_hex(path / "vendor"),
        device=_hex(path / "device"),
        class_code=_hex(path / "class"),
        bars=_bars(path / "resource"),
        driver=link_name(path / "driver"),
        iommu_group=int(group) if group is not None else None,
        runtime_status=status,
    )


def list_functions(devices: Path) -> list[FunctionInfo]:
    """The functions under ``devices`` (a tree's /sys/bus/pci/devices) in bus order.

    No such directory lists none. A function whose files cannot be read (the kernel removing
    it, say) is left out. Raises :class:`rig_edge.RigError` with the reason when the listing
    itself cannot be made (no file left to open, no permission).
    """
    try:
        names = os.listdir(devices)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise RigError(f"the machine's PCI functions cannot be listed: {e.strerror}") from e
    found = []
    for name in names:
        try:
            parse_address(name)
            found.append(read_function(devices / name, name))
        except ValueError:
            continue
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):
                raise RigError(f"the machine's PCI functions cannot be listed: {e.strerror}") from e
            continue
    found.sort(key=lambda f: f.sort_key)
    return found
