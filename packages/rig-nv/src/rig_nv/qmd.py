"""Queue meta data (QMD): the launch descriptor the compute engine reads, per version.

Bit positions are NVIDIA's, from open-gpu-doc classes/compute/clc6c0qmd.h (V03_00: Ampere
0xC6C0/0xC7C0 and Ada 0xC9C0 share it), clcbc0qmd.h (V04_00: Hopper 0xCBC0) and clcdc0qmd.h /
clcec0qmd.h (V05_00: Blackwell 0xCDC0/0xCEC0); ``MW(hi:lo)`` counts bits from bit 0 of dword 0,
little-endian. Which fields a launch needs and how they are encoded (shifts, the shared-memory
carveout encoding KiB/4 + 1) follows Mesa NAK's qmd.rs.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

Field = tuple[int, int]  # (hi, lo) bit numbers, inclusive


def _per(hi: int, lo: int, stride: int, count: int) -> list[Field]:
    return [(hi + i * stride, lo + i * stride) for i in range(count)]


@dataclass(frozen=True)
class Release:
    """Where a QMD's first two releases lie: the first's control bits at ``control_at`` (16
    bits: enable, size, payload width), the second's just after them, each one's address and
    64-bit payload; the GPU writes the payload there once the grid is done. The first releases
    the timeline's value; the second, only while a profile stamps the launch, writes the GPU's
    clock at its address + 8 (a 16-byte semaphore, as the host's timestamp release). Written
    by the timeline into its own copy of each QMD, so a QMD made once (a step's too) releases
    nothing by itself."""

    control_at: int
    control: int
    address_at: int
    payload_at: int
    stamp_control: int  # the second release's control bits (at control_at + 2)
    stamp_at: int  # the second release's address (its payload follows)
    add_control: int  # the first's control bits to add its payload to the word instead

    def write(self, qmd: memoryview | bytearray, at: int, address: int, value: int,
              stamp: int = 0, *, add: bool = False) -> None:
        """Make the QMD at ``qmd[at:]`` release ``value`` at ``address`` (with ``add``: add
        it to the 64-bit word there), and with ``stamp`` write its end time at ``stamp + 8``;
        without, its second release is off."""
        struct.pack_into("<HH", qmd, at + self.control_at,
                         self.add_control if add else self.control,
                         self.stamp_control if stamp else 0)
        struct.pack_into("<QQ", qmd, at + self.address_at, address, value)
        if stamp:
            struct.pack_into("<QQ", qmd, at + self.stamp_at, stamp, 0)


@dataclass(frozen=True)
class Layout:
    """One QMD version: its size, its fields, and how addresses and sizes are shifted."""

    version: int
    size: int
    fields: dict[str, Field]
    cbuf_addr_lower: list[Field]
    cbuf_addr_upper: list[Field]
    cbuf_size: list[Field]
    cbuf_valid: list[Field]
    cbuf_invalidate: list[Field]
    cbuf_addr_shift: int  # 0 (V3) or 6 (V4, V5): cbuf addresses 64-byte aligned
    program_shift: int  # 0 (V3, V4) or 4 (V5)
    shared_shift: int  # 0 (V3, V4) or 7 (V5)
    local_shift: int  # 0 (V3, V4) or 4 (V5)
    release: Release | None = None  # where the GPU is known to run it


V3 = Layout(
    version=3,
    size=256,
    fields={
        "QMD_GROUP_ID": (133, 128),
        "SM_GLOBAL_CACHING_ENABLE": (134, 134),
        "INVALIDATE_TEXTURE_HEADER_CACHE": (186, 186),
        "INVALIDATE_TEXTURE_SAMPLER_CACHE": (187, 187),
        "INVALIDATE_TEXTURE_DATA_CACHE": (188, 188),
        "INVALIDATE_SHADER_DATA_CACHE": (189, 189),
        "INVALIDATE_INSTRUCTION_CACHE": (190, 190),
        "INVALIDATE_SHADER_CONSTANT_CACHE": (191, 191),
        "CWD_MEMBAR_TYPE": (369, 368),
        "API_VISIBLE_CALL_LIMIT": (378, 378),
        "SAMPLER_INDEX": (382, 382),
        "GRID_WIDTH": (415, 384),
        "GRID_HEIGHT": (431, 416),
        "GRID_DEPTH": (463, 448),
        "SHARED_MEMORY_SIZE": (561, 544),
        "MIN_SM_CONFIG_SHARED_MEM_SIZE": (567, 562),
        "MAX_SM_CONFIG_SHARED_MEM_SIZE": (574, 569),
        "QMD_MINOR_VERSION": (579, 576),
        "QMD_MAJOR_VERSION": (583, 580),
        "CTA_THREAD_DIMENSION0": (607, 592),
        "CTA_THREAD_DIMENSION1": (623, 608),
        "CTA_THREAD_DIMENSION2": (639, 624),
        "REGISTER_COUNT": (656, 648),
        "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (662, 657),
        "SHADER_LOCAL_MEMORY_LOW_SIZE": (759, 736),
        "BARRIER_COUNT": (767, 763),
        "PROGRAM_ADDRESS_LOWER": (1567, 1536),
        "PROGRAM_ADDRESS_UPPER": (1584, 1568),
        "SHADER_LOCAL_MEMORY_HIGH_SIZE": (1623, 1600),
        "SASS_VERSION": (1663, 1656),
        "DEPENDENT_QMD0_POINTER": (511, 480),
        "DEPENDENT_QMD0_ENABLE": (512, 512),
        "DEPENDENT_QMD0_ACTION": (515, 513),
        "DEPENDENT_QMD0_PREFETCH": (516, 516),
    },
    cbuf_addr_lower=_per(1055, 1024, 64, 8),
    cbuf_addr_upper=_per(1072, 1056, 64, 8),
    cbuf_size=_per(1087, 1075, 64, 8),
    cbuf_valid=_per(640, 640, 1, 8),
    cbuf_invalidate=_per(1074, 1074, 64, 8),
    cbuf_addr_shift=0,
    program_shift=0,
    shared_shift=0,
    local_shift=0,
)

V4 = Layout(
    version=4,
    size=384,
    fields={
        "QMD_GROUP_ID": (21, 16),
        "QMD_TYPE": (25, 23),
        "SHADER_LOCAL_MEMORY_LOW_SIZE": (535, 512),
        "SASS_VERSION": (543, 536),
        "SHADER_LOCAL_MEMORY_HIGH_SIZE": (567, 544),
        "API_VISIBLE_CALL_LIMIT": (568, 568),
        "SAMPLER_INDEX": (569, 569),
        "QMD_MINOR_VERSION": (579, 576),
        "QMD_MAJOR_VERSION": (583, 580),
        "SHARED_MEMORY_SIZE": (601, 584),
        "INVALIDATE_TEXTURE_HEADER_CACHE": (602, 602),
        "INVALIDATE_TEXTURE_SAMPLER_CACHE": (603, 603),
        "INVALIDATE_TEXTURE_DATA_CACHE": (604, 604),
        "INVALIDATE_SHADER_DATA_CACHE": (605, 605),
        "INVALIDATE_INSTRUCTION_CACHE": (606, 606),
        "INVALIDATE_SHADER_CONSTANT_CACHE": (607, 607),
        "MIN_SM_CONFIG_SHARED_MEM_SIZE": (613, 608),
        "MAX_SM_CONFIG_SHARED_MEM_SIZE": (619, 614),
        "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (625, 620),
        "GRID_WIDTH": (1055, 1024),
        "GRID_HEIGHT": (1071, 1056),
        "GRID_DEPTH": (1103, 1088),
        "CWD_MEMBAR_TYPE": (1137, 1136),
        "CTA_THREAD_DIMENSION0": (1167, 1152),
        "CTA_THREAD_DIMENSION1": (1183, 1168),
        "CTA_THREAD_DIMENSION2": (1199, 1184),
        "REGISTER_COUNT": (1208, 1200),
        "BARRIER_COUNT": (1215, 1211),
        "PROGRAM_ADDRESS_LOWER": (1247, 1216),
        "PROGRAM_ADDRESS_UPPER": (1272, 1248),
        "DEPENDENT_QMD0_ENABLE": (368, 368),
        "DEPENDENT_QMD0_ACTION": (371, 369),
        "DEPENDENT_QMD0_PREFETCH": (372, 372),
        "DEPENDENT_QMD0_POINTER": (479, 448),
        "SHARED_ALLOCATION_ENABLE": (626, 626),
        "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": (1375, 1344),
        "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1392, 1376),
        "PROGRAM_PREFETCH_SIZE": (1401, 1393),
        "DEPENDENCE_COUNTER": (15, 0),
        # Clusters (clcbc0qmd.h): a GRID_GPC_CGA grid runs in CGAs of WIDTH x HEIGHT x DEPTH
        # CTAs, each CGA on one GPC.
        "GPC_CGA_WIDTH": (2149, 2144),
        "GPC_CGA_HEIGHT": (2157, 2152),
        "GPC_CGA_DEPTH": (2165, 2160),
        "CGA_CTA_DISTRIBUTION_MODE": (2207, 2207),
        # Programmatic dependent launch (clcbc0qmd.h); rig_nv.grids says what rig lacks.
        "ENABLE_PROGRAM_PRE_EXIT": (1151, 1151),
        "PRE_EXIT_AT_LAST_CTA_LAUNCH": (1150, 1150),
        "ARRIVE_AT_LATCH_VALID": (28, 28),
        "WAIT_ON_LATCH_VALID": (29, 29),
        "REQUIRE_SCHEDULING_PCAS": (30, 30),
        "ARRIVE_AT_LATCH_ID": (1503, 1472),
        "WAIT_ON_LATCH_ID": (1535, 1504),
    },
    cbuf_addr_lower=_per(1567, 1536, 64, 8),
    cbuf_addr_upper=_per(1586, 1568, 64, 8),
    cbuf_size=_per(1599, 1587, 64, 8),
    cbuf_valid=_per(416, 416, 4, 8),
    cbuf_invalidate=_per(419, 419, 4, 8),
    cbuf_addr_shift=6,
    program_shift=0,
    shared_shift=0,
    local_shift=0,
    # clcbc0qmd.h: RELEASE_ENABLE(0) MW(320), RELEASE_STRUCTURE_SIZE(0) MW(322:321)
    # SEMAPHORE_TWO_WORDS (2) with RELEASE_PAYLOAD64B(0) MW(332): a 64-bit payload (on the
    # H200, scripts/queue_probe.py: ONE_WORD with PAYLOAD64B faults, Xid 13; ONE_WORD or
    # TWO_WORDS alone write 32 bits; libcuda's QMDs use ONE_WORD). RELEASE_MEMBAR_TYPE(0)
    # FE_NONE, as libcuda's (docs/results/cuda-launches-2026-12-01-v2.jsonl): CWD_MEMBAR_TYPE
    # L1_SYSMEMBAR flushes each CTA's writes. RELEASE_SEMAPHORE0_ADDR MW(696:640), _PAYLOAD
    # MW(767:704). The second release, RELEASE_ENABLE(1) MW(336), SEMAPHORE_FOUR_WORDS (0)
    # with PAYLOAD64B(1) MW(348): payload 0 at +0, the grid's end time at +8; its address
    # RELEASE_SEMAPHORE1_ADDR MW(824:768). Adding: RELEASE_REDUCTION_ENABLE(0) MW(324), OP
    # RED_ADD (0) MW(327:325), FORMAT UNSIGNED (0) MW(329:328); with PAYLOAD64B the H200 adds
    # 64 bits (scripts/submit_variants_probe.py carry, docs/results/step-runs-2026-12-04.txt).
    release=Release(control_at=40, control=1 | 2 << 1 | 1 << 12, address_at=80, payload_at=88,
                    stamp_control=1 | 0 << 1 | 1 << 12, stamp_at=96,
                    add_control=1 | 2 << 1 | 1 << 4 | 1 << 12),
)

V5 = Layout(
    version=5,
    size=384,
    fields={
        "QMD_GROUP_ID": (149, 144),
        "QMD_TYPE": (153, 151),
        "SASS_VERSION": (455, 448),
        "API_VISIBLE_CALL_LIMIT": (456, 456),
        "SAMPLER_INDEX": (457, 457),
        "QMD_MINOR_VERSION": (467, 464),
        "QMD_MAJOR_VERSION": (471, 468),
        "INVALIDATE_TEXTURE_HEADER_CACHE": (472, 472),
        "INVALIDATE_TEXTURE_SAMPLER_CACHE": (473, 473),
        "INVALIDATE_TEXTURE_DATA_CACHE": (474, 474),
        "INVALIDATE_SHADER_DATA_CACHE": (475, 475),
        "INVALIDATE_INSTRUCTION_CACHE": (476, 476),
        "INVALIDATE_SHADER_CONSTANT_CACHE": (477, 477),
        "CWD_MEMBAR_TYPE": (625, 624),
        "PROGRAM_ADDRESS_LOWER": (1055, 1024),
        "PROGRAM_ADDRESS_UPPER": (1076, 1056),
        "CTA_THREAD_DIMENSION0": (1103, 1088),
        "CTA_THREAD_DIMENSION1": (1119, 1104),
        "CTA_THREAD_DIMENSION2": (1127, 1120),
        "REGISTER_COUNT": (1136, 1128),
        "BARRIER_COUNT": (1141, 1137),
        "SHARED_MEMORY_SIZE": (1162, 1152),
        "MIN_SM_CONFIG_SHARED_MEM_SIZE": (1168, 1163),
        "MAX_SM_CONFIG_SHARED_MEM_SIZE": (1174, 1169),
        "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (1180, 1175),
        "SHADER_LOCAL_MEMORY_LOW_SIZE": (1199, 1184),
        "SHADER_LOCAL_MEMORY_HIGH_SIZE": (1215, 1200),
        "GRID_WIDTH": (1279, 1248),
        "GRID_HEIGHT": (1295, 1280),
        "GRID_DEPTH": (1327, 1312),
        "DEPENDENT_QMD0_ENABLE": (336, 336),
        "DEPENDENT_QMD0_ACTION": (339, 337),
        "DEPENDENT_QMD0_PREFETCH": (340, 340),
        "DEPENDENT_QMD0_POINTER": (415, 384),
        # Clusters (clcdc0qmd.h): as V4's, at new places.
        "GPC_CGA_WIDTH": (2053, 2048),
        "GPC_CGA_HEIGHT": (2061, 2056),
        "GPC_CGA_DEPTH": (2069, 2064),
        "CGA_CTA_DISTRIBUTION_MODE": (2111, 2111),
        "ENABLE_PROGRAM_PRE_EXIT": (639, 639),
        "PRE_EXIT_AT_LAST_CTA_LAUNCH": (638, 638),
        "ARRIVE_AT_LATCH_VALID": (730, 730),
        "WAIT_ON_LATCH_VALID": (731, 731),
        "REQUIRE_SCHEDULING_PCAS": (158, 158),
        "ARRIVE_AT_LATCH_ID": (671, 640),
        "WAIT_ON_LATCH_ID": (703, 672),
    },
    cbuf_addr_lower=_per(1375, 1344, 64, 8),
    cbuf_addr_upper=_per(1394, 1376, 64, 8),
    cbuf_size=_per(1407, 1395, 64, 8),
    cbuf_valid=_per(1856, 1856, 4, 8),
    cbuf_invalidate=_per(1859, 1859, 4, 8),
    cbuf_addr_shift=6,
    program_shift=4,
    shared_shift=7,
    local_shift=4,
)

LAYOUTS = {3: V3, 4: V4, 5: V5}

# Shared-memory carveouts per SM in KiB (Mesa nouveau_device.c init_shared_mem_sizes).
CARVEOUTS = {
    "sm_80": (0, 8, 16, 32, 64, 100, 132, 164),
    "sm_86": (0, 8, 16, 32, 64, 100),
    "sm_89": (0, 8, 16, 32, 64, 100),
    "sm_90": (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    "sm_100": (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    "sm_120": (0, 8, 16, 32, 64, 100),
}

QMD_TYPE_GRID_CTA = 2
QMD_TYPE_GRID_GPC_CGA = 3  # clcbc0qmd.h / clcdc0qmd.h: a grid of clusters, each on one GPC
CGA_CTA_DISTRIBUTION_MULTI_CAST = 1  # clcbc0qmd.h CGA_CTA_DISTRIBUTION_MODE_MULTI_CAST
CWD_MEMBAR_L1_SYSMEMBAR = 1
API_VISIBLE_CALL_LIMIT_NO_CHECK = 1


class Qmd:
    """A QMD being filled: named fields set and read back, bit-exact."""

    def __init__(self, layout: Layout, data: bytes | None = None) -> None:
        self.layout = layout
        self.value = int.from_bytes(data, "little") if data is not None else 0

    @property
    def data(self) -> bytes:
        return self.value.to_bytes(self.layout.size, "little")

    def _put(self, f: Field, value: int, name: str) -> None:
        hi, lo = f
        width = hi - lo + 1
        if not 0 <= value < (1 << width):
            raise ValueError(f"QMD V{self.layout.version} {name}: {value:#x} does not fit "
                             f"{width} bits")
        self.value = (self.value & ~(((1 << width) - 1) << lo)) | (value << lo)

    def _get(self, f: Field) -> int:
        hi, lo = f
        return (self.value >> lo) & ((1 << (hi - lo + 1)) - 1)

    def set(self, name: str, value: int) -> None:
        try:
            f = self.layout.fields[name]
        except KeyError:
            raise KeyError(f"QMD V{self.layout.version} has no field {name}") from None
        self._put(f, value, name)

    def get(self, name: str) -> int:
        return self._get(self.layout.fields[name])

    def set_program(self, address: int) -> None:
        lay = self.layout
        if address & ((1 << lay.program_shift) - 1):
            raise ValueError(
                f"program address 0x{address:x} is not {1 << lay.program_shift}-byte aligned")
        shifted = address >> lay.program_shift
        self.set("PROGRAM_ADDRESS_LOWER", shifted & 0xFFFFFFFF)
        self.set("PROGRAM_ADDRESS_UPPER", shifted >> 32)

    def program(self) -> int:
        shifted = self.get("PROGRAM_ADDRESS_LOWER") | (self.get("PROGRAM_ADDRESS_UPPER") << 32)
        return shifted << self.layout.program_shift

    def set_cbuf(self, index: int, address: int, size: int, *, invalidate: bool = True) -> None:
        lay = self.layout
        if address & ((1 << lay.cbuf_addr_shift) - 1):
            raise ValueError(f"constant buffer {index} at 0x{address:x} is not "
                             f"{1 << lay.cbuf_addr_shift}-byte aligned")
        if size % 16 or size <= 0:
            raise ValueError(
                f"constant buffer {index} size {size} is not a positive multiple of 16")
        shifted = address >> lay.cbuf_addr_shift
        self._put(lay.cbuf_addr_lower[index], shifted & 0xFFFFFFFF, f"CBUF{index}_ADDR_LOWER")
        self._put(lay.cbuf_addr_upper[index], shifted >> 32, f"CBUF{index}_ADDR_UPPER")
        self._put(lay.cbuf_size[index], size >> 4, f"CBUF{index}_SIZE")
        self._put(lay.cbuf_valid[index], 1, f"CBUF{index}_VALID")
        self._put(lay.cbuf_invalidate[index], int(invalidate), f"CBUF{index}_INVALIDATE")

    def cbuf(self, index: int) -> tuple[int, int, bool]:
        """(address, size, valid) of constant buffer ``index``, decoded."""
        lay = self.layout
        lower, upper = lay.cbuf_addr_lower[index], lay.cbuf_addr_upper[index]
        shifted = self._get(lower) | (self._get(upper) << 32)
        return (shifted << lay.cbuf_addr_shift, self._get(lay.cbuf_size[index]) << 4,
                bool(self._get(lay.cbuf_valid[index])))


def cbuf0_slot(layout: Layout) -> tuple[int, int]:
    """(byte offset, upper-address width) of constant buffer 0's address in a QMD: its lower
    32 bits fill the dword there and its upper bits start the next one (every version)."""
    lo_lo = layout.cbuf_addr_lower[0][1]
    up_hi, up_lo = layout.cbuf_addr_upper[0]
    assert lo_lo % 32 == 0 and up_lo == lo_lo + 32
    return lo_lo // 8, up_hi - up_lo + 1


def patch_cbuf0(layout: Layout, qmd: memoryview | bytearray, address: int) -> None:
    """Point constant buffer 0 of an encoded QMD at ``address`` (its size and flags kept)."""
    at, width = cbuf0_slot(layout)
    shifted = address >> layout.cbuf_addr_shift
    upper = int.from_bytes(qmd[at + 4 : at + 8], "little")
    upper = (upper & ~((1 << width) - 1)) | (shifted >> 32)
    qmd[at : at + 8] = ((shifted & 0xFFFFFFFF) | (upper << 32)).to_bytes(8, "little")


DEPENDENT_QMD_SCHEDULE = 1  # DEPENDENT_QMD0_ACTION_QMD_SCHEDULE
DEPENDENT_ACTION = DEPENDENT_QMD_SCHEDULE


def chain(layout: Layout, qmd: memoryview | bytearray, following: int) -> None:
    """Make an encoded QMD schedule the QMD at ``following`` (256-byte aligned, below 2^40)
    once its own grid completes: the GPU runs the two back to back with no host work."""
    if following & 0xFF or following >> 40:
        raise ValueError(f"a dependent QMD at 0x{following:x} is not 256-aligned below 2^40")
    q = Qmd(layout, bytes(qmd))
    q.set("DEPENDENT_QMD0_POINTER", following >> 8)
    q.set("DEPENDENT_QMD0_ACTION", DEPENDENT_ACTION)
    q.set("DEPENDENT_QMD0_PREFETCH", 1)
    q.set("DEPENDENT_QMD0_ENABLE", 1)
    qmd[:] = q.data


def _carveouts(arch: str) -> tuple[int, ...]:
    return CARVEOUTS.get(arch.rstrip("af"), CARVEOUTS["sm_86"])


def smem_config(arch: str, nbytes: int) -> tuple[int, int]:
    """(smallest carveout that fits, largest carveout), each encoded KiB/4 + 1."""
    sizes = _carveouts(arch)
    fits = next((k for k in sizes if k * 1024 >= nbytes), None)
    if fits is None:
        raise ValueError(f"{nbytes} bytes of shared memory exceed {arch}'s {sizes[-1]} KiB")
    return fits // 4 + 1, sizes[-1] // 4 + 1


def carveout_max(arch: str) -> int:
    """The largest shared-memory carveout of an SM of ``arch``, in bytes."""
    return _carveouts(arch)[-1] * 1024


def max_shared(arch: str) -> int:
    """The most shared memory one block may use on ``arch``: the largest carveout less the
    1 KiB the system reserves per block."""
    return carveout_max(arch) - 1024


@dataclass(frozen=True)
class Launch:
    """What one launch puts into a QMD."""

    program: int
    grid: tuple[int, int, int]  # in CTAs; a cluster launch's QMD counts it in clusters
    block: tuple[int, int, int]
    registers: int
    shared_bytes: int  # static + dynamic + the system's reservation, as the SM must provide
    local_bytes: int  # per thread
    barriers: int
    cbufs: tuple[tuple[int, int, int], ...]  # (index, address, size)
    sass_version: int
    arch: str
    cluster: tuple[int, int, int] | None = None  # CTAs a cluster (V4, V5); None: no clusters


def encode(version: int, launch: Launch) -> bytes:
    """The QMD of ``launch`` in layout ``version`` (3, 4 or 5)."""
    q = Qmd(LAYOUTS[version])
    lay = q.layout
    q.set("QMD_MAJOR_VERSION", version)
    q.set("QMD_MINOR_VERSION", 0)
    q.set("API_VISIBLE_CALL_LIMIT", API_VISIBLE_CALL_LIMIT_NO_CHECK)
    q.set("SAMPLER_INDEX", 0)
    grid: tuple[int, ...] = launch.grid
    if launch.cluster is not None:
        if "GPC_CGA_WIDTH" not in lay.fields:
            raise ValueError(f"QMD V{version} has no clusters (Hopper's V4 on)")
        if any(g % n for g, n in zip(launch.grid, launch.cluster, strict=True)):
            raise ValueError(f"grid {launch.grid} is not a whole number of {launch.cluster} "
                             "clusters")
        q.set("QMD_TYPE", QMD_TYPE_GRID_GPC_CGA)
        for name, n in zip(("GPC_CGA_WIDTH", "GPC_CGA_HEIGHT", "GPC_CGA_DEPTH"), launch.cluster,
                           strict=True):
            q.set(name, n)
        # libcuda's cluster QMDs on the H200 count the grid in clusters and ask for MULTI_CAST
        # (docs/results/cuda-launches-2026-12-01-v2.jsonl; docs/hopper-launch.md). A grid in
        # CTAs launched the cluster's size times too many CTAs there, which faulted. V5 is
        # taken to count alike (unmeasured: rig_nv.grids refuses clusters on sm_100).
        grid = tuple(g // n for g, n in zip(launch.grid, launch.cluster, strict=True))
        q.set("CGA_CTA_DISTRIBUTION_MODE", CGA_CTA_DISTRIBUTION_MULTI_CAST)
    elif "QMD_TYPE" in lay.fields:
        # A V4 QMD left at QMD_TYPE 0 (QUEUE), as Mesa NAK leaves it, runs no grid on the H200.
        q.set("QMD_TYPE", QMD_TYPE_GRID_CTA)
    if "SM_GLOBAL_CACHING_ENABLE" in lay.fields:
        q.set("SM_GLOBAL_CACHING_ENABLE", 1)
    q.set("QMD_GROUP_ID", 0x3F)
    q.set("CWD_MEMBAR_TYPE", CWD_MEMBAR_L1_SYSMEMBAR)
    for name in ("INVALIDATE_TEXTURE_HEADER_CACHE", "INVALIDATE_TEXTURE_SAMPLER_CACHE",
                 "INVALIDATE_TEXTURE_DATA_CACHE", "INVALIDATE_SHADER_DATA_CACHE"):
        q.set(name, 1)
    q.set_program(launch.program)
    q.set("GRID_WIDTH", grid[0])
    q.set("GRID_HEIGHT", grid[1])
    q.set("GRID_DEPTH", grid[2])
    q.set("CTA_THREAD_DIMENSION0", launch.block[0])
    q.set("CTA_THREAD_DIMENSION1", launch.block[1])
    q.set("CTA_THREAD_DIMENSION2", launch.block[2])
    q.set("REGISTER_COUNT", launch.registers)
    q.set("BARRIER_COUNT", launch.barriers)
    shared = -(-launch.shared_bytes // 0x100) * 0x100
    q.set("SHARED_MEMORY_SIZE", shared >> lay.shared_shift)
    low, high = smem_config(launch.arch, shared)
    q.set("MIN_SM_CONFIG_SHARED_MEM_SIZE", low)
    q.set("TARGET_SM_CONFIG_SHARED_MEM_SIZE", low)
    q.set("MAX_SM_CONFIG_SHARED_MEM_SIZE", high)
    q.set("SHADER_LOCAL_MEMORY_HIGH_SIZE", launch.local_bytes >> lay.local_shift)
    q.set("SASS_VERSION", launch.sass_version)
    for index, address, size in launch.cbufs:
        q.set_cbuf(index, address, size)
    return q.data
