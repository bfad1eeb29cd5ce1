"""The simulated GSP-RM's resources and the GPU's memory system behind them: what a process
that booted the GSP reaches through the RM once it makes a device.

Written from NVIDIA's interfaces (open-gpu-kernel-modules 570.144), importing nothing of
rig_nv_pci or rig_nv:

- video memory is the client's to keep, as for NVIDIA's GSP client (its CPU-RM's heap): the
  static info (GET_GSP_STATIC_INFO) reports FB regions (:data:`RESERVED` at the FB's start,
  reserved; the rest usable up to :data:`PROTECTED` at its end, protected), and a GSP_RM_ALLOC
  of NV01_MEMORY_LOCAL_USER (0x40) answers NV_ERR_NOT_SUPPORTED: the simulated GSP-RM keeps no
  heap for the client (the vGPU guest's model, which it no longer serves);
  NV50_MEMORY_VIRTUAL (0x50a0, NV_MEMORY_ALLOCATION_PARAMS of nvos.h: size u64 at 64, offset
  at 80) reserves a GPU range of the params' size at their offset;
- ALLOC_MEMORY (4, rpc_alloc_memory_v13_01, g_rpc-structures.h: hClient, hDevice, hMemory,
  hClass, flags, pteAdjust, format, length u64 at 32, pageCount at 40, pte_desc at 48 whose
  pte_pde[] of page addresses >> 12 starts at 56) of NV01_MEMORY_LIST_SYSTEM (cl84a0.h 0x81)
  registers system memory, as mem.c memRegisterWithGsp_IMPL does for a GSP client; of
  NV01_MEMORY_LIST_FBMEM (0x82) it registers the client's video memory: NVOS02 flags LOCATION
  11:8 VIDMEM (2) and PHYSICALITY 7:4 CONTIGUOUS (0), one page address (the first page, as
  rpcAllocMemory_v13_01 sends a contiguous memdesc's one PTE), lying in a usable region and
  overlapping no other registered video memory;
- the client writes the GPU's page tables, as NVIDIA's CPU-RM does for a GSP client (Ampere
  and Ada in the version-2 format, Blackwell in Hopper's version 3: sim/gmmu.py):
  NV90F1_CTRL_CMD_VASPACE_COPY_SERVER_RESERVED_PDES (0x90f10106, ctrl90f1.h:
  hSubDevice, subDeviceId, pageSize u64 at 8, virtAddrLo 16, virtAddrHi 24, numLevelsToCopy
  32, levels[6] of {physAddress u64, size u64, aperture u32, pageShift u8} from 40) on the
  FERMI_VASPACE_A hands over the directories down to PD1 (PD3, PD2, PD1; in version 3 PD4
  first) over the server's range (4 GiB,
  512 MiB: SPLIT_VAS_SERVER_RM_MANAGED_VA_START/SIZE, g_gpu_vaspace_nvoc.h; pageSize 2^29 as
  _gvaspacePopulatePDEentries sends; GMMU_APERTURE_VIDEO 1; each level's PDE naming the
  next), and from then on the PBDMA and copy engine translate GPU addresses by walking the
  tables from that root in video memory (sim/gmmu.py); MAP_MEMORY_DMA answers
  NV_ERR_NOT_SUPPORTED. Translations are kept in a TLB (per root and 4 KiB page) until
  the client invalidates them: NV_VIRTUAL_FUNCTION_PRIV_MMU_INVALIDATE (BAR 0 0xB80000 +
  0x30B0, turing/tu102/dev_vm.h: ALL_VA 0:0, ALL_PDB 1:1, TRIGGER 31:31, read back clear once
  done) for the root named by _INVALIDATE_PDB (0x30A0, ADDR 31:4 of the address >> 12) and
  _INVALIDATE_UPPER_PDB (0x30A4, ADDR 19:0 above it), or for all with ALL_PDB; an invalidate
  without ALL_VA is not simulated (an AssertionError);
- for a GPU whose MMU is not simulated (``walks`` False: a test's) MAP_MEMORY_DMA (14) /
  UNMAP_MEMORY_DMA (15) with NVOS46_PARAMETERS_v03_00 (hClient, hDevice,
  hDma, hMemory, offset u64 at 16, length at 24, flags at 32, dmaOffset at 40, status at 48)
  and NVOS47_PARAMETERS_v03_00 (flags at 16, dmaOffset at 24, status at 32) map a memory
  object into the GPU's addresses; flags bit 15 (NVOS46_FLAGS_DMA_OFFSET_FIXED) keeps
  dmaOffset, which must lie in the hDma virtual object's range;
- controls: NV0080_CTRL_CMD_GPU_GET_CLASSLIST_V2 (0x800292, numClasses then 100 class
  numbers), NV2080_CTRL_CMD_GR_GET_INFO_V2 (0x20801228) and NV2080_CTRL_CMD_FB_GET_INFO_V2
  (0x20801303) (a count, then {index, data} pairs answered from the tables given),
  NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN (0xc36f0108, the channel's ChID), the
  engine and copy engine queries from ``copy_engines`` (sim/engines.py), and the retired
  pages ``retired`` lists (NV2080_CTRL_CMD_FB_GET_DYNAMIC_OFFLINED_PAGES, sim/retired.py;
  the static info's bPageRetirementSupported is set when a list is given), on any object,
  GSP-RM's internal subdevice included (tests/sim/gsp_peer.py lets a control name it);
- a channel (the GPFIFO classes) is made from NV_CHANNEL_ALLOC_PARAMS (alloc_channel.h:
  gpFifoOffset u64 at 8, gpFifoEntries at 16, hUserdMemory[8] at 32, userdOffset[8] u64 at
  64, the NV_MEMORY_DESC_PARAMS of :data:`CH_INSTANCE` ...) only with the memory a GSP
  client's CPU-RM hands over (kernel_channel.c _kchannelSendChannelAllocRpc), else
  NV_ERR_INVALID_ARGUMENT: hObjectBuffer 0; instanceMem 4 KiB of FBMEM (ADDR_FBMEM 2), 4 KiB
  aligned, zeroed, in a usable FB region and overlapping no registered memory nor another
  channel's instance block; ramfcMem its first 512 bytes; userdMem 512 bytes of FBMEM where
  hUserdMemory[0] + userdOffset[0] lies; mthdbufMem system memory (ADDR_SYSMEM 1) of the size
  NV2080_CTRL_CMD_CE_GET_FAULT_METHOD_BUFFER_SIZE (0x20802a08) answers
  (:data:`METHOD_BUFFER_SIZE`); errorNotifierMem the first page of hObjectError's system
  memory; the ChID its flags name, free on its runlist (sim/chid.py). It writes the root
  into the instance block (gm107 dev_ram.h NV_RAMIN_PAGE_DIR_BASE_LO 128*32+31:12, _HI
  129*32+7:0) and the PBDMA translates the channel's addresses through the root it reads back
  from there; the error notifier it writes is the errorNotifierMem given;
  its channels run on the simulated PBDMA and copy engine (sim/pbdma.py: :meth:`SimRm.step`,
  or a thread :meth:`SimRm.start` runs);
- a compute object on a channel answers NV_ERR_INVALID_STATE until the channel's group has its
  context buffers promoted (NV2080_CTRL_CMD_GPU_PROMOTE_CTX, :meth:`SimRm._promote`, sizes
  from :data:`CTX_PROPERTIES`); the GPU's global buffers, once initialized, must be promoted
  at the same place again until the device (NV01_DEVICE_0) is freed, with which a GSP client
  gives them back (the simulator's choice: when the real GSP-RM forgets them is not in the
  open sources);
- a channel that faults stops, its group's error notifiers written and RC_TRIGGERED (then,
  for an MMU fault, MMU_FAULT_QUEUED) sent, as sim/pbdma.py says;
- the usermode page (BAR 0 from 0xBB0000: NV_VIRTUAL_FUNCTION 0x30000 in the PF's view of
  the virtual registers at 0xB80000, turing/tu102/dev_vm.h) is memory the process
  writes its doorbell into; BAR 1 shows video memory as the page tables under GSP-RM's BAR 1
  root (the static info's bar1PdeBase, :data:`BAR1_PDB`, in the reserved region) map it, as
  a GSP client's CPU-RM writes them (kbusPatchBar1Pdb_GSPCLIENT): a BAR 1 view must be mapped
  there, contiguously, to registered video memory (with ``walks`` False, one to one); a BAR
  1 range can also be mapped at an address the process chose (:meth:`SimRm.place_bar1`, as
  rig_pci maps a BAR's file with MAP_FIXED), sharing the video memory's pages. Video memory
  is a memfd of the FB's size, mapped shared (pages the tests never touch cost nothing);
- peer to peer: the GPU's BAR 1 answers other devices' requests on the machine's bus (the
  GPU's HostMemory, which GPUs of one simulated machine share: sim/gpu.py) at its bus address
  (``gpu.bar1_address``, ``bar1_size`` bytes), each 4 KiB page through those BAR 1 tables as
  the host's views are, kept in a BAR 1 TLB until the client invalidates BAR 1's root; a page
  they do not map to video memory is a LookupError for the requester (its channel faults as
  for an address nothing maps). A copy engine or PBDMA access whose PTE names system memory
  (aperture 2 or 3) goes to that bus: host memory, else another GPU's BAR 1, so a GPU that
  maps a peer's BAR 1 bus addresses reads and writes the peer's video memory.
- each boot of GSP-RM builds BAR 1's and BAR 2's address spaces anew (kern_bus_gm107.c
  kbusInitBar1_GM107 creates BAR 1's, VASPACE_FLAGS_BAR_BAR1, which gpu_vaspace.c
  gvaspaceConstruct_IMPL sparsifies whole: nothing mapped): the boot empties the pages at
  :data:`BAR1_PDB` and :data:`BAR2_PDB` (video memory, which outlives a reset) and the
  BAR 1 TLB; a function reset (sim/gpu.py SimGpu.reset) ends GSP-RM: its objects, channels,
  contexts and registrations, the PBDMA's work and the MMU's state are gone;
- after its boot GSP-RM may ask the CPU to run a sequence of register operations
  (GSP_RUN_CPU_SEQUENCER 0x1002, as at boot: :meth:`SimRm.run_cpu_sequencer` sends one when a
  test says), which the CPU runs against BAR 0, whose every write the simulated GPU records.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import weakref
from typing import TYPE_CHECKING

from rig_pci import libc

from . import chid, engines, gmmu, pbdma
from . import retired as retired_pages
from . import runlists as runlist_table
from .gpu import SimGpu, hopper_on
from .gsp_fw import EV_GSP_RUN_CPU_SEQUENCER, sequencer_payload
from .pbdma import COMPUTE_CLASSES, USERD_SIZE, Channel

if TYPE_CHECKING:
    from .gsp_fw import GspFirmware

FN_ALLOC_MEMORY, FN_MAP_MEMORY_DMA, FN_UNMAP_MEMORY_DMA = 4, 14, 15
LOCAL_USER, MEMORY_LIST_SYSTEM, MEMORY_LIST_FBMEM, MEMORY_VIRTUAL = 0x40, 0x81, 0x82, 0x50A0
NV01_DEVICE_0 = 0x80  # cl0080.h
LOCATION_VIDMEM, PHYSICALITY_NONCONTIGUOUS = 2 << 8, 1 << 4  # NVOS02_FLAGS (nvos.h)
RESERVED = 2 << 20  # the FB's first bytes, a reserved region (GSP-RM's own)
BAR1_PDB = RESERVED - 0x1000  # GSP-RM's BAR 1 root, in it
BAR2_PDB = RESERVED - 0x2000  # GSP-RM's BAR 2 root (GspStaticConfigInfo.bar2PdeBase), in it
# kern_bus_gm107.c kbusInitBar1_GM107: "Reduce BAR1 VA space by FERMI_SMALL_PAGESIZE for host
# overfetch bug WAR (Bug 529932/525381)"; FERMI_SMALL_PAGESIZE (fermi_dma.h) is RM_PAGE_SIZE,
# 4 KiB: no BAR 1 mapping lies in the BAR's last 4 KiB
BAR1_OVERFETCH_PAD = 0x1000
PROTECTED = 512 << 20  # the FB's last bytes, a protected region (WPR2)
GPFIFO_CLASSES = (0xC56F, 0xC86F, 0xC96F, 0xCA6F)
USERMODE_BAR0 = 0xB80000 + 0x30000  # dev_vm.h NV_VIRTUAL_FUNCTION in the PF's VREG view
CTRL_CLASSLIST_V2, CTRL_GR_INFO_V2, CTRL_FB_INFO_V2 = 0x800292, 0x20801228, 0x20801303
CTRL_WORK_SUBMIT_TOKEN = 0xC36F0108
# NV2080_CTRL_CMD_CE_GET_FAULT_METHOD_BUFFER_SIZE (ctrl2080ce.h): {NvU32 size}; the size the
# simulated GSP-RM answers is its own (the real one is GSP-RM's, not in the open sources)
CTRL_CE_METHOD_BUFFER_SIZE, METHOD_BUFFER_SIZE = 0x20802A08, 0x3000
# NV_CHANNEL_ALLOC_PARAMS (alloc_channel.h), worked by hand: hObjectError 0, hObjectBuffer 4,
# gpFifoOffset 8, gpFifoEntries 16, flags 20, hContextShare 24, hVASpace 28,
# hUserdMemory[8] 32, userdOffset[8] 64, engineType 128, cid 132, subDeviceId 136,
# hObjectEccError 140, then NV_MEMORY_DESC_PARAMS {base u64, size u64, addressSpace u32,
# cacheAttrib u32} instanceMem 144, userdMem 168, ramfcMem 192, mthdbufMem 216,
# hPhysChannelGroup 240, internalFlags 244, errorNotifierMem 248, eccErrorNotifierMem 272,
# ProcessID 296, SubProcessID 300, encryptIv[3] 304, decryptIv[3] 316, hmacNonce[8] 328,
# tpcConfigID 360: 368 bytes with the 8-byte alignment
MEM_DESC = struct.Struct("<QQII")
CH_INSTANCE, CH_USERD, CH_RAMFC, CH_MTHDBUF, CH_ERROR_NOTIFIER = 144, 168, 192, 216, 248
CHANNEL_PARAMS_SIZE = 368
ADDR_SYSMEM, ADDR_FBMEM = 1, 2  # NV_ADDRESS_SPACE (mem_desc.h)
# dev_ram.h: NV_RAMIN_ALLOC_SIZE 4096 (aligned to 1 << NV_RAMIN_BASE_SHIFT 12), NV_RAMIN_RAMFC
# its first 128 words, NV_RAMIN_PAGE_DIR_BASE_LO (128*32+31:12); USERD's size is the PBDMA's
INSTANCE_SIZE, RAMFC_SIZE, RAMIN_PAGE_DIR_BASE = 0x1000, 0x200, 128 * 4
# NV0080_CTRL_CMD_FIFO_GET_ENGINE_CONTEXT_PROPERTIES (ctrl0080fifo.h: {engineId, alignment,
# size}): the simulated sizes of ENGINE_ID_GRAPHICS 0x0, _PATCH 0x10, _FECS_EVENT 0x17,
# _PRIV_ACCESS_MAP 0x18 (the real ones are GSP-RM's)
CTRL_ENGINE_CONTEXT_PROPERTIES = 0x801707
CTX_PROPERTIES = {0x0: (0x1000, 0x48000), 0x10: (0x1000, 0x10000), 0x17: (0x1000, 0x4000),
                  0x18: (0x1000, 0x2000)}
# NV2080_CTRL_CMD_GPU_PROMOTE_CTX (ctrl2080gpu.h): engineType, hClient, ChID, hChanClient,
# hObject, hVirtMemory, virtAddress u64 at 24, size u64 at 32, entryCount at 40, then from 48
# 16 entries {gpuPhysAddr u64, gpuVirtAddr u64, size u64, physAttr u32, bufferId u16,
# bInitialize u8, bNonmapped u8}; buffer ids MAIN 0, PATCH 2, FECS_EVENT 9,
# PRIV_ACCESS_MAP 10, UNRESTRICTED_PRIV_ACCESS_MAP 11 (what a compute object needs,
# kgrobjGetPromoteIds_FWCLIENT), each with its engine id above
CTRL_PROMOTE_CTX = 0x2080012B
PROMOTE_HEAD, PROMOTE_ENTRY = struct.Struct("<6IQQI4x"), struct.Struct("<QQQIHBB")
CTX_ENGINE = {0: 0x0, 2: 0x10, 9: 0x17, 10: 0x18, 11: 0x18}
GROUP_CTX, GLOBAL_CTX = (0, 2), (9, 10, 11)
CTX_PHYS_ATTR = 4  # NV2080_CTRL_GPU_INITIALIZE_CTX_APERTURE_VIDMEM 0, GPU_CACHEABLE_NO 2:2
NV_ERR_INVALID_STATE = 0x40
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
        gpu.on_write[VF + VF_MMU_INVALIDATE] = self._invalidate
        # BAR 1 as other devices reach it (peer to peer): its TLB (BAR 1 page -> the page's
        # translation) under a lock of its own, since another GPU's PBDMA asks while holding
        # its own lock (two GPUs each reaching the other must not wait on each other)
        self.bar1_tlb: dict[int, gmmu.Translation] = {}
        self.bar1_requests = 0
        self._bar1_lock = threading.Lock()
        gpu.host.devices.append(self.bar1_request)
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
        self._lock = threading.RLock()
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

    def bar1_overfetch_mapped(self, root: int = BAR1_PDB) -> bool:
        """Whether BAR 1's last 4 KiB, which CPU-RM never maps (kbusInitBar1_GM107's host
        overfetch WAR), is mapped through the BAR 1 tables under ``root``."""
        try:
            gmmu.translate(self._read64, root, self.bar1_size - BAR1_OVERFETCH_PAD,
                           self.version)
        except gmmu.MmuFault:
            return False
        return True

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
            with self._lock:
                if ring is not None:
                    ring()

        firmware.gpu.on_doorbell = doorbell
        return self

    def _boot(self) -> None:
        """GSP-RM's boot: BAR 1's and BAR 2's roots empty (see the module)."""
        with self._lock, self._bar1_lock:
            for root in (BAR1_PDB, BAR2_PDB):
                self.vram[root:root + PAGE] = bytes(PAGE)
            self.bar1_tlb.clear()

    def _reset(self) -> None:
        """A function reset: GSP-RM and all it held gone (see the module); what the tests
        count (``log``, ``faults``, ``invalidates``, ``retired_asked``) stays."""
        with self._lock, self._bar1_lock:
            for records in (self.roots, self.tlb, self.fbmem, self.sysmem, self.virtual,
                            self.mappings, self.channels, self.groups, self.contexts,
                            self.promoted, self.global_ctx, self.devices, self.bar1_tlb):
                records.clear()
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
        fb = self._bar1_fb(offset, length)
        return memoryview(self.vram)[fb:fb + length]

    def place_bar1(self, offset: int, length: int, at: int) -> None:
        """Map BAR 1's ``length`` bytes at ``offset`` at the process address ``at`` (page
        aligned, over a range the caller reserved: MAP_FIXED), as rig_pci maps a BAR's file
        there: the video memory BAR 1's tables map at ``offset``, checked as :meth:`bar`
        checks it, sharing its pages (translated once, here, as :meth:`bar` translates)."""
        fb = self._bar1_fb(offset, length)
        got = libc.mmap(at, length, libc.PROT_READ | libc.PROT_WRITE,
                        libc.MAP_SHARED | libc.MAP_FIXED, self._vram_fd, fb)
        assert got == at

    def _bar1_fb(self, offset: int, length: int) -> int:
        """The FB offset of BAR 1's ``[offset, offset+length)``: mapped by BAR 1's tables,
        contiguously, to registered video memory (one to one without ``walks``)."""
        if offset + length > self.bar1_size:
            raise AssertionError(f"BAR 1 view 0x{offset:x}+0x{length:x} out of range")
        fb = offset
        if self.walks:
            try:
                first = gmmu.translate(self._read64, BAR1_PDB, offset, self.version)
                for page in range(offset, offset + length, PAGE):
                    where = gmmu.translate(self._read64, BAR1_PDB, page, self.version)
                    if not where.video or where.address != first.address + page - offset:
                        raise AssertionError(f"BAR 1 at 0x{page:x}: not contiguous video "
                                             "memory")
            except gmmu.MmuFault as e:
                raise AssertionError(f"BAR 1 at 0x{offset:x} is not mapped: {e}") from e
            fb = first.address
        for at, n in self.fbmem.values():
            if at <= fb and fb + length <= at + n:
                return fb
        raise AssertionError(f"BAR 1 at 0x{offset:x}: no registered video memory there")

    def bar1_request(self, address: int, n: int) -> memoryview | None:
        """Another device's request for ``n`` bytes at bus ``address`` (one page at most):
        ``None`` outside this GPU's BAR 1, else the video memory the BAR 1 tables map there
        (through the BAR 1 TLB); LookupError where they map none."""
        offset = address - self.gpu.bar1_address
        if not 0 <= offset < self.bar1_size:
            return None
        if offset % PAGE + n > PAGE or offset + n > self.bar1_size:
            raise LookupError(f"bus 0x{address:x} (+{n}) crosses a page of BAR 1")
        fb = offset
        if self.walks:
            with self._bar1_lock:
                page = self.bar1_tlb.get(offset >> 12)
                if page is None:
                    try:
                        page = gmmu.translate(self._read64, BAR1_PDB, offset & ~(PAGE - 1),
                                              self.version)
                    except gmmu.MmuFault as e:
                        raise LookupError(f"bus 0x{address:x}: BAR 1 of the GPU at "
                                          f"0x{self.gpu.bar1_address:x} maps nothing at "
                                          f"0x{offset:x} ({e})") from None
                    self.bar1_tlb[offset >> 12] = page
                self.bar1_requests += 1
            if not page.video:
                raise LookupError(f"bus 0x{address:x}: BAR 1 at 0x{offset:x} maps system "
                                  "memory")
            fb = page.address + offset % PAGE
        if fb + n > self.fb_size:
            raise LookupError(f"bus 0x{address:x}: BAR 1 maps beyond video memory")
        return memoryview(self.vram)[fb:fb + n]

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
            return self._alloc_channel(parent, handle, params), params
        if cls in COMPUTE_CLASSES and parent in self.channels and self.walks:
            group = self.channels[parent].group
            if set(GROUP_CTX + GLOBAL_CTX) - self.promoted.get(group, set()):
                return NV_ERR_INVALID_STATE, params  # no context buffers promoted
        return 0, params

    def _promote(self, params: bytes) -> int:
        """NV2080_CTRL_CMD_GPU_PROMOTE_CTX of a GSP client: each buffer's video memory
        checked (usable, aligned, of the engine's size, free of registered memory and instance
        blocks), initialized once, and its GPU address walked to it."""
        if len(params) < PROMOTE_HEAD.size + 16 * PROMOTE_ENTRY.size:
            return NV_ERR_INVALID_ARGUMENT
        engine, _, _, _, channel, _, _, _, count = PROMOTE_HEAD.unpack_from(params)
        if engine != 1 or channel not in self.channels or not 0 < count <= 16:
            return NV_ERR_INVALID_ARGUMENT
        group = self.channels[channel].group
        mine = self.contexts.setdefault(group, {})
        taken = list(self.fbmem.values()) + [(c.instance, INSTANCE_SIZE)
                                             for c in self.channels.values()]
        done: list[tuple[int, int, int, bool]] = []
        for i in range(count):
            fb, va, size, attr, buffer_id, initialize, nonmapped = PROMOTE_ENTRY.unpack_from(
                params, PROMOTE_HEAD.size + i * PROMOTE_ENTRY.size)
            if buffer_id not in CTX_ENGINE:
                return NV_ERR_INVALID_ARGUMENT
            align, need = CTX_PROPERTIES[CTX_ENGINE[buffer_id]]
            known = (self.global_ctx if buffer_id in GLOBAL_CTX else mine).get(buffer_id)
            if (known is None and not initialize) or (known is not None and known != (fb, size)):
                return NV_ERR_INVALID_ARGUMENT
            if (attr != CTX_PHYS_ATTR or fb % align or size < need
                    or not self.usable(fb, size)
                    or any(a < fb + size and fb < a + n for a, n in taken)):
                return NV_ERR_INVALID_ARGUMENT
            if not nonmapped:
                try:
                    for page in (va, va + size - PAGE):
                        where = self.translate(page)
                        if not where.video or where.address != fb + page - va:
                            return NV_ERR_INVALID_ARGUMENT
                except gmmu.MmuFault:
                    return NV_ERR_INVALID_ARGUMENT
            done.append((buffer_id, fb, size, not nonmapped))
        with self._lock:
            for buffer_id, fb, size, mapped in done:
                (self.global_ctx if buffer_id in GLOBAL_CTX else mine)[buffer_id] = (fb, size)
                if mapped:
                    self.promoted.setdefault(group, set()).add(buffer_id)
        return 0

    def _alloc_channel(self, parent: int, handle: int, params: bytes) -> int:
        """A GSP client's channel: its memory as the client's CPU-RM hands it over
        (kernel_channel.c _kchannelSendChannelAllocRpc), checked, the instance block's page
        directory base written (dev_ram.h NV_RAMIN_PAGE_DIR_BASE, as GSP-RM sets up the
        instance block it was given)."""
        if len(params) < CHANNEL_PARAMS_SIZE:
            return NV_ERR_INVALID_ARGUMENT
        notifier, buffer, gpfifo, entries = struct.unpack_from("<IIQI", params, 0)
        userd_handle = struct.unpack_from("<I", params, 32)[0]
        userd_offset = struct.unpack_from("<Q", params, 64)[0]
        inst, userd, ramfc, mthd = (MEM_DESC.unpack_from(params, at)
                                    for at in (CH_INSTANCE, CH_USERD, CH_RAMFC, CH_MTHDBUF))
        error = MEM_DESC.unpack_from(params, CH_ERROR_NOTIFIER)
        if userd_handle not in self.fbmem:
            return NV_ERR_INVALID_OBJECT_HANDLE
        runlist = chid.runlist(self.groups, parent, params)
        runlist_id = self.runlists.get(runlist_table.rm_engine_type(runlist))
        if runlist_id is None:
            return NV_ERR_INVALID_ARGUMENT
        status, channel_id = chid.named(params, runlist_id, self.channels.values())
        if status:
            return status
        base = inst[0]
        taken = [(at, n) for at, n in self.fbmem.values()] + [
            (c.instance, INSTANCE_SIZE) for c in self.channels.values()]
        if (buffer or inst[1:3] != (INSTANCE_SIZE, ADDR_FBMEM) or base % INSTANCE_SIZE
                or not self.usable(base, INSTANCE_SIZE)
                or any(a < base + INSTANCE_SIZE and base < a + n for a, n in taken)
                or any(self.vram[base:base + INSTANCE_SIZE])):  # the client zeroes it
            return NV_ERR_INVALID_ARGUMENT
        if ramfc[:3] != (base, RAMFC_SIZE, ADDR_FBMEM):
            return NV_ERR_INVALID_ARGUMENT
        fb, length = self.fbmem[userd_handle]
        if (userd[:3] != (fb + userd_offset, USERD_SIZE, ADDR_FBMEM) or userd[0] % USERD_SIZE
                or userd_offset + USERD_SIZE > length):
            return NV_ERR_INVALID_ARGUMENT
        if (mthd[1:3] != (METHOD_BUFFER_SIZE, ADDR_SYSMEM)
                or self.gpu.host.view(mthd[0], METHOD_BUFFER_SIZE) is None):
            return NV_ERR_INVALID_ARGUMENT
        pages = self.sysmem.get(notifier)
        if not pages or error[0] != pages[0] or error[2] != ADDR_SYSMEM or error[1] < 16:
            return NV_ERR_INVALID_ARGUMENT
        if self.walks:
            if not self.roots:
                return NV_ERR_INVALID_ARGUMENT
            root = list(self.roots.values())[-1]
            # TARGET 1:0 VID_MEM 0, LO 31:12, HI 7:0 of the next word
            struct.pack_into("<II", self.vram, base + RAMIN_PAGE_DIR_BASE,
                             root & 0xFFFFF000, root >> 32 & 0xFF)
        self.channels[handle] = Channel(handle, channel_id, gpfifo, entries, userd[0], parent,
                                        error[0], base, mthd[0], runlist=runlist,
                                        runlist_id=runlist_id)
        return 0

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
            return self._promote(params), params
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
                entry = self._read64(above + 8 * (lo >> upper & entries[i - 1] - 1))
                named = (entry >> 8 & 0x1FFFFFF if self.version == 2 else
                         entry >> 12 & (1 << 40) - 1) << 12
                if entry >> 1 & 3 != 1 or named != address:
                    return NV_ERR_INVALID_ARGUMENT
        with self._lock:
            self.roots[vaspace] = levels[0][0]
        return 0

    def _read64(self, fb: int) -> int:
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
        with self._lock:
            page = self.tlb.get(key)
            if page is None:
                page = gmmu.translate(self._read64, root, va & ~0xFFF, self.version)
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
        with self._lock:
            for key in [k for k in self.tlb if value & 2 or k[0] == pdb]:
                del self.tlb[key]
            self.invalidates += 1
            if value & 2 or pdb == BAR1_PDB:
                with self._bar1_lock:
                    self.bar1_tlb.clear()
        regs[VF + VF_MMU_INVALIDATE] = value & ~(1 << 31)  # done

    def _on_free(self, handle: int) -> None:
        with self._lock:
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
            with self._lock:
                self.mappings[va] = (memory, length)
        out = bytearray(p)
        struct.pack_into("<I", out, 48, status)
        return bytes(out), status

    def _unmap_dma(self, p: bytes) -> tuple[bytes, int]:
        _, _, _, memory, _, va, _ = struct.unpack_from("<5I4xQI", p)
        status = 0 if self.mappings.get(va, (None, 0))[0] == memory else NV_ERR_INVALID_OFFSET
        if status == 0:
            with self._lock:
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
        with self._lock:
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
