"""Copies through the host: host bytes to and from Device memory through pinned staging, and
copies inside the GPU on rig's copy kernels. Device's copy methods check their arguments and
come here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rig_edge import Memory, Region, RigError
from rig_nv import launch as launching
from rig_nv.hostmem import copy, view
from rig_nv.push import Push
from rig_nv.rm import Allocation

if TYPE_CHECKING:
    from rig_nv.device import Device, Point
    from rig_nv.launch import Function

STAGING = 32 << 20  # two halves, pipelined: one fills while the copy engine drains the other
COPY_BLOCK = 256


def stage(d: Device) -> Allocation:
    """The device's pinned staging memory (made on first use, freed at stop)."""
    if d._staging is None:
        a = d.path.alloc_memory(STAGING, Memory.PINNED, contiguous=False)
        if a is None:
            raise RigError(f"{d.facts.name}: no pinned memory for copy staging")
        d._staging = a
        d._own.append(a)
    return d._staging


def staged_upload(d: Device, dst: Region, src: memoryview, offset: int) -> Point:
    """Host bytes into Device memory, half a staging buffer at a time."""
    from rig_nv.device import Point

    with d._staging_lock:
        s = stage(d)
        assert s.host is not None
        half = STAGING // 2
        point = Point(d, d._next - 1)
        for i, off in enumerate(range(0, len(src), half)):
            slot = i % 2
            d._wait_value(d._staging_busy[slot])
            chunk = src[off : off + half]
            copy(view(s.host + slot * half, len(chunk)), chunk)
            point = d._submit(d.copy_channel,
                              Push().copy(dst.gpu + offset + off, s.gpu + slot * half, len(chunk)),
                              "upload")
            d._staging_busy[slot] = point.value
        return point


def staged_download(d: Device, src: Region, n: int, offset: int, out: memoryview) -> None:
    """Device memory into ``out``: the copy engine fills one half while the host drains the
    other."""
    with d._staging_lock:
        s = stage(d)
        assert s.host is not None
        half = STAGING // 2
        pending: list[tuple[int, int, int, int]] = []  # (offset, size, slot, value)
        for i, off in enumerate(range(0, n, half)):
            slot = i % 2
            size = min(half, n - off)
            d._wait_value(d._staging_busy[slot])
            p = d._submit(d.copy_channel,
                          Push().copy(s.gpu + slot * half, src.gpu + offset + off, size),
                          "download")
            d._staging_busy[slot] = p.value
            pending.append((off, size, slot, p.value))
            if len(pending) == 2:
                _drain(d, pending.pop(0), out, s)
        for item in pending:
            _drain(d, item, out, s)


def _drain(d: Device, item: tuple[int, int, int, int], out: memoryview, s: Allocation) -> None:
    off, size, slot, value = item
    d._wait_value(value)
    assert s.host is not None
    copy(out[off : off + size], view(s.host + slot * (STAGING // 2), size))


def _launch(d: Device, fn: Function, blocks: int, args: tuple[int, int, int]) -> Point:
    """Launch a copy kernel: the launch fast path, or, under a profile, named "copy" there
    (the user asked for a copy, not for rig's kernel)."""
    if d._profile is None:
        return d.launch(fn, (blocks,), (COPY_BLOCK,), args)
    return launching.launch(d, fn, (blocks,), (COPY_BLOCK,), args, name="copy")


def kernel_copy(d: Device, dst: int, src: int, n: int) -> Point:
    """Copy within the GPU's memory on the SMs: 16 bytes a thread where both ends are 16-byte
    aligned, then the rest byte by byte."""
    img = d._copy_kernels()
    assert img is not None
    most = d.sm_count * 8
    point = None
    done = 0
    if not (dst | src) & 15 and n >= 16:
        count = n // 16
        point = _launch(d, img["copy16"], min(-(-count // COPY_BLOCK), most), (dst, src, count))
        done = count * 16
    if n > done:
        rest = n - done
        point = _launch(d, img["copy1"], min(-(-rest // COPY_BLOCK), most),
                        (dst + done, src + done, rest))
    assert point is not None
    return point
