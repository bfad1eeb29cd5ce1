"""The PyTorch and CuPy workers: the rows each can time, on their own allocators, streams and
kernels (CuPy loads the same cubin), checked like rig's."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

from common import (
    ALLOCS,
    COPY,
    FLIGHT,
    PEER_ROWS,
    Accumulator,
    Recorder,
    flight,
    fresh_bytes,
    same,
    timed,
    too_few_gpus,
)
from worker_queues import queues_torch

# ---- the PyTorch worker ------------------------------------------------------------------------


def worker_torch(rec: Recorder, cubin: Path) -> None:
    import numpy as np
    import torch

    del cubin  # torch runs its own add kernel
    rng = np.random.default_rng()
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    rec.meta.update(torch=torch.__version__, cuda=torch.version.cuda,
                    device=torch.cuda.get_device_name(0), kernel="torch.add (1 element)")
    stream = torch.cuda.current_stream()

    def f32(x: Any) -> Any:
        return torch.from_numpy(np.asarray(x, dtype=np.float32)).to(dev)

    if rec.wants("1_launch"):
        with rec.row("1_launch"):
            a, b = rng.random(1, dtype=np.float32), rng.random(1, dtype=np.float32)
            ta, tb, tc = f32(a), f32(b), torch.zeros(1, dtype=torch.float32, device=dev)

            def once() -> None:
                torch.add(ta, tb, out=tc)
                stream.synchronize()

            s = timed(once, rec.reps(5000), rec.reps(500))
            got = tc.cpu().numpy()[0]
            if got != np.float32(a[0] + b[0]):
                raise AssertionError(f"add wrote {got!r}, not {a[0]!r} + {b[0]!r}")
            rec.add("1_launch", s)

    g1 = tc = tb = None
    # Row 3 replays row 2's graph of one: asking for row 3 runs row 2 too (the table shows
    # what --rows asked for).
    if rec.wants("2_step64", "2_step1", "3_flight", "3_launch_flight"):
        with rec.row("2_step64", "2_step1"):
            tc, tb = torch.zeros(1, dtype=torch.float32, device=dev), f32([0.5])
            side = torch.cuda.Stream()
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                for _ in range(3):
                    tc.add_(tb)
            stream.wait_stream(side)
            g64, g1 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(g64):
                for _ in range(64):
                    tc.add_(tb)
            with torch.cuda.graph(g1):
                tc.add_(tb)
            torch.cuda.synchronize()
            acc = Accumulator(rng)
            c0, b0 = acc.arrays()
            tc.copy_(torch.from_numpy(c0))
            tb.copy_(torch.from_numpy(b0))
            torch.cuda.synchronize()

            def replay(g: Any) -> None:
                g.replay()
                stream.synchronize()

            n, w = rec.reps(1000), rec.reps(100)
            s64 = timed(lambda: replay(g64), n, w)
            s1 = timed(lambda: replay(g1), n, w)
            acc.count += 65 * (n + w)
            acc.check(tc.cpu().numpy()[0], "graphs")
            rec.add("2_step64", s64)
            rec.add("2_step1", s1)

    if rec.wants("3_flight", "3_launch_flight"):
        with rec.row("3_flight", "3_launch_flight"):
            if g1 is None or tc is None or tb is None:
                raise RuntimeError("no one-kernel graph (row 2 failed)")
            acc = Accumulator(rng)
            c0, b0 = acc.arrays()
            tc.copy_(torch.from_numpy(c0))
            tb.copy_(torch.from_numpy(b0))
            torch.cuda.synchronize()
            n = rec.reps(8)
            s = flight(g1.replay, stream.synchronize, n)
            sl = flight(lambda: tc.add_(tb), stream.synchronize, n)
            acc.count += 2 * (n + 1) * FLIGHT
            acc.check(tc.cpu().numpy()[0], "kernels in flight")
            rec.add("3_flight", s)
            rec.add("3_launch_flight", sl)

    big = torch.empty(COPY, dtype=torch.uint8, device=dev)

    def copies(src: Any, dst: Any, h2d: str, d2h: str) -> None:
        src.numpy()[:] = fresh_bytes(rng, COPY)
        dst.numpy()[:] = 0

        def up() -> None:
            big.copy_(src)
            stream.synchronize()

        def down() -> None:
            dst.copy_(big)
            stream.synchronize()

        n = rec.reps(20)
        sh = timed(up, n, 2)
        down()
        same(dst.numpy(), src.numpy(), h2d)
        dst.numpy()[:] = 0
        sd = timed(down, n, 2)
        same(dst.numpy(), src.numpy(), d2h)
        rec.add(h2d, sh, COPY)
        rec.add(d2h, sd, COPY)

    if rec.wants("4_h2d_pinned", "4_d2h_pinned"):
        with rec.row("4_h2d_pinned", "4_d2h_pinned"):
            copies(torch.empty(COPY, dtype=torch.uint8, pin_memory=True),
                   torch.empty(COPY, dtype=torch.uint8, pin_memory=True),
                   "4_h2d_pinned", "4_d2h_pinned")
    if rec.wants("4_h2d_pageable", "4_d2h_pageable"):
        with rec.row("4_h2d_pageable", "4_d2h_pageable"):
            copies(torch.from_numpy(np.zeros(COPY, dtype=np.uint8)),
                   torch.from_numpy(np.zeros(COPY, dtype=np.uint8)),
                   "4_h2d_pageable", "4_d2h_pageable")

    if rec.wants("5_d2d"):
        with rec.row("5_d2d"):
            src = fresh_bytes(rng, COPY)
            big.copy_(torch.from_numpy(src))
            big2 = torch.zeros(COPY, dtype=torch.uint8, device=dev)

            def d2d() -> None:
                big2.copy_(big)
                stream.synchronize()

            s = timed(d2d, rec.reps(30), 3)
            same(big2.cpu().numpy(), src, "D2D")
            rec.add("5_d2d", s, COPY)

    for key, size, count in ALLOCS:
        if rec.wants(key):
            with rec.row(key):
                s = timed(functools.partial(torch.empty, size, dtype=torch.uint8, device=dev),
                          rec.reps(count), rec.reps(count // 10))
                rec.add(key, s, size)

    if rec.wants("12_matmul", "12_matmul_torch"):
        with rec.row("12_matmul", "12_matmul_torch"):
            matmul_torch(rec, rng)

    if rec.wants(*PEER_ROWS):
        with rec.row(*PEER_ROWS):
            peers_torch(rec, rng)

    queues_torch(rec, rng)


def matmul_torch(rec: Recorder, rng: Any) -> None:
    """Row 12 for CUDA: the same Triton matmul launched by Triton's own launcher (its
    cuLaunchKernelEx) on torch's tensors; and torch.matmul, the ceiling (12')."""
    import matmul as mm
    import torch

    kernel = mm.compile_for(torch.cuda.get_device_capability())
    a, b = mm.inputs(rng)
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    tc = torch.empty_like(ta)
    launch = kernel[mm.grid()]
    args = mm.args(ta, tb, tc)
    launch(*args)
    torch.cuda.synchronize()
    rows = rng.choice(mm.SIZE, mm.CHECK_ROWS, replace=False)
    mm.check(a, b, rows, tc[torch.from_numpy(rows).cuda()].cpu().numpy(), "12_matmul (CUDA)")

    def once() -> None:
        launch(*args)
        torch.cuda.synchronize()

    rec.add("12_matmul", timed(once, rec.reps(20), 3), mm.FLOPS, cubin=mm.digest(kernel))

    def ceiling() -> None:
        torch.matmul(ta, tb, out=tc)
        torch.cuda.synchronize()

    ceiling()
    mm.check(a, b, rows, tc[torch.from_numpy(rows).cuda()].cpu().numpy(), "12_matmul_torch")
    rec.add("12_matmul_torch", timed(ceiling, rec.reps(20), 3), mm.FLOPS)


def peers_torch(rec: Recorder, rng: Any) -> None:
    """Row 9 for torch: a 256 MiB tensor on one GPU, ``tensor.to()`` the other, and both GPUs
    synchronized; checked once after warm-up."""
    import torch

    why = too_few_gpus(torch.cuda.device_count())
    if why is not None:
        rec.skip(PEER_ROWS, why)
        return
    access = (torch.cuda.can_device_access_peer(0, 1), torch.cuda.can_device_access_peer(1, 0))
    rec.meta["peer_access"] = list(access)
    if not all(access):
        raise RuntimeError(f"no peer access: torch.cuda.can_device_access_peer(0, 1), (1, 0) = "
                           f"{access}")

    def sync() -> None:
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)

    for key, frm, to in (("9_peer_01", 0, 1), ("9_peer_10", 1, 0)):
        if rec.wants(key):
            with rec.row(key):
                src = fresh_bytes(rng, COPY)
                a = torch.from_numpy(src).to(torch.device("cuda", frm))
                target = torch.device("cuda", to)
                sync()

                def once(a: Any = a, target: Any = target) -> None:
                    a.to(target)
                    sync()

                for _ in range(2):
                    once()
                b = a.to(target)
                sync()
                same(b.cpu().numpy(), src, key)
                del b
                s = timed(once, rec.reps(30), 0)
                rec.add(key, s, COPY)

# ---- the CuPy worker ---------------------------------------------------------------------------


def worker_cupy(rec: Recorder, cubin: Path) -> None:
    import cupy as cp
    import numpy as np

    rng = np.random.default_rng()
    cp.cuda.Device(0).use()
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props.get("name", b"")
    rec.meta.update(cupy=cp.__version__, cuda_runtime=cp.cuda.runtime.runtimeGetVersion(),
                    device=name.decode() if isinstance(name, bytes) else str(name))
    stream = cp.cuda.Stream(non_blocking=True)
    one_arg = np.int32(1)
    try:
        kernel = cp.RawModule(path=str(cubin)).get_function("vadd")

        def vadd(a: Any, b: Any, c: Any) -> None:
            kernel((1,), (1,), (a, b, c, one_arg))

        rec.meta["kernel"] = f"RawModule({cubin.name})['vadd']"
    except Exception as e:
        ew = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x + y", "bench_vadd")

        def vadd(a: Any, b: Any, c: Any) -> None:
            ew(a, b, c)

        rec.meta["kernel"] = f"ElementwiseKernel (RawModule failed: {type(e).__name__}: {e})"

    def f32(x: Any) -> Any:
        return cp.asarray(np.asarray(x, dtype=np.float32))

    def read(c: Any) -> Any:
        stream.synchronize()
        return cp.asnumpy(c)[0]

    if rec.wants("1_launch"):
        with rec.row("1_launch"):
            a, b = rng.random(1, dtype=np.float32), rng.random(1, dtype=np.float32)
            ca, cb, cc = f32(a), f32(b), cp.zeros(1, dtype=cp.float32)
            cp.cuda.runtime.deviceSynchronize()

            def once() -> None:
                vadd(ca, cb, cc)
                stream.synchronize()

            with stream:
                s = timed(once, rec.reps(5000), rec.reps(500))
            got = read(cc)
            if got != np.float32(a[0] + b[0]):
                raise AssertionError(f"vadd wrote {got!r}, not {a[0]!r} + {b[0]!r}")
            rec.add("1_launch", s)

    g1 = cc = cb = None
    if rec.wants("2_step64", "2_step1", "3_flight", "3_launch_flight"):  # as torch's
        with rec.row("2_step64", "2_step1"):
            acc = Accumulator(rng)
            c0, b0 = acc.arrays()
            cc, cb = cp.asarray(c0), cp.asarray(b0)
            cp.cuda.runtime.deviceSynchronize()
            with stream:
                vadd(cc, cb, cc)  # once outside a capture, so that nothing loads during one
                stream.synchronize()
                acc.count += 1
                stream.begin_capture()
                for _ in range(64):
                    vadd(cc, cb, cc)
                g64 = stream.end_capture()
                stream.begin_capture()
                vadd(cc, cb, cc)
                g1 = stream.end_capture()

            def replay(g: Any) -> None:
                g.launch(stream)
                stream.synchronize()

            n, w = rec.reps(1000), rec.reps(100)
            s64 = timed(lambda: replay(g64), n, w)
            s1 = timed(lambda: replay(g1), n, w)
            acc.count += 65 * (n + w)
            acc.check(read(cc), "graphs")
            rec.add("2_step64", s64)
            rec.add("2_step1", s1)

    if rec.wants("3_flight", "3_launch_flight"):
        with rec.row("3_flight", "3_launch_flight"):
            if g1 is None or cc is None or cb is None:
                raise RuntimeError("no one-kernel graph (row 2 failed)")
            acc = Accumulator(rng)
            c0, b0 = acc.arrays()
            cc.set(c0)
            cb.set(b0)
            cp.cuda.runtime.deviceSynchronize()
            n = rec.reps(8)
            s = flight(lambda: g1.launch(stream), stream.synchronize, n)
            with stream:
                sl = flight(lambda: vadd(cc, cb, cc), stream.synchronize, n)
            acc.count += 2 * (n + 1) * FLIGHT
            acc.check(read(cc), "kernels in flight")
            rec.add("3_flight", s)
            rec.add("3_launch_flight", sl)

    big = cp.empty(COPY, dtype=cp.uint8)
    sync = cp.cuda.runtime.deviceSynchronize

    def copies(src: Any, dst: Any, h2d: str, d2h: str) -> None:
        src[:] = fresh_bytes(rng, COPY)
        dst[:] = 0
        s_ptr, d_ptr = ctypes.c_void_p(src.ctypes.data), ctypes.c_void_p(dst.ctypes.data)

        def up() -> None:
            big.data.copy_from_host(s_ptr, COPY)
            sync()

        def down() -> None:
            big.data.copy_to_host(d_ptr, COPY)
            sync()

        n = rec.reps(20)
        sh = timed(up, n, 2)
        down()
        same(dst, src, h2d)
        dst[:] = 0
        sd = timed(down, n, 2)
        same(dst, src, d2h)
        rec.add(h2d, sh, COPY)
        rec.add(d2h, sd, COPY)

    if rec.wants("4_h2d_pinned", "4_d2h_pinned"):
        with rec.row("4_h2d_pinned", "4_d2h_pinned"):
            import cupyx

            copies(cupyx.empty_pinned((COPY,), dtype=np.uint8),
                   cupyx.empty_pinned((COPY,), dtype=np.uint8), "4_h2d_pinned", "4_d2h_pinned")
    if rec.wants("4_h2d_pageable", "4_d2h_pageable"):
        with rec.row("4_h2d_pageable", "4_d2h_pageable"):
            copies(np.zeros(COPY, dtype=np.uint8), np.zeros(COPY, dtype=np.uint8),
                   "4_h2d_pageable", "4_d2h_pageable")

    if rec.wants("5_d2d"):
        with rec.row("5_d2d"):
            src = fresh_bytes(rng, COPY)
            big.set(src)
            big2 = cp.zeros(COPY, dtype=cp.uint8)
            sync()

            def d2d() -> None:
                big2.data.copy_from_device(big.data, COPY)
                sync()

            s = timed(d2d, rec.reps(30), 3)
            same(cp.asnumpy(big2), src, "D2D")
            rec.add("5_d2d", s, COPY)

    for key, size, count in ALLOCS:
        if rec.wants(key):
            with rec.row(key):
                s = timed(functools.partial(cp.cuda.alloc, size), rec.reps(count),
                          rec.reps(count // 10))
                rec.add(key, s, size)
        if rec.wants(key + "_raw"):
            with rec.row(key + "_raw"):
                s = timed(functools.partial(cp.cuda.memory.Memory, size), rec.reps(count),
                          rec.reps(count // 10))
                rec.add(key + "_raw", s, size)

