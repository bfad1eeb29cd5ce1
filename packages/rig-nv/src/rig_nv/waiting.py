"""How a device waits for a value of its timeline: it spins on the timeline word, then naps
through the path's ``sleep`` (which raises the GPU's faults), each nap a small share of the
time waited so far, with the thread's timer slack lowered meanwhile so that a nap ends when
asked.

Why (measured on the H200, docs/results/d2d-wait-2026-11-30.txt): a 256 MiB copy inside the GPU
takes 140 us on the GPU's clock (1.92 TB/s, as CUDA's), but launch to wait's return took 222 us
(1.21 TB/s) when a wait spun 100 us and then slept 20 us, 40 us and so on: Linux's default
timer slack (50 us) makes ``time.sleep(20e-6)`` last some 70 us, so the waiter woke long after
the copy was done; 1 GiB (544 us) took 668 us. The bench's copies (rows 4 and 5) lost 5 to 35%
that way. CUDA spins for as long as it waits by default (cudaDeviceScheduleAuto, with fewer
contexts than cores); rig spins for 1 ms, which covers a launch and copies up to some 1 GiB
inside the GPU, then naps 1/128 of the time waited (from 10 us to 1 ms): a 256 MiB copy
between Pinned and Device memory (4.9 ms on the copy engine) returned 200 us after it was done
with naps of 1/32, 57 us with naps of 1/128, so a longer wait overshoots by about 1% and costs
the CPU a wake-up (a few us) every 1% of it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Protocol

from rig_edge import Lost
from rig_nv.hostmem import ffi, libc


class Waits(Protocol):
    """What a wait reads: the word, the device's health, its hang time and its path."""

    health: Any
    hang_ms: int | None
    path: Any

    def completed(self) -> int: ...

SPIN_S = 1e-3  # a wait spins this long on the timeline word before it naps
NAP_SHARE = 1 / 128  # each nap: this share of the time waited so far ...
NAP_FIRST_S, NAP_LAST_S = 10e-6, 1e-3  # ... and no less, no more
# prctl options (linux/prctl.h); the slack is in nanoseconds, per thread.
PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30
NAP_SLACK_NS = 1000


@contextlib.contextmanager
def precise_naps() -> Iterator[None]:
    """Lower the calling thread's timer slack (prctl PR_SET_TIMERSLACK) to 1 us meanwhile,
    and put the thread's own back after; where the kernel refuses, or the C library has no
    prctl (off Linux), naps keep their slack."""
    ulong = "unsigned long"
    try:
        prctl = libc.prctl
    except AttributeError:
        yield
        return
    zero = ffi.cast(ulong, 0)
    before = prctl(PR_GET_TIMERSLACK, zero, zero, zero, zero)
    if before < 0 or prctl(PR_SET_TIMERSLACK, ffi.cast(ulong, NAP_SLACK_NS), zero, zero, zero):
        yield
        return
    try:
        yield
    finally:
        prctl(PR_SET_TIMERSLACK, ffi.cast(ulong, before), zero, zero, zero)

def wait_value(t: Waits, value: int, timeout_s: float | None = None) -> None:
    """Return once ``t``'s timeline reaches ``value``.

    Raises the device's :class:`rig_edge.Lost` (a lost device's every wait raises, for done
    work too), a fault the path reports (losing the device), :class:`Lost` when the timeline
    makes no progress for ``t.hang_ms``, and :class:`TimeoutError` after ``timeout_s``.
    """
    if t.completed() >= value:
        t.health.raise_lost()
        return
    start = time.perf_counter()
    while time.perf_counter() - start < SPIN_S:
        if t.completed() >= value:
            return
    with precise_naps():
        _nap_until(t, value, timeout_s, start)


def _nap_until(t: Waits, value: int, timeout_s: float | None, start: float) -> None:
    last, progress = t.completed(), time.monotonic()
    hang, health = t.hang_ms, t.health
    while True:
        now_done = t.completed()
        if now_done >= value:
            return
        health.raise_lost()
        health.raise_fault()
        now = time.monotonic()
        if now_done != last:
            last, progress = now_done, now
        elif hang is not None and (now - progress) * 1000 > hang:
            raise health.lose(Lost(f"its work made no progress for {hang / 1000:g} s "
                                   f"(timeline at {now_done}, waiting for {value})"))
        waited = time.perf_counter() - start
        if timeout_s is not None and waited > timeout_s:
            raise TimeoutError(f"{t.path.name}: timeline value {value} not reached in "
                               f"{timeout_s} s (at {now_done})")
        t.path.sleep(min(max(waited * NAP_SHARE, NAP_FIRST_S), NAP_LAST_S))
