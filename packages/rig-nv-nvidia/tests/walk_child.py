"""The child processes of test_gpu_walks.py: ``python walk_child.py MODE [ARG]``.

Each mode does its work on GPU 0 through the kernel driver and prints one line
``RESULT <json>`` that the test reads. The process's files and mappings are compared before and
after with what the spec lets stay for the process (the control file and RM client, UVM's two
files and the reservation from 384 GiB to 2^40, each GPU's file): ``leaks()``.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# numpy's import starts OpenBLAS's threads, whose stacks' guard pages would read as leaked
# mappings: it comes before any snapshot.
import numpy  # noqa: F401

CUBIN = Path(__file__).resolve().parents[2] / "rig-nv" / "tests" / "cubins" / "kernels.sm_90.cubin"
RESERVATION = (384 << 30, 1 << 40)

Snapshot = tuple[set[int], set[tuple[int, int, str, str]]]


def fds() -> set[int]:
    """The process's open files (the directory listing's own file left out)."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        out.add(int(name))
    return out


def maps() -> set[tuple[int, int, str, str]]:
    """The mappings a path could leak: the driver's files, shared ones, inaccessible anonymous
    ranges (GPU address reservations), and anything inside the client's reservation. Python's
    own heap (private, readable) comes and goes and is left out."""
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            perms, path = fields[1], (fields[5] if len(fields) > 5 else "")
            inside = RESERVATION[0] <= lo < RESERVATION[1]
            if inside or "nvidia" in path or perms.endswith("s") or (
                    perms == "---p" and not path):
                out.add((lo, hi, perms, path))
    return out


def snapshot() -> Snapshot:
    return fds(), maps()


def kept() -> Snapshot:
    """What the spec lets stay for the process, as made so far."""
    from rig_nv_nvidia.driver import PROCESS

    files: set[int] = set()
    mapped: set[tuple[int, int, str, str]] = set()
    if PROCESS.rm is not None:
        files.add(PROCESS.rm.ctl)
    if PROCESS.uvm is not None and PROCESS.uvm_mm is not None:
        files |= {PROCESS.uvm, PROCESS.uvm_mm}
        mapped.add((RESERVATION[0], RESERVATION[1], "---p", ""))
    files |= {g.fd for g in PROCESS.gpus.values()}
    return files, mapped


def leaks(before: Snapshot) -> dict[str, list[Any]]:
    """Files and mappings the process holds now beyond ``before`` and what stays."""
    now_fds, now_maps = snapshot()
    stay_fds, stay_maps = kept()
    return {"fds": sorted(now_fds - before[0] - stay_fds),
            "maps": [f"{lo:x}-{hi:x} {p} {path}" for lo, hi, p, path in
                     sorted(now_maps - before[1] - stay_maps)]}


def site(stack: traceback.StackSummary) -> str:
    return ">".join(f.name for f in stack if "/rig_nv" in f.filename)[-160:]


def _recorder(sites: list[str]) -> Callable[[str], BaseException]:
    from rig_nv import inject

    def make(kind: str) -> BaseException:
        sites.append(site(traceback.extract_stack()))
        return inject.injected_eio(kind)
    return make


def result(**values: Any) -> None:
    print("RESULT " + json.dumps(values), flush=True)


# -- the work the walks fail ---------------------------------------------------------------------

def _work(name: str, d: Any, img: Any) -> Callable[[], Any]:
    from rig_edge import Memory

    def launch() -> None:
        r = d.alloc(1 << 16, Memory.DEVICE)
        try:
            d.upload(r, bytes(1 << 16))
            d.launch(img["local_array"], (1,), (32,), (r, r, r, 32)).wait()
        finally:
            d.free(r)

    def alloc(kind: Memory, n: int) -> Callable[[], None]:
        def go() -> None:
            r = d.alloc(n, kind)
            if r is not None:
                d.free(r)
        return go

    return {"alloc-device-4k": alloc(Memory.DEVICE, 4096),
            "alloc-device-4m": alloc(Memory.DEVICE, 4 << 20),
            "alloc-pinned": alloc(Memory.PINNED, 8192),
            "alloc-mapped": alloc(Memory.MAPPED, 2 << 20),
            "load": lambda: d.load(CUBIN.read_bytes()),
            "launch-local-memory": launch}[name]


WORKS = ("alloc-device-4k", "alloc-device-4m", "alloc-pinned", "alloc-mapped", "load",
         "launch-local-memory")


def _check_device(d: Any) -> bool:
    """A vadd of fresh random data, compared with numpy."""
    import numpy as np

    from rig_edge import Memory

    img = d.load(CUBIN.read_bytes())
    a, b = (np.random.default_rng().random(4096, dtype=np.float32) for _ in range(2))
    ra, rb, rc = (d.alloc(a.nbytes, Memory.DEVICE) for _ in range(3))
    d.upload(ra, a.tobytes())
    d.upload(rb, b.tobytes())
    d.launch(img["vadd"], (16,), (256,), (ra, rb, rc, a.size)).wait()
    got = np.frombuffer(bytes(d.download(rc)), dtype=np.float32)
    return bool(np.array_equal(got, a + b))


# -- modes ---------------------------------------------------------------------------------------

def mode_count() -> None:
    """How many fallible calls the process's first open makes, and where."""
    import rig_nv_nvidia
    from rig_nv import inject

    with inject.counting(sites=True) as first:
        d = rig_nv_nvidia.gpu(0).open()
    d.stop()
    assert first.sites is not None
    result(first=[f"{k} {site(s)}" for k, s in zip(first.calls, first.sites, strict=True)])


def mode_first(n: int) -> None:
    """Fail the n-th call of the process's first open."""
    import rig_nv_nvidia
    from rig_edge import OpenRefused
    from rig_nv import inject

    before = snapshot()
    sites: list[str] = []
    other = ""
    with inject.fail_at(n, _recorder(sites)) as shot:
        try:
            rig_nv_nvidia.gpu(0).open().stop()
        except OpenRefused as e:
            if not inject.caused_by(e, shot.raised):
                other = repr(e)
        except BaseException as e:  # anything else escaping is the finding
            other = "".join(traceback.format_exception(e))
    after_failure = leaks(before)
    d = rig_nv_nvidia.gpu(0).open()
    works = _check_device(d)
    d.stop()
    result(fired=shot.fired, site=sites[0] if sites else "", other=other,
           leaks=after_failure, reopened=works, leaks_after_reopen=leaks(before))


def _walk(what: str, cases: list[dict[str, Any]], base: list[Snapshot],
          setup: Callable[[], Any], work: Callable[[Any], Any],
          cleanup: Callable[[Any], bool]) -> None:
    """Count the calls of ``work(setup())``, then fail each in turn; after each, ``cleanup``
    (which says whether the device still worked) and the leaks since the last case."""
    from rig_edge import RigError
    from rig_nv import inject
    from rig_nv_nvidia.driver import PROCESS

    s = setup()
    with inject.counting() as seen:
        work(s)
    cleanup(s)
    base[0] = snapshot()
    for n in range(1, len(seen.calls) + 1):
        s = setup()
        sites: list[str] = []
        other = ""
        with inject.fail_at(n, _recorder(sites)) as shot:
            try:
                work(s)
            except RigError as e:
                other = "" if inject.caused_by(e, shot.raised) else repr(e)
            except BaseException as e:  # anything else escaping is the finding
                other = "".join(traceback.format_exception(e))
        try:
            usable = cleanup(s)
        except BaseException as e:  # the GPU no longer opens or works: this case's finding,
            usable = False          # the walk goes on to the next
            other += "cleanup: " + "".join(traceback.format_exception(e))
        stuck = any(g.device_open for g in PROCESS.gpus.values())
        for g in PROCESS.gpus.values():
            g.device_open = False  # a failed stop's known leak: unmark it to walk on
        cases.append({"what": what, "n": n, "calls": len(seen.calls), "fired": shot.fired,
                      "site": sites[0] if sites else "", "other": other, "stuck": stuck,
                      "usable": usable, "leaks": leaks(base[0])})
        base[0] = snapshot()


def _reopens(_: Any) -> bool:
    """Whether GPU 0 opens again and runs a vadd correctly."""
    import rig_nv_nvidia

    d = rig_nv_nvidia.gpu(0).open()
    try:
        return _check_device(d)
    finally:
        d.stop()


def mode_again() -> None:
    """After one good open: fail each call of an open, of stop and of each work, in turn."""
    import rig_nv_nvidia

    rig_nv_nvidia.gpu(0).open().stop()
    start = snapshot()
    free_before = rig_nv_nvidia.usage(0).memory_free
    cases: list[dict[str, Any]] = []
    base = [start]

    def nothing() -> None:
        return None

    def open_stop(_: Any) -> None:
        rig_nv_nvidia.gpu(0).open().stop()

    reopens = _reopens
    _walk("open", cases, base, nothing, open_stop, reopens)
    _walk("stop", cases, base, lambda: rig_nv_nvidia.gpu(0).open(), lambda d: d.stop(),
          reopens)
    for name in WORKS:
        def loaded() -> tuple[Any, Any]:
            d = rig_nv_nvidia.gpu(0).open()
            return d, d.load(CUBIN.read_bytes())

        def work(s: tuple[Any, Any], name: str = name) -> None:
            _work(name, *s)()

        def stop(s: tuple[Any, Any]) -> bool:
            try:
                return _check_device(s[0])
            finally:
                s[0].stop()

        _walk(name, cases, base, loaded, work, stop)
    result(cases=cases, reopened=reopens(None), leaks_at_end=leaks(start),
           memory_free_change=rig_nv_nvidia.usage(0).memory_free - free_before)


def mode_queues() -> None:
    """After one good open: fail each call of the stop of a device with two queues (one with
    work done), then of a queue's stop, after which the device's stop gives back the rest."""
    import rig_nv_nvidia
    from rig_edge import Memory

    rig_nv_nvidia.gpu(0).open().stop()
    start = snapshot()
    cases: list[dict[str, Any]] = []
    base = [start]

    def with_queues() -> tuple[Any, Any]:
        d = rig_nv_nvidia.gpu(0).open()
        try:
            first, second = d.queue(), d.queue()
            r = d.alloc(1 << 16, Memory.DEVICE)
            second.upload(r, bytes(r.length))
            second.copy(r, r, 4096, dst_offset=8192).wait()
        except BaseException:
            d.stop()
            raise
        return d, (first, second)

    def device_stop_then_reopens(s: tuple[Any, Any]) -> bool:
        s[0].stop()
        return _reopens(None)

    _walk("stop-queues", cases, base, with_queues, lambda s: s[0].stop(), _reopens)
    _walk("queue-stop", cases, base, with_queues, lambda s: s[1][1].stop(),
          device_stop_then_reopens)
    result(cases=cases, reopened=_reopens(None), leaks_at_end=leaks(start))


def mode_rlimit(which: str, extra: int) -> None:
    """Open with RLIMIT_NOFILE at the files open + ``extra``, or RLIMIT_AS at the address space
    now + ``extra`` MiB; ``first`` in the name: before any open of this process."""
    import rig_nv_nvidia
    import rig_nv_nvidia.listing  # before the limit: an import takes files
    from rig_edge import OpenRefused

    if not which.endswith("first"):
        rig_nv_nvidia.gpu(0).open().stop()
    before = snapshot()
    limit = resource.RLIMIT_NOFILE if which.startswith("nofile") else resource.RLIMIT_AS
    soft, hard = resource.getrlimit(limit)
    if limit == resource.RLIMIT_NOFILE:
        resource.setrlimit(limit, (max(before[0]) + 1 + extra, hard))
    else:
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) for line in f if line.startswith("VmSize:")) * 1024
        resource.setrlimit(limit, (vm + (extra << 20), hard))
    refused, other = "", ""
    try:
        rig_nv_nvidia.gpu(0).open().stop()
    except OpenRefused as e:
        refused = str(e)
    except BaseException as e:
        other = "".join(traceback.format_exception(e))
    resource.setrlimit(limit, (soft, hard))
    after = leaks(before)
    d = rig_nv_nvidia.gpu(0).open()
    works = _check_device(d)
    d.stop()
    result(refused=refused, other=other, leaks=after, reopened=works)


def mode_inflight(stage: str) -> None:
    """``stop``: stop with copies in flight, then open again in this process; ``exit``: leave
    the process with an open device and work in flight; ``after``: open and run a kernel."""
    import rig_nv_nvidia
    from rig_edge import Memory

    d = rig_nv_nvidia.gpu(0).open()
    if stage == "after":
        result(works=_check_device(d))
        d.stop()
        return
    a, b = d.alloc(256 << 20, Memory.DEVICE), d.alloc(256 << 20, Memory.DEVICE)
    last = None
    for _ in range(200):
        last = d.copy(b, a)
    assert last is not None
    in_flight = not last.signaled
    if stage == "exit":
        result(in_flight=in_flight)
        sys.exit(0)
    if stage == "exit-hard":  # no atexit, no finalizers: the kernel driver cleans up alone
        result(in_flight=in_flight)
        os._exit(0)
    d.stop()
    d = rig_nv_nvidia.gpu(0).open()
    works = _check_device(d)
    d.stop()
    result(in_flight=in_flight, works=works)


def mode_stress(seconds: float) -> None:
    """8 threads of alloc/upload/launch/wait/download/free checked against numpy; then threads
    racing to open the GPU, at most one holding it at a time."""
    import numpy as np

    import rig_nv_nvidia
    from rig_edge import Memory, OpenRefused

    d = rig_nv_nvidia.gpu(0).open()
    img = d.load(CUBIN.read_bytes())
    errors: list[str] = []
    rounds = [0] * 8
    end = time.monotonic() + seconds

    def worker(i: int) -> None:
        rng = np.random.default_rng(i)
        try:
            while time.monotonic() < end:
                n = int(rng.integers(1, 1 << 20))
                a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
                kind = (Memory.DEVICE, Memory.PINNED, Memory.MAPPED)[int(rng.integers(3))]
                ra, rb, rc = (d.alloc(4 * n, kind) for _ in range(3))
                d.upload(ra, a.tobytes())
                d.upload(rb, b.tobytes())
                d.launch(img["vadd"], ((n + 255) // 256,), (256,), (ra, rb, rc, n)).wait()
                got = np.frombuffer(bytes(d.download(rc)), dtype=np.float32)
                if not np.array_equal(got, a + b):
                    errors.append(f"thread {i} round {rounds[i]}: wrong sums ({kind}, {n})")
                for r in (ra, rb, rc):
                    d.free(r)
                rounds[i] += 1
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    d.stop()

    lock = threading.Lock()
    holding = [0]
    most = [0]
    wins = [0]
    refusals = [0]
    race_end = time.monotonic() + min(seconds, 5.0)

    def opener() -> None:
        try:
            while time.monotonic() < race_end:
                try:
                    dev = rig_nv_nvidia.gpu(0).open()
                except OpenRefused as e:
                    if "open and not stopped" not in str(e):
                        errors.append(f"open refused otherwise: {e}")
                    refusals[0] += 1
                    continue
                with lock:
                    holding[0] += 1
                    most[0] = max(most[0], holding[0])
                    wins[0] += 1
                time.sleep(0.001)
                with lock:
                    holding[0] -= 1
                dev.stop()
        except BaseException:
            errors.append(traceback.format_exc())

    racers = [threading.Thread(target=opener) for _ in range(6)]
    for t in racers:
        t.start()
    for t in racers:
        t.join()
    result(errors=errors[:20], rounds=rounds, most_open=most[0], wins=wins[0],
           refusals=refusals[0])


def mode_interrupt() -> None:
    """SIGINT during a long wait: the wait raises KeyboardInterrupt; the device is not lost,
    the next wait completes, every value completes in order and the bytes are right."""
    import numpy as np

    import rig_nv_nvidia
    from rig_edge import Memory

    d = rig_nv_nvidia.gpu(0).open()
    n = 256 << 20
    src, dst = d.alloc(n, Memory.DEVICE), d.alloc(n, Memory.DEVICE)
    pattern = np.random.default_rng().integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    for off in range(0, n, len(pattern)):
        d.upload(src, pattern, off)
    d.synchronize()
    points = [d.copy(dst, src) for _ in range(10000)]
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    interrupted = False
    try:
        points[-1].wait()
    except KeyboardInterrupt:
        interrupted = True
    done_at_interrupt = d.completed()
    points[-1].wait(timeout_s=120)
    values = [p.value for p in points]
    in_order = all(p.signaled for p in points) and all(
        a < b for a, b in itertools.pairwise(values))
    after = d.copy(src, dst)
    after.wait()
    got = bytes(d.download(dst, 1 << 20, n - (1 << 20)))
    result(interrupted=interrupted, done_at_interrupt=done_at_interrupt,
           last=points[-1].value, completed=d.completed(), in_order=in_order,
           bytes_right=got == pattern, works=_check_device(d))
    d.stop()


def main() -> None:
    mode = sys.argv[1]
    if mode == "count":
        mode_count()
    elif mode == "first":
        mode_first(int(sys.argv[2]))
    elif mode == "again":
        mode_again()
    elif mode == "queues":
        mode_queues()
    elif mode == "rlimit":
        mode_rlimit(sys.argv[2], int(sys.argv[3]))
    elif mode == "inflight":
        mode_inflight(sys.argv[2])
    elif mode == "stress":
        mode_stress(float(sys.argv[2]))
    elif mode == "interrupt":
        mode_interrupt()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
