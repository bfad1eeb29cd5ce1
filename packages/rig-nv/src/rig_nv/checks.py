"""The argument checks every public call of rig_nv makes before it touches the GPU: each
raises :class:`rig_edge.Misuse` (a ValueError) naming the argument and the problem, having
changed nothing (the error policy of rig_edge.errors)."""

from __future__ import annotations

import math
import numbers
import operator
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from rig_edge import Misuse, Region

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

    from rig_nv.memory import Heap


class ArrayInterface(Protocol):
    """What numpy's array interface describes. numpy's stubs give arrays the buffer protocol
    only from Python 3.12, so host data is typed as either."""

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """numpy's description of the object's memory."""
        ...


# Host data a call reads or writes: anything with the buffer protocol (bytes, bytearray,
# memoryview, numpy arrays, array.array), contiguous; :func:`buffer` checks it.
HostData: TypeAlias = "Buffer | ArrayInterface"


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
    if region is None:  # alloc's answer when the GPU is out of memory, passed on unread
        raise Misuse(f"{what} is None, not a rig_edge.Region: alloc returns None when the GPU "
                     "is out of that memory; check its answer")
    if not isinstance(region, Region):
        raise Misuse(f"{what} must be a rig_edge.Region, not {type(region).__name__}")
    return region


def live(memory: Heap, region: Region, what: str) -> None:
    """:class:`Misuse` unless ``region`` is, or lies inside, a live region of ``memory`` (at
    the same host address): not freed, not another device's."""
    if not memory.contains(region):
        raise Misuse(f"{what} {region} is not a live region of {memory.name} (freed, or "
                     "another device's)")


def span(memory: Heap, what: str, region: Any, offset: Any, n: Any) -> tuple[Region, int, int]:
    """Check that ``n`` bytes at ``offset`` lie inside ``region``, a live region of
    ``memory`` (a device's :class:`rig_nv.memory.Heap`); returns them. Raises
    :class:`Misuse` naming the problem, before anything is submitted."""
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
    if not memory.holds(region):
        live(memory, region, what)
    return region, offset, n


def copy_spans(memory: Heap, dst: Any, dst_offset: Any, src: Any, src_offset: Any,
               n: Any) -> tuple[Region, int, Region, int, int]:
    """Both ends of a copy of ``n`` bytes (None: the rest of ``src`` from ``src_offset``), as
    :func:`span` checks each; returns (dst, dst_offset, src, src_offset, n). Its common case
    (regions, whole numbers, inside both, both live) is tested inline, since every copy pays
    for it; anything else goes through :func:`span` for its :class:`Misuse`."""
    if type(dst) is Region and type(src) is Region and type(dst_offset) is int \
            and type(src_offset) is int:
        if n is None:
            n = src.length - src_offset
        if type(n) is int and n > 0 and dst_offset >= 0 and src_offset >= 0 \
                and dst_offset + n <= dst.length and src_offset + n <= src.length \
                and memory.holds(dst) and memory.holds(src):
            return dst, dst_offset, src, src_offset, n
    if n is None:
        n = region_of("source", src).length - whole("src_offset", src_offset)
    dst, dst_offset, n = span(memory, "destination", dst, dst_offset, n)
    src, src_offset, n = span(memory, "source", src, src_offset, n)
    return dst, dst_offset, src, src_offset, n
