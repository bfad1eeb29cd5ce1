"""The simulated GPU's runlists and channel doorbell: which runlist each engine is on, as
GSP-RM's device info table reports it, and what a doorbell write must hold for the PBDMA to
fetch. Worked from NVIDIA's headers by hand (open-gpu-kernel-modules 570.144), as the rest of
the simulator (no rig_nv_pci constant is shared):

- NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE (0x20801112, ctrl2080fifo.h): {NvU32 baseIndex,
  numEntries; NvBool bMore; entries[32] at 12} of NV2080_CTRL_FIFO_DEVICE_ENTRY (100 bytes:
  engineData[16], pbdmaIds[2], pbdmaFaultIds[2], numPbdmas, engineName[16]), engineData by
  engine_info.h's ENGINE_INFO_TYPE: RM_ENGINE_TYPE 2, RUNLIST 3. RM_ENGINE_TYPE
  (gpu_engine_type.h) numbers GR0 1, COPY0..COPY19 0x9..0x1c; a client's NV2080 COPY10..19
  are 0x34..0x3d (cl2080_notification.h).
- Which runlist an engine is on is the chip's device info (NV_PTOP_DEVICE_INFO2), in no
  header: :data:`DEFAULT` is the simulator's choice, GR0 with its GRCEs (COPY0, COPY1) on
  runlist 1 and each other copy engine on its own, so that no channel rig makes is on
  runlist 0 and a token without its runlist names none.
- The doorbell, NV_VIRTUAL_FUNCTION_DOORBELL (dev_vm.h 0x30090, the usermode page's
  NOTIFY_CHANNEL_PENDING 0x90, clc361.h): VECTOR 11:0 the ChID, RUNLIST_ID 22:16
  (ga100/dev_ctrl.h NV_CTRL_VF_DOORBELL; gb202/dev_vm.h), and on GB20x RUNLIST_DOORBELL 30:30,
  which must read _ENABLE 1 (gb202/dev_vm.h; on GA10x/AD10x the bit is not the field's).
"""

from __future__ import annotations

import struct

CTRL_GET_DEVICE_INFO_TABLE = 0x20801112
MAX_ENTRIES = 32
HEAD = struct.Struct("<IIB3x")
ENTRY = struct.Struct("<16I2I2II16s")
RM_ENGINE_TYPE, RUNLIST = 2, 3
GR0, COPY0 = 0x1, 0x9
DEFAULT: dict[int, int] = {GR0: 1, COPY0: 1, COPY0 + 1: 1, COPY0 + 2: 2, COPY0 + 3: 3}
DOORBELL = 0x90  # NVC361_NOTIFY_CHANNEL_PENDING in the usermode page
RUNLIST_DOORBELL_ENABLE = 1 << 30  # gb202/dev_vm.h, GB20x only


def rm_engine_type(nv2080: int) -> int:
    """RM_ENGINE_TYPE of an NV2080_ENGINE_TYPE (GR and COPY alike but COPY10..19)."""
    return nv2080 - 0x34 + 0x13 if 0x34 <= nv2080 <= 0x3D else nv2080


def answer(params: bytes, table: dict[int, int]) -> tuple[int, bytes]:
    """(status, params) of the device info table's control: the entries from baseIndex."""
    if len(params) < HEAD.size + MAX_ENTRIES * ENTRY.size:
        return 0x1F, params  # NV_ERR_INVALID_ARGUMENT
    (base,) = struct.unpack_from("<I", params)
    rows = sorted(table.items())[base:base + MAX_ENTRIES]
    out = bytearray(params)
    HEAD.pack_into(out, 0, base, len(rows), int(base + MAX_ENTRIES < len(table)))
    for i, (engine, runlist) in enumerate(rows):
        data = [0] * 16
        data[RM_ENGINE_TYPE], data[RUNLIST] = engine, runlist
        ENTRY.pack_into(out, HEAD.size + i * ENTRY.size, *data, 0, 0, 0, 0, 1, b"")
    return 0, bytes(out)


def decode(token: int, gb20x: bool) -> tuple[int, int] | None:
    """(runlist, ChID) a doorbell write names, or ``None`` where the PBDMA ignores it (GB20x's
    RUNLIST_DOORBELL not _ENABLE)."""
    if gb20x and not token & RUNLIST_DOORBELL_ENABLE:
        return None
    return token >> 16 & 0x7F, token & 0xFFF
