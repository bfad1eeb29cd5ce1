"""Copies through the host: host bytes to and from Device memory through pinned staging
(:class:`Staging`, which owns its lock and the values each half was last used by), and copies
inside the GPU on rig's copy kernels. Device's copy methods check their arguments and come
here."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from rig_nv import launch as launching
from rig_nv.hostmem import copy, view
from rig_nv.memory import STAGING

if TYPE_CHECKING:
    from rig_edge import Region
    from rig_nv.launch import Image
    from rig_nv.loader import Loader
    from rig_nv.queues import Submits
    from rig_nv.rm import Allocation
    from rig_nv.timeline import Point, Timeline

# copy16 copies COPY16_LOADS 16-byte units a thread of COPY16_THREADS, one chunk a block, no
# loop (copy.cu, whose #defines these follow): rig launches a block a chunk. That shape came
# closest to cuMemcpyDtoD on an H200 (0.987x, docs/results/copy-variants-2026-12-03.txt).
COPY16_THREADS = 1024
COPY16_LOADS = 2
COPY16_CHUNK = COPY16_THREADS * COPY16_LOADS  # 16-byte units a block of copy16
COPY1_THREADS = 256  # threads a block of copy1, a grid-stride byte loop
# Blocks a launch at most: the largest power of two in the grid's limit (2^31-1), so that the
# rounding of _grid never passes it; a copy of more (32 TiB) takes several launches.
COPY16_MOST = 1 << (launching.MAX_GRID[0].bit_length() - 1)
COPY1_PER_SM = 8
COPY_SIZES_KEPT = 256  # copy sizes whose launches stay resolved (Loader.copy_launches)


class Staging:
    """Copies through a queue's pinned staging memory (``make()``'s, two halves), submitted
    on ``timeline``'s copy channel; one at a time (its own lock)."""

    def __init__(self, make: Callable[[], Allocation], timeline: Timeline) -> None:
        self._make = make  # the staging memory, made on first use
        self._memory: Allocation | None = None
        self.timeline = timeline
        self.busy = [0, 0]  # the last value that copied through each half
        self._lock = threading.Lock()

    def upload(self, dst: Region, src: memoryview, offset: int) -> Point:
        """Host bytes into Device memory, half a staging buffer at a time."""
        t = self.timeline
        with self._lock:
            s = self._stage()
            assert s.host is not None
            half = STAGING // 2
            point = t.point(t.current())
            for i, off in enumerate(range(0, len(src), half)):
                slot = i % 2
                t.wait_value(self.busy[slot])
                chunk = src[off : off + half]
                copy(view(s.host + slot * half, len(chunk)), chunk)
                point = t.copy(dst.gpu + offset + off, s.gpu + slot * half, len(chunk),
                               "upload")
                self.busy[slot] = point.value
            return point

    def download(self, src: Region, n: int, offset: int, out: memoryview) -> None:
        """Device memory into ``out``: the copy engine fills one half while the host drains
        the other."""
        t = self.timeline
        with self._lock:
            s = self._stage()
            assert s.host is not None
            half = STAGING // 2
            pending: list[tuple[int, int, int, int]] = []  # (offset, size, slot, value)
            for i, off in enumerate(range(0, n, half)):
                slot = i % 2
                size = min(half, n - off)
                t.wait_value(self.busy[slot])
                p = t.copy(s.gpu + slot * half, src.gpu + offset + off, size, "download")
                self.busy[slot] = p.value
                pending.append((off, size, slot, p.value))
                if len(pending) == 2:
                    self._drain(pending.pop(0), out, s)
            for item in pending:
                self._drain(item, out, s)

    def _stage(self) -> Allocation:
        if self._memory is None:
            self._memory = self._make()
        return self._memory

    def _drain(self, item: tuple[int, int, int, int], out: memoryview, s: Allocation) -> None:
        off, size, slot, value = item
        self.timeline.wait_value(value)
        assert s.host is not None
        copy(out[off : off + size], view(s.host + slot * (STAGING // 2), size))


def _grid(chunks: int) -> int:
    """``chunks`` rounded up to a number of at most 5 significant bits: 16 grids an octave, so
    copies of every size prepare a bounded set of launch configurations (a function caches
    one a grid). The extra blocks, fewer than 1 in 16, find no unit to copy."""
    step = 1 << max(chunks.bit_length() - 5, 0)
    return -(-chunks // step) * step


def copy16_launches(count: int) -> list[tuple[int, int, int]]:
    """copy16's launches for ``count`` 16-byte units, each (first unit, blocks, units): one
    block a chunk of COPY16_CHUNK units, at most COPY16_MOST blocks a launch. The one place
    that picks copy16's geometry, for every size."""
    most = COPY16_MOST * COPY16_CHUNK  # one launch for any copy below 32 TiB
    return [(first, _grid(-(-min(most, count - first) // COPY16_CHUNK)),
             min(most, count - first)) for first in range(0, count, most)]


def copy_plan(n: int, aligned: bool,
              sm_count: int) -> tuple[tuple[str, int, int, int, int], ...]:
    """The launches of a copy of ``n`` bytes inside the GPU, each (kernel, byte offset,
    blocks, threads a block, count): where both ends are 16-byte ``aligned``, copy16's
    (copy16_launches), then copy1's for the rest, bytes, on at most COPY1_PER_SM blocks an SM.
    Made at a size's first copy only: kernel_copy keeps its launches resolved."""
    plan, done = [], 0
    if aligned and n >= 16:
        count = n // 16
        plan = [("copy16", first * 16, blocks, COPY16_THREADS, units)
                for first, blocks, units in copy16_launches(count)]
        done = count * 16
    if n > done:
        rest = n - done
        blocks = min(-(-rest // COPY1_THREADS), sm_count * COPY1_PER_SM)
        plan.append(("copy1", done, blocks, COPY1_THREADS, rest))
    return tuple(plan)


def kernel_copy(q: Submits, dst: int, src: int, n: int) -> Point | None:
    """Copy ``n`` bytes (at least one) within the GPU's memory on the SMs, as copy_plan
    says: 16 bytes a load, COPY16_LOADS loads in flight a thread, a block a chunk, where both
    ends are 16-byte aligned; then the rest byte by byte. Returns None, having done nothing,
    where rig ships no copy kernels for the GPU.

    The plan's launches, once prepared, are kept resolved (the Loader's ``copy_launches``):
    a copy of a size copied before then costs its bare launches."""
    t, loader = q.timeline, q.owner.loader
    aligned = not (dst | src) & 15
    ready = loader.copy_launches.get((n, aligned, loader.slm))
    point = None
    if ready is not None and t.profile is None:
        for prep, st, params, at, count in ready:
            point = t.launch_prepared(prep, st, (dst + at, src + at, count), params)
        return point
    img = loader.copy_kernels()
    if img is None:
        return None
    plan = copy_plan(n, aligned, q.owner.sm_count)
    for name, at, blocks, threads, count in plan:
        point = q.launch_own(img[name], blocks, threads, (dst + at, src + at, count), "copy")
    _resolve(loader, (n, aligned, loader.slm), img, plan)
    return point


def _resolve(loader: Loader, key: tuple[int, bool, int], img: Image,
             plan: tuple[tuple[str, int, int, int, int], ...]) -> None:
    """Keep ``plan``'s launches resolved under ``key`` once each is prepared (its launch
    configuration and a packer of its arguments in their own order), found under the keys
    :meth:`rig_nv.queues.Submits.launch` made them with."""
    ready = []
    for name, at, blocks, threads, count in plan:
        fn = img[name]
        prep = fn.prepared.get(((blocks,), (threads,), 0, key[2]))
        packer = fn.packers.get((int, int, int))
        if prep is None or packer is None or packer[1] is not None:
            return
        ready.append((prep, packer[0], fn.kernel.param_offset, at, count))
    kept = loader.copy_launches
    if len(kept) >= COPY_SIZES_KEPT:
        kept.clear()
    kept[key] = tuple(ready)
