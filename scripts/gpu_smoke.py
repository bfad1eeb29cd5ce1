"""Step-by-step smoke run of the kernel-driver path on a real GPU, for the GPU machine.

Prints each step's outcome (and the traceback of a failure) so one device call shows how far
the path gets; ends with a short table. Run by scripts/gpu-run.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
import traceback

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory

rows: list[tuple[str, str]] = []


def step(name: str, fn):  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    try:
        out = fn()
        dt = (time.perf_counter() - t) * 1e3
        # Bytes show as their length: repr of 64 MiB would take longer than the download.
        shown = ("" if out is None else f"{len(out)} bytes"
                 if isinstance(out, bytes | bytearray | memoryview) else repr(out)[:160])
        rows.append((name, f"ok {dt:.2f} ms {shown}"))
        print(f"[ok] {name}: {shown} ({dt:.2f} ms)", flush=True)
        return out
    except BaseException as e:
        rows.append((name, f"FAIL {type(e).__name__}: {e}"))
        print(f"[FAIL] {name}", flush=True)
        traceback.print_exc()
        return None


def main() -> int:
    print("buses", rig_nv_nvidia.buses(), flush=True)
    d = step("open NV", lambda: rig_nv_nvidia.gpu(0).open())
    if d is None:
        for r in rows:
            print(f"{r[0]:<28} {r[1]}")
        return 1
    step("facts", lambda: d.facts)
    step("sm_count", lambda: (d.sm_count, d.classes))
    for kind in (Memory.PINNED, Memory.MAPPED, Memory.DEVICE):
        r = step(f"alloc 4KiB {kind.value}", lambda k=kind: d.alloc(4096, k))
        if r is not None:
            step(f"free 4KiB {kind.value}", lambda r=r: d.free(r))
    dev = step("alloc 64MiB device", lambda: d.alloc(64 << 20, Memory.DEVICE))
    pin = step("alloc 64MiB pinned", lambda: d.alloc(64 << 20, Memory.PINNED))
    if dev is not None and pin is not None:
        data = np.frombuffer(secrets.token_bytes(1 << 20), dtype=np.uint8)
        step("upload 1MiB", lambda: d.upload(dev, data, offset=13).wait())
        back = step("download 1MiB", lambda: bytes(d.download(dev, len(data), offset=13)))
        step("round trip equal", lambda: back == data.tobytes())
        step("d2d copy 1MiB",
             lambda: d.copy(pin, dev, len(data), dst_offset=7, src_offset=13).wait())
        step("d2d equal", lambda: bytes(d.download(pin, len(data), offset=7)) == data.tobytes())
        big = np.frombuffer(secrets.token_bytes(64 << 20), dtype=np.uint8)
        t = time.perf_counter()
        step("upload 64MiB", lambda: d.upload(dev, big).wait())
        up = (64 << 20) / (time.perf_counter() - t) / 1e9
        t = time.perf_counter()
        back = step("download 64MiB", lambda: bytes(d.download(dev)))
        down = (64 << 20) / (time.perf_counter() - t) / 1e9
        rate = f"{up:.2f} GB/s up, {down:.2f} GB/s down"
        step("64MiB equal", lambda: (back == big.tobytes(), rate))
        n = 2000
        t = time.perf_counter()
        for _ in range(n):
            p = d.copy(pin, dev, 4, dst_offset=0, src_offset=0)
        p.wait()
        per = (time.perf_counter() - t) / n * 1e6
        rows.append(("small copy submit", f"{per:.2f} us each"))
        t = time.perf_counter()
        for _ in range(200):
            d.copy(pin, dev, 4).wait()
        rows.append(("small copy+wait", f"{(time.perf_counter() - t) / 200 * 1e6:.2f} us"))
    anon = bytearray(os.urandom(3 * 4096 + 100))
    r = step("map_host anon", lambda: d.map_host(anon))
    step("usage", lambda: rig_nv_nvidia.usage(0, window=2.0))
    def second_open() -> str:
        from rig_edge import OpenRefused
        try:
            rig_nv_nvidia.gpu(0).open()
        except OpenRefused as e:
            return f"refused: {str(e)[:60]}"
        raise AssertionError("a second open of an open GPU succeeded")

    step("second open refused", second_open)
    if dev is not None:
        step("dma export", lambda: d.dma(dev))
    step("stop", d.stop)
    d2 = step("open again", lambda: rig_nv_nvidia.gpu(0).open())
    if d2 is not None:
        step("stop again", d2.stop)
    print("\n==== smoke summary ====")
    for name, what in rows:
        print(f"{name:<28} {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
