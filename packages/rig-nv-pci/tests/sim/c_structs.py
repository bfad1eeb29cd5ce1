"""NVIDIA's C structs that the simulated GSP lays its replies and events out by, member by
member as the headers list them (GspStaticConfigInfo and the structs in it, the event
payloads), and C's layout rules over them (:func:`c_layout`), so that no offset is copied
from rig_nv_pci."""

from __future__ import annotations

# GspStaticConfigInfo of 570.144 (src/nvidia/inc/kernel/gpu/gsp/gsp_static_config.h, "Fetched
# from GSP-RM into CPU-RM") and the structs in it, member by member: (type, name, array length).
# Scalars are naturally aligned (the GSP's RISC-V core is LP64). Array lengths:
# NV0080_CTRL_GR_CAPS_TBL_SIZE 23 (ctrl0080gr.h); NV2080_GPU_MAX_GID_LENGTH 0x100 and
# NV2080_GPU_MAX_NAME_STRING_LENGTH 0x40 (ctrl2080gpu.h); NV2080_CTRL_CMD_FB_GET_FB_REGION_INFO_
# MEM_TYPES 17 and _MAX_ENTRIES 16 (ctrl2080fb.h); NVGPU_ENGINE_CAPS_MASK_ARRAY_MAX
# (RM_ENGINE_TYPE_LAST 0x54 - 1) / 32 + 1 = 3 (nvbitmask.h, gpu_engine_type.h); MAX_GROUP_COUNT 2
# (generated/g_gpu_nvoc.h).
C_SCALARS = {"NvU64": 8, "NvU32": 4, "NvHandle": 4, "NvU16": 2, "NvU8": 1, "NvBool": 1,
             "char": 1}
C_STRUCTS: dict[str, list[tuple[str, str, int]]] = {
    # ctrl2080gpu.h
    "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS": [("NvU32", "index", 1), ("NvU32", "flags", 1),
                                            ("NvU32", "length", 1), ("NvU8", "data", 0x100)],
    # ctrl2080bios.h
    "NV2080_CTRL_BIOS_GET_SKU_INFO_PARAMS": [
        ("NvU32", "BoardID", 1), ("char", "chipSKU", 9), ("char", "chipSKUMod", 5),
        ("NvU32", "skuConfigVersion", 1), ("char", "project", 5), ("char", "projectSKU", 5),
        ("char", "CDP", 6), ("char", "projectSKUMod", 2), ("NvU32", "businessCycle", 1)],
    # ctrl2080fb.h
    "NV2080_CTRL_CMD_FB_GET_FB_REGION_FB_REGION_INFO": [
        ("NvU64", "base", 1), ("NvU64", "limit", 1), ("NvU64", "reserved", 1),
        ("NvU32", "performance", 1), ("NvBool", "supportCompressed", 1),
        ("NvBool", "supportISO", 1), ("NvBool", "bProtected", 1), ("NvBool", "blackList", 17)],
    "NV2080_CTRL_CMD_FB_GET_FB_REGION_INFO_PARAMS": [
        ("NvU32", "numFBRegions", 1),
        ("NV2080_CTRL_CMD_FB_GET_FB_REGION_FB_REGION_INFO", "fbRegion", 16)],
    # NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES's params (not in the static info; laid out
    # here for the tests): offlined[NV2080_CTRL_FB_DYNAMIC_BLACKLIST_MAX_ENTRIES 64]
    "NV2080_CTRL_FB_DYNAMIC_OFFLINED_ADDRESS_INFO": [("NvU64", "pageNumber", 1),
                                                     ("NvU8", "source", 1)],
    "NV2080_CTRL_FB_GET_DYNAMIC_OFFLINED_PAGES_PARAMS": [
        ("NV2080_CTRL_FB_DYNAMIC_OFFLINED_ADDRESS_INFO", "offlined", 64),
        ("NvU32", "validEntries", 1), ("NvU32", "baseIndex", 1), ("NvBool", "bMore", 1)],
    # ctrl0080gpu.h
    "NV0080_CTRL_GPU_GET_SRIOV_CAPS_PARAMS": [
        ("NvU32", "totalVFs", 1), ("NvU32", "firstVfOffset", 1), ("NvU32", "vfFeatureMask", 1),
        ("NvU64", "FirstVFBar0Address", 1), ("NvU64", "FirstVFBar1Address", 1),
        ("NvU64", "FirstVFBar2Address", 1), ("NvU64", "bar0Size", 1), ("NvU64", "bar1Size", 1),
        ("NvU64", "bar2Size", 1), ("NvBool", "b64bitBar0", 1), ("NvBool", "b64bitBar1", 1),
        ("NvBool", "b64bitBar2", 1), ("NvBool", "bSriovEnabled", 1),
        ("NvBool", "bSriovHeavyEnabled", 1), ("NvBool", "bEmulateVFBar0TlbInvalidationRegister", 1),
        ("NvBool", "bClientRmAllocatedCtxBuffer", 1),
        ("NvBool", "bNonPowerOf2ChannelCountSupported", 1),
        ("NvBool", "bVfResizableBAR1Supported", 1)],
    # vgpu/rpc_headers.h
    "VIRTUAL_DISPLAY_GET_NUM_HEADS_PARAMS": [("NvU32", "numHeads", 1),
                                             ("NvU32", "maxNumHeads", 1)],
    "VIRTUAL_DISPLAY_GET_MAX_RESOLUTION_PARAMS": [("NvU32", "headIndex", 1),
                                                  ("NvU32", "maxHResolution", 1),
                                                  ("NvU32", "maxVResolution", 1)],
    # gsp_static_config.h
    "EcidManufacturingInfo": [("NvU32", "ecidLow", 1), ("NvU32", "ecidHigh", 1),
                              ("NvU32", "ecidExtended", 1)],
    "FW_WPR_LAYOUT_OFFSET": [("NvU64", "nonWprHeapOffset", 1), ("NvU64", "frtsOffset", 1)],
    "GspStaticConfigInfo": [
        ("NvU8", "grCapsBits", 23), ("NV2080_CTRL_GPU_GET_GID_INFO_PARAMS", "gidInfo", 1),
        ("NV2080_CTRL_BIOS_GET_SKU_INFO_PARAMS", "SKUInfo", 1),
        ("NV2080_CTRL_CMD_FB_GET_FB_REGION_INFO_PARAMS", "fbRegionInfoParams", 1),
        ("NV0080_CTRL_GPU_GET_SRIOV_CAPS_PARAMS", "sriovCaps", 1), ("NvU32", "sriovMaxGfid", 1),
        ("NvU32", "engineCaps", 3), ("NvBool", "poisonFuseEnabled", 1),
        ("NvU64", "fb_length", 1), ("NvU64", "fbio_mask", 1), ("NvU32", "fb_bus_width", 1),
        ("NvU32", "fb_ram_type", 1), ("NvU64", "fbp_mask", 1), ("NvU32", "l2_cache_size", 1),
        ("NvU8", "gpuNameString", 0x40), ("NvU8", "gpuShortNameString", 0x40),
        ("NvU16", "gpuNameString_Unicode", 0x40),
        *[("NvBool", n, 1) for n in (
            "bGpuInternalSku", "bIsQuadroGeneric", "bIsQuadroAd", "bIsNvidiaNvs", "bIsVgx",
            "bGeforceSmb", "bIsTitan", "bIsTesla", "bIsMobile", "bIsGc6Rtd3Allowed",
            "bIsGc8Rtd3Allowed", "bIsGcOffRtd3Allowed", "bIsGcoffLegacyAllowed",
            "bIsMigSupported")],
        ("NvU16", "RTD3GC6TotalBoardPower", 1), ("NvU16", "RTD3GC6PerstDelay", 1),
        ("NvU64", "bar1PdeBase", 1), ("NvU64", "bar2PdeBase", 1),
        ("NvBool", "bVbiosValid", 1), ("NvU32", "vbiosSubVendor", 1),
        ("NvU32", "vbiosSubDevice", 1), ("NvBool", "bPageRetirementSupported", 1),
        ("NvBool", "bSplitVasBetweenServerClientRm", 1),
        ("NvBool", "bClRootportNeedsNosnoopWAR", 1),
        ("VIRTUAL_DISPLAY_GET_NUM_HEADS_PARAMS", "displaylessMaxHeads", 1),
        ("VIRTUAL_DISPLAY_GET_MAX_RESOLUTION_PARAMS", "displaylessMaxResolution", 1),
        ("NvU64", "displaylessMaxPixels", 1), ("NvHandle", "hInternalClient", 1),
        ("NvHandle", "hInternalDevice", 1), ("NvHandle", "hInternalSubdevice", 1),
        ("NvBool", "bSelfHostedMode", 1), ("NvBool", "bAtsSupported", 1),
        ("NvBool", "bIsGpuUefi", 1), ("NvBool", "bIsEfiInit", 1),
        ("EcidManufacturingInfo", "ecidInfo", 2),
        ("FW_WPR_LAYOUT_OFFSET", "fwWprLayoutOffset", 1)],
    # g_rpc-structures.h: the event payloads. A last member of count 0 is C's flexible array.
    "rpc_rc_triggered_v17_02": [
        *[("NvU32", n, 1) for n in ("nv2080EngineType", "chid", "gfid", "exceptLevel",
                                    "exceptType", "scope")],
        ("NvU16", "partitionAttributionId", 1), ("NvU32", "mmuFaultAddrLo", 1),
        ("NvU32", "mmuFaultAddrHi", 1), ("NvU32", "mmuFaultType", 1),
        ("NvBool", "bCallbackNeeded", 1), ("NvU32", "rcJournalBufferSize", 1),
        ("NvU8", "rcJournalBuffer", 0)],
    "rpc_os_error_log_v17_00": [
        ("NvU32", "exceptType", 1), ("NvU32", "runlistId", 1), ("NvU32", "chid", 1),
        ("char", "errString", 0x100), ("NvU32", "preemptiveRemovalPreviousXid", 1)],
    "rpc_ucode_libos_print_v1E_08": [("NvU32", "ucodeEngDesc", 1),
                                     ("NvU32", "libosPrintBufSize", 1),
                                     ("NvU8", "libosPrintBuf", 0)],
    "rpc_gsp_lockdown_notice_v17_00": [("NvBool", "bLockdownEngaging", 1)],
    "rpc_post_event_v17_00": [
        ("NvHandle", "hClient", 1), ("NvHandle", "hEvent", 1), ("NvU32", "notifyIndex", 1),
        ("NvU32", "data", 1), ("NvU16", "info16", 1), ("NvU32", "status", 1),
        ("NvU32", "eventDataSize", 1), ("NvBool", "bNotifyList", 1), ("NvU8", "eventData", 0)],
}



def c_layout(name: str) -> tuple[int, int, dict[str, tuple[int, int, int]]]:
    """(sizeof, alignof, {member path: (offset, element size, count)}) of ``name`` by C's
    rules. Paths are dotted; a struct array's elements are ``member[i]``; scalar arrays are one
    entry of ``count`` elements. Only leaves (scalars and scalar arrays) are listed."""
    if name in C_SCALARS:
        return C_SCALARS[name], C_SCALARS[name], {}
    at, align, leaves = 0, 1, {}
    for ctype, member, count in C_STRUCTS[name]:
        size, a, inner = c_layout(ctype)
        at = -(-at // a) * a
        if not inner:
            leaves[member] = (at, size, count)
        for i in range(count if inner else 0):
            path = member if count == 1 else f"{member}[{i}]"
            leaves.update({f"{path}.{k}": (at + i * size + o, s, n)
                           for k, (o, s, n) in inner.items()})
        at += size * count
        align = max(align, a)
    return -(-at // align) * align, align, leaves


def static_config(fields: dict[str, int | bytes]) -> bytes:
    """A GspStaticConfigInfo holding ``fields`` (member path -> integer, or bytes for an
    array), zero elsewhere."""
    return c_struct("GspStaticConfigInfo", fields)


def c_struct(name: str, fields: dict[str, int | bytes], tail: bytes | None = None) -> bytes:
    """Struct ``name`` holding ``fields``, zero elsewhere. With ``tail``, the struct ends at its
    flexible array member (its last, of count 0) and ``tail`` follows there."""
    size, _, leaves = c_layout(name)
    out = bytearray(size)
    for path, value in fields.items():
        at, elem, count = leaves[path]
        if isinstance(value, bytes):
            if len(value) > elem * count:
                raise ValueError(f"{path}: {len(value)} bytes into {elem * count}")
            out[at:at + len(value)] = value
        else:
            out[at:at + elem] = value.to_bytes(elem, "little")
    if tail is None:
        return bytes(out)
    flexible = C_STRUCTS[name][-1][1]
    if leaves[flexible][2] != 0:
        raise ValueError(f"{name} has no flexible array member")
    return bytes(out[:leaves[flexible][0]]) + tail
