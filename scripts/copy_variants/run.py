"""Time copy-kernel variants (variants.cu, built by `nvcc -cubin -O3 -arch=sm_90`) on 256 MiB:
inside GPU 0, and GPU 1 reading/writing GPU 0's memory through map_peer when two GPUs are here.
Each variant x grid (blocks per SM) is checked byte-exact once, then timed (median of 20)."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import rig_nv_nvidia

N = 256 << 20
HERE = Path(__file__).resolve().parent


def bench(d, fn, dst, src, blocks):  # type: ignore[no-untyped-def]
    count = N // 16
    def once() -> None:
        d.launch(fn, (blocks,), (256,), (dst, src, count)).wait()
    for _ in range(3):
        once()
    t = []
    for _ in range(20):
        s = time.perf_counter()
        once()
        t.append(time.perf_counter() - s)
    return N / statistics.median(t) / 1e9


def main() -> None:
    d0 = rig_nv_nvidia.gpu(0).open()
    img0 = d0.load((HERE / "variants.sm_90.cubin").read_bytes())
    rng = np.random.default_rng()
    data = rng.bytes(N)
    a, b = d0.alloc(N), d0.alloc(N)
    d0.upload(a, data).wait()
    rows = []
    names = ["plain", "u4", "u4cs", "u8", "u8cs"]
    for name in names:
        for per_sm in (4, 8, 16):
            blocks = d0.sm_count * per_sm
            d0.upload(b, bytes(N)).wait()
            d0.launch(img0[name], (blocks,), (256,), (b, a, N // 16)).wait()
            ok = bytes(d0.download(b)) == data
            rows.append(("d2d", name, per_sm, bench(d0, img0[name], b, a, blocks), ok))
    if rig_nv_nvidia.count() >= 2:
        d1 = rig_nv_nvidia.gpu(1).open()
        img1 = d1.load((HERE / "variants.sm_90.cubin").read_bytes())
        p = d1.map_peer(d0, a)
        local = d1.alloc(N)
        for name in names:
            for per_sm in (8, 16):
                blocks = d1.sm_count * per_sm
                d1.upload(local, bytes(N)).wait()
                d1.launch(img1[name], (blocks,), (256,), (local, p, N // 16)).wait()
                ok = bytes(d1.download(local)) == data
                read = bench(d1, img1[name], local, p, blocks)
                write = bench(d1, img1[name], p, local, blocks)
                rows.append(("peer read", name, per_sm, read, ok))
                rows.append(("peer write", name, per_sm, write, ok))
        d1.free(p)
        d1.stop()
    d0.stop()
    print(f"{'what':<11}{'kernel':<7}{'blk/SM':>7}{'GB/s':>9}  ok")
    for what, name, per_sm, gbs, ok in rows:
        print(f"{what:<11}{name:<7}{per_sm:>7}{gbs:>9.0f}  {ok}")


if __name__ == "__main__":
    sys.exit(main())
