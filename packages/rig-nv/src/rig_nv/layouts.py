"""RM parameter structs per driver release, declared once, as cffi types.

Both of rig's paths carry these structs to the resource manager (the kernel driver copies them
from user memory; the GSP receives them in RPCs). Field names, order and types follow NVIDIA's
open-gpu-kernel-modules headers under src/common/sdk/nvidia/inc at tags 570.211.01 and 580.142
(580.159.04 is not tagged there; 580.65.06 and 580.142 agree byte for byte):
nvos.h, alloc/alloc_channel.h, class/cl0080.h, class/cl2080.h, class/clb0b5sw.h,
nvgputypes.h, ctrl/ctrl0000/ctrl0000system.h, ctrl0000gpu.h, ctrl/ctrl0080/ctrl0080gpu.h,
ctrl/ctrl2080/ctrl2080gpu.h, ctrl2080fb.h, ctrl2080gr.h, ctrl2080perf.h, ctrl2080gpumon.h,
ctrl2080bus.h, ctrl2080ce.h, ctrl2080rc.h, ctrl/ctrla06f/ctrla06fgpfifo.h, ctrl/ctrlc36f.h,
ctrl/ctrl906f.h, class/cl83de.h, ctrl/ctrl83de/ctrl83dedebug.h.
NvP64 is declared as uint64_t, which has its 8-byte alignment on x86-64. The sizes are asserted
by the tests against those headers, compiled with gcc.
"""

from __future__ import annotations

import functools
from typing import Any

from cffi import FFI

from rig_edge import OpenRefused
from rig_nv import prebuilt

SUPPORTED = ("570", "580")

_COMMON = """
typedef struct {
    uint32_t deviceId; uint32_t hClientShare; uint32_t hTargetClient; uint32_t hTargetDevice;
    uint32_t flags; uint64_t vaSpaceSize; uint64_t vaStartInternal; uint64_t vaLimitInternal;
    uint32_t vaMode;
} NV0080_ALLOC_PARAMETERS;
typedef struct { uint32_t subDeviceId; } NV2080_ALLOC_PARAMETERS;
typedef struct {
    uint32_t owner; uint32_t type; uint32_t flags; uint32_t width; uint32_t height; int32_t pitch;
    uint32_t attr; uint32_t attr2; uint32_t format; uint32_t comprCovg; uint32_t zcullCovg;
    uint64_t rangeLo; uint64_t rangeHi; uint64_t size; uint64_t alignment; uint64_t offset;
    uint64_t limit; uint64_t address; uint32_t ctagOffset; uint32_t hVASpace;
    uint32_t internalflags; uint32_t tag; int32_t numaNode;
} NV_MEMORY_ALLOCATION_PARAMS;
typedef struct {
    uint32_t hObjectError; uint32_t hObjectEccError; uint32_t hVASpace; uint32_t engineType;
    uint8_t bIsCallingContextVgpuPlugin;
} NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS;
typedef struct { uint32_t hVASpace; uint32_t flags; uint32_t subctxId; } NV_CTXSHARE_ALLOCATION_PARAMETERS;
typedef struct { uint64_t base; uint64_t size; uint32_t addressSpace; uint32_t cacheAttrib; } NV_MEMORY_DESC_PARAMS;
typedef struct {
    uint32_t hObjectError; uint32_t hObjectBuffer; uint64_t gpFifoOffset; uint32_t gpFifoEntries;
    uint32_t flags; uint32_t hContextShare; uint32_t hVASpace; uint32_t hUserdMemory[8];
    uint64_t userdOffset[8]; uint32_t engineType; uint32_t cid; uint32_t subDeviceId;
    uint32_t hObjectEccError; NV_MEMORY_DESC_PARAMS instanceMem; NV_MEMORY_DESC_PARAMS userdMem;
    NV_MEMORY_DESC_PARAMS ramfcMem; NV_MEMORY_DESC_PARAMS mthdbufMem; uint32_t hPhysChannelGroup;
    uint32_t internalFlags; NV_MEMORY_DESC_PARAMS errorNotifierMem;
    NV_MEMORY_DESC_PARAMS eccErrorNotifierMem; uint32_t ProcessID; uint32_t SubProcessID;
    uint32_t encryptIv[3]; uint32_t decryptIv[3]; uint32_t hmacNonce[8]; uint32_t tpcConfigID;
} NV_CHANNEL_ALLOC_PARAMS;
typedef struct { uint8_t bBar1Mapping; uint8_t bPriv; } NV_HOPPER_USERMODE_A_PARAMS;
/* class/clb0b5sw.h: a copy object's engine (version NVB0B5_ALLOCATION_PARAMETERS_VERSION_1: an
   NV2080_ENGINE_TYPE) */
typedef struct { uint32_t version; uint32_t engineType; } NVB0B5_ALLOCATION_PARAMETERS;

typedef struct {
    char driverVersionBuffer[256]; char versionBuffer[256]; char driverBranch[256];
    char titleBuffer[256]; uint32_t changelistNumber; uint32_t officialChangelistNumber;
} NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS;
typedef struct {
    uint32_t gpuIds[32]; uint32_t gpuCount; uint32_t p2pCaps; uint32_t p2pOptimalReadCEs;
    uint32_t p2pOptimalWriteCEs; uint8_t p2pCapsStatus[9]; uint32_t busPeerIds[1024];
    uint32_t busEgmPeerIds[1024];
} NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS;
typedef struct {
    uint32_t gpuId; uint32_t gpuFlags; uint32_t deviceInstance; uint32_t subDeviceInstance;
    uint32_t sliStatus; uint32_t boardId; uint32_t gpuInstance; int32_t numaId;
} NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS;
typedef struct { uint32_t numClasses; uint64_t classList; } NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS;
/* ctrl2080gpu.h: NV2080_GPU_MAX_ENGINES_LIST_SIZE 0x54 */
typedef struct { uint32_t engineCount; uint32_t engineList[84]; } NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS;
/* ctrl2080ce.h: NV2080_CTRL_CE_CAPS_TBL_SIZE 2 */
typedef struct { uint32_t ceEngineType; uint8_t capsTbl[2]; } NV2080_CTRL_CE_GET_CAPS_V2_PARAMS;
typedef struct { uint32_t ceEngineType; uint32_t pceMask; } NV2080_CTRL_CE_GET_CE_PCE_MASK_PARAMS;
typedef struct { uint32_t index; uint32_t flags; uint32_t length; uint8_t data[256]; } NV2080_CTRL_GPU_GET_GID_INFO_PARAMS;
typedef struct { uint32_t index; uint32_t data; } NV2080_CTRL_INFO;
typedef struct { uint32_t listSize; uint64_t list; } NV2080_CTRL_INFO_LIST_PARAMS;
typedef struct { uint32_t flags; uint64_t route; } NV2080_CTRL_GR_ROUTE_INFO;
typedef struct {
    uint32_t grInfoListSize; uint64_t grInfoList; NV2080_CTRL_GR_ROUTE_INFO grRouteInfo;
} NV2080_CTRL_GR_GET_INFO_PARAMS;
typedef struct { uint32_t flags; uint32_t duration; } NV2080_CTRL_PERF_BOOST_PARAMS;
typedef struct { uint64_t timeStamp; } NV2080_CTRL_GPUMON_SAMPLE;
typedef struct {
    uint32_t util; uint32_t vgpuScale; uint32_t procId; uint32_t subProcessID;
    char subProcessName[100]; uint64_t pOsPidInfo;
} NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE;
typedef struct {
    NV2080_CTRL_GPUMON_SAMPLE base; NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE fb;
    NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE gr; NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE nvenc;
    NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE nvdec; NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE nvjpg;
    NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE nvofa;
} NV2080_CTRL_PERF_GPUMON_PERFMON_UTIL_SAMPLE;
typedef struct {
    uint8_t type; uint32_t bufSize; uint32_t count; uint32_t tracker;
    NV2080_CTRL_PERF_GPUMON_PERFMON_UTIL_SAMPLE samples[72];
} NV2080_CTRL_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2_PARAMS;
typedef struct { uint32_t flags; uint32_t barSize; uint64_t barSizeBytes; uint64_t barOffset; } NV2080_CTRL_BUS_PCI_BAR_INFO;
typedef struct { uint32_t pciBarCount; NV2080_CTRL_BUS_PCI_BAR_INFO pciBarInfo[8]; } NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS;
typedef struct { uint32_t workSubmitToken; } NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS;
/* ctrl/ctrl906f.h @570.211.01 and @580.142 alike: addrHi first; faultString[NV906F_CTRL_MMU_FAULT_STRING_LEN 32],
   shaderProgramVA[NV906F_CTRL_MMU_FAULT_SHADER_TYPES 7] 8-byte aligned at 48. */
typedef struct {
    uint32_t addrHi; uint32_t addrLo; uint32_t faultType; char faultString[32];
    uint64_t shaderProgramVA[7];
} NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS;
/* class/cl83de.h @570.211.01 and @580.142 alike: GT200_DEBUGGER's alloc parameters (12 bytes). */
typedef struct {
    uint32_t hDebuggerClient_Obsolete; uint32_t hAppClient; uint32_t hClass3dObject;
} NV83DE_ALLOC_PARAMETERS;
/* ctrl/ctrl83de/ctrl83dedebug.h @570.211.01 and @580.142 alike: entries of 16 bytes (faultAddress
   NV_DECLARE_ALIGNED 8), NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_MAX_ENTRIES 4, count at 64, 72 bytes. */
typedef struct {
    uint64_t faultAddress; uint32_t faultType; uint32_t accessType;
} NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_ENTRY;
typedef struct {
    NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_ENTRY mmuFaultInfoList[4]; uint32_t count;
} NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_PARAMS;
/* ctrl/ctrl83de/ctrl83dedebug.h @570.211.01 and @580.142 alike: an SM's error state of 48 bytes
   (hwwEsrAddr and hwwWarpEsrPc64 NV_DECLARE_ALIGNED 8, at 24 and 32); NV83DE_MMU_FAULT_INFO
   {NvBool valid; NvU32 faultInfo} of 8; READ_ALL_SM_ERROR_STATES' parameters with
   NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL (100) states from 8, mmuFaultInfo at 4808, mmuFault at 4812,
   startingSM at 4820, 4824 bytes. */
typedef struct {
    uint32_t hwwGlobalEsr; uint32_t hwwWarpEsr; uint32_t hwwWarpEsrPc;
    uint32_t hwwGlobalEsrReportMask; uint32_t hwwWarpEsrReportMask; uint64_t hwwEsrAddr;
    uint64_t hwwWarpEsrPc64; uint32_t hwwCgaEsr; uint32_t hwwCgaEsrReportMask;
} NV83DE_SM_ERROR_STATE_REGISTERS;
typedef struct { uint8_t valid; uint32_t faultInfo; } NV83DE_MMU_FAULT_INFO;
typedef struct {
    uint32_t hTargetChannel; uint32_t numSMsToRead;
    NV83DE_SM_ERROR_STATE_REGISTERS smErrorStateArray[100];
    uint32_t mmuFaultInfo; NV83DE_MMU_FAULT_INFO mmuFault; uint32_t startingSM;
} NV83DE_CTRL_DEBUG_READ_ALL_SM_ERROR_STATES_PARAMS;
typedef struct { uint64_t time_nsec; } NV2080_CTRL_TIMER_GET_TIME_PARAMS;
/* ctrl/ctrl2080/ctrl2080rc.h @570.211.01 and @580.142 alike: NV2080_CTRL_RC_GET_WATCHDOG_INFO_FLAGS_*. */
typedef struct { uint32_t watchdogStatusFlags; } NV2080_CTRL_RC_GET_WATCHDOG_INFO_PARAMS;
typedef struct {
    uint32_t nanoseconds[2]; uint32_t info32; uint16_t info16; uint16_t status;
} NvNotification;
"""

_RELEASE = {
    "570": """
typedef struct {
    uint32_t index; uint32_t flags; uint64_t vaSize; uint64_t vaStartInternal;
    uint64_t vaLimitInternal; uint32_t bigPageSize; uint64_t vaBase;
} NV_VASPACE_ALLOCATION_PARAMETERS;
typedef struct { uint8_t bEnable; uint8_t bSkipSubmit; } NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS;
""",
    "580": """
typedef struct {
    uint32_t index; uint32_t flags; uint64_t vaSize; uint64_t vaStartInternal;
    uint64_t vaLimitInternal; uint32_t bigPageSize; uint64_t vaBase; uint32_t pasid;
} NV_VASPACE_ALLOCATION_PARAMETERS;
typedef struct { uint8_t bEnable; uint8_t bSkipSubmit; uint8_t bSkipEnable; } NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS;
""",
}

# The generated modules holding these declarations parsed (rig_nv.prebuilt; regenerated by
# `python3 scripts/gen_ffi.py`): one per layout set.
PREBUILT = {f"rig_nv._ffi_rm_{key}": _COMMON + _RELEASE[key] for key in SUPPORTED}


def layout_key(release: str) -> str:
    """The layout set for a driver release string ("580.159.04" → "580").

    Raises :class:`rig_edge.OpenRefused` naming the release and the supported ones.
    """
    major = release.split(".", maxsplit=1)[0]
    if major not in SUPPORTED:
        raise OpenRefused(
            f"NVIDIA driver release {release} is not supported "
            f"(rig has struct layouts for releases {', '.join(SUPPORTED)})"
        )
    return major


@functools.cache
def rm_ffi(key: str) -> FFI:
    """The cffi types of RM parameters for layout set ``key`` ("570" or "580").

    Loaded from the generated module ``rig_nv._ffi_rm_<key>`` (about a millisecond), parsed
    only where that is absent or stale (:func:`rig_nv.prebuilt.load`); every supported set is
    loaded when this module is imported (below).
    """
    return prebuilt.load(f"rig_nv._ffi_rm_{key}", _COMMON + _RELEASE[key])


# Load every layout set now, not at a GPU's first open: importing a generated module opens its
# file, which an open at RLIMIT_NOFILE must not need (rig-nv-nvidia's walk tests open so), and
# a module's import is a millisecond.
for _key in SUPPORTED:
    rm_ffi(_key)


def cnew(ffi: FFI, ctype: str, init: Any = None) -> Any:
    """``ffi.new`` typed as ``Any``: cffi's stubs know no struct fields."""
    return ffi.new(ctype, init)


class Params:
    """A zeroed struct in a ``bytearray``: ``.buf`` goes to the RM, ``.p`` reads and writes fields."""

    def __init__(self, ffi: FFI, ctype: str, **fields: Any) -> None:
        self.ffi = ffi
        self.buf = bytearray(ffi.sizeof(ctype))
        self.p: Any = ffi.from_buffer(ctype + " *", self.buf)
        for name, value in fields.items():
            setattr(self.p, name, value)
