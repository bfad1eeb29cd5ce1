"""Queues on a real GPU (issue 17, "Queues"): order within a queue, ``after`` between queues on
the GPU, whether two queues' kernels run at the same time (measured and printed, not asserted),
a fault on a queue losing the device, and threads each on a queue of its own. Fresh random data
every time, compared with numpy. Kernels: rig-nv's tests/cubins/kernels.cu (vadd, saxpy,
reduce) and this package's cubins/faults.cu (spin, which runs until the host writes its flag:
it holds a queue's work back for as long as a test wants, with no race).
"""

from __future__ import annotations

import ctypes
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from test_gpu_faults import CUBIN, FAULTS, REOPEN, faulting_child

from rig_edge import Memory, Region
from rig_nv import Device, Queue
from rig_nv.launch import Function, Image
from rig_nv.queues import Submits
from rig_nv.step import Step
from rig_nv.timeline import Point

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()
BLOCK = 256


def kernels(device: Device) -> Image:
    return device.load(CUBIN.read_bytes())


def alloc(device: Device, n: int, kind: Memory = Memory.DEVICE) -> Region:
    r = device.alloc(n, kind)
    assert r is not None
    return r


def get(q: Submits, r: Region, count: int) -> np.ndarray:
    """``count`` floats of ``r``, read through ``q`` (which waits for its own work first)."""
    return np.frombuffer(bytes(q.download(r, 4 * count)), dtype=np.float32)


def whole(rows: int) -> np.ndarray:
    """Random whole numbers 0..7 as floats: sums of them stay exact in float32, so an answer
    that misses one launch's work is wrong by a whole number, never within rounding."""
    return rng.integers(0, 8, rows, dtype=np.int32).astype(np.float32)


def spin_kernel(device: Device) -> tuple[Function, Region, Callable[[], None]]:
    """faults.cu's spin (launch it as one warp with the flag: it runs until the flag, in
    pinned memory, is nonzero), its flag, cleared, and the call that ends it."""
    flag = alloc(device, 4096, Memory.PINNED)
    assert flag.host is not None
    word = ctypes.c_int.from_address(flag.host)
    word.value = 0

    def release() -> None:
        word.value = 1

    return device.load(FAULTS.read_bytes())["spin"], flag, release


@contextmanager
def spinning(device: Device, q: Queue) -> Iterator[tuple[Point, Callable[[], None]]]:
    """The spin on ``q``: its point and the call that ends it. The spin is ended on leaving,
    whatever happened, so a failed test cannot leave it to hang_ms."""
    spin, flag, release = spin_kernel(device)
    try:
        yield q.launch(spin, (1,), (32,), (flag,)), release
    finally:
        release()


def vadd_inputs(device: Device, q: Queue, n: int,
                outs: int) -> tuple[np.ndarray, np.ndarray, list[Region]]:
    """Fresh a and b of ``n`` floats, uploaded through ``q`` (done), and their regions
    followed by ``outs`` more for results."""
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    regions = [alloc(device, 4 * n) for _ in range(2 + outs)]
    q.upload(regions[0], a)
    q.upload(regions[1], b).wait()
    return a, b, regions


def saxpy_chain(q: Submits, img: Image, x: Region, y: Region, n: int,
                times: int) -> Point:
    """y += x, ``times`` times on ``q``, each launch reading what the one before wrote."""
    grid = ((n + BLOCK - 1) // BLOCK,)
    p = None
    for _ in range(times):
        p = q.launch(img["saxpy"], grid, (BLOCK,), (1.0, x, y, n))
    assert p is not None
    return p


def vadd(q: Submits, img: Image, a: Region, b: Region, c: Region, n: int) -> Point:
    """c = a + b on ``q``."""
    return q.launch(img["vadd"], ((n + BLOCK - 1) // BLOCK,), (BLOCK,), (a, b, c, n))


def two_queues(device: Device, n: int) -> tuple[tuple[Queue, Queue],
                                                tuple[np.ndarray, np.ndarray, np.ndarray],
                                                tuple[Region, Region, Region, Region]]:
    """Queues A and B; fresh x, y (in memory through A) and b (through B), and memory for
    B's output; every upload done."""
    qa, qb = device.queue(), device.queue()
    x, y, b = whole(n), whole(n), whole(n)
    rx, ry, rb, out = (alloc(device, 4 * n) for _ in range(4))
    qa.upload(rx, x)
    qa.upload(ry, y).wait()
    qb.upload(rb, b).wait()
    return (qa, qb), (x, y, b), (rx, ry, rb, out)


# ---- 1. work of one queue runs in order --------------------------------------------------


def test_each_queues_work_runs_in_its_order_and_two_queues_are_both_right(
        device: Device) -> None:
    """Issue 17: "work of one queue runs in order (its compute and copy work in queue order)";
    two queues at once, their submissions interleaved, with no wait until the end. On each:
    an upload (staged, the copy channel), 16 saxpys (compute), a copy on the copy engine, a
    vadd of that copy (compute), a copy to pinned memory (copy engine); each result numpy's.
    A stage run before the one before it ended gives a sum off by whole numbers."""
    img = kernels(device)
    n = (1 << 22) + 3  # 16 MiB and a partial block
    grid = ((n + BLOCK - 1) // BLOCK,)
    queues = [device.queue(), device.queue()]
    data = [(whole(n), whole(n)) for _ in queues]
    mem = [[alloc(device, 4 * n) for _ in range(4)] + [alloc(device, 4 * n, Memory.PINNED)]
           for _ in queues]
    for q, (x, y), (rx, ry, _, _, _) in zip(queues, data, mem, strict=True):
        q.upload(rx, x)
        q.upload(ry, y)
    points: list[list[Point]] = [[] for _ in queues]
    for _ in range(16):
        for i, q in enumerate(queues):
            rx, ry = mem[i][0], mem[i][1]
            points[i].append(q.launch(img["saxpy"], grid, (BLOCK,), (1.0, rx, ry, n)))
    for i, q in enumerate(queues):
        rx, ry, rz, rw, pinned = mem[i]
        points[i].append(q.copy(rz, ry, engine="copy"))
        points[i].append(vadd(q, img, rz, rx, rw, n))
        points[i].append(q.copy(pinned, rw, engine="copy"))
    for q, (x, y), m, ps in zip(queues, data, mem, points, strict=True):
        assert [p.value for p in ps] == sorted(p.value for p in ps)
        assert all(p.device is q for p in ps)
        y16 = y + 16 * x  # exact: whole numbers below 2**24
        np.testing.assert_array_equal(get(q, m[4], n), y16 + x)
        assert all(p.signaled for p in ps)
        np.testing.assert_array_equal(get(q, m[1], n), y16)


# ---- 2. after: ordering on the GPU, and none without it ----------------------------------


def test_after_holds_a_queue_on_the_gpu_until_the_other_queues_point(device: Device) -> None:
    """Issue 17: "q.after(*points): the queue's next submission waits, on the GPU, for those
    points of any queue ... (no host wait)". Queue A: a spin, then 8 saxpys into y. Queue B:
    after(A's last point), then a vadd reading y. Both submitted with no wait; B is not done
    while A spins (its acquire holds it on the GPU); once the spin ends, a wait for B alone
    gives A's y + fresh b, exactly."""
    img = kernels(device)
    n = 1 << 20
    (qa, qb), (x, y, b), (rx, ry, rb, out) = two_queues(device, n)
    with spinning(device, qa) as (spin, release):
        pa = saxpy_chain(qa, img, rx, ry, n, 8)
        qb.after(pa)
        pb = vadd(qb, img, ry, rb, out, n)
        time.sleep(0.2)
        held = (spin.signaled, pa.signaled, pb.signaled)
        release()
        pb.wait(timeout_s=30)
    assert held == (False, False, False), "B ran while the point it was after was pending"
    assert pa.signaled  # B's completion implies A's: the GPU ordered them
    np.testing.assert_array_equal(get(qb, out, n), y + 8 * x + b)


def test_after_orders_a_kernel_behind_a_long_kernel_of_another_queue(device: Device) -> None:
    """Issue 17, "q.after(*points)", with no host in the loop at all: queue A runs 64 saxpys
    of 64 Mi floats (y += x, some 15 ms); queue B, after A's last point, a vadd reading
    y. Submitted back to back, then a wait for B only: B sees all 64 of A's sums. (Without
    the acquire B would start while A's chain runs and read y some launches short.)"""
    img = kernels(device)
    n = 1 << 26
    (qa, qb), (x, y, b), (rx, ry, rb, out) = two_queues(device, n)
    t = time.perf_counter()
    pa = saxpy_chain(qa, img, rx, ry, n, 64)
    qb.after(pa)
    pb = vadd(qb, img, ry, rb, out, n)
    pb.wait(timeout_s=30)
    took = time.perf_counter() - t
    assert pa.signaled
    np.testing.assert_array_equal(get(qb, out, n), y + 64 * x + b)
    print(f"A's 64 saxpys of {n} floats and B's vadd after them: {took * 1e3:.1f} ms")


def test_without_after_a_queue_completes_while_another_queue_spins(device: Device) -> None:
    """Issue 17: "work of different queues runs concurrently unless ordered". Queue A spins
    (until the host ends it); queue B's vadd of fresh data, submitted after it with no
    ``after``, completes while A still spins, and is right. Then the spin ends and A's point
    completes. Were the queues one timeline (or B's channel never served while A's spin
    runs), B's wait would time out. The two compute channels share the device's channel
    group, each with a subcontext of its own (rig_nv.setup.QUEUE_GROUP), so the compute
    engine serves both at once; in two groups they would be time-sliced, and a spinning CTA
    does not yield (docs/queues.md: Xid 109 on the H200)."""
    img = kernels(device)
    qa, qb = device.queue(), device.queue()
    n = 1 << 20
    a, b, (ra, rb, out) = vadd_inputs(device, qb, n, 1)
    with spinning(device, qa) as (spin, release):
        t = time.perf_counter()
        pb = vadd(qb, img, ra, rb, out, n)
        pb.wait(timeout_s=10)
        took = time.perf_counter() - t
        assert not spin.signaled, "the spin ended by itself"
        release()
        spin.wait(timeout_s=30)
    np.testing.assert_array_equal(get(qb, out, n), a + b)
    print(f"B's vadd beside A's spin: done {took * 1e3:.2f} ms after its launch")


def test_profiles_keep_two_queues_side_by_side(device: Device) -> None:
    """Issue 17: a queue has every submission the device has, profiles too, and a profile
    must not change what it measures. Both queues profiled: B's vadd of fresh data completes
    while A's spin runs, and on the GPU's clock B's span ends inside A's. A wait for idle
    in a stamp would hold B until A's spin ended (the test would time out); A's end stamp is
    its QMD's second release (rig_nv.qmd.Release), and lands on the host's clock between the
    host ending the spin and seeing it done."""
    img = kernels(device)
    qa, qb = device.queue(), device.queue()
    n = 1 << 20
    a, b, (ra, rb, out) = vadd_inputs(device, qb, n, 1)
    with qa.profile() as pa, qb.profile() as pb, spinning(device, qa) as (spin, release):
        vadd(qb, img, ra, rb, out, n).wait(timeout_s=10)
        assert not spin.signaled, "the spin ended by itself"
        ended = time.monotonic_ns()
        release()
        spin.wait(timeout_s=30)
        seen = time.monotonic_ns()
    np.testing.assert_array_equal(get(qb, out, n), a + b)
    (ea,), (eb,) = pa.events(), pb.events()
    # What must hold whatever the channels' timing: each span has a length, and B's ends
    # before A's (the host ends A's spin only once it has seen B done).
    assert 0 < ea.start_ns < ea.end_ns and 0 < eb.start_ns < eb.end_ns <= ea.end_ns, (ea, eb)
    if ea.host_end_ns is not None:
        slack = 200_000  # the pairs' spread and drift: well under 0.2 ms (test_gpu_clock.py)
        assert ended - slack <= ea.host_end_ns <= seen + slack, (ended, ea.host_end_ns, seen)
    print(f"profiled: A's spin {ea.duration_ns / 1e6:.2f} ms; B's vadd {eb.duration_ns / 1e3:.1f}"
          f" us, from {(eb.start_ns - ea.start_ns) / 1e6:.2f} ms into it")
    pa.free()
    pb.free()


def test_a_queues_step_leaves_other_queues_running(device: Device) -> None:
    """Issue 17: a queue has every submission the device has, a step's too, and queues run
    concurrently unless ordered. Queue A's step: a vadd of fresh data, then the spin. B's vadd,
    submitted after it with no ``after``, completes while A's step still spins, and is
    right. (On the H200 it passed with the step's end waiting for idle too: it keeps the
    promise, and does not tell the two ends apart; docs/queues.md.) The spin ended, A's
    step completes and its vadd is right; submitted again, once and twice (the spin's flag
    still set), its points complete."""
    img = kernels(device)
    qa, qb = device.queue(), device.queue()
    n = 1 << 20
    a, b, (ra, rb, oa, ob) = vadd_inputs(device, qb, n, 2)
    spin, flag, release = spin_kernel(device)
    step = qa.step()
    step.launch(img["vadd"], ((n + BLOCK - 1) // BLOCK,), (BLOCK,), (ra, rb, oa, n))
    step.launch(spin, (1,), (32,), (flag,))
    try:
        pa = step.submit()
        vadd(qb, img, ra, rb, ob, n).wait(timeout_s=10)
        assert not pa.signaled, "the spin ended by itself"
    finally:
        release()
    pa.wait(timeout_s=30)
    np.testing.assert_array_equal(get(qb, ob, n), a + b)
    np.testing.assert_array_equal(get(qa, oa, n), a + b)
    once = step.submit()
    twice = step.submit(times=2)
    twice.wait(timeout_s=30)
    assert once.signaled and twice.value == once.value + 2


def saxpys(device: Device) -> tuple[Queue, Callable[[Submits | Step], object], np.ndarray,
                                     np.ndarray, Region]:
    """(queue, saxpy, x, y, y's region): a new queue, x and y 4 Mi whole numbers uploaded
    through it, and ``saxpy(on)`` that records or launches y += x on ``on`` (the queue or a
    step of it)."""
    img = kernels(device)
    q = device.queue()
    n = 1 << 22
    x, y = whole(n), whole(n)
    rx, ry = alloc(device, 4 * n), alloc(device, 4 * n)
    q.upload(rx, x)
    q.upload(ry, y)
    grid = ((n + BLOCK - 1) // BLOCK,)
    return q, lambda on: on.launch(img["saxpy"], grid, (BLOCK,), (1.0, rx, ry, n)), x, y, ry


def test_a_queues_step_repeated_in_flight_adds_every_repetition(device: Device) -> None:
    """A queue's step that ends with a launch waits for its last grid by an acquire, not a
    wait for idle (rig_nv.step): repetitions in flight back to back must still run one after
    another. 8 dependent saxpys (y += x over 4 Mi whole numbers), submitted 100 times, a
    saxpy launched alone, then 100 times more, with no wait until the end: y gains x 1,601
    times exactly. Repetitions that overlapped would race on y and lose some."""
    q, saxpy, x, y, ry = saxpys(device)
    step = q.step()
    for _ in range(8):
        saxpy(step)
    step.submit(times=100)
    saxpy(q)
    step.submit(times=100).wait(timeout_s=60)
    np.testing.assert_array_equal(get(q, ry, len(y)), y + 1601 * x)


def test_a_queues_steps_submitted_one_at_a_time_in_flight_add_every_one(device: Device) -> None:
    """A queue's marked step submitted while the one before runs goes as its own entry, and a
    launch behind it with no acquire: the entry before ends only once its grids are done
    (rig_nv.timeline.Timeline.settled). Two dependent saxpys (y += x over 4 Mi whole
    numbers) a step, submitted 200 times one at a time, a saxpy launched after every tenth
    (the step after it acquires the launch's value), no wait until the end: y gains x 420
    times exactly. Work that overlapped would race on y and lose some."""
    q, saxpy, x, y, ry = saxpys(device)
    step = q.step()
    for _ in range(2):
        saxpy(step)
    t = time.perf_counter()
    for i in range(200):
        step.submit()
        if i % 10 == 9:
            saxpy(q)
    q.synchronize()
    print(f"{(time.perf_counter() - t) / 220 * 1e6:.1f} us a submission, the GPU's pace")
    np.testing.assert_array_equal(get(q, ry, len(y)), y + 420 * x)


@pytest.mark.parametrize("on", ["device", "queue"])
def test_a_step_repeated_in_flight_waits_for_its_grid_without_leaving_the_group(
        device: Device, on: str) -> None:
    """Issue 23 (row 3): a marked step's end acquires its marker without SWITCH_TSG. With the
    switch, the failed acquire sent the group away and back: 8.2 us a step of one vadd in one
    submit(times=10_000) on the H200, against 1.7-2.0 without (2.4 behind a wait for idle;
    docs/results/submit-variants-2026-12-02.txt). Asserted under 4 us a step, best of three,
    and every repetition's c += b landed (whole numbers: sums exact in float32)."""
    img = kernels(device)
    where: Submits = device.queue() if on == "queue" else device
    c, b = whole(1), whole(1) + 1
    rc, rb = alloc(device, 4), alloc(device, 4)
    where.upload(rc, c)
    where.upload(rb, b)
    step = where.step()
    step.launch(img["vadd"], (1,), (1,), (rc, rb, rc, 1))
    step.submit().wait(timeout_s=30)
    times, best = 10_000, float("inf")
    for _ in range(3):
        t = time.perf_counter()
        step.submit(times=times).wait(timeout_s=60)
        best = min(best, time.perf_counter() - t)
    assert step.marked
    np.testing.assert_array_equal(get(where, rc, 1), c + (1 + 3 * times) * b)
    print(f"{on}: {best / times * 1e6:.2f} us a step")
    assert best / times < 4e-6, f"{best / times * 1e6:.2f} us a step (8.2 with SWITCH_TSG)"


@pytest.mark.parametrize("launches", [1, 3])
def test_a_step_repeated_as_runs_goes_at_the_chained_grids_pace(
        device: Device, launches: int) -> None:
    """Issue 23 (row 3): repetitions of a marked step of launches alone go as runs, copies of
    its QMDs chained into its own (rig_nv.step.Step.lay_runs), so the GPU goes from one
    repetition to the next as from one launch of a step to the next. One vadd (c += b) a
    launch, submit(times=) of 10,000 launches, odd counts so a run of the rest goes too:
    every launch landed in order (whole numbers, exact in float32), and a launch took under
    1.5 us, best of three (an entry a repetition: 1.8-1.9 us a step of one, 1.1 more a
    launch; docs/results/submit-variants-2026-12-03.txt)."""
    img = kernels(device)
    q = device.queue()
    c, b = whole(1), whole(1) + 1
    rc, rb = alloc(device, 4), alloc(device, 4)
    q.upload(rc, c)
    q.upload(rb, b)
    step = q.step()
    for _ in range(launches):
        step.launch(img["vadd"], (1,), (1,), (rc, rb, rc, 1))
    step.submit().wait(timeout_s=30)
    times, best, done = 10_001 // launches, float("inf"), 1
    for _ in range(3):
        t = time.perf_counter()
        step.submit(times=times).wait(timeout_s=60)
        best = min(best, time.perf_counter() - t)
        done += times
    assert len(step.runs) > 1
    np.testing.assert_array_equal(get(q, rc, 1), c + done * launches * b)
    per = best / (times * launches)
    print(f"{launches} launch(es) a step: {per * 1e6:.2f} us a launch in runs")
    assert per < 1.5e-6, f"{per * 1e6:.2f} us a launch"


# ---- 3. do two queues' kernels run at the same time? (a measurement) ---------------------


REDUCE_BLOCKS = 2  # few SMs: two such kernels side by side fit the GPU many times over
REDUCE_SHARED = 1024  # dynamic shared memory: extra[t] for 256 threads


def reduce_want(data: np.ndarray, blocks: int) -> np.ndarray:
    """What kernels.cu's reduce gives for ``data`` (a multiple of blocks * BLOCK long): the
    tree test_gpu_kernels.py's reduction test computes, per block."""
    per_thread = data.reshape(-1, blocks * BLOCK).sum(axis=0, dtype=np.float64)
    stage = per_thread.reshape(blocks, BLOCK)
    extra = stage * 0.5
    w = BLOCK // 2
    while w > 0:
        stage[:, :w] += stage[:, w : 2 * w] + extra[:, w : 2 * w]
        w //= 2
    return np.asarray(stage[:, 0] + 1.0)


def test_two_queues_long_kernels_side_by_side_measured(device: Device) -> None:
    """Issue 17: "work of different queues runs concurrently unless ordered", measured, not
    asserted: two reduce kernels of 2 blocks each (a grid-stride loop over n floats, its
    length found so one takes ~10 ms) on two queues. A bandwidth-bound kernel (a big vadd)
    would take twice as long beside another even if both ran at once; these use 2 of the
    GPU's SMs, so at once they take the time of one, and time-sliced twice that. Printed: one
    alone, two on one queue (in order, the 2x reference), two on two queues (wall times), and
    each one's GPU interval from the two queues' profiles (PTIMER; under time-slicing the
    intervals may overlap while the kernels do not run at once, so the wall times decide).
    Asserted: every output is numpy's. Each queue's compute channel has a channel group of
    its own today (docs/queues.md), so the GPU may time-slice them; this test tells."""
    img = kernels(device)
    fn = img["reduce"]
    qa, qb = device.queue(), device.queue()
    stride = REDUCE_BLOCKS * BLOCK
    most = 1 << 26
    data = rng.random(most, dtype=np.float32)
    rin = alloc(device, data.nbytes)
    outs = [alloc(device, 4 * REDUCE_BLOCKS) for _ in range(3)]
    device.upload(rin, data).wait()

    def launch(q: Queue, out: Region, n: int) -> Point:
        return q.launch(fn, (REDUCE_BLOCKS,), (BLOCK,), (rin, out, n), shared=REDUCE_SHARED)

    def timed(run: Callable[[], list[Point]]) -> float:
        t = time.perf_counter()
        for p in run():
            p.wait(timeout_s=60)
        return time.perf_counter() - t

    def alone(n: int) -> float:
        return timed(lambda: [launch(qa, outs[0], n)])

    n = 1 << 20
    launch(qa, outs[0], n).wait()  # the first launch of a queue loads what it needs
    launch(qb, outs[1], n).wait()
    for _ in range(2):  # twice: the first guess counts the launch's own cost too
        one = alone(n)
        n = int(min(most, max(stride, n * 0.010 / one))) // stride * stride  # ~10 ms alone
    rounds = []
    for _ in range(3):
        one = alone(n)
        serial = timed(lambda: [launch(qa, outs[0], n), launch(qa, outs[2], n)])
        both = timed(lambda: [launch(qa, outs[0], n), launch(qb, outs[1], n)])
        rounds.append((one, serial, both))
    with qa.profile() as pa, qb.profile() as pb:
        launch(qa, outs[0], n)
        launch(qb, outs[1], n)
    (ea,), (eb,) = pa.events(), pb.events()
    overlap = min(ea.end_ns, eb.end_ns) - max(ea.start_ns, eb.start_ns)
    print(f"reduce, {REDUCE_BLOCKS} blocks over {n} floats ({4 * n >> 20} MiB):")
    for one, serial, both in rounds:
        print(f"  alone {one * 1e3:.2f} ms; two on one queue {serial * 1e3:.2f} ms "
              f"({serial / one:.2f}x); two on two queues {both * 1e3:.2f} ms "
              f"({both / one:.2f}x)")
    print(f"  profiles: A {ea.duration_ns / 1e6:.2f} ms, B {eb.duration_ns / 1e6:.2f} ms on the "
          f"GPU, B starts {(eb.start_ns - ea.start_ns) / 1e6:+.2f} ms after A; their intervals "
          f"overlap {max(overlap, 0) / 1e6:.2f} ms; union "
          f"{(max(ea.end_ns, eb.end_ns) - min(ea.start_ns, eb.start_ns)) / 1e6:.2f} ms")
    pa.free()
    pb.free()
    want = reduce_want(data[:n], REDUCE_BLOCKS)
    got = [get(q, out, REDUCE_BLOCKS) for q, out in zip((qa, qb, qa), outs, strict=True)]
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-3)


# ---- 4. a fault on a queue loses the device -----------------------------------------------


QUEUE_FAULT_CHILD = textwrap.dedent("""
    import numpy as np, sys
    import rig_nv_nvidia
    from rig_edge import Fault, Lost, Memory, Region
    vadd_cubin = sys.argv[1]
    d = rig_nv_nvidia.gpu(0).open()
    img = d.load(open(vadd_cubin, "rb").read())
    q1, q2 = d.queue(), d.queue()
    good = d.alloc(1 << 16, Memory.DEVICE)
    done = q2.upload(good, np.random.default_rng().bytes(1 << 16))
    done.wait()
    bad = Region(0xDEAD0000, None, 1 << 20, Memory.DEVICE)
    try:
        q1.launch(img["vadd"], (4,), (256,), (bad, bad, bad, 1024)).wait(timeout_s=60)
        print("NO FAULT")
        sys.exit(1)
    except Fault as e:
        print("FAULT", e.channel_error)
    vadd = img["vadd"]
    uses = [
        ("q1.launch", lambda: q1.launch(vadd, (4,), (256,), (good, good, good, 1024))),
        ("q1.synchronize", lambda: q1.synchronize()),
        ("q2.launch", lambda: q2.launch(vadd, (4,), (256,), (good, good, good, 1024))),
        ("q2.upload", lambda: q2.upload(good, bytes(16))),
        ("q2.copy", lambda: q2.copy(good, good, 16, dst_offset=64)),
        ("q2.download", lambda: q2.download(good, 16)),
        ("q2.after", lambda: q2.after(done)),
        ("q2.step", lambda: q2.step()),
        ("q2.profile", lambda: q2.profile()),
        ("d.launch", lambda: d.launch(vadd, (4,), (256,), (good, good, good, 1024))),
        ("d.upload", lambda: d.upload(good, bytes(16))),
        ("d.alloc", lambda: d.alloc(4096, Memory.DEVICE)),
        ("d.queue", lambda: d.queue()),
    ]
    for name, use in uses:
        try:
            use()
            print("NOT LOST", name)
        except Lost as e:
            print("LOST", name, "|", type(e).__name__, "|", e.reason)
    q2.stop()  # one queue stopped by hand; the device's stop gives back q1's channels
    print("QUEUE STOPPED")
""") + REOPEN

LOST_USES = ("q1.launch", "q1.synchronize", "q2.launch", "q2.upload", "q2.copy", "q2.download",
             "q2.after", "q2.step", "q2.profile", "d.launch", "d.upload", "d.alloc", "d.queue")


def test_a_fault_on_a_queue_loses_every_queue_and_the_gpu_opens_again() -> None:
    """Issue 17: "a fault on any queue's channel loses the device, and every queue's later use
    raises that Lost; stop gives back every queue's channels and memory". In a fresh process
    (test_gpu_faults.py's way): a vadd at an unmapped address on queue 1 is a Fault naming the
    channel error; then every use of queue 1, of queue 2 (whose work was done before) and of
    the device raises Lost, all naming the one fault; queue 2 and then the device stop, and
    the GPU opens again and computes right."""
    lines = faulting_child(QUEUE_FAULT_CHILD, str(CUBIN))
    lost = [line for line in lines if line.startswith(("LOST ", "NOT LOST "))]
    assert [line.split(" | ")[0].split()[-1] for line in lost] == list(LOST_USES), lost
    assert all(line.startswith("LOST ") for line in lost), lost
    reasons = {line.split(" | ")[2] for line in lost}
    assert len(reasons) == 1, reasons  # every use names the same loss, the fault's
    assert lines[len(lost) + 1] == "QUEUE STOPPED"
    assert lines[len(lost) + 2] == "REOPENED True"


# ---- 5. threads, each on a queue of its own -----------------------------------------------


def test_four_threads_each_submit_to_a_queue_of_their_own(device: Device) -> None:
    """Issue 17: "Threads: each thread may own a queue". Four threads started together, each
    on its own queue with its own fresh data: an upload, 200 saxpys, a copy on the copy
    engine, a download; every thread's result numpy's, none of them raised."""
    img = kernels(device)
    threads, launches, n = 4, 200, (1 << 18) + 5
    queues = [device.queue() for _ in range(threads)]
    mem = [[alloc(device, 4 * n) for _ in range(3)] for _ in range(threads)]
    start = threading.Barrier(threads)
    got: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []

    def body(i: int) -> None:
        own = np.random.default_rng()  # a Generator is no thread's to share
        x = own.integers(0, 8, n, dtype=np.int32).astype(np.float32)
        y = own.integers(0, 8, n, dtype=np.int32).astype(np.float32)
        q, (rx, ry, rz) = queues[i], mem[i]
        try:
            start.wait()
            q.upload(rx, x)
            q.upload(ry, y)
            saxpy_chain(q, img, rx, ry, n, launches)
            q.copy(rz, ry, engine="copy")
            got[i] = (get(q, rz, n), y + launches * x)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    t = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    took = time.perf_counter() - t
    assert not errors, errors
    assert sorted(got) == list(range(threads))
    for result, want in got.values():
        np.testing.assert_array_equal(result, want)
    print(f"{threads} threads x {launches} launches: {took * 1e3:.1f} ms in all")
