"""The host-side layouts a GSP boot hands the firmware: the radix-3 page table of the GSP's
image, GspFwWprMeta, and where WPR2's regions lie in the GPU's memory (FB).

Every number is open-gpu-kernel-modules 570.144's, the release of the GSP firmware this library
boots.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/firmware-layout.md."""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from rig_edge import Misuse, RigError
from rig_nv_pci.firmware.chips import Family

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def align_down(n: int, to: int) -> int:
    return n - n % to


def align_up(n: int, to: int) -> int:
    return -(-n // to) * to


# ---- the radix-3 page table --------------------------------------------------------------------

# libos_init_args.h: LIBOS_MEMORY_REGION_RADIX_PAGE_LOG2 12; each entry is a 64-bit bus address.
RADIX3_PAGE_LOG2 = 12
RADIX3_PAGE = 1 << RADIX3_PAGE_LOG2
RADIX3_ENTRIES_LOG2 = RADIX3_PAGE_LOG2 - 3  # 512 entries a page


@dataclass(frozen=True)
class Radix3Shape:
    """How many 4 KiB pages each level of the table of an image takes: ``levels`` for levels
    0, 1 and 2 (level 0 is always one page), ``data`` for the image itself."""

    levels: tuple[int, int, int]
    data: int

    @property
    def table_pages(self) -> int:
        return sum(self.levels)


def radix3_shape(size: int) -> Radix3Shape:
    """The shape of the table of an image of ``size`` bytes, as kgspCreateRadix3 counts it:
    the data's pages, then each level up ``((n - 1) >> 9) + 1`` pages, level 0 one page.

    Raises :class:`rig_edge.Misuse` if ``size`` is not positive or so large (over 512 GiB) that
    level 0 would need more than one page.
    """
    if size <= 0:
        raise Misuse(f"a radix-3 table maps a positive number of bytes, not {size}")
    counts = [(size + RADIX3_PAGE - 1) >> RADIX3_PAGE_LOG2]
    for _ in range(3):
        counts.insert(0, ((counts[0] - 1) >> RADIX3_ENTRIES_LOG2) + 1)
    if counts[0] != 1:
        raise Misuse(f"{size} bytes are too many for a radix-3 table's one page at level 0")
    return Radix3Shape((counts[0], counts[1], counts[2]), counts[3])


@dataclass(frozen=True)
class Radix3:
    """A radix-3 table: ``tables`` holds its pages, level 0's page first, then level 1's, then
    level 2's, to be written at the bus addresses the table was built for; ``root`` is level
    0's page's bus address (GspFwWprMeta's ``sysmemAddrOfRadix3Elf``)."""

    tables: bytes
    root: int
    shape: Radix3Shape


def _entries(addresses: Sequence[int], pages: int) -> bytes:
    out = bytearray(pages * RADIX3_PAGE)
    struct.pack_into(f"<{len(addresses)}Q", out, 0, *addresses)
    return bytes(out)


def radix3(data: Sequence[int], tables: Sequence[int]) -> Radix3:
    """The radix-3 table of an image whose 4 KiB pages lie at the bus addresses ``data``, in
    order, its own pages to lie at ``tables`` (level 0's one page, then level 1's, then level
    2's: ``radix3_shape(len(data) * 4096).table_pages`` of them).

    Level 2's entries are the data pages' addresses, level 1's those of level 2's pages, level
    0's those of level 1's pages, each level's entries filling its pages in order, the rest
    zero: kgspCreateRadix3_IMPL's "PDEs" and "PTEs". (NVIDIA lays tables and data in one
    buffer, tables first; nouveau gives each level its own memory: the entries are the same.)

    Raises :class:`rig_edge.Misuse` for no data, the wrong number of table pages, or an address
    that is not a 4 KiB-aligned 64-bit bus address.
    """
    shape = radix3_shape(len(data) * RADIX3_PAGE)
    if len(tables) != shape.table_pages:
        raise Misuse(
            f"a radix-3 table of {len(data)} pages has {shape.table_pages} pages of its own, "
            f"not {len(tables)}"
        )
    for a in (*data, *tables):
        if not 0 <= a < 1 << 64 or a % RADIX3_PAGE:
            raise Misuse(f"0x{a:x} is not the bus address of a 4 KiB page")
    n0, n1, _n2 = shape.levels
    level1, level2 = tables[n0 : n0 + n1], tables[n0 + n1 :]
    out = _entries(level1, n0) + _entries(level2, n1) + _entries(data, shape.levels[2])
    return Radix3(out, tables[0], shape)


# ---- GspFwWprMeta ------------------------------------------------------------------------------

GSP_FW_WPR_META_MAGIC = 0xDC3AAE21371A60B3
GSP_FW_WPR_META_REVISION = 1
GSP_FW_WPR_META_VERIFIED = 0xA0A0A0A0A0A0A0A0
GSP_FW_FLAGS_CLOCK_BOOST = 1 << 0
GSP_FW_FLAGS_RECOVERY_MARGIN_PRESENT = 1 << 1
GSP_FW_FLAGS_PPCIE_ENABLED = 1 << 2

# (our name, NVIDIA's, struct format), in gsp_fw_wpr_meta.h's order. Of the first union the
# boot view (sysmemAddrOfSignature, sizeOfSignature; at resume its first 4 bytes are
# gspFwHeapFreeListWprOffset); of the second the partition RPC fields and elfCodeOffset, then
# the CrashCat queue (which shares its bytes with elfDataOffset, elfCodeSize and elfDataSize),
# then lsUcodeVersion.
WPR_META_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("magic", "magic", "Q"),
    ("revision", "revision", "Q"),
    ("sysmem_addr_of_radix3_elf", "sysmemAddrOfRadix3Elf", "Q"),
    ("size_of_radix3_elf", "sizeOfRadix3Elf", "Q"),
    ("sysmem_addr_of_bootloader", "sysmemAddrOfBootloader", "Q"),
    ("size_of_bootloader", "sizeOfBootloader", "Q"),
    ("bootloader_code_offset", "bootloaderCodeOffset", "Q"),
    ("bootloader_data_offset", "bootloaderDataOffset", "Q"),
    ("bootloader_manifest_offset", "bootloaderManifestOffset", "Q"),
    ("sysmem_addr_of_signature", "sysmemAddrOfSignature", "Q"),
    ("size_of_signature", "sizeOfSignature", "Q"),
    ("gsp_fw_rsvd_start", "gspFwRsvdStart", "Q"),
    ("non_wpr_heap_offset", "nonWprHeapOffset", "Q"),
    ("non_wpr_heap_size", "nonWprHeapSize", "Q"),
    ("gsp_fw_wpr_start", "gspFwWprStart", "Q"),
    ("gsp_fw_heap_offset", "gspFwHeapOffset", "Q"),
    ("gsp_fw_heap_size", "gspFwHeapSize", "Q"),
    ("gsp_fw_offset", "gspFwOffset", "Q"),
    ("boot_bin_offset", "bootBinOffset", "Q"),
    ("frts_offset", "frtsOffset", "Q"),
    ("frts_size", "frtsSize", "Q"),
    ("gsp_fw_wpr_end", "gspFwWprEnd", "Q"),
    ("fb_size", "fbSize", "Q"),
    ("vga_workspace_offset", "vgaWorkspaceOffset", "Q"),
    ("vga_workspace_size", "vgaWorkspaceSize", "Q"),
    ("boot_count", "bootCount", "Q"),
    ("partition_rpc_addr", "partitionRpcAddr", "Q"),
    ("partition_rpc_request_offset", "partitionRpcRequestOffset", "H"),
    ("partition_rpc_reply_offset", "partitionRpcReplyOffset", "H"),
    ("elf_code_offset", "elfCodeOffset", "I"),
    ("sysmem_addr_of_crash_report_queue", "sysmemAddrOfCrashReportQueue", "Q"),
    ("size_of_crash_report_queue", "sizeOfCrashReportQueue", "I"),
    ("ls_ucode_version", "lsUcodeVersion", "I"),
    ("gsp_fw_heap_vf_partition_count", "gspFwHeapVfPartitionCount", "B"),
    ("flags", "flags", "B"),
    ("padding", "padding", "2x"),
    ("pmu_reserved_size", "pmuReservedSize", "I"),
    ("verified", "verified", "Q"),
)
WPR_META = struct.Struct("<" + "".join(f for _, _, f in WPR_META_FIELDS))
assert WPR_META.size == 256  # ct_assert(sizeof(*pWprMeta) == 256) in kernel_gsp_tu102.c


def wpr_meta_offsets() -> dict[str, int]:
    """NVIDIA's name of each field → its byte offset in GspFwWprMeta."""
    out, at = {}, 0
    for _, nvidia, fmt in WPR_META_FIELDS:
        out[nvidia] = at
        at += struct.calcsize("<" + fmt)
    return out


@dataclass
class WprMeta:
    """GspFwWprMeta, field by field (snake_case of NVIDIA's names), every field 0 but the
    magic and revision until set. :meth:`pack` gives its 256 bytes."""

    magic: int = GSP_FW_WPR_META_MAGIC
    revision: int = GSP_FW_WPR_META_REVISION
    sysmem_addr_of_radix3_elf: int = 0
    size_of_radix3_elf: int = 0
    sysmem_addr_of_bootloader: int = 0
    size_of_bootloader: int = 0
    bootloader_code_offset: int = 0
    bootloader_data_offset: int = 0
    bootloader_manifest_offset: int = 0
    sysmem_addr_of_signature: int = 0
    size_of_signature: int = 0
    gsp_fw_rsvd_start: int = 0
    non_wpr_heap_offset: int = 0
    non_wpr_heap_size: int = 0
    gsp_fw_wpr_start: int = 0
    gsp_fw_heap_offset: int = 0
    gsp_fw_heap_size: int = 0
    gsp_fw_offset: int = 0
    boot_bin_offset: int = 0
    frts_offset: int = 0
    frts_size: int = 0
    gsp_fw_wpr_end: int = 0
    fb_size: int = 0
    vga_workspace_offset: int = 0
    vga_workspace_size: int = 0
    boot_count: int = 0
    partition_rpc_addr: int = 0
    partition_rpc_request_offset: int = 0
    partition_rpc_reply_offset: int = 0
    elf_code_offset: int = 0
    sysmem_addr_of_crash_report_queue: int = 0
    size_of_crash_report_queue: int = 0
    ls_ucode_version: int = 0
    gsp_fw_heap_vf_partition_count: int = 0
    flags: int = 0
    pmu_reserved_size: int = 0
    verified: int = 0

    def pack(self) -> bytes:
        """The structure's 256 bytes; raises :class:`rig_edge.Misuse` if a field does not fit."""
        values = [getattr(self, name) for name, _, fmt in WPR_META_FIELDS if fmt != "2x"]
        try:
            return WPR_META.pack(*values)
        except struct.error as e:
            raise Misuse(f"GspFwWprMeta: a field does not fit: {e}") from None

    @classmethod
    def unpack(cls, data: bytes) -> WprMeta:
        """The structure in the first 256 bytes of ``data``."""
        names = [name for name, _, fmt in WPR_META_FIELDS if fmt != "2x"]
        return cls(**dict(zip(names, WPR_META.unpack_from(data), strict=True)))


# ---- the WPR heap ------------------------------------------------------------------------------

# gsp_fw_heap.h
GSP_FW_HEAP_PARAM_SIZE_PER_GB_FB = 96 * KiB
GSP_FW_HEAP_PARAM_CLIENT_ALLOC_SIZE = (48 * KiB) * 2048


@dataclass(frozen=True)
class HeapParams:
    """A family's numbers for the FB layout, each from open-gpu-kernel-modules 570.144 (bare
    metal, not vGPU):

    - ``os_carveout``: kgspGetFwHeapParamOsCarveoutSize, 22 MiB past Turing and GA100
      (GSP_FW_HEAP_PARAM_OS_SIZE_LIBOS3_BAREMETAL);
    - ``base_rm``: fwHeapParamBaseSize, 8 MiB Turing thru Ada, 14 MiB Hopper+;
    - ``min_heap``: kgspGetMinWprHeapSizeMB, 88 MiB (LIBOS3_BAREMETAL_MIN_MB);
    - ``non_wpr_heap``: kgspGetNonWprHeapSize, 1 MiB TU102 thru AD107, 2 MiB GH100
      (kgspGetNonWprHeapSize_d505ea in g_kernel_gsp_nvoc.h), 0x220000 GB20x;
    - ``prescrubbed``: kgspGetPrescrubbedTopFbSize where no scrubber ucode unlocks the rest of
      FB before GSP-RM boots (256 MiB on GA102-GA107), else ``None`` (Ada has the scrubber,
      bScrubberUcodeSupported; Blackwell's FMC scrubs);
    - ``frts``: kgspGetFrtsSize_TU102, NV_PGC6_AON_FRTS_INPUT_WPR_SIZE_..._1MB_IN_4K pages;
    - ``pmu_reserved``: kpmuReservedMemorySizeGet, 0 unless the PMU initializes itself
      (GB20x): 8 MiB backing store + 16 MiB surfaces + 4 KiB, 128 KiB-aligned. GH100's is
      taken as 0: that its PMU initializes itself is not confirmed by the sources
      (docs/hopper-boot.md section 1.3).
    """

    os_carveout: int
    base_rm: int
    min_heap: int
    non_wpr_heap: int
    prescrubbed: int | None
    frts: int
    pmu_reserved: int


HEAP_PARAMS: dict[str, HeapParams] = {
    "ga102": HeapParams(22 * MiB, 8 * MiB, 88 * MiB, 1 * MiB, 256 * MiB, 0x100 * 0x1000, 0),
    "ad102": HeapParams(22 * MiB, 8 * MiB, 88 * MiB, 1 * MiB, None, 0x100 * 0x1000, 0),
    "gh100": HeapParams(22 * MiB, 14 * MiB, 88 * MiB, 2 * MiB, None, 0x100 * 0x1000, 0),
    "gb202": HeapParams(
        22 * MiB, 14 * MiB, 88 * MiB, 0x220000, None, 0x100 * 0x1000,
        align_up(0x800000 + 0x1000000 + 4 * KiB, 128 * KiB),
    ),
}


def _params(family: Family) -> HeapParams:
    try:
        return HEAP_PARAMS[family.name]
    except KeyError:
        raise Misuse(f"no FB layout is known for the family {family.name}") from None


def wpr_heap_size(family: Family, fb_size: int, anterior: int = 0, posterior: int = 0) -> int:
    """The GSP's WPR heap in bytes for a GPU of ``fb_size`` bytes of usable FB
    (_kgspCalculateFwHeapSize): the OS carveout, the RM's base, 96 KiB per GiB of FB (GiB
    rounded up) and 96 MiB for 2048 channels' allocations, each MiB-aligned, at least the
    minimum; on a chip whose heap must lie in the pre-scrubbed top of FB, at most the whole
    MiBs of it that ``anterior`` and ``posterior`` (the bytes reserved below and above the
    heap) leave (kgspGetFwHeapSize_IMPL; both 0 lift that limit), even below the minimum.

    Raises :class:`rig_edge.RigError` if the reserved bytes leave no MiB of the pre-scrubbed
    region, :class:`rig_edge.Misuse` if ``fb_size`` is not positive.
    """
    if fb_size <= 0:
        raise Misuse(f"the FB size must be positive, not {fb_size}")
    p = _params(family)
    fb_gib = align_up(fb_size, GiB) >> 30
    heap = (
        p.os_carveout
        + p.base_rm
        + align_up(GSP_FW_HEAP_PARAM_SIZE_PER_GB_FB * fb_gib, MiB)
        + align_up(GSP_FW_HEAP_PARAM_CLIENT_ALLOC_SIZE, MiB)
    )
    heap = max(heap, p.min_heap)
    if p.prescrubbed is not None and (anterior or posterior):
        room = (p.prescrubbed - (anterior + posterior)) >> 20 << 20
        if room <= 0:
            raise RigError(
                f"the GSP's regions need 0x{anterior + posterior:x} bytes of the pre-scrubbed "
                f"0x{p.prescrubbed:x} at the top of FB, leaving none for its heap"
            )
        heap = min(heap, room)  # below the minimum too, as NVIDIA clamps after it
    return heap


# ---- the FB layout -----------------------------------------------------------------------------

NV_PDISP_VGA_WORKSPACE_BASE = 0x00625F04  # disp/v04_00/dev_disp.h: STATUS 3:3, ADDR 31:8
PRAMIN_SIZE = 1 * MiB  # DRF_SIZE(NV_PRAMIN): 0x7FFFFF:0x700000
VBIOS_WORKSPACE_SIZE = 0x20000
WPR_META_SIZE = align_up(WPR_META.size, MiB)  # wprMetaSize in kgspCalculateFbLayout_TU102


def vga_workspace_offset(fb_size: int, workspace_base: int | None) -> int:
    """Where the VBIOS's VGA workspace starts in FB, as kgspCalculateFbLayout_TU102 finds it.

    ``workspace_base`` is NV_PDISP_VGA_WORKSPACE_BASE as read, or ``None`` for a GPU whose
    fuses support no display. Its address (bits 31:8, in 64 KiB units) counts when its STATUS
    bit says VALID; one below the top MiB of FB is moved to 128 KiB below its end. With no
    valid base the workspace is FB's top MiB.
    """
    if workspace_base is None or not (workspace_base >> 3) & 1:
        return fb_size - PRAMIN_SIZE
    offset = ((workspace_base >> 8) & 0xFFFFFF) << 16
    if offset < fb_size - PRAMIN_SIZE:
        return fb_size - VBIOS_WORKSPACE_SIZE
    return offset


@dataclass(frozen=True)
class FbLayout:
    """Where a boot of Ampere or Ada lays WPR2 and the GSP's heaps in FB, top down (byte
    offsets into FB, each named as GspFwWprMeta names it). From the top: the VGA workspace,
    then from ``gsp_fw_wpr_end`` down FRTS, the boot binary (the bootloader), the GSP's ELF
    (its radix-3 image), the WPR heap and the metadata page(s) from ``gsp_fw_wpr_start``, then
    below WPR2 the non-WPR heap from ``non_wpr_heap_offset`` (= ``gsp_fw_rsvd_start``)."""

    fb_size: int
    vga_workspace_offset: int
    vga_workspace_size: int
    gsp_fw_wpr_end: int
    frts_offset: int
    frts_size: int
    boot_bin_offset: int
    size_of_bootloader: int
    gsp_fw_offset: int
    size_of_radix3_elf: int
    gsp_fw_heap_offset: int
    gsp_fw_heap_size: int
    gsp_fw_wpr_start: int
    non_wpr_heap_offset: int
    non_wpr_heap_size: int
    gsp_fw_rsvd_start: int


def fb_layout(
    family: Family,
    fb_size: int,
    elf_size: int,
    boot_size: int,
    *,
    vga_workspace: int | None = None,
    mmu_lock_low: int | None = None,
) -> FbLayout:
    """kgspCalculateFbLayout_TU102 for an Ampere or Ada GPU of ``fb_size`` bytes of usable FB,
    a GSP image (its radix-3 ELF) of ``elf_size`` bytes and a bootloader of ``boot_size``.

    ``vga_workspace`` is :func:`vga_workspace_offset`'s answer (FB's top MiB by default);
    ``mmu_lock_low`` the low end of a range the VBIOS locked (memmgrReadMmuLock), if any, which
    WPR2 then ends below. With no recovery margin (a first boot): WPR2 ends 128 KiB-aligned
    below the VBIOS's reservation; FRTS (1 MiB) ends there; the bootloader 4 KiB-aligned below
    FRTS; the ELF 64 KiB-aligned below it; the heap (:func:`wpr_heap_size`, limited to the
    pre-scrubbed region with the 1 MiB metadata and non-WPR heap below it and everything from
    the ELF up above it) MiB-aligned below the ELF; WPR2 starts one MiB of metadata below the
    heap; the non-WPR heap lies under WPR2's start.

    Raises :class:`rig_edge.Misuse` for Hopper and Blackwell (their FMC lays WPR2 out:
    :func:`fmc_sizes`)
    or sizes that are not positive, :class:`rig_edge.RigError` if the regions do not fit.
    """
    if family.boot != "booter":
        raise Misuse(f"{family.architecture}'s FMC lays out WPR2 itself: see fmc_sizes")
    if elf_size <= 0 or boot_size <= 0 or fb_size <= 0:
        raise Misuse("the FB, ELF and bootloader sizes must be positive")
    p = _params(family)
    vga = fb_size - PRAMIN_SIZE if vga_workspace is None else vga_workspace
    reserved = vga if mmu_lock_low is None else min(mmu_lock_low, vga)
    wpr_end = align_down(reserved, 0x20000)
    frts_offset = wpr_end - p.frts
    boot_offset = align_down(frts_offset - boot_size, 0x1000)
    elf_offset = align_down(boot_offset - elf_size, 0x10000)
    non_wpr = align_up(p.non_wpr_heap, MiB)
    anterior = WPR_META_SIZE + non_wpr
    posterior = align_up(fb_size - elf_offset, MiB)
    heap = wpr_heap_size(family, fb_size, anterior, posterior)
    heap_offset = align_down(elf_offset - heap, MiB)
    wpr_start = heap_offset - WPR_META_SIZE
    non_wpr_offset = wpr_start - non_wpr
    if non_wpr_offset < 0:
        raise RigError(f"the GSP's regions do not fit in 0x{fb_size:x} bytes of FB")
    return FbLayout(
        fb_size=fb_size,
        vga_workspace_offset=vga,
        vga_workspace_size=fb_size - vga,
        gsp_fw_wpr_end=wpr_end,
        frts_offset=frts_offset,
        frts_size=p.frts,
        boot_bin_offset=boot_offset,
        size_of_bootloader=boot_size,
        gsp_fw_offset=elf_offset,
        size_of_radix3_elf=elf_size,
        gsp_fw_heap_offset=heap_offset,
        gsp_fw_heap_size=align_down(elf_offset - heap_offset, MiB),
        gsp_fw_wpr_start=wpr_start,
        non_wpr_heap_offset=non_wpr_offset,
        non_wpr_heap_size=non_wpr,
        gsp_fw_rsvd_start=non_wpr_offset,
    )


@dataclass(frozen=True)
class FmcSizes:
    """What kgspCalculateFbLayout_GH100 tells Hopper's or Blackwell's FMC, which places the
    regions itself: the sizes to reserve (GspFwWprMeta's fields of these names). Every offset
    of GspFwWprMeta stays 0: "The actual offsets get filled in by ACR ucode when it sets up
    WPR2"."""

    vga_workspace_size: int
    pmu_reserved_size: int
    non_wpr_heap_size: int
    gsp_fw_heap_size: int
    frts_size: int


def fmc_sizes(family: Family, fb_size: int) -> FmcSizes:
    """The sizes a Hopper or Blackwell boot gives its FMC for a GPU of ``fb_size`` bytes of
    usable FB (kgspCalculateFbLayout_GH100, kgspPopulateWprMeta_GH100 in 580):
    a 128 KiB VGA workspace, the PMU's reservation, the non-WPR heap (not MiB-aligned here),
    the WPR heap with no pre-scrubbed limit, and FRTS. Raises :class:`rig_edge.Misuse` for a
    family the host lays out (:func:`fb_layout`)."""
    if family.boot != "fsp":
        raise Misuse(f"{family.architecture}'s WPR2 is laid out by the host: see fb_layout")
    p = _params(family)
    return FmcSizes(
        vga_workspace_size=128 * KiB,
        pmu_reserved_size=p.pmu_reserved,
        non_wpr_heap_size=p.non_wpr_heap,
        gsp_fw_heap_size=wpr_heap_size(family, fb_size),
        frts_size=p.frts,
    )


@dataclass(frozen=True)
class Sysmem:
    """Where the boot's images lie in system memory, and the bootloader's offsets (its
    RM_RISCV_UCODE_DESC's monitorCodeOffset, monitorDataOffset, manifestOffset)."""

    radix3_root: int
    elf_size: int
    bootloader: int
    bootloader_size: int
    code_offset: int
    data_offset: int
    manifest_offset: int
    signature: int = 0
    signature_size: int = 0
    crash_queue: int = 0
    crash_queue_size: int = 0


def wpr_meta(plan: FbLayout | FmcSizes, sysmem: Sysmem) -> WprMeta:
    """GspFwWprMeta for a first boot: the layout (Ampere, Ada) or the sizes for the FMC
    (Hopper, Blackwell), the images in system memory; the clock-boost flag on Ampere and Ada, as
    bBootGspRmWithBoostClocks is there; boot count and verified 0."""
    m = WprMeta(
        sysmem_addr_of_radix3_elf=sysmem.radix3_root,
        size_of_radix3_elf=sysmem.elf_size,
        sysmem_addr_of_bootloader=sysmem.bootloader,
        size_of_bootloader=sysmem.bootloader_size,
        bootloader_code_offset=sysmem.code_offset,
        bootloader_data_offset=sysmem.data_offset,
        bootloader_manifest_offset=sysmem.manifest_offset,
        sysmem_addr_of_signature=sysmem.signature,
        size_of_signature=sysmem.signature_size,
        sysmem_addr_of_crash_report_queue=sysmem.crash_queue,
        size_of_crash_report_queue=sysmem.crash_queue_size,
    )
    if isinstance(plan, FmcSizes):
        return dataclasses.replace(m, **dataclasses.asdict(plan))
    if plan.size_of_radix3_elf != sysmem.elf_size:
        raise Misuse("the layout was computed for another ELF size")
    if plan.size_of_bootloader != sysmem.bootloader_size:
        raise Misuse("the layout was computed for another bootloader size")
    return dataclasses.replace(m, **dataclasses.asdict(plan), flags=GSP_FW_FLAGS_CLOCK_BOOST)
