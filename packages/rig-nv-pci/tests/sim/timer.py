"""The simulated GPU's PTIMER: a nanosecond clock that advances with the host's monotonic
clock, optionally drifting from it, read through BAR 0 in two 32-bit halves.

Written from NVIDIA's published headers (open-gpu-kernel-modules 570.144,
src/common/inc/swref/published/), importing nothing of rig_nv_pci or rig_nv: NV_PTIMER_TIME_0
0x9400 and NV_PTIMER_TIME_1 0x9410 (volta/gv100/dev_timer.h), and the same time through the
virtual-function registers NV_VIRTUAL_FUNCTION_TIME_0 0x30080 and _TIME_1 0x30084
(turing/tu102/dev_vm.h), which a PF reaches at NV_VIRTUAL_FUNCTION_FULL_PHYS_OFFSET 0xB80000
(kern_gpu_tu102.c gpuGetVirtRegPhysOffset_TU102); TIME_0's NSEC field is bits 31:5 (its bits
4:0 read zero: 32 ns steps), TIME_1's bits 28:0. The host semaphores' RELEASE_TIMESTAMP writes
this time too (sim/pbdma.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

TIME_0, TIME_1 = 0x9400, 0x9410
VF = 0xB80000
VF_TIME_0, VF_TIME_1 = VF + 0x30080, VF + 0x30084


@dataclass
class SimTimer:
    """PTIMER: ``start_ns`` when made, then the host's ``clock`` (``time.monotonic_ns`` by
    default; a test may give a scripted one) since, ``drift_ppm`` parts per million fast
    (negative: slow). ``answers`` False: the GPU has stopped answering, and every half reads
    all ones, as a BAR read of a function that fell off the bus does."""

    start_ns: int = 0x0000_1234_5678_9A00
    drift_ppm: float = 0.0
    clock: Callable[[], int] = time.monotonic_ns
    answers: bool = True
    origin: int = field(init=False)

    def __post_init__(self) -> None:
        self.origin = self.clock()

    def now(self) -> int:
        """The time now, in nanoseconds (not yet cut to 32 ns steps)."""
        host = self.clock() - self.origin
        return self.start_ns + host + int(host * self.drift_ppm / 1e6)

    def owns(self, offset: int) -> bool:
        return offset in (TIME_0, TIME_1, VF_TIME_0, VF_TIME_1)

    def read(self, offset: int) -> int:
        """TIME_0's or TIME_1's value now (each read sees the time at that read)."""
        if not self.answers:
            return 0xFFFF_FFFF
        t = self.now()
        if offset in (TIME_0, VF_TIME_0):
            return t & 0xFFFF_FFE0
        return t >> 32 & 0x1FFF_FFFF
