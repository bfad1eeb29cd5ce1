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

What is kept back beyond the reserved and protected regions (open-gpu-kernel-modules 595.45.04):

- GSP-RM's BAR 1 and BAR 2 roots: kern_bus.c kbusPatchBar1Pdb_GSPCLIENT and
  kbusPatchBar2Pdb_GSPCLIENT describe the root at GspStaticConfigInfo.bar1PdeBase /
  bar2PdeBase as GSP-RM's and put it in place of CPU-RM's own, so those pages are never
  heap memory; the path keeps their whole 4 KiB pages out of the heap (:func:`roots`) should
  GSP-RM ever report one inside a usable region (the simulated GSP-RM, like every report seen
  so far, puts them in a reserved one).
- The GPU's retired pages (:mod:`rig_nv_pci.gsp.retired`: what GSP-RM answers to
  NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES, as memmgrGetBlackListPages_GA100 asks it):
  the whole 64 KiB frame of each (:func:`retired`), as PMA, which serves clients' video
  memory, leaves them out (phys_mem_allocator_util.c pmaRegisterBlacklistInfo marks
  NV_ALIGN_DOWN64(address, PMA_GRANULARITY) for PMA_GRANULARITY 0x10000 bytes, map_defines.h;
  mem_mgr.c memmgrPmaRegisterRegions_IMPL hands it the heap's blackListAddresses region by
  region). CPU-RM's internal heap leaves out only the 4 KiB page (heap.c
  heapBlackListPages_IMPL: an RM_PAGE_SIZE block at RM_PAGE_ALIGN_DOWN(address)); this heap
  serves both and keeps the larger.
- BAR 1's last 4 KiB page: kern_bus_gm107.c kbusInitBar1_GM107 shrinks the BAR 1 VA heap by
  FERMI_SMALL_PAGESIZE ("host overfetch bug WAR (Bug 529932/525381)") before anything is
  mapped, so no BAR 1 mapping ever ends on the BAR's last page (:func:`bar1_range`).

CPU-RM's own reserved region (mem_mgr_gm107.c memmgrInitReservedMemory_GM107: an
bInternalHeap region carved from the top of the last usable region, sized by
memmgrPreInitReservedMemory_GM107 as 64 KiB of display instance memory on a GSP client with
a display, the BAR 1 and BAR 2 instance blocks and the BAR 2 page tables) is not kept back:
it holds CPU-RM's own structures, which this path does not make (it writes its tables through
PRAMIN, not BAR 2, and GSP-RM binds BAR 1 under its own root). PMA serves clients only
regions neither bInternalHeap nor bRsvdRegion (mem_mgr.c memmgrPmaRegisterRegions_IMPL),
which is :func:`usable` here less that region.
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


class Heap:
    """Video memory's free blocks, first fit: :meth:`take` a block of whole pages aligned to
    ``align``, :meth:`give` it back. ``kept``: ranges ``(at, size)`` of whole pages never
    handed out (:func:`roots`, :func:`retired`)."""

    def __init__(self, regions: Sequence[FbRegion],
                 kept: Iterable[tuple[int, int]] = ()) -> None:
        self.kept = list(kept)
        self.ranges = without(usable(regions), self.kept)
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
        if any(at < k + kn and k < at + size for k, kn in self.kept):
            raise ValueError(f"0x{at:x}+0x{size:x} is FB the heap keeps back")
        self._free.give(at, size)
