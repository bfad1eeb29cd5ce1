"""The CPU cost of rig's launch path, without a GPU: launches on a rig_nv.Device over the
stand-in path of packages/rig-nv/tests/fake_gpu.py (nothing runs; the timeline is advanced by
hand). Prints the thread's CPU microseconds per launch, per step submission and per step of
``submit(times=10_000)`` (median and least of 15 batches) and the top of a cProfile."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
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


def per_call(f: Callable[[], object], n: int = 4000, batches: int = 15, each: int = 1) -> str:
    """The thread's CPU time per call of ``f`` over ``each`` (median and least of ``batches``
    batches): on a machine shared with other work, the wall clock counts their turns too."""
    times = []
    for _ in range(batches):
        t = time.thread_time()
        for _ in range(n):
            f()
        times.append((time.thread_time() - t) / n / each * 1e6)
    return f"{statistics.median(times):.3f} us of CPU each (least {min(times):.3f})"


print(f"launch: {per_call(lambda: d.launch(fn, (1,), (1,), (r, r, r, 1)))}")
step = d.step()
step.launch(fn, (1,), (1,), (r, r, r, 1))
step.submit()
print(f"step submit: {per_call(step.submit)}")
TIMES = 10_000  # bench row 3's steps in flight (bench/common.py FLIGHT)
try:
    step.submit(times=2)
except TypeError:  # a tree before Step.submit(times=...)
    print("step submit(times=N): none in this tree")
else:
    print(f"step submit(times={TIMES}), per step: "
          f"{per_call(lambda: step.submit(times=TIMES), n=20, each=TIMES)}")
prof = cProfile.Profile()
prof.enable()
for _ in range(5000):
    d.launch(fn, (1,), (1,), (r, r, r, 1)).wait()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(12)
d.timeline.word[0] = d.timeline.current()
d.stop()
