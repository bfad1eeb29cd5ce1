"""The engines and copy engines the simulated GSP-RM reports (GPU_GET_ENGINES_V2,
CE_GET_CAPS_V2, CE_GET_CE_PCE_MASK): what a client asks to choose the copy engine of its copy
channel. The default table is a GA102 over PCIe without NVLink peers.

Worked from NVIDIA's headers by hand, as the rest of the simulator (no rig_nv constant is
shared). Each control's layout, the default table's sources and what the open sources leave
open: docs/rig-nv-pci-modules/sim-engines.md."""

from __future__ import annotations

import struct

CTRL_GET_ENGINES_V2, CTRL_CE_GET_CAPS_V2, CTRL_CE_GET_PCE_MASK = (
    0x20800170, 0x20802A03, 0x20802A02)
MAX_ENGINES = 0x54
NV_ERR_NOT_SUPPORTED = 0x56
GRAPHICS, NVDEC0, NVJPG = 0x01, 0x13, 0x2B
_SYSMEM_LCE = bytes((0x02 | 0x20 | 0x40 | 0x80, 0x03))
_GRCE = bytes((0x01 | 0x02 | 0x20 | 0x40 | 0x80, 0x03))
GA102_COPY_ENGINES: dict[int, tuple[bytes, int]] = {  # LCE -> (capsTbl, pceMask)
    0: (_GRCE, 0x1), 1: (_GRCE, 0x2), 2: (_SYSMEM_LCE, 0x1), 3: (_SYSMEM_LCE, 0x2)}


def copy_type(index: int) -> int:
    """NV2080_ENGINE_TYPE_COPY(index)."""
    return 0x09 + index if index < 10 else 0x34 + index - 10


def copy_index(engine: int) -> int | None:
    if 0x09 <= engine <= 0x12:
        return engine - 0x09
    if 0x34 <= engine <= 0x3D:
        return engine - 0x34 + 10
    return None


def answer(cmd: int, params: bytes,
           copy_engines: dict[int, tuple[bytes, int]]) -> tuple[int, bytes] | None:
    """(status, params) for the three controls, ``None`` for any other."""
    if cmd == CTRL_GET_ENGINES_V2:
        listed = [GRAPHICS, *(copy_type(i) for i in sorted(copy_engines)), NVDEC0, NVJPG]
        out = bytearray(4 + 4 * MAX_ENGINES)
        struct.pack_into(f"<I{len(listed)}I", out, 0, len(listed), *listed)
        return 0, bytes(out)
    if cmd not in (CTRL_CE_GET_CAPS_V2, CTRL_CE_GET_PCE_MASK):
        return None
    if len(params) < 8:
        return NV_ERR_NOT_SUPPORTED, params
    (engine,) = struct.unpack_from("<I", params)
    index = copy_index(engine)
    if index is None or index not in copy_engines:
        return NV_ERR_NOT_SUPPORTED, params
    caps, pces = copy_engines[index]
    if cmd == CTRL_CE_GET_CAPS_V2:
        return 0, struct.pack("<I2s2x", engine, caps)
    return 0, struct.pack("<II", engine, pces)
