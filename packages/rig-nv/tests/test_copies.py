"""The staged copy pipeline without a GPU: a stand-in device whose copy engine is memmove on
host memory (GPU address = host address), decoding the copy methods rig_nv.push writes."""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import pytest

from rig_edge import Memory, Region
from rig_nv import copies
from rig_nv.push import CE_LAUNCH_DMA, CE_LINE_LENGTH_IN, CE_OFFSET_IN_UPPER, Push
from rig_nv.rm import Allocation


class Point:
    def __init__(self, value: int) -> None:
        self.value = value


class FakePath:
    def __init__(self) -> None:
        self.kept: list[bytearray] = []

    def alloc_memory(self, n: int, kind: Memory, *, contiguous: bool = False) -> Allocation:
        buf = bytearray(n)
        self.kept.append(buf)
        address = ctypes.addressof((ctypes.c_char * n).from_buffer(buf))
        return Allocation(address, address, n, kind, 0)


class FakeDevice:
    """What copies.py touches of a Device; the copy engine copies at submit time."""

    def __init__(self) -> None:
        self.path = FakePath()
        self._staging: Allocation | None = None
        self._staging_lock = threading.Lock()
        self._staging_busy = [0, 0]
        self._own: list[Allocation] = []
        self._next = 1
        self.copy_channel = object()
        self.waited: list[int] = []
        self.facts = type("F", (), {"name": "fake"})()

    def _wait_value(self, value: int) -> None:
        self.waited.append(value)

    def _submit(self, channel: object, body: Push, name: str = "work") -> Point:
        words, i, regs = list(body.words), 0, {}
        while i < len(words):
            head = words[i]
            count, method = (head >> 16) & 0x1FFF, (head & 0xFFF) << 2
            for k in range(count):
                regs[method + 4 * k] = words[i + 1 + k]
            if method == CE_LAUNCH_DMA:
                src = (regs[CE_OFFSET_IN_UPPER] << 32) | regs[CE_OFFSET_IN_UPPER + 4]
                dst = (regs[CE_OFFSET_IN_UPPER + 8] << 32) | regs[CE_OFFSET_IN_UPPER + 12]
                ctypes.memmove(dst, src, regs[CE_LINE_LENGTH_IN])
            i += 1 + count
        self._next += 1
        return Point(self._next - 1)


def device_region(d: FakeDevice, n: int) -> tuple[Region, bytearray]:
    a = d.path.alloc_memory(n, Memory.DEVICE)
    return Region(a.gpu, None, n, Memory.DEVICE), d.path.kept[-1]


@pytest.mark.parametrize("n", [1, 4097, copies.STAGING // 2, copies.STAGING * 2 + 12345])
def test_staged_upload_and_download_round_trip(n: int) -> None:
    d: Any = FakeDevice()
    region, memory = device_region(d, n + 64)
    data = os.urandom(n)
    copies.staged_upload(d, region, memoryview(data), 7)
    assert bytes(memory[7 : 7 + n]) == data
    out = memoryview(bytearray(n))
    copies.staged_download(d, region, n, 7, out)
    assert bytes(out) == data


def test_staging_halves_are_waited_for_before_reuse() -> None:
    d: Any = FakeDevice()
    n = copies.STAGING * 2  # four halves: the third and fourth reuse the first two
    region, _ = device_region(d, n)
    copies.staged_upload(d, region, memoryview(os.urandom(n)), 0)
    first, second = d._staging_busy[0], d._staging_busy[1]
    assert (first, second) == (3, 4)  # the last value submitted into each half
    assert 1 in d.waited and 2 in d.waited  # half 0 and 1 were waited for before reuse
