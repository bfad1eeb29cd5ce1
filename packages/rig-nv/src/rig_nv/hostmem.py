"""The C library calls rig needs for memory (mmap at chosen addresses, munmap, mlock), and a fence.

Python's mmap module cannot map at a fixed address, so these go through cffi in ABI mode
(nothing compiled at install).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import TYPE_CHECKING, Any

from rig_nv import inject, prebuilt

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor

_CDEF = """
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset);
    int munmap(void *addr, size_t length);
    int madvise(void *addr, size_t length, int advice);
    void *memcpy(void *dest, const void *src, size_t n);
    int prctl(int option, ...);
    """

# Parsed once into a generated module (rig_nv.prebuilt; `python3 scripts/gen_ffi.py`), so that
# importing rig_nv does not import pycparser.
PREBUILT = {"rig_nv._ffi_libc": _CDEF}
ffi = prebuilt.load("rig_nv._ffi_libc", _CDEF)
libc: Any = ffi.dlopen(None)

PROT_NONE, PROT_READ, PROT_WRITE = 0, 1, 2
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS = 0x01, 0x02, 0x10, 0x20
MAP_NORESERVE, MAP_FIXED_NOREPLACE = 0x4000, 0x100000
MAP_FAILED = (1 << 64) - 1
PAGE = os.sysconf("SC_PAGE_SIZE")

# A locked instruction drains the CPU's write-combining buffers (Intel SDM vol. 3, 11.3.1), so
# an uncontended lock's acquire and release fence BAR1 writes before a doorbell: on x86 each is
# an atomic read-modify-write (CPython 3.12: glibc's sem_trywait and sem_post, a lock cmpxchg
# each; 3.13: PyMutex's compare-exchange), and neither gives the GIL up, so threads on queues
# of their own are not woken at every launch. The acquire does not wait: a thread switched
# out between its two holds the lock, and waiting for it made four threads' launches collapse
# to 110-166k a second on the stand-in in three runs of six. A fresh lock's acquire is then
# the locked instruction. It was pthread_spin_trylock through ctypes.PyDLL: on the H200, on a
# slow turn of its host, a step's submit took 2.82-2.86 us against 3.08-3.10 with it
# (docs/results/ring-2026-12-04.txt, 18:48). Other CPUs than x86 want a barrier of their own.
_fence_lock = threading.Lock()
_acquire, _release = _fence_lock.acquire, _fence_lock.release


def fence() -> None:
    """Order every earlier store (write-combined ones too) before every later one."""
    if _acquire(False):
        _release()
    else:
        threading.Lock().acquire()


def mmap(addr: int, length: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    """``mmap(2)``; returns the address or raises :class:`OSError` with errno."""
    inject.check("mmap")
    p = libc.mmap(ffi.cast("void *", addr), length, prot, flags, fd, offset)
    got = int(ffi.cast("uintptr_t", p))
    if got == MAP_FAILED:
        e = ffi.errno
        raise OSError(e, os.strerror(e))
    return got


def munmap(addr: int, length: int) -> None:
    """``munmap(2)``; raises :class:`OSError` with errno."""
    if libc.munmap(ffi.cast("void *", addr), length) != 0:
        e = ffi.errno
        raise OSError(e, os.strerror(e))


# Host copies of this many bytes or more are split over threads: cffi releases the GIL around
# a C call, so the parts' memcpy calls run at once. One thread copies 7-9 GB/s on the GPU
# machine, below the 50+ GB/s of the copy engine that the staged copies pipeline with.
PARALLEL_FROM = 8 << 20
COPY_THREADS = min(8, os.cpu_count() or 1)
_pools: list[ThreadPoolExecutor] = []  # made on first use
_pool_lock = threading.Lock()


def copy(dst: memoryview, src: Any) -> None:
    """``dst[:] = src`` for equal-length byte views, in :data:`COPY_THREADS` parts at once
    when it is :data:`PARALLEL_FROM` bytes or more (a part's failure is raised here)."""
    n = len(dst)
    if n < PARALLEL_FROM or COPY_THREADS < 2:
        dst[:] = src
        return
    if len(src) != n:
        raise ValueError(f"a copy of {len(src)} bytes into {n}")
    with _pool_lock:
        if not _pools:  # imported here: an import of rig_nv (rig list's) should not pay for it
            from concurrent.futures import ThreadPoolExecutor

            _pools.append(ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="rig-copy"))
        pool = _pools[0]
    to, fro = ffi.from_buffer(dst, require_writable=True), ffi.from_buffer(src)
    part = (-(-n // COPY_THREADS) + 4095) // 4096 * 4096
    jobs = [pool.submit(libc.memcpy, to + at, fro + at, min(part, n - at))
            for at in range(0, n, part)]
    try:
        for job in jobs:
            job.result()
    finally:
        _settle(jobs)
        # Give the buffers back now, not when a traceback's cycle is collected (the garbage
        # collector could clear a memoryview before the cdata that holds its buffer).
        ffi.release(to)
        ffi.release(fro)


def _settle(jobs: list[Future[Any]]) -> None:
    """Wait until every part has run or is cancelled, through further interrupts: a Ctrl-C in
    :func:`copy` must not leave parts writing into memory the caller reuses (staging)."""
    for job in jobs:
        if job.cancel():
            continue
        while not job.done():
            with contextlib.suppress(BaseException):  # a KeyboardInterrupt: wait on
                job.exception()


def view(addr: int, length: int) -> memoryview:
    """A writable byte view of ``length`` bytes of this process's memory at ``addr``."""
    return memoryview(ffi.buffer(ffi.cast("char *", addr), length)).cast("B")


def round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to
