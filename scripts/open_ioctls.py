"""Which ioctls a fresh process's first open spends its time in, for the GPU machine: every
fcntl.ioctl timed (wrapped before rig is imported), then the twelve slowest request codes with
the RM class or control command they carried.

    python3 scripts/open_ioctls.py

Request codes: 0xc0xx462a/b are NV_ESC_RM_CONTROL/ALLOC on /dev/nvidiactl (nv_escape.h);
small numbers are UVM ioctls (uvm_ioctl.h, e.g. 37 UVM_REGISTER_GPU).
"""

from __future__ import annotations

import collections
import fcntl
import time
from typing import Any

real = fcntl.ioctl
spent: dict[tuple[int, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])


def what(request: int, args: tuple[Any, ...]) -> str:
    """The class of an RM alloc (NVOS21/64 hClass at 12) or the command of an RM control
    (NVOS54 cmd at 8), read from the struct passed."""
    try:
        buf = bytes(args[0])
    except (IndexError, TypeError):
        return ""
    if request & 0xFF == 0x2B and len(buf) >= 16:
        return f"alloc class 0x{int.from_bytes(buf[12:16], 'little'):x}"
    if request & 0xFF == 0x2A and len(buf) >= 12:
        return f"control 0x{int.from_bytes(buf[8:12], 'little'):x}"
    return ""


def timed(fd: int, request: int, *args: Any) -> Any:
    t = time.perf_counter()
    try:
        return real(fd, request, *args)
    finally:
        entry = spent[(request, what(request, args))]
        entry[0] += 1
        entry[1] += time.perf_counter() - t


def main() -> None:
    fcntl.ioctl = timed  # type: ignore[assignment]
    t0 = time.perf_counter()
    import rig_nv_nvidia

    t1 = time.perf_counter()
    d = rig_nv_nvidia.gpu(0).open()
    t2 = time.perf_counter()
    d.stop()
    t3 = time.perf_counter()
    print(f"import {1e3 * (t1 - t0):.1f} ms, open {1e3 * (t2 - t1):.1f} ms, "
          f"stop {1e3 * (t3 - t2):.1f} ms")
    for (request, name), (count, seconds) in sorted(spent.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"ioctl 0x{request:08x} {name:<28} x{int(count):<4} {seconds * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
