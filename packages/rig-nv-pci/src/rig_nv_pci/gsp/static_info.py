"""GET_GSP_STATIC_INFO: the static configuration GSP-RM reports once it is up.

kgspInitRm (src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c) asks for it right after the boot
(_kgspBootGspRm, whose kgspBootstrap ends in kgspWaitForRmInitDone, i.e. GSP_INIT_DONE) and
SET_GUEST_SYSTEM_INFO (the RPC version handshake, which rig does not send), before it or anyone
allocates an RM client; nouveau reads it in r535_gsp_rpc_get_gsp_static_info.
rpcGetGspStaticInfo_v14_00 (src/kernel/vgpu/rpc.c) sends a request of
``sizeof(GspStaticConfigInfo)`` payload bytes and copies as many back from the reply.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/gsp-static_info.md."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rig_edge import RigError
from rig_nv_pci.gsp.rpc import Function, Rpc

SIZE = 1656  # sizeof(GspStaticConfigInfo), 570.144

# Offsets in GspStaticConfigInfo (see the module's docstring for how each follows).
FB_REGION_INFO = 344  # fbRegionInfoParams: NvU32 numFBRegions
FB_REGION_FIRST = FB_REGION_INFO + 8  # fbRegionInfoParams.fbRegion[0] (8-aligned NvU64 base)
FB_REGION_MAX = 16  # NV2080_CTRL_CMD_FB_GET_FB_REGION_INFO_MAX_ENTRIES (ctrl2080fb.h)
# NV2080_CTRL_CMD_FB_GET_FB_REGION_FB_REGION_INFO (ctrl2080fb.h): NvU64 base, limit, reserved;
# NvU32 performance; NvBool supportCompressed, supportISO, bProtected; then
# blackList[NV2080_CTRL_CMD_FB_GET_FB_REGION_INFO_MEM_TYPES 17] (deprecated; skipped): 48 bytes
FB_REGION = struct.Struct("<3QI3B17x")
FB_LENGTH = 1224  # NvU64 fb_length
L2_CACHE_SIZE = 1256  # NvU32 l2_cache_size
GPU_NAME = 1260  # NvU8 gpuNameString[NV2080_GPU_MAX_NAME_STRING_LENGTH 0x40] (ctrl2080gpu.h)
GPU_NAME_LENGTH = 0x40
BAR_PDE_BASES = 1536  # NvU64 bar1PdeBase, bar2PdeBase
PAGE_RETIREMENT = 1564  # NvBool bPageRetirementSupported
INTERNAL_HANDLES = 1600  # NvHandle hInternalClient, hInternalDevice, hInternalSubdevice

U32, U64, TWO_U64, THREE_U32 = (struct.Struct(f) for f in ("<I", "<Q", "<2Q", "<3I"))


class StaticInfoError(RigError):
    """GET_GSP_STATIC_INFO's reply cannot be 570.144's GspStaticConfigInfo."""


@dataclass(frozen=True)
class FbRegion:
    """One NV2080_CTRL_CMD_FB_GET_FB_REGION_FB_REGION_INFO (ctrl2080fb.h): the FB addresses
    [base..limit], what RM needs to keep of it (``reserved``), its relative ``performance``,
    whether compressed kinds, ISO surfaces (display, cursor, video) are allowed in it, and
    whether only protected allocations may use it."""

    base: int
    limit: int
    reserved: int
    performance: int
    compressed: bool
    iso: bool
    protected: bool

    @property
    def size(self) -> int:
        return self.limit - self.base + 1


@dataclass(frozen=True)
class StaticInfo:
    """What rig reads of GspStaticConfigInfo: the handles of GSP-RM's internal client, device
    and subdevice (for RM-internal controls), the FB regions, the BAR1/BAR2 page directory
    bases, the FB size, the L2 cache size, the GPU's name and whether GSP-RM retires pages
    (bPageRetirementSupported: only then does CPU-RM ask for the retired ones,
    :mod:`rig_nv_pci.gsp.retired`)."""

    internal_client: int
    internal_device: int
    internal_subdevice: int
    fb_regions: tuple[FbRegion, ...]
    bar1_pde_base: int
    bar2_pde_base: int
    fb_length: int
    l2_cache_size: int
    gpu_name: str
    page_retirement: bool = False


def decode(payload: bytes) -> StaticInfo:
    """The :class:`StaticInfo` of a GET_GSP_STATIC_INFO reply's payload; raises
    :class:`StaticInfoError` for a reply of another size, more FB regions than the struct
    holds, a region ending before it starts, a flag that is no NvBool (a region's,
    bPageRetirementSupported), or a null internal client handle (GSP-RM always has one)."""
    if len(payload) != SIZE:
        raise StaticInfoError(f"GET_GSP_STATIC_INFO replied {len(payload)} bytes, not the "
                              f"{SIZE} of 570.144's GspStaticConfigInfo")
    (count,) = U32.unpack_from(payload, FB_REGION_INFO)
    if count > FB_REGION_MAX:
        raise StaticInfoError(f"GET_GSP_STATIC_INFO is garbled: {count} FB regions "
                              f"(at most {FB_REGION_MAX})")
    regions = []
    for i in range(count):
        base, limit, reserved, perf, *flags = FB_REGION.unpack_from(
            payload, FB_REGION_FIRST + i * FB_REGION.size)
        if limit < base or any(f > 1 for f in flags):
            raise StaticInfoError(f"GET_GSP_STATIC_INFO is garbled: FB region {i} "
                                  f"[0x{base:x}..0x{limit:x}], flags {flags}")
        regions.append(FbRegion(base, limit, reserved, perf, *(bool(f) for f in flags)))
    client, device, subdevice = THREE_U32.unpack_from(payload, INTERNAL_HANDLES)
    if client == 0:
        raise StaticInfoError("GET_GSP_STATIC_INFO is garbled: no internal client handle "
                              "(hInternalClient 0)")
    bar1, bar2 = TWO_U64.unpack_from(payload, BAR_PDE_BASES)
    retirement = payload[PAGE_RETIREMENT]
    if retirement > 1:
        raise StaticInfoError(f"GET_GSP_STATIC_INFO is garbled: bPageRetirementSupported "
                              f"{retirement}")
    name = payload[GPU_NAME:GPU_NAME + GPU_NAME_LENGTH].split(b"\0", 1)[0]
    return StaticInfo(client, device, subdevice, tuple(regions), bar1, bar2,
                      U64.unpack_from(payload, FB_LENGTH)[0],
                      U32.unpack_from(payload, L2_CACHE_SIZE)[0],
                      name.decode(errors="replace"), bool(retirement))


def get_static_info(rpc: Rpc, timeout_s: float | None = None) -> StaticInfo:
    """Send GET_GSP_STATIC_INFO (a zeroed GspStaticConfigInfo, as rpcGetGspStaticInfo_v14_00
    sizes it) and decode the reply. A refusal raises :class:`rig_nv.rm.RMError`, silence
    :class:`rig_nv_pci.gsp.rpc.RpcTimeout`, a reply that is no GspStaticConfigInfo
    :class:`StaticInfoError`; each names the GPU."""
    reply = rpc.call(Function.GET_GSP_STATIC_INFO, bytes(SIZE), timeout_s=timeout_s)
    try:
        return decode(reply.payload)
    except StaticInfoError as e:
        raise StaticInfoError(f"{rpc.name}: {e}") from e
