"""The simulated GSP-RM's resources and the GPU's memory system behind them: what a process
that booted the GSP reaches through the RM once it makes a device. Video memory is the
client's to keep (FB regions in the static info, ALLOC_MEMORY registrations); the client
writes the page tables (sim/gmmu.py), handed over by COPY_SERVER_RESERVED_PDES, cached in a
TLB until the invalidate register says; channels are made only of the memory a GSP client's
CPU-RM hands over and run on sim/pbdma.py; compute objects need their context buffers
promoted; BAR 1 is sim/bar1.py; a reset ends GSP-RM and all it held.
The notes in full (each format and NVIDIA source): docs/rig-nv-pci-modules/sim-gsp_rm.md.
Written from NVIDIA's interfaces (open-gpu-kernel-modules 570.144), importing nothing of
rig_nv_pci or rig_nv."""

from __future__ import annotations

import mmap
import os
import struct
import threading
import weakref
from typing import TYPE_CHECKING

from . import channel_memory, chid, engines, gmmu, pbdma
from . import retired as retired_pages
from . import runlists as runlist_table
from .bar1 import BAR1_PDB, RESERVED, SimBar1
from .channel_memory import (
    CTRL_CE_METHOD_BUFFER_SIZE,
    CTRL_ENGINE_CONTEXT_PROPERTIES,
    CTRL_PROMOTE_CTX,
    CTX_PROPERTIES,
    GLOBAL_CTX,
    GROUP_CTX,
    METHOD_BUFFER_SIZE,
    RAMIN_PAGE_DIR_BASE,
)
from .gpu import SimGpu, hopper_on
from .gsp_fw import EV_GSP_RUN_CPU_SEQUENCER, sequencer_payload
from .pbdma import COMPUTE_CLASSES, Channel

if TYPE_CHECKING:
    from .gsp_fw import GspFirmware

FN_ALLOC_MEMORY, FN_MAP_MEMORY_DMA, FN_UNMAP_MEMORY_DMA = 4, 14, 15
LOCAL_USER, MEMORY_LIST_SYSTEM, MEMORY_LIST_FBMEM, MEMORY_VIRTUAL = 0x40, 0x81, 0x82, 0x50A0
NV01_DEVICE_0 = 0x80  # cl0080.h
LOCATION_VIDMEM, PHYSICALITY_NONCONTIGUOUS = 2 << 8, 1 << 4  # NVOS02_FLAGS (nvos.h)
BAR2_PDB = RESERVED - 0x2000  # GSP-RM's BAR 2 root (GspStaticConfigInfo.bar2PdeBase), in it
PROTECTED = 512 << 20  # the FB's last bytes, a protected region (WPR2)
GPFIFO_CLASSES = (0xC56F, 0xC86F, 0xC96F, 0xCA6F)
USERMODE_BAR0 = 0xB80000 + 0x30000  # dev_vm.h NV_VIRTUAL_FUNCTION in the PF's VREG view
CTRL_CLASSLIST_V2, CTRL_GR_INFO_V2, CTRL_FB_INFO_V2 = 0x800292, 0x20801228, 0x20801303
CTRL_WORK_SUBMIT_TOKEN = 0xC36F0108
CTRL_COPY_SERVER_RESERVED_PDES = 0x90F10106
VF, VF_MMU_INVALIDATE_PDB, VF_MMU_INVALIDATE_UPPER_PDB, VF_MMU_INVALIDATE = (
    0xB80000, 0x30A0, 0x30A4, 0x30B0)
SERVER_VA, SERVER_VA_SIZE = 1 << 32, 512 << 20
COPY_PDES = struct.Struct("<IIQQQI4x")
COPY_PDES_LEVEL = struct.Struct("<QQIB3x")
GR_INFO_SLOTS, FB_INFO_SLOTS = 0x3A, 0x39
NV_ERR_INVALID_ARGUMENT, NV_ERR_INVALID_OBJECT_HANDLE = 0x1F, 0x33
NV_ERR_INVALID_OFFSET, NV_ERR_NO_MEMORY, NV_ERR_NOT_SUPPORTED = 0x37, 0x51, 0x56
OFFSET_FIXED = 1 << 15
PAGE = 0x1000

# What a GA102 (RTX 3090's chip) reports: AMPERE_USERMODE_A, AMPERE_CHANNEL_GPFIFO_A,
# AMPERE_COMPUTE_B, AMPERE_DMA_COPY_B, and older classes besides.
GA102_CLASSES = (0x0080, 0x2080, 0x90F1, 0xA06C, 0x9067, 0xC461, 0xC561, 0xC46F, 0xC56F,
                 0xC5C0, 0xC6C0, 0xC7C0, 0xC5B5, 0xC6B5, 0xC7B5)
# NV2080_CTRL_GR_INFO_INDEX_*: SHADER_PIPE_SUB_COUNT 0x9 (TPCs), SM_VERSION 0xC (0x806),
# MAX_WARPS_PER_SM 0xD, LITTER_NUM_GPCS 0x14, LITTER_NUM_TPC_PER_GPC 0x17,
# LITTER_NUM_SM_PER_TPC 0x20.
GA102_GR = {0x9: 41, 0xC: 0x806, 0xD: 48, 0x14: 7, 0x17: 6, 0x20: 2}
# NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE 0x9 (KiB), HEAP_FREE 0x16, RAM_SIZE 0x7.
GA102_FB = {0x9: 23 << 20, 0x16: 23 << 20, 0x7: 24 << 20}


class SimRm:
    """Install into a :class:`GspFirmware` with :meth:`install` (before its boot); ``bar`` is
    the BAR view a path is handed. ``refuse``: allocs of these classes answer
    NV_ERR_NO_MEMORY."""

    def __init__(self, gpu: SimGpu, *, fb_size: int = 24 << 30, bar1_size: int = 256 << 20,
                 classes: tuple[int, ...] = GA102_CLASSES, gr: dict[int, int] | None = None,
                 fb: dict[int, int] | None = None,
                 copy_engines: dict[int, tuple[bytes, int]] | None = None,
                 retired: list[int] | None = None,
                 runlists: dict[int, int] | None = None) -> None:
        self.gpu = gpu
        # the device info table's {RM_ENGINE_TYPE: runlist} (sim/runlists.py), the doorbell
        # writes the PBDMA saw, and those it ignored (naming no channel, or GB20x's without
        # _ENABLE)
        self.runlists = dict(runlist_table.DEFAULT if runlists is None else runlists)
        self.doorbells: list[int] = []
        self.ignored_doorbells: list[int] = []
        # the GPU's retired pages (FB addresses; None: no page retirement), sim/retired.py,
        # and the (object, baseIndex) of each pass a client asked
        assert retired is None or len(retired) <= retired_pages.MAX_PAGES
        self.retired = retired
        self.retired_asked: list[tuple[int, int]] = []
        self.copy_engines = engines.GA102_COPY_ENGINES if copy_engines is None else copy_engines
        self.fb_size, self.bar1_size = fb_size, bar1_size
        self.classes, self.gr, self.fb = classes, gr or GA102_GR, fb or GA102_FB
        # a file, so that a BAR 1 window can map its pages again at an address of the
        # process's choosing (place_bar1), as a BAR's mmap does
        self._vram_fd = os.memfd_create("sim-vram", os.MFD_CLOEXEC)
        weakref.finalize(self, os.close, self._vram_fd)
        os.ftruncate(self._vram_fd, fb_size)
        self.vram = mmap.mmap(self._vram_fd, fb_size)
        self.fbmem: dict[int, tuple[int, int]] = {}  # handle -> (FB offset, length)
        gpu.vram = memoryview(self.vram)
        # NV_PMC_BOOT_42 architecture 29:24: GA10x 0x17 and AD10x 0x19 use the version-2 MMU,
        # GB20x 0x1B Hopper's version 3
        arch = gpu.boot42 >> 24 & 0x3F
        self.walks = arch in (0x17, 0x19, 0x1B)
        self.version = 3 if hopper_on(gpu.boot42) else 2
        self.roots: dict[int, int] = {}  # FERMI_VASPACE_A handle -> its PD3 in video memory
        self.tlb: dict[tuple[int, int], gmmu.Translation] = {}  # (PD3, va >> 12) -> page's
        self.invalidates = 0
        # False: an invalidate is acknowledged but flushes nothing (what a TLB keeps without one)
        self.tlb_flushes = True
        gpu.on_write[VF + VF_MMU_INVALIDATE] = self._invalidate
        # BAR 1 as the host and other devices (peer to peer) reach it
        self.bar1 = SimBar1(gpu, self._vram_fd, self.vram, bar1_size, version=self.version,
                            walks=self.walks, registered=self._registered)
        self.sysmem: dict[int, list[int]] = {}  # handle -> page bus addresses
        self.virtual: dict[int, tuple[int, int]] = {}  # handle -> (base, size)
        self.mappings: dict[int, tuple[int, int]] = {}  # GPU address -> (memory handle, size)
        self.channels: dict[int, Channel] = {}
        self.groups: dict[int, int] = {}  # channel group -> its engineType (its runlist)
        self.running: int | None = None  # the instance block of the channel the PBDMA runs
        self.contexts: dict[int, dict[int, tuple[int, int]]] = {}  # group -> id -> (fb, size)
        self.promoted: dict[int, set[int]] = {}  # group -> buffer ids whose VA it was given
        self.global_ctx: dict[int, tuple[int, int]] = {}  # the GPU's buffers, initialized
        self.devices: set[int] = set()  # NV01_DEVICE_0 objects: freeing one forgets global_ctx
        self.usermode = bytearray(0x10000)
        self.log: list[str] = []
        self.refuse: set[int] = set()
        self.faults: list[str] = []
        self.notifiers = True  # a faulted group's error notifiers are written (not with CC)
        self.lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.firmware: GspFirmware | None = None

    def regions(self) -> dict[str, int | bytes]:
        """The static info's FB regions (GspStaticConfigInfo.fbRegionInfoParams): reserved,
        usable, protected."""
        top = self.fb_size - 1
        out: dict[str, int | bytes] = {"fbRegionInfoParams.numFBRegions": 3,
                                       "bar1PdeBase": BAR1_PDB, "bar2PdeBase": BAR2_PDB,
                                       "bPageRetirementSupported": int(self.retired is not None)}
        for i, (base, limit, reserved, protected) in enumerate((
                (0, RESERVED - 1, RESERVED, 0), (RESERVED, top - PROTECTED, 0, 0),
                (top - PROTECTED + 1, top, 0, 1))):
            r = f"fbRegionInfoParams.fbRegion[{i}]."
            out.update({r + "base": base, r + "limit": limit, r + "reserved": reserved,
                        r + "performance": 0xFF, r + "supportCompressed": int(i == 1),
                        r + "supportISO": int(i == 1), r + "bProtected": protected})
        return out

    def usable(self, at: int, n: int) -> bool:
        return at >= RESERVED and at + n <= self.fb_size - PROTECTED

    def install(self, firmware: GspFirmware) -> SimRm:
        """Serve ``firmware``'s peer; its doorbell and this PBDMA's events take turns (the
        PBDMA's thread sends RC_TRIGGERED into the same status queue)."""
        given = firmware.peer_kw.get("static_fields", {})
        firmware.peer_kw.update(self.peer_kw())
        firmware.peer_kw["static_fields"] = {**self.regions(), **given}
        self.firmware = firmware
        firmware.on_boot.append(self._boot)
        firmware.gpu.on_reset.append(self._reset)
        ring = firmware.gpu.on_doorbell

        def doorbell() -> None:
            with self.lock:
                if ring is not None:
                    ring()

        firmware.gpu.on_doorbell = doorbell
        return self

    def _boot(self) -> None:
        """GSP-RM's boot: BAR 1's and BAR 2's roots empty (see the module)."""
        with self.lock:
            for root in (BAR1_PDB, BAR2_PDB):
                self.vram[root:root + PAGE] = bytes(PAGE)
            self.bar1.forget()

    def _reset(self) -> None:
        """A function reset: GSP-RM and all it held gone (see the module); what the tests
        count (``log``, ``faults``, ``invalidates``, ``retired_asked``) stays."""
        with self.lock:
            for records in (self.roots, self.tlb, self.fbmem, self.sysmem, self.virtual,
                            self.mappings, self.channels, self.groups, self.contexts,
                            self.promoted, self.global_ctx, self.devices):
                records.clear()
            self.bar1.forget()
            self.running = None

    def peer_kw(self) -> dict[str, object]:
        return {"functions": {FN_ALLOC_MEMORY: self._alloc_memory,
                              FN_MAP_MEMORY_DMA: self._map_dma,
                              FN_UNMAP_MEMORY_DMA: self._unmap_dma},
                "on_alloc": self._on_alloc, "on_control": self._on_control,
                "on_free": self._on_free}

    # -- the BARs ------------------------------------------------------------------------

    def bar(self, index: int, offset: int, length: int) -> memoryview:
        if index == 0:
            if offset != USERMODE_BAR0 or length > len(self.usermode):
                raise AssertionError(f"BAR 0 view 0x{offset:x}+0x{length:x} is not usermode")
            return memoryview(self.usermode)[:length]
        if index != 1:
            raise AssertionError(f"BAR {index} view 0x{offset:x}+0x{length:x} out of range")
        return self.bar1.view(offset, length)

    def _registered(self, fb: int, n: int) -> bool:
        """Whether ``[fb, fb+n)`` lies in video memory registered with ALLOC_MEMORY."""
        return any(at <= fb and fb + n <= at + size for at, size in self.fbmem.values())

    # -- the RM --------------------------------------------------------------------------

    def _on_alloc(self, parent: int, handle: int, cls: int, params: bytes) -> tuple[int, bytes]:
        if cls in self.refuse:
            return NV_ERR_NO_MEMORY, params
        if cls == LOCAL_USER:
            return NV_ERR_NOT_SUPPORTED, params  # a GSP client keeps its own heap
        if cls == MEMORY_VIRTUAL:
            size, _, offset = struct.unpack_from("<QQQ", params, 64)
            self.virtual[handle] = (offset, size)
        if cls == chid.KEPLER_CHANNEL_GROUP_A:
            self.groups[handle] = chid.group_engine(params)
        if cls == NV01_DEVICE_0:
            self.devices.add(handle)
        if cls in GPFIFO_CLASSES:
            return channel_memory.alloc_channel(self, parent, handle, params), params
        if cls in COMPUTE_CLASSES and parent in self.channels and self.walks:
            group = self.channels[parent].group
            if set(GROUP_CTX + GLOBAL_CTX) - self.promoted.get(group, set()):
                return chid.NV_ERR_INVALID_STATE, params  # no context buffers promoted
        return 0, params

    def _on_control(self, obj: int, cmd: int, params: bytes) -> tuple[int, bytes] | None:
        if cmd == CTRL_CLASSLIST_V2:
            listed = list(self.classes)[:100]
            return 0, struct.pack(f"<I{len(listed)}I", len(listed), *listed).ljust(404, b"\0")
        if cmd in (CTRL_GR_INFO_V2, CTRL_FB_INFO_V2):
            table = self.gr if cmd == CTRL_GR_INFO_V2 else self.fb
            out = bytearray(params)
            (n,) = struct.unpack_from("<I", out)
            if n > (GR_INFO_SLOTS if cmd == CTRL_GR_INFO_V2 else FB_INFO_SLOTS):
                return NV_ERR_INVALID_ARGUMENT, params
            for i in range(n):
                (index,) = struct.unpack_from("<I", out, 4 + 8 * i)
                if index not in table:
                    return NV_ERR_INVALID_ARGUMENT, params
                struct.pack_into("<I", out, 8 + 8 * i, table[index])
            return 0, bytes(out)
        if cmd == CTRL_COPY_SERVER_RESERVED_PDES:
            return self._copy_pdes(obj, params), params
        if cmd == CTRL_ENGINE_CONTEXT_PROPERTIES:
            (engine,) = struct.unpack_from("<I", params)
            if engine not in CTX_PROPERTIES:
                return NV_ERR_INVALID_ARGUMENT, params
            return 0, struct.pack("<III", engine, *CTX_PROPERTIES[engine])
        if cmd == CTRL_PROMOTE_CTX:
            return channel_memory.promote(self, params), params
        if cmd == runlist_table.CTRL_GET_DEVICE_INFO_TABLE:
            return runlist_table.answer(params, self.runlists)
        if cmd == CTRL_CE_METHOD_BUFFER_SIZE:
            return 0, struct.pack("<I", METHOD_BUFFER_SIZE)
        if cmd == retired_pages.CTRL_GET_DYNAMIC_OFFLINED_PAGES:
            self.retired_asked.append((obj, int.from_bytes(
                params[retired_pages.BASE_INDEX_AT:retired_pages.BASE_INDEX_AT + 4], "little")))
            return retired_pages.answer(params, self.retired)
        if cmd == CTRL_WORK_SUBMIT_TOKEN:
            channel = self.channels.get(obj)
            if channel is None:
                return NV_ERR_INVALID_OBJECT_HANDLE, params
            return 0, struct.pack("<I", channel.chid)
        return engines.answer(cmd, params, self.copy_engines)

    def _copy_pdes(self, vaspace: int, params: bytes) -> int:
        """The client's PD3/PD2/PD1 over the server's range, checked and mirrored."""
        if not self.walks:
            return NV_ERR_NOT_SUPPORTED
        if len(params) < COPY_PDES.size + 6 * COPY_PDES_LEVEL.size:
            return NV_ERR_INVALID_ARGUMENT
        _, _, page_size, lo, hi, count = COPY_PDES.unpack_from(params)
        levels = [COPY_PDES_LEVEL.unpack_from(params, COPY_PDES.size + i * COPY_PDES_LEVEL.size)
                  for i in range(count)]
        shifts = (47, 38, 29) if self.version == 2 else (56, 47, 38, 29)
        entries = (4, 512, 512) if self.version == 2 else (2, 512, 512, 512)
        if (page_size, lo, hi, count) != (1 << 29, SERVER_VA, SERVER_VA + SERVER_VA_SIZE - 1,
                                          len(shifts)):
            return NV_ERR_INVALID_ARGUMENT
        for i, (address, size, aperture, shift) in enumerate(levels):
            if (aperture, shift) != (1, shifts[i]) or address % PAGE or not size:
                return NV_ERR_INVALID_ARGUMENT
            if not self.usable(address, size) or any(
                    a < address + size and address < a + n for a, n in self.fbmem.values()):
                return NV_ERR_INVALID_ARGUMENT
            if i:  # the level above names this one for the server's range
                above, upper = levels[i - 1][0], shifts[i - 1]
                entry = self.read64(above + 8 * (lo >> upper & entries[i - 1] - 1))
                named = (entry >> 8 & 0x1FFFFFF if self.version == 2 else
                         entry >> 12 & (1 << 40) - 1) << 12
                if entry >> 1 & 3 != 1 or named != address:
                    return NV_ERR_INVALID_ARGUMENT
        with self.lock:
            self.roots[vaspace] = levels[0][0]
        return 0

    def read64(self, fb: int) -> int:
        return int.from_bytes(self.vram[fb:fb + 8], "little")

    def translate(self, va: int) -> gmmu.Translation:
        """``va`` through the TLB, else the page tables, of the latest address space handed
        over."""
        if self.running is not None:  # the running channel's, from its instance block
            lo, hi = struct.unpack_from("<II", self.vram, self.running + RAMIN_PAGE_DIR_BASE)
            root = (lo & 0xFFFFF000) | (hi & 0xFF) << 32
        elif not self.roots:
            raise gmmu.MmuFault(f"0x{va:x}: no page tables handed over", va,
                                gmmu.FAULT_UNBOUND_INST_BLOCK)
        else:
            root = list(self.roots.values())[-1]
        key = (root, va >> 12)
        with self.lock:
            page = self.tlb.get(key)
            if page is None:
                page = gmmu.translate(self.read64, root, va & ~0xFFF, self.version)
                self.tlb[key] = page
        return page._replace(address=page.address + va % PAGE)

    def _invalidate(self, value: int) -> None:
        if not value >> 31:
            return
        if not value & 1:
            raise AssertionError(f"MMU invalidate 0x{value:x}: only ALL_VA is simulated")
        regs = self.gpu.regs
        pdb = ((regs.get(VF + VF_MMU_INVALIDATE_UPPER_PDB, 0) & 0xFFFFF) << 28
               | regs.get(VF + VF_MMU_INVALIDATE_PDB, 0) >> 4) << 12
        with self.lock:
            for key in [k for k in self.tlb if self.tlb_flushes and (value & 2 or k[0] == pdb)]:
                del self.tlb[key]
            self.invalidates += 1
            if value & 2 or pdb == BAR1_PDB:
                self.bar1.forget()
        regs[VF + VF_MMU_INVALIDATE] = value & ~(1 << 31)  # done

    def _on_free(self, handle: int) -> None:
        with self.lock:
            self.roots.pop(handle, None)
            self.fbmem.pop(handle, None)
            self.sysmem.pop(handle, None)
            self.virtual.pop(handle, None)
            self.channels.pop(handle, None)
            self.groups.pop(handle, None)
            self.contexts.pop(handle, None)
            self.promoted.pop(handle, None)
            if handle in self.devices:  # the client gives the GPU's buffers back with it
                self.devices.discard(handle)
                self.global_ctx.clear()
            for va in [va for va, (h, _) in self.mappings.items() if h == handle]:
                del self.mappings[va]

    def _alloc_memory(self, p: bytes) -> tuple[bytes, int]:
        _, device, handle, cls, flags, _, _, length, count, desc = struct.unpack_from(
            "<7I4xQI4xI", p)
        pages = list(struct.unpack_from(f"<{count}Q", p, 56))
        assert self.firmware is not None
        objects = self.firmware.peer.objects
        if device not in objects or handle in objects:
            return p, NV_ERR_INVALID_OBJECT_HANDLE
        if desc >> 16 != count or not count:
            return p, NV_ERR_INVALID_ARGUMENT
        if cls == MEMORY_LIST_FBMEM:
            at = pages[0] * PAGE
            overlaps = any(a < at + length and at < a + n for a, n in self.fbmem.values())
            if (flags & 0xF00 != LOCATION_VIDMEM or flags & 0xF0 or count != 1
                    or not self.usable(at, length) or overlaps or length % PAGE):
                return p, NV_ERR_INVALID_ARGUMENT
            self.fbmem[handle] = (at, length)
            objects[handle] = device
            return p, 0
        if cls != MEMORY_LIST_SYSTEM or count * PAGE < length:
            return p, NV_ERR_INVALID_ARGUMENT
        if any(self.gpu.host.view(pfn * PAGE, PAGE) is None for pfn in pages):
            return p, NV_ERR_INVALID_ARGUMENT
        self.sysmem[handle] = [pfn * PAGE for pfn in pages]
        objects[handle] = device  # an RM object like any other: FREE removes it
        return p, 0

    def _owner_ok(self, memory: int) -> bool:
        return memory in self.fbmem or memory in self.sysmem

    def _map_dma(self, p: bytes) -> tuple[bytes, int]:
        _, _, dma, memory, offset, length, flags, va, _ = struct.unpack_from("<4IQQI4xQI", p)
        status = 0
        if self.walks:  # a GSP client writes its page tables itself
            status = NV_ERR_NOT_SUPPORTED
        elif dma not in self.virtual or not self._owner_ok(memory):
            status = NV_ERR_INVALID_OBJECT_HANDLE
        elif offset or not flags & OFFSET_FIXED:
            status = NV_ERR_INVALID_ARGUMENT  # the simulated RM maps whole objects where told
        else:
            base, size = self.virtual[dma]
            overlaps = any(v < va + length and va < v + n for v, (_, n) in self.mappings.items())
            if not (base <= va and va + length <= base + size) or overlaps or va % PAGE:
                status = NV_ERR_INVALID_OFFSET
        if status == 0:
            with self.lock:
                self.mappings[va] = (memory, length)
        out = bytearray(p)
        struct.pack_into("<I", out, 48, status)
        return bytes(out), status

    def _unmap_dma(self, p: bytes) -> tuple[bytes, int]:
        _, _, _, memory, _, va, _ = struct.unpack_from("<5I4xQI", p)
        status = 0 if self.mappings.get(va, (None, 0))[0] == memory else NV_ERR_INVALID_OFFSET
        if status == 0:
            with self.lock:
                del self.mappings[va]
        out = bytearray(p)
        struct.pack_into("<I", out, 32, status)
        return bytes(out), status

    # -- GPU memory ----------------------------------------------------------------------

    def _span(self, va: int, n: int) -> memoryview:
        """The bytes at GPU address ``va`` (within one mapping, one page for system memory)."""
        if self.walks:
            where = self.translate(va)
            if where.address % where.page + n > where.page:
                raise LookupError(f"GPU address 0x{va:x} (+{n}) crosses a page")
            if where.video:
                if where.address + n > self.fb_size:
                    raise LookupError(f"GPU address 0x{va:x} maps beyond video memory")
                return memoryview(self.vram)[where.address:where.address + n]
            # system memory, or a peer's BAR: nothing while Bus Master Enable is clear
            host = self.gpu.dma(where.address, n, f"an engine's access at GPU 0x{va:x}")
            if host is None and not self.gpu.bus_master():
                raise LookupError(f"GPU address 0x{va:x}: no memory request (Bus Master "
                                  "Enable clear)")
            if host is None:
                raise LookupError(f"GPU address 0x{va:x} maps bus 0x{where.address:x}, no "
                                  "host memory nor a BAR")
            return host
        for at, (handle, size) in self.mappings.items():
            if at <= va and va + n <= at + size:
                if handle in self.fbmem:
                    fb, _ = self.fbmem[handle]
                    return memoryview(self.vram)[fb + va - at:fb + va - at + n]
                page = (va - at) // PAGE
                inside = (va - at) % PAGE
                if inside + n > PAGE:
                    break
                view = self.gpu.dma(self.sysmem[handle][page] + inside, n,
                                    f"an engine's access at GPU 0x{va:x}")
                if view is None:
                    raise LookupError(f"GPU address 0x{va:x}: no memory request (Bus Master "
                                      "Enable clear)")
                return view
        raise LookupError(f"GPU address 0x{va:x} (+{n}) is not mapped")

    def read(self, va: int, n: int) -> bytes:
        out = b""
        while n:
            chunk = min(n, PAGE - va % PAGE)
            out += bytes(self._span(va, chunk))
            va, n = va + chunk, n - chunk
        return out

    def write(self, va: int, data: bytes) -> None:
        while data:
            chunk = min(len(data), PAGE - va % PAGE)
            self._span(va, chunk)[:] = data[:chunk]
            va, data = va + chunk, data[chunk:]

    # -- the PBDMA -----------------------------------------------------------------------

    def step(self) -> int:
        """Run every channel as far as it goes; how many methods ran (sim/pbdma.py)."""
        return pbdma.step(self)

    def event(self, fn: int, payload: bytes = b"") -> None:
        """Send GSP event ``fn`` now, between the PBDMA's steps (as a test's GSP-RM would)."""
        assert self.firmware is not None and self.firmware.peer is not None
        with self.lock:
            self.firmware.peer.event(fn, payload)

    def run_cpu_sequencer(self, commands: list[tuple[int, ...]] | bytes,
                          size_dwords: int = 64) -> None:
        """Ask the CPU, now, to run a sequence of register operations: GSP_RUN_CPU_SEQUENCER
        (0x1002) with an rpc_run_cpu_sequencer_v17_00 holding ``commands`` (each an rmgspseq.h
        opcode and its arguments; a payload as it is when bytes), as GSP-RM sends them after
        its boot around power and reset flows (CPU-RM runs them wherever it drains the status
        queue, kernel_gsp.c _kgspProcessRpcEvent). What the CPU did shows in BAR 0's
        ``gpu.writes``."""
        payload = (commands if isinstance(commands, bytes)
                   else sequencer_payload(commands, size_dwords))
        self.event(EV_GSP_RUN_CPU_SEQUENCER, payload)

    def chid(self, handle: int) -> int:
        """The ChID of channel ``handle`` (while it runs)."""
        return self.channels[handle].chid

    def start(self, period_s: float = 50e-6) -> SimRm:
        """Run the PBDMA in a thread until :meth:`stop`."""
        def loop() -> None:
            while not self._stop.wait(period_s):
                self.step()

        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="sim PBDMA", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
