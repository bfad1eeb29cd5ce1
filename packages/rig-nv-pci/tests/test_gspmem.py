"""rig_nv_pci.boot.gspmem: the GSP's host memory laid out in the simulator's host memory and decoded
back by hand (numbers from libos_init_args.h, gsp_init_args.h and message_queue_cpu.c)."""

from __future__ import annotations

import struct

import pytest
import sim

from rig_nv_pci.boot import gspmem
from rig_nv_pci.firmware import chips, layout
from rig_nv_pci.gsp.queue import Layout

IMAGE = bytes(range(256)) * 48 + b"tail"  # 3 pages and 4 bytes: 4 data pages
BOOTLOADER = b"\xb0" * 0x1800
SIGNATURE = b"\x5e" * 0x1000


def build(plan: layout.FbLayout | None = None) -> tuple[sim.HostMemory, gspmem.GspMemory]:
    host = sim.HostMemory()
    plan = plan or layout.fb_layout(chips.AMPERE, 8 << 30, len(IMAGE), len(BOOTLOADER))
    return host, gspmem.build(host.alloc_dma, image=IMAGE, bootloader=BOOTLOADER,
                              code_offset=0x100, data_offset=0x200, manifest_offset=0x300,
                              signature=SIGNATURE, plan=plan, doorbell=lambda: None,
                              name="GPU 3")


def q(host: sim.HostMemory, address: int, n: int = 1) -> tuple[int, ...]:
    return struct.unpack(f"<{n}Q", host.read(address, 8 * n))


def test_the_radix3_table_maps_every_image_page_in_order() -> None:
    host, m = build()
    assert m.meta.sysmem_addr_of_radix3_elf == m.radix3.root
    assert m.meta.size_of_radix3_elf == len(IMAGE)
    (level1,) = q(host, m.radix3.root)
    (level2,) = q(host, level1)
    pages = q(host, level2, 4)
    assert q(host, level2 + 32) == (0,)  # the rest of level 2's page is zero
    got = b"".join(host.read(p, 0x1000) for p in pages)
    assert got[:len(IMAGE)] == IMAGE and got[len(IMAGE):] == bytes(0x4000 - len(IMAGE))
    assert list(pages) == list(m.image_pages)


def test_the_libos_arguments_name_the_logs_then_rmargs() -> None:
    """570.144's five release-build logs (_kgspInitLibosLoggingStructures: LOGINIT, LOGINTR,
    LOGRM, LOGMNOC, then the family's LOGKRNL; issue 26 item 5), then RMARGS."""
    host, m = build()
    raw = host.read(m.libos_args, 0x1000)
    entries = [struct.unpack_from("<QQQBB", raw, 32 * i) for i in range(7)]
    # "LOGINIT" as _kgspGenerateInitArgId packs it: the first character in the highest byte
    assert [e[0] for e in entries] == [0x4C4F47494E4954, 0x4C4F47494E5452, 0x4C4F47524D,
                                       0x4C4F474D4E4F43, 0x4C4F474B524E4C, 0x524D41524753, 0]
    assert [(e[2], e[3], e[4]) for e in entries[:6]] == [(0x10000, 1, 1)] * 5 + [(0x1000, 1, 1)]
    assert raw[32 * 6:] == bytes(0x1000 - 192)
    logs = ("LOGINIT", "LOGINTR", "LOGRM", "LOGMNOC", "LOGKRNL")
    for (_, pa, _, _, _), log in zip(entries, logs, strict=False):
        assert m.logs[log] == pa
        # put pointer 0, then the bus address of each of the buffer's 16 pages
        assert q(host, pa, 17) == (0, *(pa + 0x1000 * i for i in range(16)))
    assert entries[5][1] == m.rm_args


def test_the_rm_arguments_give_the_queues() -> None:
    host, m = build()
    shared, count, cmd, stat = struct.unpack_from("<QI4xQQ", host.read(m.rm_args, 32))
    # 2 x 256 KiB of queues = 128 pages, plus one page of table: 129 entries
    assert (shared, count, cmd, stat) == (m.shared, 129, 0x1000, 0x1000 + 0x40000)
    old_level, flags, pm, instance, dmem = struct.unpack_from("<IIB3xIB", host.read(m.rm_args, 49),
                                                              32)
    assert (old_level, flags, pm, instance, dmem) == (0, 0, 0, 0, 1)
    assert q(host, shared, 129) == tuple(shared + 0x1000 * i for i in range(129))
    # the command queue is created: msgqTxHeader version 0, size, msgSize, msgCount 63, flags
    version, size, msg_size, msg_count, write, flags, rx, entry = struct.unpack(
        "<8I", host.read(shared + cmd, 32))
    assert (version, size, msg_size, msg_count, write, flags, rx, entry) == (
        0, 0x40000, 0x1000, 63, 0, 1, 0x20, 0x1000)
    assert m.queue_layout == Layout()


def test_the_wpr_meta_holds_the_bus_addresses() -> None:
    host, m = build()
    meta = layout.WprMeta.unpack(host.read(m.wpr_meta, 256))
    assert meta == m.meta and meta.magic == layout.GSP_FW_WPR_META_MAGIC
    assert host.read(meta.sysmem_addr_of_bootloader, len(BOOTLOADER)) == BOOTLOADER
    assert meta.size_of_bootloader == len(BOOTLOADER)
    assert (meta.bootloader_code_offset, meta.bootloader_data_offset,
            meta.bootloader_manifest_offset) == (0x100, 0x200, 0x300)
    assert host.read(meta.sysmem_addr_of_signature, 0x1000) == SIGNATURE
    assert meta.size_of_signature == 0x1000
    plan = layout.fb_layout(chips.AMPERE, 8 << 30, len(IMAGE), len(BOOTLOADER))
    assert meta.frts_offset == plan.frts_offset and meta.gsp_fw_wpr_start == plan.gsp_fw_wpr_start


def test_no_dma_memory_is_an_error_naming_the_gpu() -> None:
    with pytest.raises(gspmem.GspMemoryError,
                       match=r"GPU 3: no DMA memory for the GSP's image \(0x4000 bytes\)"):
        gspmem.build(lambda n: None, image=IMAGE, bootloader=BOOTLOADER, code_offset=0,
                     data_offset=0, manifest_offset=0, signature=b"",
                     plan=layout.fb_layout(chips.AMPERE, 8 << 30, len(IMAGE), len(BOOTLOADER)),
                     doorbell=lambda: None, name="GPU 3")


class Scattered(sim.SimDma):
    """DMA memory whose second page lies elsewhere on the bus."""

    def bus_address(self, offset: int) -> int:
        return self.bus + offset + (0x100000 if offset >= 0x1000 else 0)


def test_memory_that_is_not_contiguous_is_refused_where_the_gsp_needs_it() -> None:
    host = sim.HostMemory()

    def alloc(n: int) -> sim.SimDma:
        buf = host.alloc_dma(n)
        return Scattered(buf.bus, buf.data)

    with pytest.raises(gspmem.GspMemoryError,
                       match=r"GPU 3: the GSP's bootloader \(0x2000 bytes\) is not contiguous"):
        gspmem.build(alloc, image=IMAGE, bootloader=BOOTLOADER, code_offset=0, data_offset=0,
                     manifest_offset=0, signature=b"",
                     plan=layout.fb_layout(chips.AMPERE, 8 << 30, len(IMAGE), len(BOOTLOADER)),
                     doorbell=lambda: None, name="GPU 3")


class MiddlePageElsewhere(sim.SimDma):
    """DMA memory of three pages or more whose second page lies elsewhere on the bus: its two
    ends are where one run would put them."""

    def bus_address(self, offset: int) -> int:
        moved = len(self.data) >= 0x3000 and 0x1000 <= offset < 0x2000
        return self.bus + offset + (0x100000 if moved else 0)


def middle_page_elsewhere(host: sim.HostMemory) -> gspmem.Alloc:
    def alloc(n: int, *, at: int | None = None) -> sim.SimDma:
        buf = host.alloc_dma(n)
        return MiddlePageElsewhere(buf.bus, buf.data)

    return alloc


def test_the_gsps_memory_is_one_run_of_bus_addresses_on_every_page() -> None:
    """The spec: "The GSP's logs and bootloader [...] each lie in one run of bus addresses."
    Issue 20 item 12: only the two ends were checked, so a log whose middle page lay
    elsewhere was handed to the GSP."""
    with pytest.raises(gspmem.GspMemoryError,
                       match=r"GPU 3: the GSP's LOGINIT log \(0x10000 bytes\) is not contiguous"):
        gspmem.build(middle_page_elsewhere(sim.HostMemory()), image=IMAGE,
                     bootloader=BOOTLOADER, code_offset=0, data_offset=0, manifest_offset=0,
                     signature=b"",
                     plan=layout.fb_layout(chips.AMPERE, 8 << 30, len(IMAGE), len(BOOTLOADER)),
                     doorbell=lambda: None, name="GPU 3")


def test_one_run_asks_every_page() -> None:
    """gspmem.in_one_run, the one rule of contiguity (the GSP's memory, the FMC, a channel
    group's method buffer): a page moved anywhere between the ends breaks the run."""
    host = sim.HostMemory()
    buf = host.alloc_dma(0x5000)
    assert gspmem.in_one_run(buf, 0x5000) and gspmem.in_one_run(buf, 0x4321)
    moved = MiddlePageElsewhere(buf.bus, buf.data)
    assert moved.bus_address(0x4FFF) == buf.bus + 0x4FFF  # its ends are in place
    assert not gspmem.in_one_run(moved, 0x5000)
    assert gspmem.in_one_run(moved, 0x1000)  # the first page alone is one run


def test_a_plan_for_another_image_size_is_misuse() -> None:
    from rig_edge import Misuse

    with pytest.raises(Misuse, match="another ELF size"):
        build(plan=layout.fb_layout(chips.AMPERE, 8 << 30, 0x800000, len(BOOTLOADER)))
