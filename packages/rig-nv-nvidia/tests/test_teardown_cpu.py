"""The kernel path's part of a device's stop, each fallible call failed in turn (rig_nv.inject),
on the stand-in kernel driver (fake_kernel.py): two channels' UVM detach and the free of
Device, Pinned and map_host memory (rig_nv.rm.Path's detach_channel and free_memory).

After the failure nothing is handed out twice: where UVM's range or channel remains, its
addresses stay taken (path.py free_memory: "a failure leaks addresses, never a later
allocation"). Tried again, as the device's stop tries a failed step, everything goes back: no
RM object, UVM range or channel stays, the reservation is whole again, and nothing is mapped
but the reservation's inaccessible pages. The device's own walks are rig-nv's test_walks.py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_kernel import FakeKernel
from test_kernel_driver_cpu import opened_path

from rig_edge import Memory, RigError
from rig_nv import inject
from rig_nv.hostmem import MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE, mmap, munmap
from rig_nv.rm import Allocation
from rig_nv_nvidia.path import NvidiaPath

CHANNELS = (0xCAFE0001, 0xCAFE0002)  # RM handles of two channels (any the RM would give)
HOST = 8192  # bytes of the host buffer map_host maps


def maps(lo: int, hi: int) -> list[tuple[int, int, str]]:
    """The process's mappings that overlap [lo, hi): (start, end, permissions)."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            span, perms = line.split()[:2]
            start, end = (int(x, 16) for x in span.split("-"))
            if start < hi and lo < end:
                out.append((start, end, perms))
    return out


@dataclass
class Made:
    kernel: Any
    path: NvidiaPath
    memory: list[Allocation]
    host: int  # the buffer map_host mapped (the caller's own)
    objects: dict[int, tuple[int, int]]  # the RM's objects before any of it was made
    free_va: list[tuple[int, int]]  # the reservation's free runs before
    channel_va: list[tuple[int, int]]  # the addresses UVM was given for the channels

    def teardown(self) -> list[BaseException]:
        """What a device's stop asks of the path: every step tried, the failures returned."""
        failures: list[BaseException] = []
        for h in CHANNELS:
            try:
                self.path.detach_channel(h)
            except RigError as e:
                failures.append(e)
        for a in self.memory:
            try:
                self.path.free_memory(a)
            except RigError as e:
                failures.append(e)
        return failures


def made(root: Path, monkeypatch: pytest.MonkeyPatch) -> Made:
    """A fresh stand-in kernel, the path of GPU 0 on it, two channels and memory of each kind."""
    root.mkdir()
    kernel = FakeKernel(root).install(monkeypatch)
    p = opened_path(kernel, monkeypatch, root)
    objects, free_va = dict(kernel.objects), list(kernel.process.free_va)
    for h in CHANNELS:  # the RM objects are rig_nv.setup's to free, not the path's
        p.attach_channel(h)
    device, pinned = p.alloc_memory(4 << 20, Memory.DEVICE), p.alloc_memory(8192, Memory.PINNED)
    host = mmap(0, HOST, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
    mapped = p.map_host(host, HOST)
    assert device is not None and pinned is not None and isinstance(mapped, Allocation)
    return Made(kernel, p, [device, pinned, mapped], host, objects, free_va,
                list(kernel.channels.values()))


def ranges_taken(m: Made) -> list[str]:
    """What UVM still holds whose addresses the process would hand out again: a range or a
    channel's addresses in the reservation's free runs, or outside it no longer mapped."""
    wrong = []
    held = [*m.kernel.ranges, *m.kernel.channels.values()]
    for base, length in held:
        if any(s < base + length and base < s + n for s, n in m.kernel.process.free_va):
            wrong.append(f"0x{base:x}+0x{length:x} is free in the reservation")
        covered = sum(min(end, base + length) - max(start, base)
                      for start, end, _ in maps(base, base + length))
        if covered < length:
            wrong.append(f"0x{base:x}+0x{length:x} is no longer mapped")
    return wrong


def views_of_freed_memory(m: Made) -> list[str]:
    """Host views the process still has of memory the RM freed (path.py free_memory: "take
    the host's view away first, so nothing maps memory the RM has freed")."""
    return [f"{a.kind.value} at 0x{a.gpu:x}: {left}" for a in m.memory
            if a.undo.cpu_mapped and a.undo.reserved and a.handle not in m.kernel.objects
            and (left := [x for x in maps(a.gpu, a.gpu + a.undo.size) if x[2] != "---p"])]


def test_the_paths_stop_steps_fail_one_at_a_time_and_a_retry_gives_back_everything(
        tmp_path: Path) -> None:
    """Each fallible call of the path's part of a stop fails in turn: the failure escapes as
    itself or wrapped, alone; what UVM may still hold keeps its addresses taken, and no host
    view of freed memory stays; the reservation is never given a range twice; a second
    teardown fails nothing and leaves nothing."""
    with pytest.MonkeyPatch.context() as mp:
        first = made(tmp_path / "count", mp)
        with inject.counting() as seen:
            assert first.teardown() == []
        _unmap_all(first)
    assert {"ioctl", "mmap"} <= set(seen.calls)
    for n in range(1, len(seen.calls) + 1):
        with pytest.MonkeyPatch.context() as mp:
            m = made(tmp_path / str(n), mp)
            try:
                _fail_then_retry(m, n)
            finally:
                _unmap_all(m)


def _unmap_all(m: Made) -> None:
    """Unmap whatever the case left, the stand-in reservation's pages included (in a real
    process the reservation's): later tests map there. Close the stand-in's files."""
    for base, length in [*((a.gpu, a.undo.size) for a in m.memory), *m.channel_va,
                         (m.host, HOST)]:
        munmap(base, length)
    m.kernel.close()


def _fail_then_retry(m: Made, n: int) -> None:
    with inject.fail_at(n) as shot:
        failures = m.teardown()
    case = f"call {n} ({shot.kind})"
    assert shot.fired, case
    assert len(failures) == 1 and inject.caused_by(failures[0], shot.raised), (case, failures)
    assert not ranges_taken(m), (case, ranges_taken(m))
    assert not views_of_freed_memory(m), (case, views_of_freed_memory(m))
    runs = sorted(m.kernel.process.free_va)
    assert all(a + n <= b for (a, n), (b, _) in itertools.pairwise(runs)), (
        f"{case}: the reservation was given a range twice: {runs}")
    assert m.teardown() == [], f"{case}: the retry failed"
    assert m.kernel.objects == m.objects, case
    assert m.kernel.ranges == set() and m.kernel.channels == {}, case
    assert m.kernel.process.free_va == m.free_va, case
    for a in m.memory:
        left = maps(a.gpu, a.gpu + a.undo.size)
        if a.undo.reserved:  # back to the reservation: inaccessible, as it was made
            assert all(perms == "---p" for _, _, perms in left), (case, left)
        else:
            assert left == [], (case, a, left)
    for base, length in m.channel_va:
        assert maps(base, base + length) == [], f"{case}: a channel's addresses stay"
