"""Does the way the kernel path allocates and maps Device memory slow rig's copy kernel? The
same kernel runs at ~1.8 TB/s on cuMemAlloc memory under CUDA (under_cuda.c) and ~1.4 TB/s
launched by rig on rig's memory. Allocates 2 x 256 MiB through the path with one thing changed
per variant (UVM's caching type for the mapping, the RM allocation's flags, its kind), copies
between them with rig's copy kernel (checked byte-exact through ordinary regions), and prints
GB/s (median of 20). An experiment, not a test.

    python3 scripts/copy_variants/mapping.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

import rig_nv_nvidia
import rig_nv_nvidia.path as kpath
from rig_edge import Memory
from rig_nv.copies import kernel_copy

N = 256 << 20


@contextmanager
def caching(kind: int) -> Iterator[None]:
    """UVM_MAP_EXTERNAL_ALLOCATION's gpuCachingType (uvm_types.h: 0 default, 1 force
    uncached, 2 force cached) for every mapping made meanwhile."""
    real = kpath.cnew

    def cnew(ffi, ctype, init=None):  # type: ignore[no-untyped-def]
        p = real(ffi, ctype, init) if init is not None else real(ffi, ctype)
        if ctype.startswith("UVM_MAP_EXTERNAL_ALLOCATION_PARAMS"):
            p.perGpuAttributes[0].gpuCachingType = kind
        return p

    kpath.cnew = cnew
    try:
        yield
    finally:
        kpath.cnew = real


@contextmanager
def patched(name: str, value: int) -> Iterator[None]:
    real = getattr(kpath, name)
    setattr(kpath, name, value)
    try:
        yield
    finally:
        setattr(kpath, name, real)


@contextmanager
def nothing() -> Iterator[None]:
    yield


VARIANTS: list[tuple[str, Callable[[], object]]] = [
    ("as rig does", nothing),
    ("UVM caching: force cached", lambda: caching(2)),
    ("UVM caching: force uncached", lambda: caching(1)),
    ("no PERSISTENT_VIDMEM flag", lambda: patched("PERSISTENT_VIDMEM", 0)),
    ("kind 0 (pitch)", lambda: patched("KIND_GENERIC", 0)),
    ("attr2 GPU_CACHEABLE default", lambda: patched("ATTR2_GPU_CACHED", 0x1)),
    ("contiguous", nothing),
    ("as rig does, again", nothing),
]


def main() -> int:
    d = rig_nv_nvidia.gpu(0).open()
    rng = np.random.default_rng()
    data = rng.bytes(N)
    src, out = d.alloc(N), d.alloc(N)
    d.upload(src, data).wait()
    rows = []
    for name, make in VARIANTS:
        try:
            with make():  # type: ignore[attr-defined]
                contiguous = name == "contiguous"
                a = d.path.alloc_memory(N, Memory.DEVICE, contiguous=contiguous)
                b = d.path.alloc_memory(N, Memory.DEVICE, contiguous=contiguous)
        except Exception as e:  # an experiment: say what the RM refused
            rows.append((name, 0.0, f"refused: {e}"[:70]))
            continue
        assert a is not None and b is not None
        kernel_copy(d, a.gpu, src.gpu, N).wait()
        t = []
        for i in range(23):
            s = time.perf_counter()
            kernel_copy(d, b.gpu, a.gpu, N).wait()
            if i >= 3:
                t.append(time.perf_counter() - s)
        d.upload(out, bytes(16)).wait()
        kernel_copy(d, out.gpu, b.gpu, N).wait()
        ok = bytes(d.download(out)) == data
        rows.append((name, N / statistics.median(t) / 1e9, "byte-exact" if ok else "WRONG"))
        d.path.free_memory(a)
        d.path.free_memory(b)
    d.stop()
    print(f"{'variant':<32}{'GB/s':>8}  check")
    for name, gbs, note in rows:
        print(f"{name:<32}{gbs:>8.0f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
