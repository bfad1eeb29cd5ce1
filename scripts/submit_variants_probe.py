"""Probe (issue 23, rows 1, 3 and 5): what each part of a submission costs on the GPU. Each
configuration is a fresh open; it prints a line per configuration and a table last.

- ``latency``: launch+wait of a one-thread vadd, median of 3,000 after 300, on the device's
  timeline as it opens and after a queue (both QMD releases since 2026-12-04; before, as
  opened meant the channel's release), and as opened with the channel's release
  (RELEASE_BY_QMD off), twice each, interleaved.
- ``d2d``: a 256 MiB copy inside the GPU and its wait, median of 30, as opened and after a
  queue.
- ``order``: saxpys in flight on a queue, per way a launch waits for the one before.
- ``parts``: launch+wait of a one-thread vadd and of a 256 MiB copy inside the GPU, each
  cut in four on the host's clock through a profile: the call, from its return to the GPU's
  start stamp, the GPU's span, and from the end stamp to the wait's return (medians of 30).
- ``cuts``: the same without a profile: the call and launch to wait's return, for a vadd, a
  copy, and copy16 launched as a caller's kernel (``Device.launch``), medians of 200; with
  ``parts``' GPU spans they say what the call and the wait cost the copy.
- ``steps``: a one-launch step submitted 10,000 times in one ``submit(times=)``, per step,
  with parts of its commands left out or put back: its marker (``marked`` false: the
  reduction waits for idle), the marker acquire's switch of channel group (``switch`` true,
  as before 2026-12-02), or its runs (``runs`` false: an entry a repetition).
- ``carry``: whether a QMD's release that adds (a run's copies') carries into the high word.
- ``word``: a host read of the timeline word while the GPU writes it and while idle.
- ``ring``: the channels' rings and USERD in BAR 1 or in pinned host memory: launch+wait,
  a step submitted 10,000 times one ``submit()`` each (with each fence of ``FENCES``; no
  fence is sound in host memory only), and a step's entry each repetition.
- ``pcas``: a step's entry each repetition, its QMD sent with other PCAS actions;
  ``pcas_all``: latency, steps, order and d2d with every QMD sent with action 3 or 9.
  (Before a5afa91 a step began with an invalidate of the SMs' caches; a variant left it out.)

Run on the GPU machine:
python3 scripts/submit_variants_probe.py [latency] [d2d] [parts] [cuts] [order] [steps] [ring]
[carry] [pcas] [pcas_all]."""

from __future__ import annotations

import ctypes
import functools
import statistics
import struct
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dependence_probe  # the saxpys' inputs (scripts/, the script's own folder)
import numpy as np

import rig_nv.channel
import rig_nv.push
import rig_nv.qmd
import rig_nv.setup
import rig_nv.step
import rig_nv.timeline
import rig_nv_nvidia
from rig_edge import Memory
from rig_nv.copies import COPY16_CHUNK, COPY16_THREADS
from rig_nv.hostmem import view

CUBIN = Path(__file__).resolve().parents[1] / "packages/rig-nv/tests/cubins/kernels.sm_90.cubin"
FLIGHT = 10_000
ROWS: list[tuple[str, str, float, str]] = []


@contextmanager
def patched(wfi: bool = True, switch: bool = False, marked: bool = True,
            runs: bool = True, pcas: int = rig_nv.push.PCAS_ACTION) -> Any:
    """Steps sealed inside leave out the reduction's wait for idle, switch channel group on
    the marker's acquire (as before 2026-12-02), have no marker (``marked`` false: the
    reduction waits for idle), send their QMD with another PCAS action (``pcas``, clcbc0.h
    SEND_SIGNALING_PCAS2_B) or, without ``runs``, go as an entry a repetition."""
    seal = rig_nv.step.Step._seal
    acquire = rig_nv.push.Push.semaphore_acquire
    most = rig_nv.step.RUN_MOST

    def switching(self: Any, address: int, value: int, **_: bool) -> Any:
        return acquire(self, address, value, switch=True)

    def sealed(self: Any) -> None:
        flag, qmd_release = rig_nv.step.SEM_RELEASE_WFI, rig_nv.step.qmd_release
        action = rig_nv.push.PCAS_ACTION
        rig_nv.push.PCAS_ACTION = pcas
        if not marked:
            rig_nv.step.qmd_release = lambda d: None
        if not wfi:
            rig_nv.step.SEM_RELEASE_WFI = 0
        if switch:
            rig_nv.push.Push.semaphore_acquire = switching  # type: ignore[method-assign]
        try:
            seal(self)
        finally:
            rig_nv.step.SEM_RELEASE_WFI, rig_nv.step.qmd_release = flag, qmd_release
            rig_nv.push.Push.semaphore_acquire = acquire  # type: ignore[method-assign]
            rig_nv.push.PCAS_ACTION = action

    rig_nv.step.Step._seal = sealed  # type: ignore[method-assign]
    if not runs:
        rig_nv.step.RUN_MOST = 1
    try:
        yield
    finally:
        rig_nv.step.Step._seal = seal  # type: ignore[method-assign]
        rig_nv.step.RUN_MOST = most


def opened(queue: bool) -> tuple[Any, Any]:
    """(device, where to submit): the device, after a queue when ``queue``."""
    d = rig_nv_nvidia.gpu(0).open()
    if not queue:
        return d, d
    q = d.queue()
    return d, q


def vadd_inputs(d: Any) -> tuple[Any, Any, Any, Any, Any, Any]:
    """(vadd, ra, rb, rc, a, b): one-element float32 inputs a and b uploaded to ra and rb."""
    fn = d.load(CUBIN.read_bytes())["vadd"]
    rng = np.random.default_rng()
    a, b = rng.random(1, dtype=np.float32), rng.random(1, dtype=np.float32)
    ra, rb, rc = (d.alloc(4096) for _ in range(3))
    d.upload(ra, a.tobytes())
    d.upload(rb, b.tobytes()).wait()
    return fn, ra, rb, rc, a, b


def copy_pair(d: Any, n: int = 256 << 20) -> tuple[Any, Any, Any]:
    """(src, dst, data): ``n`` fresh random bytes uploaded to src, and dst to copy them to."""
    src, dst = d.alloc(n), d.alloc(n)
    data = np.random.default_rng().integers(0, 256, n, dtype=np.uint8)
    d.upload(src, data).wait()
    return src, dst, data


def copied(d: Any, dst: Any, data: Any) -> bool:
    """Whether ``dst`` holds ``data``, byte for byte."""
    return bool(np.array_equal(np.frombuffer(bytes(d.download(dst)), np.uint8), data))


def latency(queue_first: bool) -> None:
    d, _ = opened(queue_first)
    try:
        fn, ra, rb, rc, a, b = vadd_inputs(d)
        for _ in range(300):
            d.launch(fn, (1,), (1,), (ra, rb, rc, 1)).wait()
        s = []
        clock = time.perf_counter
        for _ in range(3000):
            t = clock()
            d.launch(fn, (1,), (1,), (ra, rb, rc, 1)).wait()
            s.append(clock() - t)
        got = np.frombuffer(bytes(d.download(rc, 4)), dtype=np.float32)[0]
        ok = got == np.float32(a[0] + b[0])
        s.sort()
        note = f"p99 {s[len(s) * 99 // 100] * 1e6:.2f} us, correct {ok}"
        ROWS.append(("latency", "after a queue" if queue_first else "as opened",
                     statistics.median(s) * 1e6, note))
    finally:
        d.stop()


def d2d(queue_first: bool) -> None:
    d, _ = opened(queue_first)
    try:
        src, dst, data = copy_pair(d)
        n = src.length
        for _ in range(3):
            d.copy(dst, src).wait()
        s = []
        for _ in range(30):
            t = time.perf_counter()
            d.copy(dst, src).wait()
            s.append(time.perf_counter() - t)
        with d.profile(capacity=64) as prof:
            for _ in range(10):
                d.copy(dst, src).wait()
        gpu = statistics.median(e.duration_ns for e in prof.events()) / 1e3
        ok = copied(d, dst, data)
        us = statistics.median(s) * 1e6
        ROWS.append(("d2d", "after a queue" if queue_first else "as opened", us,
                     f"{n / us / 1e3:.0f} GB/s, kernel {gpu:.1f} us on the GPU's clock, "
                     f"correct {ok}"))
    finally:
        d.stop()


def parts(what: str, queue_first: bool) -> None:
    d, on = opened(queue_first)
    try:
        if what == "d2d":
            src, dst, data = copy_pair(d)

            def go() -> Any:
                return on.copy(dst, src)
        else:
            fn, ra, rb, rc, a, b = vadd_inputs(d)

            def go() -> Any:
                return on.launch(fn, (1,), (1,), (ra, rb, rc, 1))
        for _ in range(5):
            go().wait()
        hosts = []
        clock = time.monotonic_ns
        with on.profile(capacity=64) as prof:
            for _ in range(30):
                t0 = clock()
                p = go()
                t1 = clock()
                p.wait()
                hosts.append((t0, t1, clock()))
        events = prof.events()
        cuts: list[list[float]] = [[], [], [], [], []]
        for (t0, t1, t2), e in zip(hosts, events, strict=True):
            assert e.host_start_ns is not None and e.host_end_ns is not None
            for i, v in enumerate((t1 - t0, e.host_start_ns - t1, e.duration_ns,
                                   t2 - e.host_end_ns, t2 - t0)):
                cuts[i].append(v / 1e3)
        m = [statistics.median(c) for c in cuts]
        if what == "d2d":
            ok = copied(d, dst, data)
        else:
            got = np.frombuffer(bytes(d.download(rc, 4)), dtype=np.float32)[0]
            ok = bool(got == np.float32(a[0] + b[0]))
        ROWS.append(("parts", f"{what} {'on a queue' if queue_first else 'as opened'}", m[4],
                     f"call {m[0]:.2f}, to start {m[1]:.2f}, GPU {m[2]:.2f}, end to return "
                     f"{m[3]:.2f} us; correct {ok}"))
    finally:
        d.stop()


def cuts() -> None:
    d, _ = opened(False)
    try:
        src, dst, data = copy_pair(d)
        n = src.length
        fn = d.load(CUBIN.read_bytes())["vadd"]
        r = d.alloc(4096)
        img = d.loader.copy_kernels()
        chunk = COPY16_CHUNK * 16  # bytes a block of copy16, as Device.copy launches it
        ways: dict[str, Callable[[], Any]] = {
            "vadd": lambda: d.launch(fn, (1,), (1,), (r, r, r, 1)),
            "d2d copy": lambda: d.copy(dst, src),
            "d2d launch": lambda: d.launch(img["copy16"], (n // chunk,), (COPY16_THREADS,),
                                           (dst.gpu, src.gpu, n // 16)),
            "d2d x2 (two back to back)": lambda: (d.copy(dst, src), d.copy(dst, src))[1],
        }
        clock = time.perf_counter_ns
        for name, go in ways.items():
            for _ in range(5):
                go().wait()
            calls, walls = [], []
            for _ in range(200):
                t0 = clock()
                p = go()
                t1 = clock()
                p.wait()
                t2 = clock()
                calls.append(t1 - t0)
                walls.append(t2 - t0)
            m = [statistics.median(x) / 1e3 for x in (calls, walls)]
            ROWS.append(("cuts", name, m[1], f"call {m[0]:.2f} us"))
            print(ROWS[-1], flush=True)
        ROWS.append(("cuts", "d2d correct", float(copied(d, dst, data)), ""))
    finally:
        d.stop()


def steps(name: str, where: str, launches: int = 1, **patch: Any) -> None:
    """``where``: "device", "device after a queue" (its launches release by their QMD, its
    steps are marked), "queue", "queue, its uploads" (the step's inputs uploaded through the
    queue, as bench row 3_flight_queue does)."""
    d, q = opened(where != "device")
    on = q if where.startswith("queue") else d
    try:
        fn = d.load(CUBIN.read_bytes())["vadd"]
        rc, rb = d.alloc(4096), d.alloc(4096)
        rng = np.random.default_rng()
        # Multiples of 2^-10 below 2^13: every partial sum is exact in float32.
        c0 = (rng.integers(0, 1024, 1) / 1024).astype(np.float32)
        b0 = (rng.integers(1, 8, 1) / 1024).astype(np.float32)
        up = q if where == "queue, its uploads" else d  # the bench's row 3 on a queue
        up.upload(rc, c0.tobytes())
        up.upload(rb, b0.tobytes()).wait()
        with patched(**patch):
            st = on.step()
            for _ in range(launches):
                st.launch(fn, (1,), (1,), (rc, rb, rc, 1))
            st.submit().wait()
            st.lay_runs()
        times = FLIGHT // launches
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            st.submit(times=times).wait()
            best = min(best, time.perf_counter() - t)
        got = np.frombuffer(bytes(on.download(rc, 4)), dtype=np.float32)[0]
        want = c0[0] + b0[0] * launches * (1 + 3 * times)
        ROWS.append(("steps", f"{where}: {name}", best / times * 1e6,
                     f"{launches} launch(es)/step, correct {bool(got == want)}"))
    finally:
        d.stop()


def spin_fence() -> None:
    """The fence rig shipped before 2026-12-04: pthread_spin_trylock of a lock held for good,
    one locked exchange through ctypes.PyDLL (which keeps the GIL)."""
    _spin_trylock(_spin_address)


_spin = ctypes.c_int(0)
_libc = ctypes.PyDLL(None)
_libc.pthread_spin_init(ctypes.byref(_spin), 0)
_libc.pthread_spin_lock(ctypes.byref(_spin))
_spin_trylock = _libc.pthread_spin_trylock
_spin_trylock.argtypes, _spin_trylock.restype = [ctypes.c_void_p], ctypes.c_int
_spin_address = ctypes.addressof(_spin)
FENCES: dict[str, Callable[[], None] | None] = {"shipped": None, "spin": spin_fence,
                                                "none": lambda: None}


def one_at_a_time(fence_kind: str = "shipped") -> None:
    """Bench row 3 on the device: a one-vadd step submitted 10,000 times, one ``submit()``
    each, then one wait, per step (best of 3). ``fence_kind`` (:data:`FENCES`): "none", no
    fence before each doorbell (rig_nv.channel.fence), is sound only where the ring and
    USERD are write-back host memory (setup.CHANNEL_KIND PINNED): x86 keeps those stores
    before the uncached one; "spin", :func:`spin_fence`."""
    d = rig_nv_nvidia.gpu(0).open()
    try:
        fn = d.load(CUBIN.read_bytes())["vadd"]
        rc, rb = d.alloc(4096), d.alloc(4096)
        rng = np.random.default_rng()
        c0 = (rng.integers(0, 1024, 1) / 1024).astype(np.float32)  # sums exact, as steps'
        b0 = (rng.integers(1, 8, 1) / 1024).astype(np.float32)
        d.upload(rc, c0.tobytes())
        d.upload(rb, b0.tobytes()).wait()
        st = d.step()
        st.launch(fn, (1,), (1,), (rc, rb, rc, 1))
        st.submit().wait()
        submit, fence = st.submit, rig_nv.channel.fence
        best = float("inf")
        for _ in range(3):
            rig_nv.channel.fence = FENCES[fence_kind] or fence
            try:
                t = time.perf_counter()
                for _ in range(FLIGHT):
                    p = submit()
                t1 = time.perf_counter()
            finally:
                rig_nv.channel.fence = fence
            p.wait()
            best = min(best, time.perf_counter() - t)
        got = np.frombuffer(bytes(d.download(rc, 4)), dtype=np.float32)[0]
        want = c0[0] + b0[0] * (1 + 3 * FLIGHT)
        ROWS.append(("one", f"one submit a step, fence {fence_kind}",
                     best / FLIGHT * 1e6, f"last round's submits {(t1 - t) / FLIGHT * 1e6:.2f}"
                     f" us, correct {bool(got == want)}"))
    finally:
        d.stop()


def vadd_step(d: Any, n: int) -> Any:
    """A step of one one-thread vadd of ``n`` elements on a region of its own, its runs laid
    by a first submission of two, waited for."""
    fn = d.load(CUBIN.read_bytes())["vadd"]
    rc = d.alloc(4096)
    st = d.step()
    st.launch(fn, (1,), (1,), (rc, rc, rc, n))
    st.submit(times=2).wait()
    return st


def word_reads(reads: int = 20_000) -> None:
    """What the host's read of the timeline word costs while the GPU writes it (a run of
    one-vadd steps adds one about every 1.1 us) and while it is idle: ``reads`` reads in a
    loop, us each, the GPU still busy at the loop's end for the first."""
    d = rig_nv_nvidia.gpu(0).open()
    try:
        st = vadd_step(d, 0)
        word = d.timeline.word
        for busy in (True, False):
            p = st.submit(times=100_000) if busy else None
            t = time.perf_counter()
            for _ in range(reads):
                word[0]
            us = (time.perf_counter() - t) / reads * 1e6
            still = p is not None and not p.signaled
            if p is not None:
                p.wait()
            ROWS.append(("word", f"a read, the GPU {'writing' if busy else 'idle'}", us,
                         f"still running at the end: {still}"))
    finally:
        d.stop()


def in_host_memory(run: Callable[[], None]) -> Callable[[], None]:
    """``run`` with the channels' rings and USERD in pinned host memory (write-back)."""
    return with_set(rig_nv.setup, "CHANNEL_KIND", Memory.PINNED, "rings in host memory", run)


def carry() -> None:
    """Whether a QMD's release that adds (a run's copies', clcbc0qmd.h RELEASE_REDUCTION_*
    with PAYLOAD64B) adds all 64 bits: the last copy of a one-launch step's runs is pointed
    at a word holding 2^32 - 1, a run of two sent; 2^32 there means 64 bits, 0 means 32.
    The timeline then lacks that copy's one, which the host adds back before the stop."""
    d = rig_nv_nvidia.gpu(0).open()
    try:
        st = vadd_step(d, 1)
        word = d.alloc(4096, Memory.MAPPED)
        w = view(word.host, 8).cast("Q")
        w[0] = 0xFFFF_FFFF
        release = rig_nv.qmd.LAYOUTS[d.classes.qmd_version].release
        assert release is not None and st.run_memory is not None
        at = (len(st.runs) - 2) * 512 + release.address_at  # the last copy: 512 bytes each
        struct.pack_into("<Q", view(st.run_memory.host, st.run_memory.length), at, word.gpu)
        p = st.submit(times=2)
        d.timeline.point(p.value - 1).wait(timeout_s=10)
        time.sleep(0.01)
        got = int(w[0])
        d.timeline.word[0] += 1
        p.wait(timeout_s=10)
        kind = {1 << 32: "64 bits", 0: "32 bits"}.get(got, "neither")
        ROWS.append(("carry", "a QMD's add at 2^32 - 1", float(got), f"0x{got:x}: {kind}"))
    finally:
        d.stop()


def order(kind: str, launches: int = 2000) -> None:
    """Saxpys of 1M floats (a few us each: the GPU, not the host, sets the pace) launched one
    after another on a queue whose launches wait for the one before as ``kind`` says."""
    before, rig_nv.setup.ORDER = rig_nv.setup.ORDER, kind
    try:
        d, q = opened(True)
    finally:
        rig_nv.setup.ORDER = before
    try:
        fn, grid, _, args, x, y, ry = dependence_probe.work(d, q, 1 << 20)  # one saxpy
        for _ in range(99):
            q.launch(fn, grid, (256,), args)
        q.synchronize()
        with q.profile(capacity=64) as prof:
            for _ in range(20):
                q.launch(fn, grid, (256,), args).wait()
        kernel = statistics.median(e.duration_ns for e in prof.events()) / 1e3
        t0 = time.perf_counter()
        for _ in range(launches):
            p = q.launch(fn, grid, (256,), args)
        t1 = time.perf_counter()
        p.wait(timeout_s=60)
        t2 = time.perf_counter()
        got = np.frombuffer(bytes(q.download(ry)), np.float32)
        ok = bool(np.array_equal(got, y + np.float32(120 + launches) * x))
        ROWS.append(("order", f"queue: {kind}", (t2 - t0) / launches * 1e6,
                     f"submit {(t1 - t0) / launches * 1e6:.2f} us, kernel {kernel:.2f} us "
                     f"alone, correct {ok}"))
    finally:
        d.stop()


def with_set(owner: Any, attr: str, value: Any, label: str,
             run: Callable[[], None]) -> Callable[[], None]:
    """``run`` with ``owner.attr`` set to ``value`` (read by the device opened inside), its
    row's name followed by ``label``."""
    def patched_run() -> None:
        before = getattr(owner, attr)
        setattr(owner, attr, value)
        try:
            run()
        finally:
            setattr(owner, attr, before)
            what, name, us, note = ROWS[-1]
            ROWS[-1] = (what, f"{name}, {label}", us, note)
    return patched_run


def by_channel(run: Callable[[], None]) -> Callable[[], None]:
    """``run`` with launches released by the channel after a wait for idle."""
    return with_set(rig_nv.setup, "RELEASE_BY_QMD", False, "channel's release", run)


def everywhere(action: int, run: Callable[[], None]) -> Callable[[], None]:
    """``run`` with every QMD sent with PCAS action ``action``."""
    return with_set(rig_nv.push, "PCAS_ACTION", action, f"PCAS {action}", run)


GROUPS: dict[str, list[Callable[[], None]]] = {
    "latency": [
        run for _ in range(2) for run in (
            functools.partial(latency, False), functools.partial(latency, True),
            by_channel(functools.partial(latency, False)))
    ],
    "d2d": [lambda: d2d(False), lambda: d2d(True)],
    "parts": [lambda: parts("vadd", False), lambda: parts("vadd", True),
              lambda: parts("d2d", False), lambda: parts("d2d", True)],
    "cuts": [cuts],
    "order": [lambda: order("acquire"), lambda: order("acquire-stay"), lambda: order("wfi")],
    "steps": [
        lambda: steps("shipped", "device"),
        lambda: steps("unmarked", "device", marked=False),
        lambda: steps("shipped, 2 launches", "device", 2),
        lambda: steps("shipped", "device after a queue"),
        lambda: steps("shipped", "queue"),
        lambda: steps("shipped", "queue, its uploads"),
        lambda: steps("unmarked", "queue", marked=False),
        lambda: steps("switch (as before)", "queue", switch=True),
        lambda: steps("shipped, 2 launches", "queue", 2),
        lambda: steps("an entry each", "device", runs=False),
        lambda: steps("an entry each", "queue", runs=False),
        lambda: steps("an entry each, 2 launches", "queue", 2, runs=False),
    ],
    # The PCAS action a step's entry sends its QMD with (clcbc0.h): SCHEDULE (2) without the
    # invalidate and copy, PREFETCH_SCHEDULE (9), INVALIDATE_PREFETCH_COPY_SCHEDULE (10).
    "pcas": [
        functools.partial(steps, name, where, runs=False, pcas=action)
        for _ in range(3) for where in ("device", "queue")
        for action, name in ((3, "an entry each"), (2, "an entry each, PCAS 2"),
                             (9, "an entry each, PCAS 9"), (10, "an entry each, PCAS 10"))
    ],
    # Every QMD sent with action 3 (as NVK, rig before 2026-12-04) or 9 (PREFETCH_SCHEDULE,
    # as tinygrad, rig since).
    "pcas_all": [
        everywhere(action, run) for _ in range(2) for action in (3, 9)
        for run in (functools.partial(latency, False), functools.partial(latency, True),
                    functools.partial(steps, "shipped", "device"),
                    functools.partial(steps, "shipped", "queue"),
                    functools.partial(order, "acquire-stay"),
                    functools.partial(d2d, False))
    ],
    "carry": [carry],
    "word": [word_reads, word_reads, word_reads],
    # Where the rings and USERD lie: BAR 1 (write-combined, fenced) or host memory.
    "ring": [
        run for _ in range(3) for run in (
            functools.partial(latency, False), in_host_memory(functools.partial(latency, False)),
            one_at_a_time, functools.partial(one_at_a_time, "spin"),
            functools.partial(one_at_a_time, "none"), in_host_memory(one_at_a_time),
            in_host_memory(functools.partial(one_at_a_time, "none")),
            functools.partial(steps, "an entry each", "device", runs=False),
            in_host_memory(functools.partial(steps, "an entry each", "device", runs=False)))
    ],
}

if __name__ == "__main__":
    for run in [r for g in sys.argv[1:] or GROUPS for r in GROUPS[g]]:
        try:
            run()
        except Exception as e:  # one configuration's failure is a line, not the end
            ROWS.append(("error", repr(e)[:80], float("nan"), ""))
        print(ROWS[-1], flush=True)
    print(f"\n{'what':8} {'configuration':34} {'us':>8}  note", file=sys.stdout)
    for what, name, us, note in ROWS:
        print(f"{what:8} {name:34} {us:8.2f}  {note}")
