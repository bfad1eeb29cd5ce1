"""rig_nv_pci.vidmem: the path's video-memory heap over the FB regions GSP-RM reports
(memmgrInitBaseFbRegions_FWCLIENT: reserved and protected regions are none of it)."""

from __future__ import annotations

import pytest

from rig_nv_pci.gsp.static_info import FbRegion
from rig_nv_pci.vidmem import HUGE, SMALL, Heap

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
