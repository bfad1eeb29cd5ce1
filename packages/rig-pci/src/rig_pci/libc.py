"""The few C library calls Python's standard library lacks: mmap at a chosen address, munmap
and madvise on raw addresses, and a byte view of memory at an address.

They go through :mod:`ctypes`, which is in the standard library, so rig-pci installs alone
(no third-party package, nothing compiled). Python's :mod:`mmap` serves every mapping of a file
(BARs, VFIO regions) the kernel may place anywhere; these serve DMA memory, whose address the
device must be told, and BAR windows placed at an address the caller chose
(:func:`rig_pci.window.place`), which Python's :mod:`mmap` cannot do.
"""

from __future__ import annotations

import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

# Linux include/uapi/asm-generic/mman-common.h and mman.h (x86-64, arm64 share these values).
PROT_NONE, PROT_READ, PROT_WRITE = 0x0, 0x1, 0x2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_POPULATE, MAP_HUGETLB = 0x4000, 0x8000, 0x40000
# include/uapi/asm-generic/hugetlb_encode.h: the page size's log2 in bits 26-31 of the flags.
MAP_HUGE_SHIFT = 26
MAP_HUGE_2MB = 21 << MAP_HUGE_SHIFT
# mman-common.h: keep a range out of a fork's child, so copy-on-write never moves pages a
# device is reaching.
MADV_DONTFORK = 10
MAP_FAILED = (1 << 64) - 1

PAGE = os.sysconf("SC_PAGE_SIZE")
HUGE_PAGE = 2 << 20


def _raise() -> None:
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))


def mmap(addr: int, length: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    """``mmap(2)``: the mapping's address; raises :class:`OSError` with the errno."""
    got = _libc.mmap(addr or None, length, prot, flags, fd, offset)
    if got is None or got == MAP_FAILED:
        _raise()
    return int(got)


def munmap(addr: int, length: int) -> None:
    """``munmap(2)``; raises :class:`OSError` with the errno."""
    if _libc.munmap(addr, length) != 0:
        _raise()


def madvise(addr: int, length: int, advice: int) -> None:
    """``madvise(2)``; raises :class:`OSError` with the errno."""
    if _libc.madvise(addr, length, advice) != 0:
        _raise()


def reserve(addr: int, length: int) -> None:
    """Put an inaccessible, unbacked mapping at ``addr`` (``MAP_FIXED``), replacing what lay
    there: how an address range a caller reserved is kept reserved once memory leaves it."""
    mmap(addr, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED)


def view(addr: int, length: int) -> memoryview:
    """A writable byte view of ``length`` bytes of this process's memory at ``addr``.

    The view is valid while the memory stays mapped; it does not keep the memory alive.
    """
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")

