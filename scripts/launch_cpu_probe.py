"""What a launch call costs the CPU on the GPU machine, and how much of it is the doorbell
and the fence (an experiment, not a test).

Launches of a one-block ``vadd`` are submitted without waiting, 2000 at a time (the GPU runs
them meanwhile), min of 7 rounds per variant: as rig does it; with the doorbell written to
ordinary memory instead of the usermode page (the real doorbell is rung once after the round,
so the GPU still runs everything); and with neither the doorbell nor the fence. Then the same
on the CPU stand-in (packages/rig-nv/tests/fake_gpu.py), to compare the two machines' CPUs.

    python3 scripts/launch_cpu_probe.py
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable
from pathlib import Path

import rig_nv.channel as channel_module
import rig_nv_nvidia
from rig_edge import Memory

ROOT = Path(__file__).resolve().parents[1]
CUBIN = ROOT / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
ROUND, ROUNDS = 2000, 7


def best_us(d: object, round_: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        t = time.perf_counter()
        round_()
        best = min(best, (time.perf_counter() - t) / ROUND * 1e6)
        d.synchronize()  # type: ignore[attr-defined]
    return best


def probe(d: object, complete: Callable[[], None] | None = None) -> list[tuple[str, float]]:
    img = d.load(CUBIN.read_bytes())  # type: ignore[attr-defined]
    fn = img["vadd"]
    r = d.alloc(4096, Memory.DEVICE)  # type: ignore[attr-defined]
    args = (r, r, r, 1)
    launch = d.launch  # type: ignore[attr-defined]
    ch = d.compute  # type: ignore[attr-defined]
    real = ch.doorbell

    step = d.step()  # type: ignore[attr-defined]
    step.launch(fn, (1,), (1,), args)
    submit = step.submit
    what = [launch]

    def round_() -> None:
        if what[0] is launch:
            for _ in range(ROUND):
                launch(fn, (1,), (1,), args)
        else:
            for _ in range(ROUND):
                submit()
        if complete is not None:
            complete()

    def with_dummy_doorbell() -> None:
        ch.doorbell = memoryview(bytearray(4096)).cast("I")
        try:
            round_()
        finally:
            ch.doorbell = real
            channel_module.fence()
            real[0x90 >> 2] = ch.token

    for _ in range(3):
        round_()
        d.synchronize()  # type: ignore[attr-defined]
    rows = [("launch call", best_us(d, round_)),
            ("launch call, doorbell to host memory", best_us(d, with_dummy_doorbell))]
    fence = channel_module.fence
    channel_module.fence = lambda: None
    try:
        rows.append(("launch call, no doorbell, no fence", best_us(d, with_dummy_doorbell)))
    finally:
        channel_module.fence = fence
    # The same for a sealed one-kernel step's submission (bench row 3).
    what[0] = submit
    for _ in range(3):
        round_()
        d.synchronize()  # type: ignore[attr-defined]
    rows += [("step submit", best_us(d, round_)),
             ("step submit, doorbell to host memory", best_us(d, with_dummy_doorbell))]
    channel_module.fence = lambda: None
    try:
        rows.append(("step submit, no doorbell, no fence", best_us(d, with_dummy_doorbell)))
    finally:
        channel_module.fence = fence
    # Work of a submission's shape on plain memory: whether this process's CPU is slow
    # itself, or only its writes to the GPU's memory and its reads of what the GPU writes.
    rows.append(("plain Python of a submit's shape", best_us(d, plain_round)))
    return rows


class _Ring:
    def __init__(self) -> None:
        self.pending: deque[int] = deque()
        self.entries = array("Q", bytes(8 * 1024))
        self.put = 0


def plain_round() -> None:
    ring, lock = _Ring(), threading.Lock()
    for value in range(ROUND):
        lock.acquire()
        try:
            pending = ring.pending
            while pending and pending[0] <= value - 64:
                pending.popleft()
            put = ring.put
            ring.entries[put % 1024] = value
            ring.put = put + 1
            pending.append(value)
        finally:
            lock.release()


def stand_in() -> list[tuple[str, float]]:
    """The same on the stand-in, in a process of its own (its memory lies at fixed addresses
    that a real device's reservation holds)."""
    sys.path.insert(0, str(ROOT / "packages/rig-nv/tests"))
    from fake_gpu import open_fake

    fake, _path = open_fake()
    fake.timeline.word[0] = 1 << 62  # the stand-in runs nothing: every value complete
    return [(f"stand-in: {name}", v) for name, v in probe(fake)]


def main() -> None:
    if sys.argv[1:] == ["--stand-in"]:
        for name, v in stand_in():
            print(f"{name}\t{v}")
        return
    d = rig_nv_nvidia.gpu(0).open()
    try:
        rows = [(f"H200: {name}", v) for name, v in probe(d)]
    finally:
        d.stop()
    out = subprocess.run([sys.executable, __file__, "--stand-in"], capture_output=True,
                         text=True, check=True).stdout
    rows += [(name, float(v)) for name, v in (line.split("\t") for line in out.splitlines())]
    print(f"\n{'variant':<52} {'us a call (min of 7 x 2000)':>28}")
    for name, v in rows:
        print(f"{name:<52} {v:28.2f}")


if __name__ == "__main__":
    main()
