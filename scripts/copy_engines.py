"""Copy bandwidth per copy-engine choice (rig_nv.setup.COPY_ENGINE), an experiment for the
GPU machine: pinned<->device and device->device on the copy channel, and device->device on
the SMs, 256 MiB, median of 7; the last MiB of the D2D copies checked against the data.

    python3 scripts/copy_engines.py
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory
from rig_nv import setup
from rig_nv.hostmem import view

N = 256 << 20
MIB = 1 << 20


def gbps(f: Callable[[], object], reps: int = 7) -> float:
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return N / statistics.median(times) / 1e9


def measure(choice: int | str | None) -> str:
    setup.COPY_ENGINE = choice
    try:
        d = rig_nv_nvidia.gpu(0).open()
    except Exception as e:  # an override the GPU refuses: say so and go on
        return f"{choice!s:>5}: open refused: {type(e).__name__}: {str(e)[:150]}"
    try:
        pin, a, b = d.alloc(N, Memory.PINNED), d.alloc(N, Memory.DEVICE), d.alloc(N)
        assert pin is not None and pin.host is not None and a is not None and b is not None
        data = np.frombuffer(secrets.token_bytes(N), dtype=np.uint8)
        view(pin.host, N)[:] = data

        def on(engine: str, dst: object, src: object) -> Callable[[], object]:
            return lambda: d.copy(dst, src, engine=engine).wait(timeout_s=10)  # type: ignore[arg-type]

        h2d = gbps(on("copy", a, pin))
        d2h = gbps(on("copy", pin, a))
        d2d = gbps(on("copy", b, a))
        sm = gbps(on("sm", b, a))
        ok = bytes(d.download(b, MIB, offset=N - MIB)) == data[-MIB:].tobytes()
        return (f"{choice!s:>5}: {d!r}: H2D {h2d:7.1f}  D2H {d2h:7.1f}  D2D copy {d2d:7.1f}  "
                f"D2D sm {sm:7.1f} GB/s  data ok {ok}")
    except Exception as e:
        return f"{choice!s:>5}: {type(e).__name__}: {str(e)[:200]}"
    finally:
        d.stop()


def main() -> None:
    rows = []
    for choice in (None, "grce", 1, 2, 3, 4):
        rows.append(measure(choice))
        print(rows[-1], flush=True)
    setup.COPY_ENGINE = None
    print("\n".join(rows))


if __name__ == "__main__":
    main()
