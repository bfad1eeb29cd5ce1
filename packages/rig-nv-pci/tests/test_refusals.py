"""The Rig_nv_pci spec's "An allocation the path or the GSP refuses gives back at once the memory
the path gave for it, unless the GPU faulted meanwhile", through the real path
(:meth:`rig_nv_pci.path.rm.PciRM.alloc`, rig_nv.make) against the simulated GSP-RM: a refused
channel, promote or compute object gives its memory back; after no answer in time, a report
of trouble or a KeyboardInterrupt, the channel's memory is kept until GSP-RM answers the free
of its group. The cases in full: docs/rig-nv-pci-modules/tests-test_refusals.md."""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from typing import Any, overload

import pytest
import sim
from sim import channel_memory, gmmu, gsp_peer
from sim.gsp_fw import EV_GSP_RUN_CPU_SEQUENCER, sequencer_payload
from support import Booted, Opened, _channel_kit
from support import ga102 as booted_ga102  # noqa: F401  (the fixture, for Booted)

import rig_nv
from rig_edge import Memory
from rig_nv.rm import RMError
from rig_nv_pci import held
from rig_nv_pci.gsp import events as ev
from rig_nv_pci.gsp import rpc
from rig_nv_pci.path import grctx
from rig_nv_pci.path import pci as pp
from rig_nv_pci.path.channels import INSTANCE_SIZE

GPFIFO = 0xC56F  # AMPERE_CHANNEL_GPFIFO_A (clc56f.h)
COMPUTE = 0xC7C0  # AMPERE_COMPUTE_B (clc7c0.h)
NV_ERR_NO_MEMORY = 0x51  # nvstatuscodes.h
# NV_VGPU_MSG_EVENT_* (rpc_global_enums.h)
EV_RC_TRIGGERED, EV_MMU_FAULT_QUEUED, EV_OS_ERROR_LOG = 0x1004, 0x1005, 0x1006
EV_GSP_LOCKDOWN_NOTICE = 0x101C
POLL = 2  # GSP_SEQ_BUF_OPCODE_REG_POLL (rmgspseq.h)
SCRATCH = 0x1400 + 4 * 0x36  # an NV_PBUS_SW_SCRATCH register nothing sets (pri_nv_xal_ep.h)


def in_heap(p: pp.PciPath, at: int, size: int) -> bool:
    """Whether ``[at, at+size)`` lies free in the path's heap."""
    return any(a <= at and at + size <= a + n for a, n in p.heap.free)


class MethodBuffers(Sequence[sim.SimDma]):
    """The DMA memory of the simulated GSP-RM's method-buffer size (sim/channel_memory.py)
    that the simulated machine ``host`` gives from now on, read from its record of buffers."""

    def __init__(self, host: sim.HostMemory) -> None:
        self.host, self.start = host, len(host.buffers)

    def _made(self) -> list[sim.SimDma]:
        return [b for b in self.host.buffers[self.start:]
                if b.length == channel_memory.METHOD_BUFFER_SIZE]

    def __len__(self) -> int:
        return len(self._made())

    @overload
    def __getitem__(self, i: int) -> sim.SimDma: ...
    @overload
    def __getitem__(self, i: slice) -> list[sim.SimDma]: ...
    def __getitem__(self, i: int | slice) -> sim.SimDma | list[sim.SimDma]:
        return self._made()[i]


# ---- GSP-RM refuses: the memory goes back at once ---------------------------------------------


def test_a_channel_gsp_rm_refuses_gives_back_its_instance_block_chid_and_method_buffer(
    booted_ga102: Booted,  # noqa: F811
) -> None:
    """The spec: an allocation the GSP refuses gives back at once the memory the path gave for
    it. The simulated GSP-RM answers the channel's GSP_RM_ALLOC with NV_ERR_NO_MEMORY: through
    PciRM.alloc, the instance block is back in the heap (the heap's free ranges exactly as
    before), the method buffer made for the group's first channel freed, and the ChID free (the
    same alloc, allowed, takes the same ChID and, the heap unchanged, the same instance block)."""
    p, s = booted_ga102.path(), booted_ga102.sim_rm
    held_ = p.rm.channels
    assert held_ is not None
    tsg, asked = _channel_kit(p, 1)
    made = MethodBuffers(booted_ga102.rig.gpu.host)
    before = p.heap.free
    s.refuse.add(GPFIFO)
    channel = p.rm.new_handle()
    with pytest.raises(rpc.Refused) as e:
        p.rm.alloc(tsg, channel, GPFIFO, bytearray(asked))
    assert e.value.status == NV_ERR_NO_MEMORY
    sent = booted_ga102.firmware.peer.requests[-1]
    assert sent.function == gsp_peer.FN_GSP_RM_ALLOC  # GSP-RM was asked, and refused
    assert p.heap.free == before and channel not in held_.channels
    assert len(made) == 1 and made[0].freed and held_.method_buffers == {}
    s.refuse.clear()
    again = p.rm.new_handle()
    p.rm.alloc(tsg, again, GPFIFO, bytearray(asked))
    assert held_.channels[again].chid == 1  # the lowest above GSP-RM's reserved one
    assert not in_heap(p, held_.channels[again].instance, INSTANCE_SIZE)
    p.rm.free(tsg)
    assert p.heap.free == before and len(made) == 2 and made[1].freed
    p.closed()


def test_a_channel_of_a_group_whose_first_channel_gsp_rm_took_keeps_the_groups_method_buffer(
    booted_ga102: Booted,  # noqa: F811
) -> None:
    """The method buffer GSP-RM saw with the group's first channel is the group's: a second
    channel GSP-RM refuses gives back only its own instance block and ChID."""
    p, s = booted_ga102.path(), booted_ga102.sim_rm
    held_ = p.rm.channels
    assert held_ is not None
    tsg, asked = _channel_kit(p, 1)
    first = p.rm.new_handle()
    p.rm.alloc(tsg, first, GPFIFO, bytearray(asked))
    buffer = held_.method_buffers[tsg]
    before = p.heap.free
    s.refuse.add(GPFIFO)
    with pytest.raises(rpc.Refused):
        p.rm.alloc(tsg, p.rm.new_handle(), GPFIFO, bytearray(asked))
    assert p.heap.free == before and held_.method_buffers == {tsg: buffer}
    assert not buffer.freed  # type: ignore[attr-defined]
    p.rm.free(tsg)
    p.closed()


def test_a_make_whose_channels_gsp_rm_refuses_gives_back_every_page(
    booted_ga102: Booted,  # noqa: F811
) -> None:
    """The spec's promise through rig_nv.make: GSP-RM refuses the device's channels; the make
    fails, and every page the path gave (instance blocks, method buffers) is back."""
    p, s = booted_ga102.path(), booted_ga102.sim_rm.start()
    held_ = p.rm.channels
    assert held_ is not None
    made = MethodBuffers(booted_ga102.rig.gpu.host)
    before = p.heap.free
    s.refuse.add(GPFIFO)
    with pytest.raises(RMError):
        rig_nv.make(p)
    assert p.heap.free == before and held_.channels == {} and held_.method_buffers == {}
    assert made and all(m.freed for m in made)


def test_a_promote_gsp_rm_refuses_gives_back_every_context_buffer_made_for_it(
    booted_ga102: Booted,  # noqa: F811
) -> None:
    """The compute object's context buffers (the group's MAIN and PATCH, the GPU's FECS_EVENT
    and access maps, all made for it): GSP-RM refuses NV2080_CTRL_CMD_GPU_PROMOTE_CTX, and
    through PciRM.alloc every buffer's pages are back in the heap and its GPU addresses
    unmapped; the compute object is never sent. Allowed again, it is made."""
    p, s, peer = booted_ga102.path(), booted_ga102.sim_rm, booted_ga102.firmware.peer
    g = p.rm.grctx
    assert g is not None
    tsg, asked = _channel_kit(p, 1)
    channel = p.rm.new_handle()
    p.rm.alloc(tsg, channel, GPFIFO, bytearray(asked))
    before = p.heap.free
    peer.control_status[channel_memory.CTRL_PROMOTE_CTX] = NV_ERR_NO_MEMORY
    asked_before = len(peer.requests)
    with pytest.raises(rpc.Refused) as e:
        p.rm.alloc(channel, p.rm.new_handle(), COMPUTE)
    assert e.value.status == NV_ERR_NO_MEMORY
    # the buffers made for it, as the refused promote named them to the simulated GSP-RM
    (promote,) = [c for c in peer.controls() if c.cmd == channel_memory.CTRL_PROMOTE_CTX]
    taken = channel_memory.promote_entries(promote.params)
    assert sorted(b.buffer_id for b in taken) == sorted(channel_memory.GROUP_CTX
                                                        + channel_memory.GLOBAL_CTX)
    assert p.heap.free == before and g.groups == {} and g.globals == {}
    for b in taken:
        with pytest.raises(gmmu.MmuFault):
            s.translate(b.va)
    assert all(q.function != gsp_peer.FN_GSP_RM_ALLOC for q in peer.requests[asked_before:])
    del peer.control_status[channel_memory.CTRL_PROMOTE_CTX]
    p.rm.alloc(channel, p.rm.new_handle(), COMPUTE)
    assert set(g.groups) == {tsg}
    p.rm.free(tsg)
    p.closed()


def test_a_compute_object_refused_after_its_promote_leaves_the_buffers_with_the_group(
    booted_ga102: Booted,  # noqa: F811
) -> None:
    """Once GSP-RM took the promote, the buffers are the group's (its context names them): a
    compute object GSP-RM then refuses gives none of them back; the next one is made without
    a second promote, and freeing the group gives the group's buffers back."""
    p, s, peer = booted_ga102.path(), booted_ga102.sim_rm, booted_ga102.firmware.peer
    g = p.rm.grctx
    assert g is not None
    tsg, asked = _channel_kit(p, 1)
    channel = p.rm.new_handle()
    p.rm.alloc(tsg, channel, GPFIFO, bytearray(asked))
    before = p.heap.free
    s.refuse.add(COMPUTE)
    with pytest.raises(rpc.Refused):
        p.rm.alloc(channel, p.rm.new_handle(), COMPUTE)
    kept = g.groups[tsg].buffers
    assert set(kept) == set(grctx.GROUP_BUFFERS) and set(g.globals) == set(grctx.GLOBAL_BUFFERS)
    assert all(not in_heap(p, b.fb, b.size) for b in [*kept.values(), *g.globals.values()])
    s.refuse.clear()
    asked_before = len(peer.requests)
    p.rm.alloc(channel, p.rm.new_handle(), COMPUTE)
    assert len(peer.requests) == asked_before + 1  # the alloc alone: nothing promoted again
    group_buffers = list(kept.values())
    p.rm.free(tsg)
    assert all(in_heap(p, b.fb, b.size) for b in group_buffers)
    assert before != p.heap.free  # the GPU's buffers stay until the device is freed
    p.closed()


# ---- the GPU faulted meanwhile: the memory is kept --------------------------------------------


def no_answer(o: Opened, p: pp.PciPath, monkeypatch: pytest.MonkeyPatch) -> type[BaseException]:
    """GSP-RM takes the alloc (and makes the channel) but never answers: RpcTimeout."""
    o.firmware.peer.alloc_unanswered.add(GPFIFO)
    monkeypatch.setattr(p.rm.rpc_rm.rpc, "timeout_s", 0.2)
    late_is_not_gone(p, monkeypatch)
    return rpc.RpcTimeout


def late_is_not_gone(p: pp.PciPath, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GSP's one timeout is not taken as the GSP gone (rig_nv_pci.gsp.rpc.Rpc's
    ``silent_after``, 1 by default: no later RPC would be sent, test_silent.py), so that
    what a late or missing answer keeps is seen given back by a later free's answer."""
    monkeypatch.setattr(p.rm.rpc_rm.rpc, "silent_after", None)


def answered_late(o: Opened, p: pp.PciPath, monkeypatch: pytest.MonkeyPatch,
                  ) -> type[BaseException]:
    """GSP-RM takes the alloc (and makes the channel) but answers only once the caller gave
    up (RpcTimeout): its late reply comes before the next alloc's, which must not take it
    (rig_nv_pci.gsp.rpc matches a reply by its sequence)."""
    o.firmware.peer.late.add(gsp_peer.FN_GSP_RM_ALLOC)
    monkeypatch.setattr(p.rm.rpc_rm.rpc, "timeout_s", 0.2)
    late_is_not_gone(p, monkeypatch)
    return rpc.RpcTimeout


def refused_after(event: int, payload: Callable[[Opened], bytes],
                  raised: type[BaseException] = rpc.Refused,
                  ) -> Callable[[Opened, pp.PciPath, pytest.MonkeyPatch], type[BaseException]]:
    def strike(o: Opened, p: pp.PciPath, monkeypatch: pytest.MonkeyPatch,
               ) -> type[BaseException]:
        """GSP-RM sends ``event`` while the RPC waits, then refuses the alloc."""
        o.firmware.peer.event(event, payload(o), now=False)
        o.sim_rm.refuse.add(GPFIFO)
        return raised

    return strike


def interrupted(refuse: bool) -> Callable[[Opened, pp.PciPath, pytest.MonkeyPatch],
                                          type[BaseException]]:
    def strike(o: Opened, p: pp.PciPath, monkeypatch: pytest.MonkeyPatch,
               ) -> type[BaseException]:
        """A KeyboardInterrupt strikes while an event that came before the reply is recorded;
        the reply (a refusal, or the channel made) is read, then the interrupt raised."""
        first = [True]

        def decode(payload: bytes) -> ev.Decoded:
            if first[0]:
                first[0] = False
                raise KeyboardInterrupt
            return ev.decode_os_error_log(payload)

        monkeypatch.setitem(ev.DECODERS, EV_OS_ERROR_LOG, decode)
        o.firmware.peer.event(EV_OS_ERROR_LOG, o.firmware.peer.os_error_log(43, 9, "a line"),
                              now=False)
        if refuse:
            o.sim_rm.refuse.add(GPFIFO)
        return KeyboardInterrupt

    return strike


MEANWHILE = {
    "no-answer": no_answer,
    "answered-late": answered_late,
    "rc-triggered": refused_after(EV_RC_TRIGGERED, lambda o: o.firmware.peer.rc_triggered(
        40, xid=13)),  # another channel's: the GPU faulted all the same
    "mmu-fault-queued": refused_after(EV_MMU_FAULT_QUEUED, lambda o: b""),
    "lockdown": refused_after(EV_GSP_LOCKDOWN_NOTICE,
                              lambda o: o.firmware.peer.lockdown_notice(True)),
    "gpu-lost": refused_after(EV_GSP_RUN_CPU_SEQUENCER, lambda o: sequencer_payload(
        [(POLL, SCRATCH, 1, 1, 500, 3)], 64)),  # a poll never met: the GPU lost
    "interrupted-refused": interrupted(True),
    "interrupted-made": interrupted(False),
}


@pytest.mark.parametrize("meanwhile", list(MEANWHILE))
def test_a_channel_alloc_during_which_the_gpu_faulted_keeps_its_memory(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch, meanwhile: str,
) -> None:
    """The spec's "unless the GPU faulted meanwhile", on an opened device's path: the channel
    alloc fails without a plain refusal (no answer; a report of trouble or the GPU lost during
    the RPC, then a refusal; a KeyboardInterrupt while the reply was awaited). Its instance
    block stays out of the heap, its ChID taken and the method buffer made for it held: a
    channel made next in the group gets neither. Only GSP-RM's answer to the free of the group
    gives them back."""
    d = ga102.open()
    try:
        p = d.path
        assert isinstance(p, held.PciPath)
        held_ = p.rm.channels
        assert held_ is not None
        tsg, asked = _channel_kit(p, 1)
        made = MethodBuffers(ga102.rig.gpu.host)
        before = p.heap.free
        raised = MEANWHILE[meanwhile](ga102, p, monkeypatch)
        channel = p.rm.new_handle()
        with pytest.raises(raised):
            p.rm.alloc(tsg, channel, GPFIFO, bytearray(asked))
        kept = held_.channels[channel]
        assert not in_heap(p, kept.instance, INSTANCE_SIZE)
        assert len(made) == 1 and not made[0].freed and held_.method_buffers[tsg] is made[0]
        ga102.firmware.peer.alloc_unanswered.clear()
        ga102.firmware.peer.late.clear()
        ga102.firmware.peer.send_late()  # a late answer, read by the next RPC's wait
        ga102.sim_rm.refuse.clear()
        other = p.rm.new_handle()
        p.rm.alloc(tsg, other, GPFIFO, bytearray(asked))
        late = [u for u in p.rm.rpc_rm.rpc.unexpected if u.function == rpc.Function.GSP_RM_ALLOC]
        assert [gsp_peer.parse_alloc(u.payload).handle for u in late] == (
            [channel] if meanwhile == "answered-late" else [])
        assert held_.channels[other].instance != kept.instance
        assert held_.channels[other].chid != kept.chid and len(made) == 1
        p.rm.free(tsg)
        assert p.heap.free == before and made[0].freed and channel not in held_.channels
    finally:
        d.stop()


# ---- memory the path registers with ALLOC_MEMORY (PciPath.alloc_memory, map_host) -----------

FN_ALLOC_MEMORY = gsp_peer.FN_ALLOC_MEMORY  # NV_VGPU_MSG_FUNCTION_ALLOC_MEMORY
SMALL_PAGE = 0x1000


def registering_path(b: Booted) -> pp.PciPath:
    """A path on the booted GA102 whose RPCs' events go to its event log (what decides a
    refusal is plain), that maps the caller's pages."""
    log = ev.EventLog("NV-PCI")
    b.booted.channel.on_event = log.take
    return b.path(maps_host=True, events=log)


def registration_refused(b: Booted, p: pp.PciPath, before: Callable[[], None] | None = None,
                         ) -> None:
    """GSP-RM answers the next ALLOC_MEMORY with NV_ERR_NO_MEMORY (in rpc_result, its reply's
    only status), ``before`` sending what comes while the RPC waits."""
    functions = b.firmware.peer.functions
    served = functions[FN_ALLOC_MEMORY]

    def refuse(payload: bytes) -> tuple[bytes, int]:
        functions[FN_ALLOC_MEMORY] = served
        if before is not None:
            before()
        return payload, NV_ERR_NO_MEMORY

    functions[FN_ALLOC_MEMORY] = refuse


def registration_late(b: Booted, p: pp.PciPath) -> None:
    """GSP-RM registers the memory but answers only after the caller gave up."""
    b.firmware.peer.late.add(FN_ALLOC_MEMORY)
    p.rm.rpc_rm.rpc.timeout_s = 0.2
    p.rm.rpc_rm.rpc.silent_after = None  # as late_is_not_gone: a later free is answered


def refused_after_event(event: int, payload: Callable[[Any], bytes],
                        ) -> Callable[[Booted, pp.PciPath], None]:
    def strike(b: Booted, p: pp.PciPath) -> None:
        peer = b.firmware.peer
        registration_refused(b, p, lambda: peer.event(event, payload(peer), now=False))

    return strike


REGISTRATION = {  # how the registration fails: the exception, and whether the memory is kept
    "refused": (registration_refused, rpc.Refused, False),
    "no-answer": (registration_late, rpc.RpcTimeout, True),
    "rc-triggered-then-refused": (refused_after_event(
        EV_RC_TRIGGERED, lambda peer: peer.rc_triggered(40, xid=13)), rpc.Refused, True),
    "lockdown-then-refused": (refused_after_event(
        EV_GSP_LOCKDOWN_NOTICE, lambda peer: peer.lockdown_notice(True)), rpc.Refused, True),
}


def take_pinned(p: pp.PciPath, _: Any) -> Any:
    return p.alloc_memory(0x2000, Memory.PINNED)


def take_device(p: pp.PciPath, _: Any) -> Any:
    return p.alloc_memory(0x10000, Memory.DEVICE)


def take_notifier(p: pp.PciPath, _: Any) -> Any:
    return p.alloc_notifier()


def take_host(p: pp.PciPath, buffer: Any) -> Any:
    return p.map_host(pp.address_of(memoryview(buffer)), 0x2000)


TAKERS = {"pinned": take_pinned, "device": take_device, "notifier": take_notifier,
          "map-host": take_host}


def taken(r: Any, recorded: list[int]) -> Any:
    """``r``'s take, recording each non-None answer."""
    take = r.take

    def recording(size: int, align: int = SMALL_PAGE) -> Any:
        at = take(size, align)
        if at is not None and size >= 0x2000:  # not a page table's page
            recorded.append(at)
        return at

    r.take = recording
    return r


@pytest.mark.parametrize("how", list(REGISTRATION))
@pytest.mark.parametrize("taker", list(TAKERS))
def test_memory_whose_registration_fails_without_a_plain_refusal_is_kept_until_the_device_free(
    booted_ga102: Booted, how: str, taker: str,  # noqa: F811
) -> None:
    """The rule of rig_nv_pci.path.rm's docstring for the memory the path registers with
    ALLOC_MEMORY (Pinned and map_host's DMA memory, a channel's error notifier, Device
    memory's video memory): a plain refusal (a status, no report of trouble during the RPC)
    gives back at once the DMA memory (a map_host's IOMMU mapping), the video memory and the
    GPU addresses; no answer in time, or a refusal after an RC_TRIGGERED or lockdown
    engaging, keeps them all, never handed out again, until GSP-RM answers the device's free
    (the path's stop), under which the memory object it may hold lies."""
    b = booted_ga102
    p, host = registering_path(b), b.rig.gpu.host
    vas: list[int] = []
    fbs: list[int] = []
    taken(p.space.addresses, vas)
    taken(p.heap, fbs)
    heap, addresses = list(p.heap.free), list(p.space.addresses.free)
    buffers = len(host.buffers)
    strike, raised, kept = REGISTRATION[how]
    strike(b, p)
    with pytest.raises(raised):
        TAKERS[taker](p, mmap.mmap(-1, 0x2000))
    b.firmware.peer.late.clear()
    p.rm.rpc_rm.rpc.timeout_s = 5.0
    b.firmware.peer.send_late()  # a late answer: the next RPC drops it
    dma = host.buffers[buffers:]
    assert len(dma) == (taker != "device") and len(vas) == (taker != "notifier")
    assert len(fbs) == (taker == "device")
    if not kept:
        assert all(d.freed for d in dma) and p.heap.free == heap
        assert p.space.addresses.free == addresses and p.rm.kept == []
        p.closed()
        return
    assert not any(d.freed for d in dma) and len(p.rm.kept) == 1
    vas, fbs = list(vas), list(fbs)  # the kept ones, not what the next allocation takes
    assert all(not in_range(p.space.addresses.free, va, 0x2000) for va in vas)
    assert all(not in_heap(p, fb, 0x10000) for fb in fbs)
    again = TAKERS[taker](p, mmap.mmap(-1, 0x2000))  # made: none of the kept memory in it
    assert again is not None and not isinstance(again, pp.Refusal)
    assert again.undo.va not in vas and again.undo.fb not in fbs
    assert again.undo.dma not in dma and not any(d.freed for d in dma)
    p.free_memory(again)
    p.closed()  # GSP-RM answers the device's free: the kept memory goes back
    assert p.rm.kept == [] and all(d.freed for d in dma)
    assert all(in_range(p.space.addresses.free, va, 0x2000) for va in vas)
    assert all(in_heap(p, fb, 0x10000) for fb in fbs)


def in_range(free: list[tuple[int, int]], at: int, size: int) -> bool:
    """Whether ``[at, at+size)`` lies in one of the ``free`` ranges."""
    return any(a <= at and at + size <= a + n for a, n in free)
