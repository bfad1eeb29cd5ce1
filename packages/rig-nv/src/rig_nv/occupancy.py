"""Occupancy: how many blocks of a kernel one SM holds at once, as CUDA computes it.

The rules are those of NVIDIA's cuda_occupancy.h (CUDA 13.0): blocks are limited by warps,
by registers (given to warps in units of 256, each sub-partition a quarter of the SM's 65536),
by shared memory (128-byte granules, 1 KiB the driver reserves per block, the SM's largest
carveout, as with no carveout preference), by the SM's block slots and by its barriers. The
per-architecture figures below name where each comes from; a figure not in the header is the
CUDA programming guide's "technical specifications" table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rig_edge import Misuse
from rig_nv import qmd
from rig_nv.cubin import Kernel

__all__ = ["Limits", "limits", "max_active_blocks"]

REGISTERS_PER_SM = 65536  # cudaDeviceProp.regsPerMultiprocessor, every sm_80+ GPU
REGISTER_GRANULE = 256  # cudaOccRegAllocationGranularity
SUB_PARTITIONS = 4  # cudaOccSubPartitionsPerMultiprocessor
MAX_REGISTERS = 256  # cudaOccRegAllocationMaxPerThread (the hardware allows 255 + RZ)
SHARED_GRANULE = 128  # cudaOccSMemAllocationGranularity
RESERVED_SHARED = 1024  # cudaDeviceProp.reservedSharedMemPerBlock
MAX_THREADS_PER_BLOCK = 1024


@dataclass(frozen=True)
class Limits:
    """One architecture's SM: threads (programming guide), block slots
    (cudaOccMaxBlocksPerMultiprocessor) and barriers per block slot
    (cudaOccMaxBlocksPerSMBlockBarrierLimit)."""

    threads: int
    blocks: int
    barriers_per_slot: int


LIMITS = {
    "sm_80": Limits(2048, 32, 2),
    "sm_86": Limits(1536, 16, 1),
    "sm_89": Limits(1536, 24, 1),
    "sm_90": Limits(2048, 32, 2),
    "sm_100": Limits(2048, 32, 2),
    "sm_120": Limits(1536, 24, 1),
}


def limits(arch: str) -> Limits:
    """The SM limits of ``arch`` (``sm_90a`` reads as ``sm_90``); Misuse for one rig lacks."""
    try:
        return LIMITS[arch.rstrip("af")]
    except KeyError:
        raise Misuse(f"rig has no occupancy figures for {arch}") from None


def _threads(block: int | Sequence[int]) -> int:
    dims = (block,) if isinstance(block, int) else tuple(block)
    if not 1 <= len(dims) <= 3 or any(not isinstance(v, int) or v < 1 for v in dims):
        raise Misuse(f"block {block!r} needs one to three positive whole numbers")
    n = 1
    for v in dims:
        n *= v
    return n


def max_active_blocks(kernel: Kernel, arch: str, block: int | Sequence[int],
                      shared: int = 0) -> int:
    """Blocks of ``block`` threads and ``shared`` dynamic shared bytes that one SM of ``arch``
    holds at once (cuOccupancyMaxActiveBlocksPerMultiprocessor); 0 where one does not fit.
    Raises :class:`Misuse` for a malformed block or negative ``shared``."""
    threads = _threads(block)
    if not isinstance(shared, int) or shared < 0:
        raise Misuse(f"dynamic shared memory must be a whole number >= 0, not {shared!r}")
    lim = limits(arch)
    if threads > MAX_THREADS_PER_BLOCK or (kernel.max_threads and threads > kernel.max_threads):
        return 0
    warps = -(-threads // 32)
    by_warps = (lim.threads // 32) // warps
    per_warp = -(-max(kernel.registers, 1) * 32 // REGISTER_GRANULE) * REGISTER_GRANULE
    assumed = per_warp * -(-warps // SUB_PARTITIONS) * SUB_PARTITIONS
    if assumed > REGISTERS_PER_SM or kernel.registers > MAX_REGISTERS:
        return 0
    by_registers = (REGISTERS_PER_SM // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS // warps
    per_block = kernel.shared_bytes + RESERVED_SHARED + shared
    per_block = -(-per_block // SHARED_GRANULE) * SHARED_GRANULE
    if per_block > qmd.max_shared(arch) + RESERVED_SHARED:
        return 0
    by_shared = qmd.carveout_max(arch) // per_block
    by_barriers = lim.blocks * lim.barriers_per_slot // max(kernel.barriers, 1)
    return min(by_warps, by_registers, by_shared, lim.blocks, by_barriers)
