"""``rig check``: open a GPU, move fresh random data both ways, run a built-in kernel, compare.

Every step's data is new random bytes (numpy's generator where numpy imports, ``os.urandom``
otherwise) and every result is compared byte for byte with what the host holds or computes.
The built-in kernel is ``vadd`` (``c[i] = a[i] + b[i]`` on 32-bit unsigned integers, so the
host's sum is exact), shipped as one cubin per architecture in ``rig_cli/kernels``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from typing import TYPE_CHECKING

from rig_cli.show import duration, rate, size
from rig_edge import Memory, Misuse, Region, RigError

if TYPE_CHECKING:
    from rig_nv import Device

OK, FAILURE, REFUSED = 0, 1, 4
KERNEL_ELEMENTS = 1 << 20  # 4 MiB per vector
BLOCK = 256
TIMED_LAUNCHES = 100
REPEATS = 3  # each transfer, with fresh data each time; the best time is reported


@dataclass
class Step:
    """One line of the report: what ran, whether its result matched, and how long it took."""

    step: str
    ok: bool
    seconds: float
    nbytes: int = 0
    detail: str = ""


def kernel_archs() -> list[str]:
    """The architectures whose built-in cubin ships with rig (``["sm_80", ...]``)."""
    names = [p.name for p in resources.files("rig_cli").joinpath("kernels").iterdir()]
    found = [n[len("vadd."):-len(".cubin")] for n in names
             if n.startswith("vadd.") and n.endswith(".cubin")]
    return sorted(found, key=lambda a: int(a[3:]))


def kernel_for(arch: str) -> bytes | None:
    """The built-in vadd cubin for ``arch``, or ``None`` where rig ships none."""
    item = resources.files("rig_cli").joinpath("kernels", f"vadd.{arch}.cubin")
    return item.read_bytes() if item.is_file() else None


def random_source() -> tuple[str, Callable[[int], bytes]]:
    """(name, function giving n fresh random bytes): numpy's generator if numpy imports."""
    try:
        import numpy as np
    except ImportError:
        return "os.urandom", os.urandom
    rng = np.random.default_rng()
    return "numpy", rng.bytes


def vadd_on_host(a: bytes, b: bytes) -> bytes:
    """The sums the kernel must produce: little-endian u32, wrapping modulo 2^32."""
    try:
        import numpy as np
    except ImportError:
        x, y = array("I", a), array("I", b)
        if sys.byteorder != "little":
            x.byteswap()
            y.byteswap()
        out = array("I", [(p + q) & 0xFFFFFFFF for p, q in zip(x, y, strict=True)])
        if sys.byteorder != "little":
            out.byteswap()
        return out.tobytes()
    return bytes((np.frombuffer(a, "<u4") + np.frombuffer(b, "<u4")).astype("<u4").tobytes())


def first_difference(got: bytes | memoryview, want: bytes) -> int | None:
    """The offset of the first byte where ``got`` and ``want`` differ, or ``None``."""
    got = bytes(got)
    if got == want:
        return None
    if len(got) != len(want):
        return min(len(got), len(want))
    chunk = 1 << 16
    for at in range(0, len(want), chunk):
        if got[at : at + chunk] != want[at : at + chunk]:
            return next(at + i for i, (p, q) in enumerate(
                zip(got[at : at + chunk], want[at : at + chunk], strict=True)) if p != q)
    return None


def _matched(got: bytes | memoryview, want: bytes) -> tuple[bool, str]:
    at = first_difference(got, want)
    return (True, "") if at is None else (False, f"first difference at byte {at}")


def _alloc(d: Device, n: int, kind: Memory) -> Region:
    region = d.alloc(n, kind)
    if region is None:
        raise RigError(f"{d.facts.name} ({d.facts.bus}): no {size(n)} of {kind.value} memory "
                       "left for the check (try a smaller --size)")
    return region


class Report:
    """Prints each step as it finishes (or keeps them for ``--json``)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.steps: list[Step] = []

    def add(self, step: Step) -> None:
        self.steps.append(step)
        if self.as_json:
            return
        what = f"  {step.step:<34}"
        if step.nbytes:
            what += f"{size(step.nbytes):>8}  {rate(step.nbytes, step.seconds):>12}"
        else:
            what += f"{'':>8}  {duration(step.seconds):>12}"
        verdict = "ok" if step.ok else "FAILED"
        print(f"{what}  {verdict}{'  ' + step.detail if step.detail else ''}", flush=True)


def _transfer(label: str, n: int, random: Callable[[int], bytes],
              move: Callable[[bytes], tuple[float, bytes | memoryview]], report: Report) -> None:
    """Run ``move`` (fresh data in → seconds it took, the bytes that came out) :data:`REPEATS`
    times, each checked; report the best time (the first pays for first-use costs)."""
    best, ok, why = float("inf"), True, ""
    for _ in range(REPEATS):
        data = random(n)
        seconds, got = move(data)
        best = min(best, seconds)
        matched, detail = _matched(got, data)
        if not matched and ok:
            ok, why = False, detail
    report.add(Step(label, ok, best, n, why))


def copies(d: Device, n: int, random: Callable[[int], bytes], report: Report) -> None:
    """Host → Device and back through the device's staging, then the copy engine between
    Device and Pinned memory, each way, each time with fresh data."""
    dev = _alloc(d, n, Memory.DEVICE)
    pinned = _alloc(d, n, Memory.PINNED)

    def timed(op: Callable[[], object]) -> float:
        t = time.perf_counter()
        op()
        return time.perf_counter() - t

    def upload(data: bytes) -> tuple[float, memoryview]:
        return timed(lambda: d.upload(dev, data).wait()), d.download(dev, n)

    def download(data: bytes) -> tuple[float, memoryview]:
        d.upload(dev, data).wait()
        got: list[memoryview] = []
        return timed(lambda: got.append(d.download(dev, n))), got[0]

    def to_device(data: bytes) -> tuple[float, memoryview]:
        d.upload(pinned, data).wait()  # host-visible: written in place
        return timed(lambda: d.copy(dev, pinned, n).wait()), d.download(dev, n)

    def to_pinned(data: bytes) -> tuple[float, memoryview]:
        d.upload(dev, data).wait()
        return timed(lambda: d.copy(pinned, dev, n).wait()), d.download(pinned, n)

    _transfer("upload   host → Device", n, random, upload, report)
    _transfer("download Device → host", n, random, download, report)
    _transfer("copy     Pinned → Device (engine)", n, random, to_device, report)
    _transfer("copy     Device → Pinned (engine)", n, random, to_pinned, report)
    d.free(dev)
    d.free(pinned)


def kernel(d: Device, cubin: bytes, random: Callable[[int], bytes], report: Report) -> None:
    """Launch vadd on fresh vectors and compare with the host's sums; then time launch+wait."""
    n = KERNEL_ELEMENTS
    a, b = random(4 * n), random(4 * n)
    ra, rb, rc = (_alloc(d, 4 * n, Memory.DEVICE) for _ in range(3))
    d.upload(ra, a)
    d.upload(rb, b).wait()
    t = time.perf_counter()
    image = d.load(cubin)
    loaded = time.perf_counter() - t
    fn = image["vadd"]
    grid = ((n + BLOCK - 1) // BLOCK,)
    t = time.perf_counter()
    d.launch(fn, grid, (BLOCK,), (ra, rb, rc, n)).wait()
    first = time.perf_counter() - t
    ok, why = _matched(d.download(rc, 4 * n), vadd_on_host(a, b))
    report.add(Step(f"load     vadd.{d.arch}.cubin", True, loaded))
    report.add(Step(f"launch   vadd, {n} u32, first", ok, first, 0, why))
    times = []
    for _ in range(TIMED_LAUNCHES):
        t = time.perf_counter()
        d.launch(fn, grid, (BLOCK,), (ra, rb, rc, n)).wait()
        times.append(time.perf_counter() - t)
    ok, why = _matched(d.download(rc, 4 * n), vadd_on_host(a, b))
    report.add(Step(f"launch+wait, median of {TIMED_LAUNCHES}", ok, statistics.median(times), 0,
                    why))


def run_check(index: int, *, size_mib: int, as_json: bool) -> int:
    import rig_nv_nvidia

    if size_mib <= 0:
        raise Misuse(f"--size must be a positive number of MiB, not {size_mib}")
    n = size_mib << 20
    source, random = random_source()
    report = Report(as_json)
    t = time.perf_counter()
    d = rig_nv_nvidia.gpu(index).open()
    opened = time.perf_counter() - t
    f = d.facts
    refused = ""
    try:
        if not as_json:
            print(f"rig check: GPU {index} ({f.name}) at {f.bus}: {f.arch}, driver {f.driver}; "
                  f"fresh random data from {source} each time, copies timed best of {REPEATS}",
                  flush=True)
        report.add(Step("open", True, opened))
        copies(d, n, random, report)
        cubin = kernel_for(f.arch)
        if cubin is None:
            refused = (f"{f.name} ({f.bus}): rig has no built-in kernel for {f.arch} "
                       f"(it has {', '.join(kernel_archs())}), so the kernel was not checked")
        else:
            kernel(d, cubin, random, report)
    finally:
        t = time.perf_counter()
        d.stop()
        stopped = time.perf_counter() - t
    report.add(Step("stop", True, stopped))
    passed = all(s.ok for s in report.steps)
    code = OK if passed and not refused else FAILURE if not passed else REFUSED
    if as_json:
        print(json.dumps({"index": index, "name": f.name, "bus": f.bus, "arch": f.arch,
                          "driver": f.driver, "random": source, "ok": code == OK,
                          "refused": refused or None,
                          "steps": [asdict(s) for s in report.steps]}, indent=2))
    elif passed and not refused:
        print(f"GPU {index} passed every check.")
    if refused:
        print(f"rig: {refused}.", file=sys.stderr)
    if not passed:
        failed = "; ".join(" ".join(s.step.split()) for s in report.steps if not s.ok)
        print(f"rig: GPU {index} failed the check ({failed}): its results differ from the "
              "host's.", file=sys.stderr)
    return code
