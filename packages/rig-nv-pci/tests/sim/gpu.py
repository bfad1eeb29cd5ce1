"""The simulated GPU: BAR 0 as a register file with the registers an Ampere/Ada boot touches,
PTIMER (sim/timer.py), host memory the falcons reach by DMA, and scripted firmware behaviour
(FWSEC-FRTS, FWSEC-SB, booter_load, booter_unload).
"""

from __future__ import annotations

import ctypes
import errno
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from rig_pci import Window, libc

from . import regs
from .falcon import SimFalcon
from .fsp import SimFsp
from .timer import SimTimer

BAR0_SIZE = 0x1000000
GA102_BOOT42 = 0x17 << 24 | 0x2 << 20 | 0xA1
AD102_BOOT42 = 0x19 << 24 | 0x2 << 20 | 0xA1
GB202_BOOT42 = 0x1B << 24 | 0x2 << 20 | 0xA1  # nv_ref.h architecture 0x1B (GB200), impl 2
FWSEC_FAILED = 0x0ABC  # an FRTS error code the tests script
FWSEC_SB_BAD_DESC = 0x0BAD  # the SB error code the simulated FWSEC reports for a bad argument


class HostMemory:
    """System memory the GPU reaches by bus address: buffers handed out at ``base`` upwards,
    each with ``view()``, ``bus_address(offset)`` and ``free()`` as rig_pci.DmaMemory has.

    It stands for one machine's memory, and so for its bus: GPUs given the same HostMemory
    lie on one machine, and ``devices`` holds what their BARs answer to other devices'
    requests (a BAR's owner's callback: the bytes at a bus address, or ``None`` where the
    address is not its BAR's). :meth:`reach` is what a device's DMA at a bus address reaches:
    system memory, else a BAR of a device on the bus (peer to peer)."""

    def __init__(self, base: int = 0x1_2340_0000) -> None:
        # write-back cached, as rig_pci's DMA memory is (anonymous or hugetlb pages): a
        # device read that does not snoop (a NONCOHERENT_SYSTEM target) misses the CPU's
        # latest writes
        self.cached = True
        self.next = base
        self.buffers: list[SimDma] = []
        self.devices: list[Callable[[int, int], memoryview | None]] = []

    def alloc_dma(self, n: int, *, at: int | None = None) -> SimDma:
        """``n`` bytes (whole pages) at the next bus address; with ``at``, at that address of
        the process, over a range the caller reserved, which freeing it reserves again (as
        rig_pci.Function.alloc_dma places memory)."""
        n = -(-n // 4096) * 4096
        if at is None:
            buf = SimDma(self.next, bytearray(n))
        else:
            got = libc.mmap(at, n, libc.PROT_READ | libc.PROT_WRITE,
                            libc.MAP_PRIVATE | libc.MAP_ANONYMOUS | libc.MAP_FIXED)
            assert got == at
            buf = SimDma(self.next, libc.view(at, n),  # type: ignore[arg-type]
                         on_free=lambda: libc.reserve(at, n))
        self.next += n + 0x10000
        self.buffers.append(buf)
        return buf

    def map_host(self, address: int, length: int) -> SimDma:
        """The process's own ``length`` bytes at ``address`` given bus addresses (what an
        IOMMU mapping does for them)."""
        pages = (ctypes.c_char * length).from_address(address)
        buf = SimDma(self.next, memoryview(pages).cast("B"))  # type: ignore[arg-type]
        self.next += length + 0x10000
        self.buffers.append(buf)
        return buf

    def read(self, address: int, n: int) -> bytes:
        for b in self.buffers:
            if b.bus <= address and address + n <= b.bus + len(b.data) and not b.freed:
                return bytes(b.data[address - b.bus:address - b.bus + n])
        raise AssertionError(f"DMA read of 0x{n:x} bytes at 0x{address:x} outside host memory")

    def view(self, address: int, n: int) -> memoryview | None:
        """The ``n`` bytes at bus ``address`` as a writable view, if one buffer holds them."""
        for b in self.buffers:
            if b.bus <= address and address + n <= b.bus + len(b.data) and not b.freed:
                return memoryview(b.data)[address - b.bus:address - b.bus + n]
        return None

    def reach(self, address: int, n: int) -> memoryview | None:
        """The ``n`` bytes a device's DMA at bus ``address`` reaches: system memory, else the
        BAR of a device on the bus that claims the address (see the class). A BAR's owner
        raises LookupError for an address of its BAR that leads nowhere."""
        found = self.view(address, n)
        for claim in self.devices:
            if found is not None:
                break
            found = claim(address, n)
        return found


@dataclass
class SimDma:
    bus: int
    data: bytearray
    freed: bool = False
    on_free: Callable[[], None] | None = None

    @property
    def length(self) -> int:
        return len(self.data)

    def view(self) -> memoryview:
        return memoryview(self.data)

    def bus_address(self, offset: int) -> int:
        if not 0 <= offset < len(self.data):
            raise ValueError(f"offset 0x{offset:x} is outside 0x{len(self.data):x} bytes")
        return self.bus + offset

    def free(self) -> None:
        if not self.freed and self.on_free is not None:
            self.data = bytearray()  # no view of memory that is gone
            self.on_free()
        self.freed = True


def hopper_on(boot42: int) -> bool:
    """Whether NV_PMC_BOOT_42's architecture (29:24) is Hopper's or a later one's: GH100 0x18,
    GB100 0x1A, GB200 0x1B (nv_ref.h NV_PMC_BOOT_42_ARCHITECTURE_*). Ada, AD100 0x19, numbered
    after Hopper, is Ampere's kin: NV_PBUS_BAR0_WINDOW and the version-2 MMU (the ad10x HALs
    of open-gpu-kernel-modules are ga10x's, kgmmuFmtFamiliesInit_GH100 only from Hopper)."""
    arch = boot42 >> 24 & 0x3F
    return arch == 0x18 or arch >= 0x1A


@dataclass
class SimGpu:
    boot42: int = GA102_BOOT42
    vbios: bytes = b""
    gfw_polls: int | None = 2  # reads of the GFW progress before it completes; None: never
    fuses: dict[int, int] = field(default_factory=dict)  # register -> value
    host: HostMemory = field(default_factory=HostMemory)
    regs: dict[int, int] = field(default_factory=dict)
    wpr2: tuple[int, int] = (0, 0)  # (lo, hi) register values
    # whether taking WPR2 down (a reset, booter_unload) clears only its high bound and leaves
    # the low one stale: the two bounds then disagree, and only the high one says whether
    # WPR2 is up (kgspIsWpr2Up_TU102 reads NV_PFB_PRI_MMU_WPR2_ADDR_HI alone)
    stale_wpr2_lo: bool = False
    # the usable FB size in MiB the VBIOS's devinit left in NV_USABLE_FB_SIZE_IN_MB; 0 where
    # the boot ROM reported none
    usable_fb_mib: int = 0
    reads: list[int] = field(default_factory=list)
    writes: list[tuple[int, int]] = field(default_factory=list)
    # registers whose access fails, as a BAR access can (a VFIO region's read or write of a
    # function that stopped answering is an EIO): register -> times left to fail
    failing: dict[int, int] = field(default_factory=dict)
    # what the GSP's RISC-V core runs once booter_load starts it (gsp_fw.GspFirmware.start)
    on_gsp_start: Callable[[], None] | None = None
    # what it runs when an FMC starts it with the LibOS arguments' bus address and whether
    # their GSP_DMA_TARGET is coherent (sim/fmc.py)
    on_gsp_start_at: Callable[[int, bool], None] | None = None
    # the GSP's end of the command queue doorbell (NV_PGSP_QUEUE_HEAD(0))
    on_doorbell: Callable[[], None] | None = None
    # what happens when the CPU writes a register: register -> callback(value)
    on_write: dict[int, Callable[[int], None]] = field(default_factory=dict)
    # the bus addresses of BARs 0, 1 and 3 (what GSP_SET_SYSTEM_INFO must carry)
    bar0_address: int = 0xF200_0000
    bar1_address: int = 0x38_0000_0000
    bar3_address: int = 0x38_1000_0000
    # a Hopper's FSP (its boot scratch, EMEM channel 0 and queues); None on Ampere/Ada
    fsp: SimFsp | None = None
    # the scripted firmware run, in order across both falcons ("fwsec-frts", "fwsec-sb",
    # "booter_unload")
    runs: list[str] = field(default_factory=list)
    # video memory, which BAR 0's PRAMIN window (NV_PRAMIN 0x700000..0x7fffff, dev_ram.h)
    # shows from NV_PBUS_BAR0_WINDOW's BASE (0x1700 bits 23:0, in 64 KiB units; TARGET 25:24
    # must be VID_MEM 0, dev_bus.ref.txt), from Hopper on NV_XAL_EP_BAR0_WINDOW's (0x10fd40
    # bits 22:0, pri_nv_xal_ep.h); None: no video memory simulated
    vram: memoryview | None = None
    # PTIMER, the GPU's nanosecond clock (sim/timer.py), which BAR 0 reads and the host
    # semaphores' RELEASE_TIMESTAMP writes
    timer: SimTimer = field(default_factory=SimTimer)
    # its config space's command register (PCI_COMMAND, include/uapi/linux/pci_regs.h):
    # MEMORY (bit 1) and MASTER (bit 2) set, as a driver's pci_enable_device and
    # pci_set_master leave them; Linux clears MASTER when the driver lets the function go
    # (pci_disable_device) and when vfio-pci opens or resets it. With MASTER clear the GPU's
    # memory requests are not issued (:meth:`dma`)
    command: int = 0x0006
    # the memory requests the GPU did not issue for Bus Master Enable was clear, in order
    unissued: list[str] = field(default_factory=list)
    # what else a function reset ends (:meth:`reset`): the GSP firmware's and GSP-RM's own
    # hooks (sim/gsp_fw.py, sim/gsp_rm.py), in the order installed
    on_reset: list[Callable[[], None]] = field(default_factory=list)
    function_resets: int = 0

    def __post_init__(self) -> None:
        self.gsp = SimFalcon("GSP", regs.GSP_BASE, regs.GSP_RISCV, regs.GSP_FBIF, 1 << 10,
                             self.host.read, bus_master=self.bus_master, boot0=self.boot0)
        self.sec2 = SimFalcon("SEC2", regs.SEC_BASE, regs.SEC_RISCV, regs.SEC_FBIF, 1 << 0,
                              self.host.read, bus_master=self.bus_master, boot0=self.boot0)

    @property
    def config_mirror(self) -> int:
        """Where BAR 0 mirrors the config space: NV_EP_PCFGM from Hopper on, else NV_PCFG."""
        return regs.EP_PCFGM_MIRROR if hopper_on(self.boot42) else regs.PCFG_MIRROR

    def boot0(self) -> int:
        """NV_PMC_BOOT_0: the chip's architecture and implementation in bits 31:20 (nv_ref.h
        via BOOT_42's 29:20; enough for a BOOT_0 that is not all-ones)."""
        return self.boot42 >> 20 << 20

    def bus_master(self) -> bool:
        """Whether Bus Master Enable (PCI_COMMAND bit 2) is set in its config space."""
        return bool(self.command & 0x4)

    def dma(self, address: int, n: int, what: str) -> memoryview | None:
        """What a memory request of the GPU's at bus ``address`` reaches (``what`` names it:
        the GSP reading its arguments, an engine's copy): :meth:`HostMemory.reach`.

        With Bus Master Enable clear the function issues no memory request (PCIe Base 6.0
        7.5.1.1.3), so nothing is reached: ``None``, the request kept in :attr:`unissued`.
        NVIDIA documents no more of what its engines then see; the simulator takes the
        request as never answered, which each engine meets as it meets memory that is not
        there: a falcon's DMA stays busy (sim/falcon.py), the GSP's LibOS finds no arguments
        and GSP-RM never starts (so no INIT_DONE comes), the FSP finds no FMC, the GSP reads
        no command queue (sim/gsp_fw.py's doorbell), and a channel's fetch or copy faults
        (sim/gsp_rm.py)."""
        if not self.bus_master():
            self.unissued.append(f"{what}: 0x{n:x} bytes at 0x{address:x}")
            return None
        return self.host.reach(address, n)

    def reset(self) -> None:
        """A function reset (FLR, or a secondary bus reset): the GPU's engines start over, what a
        boot left running ends. WPR2 comes down (:meth:`take_wpr2_down`: its high bound reads 0, as
        kgspIsWpr2Up_TU102 reads a GPU no boot has run on: the spec's "a reset that leaves WPR2 up
        fails" is of a reset that did not take), the falcons are as at power-on
        (:meth:`SimFalcon.power_on`), and each :attr:`on_reset` hook ends what it models: the GSP's
        firmware (GSP-RM and LibOS were running on the GSP and from WPR2) and GSP-RM's objects,
        channels, PBDMA and MMU state with it. Video memory keeps its bytes (a reset does not scrub
        the FB; GSP-RM's next boot builds its own BAR 1 and BAR 2 tables: sim/gsp_rm.py). The config
        space's command register is the function's owner's business: Linux saves it before the reset
        and restores it after (pci_reset_function's pci_dev_save_and_disable / pci_dev_restore), so
        it is left as it is; registers the VBIOS's devinit sets (the FB size) read as before, as the
        GPU's firmware (GFW) runs devinit again after a reset."""
        self.function_resets += 1
        self.take_wpr2_down()
        for f in self.falcons:
            f.power_on()
        for hook in self.on_reset:
            hook()

    @property
    def falcons(self) -> tuple[SimFalcon, SimFalcon]:
        return self.gsp, self.sec2

    def _pramin(self, offset: int) -> memoryview | None:
        if self.vram is None or not regs.PRAMIN <= offset < regs.PRAMIN + regs.PRAMIN_SIZE:
            return None
        if hopper_on(self.boot42):  # NV_XAL_EP_BAR0_WINDOW, BASE 22:0
            base = self.regs.get(regs.XAL_EP_BAR0_WINDOW, 0) & 0x7FFFFF
            at = (base << 16) + offset - regs.PRAMIN
        else:
            window = self.regs.get(regs.BAR0_WINDOW, 0)
            if window >> 24 & 3:
                raise AssertionError(f"PRAMIN over target {window >> 24 & 3}: only video "
                                     "memory is simulated")
            at = ((window & 0xFFFFFF) << 16) + offset - regs.PRAMIN
        if at + 4 > len(self.vram):
            raise AssertionError(f"PRAMIN at FB 0x{at:x}: beyond video memory")
        return self.vram[at:at + 4]

    def _fail(self, offset: int) -> None:
        left = self.failing.get(offset, 0)
        if left > 0:
            self.failing[offset] = left - 1
            raise OSError(errno.EIO, f"BAR 0 access at 0x{offset:x} failed")

    def read(self, offset: int) -> int:
        self._fail(offset)
        self.reads.append(offset)
        if self.fsp is not None and self.fsp.owns(offset):
            return self.fsp.read(offset)
        word = self._pramin(offset)
        if word is not None:
            return int.from_bytes(word, "little")
        for f in self.falcons:
            if f.owns(offset):
                return f.read(offset)
        if self.timer.owns(offset):
            return self.timer.read(offset)
        if offset == regs.PMC_BOOT_0:
            return self.boot0()
        if offset == regs.PMC_BOOT_42:
            return self.boot42
        if offset == regs.WPR2_ADDR_LO:
            return self.wpr2[0]
        if offset == regs.WPR2_ADDR_HI:
            return self.wpr2[1]
        if offset == regs.USABLE_FB_SIZE_IN_MB:
            return self.usable_fb_mib
        if offset == regs.AON_SCRATCH_GROUP_05_PLM:
            return 1 if self.gfw_polls is not None and self.gfw_polls <= 0 else 0
        if offset == regs.AON_SCRATCH_GROUP_05_0:
            if self.gfw_polls is None:
                return 0x3
            if self.gfw_polls > 0:
                self.gfw_polls -= 1
                return 0x3
            return 0xFF
        if regs.PROM <= offset < regs.PROM + regs.PROM_SIZE:
            chunk = self.vbios[offset - regs.PROM:offset - regs.PROM + 4]
            return int.from_bytes(chunk.ljust(4, b"\xff"), "little")
        if offset in self.fuses:
            return self.fuses[offset]
        return self.regs.get(offset, 0)

    def write(self, offset: int, value: int) -> None:
        self._fail(offset)
        self.writes.append((offset, value))
        if self.fsp is not None and self.fsp.owns(offset):
            self.fsp.write(offset, value)
            return
        word = self._pramin(offset)
        if word is not None:
            word[:] = value.to_bytes(4, "little")
            return
        if offset == regs.GSP_QUEUE_HEAD0:
            if self.on_doorbell is not None:
                self.on_doorbell()
            return
        for f in self.falcons:
            if f.owns(offset):
                f.write(offset, value)
                return
        if offset in (regs.WPR2_ADDR_LO, regs.WPR2_ADDR_HI, regs.PMC_BOOT_42,
                      regs.USABLE_FB_SIZE_IN_MB):
            return  # protected or read-only: dropped
        self.regs[offset] = value
        if offset in self.on_write:
            self.on_write[offset](value)

    def bar0(self) -> SimBar0:
        return SimBar0(self)

    # ---- scripted firmware ------------------------------------------------------------------

    def set_wpr2(self, lo: int, hi: int) -> None:
        """WPR2 from byte ``lo`` to the 4 KiB page holding byte ``hi`` - 1, as the registers
        hold it (address >> 12 in bits 31:4)."""
        self.wpr2 = ((lo >> 12) << 4, ((hi - 1) >> 12) << 4)

    def take_wpr2_down(self) -> None:
        """WPR2 down: both bounds 0, or only the high one where :attr:`stale_wpr2_lo`."""
        self.wpr2 = (self.wpr2[0] if self.stale_wpr2_lo else 0, 0)

    def wpr2_up(self) -> bool:
        """Whether WPR2 is up: its high bound's VAL (bits 31:4, dev_fb.h) is not 0."""
        return bool(self.wpr2[1] >> 4)

    def wpr2_bytes(self) -> tuple[int, int]:
        lo, hi = self.wpr2
        return (lo >> 4) << 12, ((hi >> 4) + 1) << 12


def fwsec_program(gpu: SimGpu, mapper_offset: int, cmd_in_offset: int, *,
                  error: int = 0, set_wpr2: bool = True, sb_error: int = 0
                  ) -> Callable[[SimFalcon], None]:
    """FWSEC as the GSP falcon runs it: the DMEM mapper's init_cmd (offset 44 in
    FALCON_APPLICATION_INTERFACE_DMEM_MAPPER_V3) 0x15 is FRTS, whose FWSECLIC_FRTS_CMD (a
    24-byte READ_VBIOS_DESC, then version, size, offset and size in 4 KiB, media) lies at the
    command-in buffer; FRTS puts WPR2 (stage one) over the FRTS region and the error code
    (0 none) in VBIOS scratch 0xE bits 31:16. init_cmd 0x19 is SB (kernel_gsp_frts_tu102.c
    FALCON_APPLICATION_INTERFACE_DMEM_MAPPER_V3_CMD_SB), whose argument is the READ_VBIOS_DESC
    alone (version 1, size 24, flags 2, else :data:`FWSEC_SB_BAD_DESC`); it leaves WPR2 as it
    is and ``sb_error`` (0 none) in VBIOS scratch 0x15 bits 15:0, keeping bits 31:16. Each run
    is recorded in ``gpu.runs``; other commands report 0xffff in scratch 0xE."""

    def run(f: SimFalcon) -> None:
        (cmd,) = struct.unpack_from("<I", f.dmem, mapper_offset + 44)
        f.log.append(f"fwsec cmd 0x{cmd:x}")
        if cmd == 0x19:
            gpu.runs.append("fwsec-sb")
            version, size, _, _, flags = struct.unpack_from("<IIQII", f.dmem, cmd_in_offset)
            code = sb_error if (version, size, flags) == (1, 24, 2) else FWSEC_SB_BAD_DESC
            old = gpu.regs.get(regs.VBIOS_SCRATCH_15, 0)
            gpu.regs[regs.VBIOS_SCRATCH_15] = old & 0xFFFF0000 | code & 0xFFFF
            f.set_mailbox(0, 0)
            return
        if cmd != 0x15:
            gpu.regs[regs.VBIOS_SCRATCH_0E] = 0xFFFF << 16
            return
        gpu.runs.append("fwsec-frts")
        _, _, off4k, size4k, media = struct.unpack_from("<5I", f.dmem, cmd_in_offset + 24)
        gpu.regs[regs.VBIOS_SCRATCH_0E] = error << 16
        if error == 0 and set_wpr2 and media == 2:
            gpu.set_wpr2(off4k << 12, (off4k + size4k) << 12)
        f.set_mailbox(0, 0)

    return run


def booter_program(gpu: SimGpu, *, error: int = 0, start_gsp: bool = True
                   ) -> Callable[[SimFalcon], None]:
    """booter_load on SEC2: reads GspFwWprMeta at MAILBOX1:MAILBOX0 in host memory, checks its
    magic and that WPR2 (stage one, from FWSEC) covers its FRTS, widens WPR2 down to
    gspFwWprStart (stage two), starts the GSP's RISC-V core and leaves 0 in MAILBOX0; or
    leaves ``error`` there."""

    def run(f: SimFalcon) -> None:
        address = f.mailbox(1) << 32 | f.mailbox(0)
        found = gpu.dma(address, 256, "booter_load reading GspFwWprMeta")
        if found is None:
            f.set_mailbox(0, 0xB0070004)  # a code of the simulator's: no WPR meta read
            return
        meta = bytes(found)

        def q(name: str) -> int:
            return int(struct.unpack_from("<Q", meta, regs.META_OFFSETS[name])[0])

        if error:
            f.set_mailbox(0, error)
            return
        if q("magic") != regs.META_MAGIC or q("revision") != 1:
            f.set_mailbox(0, 0xB0070001)
            return
        lo, hi = gpu.wpr2_bytes()
        if gpu.wpr2[1] == 0 or lo != q("frtsOffset"):
            f.set_mailbox(0, 0xB0070002)
            return
        gpu.set_wpr2(q("gspFwWprStart"), hi)
        f.set_mailbox(0, 0)
        if start_gsp:
            gpu.gsp.start_riscv()
            if gpu.on_gsp_start is not None:
                gpu.on_gsp_start()

    return run


BOOTER_UNLOAD_BAD_ARGS = 0xB0070003  # an error code the simulated booter_unload reports


def booter_unload_program(gpu: SimGpu, *, error: int = 0) -> Callable[[SimFalcon], None]:
    """booter_unload on SEC2, the mirror of :func:`booter_program`: for a normal unload it is
    started with 0xff in MAILBOX0 and MAILBOX1 (kgspExecuteBooterUnloadIfNeeded_TU102), takes
    WPR2 down (:meth:`SimGpu.take_wpr2_down`: WPR2_ADDR_HI's VAL is 0, kgspIsWpr2Up_TU102
    false) and leaves 0 in MAILBOX0; or leaves ``error`` there and WPR2 up. Other mailbox
    values (a suspend's SR meta address, GC6's 0xdeaddead) are not modelled: it reports
    :data:`BOOTER_UNLOAD_BAD_ARGS`."""

    def run(f: SimFalcon) -> None:
        f.log.append(f"booter_unload mailboxes 0x{f.mailbox(0):x} 0x{f.mailbox(1):x}")
        gpu.runs.append("booter_unload")
        if error:
            f.set_mailbox(0, error)
            return
        if (f.mailbox(0), f.mailbox(1)) != (0xFF, 0xFF):
            f.set_mailbox(0, BOOTER_UNLOAD_BAD_ARGS)
            return
        gpu.take_wpr2_down()
        f.set_mailbox(0, 0)

    return run


class SimBar0(Window):
    """BAR 0 of the simulated GPU as a rig_pci Window (32-bit registers; the PROM read at any
    width)."""

    def __init__(self, gpu: SimGpu) -> None:
        super().__init__(BAR0_SIZE, "simulated BAR 0")
        self.gpu = gpu
        self.closed = False

    def _read(self, offset: int, width: int) -> int:
        if width == 4:
            return self.gpu.read(offset)
        word = self.gpu.read(offset - offset % 4)
        return word >> 8 * (offset % 4) & (1 << 8 * width) - 1

    def _write(self, offset: int, width: int, value: int) -> None:
        if width != 4:
            raise AssertionError(f"{width}-byte write at 0x{offset:x}: registers are 32-bit")
        self.gpu.write(offset, value)

    def close(self) -> None:
        self.closed = True
