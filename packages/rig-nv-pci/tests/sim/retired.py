"""The simulated GSP-RM's retired video-memory pages: what it answers CPU-RM's
NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES. Worked from open-gpu-kernel-modules 570.144 by
hand, as the rest of the simulator (no rig_nv_pci constant is shared):

- the control is 0x20801348 (ctrl2080fb.h), which a GSP client's CPU-RM sends to GSP-RM's
  internal subdevice (arch/ampere/mem_mgr_ga100.c memmgrGetBlackListPages_GA100) only where
  the static info's bPageRetirementSupported is set (gpu_gspclient.c
  gpuCheckPageRetirementSupport_GSPCLIENT);
- its params, NV2080_CTRL_FB_GET_DYNAMIC_OFFLINED_PAGES_PARAMS: offlined[64] of
  NV2080_CTRL_FB_DYNAMIC_OFFLINED_ADDRESS_INFO {NvU64 pageNumber; NvU8 source} (16 bytes
  each, from 0), then NvU32 validEntries at 1024, NvU32 baseIndex at 1028, NvBool bMore at
  1032; 1040 bytes;
- a pass lists the retired pages from baseIndex on, at most
  NV2080_CTRL_FB_DYNAMIC_BLACKLIST_MAX_ENTRIES (64), bMore set while more follow; a GPU
  retires at most NV2080_CTRL_FB_DYNAMIC_BLACKLIST_MAX_PAGES (512); pageNumber is the page's
  FB address >> 12 (RM_PAGE_SHIFT), source NV2080_CTRL_FB_DYNAMIC_BLACKLISTED_PAGES_SOURCE_
  DPR_DBE (1);
- a baseIndex from 512 on answers NV_ERR_INVALID_ARGUMENT (as the vGPU guest's
  subdeviceCtrlCmdFbGetDynamicOfflinedPages_VF, kern_mem_sys_ctrl.c, refuses an index past
  its passes); a GPU without page retirement answers NV_ERR_NOT_SUPPORTED (the simulator's
  choice: GSP-RM's own handler is not in the open sources; CPU-RM reads that answer as "No
  blacklisted pages").
"""

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
