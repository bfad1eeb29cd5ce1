"""What NVIDIA's libcuda wrote on the H200 for the launches of scripts/cuda_launch_capture, read
as data from docs/results/cuda-launches-2026-12-01-v2.jsonl, and QMD V4 decoded by positions
re-typed from open-gpu-doc's classes/compute/clcbc0qmd.h (not read from rig_nv.qmd).

A bank record is what capture.c found in a pushbuffer (/dev/nvidiactl): the driver's words,
then the compute class's inline upload of the parameters (clcbc0.h OFFSET_OUT_UPPER,
LINE_LENGTH_IN, LAUNCH_DMA, LOAD_INLINE_DATA), so its bytes are placed in the bank by that
upload's header. Run as a script, it prints libcuda's QMD and bank beside rig's for the same
launches (cluster_rank of cubins/hopper.cu, on the stand-in GPU).
"""

from __future__ import annotations

import dataclasses
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CAPTURE = ROOT / "docs" / "results" / "cuda-launches-2026-12-01-v2.jsonl"
GPU_READS = "/dev/nvidiactl"  # the mapping the GPU reads; [heap] and [stack] hits are copies
PARAMS = 0x210  # sm_90: the parameters' offset in bank 0 (capture.c, the cubins' .nv.info)


def _per(name: str, hi: int, lo: int, stride: int, count: int) -> dict[str, tuple[int, int]]:
    return {f"{name}{i}": (hi + i * stride, lo + i * stride) for i in range(count)}


# QMD V04_00 (clcbc0qmd.h), every field but the queue-only ones (CIRCULAR_QUEUE_*, INNER_*,
# OUTER_*, HW_ONLY_*); (i)-indexed fields numbered, as many as fit before the next field.
V4_FIELDS: dict[str, tuple[int, int]] = {
    "DEPENDENCE_COUNTER": (15, 0), "QMD_GROUP_ID": (21, 16),
    "ADD_TO_HEAD_OF_QMD_GROUP_LINKED_LIST": (22, 22), "QMD_TYPE": (25, 23),
    "ARRIVE_AT_LATCH_VALID": (28, 28), "WAIT_ON_LATCH_VALID": (29, 29),
    "REQUIRE_SCHEDULING_PCAS": (30, 30), "TPC_DISABLE_MASK_VALID": (31, 31),
    **_per("RELEASE_ENABLE", 320, 320, 16, 3), **_per("RELEASE_STRUCTURE_SIZE", 322, 321, 16, 3),
    **_per("RELEASE_MEMBAR_TYPE", 323, 323, 16, 3),
    **_per("RELEASE_REDUCTION_ENABLE", 324, 324, 16, 3),
    **_per("RELEASE_REDUCTION_OP", 327, 325, 16, 3),
    **_per("RELEASE_REDUCTION_FORMAT", 329, 328, 16, 3),
    **_per("RELEASE_TRAP_TYPE", 331, 330, 16, 3), **_per("RELEASE_PAYLOAD64B", 332, 332, 16, 3),
    **_per("RELEASE_RESERVED_INFO", 335, 333, 16, 3),
    **_per("DEPENDENT_QMD_ENABLE", 368, 368, 5, 2), **_per("DEPENDENT_QMD_ACTION", 371, 369, 5, 2),
    **_per("DEPENDENT_QMD_PREFETCH", 372, 372, 5, 2),
    "SELF_COPY_ON_COMPLETION": (378, 378), "DEMOTE_L2_EVICT_LAST": (379, 379),
    "DISABLE_AUTO_INVALIDATE": (380, 380), "CORRELATION_ID_INTERNAL": (381, 381),
    "CWD_MEMBAR_TASK_CHASING_ENABLE": (382, 382), "CORRELATION_ID": (415, 384),
    **_per("CONSTANT_BUFFER_VALID", 416, 416, 4, 8),
    **_per("CONSTANT_BUFFER_PREFETCH", 418, 417, 4, 8),
    **_per("CONSTANT_BUFFER_INVALIDATE", 419, 419, 4, 8),
    "DEPENDENT_QMD0_POINTER": (479, 448), "DEPENDENT_QMD1_POINTER": (511, 480),
    "SHADER_LOCAL_MEMORY_LOW_SIZE": (535, 512), "SASS_VERSION": (543, 536),
    "SHADER_LOCAL_MEMORY_HIGH_SIZE": (567, 544), "API_VISIBLE_CALL_LIMIT": (568, 568),
    "SAMPLER_INDEX": (569, 569), "CONSTANT_BUFFER_PREFETCH_PRE_MAX_SIZE_SHIFTED8": (575, 570),
    "QMD_MINOR_VERSION": (579, 576), "QMD_MAJOR_VERSION": (583, 580),
    "SHARED_MEMORY_SIZE": (601, 584), "INVALIDATE_TEXTURE_HEADER_CACHE": (602, 602),
    "INVALIDATE_TEXTURE_SAMPLER_CACHE": (603, 603), "INVALIDATE_TEXTURE_DATA_CACHE": (604, 604),
    "INVALIDATE_SHADER_DATA_CACHE": (605, 605), "INVALIDATE_INSTRUCTION_CACHE": (606, 606),
    "INVALIDATE_SHADER_CONSTANT_CACHE": (607, 607), "MIN_SM_CONFIG_SHARED_MEM_SIZE": (613, 608),
    "MAX_SM_CONFIG_SHARED_MEM_SIZE": (619, 614), "TARGET_SM_CONFIG_SHARED_MEM_SIZE": (625, 620),
    "SHARED_ALLOCATION_ENABLE": (626, 626), "RELEASE_SEMAPHORE0_ADDR_LOWER": (671, 640),
    "RELEASE_SEMAPHORE0_ADDR_UPPER": (696, 672), "RELEASE_SEMAPHORE0_PAYLOAD_LOWER": (735, 704),
    "RELEASE_SEMAPHORE0_PAYLOAD_UPPER": (767, 736), "RELEASE_SEMAPHORE1_ADDR_LOWER": (799, 768),
    "RELEASE_SEMAPHORE1_ADDR_UPPER": (824, 800), "RELEASE_SEMAPHORE1_PAYLOAD_LOWER": (863, 832),
    "RELEASE_SEMAPHORE1_PAYLOAD_UPPER": (895, 864), "RELEASE_SEMAPHORE2_ADDR_LOWER": (927, 896),
    "RELEASE_SEMAPHORE2_ADDR_UPPER": (952, 928), "RELEASE_SEMAPHORE2_PAYLOAD_LOWER": (991, 960),
    "RELEASE_SEMAPHORE2_PAYLOAD_UPPER": (1023, 992), "GRID_WIDTH": (1055, 1024),
    "GRID_HEIGHT": (1071, 1056), "GRID_DEPTH": (1103, 1088),
    "CWD_REFERENCE_COUNT_DELTA_MINUS_ONE": (1127, 1120), "CWD_REFERENCE_COUNT_ID": (1133, 1128),
    "CWD_REFERENCE_COUNT_INCR_ENABLE": (1134, 1134),
    "CWD_REFERENCE_COUNT_DECR_ENABLE": (1135, 1135), "CWD_MEMBAR_TYPE": (1137, 1136),
    "SEQUENTIALLY_RUN_CTAS": (1138, 1138), "CTA_LAUNCH_QUEUE": (1139, 1139),
    "FREE_CTA_SLOTS_EMPTY_SM": (1147, 1140), "SYNC_DOMAIN_ID": (1149, 1148),
    "PRE_EXIT_AT_LAST_CTA_LAUNCH": (1150, 1150), "ENABLE_PROGRAM_PRE_EXIT": (1151, 1151),
    "CTA_THREAD_DIMENSION0": (1167, 1152), "CTA_THREAD_DIMENSION1": (1183, 1168),
    "CTA_THREAD_DIMENSION2": (1199, 1184), "REGISTER_COUNT": (1208, 1200),
    "BARRIER_COUNT": (1215, 1211), "PROGRAM_ADDRESS_LOWER": (1247, 1216),
    "PROGRAM_ADDRESS_UPPER": (1272, 1248), "OCCUPANCY_THRESHOLD_WARP": (1287, 1280),
    "OCCUPANCY_MAX_WARP": (1295, 1288), "OCCUPANCY_THRESHOLD_REGISTER": (1303, 1296),
    "OCCUPANCY_MAX_REGISTER": (1311, 1304), "OCCUPANCY_THRESHOLD_SHARED_MEM": (1319, 1312),
    "OCCUPANCY_MAX_SHARED_MEM": (1327, 1320), "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": (1375, 1344),
    "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": (1392, 1376), "PROGRAM_PREFETCH_SIZE": (1401, 1393),
    "PROGRAM_PREFETCH_TYPE": (1403, 1402),
    "LATCH_ACQUIRE_INVALIDATE_SHADER_DATA_CACHE": (1406, 1406),
    "LATCH_ACQUIRE_INVALIDATE_TEXTURE_DATA_CACHE": (1407, 1407),
    "GRID_WIDTH_RESUME": (1439, 1408), "GRID_HEIGHT_RESUME": (1455, 1440),
    "GRID_DEPTH_RESUME": (1471, 1456), "ARRIVE_AT_LATCH_ID": (1503, 1472),
    "WAIT_ON_LATCH_ID": (1535, 1504),
    **_per("CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_", 1567, 1536, 64, 8),
    **_per("CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_", 1586, 1568, 64, 8),
    **_per("CONSTANT_BUFFER_SIZE_SHIFTED4_", 1599, 1587, 64, 8),
    "GPC_CGA_WIDTH": (2149, 2144), "GPC_CGA_HEIGHT": (2157, 2152), "GPC_CGA_DEPTH": (2165, 2160),
    "CGA_CTA_DISTRIBUTION_MODE": (2207, 2207), "GPU_CGA_WIDTH": (2223, 2208),
    "GPU_CGA_HEIGHT": (2239, 2224), "GPU_CGA_DEPTH": (2255, 2240),
    "DEBUG_ID_LOWER": (2399, 2368), "DEBUG_ID_UPPER": (2431, 2400),
    **_per("TPC_DISABLE_MASK", 2463, 2432, 32, 18),
}

# Compute class methods (open-gpu-doc classes/compute/clcbc0.h) of an inline upload, and the
# method header's fields (Fermi on: opcode 31:29, count 28:16, subchannel 15:13, method/4 12:0;
# Mesa's nv_push.h NVC0 headers). Opcode 1 increments the method, 3 does not.
OFFSET_OUT_UPPER = 0x188
LOAD_INLINE_DATA = 0x1B4
INCREASING, NON_INCREASING = 1, 3


def decode(qmd: bytes) -> dict[str, int]:
    """Every V4 field of a 384-byte QMD."""
    v = int.from_bytes(qmd, "little")
    return {n: (v >> lo) & ((1 << (hi - lo + 1)) - 1) for n, (hi, lo) in V4_FIELDS.items()}


@dataclass(frozen=True)
class Captured:
    """One launch of capture.c: its shape and arguments, the QMD libcuda wrote where the GPU
    reads it (or None), and bank 0 as found there: words by bank offset, and the bank's GPU
    address as the parameters' upload names it (or None)."""

    variant: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int] | None
    shared: int
    a: int
    b: int
    qmd: bytes | None = None
    bank: dict[int, int] | None = None
    bank_address: int | None = None

    @property
    def fields(self) -> dict[str, int]:
        assert self.qmd is not None, self.variant
        return decode(self.qmd)


def _header(word: int) -> tuple[int, int, int]:
    """(opcode, count, method) of a pushbuffer method header."""
    return word >> 29, (word >> 16) & 0x1FFF, (word & 0x1FFF) << 2


def place_bank(record: bytes, params: bytes) -> tuple[dict[int, int], int]:
    """The bank words a cbuf0 record holds (by bank offset) and the bank's GPU address.

    The record ends with the parameters' upload: OFFSET_OUT_UPPER/OFFSET_OUT (where they go),
    ..., a NON_INCREASING LOAD_INLINE_DATA header, the parameters. The words before the
    OFFSET_OUT_UPPER header are the driver's, ending where the parameters begin."""
    words = struct.unpack_from(f"<{len(record) // 4}I", record)
    at = record.index(params) // 4
    op, count, method = _header(words[at - 1])
    assert (op, method) == (NON_INCREASING, LOAD_INLINE_DATA) and count * 4 >= len(params)
    start = next(i for i in range(at - 2, -1, -1)
                 if _header(words[i]) == (INCREASING, 2, OFFSET_OUT_UPPER))
    out = words[start + 1] << 32 | words[start + 2]
    bank_address = out - PARAMS
    shift = PARAMS - start * 4
    placed = {i * 4 + shift: w for i, w in enumerate(words[:start])}
    for j in range(0, len(params), 4):
        placed[PARAMS + j] = struct.unpack_from("<I", params, j)[0]
    return placed, bank_address


def load(path: Path = CAPTURE) -> dict[str, Captured]:
    """Every launch of the capture, by variant, with what was found where the GPU reads."""
    got: dict[str, Captured] = {}
    for line in path.read_text().splitlines():
        r = json.loads(line)
        v = r.get("variant")
        if "launch" in r:
            c = r["cluster"]
            got[v] = Captured(v, tuple(r["grid"]), tuple(r["block"]),
                              tuple(c) if c[0] else None, r["shared"], r["a"], r["b"])
        elif r.get("map") == GPU_READS and r["kind"] == "qmd":
            got[v] = dataclasses.replace(got[v], qmd=bytes.fromhex(r["bytes"]))
        elif r.get("map") == GPU_READS and r["kind"] == "cbuf0":
            params = struct.pack("<QI", got[v].a, got[v].b)
            bank, address = place_bank(bytes.fromhex(r["bytes"]), params)
            got[v] = dataclasses.replace(got[v], bank=bank, bank_address=address)
    return got


# The capture's kernels.cu declares __cluster_dims__(2, 1, 1) on fixed2 alone.
DECLARED = {"fixed2_declared": (2, 1, 1)}


def rig_launch(d: Any, c: Captured) -> Any:
    """rig's prepared launch (rig_nv.launch.Prepared) of the same shape as ``c``, of
    cluster_rank (hopper.cu: no static shared memory, as the capture's ``clus``), with the
    cubin's shape where the captured kernel declared one and non-portable sizes allowed."""
    from rig_nv import launch as L  # noqa: N812

    fn = d.load((Path(__file__).parent / "cubins" / "hopper.sm_90.cubin").read_bytes())[
        "cluster_rank"]
    cluster = c.cluster or DECLARED.get(c.variant)
    if cluster is not None and (cluster != c.cluster or cluster[0] * cluster[1] * cluster[2] > 8):
        fn = dataclasses.replace(fn, kernel=dataclasses.replace(
            fn.kernel, cluster=cluster, max_cluster_rank=None), prepared={}, packers={})
    return L.prepare(d, fn, c.grid, c.block, c.shared, c.cluster)


def main() -> None:
    """Print libcuda's QMD fields and bank words beside rig's, where either is non-zero."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_gpu import open_fake

    d, _ = open_fake()
    try:
        for c in load().values():
            if c.qmd is None or c.variant == "pdl":
                continue
            prep = rig_launch(d, c)
            mine = decode(prep.qmd)
            print(f"== {c.variant}: grid {c.grid} block {c.block} cluster {c.cluster} "
                  f"shared {c.shared}")
            for name, theirs in c.fields.items():
                if theirs or mine[name]:
                    flag = "" if theirs == mine[name] else "  <> differ"
                    print(f"  {name:45} libcuda {theirs:#12x}  rig {mine[name]:#12x}{flag}")
            if c.bank is not None:
                for at, theirs in sorted(c.bank.items()):
                    rig = struct.unpack_from("<I", prep.bank, at)[0] if at < len(prep.bank) else 0
                    if theirs or rig:
                        print(f"  bank {at:#05x}  libcuda {theirs:#12x}  rig {rig:#12x}")
    finally:
        d.stop()


if __name__ == "__main__":
    main()
