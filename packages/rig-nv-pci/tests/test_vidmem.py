"""rig_nv_pci.path.vidmem: the path's video-memory heap over the FB regions GSP-RM reports
(memmgrInitBaseFbRegions_FWCLIENT: reserved and protected regions are none of it)."""

from __future__ import annotations

import pytest

from rig_nv_pci.gsp.static_info import FbRegion
from rig_nv_pci.path.vidmem import HUGE, SMALL, Heap, bar1_range, roots

MiB = 1 << 20


def region(base: int, limit: int, reserved: int = 0, protected: bool = False) -> FbRegion:
    return FbRegion(base, limit, reserved, 0xFF, False, False, protected)


def test_the_heap_is_the_regions_neither_reserved_nor_protected_in_whole_pages() -> None:
    h = Heap([region(0, 2 * MiB - 1, reserved=2 * MiB), region(2 * MiB, 100 * MiB + 0x1FFF),
              region(100 * MiB + 0x2000, 128 * MiB - 1, protected=True),
              region(128 * MiB + 0x800, 130 * MiB - 1)])
    assert h.ranges == [(2 * MiB, 98 * MiB + 0x2000), (128 * MiB + SMALL, 2 * MiB - SMALL)]
    assert h.size == 100 * MiB + 0x2000 - SMALL


def test_first_fit_with_4k_and_2m_alignment_and_blocks_come_back_merged() -> None:
    h = Heap([region(0x1000, 16 * MiB - 1)])
    a = h.take(0x3000)
    b = h.take(2 * MiB, HUGE)
    c = h.take(0x1000)
    assert (a, b, c) == (0x1000, 2 * MiB, 0x4000)  # c fits in the gap b's alignment left
    assert h.take(16 * MiB) is None
    for at, n in ((b, 2 * MiB), (a, 0x3000), (c, 0x1000)):
        assert at is not None
        h.give(at, n)
    assert h.free == h.ranges == [(0x1000, 16 * MiB - 0x1000)]
    with pytest.raises(ValueError, match="whole 4 KiB pages"):
        h.take(0x1800)


def test_no_usable_region_is_an_empty_heap() -> None:
    h = Heap([region(0, MiB - 1, reserved=MiB), region(MiB, 2 * MiB - 1, protected=True)])
    assert h.size == 0 and h.take(SMALL) is None


def test_gsp_rms_bar_roots_pages_are_never_handed_out() -> None:
    """kbusPatchBar1Pdb_GSPCLIENT / kbusPatchBar2Pdb_GSPCLIENT: the roots at bar1PdeBase and
    bar2PdeBase are GSP-RM's; reported in a usable region, their pages stay out of the heap."""
    kept = roots(0x3010, 0, 0x5000)
    assert kept == [(0x3000, SMALL), (0x5000, SMALL)]
    h = Heap([region(0x1000, 0x8000 - 1)], kept)
    assert h.ranges == [(0x1000, 0x2000), (0x4000, 0x1000), (0x6000, 0x2000)]
    got = []
    while (at := h.take(SMALL)) is not None:
        got.append(at)
    assert sorted(got) == [0x1000, 0x2000, 0x4000, 0x6000, 0x7000]
    assert h.take(0x3000) is None  # no run crosses a kept page
    with pytest.raises(ValueError, match="keeps back"):
        h.give(0x3000, SMALL)


def test_bar1s_last_page_is_kept_back() -> None:
    """kbusInitBar1_GM107: BAR 1's VA heap ends a FERMI_SMALL_PAGESIZE short of the BAR."""
    assert bar1_range(256 * MiB) == (0, 256 * MiB - SMALL)
    assert bar1_range(0) == (0, 0)
