"""DMA memory: zeroed system memory a device reaches, and the bus addresses it lies at.

Two ways give it, as the function was taken:

- **Behind an IOMMU** (VFIO): anonymous memory that VFIO_IOMMU_MAP_DMA pins and maps for the
  device. Pinned pages count against the process's RLIMIT_MEMLOCK (VFIO's type-1 IOMMU adds
  them to the process's locked memory, drivers/vfio/vfio_iommu_type1.c), so an allocation past
  the limit answers ``None``. The memory is not also ``mlock``-ed: mlock would count the same
  pages against the same limit a second time, and VFIO's pin already keeps them resident.
- **Physically**: 2 MiB huge pages (``MAP_HUGETLB | MAP_HUGE_2MB``), which Linux never swaps
  and which are physically contiguous each; their bus addresses are their physical addresses,
  read from /proc/self/pagemap. An allocation answers ``None`` when no huge page is free.

Either way the memory comes zeroed, as Linux gives every new anonymous page.
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Callable
from pathlib import Path

from rig_edge import RigError

# Linux Documentation/admin-guide/mm/pagemap.rst: one 64-bit entry per virtual page.
PAGEMAP_PFN_MASK = (1 << 55) - 1  # bits 0-54: the page frame number, if present
PAGEMAP_PRESENT = 1 << 63
PAGEMAP_SWAPPED = 1 << 62
PAGEMAP_ENTRY = 8

# include/uapi/linux/capability.h: CAP_IPC_LOCK lifts RLIMIT_MEMLOCK (for mlock and VFIO).
CAP_IPC_LOCK = 14

Ranges = tuple[tuple[int, int], ...]


class DmaMemory:
    """``length`` bytes of zeroed, locked system memory at ``host`` in this process, which the
    device reaches at the bus addresses ``bus``: runs of (bus address, length) in the order of
    the host addresses, together covering ``length`` bytes.

    ``free()`` gives it back once, however often it is called; the function that made it frees
    it when it is released.
    """

    def __init__(self, host: int, length: int, bus: Ranges, release: Callable[[], None]) -> None:
        self.host = host
        self.length = length
        self.bus = bus
        self._release: Callable[[], None] | None = release
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        runs = ", ".join(f"0x{a:x}+0x{n:x}" for a, n in self.bus)
        return f"DmaMemory(host=0x{self.host:x}, length=0x{self.length:x}, bus=[{runs}])"

    @property
    def freed(self) -> bool:
        """Whether the memory was given back."""
        return self._release is None

    def bus_address(self, offset: int) -> int:
        """The bus address of the byte at ``offset``; raises :class:`ValueError` outside."""
        if not 0 <= offset < self.length:
            raise ValueError(f"offset 0x{offset:x} is outside 0x{self.length:x} bytes")
        for address, n in self.bus:
            if offset < n:
                return address + offset
            offset -= n
        raise AssertionError("bus ranges cover the memory")

    def view(self) -> memoryview:
        """The memory as a writable byte view; valid until :meth:`free`."""
        from rig_pci.libc import view

        if self.freed:
            raise RigError(f"{self!r} was freed")
        return view(self.host, self.length)

    def free(self) -> None:
        """Unmap it from the device and give it back; a second call does nothing.

        Raises :class:`rig_edge.RigError` if the device's mapping could not be removed, in
        which case the memory stays the process's (the device may still reach it).
        """
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()


def merge(ranges: list[tuple[int, int]]) -> Ranges:
    """Adjacent (address, length) runs joined into one, in order."""
    out: list[tuple[int, int]] = []
    for address, n in ranges:
        if out and out[-1][0] + out[-1][1] == address:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((address, n))
    return tuple(out)


def pagemap_ranges(pagemap: Path, host: int, length: int, chunk: int, page: int) -> Ranges:
    """The physical runs of ``length`` bytes at ``host``, read from the pagemap file
    ``pagemap`` (this process's /proc/self/pagemap), one entry per ``chunk`` bytes (the huge
    page size: each chunk is physically contiguous) for pages of ``page`` bytes.

    Raises :class:`rig_edge.RigError` if a page is not in memory, or if the entries hide their
    frame numbers: Linux shows them only to a process with CAP_SYS_ADMIN (since 4.2; earlier
    kernels refused non-root readers outright), and without them the bus addresses cannot be
    known.
    """
    runs = []
    try:
        with open(pagemap, "rb", buffering=0) as f:
            for start in range(host, host + length, chunk):
                entry = os.pread(f.fileno(), PAGEMAP_ENTRY, start // page * PAGEMAP_ENTRY)
                if len(entry) != PAGEMAP_ENTRY:
                    raise RigError(f"{pagemap} has no entry for 0x{start:x}")
                value = int.from_bytes(entry, "little")
                if not value & PAGEMAP_PRESENT or value & PAGEMAP_SWAPPED:
                    raise RigError(f"{pagemap}: the page at 0x{start:x} is not in memory")
                pfn = value & PAGEMAP_PFN_MASK
                if pfn == 0:
                    raise RigError(
                        f"{pagemap} hides physical addresses: reading them needs CAP_SYS_ADMIN "
                        "(run as root to use a function taken physically)"
                    )
                runs.append((pfn * page, min(chunk, host + length - start)))
    except OSError as e:
        raise RigError(f"{pagemap} cannot be read: {e.strerror}") from e
    return merge(runs)


def _status_field(status: str, name: str) -> str | None:
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    return None


def memlock_room(n: int, status: str, limit: int) -> bool:
    """Whether ``n`` more bytes may be locked under the soft limit ``limit``
    (RLIMIT_MEMLOCK, ``resource.RLIM_INFINITY`` for none), given /proc/self/status text
    ``status`` (its ``VmLck`` is what the process has locked, VFIO's pins included, and its
    ``CapEff`` whether CAP_IPC_LOCK lifts the limit)."""
    if limit == resource.RLIM_INFINITY:
        return True
    caps = _status_field(status, "CapEff")
    if caps is not None and int(caps, 16) >> CAP_IPC_LOCK & 1:
        return True
    locked = _status_field(status, "VmLck") or "0 kB"
    used = int(locked.split()[0]) * 1024
    return used + n <= limit


def memlock_allows(n: int) -> bool:
    """:func:`memlock_room` for this process now."""
    limit = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    return memlock_room(n, status, limit)
