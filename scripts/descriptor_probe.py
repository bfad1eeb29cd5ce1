"""Does the memory descriptor in constant bank 0 cost time per kernel? A 64-launch step's
per-kernel cost for a kernel doing no memory access (n=0), and doing three (n=32) with the
descriptor left 0 or set to createpolicy's evict_normal value (argv[1], from policy.cu)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import rig_nv.launch as launch_module
import rig_nv_nvidia
from rig_edge import Memory

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"


def measure(name: str, n: int, descriptor: int) -> str:
    launch_module.MEMORY_DESCRIPTOR = descriptor
    d = rig_nv_nvidia.gpu(0).open()
    try:
        img = d.load(CUBIN.read_bytes())
        r = d.alloc(1 << 20, Memory.DEVICE)
        assert r
        fn = img["vadd"]
        steps = {}
        for count in (1, 64):
            s = d.step()
            for _ in range(count):
                s.launch(fn, (1,), (32,), (r, r, r, n))
            for _ in range(30):
                s.submit().wait()
            times = []
            for _ in range(300):
                t = time.perf_counter()
                s.submit().wait()
                times.append(time.perf_counter() - t)
            steps[count] = statistics.median(times)
        lat = []
        for _ in range(1000):
            t = time.perf_counter()
            d.launch(fn, (1,), (32,), (r, r, r, n)).wait()
            lat.append(time.perf_counter() - t)
        per = (steps[64] - steps[1]) / 63
        return (f"{name:<22} step1 {steps[1] * 1e6:6.2f} us  per further kernel "
                f"{per * 1e6:6.2f} us  launch+wait {statistics.median(lat) * 1e6:6.2f} us")
    finally:
        d.stop()


if __name__ == "__main__":
    policy = int(sys.argv[1], 16) if len(sys.argv) > 1 else 0
    import rig_nv.qmd as qmd_module
    import rig_nv.step as step_module

    rows = [measure("as built", 32, 0)]
    qmd_module.DEPENDENT_ACTION = 3
    rows.append(measure("dependent action 3", 32, 0))
    qmd_module.DEPENDENT_ACTION = 1
    step_module.CHAIN = False  # each launch sent by the step itself, no ordering between them
    step_module.PCAS_ACTION = 9
    rows.append(measure("unchained, PCAS 9", 32, 0))
    step_module.PCAS_ACTION = 3
    rows.append(measure("unchained, PCAS 3", 32, 0))
    print("\n".join(rows))
