"""Where a launch's time goes on the GPU machine, and which memory the GPU should read its
launches from: launch+wait latency and the step's per-kernel cost for each placement of the
launch arena and pushbuffers, then a cProfile of the submit path. Run by scripts/gpu-run.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time
from pathlib import Path

import rig_nv.setup as device_module
import rig_nv_nvidia
from rig_edge import Memory

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"


def measure(arena: Memory, pushbuffer: Memory) -> str:
    device_module.ARENA_KIND, device_module.PUSHBUFFER_KIND = arena, pushbuffer
    d = rig_nv_nvidia.gpu(0).open()
    try:
        img = d.load(CUBIN.read_bytes())
        r = d.alloc(4096, Memory.DEVICE)
        assert r
        fn = img["vadd"]
        for _ in range(300):
            d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
        lat = []
        for _ in range(3000):
            t = time.perf_counter()
            d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
            lat.append(time.perf_counter() - t)
        t = time.perf_counter()
        for _ in range(3000):
            d.launch(fn, (1,), (1,), (r, r, r, 1))
        d.synchronize()
        submit = (time.perf_counter() - t) / 3000
        steps = {}
        for count in (1, 64):
            s = d.step()
            for _ in range(count):
                s.launch(fn, (1,), (1,), (r, r, r, 1))
            for _ in range(50):
                s.submit().wait()
            times = []
            for _ in range(500):
                t = time.perf_counter()
                s.submit().wait()
                times.append(time.perf_counter() - t)
            steps[count] = statistics.median(times)
        per = (steps[64] - steps[1]) / 63
        return (f"arena={arena.value:<7} pb={pushbuffer.value:<7} launch+wait median "
                f"{statistics.median(lat) * 1e6:6.2f} us (min {min(lat) * 1e6:.2f}); submit "
                f"{submit * 1e6:.2f} us; step1 {steps[1] * 1e6:.2f} us, step64 "
                f"{steps[64] * 1e6:.1f} us, {per * 1e6:.2f} us per further kernel")
    finally:
        d.stop()


def profile() -> None:
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load(CUBIN.read_bytes())
    r = d.alloc(4096, Memory.DEVICE)
    assert r
    fn = img["vadd"]
    for _ in range(200):
        d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    d.stop()


if __name__ == "__main__":
    results = [measure(a, p) for a, p in ((Memory.PINNED, Memory.PINNED),
                                          (Memory.MAPPED, Memory.PINNED),
                                          (Memory.MAPPED, Memory.MAPPED))]
    device_module.ARENA_KIND = device_module.PUSHBUFFER_KIND = Memory.PINNED
    profile()
    print("\n".join(results))
