"""The ChID of a GSP client's channel in the simulated GSP-RM: the one the client's CPU-RM
names in NV_CHANNEL_ALLOC_PARAMS.flags (kernel_channel.c _kchannelSendChannelAllocRpc, its
IS_GSP_CLIENT branch), one ChID space per runlist. Worked from NVIDIA's headers by hand, as
the rest of the simulator (no rig_nv_pci constant is shared).

- alloc_channel.h (570.211.01): NVOS04_FLAGS_CHANNEL_USERD_INDEX_VALUE 10:8,
  _USERD_INDEX_FIXED 11:11, _USERD_INDEX_PAGE_VALUE 20:12, _USERD_INDEX_PAGE_FIXED 21:21; the
  ChID is PAGE_VALUE * 8 + VALUE (kernel_fifo.c kfifoChidMgrAllocChid_IMPL: userdPageIdx *
  ownerGranularity + internalIdx, 8 channels of 512 bytes to a 4 KiB USERD page);
- PAGE_FIXED with INDEX_FIXED too: NV_ERR_INVALID_STATE (kernel_channel_gm107.c
  kchannelAllocHwID_GM107, NV_ASSERT_OR_RETURN on _USERD_INDEX_FIXED _FALSE);
- a ChID in use on the runlist, or GSP-RM's own (below KFIFO_NUM_GSP_RESERVED_CHANNELS 1,
  kernel_fifo.c: outside a GSP client's alloc range): NV_ERR_NO_MEMORY, what the fixed-address
  eheapAlloc answers when the offset is not free (eheap_old.c, its ``failed:``);
- no PAGE_FIXED: the real GSP-RM would pick a ChID itself (GROW_UP); the simulated one
  answers NV_ERR_INVALID_ARGUMENT, since a GSP client's CPU-RM always names it.

A channel's runlist is its group's: the runlist the device info table (sim/runlists.py) names
for the engineType of the group's NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS (hObjectError 0,
hObjectEccError 4, hVASpace 8, engineType 12); a channel whose parent is no group, its own
engineType's (128). Engines on one runlist (a GRCE and its GR) share its ChIDs. The
work-submit token the simulated GSP-RM answers is the ChID (what a GSP client's CPU-RM adds
to it is the client's: sim/runlists.py).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Protocol

KEPLER_CHANNEL_GROUP_A = 0xA06C  # cla06c.h
NV_ERR_INVALID_ARGUMENT, NV_ERR_INVALID_STATE, NV_ERR_NO_MEMORY = 0x1F, 0x40, 0x51
GSP_RESERVED = 1  # kernel_fifo.c KFIFO_NUM_GSP_RESERVED_CHANNELS
GROUP_ENGINE_TYPE, CHANNEL_FLAGS, CHANNEL_ENGINE_TYPE = 12, 20, 128


class Held(Protocol):
    chid: int
    runlist_id: int


def group_engine(params: bytes) -> int:
    """The engineType of NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS (0 where too short)."""
    if len(params) < GROUP_ENGINE_TYPE + 4:
        return 0
    return int(struct.unpack_from("<I", params, GROUP_ENGINE_TYPE)[0])


def runlist(groups: dict[int, int], parent: int, params: bytes) -> int:
    """The NV2080 engine type whose runlist a channel of ``parent`` is on."""
    if parent in groups:
        return groups[parent]
    return int(struct.unpack_from("<I", params, CHANNEL_ENGINE_TYPE)[0])


def named(params: bytes, runlist: int, channels: Iterable[Held]) -> tuple[int, int]:
    """(status, ChID) of a channel on runlist ``runlist`` (the device info table's number)
    whose NV_CHANNEL_ALLOC_PARAMS are ``params``, ``channels`` those there are."""
    taken = {c.chid for c in channels if c.runlist_id == runlist}
    flags = struct.unpack_from("<I", params, CHANNEL_FLAGS)[0]
    if not flags >> 21 & 1:
        return NV_ERR_INVALID_ARGUMENT, 0
    if flags >> 11 & 1:
        return NV_ERR_INVALID_STATE, 0
    chid = (flags >> 12 & 0x1FF) * 8 + (flags >> 8 & 7)
    if chid < GSP_RESERVED or chid in taken:
        return NV_ERR_NO_MEMORY, chid
    return 0, chid
