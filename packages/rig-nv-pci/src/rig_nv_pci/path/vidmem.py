"""The GPU's video memory as a GSP client's CPU-RM keeps it: a heap of its own, carved from the
FB regions GSP-RM reports, each block described to GSP-RM so that its objects can name it.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-vidmem.md."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rig_nv_pci.gsp.static_info import FbRegion

NV01_MEMORY_LIST_FBMEM = 0x82  # cl84a0.h
# NVOS02_FLAGS (nvos.h): PHYSICALITY 7:4 CONTIGUOUS 0, LOCATION 11:8 VIDMEM 2, COHERENCY 15:12
# UNCACHED 0 (the NVOS32 attributes' default coherency, converted).
FBMEM_FLAGS = 2 << 8
KIND_GENERIC = 0x06  # NV_MMU_PTE_KIND_GENERIC_MEMORY (ampere dev_mmu.h), the PTE array's format
SMALL, HUGE = 4 << 10, 2 << 20
PMA_GRANULARITY = 64 << 10  # map_defines.h: the frame PMA blacklists a retired page's


class Addresses:
    """A first-fit allocator of addresses in the free ranges ``[base, limit)`` given."""

    def __init__(self, base: int, limit: int) -> None:
        self.free: list[tuple[int, int]] = [(base, limit - base)] if limit > base else []

    @classmethod
    def of(cls, ranges: Iterable[tuple[int, int]]) -> Addresses:
        """Free ranges ``(at, size)``."""
        a = cls(0, 0)
        for at, size in ranges:
            if size > 0:
                a.give(at, size)
        return a

    def take(self, size: int, align: int) -> int | None:
        for i, (at, n) in enumerate(self.free):
            start = (at + align - 1) // align * align
            if start + size <= at + n:
                rest = [(at, start - at)] if start > at else []
                if start + size < at + n:
                    rest.append((start + size, at + n - start - size))
                self.free[i:i + 1] = rest
                return start
        return None

    def give(self, at: int, size: int) -> None:
        self.free.append((at, size))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for a, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((a, n))
        self.free = merged


def roots(*bases: int) -> list[tuple[int, int]]:
    """The whole 4 KiB pages ``(at, size)`` of GSP-RM's BAR roots at ``bases`` (its
    bar1PdeBase, bar2PdeBase; kbusPatchBar1Pdb_GSPCLIENT, kbusPatchBar2Pdb_GSPCLIENT): FB
    the heap never hands out. A base of 0 (none reported) is no root."""
    return [(b // SMALL * SMALL, SMALL) for b in bases if b]


def retired(addresses: Iterable[int]) -> list[tuple[int, int]]:
    """The 64 KiB frames ``(at, size)`` holding the retired pages at ``addresses`` (FB
    addresses, :class:`rig_nv_pci.gsp.retired.RetiredPage`), each once, in order: FB the heap
    never hands out (pmaRegisterBlacklistInfo aligns each down to PMA_GRANULARITY). A frame
    outside the heap's ranges leaves the heap as it is (memmgrPmaRegisterRegions_IMPL hands
    PMA only the pages inside the region it registers)."""
    frames = {a // PMA_GRANULARITY * PMA_GRANULARITY for a in addresses}
    return [(f, PMA_GRANULARITY) for f in sorted(frames)]


def bar1_range(size: int) -> tuple[int, int]:
    """The BAR 1 offsets ``[0, limit)`` the path maps of a BAR 1 of ``size`` bytes: all but
    its last 4 KiB page, which kbusInitBar1_GM107 (kern_bus_gm107.c) takes out of BAR 1's VA
    heap for the host overfetch WAR (bugs 529932/525381)."""
    return 0, max(size - SMALL, 0)


def without(ranges: Iterable[tuple[int, int]],
            kept: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` ``(at, size)`` less every range of ``kept``."""
    out = [r for r in ranges if r[1] > 0]
    for k, kn in kept:
        nxt = []
        for at, n in out:
            if k + kn <= at or at + n <= k:
                nxt.append((at, n))
                continue
            if k > at:
                nxt.append((at, k - at))
            if k + kn < at + n:
                nxt.append((k + kn, at + n - k - kn))
        out = nxt
    return out


def usable(regions: Sequence[FbRegion]) -> list[tuple[int, int]]:
    """The heap's ranges ``(at, size)`` of ``regions``: neither reserved nor protected
    (memmgrInitBaseFbRegions_FWCLIENT), whole 4 KiB pages."""
    out = []
    for r in regions:
        if r.reserved or r.protected:
            continue
        at = -(-r.base // SMALL) * SMALL
        end = (r.limit + 1) // SMALL * SMALL
        if end > at:
            out.append((at, end - at))
    return out


@dataclass(frozen=True)
class FbLayout:
    """The GPU's video memory as its path is told of it: the FB ``regions`` GSP-RM reported,
    GSP-RM's BAR 1 root and BAR 1's size (``bar1``; ``None``: BAR 1 shows video memory one to
    one), FB ranges ``(at, size)`` of whole pages the heap never hands out besides that root
    (``kept``: :func:`roots`, :func:`retired`), and the bytes of video memory (``size``:
    what a peer mapping asks rig_pci.memory.why_apart about; 0: the path maps no peer's)."""

    regions: Sequence[FbRegion] = ()
    bar1: tuple[int, int] | None = None
    kept: Sequence[tuple[int, int]] = ()
    size: int = 0

    def heap(self) -> Heap:
        """The path's heap over the usable regions, less :attr:`kept` and GSP-RM's BAR 1 root
        (kbusPatchBar1Pdb_GSPCLIENT)."""
        return Heap(self.regions, [*self.kept, *roots(self.bar1[0] if self.bar1 else 0)])


class Heap:
    """Video memory's free blocks, first fit: :meth:`take` a block of whole pages aligned to
    ``align``, :meth:`give` it back, by any thread. ``kept``: ranges ``(at, size)`` of whole
    pages never handed out (:func:`roots`, :func:`retired`)."""

    def __init__(self, regions: Sequence[FbRegion],
                 kept: Iterable[tuple[int, int]] = ()) -> None:
        self.kept = list(kept)
        self.ranges = without(usable(regions), self.kept)
        self.size = sum(n for _, n in self.ranges)
        self._free = Addresses.of(self.ranges)
        self._lock = threading.Lock()

    @property
    def free(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self._free.free)

    def take(self, size: int, align: int = SMALL) -> int | None:
        """The FB offset of ``size`` bytes (whole pages) aligned to ``align``, or ``None``."""
        if size <= 0 or size % SMALL:
            raise ValueError(f"a heap block is whole 4 KiB pages, not 0x{size:x} bytes")
        with self._lock:
            return self._free.take(size, max(align, SMALL))

    def give(self, at: int, size: int) -> None:
        if any(at < k + kn and k < at + size for k, kn in self.kept):
            raise ValueError(f"0x{at:x}+0x{size:x} is FB the heap keeps back")
        with self._lock:
            self._free.give(at, size)
