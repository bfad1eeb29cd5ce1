"""Which runlist each engine's channels go on, and the work-submit token a channel's doorbell
carries, as a GSP client's CPU-RM knows and builds them (open-gpu-kernel-modules 570.144).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-runlists.md."""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping

from rig_edge import RigError

NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE = 0x20801112
MAX_ENTRIES = 32  # NV2080_CTRL_FIFO_GET_DEVICE_INFO_TABLE_MAX_ENTRIES
MAX_DEVICES = 256  # NV2080_CTRL_FIFO_GET_DEVICE_INFO_TABLE_MAX_DEVICES
ENGINE_DATA_TYPES = 16  # NV2080_CTRL_FIFO_GET_DEVICE_INFO_TABLE_ENGINE_DATA_TYPES
ENGINE_INFO_TYPE_RM_ENGINE_TYPE, ENGINE_INFO_TYPE_RUNLIST = 2, 3
# NV2080_CTRL_FIFO_DEVICE_ENTRY {NvU32 engineData[16], pbdmaIds[2], pbdmaFaultIds[2],
# numPbdmas; char engineName[16]}: 100 bytes; the params {NvU32 baseIndex, numEntries; NvBool
# bMore; entries[32]} put the entries 4-aligned at 12: 3212 bytes
ENTRY = struct.Struct(f"<{ENGINE_DATA_TYPES}I2I2II16s")
HEAD = struct.Struct("<IIB3x")
PARAMS_SIZE = HEAD.size + MAX_ENTRIES * ENTRY.size

# the token's fields: NV_CTRL_VF_DOORBELL_VECTOR 11:0, _RUNLIST_ID 22:16 (ga100/dev_ctrl.h,
# gb202/dev_vm.h NV_VIRTUAL_FUNCTION_DOORBELL); GB202's RUNLIST_DOORBELL 30:30, _ENABLE 1
VECTOR_MASK, RUNLIST_SHIFT, RUNLIST_MASK = 0xFFF, 16, 0x7F
RUNLIST_DOORBELL_ENABLE = 1 << 30
NV2080_ENGINE_TYPE_COPY10, RM_ENGINE_TYPE_COPY10 = 0x34, 0x13


class RunlistError(RigError):
    """GSP-RM's device info table could not be read, or names no runlist for an engine."""


def rm_engine_type(engine: int) -> int:
    """The RM_ENGINE_TYPE of NV2080_ENGINE_TYPE ``engine`` (gpuGetRmEngineType), for the
    engines rig makes channels on (GR, COPY); any other is returned as it is."""
    if NV2080_ENGINE_TYPE_COPY10 <= engine < NV2080_ENGINE_TYPE_COPY10 + 10:
        return engine - NV2080_ENGINE_TYPE_COPY10 + RM_ENGINE_TYPE_COPY10
    return engine


def decode(params: bytes) -> tuple[dict[int, int], bool]:
    """One pass's {RM_ENGINE_TYPE: runlist} and bMore."""
    _, count, more = HEAD.unpack_from(params)
    if count > MAX_ENTRIES:
        raise RunlistError(f"is garbled: {count} entries in a pass of at most {MAX_ENTRIES}")
    found = {}
    for i in range(count):
        data = ENTRY.unpack_from(params, HEAD.size + i * ENTRY.size)
        found[data[ENGINE_INFO_TYPE_RM_ENGINE_TYPE]] = data[ENGINE_INFO_TYPE_RUNLIST]
    return found, bool(more)


def get(control: Callable[[bytearray], None]) -> dict[int, int]:
    """{RM_ENGINE_TYPE: runlist} of every engine, asked pass by pass through ``control`` (the
    device info table's control on GSP-RM's internal subdevice, which fills the params in
    place) as kfifoGetHostDeviceInfoTable_KERNEL asks; raises :class:`RunlistError`."""
    table: dict[int, int] = {}
    for base in range(0, MAX_DEVICES, MAX_ENTRIES):
        params = bytearray(PARAMS_SIZE)
        HEAD.pack_into(params, 0, base, 0, 0)
        control(params)
        found, more = decode(bytes(params))
        table.update(found)
        if not more:
            break
    return table


class Doorbells:
    """The work-submit tokens of one GPU's channels: ``runlists`` is GSP-RM's table
    ({RM_ENGINE_TYPE: runlist}, :func:`get`), ``enable`` whether the chip's token carries
    RUNLIST_DOORBELL _ENABLE (chips.Family.runlist_doorbell)."""

    def __init__(self, name: str, runlists: Mapping[int, int], enable: bool) -> None:
        self.name, self.runlists, self.enable = name, dict(runlists), enable

    def runlist(self, engine: int) -> int:
        """The runlist of NV2080_ENGINE_TYPE ``engine``'s channels (kchannelGetRunlistId)."""
        found = self.runlists.get(rm_engine_type(engine))
        if found is None:
            raise RunlistError(f"{self.name}: GSP-RM's device info table names no runlist for "
                               f"engine type 0x{engine:x}")
        return found

    def token(self, engine: int, chid: int) -> int:
        """The token of ChID ``chid`` on ``engine``'s runlist, as CPU-RM builds it."""
        token = (self.runlist(engine) & RUNLIST_MASK) << RUNLIST_SHIFT | chid & VECTOR_MASK
        return token | (RUNLIST_DOORBELL_ENABLE if self.enable else 0)
