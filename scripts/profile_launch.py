"""Where a launch's time goes on the GPU machine: cProfile of 2,000 launch+wait of a tiny kernel.

Run by scripts/gpu-run; prints the top functions by own time.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path

import rig_nv_nvidia
from rig_edge import Memory

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"


def main() -> None:
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load(CUBIN.read_bytes())
    r = d.alloc(4096, Memory.DEVICE)
    assert r
    fn = img["vadd"]
    for _ in range(200):
        d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
    t = time.perf_counter()
    for _ in range(2000):
        d.launch(fn, (1,), (1,), (r, r, r, 1))
    d.synchronize()
    print(f"submit only: {(time.perf_counter() - t) / 2000 * 1e6:.2f} us per launch")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    d.stop()


if __name__ == "__main__":
    main()
