"""The RM controls a device sends: their numbers, and the two list-shaped queries.

Numbers from open-gpu-kernel-modules src/common/sdk/nvidia/inc/ctrl/ (the header of each is
named beside it); the same in releases 570 and 580.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rig_nv.layouts import Params, rm_ffi

if TYPE_CHECKING:
    from rig_nv.rm import Path

# Control commands (ctrl0080gpu.h, ctrl2080gr.h, ctrl2080fb.h, ctrlc36f.h, ctrla06fgpfifo.h,
# ctrl906f.h, ctrl83dedebug.h).
NV0080_CTRL_CMD_GPU_GET_CLASSLIST = 0x800201
NV2080_CTRL_CMD_GR_GET_INFO = 0x20801201
NV2080_CTRL_CMD_FB_GET_INFO = 0x20801301
NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN = 0xC36F0108
NVA06C_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06C0101
NVA06F_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06F0103  # one channel (ctrla06fgpfifo.h)
NV2080_CTRL_CMD_PERF_BOOST = 0x2080200A
# A channel's last MMU fault (rig_nv.faults): exported by every GPFIFO channel class (KernelChannel,
# g_kernel_channel_nvoc.c: flags NON_PRIVILEGED | ROUTE_TO_PHYSICAL, so the GSP answers it).
NV906F_CTRL_CMD_GET_MMU_FAULT_INFO = 0x906F0106
# A graphics context's MMU faults with their access types (rig_nv.faults), a control of a
# GT200_DEBUGGER object (ctrl/ctrl83de/ctrl83dedebug.h; g_kernel_sm_debugger_session_nvoc.c:
# flags NON_PRIVILEGED, forwarded to the GSP by its handler on a GSP client).
NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO = 0x83DE0328
# Its SM error states (rig_nv.faults): flags NON_PRIVILEGED | ROUTE_TO_PHYSICAL (the GSP answers
# it on a GSP client; the kernel module's own handler serves only a vGPU guest), at most
# NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL states a call from startingSM.
NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES = 0x83DE030C
NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL = 100
# NV2080_CTRL_PERF_BOOST_FLAGS (ctrl2080perf.h): CMD 1:0 BOOST_TO_MAX (2), CUDA 4:4 YES,
# CUDA_PRIORITY 6:6 HIGH; CLEAR (0) drops the request. DURATION_INFINITE lasts until cleared or
# until the client goes (the RM tracks boosts per client).
PERF_BOOST_CUDA = 2 | (1 << 4) | (1 << 6)
PERF_BOOST_CLEAR = 0
PERF_BOOST_INFINITE = 0xFFFFFFFF
# NV2080_CTRL_GR_INFO_INDEX_* and NV2080_CTRL_FB_INFO_INDEX_* (ctrl2080gr.h, ctrl2080fb.h).
GR_SHADER_PIPE_SUB_COUNT = 0x9  # enabled TPCs
GR_SM_VERSION = 0xC
GR_MAX_WARPS_PER_SM = 0xD
GR_LITTER_NUM_SM_PER_TPC = 0x20
GR_LITTER_NUM_GPCS = 0x14
GR_LITTER_NUM_TPC_PER_GPC = 0x17
FB_HEAP_SIZE = 0x9  # KiB usable for allocations
FB_HEAP_FREE = 0x16  # KiB free now
FB_RAM_SIZE = 0x7  # KiB of memory on the board


def info_list(path: Path, cmd: int, indices: list[int], obj: int) -> list[int]:
    """Values of ``indices`` from an RM ``{index, data}`` list control (FB/GR info)."""
    ffi = rm_ffi(path.rm.layouts)
    entries = ffi.new("NV2080_CTRL_INFO[]", len(indices))
    for i, index in enumerate(indices):
        entries[i].index = index
    if cmd == NV2080_CTRL_CMD_GR_GET_INFO:
        p = Params(ffi, "NV2080_CTRL_GR_GET_INFO_PARAMS", grInfoListSize=len(indices))
        p.p.grInfoList = int(ffi.cast("uintptr_t", entries))
    else:
        p = Params(ffi, "NV2080_CTRL_INFO_LIST_PARAMS", listSize=len(indices))
        p.p.list = int(ffi.cast("uintptr_t", entries))
    path.rm.control(obj, cmd, p.buf)
    return [entries[i].data for i in range(len(indices))]


def class_list(path: Path) -> set[int]:
    """The classes the GPU offers (NV0080_CTRL_CMD_GPU_GET_CLASSLIST, asked twice: count, list)."""
    ffi = rm_ffi(path.rm.layouts)
    p = Params(ffi, "NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS")
    path.rm.control(path.h_device, NV0080_CTRL_CMD_GPU_GET_CLASSLIST, p.buf)
    listed = ffi.new("uint32_t[]", p.p.numClasses)
    p.p.classList = int(ffi.cast("uintptr_t", listed))
    path.rm.control(path.h_device, NV0080_CTRL_CMD_GPU_GET_CLASSLIST, p.buf)
    return {listed[i] for i in range(p.p.numClasses)}
