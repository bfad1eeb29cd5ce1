"""What run3.py and run4.py share: a table of copy variants inside GPU 0 by size, each variant
checked byte-exact once, then timed ``reps`` times: the median on the GPU's clock (a profile)
and on the host's (launch to wait's return). An experiment."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import rig_nv_nvidia

# (name, blocks, a call that copies the source into the destination and returns its point)
Variant = tuple[str, int, Callable[[], Any]]
# The variants for (device, the cubin's image, destination, source, bytes).
Variants = Callable[[Any, Any, Any, Any, int], list[Variant]]


def table(cubin: Path, sizes: tuple[int, ...], variants: Variants, reps: int) -> int:
    """Print one row a variant and size; returns the exit status."""
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load(cubin.read_bytes())
    print(f"{'variant':<20}{'KiB':>8}{'blocks':>8}{'GPU GB/s':>10}{'GPU us':>10}"
          f"{'wall GB/s':>10}{'wall us':>10}  byte-exact", flush=True)
    for n in sizes:
        data = np.random.default_rng().bytes(n)
        a, b = d.alloc(n), d.alloc(n)
        assert a is not None and b is not None
        d.upload(a, data).wait()
        for name, blocks, go in variants(d, img, b, a, n):
            try:
                d.upload(b, bytes(16)).wait()
                go().wait()
                ok = bytes(d.download(b)) == data
                wall = []
                with d.profile() as p:
                    for _ in range(reps):
                        s = time.perf_counter()
                        go().wait()
                        wall.append(time.perf_counter() - s)
                gpu = statistics.median(e.duration_ns for e in p.events()) * 1e-9
                host = statistics.median(wall)
                print(f"{name:<20}{n >> 10:>8}{blocks:>8}{n / gpu / 1e9:>10.0f}"
                      f"{gpu * 1e6:>10.2f}{n / host / 1e9:>10.0f}{host * 1e6:>10.2f}  {ok}",
                      flush=True)
            except Exception as e:  # an experiment: say what failed and go on
                print(f"{name:<20}{n >> 10:>8} failed: {type(e).__name__}: {e}"[:120],
                      flush=True)
        d.free(a)
        d.free(b)
    d.stop()
    return 0
