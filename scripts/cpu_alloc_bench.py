"""The CPU cost of rig's pool, without a GPU: alloc+free round trips of Device memory on a
rig_nv.Device over the stand-in path of packages/rig-nv/tests/fake_gpu.py (bench row 6's sizes;
the timeline is advanced by hand). Prints the thread's CPU microseconds per round trip (median
and least of many batches) for the tree given (default: this one), so that two trees can be
run in turn: ``python scripts/cpu_alloc_bench.py [TREE]``."""

from __future__ import annotations

import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
sys.path[:0] = [*map(str, sorted((ROOT / "packages").glob("*/src"))),
                str(ROOT / "packages/rig-nv/tests")]

from fake_gpu import BASE, FakePath, open_on  # noqa: E402


def per_call(f: Callable[[], object], n: int = 2000, batches: int = 40) -> str:
    """The thread's CPU time per call of ``f`` (median and least of ``batches`` batches): on a
    machine shared with other work, the wall clock counts their turns too."""
    times = []
    for _ in range(batches):
        t = time.thread_time()
        for _ in range(n):
            f()
        times.append((time.thread_time() - t) / n * 1e6)
    return f"{statistics.median(times):6.3f} us (least {min(times):6.3f})"


def device(at: int) -> tuple[Any, FakePath]:
    path = FakePath()
    path.next = at
    d = open_on(path)
    path.complete()
    return d, path


d, path = device(BASE)


def round_trip(n: int) -> None:
    d.free(d.alloc(n))


print(f"tree {ROOT}")
for name, size in (("64 KiB", 64 << 10), ("64 MiB", 64 << 20), ("1 GiB", 1 << 30)):
    r = d.alloc(size)
    d.free(r)
    if not any(a.gpu == r.gpu for a in d.memory.kept()):
        print(f"alloc+free {name}: not kept for reuse")
        continue
    print(f"alloc+free {name}: {per_call(functools.partial(round_trip, size))}")

t = d.timeline


def in_flight() -> None:
    """A 64 KiB round trip with a submission in flight at the free, done before the alloc."""
    t.next += 1
    r = d.alloc(64 << 10)
    d.free(r)
    t.word[0] = t.next - 1


print(f"alloc+free 64 KiB, work in flight at the free: {per_call(in_flight)}")
d2, path2 = device(BASE + (256 << 30))  # apart from the first's memory
d2.queue()
path2.complete()
print(f"alloc+free 64 KiB, a second queue: {per_call(lambda: d2.free(d2.alloc(64 << 10)))}")
