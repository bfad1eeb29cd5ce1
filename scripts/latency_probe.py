"""Where a launch+wait's time goes on the GPU machine (an experiment, not a test).

Each variant changes one thing about a one-block launch of ``vadd`` and reports the median
launch+wait over 3000 launches (after 300 warm-up ones), with the launch call's own CPU time
and the wait's apart. Variants: the QMD's end-of-grid membar and cache invalidations, the
grid's completion reported by the QMD's own release (clcbc0qmd.h RELEASE_ENABLE(0) and
RELEASE_SEMAPHORE0, a reduction ADD of 1 to a probe word) instead of (or besides) the
channel's WFI semaphore release, an empty submission's round trip on each channel, and the
launch arena in video memory. The QMD bits follow open-gpu-doc clcbc0qmd.h (V04_00, Hopper).

    python3 scripts/latency_probe.py        (needs the GPU; prints a table last)
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import rig_nv_nvidia
from rig_edge import Memory
from rig_nv import launch as launching
from rig_nv import setup
from rig_nv.hostmem import view
from rig_nv.push import SEM_RELEASE_WFI

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
N, WARM = 3000, 300

# clcbc0qmd.h V04_00, MW(hi:lo) from bit 0 of dword 0.
CWD_MEMBAR_TYPE = (1137, 1136)
INVALIDATES = ((602, 602), (603, 603), (604, 604), (605, 605))
RELEASE_ENABLE0 = (320, 320)
RELEASE_STRUCTURE_SIZE0 = (322, 321)  # 1: SEMAPHORE_ONE_WORD
RELEASE_MEMBAR_TYPE0 = (323, 323)  # 1: FE_SYSMEMBAR
RELEASE_REDUCTION_ENABLE0 = (324, 324)
RELEASE_REDUCTION_OP0 = (327, 325)  # 0: RED_ADD
SEM0_ADDR_LOWER, SEM0_ADDR_UPPER = (671, 640), (696, 672)
SEM0_PAYLOAD_LOWER = (735, 704)


def put(q: bytearray, f: tuple[int, int], value: int) -> None:
    hi, lo = f
    whole = int.from_bytes(q[:384], "little")
    mask = ((1 << (hi - lo + 1)) - 1) << lo
    whole = (whole & ~mask) | ((value << lo) & mask)
    q[:384] = whole.to_bytes(384, "little")


def median_us(xs: list[float]) -> float:
    return statistics.median(xs) * 1e6


def run(arena: Memory, pushbuffer: Memory) -> list[tuple[str, float, float, float]]:
    setup.ARENA_KIND, setup.PUSHBUFFER_KIND = arena, pushbuffer
    where = f"arena {arena.value}, pushbuffers {pushbuffer.value}"
    d = rig_nv_nvidia.gpu(0).open()
    rows: list[tuple[str, float, float, float]] = []
    try:
        img = d.load(CUBIN.read_bytes())
        fn = img["vadd"]
        r = d.alloc(4096, Memory.DEVICE)
        probe = d.alloc(4096, Memory.PINNED)
        assert r is not None and probe is not None and probe.host is not None
        word = view(probe.host, 8).cast("I")
        args = (r, r, r, 1)
        d.launch(fn, (1,), (1,), args).wait()
        original = {k: p.blob for k, p in fn.prepared.items()}
        release_op = d.timeline.launch_words[9]

        def measure(name: str, once: Callable[[], Callable[[], None]]) -> None:
            for _ in range(WARM):
                once()()
            sub, wait, total = [], [], []
            for _ in range(N):
                t0 = time.perf_counter()
                w = once()
                t1 = time.perf_counter()
                w()
                t2 = time.perf_counter()
                sub.append(t1 - t0)
                wait.append(t2 - t1)
                total.append(t2 - t0)
            rows.append((f"{name} [{where}]", median_us(total), median_us(sub),
                         median_us(wait)))
            print(rows[-1], flush=True)

        def qmd(edit: Callable[[bytearray], None]) -> None:
            for k, p in list(fn.prepared.items()):
                b = bytearray(original[k])
                edit(b)
                # new slots too: the old ones hold QMDs written from the old blob
                fn.prepared[k] = dataclasses.replace(p, blob=bytes(b), slots=launching.Slots())

        def plain() -> Callable[[], None]:
            return d.launch(fn, (1,), (1,), args).wait

        measure("launch+wait", plain)

        def no_membar(b: bytearray) -> None:
            put(b, CWD_MEMBAR_TYPE, 0)
        qmd(no_membar)
        measure("CWD membar none", plain)

        def no_inval(b: bytearray) -> None:
            for f in INVALIDATES:
                put(b, f, 0)
        qmd(no_inval)
        measure("no cache invalidations", plain)

        def release(membar: int) -> Callable[[bytearray], None]:
            def edit(b: bytearray) -> None:
                put(b, RELEASE_ENABLE0, 1)
                put(b, RELEASE_STRUCTURE_SIZE0, 1)
                put(b, RELEASE_MEMBAR_TYPE0, membar)
                put(b, RELEASE_REDUCTION_ENABLE0, 1)
                put(b, RELEASE_REDUCTION_OP0, 0)
                put(b, SEM0_ADDR_LOWER, probe.gpu & 0xFFFFFFFF)
                put(b, SEM0_ADDR_UPPER, probe.gpu >> 32)
                put(b, SEM0_PAYLOAD_LOWER, 1)
            return edit

        def on_probe() -> Callable[[], None]:
            target = word[0] + 1
            d.launch(fn, (1,), (1,), args)

            def spin() -> None:
                while word[0] < target:
                    pass
            return spin

        qmd(release(1))
        measure("QMD release (sysmembar), wait on it", on_probe)
        qmd(release(0))
        measure("QMD release (no membar), wait on it", on_probe)
        d.timeline.launch_words[9] = release_op & ~SEM_RELEASE_WFI
        measure("QMD release, channel release without WFI", on_probe)
        d.timeline.launch_words[9] = release_op
        d.synchronize()
        qmd(lambda b: None)

        def empty(ch: object) -> Callable[[], Callable[[], None]]:
            def once() -> Callable[[], None]:
                return d.timeline.submit(ch, ()).wait  # type: ignore[arg-type]
            return once
        measure("empty submission, compute channel", empty(d.compute))
        measure("empty submission, copy channel", empty(d.copy_channel))
        d.launch(fn, (1,), (1,), args).wait()
        measure("launch+wait again", plain)
    finally:
        d.stop()
    return rows


def main() -> None:
    kinds = setup.ARENA_KIND, setup.PUSHBUFFER_KIND
    rows = [row for a, p in ((Memory.PINNED, Memory.PINNED), (Memory.MAPPED, Memory.PINNED),
                             (Memory.MAPPED, Memory.MAPPED)) for row in run(a, p)]
    setup.ARENA_KIND, setup.PUSHBUFFER_KIND = kinds
    print(f"\n{'variant':<72} {'total':>7} {'call':>7} {'wait':>7}  (median us)")
    for name, total, sub, wait in rows:
        print(f"{name:<72} {total:7.2f} {sub:7.2f} {wait:7.2f}")


if __name__ == "__main__":
    main()
