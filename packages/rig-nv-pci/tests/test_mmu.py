"""rig_nv_pci.path.mmu: the version-2 page-table entries against numbers worked by hand from
open-gpu-doc's manuals/turing/tu104/dev_mmu.ref.txt, the PRAMIN window against the simulated
BAR 0, and tables the path writes walked by the simulated MMU (tests/sim/gmmu.py, written
from the manual alone); the simulated GSP-RM's check of the handed-over directories."""

from __future__ import annotations

import pytest
import sim
from sim import gmmu
from support import (
    Booted,
    ga102,  # noqa: F401  (the fixture)
)

from rig_nv.rm import RMError
from rig_nv_pci.path import mmu, space
from rig_nv_pci.path import pci as pp

MiB = 1 << 20


def test_entries_as_the_manual_lays_them_out() -> None:
    # PTE: VALID 0:0, APERTURE 2:1 (VIDEO 0, SYSTEM_COHERENT 2), ADDRESS 53:8 (>> 12), KIND 63:56
    assert mmu.pte(0x1234_5000, video=True, kind=6) == 0x0600_0000_0123_4501
    assert mmu.pte(0x12_3456_7000, video=False, kind=0) == 0x0000_0001_2345_6705
    # a peer's BAR 1 (BAR1 P2P): SYSTEM_NON_COHERENT 3, VOL 3:3 set, KIND GENERIC_MEMORY 6
    assert mmu.pte(0x38_0000_1000, video=False, kind=6, coherent=False,
                   volatile=True) == 0x0600_0003_8000_010F
    # PDE: APERTURE 2:1 VIDEO_MEMORY 1, ADDRESS 53:8 (>> 12)
    assert mmu.pde(0x20_3000) == 0x2_0302
    assert [lv.shift for lv in (mmu.PD3, mmu.PD2, mmu.PD1, mmu.PD0, mmu.PT)] == [47, 38, 29,
                                                                                  21, 12]
    assert all(lv.entries * lv.entry_size in (32, 4096)
               for lv in (mmu.PD3, mmu.PD2, mmu.PD1, mmu.PD0, mmu.PT))
    assert space.COPY_PDES.size + space.GMMU_FMT_MAX_LEVELS * space.COPY_PDES_LEVEL.size == 184


def test_pramin_moves_the_window_in_64k_steps_over_video_memory() -> None:
    gpu = sim.SimGpu()
    vram = bytearray(64 * MiB)
    gpu.vram = memoryview(vram)
    window = mmu.Pramin(gpu.bar0())
    window.write(0x10_0FFC, b"abcdefgh")
    assert vram[0x10_0FFC:0x10_1004] == b"abcdefgh"
    assert gpu.regs[sim.regs.BAR0_WINDOW] == 0x10  # 1 MiB >> 16
    window.write(0x310_0000 - 4, b"last")  # beyond the first window's MiB: moved
    assert vram[0x310_0000 - 4:0x310_0000] == b"last"
    assert gpu.regs[sim.regs.BAR0_WINDOW] == 0x30F
    assert window.read(0x10_0FFC, 8) == b"abcdefgh"
    window = mmu.Pramin(gpu.bar0())
    window.write(0x1F_0000, b"base")  # a window at 0x1f0000 reaches 0x202400 by adding
    window.write(0x20_2400, b"next")
    assert vram[0x20_2400:0x20_2404] == b"next" and gpu.regs[sim.regs.BAR0_WINDOW] == 0x1F
    with pytest.raises(ValueError, match="whole words"):
        window.write(2, b"xy")


def tables(size: int = 64 * MiB) -> tuple[mmu.PageTables, bytearray, list[int]]:
    vram = bytearray(size)
    pages = list(range(size - mmu.PAGE, 32 * MiB - 1, -mmu.PAGE))  # from the top down

    def write(fb: int, data: bytes) -> None:
        vram[fb:fb + len(data)] = data

    return (mmu.PageTables(lambda: pages.pop(0) if pages else None, write,
                           give_page=pages.append), vram, pages)


def walk(vram: bytearray, root: int, va: int) -> gmmu.Translation:
    return gmmu.translate(lambda fb: int.from_bytes(vram[fb:fb + 8], "little"), root, va)


def test_4k_and_2m_pages_walk_to_what_was_mapped_and_unmaps_clear_them() -> None:
    t, vram, pages = tables()
    before = len(pages)
    va = 64 << 30
    t.map(va, 4 * MiB, lambda o: 8 * MiB + o, video=True, kind=6, huge=True)
    t.map(va + 4 * MiB, 0x3000, lambda o: 0x5_0000_0000 + 2 * o, video=False, kind=0,
          huge=False)
    assert walk(vram, t.root, va + 3 * MiB + 5) == (True, 11 * MiB + 5, 2 * MiB, 6)
    assert walk(vram, t.root, va + 4 * MiB + 0x2008) == (False, 0x5_0000_4008, 0x1000, 0)
    # PD3, PD2, PD1, PD0 and one PT: five tables
    assert len(t.shadow) == 5
    with pytest.raises(gmmu.MmuFault, match="not valid"):
        walk(vram, t.root, va + 4 * MiB + 0x3000)
    with pytest.raises(mmu.RigError, match="lies in a mapped 2 MiB page"):
        t.map(va + 2 * MiB, 0x1000, lambda o: 0, video=True, kind=6, huge=False)
    with pytest.raises(mmu.RigError, match="its 2 MiB block has 4 KiB pages mapped"):
        t.map(va + 4 * MiB, 2 * MiB, lambda o: 0, video=True, kind=6, huge=True)
    t.unmap(va, 4 * MiB, huge=True)
    t.unmap(va + 4 * MiB, 0x3000, huge=False)
    for at in (va, va + 4 * MiB + 0x1000):
        with pytest.raises(gmmu.MmuFault):
            walk(vram, t.root, at)
    # the emptied PT, PD0, PD1 and PD2 came back; the root stays
    assert set(t.shadow) == {t.root} == t.pinned and len(pages) == before
    # a freed 2 MiB page's block takes 4 KiB pages
    t.map(va, 0x1000, lambda o: 9 * MiB, video=True, kind=6, huge=False)
    assert walk(vram, t.root, va + 4) == (True, 9 * MiB + 4, 0x1000, 6)


def test_no_page_for_a_table_is_no_room() -> None:
    t, _, pages = tables()
    pages.clear()
    with pytest.raises(mmu.NoRoom):
        t.map(1 << 40, 0x1000, lambda o: 0, video=True, kind=6, huge=False)


def test_the_simulated_gsp_checks_the_handed_over_directories(ga102: Booted) -> None:  # noqa: F811
    p, s = ga102.path(), ga102.sim_rm
    assert p.space.tables is not None and list(s.roots.values()) == [p.space.tables.root]
    (q,) = [c for c in ga102.firmware.peer.controls()
            if c.cmd == sim.gsp_rm.CTRL_COPY_SERVER_RESERVED_PDES]
    params = bytearray(q.params)
    _, _, page_size, lo, hi, count = sim.gsp_rm.COPY_PDES.unpack_from(params)
    assert (page_size, lo, hi, count) == (1 << 29, 4 << 30, (4 << 30) + (512 << 20) - 1, 3)
    levels = [sim.gsp_rm.COPY_PDES_LEVEL.unpack_from(params, 40 + 24 * i) for i in range(3)]
    assert [(lv[2], lv[3]) for lv in levels] == [(1, 47), (1, 38), (1, 29)]
    assert levels[0][0] == p.space.tables.root
    # a PD1 the PD2 does not name is refused
    sim.gsp_rm.COPY_PDES_LEVEL.pack_into(params, 40 + 48, levels[2][0] + 0x1000, 4096, 1, 29)
    with pytest.raises(RMError, match="NV_ERR_INVALID_ARGUMENT"):
        p.rm.control(p.h_vaspace, sim.gsp_rm.CTRL_COPY_SERVER_RESERVED_PDES, params)


class Recorded:
    """BAR 0 whose invalidate register reads back clear."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int]] = []

    def read32(self, offset: int) -> int:
        return 0

    def write32(self, offset: int, value: int) -> None:
        self.writes.append((offset, value))


def test_an_invalidate_names_the_pdb_and_triggers_all_va() -> None:
    bar0 = Recorded()
    mmu.invalidate(bar0, 0x12_3456_7000, downgrade=False)
    mmu.invalidate(bar0, 0x100_0000_0000, downgrade=True)  # above PDB_ADDR's 28 bits
    assert bar0.writes == [(0xB830A0, 0x1234567 << 4), (0xB830A4, 0), (0xB830B0, 0x8000_0001),
                           (0xB830A0, 0), (0xB830A4, 1), (0xB830B0, 0x8000_0041)]

    class Stuck(Recorded):
        def read32(self, offset: int) -> int:
            return 1 << 31

    with pytest.raises(mmu.RigError, match="TLB invalidate still pending"):
        mmu.invalidate(Stuck(), 0, downgrade=False, timeout_s=0.01)


def test_the_simulated_tlb_keeps_a_freed_mapping_until_the_path_invalidates(
    ga102: Booted,  # noqa: F811
) -> None:
    p, s = ga102.path(), ga102.sim_rm
    assert p.space.tables is not None
    a = p.alloc_memory(0x1000, pp.Memory.PINNED)
    assert a is not None and not s.translate(a.gpu).video
    before = s.invalidates
    p.free_memory(a)
    assert s.invalidates == before + 1
    with pytest.raises(LookupError):
        s.translate(a.gpu)
    b = p.alloc_memory(0x1000, pp.Memory.PINNED)
    assert b is not None and b.gpu == a.gpu and s.translate(b.gpu).address == b.undo.dma.bus
    # without the invalidate's flush the simulated GPU would go on using the freed pages
    s.tlb_flushes = False
    before = s.invalidates
    try:
        p.free_memory(b)
        assert s.invalidates == before + 1  # the path invalidated; the TLB kept the page
        assert s.translate(b.gpu).address == b.undo.dma.bus
    finally:
        s.tlb_flushes = True
        s.tlb.clear()


def test_version_3_entries_and_tables_as_hoppers_manual_lays_them_out() -> None:
    # PTE: VALID 0:0, APERTURE 2:1, PCF 7:3 (0), KIND 11:8, ADDRESS 51:12 in place
    assert mmu.pte3(0x1234_5000, video=True, kind=6) == 0x1234_5601
    assert mmu.pte3(0x12_3456_7000, video=False, kind=0) == 0x12_3456_7005
    # a peer's BAR 1: SYSTEM_NON_COHERENT 3, PCF REGULAR_RW_ATOMIC_UNCACHED_ACE 1, KIND 6
    assert mmu.pte3(0x38_0000_1000, video=False, kind=6, coherent=False,
                    volatile=True) == 0x38_0000_160F
    # APERTURE VIDEO 1, PCF 5:3 VALID_CACHED_ATS_NOT_ALLOWED 2 (gh100/dev_mmu.h; gmmu_walk.c
    # sets ATS_ALLOWED only for a VA space with ATS: issue 26 item 5), ADDRESS 51:12
    assert mmu.pde3(0x20_3000) == 0x20_3012
    assert [lv.shift for lv in mmu.VER3.directories] == [56, 47, 38, 29]
    vram = bytearray(64 * MiB)
    pages = list(range(32 * MiB, 64 * MiB, mmu.PAGE))

    def write(fb: int, data: bytes) -> None:
        vram[fb:fb + len(data)] = data

    t = mmu.PageTables(lambda: pages.pop(0), write, fmt=mmu.VER3)
    va = (1 << 56) + (64 << 30)  # PD4's second entry
    t.map(va, 2 * MiB, lambda o: 4 * MiB + o, video=True, kind=6, huge=True)
    t.map(va + 2 * MiB, 0x2000, lambda o: 0x7_0000_0000 + o, video=False, kind=0, huge=False)
    read = lambda fb: int.from_bytes(vram[fb:fb + 8], "little")  # noqa: E731
    assert gmmu.translate(read, t.root, va + 0x1234, 3) == (True, 4 * MiB + 0x1234, 2 * MiB, 6)
    assert gmmu.translate(read, t.root, va + 2 * MiB + 0x1008, 3) == (
        False, 0x7_0000_1008, 0x1000, 0)
    assert len(t.directory(4 << 30)) == 4  # PD4, PD3, PD2, PD1 over the server's range


def test_hoppers_window_register_moves_pramin_on_a_gb202() -> None:
    gpu = sim.gb202()
    vram = bytearray(8 * MiB)
    gpu.vram = memoryview(vram)
    mmu.Pramin(gpu.bar0(), mmu.VER3.window).write(0x50_0000, b"gb20")
    assert vram[0x50_0000:0x50_0004] == b"gb20" and gpu.regs[0x10FD40] == 0x50


def test_only_changed_entries_are_written_so_the_servers_stay() -> None:
    """GSP-RM writes entries of the PD1 handed over (its range's); a later map by the path
    of entries on both sides of one writes only its own."""
    t, vram, _ = tables()
    pd1 = t.directory(4 << 30)[-1]
    server = pd1 + 8 * 8  # PD1 entry 8: 4 GiB, the server's range
    vram[server:server + 8] = (0xABCD_0002).to_bytes(8, "little")
    t._set(pd1, 7 * 8, mmu.U64.pack(mmu.pde(0x100000)))  # entries 7 and 9 in one flush
    t._set(pd1, 9 * 8, mmu.U64.pack(mmu.pde(0x200000)))
    t._flush()
    assert int.from_bytes(vram[server:server + 8], "little") == 0xABCD_0002
    assert vram[pd1 + 72:pd1 + 80] == mmu.U64.pack(mmu.pde(0x200000))
    t.map(10 << 29, 4 * MiB, lambda o: 0, video=True, kind=6, huge=True)
    assert walk(vram, t.root, (10 << 29) + 5).address == 5
    assert int.from_bytes(vram[server:server + 8], "little") == 0xABCD_0002


@pytest.mark.parametrize("version", [2, 3])
def test_big_pages_share_a_2m_block_with_4k_pages_through_the_dual_pde(version: int) -> None:
    """64 KiB pages through the dual PDE's big half (ADDRESS_BIG >> 8), 4 KiB pages through its
    small half in the same 2 MiB block; a 64 KiB range is one or the other, and unmaps clear
    each half when its table empties."""
    fmt = mmu.VER2 if version == 2 else mmu.VER3
    assert mmu.big_pde(0x20_3000) == 0x20_3000 >> 8 << 4 | 2  # ADDRESS_BIG 53:4, VIDEO 1
    assert mmu.big_pde3(0x20_3100) == 0x20_3112  # PCF_BIG 2, ADDRESS_BIG 51:8 in place
    vram = bytearray(64 * MiB)
    pages = list(range(32 * MiB, 64 * MiB, mmu.PAGE))

    def write(fb: int, data: bytes) -> None:
        vram[fb:fb + len(data)] = data

    t = mmu.PageTables(lambda: pages.pop(0), write, fmt=fmt, give_page=pages.append)
    before = len(pages)

    def read(fb: int) -> int:
        return int.from_bytes(vram[fb:fb + 8], "little")

    va = 64 << 30
    t.map(va, 3 * mmu.BIG_PAGE, lambda o: 8 * MiB + o, video=True, kind=6, huge=False,
          big=True)
    t.map(va + 3 * mmu.BIG_PAGE, 0x2000, lambda o: 12 * MiB + o, video=True, kind=6,
          huge=False)
    assert gmmu.translate(read, t.root, va + 0x2_1234, version) == (
        True, 8 * MiB + 0x2_1234, 64 << 10, 6)
    assert gmmu.translate(read, t.root, va + 0x3_1008, version) == (
        True, 12 * MiB + 0x1008, 0x1000, 6)
    with pytest.raises(gmmu.MmuFault, match="not valid"):  # past the 4 KiB pages
        gmmu.translate(read, t.root, va + 0x3_2000, version)
    with pytest.raises(mmu.RigError, match="lies in a mapped 64 KiB page"):
        t.map(va + 0x1_0000, 0x1000, lambda o: 0, video=True, kind=6, huge=False)
    with pytest.raises(mmu.RigError, match="its 64 KiB has 4 KiB pages mapped"):
        t.map(va + 3 * mmu.BIG_PAGE, mmu.BIG_PAGE, lambda o: 0, video=True, kind=6,
              huge=False, big=True)
    with pytest.raises(mmu.RigError, match="its 2 MiB block has 4 KiB pages mapped"):
        t.map(va, 2 * MiB, lambda o: 0, video=True, kind=6, huge=True)
    with pytest.raises(ValueError, match="whole"):
        t.unmap(va + 0x1000, 0x1000)
    # the big pages go: the big half is cleared, the small half stays
    t.unmap(va, 3 * mmu.BIG_PAGE)
    pd0_entry = gmmu.dual_pde(read, t.root, va, version)  # as the simulated MMU walks to it
    lo, hi = mmu.U128.unpack_from(vram, pd0_entry)
    assert lo == 0 and hi >> 1 & 3 == 1
    for off in (0, 0x2_0000):
        with pytest.raises(gmmu.MmuFault):
            gmmu.translate(read, t.root, va + off, version)
    assert gmmu.translate(read, t.root, va + 0x3_0000, version).page == 0x1000
    # 4 KiB pages where the big pages were, and a big page over where 4 KiB ones were
    t.map(va, 0x1000, lambda o: 16 * MiB, video=True, kind=6, huge=False)
    assert gmmu.translate(read, t.root, va + 8, version) == (True, 16 * MiB + 8, 0x1000, 6)
    t.unmap(va, 0x1000)
    t.unmap(va + 3 * mmu.BIG_PAGE, 0x2000)
    lo, hi = mmu.U128.unpack_from(vram, pd0_entry)
    assert lo == hi == 0
    t.map(va + 3 * mmu.BIG_PAGE, mmu.BIG_PAGE, lambda o: 20 * MiB, video=True, kind=6,
          huge=False, big=True)
    assert gmmu.translate(read, t.root, va + 0x3_5000, version) == (
        True, 20 * MiB + 0x5000, 64 << 10, 6)
    t.unmap(va, 2 * MiB)
    assert set(t.shadow) == {t.root} and len(pages) == before
