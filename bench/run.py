#!/usr/bin/env python3
"""rig against CUDA from C, PyTorch and CuPy on the same work, in one run on GPU 0 (issue 7).

    python3 bench/run.py [--scale F] [--peers rig,cuda,torch,cupy]

Builds bench/cuda_bench.c (nvcc, else cc -lcuda), runs it, then each Python peer in a process of
its own (``--worker NAME``), then the fresh-process rows (open+stop, import times, ``rig list``).
Every row is the median of many repetitions after warm-up, with min and max; every copy and
kernel row checks its result against fresh random data before it counts. Writes every sample to
$OUT/bench.json (./bench-out without OUT), the rig/CUDA ratios to $OUT/bench.png (with
matplotlib), and prints a table last. A peer that is missing or a row that fails is recorded in
the JSON and shown as n/a.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import functools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CUBINS = ROOT / "packages" / "rig-nv" / "tests" / "cubins"
COPY = 256 << 20
FLIGHT = 10_000
PEERS = ("rig", "cuda", "torch", "cupy")
IMPORTS = ("rig_edge", "rig_pci", "rig_nv", "rig_nv_nvidia", "rig_cli", "torch", "cupy")
IMPORT_OF = {"rig": "rig_nv_nvidia", "torch": "torch", "cupy": "cupy"}


@dataclass(frozen=True)
class Row:
    key: str
    label: str
    unit: str  # "us", "ms" (times: lower is better) or "GB/s" (higher is better)
    target: tuple[str, float] | None = None  # ("<=" | ">=", ratio to CUDA) or ("ms<=", ms)
    cuda_key: str | None = None  # the CUDA row to compare with, where not the same key


ROWS = (
    Row("1_launch", "1 launch+wait, 1 kernel", "us", ("<=", 1.0)),
    Row("2_step64", "2 step of 64 dependent kernels", "us", ("<=", 1.0)),
    Row("2_step1", "2 step of 1 kernel", "us", ("<=", 1.0)),
    Row("2_per_kernel", "2 each further kernel (t64-t1)/63", "us", ("<=", 1.0)),
    Row("3_flight", "3 10,000 1-kernel steps, per step", "us", ("<=", 1.0)),
    Row("3_launch_flight", "3' 10,000 launches, per launch", "us"),
    Row("4_h2d_pinned", "4 H2D 256 MiB pinned", "GB/s", (">=", 0.98)),
    Row("4_d2h_pinned", "4 D2H 256 MiB pinned", "GB/s", (">=", 0.98)),
    Row("4_h2d_pageable", "4 H2D 256 MiB pageable", "GB/s", (">=", 1.5)),
    Row("4_d2h_pageable", "4 D2H 256 MiB pageable", "GB/s", (">=", 1.5)),
    Row("4_h2d_map_host", "4' H2D pageable, map_host+copy+free", "GB/s", (">=", 1.5),
        "4_h2d_pageable"),
    Row("4_d2h_map_host", "4' D2H pageable, map_host+copy+free", "GB/s", (">=", 1.5),
        "4_d2h_pageable"),
    Row("5_d2d", "5 D2D 256 MiB", "GB/s", (">=", 0.9)),
    Row("6_alloc_64k", "6 alloc+free 64 KiB", "us", ("<=", 1.0)),
    Row("6_alloc_64m", "6 alloc+free 64 MiB", "us", ("<=", 1.0)),
    Row("6_alloc_64k_raw", "6' alloc+free 64 KiB, no cache", "us", None, "6_alloc_64k"),
    Row("6_alloc_64m_raw", "6' alloc+free 64 MiB, no cache", "us", None, "6_alloc_64m"),
    Row("7_open_stop_fresh", "7 open+stop, fresh process", "ms", ("ms<=", 40.0)),
    Row("7_open_stop_fresh_wall", "7 the fresh process, wall", "ms"),
    Row("7_open_stop_inproc", "7 open+stop again, same process", "ms", ("ms<=", 40.0)),
    Row("8_import", "8 import rig_nv_nvidia/torch/cupy", "ms"),
    *(Row(f"8_import_{m}", f"8 import {m}", "ms") for m in IMPORTS[:5]),
    Row("8_rig_list", "8 rig list (process wall)", "ms"),
    Row("8_python", "8 python -c pass (reference)", "ms"),
)

NOTES = {
    "7_open_stop_fresh": "rig: gpu(0).open()+stop() after import; CUDA: cuInit+cuCtxCreate+"
    "cuCtxDestroy; torch/cupy: first CUDA use after import (context made, never destroyed)",
    "7_open_stop_fresh_wall": "whole process from exec to exit, interpreter and imports included",
    "6_alloc_64k": "torch and cupy: their caching allocators (no cudaMalloc after warm-up)",
    "6_alloc_64k_raw": "cupy.cuda.memory.Memory: cudaMalloc+cudaFree",
    "4_h2d_map_host": "rig only: map the caller's pages, copy, unmap, every time",
    "3_launch_flight": "plain launches (not steps/graphs) submitted, then one wait",
}


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---- statistics ----------------------------------------------------------------------------


def summary(row: Row, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` holds samples_s (seconds per operation) and bytes: the value in the row's unit."""
    if "error" in data:
        return {"error": data["error"]}
    s = data.get("samples_s") or []
    if not s:
        return {"error": "no samples"}
    med, lo, hi = statistics.median(s), min(s), max(s)
    if row.unit == "GB/s":
        b = data.get("bytes") or 0
        if not b or lo <= 0:
            return {"error": "no byte count"}
        return {"value": b / med / 1e9, "min": b / hi / 1e9, "max": b / lo / 1e9, "n": len(s)}
    k = 1e6 if row.unit == "us" else 1e3
    return {"value": med * k, "min": lo * k, "max": hi * k, "n": len(s)}


def fmt(v: float | None) -> str:
    if v is None or math.isnan(v):
        return "n/a"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


# ---- shared by the workers -------------------------------------------------------------------


class Recorder:
    """A worker's rows: samples, or the error that ended the row."""

    def __init__(self, scale: float, path: Path) -> None:
        self.scale = scale
        self.path = path
        self.rows: dict[str, dict[str, Any]] = {}
        self.meta: dict[str, Any] = {}

    def save(self) -> None:
        """Write what there is so far (a worker that is killed still leaves its rows)."""
        self.path.write_text(json.dumps({"meta": self.meta, "rows": self.rows}))

    def reps(self, n: int) -> int:
        return max(3, int(n * self.scale))

    def add(self, key: str, samples: list[float], nbytes: int = 0, **extra: Any) -> None:
        self.rows[key] = {"samples_s": samples, "bytes": nbytes, **extra}
        self.save()
        med, lo = statistics.median(samples), min(samples)
        if key[0] in "45":  # the copy rows
            log(f"  {key}: median {nbytes / med / 1e9:.2f} GB/s, best {nbytes / lo / 1e9:.2f} "
                f"GB/s ({len(samples)} samples)")
        else:
            log(f"  {key}: median {med * 1e6:.2f} us, min {lo * 1e6:.2f} us "
                f"({len(samples)} samples)")

    @contextlib.contextmanager
    def row(self, *keys: str) -> Iterator[None]:
        """Run a row: an exception becomes the error of each of ``keys`` not yet recorded."""
        try:
            yield
        except Exception as e:
            msg = f"{type(e).__name__}: {e}"
            tb = traceback.format_exc(limit=6)
            log(f"  {', '.join(keys)}: FAILED: {msg}")
            for k in keys:
                self.rows.setdefault(k, {"error": msg, "traceback": tb})
            self.save()


def timed(fn: Callable[[], object], reps: int, warm: int) -> list[float]:
    for _ in range(warm):
        fn()
    out = []
    clock = time.perf_counter
    for _ in range(reps):
        t = clock()
        fn()
        out.append(clock() - t)
    return out


def flight(fn: Callable[[], object], wait: Callable[[], object], reps: int) -> list[float]:
    """FLIGHT calls of ``fn``, then ``wait()``: seconds per call, ``reps`` times after one
    warm-up round."""
    out = []
    clock = time.perf_counter
    for r in range(reps + 1):
        t = clock()
        for _ in range(FLIGHT):
            fn()
        wait()
        if r:
            out.append((clock() - t) / FLIGHT)
    return out


class Accumulator:
    """c += b, once per kernel, repeated on the host in float32 (the GPU's FADD rounds alike)."""

    def __init__(self, rng: Any) -> None:
        import numpy as np

        self.np = np
        self.c = np.float32(rng.random(dtype=np.float32) * np.float32(4))
        self.b = np.float32(rng.random(dtype=np.float32))
        self.count = 0

    def arrays(self) -> tuple[Any, Any]:
        np = self.np
        return np.array([self.c], dtype=np.float32), np.array([self.b], dtype=np.float32)

    def check(self, got: Any, what: str) -> None:
        np = self.np
        c, b = self.c, self.b
        for _ in range(self.count):
            c = np.float32(c + b)
        self.c, self.count = c, 0
        got = np.float32(got)
        if got.view(np.uint32) != c.view(np.uint32):
            raise AssertionError(f"{what}: the accumulator holds {got!r}, the host computed {c!r}")


def same(got: Any, want: Any, what: str) -> None:
    import numpy as np

    if not np.array_equal(got, want):
        bad = int(np.count_nonzero(got != want))
        raise AssertionError(f"{what}: {bad} bytes differ")


def fresh_bytes(rng: Any, n: int) -> Any:
    import numpy as np

    return np.frombuffer(bytearray(rng.bytes(n)), dtype=np.uint8)


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
        d.free(alloc(n))

    def host(region: Any) -> Any:
        return np.ctypeslib.as_array((ctypes.c_uint8 * region.length).from_address(region.host))

    def read_f32(region: Any) -> Any:
        return np.frombuffer(bytes(d.download(region, 4)), dtype=np.float32)[0]

    fn = None
    ra = rb = rc = None
    with rec.row("1_launch", "2_step64", "2_step1", "3_flight", "3_launch_flight"):
        img = d.load(cubin.read_bytes())
        fn = img["vadd"]
        ra, rb, rc = alloc(4096), alloc(4096), alloc(4096)

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

    with rec.row("3_flight", "3_launch_flight"):
        if one is None:
            raise RuntimeError("no one-kernel step (row 2 failed)")
        acc = Accumulator(rng)
        c0, b0 = acc.arrays()
        d.upload(rc, c0.tobytes())
        d.upload(rb, b0.tobytes()).wait()
        n = rec.reps(8)
        s = flight(one.submit, d.synchronize, n)
        args = (rc, rb, rc, 1)
        sl = flight(lambda: d.launch(fn, (1,), (1,), args), d.synchronize, n)
        acc.count += 2 * (n + 1) * FLIGHT
        acc.check(read_f32(rc), "kernels in flight")
        rec.add("3_flight", s)
        rec.add("3_launch_flight", sl)

    big = big2 = None
    with rec.row("4_h2d_pinned", "4_d2h_pinned"):
        big, big2 = alloc(COPY), alloc(COPY)
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
    with rec.row("4_h2d_pageable", "4_d2h_pageable"):
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

    with rec.row("4_h2d_map_host", "4_d2h_map_host"):
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

    with rec.row("5_d2d"):
        src, dst = fresh_bytes(rng, COPY), np.zeros(COPY, dtype=np.uint8)
        d.upload(big, src).wait()
        s = timed(lambda: d.copy(big2, big).wait(), rec.reps(30), 3)
        d.download(big2, COPY, out=dst)
        same(dst, src, "D2D")
        rec.add("5_d2d", s, COPY)
    src = dst = None

    for key, size, count in (("6_alloc_64k", 64 << 10, 2000), ("6_alloc_64m", 64 << 20, 300)):
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

    with rec.row("7_open_stop_inproc"):
        d.stop()
        s = timed(lambda: rig_nv_nvidia.gpu(0).open().stop(), rec.reps(8), 1)
        rec.add("7_open_stop_inproc", s)


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

    with rec.row("4_h2d_pinned", "4_d2h_pinned"):
        copies(torch.empty(COPY, dtype=torch.uint8, pin_memory=True),
               torch.empty(COPY, dtype=torch.uint8, pin_memory=True),
               "4_h2d_pinned", "4_d2h_pinned")
    with rec.row("4_h2d_pageable", "4_d2h_pageable"):
        copies(torch.from_numpy(np.zeros(COPY, dtype=np.uint8)),
               torch.from_numpy(np.zeros(COPY, dtype=np.uint8)),
               "4_h2d_pageable", "4_d2h_pageable")

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

    for key, size, count in (("6_alloc_64k", 64 << 10, 2000), ("6_alloc_64m", 64 << 20, 300)):
        with rec.row(key):
            s = timed(functools.partial(torch.empty, size, dtype=torch.uint8, device=dev),
                      rec.reps(count), rec.reps(count // 10))
            rec.add(key, s, size)


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

    with rec.row("4_h2d_pinned", "4_d2h_pinned"):
        import cupyx

        copies(cupyx.empty_pinned((COPY,), dtype=np.uint8),
               cupyx.empty_pinned((COPY,), dtype=np.uint8), "4_h2d_pinned", "4_d2h_pinned")
    with rec.row("4_h2d_pageable", "4_d2h_pageable"):
        copies(np.zeros(COPY, dtype=np.uint8), np.zeros(COPY, dtype=np.uint8),
               "4_h2d_pageable", "4_d2h_pageable")

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

    for key, size, count in (("6_alloc_64k", 64 << 10, 2000), ("6_alloc_64m", 64 << 20, 300)):
        with rec.row(key):
            s = timed(functools.partial(cp.cuda.alloc, size), rec.reps(count),
                      rec.reps(count // 10))
            rec.add(key, s, size)
        with rec.row(key + "_raw"):
            s = timed(functools.partial(cp.cuda.memory.Memory, size), rec.reps(count),
                      rec.reps(count // 10))
            rec.add(key + "_raw", s, size)


WORKERS = {"rig": worker_rig, "torch": worker_torch, "cupy": worker_cupy}


def worker(name: str, cubin: Path, scale: float, out: Path) -> int:
    rec = Recorder(scale, out)
    status = 0
    try:
        WORKERS[name](rec, cubin)
    except Exception as e:
        rec.meta["error"] = f"{type(e).__name__}: {e}"
        rec.meta["traceback"] = traceback.format_exc(limit=8)
        log(f"{name}: {rec.meta['error']}")
        status = 1
    rec.save()
    return status


# ---- the harness -------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment with every package's src on PYTHONPATH (kept where already there)."""
    env = dict(os.environ)
    have = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    srcs = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    env["PYTHONPATH"] = os.pathsep.join(have + [p for p in srcs if p not in have])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def sh(cmd: list[str], timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def nvidia_smi(query: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        p = sh([exe, f"--query-gpu={query}", "--format=csv,noheader", "-i", "0"])
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def pick_cubin() -> Path:
    cap = nvidia_smi("compute_cap")
    if cap and "." in cap:
        path = CUBINS / f"kernels.sm_{cap.replace('.', '')}.cubin"
        if path.exists():
            return path
    return CUBINS / "kernels.sm_90.cubin"


def cuda_include_dirs() -> list[str]:
    """Folders with cuda.h: the toolkit's, the system's, or a Python package's (triton ships
    one)."""
    dirs = []
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base:
            dirs.append(f"{base}/include")
    dirs.append("/usr/include")
    for p in sys.path:
        sp = Path(p)
        if sp.is_dir():
            dirs += [str(h.parent) for h in sp.glob("triton/backends/nvidia/include/cuda.h")]
            dirs += [str(h.parent) for h in sp.glob("nvidia/cuda_runtime/include/cuda.h")]
    return [d for d in dict.fromkeys(dirs) if Path(d, "cuda.h").exists()]


def libcuda_args() -> list[list[str]]:
    """Ways to link the driver library: -lcuda, else the driver's libcuda.so.1 by path."""
    ways = [["-lcuda"]]
    for d in ("/usr/local/cuda/lib64/stubs", "/usr/local/cuda/lib64"):
        if Path(d, "libcuda.so").exists():
            ways.append([f"-L{d}", "-lcuda"])
    try:
        listed = sh(["ldconfig", "-p"]).stdout
    except (OSError, subprocess.SubprocessError):
        listed = ""
    for line in listed.splitlines():
        if "libcuda.so.1 " in line and "x86-64" in line and "=>" in line:
            ways.append([line.split("=>")[1].strip()])
    ways += [[p] for p in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1")
             if Path(p).exists()]
    unique: list[list[str]] = []
    for w in ways:
        if w not in unique:
            unique.append(w)
    return unique


def find_nvcc() -> str | None:
    return shutil.which("nvcc") or next(
        (p for p in ("/usr/local/cuda/bin/nvcc",) if Path(p).exists()), None)


def local_cubin(out: Path, cubin: Path) -> tuple[Path | None, str]:
    """kernels.cu compiled here, for a driver older than the committed cubin's nvcc (13.0)."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None, "no nvcc"
    arch = cubin.name.split(".")[1]  # kernels.sm_90.cubin
    dst = out / f"kernels.{arch}.local.cubin"
    try:
        p = sh([nvcc, "-cubin", f"-arch={arch}", "-o", str(dst), str(CUBINS / "kernels.cu")],
               timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"{type(e).__name__}: {e}"
    return (dst, "") if p.returncode == 0 else (None, (p.stderr or p.stdout)[-800:])


def build(out: Path) -> tuple[Path | None, list[dict[str, Any]]]:
    src, exe = ROOT / "bench" / "cuda_bench.c", out / "cuda_bench"
    tries: list[list[str]] = []
    nvcc = find_nvcc()
    links = libcuda_args()
    if nvcc:
        tries += [[nvcc, "-O2", "-o", str(exe), str(src), *link] for link in links]
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        for inc in cuda_include_dirs():
            tries += [[cc, "-O2", "-o", str(exe), str(src), f"-I{inc}", *link] for link in links]
    attempts: list[dict[str, Any]] = []
    for cmd in tries:
        try:
            p = sh(cmd, timeout=120)
            attempts.append({"cmd": " ".join(cmd), "rc": p.returncode,
                             "output": (p.stdout + p.stderr)[-2000:]})
        except (OSError, subprocess.SubprocessError) as e:
            attempts.append({"cmd": " ".join(cmd), "error": f"{type(e).__name__}: {e}"})
            continue
        if p.returncode == 0:
            return exe, attempts
    if not tries:
        attempts.append({"error": "neither nvcc nor cc found"})
    return None, attempts


def run_json(cmd: list[str], timeout: float, env: dict[str, str] | None = None
             ) -> tuple[dict[str, Any] | None, float, str]:
    """Run ``cmd``; its stdout's last line as JSON, its wall seconds, and an error (or "")."""
    t = time.perf_counter()
    try:
        p = sh(cmd, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t, f"timed out after {timeout} s"
    except OSError as e:
        return None, time.perf_counter() - t, f"{type(e).__name__}: {e}"
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return None, wall, f"exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}"
    try:
        lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
        return json.loads(lines[-1]), wall, ""
    except (ValueError, IndexError):
        return None, wall, f"no JSON in its output: {p.stdout[-500:]} {p.stderr[-500:]}"


def run_cuda(exe: Path, cubin: Path, scale: float) -> dict[str, Any]:
    log("CUDA from C ...")
    t = time.perf_counter()
    try:
        p = sh([str(exe), str(cubin), "--scale", str(scale)], timeout=240)
    except (OSError, subprocess.SubprocessError) as e:
        return {"meta": {"error": f"cuda_bench did not run: {type(e).__name__}: {e}"},
                "rows": {}}
    if p.stderr:
        log(p.stderr.rstrip()[-3000:])
    try:
        result: dict[str, Any] = json.loads(p.stdout)
    except ValueError:
        return {"meta": {"error": f"cuda_bench exit {p.returncode}, no JSON: "
                         f"{(p.stderr or p.stdout)[-1500:]}"}, "rows": {}}
    log(f"  done in {time.perf_counter() - t:.1f} s, exit {p.returncode}")
    return result


def fresh_rows(peer: str, exe: Path | None, env: dict[str, str], reps: int
               ) -> dict[str, dict[str, Any]]:
    """Row 7 in fresh processes: the time inside the process, and the process's wall time."""
    scripts = {
        "rig": "import json, time\nt0 = time.perf_counter()\nimport rig_nv_nvidia\n"
               "t1 = time.perf_counter()\nd = rig_nv_nvidia.gpu(0).open()\n"
               "t2 = time.perf_counter()\nd.stop()\nt3 = time.perf_counter()\n"
               "print(json.dumps({'import_s': t1 - t0, 'open_s': t2 - t1, 'stop_s': t3 - t2,"
               " 'total_s': t3 - t1}))",
        "torch": "import json, time\nimport torch\nt1 = time.perf_counter()\n"
                 "x = torch.zeros(1, device='cuda')\ntorch.cuda.synchronize()\n"
                 "print(json.dumps({'total_s': time.perf_counter() - t1}))",
        "cupy": "import json, time\nimport cupy\nt1 = time.perf_counter()\n"
                "x = cupy.zeros(1)\ncupy.cuda.runtime.deviceSynchronize()\n"
                "print(json.dumps({'total_s': time.perf_counter() - t1}))",
    }
    if peer == "cuda":
        if exe is None:
            return {}
        cmd = [str(exe), "--ctx-once"]
    else:
        cmd = [sys.executable, "-c", scripts[peer]]
    inner, walls, details, error = [], [], [], ""
    for i in range(reps + 1):  # the first run warms the file cache
        got, wall, error = run_json(cmd, 120, env)
        if got is None:
            break
        if i:
            inner.append(got["total_s"])
            walls.append(wall)
            details.append(got)
    if error:
        return {"7_open_stop_fresh": {"error": error}, "7_open_stop_fresh_wall": {"error": error}}
    return {"7_open_stop_fresh": {"samples_s": inner, "runs": details},
            "7_open_stop_fresh_wall": {"samples_s": walls}}


def wall_rows(cmd: list[str], env: dict[str, str], reps: int, inner: bool
              ) -> dict[str, Any]:
    """A process run ``reps`` times after one warm-up: its printed seconds (``inner``) or its
    wall time."""
    samples = []
    for i in range(reps + 1):
        t = time.perf_counter()
        try:
            p = sh(cmd, timeout=120, env=env)
        except (OSError, subprocess.SubprocessError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
        wall = time.perf_counter() - t
        if p.returncode != 0:
            return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout)[-1000:]}"}
        if i and not inner:
            samples.append(wall)
        elif i:
            try:
                samples.append(float(p.stdout.split()[-1]))
            except (ValueError, IndexError):
                return {"error": f"no time in its output: {p.stdout[-300:]!r}"}
    return {"samples_s": samples}


def import_rows(peers: list[str], env: dict[str, str], reps: int
                ) -> dict[str, dict[str, dict[str, Any]]]:
    rows: dict[str, dict[str, dict[str, Any]]] = {"rig": {}, "torch": {}, "cupy": {}}
    for module in IMPORTS:
        peer = module if module in ("torch", "cupy") else "rig"
        if peer not in peers:
            continue
        log(f"import {module} ...")
        code = f"import time; t = time.perf_counter(); import {module}; " \
               f"print(time.perf_counter() - t)"
        got = wall_rows([sys.executable, "-c", code], env, reps, inner=True)
        if peer == "rig":
            rows["rig"][f"8_import_{module}"] = got
        if module == IMPORT_OF[peer]:
            rows[peer]["8_import"] = got
    if "rig" in peers:
        log("rig list ...")
        rows["rig"]["8_rig_list"] = wall_rows([sys.executable, "-m", "rig_cli", "list"], env,
                                              reps, inner=False)
        rows["rig"]["8_python"] = wall_rows([sys.executable, "-c", "pass"], env, reps,
                                            inner=False)
    return rows


def ratio_of(row: Row, rig: dict[str, Any], cuda: dict[str, Any]) -> float | None:
    r, c = rig.get("value"), cuda.get("value")
    if r is None or c is None or c == 0:
        return None
    return float(r / c)


def met(row: Row, rig: dict[str, Any], ratio: float | None) -> bool | None:
    if row.target is None:
        return None
    op, limit = row.target
    if op == "ms<=":
        v = rig.get("value")
        return None if v is None else bool(v <= limit)
    if ratio is None:
        return None
    return ratio <= limit if op == "<=" else ratio >= limit


def target_text(row: Row) -> str:
    if row.target is None:
        return "-"
    op, limit = row.target
    if op == "ms<=":
        return f"<= {limit:g} ms"
    return f"{op} {limit}x"


def summarise(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each row: every peer's value, min, max and samples; rig/CUDA and whether it met its
    target."""
    table: dict[str, Any] = {}
    for row in ROWS:
        entry: dict[str, Any] = {"label": row.label, "unit": row.unit,
                                 "target": target_text(row), "peers": {}}
        for peer in PEERS:
            rows = results.get(peer, {}).get("rows", {})
            if row.key == "2_per_kernel":
                t64, t1 = table["2_step64"]["peers"].get(peer), table["2_step1"]["peers"].get(peer)
                if t64 is None and t1 is None:
                    continue
                if t64 and t1 and "value" in t64 and "value" in t1:
                    stats: dict[str, Any] = {"value": (t64["value"] - t1["value"]) / 63,
                                             "min": None, "max": None, "n": 0}
                else:
                    stats = {"error": (t64 or {}).get("error") or (t1 or {}).get("error")}
            elif row.key in rows:
                stats = summary(row, rows[row.key])
                if "error" not in stats:
                    stats["raw"] = rows[row.key]
            else:
                continue
            entry["peers"][peer] = stats
        rig = entry["peers"].get("rig", {})
        if row.cuda_key and "cuda" not in entry["peers"] and row.cuda_key in table:
            # The CUDA row this one is measured against (shown in the CUDA column).
            entry["cuda_reference"] = row.cuda_key
            ref = table[row.cuda_key]["peers"].get("cuda")
            if ref is not None:
                entry["peers"]["cuda"] = {k: v for k, v in ref.items() if k != "raw"}
        cuda = entry["peers"].get("cuda", {})
        entry["ratio"] = ratio_of(row, rig, cuda)
        entry["met"] = met(row, rig, entry["ratio"])
        entry["ratios"] = {p: ratio_of(row, entry["peers"].get(p, {}), cuda)
                           for p in ("rig", "torch", "cupy")}
        table[row.key] = entry
    return table


def print_table(table: dict[str, Any], meta: dict[str, Any]) -> None:
    head = ("row", "rig", "CUDA-C", "torch", "cupy", "rig/CUDA", "target")
    lines = []
    for row in ROWS:
        e = table[row.key]
        if not e["peers"]:
            continue
        cells = [f"{row.label} [{row.unit}]"]
        for peer in PEERS:
            cells.append(fmt(e["peers"].get(peer, {}).get("value")))
        ratio = e["ratio"]
        cells.append("n/a" if ratio is None else f"{ratio:.2f}x")
        flag = {True: " met", False: " MISSED", None: ""}[e["met"]]
        cells.append(e["target"] + (flag if e["target"] != "-" else ""))
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(head, *lines, strict=True)]

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                          for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    print()
    print(f"{meta.get('gpu') or '?'}, driver {meta.get('driver') or '?'}, {meta.get('date')}; "
          f"{meta.get('command')}")
    print(line(head))
    print("-+-".join("-" * w for w in widths))
    for cells in lines:
        print(line(cells))
    sys.stdout.flush()


def plot(table: dict[str, Any], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot: {e}"
    rows = [r for r in ROWS if any(v is not None for v in table[r.key]["ratios"].values())]
    if not rows:
        return "no plot: no ratios"
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    colours = {"rig": "tab:blue", "torch": "tab:orange", "cupy": "tab:green"}
    height = 0.27
    for i, peer in enumerate(("rig", "torch", "cupy")):
        ys, xs = [], []
        for j, r in enumerate(rows):
            v = table[r.key]["ratios"].get(peer)
            if v is not None and v > 0:
                ys.append(j + (i - 1) * height)
                xs.append(v)
        if xs:
            ax.barh(ys, xs, height=height, color=colours[peer], label=f"{peer} / CUDA-C")
    for j, r in enumerate(rows):
        if r.target and r.target[0] in ("<=", ">="):
            ax.plot([r.target[1]] * 2, [j - 0.45, j + 0.45], color="black", lw=2)
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r.label} ({'higher' if r.unit == 'GB/s' else 'lower'} is better)"
                        for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to CUDA from C (black: target)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def harness(args: argparse.Namespace) -> int:
    out = Path(os.environ.get("OUT") or "./bench-out")
    out.mkdir(parents=True, exist_ok=True)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    env = child_env()
    cubin = Path(args.cubin) if args.cubin else pick_cubin()
    started = time.perf_counter()
    smi = nvidia_smi("name,driver_version,memory.total") or ""
    parts = [p.strip() for p in smi.split(",")]
    meta: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": parts[0] if parts and parts[0] else None,
        "driver": parts[1] if len(parts) > 1 else None,
        "memory": parts[2] if len(parts) > 2 else None,
        "host": platform.node(),
        "python": sys.version.split()[0],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "cubin": str(cubin.relative_to(ROOT) if cubin.is_relative_to(ROOT) else cubin),
        "scale": args.scale,
        "notes": NOTES,
    }
    try:
        meta["commit"] = sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"]).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        meta["commit"] = None
    results: dict[str, dict[str, Any]] = {p: {"meta": {}, "rows": {}} for p in PEERS}
    exe = None

    if "cuda" in peers:
        log("building cuda_bench ...")
        exe, attempts = build(out)
        meta["build"] = attempts
        if exe is None:
            results["cuda"]["meta"]["error"] = "cuda_bench did not build: " + (
                attempts[-1].get("output") or attempts[-1].get("error", "?"))[-800:]
            log(results["cuda"]["meta"]["error"])
        else:
            results["cuda"] = run_cuda(exe, cubin, args.scale)
            err = str(results["cuda"].get("rows", {}).get("1_launch", {}).get("error", ""))
            if "cuModuleLoadData" in err:
                # The driver refuses the committed cubin (nvcc 13.0): CUDA and CuPy run the
                # same kernels.cu compiled here instead; rig keeps the committed cubin.
                log(f"the driver refused {cubin.name}; compiling kernels.cu here ...")
                cuda_cubin, why = local_cubin(out, cubin)
                if cuda_cubin is None:
                    meta["cuda_cubin_error"] = why
                else:
                    again = run_cuda(exe, cuda_cubin, args.scale)
                    again.setdefault("meta", {})["first_try"] = err
                    results["cuda"] = again
                    meta["cuda_cubin"] = str(cuda_cubin)

    for peer in ("rig", "torch", "cupy"):
        if peer not in peers:
            continue
        log(f"{peer} ...")
        path = out / f"worker-{peer}.json"
        path.unlink(missing_ok=True)
        use = Path(meta["cuda_cubin"]) if peer == "cupy" and "cuda_cubin" in meta else cubin
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", peer, "--cubin",
               str(use), "--scale", str(args.scale), "--json", str(path)]
        t = time.perf_counter()
        try:
            p = sh(cmd, timeout=240, env=env)
            tail = (p.stderr or "")[-6000:]
            err = "" if p.returncode == 0 else f"worker exit {p.returncode}: {tail[-1500:]}"
        except subprocess.TimeoutExpired as e:
            raw = e.stderr or b""
            tail = (raw.decode(errors="replace") if isinstance(raw, bytes) else raw)[-6000:]
            err = "worker timed out after 240 s"
        log(tail.rstrip())
        log(f"  done in {time.perf_counter() - t:.1f} s")
        try:
            results[peer] = json.loads(path.read_text())
        except (OSError, ValueError):
            results[peer] = {"meta": {}, "rows": {}}
        if err:
            results[peer]["meta"].setdefault("error", err)

    reps = max(3, int(5 * args.scale))
    for peer in peers:
        if peer in PEERS:
            log(f"{peer}: open+stop in fresh processes ...")
            results[peer]["rows"].update(fresh_rows(peer, exe, env, reps))
    for peer, rows in import_rows(peers, env, reps).items():
        results[peer]["rows"].update(rows)

    table = summarise(results)
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["peers"] = {p: results[p].get("meta", {}) for p in PEERS}
    meta["plot"] = plot(table, out / "bench.png")
    (out / "bench.json").write_text(json.dumps({"meta": meta, "rows": table}, indent=1,
                                               default=str))
    for peer in PEERS:
        if results[peer].get("meta", {}).get("error"):
            log(f"{peer}: {results[peer]['meta']['error'][:300]}")
    log(f"wrote {out / 'bench.json'}; plot: {meta['plot']}; {meta['seconds']} s")
    print_table(table, meta)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every repetition count")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated: rig,cuda,torch,cupy")
    ap.add_argument("--cubin", help="the cubin (default: kernels.sm_XY.cubin of GPU 0)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.scale <= 0:
        ap.error("--scale must be positive")
    if args.worker:
        return worker(args.worker, Path(args.cubin), args.scale, Path(args.json))
    return harness(args)


if __name__ == "__main__":
    sys.exit(main())
