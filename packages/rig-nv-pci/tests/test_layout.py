"""The radix-3 table, GspFwWprMeta and the FB layout, against numbers worked out by hand from
open-gpu-kernel-modules 570.144 (kernel_gsp.c, kernel_gsp_tu102.c, kernel_gsp_gh100.c,
gsp_fw_heap.h, gsp_fw_wpr_meta.h), not from rig_nv_pci.firmware.layout."""

import struct

import pytest

from rig_edge import Misuse, RigError
from rig_nv_pci.firmware import chips, layout

MiB, GiB = 1 << 20, 1 << 30
PAGE = 4096


# ---- radix-3 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pages", "levels"),
    [
        (1, (1, 1, 1)),
        (512, (1, 1, 1)),  # one level-2 page holds 512 entries
        (513, (1, 1, 2)),
        (512 * 512, (1, 1, 512)),
        (512 * 512 + 1, (1, 2, 513)),
        (512**3, (1, 512, 512 * 512)),
    ],
)
def test_shape_counts_pages_as_kgspCreateRadix3(pages: int, levels: tuple[int, int, int]) -> None:
    shape = layout.radix3_shape(pages * PAGE)
    assert (shape.levels, shape.data, shape.table_pages) == (levels, pages, sum(levels))


def test_shape_rounds_a_partial_page_up_and_refuses_what_level_0_cannot_hold() -> None:
    assert layout.radix3_shape(PAGE + 1).data == 2
    for bad in (0, -1, (512**3 + 1) * PAGE):
        with pytest.raises(Misuse):
            layout.radix3_shape(bad)


def walk(memory: dict[int, bytes], root: int, index: int) -> int:
    """The bus address of data page ``index``, read as the GSP reads the table: level 0's
    entry index >> 18, level 1's (index >> 9) & 511, level 2's index & 511, each 8 bytes."""
    addr = root
    for shift in (18, 9, 0):
        entry = (index >> shift) & 511
        (addr,) = struct.unpack_from("<Q", memory[addr], entry * 8)
    return addr


@pytest.mark.parametrize("pages", [1, 3, 512, 600, 512 * 512 + 5])
def test_table_decodes_back_to_every_data_page(pages: int) -> None:
    shape = layout.radix3_shape(pages * PAGE)
    # Scattered, descending addresses, so no entry can be right by being contiguous.
    data = [0x40_0000_0000 - (i * 3 + 1) * PAGE for i in range(pages)]
    tables = [0x80_0000_0000 + (i * 7 + 5) * PAGE for i in range(shape.table_pages)]
    rx = layout.radix3(data, tables)
    assert rx.root == tables[0] and len(rx.tables) == shape.table_pages * PAGE
    memory = {a: rx.tables[k * PAGE : (k + 1) * PAGE] for k, a in enumerate(tables)}
    for index in {0, pages // 2, pages - 1}:
        assert walk(memory, rx.root, index) == data[index]
    if pages > 600:
        assert all(walk(memory, rx.root, i) == data[i] for i in range(0, pages, 509))


def test_unused_entries_are_zero() -> None:
    data = [0x1000 * (i + 10) for i in range(3)]
    rx = layout.radix3(data, [0x100000, 0x101000, 0x102000])
    level0, level1, level2 = (rx.tables[k * PAGE : (k + 1) * PAGE] for k in range(3))
    assert struct.unpack_from("<2Q", level0) == (0x101000, 0)
    assert struct.unpack_from("<2Q", level1) == (0x102000, 0)
    assert struct.unpack_from("<4Q", level2) == (0xA000, 0xB000, 0xC000, 0)
    assert level2[32:] == bytes(PAGE - 32)


def test_radix3_misuse() -> None:
    with pytest.raises(Misuse):
        layout.radix3([0x1000], [0x2000, 0x3000])  # one table page too few
    with pytest.raises(Misuse):
        layout.radix3([0x1800], [0x2000, 0x3000, 0x4000])  # not page-aligned
    with pytest.raises(Misuse):
        layout.radix3([], [])


# ---- GspFwWprMeta ------------------------------------------------------------------------------

# offsetof of every field, from gcc on gsp_fw_wpr_meta.h at tag 570.144 (NvU64 = unsigned long
# long, NvU32 = unsigned int, NvU16 = unsigned short, NvU8 = unsigned char); size 256.
OFFSETS = {
    "magic": 0, "revision": 8, "sysmemAddrOfRadix3Elf": 16, "sizeOfRadix3Elf": 24,
    "sysmemAddrOfBootloader": 32, "sizeOfBootloader": 40, "bootloaderCodeOffset": 48,
    "bootloaderDataOffset": 56, "bootloaderManifestOffset": 64, "sysmemAddrOfSignature": 72,
    "sizeOfSignature": 80, "gspFwRsvdStart": 88, "nonWprHeapOffset": 96,
    "nonWprHeapSize": 104, "gspFwWprStart": 112, "gspFwHeapOffset": 120, "gspFwHeapSize": 128,
    "gspFwOffset": 136, "bootBinOffset": 144, "frtsOffset": 152, "frtsSize": 160,
    "gspFwWprEnd": 168, "fbSize": 176, "vgaWorkspaceOffset": 184, "vgaWorkspaceSize": 192,
    "bootCount": 200, "partitionRpcAddr": 208, "partitionRpcRequestOffset": 216,
    "partitionRpcReplyOffset": 218, "elfCodeOffset": 220, "sysmemAddrOfCrashReportQueue": 224,
    "sizeOfCrashReportQueue": 232, "lsUcodeVersion": 236, "gspFwHeapVfPartitionCount": 240,
    "flags": 241, "padding": 242, "pmuReservedSize": 244, "verified": 248,
}


def test_wpr_meta_is_the_headers_layout() -> None:
    assert layout.WPR_META.size == 256
    assert layout.wpr_meta_offsets() == OFFSETS
    assert layout.GSP_FW_WPR_META_MAGIC == 0xDC3AAE21371A60B3
    assert layout.GSP_FW_WPR_META_REVISION == 1
    assert layout.GSP_FW_WPR_META_VERIFIED == 0xA0A0A0A0A0A0A0A0


def test_wpr_meta_packs_each_field_at_its_offset() -> None:
    m = layout.WprMeta(gsp_fw_wpr_end=0x1122334455667788, partition_rpc_reply_offset=0xBEEF,
                  size_of_crash_report_queue=0x12345, flags=1, pmu_reserved_size=0x1820000,
                  verified=layout.GSP_FW_WPR_META_VERIFIED)
    raw = m.pack()
    assert struct.unpack_from("<QQ", raw, 0) == (0xDC3AAE21371A60B3, 1)
    assert struct.unpack_from("<Q", raw, OFFSETS["gspFwWprEnd"])[0] == 0x1122334455667788
    assert struct.unpack_from("<H", raw, OFFSETS["partitionRpcReplyOffset"])[0] == 0xBEEF
    assert struct.unpack_from("<I", raw, OFFSETS["sizeOfCrashReportQueue"])[0] == 0x12345
    assert raw[OFFSETS["flags"]] == 1 and raw[242:244] == b"\0\0"
    assert struct.unpack_from("<I", raw, OFFSETS["pmuReservedSize"])[0] == 0x1820000
    assert layout.WprMeta.unpack(raw) == m
    with pytest.raises(Misuse):
        layout.WprMeta(flags=256).pack()


# ---- the WPR heap and the FB layout ------------------------------------------------------------


def test_heap_from_the_fb_size() -> None:
    # OS carveout 22 MiB + RM base (8 MiB to Ada, 14 MiB Hopper+) + 96 KiB per GiB of FB,
    # MiB-aligned + 96 MiB for 2048 channels (48 KiB each).
    assert layout.wpr_heap_size(chips.AMPERE, 24 * GiB) == (22 + 8 + 3 + 96) * MiB  # 2.25 -> 3
    assert layout.wpr_heap_size(chips.ADA, 16 * GiB) == (22 + 8 + 2 + 96) * MiB  # 1.5 -> 2
    assert layout.wpr_heap_size(chips.BLACKWELL, 32 * GiB) == (22 + 14 + 3 + 96) * MiB
    # GiB rounded up: 24 GiB and a byte counts as 25 GiB (2.34 MiB -> 3 MiB still).
    assert layout.wpr_heap_size(chips.AMPERE, 48 * GiB + 1) == (22 + 8 + 5 + 96) * MiB
    # Ampere's heap must lie in the pre-scrubbed top 256 MiB with what is below and above it;
    # Ada's scrubber lifts that.
    assert layout.wpr_heap_size(chips.AMPERE, 24 * GiB, 2 * MiB, 153 * MiB) == 101 * MiB
    assert layout.wpr_heap_size(chips.ADA, 16 * GiB, 2 * MiB, 153 * MiB) == 128 * MiB
    with pytest.raises(RigError):
        layout.wpr_heap_size(chips.AMPERE, 24 * GiB, 2 * MiB, 254 * MiB)


ELF = 0x3003456  # a GSP image (radix-3 ELF) of 48 MiB and a bit
BOOT = 0x14AB0  # a bootloader of 84656 bytes


def test_24_gib_ga102_without_display() -> None:
    lay = layout.fb_layout(chips.AMPERE, 24 * GiB, ELF, BOOT)
    # VGA workspace: FB's top MiB (no display). WPR2's end: 0x5fff00000 aligned to 128 KiB.
    assert (lay.vga_workspace_offset, lay.vga_workspace_size) == (0x5FFF00000, MiB)
    assert lay.gsp_fw_wpr_end == 0x5FFF00000
    assert (lay.frts_offset, lay.frts_size) == (0x5FFE00000, MiB)
    assert lay.boot_bin_offset == 0x5FFDEB000  # 0x5ffe00000 - 0x14ab0, 4 KiB down
    assert lay.gsp_fw_offset == 0x5FCDE0000  # 0x5ffdeb000 - 0x3003456, 64 KiB down
    # Heap 129 MiB (under the 203 MiB the pre-scrubbed region leaves: 256 - 2 - 51).
    assert (lay.gsp_fw_heap_offset, lay.gsp_fw_heap_size) == (0x5F4C00000, 129 * MiB)
    assert lay.gsp_fw_wpr_start == 0x5F4B00000  # one MiB of metadata below the heap
    assert (lay.non_wpr_heap_offset, lay.non_wpr_heap_size) == (0x5F4A00000, MiB)
    assert lay.gsp_fw_rsvd_start == lay.non_wpr_heap_offset


def test_16_gib_ad104_with_a_low_vga_workspace() -> None:
    # NV_PDISP_VGA_WORKSPACE_BASE valid (bit 3) at 0x30000000 (bits 31:8 in 64 KiB units),
    # below FB's top MiB: the workspace moves to 128 KiB below FB's end.
    vga = layout.vga_workspace_offset(16 * GiB, 0x3000 << 8 | 0x8)
    assert vga == 0x3FFFE0000
    lay = layout.fb_layout(chips.ADA, 16 * GiB, ELF, BOOT, vga_workspace=vga)
    assert (lay.vga_workspace_offset, lay.vga_workspace_size) == (0x3FFFE0000, 0x20000)
    assert lay.gsp_fw_wpr_end == 0x3FFFE0000
    assert lay.frts_offset == 0x3FFEE0000
    assert lay.boot_bin_offset == 0x3FFECB000
    assert lay.gsp_fw_offset == 0x3FCEC0000
    assert (lay.gsp_fw_heap_offset, lay.gsp_fw_heap_size) == (0x3F4E00000, 128 * MiB)
    assert lay.gsp_fw_wpr_start == 0x3F4D00000
    assert lay.non_wpr_heap_offset == 0x3F4C00000


def test_vga_workspace_base() -> None:
    fb = 16 * GiB
    assert layout.vga_workspace_offset(fb, None) == fb - MiB  # no display
    assert layout.vga_workspace_offset(fb, 0x3FFF0 << 8) == fb - MiB  # STATUS not valid
    assert layout.vga_workspace_offset(fb, 0x3FFF0 << 8 | 0x8) == 0x3FFF00000  # in the top MiB


def test_a_large_image_on_ampere_clamps_the_heap_to_the_pre_scrubbed_region() -> None:
    lay = layout.fb_layout(chips.AMPERE, 24 * GiB, 150 * MiB, BOOT)
    assert lay.gsp_fw_offset == 0x5F67E0000
    # 256 MiB - (1 MiB metadata + 1 MiB non-WPR heap) - 153 MiB from the ELF up = 101 MiB.
    assert (lay.gsp_fw_heap_offset, lay.gsp_fw_heap_size) == (0x5F0200000, 101 * MiB)


def test_an_mmu_lock_below_the_workspace_ends_wpr2_below_it() -> None:
    lay = layout.fb_layout(chips.AMPERE, 24 * GiB, ELF, BOOT, mmu_lock_low=0x5FFE30000)
    assert lay.gsp_fw_wpr_end == 0x5FFE20000 and lay.frts_offset == 0x5FFD20000


def test_blackwell_gives_its_fmc_sizes_only() -> None:
    sizes = layout.fmc_sizes(chips.BLACKWELL, 32 * GiB)
    assert sizes == layout.FmcSizes(
        vga_workspace_size=0x20000,
        pmu_reserved_size=0x1820000,  # 8 MiB + 16 MiB + 4 KiB, up to 128 KiB
        non_wpr_heap_size=0x220000,
        gsp_fw_heap_size=135 * MiB,
        frts_size=MiB,
    )
    with pytest.raises(Misuse):
        layout.fb_layout(chips.BLACKWELL, 32 * GiB, ELF, BOOT)
    with pytest.raises(Misuse):
        layout.fmc_sizes(chips.AMPERE, 24 * GiB)


def test_wpr_meta_of_a_layout() -> None:
    lay = layout.fb_layout(chips.AMPERE, 24 * GiB, ELF, BOOT)
    sysmem = layout.Sysmem(radix3_root=0x7000_0000, elf_size=ELF, bootloader=0x7100_0000,
                      bootloader_size=BOOT, code_offset=0x0, data_offset=0xA000,
                      manifest_offset=0x14000, signature=0x7200_0000, signature_size=0x1000)
    raw = layout.wpr_meta(lay, sysmem).pack()

    def q(name: str) -> int:
        return int(struct.unpack_from("<Q", raw, OFFSETS[name])[0])

    assert q("magic") == 0xDC3AAE21371A60B3 and q("revision") == 1
    assert (q("sysmemAddrOfRadix3Elf"), q("sizeOfRadix3Elf")) == (0x7000_0000, ELF)
    assert (q("sysmemAddrOfBootloader"), q("sizeOfBootloader")) == (0x7100_0000, BOOT)
    assert q("bootloaderManifestOffset") == 0x14000
    assert (q("sysmemAddrOfSignature"), q("sizeOfSignature")) == (0x7200_0000, 0x1000)
    assert (q("gspFwWprStart"), q("gspFwWprEnd"), q("fbSize")) == (
        0x5F4B00000, 0x5FFF00000, 24 * GiB)
    assert (q("gspFwHeapOffset"), q("gspFwOffset"), q("bootBinOffset")) == (
        0x5F4C00000, 0x5FCDE0000, 0x5FFDEB000)
    assert q("bootCount") == 0 and q("verified") == 0
    assert raw[OFFSETS["flags"]] == layout.GSP_FW_FLAGS_CLOCK_BOOST

    fmc = layout.wpr_meta(layout.fmc_sizes(chips.BLACKWELL, 32 * GiB), sysmem).pack()
    assert struct.unpack_from("<I", fmc, OFFSETS["pmuReservedSize"])[0] == 0x1820000
    assert struct.unpack_from("<Q", fmc, OFFSETS["gspFwHeapSize"])[0] == 135 * MiB
    assert struct.unpack_from("<Q", fmc, OFFSETS["gspFwWprStart"])[0] == 0  # the FMC's to place
    assert fmc[OFFSETS["flags"]] == 0

    with pytest.raises(Misuse):
        layout.wpr_meta(lay, layout.Sysmem(0, ELF + 1, 0, BOOT, 0, 0, 0))


# ---- Hopper (GH100): kgspCalculateFbLayout_GH100 -----------------------------------------------

# The offsets GspFwWprMeta leaves 0 on GH100: "The actual offsets get filled in by ACR ucode
# when it sets up WPR2" (kernel_gsp_gh100.c).
ACR_PLACED = ("gspFwRsvdStart", "nonWprHeapOffset", "gspFwWprStart", "gspFwHeapOffset",
              "gspFwOffset", "bootBinOffset", "frtsOffset", "gspFwWprEnd", "fbSize",
              "vgaWorkspaceOffset")


@pytest.mark.parametrize(("fb_gib", "heap_mib"), [(80, 140), (96, 141), (141, 146)])
def test_gh100_gives_its_fmc_sizes_only(fb_gib: int, heap_mib: int) -> None:
    # Heap: 22 MiB OS carveout + 14 MiB base (GSP_FW_HEAP_PARAM_BASE_RM_SIZE_GH100, "Hopper+")
    # + 96 KiB per GiB MiB-aligned (80 GiB: 7.5 -> 8; 96: 9; 141: 13.2 -> 14) + 96 MiB; no
    # pre-scrubbed limit (kgspGetFwHeapSize(..., 0)). Non-WPR heap 2 MiB
    # (kgspGetNonWprHeapSize_d505ea), FRTS 0x100 4 KiB pages, VGA workspace 128 KiB, PMU 0.
    assert layout.fmc_sizes(chips.HOPPER, fb_gib * GiB) == layout.FmcSizes(
        vga_workspace_size=128 * 1024,
        pmu_reserved_size=0,
        non_wpr_heap_size=2 * MiB,
        gsp_fw_heap_size=heap_mib * MiB,
        frts_size=MiB,
    )
    with pytest.raises(Misuse):
        layout.fb_layout(chips.HOPPER, fb_gib * GiB, ELF, BOOT)


def test_gh100_wpr_meta_has_sizes_and_sysmem_addresses_only() -> None:
    sysmem = layout.Sysmem(radix3_root=0x1_2340_0000, elf_size=ELF, bootloader=0x1_2350_0000,
                           bootloader_size=BOOT, code_offset=0x0, data_offset=0xA000,
                           manifest_offset=0x14000, signature=0x1_2360_0000,
                           signature_size=0x1000, crash_queue=0x1_2370_0000,
                           crash_queue_size=0x1000)
    raw = layout.wpr_meta(layout.fmc_sizes(chips.HOPPER, 80 * GiB), sysmem).pack()

    def q(name: str) -> int:
        return int(struct.unpack_from("<Q", raw, OFFSETS[name])[0])

    def d(name: str) -> int:
        return int(struct.unpack_from("<I", raw, OFFSETS[name])[0])

    assert len(raw) == 256
    assert q("magic") == 0xDC3AAE21371A60B3 and q("revision") == 1
    assert (q("sysmemAddrOfRadix3Elf"), q("sizeOfRadix3Elf")) == (0x1_2340_0000, ELF)
    assert (q("sysmemAddrOfBootloader"), q("sizeOfBootloader")) == (0x1_2350_0000, BOOT)
    assert (q("bootloaderCodeOffset"), q("bootloaderDataOffset"),
            q("bootloaderManifestOffset")) == (0, 0xA000, 0x14000)
    assert (q("sysmemAddrOfSignature"), q("sizeOfSignature")) == (0x1_2360_0000, 0x1000)
    assert (q("sysmemAddrOfCrashReportQueue"), d("sizeOfCrashReportQueue")) == (
        0x1_2370_0000, 0x1000)
    assert (q("vgaWorkspaceSize"), q("nonWprHeapSize"), q("gspFwHeapSize"), q("frtsSize")) == (
        0x20000, 2 * MiB, 140 * MiB, MiB)
    assert d("pmuReservedSize") == 0
    assert {name: q(name) for name in ACR_PLACED} == dict.fromkeys(ACR_PLACED, 0)
    assert raw[OFFSETS["flags"]] == 0 and raw[OFFSETS["gspFwHeapVfPartitionCount"]] == 0
    assert q("bootCount") == 0 and q("verified") == 0
