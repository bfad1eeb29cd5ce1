"""rig_nv_pci.boot.fmc_params's GSP_FMC_BOOT_PARAMS against offsets worked out by hand from
open-gpu-kernel-modules' src/nvidia/arch/nvalloc/common/inc/gsp/gspifpub.h (570.144 and
580.105.08: not packed, GSP_DMA_TARGET an enum of 4 bytes, NvBool 1 byte), cross-checked with
ctypes laying out the same C structs, and kgspSetupGspFmcArgs_GH100's values (kernel_gsp_gh100.c).
Not computed from rig_nv_pci.boot.fmc_params."""

import ctypes
import struct

import pytest

from rig_edge import Misuse
from rig_nv_pci.boot import fmc_params as hopper
from rig_nv_pci.firmware import layout

# offsetof of every member. GSP_FMC_INIT_PARAMS {NvU32 regkeys} is 4 bytes, then the 8-aligned
# GSP_ACR_BOOT_GSP_RM_PARAMS {target 4, gspRmDescSize 4, gspRmDescOffset 8, wprCarveoutOffset 8,
# wprCarveoutSize 4, bIsGspRmBoot 1, 3 of padding} at 8 (32 bytes); GSP_RM_PARAMS {target, 4 of
# padding, bootArgsOffset} at 40 (16); GSP_SPDM_PARAMS {target, padding, payloadBufferOffset,
# payloadBufferSize, padding} at 56 (24): 80 bytes. 580 appends GSP_RM_MEM_PARAMS {NvU32 lo, hi}
# at 80: 88.
OFFSETS_570 = {
    "initParams.regkeys": 0,
    "bootGspRmParams.target": 8,
    "bootGspRmParams.gspRmDescSize": 12,
    "bootGspRmParams.gspRmDescOffset": 16,
    "bootGspRmParams.wprCarveoutOffset": 24,
    "bootGspRmParams.wprCarveoutSize": 32,
    "bootGspRmParams.bIsGspRmBoot": 36,
    "gspRmParams.target": 40,
    "gspRmParams.bootArgsOffset": 48,
    "gspSpdmParams.target": 56,
    "gspSpdmParams.payloadBufferOffset": 64,
    "gspSpdmParams.payloadBufferSize": 72,
}
OFFSETS_580 = {
    **OFFSETS_570,
    "gspRmMemParams.flushSysmemAddrValLo": 80,
    "gspRmMemParams.flushSysmemAddrValHi": 84,
}


# The C structs of gspifpub.h, for ctypes to lay out with the platform's natural alignment.
class _Init(ctypes.Structure):
    _fields_ = [("regkeys", ctypes.c_uint32)]


class _AcrBoot(ctypes.Structure):
    _fields_ = [("target", ctypes.c_uint32), ("gspRmDescSize", ctypes.c_uint32),
                ("gspRmDescOffset", ctypes.c_uint64), ("wprCarveoutOffset", ctypes.c_uint64),
                ("wprCarveoutSize", ctypes.c_uint32), ("bIsGspRmBoot", ctypes.c_uint8)]


class _Rm(ctypes.Structure):
    _fields_ = [("target", ctypes.c_uint32), ("bootArgsOffset", ctypes.c_uint64)]


class _Spdm(ctypes.Structure):
    _fields_ = [("target", ctypes.c_uint32), ("payloadBufferOffset", ctypes.c_uint64),
                ("payloadBufferSize", ctypes.c_uint32)]


class _Mem(ctypes.Structure):
    _fields_ = [("flushSysmemAddrValLo", ctypes.c_uint32),
                ("flushSysmemAddrValHi", ctypes.c_uint32)]


class _Fmc570(ctypes.Structure):
    _fields_ = [("initParams", _Init), ("bootGspRmParams", _AcrBoot), ("gspRmParams", _Rm),
                ("gspSpdmParams", _Spdm)]


class _Fmc580(ctypes.Structure):
    _fields_ = [*_Fmc570._fields_, ("gspRmMemParams", _Mem)]


def _ctypes_offsets(outer: type[ctypes.Structure]) -> dict[str, int]:
    out = {}
    for name, inner in outer._fields_:
        base = getattr(outer, name).offset
        for member, _ in inner._fields_:
            out[f"{name}.{member}"] = base + getattr(inner, member).offset
    return out


@pytest.mark.parametrize(("release", "size", "offsets", "c"), [
    ("570.144", 80, OFFSETS_570, _Fmc570), ("580.105.08", 88, OFFSETS_580, _Fmc580)])
def test_fmc_boot_params_is_the_headers_layout(release: str, size: int,
                                               offsets: dict[str, int],
                                               c: type[ctypes.Structure]) -> None:
    assert hopper.FMC_BOOT_PARAMS[release].size == size == ctypes.sizeof(c)
    assert hopper.fmc_boot_params_offsets(release) == offsets == _ctypes_offsets(c)
    assert len(hopper.FmcBootParams().pack(release)) == size


def test_the_default_release_is_the_firmwares() -> None:
    assert hopper.fmc_boot_params_offsets() == OFFSETS_570
    assert len(hopper.FmcBootParams().pack()) == 80
    with pytest.raises(Misuse, match=r"no GSP_FMC_BOOT_PARAMS layout is known for release "
                                     r"'535\.113\.01'"):
        hopper.FmcBootParams().pack("535.113.01")


def test_dma_targets_are_gspifpub_hs() -> None:
    assert (hopper.GSP_DMA_TARGET_LOCAL_FB, hopper.GSP_DMA_TARGET_COHERENT_SYSTEM,
            hopper.GSP_DMA_TARGET_NONCOHERENT_SYSTEM) == (0, 1, 2)


def _u32(raw: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", raw, off)[0])


def _u64(raw: bytes, off: int) -> int:
    return int(struct.unpack_from("<Q", raw, off)[0])


def test_builder_fills_what_kgspSetupGspFmcArgs_GH100_fills() -> None:
    p = hopper.fmc_boot_params(0x1_2345_6000, 0x2_3456_7000)
    raw = p.pack("570.144")
    o = OFFSETS_570
    # bootGspRmParams: the WPR metadata (coherent sysmem, as nouveau and nova-core give it),
    # sizeof(GspFwWprMeta), bIsGspRmBoot; no carveout.
    assert _u32(raw, o["bootGspRmParams.target"]) == 1
    assert _u32(raw, o["bootGspRmParams.gspRmDescSize"]) == 256 == layout.WPR_META.size
    assert _u64(raw, o["bootGspRmParams.gspRmDescOffset"]) == 0x1_2345_6000
    assert _u64(raw, o["bootGspRmParams.wprCarveoutOffset"]) == 0
    assert _u32(raw, o["bootGspRmParams.wprCarveoutSize"]) == 0
    assert raw[o["bootGspRmParams.bIsGspRmBoot"]] == 1
    # gspRmParams: the LibOS arguments, coherent sysmem: _kgspMemdescToDmaTarget of rig's
    # write-back cached DMA memory (issue 26 finding 4)
    assert _u32(raw, o["gspRmParams.target"]) == 1
    assert _u64(raw, o["gspRmParams.bootArgsOffset"]) == 0x2_3456_7000
    # no regkeys, no SPDM; every padding byte zero
    assert _u32(raw, 0) == 0 and raw[56:80] == bytes(24)
    assert raw[4:8] == bytes(4) and raw[37:40] == bytes(3) and raw[44:48] == bytes(4)
    assert hopper.FmcBootParams.unpack(raw) == p


def test_580_carries_the_flush_address_and_570_refuses_it() -> None:
    p = hopper.fmc_boot_params(0x1000, 0x2000, flush_sysmem_addr=0x12_3456_7000,
                               wpr_meta_target=hopper.GSP_DMA_TARGET_NONCOHERENT_SYSTEM,
                               regkeys=0x5)
    raw = p.pack("580.105.08")
    assert _u32(raw, OFFSETS_580["gspRmMemParams.flushSysmemAddrValLo"]) == 0x3456_7000
    assert _u32(raw, OFFSETS_580["gspRmMemParams.flushSysmemAddrValHi"]) == 0x12
    assert _u32(raw, OFFSETS_580["bootGspRmParams.target"]) == 2
    assert _u32(raw, OFFSETS_580["initParams.regkeys"]) == 5
    assert hopper.FmcBootParams.unpack(raw, "580.105.08") == p
    with pytest.raises(Misuse, match=r"570\.144 has no gspRmMemParams"):
        p.pack("570.144")
    # Without a flush address the 580 layout is the 570 one and eight zero bytes.
    q = hopper.fmc_boot_params(0x1000, 0x2000)
    assert q.pack("580.105.08") == q.pack("570.144") + bytes(8)


@pytest.mark.parametrize("bad", [
    {"wpr_meta": 0}, {"libos_args": 0}, {"wpr_meta": 1 << 64}, {"libos_args": -4096},
    {"wpr_meta_target": 3}, {"libos_args_target": -1}, {"flush_sysmem_addr": 1 << 64},
])
def test_builder_misuse(bad: dict[str, int]) -> None:
    args = {"wpr_meta": 0x1000, "libos_args": 0x2000, **bad}
    with pytest.raises(Misuse):
        hopper.fmc_boot_params(**args)


def test_a_field_too_large_is_misuse() -> None:
    with pytest.raises(Misuse, match="does not fit"):
        hopper.FmcBootParams(is_gsp_rm_boot=256).pack()
