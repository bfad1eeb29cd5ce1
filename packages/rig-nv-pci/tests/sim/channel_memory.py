"""The memory a GSP client's CPU-RM hands the simulated GSP-RM for a channel (its alloc,
kernel_channel.c _kchannelSendChannelAllocRpc) and for its group's compute context
(NV2080_CTRL_CMD_GPU_PROMOTE_CTX), and how GSP-RM checks both: a channel only of 4 KiB FBMEM
instance blocks, USERD and method buffers as CPU-RM lays them out, with its ChID free on its
runlist; context buffers usable, aligned, of the engine's size and mapped where they say.
The notes in full: docs/rig-nv-pci-modules/sim-gsp_rm.md. Written from NVIDIA's interfaces
(open-gpu-kernel-modules 570.144), importing nothing of rig_nv_pci or rig_nv."""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, NamedTuple

from . import chid, gmmu
from . import runlists as runlist_table
from .chid import NV_ERR_INVALID_ARGUMENT
from .pbdma import USERD_SIZE, Channel

if TYPE_CHECKING:
    from .gsp_rm import SimRm

PAGE = 0x1000
# NV2080_CTRL_CMD_CE_GET_FAULT_METHOD_BUFFER_SIZE (ctrl2080ce.h): {NvU32 size}; the size the
# simulated GSP-RM answers is its own (the real one is GSP-RM's, not in the open sources)
CTRL_CE_METHOD_BUFFER_SIZE, METHOD_BUFFER_SIZE = 0x20802A08, 0x3000
# NV_CHANNEL_ALLOC_PARAMS (alloc_channel.h), worked by hand: hObjectError 0, hObjectBuffer 4,
# gpFifoOffset 8, gpFifoEntries 16, flags 20, hContextShare 24, hVASpace 28,
# hUserdMemory[8] 32, userdOffset[8] 64, engineType 128, cid 132, subDeviceId 136,
# hObjectEccError 140, then NV_MEMORY_DESC_PARAMS {base u64, size u64, addressSpace u32,
# cacheAttrib u32} instanceMem 144, userdMem 168, ramfcMem 192, mthdbufMem 216,
# hPhysChannelGroup 240, internalFlags 244, errorNotifierMem 248, eccErrorNotifierMem 272,
# ProcessID 296, SubProcessID 300, encryptIv[3] 304, decryptIv[3] 316, hmacNonce[8] 328,
# tpcConfigID 360: 368 bytes with the 8-byte alignment
MEM_DESC = struct.Struct("<QQII")
CH_INSTANCE, CH_USERD, CH_RAMFC, CH_MTHDBUF, CH_ERROR_NOTIFIER = 144, 168, 192, 216, 248
CHANNEL_PARAMS_SIZE = 368
ADDR_SYSMEM, ADDR_FBMEM = 1, 2  # NV_ADDRESS_SPACE (mem_desc.h)
# dev_ram.h: NV_RAMIN_ALLOC_SIZE 4096 (aligned to 1 << NV_RAMIN_BASE_SHIFT 12), NV_RAMIN_RAMFC
# its first 128 words, NV_RAMIN_PAGE_DIR_BASE_LO (128*32+31:12); USERD's size is the PBDMA's
INSTANCE_SIZE, RAMFC_SIZE, RAMIN_PAGE_DIR_BASE = 0x1000, 0x200, 128 * 4
# NV0080_CTRL_CMD_FIFO_GET_ENGINE_CONTEXT_PROPERTIES (ctrl0080fifo.h: {engineId, alignment,
# size}): the simulated sizes of ENGINE_ID_GRAPHICS 0x0, _PATCH 0x10, _FECS_EVENT 0x17,
# _PRIV_ACCESS_MAP 0x18 (the real ones are GSP-RM's)
CTRL_ENGINE_CONTEXT_PROPERTIES = 0x801707
CTX_PROPERTIES = {0x0: (0x1000, 0x48000), 0x10: (0x1000, 0x10000), 0x17: (0x1000, 0x4000),
                  0x18: (0x1000, 0x2000)}
# NV2080_CTRL_CMD_GPU_PROMOTE_CTX (ctrl2080gpu.h): engineType, hClient, ChID, hChanClient,
# hObject, hVirtMemory, virtAddress u64 at 24, size u64 at 32, entryCount at 40, then from 48
# 16 entries {gpuPhysAddr u64, gpuVirtAddr u64, size u64, physAttr u32, bufferId u16,
# bInitialize u8, bNonmapped u8}; buffer ids MAIN 0, PATCH 2, FECS_EVENT 9,
# PRIV_ACCESS_MAP 10, UNRESTRICTED_PRIV_ACCESS_MAP 11 (what a compute object needs,
# kgrobjGetPromoteIds_FWCLIENT), each with its engine id above
CTRL_PROMOTE_CTX = 0x2080012B
PROMOTE_HEAD, PROMOTE_ENTRY = struct.Struct("<6IQQI4x"), struct.Struct("<QQQIHBB")
CTX_ENGINE = {0: 0x0, 2: 0x10, 9: 0x17, 10: 0x18, 11: 0x18}
GROUP_CTX, GLOBAL_CTX = (0, 2), (9, 10, 11)
CTX_PHYS_ATTR = 4  # NV2080_CTRL_GPU_INITIALIZE_CTX_APERTURE_VIDMEM 0, GPU_CACHEABLE_NO 2:2
NV_ERR_INVALID_OBJECT_HANDLE = 0x33  # nverr.h


class PromoteEntry(NamedTuple):
    """One NV2080_CTRL_GPU_PROMOTE_CTX_BUFFER_ENTRY."""

    fb: int
    va: int
    size: int
    attr: int
    buffer_id: int
    initialize: int
    nonmapped: int


def promote_entries(params: bytes) -> list[PromoteEntry]:
    """The entries a PROMOTE_CTX's params name (entryCount of them, at most 16)."""
    count = min(PROMOTE_HEAD.unpack_from(params)[8], 16)
    return [PromoteEntry(*PROMOTE_ENTRY.unpack_from(params, PROMOTE_HEAD.size
                                                    + i * PROMOTE_ENTRY.size))
            for i in range(count)]


def promote(rm: SimRm, params: bytes) -> int:
    """NV2080_CTRL_CMD_GPU_PROMOTE_CTX of a GSP client: each buffer's video memory
    checked (usable, aligned, of the engine's size, free of registered memory and instance
    blocks), initialized once, and its GPU address walked to it."""
    if len(params) < PROMOTE_HEAD.size + 16 * PROMOTE_ENTRY.size:
        return NV_ERR_INVALID_ARGUMENT
    engine, _, _, _, channel, _, _, _, count = PROMOTE_HEAD.unpack_from(params)
    if engine != 1 or channel not in rm.channels or not 0 < count <= 16:
        return NV_ERR_INVALID_ARGUMENT
    group = rm.channels[channel].group
    mine = rm.contexts.setdefault(group, {})
    taken = list(rm.fbmem.values()) + [(c.instance, INSTANCE_SIZE)
                                         for c in rm.channels.values()]
    done: list[tuple[int, int, int, bool]] = []
    for fb, va, size, attr, buffer_id, initialize, nonmapped in promote_entries(params):
        if buffer_id not in CTX_ENGINE:
            return NV_ERR_INVALID_ARGUMENT
        align, need = CTX_PROPERTIES[CTX_ENGINE[buffer_id]]
        known = (rm.global_ctx if buffer_id in GLOBAL_CTX else mine).get(buffer_id)
        if (known is None and not initialize) or (known is not None and known != (fb, size)):
            return NV_ERR_INVALID_ARGUMENT
        if (attr != CTX_PHYS_ATTR or fb % align or size < need
                or not rm.usable(fb, size)
                or any(a < fb + size and fb < a + n for a, n in taken)):
            return NV_ERR_INVALID_ARGUMENT
        if not nonmapped:
            try:
                for page in (va, va + size - PAGE):
                    where = rm.translate(page)
                    if not where.video or where.address != fb + page - va:
                        return NV_ERR_INVALID_ARGUMENT
            except gmmu.MmuFault:
                return NV_ERR_INVALID_ARGUMENT
        done.append((buffer_id, fb, size, not nonmapped))
    with rm.lock:
        for buffer_id, fb, size, mapped in done:
            (rm.global_ctx if buffer_id in GLOBAL_CTX else mine)[buffer_id] = (fb, size)
            if mapped:
                rm.promoted.setdefault(group, set()).add(buffer_id)
    return 0

def alloc_channel(rm: SimRm, parent: int, handle: int, params: bytes) -> int:
    """A GSP client's channel: its memory as the client's CPU-RM hands it over
    (kernel_channel.c _kchannelSendChannelAllocRpc), checked, the instance block's page
    directory base written (dev_ram.h NV_RAMIN_PAGE_DIR_BASE, as GSP-RM sets up the
    instance block it was given)."""
    if len(params) < CHANNEL_PARAMS_SIZE:
        return NV_ERR_INVALID_ARGUMENT
    notifier, buffer, gpfifo, entries = struct.unpack_from("<IIQI", params, 0)
    userd_handle = struct.unpack_from("<I", params, 32)[0]
    userd_offset = struct.unpack_from("<Q", params, 64)[0]
    inst, userd, ramfc, mthd = (MEM_DESC.unpack_from(params, at)
                                for at in (CH_INSTANCE, CH_USERD, CH_RAMFC, CH_MTHDBUF))
    error = MEM_DESC.unpack_from(params, CH_ERROR_NOTIFIER)
    if userd_handle not in rm.fbmem:
        return NV_ERR_INVALID_OBJECT_HANDLE
    runlist = chid.runlist(rm.groups, parent, params)
    runlist_id = rm.runlists.get(runlist_table.rm_engine_type(runlist))
    if runlist_id is None:
        return NV_ERR_INVALID_ARGUMENT
    status, channel_id = chid.named(params, runlist_id, rm.channels.values())
    if status:
        return status
    base = inst[0]
    taken = [(at, n) for at, n in rm.fbmem.values()] + [
        (c.instance, INSTANCE_SIZE) for c in rm.channels.values()]
    if (buffer or inst[1:3] != (INSTANCE_SIZE, ADDR_FBMEM) or base % INSTANCE_SIZE
            or not rm.usable(base, INSTANCE_SIZE)
            or any(a < base + INSTANCE_SIZE and base < a + n for a, n in taken)
            or any(rm.vram[base:base + INSTANCE_SIZE])):  # the client zeroes it
        return NV_ERR_INVALID_ARGUMENT
    if ramfc[:3] != (base, RAMFC_SIZE, ADDR_FBMEM):
        return NV_ERR_INVALID_ARGUMENT
    fb, length = rm.fbmem[userd_handle]
    if (userd[:3] != (fb + userd_offset, USERD_SIZE, ADDR_FBMEM) or userd[0] % USERD_SIZE
            or userd_offset + USERD_SIZE > length):
        return NV_ERR_INVALID_ARGUMENT
    if (mthd[1:3] != (METHOD_BUFFER_SIZE, ADDR_SYSMEM)
            or rm.gpu.host.view(mthd[0], METHOD_BUFFER_SIZE) is None):
        return NV_ERR_INVALID_ARGUMENT
    pages = rm.sysmem.get(notifier)
    if not pages or error[0] != pages[0] or error[2] != ADDR_SYSMEM or error[1] < 16:
        return NV_ERR_INVALID_ARGUMENT
    if rm.walks:
        if not rm.roots:
            return NV_ERR_INVALID_ARGUMENT
        root = list(rm.roots.values())[-1]
        # TARGET 1:0 VID_MEM 0, LO 31:12, HI 7:0 of the next word
        struct.pack_into("<II", rm.vram, base + RAMIN_PAGE_DIR_BASE,
                         root & 0xFFFFF000, root >> 32 & 0xFF)
    rm.channels[handle] = Channel(handle, channel_id, gpfifo, entries, userd[0], parent,
                                    error[0], base, mthd[0], runlist=runlist,
                                    runlist_id=runlist_id)
    return 0
