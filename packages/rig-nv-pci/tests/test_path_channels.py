"""rig_nv_pci.path.pci's channels against the simulated GA102 booted to GSP_INIT_DONE (the
fixture and helpers of tests/test_path.py): the memory a channel's alloc hands GSP-RM
(kernel_channel.c _kchannelSendChannelAllocRpc), the compute engine's context buffers promoted
before a compute object (_kgrAlloc), and the ChIDs the path picks (kernel_channel_gm107.c
kchannelAllocHwID_GM107, alloc_channel.h's NVOS04_FLAGS_CHANNEL_USERD_INDEX_*), with the
simulated GSP-RM's checks of each.
"""

from __future__ import annotations

import struct

import pytest
from sim.gsp_rm import CTX_PROPERTIES
from support import Booted, _channel_kit, ga102

import rig_nv
from rig_edge import Memory
from rig_nv.rm import RMError
from rig_nv.setup import CHANNEL_AREA
from rig_nv_pci.path import pci as pp

__all__ = ["ga102"]  # the fixture, from support.path


def test_a_channel_alloc_hands_gsp_rm_the_channels_memory_and_it_comes_back(
        ga102: Booted) -> None:
    """As CPU-RM does for a GSP client (kernel_channel.c _kchannelSendChannelAllocRpc): the
    instance block (4 KiB, aligned, zeroed, from the path's heap) and its RAMFC, USERD where
    the caller put it, the group's method buffer in system memory, the error notifier; the
    simulated GSP-RM writes the address space's root into the instance block and its PBDMA
    translates the channel's addresses through it."""
    p, s = ga102.path(), ga102.sim_rm.start()
    free_before = p.heap.free
    d = rig_nv.make(p)
    try:
        held = p.rm.channels
        assert held is not None and p.space.tables is not None
        assert set(held.channels) == set(s.channels) and len(s.channels) == 2
        # one method buffer a group: the compute channel's group's and the copy channel's
        assert set(held.method_buffers) == {d.objects.tsg, d.objects.copy_tsg}
        buffers = list(held.method_buffers.values())
        for handle, ch in s.channels.items():
            at = held.channels[handle].instance
            assert ch.instance == at and at % 0x1000 == 0 and s.usable(at, 0x1000)
            assert ch.mthdbuf == held.method_buffers[ch.group].bus_address(0)
            lo, hi = struct.unpack_from("<II", s.vram, at + 128 * 4)  # NV_RAMIN_PAGE_DIR_BASE
            assert (lo & ~0xFFF) | hi << 32 == p.space.tables.root
        # the USERD GSP-RM was given is the one GP_PUT is written to: the submissions ran
        assert d.completed() == 2 and s.faults == []
        userds = sorted(ch.userd for ch in s.channels.values())
        assert userds[1] - userds[0] == CHANNEL_AREA and all(u % 0x200 == 0 for u in userds)
    finally:
        d.stop()
    assert p.rm.channels is not None and p.rm.channels.channels == {}
    assert p.rm.channels.method_buffers == {}
    assert all(b.freed for b in buffers)  # type: ignore[attr-defined]
    assert p.heap.free == free_before


def test_the_simulated_gsp_refuses_a_channel_whose_memory_is_missing_or_wrong(
        ga102: Booted) -> None:
    """The simulated GSP-RM's checks of a channel's memory, each field spoiled in params sent
    straight to the RPC RM (held.failed() puts the instance block back by hand): what the path
    gives back when GSP-RM refuses an alloc made through PciRM.alloc is
    tests/test_refusals.py's."""
    from rig_nv import classes as cls
    from rig_nv.layouts import Params

    p, s = ga102.path(), ga102.sim_rm
    held = p.rm.channels
    assert held is not None
    tsg = p.rm.new_handle()
    p.rm.alloc(p.h_device, tsg, cls.KEPLER_CHANNEL_GROUP_A,
               Params(p.ffi, "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS", engineType=1).buf)
    area = p.alloc_memory(2 << 20, Memory.MAPPED)
    notifier = p.alloc_notifier()
    assert area is not None
    asked = Params(p.ffi, "NV_CHANNEL_ALLOC_PARAMS", hObjectError=notifier.handle,
                   hObjectBuffer=area.handle, gpFifoOffset=area.gpu, gpFifoEntries=0x400)
    asked.p.hUserdMemory[0] = area.handle
    asked.p.userdOffset[0] = 0x2000
    assert p.ffi.sizeof("NV_CHANNEL_ALLOC_PARAMS") == 368  # the sizes sim/gsp_rm.py works out
    assert p.ffi.offsetof("NV_CHANNEL_ALLOC_PARAMS", "instanceMem") == 144
    assert p.ffi.offsetof("NV_CHANNEL_ALLOC_PARAMS", "errorNotifierMem") == 248

    def refused(change: str, value: int) -> None:
        handle = p.rm.new_handle()
        sent = held.params(tsg, handle, asked.buf)
        fields = p.ffi.from_buffer("NV_CHANNEL_ALLOC_PARAMS *", sent)
        where, _, name = change.rpartition(".")
        setattr(getattr(fields, where) if where else fields, name, value)
        with pytest.raises(RMError) as e:
            p.rm.rpc_rm.alloc(tsg, handle, 0xC56F, sent)
        assert e.value.status == 0x1F, change
        held.failed(handle)

    refused("instanceMem.size", 0)  # no instance block
    refused("instanceMem.base", 0x1000)  # in GSP-RM's reserved region, not the heap's
    refused("instanceMem.base", area.gpu)  # not an FB address of the heap
    refused("ramfcMem.base", 0x0)
    refused("userdMem.base", 0x100)  # not where hUserdMemory[0] + userdOffset[0] lies
    refused("mthdbufMem.size", 0)  # no method buffer
    refused("errorNotifierMem.base", 0)
    refused("hObjectBuffer", area.handle)  # CPU-RM sends 0
    handle = p.rm.new_handle()
    sent = held.params(tsg, handle, asked.buf)
    misaligned = p.ffi.from_buffer("NV_CHANNEL_ALLOC_PARAMS *", sent)
    misaligned.instanceMem.base += 0x200
    misaligned.ramfcMem.base += 0x200
    with pytest.raises(RMError):
        p.rm.rpc_rm.alloc(tsg, handle, 0xC56F, sent)
    held.failed(handle)
    # the path's own alloc is taken; freeing the channel gives its instance block back
    before = p.heap.free
    channel = p.rm.new_handle()
    p.rm.alloc(tsg, channel, 0xC56F, asked.buf)
    assert channel in s.channels and channel in held.channels
    p.rm.free(channel)
    assert channel not in held.channels and p.heap.free == before
    # a USERD the path does not know is refused before the GSP hears of it
    asked.p.hUserdMemory[0] = 0x1234
    with pytest.raises(RMError, match="USERD 0x1234 is not memory of this path"):
        p.rm.alloc(tsg, p.rm.new_handle(), 0xC56F, asked.buf)
    assert p.heap.free == before
    p.rm.free(tsg)
    assert held.method_buffers == {}
    p.closed()


def test_the_compute_objects_context_buffers_are_promoted_to_gsp_rm_first(
        ga102: Booted) -> None:
    """As CPU-RM does for a GSP client (kernel_graphics_object.c _kgrAlloc,
    kgrobjPromoteContext): before the compute object, the group's MAIN and PATCH buffers and
    the GPU's FECS_EVENT and access maps, in the path's heap, mapped by its tables, handed
    over by one NV2080_CTRL_CMD_GPU_PROMOTE_CTX; a compute object without them is refused."""
    from rig_nv_pci.path import grctx

    p, s = ga102.path(), ga102.sim_rm.start()
    free_before = p.heap.free
    d = rig_nv.make(p)
    try:
        g = p.rm.grctx
        assert g is not None and set(g.groups) == {d.objects.tsg}
        assert set(g.groups[d.objects.tsg].buffers) == {grctx.MAIN, grctx.PATCH}
        assert set(g.globals) == set(grctx.GLOBAL_BUFFERS)
        assert s.promoted == {d.objects.tsg: {0, 2, 9, 10, 11}}
        for buffer_id, b in [*g.groups[d.objects.tsg].buffers.items(), *g.globals.items()]:
            where = s.translate(b.va)
            assert where.video and where.address == b.fb and s.usable(b.fb, b.size)
            assert b.size >= CTX_PROPERTIES[grctx.ENGINE_ID[buffer_id]][1]
        promote = grctx.NV2080_CTRL_CMD_GPU_PROMOTE_CTX
        promotes = [c for c in ga102.firmware.peer.controls() if c.cmd == promote]
        assert len(promotes) == 1  # the compute channel's; the copy channel has no compute object
        assert d.completed() == 2 and s.faults == []
    finally:
        d.stop()
    assert s.promoted == {} and p.heap.free == free_before
    assert p.rm.grctx is not None and p.rm.grctx.groups == {} and p.rm.grctx.globals == {}


def test_the_simulated_gsp_refuses_a_compute_object_without_promoted_buffers(
        ga102: Booted) -> None:
    p = ga102.path()
    held = p.rm.channels
    assert held is not None
    tsg, asked = _channel_kit(p, 1)  # NV2080_ENGINE_TYPE_GRAPHICS
    channel = p.rm.new_handle()
    p.rm.alloc(tsg, channel, 0xC56F, asked)
    with pytest.raises(RMError) as e:  # straight to the GSP: nothing promoted
        p.rm.rpc_rm.alloc(channel, p.rm.new_handle(), 0xC7C0)
    assert e.value.status == 0x40
    from rig_nv_pci.path import grctx

    fb = p.heap.take(0x48000, 0x1000)
    assert fb is not None
    for entry in ((0x1000, 0x48000, 4),  # GSP-RM's reserved region, not the heap
                  (fb, 0x48000, 0),  # not VIDMEM / uncached by the GPU
                  (fb, 0x1000, 4)):  # smaller than the engine's context
        params = bytearray(grctx.PROMOTE.pack(1, p.rm.client, 0, p.rm.client, channel, 0, 0, 0,
                                              1) + grctx.ENTRY.pack(entry[0], 0, entry[1],
                                                                    entry[2], 0, 1, 1))
        params += bytes(grctx.ENTRY.size * 15)
        assert len(params) == 560  # sizeof(NV2080_CTRL_GPU_PROMOTE_CTX_PARAMS)
        with pytest.raises(RMError) as e:
            p.rm.control(p.h_subdevice, grctx.NV2080_CTRL_CMD_GPU_PROMOTE_CTX, params)
        assert e.value.status == 0x1F, entry
    p.heap.give(fb, 0x48000)
    p.rm.alloc(channel, p.rm.new_handle(), 0xC7C0)  # through the path: promoted first
    p.rm.free(tsg)
    p.closed()


def _token(p: pp.PciPath, channel: int) -> int:
    from rig_nv.layouts import Params

    token = Params(p.ffi, "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS")
    p.rm.control(channel, 0xC36F0108, token.buf)
    return int(token.p.workSubmitToken)


def test_the_flags_name_the_chid_as_cpu_rm_does() -> None:
    """alloc_channel.h: NVOS04_FLAGS_CHANNEL_USERD_INDEX_VALUE 10:8, _USERD_INDEX_FIXED 11:11
    (FALSE), _USERD_INDEX_PAGE_VALUE 20:12, _USERD_INDEX_PAGE_FIXED 21:21 (TRUE); ChID 11 is
    page 1, index 3 (kernel_channel.c: ChID / 8, ChID % 8); the other bits stay."""
    from rig_nv_pci.path import channels

    assert channels.chid_flags(0, 11) == 1 << 21 | 1 << 12 | 3 << 8
    full = 1 << 21 | 0x1FF << 12 | 7 << 8 | 1
    assert channels.chid_flags(1 << 11 | 0x1FF << 12 | 1, 4095) == full


def test_two_devices_channels_take_each_runlists_lowest_free_chids_in_sequence(
        ga102: Booted) -> None:
    """One ChID space per runlist (kernel_channel_gm107.c kchannelAllocHwID_GM107 GROW_UP,
    kernel_fifo.c kfifoChidMgrAllocChid_IMPL above KFIFO_NUM_GSP_RESERVED_CHANNELS 1): each
    device's compute channel is on the GR runlist, its copy channel on its copy engine's
    (COPY2 0x0b here); the first device's get 1 on each, the second's 2; GSP-RM uses the ChIDs
    the flags name, and the work-submit token CPU-RM builds holds each with its runlist (the
    simulated device info table's 1 and 2: issue 26 finding 3). Without a usable copy engine
    both channels share the GR runlist: 1 and 2, then 3 and 4."""
    p, s = ga102.path(), ga102.sim_rm.start()
    held = p.rm.channels
    assert held is not None
    d1 = rig_nv.make(p)
    d2 = rig_nv.make(p)
    for d, expected in ((d1, [1, 1]), (d2, [2, 2])):
        chans = (d.compute, d.copy_channel)
        assert [held.channels[c.handle].chid for c in chans] == expected
        assert [s.channels[c.handle].chid for c in chans] == expected
        assert [c.token for c in chans] == [1 << 16 | expected[0], 2 << 16 | expected[1]]
        assert [held.channels[c.handle].runlist for c in chans] == [1, 0x0B]
    assert d2.completed() == 2 and s.faults == []
    d2.stop()  # the path's device goes, and every ChID with it
    assert held.channels == {} and held.groups == {} and s.channels == {}


def test_without_a_usable_copy_engine_both_channels_share_the_gr_runlist(
        ga102: Booted) -> None:
    """A GPU that reports no copy engine but its GRCEs: the copy channel joins the graphics
    group, on its GRCE (rig_nv.setup's fallback); the first device's channels get 1 and 2 of
    the GR runlist, the second's 3 and 4."""
    p, s = ga102.path(), ga102.sim_rm.start()
    s.copy_engines = {i: s.copy_engines[i] for i in (0, 1)}  # the GRCEs only
    held = p.rm.channels
    assert held is not None
    d1 = rig_nv.make(p)
    d2 = rig_nv.make(p)
    for d, expected in ((d1, [1, 2]), (d2, [3, 4])):
        chans = (d.compute, d.copy_channel)
        assert d.copy_engine is None and d.objects.copy_tsg is None
        assert set(s.groups) >= {d.objects.tsg}
        assert [held.channels[c.handle].chid for c in chans] == expected
        assert [s.channels[c.handle].chid for c in chans] == expected
        assert [c.token for c in chans] == [1 << 16 | chid for chid in expected]
        assert {held.channels[c.handle].runlist for c in chans} == {1}  # the GR group's
    assert len(s.groups) == 2 and set(held.method_buffers) == {d1.objects.tsg, d2.objects.tsg}
    assert d2.completed() == 2 and s.faults == []
    d2.stop()  # the path's device goes, and every ChID with it
    assert held.channels == {} and held.groups == {} and s.channels == {}


def test_a_freed_chid_is_taken_again_lowest_first_and_each_runlist_has_its_own(
        ga102: Booted) -> None:
    p, s = ga102.path(), ga102.sim_rm
    held = p.rm.channels
    assert held is not None
    gr, params = _channel_kit(p, 1)
    made = []
    for _ in range(3):
        made.append(p.rm.new_handle())
        p.rm.alloc(gr, made[-1], 0xC56F, params)
    assert [s.channels[h].chid for h in made] == [1, 2, 3]
    p.rm.free(made[0])
    assert made[0] not in held.channels and made[0] not in s.channels
    again, fourth = p.rm.new_handle(), p.rm.new_handle()
    p.rm.alloc(gr, again, 0xC56F, params)  # the lowest free: 1 again
    p.rm.alloc(gr, fourth, 0xC56F, params)
    assert (s.channels[again].chid, s.channels[fourth].chid) == (1, 4)
    assert (_token(p, again), _token(p, fourth)) == (1 << 16 | 1, 1 << 16 | 4)
    # a second GR group shares the runlist; a COPY2 group has a runlist of its own
    gr2, params2 = _channel_kit(p, 1)
    ce, params_ce = _channel_kit(p, 0x0B)
    in_gr2, in_ce = p.rm.new_handle(), p.rm.new_handle()
    p.rm.alloc(gr2, in_gr2, 0xC56F, params2)
    p.rm.alloc(ce, in_ce, 0xC56F, params_ce)
    assert (s.channels[in_gr2].chid, s.channels[in_ce].chid) == (5, 1)
    assert (held.channels[in_gr2].chid, held.channels[in_ce].chid) == (5, 1)
    p.rm.free(gr)  # the group's channels give their ChIDs back
    assert {h.chid for h in held.channels.values()} == {5, 1}
    assert gr not in held.groups and gr not in s.groups
    later = p.rm.new_handle()
    p.rm.alloc(gr2, later, 0xC56F, params2)
    assert s.channels[later].chid == held.channels[later].chid == 1
    p.closed()
    assert held.channels == {} and held.groups == {} and s.channels == {}


def test_the_simulated_gsp_refuses_a_chid_in_use_gsp_rms_own_or_none(ga102: Booted) -> None:
    """A ChID in use on the runlist, or GSP-RM's reserved 0: NV_ERR_NO_MEMORY (eheap_old.c
    eheapAlloc of a fixed offset that is not free); INDEX_FIXED with PAGE_FIXED:
    NV_ERR_INVALID_STATE (kernel_channel_gm107.c kchannelAllocHwID_GM107); no PAGE_FIXED: the
    simulated GSP-RM's NV_ERR_INVALID_ARGUMENT (the real one would pick one itself)."""
    from rig_nv_pci.path import channels

    p = ga102.path()
    held = p.rm.channels
    assert held is not None
    gr, params = _channel_kit(p, 1)
    first = p.rm.new_handle()
    p.rm.alloc(gr, first, 0xC56F, params)
    assert held.channels[first].chid == 1

    def refused(flags: int, status: int) -> None:
        handle = p.rm.new_handle()
        sent = held.params(gr, handle, params)
        p.ffi.from_buffer("NV_CHANNEL_ALLOC_PARAMS *", sent).flags = flags
        with pytest.raises(RMError) as e:
            p.rm.rpc_rm.alloc(gr, handle, 0xC56F, sent)
        assert e.value.status == status, hex(flags)
        held.failed(handle)

    refused(channels.chid_flags(0, 1), 0x51)  # in use
    refused(channels.chid_flags(0, 0), 0x51)  # GSP-RM's own
    refused(channels.chid_flags(0, 2) | 1 << 11, 0x40)  # INDEX_FIXED too
    refused(0, 0x1F)  # none named
    second = p.rm.new_handle()
    p.rm.alloc(gr, second, 0xC56F, params)  # the refusals took nothing
    assert held.channels[second].chid == 2 and ga102.sim_rm.channels[second].chid == 2
    # GSP-RM takes the ChID named, whatever it is; the token is CPU-RM's own, of the ChID it
    # picked (kchannelCtrlCmdGpfifoGetWorkSubmitToken_IMPL asks GSP-RM nothing)
    named = p.rm.new_handle()
    sent = held.params(gr, named, params)
    p.ffi.from_buffer("NV_CHANNEL_ALLOC_PARAMS *", sent).flags = channels.chid_flags(0, 11)
    p.rm.rpc_rm.alloc(gr, named, 0xC56F, sent)
    assert ga102.sim_rm.channels[named].chid == 11
    assert _token(p, named) == 1 << 16 | held.channels[named].chid
    p.closed()

