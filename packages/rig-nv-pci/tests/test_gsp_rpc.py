"""RPC framing and the RM over RPCs, against the GSP peer of the simulated GPU.

Sizes and numbers asserted against open-gpu-kernel-modules 570.144: g_rpc-message-header.h
(rpc_message_header_v03_00: 8 x u32), g_rpc-structures.h (rpc_gsp_rm_alloc_v03_00 32 bytes
before params[], rpc_gsp_rm_control_v03_00 24, rpc_free_v03_00 = NVOS00_PARAMETERS_v03_00 16,
rpc_unloading_guest_driver_v1F_07 8; the event structs in test_gsp_events.py), cl0000.h
(NV0000_ALLOC_PARAMETERS 120), rpc_global_enums.h, rpc_headers.h.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from sim import gsp_peer, peer_module
from support import connect

from rig_edge import Lost, Misuse
from rig_nv.rm import RMError
from rig_nv_pci.gsp import events as ev
from rig_nv_pci.gsp import payloads
from rig_nv_pci.gsp import queue as q
from rig_nv_pci.gsp import rpc as r

NV_ERR_NO_MEMORY, NV_ERR_NOT_SUPPORTED, NV_ERR_INVALID_OBJECT_HANDLE = 0x51, 0x56, 0x33
NV_ERR_INVALID_OBJECT_PARENT, NV_ERR_INSERT_DUPLICATE_NAME = 0x36, 0x19


def test_struct_sizes_and_numbers_match_nvidia_headers() -> None:
    assert r.HEADER.size == 32 and r.MAX_PAYLOAD == 65536 - 48 - 32
    assert r.SIGNATURE.to_bytes(4, "little") == b"VRPC" and r.HEADER_VERSION == 0x03000000
    assert r.RESULT_PENDING == 0xFFFFFFFF
    assert (payloads.ALLOC.size, payloads.CONTROL.size, payloads.FREE.size,
            payloads.UNLOADING.size) == (32, 24, 16, 8)
    assert payloads.ROOT_PARAMS.size == 120  # 4 + 4 + 100, aligned to 8, + NvP64 pOsPidInfo
    f, e = r.Function, r.Event
    assert (f.FREE, f.UNLOADING_GUEST_DRIVER, f.GET_GSP_STATIC_INFO) == (10, 47, 65)
    assert (f.CONTINUATION_RECORD, f.GSP_SET_SYSTEM_INFO, f.SET_REGISTRY) == (71, 72, 73)
    assert (f.GSP_RM_CONTROL, f.GSP_RM_ALLOC) == (76, 103)
    assert (e.GSP_INIT_DONE, e.GSP_RUN_CPU_SEQUENCER, e.POST_EVENT) == (0x1001, 0x1002, 0x1003)
    assert (e.RC_TRIGGERED, e.MMU_FAULT_QUEUED, e.OS_ERROR_LOG) == (0x1004, 0x1005, 0x1006)
    assert (e.UCODE_LIBOS_PRINT, e.GSP_LOCKDOWN_NOTICE) == (0x100C, 0x101C)
    assert (e.GSP_POST_NOCAT_RECORD, e.RECOVERY_ACTION) == (0x1020, 0x1022)
    assert r.function_name(0x1011) == "DISPLAY_MODESET" and r.function_name(999) == "0x3e7"


def test_request_header_as_rpc_write_common_header() -> None:
    h = r.HEADER.unpack(r.header(r.Function.FREE, 48, 7))
    assert h == (0x03000000, 0x43505256, 48, 10, 0xFFFFFFFF, 0xFFFFFFFF, 7, 0)


def test_alloc_control_free_round_trip() -> None:
    rpc, peer = connect(alloc_answer={0x80: lambda p: p[:4] + b"\x99" * (len(p) - 4)},
                        control_answer={0x20800110: lambda p: bytes(reversed(p))})
    rm = r.RpcRM.open(rpc)
    assert (rm.client, rm.release, rm.layouts) == (0xC1D00001, "570.144", "570")
    first = peer.requests[0]
    assert first.function == 103
    assert gsp_peer.parse_alloc(first.payload).cls == 0 and peer.objects == {0xC1D00001: 0}
    dev = rm.new_handle()
    assert rm.new_handle() == dev + 1
    params = bytearray(range(16))
    assert rm.alloc(rm.client, dev, 0x80, params) == dev
    assert params == bytearray(range(4)) + b"\x99" * 12  # written back in place
    sent = gsp_peer.parse_alloc(peer.requests[-1].payload)
    assert (sent.client, sent.parent, sent.handle, sent.cls) == (rm.client, rm.client, dev, 0x80)
    ctl = bytearray(b"abcdef")
    rm.control(dev, 0x20800110, ctl)
    assert ctl == bytearray(b"fedcba")
    rm.control(dev, 0x20800111, None)
    assert gsp_peer.parse_control(peer.requests[-1].payload).params == b""
    sub = rm.new_handle() + 10
    rm.alloc(dev, sub, 0x2080)
    rm.free(dev)  # and everything under it
    assert peer.objects == {rm.client: 0}
    assert gsp_peer.parse_free(peer.requests[-1].payload) == gsp_peer.Free(rm.client, 0, dev, 0)
    rm.close()
    assert peer.objects == {}


def test_statuses_become_rm_errors_with_nvidias_names() -> None:
    rpc, peer = connect(alloc_status={0x90F1: NV_ERR_NO_MEMORY},
                        control_status={0x801: NV_ERR_NOT_SUPPORTED})
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    rm.alloc(rm.client, dev, 0x80)
    with pytest.raises(RMError, match=r"GPU 0: making RM object 0x.* of class 0x90f1: the RM "
                       r"answered NV_ERR_NO_MEMORY \(0x51\)") as e:
        rm.alloc(dev, rm.new_handle(), 0x90F1, bytearray(8))
    assert e.value.status == NV_ERR_NO_MEMORY
    with pytest.raises(RMError, match=r"RM control 0x801 .* NV_ERR_NOT_SUPPORTED") as e:
        rm.control(dev, 0x801, bytearray(4))
    assert e.value.status == NV_ERR_NOT_SUPPORTED
    with pytest.raises(RMError, match="NV_ERR_INVALID_OBJECT_PARENT"):
        rm.alloc(0x1234, rm.new_handle(), 0x2080)
    with pytest.raises(RMError, match="NV_ERR_INSERT_DUPLICATE_NAME"):
        rm.alloc(rm.client, dev, 0x80)
    with pytest.raises(RMError, match=r"freeing RM object 0x4321: .*NV_ERR_INVALID_OBJECT_HANDLE"):
        rm.free(0x4321)
    peer.status_in_header = False  # the status only in the reply's own field
    with pytest.raises(RMError, match="NV_ERR_NO_MEMORY"):
        rm.alloc(dev, rm.new_handle(), 0x90F1)
    peer.free_status[dev] = NV_ERR_INVALID_OBJECT_HANDLE
    with pytest.raises(RMError) as e:
        rm.free(dev)
    assert e.value.status == NV_ERR_INVALID_OBJECT_HANDLE


def test_unknown_function_names_the_rpc_result() -> None:
    rpc, _ = connect()
    with pytest.raises(RMError, match=r"RPC 0x3e7 .*NV_VGPU_MSG_RESULT_RPC_UNKNOWN_FUNCTION") as e:
        rpc.call(999, b"abcd")
    assert e.value.status == 0xFFFF  # NV_ERR_GENERIC, as _issueRpcAndWait maps it
    reply = rpc.call(999, b"abcd", check=False)
    assert reply.result == 0xFF100001 and reply.payload == b"abcd"


def test_large_control_goes_and_comes_back_in_continuation_records() -> None:
    rpc, peer = connect(control_answer={0x2080AAAA: lambda p: bytes(b ^ 0xFF for b in p)})
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    rm.alloc(rm.client, dev, 0x80)
    data = os.urandom(150_000)  # 24 + 150000 bytes of payload: three messages each way
    params = bytearray(data)
    rm.control(dev, 0x2080AAAA, params)
    assert params == bytes(b ^ 0xFF for b in data)
    request = peer.requests[-1]
    assert request.records == 3 and len(request.payload) == 24 + len(data)
    assert len(request.seqnums) == 3 and request.seqnums == sorted(request.seqnums)


def test_a_reply_of_another_size_is_reassembled() -> None:
    big = os.urandom(100_000)
    rpc, _ = connect(static_info=big)
    reply = rpc.call(r.Function.GET_GSP_STATIC_INFO, bytes(4), reply_size=32 + len(big))
    assert reply.payload == big and reply.function == 65


def test_events_arriving_while_waiting_go_to_the_callback() -> None:
    events: list[r.Incoming] = []
    rpc, peer = connect(events=events)
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    p = peer_module().Peer
    peer.event(0x1004, p.rc_triggered(chid=5, xid=31, fault_address=0x12_3456_7000), now=False)
    peer.event(0x1005, now=False)
    peer.event(0x1006, p.os_error_log(31, 5, "MMU Fault: ENGINE GRAPHICS"), now=False)
    rm.alloc(rm.client, dev, 0x80)
    assert [e.name for e in events] == ["RC_TRIGGERED", "MMU_FAULT_QUEUED", "OS_ERROR_LOG"]
    rc = ev.decode_rc_triggered(events[0].payload)
    assert (rc.chid, rc.except_type, rc.mmu_fault_address, rc.callback_needed) == (
        5, 31, 0x12_3456_7000, True)
    log = ev.decode_os_error_log(events[2].payload)
    assert (log.except_type, log.chid, log.err_string) == (31, 5, "MMU Fault: ENGINE GRAPHICS")
    assert dev in peer.objects
    peer.event(0x100C, b"\x01\0\0\0\x05\0\0\0hello")  # arrives with nothing waiting
    assert rpc.poll() == 1
    assert ev.decode_libos_print(events[-1].payload) == ev.LibosPrint(1, b"hello")


def test_an_exception_from_the_callback_comes_after_the_reply() -> None:
    def on_event(e: r.Incoming) -> None:
        raise RuntimeError(f"fault {e.name}")

    rpc, peer = connect()
    rm = r.RpcRM.open(rpc)
    rpc.on_event = on_event
    peer.event(0x1005, now=False)
    dev = rm.new_handle()
    with pytest.raises(RuntimeError, match="fault MMU_FAULT_QUEUED"):
        rm.alloc(rm.client, dev, 0x80)
    assert dev in peer.objects  # the alloc itself was answered, and read
    rpc.on_event = None
    rm.control(dev, 0x123, bytearray(4))  # the queues are still in step


def test_a_poll_an_interruption_ends_keeps_the_message_for_the_next() -> None:
    """on_event interrupted by a KeyboardInterrupt: poll raises it at once and hands the same
    message (the same serial) on again at the next poll; an Exception of on_event ends the
    poll too, but counts the message handled."""
    seen: list[r.Incoming] = []
    interrupts = [KeyboardInterrupt(), RuntimeError("garbled")]

    def on_event(e: r.Incoming) -> None:
        seen.append(e)
        if e.function == 0x1005 and interrupts:
            raise interrupts.pop(0)

    rpc, peer = connect()
    rpc.on_event = on_event
    peer.event(0x1006, peer_module().Peer.os_error_log(1, 0, "first"))
    peer.event(0x1005)
    peer.event(0x1006, peer_module().Peer.os_error_log(2, 0, "last"))
    with pytest.raises(KeyboardInterrupt):
        rpc.poll()
    assert [e.function for e in seen] == [0x1006, 0x1005]
    with pytest.raises(RuntimeError, match="garbled"):
        rpc.poll()
    assert rpc.poll() == 1
    assert [e.function for e in seen] == [0x1006, 0x1005, 0x1005, 0x1006]
    assert seen[1] == seen[2] and seen[1].serial is not None and seen[3].serial != seen[1].serial
    assert rpc.poll() == 0


def test_an_interruption_of_the_callback_is_not_dropped_when_no_reply_comes() -> None:
    """An RPC that times out raises its timeout, but a KeyboardInterrupt an event's callback
    raised meanwhile goes first (an event's Exception does not)."""
    seen: list[int] = []

    def on_event(e: r.Incoming) -> None:
        seen.append(e.function)
        raise KeyboardInterrupt if seen == [0x1006, 0x1005] else RuntimeError("garbled")

    rpc, peer = connect(timeout_s=0.05, auto=False, sleep=lambda _left: None)
    rpc.on_event = on_event
    peer.event(0x1006, peer_module().Peer.os_error_log(1, 0, "log"))
    peer.event(0x1005)
    with pytest.raises(KeyboardInterrupt) as e:
        rpc.call(r.Function.GSP_RM_ALLOC, payloads.encode_alloc(1, 0, 1, 0))
    assert isinstance(e.value.__cause__, r.RpcTimeout)
    peer.event(0x1006, peer_module().Peer.os_error_log(2, 0, "log"))
    with pytest.raises(r.RpcTimeout):
        rpc.call(r.Function.GSP_RM_ALLOC, payloads.encode_alloc(1, 0, 1, 0))
    assert seen == [0x1006, 0x1005, 0x1005, 0x1006]  # the one struck, handed on again


def test_an_rpc_hands_the_message_an_interruption_struck_to_the_next_poll() -> None:
    """A KeyboardInterrupt in the callback while an RPC waits: the reply is still read (the
    queues stay in step) and the interrupt raised after it; the message it struck, and those
    after it, are handed on again by the next poll, in order."""
    seen: list[r.Incoming] = []
    strikes = [KeyboardInterrupt()]

    def on_event(e: r.Incoming) -> None:
        seen.append(e)
        if e.function == 0x1005 and strikes:
            raise strikes.pop()

    rpc, peer = connect()
    rm = r.RpcRM.open(rpc)
    rpc.on_event = on_event
    p = peer_module().Peer
    peer.event(0x1006, p.os_error_log(1, 0, "before"), now=False)
    peer.event(0x1005, now=False)
    peer.event(0x1006, p.os_error_log(2, 0, "after"), now=False)
    dev = rm.new_handle()
    with pytest.raises(KeyboardInterrupt):
        rm.alloc(rm.client, dev, 0x80)
    assert dev in peer.objects and [e.function for e in seen] == [0x1006, 0x1005]
    assert rpc.poll() == 2
    assert [e.function for e in seen] == [0x1006, 0x1005, 0x1005, 0x1006]
    assert seen[1] == seen[2]
    assert ev.decode_os_error_log(seen[3].payload).err_string == "after"
    rm.control(dev, 0x123, bytearray(4))  # the queues are still in step


def test_an_rpc_from_inside_the_callback_is_misuse() -> None:
    rpc, peer = connect()
    rm = r.RpcRM.open(rpc)
    rpc.on_event = lambda e: rm.control(rm.client, 1, None)
    peer.event(0x1005, now=False)
    with pytest.raises(Misuse, match="from inside a GSP event callback"):
        rm.alloc(rm.client, rm.new_handle(), 0x80)


def test_init_done_is_awaited_past_other_events() -> None:
    events: list[r.Incoming] = []
    rpc, peer = connect(events=events)
    rpc.post(r.Function.GSP_SET_SYSTEM_INFO, bytes(64))
    rpc.post(r.Function.SET_REGISTRY, bytes(32))
    peer.event(0x101C, b"\x01")
    peer.event(0x1001, bytes(4))
    done = rpc.wait_for(r.Event.GSP_INIT_DONE)
    assert done.name == "GSP_INIT_DONE" and [e.name for e in events] == ["GSP_LOCKDOWN_NOTICE"]
    assert [x.function for x in peer.requests] == [72, 73]


def test_unloading() -> None:
    rpc, peer = connect()
    reply = rpc.call(r.Function.UNLOADING_GUEST_DRIVER, payloads.encode_unloading())
    assert peer.unloaded and reply.payload == bytes(8)
    # the peer echoes the request's header (see rpc.py)
    assert reply.sequence == peer.requests[-1].sequence


def test_no_reply_times_out() -> None:
    layout = q.Layout(8 * 4096, 8 * 4096)
    rpc, peer = connect(layout, timeout_s=0.05, auto=False, sleep=lambda _left: None)
    with pytest.raises(r.RpcTimeout, match="GPU 0: the GSP sent no GSP_RM_ALLOC"):
        rpc.call(r.Function.GSP_RM_ALLOC, payloads.encode_alloc(1, 0, 1, 0))
    assert peer.requests == []


def test_a_full_command_queue_waits_while_the_status_queue_drains() -> None:
    events: list[r.Incoming] = []
    layout = q.Layout(8 * 4096, 8 * 4096)
    rpc, peer = connect(layout, events=events, auto=False)
    for i in range(12):  # more than either queue holds; the GSP serves only when we sleep
        peer.event(0x1006, peer_module().Peer.os_error_log(i, 0, f"log {i}"))
    for _ in range(5):
        rpc.post(r.Function.GSP_SET_SYSTEM_INFO, bytes(9000))  # three elements each
    rpc.poll()
    peer.service()
    while rpc.poll():
        peer.service()
    assert [ev.decode_os_error_log(e.payload).except_type for e in events] == list(range(12))
    assert len(peer.requests) == 5


# ---- replies matched by sequence (kernel_gsp.c _kgspRpcDrainOneEvent, 580.82.07 on) -----------


def late_then_on_time(peer: Any, rpc: r.Rpc, function: int) -> None:
    """Make ``function``'s next request time out with GSP-RM answering it late: its reply
    arrives once the caller gave up, before the next request's."""
    peer.late.add(function)
    rpc.timeout_s = 0.05


def test_a_late_alloc_reply_is_dropped_and_the_next_alloc_gets_its_own() -> None:
    """GSP-RM refuses an alloc but answers after the caller gave up (RpcTimeout); the next
    GSP_RM_ALLOC gets its own answer (made), not the stale refusal, which is kept as an
    unexpected reply with the first request's sequence."""
    events: list[r.Incoming] = []
    rpc, peer = connect(events=events, alloc_status={0x90F1: NV_ERR_NO_MEMORY})
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    rm.alloc(rm.client, dev, 0x80)
    rpc.silent_after = None  # a GSP that answers late, not one taken as gone at its timeout
    late_then_on_time(peer, rpc, gsp_peer.FN_GSP_RM_ALLOC)
    refused = rm.new_handle()
    with pytest.raises(r.RpcTimeout, match="sent no GSP_RM_ALLOC"):
        rm.alloc(dev, refused, 0x90F1, bytearray(8))
    stale = peer.requests[-1].sequence  # the timed-out request's, as the GSP read it
    peer.late.clear()
    rpc.timeout_s = 5.0
    assert peer.send_late() == 1  # the refusal, now in the status queue first
    sub = rm.new_handle()
    params = bytearray(b"\x11" * 8)
    assert rm.alloc(dev, sub, 0x2080, params) == sub  # its own answer: made
    assert sub in peer.objects and refused not in peer.objects
    (dropped,) = rpc.unexpected
    assert rpc.unexpected_count == 1 and events == []  # not an event: not handed on
    assert (dropped.function, dropped.sequence) == (r.Function.GSP_RM_ALLOC, stale)
    answer = gsp_peer.parse_alloc(dropped.payload)
    assert (answer.handle, answer.status) == (refused, NV_ERR_NO_MEMORY)
    rm.control(dev, 0x123, bytearray(4))  # the queues are still in step
    assert len(rpc.unexpected) == 1


def test_a_late_control_reply_in_continuation_records_is_dropped_whole() -> None:
    """A control answered late in three messages (its first and two continuation records,
    numbered from its request's sequence): the next control of the same command gets its own
    params back, and every record of the stale reply is dropped."""
    rpc, peer = connect(control_answer={0x2080AAAA: lambda p: bytes(b ^ 0xFF for b in p)})
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    rm.alloc(rm.client, dev, 0x80)
    rpc.silent_after = None  # a GSP that answers late, not one taken as gone at its timeout
    late_then_on_time(peer, rpc, gsp_peer.FN_GSP_RM_CONTROL)
    with pytest.raises(r.RpcTimeout):
        rm.control(dev, 0x2080AAAA, bytearray(b"\x01" * 150_000))
    stale = peer.requests[-1].sequence  # the timed-out request's first, as the GSP read it
    assert peer.requests[-1].records == 3
    peer.late.clear()
    rpc.timeout_s = 5.0
    assert peer.send_late() == 3
    mine = os.urandom(150_000)
    params = bytearray(mine)
    rm.control(dev, 0x2080AAAA, params)
    assert params == bytes(b ^ 0xFF for b in mine)  # not the stale b"\xfe" * 150000
    assert [(u.function, u.sequence) for u in rpc.unexpected] == [
        (r.Function.GSP_RM_CONTROL, stale), (r.Function.CONTINUATION_RECORD, stale + 1),
        (r.Function.CONTINUATION_RECORD, stale + 2)]
    assert peer.requests[-1].sequence == stale + 3  # the next request took the next numbers


def test_a_reply_with_a_sequence_not_yet_sent_is_dropped_and_the_wait_goes_on() -> None:
    """A reply whose sequence is none the CPU sent (from the future) is no answer either:
    CPU-RM's _kgspRpcDrainOneEvent hands it to _kgspProcessRpcEvent, which logs it and drops
    it, and the wait goes on for the right one (or to its timeout)."""
    rpc, peer = connect()
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    rm.alloc(rm.client, dev, 0x80)
    p = peer_module().Peer
    future = peer.requests[-1].sequence + 1000  # none the CPU sent
    forged = payloads.encode_control(rm.client, dev, 0x123, b"\xee" * 4)
    peer.before_reply.append(p.message(r.Function.GSP_RM_CONTROL, forged, 0, future))
    params = bytearray(b"\x01\x02\x03\x04")
    rm.control(dev, 0x123, params)
    assert params == b"\x01\x02\x03\x04"  # its own answer, not the forged one's
    (dropped,) = rpc.unexpected
    assert (dropped.function, dropped.sequence) == (r.Function.GSP_RM_CONTROL, future)
    # and with no right one to come: the wait ends at its deadline, the forged one dropped
    peer.late.add(gsp_peer.FN_GSP_RM_CONTROL)
    peer.before_reply.append(p.message(r.Function.GSP_RM_CONTROL, forged, 0, future + 1))
    rpc.timeout_s = 0.05
    with pytest.raises(r.RpcTimeout):
        rm.control(dev, 0x123, bytearray(4))
    assert [u.sequence for u in rpc.unexpected] == [future, future + 1]


def test_a_late_reply_a_poll_reads_is_dropped_not_handed_on() -> None:
    """A late answer read while no RPC waits (the device's poll) is no event: kept as
    unexpected, the events around it handed on in order."""
    events: list[r.Incoming] = []
    rpc, peer = connect(events=events)
    rm = r.RpcRM.open(rpc)
    late_then_on_time(peer, rpc, gsp_peer.FN_GSP_RM_ALLOC)
    with pytest.raises(r.RpcTimeout):
        rm.alloc(rm.client, rm.new_handle(), 0x80)
    peer.event(0x1005)
    peer.send_late()
    peer.event(0x1006, peer_module().Peer.os_error_log(1, 0, "after"))
    assert rpc.poll() == 3
    assert [e.name for e in events] == ["MMU_FAULT_QUEUED", "OS_ERROR_LOG"]
    assert [u.name for u in rpc.unexpected] == ["GSP_RM_ALLOC"]


def test_the_first_reply_decides_whether_replies_are_matched_by_sequence() -> None:
    """rpc.py: a GSP-RM whose replies carry their request's sequence is matched on it (580's
    CPU-RM), one whose replies carry 0 by function alone (570.144's CPU-RM never numbers its
    requests): every call of the second is answered, none dropped."""
    rpc, _peer = connect()
    rm = r.RpcRM.open(rpc)
    assert rpc.echoes is True
    rpc, peer = connect()
    peer.echo_sequence = False
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    rm.alloc(rm.client, dev, 0x80)
    for _ in range(5):
        rm.control(dev, 0x123, bytearray(4))
    assert rpc.echoes is False and rpc.unexpected_count == 0


def test_requests_are_numbered_from_one_so_a_zero_is_no_echo() -> None:
    rpc, peer = connect()
    peer.echo_sequence = False
    r.RpcRM.open(rpc)
    assert peer.requests[0].sequence == 1 and rpc.echoes is False


# ---- a GSP that stopped answering costs one timeout (Rpc.silent) ----------------------------


def test_after_one_timed_out_request_no_later_request_is_sent() -> None:
    """The first request that times out takes the GSP as gone (rig's silent_after 1; CPU-RM's
    bFatalError after a fatal timeout, then _kgspRpcSanityCheck's "skipping RPC"):
    on_silent is told once where, and every later call and post raises NotAnswering at once
    (a Lost, and an RpcTimeout for what GSP-RM made of the earlier ones), naming the GPU, the
    request not sent and the one the GSP stopped answering at; the peer receives nothing more,
    its doorbell unrung. A poll still reads what comes (the late reply, dropped)."""
    rpc, peer = connect()
    told: list[str] = []
    rpc.on_silent = told.append
    rm = r.RpcRM.open(rpc)
    dev = rm.new_handle()
    rm.alloc(rm.client, dev, 0x80)
    late_then_on_time(peer, rpc, gsp_peer.FN_FREE)
    with pytest.raises(r.RpcTimeout, match="the GSP sent no FREE for FREE in time"):
        rm.free(dev)
    assert rpc.silent == "FREE (the GSP sent no FREE for FREE in time)"
    assert told == ["the GSP stopped answering at " + rpc.silent]
    sent, rings = len(peer.requests), peer.rings
    rpc.timeout_s = 5.0  # were anything sent, a reply would be awaited this long
    start = time.monotonic()
    for attempt in (lambda: rm.alloc(dev, rm.new_handle(), 0x2080),
                    lambda: rm.control(dev, 0x123, bytearray(4)), lambda: rm.free(dev),
                    lambda: rpc.call(r.Function.UNLOADING_GUEST_DRIVER,
                                     payloads.encode_unloading()),
                    lambda: rpc.post(r.Function.SET_REGISTRY, b"")):
        with pytest.raises(r.NotAnswering) as e:
            attempt()
        assert isinstance(e.value, Lost) and isinstance(e.value, r.RpcTimeout)
    assert time.monotonic() - start < 0.5
    assert str(e.value) == ("the device is lost: GPU 0: SET_REGISTRY not sent: the GSP stopped "
                            "answering at FREE (the GSP sent no FREE for FREE in time); the "
                            "GPU is reset at its next open")
    peer.late.clear()
    peer.send_late()
    assert rpc.poll() == 1 and [u.name for u in rpc.unexpected] == ["FREE"]
    assert len(peer.requests) == sent and peer.rings == rings and len(told) == 1


def test_silent_after_counts_timed_out_requests() -> None:
    """With ``silent_after`` 2 (NVIDIA's RmGspRpcTimeoutGpuResetThreshold counts alike, 3 by
    default) the first timeout leaves the GSP answering, the second takes it as gone; None
    never does (the late-reply tests above)."""
    rpc, peer = connect()
    rpc.silent_after = 2
    rm = r.RpcRM.open(rpc)
    late_then_on_time(peer, rpc, gsp_peer.FN_GSP_RM_CONTROL)
    with pytest.raises(r.RpcTimeout) as e:
        rm.control(rm.client, 0x123, bytearray(4))
    assert not isinstance(e.value, Lost)  # one timeout of two: the GSP still answers
    assert rpc.silent is None and rpc.timeouts == 1
    with pytest.raises(r.NotAnswering, match="taken as not answering, so the GPU is lost"):
        rm.control(rm.client, 0x123, bytearray(4))  # the timeout that silences it is Lost
    assert rpc.silent is not None and rpc.silent.startswith("GSP_RM_CONTROL (")
    with pytest.raises(r.NotAnswering):
        rm.control(rm.client, 0x123, bytearray(4))


def test_queues_that_fail_take_the_gsp_as_gone() -> None:
    """A status queue that reads garbled (a QueueError) in a poll, or in a request's wait,
    takes the GSP as gone at once, whatever ``silent_after``: the queues are out of step."""
    for where in ("poll", "call"):
        rpc, _ = connect()
        rpc.silent_after = None
        rm = r.RpcRM.open(rpc)

        def garbled() -> None:
            raise q.QueueCorrupt("GPU 0: the GSP status queue's header is unusable")

        rpc.queues.receive = garbled  # type: ignore[method-assign,assignment]
        with pytest.raises(q.QueueCorrupt):
            if where == "poll":
                rpc.poll()
            else:
                rm.control(rm.client, 0x123, bytearray(4))
        what = "a poll of its queues" if where == "poll" else "GSP_RM_CONTROL"
        assert rpc.silent == f"{what} (the GSP status queue's header is unusable)"
        with pytest.raises(r.NotAnswering, match=rf"stopped answering at {what} \("):
            rm.free(rm.client)
