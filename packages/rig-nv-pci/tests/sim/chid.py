"""The ChID of a GSP client's channel in the simulated GSP-RM: the one the client's CPU-RM
names in NV_CHANNEL_ALLOC_PARAMS.flags (USERD page and index), one ChID space per runlist; a
ChID in use or GSP-RM's own answers NV_ERR_NO_MEMORY, none named NV_ERR_INVALID_ARGUMENT.
A channel's runlist is its group's engine type's (sim/runlists.py); the work-submit token
answered is the ChID.

Worked from NVIDIA's headers by hand, as the rest of the simulator (no rig_nv_pci constant
is shared). Each field and its source: docs/rig-nv-pci-modules/sim-chid.md."""

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
