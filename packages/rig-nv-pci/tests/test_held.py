"""rig_nv_pci.held: the open after its preconditions, on the simulated GA102 behind a stand-in
of a taken function: firmware images parsed, the FB size read, the GSP booted, a device made
that runs its first submissions; its stop stops the GSP, and the GPU opens again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sim
from sim import gmmu
from sim.gsp_rm import SimRm
from support import (
    BUS,
    FB_SIZE,
    GB202_CLASSES,
    UNLOAD_UCODE_ID,
    Opened,
    SimFunction,
    all_reserved,
    bar1_window,
    every_use_is_lost,
    gb202_files,
    given_back,
    opener,
    reopens,
    simulated_ga102,
)

import rig_nv_pci
import rig_pci.driver
from rig_edge import Fault, Lost, Memory, OpenRefused, Refusal, Region, RigError
from rig_nv.hostmem import view
from rig_nv.setup import WINDOWS
from rig_nv_pci import held, lock
from rig_nv_pci.firmware import chips
from rig_nv_pci.path import addresses
from rig_pci import Window, libc
from rig_pci.testing import inaccessible


def test_the_open_boots_the_gsp_and_makes_a_device_and_its_stop_stops_the_gsp(
    ga102: Opened,
) -> None:
    for round in (1, 2):
        d = ga102.open()
        g = ga102.rig.gpu
        assert ga102.firmware.boots == round and ga102.firmware.failure is None
        assert d.facts.arch == "sm_86" and d.facts.bus == BUS and d.completed() == 2
        # the bootloader's appVersion went to NV_PGSP_FALCON_OS after booter_load
        assert g.gsp.read(g.gsp.base + 0x080) == 0x5701
        d.stop()
        assert ga102.stops == [None] * round
        assert ga102.firmware.suspended and not ga102.rig.gpu.wpr2_up()
        assert f"hs run ucode {UNLOAD_UCODE_ID}" in g.sec2.log


@pytest.mark.parametrize("notifiers", [True, False], ids=["notified", "event-only"])
def test_a_compute_launch_the_gsp_stopped_is_a_fault_from_its_rc_triggered(
    ga102: Opened, notifiers: bool,
) -> None:
    """rig's copy kernels are a compute launch, which the simulated GPU does not run: GSP-RM
    stops the group (writing its error notifiers, or not, as with confidential computing) and
    posts RC_TRIGGERED, which the device raises from its wait as a Fault naming the Xid, its
    channel and the engine; every later use is Lost, the stop gives the GPU back, and it opens
    again."""
    ga102.sim_rm.notifiers = notifiers
    d = ga102.open()
    try:
        a, b = d.alloc(2 << 20), d.alloc(2 << 20)
        assert a is not None and b is not None
        with pytest.raises(Fault) as e:
            d.copy(a, b).wait(timeout_s=5.0)
        assert e.value.channel_error == ("ROBUST_CHANNEL_GR_EXCEPTION (Xid 13) on the compute "
                                         "channel")
        assert e.value.engine == "graphics/compute" and e.value.address is None
        every_use_is_lost(d, a)
    finally:
        d.stop()  # its RPCs read what the GSP sent meanwhile
    assert ga102.stops == [None] and ga102.sim_rm.channels == {}
    assert isinstance(d.path, held.PciPath) and d.path.events is not None
    assert "RC_TRIGGERED: ROBUST_CHANNEL_GR_EXCEPTION (Xid 13) on channel 1" in (
        d.path.events.text())
    reopens(ga102)


def test_a_copy_from_an_address_nothing_maps_is_a_fault_naming_it(ga102: Opened) -> None:
    """The copy engine reads a page whose mapping the test took away behind the device: the
    simulated MMU faults, GSP-RM stops the group and posts RC_TRIGGERED with the page's address
    and the fault type, then MMU_FAULT_QUEUED; the device's wait raises the Fault with them."""
    d = ga102.open()
    try:
        src, dst = d.alloc(0x11000), d.alloc(0x11000)
        assert src is not None and dst is not None
        assert isinstance(d.path, held.PciPath) and d.path.space.tables is not None
        d.path.space.tables.unmap(src.gpu + 0x3000, 0x1000, huge=False)
        with pytest.raises(Fault) as e:
            d.copy(dst, src, engine="copy").wait(timeout_s=5.0)
        f = e.value
        assert f.channel_error == ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31) on the copy "
                                   "channel: FAULT_PTE")  # the page table stays, its PTE not
        # the copy channel's own group runs on the copy engine rig_nv.engines picked, its
        # ChID the first of that engine's runlist
        lce = d.copy_engine
        assert isinstance(lce, int) and lce != 0
        assert f.address == src.gpu + 0x3000 and f.engine == f"copy engine {lce}"
        assert f.access is None  # the event carries no access type; a PTE fault implies none
        assert ga102.sim_rm.faults == [f"channel 1: 0x{src.gpu + 0x3000:x}: PTE 0x0 is not valid"]
        every_use_is_lost(d, dst)
        with pytest.raises(Fault, match="FAULT_PTE"):  # the first cause, kept
            d.sleep(0.0)
    finally:
        d.stop()
    events = d.path.events
    assert events is not None and events.text(2).splitlines() == [
        f"RC_TRIGGERED: ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31) on channel 1 of copy "
        f"engine {lce} at 0x{src.gpu + 0x3000:x}", "MMU_FAULT_QUEUED"]
    assert ga102.stops == [None]
    reopens(ga102)


def test_an_rc_triggered_for_a_channel_not_the_devices_changes_nothing(ga102: Opened) -> None:
    """GSP-RM's own channels, another function's (gfid not 0): kept as lines only."""
    d = ga102.open()
    try:
        peer = ga102.firmware.peer
        compute = ga102.sim_rm.chid(d.compute.handle)
        ga102.sim_rm.event(0x1004, peer.rc_triggered(compute + 40, xid=13))
        ga102.sim_rm.event(0x1004, peer.rc_triggered(compute, xid=13, gfid=1))
        d.sleep(0.0)
        a = d.alloc(0x1000, Memory.PINNED)
        assert a is not None
        d.upload(a, b"still")
        d.copy(a, a, engine="copy").wait(timeout_s=5.0)
        assert bytes(d.download(a, 5)) == b"still"
    finally:
        d.stop()


def test_a_lockdown_notice_loses_the_device(ga102: Opened) -> None:
    """GSP_LOCKDOWN_NOTICE engaging: the device's next sleep (or wait) raises Lost, not a
    Fault, and the device stays lost after lockdown is released; the GPU opens again."""
    d = ga102.open()
    try:
        region = d.alloc(0x1000)
        assert region is not None
        peer = ga102.firmware.peer
        ga102.sim_rm.event(0x101C, peer.lockdown_notice(True))
        with pytest.raises(Lost, match="the GSP engaged lockdown") as e:
            d.sleep(0.0)
        assert not isinstance(e.value, Fault)
        ga102.sim_rm.event(0x101C, peer.lockdown_notice(False))
        every_use_is_lost(d, region)
    finally:
        d.stop()
    assert ga102.stops == [None]
    reopens(ga102)


def test_no_fb_size_is_refused_before_the_boot(ga102: Opened) -> None:
    ga102.rig.gpu.usable_fb_mib = 0
    with pytest.raises(RigError, match="GPU 0: NV_USABLE_FB_SIZE_IN_MB reads 0x0"):
        ga102.open()
    assert ga102.firmware.boots == 0


def test_an_image_not_laid_out_as_its_format_says_is_named(ga102: Opened) -> None:
    bootloader = ga102.files["nvidia/ga102/gsp/bootloader-570.144.bin"]
    Path(bootloader).write_bytes(b"\x00" * 64)
    chip = chips.identify(ga102.rig.gpu.boot42)
    with pytest.raises(RigError, match=f"not laid out as its format says: {bootloader}: "
                       "nvfw_bin_hdr magic 0x0, not 0x10de"):
        held.read_images(chip, ga102.files)


# ---- the process's addresses (rig_nv_pci.path.addresses) ------------------------------------


def overlaps(a: Region, b: Region) -> bool:
    return a.gpu < b.gpu + b.length and b.gpu < a.gpu + a.length


def test_pinned_memory_lies_at_one_address_for_the_process_and_the_gpu(ga102: Opened) -> None:
    """The spec: the GPU's and the process's addresses of system memory coincide, from 64 GiB
    to Rig_nv.windows, which the first open reserves. Pinned memory (the device's own too:
    its timeline) lies at its GPU address in the process; every region's GPU address lies in
    the range; what the host writes there the simulated GPU reads at the same address."""
    d = ga102.open()
    try:
        assert addresses.PROCESS.reserved
        pinned, mapped, device = (d.alloc(0x3000, Memory.PINNED), d.alloc(0x3000, Memory.MAPPED),
                                  d.alloc(0x3000, Memory.DEVICE))
        assert pinned is not None and mapped is not None and device is not None
        assert pinned.host == pinned.gpu and d.timeline.host == d.timeline.gpu
        for r in (pinned, mapped, device):
            assert r.gpu >= addresses.LOW and r.gpu + r.length <= WINDOWS
        view(pinned.host + 0x1FF8, 16)[:] = bytes(range(16))  # across a page
        assert ga102.sim_rm.read(pinned.gpu + 0x1FF8, 16) == bytes(range(16))
        ga102.sim_rm.write(pinned.gpu + 0x2000, b"the GPU")
        assert bytes(view(pinned.host + 0x2000, 7)) == b"the GPU"
        d.copy(device, pinned, engine="copy").wait(timeout_s=5.0)
        assert bytes(d.download(device, 16, 0x1FF8)) == bytes(range(8)) + b"the GPU\x0f"
    finally:
        d.stop()


def test_mapped_memory_lies_at_its_gpu_address_through_bar_1(ga102: Opened) -> None:
    """DESIGN: Pinned and Mapped memory lie at the same address for host and GPU. A Mapped
    region's BAR 1 window is mapped at its GPU address, over the process's reservation: what
    the host writes there is the GPU's memory, which the GPU reads at the same address and
    another device reaches through BAR 1, and what the GPU writes the host reads there. Its
    free puts the reservation back, as the device's stop does for the rest."""
    before = addresses.PROCESS.addresses().free
    assert all_reserved(before)
    d = ga102.open()
    g, s = ga102.rig.gpu, ga102.sim_rm
    try:
        small, large = d.alloc(0x3000, Memory.MAPPED), d.alloc(3 << 20, Memory.MAPPED)
        device = d.alloc(3 << 20, Memory.DEVICE)
        assert small is not None and large is not None and device is not None
        for r in (small, large):
            a = d.memory.regions()[r]  # the path's allocation: its size, its BAR 1 offset
            assert r.host == r.gpu == a.host and addresses.LOW <= r.gpu < WINDOWS
            assert bar1_window(r.gpu, r.gpu + a.length)
            # host -> GPU: the bytes the host writes at the address are the GPU's memory
            data = os.urandom(r.length)
            view(r.host, r.length)[:] = data
            assert a.undo.bar1 is not None
            for off in (0, 0x1000, r.length - 0x1000):
                page = data[off:off + 0x1000]
                assert s.read(r.gpu + off, 0x1000) == page  # the GPU's MMU, same address
                bar1 = s.bar1.request(g.bar1_address + a.undo.bar1 + off, 0x1000)
                assert bar1 is not None and bytes(bar1) == page  # through BAR 1's tables
            d.copy(device, r, engine="copy").wait(timeout_s=5.0)
            assert bytes(d.download(device, r.length)) == data
            # GPU -> host: what the copy engine and the GPU write, the host reads there
            back = os.urandom(device.length)
            d.upload(device, back).wait(timeout_s=5.0)
            d.copy(r, device, r.length, engine="copy").wait(timeout_s=5.0)
            assert bytes(view(r.host, r.length)) == back[:r.length]
            s.write(r.gpu + 0x10, b"the GPU")
            assert bytes(view(r.host + 0x10, 7)) == b"the GPU"
            assert bytes(d.download(r, 7, 0x10)) == b"the GPU"
        # the free puts the reservation back over the region, at once
        size, kept = d.memory.regions()[small].length, d.memory.regions()[large].length
        d.free(small)
        assert inaccessible(small.gpu, small.gpu + size)
        assert bar1_window(large.gpu, large.gpu + kept)  # the other region's, untouched
    finally:
        d.stop()
    # the stop frees the rest: every address the open took is given back, reserved
    assert addresses.PROCESS.free == before and all_reserved(before)


def test_a_mapped_window_the_process_cannot_place_leaves_the_range_as_it_was(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """BAR 1 refused at the region's GPU address (as rig_pci.Function.window refuses one):
    the allocation raises that refusal, and the GPU's memory, BAR 1 and the addresses are
    given back, the range reserved as before."""
    before = addresses.PROCESS.addresses().free
    d = ga102.open()
    try:
        took = addresses.PROCESS.free
        heap, bar1 = list(d.path.heap.free), list(d.path.bar1.offsets.free)

        def refused(*args: object, at: int | None = None, **kwargs: object) -> Window:
            if at is None:
                return SimFunction.window(ga102.function, *args, **kwargs)  # type: ignore[arg-type]
            raise RigError(f"BAR 1: cannot be mapped at 0x{at:x}")

        monkeypatch.setattr(ga102.function, "window", refused)
        with pytest.raises(RigError, match="BAR 1: cannot be mapped at 0x"):
            d.alloc(0x3000, Memory.MAPPED)
        assert addresses.PROCESS.free == took and all_reserved(took)
        assert list(d.path.heap.free) == heap and list(d.path.bar1.offsets.free) == bar1
    finally:
        d.stop()
    assert addresses.PROCESS.free == before and all_reserved(before)


def test_two_gpus_take_their_addresses_from_one_range_and_a_stop_gives_them_back(
    ga102: Opened, tmp_path: Path,
) -> None:
    """Every GPU the process opens takes its addresses from the one range, so no two of its
    regions share one; each device's stop gives back every address its open took."""
    before = addresses.PROCESS.addresses().free
    second = simulated_ga102(tmp_path / "second")
    try:
        d1, d2 = ga102.open(), second.open()
        try:
            regions = [r for d in (d1, d2) for kind in Memory
                       for r in (d.alloc(0x3000, kind), d.alloc(3 << 20, kind))
                       if r is not None]
            assert len(regions) == 12
            assert not any(overlaps(a, b) for i, a in enumerate(regions)
                           for b in regions[i + 1:])
            assert not overlaps(Region(d1.timeline.gpu, None, 4096, Memory.PINNED),
                                Region(d2.timeline.gpu, None, 4096, Memory.PINNED))
            assert addresses.PROCESS.free != before
        finally:
            d1.stop()
            d2.stop()
    finally:
        second.sim_rm.stop()
    assert addresses.PROCESS.free == before


def test_an_open_is_refused_when_the_processs_addresses_cannot_be_reserved(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Something of the process mapped in the range (as a kernel-path open's reservation from
    384 GiB would be): the open is refused naming the range, before the GPU is touched."""
    size = 4 << 20
    low = libc.mmap(0, size, libc.PROT_NONE,
                    libc.MAP_PRIVATE | libc.MAP_ANONYMOUS | libc.MAP_NORESERVE)
    try:
        monkeypatch.setattr(addresses, "PROCESS", addresses.Reservation(low, low + size))
        with pytest.raises(RigError, match=rf"GPU 0: the process's addresses from 0x{low:x} to "
                           rf"0x{low + size:x} cannot be reserved \(File exists\)"):
            ga102.open()
        assert ga102.firmware.boots == 0 and ga102.rig.gpu.reads == []
        assert not addresses.PROCESS.reserved
    finally:
        libc.munmap(low, size)
    reserved = addresses.PROCESS.addresses()  # once nothing is there
    assert reserved.take(0x1000, 0x1000) == low
    reserved.give(low, 0x1000)
    assert reserved.free == [(low, size)]
    libc.munmap(low, size)


# ---- through the opener ------------------------------------------------------------------------


def test_gpu_open_boots_the_simulated_ga102_and_its_stop_gives_it_back(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    for round in (1, 2):
        d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
        assert d.facts.name == "NV-PCI" and d.facts.arch == "sm_86" and d.completed() == 2
        assert d.facts.hang_ms == rig_pci.driver.hang_ms == 30_000 and not d.facts.maps_host
        assert isinstance(d.path, held.PciPath) and d.path.events is not None
        assert lock.held(machine, BUS) and not takes[-1].closed
        d.stop()
        assert takes[-1].closed and ga102.firmware.boots == round
        assert not ga102.rig.gpu.wpr2_up()
        given_back(machine, BUS)


def test_a_failed_boot_loses_the_gpu_and_the_next_open_resets_it_first(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    g = ga102.rig.gpu
    booter = g.sec2.programs[ga102.rig.sb.ucode_id]
    g.sec2.programs[ga102.rig.sb.ucode_id] = sim.booter_program(g, error=0xB00700FF)
    with pytest.raises(OpenRefused, match=r"GPU 0 of .*booter_load .*0xb00700ff"):
        rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    assert takes[-1].closed and takes[-1].resets == 0
    given_back(machine, BUS)
    assert rig_nv_pci.opener.lost(machine, BUS)
    assert ga102.rig.gpu.wpr2_up()  # FWSEC's WPR2 stayed up
    g.sec2.programs[ga102.rig.sb.ucode_id] = booter
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    assert takes[-1].resets == 1 and not rig_nv_pci.opener.lost(machine, BUS) and d.completed() == 2
    d.stop()
    given_back(machine, BUS)


def test_a_gb202_opens_through_its_fsp_and_its_stop_unloads_the_gsp(tmp_path: Path) -> None:
    from test_boot_fsp import FMC_IMAGE

    g = sim.gb202()
    sim.SimFmc(g, FMC_IMAGE).install()
    firmware = sim.GspFirmware(g).install()
    g.usable_fb_mib = FB_SIZE >> 20
    s = SimRm(g, classes=GB202_CLASSES, gr={**sim.gsp_rm.GA102_GR, 0xC: 0xC00}).install(firmware)
    paths = gb202_files(tmp_path)
    chip = chips.identify(sim.GB202_BOOT42)
    stops: list[BaseException | None] = []
    s.start()
    try:
        d = held.open_device(SimFunction(g, s), name="GPU 0", chip=chip,
                             images=held.read_images(chip, paths), on_stopped=stops.append,
                             timeout_s=0.2, init_timeout_s=1.0)
        assert firmware.boots == 1 and firmware.failure is None, firmware.log
        assert d.facts.arch == "sm_120" and d.completed() == 2
        assert (d.classes.gpfifo, d.classes.compute, d.classes.qmd_version) == (
            0xCA6F, 0xCEC0, 5)
        # its submissions ran through the version-3 page tables the path wrote (PD4 root)
        assert s.version == 3 and s.tlb and not any(
            q.function == 14 for q in firmware.peer.requests)  # no MAP_MEMORY_DMA
        # random bytes through Device memory of whole 64 KiB, mapped with version-3 big PTEs
        data = os.urandom(3 << 16)
        src, dst = d.alloc(len(data)), d.alloc(len(data))
        assert src is not None and dst is not None and isinstance(d.path, held.PciPath)
        assert d.path.space.tables is not None
        assert gmmu.translate(s.read64, d.path.space.tables.root, dst.gpu + 0x2_0010, 3).page == (
            64 << 10)
        d.upload(src, data).wait(timeout_s=5.0)
        d.copy(dst, src, engine="copy").wait(timeout_s=5.0)
        assert bytes(d.download(dst)) == data and s.faults == []
        d.free(src)
        d.free(dst)
        d.stop()
        # kgspTeardown_GH100: the GSP unloaded, suspended and halted; WPR2 stays up, so the
        # next open (rig_nv_pci.opener._open) resets the GPU first (a reset the simulated GB202 does
        # not model, so it is not opened again here)
        assert stops == [None] and firmware.suspended
        assert s.fbmem == {} and s.sysmem == {}
        assert g.wpr2_up()
    finally:
        s.stop()


def test_a_gpu_behind_an_iommu_maps_the_callers_memory(ga102: Opened) -> None:
    d = ga102.open()
    try:
        assert d.map_host(bytearray(100)) is Refusal.NEVER  # taken physically: maps_host False
    finally:
        d.stop()
    ga102.function.maps_host = True
    d = ga102.open()
    try:
        assert d.facts.maps_host
        buffer = bytearray(0x2345)
        region = d.map_host(buffer)
        assert not isinstance(region, Refusal)
        ga102.sim_rm.write(region.gpu + 0x2000, b"GPU")
        assert buffer[0x2000:0x2003] == b"GPU"
    finally:
        d.stop()
