"""The host memory a GSP boot hands the firmware, built in DMA memory the GPU reaches.

For an Ampere/Ada boot (kgspInitRm in open-gpu-kernel-modules 570.144) :func:`build` lays out.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/boot-gspmem.md."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rig_edge import RigError
from rig_nv_pci.boot.falcon import DmaBuffer
from rig_nv_pci.firmware import layout
from rig_nv_pci.gsp.queue import Layout, QueuePair, write_page_table

PAGE = 0x1000
Alloc = Callable[[int], DmaBuffer | None]

# libos_init_args.h: LibosMemoryRegionInitArgument {LibosAddress id8, pa, size; NvU8 kind, loc},
# 8-aligned: 32 bytes; LibosMemoryRegionKind / LibosMemoryRegionLoc.
LIBOS_REGION = struct.Struct("<QQQBB6x")
LIBOS_MEMORY_REGION_CONTIGUOUS = 1
LIBOS_MEMORY_REGION_RADIX3 = 2
LIBOS_MEMORY_REGION_LOC_SYSMEM = 1
LIBOS_INIT_ARGUMENTS_SIZE = 0x1000  # g_kernel_gsp_nvoc.h

# gsp_init_args.h, 64-bit: MESSAGE_QUEUE_INIT_ARGUMENTS {NvU64 sharedMemPhysAddr; NvU32
# pageTableEntryCount; NvLength cmdQueueOffset, statQueueOffset} (32 bytes, 4 of padding after
# the count); GSP_SR_INIT_ARGUMENTS {NvU32 oldLevel, flags; NvBool bInPMTransition} (12);
# then NvU32 gpuInstance, NvBool bDmemStack, profilerArgs {NvU64 pa, size} 8-aligned: 72 bytes.
GSP_ARGUMENTS_CACHED = struct.Struct("<QI4xQQ" "IIB3x" "I" "B7x" "QQ")
RM_ARGS_SIZE = PAGE  # kgspAllocBootArgs: NV_ASSERT(sizeof(GSP_ARGUMENTS_CACHED) <= 0x1000)

LOG_SIZE = 0x10000  # release build: each log 64 KiB
LOGS = ("LOGINIT", "LOGINTR", "LOGRM", "LOGMNOC", "LOGKRNL")


class GspMemoryError(RigError):
    """The DMA memory for the GSP could not be had or is not laid out as the GSP needs."""


def init_arg_id(name: str) -> int:
    """_kgspGenerateInitArgId: up to 8 characters, the first in the highest byte used."""
    out = 0
    for c in name.encode()[:8]:
        out = out << 8 | c
    return out


@dataclass(frozen=True)
class LibosRegion:
    """One LibosMemoryRegionInitArgument."""

    id8: int
    pa: int
    size: int
    kind: int = LIBOS_MEMORY_REGION_CONTIGUOUS
    loc: int = LIBOS_MEMORY_REGION_LOC_SYSMEM

    def pack(self) -> bytes:
        return LIBOS_REGION.pack(self.id8, self.pa, self.size, self.kind, self.loc)


def unpack_libos_args(data: bytes | memoryview) -> list[LibosRegion]:
    """The regions of a LibOS argument array, up to the first with id8 0."""
    out = []
    for at in range(0, len(data) - LIBOS_REGION.size + 1, LIBOS_REGION.size):
        region = LibosRegion(*LIBOS_REGION.unpack_from(data, at))
        if region.id8 == 0:
            break
        out.append(region)
    return out


@dataclass(frozen=True)
class RmArgs:
    """GSP_ARGUMENTS_CACHED as a plain boot fills it (no power transition, DMEM stack)."""

    shared_mem_phys_addr: int
    page_table_entry_count: int
    cmd_queue_offset: int
    stat_queue_offset: int
    old_level: int = 0
    flags: int = 0
    in_pm_transition: bool = False
    gpu_instance: int = 0
    dmem_stack: bool = True
    profiler_pa: int = 0
    profiler_size: int = 0

    def pack(self) -> bytes:
        return GSP_ARGUMENTS_CACHED.pack(
            self.shared_mem_phys_addr, self.page_table_entry_count, self.cmd_queue_offset,
            self.stat_queue_offset, self.old_level, self.flags, self.in_pm_transition,
            self.gpu_instance, self.dmem_stack, self.profiler_pa, self.profiler_size)

    @classmethod
    def unpack(cls, data: bytes | memoryview) -> RmArgs:
        (shared, count, cmd, stat, old, flags, pm, instance, dmem, ppa,
         psize) = GSP_ARGUMENTS_CACHED.unpack_from(data)
        return cls(shared, count, cmd, stat, old, flags, bool(pm), instance, bool(dmem), ppa,
                   psize)


@dataclass(frozen=True)
class GspMemory:
    """What :func:`build` laid out: ``libos_args`` for the GSP's mailboxes, ``wpr_meta`` for
    booter_load, the queues (created), and every other bus address, for tests and logs.
    ``buffers`` holds the DMA memory, which must stay the GPU's while the GSP runs."""

    libos_args: int
    wpr_meta: int
    meta: layout.WprMeta
    queues: QueuePair
    queue_layout: Layout
    shared: int
    rm_args: int
    logs: dict[str, int]
    radix3: layout.Radix3
    image_pages: tuple[int, ...]
    table_pages: tuple[int, ...]
    buffers: tuple[DmaBuffer, ...]


class _OnTheBus(Protocol):
    def bus_address(self, offset: int) -> int: ...


def in_one_run(buf: _OnTheBus, size: int) -> bool:
    """Whether the first ``size`` bytes of ``buf`` lie in one run of bus addresses. Every
    4 KiB page is asked, not the two ends only: the pages between them may lie anywhere."""
    start = buf.bus_address(0)
    return all(buf.bus_address(at) == start + at for at in range(PAGE, size, PAGE)) and \
        buf.bus_address(size - 1) == start + size - 1


def pages_of(buf: DmaBuffer, n: int) -> list[int]:
    """The bus address of each of the first ``n`` 4 KiB pages of ``buf``."""
    return [buf.bus_address(i * PAGE) for i in range(n)]


class _Builder:
    def __init__(self, alloc: Alloc, name: str) -> None:
        self.alloc, self.name = alloc, name
        self.buffers: list[DmaBuffer] = []

    def get(self, size: int, what: str, *, contiguous: bool = True) -> DmaBuffer:
        size = layout.align_up(max(size, 1), PAGE)
        buf = self.alloc(size)
        if buf is None:
            raise GspMemoryError(f"{self.name}: no DMA memory for the GSP's {what} "
                                 f"(0x{size:x} bytes)")
        self.buffers.append(buf)
        if buf.length < size:
            raise GspMemoryError(f"{self.name}: DMA memory of 0x{buf.length:x} bytes for the "
                                 f"GSP's {what}, not 0x{size:x}")
        if buf.bus_address(0) % PAGE:
            raise GspMemoryError(f"{self.name}: the GSP's {what} at bus address "
                                 f"0x{buf.bus_address(0):x} is not 4 KiB-aligned")
        if contiguous and not in_one_run(buf, size):
            raise GspMemoryError(f"{self.name}: the GSP's {what} (0x{size:x} bytes) is not "
                                 f"contiguous in bus addresses")
        buf.view()[:size] = bytes(size)
        return buf

    def put(self, data: bytes | memoryview, what: str) -> DmaBuffer:
        buf = self.get(len(data), what)
        buf.view()[:len(data)] = data
        return buf


def build(alloc: Alloc, *, image: bytes | memoryview, bootloader: bytes | memoryview,
          code_offset: int, data_offset: int, manifest_offset: int,
          signature: bytes | memoryview, plan: layout.FbLayout | layout.FmcSizes,
          doorbell: Callable[[], None], name: str = "GSP",
          queue_layout: Layout | None = None) -> GspMemory:
    """Lay out everything of the module's docstring in memory from ``alloc``.

    ``image`` is the GSP-RM ELF's ``.fwimage``; ``bootloader`` the bootloader's image with its
    RM_RISCV_UCODE_DESC's monitorCodeOffset, monitorDataOffset and manifestOffset; ``signature``
    the image's ``.fwsignature_<family>``; ``plan`` the FB layout computed for these sizes
    (Ampere, Ada), or for an FSP boot (Hopper, Blackwell) :func:`.layout.fmc_sizes`,
    whose GspFwWprMeta holds sizes only and whose LibOS address travels in
    GSP_FMC_BOOT_PARAMS, not the mailboxes (:mod:`rig_nv_pci.boot.blackwell`);
    ``doorbell`` rings NV_PGSP_QUEUE_HEAD(0). Raises :class:`GspMemoryError` (naming ``name``)
    when memory is missing or not laid out as needed, :class:`rig_edge.Misuse` if ``plan`` was
    computed for other sizes.
    """
    b = _Builder(alloc, name)
    # the image and its radix-3 table (pages anywhere: the table maps them)
    shape = layout.radix3_shape(len(image))
    data = b.get(len(image), "image", contiguous=False)
    data.view()[:len(image)] = image
    tables = b.get(shape.table_pages * PAGE, "radix-3 table", contiguous=False)
    image_pages, table_pages = pages_of(data, shape.data), pages_of(tables, shape.table_pages)
    r3 = layout.radix3(image_pages, table_pages)
    tables.view()[:len(r3.tables)] = r3.tables
    boot_buf = b.put(bootloader, "bootloader")
    sig_buf = b.put(signature, "signature") if len(signature) else None

    # the logs: put pointer, then each page's bus address
    logs: dict[str, int] = {}
    regions: list[LibosRegion] = []
    for log in LOGS:
        buf = b.get(LOG_SIZE, f"{log} log")
        pages = pages_of(buf, LOG_SIZE // PAGE)
        struct.pack_into(f"<{len(pages)}Q", buf.view(), 8, *pages)
        logs[log] = pages[0]
        regions.append(LibosRegion(init_arg_id(log), pages[0], LOG_SIZE))

    # the queues: page table (the block's pages, the table's own first), command queue created
    ql = queue_layout or Layout()
    shared_buf = b.get(ql.size, "message queues", contiguous=False)
    write_page_table(shared_buf.view(), ql, pages_of(shared_buf, ql.page_table_entries))
    queues = QueuePair(shared_buf.view()[:ql.size], ql, doorbell=doorbell, name=name)
    queues.create()
    shared = shared_buf.bus_address(0)

    rm = RmArgs(shared, ql.page_table_entries, ql.command_offset, ql.status_offset)
    rm_buf = b.put(rm.pack().ljust(RM_ARGS_SIZE, b"\0"), "RM arguments")
    regions.append(LibosRegion(init_arg_id("RMARGS"), rm_buf.bus_address(0), RM_ARGS_SIZE))
    libos = b.put(b"".join(r.pack() for r in regions).ljust(LIBOS_INIT_ARGUMENTS_SIZE, b"\0"),
                  "LibOS arguments")

    sysmem = layout.Sysmem(
        radix3_root=r3.root, elf_size=len(image), bootloader=boot_buf.bus_address(0),
        bootloader_size=len(bootloader), code_offset=code_offset, data_offset=data_offset,
        manifest_offset=manifest_offset,
        signature=sig_buf.bus_address(0) if sig_buf else 0, signature_size=len(signature))
    meta = layout.wpr_meta(plan, sysmem)
    meta_buf = b.put(meta.pack(), "GspFwWprMeta")
    return GspMemory(
        libos_args=libos.bus_address(0), wpr_meta=meta_buf.bus_address(0), meta=meta,
        queues=queues, queue_layout=ql, shared=shared, rm_args=rm_buf.bus_address(0),
        logs=logs, radix3=r3, image_pages=tuple(image_pages), table_pages=tuple(table_pages),
        buffers=tuple(b.buffers))
