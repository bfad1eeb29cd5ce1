"""Windows: a range of a function's registers (a BAR, its config space) read and written at
exact widths.

A register read or write of 8, 16, 32 or 64 bits is one access of that width on the bus: a
device's registers act on the width they see (a 32-bit register written as four bytes is four
writes). :class:`MappedWindow` reads through a memory mapping (:class:`PlacedWindow` through
one placed at an address the caller chose): CPython's ``memoryview`` item access copies one
item with a fixed-size ``memcpy``, which compilers emit as a single load or store of that
width. :class:`FileWindow` reads through ``pread``/``pwrite`` of exactly the
width, which Linux's sysfs ``config`` file and VFIO's region reads turn into one access of that
width where it is aligned (drivers/pci/pci-sysfs.c, drivers/vfio/pci/vfio_pci_rdwr.c).

A function that stopped answering (removed, reset, fallen off the bus) reads all-ones and
drops writes; :func:`all_ones` tells such a value.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from abc import ABC, abstractmethod

from rig_edge import Misuse, RigError

WIDTHS = (1, 2, 4, 8)


def all_ones(value: int, width: int) -> bool:
    """Whether ``value`` read at ``width`` bytes is all-ones, as a dead function reads."""
    return value == (1 << (8 * width)) - 1


class Window(ABC):
    """``size`` bytes of a function's registers, read and written at exact widths.

    Offsets are from the window's start and must be aligned to the access's width; a bad
    offset, width or value raises :class:`rig_edge.Misuse` having accessed nothing. A window
    whose function was released raises :class:`rig_edge.Misuse` too.
    """

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self.name = name

    def _check(self, offset: int, width: int) -> None:
        if width not in WIDTHS:
            raise Misuse(f"{self.name}: an access is 1, 2, 4 or 8 bytes wide, not {width}")
        if offset < 0 or offset + width > self.size or offset % width:
            raise Misuse(
                f"{self.name}: {width}-byte access at 0x{offset:x} is outside the window's "
                f"0x{self.size:x} bytes or not aligned to its width"
            )

    @staticmethod
    def _fits(value: int, width: int, name: str) -> None:
        if not 0 <= value < 1 << (8 * width):
            raise Misuse(f"{name}: {value:#x} does not fit in {width} bytes")

    def read(self, offset: int, width: int) -> int:
        """The ``width``-byte register at ``offset``, read in one access."""
        self._check(offset, width)
        return self._read(offset, width)

    def write(self, offset: int, width: int, value: int) -> None:
        """Write ``value`` to the ``width``-byte register at ``offset`` in one access."""
        self._check(offset, width)
        self._fits(value, width, self.name)
        self._write(offset, width, value)

    def read8(self, offset: int) -> int:
        """The 8-bit register at ``offset`` (:meth:`read` of 1 byte)."""
        return self.read(offset, 1)

    def read16(self, offset: int) -> int:
        """The 16-bit register at ``offset`` (:meth:`read` of 2 bytes)."""
        return self.read(offset, 2)

    def read32(self, offset: int) -> int:
        """The 32-bit register at ``offset`` (:meth:`read` of 4 bytes)."""
        return self.read(offset, 4)

    def read64(self, offset: int) -> int:
        """The 64-bit register at ``offset`` (:meth:`read` of 8 bytes)."""
        return self.read(offset, 8)

    def write8(self, offset: int, value: int) -> None:
        """Write the 8-bit register at ``offset`` (:meth:`write` of 1 byte)."""
        self.write(offset, 1, value)

    def write16(self, offset: int, value: int) -> None:
        """Write the 16-bit register at ``offset`` (:meth:`write` of 2 bytes)."""
        self.write(offset, 2, value)

    def write32(self, offset: int, value: int) -> None:
        """Write the 32-bit register at ``offset`` (:meth:`write` of 4 bytes)."""
        self.write(offset, 4, value)

    def write64(self, offset: int, value: int) -> None:
        """Write the 64-bit register at ``offset`` (:meth:`write` of 8 bytes)."""
        self.write(offset, 8, value)

    @abstractmethod
    def _read(self, offset: int, width: int) -> int: ...

    @abstractmethod
    def _write(self, offset: int, width: int, value: int) -> None: ...

    @abstractmethod
    def close(self) -> None:
        """Give the window's mapping back; later accesses raise :class:`rig_edge.Misuse`.
        Closing again does nothing."""


class _MemoryWindow(Window):
    """A window onto memory the registers are mapped at: each access one item of a view of
    the access's width."""

    def __init__(self, raw: memoryview, name: str) -> None:
        super().__init__(len(raw), name)
        if len(raw) % 8:
            raise Misuse(f"{name}: a mapped window's length is a multiple of 8 bytes")
        # One view per width. Items are native-endian: PCI is little-endian, as are the hosts
        # rig runs on (x86-64, arm64 Linux).
        self._raw = raw
        self._views = {1: raw, 2: raw.cast("H"), 4: raw.cast("I"), 8: raw.cast("Q")}

    def _read(self, offset: int, width: int) -> int:
        try:
            return int(self._views[width][offset // width])
        except ValueError:
            raise Misuse(f"{self.name}: the window is closed") from None

    def _write(self, offset: int, width: int, value: int) -> None:
        try:
            self._views[width][offset // width] = value
        except ValueError:
            raise Misuse(f"{self.name}: the window is closed") from None

    def buffer(self) -> memoryview:
        """The window's bytes as a writable view, for bulk copies where the width does not
        matter (memory behind a BAR); invalid once the window is closed."""
        return self._raw

    def _release_views(self) -> None:
        for view in self._views.values():
            view.release()
        self._raw.release()


class MappedWindow(_MemoryWindow):
    """A window onto a memory mapping of the registers (a BAR's sysfs resource file, or a VFIO
    region that allows mmap), wherever the kernel placed it."""

    def __init__(self, mapping: mmap.mmap, name: str) -> None:
        super().__init__(memoryview(mapping), name)
        self._map = mapping

    def close(self) -> None:
        if self._map.closed:
            return
        self._release_views()
        # A caller still holding a view from buffer() keeps the mapping until it lets go.
        with contextlib.suppress(BufferError):
            self._map.close()


class PlacedWindow(_MemoryWindow):
    """A window mapped at ``address`` of the process, over a range the caller reserved with an
    inaccessible mapping (``rig_pci.Function.window``'s ``at``): made by :func:`place`.

    Closing it puts the reservation back (an inaccessible, unbacked mapping, as
    :func:`rig_pci.libc.reserve` makes), so the range stays the caller's to place something
    else at; unmapping it instead would leave a hole another mmap of the process could land
    in. A view of it (``buffer()``, or one made from ``address``) must not be used once it is
    closed: the page it reads is then inaccessible, as memory a caller placed and freed is.
    """

    def __init__(self, address: int, length: int, name: str) -> None:
        # rig_pci.libc loads the C library: imported here, so that a listing (which imports
        # this module for Window) never pays for it
        from rig_pci import libc

        super().__init__(libc.view(address, length), name)
        self.address = address
        self._closed = False

    def close(self) -> None:
        from rig_pci import libc

        if self._closed:
            return
        self._closed = True
        # A consumer still exporting a view of buffer() cannot stop the reservation coming
        # back (unlike an mmap object, these views do not hold the mapping): see above.
        with contextlib.suppress(BufferError):
            self._release_views()
        libc.reserve(self.address, self.size)


def place(fd: int, offset: int, length: int, at: int, name: str) -> PlacedWindow:
    """Map ``length`` bytes of the open file ``fd`` (a BAR's sysfs resource file, a VFIO
    device) from ``offset`` at the process address ``at`` (page-aligned, over a range the
    caller reserved, which the mapping replaces: ``MAP_FIXED``), shared and read-write.

    Python's :mod:`mmap` cannot map at a chosen address, so this is :func:`rig_pci.libc.mmap`.
    Raises :class:`rig_edge.RigError` if the kernel refuses, having put the reservation back
    (a failed ``MAP_FIXED`` may have unmapped what lay there).
    """
    from rig_pci import libc

    try:
        libc.mmap(at, length, libc.PROT_READ | libc.PROT_WRITE, libc.MAP_SHARED | libc.MAP_FIXED,
                  fd, offset)
    except OSError as e:
        libc.reserve(at, length)
        raise RigError(f"{name}: 0x{length:x} bytes cannot be mapped at 0x{at:x}: "
                       f"{e.strerror}") from e
    try:
        return PlacedWindow(at, length, name)
    except BaseException:
        libc.reserve(at, length)
        raise


class FileWindow(Window):
    """A window read and written with ``pread``/``pwrite`` at ``base`` of an open file (the
    sysfs ``config`` file, a VFIO device's region). The file stays its owner's to close."""

    def __init__(self, fd: int, base: int, size: int, name: str) -> None:
        super().__init__(size, name)
        self._fd = fd
        self._base = base
        self._closed = False

    def _read(self, offset: int, width: int) -> int:
        if self._closed:
            raise Misuse(f"{self.name}: the window is closed")
        try:
            data = os.pread(self._fd, width, self._base + offset)
        except OSError as e:
            raise RigError(f"{self.name}: reading 0x{offset:x}: {e.strerror}") from e
        if len(data) != width:  # sysfs shows only 64 bytes of config space to non-root
            raise RigError(f"{self.name}: reading 0x{offset:x}: the file ends before it")
        return int.from_bytes(data, "little")

    def _write(self, offset: int, width: int, value: int) -> None:
        if self._closed:
            raise Misuse(f"{self.name}: the window is closed")
        try:
            os.pwrite(self._fd, value.to_bytes(width, "little"), self._base + offset)
        except OSError as e:
            raise RigError(f"{self.name}: writing 0x{offset:x}: {e.strerror}") from e

    def close(self) -> None:
        self._closed = True
