"""Does launch+wait run slow in the first seconds after an open (the clocks not yet raised by
the boost request an open makes)? Twice (a fresh open, then an open right after a stop): opens
GPU 0 and launches+waits a one-block vadd back to back for 3 s, printing per 250 ms window the
median latency and the SM clock nvidia-smi saw (sampled every 100 ms). An experiment.

    python3 scripts/warmup_probe.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import rig_nv_nvidia
from rig_edge import Memory

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
SAMPLES: list[tuple[float, str]] = []


def sample() -> None:
    p = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,pstate",
                          "--format=csv,noheader,nounits", "-lms", "100"],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    for line in p.stdout:
        SAMPLES.append((time.monotonic(), line.strip()))


def clock_at(t0: float, t1: float) -> str:
    got = [s for t, s in SAMPLES if t0 <= t < t1]
    return "/".join(sorted(set(got))) or "-"


def run(label: str) -> None:
    t_open = time.monotonic()
    d = rig_nv_nvidia.gpu(0).open()
    opened = time.monotonic()
    fn = d.load(CUBIN.read_bytes())["vadd"]
    r = d.alloc(4096, Memory.DEVICE)
    args = (r, r, r, 1)
    lat: list[tuple[float, float]] = []
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        s = time.perf_counter()
        d.launch(fn, (1,), (1,), args).wait()
        lat.append((time.monotonic(), time.perf_counter() - s))
    d.stop()
    print(f"{label}: open took {(opened - t_open) * 1e3:.0f} ms")
    w = 0.25
    t = opened
    while t < end:
        xs = [x for at, x in lat if t <= at < t + w]
        if xs:
            print(f"  {t - opened:5.2f}-{t - opened + w:4.2f} s  {len(xs):6d} launches  median "
                  f"{statistics.median(xs) * 1e6:6.1f} us  sm clock/pstate {clock_at(t, t + w)}")
        t += w


def main() -> int:
    threading.Thread(target=sample, daemon=True).start()
    time.sleep(1.5)
    print("idle before:", clock_at(time.monotonic() - 1.0, time.monotonic()))
    run("first open")
    run("open right after a stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
