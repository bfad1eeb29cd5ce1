"""rig_nv_pci.path.pci (the rig_nv path over the GSP's RPCs) against the simulated GA102 booted to
GSP_INIT_DONE, whose simulated GSP-RM (tests/sim/gsp_rm.py) keeps the objects, video memory,
the GPU's mappings and a PBDMA (tests/sim/pbdma.py). Its channels (their memory, context
buffers and ChIDs) are tests/test_path_channels.py's, with this file's fixture.

Sizes asserted against open-gpu-kernel-modules 570.144: g_rpc-structures.h
(rpc_alloc_memory_v13_01 56 bytes before pte_pde[]), g_sdk-structures.h
(NVOS46_PARAMETERS_v03_00 56, NVOS47_PARAMETERS_v03_00 40), ctrl0080gpu.h
(NV0080_CTRL_GPU_GET_CLASSLIST_V2_PARAMS 4 + 4 * 100), ctrl0080gr.h
(NV0080_CTRL_GR_GET_INFO_V2_PARAMS: 4 + 8 * 0x3a, aligned to 8, + 16), ctrl2080fb.h
(NV2080_CTRL_FB_GET_INFO_V2_PARAMS 4 + 8 * 0x39).
"""

from __future__ import annotations

import mmap
import os

import pytest
import sim
from sim import gmmu, gsp_peer
from sim.gsp_rm import GA102_CLASSES, METHOD_BUFFER_SIZE, SimRm
from support import (
    BOOTLOADER,
    BUS,
    FB_SIZE,
    GSP_IMAGE,
    Booted,
    Rig,
    SimBars,
    SimMemory,
    ga102,
    run_boot,
    stop,
    stop_rig,
)

import rig_nv
from rig_edge import Lost, Memory, Refusal
from rig_nv import controls
from rig_nv.hostmem import view
from rig_nv.push import Push
from rig_nv.rm import RMError
from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot import gspmem
from rig_nv_pci.boot.booted import GspBooted
from rig_nv_pci.firmware import chips, layout
from rig_nv_pci.gsp import payloads, rpc
from rig_nv_pci.path import pci as pp
from rig_nv_pci.path import rm, runlists, vidmem
from rig_nv_pci.path.rm import GspClient
from rig_nv_pci.path.vidmem import SMALL, FbLayout

__all__ = ["ga102"]  # the fixture, from support.path


def test_struct_sizes_match_nvidia_headers() -> None:
    sizes = (payloads.ALLOC_MEMORY.size, payloads.MAP_DMA.size, payloads.UNMAP_DMA.size)
    assert sizes == (56, 56, 40)
    f = rpc.Function
    assert (f.ALLOC_MEMORY, f.MAP_MEMORY_DMA, f.UNMAP_MEMORY_DMA) == (4, 14, 15)
    assert rm.CLASSLIST_V2.size == 404 and rm.CLASSLIST.size == 16
    assert rm.GR_INFO_V2.size == 488 and rm.GR_INFO.size == 32
    assert rm.FB_INFO_V2.size == 460 and rm.FB_INFO.size == 16
    payload = payloads.encode_alloc_memory(1, 2, 3, 0x81, 0x1010, 0x2000, [0x1000, 0x5000])
    assert len(payload) == 56 + 16 and payload[48:52] == (2 << 16).to_bytes(4, "little")
    assert payload[56:] == (1).to_bytes(8, "little") + (5).to_bytes(8, "little")


def test_the_path_makes_device_subdevice_address_space_and_its_range(ga102: Booted) -> None:
    p = ga102.path()
    objects = ga102.firmware.peer.objects
    client = rpc.CLIENT_HANDLE
    assert objects[p.h_device] == client
    assert objects[p.h_subdevice] == objects[p.h_vaspace] == objects[p.h_virtual] == p.h_device
    assert ga102.sim_rm.virtual[p.h_virtual] == (pp.VA_BASE, pp.VA_LIMIT - pp.VA_BASE)
    p.closed()
    assert objects == {client: 0}


def test_list_controls_go_as_their_v2_twins(ga102: Booted) -> None:
    p = ga102.path()
    assert controls.class_list(p) == set(GA102_CLASSES)
    gr = controls.info_list(p, controls.NV2080_CTRL_CMD_GR_GET_INFO,
                            [controls.GR_SM_VERSION, controls.GR_LITTER_NUM_GPCS],
                            p.h_subdevice)
    assert gr == [0x806, 7]
    (heap,) = controls.info_list(p, controls.NV2080_CTRL_CMD_FB_GET_INFO,
                                 [controls.FB_HEAP_SIZE], p.h_subdevice)
    assert heap == 23 << 20
    cmds = [c.cmd for c in ga102.firmware.peer.controls()]
    assert cmds == [sim.gsp_rm.CTRL_COPY_SERVER_RESERVED_PDES,
                    runlists.NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE] + [
        rm.NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2] * 2 + [
        rm.NV2080_CTRL_CMD_GR_GET_INFO_V2, rm.NV2080_CTRL_CMD_FB_GET_INFO_V2]


@pytest.mark.parametrize("kind", [Memory.PINNED, Memory.MAPPED, Memory.DEVICE])
def test_memory_is_mapped_by_the_paths_page_tables(ga102: Booted, kind: Memory) -> None:
    """The simulated GPU walks the tables the path wrote through PRAMIN: video memory with
    2 MiB pages of kind GENERIC, system memory page by page at its bus addresses."""
    bars = SimBars(ga102.sim_rm)
    unmapped = bars.closed
    p, s = ga102.path(bars=bars), ga102.sim_rm
    a = p.alloc_memory(3 << 20 if kind is not Memory.PINNED else 0x3000, kind)
    assert a is not None and a.kind is kind
    assert pp.VA_BASE <= a.gpu < pp.VA_LIMIT
    for offset in (0, a.length - 0x1000):
        where = s.translate(a.gpu + offset + 0x10)
        if kind is Memory.PINNED:
            assert where == (False, a.undo.dma.bus_address(offset) + 0x10, 0x1000, 0)
        else:
            assert where == (True, a.undo.fb + offset + 0x10, 2 << 20, vidmem.KIND_GENERIC)
    if kind is Memory.DEVICE:
        assert a.host is None and a.length == 4 << 20 and a.gpu % (2 << 20) == 0
    else:
        assert a.host is not None
        host = view(a.host, a.length)
        host[0x1FF8:0x2008] = bytes(range(16))  # across a page
        assert s.read(a.gpu + 0x1FF8, 16) == bytes(range(16))
        s.write(a.gpu + 0x10, b"gpu wrote")
        assert bytes(host[0x10:0x19]) == b"gpu wrote"
    s.write(a.gpu + a.length - 4, b"last")
    assert s.read(a.gpu + a.length - 4, 4) == b"last"
    functions = {q.function for q in ga102.firmware.peer.requests}
    assert rpc.Function.MAP_MEMORY_DMA not in functions
    p.free_memory(a)
    with pytest.raises(LookupError, match=r"invalid|maps nothing|not valid"):
        s.translate(a.gpu)
    assert a.handle not in ga102.firmware.peer.objects
    # a Mapped region's BAR 1 view is given back with it
    assert len(unmapped) == (kind is Memory.MAPPED) and all(v is a.undo.view for v in unmapped)
    if kind is Memory.PINNED:
        assert a.undo.dma.freed and a.handle not in s.sysmem
    b = p.alloc_memory(a.length, kind)
    assert b is not None and b.gpu == a.gpu  # the addresses came back
    p.free_memory(b)


def test_pinned_memory_is_described_page_by_page(ga102: Booted) -> None:
    p, s = ga102.path(), ga102.sim_rm
    a = p.alloc_memory(0x3000, Memory.PINNED)
    assert a is not None
    dma = a.undo.dma
    assert s.sysmem[a.handle] == [dma.bus + i for i in (0, 0x1000, 0x2000)]
    (q,) = [q for q in ga102.firmware.peer.requests if q.function == gsp_peer.FN_ALLOC_MEMORY]
    assert int.from_bytes(q.payload[12:16], "little") == pp.NV01_MEMORY_LIST_SYSTEM == 0x81
    n = p.alloc_notifier()
    assert n.host is not None and n.gpu == 0 and n.handle in s.sysmem
    assert n.gpu not in s.mappings
    p.free_memory(n)
    p.free_memory(a)
    assert s.sysmem == {}


def test_no_video_memory_is_none_and_a_refused_mapping_gives_everything_back(
    ga102: Booted,
) -> None:
    """A full heap is no room for the memory or for a page table it needs (None), and a
    mapping the GSP refuses gives back what the allocation took."""
    p, s = ga102.path(), ga102.sim_rm
    free = p.heap.free
    for at, n in free:  # the heap full
        assert p.heap.take(n) == at
    objects = dict(ga102.firmware.peer.objects)
    assert p.alloc_memory(1 << 20, Memory.DEVICE) is None
    assert p.alloc_memory(0x2000, Memory.PINNED) is None  # its page table has no room
    assert ga102.firmware.peer.objects == objects and s.sysmem == {}
    assert all(b.freed for b in ga102.rig.gpu.host.buffers[-1:])
    assert p.space.addresses.free == [(pp.VA_BASE, pp.VA_LIMIT - pp.VA_BASE)]
    for at, n in free:
        p.heap.give(at, n)
    p.space.tables = None  # the GSP maps (the vGPU guest's model): the simulated GSP-RM refuses it
    with pytest.raises(RMError, match=r"mapping memory .* NV_ERR_NOT_SUPPORTED"):
        p.alloc_memory(0x2000, Memory.DEVICE)
    assert ga102.firmware.peer.objects == objects and s.sysmem == {} and s.fbmem == {}
    assert p.space.addresses.free == [(pp.VA_BASE, pp.VA_LIMIT - pp.VA_BASE)]
    assert p.heap.free == free


def test_video_memory_comes_from_the_paths_heap_over_the_reported_fb_regions(
    ga102: Booted,
) -> None:
    """The heap is the static info's usable region (neither the reserved region at the FB's
    start nor the protected one at its end); each block goes to the GSP as
    NV01_MEMORY_LIST_FBMEM, contiguous, one PTE; NV01_MEMORY_LOCAL_USER is never asked for
    (the simulated GSP-RM refuses it)."""
    p, s = ga102.path(), ga102.sim_rm
    reserved, protected = sim.gsp_rm.RESERVED, sim.gsp_rm.PROTECTED
    assert p.heap.ranges == [(reserved, s.fb_size - reserved - protected)]
    a = p.alloc_memory(0x3000, Memory.DEVICE)
    b = p.alloc_memory(3 << 20, Memory.MAPPED)
    assert a is not None and b is not None
    tables = 4096 * len(p.space.tables.shadow)  # PD3, PD2, PD1 (the server's), PD0, PT: low
    assert s.fbmem[a.handle] == (a.undo.fb, 0x3000) and reserved <= a.undo.fb < reserved + tables
    assert s.fbmem[b.handle] == (4 << 20, 4 << 20)  # 2 MiB pages: 2 MiB aligned
    described = [q for q in ga102.firmware.peer.requests
                 if q.function == gsp_peer.FN_ALLOC_MEMORY]
    for q in described:
        cls, flags = (int.from_bytes(q.payload[i:i + 4], "little") for i in (12, 16))
        count = int.from_bytes(q.payload[40:44], "little")
        assert (cls, flags, count) == (vidmem.NV01_MEMORY_LIST_FBMEM, 0x200, 1)
        assert int.from_bytes(q.payload[24:28], "little") == vidmem.KIND_GENERIC
    assert len(described) == 2
    assert sim.gsp_rm.LOCAL_USER not in [x.cls for x in ga102.firmware.peer.allocs()]
    # a Mapped region's BAR 1 view is its video memory
    assert b.host is not None
    view(b.host, 8)[:] = b"bar1 vid"
    assert bytes(s.vram[4 << 20:(4 << 20) + 8]) == b"bar1 vid"
    p.free_memory(a)
    p.free_memory(b)
    held = sum(n for _, n in p.heap.free) + 4096 * len(p.space.tables.shadow)
    assert s.fbmem == {} and held == p.heap.size  # all but the tables came back
    tables = p.space.tables
    assert set(tables.shadow) == tables.pinned and len(tables.pinned) == 3  # PD3..PD1


def test_the_simulated_gsp_refuses_local_user_memory_and_foreign_fb_pages(ga102: Booted) -> None:
    p, s = ga102.path(), ga102.sim_rm
    with pytest.raises(RMError, match="NV_ERR_NOT_SUPPORTED"):
        p.rm.alloc(p.h_device, p.rm.new_handle(), sim.gsp_rm.LOCAL_USER,
                   bytearray(p.ffi.sizeof("NV_MEMORY_ALLOCATION_PARAMS")))
    for at in (0, s.fb_size - sim.gsp_rm.PROTECTED):  # the reserved and protected regions
        payload = payloads.encode_alloc_memory(p.rm.client, p.h_device, p.rm.new_handle(),
                                          vidmem.NV01_MEMORY_LIST_FBMEM, vidmem.FBMEM_FLAGS,
                                          0x1000, [at])
        reply = ga102.booted.channel.call(rpc.Function.ALLOC_MEMORY, payload, check=False)
        assert rpc.result_status(reply.result) == sim.gsp_rm.NV_ERR_INVALID_ARGUMENT
    assert s.fbmem == {}


def test_the_usermode_page_is_bar0s_virtual_function_range(ga102: Booted) -> None:
    p = ga102.path()
    doorbell = p.map_object(0x1234, 0x10000)
    doorbell[0x90:0x94] = (7).to_bytes(4, "little")
    assert ga102.sim_rm.usermode[0x90:0x94] == (7).to_bytes(4, "little")
    p.unmap_object(doorbell)


def test_make_builds_the_device_and_its_first_submissions_complete(ga102: Booted) -> None:
    p, s = ga102.path(), ga102.sim_rm.start()
    before = len(ga102.rig.gpu.host.buffers)
    d = rig_nv.make(p)
    try:
        assert d.facts.arch == "sm_86" and d.facts.driver == "570.144"
        assert d.facts.budget == (23 << 20) * 1024 and not d.facts.maps_host
        assert (d.classes.usermode, d.classes.gpfifo) == (0xC561, 0xC56F)
        assert (d.classes.compute, d.classes.copy) == (0xC7C0, 0xC7B5)
        assert d.sm_count == 41 * 2 and d.tpc_slots == 7 * 6
        # two channels on the GSP, each the first of its group's runlist (the compute one's
        # GRAPHICS 1, the copy one's its copy engine's: the GA102's sysmem LCE 2, COPY2 0x0b,
        # sim/engines.py; the simulated device info table's runlists 1 and 2), their tokens
        # runlist << 16 | ChID as CPU-RM builds them (issue 26 finding 3), each ran its
        # submission: the timeline's word shows the copy channel's release, which waited for
        # the compute one's
        assert d.copy_engine == 2 and d.objects.copy_tsg is not None
        assert s.groups == {d.objects.tsg: 0x01, d.objects.copy_tsg: 0x0B}
        assert sorted((c.runlist, c.chid) for c in s.channels.values()) == [(1, 1), (0x0B, 1)]
        assert (d.compute.token, d.copy_channel.token) == (1 << 16 | 1, 2 << 16 | 1)
        assert d.completed() == 2 and s.faults == []
        assert all(c.pending == [] and c.get == 1 for c in s.channels.values())
        point = d.timeline.submit(d.compute, Push().words)
        point.wait(timeout_s=5.0)
        assert d.completed() == 3
        # its sleep polls the GSP and naps: no submission asks for the non-stall interrupt
        assert not p.wakes_on_interrupt and not d.timeline.interrupt
    finally:
        d.stop()
    # the stop freed the device and everything under it on the GSP, and gave back the memory
    assert ga102.firmware.peer.objects == {rpc.CLIENT_HANDLE: 0}
    assert s.fbmem == {} and s.sysmem == {} and s.mappings == {} and s.channels == {}
    # system memory: the timeline, two error notifiers, the two channel groups' method buffers
    # (the pushbuffers and the launch arena lie in video memory: rig_nv.setup.ARENA_KIND)
    made = ga102.rig.gpu.host.buffers[before:]
    assert sorted(b.length for b in made) == [4096] * 3 + [METHOD_BUFFER_SIZE] * 2
    assert all(b.freed for b in made)


def test_a_devices_stop_stops_the_gsp_and_the_gpu_boots_and_makes_a_device_again() -> None:
    r, firmware, memory, unload = stop_rig()
    s = SimRm(r.gpu).install(firmware).start()
    stops: list[str] = []
    try:
        for round in range(2):
            if round:
                memory = rebuilt(r)
            booted = run_boot(r, memory)

            def stop_the_gsp(b: GspBooted = booted) -> None:
                stop(r, b, unload)
                stops.append("stopped")

            path = pp.PciPath("NV-PCI", BUS, GspClient(booted.rm, booted.channel.poll),
                              bars=SimBars(s), memory=SimMemory(r.gpu.host),
                              on_closed=stop_the_gsp, pramin=r.bar0, fb=FbLayout(
                                  booted.static.fb_regions,
                                  (booted.static.bar1_pde_base, s.bar1_size)))
            d = rig_nv.make(path)
            assert d.completed() == 2 and firmware.boots == round + 1
            d.stop()
            # the device's objects, then the root client freed; the GSP unloaded and
            # suspended; booter_unload took WPR2 down
            assert stops == ["stopped"] * (round + 1)
            assert firmware.peer.objects == {} and firmware.suspended
            assert not r.gpu.wpr2_up()
            assert s.fbmem == {} and s.sysmem == {} and s.mappings == {}
    finally:
        s.stop()


def rebuilt(r: Rig) -> gspmem.GspMemory:
    """The GSP's memory for another boot, as test_stop's boots again."""
    plan = layout.fb_layout(chips.AMPERE, FB_SIZE, len(GSP_IMAGE), len(BOOTLOADER))
    return gspmem.build(r.gpu.host.alloc_dma, image=GSP_IMAGE, bootloader=BOOTLOADER,
                        code_offset=0, data_offset=0x1000, manifest_offset=0x1800,
                        signature=b"\x5e" * 0x1000, plan=plan, doorbell=boot.doorbell(r.bar0),
                        name="GPU 0")


def test_a_refused_make_still_stops_the_gsp(ga102: Booted) -> None:
    stopped: list[bool] = []
    s = ga102.sim_rm.start()
    s.refuse.add(0xA06C)  # KEPLER_CHANNEL_GROUP_A
    p = ga102.path(on_closed=lambda: stopped.append(True))
    with pytest.raises(RMError, match="class 0xa06c"):
        rig_nv.make(p)
    assert stopped == [True] and ga102.firmware.peer.objects == {rpc.CLIENT_HANDLE: 0}
    assert s.fbmem == {} and s.sysmem == {} and s.mappings == {}


def test_uploads_copies_and_downloads_run_on_the_simulated_copy_engine(ga102: Booted) -> None:
    p, s = ga102.path(), ga102.sim_rm.start()
    d = rig_nv.make(p)
    try:
        data = os.urandom(3 << 20)
        device = d.alloc(len(data), Memory.DEVICE)
        mapped = d.alloc(len(data), Memory.MAPPED)
        pinned = d.alloc(len(data), Memory.PINNED)
        assert device is not None and mapped is not None and pinned is not None
        d.upload(device, data).wait(timeout_s=5.0)  # through the pinned staging memory
        d.copy(mapped, device, engine="copy").wait(timeout_s=5.0)  # "auto" runs rig's kernels
        d.copy(pinned, mapped).wait(timeout_s=5.0)
        assert bytes(d.download(device)) == data
        assert bytes(d.download(mapped)) == data and bytes(d.download(pinned)) == data
        assert s.faults == []
        # the staging memory's 8192 pages went to the GSP in continuation records
        described = [q for q in ga102.firmware.peer.requests
                     if q.function == gsp_peer.FN_ALLOC_MEMORY and q.records > 1]
        assert described and int.from_bytes(described[0].payload[40:44], "little") == 8192
    finally:
        d.stop()
    assert s.fbmem == {} and s.sysmem == {} and s.mappings == {}


def test_a_step_is_one_entry_and_after_a_copy_waits_for_it_on_the_simulated_pbdma(
        ga102: Booted) -> None:
    """Issue 5 ("Steps"): "submit the step many times, each submission one GPFIFO entry", in
    device order. A step (here one copy on the compute channel's copy engine, since no SM is
    simulated) submitted after a copy on the copy channel is one entry on the compute channel:
    the PBDMA, running the compute channel first, stops at its acquire until the copy channel's
    release; then the step copies what the copy wrote and adds one to the timeline. After
    compute work the entry names the step's commands in its mapped memory."""
    p, s = ga102.path(), ga102.sim_rm.start()
    d = rig_nv.make(p)
    try:
        data = os.urandom(4096)
        src, out = d.alloc(4096, Memory.PINNED), d.alloc(4096, Memory.PINNED)
        mid = d.alloc(4096, Memory.DEVICE)
        assert src is not None and out is not None and mid is not None and out.host is not None
        step = d.step()
        step.copy(out, mid, 4096)
        step.submit().wait(timeout_s=5.0)  # after make's work on the copy channel
        s.stop()  # the PBDMA runs only when the test steps it
        d.upload(src, data)
        compute = next(c for c in s.channels.values() if c.chid == d.compute.token & 0xFFF)
        assert next(iter(s.channels.values())) is compute  # the PBDMA's order
        puts = d.compute.put, d.copy_channel.put
        copied = d.copy(mid, src, engine="copy")
        point = step.submit()
        assert (d.compute.put - puts[0], d.copy_channel.put - puts[1]) == (1, 1)
        s.step()
        assert compute.stalled_on == f"acquire 0x{d.timeline.gpu:x} >= {copied.value}"
        assert d.completed() == copied.value and bytes(view(out.host, 4096)) == bytes(4096)
        s.step()
        assert d.completed() == point.value and bytes(view(out.host, 4096)) == data
        view(out.host, 4096)[:] = bytes(4096)
        again = step.submit()  # after compute work: the step's own commands
        entry = int(d.compute.entries[(d.compute.put - 1) % d.compute.count])
        assert entry & 0xFF_FFFF_FFFC == step.address and (entry >> 42) & 0x1FFFFF == step.dwords
        s.step()
        assert d.completed() == again.value and bytes(view(out.host, 4096)) == data
        assert s.faults == []
    finally:
        d.stop()


def test_a_channel_the_gsp_stopped_loses_the_device_and_the_stop_still_gives_all_back(
    ga102: Booted,
) -> None:
    """A copy kernel is a compute launch, which the simulated GPU does not run: the GSP stops
    the channel's group, writes both error notifiers (Xid 13) and reports RC_TRIGGERED."""
    p, s = ga102.path(), ga102.sim_rm.start()
    d = rig_nv.make(p)
    try:
        a, b = d.alloc(2 << 20, Memory.DEVICE), d.alloc(2 << 20, Memory.DEVICE)
        assert a is not None and b is not None
        point = d.copy(a, b)  # 2 MiB of GPU memory: rig's copy kernels
        with pytest.raises(Lost, match=r"ROBUST_CHANNEL_GR_EXCEPTION .*on the compute channel"):
            point.wait(timeout_s=5.0)
        assert s.faults == ["channel 1: a compute launch: no SM is simulated"]
        with pytest.raises(Lost):
            d.alloc(4096)
    finally:
        d.stop()
    assert ga102.firmware.peer.objects == {rpc.CLIENT_HANDLE: 0}
    assert s.fbmem == {} and s.sysmem == {} and s.mappings == {}


def test_map_host_maps_the_callers_pages_behind_an_iommu_and_never_when_taken_physically(
    ga102: Booted,
) -> None:
    p, s = ga102.path(), ga102.sim_rm
    assert p.map_host(0x7000_0000, 0x1000) is Refusal.NEVER  # maps_host False
    p = ga102.path(maps_host=True, fb=ga102.fb(bar1=False))
    buffer = mmap.mmap(-1, 0x3000)
    address = pp.address_of(memoryview(buffer))
    a = p.map_host(address, 0x3000)
    assert not isinstance(a, Refusal) and a.host == address and a.kind is Memory.PINNED
    assert s.translate(a.gpu + 0x2004) == (False, a.undo.dma.bus_address(0x2004), 0x1000, 0)
    assert len(s.sysmem[a.handle]) == 3
    s.write(a.gpu + 0x1FFC, b"from the GPU")
    assert buffer[0x1FFC:0x2008] == b"from the GPU"
    buffer[0:4] = b"host"
    assert s.read(a.gpu, 4) == b"host"
    p.free_memory(a)
    assert s.mappings == {} and s.sysmem == {} and a.undo.dma.freed


def test_mapped_memory_is_mapped_into_bar1_by_the_paths_tables_under_gsp_rms_root(
    ga102: Booted,
) -> None:
    p, s = ga102.path(), ga102.sim_rm
    assert p.bar1.tables is not None and p.bar1.tables.root == sim.gsp_rm.BAR1_PDB
    a = p.alloc_memory(3 << 20, Memory.MAPPED)
    assert a is not None and a.undo.bar1 == 0 and a.undo.fb != 0
    where = gmmu.translate(s.read64, sim.gsp_rm.BAR1_PDB, 0x2345, 2)
    assert where == (True, a.undo.fb + 0x2345, 2 << 20, vidmem.KIND_GENERIC)
    p.free_memory(a)
    with pytest.raises(AssertionError, match="BAR 1"):  # unmapped: no view of it
        s.bar(1, 0, 0x1000)
    # all of BAR 1 but its last page (kbusInitBar1_GM107's overfetch WAR)
    assert p.bar1.offsets.free == [(0, s.bar1_size - SMALL)]
    assert p.bar1.offsets.take(s.bar1_size - SMALL, 1) == 0  # BAR 1 full: no room
    free = p.heap.free
    assert p.alloc_memory(0x1000, Memory.MAPPED) is None
    assert s.fbmem == {} and p.heap.free == free
    assert p.space.addresses.free == [(pp.VA_BASE, pp.VA_LIMIT - pp.VA_BASE)]


def test_bar1_tables_go_under_the_directories_gsp_rm_made_and_leave_them(
    ga102: Booted,
) -> None:
    """GSP-RM's BAR 1 root may already name a PD2 of its own: the path reads it from video
    memory, builds under it, keeps GSP-RM's entries and never frees it. GSP-RM's entries are
    the simulator's own encoding (sim/gmmu.py), not the path's."""
    s = ga102.sim_rm
    gsp_pd2 = sim.gsp_rm.BAR1_PDB - 0x1000  # in the reserved region
    root = gmmu.pde(gsp_pd2).to_bytes(8, "little")
    s.vram[sim.gsp_rm.BAR1_PDB:sim.gsp_rm.BAR1_PDB + 8] = root
    theirs = gmmu.pde(gsp_pd2 - 0x1000).to_bytes(8, "little")
    s.vram[gsp_pd2 + 40:gsp_pd2 + 48] = theirs  # PD2 entry 5: GSP-RM's
    p = ga102.path()
    a = p.alloc_memory(2 << 20, Memory.MAPPED)
    assert a is not None and a.host is not None
    view(a.host, 4)[:] = b"bar1"
    assert bytes(s.vram[a.undo.fb:a.undo.fb + 4]) == b"bar1"
    assert p.bar1.tables is not None and gsp_pd2 in p.bar1.tables.shadow.foreign
    p.free_memory(a)
    assert gsp_pd2 in p.bar1.tables.shadow and s.vram[gsp_pd2 + 40:gsp_pd2 + 48] == theirs
    assert s.vram[sim.gsp_rm.BAR1_PDB:sim.gsp_rm.BAR1_PDB + 8] == root


def test_bar1s_last_page_is_never_mapped_and_gsp_rms_bar_roots_never_heap_memory(
    ga102: Booted,
) -> None:
    s = ga102.sim_rm
    static = ga102.booted.static
    assert (static.bar1_pde_base, static.bar2_pde_base) == (sim.gsp_rm.BAR1_PDB,
                                                            sim.gsp_rm.BAR2_PDB)
    # GSP-RM's roots reported in the usable region: the path's heap leaves their pages out
    usable_root = sim.gsp_rm.RESERVED + 0x5000
    p = ga102.path(fb=ga102.fb(vidmem.roots(usable_root + 0x10)))
    assert all(not (at <= usable_root < at + n) for at, n in p.heap.free)
    assert all(not (at <= sim.gsp_rm.BAR1_PDB < at + n) for at, n in p.heap.ranges)
    # BAR 1 filled with Mapped memory: its last page stays unmapped, no block on a kept page
    made = [p.alloc_memory(s.bar1_size - (2 << 20), Memory.MAPPED),
            p.alloc_memory((2 << 20) - SMALL, Memory.MAPPED)]
    assert p.alloc_memory(SMALL, Memory.MAPPED) is None  # BAR 1 full
    assert not s.bar1.overfetch_mapped()
    for a, size in zip(made, (s.bar1_size - (2 << 20), (2 << 20) - SMALL), strict=True):
        assert a is not None and a.undo.fb is not None and a.undo.bar1 is not None
        assert a.undo.bar1 + size <= s.bar1_size - SMALL
        assert not a.undo.fb <= usable_root < a.undo.fb + size
        p.free_memory(a)


def test_device_and_mapped_memory_of_whole_64k_round_trip_through_big_pages(
        ga102: Booted) -> None:
    """Video memory of whole 64 KiB below 2 MiB is mapped with big (64 KiB) PTEs at 64 KiB of
    the GPU's addresses; random bytes go up, across and back through it."""
    p, s = ga102.path(), ga102.sim_rm.start()
    d = rig_nv.make(p)
    try:
        data = os.urandom(5 << 16)
        device = d.alloc(len(data), Memory.DEVICE)
        mapped = d.alloc(len(data), Memory.MAPPED)
        assert device is not None and mapped is not None and p.space.tables is not None
        for region in (device, mapped):
            assert region.gpu % (64 << 10) == 0
            where = gmmu.translate(s.read64, p.space.tables.root, region.gpu + 0x4_1234, 2)
            assert where.page == 64 << 10 and where.video
        d.upload(device, data).wait(timeout_s=5.0)
        d.copy(mapped, device, engine="copy").wait(timeout_s=5.0)
        assert bytes(d.download(device)) == data and bytes(d.download(mapped)) == data
        assert s.faults == []
    finally:
        d.stop()
    assert s.fbmem == {} and s.sysmem == {} and s.mappings == {}
