"""rig's copy kernels (rig_nv/kernels/copy.cu) run on the CPU, as the launches rig_nv.copies
makes on the stand-in path (fake_gpu.py) ask: issue 23, "a faster copy kernel ... keep the
byte-by-byte tail". The stand-in's memory is host memory at its GPU address, so the kernels'
own source, compiled for the host with CUDA's built-ins played by a loop over every block and
thread of the launch's grid, copies there. Each copy must match byte for byte and write
nothing outside its destination: odd sizes, odd offsets, grids rounded up past the data, copies
split over several launches. copy16's geometry (one block a chunk) is checked at its edges,
32 TiB copies included, without the memory. (The GPU's speed is not measured here; the SM
copies' exact bytes on a GPU are the GPU tests'.)"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cffi import FFI
from fake_gpu import entry_words
from test_device_cpu import commands, methods, qmd_of

from rig_edge import Memory
from rig_nv import channel, copies, cubin, push, qmd, queues
from rig_nv import launch as launching
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
#define __ldg(p) (*(p))
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
    """Every copy kernel launch (kernel, blocks, args) the device's compute channel is given,
    each also run on the CPU: read from the GPFIFO entry's words and the QMD they name, so
    every path that launches (a first copy of a size, a copy of one copied before) is seen."""
    made: list[tuple[str, int, tuple[int, int, int]]] = []
    d = dev[0]
    img = d.loader.copy_kernels()  # loaded now: a submission holds its timeline's lock
    submit, submit_entry = channel.Channel.submit, channel.Channel.submit_entry

    def execute(ch: Any, words: list[int]) -> None:
        got = launched(d, ch, words, img)
        if got is not None:
            name, grid, threads, args = got
            assert threads == (1024 if name == "copy16" else 256)  # copy.cu's blocks
            made.append((name, grid, args))
            kernels.run(name == "copy16", grid, threads, *args)

    def run(ch: Any, words: Any, value: int, completed: int = -1) -> None:
        submit(ch, words, value, completed)
        execute(ch, list(memoryview(words).cast("B").cast("I")))

    def run_entry(ch: Any, entry: int, value: int, completed: int = -1) -> None:
        submit_entry(ch, entry, value, completed)  # a launch from a slot's own words
        execute(ch, entry_words(entry))

    monkeypatch.setattr(channel.Channel, "submit", run)
    monkeypatch.setattr(channel.Channel, "submit_entry", run_entry)
    return made


def launched(d: Any, ch: Any, words: list[int],
             img: Any) -> tuple[str, int, int, tuple[int, int, int]] | None:
    """(kernel, blocks, threads, (dst, src, count)) of the copy kernel launch in ``words``,
    submitted on ``ch``: the kernel whose code the QMD points at, the grid and block it names
    and the arguments in the bank it points at; None for any other submission."""
    sends = [m for _, m, _ in methods(words) if m == push.COMPUTE_SEND_PCAS_A]
    if ch is not d.compute or not sends:
        return None
    q = qmd.Qmd(qmd.LAYOUTS[d.classes.qmd_version], bytes(qmd_of(words)))
    fns = [fn for fn in (img["copy16"], img["copy1"]) if fn.program == q.program()]
    if not fns:
        return None
    bank, _, valid = q.cbuf(0)
    assert valid
    args = struct.unpack_from("<3Q", view(bank + fns[0].kernel.param_offset, 24))
    return fns[0].name, q.get("GRID_WIDTH"), q.get("CTA_THREAD_DIMENSION0"), args


GUARD = 4096
CHUNK = 1024 * 2 * 16  # bytes a block of copy16 copies (copy.cu: 1024 threads, 2 loads)


def copy_and_check(d: Any, n: int, dst_off: int, src_off: int) -> tuple[int, int]:
    """Copy ``n`` bytes on the SMs between guarded regions; assert the destination equals the
    source and the bytes around it are untouched. Returns the (dst, src) GPU addresses."""
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
    return dst.gpu + at, src.gpu + frm


@pytest.mark.parametrize(("n", "dst_off", "src_off"), [
    (1 << 20, 0, 0), ((1 << 20) + 1, 0, 0), ((1 << 20) + 15, 16, 48),
    ((3 << 20) + 4097, 32, 0), ((5 << 20) + 48, 0, 16),  # grids rounded up: idle blocks
    (33 * CHUNK + 16, 0, 0), (34 * CHUNK + 32, 16, 16),  # 34 chunks exactly; 35 in 36 blocks
    ((1 << 20) + 7, 1, 0), ((1 << 20) + 3, 0, 5), ((2 << 20) + 9, 7, 7),  # unaligned: bytes
    (1, 0, 0), (15, 0, 0), (16, 0, 0), (17, 16, 16), (4095, 3, 11),
    ((64 << 10) + 16, 0, 0), (CHUNK - 16, 0, 0), (CHUNK, 0, 0),  # one block, two blocks
])
def test_kernel_copies_are_exact_to_the_byte(dev: tuple[Any, Any], launches: list[Any],
                                             n: int, dst_off: int, src_off: int) -> None:
    """Issue 23's faster copy kernel: copy16 for the 16-byte-aligned bulk on a full grid (one
    block a chunk, rounded up by less than 1 in 16), copy1 for the rest byte by byte; the
    destination equals the source, and the bytes around it are untouched."""
    d, path = dev
    to, fro = copy_and_check(d, n, dst_off, src_off)
    aligned = not (to | fro) & 15 and n >= 16
    names = [name for name, _, _ in launches]
    assert names == (["copy16"] if aligned and n % 16 == 0 else
                     ["copy16", "copy1"] if aligned else ["copy1"])
    if aligned:
        _, blocks, (_, _, count) = launches[0]
        chunks = -(-n // CHUNK) if n % 16 == 0 else -(-(n - n % 16) // CHUNK)
        assert count == n // 16
        assert chunks <= blocks < chunks + chunks / 16 + 1
    path.complete()


@pytest.mark.parametrize("n", [1, 4096, 64 << 10, (1 << 20) - 1])
def test_auto_copies_gpu_memory_on_the_sms_at_every_size(
        dev: tuple[Any, Any], launches: list[Any], n: int) -> None:
    """``engine="auto"`` copies between GPU memory (Device or Mapped) on the SMs at every size,
    small ones too (the SMs took 0.55-0.81x a copy engine's time from 4 KiB to 4 MiB:
    docs/results/small-copies-2026-12-04.txt), and to or from host memory on the copy engine:
    the copy channel gets no entry for the first, the compute channel none for the second."""
    d, path = dev
    a, b = d.alloc(n, Memory.DEVICE), d.alloc(n, Memory.MAPPED)
    pinned = d.alloc(n, Memory.PINNED)
    view(a.gpu, n)[:] = os.urandom(n)
    for dst, src in ((b, a), (a, b)):
        put, first = d.copy_channel.put, len(launches)
        d.copy(dst, src).wait()
        assert d.copy_channel.put == put and len(launches) > first
        assert bytes(view(dst.gpu, n)) == bytes(view(src.gpu, n))
    put, first = d.copy_channel.put, len(launches)
    d.copy(pinned, a)
    assert d.copy_channel.put == put + 1 and len(launches) == first
    path.complete()


def test_copies_past_a_launchs_grid_take_several_launches(
        dev: tuple[Any, Any], launches: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of more chunks than one grid holds (2^31-1 blocks; here made 3) still copies
    exactly: consecutive copy16 launches, each at most that many blocks, then the tail."""
    d, path = dev
    monkeypatch.setattr(copies, "COPY16_MOST", 3)
    n = 10 * CHUNK + 80 + 7
    to, fro = copy_and_check(d, n, 16, 32)
    assert [(name, blocks) for name, blocks, _ in launches] == [
        ("copy16", 3), ("copy16", 3), ("copy16", 3), ("copy16", 2), ("copy1", 1)]
    at = 0
    for _, _, (dst, src, count) in launches[:4]:
        assert (dst, src) == (to + at, fro + at)
        at += count * 16
    assert at == n - 7 and launches[4][2] == (to + at, fro + at, 7)
    path.complete()


def test_a_size_copied_before_copies_exactly_on_its_resolved_launches(
        dev: tuple[Any, Any], launches: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23's cheaper copy call: a copy of a size copied before launches what its plan
    resolved to (rig_nv.copies.kernel_copy), with no launch through launch_own, never a
    stale address, count or kernel: each copy again at other regions and offsets, fresh
    bytes, several launches and a tail, an unaligned copy of an aligned one's size, and a
    copy after local memory grew (its QMD names the new size, as a first launch's would)."""
    d, path = dev
    monkeypatch.setattr(copies, "COPY16_MOST", 3)
    slow: list[int] = []  # launches through launch_own, the first copy of a size's
    own = queues.Submits.launch_own

    def counted(q: Any, fn: Any, blocks: int, block: int, args: Any, name: str) -> Any:
        slow.append(blocks)
        return own(q, fn, blocks, block, args, name)

    monkeypatch.setattr(queues.Submits, "launch_own", counted)
    cases = [(10 * CHUNK + 87, 16, 32), (CHUNK, 0, 0), ((1 << 20) + 3, 0, 5)]
    for again, (n, dst_off, src_off) in enumerate([*cases, *cases, (CHUNK, 1, 0)]):
        first, before = len(launches), len(slow)
        to, fro = copy_and_check(d, n, dst_off, src_off)
        assert (len(slow) == before) == (again in (3, 4, 5))
        at = 0
        for name, _, (dst, src, count) in launches[first:]:
            assert (dst, src) == (to + at, fro + at)
            assert name == ("copy16" if not (dst | src) & 15 and count * 16 <= n - at
                            else "copy1")
            at += count * 16 if name == "copy16" else count
        assert at == n
    d.loader.ensure_local(4096)
    copy_and_check(d, CHUNK, 0, 0)
    q = qmd.Qmd(qmd.LAYOUTS[d.classes.qmd_version], bytes(qmd_of(commands(d, d.compute)[-1])))
    assert q.get("SHADER_LOCAL_MEMORY_HIGH_SIZE") == 4096 >> q.layout.local_shift
    path.complete()


C = 2048  # 16-byte units a chunk: copy.cu's 1024 threads of 2 loads
TIB32 = (1 << 30) * C  # 16-byte units in the most chunks one launch takes (32 TiB)


@pytest.mark.parametrize(("count", "expected"), [
    (1, [(0, 1, 1)]), (C, [(0, 1, C)]), (C + 1, [(0, 2, C + 1)]),  # tiny
    (31 * C + 1, [(0, 32, 31 * C + 1)]), (33 * C, [(0, 34, 33 * C)]),  # rounded
    (1 << 24, [(0, 8192, 1 << 24)]),  # 256 MiB: the measured flat2_1024 grid
    (TIB32 - 1, [(0, 1 << 30, TIB32 - 1)]), (TIB32, [(0, 1 << 30, TIB32)]),  # the most
    (2 * TIB32 + 5, [(0, 1 << 30, TIB32), (TIB32, 1 << 30, TIB32), (2 * TIB32, 1, 5)]),
    (TIB32 + 33 * C + 1, [(0, 1 << 30, TIB32), (TIB32, 34, 33 * C + 1)]),  # huge
])
def test_copy16_geometry_at_the_edges(count: int, expected: list[tuple[int, int, int]]) -> None:
    """copy16's launches cover every unit once, one block a chunk of 2048 units, no grid past
    the hardware's 2^31-1 blocks (rig_nv.launch.MAX_GRID): more takes several launches."""
    got = copies.copy16_launches(count)
    assert got == expected
    assert all(blocks <= (1 << 31) - 1 and blocks * C >= units for _, blocks, units in got)


def test_copy16_grids_are_few_and_rounded_up_little() -> None:
    """The prepared launch configurations stay bounded (each function caches one a grid):
    every copy up to 64 Mi chunks (2 TiB) needs at most 16 grids an octave, each fewer than
    1 in 16 blocks over the chunks."""
    grids = set()
    for chunks in [*range(1, 1 << 12), *range(1 << 12, 1 << 26, 997)]:
        [(_, blocks, _)] = copies.copy16_launches(chunks * C)
        assert chunks <= blocks < chunks * 17 / 16 + 1
        grids.add(blocks)
    assert len([g for g in grids if g < 32]) == 31
    assert len([g for g in grids if g >= 32]) <= 16 * 21


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"])
def test_shipped_copy16_cubins_have_the_block_rig_launches(arch: str) -> None:
    """copy16's shape is written twice, in copy.cu's #defines and rig_nv.copies; the cubins
    build.sh made from copy.cu carry its __launch_bounds__, which must be the block rig
    launches and the chunk its geometry assumes: a stale cubin or a changed constant fails."""
    text = KERNELS.read_text()
    defines = {name: int(value) for name, value in
               re.findall(r"#define (COPY16_THREADS|COPY16_LOADS) (\d+)", text)}
    assert defines == {"COPY16_THREADS": copies.COPY16_THREADS,
                       "COPY16_LOADS": copies.COPY16_LOADS}
    data = launching.builtin_cubin("copy", arch)
    assert data is not None
    assert cubin.parse(data).kernel("copy16").max_threads == copies.COPY16_THREADS
