"""The GSP's error events, sent by the GSP peer through the real queues and Rpc, decoded.

The peer builds each payload from its own member tables (c_structs.C_STRUCTS, copied from
open-gpu-kernel-modules 570.144 src/nvidia/generated/g_rpc-structures.h), so a layout both
sides got wrong the same way would have to be wrong twice. Sizes asserted against the header:
rpc_rc_triggered_v17_02 48 before rcJournalBuffer[], rpc_os_error_log_v17_00 272 (0x110),
rpc_ucode_libos_print_v1E_08 8 before libosPrintBuf[], rpc_gsp_lockdown_notice_v17_00 1,
rpc_post_event_v17_00 eventData[] at 29 (sizeof 32); event numbers from rpc_global_enums.h.
"""

from __future__ import annotations

from typing import Any

import pytest
from sim import c_structs, peer_module

from rig_edge import Fault, Lost
from rig_nv_pci.gsp import events as ev
from rig_nv_pci.gsp import queue as q
from rig_nv_pci.gsp import rpc as r


def connect(on_event: Any) -> tuple[r.Rpc, Any]:
    layout = q.Layout()
    shared = memoryview(bytearray(layout.size))
    peer = peer_module().Peer(shared, layout.command_offset, layout.status_offset,
                              layout.status_size)
    queues = q.QueuePair(shared, layout, doorbell=peer.doorbell, name="GPU 0")
    queues.create()
    peer.boot()
    return r.Rpc(queues, on_event=on_event, sleep=lambda _left: peer.service(),
                 timeout_s=5.0), peer


def test_event_structs_match_nvidia_headers() -> None:
    pm = peer_module()
    assert (ev.RC_TRIGGERED.size, ev.OS_ERROR_LOG.size, ev.LIBOS_PRINT.size) == (48, 0x110, 8)
    assert (ev.LOCKDOWN_NOTICE.size, ev.POST_EVENT.size) == (1, 29)
    # The peer's own tables, laid out by C's rules: sizeof, and where the flexible array is.
    for name, layout in (("rpc_rc_triggered_v17_02", ev.RC_TRIGGERED),
                         ("rpc_ucode_libos_print_v1E_08", ev.LIBOS_PRINT),
                         ("rpc_post_event_v17_00", ev.POST_EVENT)):
        leaves = c_structs.c_layout(name)[2]
        flexible = c_structs.C_STRUCTS[name][-1][1]
        assert leaves[flexible][0] == layout.size, name
    assert c_structs.c_layout("rpc_post_event_v17_00")[0] == 32
    assert c_structs.c_layout("rpc_os_error_log_v17_00")[0] == ev.OS_ERROR_LOG.size
    assert c_structs.c_layout("rpc_gsp_lockdown_notice_v17_00")[0] == ev.LOCKDOWN_NOTICE.size
    assert (pm.EV_POST_EVENT, pm.EV_RC_TRIGGERED, pm.EV_MMU_FAULT_QUEUED) == (
        r.Event.POST_EVENT, r.Event.RC_TRIGGERED, r.Event.MMU_FAULT_QUEUED)
    assert (pm.EV_OS_ERROR_LOG, pm.EV_UCODE_LIBOS_PRINT, pm.EV_GSP_LOCKDOWN_NOTICE) == (
        r.Event.OS_ERROR_LOG, r.Event.UCODE_LIBOS_PRINT, r.Event.GSP_LOCKDOWN_NOTICE)


def test_each_event_round_trips_through_the_queues() -> None:
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    p = peer_module().Peer
    rm = r.RpcRM.open(rpc)
    journal = bytes(range(40))
    peer.event(0x1004, p.rc_triggered(7, xid=43, engine=0x0A, fault_address=0xAB_CDEF_1000,
                                      gfid=2, except_level=3, scope=1, partition=0x1234,
                                      fault_type=5, callback=False, journal=journal), now=False)
    peer.event(0x1005, now=False)  # arrives while the alloc waits for its reply
    rm.alloc(rm.client, rm.new_handle(), 0x80)
    peer.event(0x1006, p.os_error_log(31, 9, "MMU Fault: ENGINE GRAPHICS", runlist=4,
                                      previous_xid=13))
    peer.event(0x100C, p.libos_print(0x1500, b"pmu: hello\0\0"))
    peer.event(0x1003, p.post_event(0xC1D00001, 0xBEEF0001, 17, data=0x55, info16=0x66,
                                    status=0x77, event_data=b"xyz", notify_list=True))
    peer.event(0x101C, p.lockdown_notice(False))
    assert rpc.poll() == 4
    assert list(log.events) == [
        ev.RcTriggered(0x0A, 7, 2, 3, 43, 1, 0x1234, 0xAB_CDEF_1000, 5, False, journal),
        ev.MmuFaultQueued(),
        ev.OsErrorLog(31, 4, 9, "MMU Fault: ENGINE GRAPHICS", 13),
        ev.LibosPrint(0x1500, b"pmu: hello\0\0"),
        ev.PostEvent(0xC1D00001, 0xBEEF0001, 17, 0x55, 0x66, 0x77, True, b"xyz"),
        ev.LockdownNotice(False)]
    first = log.events[0]
    assert isinstance(first, ev.RcTriggered) and first.engine == "copy engine 1"
    lines = list(log.lines)
    assert lines[0] == ("RC_TRIGGERED: ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR (Xid 43) on "
                        "channel 7 of copy engine 1 at 0xabcdef1000")
    assert lines[2] == ("OS_ERROR_LOG: ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31) channel 9 "
                        "runlist 4: MMU Fault: ENGINE GRAPHICS")
    assert lines[3] == "UCODE_LIBOS_PRINT from class 0x15: pmu: hello"
    assert lines[5] == "GSP_LOCKDOWN_NOTICE: lockdown released"


def test_rc_triggered_with_xid_31_raises_fault() -> None:
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    rm = r.RpcRM.open(rpc)
    log.raise_pending()  # nothing yet
    rc = peer_module().Peer.rc_triggered(chid=5, xid=31, fault_address=0x12_3456_7000)
    peer.event(0x1004, rc, now=False)
    peer.event(0x1006, peer_module().Peer.os_error_log(31, 5, "MMU Fault"), now=False)
    rm.alloc(rm.client, rm.new_handle(), 0x80)  # the events do not fail the RPC
    with pytest.raises(Fault, match=r"ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT \(Xid 31\) on "
                       r"channel 5: FAULT_PDE at 0x1234567000 by graphics/compute") as e:
        log.raise_pending()
    assert e.value.channel_error.startswith("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31)")
    assert e.value.address == 0x12_3456_7000 and e.value.engine == "graphics/compute"
    assert e.value.access is None  # a PDE fault implies no access
    log.raise_pending()  # raised once
    assert "MMU Fault" in log.text()


def test_the_device_is_answered_for_its_own_channels_only() -> None:
    """EventLog.fault names the channel the device's callback names; an RC_TRIGGERED it names
    none of (another's channel) is left a line. The fault type names the access it implies;
    address 0 of an MMU fault is an address; a fault other than an MMU fault has none."""
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    p = peer_module().Peer
    mine = {3: "copy", 4: "compute"}
    assert log.fault(lambda rc: mine.get(rc.chid)) is None
    peer.event(0x1004, p.rc_triggered(9, xid=13))  # not the device's
    peer.event(0x1004, p.rc_triggered(3, xid=31, engine=0x9, fault_address=0, fault_type=0x6))
    peer.event(0x1004, p.rc_triggered(4, xid=13))
    rpc.poll()
    first = log.fault(lambda rc: mine.get(rc.chid))
    assert isinstance(first, Fault)
    assert first.channel_error == ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31) on the copy "
                                   "channel: FAULT_RO_VIOLATION")
    assert (first.address, first.access, first.engine) == (0, "write or atomic", "copy engine 0")
    assert log.fault(lambda rc: mine.get(rc.chid)) is None  # answered once, the rest dropped
    peer.event(0x1004, p.rc_triggered(4, xid=13))
    rpc.poll()
    gr = log.fault(lambda rc: mine.get(rc.chid))
    assert isinstance(gr, Fault) and gr.reason == (
        "ROBUST_CHANNEL_GR_EXCEPTION (Xid 13) on the compute channel by graphics/compute")
    assert gr.address is None
    assert "RC_TRIGGERED: ROBUST_CHANNEL_GR_EXCEPTION (Xid 13) on channel 9" in log.text(8)


def test_lockdown_engaging_raises_lost_until_released() -> None:
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    peer.event(0x101C, peer_module().Peer.lockdown_notice(True))
    rpc.poll()
    with pytest.raises(Lost, match="GPU 0: the GSP engaged lockdown") as e:
        log.raise_pending()
    assert not isinstance(e.value, Fault)
    with pytest.raises(Lost):
        log.raise_pending()  # still in lockdown
    peer.event(0x101C, peer_module().Peer.lockdown_notice(False))
    rpc.poll()
    log.raise_pending()


def test_a_loss_is_answered_in_its_turn_then_always() -> None:
    """EventLog.lose (a sequencer that failed): the reports come in order, so an RC_TRIGGERED
    of the device's received before it is answered first; then the loss, every time."""
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    peer.event(0x1004, peer_module().Peer.rc_triggered(4, xid=13))
    rpc.poll()
    log.lose("RUN_CPU_SEQUENCER: REG_POLL at payload offset 0x28 timed out")
    first = log.fault(lambda rc: "compute")
    assert isinstance(first, Fault) and "(Xid 13) on the compute channel" in first.reason
    for _ in range(2):
        lost = log.fault(lambda rc: "compute")
        assert isinstance(lost, Lost) and not isinstance(lost, Fault)
        assert lost.reason == "GPU 0: RUN_CPU_SEQUENCER: REG_POLL at payload offset 0x28 timed out"
    assert log.lines[-1] == ("the GPU is lost: RUN_CPU_SEQUENCER: REG_POLL at payload offset "
                             "0x28 timed out")


def test_an_exception_while_reports_are_examined_drops_none_and_keep_answers_again() -> None:
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    peer.event(0x1004, peer_module().Peer.rc_triggered(9, xid=13))  # not the device's
    peer.event(0x1004, peer_module().Peer.rc_triggered(4, xid=13))
    rpc.poll()

    def interrupted(rc: ev.RcTriggered) -> str | None:
        if rc.chid == 4:
            raise KeyboardInterrupt
        return None

    with pytest.raises(KeyboardInterrupt):
        log.fault(interrupted, keep=True)
    mine = {4: "compute"}
    first = log.fault(lambda rc: mine.get(rc.chid), keep=True)
    assert isinstance(first, Fault) and "on the compute channel" in first.reason
    assert log.fault(lambda rc: None, keep=True) is first  # kept: answered again
    assert log.fault(lambda rc: None) is None  # without keep: answered once


@pytest.mark.parametrize(("fn", "payload", "message"), [
    (0x1004, bytes(47), r"GSP event RC_TRIGGERED: 47 bytes, shorter than "
                        r"rpc_rc_triggered_v17_02's 48"),
    (0x1004, "journal", r"GSP event RC_TRIGGERED: rcJournalBuffer of 40 bytes, but only 39"),
    (0x1006, bytes(271), r"GSP event OS_ERROR_LOG: 271 bytes"),
    (0x100C, "libos", r"GSP event UCODE_LIBOS_PRINT: libosPrintBuf of 5 bytes, but only 4"),
    (0x101C, b"", r"GSP event GSP_LOCKDOWN_NOTICE: 0 bytes"),
    (0x1003, bytes(28), r"GSP event POST_EVENT: 28 bytes, shorter than rpc_post_event_v17_00"),
])
def test_a_truncated_payload_names_the_event(fn: int, payload: Any, message: str) -> None:
    p = peer_module().Peer
    if payload == "journal":
        payload = p.rc_triggered(1, journal=bytes(40))[:-1]
    elif payload == "libos":
        payload = p.libos_print(0x1500, b"hello")[:-1]
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    rm = r.RpcRM.open(rpc)
    peer.event(fn, payload, now=False)
    dev = rm.new_handle()
    with pytest.raises(ev.EventError, match=message):
        rm.alloc(rm.client, dev, 0x80)  # raised once the reply is read
    assert dev in peer.objects
    rm.control(dev, 0x123, bytearray(4))  # the queues are still in step


def test_text_lines_are_bounded_oldest_dropped() -> None:
    log = ev.EventLog("GPU 0")
    rpc, peer = connect(log.take)
    for i in range(300):
        peer.event(0x1006, peer_module().Peer.os_error_log(13, i, f"line {i}"))
        rpc.poll()
    peer.event(0x1011, b"abc")  # DISPLAY_MODESET: not decoded, only noted
    rpc.poll()
    assert len(log.lines) == ev.LINES_KEPT == 256
    assert log.lines[0].endswith("line 45")
    assert log.lines[-1] == "GSP event DISPLAY_MODESET (3 bytes)"
    assert log.text(2).splitlines() == [log.lines[-2], log.lines[-1]]
    log.raise_pending()  # an Xid's text alone raises nothing
