"""Is a copy itself slower under rig, or does rig's launch and wait add time around it? Times
20 copies on the host's clock (submission to wait's return) and on the GPU's (a profile's
stamps right before and after, both after a wait for idle): 256 MiB and 1 GiB inside GPU 0,
and 256 MiB between Pinned and Device memory each way on the copy engine; then the pinned
copies again with waits napping 1/128 of the time waited instead of rig_nv.waiting's share.
An experiment.

    python3 scripts/copy_variants/gpu_time.py
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory
from rig_nv import waiting


def main() -> int:
    d = rig_nv_nvidia.gpu(0).open()
    print(f"{'copy':<26}{'wall GB/s':>10}{'GPU GB/s':>10}{'wall us':>9}{'GPU us':>8}")
    rng = np.random.default_rng()

    def measure(name: str, n: int, dst: object, src: object) -> None:
        for _ in range(3):
            d.copy(dst, src).wait()
        wall = []
        with d.profile() as p:
            for _ in range(20):
                s = time.perf_counter()
                d.copy(dst, src).wait()
                wall.append(time.perf_counter() - s)
        gpu = [e.duration_ns * 1e-9 for e in p.events()]
        w, g = statistics.median(wall), statistics.median(gpu)
        print(f"{name:<26}{n / w / 1e9:>10.0f}{n / g / 1e9:>10.1f}{w * 1e6:>9.1f}{g * 1e6:>8.1f}",
              flush=True)

    for n in (256 << 20, 1 << 30):
        a, b = d.alloc(n), d.alloc(n)
        data = rng.bytes(n)
        d.upload(a, data).wait()
        measure(f"inside the GPU {n >> 20} MiB", n, b, a)
        assert bytes(d.download(b)) == data
        d.free(a)
        d.free(b)
    n = 256 << 20
    dev, pin = d.alloc(n), d.alloc(n, Memory.PINNED)
    for share in (waiting.NAP_SHARE, 1 / 128):
        waiting.NAP_SHARE = share
        tag = f" (naps 1/{round(1 / share)})"
        measure("H2D pinned" + tag, n, dev, pin)
        measure("D2H pinned" + tag, n, pin, dev)
    d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
