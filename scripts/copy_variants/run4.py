"""Which geometry copies 64 KiB to 64 MiB inside GPU 0 fastest: rig's shipped copy (copy16,
one block a chunk of 1024 units, through Device.copy(engine="sm")) against variants4.cu's
flatU (one block a chunk of 256 x U units) and loopU on at most one block an SM (fewer,
bigger blocks). Each checked byte-exact once, then 50 copies: the median on the GPU's clock
(a profile) and on the host's (launch to wait's return). For issue 23's small D2D rows
(bench row 10, 1 MiB and 16 MiB). An experiment.

    python3 scripts/copy_variants/run4.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import rig_nv_nvidia

HERE = Path(__file__).resolve().parent
SIZES = (64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


def timed(d: Any, go: Callable[[], Any]) -> tuple[float, float]:
    """(GPU seconds, host seconds), medians of 50 runs of ``go``."""
    wall = []
    with d.profile() as p:
        for _ in range(50):
            s = time.perf_counter()
            go().wait()
            wall.append(time.perf_counter() - s)
    gpu = statistics.median(e.duration_ns for e in p.events()) * 1e-9
    return gpu, statistics.median(wall)


def runs(d: Any, img: Any, a: Any, b: Any, n: int) -> list[tuple[str, int, Callable[[], Any]]]:
    """(name, blocks, a call that copies a to b and returns its point) for each variant."""
    count = n // 16
    out: list[tuple[str, int, Callable[[], Any]]] = [
        ("rig copy", -(-count // 1024), partial(d.copy, b, a, n, engine="sm"))]
    for name, u, most in [*((f"flat{u}", u, 1 << 31) for u in (1, 2, 4, 8, 16)),
                          ("loop4 <=1/SM", 4, d.sm_count), ("loop16 <=1/SM", 16, d.sm_count)]:
        blocks = min(most, -(-count // (256 * u)))
        out.append((name, blocks, partial(d.launch, img[name.split()[0]], (blocks,), (256,),
                                          (b, a, count))))
    return out


def main() -> int:
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load((HERE / "variants4.sm_90.cubin").read_bytes())
    print(f"{'variant':<16}{'KiB':>7}{'blocks':>8}{'GPU GB/s':>10}{'GPU us':>9}"
          f"{'wall us':>9}  byte-exact", flush=True)
    for n in SIZES:
        data = np.random.default_rng().bytes(n)
        a, b = d.alloc(n), d.alloc(n)
        assert a is not None and b is not None
        d.upload(a, data).wait()
        for name, blocks, go in runs(d, img, a, b, n):
            try:
                d.upload(b, bytes(16)).wait()
                go().wait()
                ok = bytes(d.download(b)) == data
                gpu, wall = timed(d, go)
                print(f"{name:<16}{n >> 10:>7}{blocks:>8}{n / gpu / 1e9:>10.0f}"
                      f"{gpu * 1e6:>9.2f}{wall * 1e6:>9.2f}  {ok}", flush=True)
            except Exception as e:  # an experiment: say what failed and go on
                print(f"{name:<16}{n >> 10:>7} failed: {type(e).__name__}: {e}"[:120], flush=True)
        d.free(a)
        d.free(b)
    d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
