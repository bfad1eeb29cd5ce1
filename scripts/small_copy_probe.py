"""Which engine should copy small amounts inside the GPU? rig's "auto" sends copies of
Device memory below 1 MiB to the copy engine (until 2026-12-04), larger ones to the
SMs; bench row 10 measured the SMs ahead at 4 KiB and 64 KiB in most runs, noisily. This
times d.copy(...).wait() with engine="copy" and engine="sm" interleaved in one process, 4 KiB
to 4 MiB, alone and right behind a one-thread kernel (a copy engine's copy then waits for the
compute channel), medians of 7 rounds of 200, each copy checked against fresh bytes.

    python3 scripts/small_copy_probe.py        (on the GPU machine)
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

import rig_nv_nvidia

ROOT = Path(__file__).resolve().parents[1]
CUBIN = ROOT / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"  # vadd, as one launch
SIZES = (4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
ROUNDS, REPS = 7, 200


def main() -> None:
    d = rig_nv_nvidia.gpu(0).open()
    rng = np.random.default_rng()
    try:
        vadd = d.load(CUBIN.read_bytes())["vadd"]
        scratch = d.alloc(4096)
        print(f"{'KiB':>6} {'behind':>7} {'copy us':>8} {'sm us':>8} {'sm/copy':>8} exact")
        for n in SIZES:
            src, dst = d.alloc(n), d.alloc(n)
            data = rng.integers(0, 256, n, dtype=np.uint8)
            d.upload(src, data).wait()
            for behind in (False, True):
                times: dict[str, list[float]] = {"copy": [], "sm": []}
                exact = True
                for _ in range(ROUNDS):
                    for engine in ("copy", "sm"):
                        d.upload(dst, bytes(n)).wait()
                        samples = []
                        for _ in range(REPS):
                            if behind:
                                d.launch(vadd, (1,), (1,), (scratch, scratch, scratch, 1))
                            t = time.perf_counter()
                            d.copy(dst, src, engine=engine).wait()
                            samples.append(time.perf_counter() - t)
                        times[engine].append(statistics.median(samples))
                        got = np.frombuffer(bytes(d.download(dst)), np.uint8)
                        exact = exact and bool(np.array_equal(got, data))
                ce, sm = (statistics.median(times[e]) * 1e6 for e in ("copy", "sm"))
                print(f"{n >> 10:6} {'kernel' if behind else '-':>7} {ce:8.2f} {sm:8.2f} "
                      f"{sm / ce:8.3f} {exact}")
            d.free(src)
            d.free(dst)
    finally:
        d.stop()


if __name__ == "__main__":
    main()
