"""The engines and copy engines the simulated GSP-RM reports: what a client asks to choose the
copy engine of its copy channel. Worked from NVIDIA's headers by hand (open-gpu-kernel-modules
570.211.01 / 580.142), as the rest of the simulator (no rig_nv constant is shared):

- NV2080_CTRL_CMD_GPU_GET_ENGINES_V2 (0x20800170, ctrl2080gpu.h): {NvU32 engineCount; NvU32
  engineList[NV2080_GPU_MAX_ENGINES_LIST_SIZE 0x54]}, NV2080_ENGINE_TYPE_* values
  (cl2080_notification.h: GRAPHICS 1, COPY0..COPY9 0x09..0x12, COPY10.. 0x34.., NVDEC0 0x13,
  NVJPG 0x2b); a stubbed copy engine (no PCEs) is not listed (gpu.c gpuUpdateEngineTable
  lists engines with classes, which a stubbed CE loses);
- NV2080_CTRL_CMD_CE_GET_CAPS_V2 (0x20802a03, ctrl2080ce.h): {NvU32 ceEngineType; NvU8
  capsTbl[2]}; an engine type that is no copy engine, or one not present, answers
  NV_ERR_NOT_SUPPORTED (kernel_ce_shared.c subdeviceCtrlCmdCeGetCapsV2_IMPL);
- NV2080_CTRL_CMD_CE_GET_CE_PCE_MASK (0x20802a02): {NvU32 ceEngineType; NvU32 pceMask}, the
  same refusal.

A GSP client's CPU-RM answers the first two itself (their g_subdevice_nvoc.c flags have no
ROUTE_TO_PHYSICAL; CE_GET_CAPS_V2 merges GSP-RM's NV2080_CTRL_CMD_CE_GET_PHYSICAL_CAPS with its
own NVLink caps, kernel_ce.c kceGetDeviceCaps_IMPL); the PCE mask is GSP-RM's (ROUTE_TO_PHYSICAL).
rig's PCI path, standing for CPU-RM, sends all three to GSP-RM, and the simulated GSP-RM answers
them as the RM answers a client; whether the real GSP-RM answers the first two for a client
(it is built from the same sources) is not in the open sources.

The default table is a GA102 over PCIe without NVLink peers, as kernel_ce_ga102.c / _ga100.c
(580.142) map it: LCE 2 and 3 the sysmem LCEs, each given an FBHUB PCE
(kceMapPceLceForSysmemLinks_GA102, NV_CE_SYS_ALLOWED_LCE_MASK 0x0C), LCE 0 and 1 the GRCEs
(NV_CE_GRCE_ALLOWED_LCE_MASK 0x03) sharing those PCEs (kceGetMappings_GA100's GRCE sharing
case), so all four are SHARED; caps bits (ctrl2080ce.h, byte 0) GRCE 0x01, SHARED 0x02, SYSMEM
0x20, P2P 0x40, BL_SIZE_GT_64K 0x80; byte 1 SUPPORTS_NONPIPELINED_BL 0x01, _PIPELINED_BL 0x02.
Which FBHUB PCEs (0 and 1 here) is made up.
"""

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
