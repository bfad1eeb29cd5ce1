"""The simulated GPU's runlists and channel doorbell: which runlist each engine is on, as
GSP-RM's device info table reports it (:data:`DEFAULT` is the simulator's choice: no channel
rig makes is on runlist 0), and what a doorbell write must hold (ChID, runlist, and on GB20x
RUNLIST_DOORBELL _ENABLE) for the PBDMA to fetch.

Worked from NVIDIA's headers by hand (open-gpu-kernel-modules 570.144), as the rest of the
simulator (no rig_nv_pci constant is shared). Each field and source:
docs/rig-nv-pci-modules/sim-runlists.md."""

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
