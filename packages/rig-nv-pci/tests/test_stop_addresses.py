"""What a device's stop does with the process's addresses (rig_nv_pci.path.addresses), on the
simulated GA102. The Rig_nv_pci spec: "The GPUs' addresses and the process's addresses of
system memory coincide, from 64 GiB to Rig_nv.windows, which the process reserves at its first
open; every GPU it opens takes its addresses from that range. A device's stop gives back every
address its open took, once the GPU's memory regions are freed, unless the GPU stopped
answering (Rig_nv.stop), which keeps the addresses the GPU may still reach."

rig_nv's Device.stop frees the memory only once the RM freed the channels ("otherwise the GPU
may still reach it, and it stays with the process"); the PCI path gives a region's GPU
addresses back in its free_memory (rig_nv_pci.path.pci.PciPath.free_memory, step "va"), so
addresses the stop did not free stay taken from the process's range for good."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import (
    BUS,
    Opened,
    Span,
    TakenSim,
    all_reserved,
    alloc_each,
    bar1_window,
    give_back_for_good,
    given_back,
    gsp_goes_silent,
    none_free,
    opener,
    simulated_ga102,
    spans,
)

import rig_nv_pci
from rig_edge import Memory, Region
from rig_nv import Device
from rig_nv.hostmem import view
from rig_nv_pci import held
from rig_nv_pci.boot.stop import StopError
from rig_nv_pci.path import addresses
from rig_pci.testing import inaccessible


def is_free(at: int, n: int) -> bool:
    """Whether ``[at, at + n)`` lies in one free run of the process's range."""
    return any(lo <= at and at + n <= lo + size for lo, size in addresses.PROCESS.free)


def meets(a: Region, taken: list[Span]) -> bool:
    return any(a.gpu < at + n and at < a.gpu + a.length for at, n, _ in taken)


def test_a_stop_gives_back_every_address_and_the_next_open_takes_the_same_ones(
    ga102: Opened,
) -> None:
    """After a normal stop every address the open took (its regions' of every kind and the
    device's own) is free in the process's range again and reserved in the process
    (PROT_NONE, nothing mapped: /proc/self/maps); the next open, allocating as the first did,
    gets the very same addresses."""
    before = addresses.PROCESS.addresses().free
    assert all_reserved(before)
    firsts: list[list[Span]] = []
    for _ in (1, 2):
        d = ga102.open()
        try:
            regions = alloc_each(d)
            taken = spans(d)
            assert none_free(taken) and addresses.PROCESS.free != before
            for r in regions:  # while held: Pinned memory and Mapped's BAR 1 window lie there
                size = d.memory.regions()[r].length
                if r.kind is Memory.PINNED:
                    assert r.host == r.gpu and not inaccessible(r.gpu, r.gpu + size)
                    view(r.host, 8)[:] = b"pinned!!"
                elif r.kind is Memory.MAPPED:
                    assert bar1_window(r.gpu, r.gpu + size)
        finally:
            d.stop()
        assert ga102.stops[-1] is None
        assert addresses.PROCESS.free == before and all_reserved(before)
        assert all(inaccessible(at, at + n) for at, n, _ in taken)
        firsts.append(taken)
    assert firsts[1] == firsts[0]  # first fit from the same free range: the same addresses


def test_a_region_freed_before_the_stop_gives_its_addresses_back_at_once(
    ga102: Opened,
) -> None:
    """A Pinned or Mapped region's free, and a Device region's larger than the device's
    cache keeps (Device.cache_limit), give its addresses back at once, reserved again; a
    Device region within the limit is kept by the device for the next allocation of its
    size (rig_nv's Device.free) and its addresses come back with Device.trim (or the stop),
    not before."""
    d = ga102.open()
    try:
        took = addresses.PROCESS.free
        for kind in (Memory.PINNED, Memory.MAPPED):
            for n in (0x3000, 3 << 20):
                r = d.alloc(n, kind)
                assert r is not None
                size = d.memory.regions()[r].length
                assert not is_free(r.gpu, size)
                d.free(r)
                assert addresses.PROCESS.free == took and inaccessible(r.gpu, r.gpu + size)
        d.cache_limit = 4 << 20
        large = d.alloc(8 << 20, Memory.DEVICE)
        assert large is not None and not is_free(large.gpu, large.length)
        d.free(large)
        assert addresses.PROCESS.free == took
        small = d.alloc(0x3000, Memory.DEVICE)
        assert small is not None
        size = d.memory.regions()[small].length
        d.free(small)
        assert not is_free(small.gpu, size)  # kept for reuse by the device
        again = d.alloc(0x3000, Memory.DEVICE)
        assert again is not None and again.gpu == small.gpu  # the same memory, reused
        d.free(again)
        d.trim()
        assert addresses.PROCESS.free == took and inaccessible(small.gpu, small.gpu + size)
    finally:
        d.stop()


def stop_silent(d: Device) -> None:
    """The stop of a device whose GSP stopped answering: it returns (the GPU is lost, reported
    to the opener, which resets it at its next open: rig_nv_pci.path.rm.PciRM.free_at_stop), having
    stopped the GSP all the same (on_stopped ran), the first FREE that timed out taking the
    GSP as gone, so that no later RPC was sent (rig_nv_pci.gsp.rpc.Rpc.silent); a second stop
    does nothing."""
    d.stop()
    assert isinstance(d.path, held.PciPath)
    silent = d.path.rm.rpc_rm.rpc.silent  # the first RPC after the GSP went quiet
    assert silent is not None and re.fullmatch(r"(\w+) \(the GSP sent no \1 for \1 in time\)",
                                               silent)
    d.stop()


@pytest.mark.parametrize("after_frees", [0, 3], ids=["before-stop", "during-stop"])
def test_a_gpu_that_stopped_answering_keeps_the_addresses_it_may_still_reach(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_frees: int,
) -> None:
    """The GSP stops answering before the stop, or after the stop's first frees were answered:
    the RM did not free the channels, so the stop frees none of the device's memory. Every
    address its memory took (Pinned, Mapped and Device regions, the device's own) stays out of
    the process's range, and the Pinned pages stay mapped where the GPU writes them: another
    simulated GPU's open and allocations, and the next open of this one, take none of them.
    The stop still gives the function and the lock back, the GPU is lost, and its next open
    resets it first; that open's own stop gives back what it took."""
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    before = addresses.PROCESS.addresses().free
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    regions = alloc_each(d)
    taken = spans(d)
    try:
        pinned = [r for r in regions if r.kind is Memory.PINNED]
        for r in pinned:
            view(r.host, 8)[:] = b"pinned!!"
        gsp_goes_silent(ga102, d, monkeypatch, after_frees=after_frees)
        took = addresses.PROCESS.free
        stop_silent(d)
        assert takes[-1].closed and rig_nv_pci.opener.lost(machine, BUS)
        assert not takes[-1].bus_mastering  # before its release freed its DMA memory
        given_back(machine, BUS)
        # no address given back: neither its regions' nor the path's own (its context
        # buffers' GPU mappings)
        assert addresses.PROCESS.free == took and none_free(taken)
        # still the process's memory, where the GPU may still write were its bus mastering
        # on again (the stop turned it off; the next holder turns it on)
        ga102.rig.gpu.command |= 0x4
        for r in pinned:
            assert not inaccessible(r.host, r.host + 8) and bytes(view(r.host, 8)) == b"pinned!!"
            ga102.sim_rm.write(r.gpu, b"late DMA")
            assert bytes(view(r.host, 8)) == b"late DMA"
        # another GPU of the process takes its addresses around the kept ones
        second = simulated_ga102(tmp_path / "second")
        try:
            d2 = second.open()
            try:
                assert not any(meets(r, taken) for r in alloc_each(d2))
                assert not any(meets(Region(at, None, n, k), taken) for at, n, k in spans(d2))
            finally:
                d2.stop()
        finally:
            second.sim_rm.stop()
        assert second.stops == [None] and none_free(taken)
        # the lost GPU's next open resets it first (which ends the silent GSP-RM and all it
        # held; its boot builds BAR 1's tables anew: sim/gpu.py SimGpu.reset), and takes
        # none of the kept addresses
        kept = addresses.PROCESS.free
        d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
        try:
            assert takes[-1].resets == 1 and not rig_nv_pci.opener.lost(machine, BUS)
            assert not any(meets(r, taken) for r in alloc_each(d))
        finally:
            d.stop()
        assert not rig_nv_pci.opener.lost(machine, BUS) and addresses.PROCESS.free == kept
        assert not takes[-1].bus_mastering  # every stop turns it off before the release
    finally:
        give_back_for_good(before)
    assert addresses.PROCESS.free == before and all_reserved(before)


def test_a_lost_stop_stops_the_gpus_dma_before_the_function_frees_its_memory(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Releasing the function frees every DMA memory it gave (rig_pci.Function.close: the
    Pinned regions the stop kept and the GSP's own memory too), which, taken physically, goes
    back to the system as 2 MiB huge pages: a GPU that stopped answering may still write
    there. So the lost GPU's bus mastering goes off first (PCI's Bus Master Enable, command
    register bit 2: the function then issues no memory requests), as rig_pci's reset turns it
    off before a reset; the stop's addresses stay kept. A stop that unloaded the GSP turns it
    off before the release too, as Linux's pci_disable_device does when a driver lets a
    function go (the next open turns it on again)."""
    machine, _ = opener(ga102, tmp_path, monkeypatch)
    order: list[str] = []
    monkeypatch.setattr(TakenSim, "bus_master",
                        lambda self, on: order.append(f"bus master {'on' if on else 'off'}"))

    def close(self: TakenSim) -> None:  # as rig_pci.Function.close frees its DMA memory
        self.closed = True
        order.append("DMA memory freed")

    monkeypatch.setattr(TakenSim, "close", close)
    before = addresses.PROCESS.addresses().free
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    d.stop()
    # the open turned bus mastering on before its boot (held.open_device)
    assert order == ["bus master on", "bus master off", "DMA memory freed"]
    assert not rig_nv_pci.opener.lost(machine, BUS)
    order.clear()
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    r = d.alloc(0x3000, Memory.PINNED)
    assert r is not None
    taken = spans(d)
    try:
        gsp_goes_silent(ga102, d, monkeypatch, after_frees=0)
        stop_silent(d)
        assert order == ["bus master on", "bus master off", "DMA memory freed"]
        assert rig_nv_pci.opener.lost(machine, BUS) and none_free(taken)
    finally:
        give_back_for_good(before)


def test_the_stop_error_of_a_silent_gsp_is_the_lost_one(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through held.open_device: the stop of a device whose GSP stopped answering calls
    on_stopped with a StopError that is ``lost`` (the GSP's firmware may still be loaded),
    which is what marks the GPU lost for the opener; the addresses stay kept."""
    before = addresses.PROCESS.addresses().free
    d = ga102.open()
    alloc_each(d)
    taken = spans(d)
    try:
        gsp_goes_silent(ga102, d, monkeypatch, after_frees=0)
        stop_silent(d)
        (failure,) = ga102.stops
        assert isinstance(failure, StopError) and failure.lost
        assert any(s.startswith("UNLOADING_GUEST_DRIVER: not sent") for s in failure.steps)
        assert none_free(taken)
    finally:
        give_back_for_good(before)
