"""rig_nv_pci.gsp.static_info: GspStaticConfigInfo's offsets against a layout computed from the
header's member list (tests/sim/c_structs.py's c_layout, written apart from rig), decoding, and
GET_GSP_STATIC_INFO against the GSP peer."""

from __future__ import annotations

import struct

import pytest
from sim import c_structs, peer_module
from support import connect

from rig_nv.rm import RMError
from rig_nv_pci.gsp import rpc, static_info
from rig_nv_pci.gsp.static_info import FbRegion, StaticInfo, StaticInfoError


def layout() -> tuple[int, dict[str, tuple[int, int, int]]]:
    size, align, leaves = c_structs.c_layout("GspStaticConfigInfo")
    assert align == 8
    return size, leaves


def test_offsets_and_size_match_the_headers_layout() -> None:
    size, leaves = layout()
    # sizeof(GspStaticConfigInfo) of 570.144 (gsp_static_config.h); gcc on the header's text
    # gives the same 1656 and offsets
    assert static_info.SIZE == size == 1656
    assert static_info.FB_REGION_INFO == leaves["fbRegionInfoParams.numFBRegions"][0] == 344
    assert leaves["fbRegionInfoParams.fbRegion[0].base"][0] == static_info.FB_REGION_FIRST
    stride = (leaves["fbRegionInfoParams.fbRegion[1].base"][0]
              - leaves["fbRegionInfoParams.fbRegion[0].base"][0])
    assert static_info.FB_REGION.size == stride == 48
    assert f"fbRegionInfoParams.fbRegion[{static_info.FB_REGION_MAX - 1}].base" in leaves
    assert f"fbRegionInfoParams.fbRegion[{static_info.FB_REGION_MAX}].base" not in leaves
    first = static_info.FB_REGION_FIRST
    for member, at in (("base", 0), ("limit", 8), ("reserved", 16), ("performance", 24),
                       ("supportCompressed", 28), ("supportISO", 29), ("bProtected", 30),
                       ("blackList", 31)):
        assert leaves[f"fbRegionInfoParams.fbRegion[0].{member}"][0] == first + at, member
    assert static_info.FB_LENGTH == leaves["fb_length"][0] == 1224
    assert leaves["l2_cache_size"][0] == static_info.L2_CACHE_SIZE
    name_at, _, name_length = leaves["gpuNameString"]
    assert (name_at, name_length) == (static_info.GPU_NAME, static_info.GPU_NAME_LENGTH)
    assert static_info.BAR_PDE_BASES == leaves["bar1PdeBase"][0] == 1536
    assert leaves["bar2PdeBase"][0] == static_info.BAR_PDE_BASES + 8
    assert static_info.INTERNAL_HANDLES == leaves["hInternalClient"][0] == 1600
    assert [leaves[n][0] for n in ("hInternalDevice", "hInternalSubdevice")] == [1604, 1608]
    assert static_info.PAGE_RETIREMENT == leaves["bPageRetirementSupported"][0] == 1564


def hand_built() -> bytearray:
    """A GspStaticConfigInfo written member by member at the computed layout's offsets."""
    size, leaves = layout()
    data = bytearray(size)

    def put(name: str, fmt: str, *values: object) -> None:
        struct.pack_into(fmt, data, leaves[name][0], *values)

    put("hInternalClient", "<I", 0xC1E0_0007)
    put("hInternalDevice", "<I", 0xD0D0_0001)
    put("hInternalSubdevice", "<I", 0x5D5D_0001)
    put("fbRegionInfoParams.numFBRegions", "<I", 2)
    put("fbRegionInfoParams.fbRegion[0].base", "<3QI3B", 0, 0x1_FFFF_FFFF, 0x400_0000, 15,
        1, 1, 0)
    put("fbRegionInfoParams.fbRegion[0].blackList", "17B", *[1] * 17)  # deprecated, ignored
    put("fbRegionInfoParams.fbRegion[1].base", "<3QI3B", 0x2_0000_0000, 0x2_01FF_FFFF, 0, 1,
        0, 0, 1)
    put("fbRegionInfoParams.fbRegion[2].base", "<Q", 0xDEAD)  # past numFBRegions: ignored
    put("bar1PdeBase", "<2Q", 0x1_FFE0_0000, 0x1_FFF0_0000)
    put("fb_length", "<Q", 8 << 30)
    put("l2_cache_size", "<I", 0x40_0000)
    put("gpuNameString", "64s", b"NVIDIA GeForce RTX 3070")
    put("gpuShortNameString", "64s", b"GA104")
    put("bPageRetirementSupported", "B", 1)
    return data


def test_decode_of_a_hand_built_payload() -> None:
    info = static_info.decode(bytes(hand_built()))
    assert info == StaticInfo(
        0xC1E0_0007, 0xD0D0_0001, 0x5D5D_0001,
        (FbRegion(0, 0x1_FFFF_FFFF, 0x400_0000, 15, compressed=True, iso=True, protected=False),
         FbRegion(0x2_0000_0000, 0x2_01FF_FFFF, 0, 1, compressed=False, iso=False,
                  protected=True)),
        0x1_FFE0_0000, 0x1_FFF0_0000, 8 << 30, 0x40_0000, "NVIDIA GeForce RTX 3070",
        page_retirement=True)
    assert info.fb_regions[0].size == 8 << 30 and info.fb_regions[1].size == 32 << 20


@pytest.mark.parametrize(("field", "fmt", "value", "message"), [
    ("fbRegionInfoParams.numFBRegions", "<I", 17, r"garbled: 17 FB regions \(at most 16\)"),
    ("fbRegionInfoParams.fbRegion[1].limit", "<Q", 0x1_0000_0000,
     r"garbled: FB region 1 \[0x200000000..0x100000000\]"),
    ("fbRegionInfoParams.fbRegion[0].supportISO", "B", 0xA5, r"garbled: FB region 0 .*165"),
    ("hInternalClient", "<I", 0, r"garbled: no internal client handle"),
    ("bPageRetirementSupported", "B", 2, r"garbled: bPageRetirementSupported 2"),
])
def test_garbled_payloads_are_refused(field: str, fmt: str, value: int, message: str) -> None:
    _, leaves = layout()
    data = hand_built()
    struct.pack_into(fmt, data, leaves[field][0], value)
    with pytest.raises(StaticInfoError, match=message):
        static_info.decode(bytes(data))


@pytest.mark.parametrize("size", [0, 100, 1655, 1657, 2048])
def test_a_reply_of_another_size_is_refused(size: int) -> None:
    with pytest.raises(StaticInfoError, match=rf"replied {size} bytes, not the 1656 of "
                                              r"570.144's GspStaticConfigInfo"):
        static_info.decode(bytes(hand_built()).ljust(size, b"\0")[:size])


def test_get_static_info_asks_the_gsp_and_decodes_its_reply() -> None:
    fields = {"hInternalClient": 0xC1E0_0099, "hInternalDevice": 0xD0_0099,
              "hInternalSubdevice": 0x5D_0099, "fbRegionInfoParams.numFBRegions": 0,
              "bar2PdeBase": 0x7000_0000}
    channel, peer = connect(static_fields=fields)
    info = static_info.get_static_info(channel)
    defaults = peer_module().STATIC_DEFAULTS
    assert (info.internal_client, info.internal_device, info.internal_subdevice) == (
        0xC1E0_0099, 0xD0_0099, 0x5D_0099)
    assert info.fb_regions == () and info.bar2_pde_base == 0x7000_0000
    assert info.bar1_pde_base == defaults["bar1PdeBase"]
    assert info.gpu_name == defaults["gpuNameString"].decode()  # type: ignore[union-attr]
    (request,) = peer.requests
    assert request.function == rpc.Function.GET_GSP_STATIC_INFO == 65
    assert request.payload == bytes(1656)


def test_the_peers_default_regions_decode() -> None:
    channel, _ = connect()
    regions = static_info.get_static_info(channel).fb_regions
    assert [(r.base, r.limit, r.compressed, r.iso, r.protected) for r in regions] == [
        (0, 0x5_FDFF_FFFF, True, True, False), (0x5_FE00_0000, 0x5_FFFF_FFFF, False, False, True)]


def test_a_short_reply_raises_naming_the_gpu() -> None:
    channel, _ = connect(static_info=bytes(40))
    with pytest.raises(StaticInfoError, match=r"^GPU 0: GET_GSP_STATIC_INFO replied 40 bytes"):
        static_info.get_static_info(channel)


def test_a_garbled_reply_raises_naming_the_gpu() -> None:
    data = hand_built()
    struct.pack_into("<I", data, static_info.FB_REGION_INFO, 0xFFFF_FFFF)
    channel, _ = connect(static_info=bytes(data))
    with pytest.raises(StaticInfoError, match=r"^GPU 0: GET_GSP_STATIC_INFO is garbled: "
                                              r"4294967295 FB regions"):
        static_info.get_static_info(channel)


def test_a_refusal_raises_the_rm_status_naming_the_gpu() -> None:
    channel, _ = connect(static_status=0x56)
    with pytest.raises(RMError, match=r"^GPU 0: RPC GET_GSP_STATIC_INFO \(rpc_result "
                                      r"NV_ERR_NOT_SUPPORTED"):
        static_info.get_static_info(channel)


def test_silence_raises_a_timeout_naming_the_gpu() -> None:
    channel, _ = connect(timeout_s=0.05, auto=False, sleep=lambda _left: None)
    # the one timeout that takes the GSP as not answering: a Lost, still an RpcTimeout
    with pytest.raises(rpc.RpcTimeout, match=r"^the device is lost: GPU 0: the GSP sent no "
                                             r"GET_GSP_STATIC_INFO"):
        static_info.get_static_info(channel)
