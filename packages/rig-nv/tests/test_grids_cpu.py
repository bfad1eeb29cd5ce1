"""Clusters, cooperative grids, occupancy and dependent launches without a GPU (issue 18).

Kernels: cubins/hopper.cu (built by cubins/build.sh with nvcc 13.0) and Triton 3.6's output
(triton/build.py). Bit positions are re-typed here from open-gpu-doc's clcbc0qmd.h (V4) and
clcdc0qmd.h (V5), not read from rig_nv.qmd; the bank-0 words from ptxas's SASS of the
fixtures (docs/hopper-launch.md); occupancy figures worked by hand from cuda_occupancy.h.
"""

from __future__ import annotations

import dataclasses
import struct
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from rig_edge import Misuse
from rig_nv import grids, occupancy, qmd
from rig_nv import launch as L  # noqa: N812
from rig_nv.cubin import Cubin, parse

HERE = Path(__file__).resolve().parent


@cache
def hopper(arch: str = "sm_90") -> Cubin:
    return parse((HERE / "cubins" / f"hopper.{arch}.cubin").read_bytes())


def bits(data: bytes, hi: int, lo: int) -> int:
    return (int.from_bytes(data, "little") >> lo) & ((1 << (hi - lo + 1)) - 1)


def words(bank: bytes, at: int, n: int, fmt: str = "I") -> tuple[Any, ...]:
    return struct.unpack_from(f"<{n}{fmt}", bank, at)


def loaded(d: Any, name: str) -> L.Function:
    return d.load((HERE / "cubins" / "hopper.sm_90.cubin").read_bytes())[name]


# ---- the cubin's cluster attributes -------------------------------------------------------

def test_cubin_reads_the_required_cluster_shape_and_the_maximum_cluster_rank() -> None:
    """Issue 18: Kernel.cluster is the required shape (EIATTR_EXPLICIT_CLUSTER with
    EIATTR_CTA_PER_CLUSTER), max_cluster_rank the maximum (EIATTR_MAX_CLUSTER_RANK)."""
    c = hopper()
    assert c.kernels["cluster_swap"].cluster == (2, 1, 1)
    assert c.kernels["cluster_swap"].max_cluster_rank is None
    assert c.kernels["cluster_rank"].cluster is None
    assert c.kernels["cluster_rank"].max_cluster_rank == 8
    assert c.kernels["grid_sum"].cluster is None and c.kernels["grid_sum"].cooperative
    assert not c.kernels["cluster_swap"].cooperative
    plain = parse((HERE / "cubins" / "kernels.sm_90.cubin").read_bytes())
    assert all(k.cluster is None and k.max_cluster_rank is None and not k.cooperative
               for k in plain.kernels.values())


# ---- the QMD's cluster fields --------------------------------------------------------------

def _launch(cluster: tuple[int, int, int] | None, arch: str = "sm_90") -> qmd.Launch:
    return qmd.Launch(program=0x1000, grid=(8, 4, 2), block=(128, 1, 1), registers=32,
                      shared_bytes=1024, local_bytes=0, barriers=1,
                      cbufs=((0, 0x2000, 0x300),), sass_version=0x90, arch=arch,
                      cluster=cluster)


def test_v4_cluster_launch_is_grid_gpc_cga_of_the_shape() -> None:
    """clcbc0qmd.h: QMD_TYPE MW(25:23) GRID_GPC_CGA = 3, GPC_CGA_WIDTH MW(2149:2144), HEIGHT
    MW(2157:2152), DEPTH MW(2165:2160); the grid in clusters."""
    data = qmd.encode(4, _launch((2, 4, 1)))
    assert bits(data, 25, 23) == 3
    assert (bits(data, 2149, 2144), bits(data, 2157, 2152), bits(data, 2165, 2160)) == (2, 4, 1)
    # GRID_WIDTH MW(1055:1024), HEIGHT MW(1071:1056), DEPTH MW(1103:1088): the (8, 4, 2) grid
    # in clusters, and CGA_CTA_DISTRIBUTION_MODE MW(2207:2207) MULTI_CAST, as libcuda's.
    assert (bits(data, 1055, 1024), bits(data, 1071, 1056), bits(data, 1103, 1088)) == (4, 1, 2)
    assert bits(data, 2207, 2207) == 1
    with pytest.raises(ValueError, match="not a whole number"):
        qmd.encode(4, _launch((3, 1, 1)))
    plain = qmd.encode(4, _launch(None))
    assert bits(plain, 25, 23) == 2  # GRID_CTA
    assert bits(plain, 2165, 2144) == 0


def test_v5_cluster_launch_is_grid_gpc_cga_of_the_shape() -> None:
    """clcdc0qmd.h: QMD_TYPE MW(153:151), GPC_CGA_WIDTH MW(2053:2048), HEIGHT MW(2061:2056),
    DEPTH MW(2069:2064)."""
    data = qmd.encode(5, _launch((4, 2, 2), "sm_100"))
    assert bits(data, 153, 151) == 3
    assert (bits(data, 2053, 2048), bits(data, 2061, 2056), bits(data, 2069, 2064)) == (4, 2, 2)


def test_v3_has_no_clusters() -> None:
    with pytest.raises(ValueError, match="no clusters"):
        qmd.encode(3, _launch((2, 1, 1), "sm_86"))


# ---- cluster launches on a device ----------------------------------------------------------

def test_a_kernel_that_declares_a_cluster_launches_in_it_by_default(dev: Any) -> None:
    """Issue 18: a kernel that declares a shape launches in it by default; bank 0 holds the
    words cluster_probe's SASS reads (0x140 explicit, 0x144 dims, 0x150 1/dims, 0x15c the
    grid in clusters, 0x188 CTAs a cluster)."""
    d, _ = dev
    fn = loaded(d, "cluster_swap")
    prep = L.prepare(d, fn, (8, 3, 1), (128, 1, 1), 0)
    assert bits(prep.qmd, 25, 23) == 3 and bits(prep.qmd, 2149, 2144) == 2
    assert bits(prep.qmd, 1055, 1024) == 4  # GRID_WIDTH: the grid in clusters, as libcuda's
    assert words(prep.bank, 0x0C, 3) == (8, 3, 1)  # %nctaid: the grid in CTAs
    assert words(prep.bank, 0x140, 1) == (1,)
    assert words(prep.bank, 0x144, 3) == (2, 1, 1)
    assert words(prep.bank, 0x150, 3, "f") == (0.5, 1.0, 1.0)
    assert words(prep.bank, 0x15C, 3) == (4, 3, 1)
    assert words(prep.bank, 0x188, 1) == (2,)
    d.launch(fn, (8, 3, 1), (128, 1, 1), (d.alloc(4096), d.alloc(4096))).wait()


def test_an_explicit_cluster_on_a_plain_kernel_and_then_none(dev: Any) -> None:
    """launch(..., cluster=) writes the cluster; the same configuration without it (the fast
    path's cache) stays a plain grid with the cluster words untouched."""
    d, _ = dev
    fn = loaded(d, "cluster_rank")
    out = d.alloc(64 * 128 * 4)
    d.launch(fn, (64, 1, 1), (128, 1, 1), (out,), cluster=(4, 1, 1)).wait()
    d.launch(fn, (64, 1, 1), (128, 1, 1), (out,)).wait()
    with_cluster = L.prepare(d, fn, (64, 1, 1), (128, 1, 1), 0, (4, 1, 1))
    plain = L.prepare(d, fn, (64, 1, 1), (128, 1, 1), 0)
    assert bits(with_cluster.qmd, 25, 23) == 3 and bits(with_cluster.qmd, 2149, 2144) == 4
    assert words(with_cluster.bank, 0x15C, 3) == (16, 1, 1)
    assert bits(plain.qmd, 25, 23) == 2
    assert plain.bank[0x140:0x18C] == bytes(0x4C)


def test_a_step_records_a_cluster_launch(dev: Any) -> None:
    """Issue 18: launch(..., cluster=) on steps."""
    d, _ = dev
    fn = loaded(d, "cluster_rank")
    s = d.step()
    s.launch(fn, (8, 2, 1), (128, 1, 1), (d.alloc(8 * 2 * 128 * 4),), cluster=(2, 2, 1))
    item = s.items[0]
    assert bits(item.prep.qmd, 25, 23) == 3
    assert (bits(item.prep.qmd, 2149, 2144), bits(item.prep.qmd, 2157, 2152)) == (2, 2)
    assert words(bytes(item.bank), 0x15C, 3) == (4, 1, 1)
    s.submit().wait()


@pytest.mark.parametrize(("kernel", "grid", "cluster", "match"), [
    ("cluster_rank", (6, 1, 1), (4, 1, 1), "not a whole number of"),
    ("cluster_rank", (8, 3, 1), (1, 2, 1), "not a whole number of"),
    ("cluster_swap", (8, 1, 1), (4, 1, 1), r"requires clusters of \(2, 1, 1\)"),
    ("cluster_rank", (32, 1, 1), (16, 1, 1), "exceeds the 8"),
    ("grid_sum", (32, 1, 1), (16, 1, 1), "exceeds the 8 this kernel"),
    ("grid_sum", (32, 1, 1), (0, 1, 1), "positive whole numbers"),
    ("grid_sum", (32, 1, 1), (2, 1, 1, 1), "one to three"),
])
def test_cluster_misuse_changes_nothing(dev: Any, kernel: str, grid: tuple[int, ...],
                                        cluster: tuple[int, ...], match: str) -> None:
    """Issue 18: Misuse, having changed nothing, for a grid that is not a whole number of
    clusters, a shape other than the cubin's, one over the portable 8 or the kernel's
    maximum."""
    d, _ = dev
    fn = loaded(d, kernel)
    before = d.timeline.next
    args = (d.alloc(4096),) if kernel != "grid_sum" else (
        d.alloc(4096), d.alloc(4096), d.alloc(4), 1024)
    with pytest.raises(Misuse, match=match):
        d.launch(fn, grid, (128, 1, 1), args, cluster=cluster)
    with pytest.raises(Misuse, match=match):
        d.step().launch(fn, grid, (128, 1, 1), args, cluster=cluster)
    assert d.timeline.next == before
    assert not any(len(key) > 4 for key in fn.prepared)


def test_sixteen_ctas_where_the_cubin_declares_them_and_never_more(dev: Any) -> None:
    """Issue 18: 16 CTAs where the kernel allows non-portable sizes (a required 16-CTA shape,
    as Triton's num_ctas=16 compiles) and the GPU does (sm_90: 16), never 32."""
    d, _ = dev
    fn = loaded(d, "cluster_rank")
    for n, ok in ((16, True), (32, False)):
        wide = dataclasses.replace(fn, kernel=dataclasses.replace(
            fn.kernel, cluster=(n, 1, 1), max_cluster_rank=None), prepared={}, packers={})
        if ok:
            assert bits(L.prepare(d, wide, (64, 1, 1), (128, 1, 1), 0).qmd, 2149, 2144) == 16
        else:
            with pytest.raises(Misuse, match="exceeds the 16"):
                L.prepare(d, wide, (64, 1, 1), (128, 1, 1), 0)


def test_a_cluster_whose_ctas_cannot_share_a_gpc(dev: Any, monkeypatch: Any) -> None:
    """Issue 18: Misuse for a cluster whose CTAs cannot fit on one GPC (an SM holds one block of
    100 KiB shared memory twice; a GPC of 2 SMs then holds 4 such CTAs, not 8)."""
    d, _ = dev
    fn = loaded(d, "cluster_rank")
    monkeypatch.setattr(grids, "SMS_PER_GPC", 2)
    L.prepare(d, fn, (8, 1, 1), (128, 1, 1), 100 * 1024, (4, 1, 1))
    with pytest.raises(Misuse, match="cannot fit on one GPC: an SM holds 2"):
        L.prepare(d, fn, (8, 1, 1), (128, 1, 1), 100 * 1024, (8, 1, 1))


@pytest.mark.parametrize("arch", ["sm_89", "sm_100"])
def test_clusters_are_refused_before_and_after_what_rig_measured(arch: str) -> None:
    """Issue 18: a cluster on a GPU before sm_90 is Misuse; on sm_100 (bank words indexed by
    SR_CgaSize, unmeasured) too."""
    k = hopper().kernels["cluster_rank"]
    with pytest.raises(Misuse, match="sm_90 or later" if arch == "sm_89" else "not measured"):
        grids.check(k, arch, (8, 1, 1), (128, 1, 1), 0, 132, (2, 1, 1))


# ---- occupancy ----------------------------------------------------------------------------

def test_max_active_blocks_follows_cuda_occupancy_h(dev: Any) -> None:
    """Issue 18: fn.max_active_blocks(block, shared) per SM as
    cuOccupancyMaxActiveBlocksPerMultiprocessor. grid_sum: 30 registers (960 -> 1024 a warp,
    16 warps a sub-partition), no static shared memory, one barrier."""
    d, _ = dev
    fn = loaded(d, "grid_sum")
    assert fn.kernel.registers == 30
    assert fn.max_active_blocks(256) == 8  # warps: 64 // 8; registers: 16 * 4 // 8
    assert fn.max_active_blocks((1024, 1, 1)) == 2
    assert fn.max_active_blocks(64) == 32  # the SM's 32 block slots
    # 100 KiB + the 1 KiB reserve a block, in 128-byte granules, from a 228 KiB carveout.
    assert fn.max_active_blocks(64, 100 * 1024) == 228 * 1024 // (101 * 1024)
    assert fn.max_active_blocks(64, 227 * 1024 + 1) == 0
    assert fn.max_active_blocks(2048) == 0
    k = dataclasses.replace(fn.kernel, registers=255)
    assert occupancy.max_active_blocks(k, "sm_90", 256) == 1  # 8192 a warp: 2 a partition
    assert occupancy.max_active_blocks(k, "sm_86", 64) == 4  # 2 a partition x 4 // 2 warps
    k = dataclasses.replace(fn.kernel, registers=48)  # 1536 a warp: 10 a sub-partition
    assert occupancy.max_active_blocks(k, "sm_90", 64) == 20  # 40 // 2, not 65536 // 1536 // 2
    k = dataclasses.replace(fn.kernel, registers=32)
    assert occupancy.max_active_blocks(k, "sm_90", 512) == 4  # 2048 threads an SM
    assert occupancy.max_active_blocks(k, "sm_86", 512) == 3  # 1536 threads an SM
    with pytest.raises(Misuse):
        fn.max_active_blocks(0)
    with pytest.raises(Misuse):
        fn.max_active_blocks(64, -1)


# ---- cooperative grids --------------------------------------------------------------------

def test_a_cooperative_grid_gets_the_grid_workspace(dev: Any) -> None:
    """Issue 18: launch(..., cooperative=True) gives the kernel what grid.sync() reads: the
    workspace address at c[0x44] (high) and c[0x48] (low) on sm_90 (grid_sum's SASS), a
    workspace {wsSize 8, barrier 0} (driver_abi.h)."""
    d, _ = dev
    fn = loaded(d, "grid_sum")
    x, partial, out = d.alloc(4096), d.alloc(4096), d.alloc(4)
    d.launch(fn, (132, 1, 1), (256, 1, 1), (x, partial, out, 1024), cooperative=True).wait()
    prep = L.prepare(d, fn, (132, 1, 1), (256, 1, 1), 0, None, True)
    high, low = words(prep.bank, 0x44, 2)
    ws = d.loader.grid_workspace()
    assert (high << 32 | low) == ws.gpu != 0
    assert struct.unpack("<II", d.download(ws, 8)) == (8, 0)
    plain = L.prepare(d, fn, (132, 1, 1), (256, 1, 1), 0)
    assert words(plain.bank, 0x44, 2) == (0, 0)


def test_a_step_records_a_cooperative_launch(dev: Any) -> None:
    """Issue 18: cooperative=True on steps: the recorded bank holds the workspace address."""
    d, _ = dev
    fn = loaded(d, "grid_sum")
    s = d.step()
    s.launch(fn, (264,), (256,), (d.alloc(4096), d.alloc(4096), d.alloc(4), 1024),
             cooperative=True)
    high, low = words(bytes(s.items[0].bank), 0x44, 2)
    assert (high << 32 | low) == d.loader.grid_workspace().gpu
    s.submit().wait()
    with pytest.raises(Misuse, match="exceeds the 1056"):
        d.step().launch(fn, (2000,), (256,), (d.alloc(4096), d.alloc(4096), d.alloc(4), 1),
                        cooperative=True)


def test_a_cooperative_grid_larger_than_the_gpu_holds_is_misuse(dev: Any) -> None:
    """Issue 18: cooperative=True refuses a grid larger than the GPU holds at once (8 blocks
    of 256 threads an SM, 132 SMs), having changed nothing."""
    d, _ = dev
    fn = loaded(d, "grid_sum")
    args = (d.alloc(4096), d.alloc(4096), d.alloc(4), 1024)
    d.launch(fn, (8 * 132, 1, 1), (256, 1, 1), args, cooperative=True).wait()
    before = d.timeline.next
    with pytest.raises(Misuse, match="1057 blocks exceeds the 1056"):
        d.launch(fn, (8 * 132 + 1, 1, 1), (256, 1, 1), args, cooperative=True)
    assert d.timeline.next == before


def test_cooperative_grids_are_refused_where_rig_has_not_measured_the_workspace() -> None:
    k = hopper("sm_100").kernels["grid_sum"]
    with pytest.raises(Misuse, match="grid workspace"):
        grids.check(k, "sm_100", (8, 1, 1), (256, 1, 1), 0, 148, None, True)


# ---- programmatic dependent launch --------------------------------------------------------

def test_programmatic_dependent_launch_says_what_is_missing(dev: Any) -> None:
    """Issue 18: PDL where its QMD fields are public; they are not all: Misuse saying so."""
    d, _ = dev
    fn = loaded(d, "cluster_rank")
    with pytest.raises(Misuse, match=r"latch ids.*not public.*ENABLE_PROGRAM_PRE_EXIT"):
        d.launch(fn, (2, 1, 1), (128, 1, 1), (d.alloc(1024),), pdl=True)
