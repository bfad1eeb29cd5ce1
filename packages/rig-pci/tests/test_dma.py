"""DMA memory's pieces that run without a device: bus addresses from a pagemap file, the
locked-memory check, huge-page allocation (with the C calls stood in for), the one free."""

import errno
import resource
from collections.abc import Callable
from pathlib import Path

import pytest

from rig_edge import Misuse, RigError
from rig_pci import Function, Machine, libc
from rig_pci.dma import DmaMemory, memlock_room, merge, pagemap_ranges
from rig_pci.sysfs import SysfsTransport

MakeDevice = Callable[..., Path]
PAGE = 4096
HUGE = 2 << 20
PRESENT = 1 << 63


def write_pagemap(path: Path, entries: dict[int, int]) -> None:
    """A sparse pagemap with ``entries`` (virtual address → 64-bit entry)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    with open(path, "r+b") as f:
        for address, entry in entries.items():
            f.seek(address // PAGE * 8)
            f.write(entry.to_bytes(8, "little"))


def test_pagemap_gives_bus_ranges_of_huge_pages(tmp_path: Path) -> None:
    pagemap = tmp_path / "pagemap"
    host = 0x7F00_0000_0000
    # Three huge pages: the first two physically adjacent, the third elsewhere. Bits 55-62
    # (soft-dirty, exclusive, file) must not leak into the frame number.
    write_pagemap(
        pagemap,
        {
            host: PRESENT | 1 << 55 | 1 << 56 | 0x40000,
            host + HUGE: PRESENT | 0x40200,
            host + 2 * HUGE: PRESENT | 1 << 61 | 0x90000,
        },
    )
    assert pagemap_ranges(pagemap, host, 3 * HUGE, HUGE, PAGE) == (
        (0x40000 * PAGE, 2 * HUGE),
        (0x90000 * PAGE, HUGE),
    )


def test_pagemap_without_frame_numbers_explains_cap_sys_admin(tmp_path: Path) -> None:
    pagemap = tmp_path / "pagemap"
    write_pagemap(pagemap, {0x7F00_0000_0000: PRESENT})  # present, PFN hidden (zero)
    with pytest.raises(RigError, match="CAP_SYS_ADMIN"):
        pagemap_ranges(pagemap, 0x7F00_0000_0000, HUGE, HUGE, PAGE)


def test_pagemap_page_not_in_memory(tmp_path: Path) -> None:
    pagemap = tmp_path / "pagemap"
    write_pagemap(pagemap, {0x7F00_0000_0000: 0x1234})  # not present
    with pytest.raises(RigError, match="not in memory"):
        pagemap_ranges(pagemap, 0x7F00_0000_0000, HUGE, HUGE, PAGE)


def test_merge_joins_adjacent_runs_only() -> None:
    assert merge([(0, 4), (4, 4), (16, 4), (20, 1)]) == ((0, 8), (16, 5))


STATUS = "Name:\tpython\nVmLck:\t    1024 kB\nCapEff:\t0000000000000000\n"


def test_memlock_room_counts_what_is_locked() -> None:
    assert memlock_room(3 << 20, STATUS, 4 << 20)  # 1 MiB locked + 3 MiB fits 4 MiB
    assert not memlock_room((3 << 20) + 1, STATUS, 4 << 20)
    assert memlock_room(1 << 40, STATUS, resource.RLIM_INFINITY)
    # CAP_IPC_LOCK (bit 14) lifts the limit.
    assert memlock_room(1 << 40, STATUS.replace("0000000000000000", "0000000000004000"), 0)


def test_dma_memory_frees_once_and_tells_bus_addresses() -> None:
    freed = []
    m = DmaMemory(0x1000, 3 * HUGE, ((0x8000_0000, 2 * HUGE), (0x2_0000_0000, HUGE)),
                  lambda: freed.append(1))
    assert m.bus_address(0) == 0x8000_0000
    assert m.bus_address(2 * HUGE + 5) == 0x2_0000_0000 + 5
    with pytest.raises(ValueError):
        m.bus_address(3 * HUGE)
    m.free()
    m.free()
    assert freed == [1] and m.freed
    with pytest.raises(RigError):
        m.view()


def physical_machine(tmp_path: Path) -> Machine:
    return Machine(SysfsTransport(tmp_path, shares_memory=True))


def test_huge_page_allocation_reads_its_bus_addresses(
    tmp_path: Path, make_device: MakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = make_device()
    host = 0x7E00_0000_0000
    write_pagemap(
        tmp_path / "proc/self/pagemap", {host: PRESENT | 0x100000, host + HUGE: PRESENT | 0x300000}
    )
    calls: list[tuple[str, int, int, int]] = []

    def fake_mmap(addr: int, n: int, prot: int, flags: int, fd: int = -1, off: int = 0) -> int:
        calls.append(("mmap", addr, n, flags))
        return host

    monkeypatch.setattr(libc, "mmap", fake_mmap)
    monkeypatch.setattr(libc, "munmap", lambda a, n: calls.append(("munmap", a, n, 0)))
    with Function.take(physical_machine(tmp_path), dev.name) as f:
        m = f.alloc_dma(HUGE + 1)  # rounded up to two huge pages
        assert m is not None
        assert (m.host, m.length) == (host, 2 * HUGE)
        assert m.bus == ((0x100000 * PAGE, HUGE), (0x300000 * PAGE, HUGE))
        flags = calls[0][3]
        assert flags & libc.MAP_HUGETLB and flags & (63 << 26) == 21 << 26  # MAP_HUGE_2MB
        assert not flags & libc.MAP_FIXED
        with pytest.raises(Misuse):
            f.alloc_dma(HUGE, at=0x1000)  # not on a huge page's boundary
        with pytest.raises(RigError, match="maps_host is false"):
            f.map_host(0x10000, PAGE)
    assert calls[-1] == ("munmap", host, 2 * HUGE, 0)  # the release gave it back


def test_no_free_huge_page_is_none(
    tmp_path: Path, make_device: MakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = make_device()
    write_pagemap(tmp_path / "proc/self/pagemap", {})

    def no_huge_pages(*args: int) -> int:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    monkeypatch.setattr(libc, "mmap", no_huge_pages)
    with Function.take(physical_machine(tmp_path), dev.name) as f:
        assert f.alloc_dma(HUGE) is None


def test_freed_memory_at_a_reserved_address_is_reserved_again() -> None:
    # The real calls: reserve a range, place memory in it, give it back, find it reserved.
    n = 4 * PAGE
    flags = libc.MAP_PRIVATE | libc.MAP_ANONYMOUS
    base = libc.mmap(0, n, libc.PROT_NONE, flags | libc.MAP_NORESERVE)
    try:
        got = libc.mmap(base, n, libc.PROT_READ | libc.PROT_WRITE, flags | libc.MAP_FIXED)
        assert got == base
        view = libc.view(base, n)
        assert bytes(view) == bytes(n)
        view.release()
        libc.reserve(base, n)
        maps = Path("/proc/self/maps").read_text()
        line = next(line for line in maps.splitlines() if line.startswith(f"{base:x}-"))
        assert line.split()[1].startswith("---")  # inaccessible again
    finally:
        libc.munmap(base, n)
