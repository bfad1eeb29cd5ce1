"""The simulated GPU's MMU: a GPU address translated by walking the page tables in video memory,
read as NVIDIA's manuals lay out the version-2 format (open-gpu-doc
manuals/turing/tu104/dev_mmu.ref.txt, NV_MMU_VER2_*), written independently of rig_nv_pci:

- PD3 indexes address bits 48:47, PD2 46:38, PD1 37:29 with 8-byte PDEs: APERTURE 2:1
  (0 invalid, 1 video memory, 2/3 system memory), ADDRESS_SYS 53:8, ADDRESS_VID 32:8, in
  4 KiB units;
- PD0 indexes 28:21 with 16-byte dual PDEs: bit 0 set (IS_PTE) makes bits 63:0 a 2 MiB page's
  PTE; else APERTURE_BIG 2:1 with ADDRESS_BIG_VID 32:4 (256-byte units,
  NV_MMU_VER2_DUAL_PDE_ADDRESS_BIG_VID (35-3):(8-4), _ADDRESS_BIG_SHIFT 8, pascal/gp100/dev_mmu.h)
  names a big-page table, and APERTURE_SMALL 66:65 with ADDRESS_SMALL 117:72 (4 KiB units) the
  small-page table;
- a big-page table indexes 20:16 (64 KiB pages) with PTEs as a PT's below; one not valid sends
  the walk on to the small-page table when it is otherwise zero, faults (PTE) when PRIVILEGE
  5:5 is set (nouveau vmmgp100.c gp100_vmm_lpt_invalid: "tells the MMU to ignore corresponding
  SPTEs"), and a sparse one (VOL 3:3) is not simulated; a valid big PTE over a 64 KiB whose
  small PTEs are valid too is a PDE fault here (what the MMU does then is not in the manuals:
  the simulator refuses it);
- PT indexes 20:12 with 8-byte PTEs: VALID 0:0, APERTURE 2:1 (0 video memory, 1 peer, 2
  coherent / 3 non-coherent system memory), ADDRESS_SYS 53:8 (ADDRESS_VID 32:8 with PEER
  35:33 for video memory), KIND 63:56.

Hopper and Blackwell (version 3, hopper/gh100/dev_mmu.h NV_MMU_VER3_*; levels as
kern_gmmu_fmt_gh10x.c): PD4 indexes bit 56, then PD3 55:47, PD2, PD1 (whose PTEs, 512 MiB
pages, are not simulated), PD0 and PT as above; PDEs APERTURE 2:1 and ADDRESS 51:12 in place,
the dual PDE's big half APERTURE_BIG 2:1 and ADDRESS_BIG 51:8 (256-byte units, in place), its
small half APERTURE_SMALL 66:65 and ADDRESS_SMALL 115:76; PTEs VALID 0:0, APERTURE 2:1, PCF 7:3,
KIND 11:8, ADDRESS 51:12 in place (ADDRESS_VID 39:12); a big PTE not valid goes on to the small
one with PCF INVALID (0), faults with NO_VALID_4KB_PAGE (3), and is not simulated otherwise
(SPARSE 1).

The page tables themselves must lie in video memory (a PDE naming system memory faults: the
path keeps its tables in video memory).

A fault says what the MMU would put in its fault packet's FAULT_TYPE (pascal/gp100/dev_fault.h
NV_PFAULT_FAULT_TYPE_*): PDE (0) where a directory entry, PD0's included, maps nothing, PTE (2)
where the page table's entry is not valid, VA_LIMIT_VIOLATION (3) beyond the address space,
UNSUPPORTED_APERTURE (0xa) for a peer's memory; what the simulator does not model (PD1 PTEs,
big pages, a PCF) is a PDE fault.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class Translation(NamedTuple):
    video: bool  # video memory, else system memory by bus address
    address: int
    page: int  # the page's size
    kind: int


# NV_PFAULT_FAULT_TYPE_* (pascal/gp100/dev_fault.h)
FAULT_PDE, FAULT_PTE, FAULT_VA_LIMIT_VIOLATION = 0x0, 0x2, 0x3
FAULT_UNBOUND_INST_BLOCK, FAULT_UNSUPPORTED_APERTURE = 0x4, 0xA


class MmuFault(LookupError):
    """A translation that faults: the address asked for and the fault type."""

    def __init__(self, why: str, va: int, fault_type: int = FAULT_PDE) -> None:
        super().__init__(why)
        self.va, self.fault_type = va, fault_type


def _field(value: int, hi: int, lo: int) -> int:
    return value >> lo & (1 << hi - lo + 1) - 1


def _next(entry: int, version: int) -> int:
    return _field(entry, 32, 8) << 12 if version == 2 else _field(entry, 51, 12) << 12


def translate(read64: Callable[[int], int], root: int, va: int, version: int = 2
              ) -> Translation:
    """``va`` through the tables of format ``version`` (2 or 3) from ``root`` (a video
    memory address); ``read64(fb)`` reads video memory. Raises :class:`MmuFault` naming the
    level that does not map it."""
    entry, size = pte(read64, root, va, version)
    return _page(entry, va, size, version)


def pte(read64: Callable[[int], int], root: int, va: int, version: int = 2
        ) -> tuple[int, int]:
    """The valid PTE that maps ``va`` (a PT's, a big-page table's, or PD0's for a 2 MiB
    page) and its page's size, as :func:`translate` walks to it."""
    bits = 49 if version == 2 else 57
    if va >> bits:
        raise MmuFault(f"0x{va:x} is beyond the {bits}-bit address space", va,
                       FAULT_VA_LIMIT_VIOLATION)
    levels = ((("PD3", 48, 47), ("PD2", 46, 38), ("PD1", 37, 29)) if version == 2 else
              (("PD4", 56, 56), ("PD3", 55, 47), ("PD2", 46, 38), ("PD1", 37, 29)))
    table = root
    for name, hi, lo in levels:
        entry = read64(table + 8 * _field(va, hi, lo))
        aperture = _field(entry, 2, 1)
        if entry & 1:
            raise MmuFault(f"0x{va:x}: a {name} PTE, not simulated", va)
        if aperture != 1:
            raise MmuFault(f"0x{va:x}: {name} entry 0x{entry:x} is "
                           f"{'invalid' if aperture == 0 else 'in system memory'}", va)
        table = _next(entry, version)
    at = table + 16 * _field(va, 28, 21)
    low, high = read64(at), read64(at + 8)
    if low & 1:
        return low, 2 << 20
    small = _field(high, 2, 1)
    if small not in (0, 1):
        raise MmuFault(f"0x{va:x}: a small-page table in system memory", va)
    big = _field(low, 2, 1)
    if big not in (0, 1):
        raise MmuFault(f"0x{va:x}: a big-page table in system memory", va)
    if big:
        table = (_field(low, 32, 4) if version == 2 else _field(low, 51, 8)) << 8
        entry = read64(table + 8 * _field(va, 20, 16))
        if entry & 1:
            if small and any(read64(_next(high, version) + 8 * (_field(va, 20, 16) << 4 | i)) & 1
                             for i in range(16)):
                raise MmuFault(f"0x{va:x}: both its big PTE and a small PTE of its 64 KiB "
                               "are valid", va)
            return entry, 64 << 10
        if (version == 2 and entry & 1 << 5) or (version == 3 and _field(entry, 7, 3) == 3):
            raise MmuFault(f"0x{va:x}: big PTE 0x{entry:x} is not valid and has no valid "
                           "small PTEs", va, FAULT_PTE)
        if entry:
            raise MmuFault(f"0x{va:x}: big PTE 0x{entry:x} (sparse?) is not simulated", va)
    if small:
        entry = read64(_next(high, version) + 8 * _field(va, 20, 12))
        if not entry & 1:
            raise MmuFault(f"0x{va:x}: PTE 0x{entry:x} is not valid", va, FAULT_PTE)
        return entry, 4 << 10
    if big:
        raise MmuFault(f"0x{va:x}: big PTE 0 is not valid and there is no small-page table",
                       va, FAULT_PTE)
    raise MmuFault(f"0x{va:x}: PD0 entry 0x{high:x}_{low:016x} maps nothing", va)


def _page(entry: int, va: int, size: int, version: int) -> Translation:
    aperture = _field(entry, 2, 1)
    if aperture == 1:
        raise MmuFault(f"0x{va:x}: a peer's memory, not simulated", va,
                       FAULT_UNSUPPORTED_APERTURE)
    video = aperture == 0
    if version == 2:
        frame = _field(entry, 32, 8) if video else _field(entry, 53, 8)
        kind = _field(entry, 63, 56)
    else:
        frame = _field(entry, 39, 12) if video else _field(entry, 51, 12)
        kind = _field(entry, 11, 8)
        if _field(entry, 7, 3) not in (0, 1):  # REGULAR_RW_ATOMIC_(UN)CACHED_ACE
            raise MmuFault(f"0x{va:x}: PTE 0x{entry:x}'s PCF is not simulated", va)
    base = frame << 12
    if base % size:
        raise MmuFault(f"0x{va:x}: PTE 0x{entry:x} names 0x{base:x}, not aligned to its page",
                       va)
    return Translation(video, base + va % size, size, kind)
