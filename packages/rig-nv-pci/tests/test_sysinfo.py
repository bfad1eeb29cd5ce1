"""rig_nv_pci.gsp.sysinfo's GspSystemInfo against the layout worked out from the header."""

from __future__ import annotations

import dataclasses

import pytest

from rig_edge import Misuse
from rig_nv_pci.gsp import sysinfo
from rig_pci import FunctionInfo
from rig_pci.listing import Bar

# C types of a 64-bit build: (size, alignment)
TYPES = {"NvU64": (8, 8), "NvU32": (4, 4), "NV_STATUS": (4, 4), "NvU16": (2, 2),
         "NvU8": (1, 1), "NvBool": (1, 1)}

# The structs as open-gpu-kernel-modules 570.144 declares them, member by member:
# g_chipset_nvoc.h BUSINFO; gpu_acpi_data.h DOD/JT/MUX/CAPS_METHOD_DATA and ACPI_METHOD_DATA
# (NV0073_CTRL_SYSTEM_ACPI_ID_MAP_MAX_DISPLAYS 16); gsp_static_config.h GSP_VF_INFO,
# GSP_PCIE_CONFIG_REG and GspSystemInfo. (type, name, array length)
STRUCTS: dict[str, list[tuple[str, str, int]]] = {
    "BUSINFO": [("NvU16", "deviceID", 1), ("NvU16", "vendorID", 1), ("NvU16", "subdeviceID", 1),
                ("NvU16", "subvendorID", 1), ("NvU8", "revisionID", 1)],
    "DOD_METHOD_DATA": [("NV_STATUS", "status", 1), ("NvU32", "acpiIdListLen", 1),
                        ("NvU32", "acpiIdList", 16)],
    "JT_METHOD_DATA": [("NV_STATUS", "status", 1), ("NvU32", "jtCaps", 1),
                       ("NvU16", "jtRevId", 1), ("NvBool", "bSBIOSCaps", 1)],
    "MUX_METHOD_DATA_ELEMENT": [("NvU32", "acpiId", 1), ("NvU32", "mode", 1),
                                ("NV_STATUS", "status", 1)],
    "MUX_METHOD_DATA": [("NvU32", "tableLen", 1),
                        ("MUX_METHOD_DATA_ELEMENT", "acpiIdMuxModeTable", 16),
                        ("MUX_METHOD_DATA_ELEMENT", "acpiIdMuxPartTable", 16),
                        ("MUX_METHOD_DATA_ELEMENT", "acpiIdMuxStateTable", 16)],
    "CAPS_METHOD_DATA": [("NV_STATUS", "status", 1), ("NvU32", "optimusCaps", 1)],
    "ACPI_METHOD_DATA": [("NvBool", "bValid", 1), ("DOD_METHOD_DATA", "dodMethodData", 1),
                         ("JT_METHOD_DATA", "jtMethodData", 1),
                         ("MUX_METHOD_DATA", "muxMethodData", 1),
                         ("CAPS_METHOD_DATA", "capsMethodData", 1)],
    "GSP_VF_INFO": [("NvU32", "totalVFs", 1), ("NvU32", "firstVFOffset", 1),
                    ("NvU64", "FirstVFBar0Address", 1), ("NvU64", "FirstVFBar1Address", 1),
                    ("NvU64", "FirstVFBar2Address", 1), ("NvBool", "b64bitBar0", 1),
                    ("NvBool", "b64bitBar1", 1), ("NvBool", "b64bitBar2", 1)],
    "GSP_PCIE_CONFIG_REG": [("NvU32", "linkCap", 1)],
    "GspSystemInfo": [(t, n, 1) for t, n in (
        ("NvU64", "gpuPhysAddr"), ("NvU64", "gpuPhysFbAddr"), ("NvU64", "gpuPhysInstAddr"),
        ("NvU64", "gpuPhysIoAddr"), ("NvU64", "nvDomainBusDeviceFunc"),
        ("NvU64", "simAccessBufPhysAddr"), ("NvU64", "notifyOpSharedSurfacePhysAddr"),
        ("NvU64", "pcieAtomicsOpMask"), ("NvU64", "consoleMemSize"), ("NvU64", "maxUserVa"),
        ("NvU32", "pciConfigMirrorBase"), ("NvU32", "pciConfigMirrorSize"),
        ("NvU32", "PCIDeviceID"), ("NvU32", "PCISubDeviceID"), ("NvU32", "PCIRevisionID"),
        ("NvU32", "pcieAtomicsCplDeviceCapMask"), ("NvU8", "oorArch"),
        ("NvU64", "clPdbProperties"), ("NvU32", "Chipset"), ("NvBool", "bGpuBehindBridge"),
        ("NvBool", "bFlrSupported"), ("NvBool", "b64bBar0Supported"),
        ("NvBool", "bMnocAvailable"), ("NvU32", "chipsetL1ssEnable"),
        ("NvBool", "bUpstreamL0sUnsupported"), ("NvBool", "bUpstreamL1Unsupported"),
        ("NvBool", "bUpstreamL1PorSupported"), ("NvBool", "bUpstreamL1PorMobileOnly"),
        ("NvBool", "bSystemHasMux"), ("NvU8", "upstreamAddressValid"),
        ("BUSINFO", "FHBBusInfo"), ("BUSINFO", "chipsetIDInfo"),
        ("ACPI_METHOD_DATA", "acpiMethodData"), ("NvU32", "hypervisorType"),
        ("NvBool", "bIsPassthru"), ("NvU64", "sysTimerOffsetNs"),
        ("GSP_VF_INFO", "gspVFInfo"), ("NvBool", "bIsPrimary"), ("NvBool", "isGridBuild"),
        ("GSP_PCIE_CONFIG_REG", "pcieConfigReg"), ("NvU32", "gridBuildCsp"),
        ("NvBool", "bPreserveVideoMemoryAllocations"), ("NvBool", "bTdrEventSupported"),
        ("NvBool", "bFeatureStretchVblankCapable"),
        ("NvBool", "bEnableDynamicGranularityPageArrays"), ("NvBool", "bClockBoostSupported"),
        ("NvBool", "bRouteDispIntrsToCPU"), ("NvU64", "hostPageSize"))],
}


def c_layout(name: str) -> tuple[int, int, dict[str, int]]:
    """(sizeof, alignof, offsets of every member and nested member) by C's rules."""
    if name in TYPES:
        return TYPES[name][0], TYPES[name][1], {}
    at, align, offsets = 0, 1, {}
    for ctype, member, count in STRUCTS[name]:
        size, a, inner = c_layout(ctype)
        at = -(-at // a) * a
        offsets[member] = at
        offsets.update({f"{member}.{k}": at + v for k, v in inner.items()})
        at += size * count
        align = max(align, a)
    return -(-at // align) * align, align, offsets


def test_gsp_system_info_has_the_headers_size_and_offsets() -> None:
    size, align, offsets = c_layout("GspSystemInfo")
    assert size == 928 and align == 8
    assert sysinfo.SIZE == size == sysinfo.GSP_SYSTEM_INFO.size
    assert c_layout("ACPI_METHOD_DATA")[:2] == (676, 4)
    for name in sysinfo.NAMES:
        assert sysinfo.offset(name) == offsets[name], name
    # every member that holds no members is declared (ACPI_METHOD_DATA as one block)
    leaves = [n for n in offsets if not any(k.startswith(n + ".") for k in offsets)
              and not n.startswith("acpiMethodData.")]
    assert sorted([*leaves, "acpiMethodData"]) == sorted(sysinfo.NAMES)


def test_the_payload_puts_each_member_at_its_offset() -> None:
    info = sysinfo.SystemInfo(0xF200_0000, 0x38_0000_0000, 0x38_1000_0000, domain=1, bus=0x41,
                              devfn=0x09, vendor=0x10DE, device=0x2684, subsystem_vendor=0x1043,
                              subsystem_device=0x889D, revision=0xA1)
    data = info.encode()
    assert len(data) == 928

    def u(name: str, n: int) -> int:
        return int.from_bytes(data[sysinfo.offset(name):sysinfo.offset(name) + n], "little")

    assert u("gpuPhysAddr", 8) == 0xF200_0000 and u("gpuPhysInstAddr", 8) == 0x38_1000_0000
    assert u("nvDomainBusDeviceFunc", 8) == 1 << 32 | 0x41 << 8 | 0x09
    assert u("PCIDeviceID", 4) == 0x2684_10DE and u("PCISubDeviceID", 4) == 0x889D_1043
    assert u("hostPageSize", 8) == 0x1000 and u("simAccessBufPhysAddr", 8) == 0
    assert data[sysinfo.offset("acpiMethodData"):][:676] == bytes(676)  # bValid 0
    assert sysinfo.decode(data)["PCIRevisionID"] == 0xA1


def function(bars: tuple[Bar, ...]) -> FunctionInfo:
    return FunctionInfo("0000:41:00.0", 0x10DE, 0x2204, 0x030000, bars, None, 12, "active")


def test_system_info_from_a_listed_function_takes_bars_0_1_and_3() -> None:
    bars = (Bar(0, 0xF200_0000, 0x100_0000, 0x200), Bar(1, 0x38_0000_0000, 1 << 28, 0x200),
            Bar(3, 0x38_1000_0000, 1 << 25, 0x200))
    info = sysinfo.SystemInfo.for_function(function(bars), revision=0xA1)
    assert (info.bar0, info.bar1, info.bar3) == (0xF200_0000, 0x38_0000_0000, 0x38_1000_0000)
    assert info.domain_bus_devfn == 0x4100 and info.device == 0x2204
    with pytest.raises(Misuse, match=r"0000:41:00.0 has no BAR 3"):
        sysinfo.SystemInfo.for_function(function(bars[:2]))
    # issue 26 finding 4: NV_PCFG 0x88000 (GM107's HAL, GA10x/AD10x), NV_EP_PCFGM 0x92000 from
    # GH100 on (kbifGetPciConfigSpacePriMirror_GH100), where the boot goes through the FSP
    assert info.values()["pciConfigMirrorBase"] == 0x88000
    fsp = sysinfo.SystemInfo.for_function(function(bars), fsp_boot=True)
    assert sysinfo.decode(fsp.encode())["pciConfigMirrorBase"] == 0x92000


def test_the_subsystem_and_revision_come_from_the_listing() -> None:
    """Issue 26 item 5: GspSystemInfo's PCISubDeviceID (NV_XVE_SUBSYSTEM: subsystem ID 31:16,
    subsystem vendor 15:0) and PCIRevisionID (NV_XVE_REV_ID's revision byte), as
    gpuGetIdInfo_GM107 reads them and rpcGspSetSystemInfo_v17_00 sends them; the listing reads
    them from sysfs's subsystem_vendor, subsystem_device and revision."""
    bars = (Bar(0, 0xF200_0000, 0x100_0000, 0x200), Bar(1, 0x38_0000_0000, 1 << 28, 0x200),
            Bar(3, 0x38_1000_0000, 1 << 25, 0x200))
    info = dataclasses.replace(function(bars), subsystem_vendor=0x1458,
                               subsystem_device=0x4043, revision=0xA1)
    got = sysinfo.decode(sysinfo.SystemInfo.for_function(info).encode())
    assert (got["PCISubDeviceID"], got["PCIRevisionID"]) == (0x4043_1458, 0xA1)
