"""Probe (issue 23, row 10): what ends a copy engine's submission costs a small copy's wait.

A copy on the copy channel ends with the host's semaphore release, which waits for the
channel to go idle (SEM_EXECUTE RELEASE_WFI). The copy engine can release the value itself
once its transfer is flushed (LAUNCH_DMA SEMAPHORE_TYPE with FLUSH_ENABLE and a 64-bit
payload, clc8b5.h; tinygrad's and UVM's copy queues end so). Variants, each a copy then its
wait, median of 2,000 after 200, interleaved rounds:

- ``host``: as shipped (``Device.copy``);
- ``ce apart``: ``Device.copy`` with the timeline's release swapped for the engine's own,
  a LAUNCH_DMA of no transfer after the copy's;
- ``manual host`` / ``manual folded``: the same words built here and submitted through
  ``Timeline.submit``, the host's release, or the engine's folded into the copy's LAUNCH_DMA.

Last, values across 2^32 through the engine's release (its payload's upper word).

    python3 scripts/copy_release_probe.py
"""

from __future__ import annotations

import statistics
import sys
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import rig_nv_nvidia
from rig_edge import Memory
from rig_nv.push import (
    CE_DST_PITCH,
    CE_FLUSH_ENABLE,
    CE_LAUNCH_DMA,
    CE_LINE_LENGTH_IN,
    CE_OFFSET_IN_UPPER,
    CE_SEMAPHORE_PAYLOAD_64BIT,
    CE_SET_SEMAPHORE_A,
    CE_SRC_PITCH,
    CE_TRANSFER_NON_PIPELINED,
    SUBC_COPY,
    Push,
    hi_lo,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from common import timed

NO_TIMESTAMP = 1 << 3  # SEMAPHORE_TYPE RELEASE_SEMAPHORE_NO_TIMESTAMP (clc8b5.h, 4:3)
SEM = CE_FLUSH_ENABLE | NO_TIMESTAMP | CE_SEMAPHORE_PAYLOAD_64BIT
REPS, WARM, ROUNDS = 2000, 200, 3


def ce_release(t: Any) -> array[int]:
    """The engine's release of the timeline's word, value words at [3] and [4] as the
    host's (Timeline.submit writes them there)."""
    return Push().method(SUBC_COPY, CE_SET_SEMAPHORE_A, *hi_lo(t.gpu), 0, 0).method(
        SUBC_COPY, CE_LAUNCH_DMA, SEM).words


def manual(d: Any, dst: Any, src: Any, n: int, folded: bool) -> Callable[[], None]:
    t = d.timeline
    launch = CE_TRANSFER_NON_PIPELINED | CE_SRC_PITCH | CE_DST_PITCH

    def go() -> None:
        value = t.next
        p = Push()
        if folded:
            p.method(SUBC_COPY, CE_SET_SEMAPHORE_A, *hi_lo(t.gpu), value & 0xFFFFFFFF,
                     value >> 32)
        p.method(SUBC_COPY, CE_OFFSET_IN_UPPER, *hi_lo(src.gpu), *hi_lo(dst.gpu))
        p.method(SUBC_COPY, CE_LINE_LENGTH_IN, n)
        p.method(SUBC_COPY, CE_LAUNCH_DMA, launch | (SEM if folded else 0))
        point = t.submit(t.copy_channel, p.words, "copy", array("I") if folded else None)
        assert point.value == value
        point.wait()
    return go


def median_us(fn: Callable[[], None]) -> float:
    return statistics.median(timed(fn, REPS, WARM)) * 1e6


def main() -> None:
    d = rig_nv_nvidia.gpu(0).open()
    t = d.timeline
    rng = np.random.default_rng()
    rows: dict[str, list[float]] = {}
    shipped = t._release
    try:
        for kind, n in (("h2d", 4096), ("d2h", 4096), ("d2d", 4096), ("h2d", 1 << 20)):
            host = d.alloc(n, Memory.PINNED)
            dev, dev2 = d.alloc(n), d.alloc(n)
            src, dst = {"h2d": (host, dev), "d2h": (dev, host), "d2d": (dev, dev2)}[kind]
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            d.upload(src, data).wait()
            variants: dict[str, Callable[[], None]] = {
                "host": lambda dst=dst, src=src: d.copy(dst, src, engine="copy").wait(),
                "ce apart": lambda dst=dst, src=src: d.copy(dst, src, engine="copy").wait(),
                "manual host": manual(d, dst, src, n, False),
                "manual folded": manual(d, dst, src, n, True),
            }
            for _ in range(ROUNDS):
                for name, fn in variants.items():
                    t._release = ce_release(t) if name == "ce apart" else shipped
                    d.upload(dst, bytes(n)).wait()
                    us = median_us(fn)
                    t._release = shipped
                    ok = bytes(d.download(dst)) == data
                    key = f"{kind} {n >> 10} KiB, {name}"
                    rows.setdefault(key, []).append(us)
                    print(f"{key:<32} {us:8.2f} us  correct {ok}", flush=True)
            for r in (host, dev, dev2):
                d.free(r)
        # Values across 2^32 through the engine's own release, folded: the word must follow.
        a, b = d.alloc(4096, Memory.PINNED), d.alloc(4096)
        d.copy(b, a, engine="copy").wait()  # the copy channel last: no acquire follows
        t.next = max(t.next, (1 << 32) - 2)
        go = manual(d, b, a, 4096, True)
        seen = []
        for _ in range(4):
            go()
            seen.append(int(t.word[0]))
        print("across 2^32:", [hex(v) for v in seen], "next", hex(t.next))
    finally:
        t._release = shipped
        d.stop()
    print(f"\n{'variant':<32} {'median us (rounds)':>30}")
    for key, v in rows.items():
        print(f"{key:<32} {min(v):8.2f} {' '.join(f'{x:.2f}' for x in v):>21}")


if __name__ == "__main__":
    main()
