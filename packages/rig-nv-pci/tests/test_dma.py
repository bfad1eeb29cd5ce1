"""Device.dma on the PCI path, on the simulated GA102 (the Rig_nv_pci spec: "Rig_nv.dma gives
another function, such as a NIC that a process drives over PCI, a region's bus ranges
(Rig_edge.dma.Bus), or the reason it cannot reach them, as Rig_pci.Memory.bus states: GPU
memory through BAR 1, the memory BAR. The region's memory and the GPU then stay the process's
until it exits, so no later open of the GPU, in this process or another, succeeds
meanwhile.").

Every bus range is checked against the simulated GPU itself: GPU memory is read back through
the simulated BAR 1 at the range's offset from BAR 1's bus address (the simulated GPU shows a
BAR 1 offset only as the BAR 1 page tables under GSP-RM's root map it, to video memory GSP-RM
holds), system memory at the range's bus addresses in the simulated host's DMA memory; the
bytes there are those the simulated copy engine wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import BUS, Opened, attach_on, detach_on, opener

import rig_nv_pci
from rig_edge import Bus, Memory, Misuse, OpenRefused, Region, RigError
from rig_nv import Device
from rig_nv_pci import lock
from rig_nv_pci.path.pci import PciPath


def path_of(d: Device) -> PciPath:
    assert isinstance(d.path, PciPath)
    return d.path


def through_bar1(ga102: Opened, bus: Bus) -> bytes:
    """The bytes at ``bus``'s ranges, read through the simulated BAR 1 from its bus address."""
    base = ga102.rig.gpu.bar1_address
    assert bus.reason is None and bus.ranges
    return b"".join(bytes(ga102.sim_rm.bar(1, address - base, n)) for address, n in bus.ranges)


def in_host_memory(ga102: Opened, bus: Bus) -> bytes:
    """The bytes at ``bus``'s ranges in the simulated host's DMA memory, by bus address."""
    assert bus.reason is None and bus.ranges
    return b"".join(ga102.rig.gpu.host.read(address, n) for address, n in bus.ranges)


def filled(d: Device) -> tuple[dict[Memory, Region], bytes]:
    """A region of each kind holding the same random bytes: uploaded into Device memory (the
    simulated copy engine writes them from staging), then copied by the copy engine into the
    Mapped and the Pinned region."""
    data = os.urandom(0x5000)
    regions = {kind: d.alloc(len(data), kind) for kind in Memory}
    device, mapped, pinned = (regions[k] for k in (Memory.DEVICE, Memory.MAPPED, Memory.PINNED))
    assert device is not None and mapped is not None and pinned is not None
    d.upload(device, data).wait(timeout_s=5.0)
    d.copy(mapped, device, engine="copy")
    d.copy(pinned, device, engine="copy").wait(timeout_s=5.0)
    return {k: r for k, r in regions.items() if r is not None}, data


def test_bus_ranges_of_each_kind_are_where_the_simulated_gpu_shows_the_memory(
    ga102: Opened,
) -> None:
    """Mapped memory at BAR 1's bus address + its BAR 1 offset; Device memory mapped into
    BAR 1 first (elsewhere in it); Pinned memory at its DMA memory's bus addresses. The bytes
    the device wrote are there; what the GPU writes later shows there too (the memory itself,
    not a copy)."""
    d = ga102.open()
    g = ga102.rig.gpu
    try:
        regions, data = filled(d)
        got = {kind: d.dma(r) for kind, r in regions.items()}
        for kind, bus in got.items():
            assert isinstance(bus, Bus) and bus.reason is None, (kind, bus)
            assert sum(n for _, n in bus.ranges) == regions[kind].length
        mapped, device, pinned = (d.memory.regions()[regions[k]]
                                  for k in (Memory.MAPPED, Memory.DEVICE, Memory.PINNED))
        # what the path says of each: BAR 1 offsets and the DMA memory's bus address
        assert got[Memory.MAPPED].ranges == ((g.bar1_address + mapped.undo.bar1, 0x5000),)
        assert device.undo.bar1 is not None and device.undo.bar1 != mapped.undo.bar1
        assert got[Memory.DEVICE].ranges == ((g.bar1_address + device.undo.bar1, 0x5000),)
        assert got[Memory.PINNED].ranges == ((pinned.undo.dma.bus, 0x5000),)
        # and what the simulated GPU shows there
        assert through_bar1(ga102, got[Memory.MAPPED]) == data
        assert through_bar1(ga102, got[Memory.DEVICE]) == data
        assert in_host_memory(ga102, got[Memory.PINNED]) == data
        again = os.urandom(0x5000)
        d.upload(regions[Memory.DEVICE], again).wait(timeout_s=5.0)
        d.copy(regions[Memory.PINNED], regions[Memory.DEVICE], engine="copy").wait(
            timeout_s=5.0)
        assert through_bar1(ga102, got[Memory.DEVICE]) == again
        assert in_host_memory(ga102, got[Memory.PINNED]) == again
        # a second dma of a region answers the same ranges (one BAR 1 mapping)
        assert d.dma(regions[Memory.DEVICE]) == got[Memory.DEVICE]
        assert sorted(a.handle for a in path_of(d).kept) == sorted(
            a.handle for a in (mapped, device, pinned))
    finally:
        d.stop()
    # the stop kept the GPU: the GSP runs on, nothing was given back, BAR 1 still shows it
    assert ga102.kept == 1 and ga102.stops == [] and not ga102.firmware.suspended
    assert through_bar1(ga102, got[Memory.DEVICE]) == again
    assert in_host_memory(ga102, got[Memory.PINNED]) == again
    assert through_bar1(ga102, got[Memory.MAPPED]) == data
    held = ga102.sim_rm
    assert mapped.handle in held.fbmem and device.handle in held.fbmem
    assert pinned.handle in held.sysmem and not pinned.undo.dma.freed


def test_a_region_freed_after_dma_keeps_its_memory(ga102: Opened) -> None:
    """The spec: the region's memory stays the process's. Its free gives nothing back: the
    simulated GSP-RM still holds its memory object, BAR 1 still shows it, the path's heap
    does not hand its video memory out again and the device does not keep it for reuse; the
    region is no longer the device's (a later dma or free of it is Misuse)."""
    d = ga102.open()
    try:
        regions, data = filled(d)
        got = {kind: d.dma(r) for kind, r in regions.items()}
        allocations = {kind: d.memory.regions()[r] for kind, r in regions.items()}
        for r in regions.values():
            d.free(r)
        for kind, a in allocations.items():
            assert a.held
            objects = ga102.sim_rm.sysmem if kind is Memory.PINNED else ga102.sim_rm.fbmem
            assert a.handle in objects, kind
        assert through_bar1(ga102, got[Memory.DEVICE]) == data
        assert through_bar1(ga102, got[Memory.MAPPED]) == data
        assert in_host_memory(ga102, got[Memory.PINNED]) == data
        assert d.memory.kept() == []  # not kept for reuse: another alloc would get this memory
        fresh = d.alloc(0x5000, Memory.DEVICE)
        assert fresh is not None
        assert d.memory.regions()[fresh].undo.fb != allocations[Memory.DEVICE].undo.fb
        for r in regions.values():
            with pytest.raises(Misuse, match="not a live region"):
                d.dma(r)
            with pytest.raises(Misuse, match="not a live region"):
                d.free(r)
    finally:
        d.stop()
    assert ga102.kept == 1 and ga102.stops == []
    assert through_bar1(ga102, got[Memory.DEVICE]) == data


def test_a_region_not_the_devices_is_misuse_and_holds_nothing(ga102: Opened) -> None:
    """As on every path: a freed region, or one the device never made, is Misuse, and nothing
    is kept; the stop stops the GSP as usual."""
    d = ga102.open()
    try:
        r = d.alloc(0x1000, Memory.DEVICE)
        assert r is not None
        d.free(r)
        with pytest.raises(Misuse, match="not a live region"):
            d.dma(r)
        with pytest.raises(Misuse, match="another device's"):
            d.dma(Region(0x7F_0000_0000, None, 0x1000, Memory.MAPPED))
        assert path_of(d).kept == []
    finally:
        d.stop()
    assert ga102.stops == [None] and ga102.kept == 0 and ga102.firmware.suspended


def test_behind_an_iommu_the_reason_comes_back_and_nothing_is_kept(ga102: Opened) -> None:
    """A GPU taken through VFIO: its BAR and its DMA memory's addresses are its own IOMMU
    domain's (rig_pci.memory.bus and dma_bus say so); Device memory's BAR 1 mapping is made
    and undone again, and the stop gives everything back."""
    ga102.function.maps_host = True
    d = ga102.open()
    try:
        regions, _ = filled(d)
        path = path_of(d)
        bar1_free = list(path.bar1.offsets.free)
        for kind, r in regions.items():
            bus = d.dma(r)
            assert isinstance(bus, Bus) and bus.ranges == ()
            assert bus.reason is not None and "taken through VFIO" in bus.reason, kind
            assert "IOMMU" in bus.reason
        assert d.memory.regions()[regions[Memory.DEVICE]].undo.bar1 is None
        assert path.bar1.offsets.free == bar1_free and path.kept == []
        for r in regions.values():
            d.free(r)
    finally:
        d.stop()
    assert ga102.stops == [None] and ga102.kept == 0
    assert ga102.sim_rm.fbmem == {} and ga102.sim_rm.sysmem == {}


def test_device_memory_bar1_has_no_room_for_is_a_reason(ga102: Opened) -> None:
    """BAR 1 taken whole (as by other Mapped memory): Device memory cannot be mapped into it,
    and the reason says so; nothing is kept."""
    d = ga102.open()
    try:
        r = d.alloc(4 << 20, Memory.DEVICE)
        assert r is not None
        path = path_of(d)
        rest = path.bar1.offsets.free  # the rest of BAR 1, taken as other Mapped memory
        path.bar1.offsets.free = []
        assert d.dma(r) == Bus(reason="GPU 0: BAR 1 has no room for 0x400000 bytes of "
                               "Device memory")
        path.bar1.offsets.free = rest
        assert d.memory.regions()[r].undo.bar1 is None and path.kept == []
        d.free(r)
    finally:
        d.stop()
    assert ga102.stops == [None] and ga102.kept == 0


def test_after_dma_the_gpu_stays_the_processs_and_no_open_succeeds(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the opener: the stop of a device whose dma gave bus ranges keeps the function
    (not released: its DMA memory and windows stay) and the GPU's lock; a later open, reset,
    detach or attach in this process is refused naming why, and another process cannot take
    the GPU's lock file."""
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        r = d.alloc(0x2000, Memory.MAPPED)
        assert r is not None
        bus = d.dma(r)
        assert isinstance(bus, Bus) and bus.ranges
    finally:
        d.stop()
    try:
        assert not takes[-1].closed and lock.held(machine, BUS)
        assert not ga102.firmware.suspended and ga102.firmware.boots == 1
        why = "this process keeps it: another device was given the bus ranges of its memory"
        with pytest.raises(OpenRefused, match=f"GPU 0 of .*{why}"):
            rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
        with pytest.raises(RigError, match=why):
            rig_nv_pci.reset(0, machine)
        writes = list(machine.sysfs.writes)  # type: ignore[attr-defined]
        # the spec: each refuses it
        for change in (detach_on, attach_on):
            with pytest.raises(RigError, match=f"GPU 0 of .*{why}"):
                change(machine, 0)
        assert machine.sysfs.writes == writes  # type: ignore[attr-defined]
        assert len(takes) == 1 and ga102.firmware.boots == 1  # refused before touching it
        # another process: the GPU's lock file stays locked (BusLock.take's flock fails)
        probe = ("import fcntl, os, sys\n"
                 "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                 "try:\n"
                 "    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                 "except BlockingIOError:\n"
                 "    sys.exit(3)\n")
        result = subprocess.run([sys.executable, "-c", probe, str(lock.path(machine, BUS))])
        assert result.returncode == 3
    finally:
        for _, held in rig_nv_pci.opener._kept.values():  # the test's process lives on
            held.release()
