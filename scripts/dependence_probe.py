"""Probe (issue 23; docs/queues.md): whether a queue's grids can wait for the grid before them
as libcuda's do, by a dependence counter, with no host method between them. An experiment.

libcuda's launches (docs/results/cuda-launches-2026-12-01-v2.jsonl) lie in its pushbuffer:
inline QMDs (clcbc0.h SET_INLINE_QMD_ADDRESS_A/B, LOAD_INLINE_QMD_DATA), each naming the slot
2 KiB on as DEPENDENT_QMD0 with ACTION 4, QMD_DECREMENT_DEPENDENCE (clcbc0qmd.h), counter 0.
Here each launch takes a slot of a ring of QMDs in video memory, written by the host and sent
by PCAS ("ring") or written by the channel ("inline"); each QMD adds one to the queue's
timeline word as it ends (RELEASE0 RED_ADD), so the host sees each grid done in turn. A run of
2,000 saxpys in flight is right only if each grid waited for the one before. Against rig's
shipped queue launches (an acquire of the value before). Each variant runs in a process of its
own with a timeout: a grid that never starts is a line "hung".
(2026-12-03 14:00: host-written slots with the next slot's counter set to 1 hung at once.)

    python3 scripts/dependence_probe.py            # every variant, a table last
"""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CUBIN = ROOT / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
RING = 64  # QMD slots
SLOT = 2048  # bytes a slot: the QMD's 512-byte place, then its bank (libcuda's stride)
ACTION_DECREMENT = 4  # DEPENDENT_QMD0_ACTION_QMD_DECREMENT_DEPENDENCE (clcbc0qmd.h)
RED_ADD_ENABLE = 1 << 4  # RELEASE0_REDUCTION_ENABLE (V04 bit 324), OP RED_ADD (0), UNSIGNED
# clcbc0.h: SET_INLINE_QMD_ADDRESS_A (upper bits 8:0, INLINE_SIZE_384 at 30), then _B;
# LOAD_INLINE_QMD_DATA(0).
SET_INLINE_QMD_ADDRESS_A, LOAD_INLINE_QMD_DATA, INLINE_384 = 0x0318, 0x0320, 1 << 30


def work(d: Any, q: Any, n_floats: int) -> tuple[Any, ...]:
    """The kernel and inputs: a saxpy of ``n_floats`` (y += 1.0 x), or for 1 a one-thread vadd
    (y += x), fresh small whole numbers; launched once on ``q`` and waited for, which makes
    its configuration's QMD and bank. (fn, grid, block, args, x, y, y's region)."""
    img = d.load(CUBIN.read_bytes())
    rng = np.random.default_rng()
    x = rng.integers(0, 8, n_floats).astype(np.float32)
    y = rng.integers(0, 8, n_floats).astype(np.float32)
    rx, ry = d.alloc(4 * n_floats), d.alloc(4 * n_floats)
    d.upload(rx, x)
    d.upload(ry, y).wait()
    if n_floats == 1:  # c = a + b with c = a
        fn, grid, block, args = img["vadd"], (1,), (1,), (ry, rx, ry, 1)
    else:
        fn, grid, block = img["saxpy"], (-(-n_floats // 256),), (256,)
        args = (1.0, rx, ry, n_floats)
    q.launch(fn, grid, block, args).wait()
    return fn, grid, block, args, x, y, ry


def chained(mode: str, n_floats: int, launches: int, wait_each: bool, counter: int = 0,
            action: int = ACTION_DECREMENT, pcas: int = 3, prefetch: int = 0,
            first: int = 0, latch: bool = False) -> str:
    """``mode``: "ring" the host writes each QMD into its slot and sends it by PCAS; "inline"
    the channel writes it there (SET_INLINE_QMD_ADDRESS, LOAD_INLINE_QMD_DATA: libcuda's
    way, clcbc0.h). ``action`` 0: no dependent; else DEPENDENT_QMD0's action on the next
    slot, with ``prefetch``. ``counter``: each QMD's DEPENDENCE_COUNTER but the first's
    (ring: set by the host in the next slot before a launch is sent). ``first``: a PCAS
    action sent for the next slot before each launch (INCREMENT_DEPENDENCE 0xC: the next
    grid then waits for this one's decrement, if the counter lives in the scheduler).
    ``latch`` (inline only, no dependent): each grid arrives at latch 0x38 + slot % 8 and
    waits on the one before's, as libcuda's programmatic dependent launch does (its QMDs in
    docs/hopper-launch.md). ``n_floats`` 1: a one-thread vadd (y += x) instead of a saxpy."""
    import rig_nv_nvidia
    from rig_edge import Memory
    from rig_nv import launch as launching
    from rig_nv import qmd
    from rig_nv.channel import entry_at
    from rig_nv.hostmem import view
    from rig_nv.push import SUBC_COMPUTE, header

    d = rig_nv_nvidia.gpu(0).open()
    try:
        q = d.queue()
        t = q.timeline
        fn, grid, block, args, x, y, ry = work(d, q, n_floats)
        prep = fn.prepared[(grid, block, 0, d.loader.slm)]
        layout = qmd.LAYOUTS[d.classes.qmd_version]
        release = layout.release
        assert release is not None
        st, values = launching.arg_values(fn, args)
        ring = d.alloc(RING * SLOT, Memory.MAPPED)
        pcas_words = d.alloc(RING * 16, Memory.MAPPED)
        assert ring and pcas_words and ring.host and pcas_words.host
        host = view(ring.host, ring.length)
        words = view(pcas_words.host, pcas_words.length).cast("I")
        entries, inline = [], []
        for s in range(RING):
            at, gpu = s * SLOT, ring.gpu + s * SLOT
            slot = bytearray(prep.blob)
            launching.point_cbuf0(prep, memoryview(slot), 0, gpu)
            st.pack_into(slot, 512 + fn.kernel.param_offset, *values)
            body = qmd.Qmd(layout, bytes(slot[: layout.size]))
            nxt_gpu = ring.gpu + (s + 1) % RING * SLOT
            if action:
                body.set("DEPENDENT_QMD0_POINTER", nxt_gpu >> 8)
                body.set("DEPENDENT_QMD0_ACTION", action)
                body.set("DEPENDENT_QMD0_ENABLE", 1)
                body.set("DEPENDENT_QMD0_PREFETCH", prefetch)
            body.set("DEPENDENCE_COUNTER", counter if s else 0)
            if latch:
                body.set("ARRIVE_AT_LATCH_VALID", 1)
                body.set("ARRIVE_AT_LATCH_ID", 0x38 + s % 8)
                body.set("WAIT_ON_LATCH_VALID", 1)
                body.set("WAIT_ON_LATCH_ID", 0x38 + (s - 1) % 8)
                body.set("REQUIRE_SCHEDULING_PCAS", 1)
                body.set("ENABLE_PROGRAM_PRE_EXIT", 1)
                # LATCH_ACQUIRE_INVALIDATE_SHADER_DATA_CACHE, _TEXTURE_DATA_CACHE (clcbc0qmd.h)
                body.value |= 1 << 1406 | 1 << 1407
            slot[: layout.size] = body.data
            struct.pack_into("<HH", slot, release.control_at,
                             release.control | RED_ADD_ENABLE, 0)
            struct.pack_into("<QQ", slot, release.address_at, t.gpu, 1)
            host[at : at + len(slot)] = slot
            if mode == "ring" and s:
                host[at : at + 2] = b"\0\0"
            words[4 * s : 4 * s + 4] = array("I", send_pcas(gpu, pcas))
            entries.append(entry_at(pcas_words.gpu + 16 * s, 4))
            qmd_words = struct.unpack(f"<{layout.size // 4}I", bytes(slot[: layout.size]))
            lead = send_pcas(nxt_gpu, first) if first else ()
            inline.append(array("I", (*lead,
                header(SUBC_COMPUTE, SET_INLINE_QMD_ADDRESS_A, 2),
                INLINE_384 | (gpu >> 40), (gpu >> 8) & 0xFFFFFFFF,
                header(SUBC_COMPUTE, LOAD_INLINE_QMD_DATA, len(qmd_words)), *qmd_words)))
        count = struct.pack("<H", counter)
        if latch:  # the first launch waits on no latch: WAIT_ON_LATCH_VALID (bit 29) off
            first_words = array("I", inline[0])
            first_words[len(first_words) - layout.size // 4] &= ~(1 << 29)

        def send(i: int) -> int:
            """Launch i (slot i % RING); returns its value."""
            s = i % RING
            with t.lock:
                value = t.next
                wait(t, value + 1 - RING, f"at launch {i}")  # the next slot's last grid
                if mode == "ring":
                    if counter:
                        nxt = (s + 1) % RING * SLOT
                        host[nxt : nxt + 2] = count
                    t._send_entry(t.compute, entries[s])
                else:
                    t.next = value + 1
                    t.compute.submit(first_words if latch and not i else inline[s], value,
                                     int(t.word[0]))
                    t.last = t.compute
            return value

        try:
            return run(send, t, q, x, y, ry, launches, wait_each)
        except TimeoutError as e:
            return f"hung {e}"
    finally:
        d.stop()


def run(send: Any, t: Any, q: Any, x: Any, y: Any, ry: Any, launches: int,
        wait_each: bool) -> str:
    send(0)
    t0 = time.perf_counter()
    last = 0
    for i in range(1, launches + 1):
        last = send(i)
        if wait_each:
            wait(t, last, f"at launch {i}")
    t1 = time.perf_counter()
    wait(t, last, "after all were sent")
    t2 = time.perf_counter()
    got = np.frombuffer(bytes(q.download(ry)), np.float32)
    ok = bool(np.array_equal(got, y + np.float32(2 + launches) * x))
    return (f"{(t2 - t0) / launches * 1e6:.2f} us a launch (sending "
            f"{(t1 - t0) / launches * 1e6:.2f}), correct {ok}")


def send_pcas(address: int, action: int) -> tuple[int, ...]:
    """The words that send the QMD at ``address`` with PCAS ``action`` (clcbc0.h SEND_PCAS_A,
    SEND_SIGNALING_PCAS2_B)."""
    from rig_nv.push import (
        COMPUTE_SEND_PCAS_A,
        COMPUTE_SEND_SIGNALING_PCAS2_B,
        SUBC_COMPUTE,
        header,
    )

    return (header(SUBC_COMPUTE, COMPUTE_SEND_PCAS_A, 1), address >> 8,
            header(SUBC_COMPUTE, COMPUTE_SEND_SIGNALING_PCAS2_B, 1), action)


def wait(t: Any, value: int, where: str) -> None:
    """The timeline's own wait for ``value``, 3 s at most; TimeoutError saying ``where`` the
    word stopped and what the device's health says."""
    try:
        t.wait_value(value, timeout_s=3)
    except TimeoutError:
        raise TimeoutError(f"{where}: word {t.word[0]} < {value}; {health(t)}") from None


def health(t: Any) -> str:
    try:
        t.health.check()
    except Exception as e:  # the device's loss: what the GPU said
        return f"{type(e).__name__}: {str(e)[:160]}"
    return "no fault seen"


def shipped(n_floats: int, launches: int, wait_each: bool) -> str:
    import rig_nv_nvidia

    d = rig_nv_nvidia.gpu(0).open()
    try:
        q = d.queue()
        fn, grid, block, args, x, y, ry = work(d, q, n_floats)
        q.launch(fn, grid, block, args).wait()  # as chained's first, by the channel
        t0 = time.perf_counter()
        for _ in range(launches):
            p = q.launch(fn, grid, block, args)
            if wait_each:
                p.wait()
        t1 = time.perf_counter()
        p.wait(timeout_s=20)
        t2 = time.perf_counter()
        got = np.frombuffer(bytes(q.download(ry)), np.float32)
        ok = bool(np.array_equal(got, y + np.float32(2 + launches) * x))
        return (f"{(t2 - t0) / launches * 1e6:.2f} us a launch (sending "
                f"{(t1 - t0) / launches * 1e6:.2f}), correct {ok}")
    finally:
        d.stop()


# (name, call): saxpys of 1M floats (~4.5 us alone) or 64K; each hypothesis first with a wait
# after each launch (a hang shows in 3 s), then, where that was right, 2,000 in flight; a
# hypothesis named "in flight" goes straight to 2,000 in flight.
VARIANTS: dict[str, str] = {
    "shipped 1M": "shipped(1 << 20, 2000, False)",
    "shipped vadd": "shipped(1, 10000, False)",
    "inline, no dependent 1M": "chained('inline', 1 << 20, 2000, False, action=0)",
    "inline, no dependent, vadd": "chained('inline', 1, 10000, False, action=0)",
    "inline, latches": "chained('inline', 1 << 16, {n}, {w}, action=0, latch=True)",
    "in flight, inline, latches, vadd": "chained('inline', 1, 10000, False, action=0, latch=True)",
    "in flight, inline, latches, vadd again":
        "chained('inline', 1, 10000, False, action=0, latch=True)",
}

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print(eval(sys.argv[2]))
        sys.exit(0)
    rows: list[tuple[str, str]] = []
    start = time.perf_counter()
    def one(name: str, call: str) -> str:
        try:
            r = subprocess.run([sys.executable, __file__, "--one", call], capture_output=True,
                               text=True, timeout=25)
            out = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else \
                f"rc {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr else ''}"
        except subprocess.TimeoutExpired:
            out = "hung (timeout 25 s)"
        rows.append((name, out))
        print(name, "|", out, flush=True)
        return out

    for name, call in VARIANTS.items():
        if time.perf_counter() - start > 240:  # hangs cost 25 s each: leave the rest
            rows.append((name, "not run (240 s spent)"))
            continue
        if "{n}" not in call:
            one(name, call)
        elif "correct True" in one(f"{name}, wait each", call.format(n=100, w=True)):
            one(f"{name} 1M", call.format(n=2000, w=False).replace("1 << 16", "1 << 20"))
            one(f"{name} 1M again", call.format(n=2000, w=False).replace("1 << 16", "1 << 20"))
    print()
    for name, out in rows:
        print(f"{name:34} {out}")
