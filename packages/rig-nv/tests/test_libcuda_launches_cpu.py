"""rig's QMDs and banks beside what libcuda wrote on the H200 for the same launches (issue 18).

The capture (docs/results/cuda-launches-2026-12-01-v2.jsonl) is read as data by
libcuda_capture.py; QMD V4 positions are its own, re-typed from clcbc0qmd.h. Every field is
held equal to libcuda's but those :data:`APART` names, each with why rig differs there.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from libcuda_capture import Captured, decode, load, rig_launch

CAPTURED = load()
# Launches whose QMD capture.c found where the GPU reads it. The dependent launch (pdl) is
# rig's Misuse (rig_nv.grids.PDL_MISSING); its QMD is read by the latch test below.
LAUNCHES = [c for c in CAPTURED.values() if c.qmd is not None and c.variant != "pdl"]
CLUSTERS = [c for c in LAUNCHES if c.fields["QMD_TYPE"] == 3]
BANKS = [c for c in LAUNCHES if c.bank is not None]

# QMD fields where rig is not libcuda, and why that does not matter to a launch.
APART = {
    # Addresses and sizes of each one's own memory.
    **{f"CONSTANT_BUFFER_{part}{i}": "addresses and sizes of each one's banks (libcuda's "
       "banks 1, 5 and 7 are its own; rig's bank 0 is the kernel's size)"
       for part in ("ADDR_LOWER_SHIFTED6_", "ADDR_UPPER_SHIFTED6_", "SIZE_SHIFTED4_", "VALID",
                    "PREFETCH", "INVALIDATE") for i in range(8)},
    "PROGRAM_ADDRESS_LOWER": "each one's code address",
    "PROGRAM_ADDRESS_UPPER": "each one's code address",
    "PROGRAM_PREFETCH_ADDR_LOWER_SHIFTED": "libcuda prefetches the code; rig does not",
    "PROGRAM_PREFETCH_ADDR_UPPER_SHIFTED": "libcuda prefetches the code; rig does not",
    "PROGRAM_PREFETCH_SIZE": "libcuda prefetches the code; rig does not",
    "INVALIDATE_SHADER_CONSTANT_CACHE": "rig invalidates bank 0 alone (CONSTANT_BUFFER_"
                                        "INVALIDATE0), libcuda the whole constant cache",
    # libcuda's completion and ordering: rig's timeline releases its own semaphore.
    **{f"RELEASE_{part}0": "libcuda's completion semaphore; rig's timeline releases its own"
       for part in ("ENABLE", "STRUCTURE_SIZE")},
    "RELEASE_SEMAPHORE0_ADDR_LOWER": "libcuda's completion semaphore",
    "RELEASE_SEMAPHORE0_ADDR_UPPER": "libcuda's completion semaphore",
    "RELEASE_SEMAPHORE0_PAYLOAD_LOWER": "libcuda's completion semaphore",
    "DEPENDENT_QMD_ENABLE0": "libcuda chains a QMD of its own after each launch",
    "DEPENDENT_QMD_ACTION0": "libcuda chains a QMD of its own after each launch",
    "DEPENDENT_QMD_PREFETCH0": "libcuda chains a QMD of its own after each launch",
    "DEPENDENT_QMD0_POINTER": "libcuda chains a QMD of its own after each launch",
    "ARRIVE_AT_LATCH_VALID": "programmatic dependent launch, which rig refuses",
    "ARRIVE_AT_LATCH_ID": "programmatic dependent launch, which rig refuses",
    "ENABLE_PROGRAM_PRE_EXIT": "programmatic dependent launch, which rig refuses",
    # The kernels differ (capture.c's clus and plain; rig's cluster_rank).
    "REGISTER_COUNT": "the kernel's own (capture.c's kernels are not rig's fixture)",
    "SHADER_LOCAL_MEMORY_HIGH_SIZE": "libcuda gives every launch local memory; rig what the "
                                     "kernel needs (cluster_rank: none)",
    "SAMPLER_INDEX": "no textures: how samplers are indexed is moot",
    # libcuda's carveout choice follows occupancy; rig's is the smallest that fits a block
    # (the SM may take more, up to MAX, which is libcuda's).
    "MIN_SM_CONFIG_SHARED_MEM_SIZE": "libcuda's occupancy heuristic",
    "TARGET_SM_CONFIG_SHARED_MEM_SIZE": "libcuda's occupancy heuristic",
    # libcuda marks TPCs 72-127 (none on GH100, whose 8 GPCs hold 9 TPCs each) disabled for
    # clusters of more than two CTAs: no TPC that exists is taken away.
    "TPC_DISABLE_MASK_VALID": "TPCs that do not exist on GH100",
    "TPC_DISABLE_MASK2": "TPCs that do not exist on GH100",
    "TPC_DISABLE_MASK3": "TPCs that do not exist on GH100",
}


@pytest.mark.parametrize("c", LAUNCHES, ids=lambda c: c.variant)
def test_every_qmd_field_is_libcudas_but_those_apart(dev: Any, c: Captured) -> None:
    """Issue 18: a cluster launch's QMD carries what CUDA's launches write: QMD_TYPE
    GRID_GPC_CGA, GPC_CGA_WIDTH/HEIGHT/DEPTH, CGA_CTA_DISTRIBUTION_MODE and the grid in
    clusters, shared memory with the system's 1 KiB; every other field too, but APART's."""
    d, _ = dev
    mine = decode(rig_launch(d, c).qmd)
    theirs = c.fields
    differ = {n: (theirs[n], mine[n]) for n in theirs if n not in APART and theirs[n] != mine[n]}
    assert differ == {}, f"(libcuda, rig): {differ}"


def test_the_capture_holds_the_cluster_launches_it_made() -> None:
    """The records read as capture.c launched them: six cluster QMDs (fixed2's shape from its
    cubin), each with its cluster's shape and its grid in clusters."""
    assert [c.variant for c in CLUSTERS] == [
        "cluster2", "cluster2x2", "cluster4_shared100k", "cluster8", "cluster16_nonportable",
        "fixed2_declared"]
    for c in CLUSTERS:
        f = c.fields
        shape = c.cluster or (2, 1, 1)
        assert (f["GPC_CGA_WIDTH"], f["GPC_CGA_HEIGHT"], f["GPC_CGA_DEPTH"]) == shape
        assert (f["GRID_WIDTH"], f["GRID_HEIGHT"], f["GRID_DEPTH"]) == tuple(
            g // n for g, n in zip(c.grid, shape, strict=True))
        assert (f["CTA_THREAD_DIMENSION0"], f["CTA_THREAD_DIMENSION1"]) == c.block[:2]


# Bank-0 words (by offset) libcuda writes that rig does not, or writes as its own address, and
# why no kernel misses them: none of the fixtures' SASS (hopper.cu, Triton's) reads them.
BANK_APART = {
    0x24: "the local window's high word: each one's own address (rig's checked below)",
    0x2C: "the dynamic shared bytes: unread",
    0x30: "a count of the stream's launches: unread",
    0x38: "an address of libcuda's, a launch's own: unread", 0x3C: "(its high word)",
    0x40: "a word of libcuda's: unread", 0x58: "a word of libcuda's: unread",
    0x68: "a word of libcuda's: unread",
    0xC0: "the bank's own address: unread", 0xC4: "(its high word)",
    0xC8: "bank 1's address: unread", 0xCC: "(its high word)",
    0x10C: "a word of libcuda's: unread", 0x114: "a word of libcuda's: unread",
    0x118: "the kernel's code address: unread", 0x11C: "(its high word)",
    0x170: "the shared window: each one's own address (checked below)", 0x174: "(its high word)",
    0x198: "the parameters' address: rig writes it as each launch is sent (checked below)",
    0x19C: "(its high word)",
    0x1A0: "the parameters' end address: unread", 0x1A4: "(its high word)",
    0x200: "a process-wide word of libcuda's: unread", 0x204: "(its high word)",
}


@pytest.mark.parametrize("c", BANKS, ids=lambda c: c.variant)
def test_every_bank_word_is_libcudas_but_those_apart(dev: Any, c: Captured) -> None:
    """Issue 18: the cluster words of bank 0 (0x13c shared bytes, 0x140 explicit, 0x144 shape,
    0x150 its reciprocals, 0x15c the grid in clusters, 0x16c the window's stride, 0x188 CTAs a
    cluster) and the stack (0x28) are libcuda's; the shared window (0x170) lies 4 GiB above
    the local window (0x20) in both."""
    d, _ = dev
    assert c.bank is not None and c.qmd is not None
    bank = rig_launch(d, c).bank
    for at, theirs in c.bank.items():
        mine = struct.unpack_from("<I", bank, at)[0] if at + 4 <= len(bank) else 0
        if at not in BANK_APART and at < 0x210:
            assert mine == theirs, f"bank 0x{at:x}: libcuda {theirs:#x}, rig {mine:#x}"
    local, shared = d.windows
    assert struct.unpack_from("<Q", bank, 0x170)[0] == shared == local + (4 << 30)
    assert c.bank[0x174] == c.bank[0x24] + 1 and c.bank[0x170] == 0  # libcuda's: local + 4 GiB
    # The bank is the one the QMD names, and the parameters' address is in it.
    assert c.bank_address == decode(c.qmd)["CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6_0"] << 6 | (
        decode(c.qmd)["CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6_0"] << 38)
    assert c.bank[0x198] | c.bank[0x19C] << 32 == c.bank_address + 0x210


def test_the_latches_cuda_uses_for_dependent_launches() -> None:
    """The facts rig_nv.grids.PDL_MISSING rests on: every launch arrives at a latch of its own,
    ids 0x38 to 0x3f in launch order and round again (capture.c's eleventh launch, pdl, has
    0x3a); the dependent launch also waits on the latch of the launch before it, with
    REQUIRE_SCHEDULING_PCAS and its data caches invalidated at the latch."""
    order = [c for c in CAPTURED.values() if c.qmd is not None]
    ids = [c.fields["ARRIVE_AT_LATCH_ID"] for c in order]
    assert ids == [0x38, 0x39, 0x3A, 0x3B, 0x3C, 0x3D, 0x3E, 0x3F, 0x3A]
    for c in order:
        assert c.fields["ARRIVE_AT_LATCH_VALID"] == c.fields["ENABLE_PROGRAM_PRE_EXIT"] == 1
        dependent = int(c.variant == "pdl")
        assert c.fields["WAIT_ON_LATCH_VALID"] == c.fields["REQUIRE_SCHEDULING_PCAS"] == dependent
        assert c.fields["LATCH_ACQUIRE_INVALIDATE_SHADER_DATA_CACHE"] == dependent
    assert CAPTURED["pdl"].fields["WAIT_ON_LATCH_ID"] == 0x39
