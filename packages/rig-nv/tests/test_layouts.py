"""RM parameter structs (rig_nv.layouts) against NVIDIA's headers, compiled with gcc for x86-64.

Every number here comes from open-gpu-kernel-modules at tags 570.211.01 and 580.142, built with
gcc and read with gdb ``ptype /o``.
The header path of each struct is relative to src/common/sdk/nvidia/inc.
"""

from __future__ import annotations

import pytest

from rig_edge import OpenRefused, RigError
from rig_nv.layouts import SUPPORTED, Params, layout_key, rm_ffi

RELEASES = ("570", "580")

# struct -> (size, {field: offset}); the same in 570.211.01 and 580.142.
COMMON: dict[str, tuple[int, dict[str, int]]] = {
    # class/cl0080.h @570.211.01, @580.142
    "NV0080_ALLOC_PARAMETERS": (56, {
        "deviceId": 0, "hClientShare": 4, "hTargetClient": 8, "hTargetDevice": 12, "flags": 16,
        "vaSpaceSize": 24, "vaStartInternal": 32, "vaLimitInternal": 40, "vaMode": 48,
    }),
    # class/cl2080.h @570.211.01, @580.142
    "NV2080_ALLOC_PARAMETERS": (4, {"subDeviceId": 0}),
    # nvos.h @570.211.01, @580.142
    "NV_MEMORY_ALLOCATION_PARAMS": (128, {
        "owner": 0, "type": 4, "flags": 8, "width": 12, "height": 16, "pitch": 20, "attr": 24,
        "attr2": 28, "format": 32, "comprCovg": 36, "zcullCovg": 40, "rangeLo": 48,
        "rangeHi": 56, "size": 64, "alignment": 72, "offset": 80, "limit": 88, "address": 96,
        "ctagOffset": 104, "hVASpace": 108, "internalflags": 112, "tag": 116, "numaNode": 120,
    }),
    # nvos.h @570.211.01, @580.142
    "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS": (20, {
        "hObjectError": 0, "hObjectEccError": 4, "hVASpace": 8, "engineType": 12,
        "bIsCallingContextVgpuPlugin": 16,
    }),
    # nvos.h @570.211.01, @580.142
    "NV_CTXSHARE_ALLOCATION_PARAMETERS": (12, {"hVASpace": 0, "flags": 4, "subctxId": 8}),
    # alloc/alloc_channel.h @570.211.01, @580.142
    "NV_MEMORY_DESC_PARAMS": (24, {"base": 0, "size": 8, "addressSpace": 16, "cacheAttrib": 20}),
    # alloc/alloc_channel.h @570.211.01, @580.142 (NV_CHANNELGPFIFO_ALLOCATION_PARAMETERS)
    "NV_CHANNEL_ALLOC_PARAMS": (368, {
        "hObjectError": 0, "hObjectBuffer": 4, "gpFifoOffset": 8, "gpFifoEntries": 16,
        "flags": 20, "hContextShare": 24, "hVASpace": 28, "hUserdMemory": 32, "userdOffset": 64,
        "engineType": 128, "cid": 132, "subDeviceId": 136, "hObjectEccError": 140,
        "instanceMem": 144, "userdMem": 168, "ramfcMem": 192, "mthdbufMem": 216,
        "hPhysChannelGroup": 240, "internalFlags": 244, "errorNotifierMem": 248,
        "eccErrorNotifierMem": 272, "ProcessID": 296, "SubProcessID": 300, "encryptIv": 304,
        "decryptIv": 316, "hmacNonce": 328, "tpcConfigID": 360,
    }),
    # nvos.h @570.211.01, @580.142
    "NV_HOPPER_USERMODE_A_PARAMS": (2, {"bBar1Mapping": 0, "bPriv": 1}),
    # class/clb0b5sw.h @570.211.01, @580.142
    "NVB0B5_ALLOCATION_PARAMETERS": (8, {"version": 0, "engineType": 4}),
    # ctrl/ctrl0000/ctrl0000system.h @570.211.01, @580.142
    "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS": (1032, {
        "driverVersionBuffer": 0, "versionBuffer": 256, "driverBranch": 512, "titleBuffer": 768,
        "changelistNumber": 1024, "officialChangelistNumber": 1028,
    }),
    # ctrl/ctrl0000/ctrl0000system.h @570.211.01, @580.142 (MAX_ATTACHED_GPUS 32, its square
    # 1024, P2P_CAPS_INDEX_TABLE_SIZE 9)
    "NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS": (8348, {
        "gpuIds": 0, "gpuCount": 128, "p2pCaps": 132, "p2pOptimalReadCEs": 136,
        "p2pOptimalWriteCEs": 140, "p2pCapsStatus": 144, "busPeerIds": 156,
        "busEgmPeerIds": 4252,
    }),
    # ctrl/ctrl0000/ctrl0000gpu.h @570.211.01, @580.142
    "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS": (32, {
        "gpuId": 0, "gpuFlags": 4, "deviceInstance": 8, "subDeviceInstance": 12, "sliStatus": 16,
        "boardId": 20, "gpuInstance": 24, "numaId": 28,
    }),
    # ctrl/ctrl0080/ctrl0080gpu.h @570.211.01, @580.142 (the pointer form)
    "NV0080_CTRL_GPU_GET_CLASSLIST_PARAMS": (16, {"numClasses": 0, "classList": 8}),
    # ctrl/ctrl2080/ctrl2080gpu.h @570.211.01, @580.142 (NV2080_GPU_MAX_ENGINES_LIST_SIZE 0x54)
    "NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS": (340, {"engineCount": 0, "engineList": 4}),
    # ctrl/ctrl2080/ctrl2080ce.h @570.211.01, @580.142 (NV2080_CTRL_CE_CAPS_TBL_SIZE 2, then
    # 2 bytes of padding)
    "NV2080_CTRL_CE_GET_CAPS_V2_PARAMS": (8, {"ceEngineType": 0, "capsTbl": 4}),
    # ctrl/ctrl2080/ctrl2080ce.h @570.211.01, @580.142
    "NV2080_CTRL_CE_GET_CE_PCE_MASK_PARAMS": (8, {"ceEngineType": 0, "pceMask": 4}),
    # ctrl/ctrl2080/ctrl2080gpu.h @570.211.01, @580.142
    "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS": (268, {"index": 0, "flags": 4, "length": 8, "data": 12}),
    # ctrl/ctrl2080/ctrl2080gpu.h @570.211.01, @580.142 (NV2080_CTRL_GPU_INFO; FB_INFO is alike)
    "NV2080_CTRL_INFO": (8, {"index": 0, "data": 4}),
    # ctrl/ctrl2080/ctrl2080gpu.h, ctrl2080fb.h @570.211.01, @580.142 (the deprecated pointer
    # forms NV2080_CTRL_GPU_GET_INFO_PARAMS / FB_GET_INFO_PARAMS: {size; NvP64 list @8})
    "NV2080_CTRL_INFO_LIST_PARAMS": (16, {"listSize": 0, "list": 8}),
    # ctrl/ctrl2080/ctrl2080gr.h @570.211.01, @580.142
    "NV2080_CTRL_GR_ROUTE_INFO": (16, {"flags": 0, "route": 8}),
    # ctrl/ctrl2080/ctrl2080gr.h @570.211.01, @580.142
    "NV2080_CTRL_GR_GET_INFO_PARAMS": (32, {
        "grInfoListSize": 0, "grInfoList": 8, "grRouteInfo": 16,
    }),
    # ctrl/ctrl2080/ctrl2080perf.h @570.211.01, @580.142
    "NV2080_CTRL_PERF_BOOST_PARAMS": (8, {"flags": 0, "duration": 4}),
    # ctrl/ctrl2080/ctrl2080gpumon.h @570.211.01, @580.142
    "NV2080_CTRL_GPUMON_SAMPLE": (8, {"timeStamp": 0}),
    # ctrl/ctrl2080/ctrl2080perf.h @570.211.01, @580.142
    "NV2080_CTRL_PERF_GPUMON_ENGINE_UTIL_SAMPLE": (128, {
        "util": 0, "vgpuScale": 4, "procId": 8, "subProcessID": 12, "subProcessName": 16,
        "pOsPidInfo": 120,
    }),
    # ctrl/ctrl2080/ctrl2080perf.h @570.211.01, @580.142
    "NV2080_CTRL_PERF_GPUMON_PERFMON_UTIL_SAMPLE": (776, {
        "base": 0, "fb": 8, "gr": 136, "nvenc": 264, "nvdec": 392, "nvjpg": 520, "nvofa": 648,
    }),
    # ctrl/ctrl2080/ctrl2080perf.h @570.211.01, @580.142
    "NV2080_CTRL_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2_PARAMS": (55888, {
        "type": 0, "bufSize": 4, "count": 8, "tracker": 12, "samples": 16,
    }),
    # ctrl/ctrl2080/ctrl2080bus.h @570.211.01, @580.142
    "NV2080_CTRL_BUS_PCI_BAR_INFO": (24, {
        "flags": 0, "barSize": 4, "barSizeBytes": 8, "barOffset": 16,
    }),
    # ctrl/ctrl2080/ctrl2080bus.h @570.211.01, @580.142
    "NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS": (200, {"pciBarCount": 0, "pciBarInfo": 8}),
    # ctrl/ctrlc36f.h @570.211.01, @580.142
    "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS": (4, {"workSubmitToken": 0}),
    # ctrl/ctrl906f.h @570.211.01, @580.142 (addrHi before addrLo; faultString[32];
    # NV_DECLARE_ALIGNED shaderProgramVA[7] at 48 after 4 bytes of padding)
    "NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS": (104, {
        "addrHi": 0, "addrLo": 4, "faultType": 8, "faultString": 12, "shaderProgramVA": 48,
    }),
    # class/cl83de.h @570.211.01, @580.142 (gcc, sizeof/offsetof)
    "NV83DE_ALLOC_PARAMETERS": (12, {
        "hDebuggerClient_Obsolete": 0, "hAppClient": 4, "hClass3dObject": 8,
    }),
    # ctrl/ctrl83de/ctrl83dedebug.h @570.211.01, @580.142 (gcc, sizeof/offsetof)
    "NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_ENTRY": (16, {
        "faultAddress": 0, "faultType": 8, "accessType": 12,
    }),
    # ctrl/ctrl83de/ctrl83dedebug.h @570.211.01, @580.142: 4 entries of 16, count at 64, padded
    # to 72 by the entries' 8-byte alignment
    "NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_PARAMS": (72, {"mmuFaultInfoList": 0, "count": 64}),
    # ctrl/ctrl83de/ctrl83dedebug.h @570.211.01, @580.142 (gcc, sizeof/offsetof): 4 bytes of
    # padding before hwwEsrAddr (NV_DECLARE_ALIGNED 8)
    "NV83DE_SM_ERROR_STATE_REGISTERS": (48, {
        "hwwGlobalEsr": 0, "hwwWarpEsr": 4, "hwwWarpEsrPc": 8, "hwwGlobalEsrReportMask": 12,
        "hwwWarpEsrReportMask": 16, "hwwEsrAddr": 24, "hwwWarpEsrPc64": 32, "hwwCgaEsr": 40,
        "hwwCgaEsrReportMask": 44,
    }),
    # ctrl/ctrl83de/ctrl83dedebug.h @570.211.01, @580.142 (gcc): NvBool valid, 3 bytes of padding
    "NV83DE_MMU_FAULT_INFO": (8, {"valid": 0, "faultInfo": 4}),
    # ctrl/ctrl83de/ctrl83dedebug.h @570.211.01, @580.142 (gcc, sizeof/offsetof):
    # NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL (100) states of 48 from 8
    "NV83DE_CTRL_DEBUG_READ_ALL_SM_ERROR_STATES_PARAMS": (4824, {
        "hTargetChannel": 0, "numSMsToRead": 4, "smErrorStateArray": 8, "mmuFaultInfo": 4808,
        "mmuFault": 4812, "startingSM": 4820,
    }),
    # ctrl/ctrl2080/ctrl2080tmr.h @570.211.01, @580.142
    "NV2080_CTRL_TIMER_GET_TIME_PARAMS": (8, {"time_nsec": 0}),
    # ctrl/ctrl2080/ctrl2080rc.h @570.211.01, @580.142
    "NV2080_CTRL_RC_GET_WATCHDOG_INFO_PARAMS": (4, {"watchdogStatusFlags": 0}),
    # nvgputypes.h @570.211.01, @580.142 (timeStamp.nanoseconds[2] flattened)
    "NvNotification": (16, {"nanoseconds": 0, "info32": 8, "info16": 12, "status": 14}),
}

# struct -> {release: (size, {field: offset})}: the structs whose layout differs by release.
BY_RELEASE: dict[str, dict[str, tuple[int, dict[str, int]]]] = {
    # nvos.h: 580.142 adds NvU32 pasid @48 (570.211.01 has none)
    "NV_VASPACE_ALLOCATION_PARAMETERS": {
        "570": (48, {"index": 0, "flags": 4, "vaSize": 8, "vaStartInternal": 16,
                     "vaLimitInternal": 24, "bigPageSize": 32, "vaBase": 40}),
        "580": (56, {"index": 0, "flags": 4, "vaSize": 8, "vaStartInternal": 16,
                     "vaLimitInternal": 24, "bigPageSize": 32, "vaBase": 40, "pasid": 48}),
    },
    # ctrl/ctrla06f/ctrla06fgpfifo.h (NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS is its typedef in
    # ctrl/ctrla06c.h): 580.142 adds NvBool bSkipEnable @2
    "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS": {
        "570": (2, {"bEnable": 0, "bSkipSubmit": 1}),
        "580": (3, {"bEnable": 0, "bSkipSubmit": 1, "bSkipEnable": 2}),
    },
}

CASES = [(key, name, size, fields) for key in RELEASES for name, (size, fields) in COMMON.items()]
CASES += [(key, name, *BY_RELEASE[name][key]) for key in RELEASES for name in BY_RELEASE]


@pytest.mark.parametrize(("key", "name", "size", "fields"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_struct_size_and_offsets(key: str, name: str, size: int, fields: dict[str, int]) -> None:
    ffi = rm_ffi(key)
    assert ffi.sizeof(name) == size
    for field, offset in fields.items():
        assert ffi.offsetof(name, field) == offset, f"{name}.{field}"


@pytest.mark.parametrize("key", RELEASES)
def test_every_declared_struct_is_checked(key: str) -> None:
    """A struct added to rig_nv.layouts without numbers here fails this test."""
    ffi = rm_ffi(key)
    declared = {n for n in ffi.list_types()[0] if ffi.typeof(n).kind == "struct"}
    assert declared == set(COMMON) | set(BY_RELEASE)


@pytest.mark.parametrize("key", RELEASES)
def test_every_field_of_every_struct_is_checked(key: str) -> None:
    """Each struct's fields are exactly those listed (names and order follow the headers)."""
    ffi = rm_ffi(key)
    for name in set(COMMON) | set(BY_RELEASE):
        fields = COMMON[name][1] if name in COMMON else BY_RELEASE[name][key][1]
        declared = [f for f, _ in ffi.typeof(name).fields]
        assert declared == list(fields), name


@pytest.mark.parametrize("key", RELEASES)
def test_array_lengths_and_nested_offsets(key: str) -> None:
    ffi = rm_ffi(key)
    ch = "NV_CHANNEL_ALLOC_PARAMS"
    assert ffi.offsetof(ch, "userdOffset") - ffi.offsetof(ch, "hUserdMemory") == 32  # [8]
    assert ffi.offsetof(ch, "hUserdMemory", 1) == 36
    assert ffi.offsetof(ch, "userdOffset", 7) == 120
    assert ffi.offsetof(ch, "errorNotifierMem", "addressSpace") == 264
    assert ffi.offsetof(ch, "hmacNonce", 7) == 356
    v2 = "NV2080_CTRL_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2_PARAMS"
    # 72 samples of 776 bytes from 16; the last one's gr.util lies at 16 + 71*776 + 136.
    assert ffi.offsetof(v2, "samples", 71, "gr", "util") == 16 + 71 * 776 + 136
    assert ffi.offsetof(v2, "samples", 1, "base", "timeStamp") == 16 + 776
    assert ffi.offsetof("NV2080_CTRL_BUS_GET_PCI_BAR_INFO_PARAMS", "pciBarInfo", 7) == 8 + 7 * 24
    assert ffi.offsetof("NV2080_CTRL_GPU_GET_GID_INFO_PARAMS", "data", 255) == 267
    assert ffi.offsetof("NvNotification", "nanoseconds", 1) == 4
    assert ffi.offsetof("NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS", "engineList", 83) == 336
    assert ffi.offsetof("NV2080_CTRL_CE_GET_CAPS_V2_PARAMS", "capsTbl", 1) == 5
    mmu = "NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS"
    assert ffi.offsetof(mmu, "faultString", 31) == 43
    assert ffi.offsetof(mmu, "shaderProgramVA", 6) == 96
    dbg = "NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_PARAMS"
    assert ffi.offsetof(dbg, "mmuFaultInfoList", 3, "accessType") == 60  # [4]
    sm = "NV83DE_CTRL_DEBUG_READ_ALL_SM_ERROR_STATES_PARAMS"
    assert ffi.offsetof(sm, "smErrorStateArray", 99, "hwwCgaEsrReportMask") == 8 + 99 * 48 + 44
    assert ffi.offsetof(sm, "mmuFault", "faultInfo") == 4816
    assert len(ffi.new(f"{sm} *").smErrorStateArray) == 100


def test_release_differences() -> None:
    """What changed from 570 to 580 in the structs rig sends (rm_structs.md section 7)."""
    assert rm_ffi("570").sizeof("NV_VASPACE_ALLOCATION_PARAMETERS") == 48
    assert rm_ffi("580").sizeof("NV_VASPACE_ALLOCATION_PARAMETERS") == 56
    assert rm_ffi("570").sizeof("NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS") == 2
    assert rm_ffi("580").sizeof("NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS") == 3
    for key in RELEASES:
        assert rm_ffi(key).sizeof("NV_CHANNEL_ALLOC_PARAMS") == 368


def test_rm_ffi_is_one_per_release() -> None:
    assert rm_ffi("580") is rm_ffi("580")
    assert rm_ffi("570") is not rm_ffi("580")


# -- layout_key ------------------------------------------------------------------------------


@pytest.mark.parametrize(("release", "key"), [
    ("580.159.04", "580"), ("580.142", "580"), ("580.65.06", "580"),
    ("570.144", "570"), ("570.211.01", "570"), ("570.86.15", "570"),
])
def test_layout_key_of_accepted_releases(release: str, key: str) -> None:
    assert layout_key(release) == key


@pytest.mark.parametrize("release", ["595.45.04", "610.1", "565.57.01", "5800.1", ""])
def test_layout_key_refuses_other_releases(release: str) -> None:
    with pytest.raises(OpenRefused) as e:
        layout_key(release)
    assert isinstance(e.value, RigError)
    msg = str(e.value)
    assert f"release {release} " in msg
    assert "570, 580" in msg


def test_supported_releases() -> None:
    assert SUPPORTED == ("570", "580")


# -- Params ------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", RELEASES)
def test_params_are_zeroed_and_struct_sized(key: str) -> None:
    ffi = rm_ffi(key)
    for name in ("NV_CHANNEL_ALLOC_PARAMS", "NV_VASPACE_ALLOCATION_PARAMETERS",
                 "NV2080_CTRL_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2_PARAMS"):
        p = Params(ffi, name)
        assert isinstance(p.buf, bytearray)
        assert len(p.buf) == ffi.sizeof(name)
        assert not any(p.buf)


def test_params_set_fields_at_their_offsets() -> None:
    ffi = rm_ffi("580")
    p = Params(ffi, "NV0080_ALLOC_PARAMETERS", deviceId=3, hClientShare=0xC1D00001, vaMode=2,
               vaSpaceSize=1 << 40)
    buf = bytes(p.buf)
    assert len(buf) == 56
    assert int.from_bytes(buf[0:4], "little") == 3
    assert int.from_bytes(buf[4:8], "little") == 0xC1D00001
    assert int.from_bytes(buf[24:32], "little") == 1 << 40
    assert int.from_bytes(buf[48:52], "little") == 2
    # Everything else stays zero.
    rest = buf[8:24] + buf[32:48] + buf[52:]
    assert not any(rest)


def test_params_buffer_and_fields_are_one_memory() -> None:
    ffi = rm_ffi("580")
    p = Params(ffi, "NV_VASPACE_ALLOCATION_PARAMETERS", vaBase=0x1000, pasid=7)
    assert int.from_bytes(p.buf[40:48], "little") == 0x1000
    assert int.from_bytes(p.buf[48:52], "little") == 7
    # What the RM writes back into the buffer reads through the fields.
    p.buf[8:16] = (0x1FFFFFB000000).to_bytes(8, "little")
    assert p.p.vaSize == 0x1FFFFFB000000
    # Arrays of a struct are set through the field view.
    c = Params(ffi, "NV_CHANNEL_ALLOC_PARAMS", gpFifoEntries=0x10000)
    c.p.hUserdMemory[0] = 0xCAFE
    c.p.userdOffset[0] = 0x80000
    assert int.from_bytes(c.buf[16:20], "little") == 0x10000
    assert int.from_bytes(c.buf[32:36], "little") == 0xCAFE
    assert int.from_bytes(c.buf[64:72], "little") == 0x80000


def test_params_schedule_by_release() -> None:
    """The schedule control's size is checked exactly by the RM, so it must follow the release."""
    for key, size in (("570", 2), ("580", 3)):
        p = Params(rm_ffi(key), "NVA06C_CTRL_GPFIFO_SCHEDULE_PARAMS", bEnable=1)
        assert bytes(p.buf) == b"\x01" + bytes(size - 1)
