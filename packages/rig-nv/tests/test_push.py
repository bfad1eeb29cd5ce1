"""Pushbuffer encoding (rig_nv.push), decoded back into (subchannel, method, value) writes.

Header format: NVIDIA's clc56f.h "dma method formats" (open-gpu-kernel-modules
src/common/sdk/nvidia/inc/class/clc56f.h @580.142): ADDRESS 11:0 = method >> 2, SUBCHANNEL 15:13,
COUNT 28:16, SEC_OP 31:29. The expected words are worked out by hand from those fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from rig_nv import push as pb
from rig_nv.push import Push, header

GiB = 1 << 30


@dataclass(frozen=True)
class Write:
    subchannel: int
    method: int
    value: int


def decode(words: Sequence[int]) -> list[list[Write]]:
    """The incrementing methods in ``words``: one list of writes per header."""
    out: list[list[Write]] = []
    i = 0
    while i < len(words):
        h = words[i]
        op, count, sc, addr = h >> 29, (h >> 16) & 0x1FFF, (h >> 13) & 7, h & 0xFFF
        assert op == pb.INCREMENTING, f"word {i}: 0x{h:08x} is not an incrementing header"
        assert not h & 0x1000, f"word {i}: reserved bit 12 set in 0x{h:08x}"
        data = words[i + 1 : i + 1 + count]
        assert len(data) == count, "a header promises more words than follow"
        out.append([Write(sc, (addr << 2) + 4 * k, v) for k, v in enumerate(data)])
        i += 1 + count
    return out


def u64(hi: int, lo: int) -> int:
    return hi << 32 | lo


# -- headers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "word"), [
    ((0, pb.SEM_ADDR_LO, 5), 0x20050017),         # host semaphore: 5 words at 0x5C on sc0
    ((1, pb.SET_OBJECT, 1), 0x20012000),           # SET_OBJECT compute on sc1
    ((4, pb.SET_OBJECT, 1), 0x20018000),           # SET_OBJECT copy on sc4
    ((4, pb.CE_OFFSET_IN_UPPER, 4), 0x20048100),   # OFFSET_IN/OUT, 4 words on sc4
    ((4, pb.CE_LINE_LENGTH_IN, 1), 0x20018106),
    ((4, pb.CE_LAUNCH_DMA, 1), 0x200180C0),
    ((0, pb.MEM_OP_A, 4), 0x2004000A),             # sysmembar's header
    ((0, pb.NON_STALL_INTERRUPT, 1), 0x20010008),
    ((0, 0x3FFC, 0x1FFF), 0x3FFF0FFF),             # the largest method and count
])
def test_header_words(args: tuple[int, int, int], word: int) -> None:
    assert header(*args) == word


def test_header_fields() -> None:
    h = header(5, 0x1698, 7, pb.NON_INCREMENTING)
    assert h >> 29 == 3
    assert (h >> 16) & 0x1FFF == 7
    assert (h >> 13) & 7 == 5
    assert (h & 0xFFF) << 2 == 0x1698
    assert header(0, 0, 0) == 0x20000000  # a header with no words is a no-op


@pytest.mark.parametrize(("count", "method"), [
    (0x2000, 0), (-1, 0), (1, 0x5E), (1, 0x2), (1, 0x8000),
])
def test_header_refuses(count: int, method: int) -> None:
    with pytest.raises(ValueError):
        header(0, method, count)


def test_header_refuses_methods_past_the_address_field() -> None:
    with pytest.raises(ValueError):
        header(0, 0x4000, 1)


def test_header_refuses_subchannels_past_seven() -> None:
    with pytest.raises(ValueError):
        header(8, 0, 1)


def test_method_appends_header_and_data() -> None:
    p = Push().method(4, pb.CE_OFFSET_IN_UPPER, 1, 2, 3, 4)
    assert list(p.words) == [0x20048100, 1, 2, 3, 4]
    assert len(p) == 5
    assert decode(p.words) == [[Write(4, 0x400, 1), Write(4, 0x404, 2), Write(4, 0x408, 3),
                                Write(4, 0x40C, 4)]]


def test_set_object() -> None:
    p = Push().set_object(pb.SUBC_COMPUTE, 0xCBC0).set_object(pb.SUBC_COPY, 0xC8B5)
    assert list(p.words) == [0x20012000, 0xCBC0, 0x20018000, 0xC8B5]


def test_hi_lo_and_lo_hi() -> None:
    assert pb.hi_lo(0x0123_4567_89AB_CDEF) == (0x0123_4567, 0x89AB_CDEF)
    assert pb.lo_hi(0x0123_4567_89AB_CDEF) == (0x89AB_CDEF, 0x0123_4567)


# -- host semaphores -------------------------------------------------------------------------

ADDR = 0x60_1234_5670
VALUE = 0x1_0000_0007


def test_semaphore_release() -> None:
    """SEM_ADDR_LO/HI, PAYLOAD_LO/HI, then SEM_EXECUTE = RELEASE | RELEASE_WFI | 64-bit
    (0x01100001), and no interrupt unless asked for."""
    p = Push().semaphore_release(ADDR, VALUE)
    assert list(p.words) == [0x20050017, ADDR & 0xFFFFFFFF, ADDR >> 32,
                             VALUE & 0xFFFFFFFF, VALUE >> 32, 0x01100001]
    (sem,) = decode(p.words)
    assert [w.method for w in sem] == [0x5C, 0x60, 0x64, 0x68, 0x6C]
    assert {w.subchannel for w in sem} == {pb.SUBC_HOST}
    assert u64(sem[1].value, sem[0].value) == ADDR
    assert u64(sem[3].value, sem[2].value) == VALUE
    execute = sem[4].value
    assert execute & 7 == pb.SEM_OP_RELEASE
    assert execute & pb.SEM_RELEASE_WFI and execute >> 20 & 1
    assert execute >> 24 & 1  # PAYLOAD_SIZE 64BIT
    assert not execute & pb.SEM_RELEASE_TIMESTAMP


def test_semaphore_release_with_an_interrupt() -> None:
    """Issue 23: the non-stall interrupt only where a path waits on it -- asked for, a
    NON_STALL_INTERRUPT (host method 0x20, clc86f.h) follows the release."""
    p = Push().semaphore_release(ADDR, VALUE, interrupt=True)
    _, intr = decode(p.words)
    assert list(p.words[:6]) == list(Push().semaphore_release(ADDR, VALUE).words)
    assert intr == [Write(0, pb.NON_STALL_INTERRUPT, 0)]


def test_semaphore_release_with_timestamp() -> None:
    p = Push().semaphore_release(ADDR, VALUE, timestamp=True)
    (sem,) = decode(p.words)
    assert sem[4].value == 0x03100001  # RELEASE_TIMESTAMP 25:25 added


def test_semaphore_acquire() -> None:
    """Wait until the 64-bit value is >= VALUE, wrapping (ACQ_CIRC_GEQ), switching TSG while
    it waits: exec 0x01001003."""
    p = Push().semaphore_acquire(ADDR, VALUE)
    (sem,) = decode(p.words)
    assert p.words[0] == 0x20050017
    assert u64(sem[1].value, sem[0].value) == ADDR
    assert u64(sem[3].value, sem[2].value) == VALUE
    execute = sem[4].value
    assert execute == 0x01001003
    assert execute & 7 == pb.SEM_OP_ACQ_CIRC_GEQ
    assert execute >> 12 & 1  # ACQUIRE_SWITCH_TSG
    assert execute >> 24 & 1  # 64-bit
    assert not execute >> 20 & 1  # no release WFI on an acquire


def test_sysmembar() -> None:
    p = Push().sysmembar()
    assert list(p.words) == [0x2004000A, 0, 0, 0, 0x28000000]


# -- copies ----------------------------------------------------------------------------------


def launches(words: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """(src, dst, length, LAUNCH_DMA flags) of each copy in ``words``, checking the order of
    methods: OFFSET_IN/OUT, LINE_LENGTH_IN, LAUNCH_DMA, all on the copy subchannel."""
    groups = decode(words)
    assert len(groups) % 3 == 0
    out = []
    for k in range(0, len(groups), 3):
        offsets, length, launch = groups[k : k + 3]
        assert [w.method for w in offsets] == [0x400, 0x404, 0x408, 0x40C]
        assert [w.method for w in length] == [0x418]
        assert [w.method for w in launch] == [0x300]
        assert {w.subchannel for w in offsets + length + launch} == {pb.SUBC_COPY}
        src = u64(offsets[0].value, offsets[1].value)  # the copy engine takes upper, lower
        dst = u64(offsets[2].value, offsets[3].value)
        out.append((src, dst, length[0].value, launch[0].value))
    return out


def test_small_copy() -> None:
    src, dst = 0x2_0000_0000, 0x60_0000_1000
    p = Push().copy(dst, src, 4096)
    assert list(p.words) == [0x20048100, 0x2, 0x0, 0x60, 0x1000, 0x20018106, 4096,
                             0x200180C0, 0x182]
    assert launches(p.words) == [(src, dst, 4096, 0x182)]


def test_copy_of_5_gib_is_three_launches() -> None:
    """2 GiB, 2 GiB, 1 GiB; the first NON_PIPELINED, the rest PIPELINED; pitch layouts."""
    src, dst = 0x7F00_0000_0000, 0x10_0000_0000
    got = launches(Push().copy(dst, src, 5 * GiB).words)
    assert [(s - src, d - dst, n) for s, d, n, _ in got] == [
        (0, 0, 2 * GiB), (2 * GiB, 2 * GiB, 2 * GiB), (4 * GiB, 4 * GiB, GiB)]
    flags = [f for *_, f in got]
    assert [f & 3 for f in flags] == [pb.CE_TRANSFER_NON_PIPELINED, pb.CE_TRANSFER_PIPELINED,
                                      pb.CE_TRANSFER_PIPELINED]
    for f in flags:
        assert f & pb.CE_SRC_PITCH and f & pb.CE_DST_PITCH
        assert not f & pb.CE_FLUSH_ENABLE
        assert not f & (3 << 3)  # no semaphore
    assert flags == [0x182, 0x181, 0x181]


def test_copy_chunks_never_exceed_the_line_length() -> None:
    for length in (1, 4, 2 * GiB - 1, 2 * GiB, 2 * GiB + 1, 4 * GiB, 4 * GiB + 12):
        got = launches(Push().copy(0x1000, 0x2000, length).words)
        assert sum(n for _, _, n, _ in got) == length
        assert all(0 < n <= pb.CE_MAX_LINE for _, _, n, _ in got)
        assert len(got) == -(-length // pb.CE_CHUNK)
        # Each chunk starts where the previous one ended, on both sides.
        at = 0
        for s, d, n, _ in got:
            assert (s - 0x2000, d - 0x1000) == (at, at)
            at += n


@pytest.mark.parametrize("length", [0, -1])
def test_copy_refuses_a_length_that_is_not_positive(length: int) -> None:
    p = Push()
    with pytest.raises(ValueError):
        p.copy(0x1000, 0x2000, length)
    assert len(p) == 0


def test_a_submission_as_the_device_builds_it() -> None:
    """acquire on the previous value, a copy, release of this value: all decodable in order."""
    tl = 0x60_0000_0000
    p = Push().semaphore_acquire(tl, 6).copy(0x1000, 0x2000, 64).semaphore_release(tl, 7)
    methods = [[w.method for w in g] for g in decode(p.words)]
    assert methods == [[0x5C, 0x60, 0x64, 0x68, 0x6C], [0x400, 0x404, 0x408, 0x40C], [0x418],
                       [0x300], [0x5C, 0x60, 0x64, 0x68, 0x6C]]
