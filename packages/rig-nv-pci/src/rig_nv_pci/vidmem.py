"""The GPU's video memory as a GSP client's CPU-RM keeps it: a heap of its own, carved from the
FB regions GSP-RM reports, each block described to GSP-RM so that its objects can name it.

NVIDIA's CPU-RM (open-gpu-kernel-modules 570.144) does not ask GSP-RM for video memory:
video_mem.c leaves bRpcAlloc false under IS_GSP_CLIENT and allocates from its own heap
(mem_mgr/heap.c), whose FB regions memmgrInitBaseFbRegions_FWCLIENT
(mem_mgr_gsp_client.c) copies from GspStaticConfigInfo.fbRegionInfoParams: a region with a
nonzero ``reserved`` is a reserved region (bRsvdRegion) and none of the heap; a protected one
serves only protected allocations, which this path makes none of. Memory of that heap is then
registered with GSP-RM (mem.c memRegisterWithGsp_IMPL): ALLOC_MEMORY of NV01_MEMORY_LIST_FBMEM
(cl84a0.h 0x82) with the NVOS02 flags RmDeprecatedConvertOs32ToOs02Flags makes of its
attributes and its PTE array, one entry for contiguous memory (rpcAllocMemory_v13_01's
IS_GSP_CLIENT branch sends memdescGetPteArraySize entries).

The allocator here is first fit, aligned to 4 KiB or 2 MiB as the mapping's page size asks;
every block is contiguous (the path's regions are described by their first page).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rig_nv_pci.gsp.static_info import FbRegion

NV01_MEMORY_LIST_FBMEM = 0x82  # cl84a0.h
# NVOS02_FLAGS (nvos.h): PHYSICALITY 7:4 CONTIGUOUS 0, LOCATION 11:8 VIDMEM 2, COHERENCY 15:12
# UNCACHED 0 (the NVOS32 attributes' default coherency, converted).
FBMEM_FLAGS = 2 << 8
KIND_GENERIC = 0x06  # NV_MMU_PTE_KIND_GENERIC_MEMORY (ampere dev_mmu.h), the PTE array's format
SMALL, HUGE = 4 << 10, 2 << 20


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


class Heap:
    """Video memory's free blocks, first fit: :meth:`take` a block of whole pages aligned to
    ``align``, :meth:`give` it back."""

    def __init__(self, regions: Sequence[FbRegion]) -> None:
        self.ranges = usable(regions)
        self.size = sum(n for _, n in self.ranges)
        self._free = Addresses.of(self.ranges)

    @property
    def free(self) -> list[tuple[int, int]]:
        return list(self._free.free)

    def take(self, size: int, align: int = SMALL) -> int | None:
        """The FB offset of ``size`` bytes (whole pages) aligned to ``align``, or ``None``."""
        if size <= 0 or size % SMALL:
            raise ValueError(f"a heap block is whole 4 KiB pages, not 0x{size:x} bytes")
        return self._free.take(size, max(align, SMALL))

    def give(self, at: int, size: int) -> None:
        self._free.give(at, size)
