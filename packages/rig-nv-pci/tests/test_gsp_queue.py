"""The GSP message queues against the GSP peer of the simulated GPU (tests/sim/gsp_peer.py).

Sizes asserted against open-gpu-kernel-modules 570.144: message_queue_priv.h
(GSP_MSG_QUEUE_ELEMENT, GSP_MSG_QUEUE_ELEMENT_SIZE_MIN/MAX), msgq_priv.h (msgqTxHeader 8 x u32,
msgqRxHeader 1 x u32), message_queue_cpu.c (two 256 KiB queues, page table), dev_gsp.h
(NV_PGSP_QUEUE_HEAD(0) = 0x110c00); nova-core's MSGQ_NUM_PAGES (0x3f) agrees on 63 elements.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
from sim import peer_module

from rig_edge import Misuse, RigError
from rig_nv_pci.gsp import queue as q
from rig_nv_pci.gsp.rpc import header

SMALL = q.Layout(8 * 4096, 8 * 4096)  # 7 elements a queue: wraps quickly


def pair(layout: q.Layout = SMALL, *, boot: bool = True, **peer_kw: Any) -> tuple[q.QueuePair, Any]:
    shared = memoryview(bytearray(layout.size))
    peer = peer_module().Peer(shared, layout.command_offset, layout.status_offset,
                              layout.status_size, **peer_kw)
    queues = q.QueuePair(shared, layout, doorbell=peer.doorbell, name="GPU 0")
    queues.create()
    if boot:
        peer.boot()
    return queues, peer


def rpc(function: int, payload: bytes, sequence: int = 0) -> bytes:
    return header(function, 32 + len(payload), sequence) + payload


GET_STATIC_INFO = 65  # the peer answers it with as many bytes as it was sent


def test_sizes_match_nvidia_headers() -> None:
    assert q.ELEMENT_HEADER_SIZE == 48  # offsetof(GSP_MSG_QUEUE_ELEMENT, rpc): 44 aligned to 8
    assert q.MESSAGE_MIN == 80  # sizeof(GSP_MSG_QUEUE_ELEMENT) with a 32-byte rpc_message_header_v
    assert (q.CHECKSUM_AT, q.SEQ_AT, q.COUNT_AT) == (32, 36, 40)
    assert (q.ELEMENT_SIZE, q.ELEMENT_SIZE_MAX, q.RPC_SIZE_MAX) == (4096, 65536, 65536 - 48)
    assert q.TX_HEADER.size == 32 and q.RX_HEADER.size == 4 and q.WRITE_PTR_AT == 16
    assert (q.RX_HEADER_OFFSET, q.ENTRY_OFFSET) == (32, 4096)
    assert q.QUEUE_HEAD == 0x110C00
    d = q.Layout()
    assert (d.command_size, d.status_size) == (0x40000, 0x40000)
    assert d.page_table_entries == 128 + 1  # both queues' pages plus the table's one page
    assert (d.page_table_size, d.command_offset, d.status_offset) == (4096, 4096, 4096 + 0x40000)
    assert d.size == 4096 + 2 * 0x40000
    assert d.queue_elements(d.command_size) == 0x3F


def test_checksum_is_nvidias_fold_and_agrees_with_an_independent_one() -> None:
    data = os.urandom(4096)
    words = struct.unpack("<512Q", data)
    x = 0
    for w in words:
        x ^= w
    assert q.checksum32(data, 4096) == (x >> 32) ^ (x & 0xFFFFFFFF)
    for n in (1, 7, 8, 13, 80, 4095):  # read on to the next multiple of 8 (zeros past the end)
        assert q.checksum32(data[:n], n) == peer_module().nova_checksum(data[:n])
    assert q.checksum32(data, 13) == peer_module().nova_checksum(data[:16])


def test_page_table() -> None:
    shared = memoryview(bytearray(SMALL.size))
    bus = [0x1_0000_0000 + i * 4096 for i in range(SMALL.page_table_entries)]
    q.write_page_table(shared, SMALL, bus)
    assert list(struct.unpack_from(f"<{len(bus)}Q", shared)) == bus
    with pytest.raises(Misuse):
        q.write_page_table(shared, SMALL, bus[:-1])


def test_headers_written_as_msgq_does() -> None:
    queues, peer = pair()
    mem = peer.mem  # the shared memory as the GSP sees it
    tx = q.TX_HEADER.unpack_from(mem, SMALL.command_offset)
    assert tx == (0, SMALL.command_size, 4096, 7, 0, q.MSGQ_FLAGS_SWAP_RX, 32, 4096)
    assert queues.link() and queues.linked
    assert peer.stat_count == 7


def test_nothing_to_read_before_the_gsp_makes_its_queue() -> None:
    queues, peer = pair(boot=False)
    assert queues.receive() is None and not queues.linked
    peer.boot()
    assert queues.receive() is None and queues.linked


def test_an_unusable_status_queue_header_is_refused() -> None:
    queues, peer = pair()
    struct.pack_into("<I", peer.mem, SMALL.status_offset + 8, 2048)  # msgSize
    with pytest.raises(q.QueueCorrupt, match=r"GPU 0: .*status queue.*msgSize 2048"):
        queues.link()


def test_many_messages_wrap_both_queues() -> None:
    queues, peer = pair()
    seen = []
    for i in range(60):
        payload = bytes([i]) * (100 + (i % 3) * 4096)  # one to two elements
        seq = queues.send(rpc(GET_STATIC_INFO, payload, i))
        assert seq == i
        m = queues.receive()
        assert m is not None and m.seq == i and m.function == GET_STATIC_INFO
        assert m.rpc[32:] == bytes(len(payload))  # the peer's answer: as many zero bytes
        seen.append(m.element)
    assert [r.payload[:1] for r in peer.requests] == [bytes([i]) for i in range(60)]
    assert [r.seqnums for r in peer.requests] == [[i] for i in range(60)]
    assert min(seen) == 0 and max(seen) == 6 and seen.count(0) > 1  # wrapped many times
    assert queues.receive() is None


def test_a_message_of_several_elements_across_the_end() -> None:
    queues, peer = pair(auto=False)
    for _ in range(5):  # move the write pointer near the end
        queues.send(rpc(GET_STATIC_INFO, b"x" * 10))
    peer.service()
    while queues.receive() is not None:
        pass
    payload = os.urandom(3 * 4096 - 48 - 32)  # exactly three elements: 5, 6, 0
    queues.send(rpc(GET_STATIC_INFO, payload))
    assert struct.unpack_from("<I", peer.mem, SMALL.command_offset + 16)[0] == 1
    peer.service()
    assert peer.requests[-1].payload == payload
    m = queues.receive()
    assert m is not None and m.elements == 3 and m.element == 5 and len(m.rpc) == 32 + len(payload)


def test_full_queue_raises_or_waits_through_the_callback() -> None:
    queues, peer = pair(auto=False)
    for _ in range(3):
        queues.send(rpc(GET_STATIC_INFO, b"y" * 5000))  # two elements each: 6 of 7 used
    assert queues.free_elements() == 0
    write = struct.unpack_from("<I", peer.mem, SMALL.command_offset + 16)[0]
    with pytest.raises(q.QueueFull, match=r"GPU 0: the GSP command queue is full.*needs 1") as e:
        queues.send(rpc(GET_STATIC_INFO, b"z"))
    assert isinstance(e.value, RigError) and (e.value.needed, e.value.free) == (1, 0)
    assert struct.unpack_from("<I", peer.mem, SMALL.command_offset + 16)[0] == write
    calls = []

    def on_full(needed: int, free: int) -> bool:
        calls.append((needed, free))
        peer.service()
        return True

    queues.send(rpc(GET_STATIC_INFO, b"z"), on_full)
    assert calls == [(1, 0)]
    with pytest.raises(q.QueueFull):  # the callback gives up
        for _ in range(10):
            queues.send(rpc(GET_STATIC_INFO, b"w" * 5000), lambda n, f: False)


def test_messages_that_never_fit_are_misuse() -> None:
    queues, _ = pair()
    with pytest.raises(Misuse, match="never fits"):
        queues.send(rpc(GET_STATIC_INFO, bytes(7 * 4096)))
    with pytest.raises(Misuse):
        queues.send(rpc(GET_STATIC_INFO, bytes(70000)))
    with pytest.raises(Misuse, match="length"):
        queues.send(header(GET_STATIC_INFO, 99, 0) + b"abc")


def test_bad_checksum_names_queue_seq_and_element() -> None:
    queues, peer = pair()
    peer.event(0x1005)
    assert queues.receive() is not None  # seq 0 at element 0
    peer.corrupt_next = True
    peer.event(0x1006, b"x" * 300)
    with pytest.raises(q.BadChecksum, match=r"GPU 0: bad checksum in the GSP status queue: "
                       r"message seq 1 at element 1") as e:
        queues.receive()
    assert (e.value.queue, e.value.seq, e.value.element) == ("status queue", 1, 1)
    assert queues.available() == 1  # left in the queue


def test_a_sequence_gap_is_refused() -> None:
    queues, peer = pair()
    peer.tx_seq = 5
    peer.event(0x1005)
    with pytest.raises(q.QueueCorrupt, match="seq 5, expected 0"):
        queues.receive()


def test_a_wild_read_pointer_is_refused() -> None:
    queues, peer = pair()
    queues.link()
    struct.pack_into("<I", peer.mem, SMALL.status_offset + 32, 99)
    with pytest.raises(q.QueueCorrupt, match=r"read pointer .* 99"):
        queues.send(rpc(GET_STATIC_INFO, b""))


def test_the_queues_need_enough_writable_memory() -> None:
    with pytest.raises(Misuse):
        q.QueuePair(memoryview(bytearray(100)), SMALL, doorbell=lambda: None)
    with pytest.raises(Misuse):
        q.QueuePair(memoryview(bytes(SMALL.size)), SMALL, doorbell=lambda: None)
    with pytest.raises(Misuse):
        q.Layout(4096, 4096 * 8)
