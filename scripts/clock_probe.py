"""Are rig's kernels slow because the SMs idle at a low clock? SM clock samples (nvidia-smi,
read only) beside D2D copy bandwidth and a 64-launch step's per-kernel cost, without and with
the RM's CUDA perf boost (NV2080_CTRL_CMD_PERF_BOOST, cleared again afterwards)."""

from __future__ import annotations

import statistics
import struct
import subprocess
import time
from pathlib import Path

import rig_nv_nvidia
from rig_edge import Memory

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"


def boost(d: object, on: bool) -> None:
    path = d.path  # type: ignore[attr-defined]
    params = bytearray(struct.pack("<II", 0x52 if on else 0, 20 if on else 0))
    path.rm.control(path.h_subdevice, 0x2080200A, params)


def clock() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip()


def run(d: object, label: str) -> str:
    a = d.alloc(256 << 20, Memory.DEVICE)  # type: ignore[attr-defined]
    b = d.alloc(256 << 20, Memory.DEVICE)  # type: ignore[attr-defined]
    for _ in range(5):
        d.copy(b, a).wait()  # type: ignore[attr-defined]
    t = time.perf_counter()
    for _ in range(20):
        p = d.copy(b, a)  # type: ignore[attr-defined]
    p.wait()
    gbs = 20 * (256 << 20) / (time.perf_counter() - t) / 1e9
    one = []
    for _ in range(20):
        t = time.perf_counter()
        d.copy(b, a).wait()  # type: ignore[attr-defined]
        one.append(time.perf_counter() - t)
    one_gbs = (256 << 20) / statistics.median(one) / 1e9
    mid = clock()
    img = d.load(CUBIN.read_bytes())  # type: ignore[attr-defined]
    r = d.alloc(1 << 20, Memory.DEVICE)  # type: ignore[attr-defined]
    steps = {}
    for count in (1, 64):
        s = d.step()  # type: ignore[attr-defined]
        for _ in range(count):
            s.launch(img["vadd"], (1,), (32,), (r, r, r, 32))
        for _ in range(20):
            s.submit().wait()
        times = []
        for _ in range(200):
            t = time.perf_counter()
            s.submit().wait()
            times.append(time.perf_counter() - t)
        steps[count] = statistics.median(times)
    per = (steps[64] - steps[1]) / 63
    lat = []
    for _ in range(2000):
        t = time.perf_counter()
        d.launch(img["vadd"], (1,), (32,), (r, r, r, 32)).wait()  # type: ignore[attr-defined]
        lat.append(time.perf_counter() - t)
    return (f"{label:<10} D2D {gbs:7.1f} GB/s (copy+wait {one_gbs:7.1f}), launch+wait "
            f"{statistics.median(lat) * 1e6:6.2f} us, step per further kernel {per * 1e6:6.2f} us, "
            f"SM clock during copies {mid}, after {clock()}")


if __name__ == "__main__":
    d = rig_nv_nvidia.gpu(0).open()
    try:
        print("idle clock", clock())
        boost(d, False)  # rig boosts at open now: measure without first
        rows = [run(d, "no boost")]
        boost(d, True)
        try:
            time.sleep(0.2)
            rows.append(run(d, "boosted"))
        finally:
            boost(d, False)
        print("\n".join(rows))
    finally:
        d.stop()
    time.sleep(1)
    print("clock after clear", clock())
