"""rig's copy kernels (rig_nv/kernels/copy.cu) run on the CPU, as the launches rig_nv.copies
makes on the stand-in path (fake_gpu.py) ask: issue 23, "a faster copy kernel ... keep the
byte-by-byte tail". The stand-in's memory is host memory at its GPU address, so the kernels'
own source, compiled for the host with CUDA's built-ins played by a loop over every block and
thread of the launch's grid, copies there. Each copy must match byte for byte and write
nothing outside its destination: odd sizes, odd offsets, grids that take several turns. (The
GPU's speed is not measured here; the SM copies' exact bytes on a GPU are the GPU tests'.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cffi import FFI

from rig_edge import Memory
from rig_nv import copies
from rig_nv.hostmem import view

KERNELS = Path(copies.__file__).resolve().parent / "kernels" / "copy.cu"
# CUDA's built-ins for a host compiler; run() plays a launch of one kernel on (grid, block).
HOST = r"""
struct uint4 { unsigned x, y, z, w; };
struct Dim { unsigned x, y, z; };
static Dim threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#include "%s"
extern "C" void run(int wide, unsigned grid, unsigned block, unsigned long long dst,
                    unsigned long long src, unsigned long long count) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; b++)
        for (unsigned t = 0; t < block; t++) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            if (wide) copy16((uint4*)dst, (const uint4*)src, count);
            else copy1((unsigned char*)dst, (const unsigned char*)src, count);
        }
}
"""


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler to build copy.cu for the host")
    at = tmp_path_factory.mktemp("copy_kernels")
    (at / "host.cpp").write_text(HOST % KERNELS)
    subprocess.run([cxx, "-O2", "-shared", "-fPIC", "-o", str(at / "copy.so"),
                    str(at / "host.cpp")], check=True)
    ffi = FFI()
    ffi.cdef("void run(int, unsigned, unsigned, unsigned long long, unsigned long long, "
             "unsigned long long);")
    return ffi.dlopen(str(at / "copy.so"))


@pytest.fixture
def launches(dev: tuple[Any, Any], kernels: Any,
             monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, tuple[int, int, int]]]:
    """Every copy kernel launch (kernel, blocks, args), each also run on the CPU."""
    made: list[tuple[str, int, tuple[int, int, int]]] = []
    launch = copies._launch

    def run(d: Any, fn: Any, blocks: int, args: tuple[int, int, int]) -> Any:
        made.append((fn.name, blocks, args))
        point = launch(d, fn, blocks, args)
        kernels.run(fn.name == "copy16", blocks, copies.COPY_BLOCK, *args)
        return point

    monkeypatch.setattr(copies, "_launch", run)
    return made


GUARD = 4096


@pytest.mark.parametrize(("n", "dst_off", "src_off"), [
    (1 << 20, 0, 0), ((1 << 20) + 1, 0, 0), ((1 << 20) + 15, 16, 48),
    ((3 << 20) + 4097, 32, 0), ((5 << 20) + 48, 0, 16),  # several turns of the grid
    ((1 << 20) + 7, 1, 0), ((1 << 20) + 3, 0, 5), ((2 << 20) + 9, 7, 7),  # unaligned: bytes
    (1, 0, 0), (15, 0, 0), (16, 0, 0), (17, 16, 16), (4095, 3, 11),
    ((64 << 10) + 16, 0, 0),  # a grid of 3 blocks, fewer than the most
])
def test_kernel_copies_are_exact_to_the_byte(dev: tuple[Any, Any], launches: list[Any],
                                             n: int, dst_off: int, src_off: int) -> None:
    """copy16 for the 16-byte-aligned bulk (its grid at most 16 blocks an SM), copy1 for the
    rest byte by byte: the destination equals the source, and the bytes around it are
    untouched."""
    d, path = dev
    d.sm_count = 2  # a grid of at most 32 blocks: a copy of more than 1 MiB loops
    size = n + GUARD * 2
    src, dst = d.alloc(size, Memory.DEVICE), d.alloc(size, Memory.DEVICE)
    s, t = view(src.gpu, size), view(dst.gpu, size)
    s[:] = os.urandom(size)
    t[:] = b"\xa5" * size
    d.copy(dst, src, n, dst_offset=GUARD + dst_off, src_offset=GUARD + src_off,
           engine="sm").wait()
    at, frm = GUARD + dst_off, GUARD + src_off
    assert bytes(t[at : at + n]) == bytes(s[frm : frm + n])
    assert bytes(t[:at]) == b"\xa5" * at and bytes(t[at + n :]) == b"\xa5" * (size - at - n)
    aligned = not (dst.gpu + at | src.gpu + frm) & 15 and n >= 16
    names = [name for name, _, _ in launches]
    assert names == (["copy16"] if aligned and n % 16 == 0 else
                     ["copy16", "copy1"] if aligned else ["copy1"])
    if aligned:
        _, blocks, (_, _, count) = launches[0]
        assert count == n // 16
        assert blocks == min(-(-count // (256 * copies.COPY16_LOADS)), 2 * copies.COPY16_PER_SM)
    path.complete()
