"""The simulated GPU's MMU: a GPU address translated by walking the page tables in video memory,
read as NVIDIA's manuals lay out the version-2 format (Ampere/Ada, NV_MMU_VER2_*) and the
version-3 one (Hopper/Blackwell, NV_MMU_VER3_*), written independently of rig_nv_pci. The
page tables must lie in video memory. A fault says what the MMU would put in its fault
packet's FAULT_TYPE (PDE, PTE, VA_LIMIT_VIOLATION, UNSUPPORTED_APERTURE); what the simulator
does not model is a PDE fault.

Each level's fields and sources: docs/rig-nv-pci-modules/sim-gmmu.md."""

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


def pde(address: int) -> int:
    """A version-2 PDE naming the table at video memory ``address``, as GSP-RM writes its own:
    APERTURE 2:1 video memory (1), ADDRESS_VID 32:8 in 4 KiB units (NV_MMU_VER2_PDE_*)."""
    return 1 << 1 | (address >> 12) << 8


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
    at = dual_pde(read64, root, va, version)
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


def dual_pde(read64: Callable[[int], int], root: int, va: int, version: int = 2) -> int:
    """The video-memory address of the 16-byte PD0 entry over ``va``, walked to from
    ``root`` through the directories above it."""
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
    return table + 16 * _field(va, 28, 21)


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
