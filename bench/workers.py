"""The benchmark's workers, each run in a process of its own by ``bench/run.py --worker NAME``:
rig, PyTorch and CuPy time every row they can, check every copy and kernel against fresh random
data before a sample counts, and write the samples (or the error that ended a row) as JSON for
the harness in run.py."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

COPY = 256 << 20
FLIGHT = 10_000
# Row 9 (issue 10): 256 MiB between GPU 0 and GPU 1, each way. rig times each engine as a row of
# its own (9') and reports the better one as 9; CUDA and torch have the two unprimed rows.
PEER_ROWS = ("9_peer_01", "9_peer_10")
PEER_ENGINES = (("copy", "ce"), ("sm", "sm"))  # rig's engine=, and the key's suffix
PEER_KEYS = (*PEER_ROWS, *(f"{k}_{tag}" for k in PEER_ROWS for _, tag in PEER_ENGINES))


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


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
        if key[0] in "459":  # the copy rows
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

    def skip(self, keys: tuple[str, ...], why: str) -> None:
        """Rows that cannot run on this machine: n/a with the reason."""
        for k in keys:
            self.rows[k] = {"error": why, "skipped": True}
        log(f"  {', '.join(keys)}: n/a: {why}")
        self.save()


def too_few_gpus(count: int) -> str | None:
    """Why the peer rows cannot run with ``count`` GPUs, or None where they can."""
    if count >= 2:
        return None
    return "one GPU here" if count == 1 else f"{count} GPUs here, the peer rows need two"


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

    with rec.row(*PEER_KEYS):
        peers_rig(rec, d, rng)

    with rec.row("7_open_stop_inproc"):
        d.stop()
        s = timed(lambda: rig_nv_nvidia.gpu(0).open().stop(), rec.reps(8), 1)
        rec.add("7_open_stop_inproc", s)


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
    with rec.row(key):
        done = {engine: rec.rows[f"{key}_{tag}"] for engine, tag in PEER_ENGINES
                if "samples_s" in rec.rows.get(f"{key}_{tag}", {})}
        if not done:
            raise RuntimeError("; ".join(
                f"{engine}: {rec.rows.get(f'{key}_{tag}', {}).get('error', 'not run')}"
                for engine, tag in PEER_ENGINES))
        engine = min(done, key=lambda e: statistics.median(done[e]["samples_s"]))
        rec.add(key, list(done[engine]["samples_s"]), COPY, engine=engine)


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

    with rec.row(*PEER_ROWS):
        peers_torch(rec, rng)


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
