"""The simulated GSP-RM's retired video-memory pages: what it answers CPU-RM's
NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES, in passes of at most 64 from baseIndex on,
bMore set while more follow; a GPU without page retirement answers NV_ERR_NOT_SUPPORTED.

Worked from open-gpu-kernel-modules 570.144 by hand, as the rest of the simulator (no
rig_nv_pci constant is shared). The params' layout and each rule's source:
docs/rig-nv-pci-modules/sim-retired.md."""

from __future__ import annotations

import struct
from collections.abc import Sequence

CTRL_GET_DYNAMIC_OFFLINED_PAGES = 0x20801348
PASS_ENTRIES, MAX_PAGES = 64, 512
ENTRY_SIZE, VALID_ENTRIES_AT, BASE_INDEX_AT, MORE_AT, PARAMS_SIZE = 16, 1024, 1028, 1032, 1040
SOURCE_DPR_DBE = 1
PAGE_SHIFT = 12
NV_ERR_INVALID_ARGUMENT, NV_ERR_NOT_SUPPORTED = 0x1F, 0x56


def answer(params: bytes, retired: Sequence[int] | None) -> tuple[int, bytes]:
    """(status, params) of a pass asked with ``params``, for the pages at FB addresses
    ``retired`` (``None``: the GPU retires no pages)."""
    if retired is None:
        return NV_ERR_NOT_SUPPORTED, params
    if len(params) != PARAMS_SIZE:
        return NV_ERR_INVALID_ARGUMENT, params
    (base,) = struct.unpack_from("<I", params, BASE_INDEX_AT)
    if base >= MAX_PAGES:
        return NV_ERR_INVALID_ARGUMENT, params
    listed = retired[base:base + PASS_ENTRIES]
    out = bytearray(PARAMS_SIZE)
    for i, address in enumerate(listed):
        struct.pack_into("<QB", out, i * ENTRY_SIZE, address >> PAGE_SHIFT, SOURCE_DPR_DBE)
    struct.pack_into("<I", out, VALID_ENTRIES_AT, len(listed))
    struct.pack_into("<I", out, BASE_INDEX_AT, base)
    out[MORE_AT] = int(base + PASS_ENTRIES < len(retired))
    return 0, bytes(out)
