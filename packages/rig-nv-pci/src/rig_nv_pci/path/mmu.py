"""The GPU's page tables as the path writes them, as NVIDIA's CPU-RM writes them for a GSP
client (gpu_vaspace.c over mmu_walk.c), in the MMU's version-2 format of Pascal to Ada
(:data:`VER2`) or the version-3 format of Hopper and Blackwell (:data:`VER3`; the generated
HAL gives every chip after AD107 kgmmuFmtFamiliesInit_GH100).

The format (NV_MMU_VER2_*, open-gpu-doc manuals/turing/tu104/dev_mmu.ref.txt, which Ampere and
Ada keep; nouveau's gp100 vmm writes the same): five levels over a 49-bit address, each level
instance one 4 KiB page of video memory here,

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-mmu.md."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from typing import NamedTuple, Protocol

from rig_edge import RigError

PAGE, BIG_PAGE, HUGE_PAGE = 4 << 10, 64 << 10, 2 << 20


class Level(NamedTuple):
    name: str
    shift: int  # the lowest address bit it indexes
    entries: int
    entry_size: int


PD3, PD2, PD1, PD0, PT = (Level("PD3", 47, 4, 8), Level("PD2", 38, 512, 8),
                          Level("PD1", 29, 512, 8), Level("PD0", 21, 256, 16),
                          Level("PT", 12, 512, 8))
PT_BIG = Level("PT big", 16, 32, 8)  # 64 KiB pages: 2 MiB / 64 KiB entries
DIRECTORIES = (PD3, PD2, PD1)

# NV_MMU_VER2_PDE_APERTURE / NV_MMU_VER2_DUAL_PDE_APERTURE_SMALL values
PDE_VIDEO = 1
# NV_MMU_VER2_PTE_APERTURE values (and NV_MMU_VER3_PTE_APERTURE's, hopper/gh100/dev_mmu.h)
PTE_VIDEO, PTE_SYSTEM_COHERENT, PTE_SYSTEM_NON_COHERENT = 0, 2, 3
PTE_VOL = 1 << 3  # NV_MMU_VER2_PTE_VOL 3:3: the GPU's L2 does not cache the page
# NV_MMU_VER3_PTE_PCF 7:3 values (hopper/gh100/dev_mmu.h)
PCF_REGULAR_RW_ATOMIC_CACHED_ACE, PCF_REGULAR_RW_ATOMIC_UNCACHED_ACE = 0x0, 0x1
# NV_MMU_VER3_PDE_PCF 5:3 (and _DUAL_PDE_PCF_BIG / _SMALL) VALID_CACHED_ATS_NOT_ALLOWED 2: what
# gmmu_walk.c's _gmmuWalkCBWriteEntries writes for a VA space without ATS (ATS_ALLOWED only
# where gvaspaceIsAtsEnabled); neither rig's address space nor BAR 1's has ATS
PDE_PCF_VALID_CACHED_ATS_NOT_ALLOWED = 0x2
KIND_PITCH = 0x00  # NV_MMU_PTE_KIND_PITCH: system memory's
U64, U128 = struct.Struct("<Q"), struct.Struct("<QQ")
ZERO_PAGE = bytes(4 << 10)


class NoRoom(RigError):
    """Video memory has no room for a page table."""


def pde(address: int) -> int:
    """A PDE (or a dual PDE's small half) naming the level at video memory ``address``."""
    return PDE_VIDEO << 1 | (address >> 12) << 8


def _aperture(video: bool, coherent: bool) -> int:
    if video:
        return PTE_VIDEO
    return PTE_SYSTEM_COHERENT if coherent else PTE_SYSTEM_NON_COHERENT


def pte(address: int, *, video: bool, kind: int, coherent: bool = True,
        volatile: bool = False) -> int:
    """A valid PTE of the page at ``address``: video memory, or system memory by bus address,
    coherent (snooped) unless ``coherent`` is false; cached in the GPU's L2 unless
    ``volatile`` (by default as the path registers its memory)."""
    return (1 | _aperture(video, coherent) << 1 | (PTE_VOL if volatile else 0)
            | (address >> 12) << 8 | (kind & 0xFF) << 56)


def index(level: Level, va: int) -> int:
    return va >> level.shift & level.entries - 1


ADDRESS_51_12 = (1 << 52) - (1 << 12)  # NV_MMU_VER3_PDE_ADDRESS / NV_MMU_VER3_PTE_ADDRESS
ADDRESS_51_8 = (1 << 52) - (1 << 8)  # NV_MMU_VER3_DUAL_PDE_ADDRESS_BIG (ADDRESS_BIG_SHIFT 8)


def big_pde(address: int) -> int:
    """A version-2 dual PDE's big half (bits 63:0) naming the big-page table at video memory
    ``address``: APERTURE_BIG VIDEO_MEMORY, VOL_BIG 0, ADDRESS_BIG 53:4 (``address >> 8``)."""
    return PDE_VIDEO << 1 | (address >> 8) << 4


def big_pde3(address: int) -> int:
    """A version-3 dual PDE's big half: APERTURE_BIG VIDEO_MEMORY, PCF_BIG VALID_CACHED_ATS_
    NOT_ALLOWED, ADDRESS_BIG 51:8 (``address >> 8``, so in place)."""
    return PDE_VIDEO << 1 | PDE_PCF_VALID_CACHED_ATS_NOT_ALLOWED << 3 | address & ADDRESS_51_8


def pde3(address: int) -> int:
    """A version-3 PDE (APERTURE VIDEO_MEMORY, PCF VALID_CACHED_ATS_NOT_ALLOWED) naming the
    level at ``address``."""
    return PDE_VIDEO << 1 | PDE_PCF_VALID_CACHED_ATS_NOT_ALLOWED << 3 | address & ADDRESS_51_12


def pte3(address: int, *, video: bool, kind: int, coherent: bool = True,
         volatile: bool = False) -> int:
    """A valid version-3 PTE, PCF REGULAR_RW_ATOMIC_CACHED_ACE (0), or its UNCACHED twin (1)
    for a ``volatile`` page (the version-2 VOL bit's place in version 3)."""
    pcf = PCF_REGULAR_RW_ATOMIC_UNCACHED_ACE if volatile else PCF_REGULAR_RW_ATOMIC_CACHED_ACE
    return (1 | _aperture(video, coherent) << 1 | pcf << 3 | (kind & 0xF) << 8
            | address & ADDRESS_51_12)


NV_PBUS_BAR0_WINDOW = 0x00001700  # dev_bus.ref.txt: BASE 23:0 (>> 16), TARGET 25:24 VID_MEM 0
NV_XAL_EP_BAR0_WINDOW = 0x0010FD40  # pri_nv_xal_ep.h: BASE 22:0 (>> 16), video memory only


class Format(NamedTuple):
    """A page-table format: its directories above PD0 (root first), PD0, PT, how entries
    are made and where a PDE's address lies, the BAR 0 window register of its chips, and how
    a dual PDE's big half is made and where its address lies."""

    name: str
    directories: tuple[Level, ...]
    pd0: Level
    pt: Level
    pde: Callable[[int], int]
    pte: Callable[..., int]
    pde_address: Callable[[int], int]
    window: int
    big_pde: Callable[[int], int]
    big_pde_address: Callable[[int], int]


VER2 = Format("version 2", DIRECTORIES, PD0, PT, pde, pte,
              lambda e: (e >> 8 & (1 << 46) - 1) << 12, NV_PBUS_BAR0_WINDOW,
              big_pde, lambda e: (e >> 4 & (1 << 50) - 1) << 8)
VER3 = Format("version 3", (Level("PD4", 56, 2, 8), Level("PD3", 47, 512, 8), PD2, PD1),
              PD0, PT, pde3, pte3, lambda e: e & ADDRESS_51_12, NV_XAL_EP_BAR0_WINDOW,
              big_pde3, lambda e: e & ADDRESS_51_8)


class Registers(Protocol):
    """BAR 0 (rig_pci.Window)."""

    def read32(self, offset: int) -> int: ...

    def write32(self, offset: int, value: int) -> None: ...


NV_PBUS_BAR0_WINDOW_BASE_SHIFT = 16  # and NV_XAL_EP_BAR0_WINDOW_BASE_SHIFT
NV_PRAMIN = 0x00700000  # dev_ram.h NV_PRAMIN 0x007FFFFF:0x00700000
PRAMIN_SIZE = 1 << 20


class Pramin:
    """Video memory written through BAR 0's PRAMIN window, 32 bits at a time."""

    def __init__(self, bar0: Registers, window: int = NV_PBUS_BAR0_WINDOW) -> None:
        self.bar0, self.window = bar0, window
        self.base: int | None = None

    def _at(self, fb: int) -> int:
        if self.base is None or not 0 <= fb - self.base < PRAMIN_SIZE:
            self.base = fb >> NV_PBUS_BAR0_WINDOW_BASE_SHIFT << NV_PBUS_BAR0_WINDOW_BASE_SHIFT
            self.bar0.write32(self.window, self.base >> NV_PBUS_BAR0_WINDOW_BASE_SHIFT)
        return NV_PRAMIN + fb - self.base

    def write(self, fb: int, data: bytes) -> None:
        if fb % 4 or len(data) % 4:
            raise ValueError(f"PRAMIN writes whole words, not 0x{len(data):x} bytes at 0x{fb:x}")
        for i, (word,) in enumerate(struct.iter_unpack("<I", data)):
            self.bar0.write32(self._at(fb + 4 * i), word)

    def read(self, fb: int, n: int) -> bytes:
        return b"".join(self.bar0.read32(self._at(fb + i)).to_bytes(4, "little")
                        for i in range(0, n, 4))


# turing/tu102/dev_vm.h, at NV_VIRTUAL_FUNCTION_FULL_PHYS_OFFSET (0xB80000) in BAR 0, where
# GPU_VREG_WR32 writes them for the PF (gpuGetVirtRegPhysOffset_TU102)
NV_VIRTUAL_FUNCTION = 0x00B80000
NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE_PDB = 0x30A0  # APERTURE 1:1 (VID_MEM 0), ADDR 31:4
NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE_UPPER_PDB = 0x30A4  # ADDR 19:0, above PDB_ADDR's 28 bits
NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE = 0x30B0
INVALIDATE_ALL_VA, INVALIDATE_SYS_MEMBAR = 1 << 0, 1 << 6  # ALL_VA 0:0, SYS_MEMBAR 6:6
INVALIDATE_TRIGGER = 1 << 31  # TRIGGER 31:31
PDB_ADDR_ALIGNMENT, PDB_ADDR_BITS = 12, 28  # _PDB_ADDR_ALIGNMENT, DRF_SIZE(_PDB_ADDR)
INVALIDATE_TIMEOUT_S = 1.0


def invalidate(bar0: Registers, root: int, *, downgrade: bool,
               timeout_s: float = INVALIDATE_TIMEOUT_S) -> None:
    """Invalidate the TLB entries of the address space whose PD3 lies at video memory
    ``root``: wait for no invalidate pending (kgmmuCheckPendingInvalidates_TU102), name the
    PDB (kgmmuSetPdbToInvalidate_TU102), trigger ALL_VA for that PDB with SYS_MEMBAR for a
    downgrade (kgmmuInvalidateTlb_GM107, kgmmuSetTlbInvalidateMembarWarParameters_TU102), and
    wait for TRIGGER to clear. Raises :class:`rig_edge.RigError` if it stays set."""
    register = NV_VIRTUAL_FUNCTION + NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE

    def idle() -> None:
        deadline = time.monotonic() + timeout_s
        while bar0.read32(register) & INVALIDATE_TRIGGER:
            if time.monotonic() > deadline:
                raise RigError(f"a TLB invalidate still pending after {timeout_s} s")

    idle()
    frame = root >> PDB_ADDR_ALIGNMENT
    bar0.write32(NV_VIRTUAL_FUNCTION + NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE_PDB,
                 (frame & (1 << PDB_ADDR_BITS) - 1) << 4)  # APERTURE VID_MEM 0
    bar0.write32(NV_VIRTUAL_FUNCTION + NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE_UPPER_PDB,
                 frame >> PDB_ADDR_BITS & 0xFFFFF)
    bar0.write32(register, INVALIDATE_TRIGGER | INVALIDATE_ALL_VA
                 | (INVALIDATE_SYS_MEMBAR if downgrade else 0))
    idle()


class Shadow(dict[int, bytearray]):
    """The tables' contents by address; a table first met under another's entry (GSP-RM's,
    under a root it made) is read from video memory by ``load`` and kept as foreign."""

    def __init__(self, load: Callable[[int], bytes] | None) -> None:
        super().__init__()
        self.load = load
        self.foreign: set[int] = set()

    def __missing__(self, table: int) -> bytearray:
        if self.load is None:
            raise KeyError(table)
        self[table] = data = bytearray(self.load(table))
        self.foreign.add(table)
        return data


class PageTables:
    """One address space's page tables in video memory: ``take_page()`` gives the FB offset
    of a free 4 KiB page (or ``None``) and ``give_page(fb)`` takes back one emptied,
    ``write(fb, data)`` writes video memory, ``invalidate(root, downgrade)`` (if given)
    follows every map and unmap; ``root`` an existing root level to build under instead of a
    new one, its tables and those below it read by ``read(fb, n)`` when first used (and never
    freed: they are another's). The tables'
    contents are shadowed here, so only changed entries are written."""

    def __init__(self, take_page: Callable[[], int | None],
                 write: Callable[[int, bytes], None],
                 invalidate: Callable[[int, bool], None] | None = None,
                 fmt: Format = VER2, give_page: Callable[[int], None] | None = None,
                 root: int | None = None,
                 read: Callable[[int, int], bytes] | None = None) -> None:
        self._take, self._write, self._invalidate = take_page, write, invalidate
        self._give = give_page or (lambda page: None)
        self.fmt = fmt
        self.pinned: set[int] = set()  # the directories handed to GSP-RM: never freed
        load = read
        self.shadow = Shadow(None if load is None else lambda table: load(table, PAGE))
        # the 8-byte words changed since the last flush, per table: only they are written, so
        # entries GSP-RM writes in a shared directory (its range's, under the PD1 handed
        # over) are never overwritten from a stale shadow
        self._dirty: dict[int, set[int]] = {}
        if root is None:
            self.root = self._table()
        else:  # another's root (BAR 1's, GSP-RM's), read from video memory when first used
            self.root = root
        self.pinned.add(self.root)
        self._flush()

    def _table(self) -> int:
        fb = self._take()
        if fb is None:
            raise NoRoom("no video memory for a page table")
        self.shadow[fb] = bytearray(PAGE)
        self._dirty[fb] = set(range(0, PAGE, 8))  # zeroed in video memory
        return fb

    def _set(self, table: int, at: int, packed: bytes) -> None:
        self.shadow[table][at:at + len(packed)] = packed
        self._dirty.setdefault(table, set()).update(range(at, at + len(packed), 8))

    def _flush(self) -> None:
        """Write the changed words, each run of adjacent ones at once."""
        for table, words in sorted(self._dirty.items()):
            run: list[int] = []
            for at in [*sorted(words), -1]:
                if run and at != run[-1] + 8:
                    lo, hi = run[0], run[-1] + 8
                    self._write(table + lo, bytes(self.shadow[table][lo:hi]))
                    run = []
                run.append(at)
        self._dirty.clear()

    def _next(self, table: int, level: Level, va: int) -> int:
        """The level below ``table``'s entry for ``va``, made if there is none."""
        at = index(level, va) * level.entry_size
        entry: int = U64.unpack_from(self.shadow[table], at)[0]
        if entry >> 1 & 3:
            return self.fmt.pde_address(entry)
        below = self._table()
        self._set(table, at, U64.pack(self.fmt.pde(below)))
        return below

    def directory(self, va: int) -> list[int]:
        """The directories above PD0 over ``va`` (made where missing), root first."""
        out = [self.root]
        for level in self.fmt.directories[:-1]:
            out.append(self._next(out[-1], level, va))
        self.pinned.update(out)
        self._flush()
        return out

    def _pd0(self, va: int) -> int:
        table = self.root
        for level in self.fmt.directories:
            table = self._next(table, level, va)
        return table

    def _small_mapped(self, pt: int, va: int) -> bool:
        """Whether the small-page table ``pt`` maps any 4 KiB page of ``va``'s 64 KiB."""
        first = index(self.fmt.pt, va & -BIG_PAGE) * self.fmt.pt.entry_size
        return any(U64.unpack_from(self.shadow[pt], first + 8 * i)[0] & 1
                   for i in range(BIG_PAGE // PAGE))

    def map(self, va: int, size: int, address: Callable[[int], int], *, video: bool,
            kind: int, huge: bool, big: bool = False, coherent: bool = True,
            volatile: bool = False) -> None:
        """Map ``[va, va+size)`` to the pages ``address(offset)`` gives, 2 MiB pages if
        ``huge``, else 64 KiB (big) pages if ``big``, else 4 KiB pages (``coherent`` and
        ``volatile`` as :func:`pte` takes them). Raises :class:`rig_edge.RigError` where video
        memory has no room for a table, or where a page lies over one of another size already
        mapped (the entries written so far stay: :meth:`unmap` clears them)."""
        step = HUGE_PAGE if huge else BIG_PAGE if big else PAGE
        if va % step or size % step:
            raise ValueError(f"0x{size:x} bytes at 0x{va:x} are not whole 0x{step:x} pages")
        fmt = self.fmt
        try:
            for off in range(0, size, step):
                v = va + off
                entry = fmt.pte(address(off), video=video, kind=kind, coherent=coherent,
                                volatile=volatile)
                pd0 = self._pd0(v)
                at = index(fmt.pd0, v) * fmt.pd0.entry_size
                lo, hi = U128.unpack_from(self.shadow[pd0], at)
                big_table = fmt.big_pde_address(lo) if not lo & 1 and lo >> 1 & 3 else None
                if huge:
                    if hi >> 1 & 3 or big_table is not None:  # an unmap frees emptied tables
                        raise RigError(f"0x{v:x}: its 2 MiB block has "
                                       f"{'4' if hi >> 1 & 3 else '64'} KiB pages mapped")
                    self._set(pd0, at, U64.pack(entry))
                    continue
                if lo & 1:
                    raise RigError(f"0x{v:x} lies in a mapped 2 MiB page")
                if big:
                    if hi >> 1 & 3 and self._small_mapped(fmt.pde_address(hi), v):
                        raise RigError(f"0x{v:x}: its 64 KiB has 4 KiB pages mapped")
                    if big_table is None:
                        big_table = self._table()
                        self._set(pd0, at, U64.pack(fmt.big_pde(big_table)))  # bits 63:0
                    self._set(big_table, index(PT_BIG, v) * PT_BIG.entry_size, U64.pack(entry))
                    continue
                if big_table is not None and U64.unpack_from(
                        self.shadow[big_table], index(PT_BIG, v) * PT_BIG.entry_size)[0] & 1:
                    raise RigError(f"0x{v:x} lies in a mapped 64 KiB page")
                if not hi >> 1 & 3:
                    pt = self._table()
                    self._set(pd0, at + 8, U64.pack(fmt.pde(pt)))  # bits 127:64
                else:
                    pt = fmt.pde_address(hi)
                self._set(pt, index(fmt.pt, v) * fmt.pt.entry_size, U64.pack(entry))
        finally:
            self._flush()
            if self._invalidate is not None:
                self._invalidate(self.root, False)

    def unmap(self, va: int, size: int, *, huge: bool = False) -> None:
        """Clear the PTEs of ``[va, va+size)``, whatever their size (read from the tables;
        ``huge`` is not needed; a page only partly in the range raises ``ValueError``, the
        pages before it cleared); a table left empty is cleared from its half of the dual PDE
        or the level above and its page given back once the TLB is invalidated (never the
        directories handed to GSP-RM: :meth:`directory`'s)."""
        fmt = self.fmt
        emptied: list[int] = []
        try:
            off = 0
            while off < size:
                v = va + off
                path: list[tuple[int, int]] = []  # (table, entry offset) from the root down
                table = self.root
                for level in fmt.directories:
                    at = index(level, v) * level.entry_size
                    (entry,) = U64.unpack_from(self.shadow[table], at)
                    if not entry >> 1 & 3:  # nothing mapped to the end of this entry's span
                        off += (1 << level.shift) - v % (1 << level.shift)
                        break
                    path.append((table, at))
                    table = fmt.pde_address(entry)
                else:
                    off += self._unmap_at(table, v, va + size, emptied)
                    for above, at in reversed(path):  # PD0, then the directories, while empty
                        if (self.shadow[table] != ZERO_PAGE or table in self.pinned
                                or table in self.shadow.foreign):
                            break
                        self._set(above, at, U64.pack(0))
                        emptied.append(table)
                        table = above
        finally:
            self._flush()
            if self._invalidate is not None:
                self._invalidate(self.root, True)
            for page in emptied:  # unreachable and no longer in any TLB: given back
                del self.shadow[page]
                self._dirty.pop(page, None)
                self._give(page)

    def _unmap_at(self, pd0: int, va: int, end: int, emptied: list[int]) -> int:
        """Clear the page that maps ``va`` under ``pd0`` (its 2 MiB PTE, big PTE or small
        PTE), and a page table it leaves empty from its half of the dual PDE (into
        ``emptied``): the bytes from ``va`` to where the next page may start. Raises
        ``ValueError`` for a page not wholly in ``[va, end)``."""

        def whole(page: int) -> int:
            if va % page or end - va < page:
                raise ValueError(f"0x{va:x}..0x{end:x} does not cover the whole 0x{page:x} "
                                 "page mapped there")
            return page
        fmt = self.fmt
        at = index(fmt.pd0, va) * fmt.pd0.entry_size
        lo, hi = U128.unpack_from(self.shadow[pd0], at)
        if lo & 1:  # a 2 MiB page
            step = whole(HUGE_PAGE)
            self._set(pd0, at, U64.pack(0))
            return step
        if lo >> 1 & 3:
            big_table = fmt.big_pde_address(lo)
            big_at = index(PT_BIG, va) * PT_BIG.entry_size
            if U64.unpack_from(self.shadow[big_table], big_at)[0] & 1:
                step = whole(BIG_PAGE)
                self._set(big_table, big_at, U64.pack(0))  # not valid: the small PTEs count
                if self.shadow[big_table] == ZERO_PAGE:
                    self._set(pd0, at, U64.pack(0))
                    emptied.append(big_table)
                return step
        if not hi >> 1 & 3:
            span = BIG_PAGE if lo >> 1 & 3 else HUGE_PAGE
            return span - va % span
        pt = fmt.pde_address(hi)
        self._set(pt, index(fmt.pt, va) * fmt.pt.entry_size, U64.pack(0))
        if self.shadow[pt] == ZERO_PAGE:
            self._set(pd0, at + 8, U64.pack(0))
            emptied.append(pt)
        return PAGE - va % PAGE
