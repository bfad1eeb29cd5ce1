"""The staged copy pipeline without a GPU: a stand-in device whose copy engine is memmove on
host memory (GPU address = host address), decoding the copy methods rig_nv.push writes."""

from __future__ import annotations

import ctypes
import os
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


class FakeMemory:
    """What copies.Staging takes of a device's memory: its staging allocation."""

    def __init__(self, path: FakePath) -> None:
        self.path = path
        self.made: Allocation | None = None

    def staging(self) -> Allocation:
        if self.made is None:
            self.made = self.path.alloc_memory(copies.STAGING, Memory.PINNED)
        return self.made


class FakeTimeline:
    """What copies.Staging takes of a device's timeline; the copy engine copies at submit
    time."""

    def __init__(self) -> None:
        self.next = 1
        self.copy_channel = object()
        self.waited: list[int] = []

    def current(self) -> int:
        return self.next - 1

    def point(self, value: int) -> Point:
        return Point(value)

    def wait_value(self, value: int) -> None:
        self.waited.append(value)

    def submit(self, channel: object, body: Any, name: str = "work") -> Point:
        words, i, regs = list(body), 0, {}
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
        self.next += 1
        return Point(self.next - 1)

    def copy(self, to: int, fro: int, n: int, name: str = "copy") -> Point:
        """Timeline.copy: the copy engine's words, executed as submit does."""
        return self.submit(self.copy_channel, Push().copy(to, fro, n).words, name)


class FakeDevice:
    """A stand-in device's staging: its path, memory and timeline."""

    def __init__(self) -> None:
        self.path = FakePath()
        self.timeline = FakeTimeline()
        self.staging = copies.Staging(FakeMemory(self.path).staging, self.timeline)  # type: ignore[arg-type]


def device_region(d: FakeDevice, n: int) -> tuple[Region, bytearray]:
    a = d.path.alloc_memory(n, Memory.DEVICE)
    return Region(a.gpu, None, n, Memory.DEVICE), d.path.kept[-1]


@pytest.mark.parametrize("n", [1, 4097, copies.STAGING // 2, copies.STAGING * 2 + 12345])
def test_staged_upload_and_download_round_trip(n: int) -> None:
    d: Any = FakeDevice()
    region, memory = device_region(d, n + 64)
    data = os.urandom(n)
    d.staging.upload(region, memoryview(data), 7)
    assert bytes(memory[7 : 7 + n]) == data
    out = memoryview(bytearray(n))
    d.staging.download(region, n, 7, out)
    assert bytes(out) == data


def test_staging_halves_are_waited_for_before_reuse() -> None:
    d: Any = FakeDevice()
    n = copies.STAGING * 2  # four halves: the third and fourth reuse the first two
    region, _ = device_region(d, n)
    d.staging.upload(region, memoryview(os.urandom(n)), 0)
    first, second = d.staging.busy[0], d.staging.busy[1]
    assert (first, second) == (3, 4)  # the last value submitted into each half
    # half 0 and 1 were waited for before reuse
    assert 1 in d.timeline.waited and 2 in d.timeline.waited
