"""GSP_SET_SYSTEM_INFO: the payload the CPU posts before the boot, telling GSP-RM where the GPU
sits on the PCI bus (kgspInitRm posts it with SET_REGISTRY, before kgspBootstrap).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/gsp-sysinfo.md."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rig_edge import Misuse
from rig_pci import FunctionInfo
from rig_pci.listing import parse_address

# GspSystemInfo, member by member (one entry per NvU64 Q / NvU32 I / NvU16 H / NvU8 or NvBool B;
# "x" padding where natural alignment puts it; nested structs flattened or opaque "Ns").
FIELDS: tuple[tuple[str, str], ...] = (
    ("gpuPhysAddr", "Q"), ("gpuPhysFbAddr", "Q"), ("gpuPhysInstAddr", "Q"),
    ("gpuPhysIoAddr", "Q"), ("nvDomainBusDeviceFunc", "Q"), ("simAccessBufPhysAddr", "Q"),
    ("notifyOpSharedSurfacePhysAddr", "Q"), ("pcieAtomicsOpMask", "Q"), ("consoleMemSize", "Q"),
    ("maxUserVa", "Q"),  # 80
    ("pciConfigMirrorBase", "I"), ("pciConfigMirrorSize", "I"), ("PCIDeviceID", "I"),
    ("PCISubDeviceID", "I"), ("PCIRevisionID", "I"), ("pcieAtomicsCplDeviceCapMask", "I"),
    ("oorArch", "B"), ("", "7x"),  # 104: clPdbProperties is 8-aligned
    ("clPdbProperties", "Q"), ("Chipset", "I"),  # 112, 120
    ("bGpuBehindBridge", "B"), ("bFlrSupported", "B"), ("b64bBar0Supported", "B"),
    ("bMnocAvailable", "B"), ("chipsetL1ssEnable", "I"),  # 124, 128
    ("bUpstreamL0sUnsupported", "B"), ("bUpstreamL1Unsupported", "B"),
    ("bUpstreamL1PorSupported", "B"), ("bUpstreamL1PorMobileOnly", "B"), ("bSystemHasMux", "B"),
    ("upstreamAddressValid", "B"),  # 132..137
    # BUSINFO FHBBusInfo, chipsetIDInfo: deviceID, vendorID, subdeviceID, subvendorID, revisionID
    ("FHBBusInfo.deviceID", "H"), ("FHBBusInfo.vendorID", "H"), ("FHBBusInfo.subdeviceID", "H"),
    ("FHBBusInfo.subvendorID", "H"), ("FHBBusInfo.revisionID", "B"), ("", "x"),  # 138
    ("chipsetIDInfo.deviceID", "H"), ("chipsetIDInfo.vendorID", "H"),
    ("chipsetIDInfo.subdeviceID", "H"), ("chipsetIDInfo.subvendorID", "H"),
    ("chipsetIDInfo.revisionID", "B"), ("", "x"), ("", "2x"),  # 148; ACPI data is 4-aligned
    ("acpiMethodData", "676s"),  # 160
    ("hypervisorType", "I"), ("bIsPassthru", "B"), ("", "7x"),  # 836, 840
    ("sysTimerOffsetNs", "Q"),  # 848
    # GSP_VF_INFO: totalVFs, firstVFOffset, FirstVFBar0/1/2Address, b64bitBar0/1/2
    ("gspVFInfo.totalVFs", "I"), ("gspVFInfo.firstVFOffset", "I"),
    ("gspVFInfo.FirstVFBar0Address", "Q"), ("gspVFInfo.FirstVFBar1Address", "Q"),
    ("gspVFInfo.FirstVFBar2Address", "Q"), ("gspVFInfo.b64bitBar0", "B"),
    ("gspVFInfo.b64bitBar1", "B"), ("gspVFInfo.b64bitBar2", "B"), ("", "5x"),  # 856
    ("bIsPrimary", "B"), ("isGridBuild", "B"), ("", "2x"),  # 896
    ("pcieConfigReg.linkCap", "I"), ("gridBuildCsp", "I"),  # 900, 904
    ("bPreserveVideoMemoryAllocations", "B"), ("bTdrEventSupported", "B"),
    ("bFeatureStretchVblankCapable", "B"), ("bEnableDynamicGranularityPageArrays", "B"),
    ("bClockBoostSupported", "B"), ("bRouteDispIntrsToCPU", "B"), ("", "6x"),  # 908
    ("hostPageSize", "Q"),  # 920
)
GSP_SYSTEM_INFO = struct.Struct("<" + "".join(code for _, code in FIELDS))
NAMES = tuple(name for name, code in FIELDS if not code.endswith("x"))
SIZE = GSP_SYSTEM_INFO.size  # 928 (sizeof(GspSystemInfo), tests/test_sysinfo.py)


def offset(name: str) -> int:
    """The byte offset of member ``name`` (``"gspVFInfo.totalVFs"`` for a nested one)."""
    at = 0
    for member, code in FIELDS:
        if member == name:
            return at
        at += struct.calcsize("<" + code)
    raise KeyError(name)


# kbifGetPciConfigSpacePriMirror_GM107 (GA10x/AD10x): DEVICE_BASE(NV_PCFG) and its extent;
# ampere/ga100/dev_nv_xve.h NV_PCFG 0x00088FFF:0x00088000. nouveau gives the same.
PCI_CONFIG_MIRROR_BASE = 0x88000
PCI_CONFIG_MIRROR_SIZE = 0x1000
# kbifGetPciConfigSpacePriMirror_GH100 (GH100, GB10x, GB20x in g_kernel_bif_nvoc.c):
# DEVICE_BASE(NV_EP_PCFGM) and its extent; hopper/gh100/dev_xtl_ep_pri.h NV_EP_PCFGM
# 0x00092FFF:0x00092000. tinygrad gives 0x92000 where its boot goes through the FSP.
PCI_CONFIG_MIRROR_BASE_FSP = 0x92000
# osGetMaxUserVa on x86-64 Linux: TASK_SIZE with 4-level paging, (1 << 47) - one page;
# nouveau passes TASK_SIZE, nova-core the same number.
MAX_USER_VA = (1 << 47) - 0x1000
HOST_PAGE_SIZE = 0x1000  # osGetPageSize


@dataclass(frozen=True)
class SystemInfo:
    """The PCI facts of one GPU that GSP_SET_SYSTEM_INFO carries.

    ``bar0``, ``bar1``, ``bar3``: the bus addresses of BAR 0 (registers), BAR 1 (FB aperture)
    and BAR 3 (instance memory; nouveau's "BAR2"); ``domain``, ``bus``, ``devfn`` the function's
    place (devfn = device << 3 | function); the IDs as config space holds them.
    """

    bar0: int
    bar1: int
    bar3: int
    domain: int
    bus: int
    devfn: int
    vendor: int
    device: int
    subsystem_vendor: int = 0
    subsystem_device: int = 0
    revision: int = 0
    config_mirror: int = PCI_CONFIG_MIRROR_BASE  # the chip's (PCI_CONFIG_MIRROR_BASE_FSP ...)

    @classmethod
    def for_function(cls, info: FunctionInfo, *, subsystem_vendor: int | None = None,
                     subsystem_device: int | None = None, revision: int | None = None,
                     fsp_boot: bool = False) -> SystemInfo:
        """From a listed function: its BARs 0, 1 and 3, bus address and IDs (the subsystem's
        and the revision as the listing read them, unless given: NVIDIA reads NV_XVE_SUBSYSTEM
        and NV_XVE_REV_ID's revision byte from config space, gpuGetIdInfo_GM107, and
        rpcGspSetSystemInfo_v17_00 sends them); the config mirror of
        a chip that boots through the FSP (``fsp_boot``: GH100 and Blackwell, whose HAL is
        kbifGetPciConfigSpacePriMirror_GH100) at :data:`PCI_CONFIG_MIRROR_BASE_FSP`. Raises
        :class:`rig_edge.Misuse` if one of the BARs is missing."""
        bars = {b.index: b.address for b in info.bars}
        missing = [i for i in (0, 1, 3) if i not in bars]
        if missing:
            raise Misuse(f"{info.address} has no BAR {', '.join(map(str, missing))}: not an "
                         "Ampere/Ada GPU's BAR layout")
        domain, bus, dev, fn = parse_address(info.address)
        return cls(bars[0], bars[1], bars[3], domain, bus, dev << 3 | fn, info.vendor,
                   info.device,
                   info.subsystem_vendor if subsystem_vendor is None else subsystem_vendor,
                   info.subsystem_device if subsystem_device is None else subsystem_device,
                   info.revision if revision is None else revision,
                   PCI_CONFIG_MIRROR_BASE_FSP if fsp_boot else PCI_CONFIG_MIRROR_BASE)

    @property
    def domain_bus_devfn(self) -> int:
        """nvDomainBusDeviceFunc: NVGPU_BUSDEVICE_DOMAIN 63:32, _BUS 15:8, _DEVICE 7:0
        (generated/g_gpu_nvoc.h gpuEncodeDomainBusDevice; the DEVICE byte is the devfn)."""
        return self.domain << 32 | (self.bus & 0xFF) << 8 | self.devfn & 0xFF

    def values(self) -> dict[str, int | bytes]:
        """Every member of GspSystemInfo by name, as this boot fills it."""
        out: dict[str, int | bytes] = dict.fromkeys(NAMES, 0)
        out["acpiMethodData"] = b""
        out.update({
            "gpuPhysAddr": self.bar0, "gpuPhysFbAddr": self.bar1, "gpuPhysInstAddr": self.bar3,
            "nvDomainBusDeviceFunc": self.domain_bus_devfn, "maxUserVa": MAX_USER_VA,
            "pciConfigMirrorBase": self.config_mirror,
            "pciConfigMirrorSize": PCI_CONFIG_MIRROR_SIZE,
            # pGpu->idInfo / nouveau: device ID in 31:16, vendor in 15:0
            "PCIDeviceID": self.device << 16 | self.vendor,
            "PCISubDeviceID": self.subsystem_device << 16 | self.subsystem_vendor,
            "PCIRevisionID": self.revision, "hostPageSize": HOST_PAGE_SIZE,
        })
        return out

    def encode(self) -> bytes:
        """The GSP_SET_SYSTEM_INFO payload: GspSystemInfo, :data:`SIZE` bytes."""
        v = self.values()
        return GSP_SYSTEM_INFO.pack(*(v[name] for name in NAMES))


def decode(payload: bytes) -> dict[str, int | bytes]:
    """GspSystemInfo's members by name (for logs and tests)."""
    return dict(zip(NAMES, GSP_SYSTEM_INFO.unpack_from(payload), strict=True))

