"""Rows 13 and 14 (issue 17, queues): rig's queues and CUDA's streams (through torch).

Row 13: an upload of 1 GiB from pinned memory on one queue while VADDS dependent vadds run
on another, the same count for every peer (counts taken from each peer's own launch latency
made their work differ). Each sample is the wall time of both, started together and both
waited for, over the longer of the two alone (target <= 1.1); the 13' rows are the three
times. Row 14: launches per second from 1, 2 and 4 threads, each launching on a queue of its
own (rig) or a stream of its own (torch), then waiting for its own; a sample is the wall
time over all the launches.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from common import FLIGHT, Accumulator, Recorder, flight_batched, fresh_bytes, same

UPLOAD = 1 << 30
VADDS = 48  # ~0.4 ms each on the H200, so about the upload's ~20 ms
WORK = 64 << 20  # floats each vadd of the kernels' work adds (768 MiB of traffic)
THREADS = (1, 2, 4)
OVERLAP_KEYS = ("13_overlap", "13_overlap_upload", "13_overlap_kernels", "13_overlap_both")
THREAD_KEYS = tuple(f"14_threads_{n}" for n in THREADS)
QUEUE_KEYS = ("3_flight_queue", *OVERLAP_KEYS, *THREAD_KEYS)  # every row needing a queue


def overlap_samples(upload: Callable[[], Any], kernels: Callable[[], Any],
                    wait: Callable[[Any], None], reps: int) -> dict[str, list[float]]:
    """Each round: the upload alone, the kernels alone, then both started together (the
    upload first) and both waited for. ``upload`` and ``kernels`` start their work and return
    what ``wait`` waits for."""
    out: dict[str, list[float]] = {k: [] for k in OVERLAP_KEYS}
    clock = time.perf_counter
    for r in range(reps + 1):  # the first round warms up
        t = clock()
        wait(upload())
        alone_upload = clock() - t
        t = clock()
        wait(kernels())
        alone_kernels = clock() - t
        t = clock()
        a, b = upload(), kernels()
        wait(a)
        wait(b)
        both = clock() - t
        if r:
            out["13_overlap_upload"].append(alone_upload)
            out["13_overlap_kernels"].append(alone_kernels)
            out["13_overlap_both"].append(both)
            out["13_overlap"].append(both / max(alone_upload, alone_kernels))
    return out


def thread_samples(launcher: Callable[[int], Callable[[], None]], count: int,
                   reps: int) -> dict[str, list[float]]:
    """Row 14: for each thread count n, n threads each running ``launcher(i)()`` (its
    ``count`` launches and its own wait) at once; seconds per launch of all of them."""
    out: dict[str, list[float]] = {}
    for n in THREADS:
        runs = [launcher(i) for i in range(n)]
        samples = []
        for r in range(reps + 1):
            start = threading.Barrier(n + 1)
            errors: list[BaseException] = []

            def body(run: Callable[[], None], start: threading.Barrier = start,
                     errors: list[BaseException] = errors) -> None:
                start.wait()
                try:
                    run()
                except BaseException as e:  # told below, with the row
                    errors.append(e)

            threads = [threading.Thread(target=body, args=(run,)) for run in runs]
            for th in threads:
                th.start()
            t = time.perf_counter()
            start.wait()
            for th in threads:
                th.join()
            took = time.perf_counter() - t
            if errors:
                raise errors[0]
            if r:
                samples.append(took / (n * count))
        out[f"14_threads_{n}"] = samples
    return out


def queues_rig(rec: Recorder, d: Any, rng: Any, alloc: Callable[..., Any],
               host: Callable[[Any], Any], fn: Any) -> None:
    """Rows 13 and 14 for rig, and row 3's steps on a queue: ``fn`` is the cubin's vadd.
    They run last, as they always have."""
    from rig_edge import Memory

    if rec.wants("3_flight_queue"):
        with rec.row("3_flight_queue"):
            q = d.queue()
            acc = Accumulator(rng)
            c0, b0 = acc.arrays()
            rc, rb = alloc(4096), alloc(4096)
            q.upload(rc, c0.tobytes())
            q.upload(rb, b0.tobytes()).wait()
            one = q.step()
            one.launch(fn, (1,), (1,), (rc, rb, rc, 1))
            n = rec.reps(8)
            s = flight_batched(lambda times: one.submit(times=times), n)
            acc.count += (n + 1) * FLIGHT
            import numpy as np

            acc.check(np.frombuffer(bytes(q.download(rc, 4)), dtype=np.float32)[0],
                      "3 steps on a queue")
            rec.add("3_flight_queue", s)
            one.free()
            q.stop()

    if rec.wants(*OVERLAP_KEYS):
        with rec.row(*OVERLAP_KEYS):
            copier, worker = d.queue(), d.queue()
            pinned, dst = alloc(UPLOAD, Memory.PINNED), alloc(UPLOAD)
            host(pinned)[:] = fresh_bytes(rng, UPLOAD)
            import numpy as np

            a, b, c = alloc(4 * WORK), alloc(4 * WORK), alloc(4 * WORK)
            fa, fb = (rng.random(WORK, dtype=np.float32) for _ in range(2))
            d.upload(a, fa)
            d.upload(b, fb).wait()
            grid = ((WORK + 255) // 256,)
            work = worker.step()  # VADDS dependent launches
            for _ in range(VADDS):
                work.launch(fn, grid, (256,), (a, b, c, WORK))
            got = overlap_samples(lambda: copier.copy(dst, pinned, engine="copy"),
                                  work.submit, lambda p: p.wait(), rec.reps(10))
            # The last round's work, whole: the upload byte-exact, every sum numpy's.
            same(np.frombuffer(d.download(dst), dtype=np.uint8), host(pinned), "13 the upload")
            same(np.frombuffer(d.download(c), dtype=np.float32), fa + fb, "13 the kernels")
            for key in OVERLAP_KEYS:
                rec.add(key, got[key])
            for r in (pinned, dst, a, b, c):
                d.free(r)
            work.free()
            copier.stop()
            worker.stop()

    if rec.wants(*THREAD_KEYS):
        with rec.row(*THREAD_KEYS):
            count = rec.reps(20000)
            import numpy as np

            queues = [d.queue() for _ in range(max(THREADS))]
            regions = [alloc(4096) for _ in range(3 * len(queues))]
            sums = []
            for i in range(len(queues)):  # each queue's a and b, fresh; c checked after
                xa, xb = rng.random(1, dtype=np.float32), rng.random(1, dtype=np.float32)
                d.upload(regions[3 * i], xa)
                d.upload(regions[3 * i + 1], xb).wait()
                sums.append(xa + xb)

            def launcher(i: int) -> Callable[[], None]:
                q, args = queues[i], (*regions[3 * i : 3 * i + 3], 1)  # each its own memory

                def run() -> None:
                    p = None
                    for _ in range(count):
                        p = q.launch(fn, (1,), (1,), args)
                    assert p is not None
                    p.wait()

                return run

            got = thread_samples(launcher, count, rec.reps(5))
            for i, want in enumerate(sums):
                same(np.frombuffer(bytes(d.download(regions[3 * i + 2], 4)), dtype=np.float32),
                     want, f"14 thread {i}'s vadd")
            for key in THREAD_KEYS:
                rec.add(key, got[key])
            for q in queues:
                q.stop()
            for r in regions:
                d.free(r)


def queues_torch(rec: Recorder, rng: Any) -> None:
    """Rows 13 and 14 for CUDA: the same through torch's streams (cudaMemcpyAsync from pinned
    memory on one stream, torch.add on another; row 14 a stream per thread)."""
    import torch

    dev = torch.device("cuda", 0)
    if rec.wants(*OVERLAP_KEYS):
        with rec.row(*OVERLAP_KEYS):
            copier, worker = torch.cuda.Stream(), torch.cuda.Stream()
            src = torch.from_numpy(fresh_bytes(rng, UPLOAD)).pin_memory()
            dst = torch.empty(UPLOAD, dtype=torch.uint8, device=dev)
            a, b = (torch.rand(WORK, device=dev) for _ in range(2))
            c = torch.empty(WORK, device=dev)
            with torch.cuda.stream(worker):
                torch.add(a, b, out=c)
            worker.synchronize()
            count = VADDS

            def upload() -> Any:
                with torch.cuda.stream(copier):
                    dst.copy_(src, non_blocking=True)
                return copier

            def kernels() -> Any:
                with torch.cuda.stream(worker):
                    for _ in range(count):
                        torch.add(a, b, out=c)
                return worker

            got = overlap_samples(upload, kernels, lambda s: s.synchronize(), rec.reps(10))
            for at in (0, UPLOAD - 4096):
                same(dst[at : at + 4096].cpu().numpy(), src[at : at + 4096].numpy(),
                     "13 the upload")
            for key in OVERLAP_KEYS:
                rec.add(key, got[key])

    if rec.wants(*THREAD_KEYS):
        with rec.row(*THREAD_KEYS):
            count = rec.reps(20000)
            streams = [torch.cuda.Stream() for _ in range(max(THREADS))]
            xs = [torch.zeros(1, device=dev) for _ in streams]  # each thread its own

            def launcher(i: int) -> Callable[[], None]:
                def run() -> None:
                    x = xs[i]
                    with torch.cuda.stream(streams[i]):
                        for _ in range(count):
                            torch.add(x, x, out=x)
                    streams[i].synchronize()

                return run

            got = thread_samples(launcher, count, rec.reps(5))
            for key in THREAD_KEYS:
                rec.add(key, got[key])
