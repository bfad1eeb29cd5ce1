"""The CPU cost of rig's launch path, without a GPU: launches on a rig_nv.Device over the
stand-in path of packages/rig-nv/tests/fake_gpu.py (nothing runs; the timeline is advanced by
hand). Prints microseconds per launch and the top of a cProfile."""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages/rig-nv/tests"))

from fake_gpu import open_fake  # noqa: E402

from rig_edge import Memory  # noqa: E402

d, path = open_fake()
img = d.load((ROOT / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin").read_bytes())
path.complete()
r = d.alloc(4096, Memory.DEVICE)
fn = img["vadd"]
d.timeline.word[0] = 1 << 62  # every value complete: no waits
for _ in range(1000):
    d.launch(fn, (1,), (1,), (r, r, r, 1))
n = 20000
t = time.perf_counter()
for _ in range(n):
    d.launch(fn, (1,), (1,), (r, r, r, 1))
print(f"launch: {(time.perf_counter() - t) / n * 1e6:.2f} us of CPU each")
step = d.step()
step.launch(fn, (1,), (1,), (r, r, r, 1))
step.submit()
t = time.perf_counter()
for _ in range(n):
    step.submit()
print(f"step submit: {(time.perf_counter() - t) / n * 1e6:.2f} us of CPU each")
prof = cProfile.Profile()
prof.enable()
for _ in range(5000):
    d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(12)
d.timeline.word[0] = d.timeline.current()
d.stop()
