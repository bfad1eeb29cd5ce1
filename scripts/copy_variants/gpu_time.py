"""Is the copy kernel itself slower under rig, or does rig's launch and wait add time around
it? Times 20 copies of 256 MiB and of 1 GiB inside GPU 0 on the host's clock (launch + wait)
and on the GPU's (a profile's stamps right before and after the kernel, both after a wait for
idle), and prints both rates. An experiment.

    python3 scripts/copy_variants/gpu_time.py
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import rig_nv_nvidia


def main() -> int:
    d = rig_nv_nvidia.gpu(0).open()
    print(f"{'size':>6}{'wall GB/s':>11}{'GPU GB/s':>10}{'wall us':>9}{'GPU us':>8}")
    for n in (256 << 20, 1 << 30):
        a, b = d.alloc(n), d.alloc(n)
        data = np.random.default_rng().bytes(n)
        d.upload(a, data).wait()
        for _ in range(3):
            d.copy(b, a).wait()
        wall = []
        with d.profile() as p:
            for _ in range(20):
                s = time.perf_counter()
                d.copy(b, a).wait()
                wall.append(time.perf_counter() - s)
        gpu = [e.duration_ns * 1e-9 for e in p.events() if e.name == "copy"]
        assert bytes(d.download(b)) == data
        w, g = statistics.median(wall), statistics.median(gpu)
        print(f"{n >> 20:>6}{n / w / 1e9:>11.0f}{n / g / 1e9:>10.0f}{w * 1e6:>9.1f}{g * 1e6:>8.1f}")
        d.free(a)
        d.free(b)
    d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
