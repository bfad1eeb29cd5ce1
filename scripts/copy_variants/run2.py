"""Time variants2.cu's copy kernels (built by `nvcc -cubin -O3 -arch=sm_90`) against rig's
shipped copy16 on 256 MiB inside GPU 0: each checked byte-exact once, then 20 copies under a
profile (median on the GPU's clock, and launch to wait's return on the host's). CUDA's
cuMemcpyDtoD takes ~128 us on the GPU for this size (137 us wall, bench row 5). An experiment.

    python3 scripts/copy_variants/run2.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import rig_nv_nvidia

N = 256 << 20
HERE = Path(__file__).resolve().parent


def main() -> int:
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load((HERE / "variants2.sm_90.cubin").read_bytes())
    ship = d.loader.copy_kernels()
    data = np.random.default_rng().bytes(N)
    a, b = d.alloc(N), d.alloc(N)
    d.upload(a, data).wait()
    sms = d.sm_count
    # (name, kernel, blocks, threads, dynamic shared bytes)
    variants = [("copy16 (rig)", ship["copy16"], sms * 8, 256, 0)]
    for per in (4, 8, 16):
        variants += [(f"ch4 {per}/SM", img["ch4"], sms * per, 256, 0),
                     (f"ch8 {per}/SM", img["ch8"], sms * per, 256, 0)]
    for per in (1, 2, 3):
        variants += [(f"bulk4x16k {per}/SM", img["bulk4x16k"], sms * per, 32, 4 * 16384),
                     (f"bulk8x8k {per}/SM", img["bulk8x8k"], sms * per, 32, 8 * 8192)]
    variants.append(("copy16 (rig), again", ship["copy16"], sms * 8, 256, 0))
    rows = []
    for name, fn, blocks, threads, shared in variants:
        try:
            d.upload(b, bytes(16)).wait()
            d.launch(fn, (blocks,), (threads,), (b, a, N // 16), shared).wait()
            ok = bytes(d.download(b)) == data
            wall = []
            with d.profile() as p:
                for _ in range(20):
                    s = time.perf_counter()
                    d.launch(fn, (blocks,), (threads,), (b, a, N // 16), shared).wait()
                    wall.append(time.perf_counter() - s)
            gpu = statistics.median(e.duration_ns for e in p.events()) * 1e-9
            rows.append((name, N / gpu / 1e9, gpu * 1e6, N / statistics.median(wall) / 1e9, ok))
        except Exception as e:  # an experiment: say what failed and go on
            rows.append((name, 0.0, 0.0, 0.0, f"{type(e).__name__}: {e}"[:80]))
        print(rows[-1], flush=True)
    d.stop()
    print(f"{'variant':<22}{'GPU GB/s':>9}{'GPU us':>8}{'wall GB/s':>10}  byte-exact")
    for name, g, us, w, ok in rows:
        print(f"{name:<22}{g:>9.0f}{us:>8.1f}{w:>10.0f}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
