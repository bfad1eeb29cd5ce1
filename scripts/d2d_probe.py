"""Why do rig's copies inside the GPU run at ~0.7x CUDA's? Samples the GPU's P-state and SM and
memory clocks (nvidia-smi, every 100 ms) while rig copies 256 MiB inside GPU 0 for ~2 s, then
while rig copies between physically contiguous allocations, 1 GiB, and finally while PyTorch
(CUDA) copies 256 MiB in a child process. Prints one row per phase: GB/s (median), and the
median clocks nvidia-smi saw during it.

    python3 scripts/d2d_probe.py        (on the GPU machine; torch optional)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory
from rig_nv.copies import kernel_copy

N = 256 << 20
SECONDS = 2.0

TORCH = r"""
import sys, time, statistics, torch
n = int(sys.argv[1])
a = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(5): b.copy_(a)
torch.cuda.synchronize()
t = []; end = time.perf_counter() + float(sys.argv[2])
while time.perf_counter() < end:
    s = time.perf_counter(); b.copy_(a); torch.cuda.synchronize(); t.append(time.perf_counter() - s)
assert torch.equal(a, b)
print(n / statistics.median(t) / 1e9)
"""


class Sampler:
    """nvidia-smi's P-state and clocks every 100 ms, each line stamped with the host's time."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            ["nvidia-smi", "-i", "0", "--query-gpu=pstate,clocks.sm,clocks.mem,power.draw",
             "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.strip()))

    def between(self, t0: float, t1: float) -> str:
        rows = [s.split(", ") for t, s in self.lines if t0 <= t <= t1]
        if not rows:
            return "no samples"
        pstates = sorted({r[0] for r in rows})
        sm = statistics.median(float(r[1]) for r in rows)
        mem = statistics.median(float(r[2]) for r in rows)
        power = statistics.median(float(r[3]) for r in rows)
        return f"{'/'.join(pstates):<6} sm {sm:>6.0f} MHz  mem {mem:>6.0f} MHz  {power:>5.0f} W"


def loop(fn: Callable[[], None]) -> float:
    for _ in range(3):
        fn()
    t = []
    end = time.perf_counter() + SECONDS
    while time.perf_counter() < end:
        s = time.perf_counter()
        fn()
        t.append(time.perf_counter() - s)
    return statistics.median(t)


def main() -> int:
    smi = Sampler()
    time.sleep(1.0)
    rows: list[tuple[str, float, str]] = []

    def phase(name: str, n: int, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        s = loop(fn)
        rows.append((name, n / s / 1e9, smi.between(t0, time.monotonic())))

    t0 = time.monotonic()
    time.sleep(1.0)
    rows.append(("idle, no device", 0.0, smi.between(t0, time.monotonic())))

    d = rig_nv_nvidia.gpu(0).open()
    rng = np.random.default_rng()
    data = rng.bytes(N)
    a, b = d.alloc(N), d.alloc(N)
    d.upload(a, data).wait()
    d.copy(b, a).wait()
    assert bytes(d.download(b)) == data, "rig's copy changed the bytes"
    t0 = time.monotonic()
    time.sleep(1.0)
    rows.append(("idle, rig device open", 0.0, smi.between(t0, time.monotonic())))
    phase("rig 256 MiB", N, lambda: d.copy(b, a).wait())

    big = 1 << 30
    c, e = d.alloc(big), d.alloc(big)
    phase("rig 1 GiB", big, lambda: d.copy(e, c).wait())
    d.free(c)
    d.free(e)

    ca = d.path.alloc_memory(N, Memory.DEVICE, contiguous=True)
    cb = d.path.alloc_memory(N, Memory.DEVICE, contiguous=True)
    if ca is not None and cb is not None:
        phase("rig 256 MiB contiguous", N, lambda: kernel_copy(d, cb.gpu, ca.gpu, N).wait())
        d.path.free_memory(ca)
        d.path.free_memory(cb)
    d.free(a)
    d.free(b)
    d.stop()

    for n in (N, big):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", TORCH, str(n), str(SECONDS)],
                           capture_output=True, text=True)
        if r.returncode:
            rows.append((f"torch {n >> 20} MiB", 0.0, r.stderr.strip().splitlines()[-1][:60]))
            break
        rows.append((f"torch {n >> 20} MiB (incl. start)", float(r.stdout),
                     smi.between(t0, time.monotonic())))
    smi.proc.terminate()
    print(f"{'phase':<34}{'GB/s':>8}  clocks (median of nvidia-smi samples)")
    for name, gbs, clocks in rows:
        print(f"{name:<34}{gbs:>8.0f}  {clocks}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
