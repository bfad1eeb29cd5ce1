"""The GPU's clock as a device reads it, and GPU times placed on the host's clock.

The GPU counts nanoseconds in PTIMER, two 32-bit registers: the clock the host semaphores'
RELEASE_TIMESTAMP writes into a profile's slots (:mod:`rig_nv.profile`) and the clock NVIDIA's
RM reads as the GPU's time (open-gpu-kernel-modules timer_gm107.c tmrGetTimeEx_GM107,
timer_gh100.c tmrGetTimeEx_GH100). It runs from the GPU's own oscillator, not the host's, so
its times drift from the host's clock. A device reads it in one of two ways
(:class:`Clock`, the spec's Rig_nv.clock; ``Device.clock``):

- :attr:`Clock.REGISTERS`: the path reads PTIMER's halves through BAR 0 itself (the PCI
  path), high, low, high again (:func:`read_split`), a few register reads;
- :attr:`Clock.RM`: the path asks the RM, which reads the same registers
  (NV2080_CTRL_CMD_TIMER_GET_TIME, ctrl2080tmr.h: :func:`rm_time_ns`; the kernel path, one
  ioctl that CPU-RM answers itself: its g_subdevice_nvoc.c flags have no ROUTE_TO_PHYSICAL).

A :class:`Pair` is the host's clock and the GPU's read together: the GPU's reading taken
between two readings of ``time.monotonic_ns()`` (CLOCK_MONOTONIC on Linux, which
``time.perf_counter_ns()`` reads too), the host time their midpoint and their distance the
pair's spread (the GPU was read somewhere within it), the narrowest of a few tries. A
:class:`Timebase` of a pair at a profile's start and one at its end places GPU times on the
host's clock and measures the drift between them.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rig_edge import RigError
from rig_nv.layouts import Params, rm_ffi

if TYPE_CHECKING:
    from rig_nv.rm import RM

# ctrl/ctrl2080/ctrl2080tmr.h: NV2080_CTRL_TIMER_GET_TIME_PARAMS {NvU64 time_nsec}, the
# subdevice's PTIMER as tmrGetCurrentTime reads it (subdevice_ctrl_timer_kernel.c).
NV2080_CTRL_CMD_TIMER_GET_TIME = 0x20800403
# NV_PTIMER_TIME_0_NSEC is bits 31:5 (gv100 and gh100 dev_timer.h; turing/tu102/dev_vm.h
# NV_VIRTUAL_FUNCTION_TIME_0_NSEC alike): the low half's bits 4:0 read zero, 32 ns steps.
LOW_ZERO_BITS = 0x1F
RESOLUTION_NS = 32
TRIES = 8  # reads of either half before a clock that does not settle is an error (rig's bound)
PAIR_TRIES = 3  # GPU readings a pair keeps the narrowest of
# A drift measured less precisely than this is not used to place times (the mapping assumes
# none): the host's CLOCK_MONOTONIC is slewed by at most 500 ppm (NTP's bound) and an
# oscillator's error is far less, so a coarser measurement says less than assuming no drift.
PLAUSIBLE_PPM = 1000.0


class Clock(enum.Enum):
    """How a device reads the GPU's clock (the spec's Rig_nv.clock; ``Device.clock``)."""

    REGISTERS = "registers"  # PTIMER's registers read through BAR 0 by the path itself
    RM = "rm"  # PTIMER as the RM reads it (NV2080_CTRL_CMD_TIMER_GET_TIME)

    @property
    def text(self) -> str:
        """What a trace says of it, e.g. ``"GPU PTIMER through BAR 0 registers"``."""
        if self is Clock.REGISTERS:
            return "GPU PTIMER through BAR 0 registers"
        return "GPU PTIMER through the RM (NV2080_CTRL_CMD_TIMER_GET_TIME)"


def read_split(read32: Callable[[int], int], low: int, high: int, *, what: str = "GPU",
               tries: int = TRIES) -> int:
    """PTIMER's 64 bits from its two 32-bit registers at BAR 0 offsets ``low`` and ``high``,
    read as NVIDIA's RM reads them (tmrGetTimeEx_GM107, after dev_timer.ref: "TIME_1 should
    be read first, followed by TIME_0, then a second reading of TIME_1 ... If the two readings
    of TIME_1 do not agree, this process should be repeated"; nouveau's nv04_timer_read
    alike): a carry from the low half into the high one between the two reads would otherwise
    tear the time by 2^32 ns (4.3 s). A low half whose bits 4:0 are set (they read zero:
    NV_PTIMER_TIME_0_NSEC 31:5) is read again, as tmrGetTimeEx does; a GPU that no longer
    answers reads all ones. Raises :class:`rig_edge.RigError` naming ``what`` when the low
    half reads such bits, or the high half changes, ``tries`` times in a row."""
    lo = 0
    for _ in range(tries):
        hi = read32(high)
        for _ in range(tries):
            lo = read32(low)
            if not lo & LOW_ZERO_BITS:
                break
        else:
            raise RigError(f"{what}: PTIMER's low half reads 0x{lo:08x} {tries} times in a row "
                           "(its bits 4:0 read zero on a GPU that answers)")
        if read32(high) == hi:
            return hi << 32 | lo
    raise RigError(f"{what}: PTIMER's high half changed across each of {tries} readings")


def rm_time_ns(rm: RM, h_subdevice: int) -> int:
    """PTIMER as the RM reads it for subdevice ``h_subdevice``: NV2080_CTRL_CMD_TIMER_GET_TIME
    (raises :class:`rig_nv.rm.RMError` where the RM refuses)."""
    params = Params(rm_ffi(rm.layouts), "NV2080_CTRL_TIMER_GET_TIME_PARAMS")
    rm.control(h_subdevice, NV2080_CTRL_CMD_TIMER_GET_TIME, params.buf)
    return int(params.p.time_nsec)


@dataclass(frozen=True)
class Pair:
    """The host's clock and the GPU's read together: ``gpu_ns`` was read between two host
    readings ``spread_ns`` apart whose midpoint is ``host_ns`` (``time.monotonic_ns()``), so it
    belongs to a host time within ``spread_ns / 2`` of ``host_ns``."""

    host_ns: int
    gpu_ns: int
    spread_ns: int


def pair(read: Callable[[], int], tries: int = PAIR_TRIES,
         host: Callable[[], int] = time.monotonic_ns) -> Pair:
    """A :class:`Pair` of ``host()`` and the GPU time ``read()`` answers: the narrowest of
    ``tries`` readings, each between two host readings (what an interrupt or a reschedule
    stretches is left out, as the RM's own GPU-CPU correlation keeps the closest pair)."""
    best: Pair | None = None
    for _ in range(tries):
        before = host()
        gpu = read()
        after = host()
        if best is None or after - before < best.spread_ns:
            best = Pair((before + after) // 2, gpu, after - before)
    assert best is not None
    return best


@dataclass(frozen=True)
class Timebase:
    """GPU times placed on the host's clock by a pair taken at ``start`` and, once there is
    one, a pair at ``end``.

    The GPU's clock drifts from the host's: between two pairs it is measured
    (:attr:`drift_ppm`, within :attr:`uncertainty_ppm`), and :meth:`to_host` maps a GPU time
    along the line through both pairs, before, between and after them. With one pair, or where
    the measurement is too coarse to say more than that the drift is small (uncertain by more
    than :data:`PLAUSIBLE_PPM`: pairs a few milliseconds apart), the mapping assumes no drift
    from ``start``. A mapped time is off by the pairs' half spreads and, away from the pairs,
    by the drift's error times the distance."""

    start: Pair
    end: Pair | None = None

    @property
    def drift_ppm(self) -> float | None:
        """How much faster the GPU's clock ran than the host's between the two pairs, in parts
        per million (negative: slower); ``None`` with one pair."""
        if self.end is None or self.end.host_ns <= self.start.host_ns:
            return None
        host = self.end.host_ns - self.start.host_ns
        return (self.end.gpu_ns - self.start.gpu_ns - host) / host * 1e6

    @property
    def uncertainty_ppm(self) -> float | None:
        """The most :attr:`drift_ppm` can be off by: the pairs' half spreads and a step of
        PTIMER's 32 ns at either end, over the host time between them; ``None`` with one pair."""
        if self.end is None or self.end.host_ns <= self.start.host_ns:
            return None
        slack = (self.start.spread_ns + self.end.spread_ns) / 2 + 2 * RESOLUTION_NS
        return slack / (self.end.host_ns - self.start.host_ns) * 1e6

    @property
    def drift_used(self) -> bool:
        """Whether :meth:`to_host` follows the measured drift (else it assumes none)."""
        u = self.uncertainty_ppm
        return (u is not None and u <= PLAUSIBLE_PPM and self.end is not None
                and self.end.gpu_ns > self.start.gpu_ns)

    def to_host(self, gpu_ns: int) -> int:
        """GPU time ``gpu_ns`` on the host's clock (``time.monotonic_ns()``)."""
        start = self.start
        if self.end is None or not self.drift_used:
            return start.host_ns + gpu_ns - start.gpu_ns
        rate = (self.end.host_ns - start.host_ns) / (self.end.gpu_ns - start.gpu_ns)
        return start.host_ns + round((gpu_ns - start.gpu_ns) * rate)
