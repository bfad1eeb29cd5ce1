"""rig_nv.channel.Channel over plain host memory: no GPU, no driver.

The ring, USERD's GP_PUT, the usermode page and the pushbuffer are bytearrays; ``wait`` records
the timeline values the channel waits for. GP entry layout per NVIDIA's clc86f.h
(NVC86F_GP_ENTRY0/1: GET 31:2, GET_HI 39:32, LEVEL bit 41, LENGTH in dwords from bit 42, SYNC
bit 63); the doorbell NOTIFY_CHANNEL_PENDING is at 0x90 of the usermode page (clc361.h).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import pytest

from rig_nv import channel as channel_module
from rig_nv.channel import Channel, Ring

PB_GPU = 0x60_0000_0000  # in the client's reservation (384 GiB up), below 2^40
TOKEN = 0x0042_0007


@dataclass
class Rig:
    """A channel and the memory behind it."""

    ch: Channel
    ring: bytearray
    userd: bytearray
    usermode: bytearray
    pb: bytearray
    waits: list[int] = field(default_factory=list)

    def entry(self, i: int) -> int:
        return int.from_bytes(self.ring[8 * i : 8 * i + 8], "little")

    @property
    def gp_put(self) -> int:
        return int.from_bytes(self.userd[0:4], "little")

    @property
    def doorbell(self) -> int:
        return int.from_bytes(self.usermode[0x90:0x94], "little")


def make(entries: int = 16, pb_length: int = 4096, pb_gpu: int = PB_GPU) -> Rig:
    ring, userd, usermode, pb = (bytearray(entries * 8), bytearray(4), bytearray(0x1000),
                                 bytearray(pb_length))
    waits: list[int] = []
    ch = Channel("compute", 0xC1D00010, memoryview(ring), memoryview(userd),
                 memoryview(usermode), TOKEN, Ring(pb_gpu, memoryview(pb), pb_length),
                 waits.append)
    return Rig(ch, ring, userd, usermode, pb, waits)


def words(*values: int) -> memoryview:
    return memoryview(array("I", values))


def fill(nbytes: int, tag: int) -> memoryview:
    """``nbytes`` of words all equal to ``tag``, so whose words lie where can be read back."""
    return words(*([tag] * (nbytes // 4)))


def owners(r: Rig) -> list[int]:
    """The tag of each 16-byte block of the pushbuffer."""
    return [int.from_bytes(r.pb[i : i + 4], "little") for i in range(0, len(r.pb), 16)]


def decode_entry(e: int) -> tuple[int, int, int, int]:
    """(address, level, length in dwords, sync) of a GP entry."""
    return e & 0xFF_FFFF_FFFC, (e >> 41) & 1, (e >> 42) & 0x1FFFFF, e >> 63


# -- one submission --------------------------------------------------------------------------


def test_submit_writes_words_entry_gp_put_and_doorbell() -> None:
    r = make()
    r.ch.submit(words(0x20050017, 1, 2, 3, 4, 0x01100001), value=1)
    assert r.pb[:24] == array("I", [0x20050017, 1, 2, 3, 4, 0x01100001]).tobytes()
    assert r.entry(0) == PB_GPU | 1 << 41 | 6 << 42
    assert decode_entry(r.entry(0)) == (PB_GPU, 1, 6, 0)  # SUBROUTINE, 6 dwords, PROCEED
    assert r.gp_put == 1
    assert r.doorbell == TOKEN
    assert r.waits == []


def test_submissions_follow_each_other() -> None:
    r = make()
    r.ch.submit(words(1, 2, 3), value=1)
    r.usermode[0x90:0x94] = bytes(4)  # to see the second doorbell
    r.ch.submit(words(4, 5), value=2)
    assert decode_entry(r.entry(1)) == (PB_GPU + 12, 1, 2, 0)
    assert r.pb[12:20] == array("I", [4, 5]).tobytes()
    assert r.pb[:12] == array("I", [1, 2, 3]).tobytes()
    assert r.gp_put == 2
    assert r.doorbell == TOKEN
    assert r.entry(2) == 0


def test_bytes_are_accepted() -> None:
    r = make()
    r.ch.submit(array("I", [7, 8]).tobytes(), value=1)
    assert decode_entry(r.entry(0)) == (PB_GPU, 1, 2, 0)
    assert r.pb[:8] == array("I", [7, 8]).tobytes()


def test_gp_put_is_written_before_the_fence_and_the_doorbell_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ring and GP_PUT may be write-combined: they must be drained before the doorbell."""
    r = make()
    seen: list[tuple[int, int, int]] = []
    monkeypatch.setattr(channel_module, "fence", lambda: seen.append(
        (r.entry(0), r.gp_put, r.doorbell)))
    r.ch.submit(words(1, 2), value=1)
    assert seen == [(PB_GPU | 1 << 41 | 2 << 42, 1, 0)]
    assert r.doorbell == TOKEN


# -- the pushbuffer ring ---------------------------------------------------------------------


def test_wrapping_waits_for_the_work_whose_words_it_overwrites() -> None:
    r = make(entries=16, pb_length=64)
    for value in (1, 2, 3, 4):  # [0,16) [16,32) [32,48) [48,64)
        r.ch.submit(fill(16, value), value)
    assert r.waits == []
    assert owners(r) == [1, 2, 3, 4]
    r.ch.submit(fill(16, 5), 5)  # no room at 64: wraps to [0,16), over 1's words only
    assert r.waits == [1]
    assert owners(r) == [5, 2, 3, 4]
    assert decode_entry(r.entry(4)) == (PB_GPU, 1, 4, 0)
    r.ch.submit(fill(24, 6), 6)  # [16,40): over 2's and part of 3's, not 4's
    assert r.waits == [1, 2, 3]
    assert owners(r) == [5, 6, 6, 4]
    assert r.pb[40:48] == fill(8, 3).tobytes()  # 3's tail is left as it was
    assert decode_entry(r.entry(5)) == (PB_GPU + 16, 1, 6, 0)


def test_retired_work_is_not_waited_for() -> None:
    r = make(entries=16, pb_length=64)
    for value in (1, 2, 3, 4):
        r.ch.submit(fill(16, value), value)
    r.ch.retire(3)
    r.ch.submit(fill(16, 5), 5)  # over 1's words: done
    r.ch.submit(fill(24, 6), 6)  # over 2's and 3's words: done
    assert r.waits == []
    r.ch.submit(fill(16, 7), 7)  # [40,56): 4's words, not retired
    assert r.waits == [4]


def test_a_submission_larger_than_half_the_pushbuffer_is_refused() -> None:
    r = make(entries=16, pb_length=64)
    with pytest.raises(ValueError):
        r.ch.submit(fill(36, 1), 1)
    assert r.gp_put == 0
    assert r.doorbell == 0
    assert r.entry(0) == 0
    assert not any(r.pb)
    r.ch.submit(fill(32, 2), 2)  # half fits
    assert decode_entry(r.entry(0)) == (PB_GPU, 1, 8, 0)


def test_pushbuffer_must_lie_below_2_to_the_40() -> None:
    make(pb_gpu=(1 << 40) - 4096)  # ends at 2^40: fine
    for gpu in ((1 << 40) - 2048, 1 << 40, 1 << 47):
        with pytest.raises(ValueError):
            make(pb_gpu=gpu)


def test_entries_address_40_bits() -> None:
    r = make(pb_gpu=(1 << 40) - 4096)
    r.ch.submit(words(1), 1)
    assert decode_entry(r.entry(0)) == ((1 << 40) - 4096, 1, 1, 0)


# -- GPFIFO entries --------------------------------------------------------------------------


def test_entries_are_reused_only_after_their_work_is_done() -> None:
    """A ring of 4 entries holds at most 3 pending ones (GP_PUT == GP_GET means empty)."""
    r = make(entries=4, pb_length=1 << 16)
    for value in (1, 2, 3):
        r.ch.submit(words(value), value)
    assert r.waits == []
    assert r.gp_put == 3
    r.ch.submit(words(4), 4)
    assert r.waits == [1]
    assert r.gp_put == 0  # 4 % 4
    assert decode_entry(r.entry(3)) == (PB_GPU + 12, 1, 1, 0)
    r.ch.submit(words(5), 5)  # into entry 0, which value 1 used
    assert r.waits == [1, 2]
    assert decode_entry(r.entry(0)) == (PB_GPU + 16, 1, 1, 0)
    assert r.gp_put == 1
    r.ch.retire(5)
    for value in (6, 7, 8):
        r.ch.submit(words(value), value)
    assert r.waits == [1, 2]
    assert r.gp_put == 0
