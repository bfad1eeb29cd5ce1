"""Where does row 5's gap to cuMemcpyDtoD go? rig's copy16 ran at 0.987x cuMemcpyDtoD's GPU
time when CUDA launched it (scripts/copy_variants/under_cuda2.py), yet d.copy(...).wait()
measures ~0.95x. For 256 MiB and 1 GiB copies inside GPU 0 this prints, each a median of 30:
the wall time of d.copy().wait(); the same of d.launch(copy16) with the grid d.copy uses; and
the GPU's span of each copy from a profile (PTIMER stamps before and after, rig_nv.profile).
If the GPU span is near CUDA's kernel time, the gap is the host's; if not, the launch's.

    python3 scripts/d2d_gap_probe.py        (on the GPU machine)
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import rig_nv_nvidia
from rig_nv import copies

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from common import timed  # the bench's own timing: row 5 is what this explains


def one_size(d: Any, img: Any, n: int) -> None:
    """Print the three ways' rows for copies of ``n`` bytes, then whether the copy was exact."""
    src, dst = d.alloc(n), d.alloc(n)
    data = np.random.default_rng().integers(0, 256, n, dtype=np.uint8)
    d.upload(src, data).wait()
    [(_, blocks, units)] = copies.copy16_launches(n // 16)
    ways: dict[str, Callable[[], None]] = {  # each submits and waits
        "d.copy": lambda: d.copy(dst, src).wait(),
        "d.launch(copy16)": lambda: d.launch(img["copy16"], (blocks,),
                                             (copies.COPY16_THREADS,),
                                             (dst.gpu, src.gpu, units)).wait(),
        "d.copy engine=copy": lambda: d.copy(dst, src, engine="copy").wait(),
    }
    for name, go in ways.items():
        wall = statistics.median(timed(go, 30, 3)) * 1e6
        with d.profile() as p:
            for _ in range(30):
                go()
        gpu = statistics.median(e.duration_ns / 1000 for e in p.events())
        print(f"{name:28} {n >> 20:5} {wall:9.1f} {n / wall / 1e3:10.0f} {gpu:8.1f} "
              f"{n / gpu / 1e3:9.0f}")
    ok = np.array_equal(np.frombuffer(bytes(d.download(dst)), np.uint8), data)
    print(f"{'byte-exact':28} {n >> 20:5} {ok}")
    d.free(src)
    d.free(dst)


def main() -> None:
    d = rig_nv_nvidia.gpu(0).open()
    try:
        img = d.loader.copy_kernels()
        print(f"{'way':28} {'MiB':>5} {'wall us':>9} {'wall GB/s':>10} {'GPU us':>8} "
              f"{'GPU GB/s':>9}")
        for n in (256 << 20, 1 << 30):
            one_size(d, img, n)
    finally:
        d.stop()


if __name__ == "__main__":
    main()
