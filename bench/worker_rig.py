"""The rig worker: every row through rig_nv_nvidia, each copy and kernel checked on fresh
random data before a sample counts."""

from __future__ import annotations

import ctypes
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import (
    ALLOCS,
    COPY,
    FLIGHT,
    PEER_ENGINES,
    PEER_KEYS,
    SWEEP,
    SWEEP_KINDS,
    Accumulator,
    Recorder,
    flight,
    flight_batched,
    fresh_bytes,
    log,
    same,
    timed,
    too_few_gpus,
)
from worker_queues import QUEUE_KEYS, queues_rig

# ---- the rig worker ----------------------------------------------------------------------------


def worker_rig(rec: Recorder, cubin: Path) -> None:
    import numpy as np

    import rig_nv_nvidia
    from rig_edge import Memory, Refusal

    rng = np.random.default_rng()
    d = rig_nv_nvidia.gpu(0).open()
    rec.meta.update(device=repr(d), arch=d.arch, driver=str(d.facts.driver),
                    rig=rig_nv_nvidia.__version__, cubin=str(cubin))

    def alloc(n: int, kind: Any = Memory.DEVICE) -> Any:
        r = d.alloc(n, kind)
        if r is None:
            raise RuntimeError(f"out of {kind} memory for {n} bytes")
        return r

    def alloc_free(n: int) -> None:
        # Row 6: no wrapper frame around alloc (CuPy's row has none); a failed allocation
        # still shows, as free(None) raises Misuse.
        d.free(d.alloc(n))

    def host(region: Any) -> Any:
        return np.ctypeslib.as_array((ctypes.c_uint8 * region.length).from_address(region.host))

    def read_f32(region: Any) -> Any:
        return np.frombuffer(bytes(d.download(region, 4)), dtype=np.float32)[0]

    fn = None
    ra = rb = rc = None
    if rec.wants("1_launch", "2_step64", "2_step1", "3_flight", "3_launch_flight"):
        with rec.row("1_launch", "2_step64", "2_step1", "3_flight", "3_launch_flight"):
            img = d.load(cubin.read_bytes())
            fn = img["vadd"]
            ra, rb, rc = alloc(4096), alloc(4096), alloc(4096)

    if rec.wants("1_launch"):
        with rec.row("1_launch"):
            a, b = rng.random(1, dtype=np.float32), rng.random(1, dtype=np.float32)
            d.upload(ra, a.tobytes())
            d.upload(rb, b.tobytes())
            d.upload(rc, bytes(4)).wait()
            args = (ra, rb, rc, 1)
            s = timed(lambda: d.launch(fn, (1,), (1,), args).wait(),
                      rec.reps(5000), rec.reps(500))
            got = read_f32(rc)
            if got != np.float32(a[0] + b[0]):
                raise AssertionError(f"vadd wrote {got!r}, not {a[0]!r} + {b[0]!r}")
            rec.add("1_launch", s)

    one = None
    if rec.wants("2_step64", "2_step1"):
        with rec.row("2_step64", "2_step1"):
            acc = Accumulator(rng)
            c0, b0 = acc.arrays()
            d.upload(rc, c0.tobytes())
            d.upload(rb, b0.tobytes()).wait()
            args = (rc, rb, rc, 1)
            many = d.step()
            for _ in range(64):
                many.launch(fn, (1,), (1,), args)
            one = d.step()
            one.launch(fn, (1,), (1,), args)
            n, w = rec.reps(1000), rec.reps(100)
            s64 = timed(lambda: many.submit().wait(), n, w)
            s1 = timed(lambda: one.submit().wait(), n, w)
            acc.count += 65 * (n + w)
            acc.check(read_f32(rc), "steps")
            rec.add("2_step64", s64)
            rec.add("2_step1", s1)

    if rec.wants("3_flight", "3_launch_flight"):
        with rec.row("3_flight", "3_launch_flight", "3_flight_batched"):
            if one is None:  # row 2 failed or was not asked for
                one = d.step()
                one.launch(fn, (1,), (1,), (rc, rb, rc, 1))
            acc = Accumulator(rng)
            c0, b0 = acc.arrays()
            d.upload(rc, c0.tobytes())
            d.upload(rb, b0.tobytes()).wait()
            n = rec.reps(8)
            s = flight(one.submit, d.synchronize, n)
            args = (rc, rb, rc, 1)
            sl = flight(lambda: d.launch(fn, (1,), (1,), args), d.synchronize, n)
            sb = flight_batched(lambda times: one.submit(times=times), n)
            acc.count += 3 * (n + 1) * FLIGHT
            acc.check(read_f32(rc), "kernels in flight")
            rec.add("3_flight", s)
            rec.add("3_launch_flight", sl)
            rec.add("3_flight_batched", sb)

    bigs: list[Any] = []

    def copy_buffers() -> tuple[Any, Any]:
        """The two 256 MiB regions rows 4, 5 and 11 copy through, made at first use."""
        if not bigs:
            bigs.extend((alloc(COPY), alloc(COPY)))
        return bigs[0], bigs[1]

    if rec.wants("4_h2d_pinned", "4_d2h_pinned"):
        with rec.row("4_h2d_pinned", "4_d2h_pinned"):
            big, big2 = copy_buffers()
            pin_src, pin_dst = alloc(COPY, Memory.PINNED), alloc(COPY, Memory.PINNED)
            src, dst = host(pin_src), host(pin_dst)
            src[:] = fresh_bytes(rng, COPY)
            dst[:] = 0
            n = rec.reps(20)
            sh = timed(lambda: d.copy(big, pin_src).wait(), n, 2)
            d.copy(pin_dst, big).wait()
            same(dst, src, "H2D pinned")
            dst[:] = 0
            sd = timed(lambda: d.copy(pin_dst, big).wait(), n, 2)
            same(dst, src, "D2H pinned")
            rec.add("4_h2d_pinned", sh, COPY)
            rec.add("4_d2h_pinned", sd, COPY)
            d.free(pin_src)
            d.free(pin_dst)

    src = dst = None
    if rec.wants("4_h2d_pageable", "4_d2h_pageable"):
        with rec.row("4_h2d_pageable", "4_d2h_pageable"):
            big, big2 = copy_buffers()
            src, dst = fresh_bytes(rng, COPY), np.zeros(COPY, dtype=np.uint8)
            n = rec.reps(20)
            sh = timed(lambda: d.upload(big, src).wait(), n, 2)
            d.download(big, COPY, out=dst)
            same(dst, src, "H2D pageable")
            dst[:] = 0
            sd = timed(lambda: d.download(big, COPY, out=dst), n, 2)
            same(dst, src, "D2H pageable")
            rec.add("4_h2d_pageable", sh, COPY)
            rec.add("4_d2h_pageable", sd, COPY)

    def mapped_copy(buffer: Any, to_gpu: bool) -> None:
        r = d.map_host(buffer)
        if isinstance(r, Refusal):
            raise RuntimeError(f"map_host refused: {r}")
        try:
            (d.copy(big, r) if to_gpu else d.copy(r, big)).wait()
        finally:
            d.free(r)

    if rec.wants("4_h2d_map_host", "4_d2h_map_host"):
        with rec.row("4_h2d_map_host", "4_d2h_map_host"):
            big, big2 = copy_buffers()
            src, dst = fresh_bytes(rng, COPY), np.zeros(COPY, dtype=np.uint8)
            n = rec.reps(10)
            sh = timed(lambda: mapped_copy(src, True), n, 1)
            d.download(big, COPY, out=dst)
            same(dst, src, "H2D map_host")
            dst[:] = 0
            sd = timed(lambda: mapped_copy(dst, False), n, 1)
            same(dst, src, "D2H map_host")
            rec.add("4_h2d_map_host", sh, COPY)
            rec.add("4_d2h_map_host", sd, COPY)

    if rec.wants("5_d2d"):
        with rec.row("5_d2d"):
            big, big2 = copy_buffers()
            src, dst = fresh_bytes(rng, COPY), np.zeros(COPY, dtype=np.uint8)
            d.upload(big, src).wait()
            s = timed(lambda: d.copy(big2, big).wait(), rec.reps(30), 3)
            d.download(big2, COPY, out=dst)
            same(dst, src, "D2D")
            rec.add("5_d2d", s, COPY)
    src = dst = None

    def alloc_free_trim(n: int) -> None:
        d.free(alloc(n))
        d.trim()

    for key, size, count in ALLOCS:
        if rec.wants(key + "_raw"):
            with rec.row(key + "_raw"):  # rig's own reuse cache left out: trim after each free
                s = timed(functools.partial(alloc_free_trim, size), rec.reps(count // 4),
                          rec.reps(count // 40))
                rec.add(key + "_raw", s, size)
        if rec.wants(key):
            with rec.row(key):
                probe = alloc(size)
                word = rng.bytes(8)
                d.upload(probe, word, size - 8).wait()
                if bytes(d.download(probe, 8, size - 8)) != word:
                    raise AssertionError(f"{key}: a fresh allocation did not keep its bytes")
                d.free(probe)
                s = timed(functools.partial(alloc_free, size), rec.reps(count),
                          rec.reps(count // 10))
                rec.add(key, s, size)

    sweep_rig(rec, d, rng, alloc, host)

    if rec.wants("11_wait_cpu"):
        with rec.row("11_wait_cpu"):
            big, big2 = copy_buffers()
            s = []
            for _ in range(rec.reps(10)):
                for _ in range(7):
                    d.copy(big2, big)
                last = d.copy(big2, big)
                c0, t0 = time.process_time(), time.perf_counter()
                last.wait()
                s.append((time.process_time() - c0) / (time.perf_counter() - t0))
            rec.add("11_wait_cpu", s)

    if rec.wants("12_matmul"):
        with rec.row("12_matmul"):
            matmul_rig(rec, d, rng, alloc)

    if rec.wants(*QUEUE_KEYS):
        if fn is None:
            fn = d.load(cubin.read_bytes())["vadd"]
        queues_rig(rec, d, rng, alloc, host, fn)

    if rec.wants(*PEER_KEYS):
        with rec.row(*PEER_KEYS):
            peers_rig(rec, d, rng)

    if rec.wants("7_open_stop_inproc"):
        with rec.row("7_open_stop_inproc"):
            d.stop()
            s = timed(lambda: rig_nv_nvidia.gpu(0).open().stop(), rec.reps(8), 1)
            rec.add("7_open_stop_inproc", s)


def sweep_rig(rec: Recorder, d: Any, rng: Any, alloc: Callable[..., Any],
              host: Callable[[Any], Any]) -> None:
    """Row 10 for rig: each kind and size through rig's own engine choice, and D2D on each
    engine (keys ``_ce``, ``_sm``); every copy's bytes checked once."""
    from rig_edge import Memory

    keys = [f"10_{k}_{n}" for k in SWEEP_KINDS for n, _ in SWEEP]
    if not rec.wants(*keys):
        return
    with rec.row(*keys):
        top = SWEEP[-1][1]
        hsrc, hdst = alloc(top, Memory.PINNED), alloc(top, Memory.PINNED)
        g1, g2 = alloc(top), alloc(top)
        src, dst = host(hsrc), host(hdst)
        src[:] = fresh_bytes(rng, top)
        d.copy(g1, hsrc).wait()  # so D2H and D2D check out when H2D is not asked for
        for name, n in SWEEP:
            reps = rec.reps(10 if n >= 256 << 20 else 200)
            plan: list[tuple[str, Any, Any, str | None]] = [
                ("h2d", g1, hsrc, None), ("d2h", hdst, g1, None), ("d2d", g2, g1, None),
                ("d2d_ce", g2, g1, "copy"), ("d2d_sm", g2, g1, "sm")]
            for kind, to, frm, engine in plan:
                key = f"10_{kind}_{name}"
                if not rec.wants(key):
                    continue
                kw = {} if engine is None else {"engine": engine}
                s = timed(lambda to=to, frm=frm, kw=kw, n=n: d.copy(to, frm, n, **kw).wait(),
                          reps, 2)
                if kind == "d2h":
                    same(dst[:n], src[:n], key)
                    dst[:n] = 0
                elif kind.startswith("d2d"):
                    d.copy(hdst, g2, n).wait()
                    same(dst[:n], src[:n], key)
                    dst[:n] = 0
                rec.add(key, s, n)
        for r in (hsrc, hdst, g1, g2):
            d.free(r)


def matmul_rig(rec: Recorder, d: Any, rng: Any, alloc: Callable[..., Any]) -> None:
    """Row 12 for rig: the Triton matmul compiled here, launched through rig_nv.triton."""
    import matmul as mm
    import numpy as np

    from rig_nv import triton as rig_triton

    sm = int(d.arch[3:].rstrip("a"))  # "sm_90" -> 90
    kernel = mm.compile_for((sm // 10, sm % 10))
    k = rig_triton.load(d, kernel)
    a, b = mm.inputs(rng)
    ra, rb, rc = (alloc(a.nbytes) for _ in range(3))
    d.upload(ra, a).wait()
    d.upload(rb, b).wait()
    launch = k[mm.grid()]
    args = mm.args(ra, rb, rc)
    launch(*args).wait()
    rows = rng.choice(mm.SIZE, mm.CHECK_ROWS, replace=False)
    got = np.stack([np.frombuffer(bytes(d.download(rc, mm.SIZE * 2, int(r) * mm.SIZE * 2)),
                                  dtype=np.float16) for r in rows])
    mm.check(a, b, rows, got, "12_matmul (rig)")
    s = timed(lambda: launch(*args).wait(), rec.reps(20), 3)
    rec.add("12_matmul", s, mm.FLOPS, cubin=mm.digest(kernel))
    for r in (ra, rb, rc):
        d.free(r)


def peers_rig(rec: Recorder, d0: Any, rng: Any) -> None:
    """Row 9 for rig: GPU 1 opened beside ``d0`` (GPU 0), GPU 0's region mapped into GPU 1,
    and GPU 1's copies pull from it (GPU0->GPU1) and push into it (GPU1->GPU0), on the copy
    engine and on the SMs; each direction's better engine is its 9 row. GPU 1 is stopped
    again before this returns (row 7 times GPU 0 alone)."""
    import numpy as np

    import rig_nv_nvidia
    from rig_edge import Memory

    why = too_few_gpus(rig_nv_nvidia.count())
    if why is not None:
        rec.skip(PEER_KEYS, why)
        return
    if not rig_nv_nvidia.reaches(0, 1):
        raise RuntimeError("no peer access: rig_nv_nvidia.reaches(0, 1) is False (the RM says "
                           "GPUs 0 and 1 cannot map each other)")
    d1 = rig_nv_nvidia.gpu(1).open()
    r0 = r1 = p = None
    try:
        rec.meta["gpu1"] = repr(d1)
        r0, r1 = d0.alloc(COPY, Memory.DEVICE), d1.alloc(COPY, Memory.DEVICE)
        if r0 is None or r1 is None:
            raise RuntimeError("out of device memory for 256 MiB on each GPU")
        p = d1.map_peer(d0, r0)  # GPU 1's view of r0, at r0's GPU address
        zeros, dst = np.zeros(COPY, dtype=np.uint8), np.zeros(COPY, dtype=np.uint8)
        # GPU 1 copies both ways: from p (r0) into r1, and from r1 into p. Per direction, the
        # device and region the source bytes go up to, and those the arrived bytes come from.
        ways = (("01", r1, p, (d0, r0), (d1, r1)), ("10", p, r1, (d1, r1), (d0, r0)))

        def copy(to: Any, frm: Any, engine: str) -> None:
            d1.copy(to, frm, engine=engine).wait()

        for way, to, frm, (src_dev, src_region), (dst_dev, dst_region) in ways:
            for engine, tag in PEER_ENGINES:
                key = f"9_peer_{way}_{tag}"
                with rec.row(key):
                    go = functools.partial(copy, to, frm, engine)
                    src = fresh_bytes(rng, COPY)
                    src_dev.upload(src_region, src).wait()
                    dst_dev.upload(dst_region, zeros).wait()
                    go()
                    dst_dev.download(dst_region, COPY, out=dst)
                    same(dst, src, f"{key} (the first copy)")
                    dst_dev.upload(dst_region, zeros).wait()
                    s = timed(go, rec.reps(30), 2)
                    dst[:] = 0
                    dst_dev.download(dst_region, COPY, out=dst)
                    same(dst, src, key)
                    rec.add(key, s, COPY, engine=engine)
            best_of_engines(rec, f"9_peer_{way}")
    finally:
        try:
            if p is not None:
                d1.free(p)  # before r0, whose mapping it is
            if r0 is not None:
                d0.free(r0)
            if r1 is not None:
                d1.free(r1)
        except Exception as e:
            rec.meta["peer_cleanup_error"] = f"{type(e).__name__}: {e}"
            log(f"  peer cleanup: {rec.meta['peer_cleanup_error']}")
        try:
            d1.stop()
        except Exception as e:
            rec.meta["peer_stop_error"] = f"{type(e).__name__}: {e}"
            log(f"  stopping GPU 1: {rec.meta['peer_stop_error']}")


def best_of_engines(rec: Recorder, key: str) -> None:
    """Row ``key``: the samples of whichever of its engine rows (``key``_ce, ``key``_sm) has
    the better median; an error naming each where none has samples."""
    if rec.wants(key):
        with rec.row(key):
            done = {engine: rec.rows[f"{key}_{tag}"] for engine, tag in PEER_ENGINES
                    if "samples_s" in rec.rows.get(f"{key}_{tag}", {})}
            if not done:
                raise RuntimeError("; ".join(
                    f"{engine}: {rec.rows.get(f'{key}_{tag}', {}).get('error', 'not run')}"
                    for engine, tag in PEER_ENGINES))
            engine = min(done, key=lambda e: statistics.median(done[e]["samples_s"]))
            rec.add(key, list(done[engine]["samples_s"]), COPY, engine=engine)

