"""Probe (issues 17 and 23): how fast one thread launches tiny kernels on a queue, per way a
launch releases its value and waits for the one before (rig_nv.setup.RELEASE_BY_QMD and
ORDER), beside the device's own launches. Each configuration: a fresh open, 20,000 launches
of a one-block vadd (after 2,000 not counted), the host's time to submit them and the
time until the last is done, best of three. Prints a line per configuration. Run on the GPU
machine: python3 scripts/launch_rate_probe.py [N]."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import rig_nv.setup
import rig_nv_nvidia

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
CONFIGS = [  # (where, RELEASE_BY_QMD, ORDER)
    ("device", True, "acquire"),
    ("queue", False, "acquire"),
    ("queue", True, "acquire"),
    ("queue", True, "acquire-stay"),
    ("queue", True, "wfi"),
]


def rate(where: str, by_qmd: bool, order: str, n: int) -> str:
    rig_nv.setup.RELEASE_BY_QMD, rig_nv.setup.ORDER = by_qmd, order
    d = rig_nv_nvidia.gpu(0).open()
    try:
        fn = d.load(CUBIN.read_bytes())["vadd"]
        a = d.alloc(1 << 16)
        assert a is not None
        q = d.queue() if where == "queue" else None
        on = d if where == "device" or q is None else q
        args = (a, a, a, 256)
        best_submit = best_done = float("inf")
        for _ in range(3):
            for _ in range(n // 10):
                on.launch(fn, (1,), (256,), args)
            on.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                p = on.launch(fn, (1,), (256,), args)
            t1 = time.perf_counter()
            p.wait(timeout_s=60)
            t2 = time.perf_counter()
            best_submit, best_done = min(best_submit, t1 - t0), min(best_done, t2 - t0)
        return (f"{where:6} by_qmd={by_qmd!s:5} order={order:12} submit "
                f"{best_submit / n * 1e6:5.2f} us/launch, done "
                f"{best_done / n * 1e6:5.2f} us/launch ({n / best_done:,.0f}/s)")
    finally:
        d.stop()


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    for cfg in CONFIGS:
        print(rate(*cfg, count), flush=True)
