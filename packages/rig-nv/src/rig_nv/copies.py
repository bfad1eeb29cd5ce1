"""Copies through the host: host bytes to and from Device memory through pinned staging, and
copies inside the GPU on rig's copy kernels. Device's copy methods check their arguments and
come here."""

from __future__ import annotations

import math
import numbers
import operator
from typing import TYPE_CHECKING, Any

from rig_edge import Memory, Misuse, Region, RigError
from rig_nv.hostmem import view
from rig_nv.push import Push
from rig_nv.rm import Allocation

if TYPE_CHECKING:
    from rig_nv.device import Device, Point

STAGING = 32 << 20  # two halves, pipelined: one fills while the copy engine drains the other
COPY_BLOCK = 256


def whole(what: str, v: Any) -> int:
    """``v`` as an int (any integer type), or :class:`Misuse` naming ``what``."""
    try:
        return operator.index(v)
    except TypeError:
        raise Misuse(f"{what} must be a whole number, not {type(v).__name__}") from None


def seconds(what: str, v: Any) -> float:
    """``v`` as seconds >= 0, or :class:`Misuse` naming ``what``."""
    t = float(v) if isinstance(v, numbers.Real) else math.nan
    if not t >= 0:
        raise Misuse(f"{what} must be a number of seconds >= 0, not {v!r}")
    return t


def buffer(what: str, data: Any, *, writable: bool = False) -> memoryview:
    """``data``'s bytes as a memoryview, or :class:`Misuse` when it is no contiguous buffer
    (or a read-only one where ``writable``)."""
    try:
        m = memoryview(data).cast("B")
    except TypeError as e:
        raise Misuse(f"{what} must be a contiguous buffer, not {type(data).__name__} "
                     f"({e})") from None
    if writable and m.readonly:
        raise Misuse(f"{what} is a read-only buffer")
    return m


def region_of(what: str, region: Any) -> Region:
    if not isinstance(region, Region):
        raise Misuse(f"{what} must be a rig_edge.Region, not {type(region).__name__}")
    return region


def live(d: Device, region: Region, what: str) -> None:
    """:class:`Misuse` unless ``region`` is, or lies inside, a live region of ``d`` (at the
    same host address): not freed, not another device's."""
    with d._lock:
        if region in d._allocs:
            return
        for r in d._allocs:
            if (r.kind is region.kind and r.gpu <= region.gpu
                    and region.gpu + region.length <= r.gpu + r.length
                    and region.host == (None if r.host is None
                                        else r.host + region.gpu - r.gpu)):
                return
    raise Misuse(f"{what} {region} is not a live region of {d.facts.name} (freed, or "
                 "another device's)")


def span(d: Device, what: str, region: Any, offset: Any, n: Any) -> tuple[Region, int, int]:
    """Check that ``n`` bytes at ``offset`` lie inside ``region``, a live region of ``d``;
    returns them. Raises :class:`Misuse` naming the problem, before anything is submitted."""
    if type(region) is not Region:
        region = region_of(what, region)
    if type(offset) is not int:
        offset = whole(f"{what}'s offset", offset)
    if type(n) is not int:
        n = whole("a copy's length", n)
    if n <= 0:
        raise Misuse(f"a copy's length must be positive, not {n}")
    if offset < 0 or offset + n > region.length:
        raise Misuse(f"bytes [{offset}, {offset + n}) lie outside the {region.length}-byte "
                     f"{what}")
    if region not in d._allocs:  # the common case needs no lock: a dict's lookup is atomic
        live(d, region, what)
    return region, offset, n


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
            view(s.host + slot * half, len(chunk))[:] = chunk
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
    out[off : off + size] = view(s.host + slot * (STAGING // 2), size)


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
        point = d.launch(img["copy16"], (min(-(-count // COPY_BLOCK), most),), (COPY_BLOCK,),
                         (dst, src, count))
        done = count * 16
    if n > done:
        rest = n - done
        point = d.launch(img["copy1"], (min(-(-rest // COPY_BLOCK), most),), (COPY_BLOCK,),
                         (dst + done, src + done, rest))
    assert point is not None
    return point
