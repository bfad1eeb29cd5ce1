"""Grids beyond a plain one: thread-block clusters, cooperative grids, dependent launches.

:func:`check` resolves and checks a launch's options (:class:`Misuse`, nothing changed) and
:func:`fill_bank` writes what the kernel then reads from the driver's area of constant bank 0.
Those words were read off ptxas 13.0's code for sm_90 (tests/cubins/hopper.cu: cluster_probe,
cluster_swap, grid_sum) and for sm_80/86/89 (grid_sum alone), and match what libcuda wrote on
the H200 (docs/results/cuda-launches-2026-12-01-v2.jsonl); see docs/hopper-launch.md. On
sm_100 and later ptxas indexes the same words by SR_CgaSize, a layout rig has not measured:
clusters and cooperative grids are refused there. A cooperative grid's ``grid.sync()`` uses
the driver's grid workspace (cooperative_groups/details/driver_abi.h: ``{u32 wsSize; u32
barrier}`` at the address in %envreg1:%envreg2); the loader keeps one per device, zeroed,
since the device runs its launches one after another.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rig_edge import Memory, Misuse, Region, RigError
from rig_nv.cubin import Kernel
from rig_nv.occupancy import max_active_blocks

if TYPE_CHECKING:
    from rig_nv.device import Device

__all__ = ["PDL_MISSING", "Options", "check", "fill_bank", "make_workspace"]

PORTABLE_CLUSTER = 8  # the CUDA programming guide's portable cluster size
MOST_CLUSTER = {"sm_90": 16}  # non-portable: cudaFuncAttributeNonPortableClusterSizeAllowed
# CTAs of one cluster run on one GPC. Hopper's GPCs hold up to 18 SMs (the GH100 whitepaper)
# and CUDA runs 16-CTA clusters of one CTA an SM on the H100: rig counts 16 SMs a GPC.
SMS_PER_GPC = 16


@dataclass(frozen=True)
class ClusterWords:
    """Where an sm_90 kernel reads its cluster in constant bank 0 (cluster_probe's SASS), and
    what else CUDA writes there for a cluster launch (docs/results/cuda-launches-2026-12-01-v2
    .jsonl, held by tests/test_libcuda_launches_cpu.py)."""

    shared: int = 0x13C  # u32: a CTA's shared bytes, the 1 KiB reserve in (CUDA's, unread)
    explicit: int = 0x140  # u32 1: %is_explicit_cluster is c[0x140] == 1
    dims: int = 0x144  # 3 x u32: %cluster_nctaid
    reciprocals: int = 0x150  # 3 x f32: 1 / dims; %clusterid = trunc(%ctaid * them)
    clusters: int = 0x15C  # 3 x u32: %nclusterid, the grid in clusters
    # CUDA's 16 MiB and its local window (high word at c[0x24]) plus 4 GiB, where rig too puts
    # the shared window; unread by ptxas's code: taken as the shared window's stride a CTA
    # (map_shared_rank puts the rank at bit 24) and its base.
    window_stride: int = 0x16C  # u32
    window: int = 0x170  # u64
    ctas: int = 0x188  # u32: %cluster_nctarank, CTAs a cluster


WINDOW_STRIDE = 1 << 24


CLUSTER_WORDS = ClusterWords()
# The grid workspace's address (%envreg1 high word, %envreg2 low word): grid_sum's SASS.
WORKSPACE_WORDS = {"sm_80": (0x8C, 0x90), "sm_86": (0x8C, 0x90), "sm_89": (0x8C, 0x90),
                   "sm_90": (0x44, 0x48)}
WORKSPACE_BYTES = 8

# What libcuda wrote on the H200 (docs/results/cuda-launches-2026-12-01-v2.jsonl): every
# launch arrives at a latch of its own (ARRIVE_AT_LATCH_VALID/ID, ENABLE_PROGRAM_PRE_EXIT),
# ids 0x38 to 0x3f in turn on one stream; a dependent one also waits on the previous
# launch's (WAIT_ON_LATCH_VALID/ID, REQUIRE_SCHEDULING_PCAS). Why those eight is not seen.
PDL_MISSING = (
    "programmatic dependent launch needs latch ids (CUDA gives each launch one of eight in "
    "turn: which ids a channel may use is not public) and a submission that does not wait for the "
    "previous launch, which rig's timeline has not; rig runs each launch after the previous "
    "one completes (QMD fields: clcbc0qmd.h ARRIVE_AT_LATCH_ID, WAIT_ON_LATCH_ID, "
    "ENABLE_PROGRAM_PRE_EXIT)")


@dataclass(frozen=True)
class Options:
    """A launch's resolved shape: its cluster (None: none) and whether it is cooperative."""

    cluster: tuple[int, int, int] | None = None
    cooperative: bool = False


PLAIN = Options()


def _base(arch: str) -> tuple[str, int]:
    bare = arch.rstrip("af")
    return bare, int(bare[3:])


def _cluster_shape(name: str, cluster: Sequence[int]) -> tuple[int, int, int]:
    try:
        dims = tuple(cluster)
    except TypeError:
        raise Misuse(f"{name}: a cluster is one to three whole numbers, not {cluster!r}") from None
    if not 1 <= len(dims) <= 3 or any(type(v) is not int or v < 1 for v in dims):
        raise Misuse(f"{name}: a cluster is one to three positive whole numbers, not "
                     f"{cluster!r}")
    return (*dims, 1, 1)[:3]  # type: ignore[return-value]


def check(kernel: Kernel, arch: str, grid: tuple[int, int, int], block: tuple[int, int, int],
          shared: int, sm_count: int, cluster: Sequence[int] | None = None,
          cooperative: bool = False, pdl: bool = False) -> Options:
    """The options of a launch of ``kernel`` (``shared``: its dynamic shared bytes), checked.

    A kernel that declares a cluster shape launches in it when ``cluster`` is None. Raises
    :class:`Misuse` for a cluster before sm_90 or after sm_90 (unmeasured), a cluster of the
    wrong shape, one the grid is not a whole number of, one above 8 CTAs (16 where the cubin
    allows it and the GPU does) or above the kernel's maximum, one whose CTAs cannot fit on one
    GPC; for a cooperative grid larger than the GPU holds at once; for ``pdl``."""
    name = kernel.name
    if pdl:
        raise Misuse(f"{name}: {PDL_MISSING}")
    bare, sm = _base(arch)
    shape = kernel.cluster if cluster is None else _cluster_shape(name, cluster)
    if shape is not None:
        if sm < 90:
            raise Misuse(f"{name}: clusters need sm_90 or later; this GPU is {arch}")
        if bare not in MOST_CLUSTER:
            raise Misuse(f"{name}: rig has not measured where {arch} kernels read their "
                         "cluster in constant bank 0 (ptxas indexes it by SR_CgaSize)")
        if kernel.cluster is not None and shape != kernel.cluster:
            raise Misuse(f"{name} requires clusters of {kernel.cluster}, not {shape}")
        if any(g % c for g, c in zip(grid, shape, strict=True)):
            raise Misuse(f"{name}: grid {grid} is not a whole number of {shape} clusters")
        size = shape[0] * shape[1] * shape[2]
        # A shape the cubin requires, or a maximum it declares, is the kernel allowing
        # non-portable sizes (as cudaFuncAttributeNonPortableClusterSizeAllowed would).
        allowed = max(kernel.max_cluster_rank or 0,
                      size if kernel.cluster is not None else 0, PORTABLE_CLUSTER)
        most = min(allowed, MOST_CLUSTER[bare])
        if kernel.max_cluster_rank is not None:
            most = min(most, kernel.max_cluster_rank)
        if size > most:
            raise Misuse(f"{name}: a cluster of {size} CTAs exceeds the {most} this kernel may "
                         f"have on {arch} (8 are portable; up to {MOST_CLUSTER[bare]} where "
                         "the cubin declares them)")
        per_sm = max_active_blocks(kernel, arch, block, shared)
        if per_sm * SMS_PER_GPC < size:
            raise Misuse(f"{name}: a cluster's {size} CTAs cannot fit on one GPC: an SM holds "
                         f"{per_sm} of them ({kernel.registers} registers a thread, "
                         f"{kernel.shared_bytes + shared} bytes of shared memory a block), "
                         f"a GPC {SMS_PER_GPC} SMs")
    if cooperative:
        if bare not in WORKSPACE_WORDS:
            raise Misuse(f"{name}: rig has not measured where {arch} kernels read the grid "
                         "workspace of a cooperative launch")
        per_sm = max_active_blocks(kernel, arch, block, shared)
        blocks = grid[0] * grid[1] * grid[2]
        if blocks > per_sm * sm_count:
            raise Misuse(f"{name}: a cooperative grid of {blocks} blocks exceeds the "
                         f"{per_sm * sm_count} this GPU holds at once ({per_sm} an SM, "
                         f"{sm_count} SMs)")
    if shape is None and not cooperative:
        return PLAIN
    return Options(shape, bool(cooperative))


def fill_bank(bank: bytearray, arch: str, grid: tuple[int, int, int], options: Options, *,
              shared: int = 0, window: int = 0, workspace_address: int = 0) -> None:
    """Write ``options``' driver words into a bank-0 copy: ``shared`` is a CTA's shared bytes
    (the reserve in), ``window`` the shared window, ``workspace_address`` the grid workspace
    of a cooperative launch."""
    if options.cluster is not None:
        w, c = CLUSTER_WORDS, options.cluster
        struct.pack_into("<I", bank, w.shared, shared)
        struct.pack_into("<I", bank, w.window_stride, WINDOW_STRIDE)
        struct.pack_into("<Q", bank, w.window, window)
        struct.pack_into("<I", bank, w.explicit, 1)
        struct.pack_into("<3I", bank, w.dims, *c)
        struct.pack_into("<3f", bank, w.reciprocals, *(1.0 / n for n in c))
        struct.pack_into("<3I", bank, w.clusters, *(g // n for g, n in zip(grid, c, strict=True)))
        struct.pack_into("<I", bank, w.ctas, c[0] * c[1] * c[2])
    if options.cooperative:
        high, low = WORKSPACE_WORDS[arch.rstrip("af")]
        struct.pack_into("<I", bank, high, workspace_address >> 32)
        struct.pack_into("<I", bank, low, workspace_address & 0xFFFFFFFF)


def make_workspace(device: Device) -> Region:
    """A new grid workspace on ``device``: wsSize 8, the barrier word 0 (the device's loader
    keeps one, :meth:`rig_nv.loader.Loader.grid_workspace`)."""
    got = device.alloc(256, Memory.DEVICE)
    if got is None:
        raise RigError(f"{device.facts.name}: no memory for a cooperative grid's workspace")
    device.upload(got, struct.pack("<II", WORKSPACE_BYTES, 0)).wait()
    return got
