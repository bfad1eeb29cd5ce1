"""A falcon engine of an Ampere or Ada GPU (the GSP, SEC2) driven through BAR 0: reset and wait
for its memory scrub, choose its Falcon or RISC-V core, load IMEM and DMEM through its ports or
by DMA from system memory, give the boot ROM a heavy-secure (HS) ucode's signature parameters,
start it, wait for it to halt and read its mailboxes.

The sequence is RM's (open-gpu-kernel-modules 570.144): kflcnReset_TU102 and
kflcnSwitchToFalcon_GA102 (src/nvidia/src/kernel/gpu/falcon/arch/), kgspExecuteHsFalcon_GA102
and s_dmaTransfer_GA102 (src/nvidia/src/kernel/gpu/gsp/arch/ampere/kernel_gsp_falcon_ga102.c).
Register offsets are from the headers under src/common/inc/swref/published/ampere/ga102/ unless
a comment says otherwise. Errors name the engine and the state of its registers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rig_edge import Misuse, RigError
from rig_pci import Window

# dev_falcon_v4.h (offsets from the engine's base)
MAILBOX0 = 0x040
MAILBOX1 = 0x044
OS = 0x080
# NV_PFALCON_FALCON_RM: kflcnReset_TU102 writes NV_PMC_BOOT_0 (pGpu->chipId0) into it after
# every reset into the Falcon core, as nova-core (falcon.rs Falcon::reset) and tinygrad do; the
# HS ucode reads it
RM = 0x084
HWCFG2 = 0x0F4
HWCFG2_RISCV = 1 << 10
HWCFG2_MEM_SCRUBBING = 1 << 12  # 0 = done (GA102 waits on it: kflcnWaitForResetToFinish_GA102)
HWCFG2_RESET_READY = 1 << 31  # ga102/dev_falcon_v4_addendum.h (kflcnPreResetWait_GA102)
CPUCTL = 0x100
CPUCTL_STARTCPU = 1 << 1
CPUCTL_HALTED = 1 << 4
CPUCTL_ALIAS_EN = 1 << 6
BOOTVEC = 0x104
DMACTL = 0x10C
DMACTL_DMEM_SCRUBBING = 1 << 1
DMACTL_IMEM_SCRUBBING = 1 << 2
DMATRFBASE = 0x110
DMATRFMOFFS = 0x114
DMATRFCMD = 0x118
DMATRFCMD_FULL = 1 << 0
DMATRFCMD_IDLE = 1 << 1
DMATRFCMD_SEC_SHIFT = 2  # 3:2
DMATRFCMD_IMEM = 1 << 4
DMATRFCMD_SIZE_256B = 6 << 8  # SIZE 10:8
DMATRFFBOFFS = 0x11C
DMATRFBASE1 = 0x128
CPUCTL_ALIAS = 0x130
IMEMC = 0x180  # port 0: OFFS 7:2, BLK 23:8, AINCW 24:24, SECURE 28:28
IMEMD = 0x184
DMEMC = 0x1C0
DMEMD = 0x1C4
MEMC_AINCW = 1 << 24
MEMC_AINCR = 1 << 25  # not in the published header: nouveau nvkm/falcon/v1.c uses BIT(25)
IMEMC_SECURE = 1 << 28
# dev_gsp.h NV_PGSP_FALCON_ENGINE, dev_sec_pri.h NV_PSEC_FALCON_ENGINE (both base + 0x3c0)
ENGINE = 0x3C0
ENGINE_RESET = 1 << 0
# falcon_common.h FLCN_RESET_PROPAGATION_DELAY_COUNT: the reads of ENGINE after each edge of
# the reset (kgspResetHw_TU102, ksec2ResetHw_TU102 "Reg read cycles needed for signal
# propagation")
RESET_PROPAGATION_READS = 10
PRE_RESET_TIMEOUT_S = 150e-6  # kernel_falcon_ga102.c PRE_RESET_TIMEOUT_US, on silicon
NV_PMC_BOOT_0 = 0x000000  # nv_ref.h

# dev_falcon_second_pri.h (offsets from the engine's RISC-V base, NV_FALCON2_*_BASE)
MOD_SEL = 0x180
MOD_SEL_ALGO_RSA3K = 0x1
BROM_CURR_UCODE_ID = 0x198
BROM_ENGIDMASK = 0x19C
BROM_PARAADDR0 = 0x210
# dev_riscv_pri.h (from the RISC-V base)
RISCV_CPUCTL = 0x388
RISCV_CPUCTL_HALTED = 1 << 4
RISCV_CPUCTL_ACTIVE = 1 << 7
RISCV_BCR_CTRL = 0x668
BCR_VALID = 1 << 0
BCR_CORE_SELECT_RISCV = 1 << 4
BCR_BRFETCH = 1 << 8

# dev_fbif_v4.h (offsets from the engine's FBIF base)
FBIF_TRANSCFG0 = 0x000
FBIF_TRANSCFG_COHERENT_SYSMEM = 0x1  # TARGET 1:0
FBIF_TRANSCFG_PHYSICAL = 1 << 2  # MEM_TYPE 2:2
FBIF_CTL = 0x024
FBIF_CTL_ALLOW_PHYS_NO_CTX = 1 << 7

BLOCK = 256  # FLCN_BLK_ALIGNMENT: a DMA transfer, an IMEM block
TIMEOUT_S = 4.0  # GPU_TIMEOUT_DEFAULT


class FalconError(RigError):
    """A falcon did not do what it was asked; the message names the engine and its registers."""


@dataclass(frozen=True)
class Engine:
    """Where an engine's registers lie in BAR 0, and its ucode fuse registers."""

    name: str
    base: int  # dev_gsp.h NV_PGSP, dev_sec_pri.h NV_PSEC
    riscv: int  # dev_falcon_second_pri.h NV_FALCON2_GSP_BASE, NV_FALCON2_SEC_BASE
    fbif: int  # dev_gsp_addendum.h NV_PGSP_FBIF_BASE, dev_sec_addendum.h NV_PSEC_FBIF_BASE
    fuse_ucode1: int  # ga100/dev_fuse.h NV_FUSE_OPT_FPF_<engine>_UCODE1_VERSION (GA100 HAL)


GSP = Engine("GSP", 0x110000, 0x111000, 0x110600, 0x8241C0)
SEC2 = Engine("SEC2", 0x840000, 0x841000, 0x840600, 0x824140)


class DmaBuffer(Protocol):
    """System memory the GPU reaches (rig_pci.DmaMemory has this shape)."""

    @property
    def length(self) -> int: ...

    def view(self) -> memoryview: ...

    def bus_address(self, offset: int) -> int: ...


@dataclass(frozen=True)
class HsUcode:
    """Where an HS ucode lies in its DMA buffer and how it loads (KernelGspFlcnUcodeBootFromHs):
    IMEM from ``code_offset`` (``imem_size`` bytes to IMEM ``imem_pa``, tagged from
    ``imem_va``, the boot vector), DMEM from ``data_offset`` (``dmem_size`` bytes to
    ``dmem_pa``); the boot ROM's parameters: the signature's DMEM offset, engine id mask and
    ucode id."""

    code_offset: int
    imem_size: int
    imem_pa: int
    imem_va: int
    data_offset: int
    dmem_size: int
    dmem_pa: int
    sig_dmem_offset: int
    engine_id_mask: int
    ucode_id: int


def poll(
    read: Callable[[], int], done: Callable[[int], bool], timeout_s: float
) -> tuple[bool, int]:
    """Read until ``done``; (True, value) or (False, last value) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0
    while True:
        value = read()
        if done(value):
            return True, value
        if time.monotonic() >= deadline:
            return False, value
        time.sleep(pause)
        pause = min(pause * 2 or 1e-5, 1e-3)


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


class Falcon:
    """One engine through ``bar0`` (a window from BAR 0's offset 0 over the engine's
    registers). ``timeout_s`` bounds every wait."""

    def __init__(self, bar0: Window, engine: Engine, timeout_s: float = TIMEOUT_S) -> None:
        self.bar0 = bar0
        self.engine = engine
        self.timeout_s = timeout_s

    # ---- registers ---------------------------------------------------------------------------

    def rd(self, r: int) -> int:
        return self.bar0.read32(self.engine.base + r)

    def wr(self, r: int, value: int) -> None:
        self.bar0.write32(self.engine.base + r, value)

    def riscv_rd(self, r: int) -> int:
        return self.bar0.read32(self.engine.riscv + r)

    def riscv_wr(self, r: int, value: int) -> None:
        self.bar0.write32(self.engine.riscv + r, value)

    def state(self) -> str:
        """The registers that tell what the engine is doing, for messages."""
        parts = [("CPUCTL", self.rd(CPUCTL)), ("MAILBOX0", self.rd(MAILBOX0)),
                 ("MAILBOX1", self.rd(MAILBOX1)), ("HWCFG2", self.rd(HWCFG2)),
                 ("DMATRFCMD", self.rd(DMATRFCMD)),
                 ("RISCV_CPUCTL", self.riscv_rd(RISCV_CPUCTL)),
                 ("BCR_CTRL", self.riscv_rd(RISCV_BCR_CTRL))]
        return ", ".join(f"{n} 0x{v:08x}" for n, v in parts)

    def fail(self, what: str) -> FalconError:
        return FalconError(f"the {self.engine.name} falcon {what} ({self.state()})")

    def _wait(self, what: str, read: Callable[[], int], done: Callable[[int], bool],
              timeout_s: float | None = None) -> int:
        ok, value = poll(read, done, self.timeout_s if timeout_s is None else timeout_s)
        if not ok:
            raise self.fail(what)
        return value

    # ---- reset and cores ---------------------------------------------------------------------

    def _reset_hw(self) -> None:
        """kflcnPreResetWait_GA102 (HWCFG2.RESET_READY, 150 us, no failure when it stays
        clear), the engine's reset (kgspResetHw_TU102 / ksec2ResetHw_TU102: ENGINE.RESET
        set, then cleared, each edge followed by the propagation reads) and the scrub wait
        (kflcnWaitForResetToFinish_GA102). Not yet Blackwell's kgspResetHw_GB100 (a wait for
        the reset's PLM, then GH100's waits for each edge): its boot resets no falcon (the FSP
        starts the GSP), only a sequencer's CORE_RESET would."""
        poll(lambda: self.rd(HWCFG2), lambda v: bool(v & HWCFG2_RESET_READY),
             PRE_RESET_TIMEOUT_S)
        for value in (ENGINE_RESET, 0):
            self.wr(ENGINE, self.rd(ENGINE) & ~ENGINE_RESET | value)
            for _ in range(RESET_PROPAGATION_READS):
                self.rd(ENGINE)
        self._wait(f"did not finish scrubbing its memory within {self.timeout_s} s of a reset",
                   lambda: self.rd(HWCFG2), lambda v: not v & HWCFG2_MEM_SCRUBBING)

    def reset(self) -> None:
        """Reset the engine, select its Falcon core and write NV_PMC_BOOT_0 into
        NV_PFALCON_FALCON_RM (kflcnReset_TU102 with GA102's HALs), as before FWSEC, booter
        and a sequencer's CORE_RESET."""
        self._reset_hw()
        self.select_falcon()
        self.wr(RM, self.bar0.read32(NV_PMC_BOOT_0))

    def select_falcon(self) -> None:
        """Switch to the Falcon core if the RISC-V one is selected, and wait for BCR VALID
        (kflcnSwitchToFalcon_GA102)."""
        if not self.rd(HWCFG2) & HWCFG2_RISCV:
            return
        if not self.riscv_rd(RISCV_BCR_CTRL) & BCR_CORE_SELECT_RISCV:
            return
        self.riscv_wr(RISCV_BCR_CTRL, 0)
        self._wait("did not switch to its Falcon core (BCR_CTRL never read VALID)",
                   lambda: self.riscv_rd(RISCV_BCR_CTRL), lambda v: bool(v & BCR_VALID))

    def reset_into_riscv(self) -> None:
        """Reset and select the RISC-V core, fetching from the boot ROM, as
        kflcnResetIntoRiscv_GA102 does: the reset and scrub wait, then kflcnRiscvProgramBcr
        with BRFETCH. NVIDIA neither switches to the Falcon core first, nor writes FALCON_RM,
        nor waits for BCR VALID here (the core runs only once the booter starts it), and
        neither does tinygrad's reset(riscv=True)."""
        self._reset_hw()
        self.riscv_wr(RISCV_BCR_CTRL, BCR_CORE_SELECT_RISCV | BCR_VALID | BCR_BRFETCH)

    def riscv_active(self) -> bool:
        """Whether the RISC-V core runs (RISCV_CPUCTL.ACTIVE_STAT, kflcnIsRiscvActive)."""
        return bool(self.riscv_rd(RISCV_CPUCTL) & RISCV_CPUCTL_ACTIVE)

    # ---- IMEM and DMEM through the ports -----------------------------------------------------

    def write_imem(self, offset: int, data: bytes, *, secure: bool = False) -> None:
        """``data`` into IMEM at ``offset`` (both 4-byte multiples) through IMEMC/IMEMD."""
        self._port_write(IMEMC, IMEMD, offset, data, IMEMC_SECURE if secure else 0)

    def write_dmem(self, offset: int, data: bytes) -> None:
        self._port_write(DMEMC, DMEMD, offset, data, 0)

    def _port_write(self, ctl: int, port: int, offset: int, data: bytes, flags: int) -> None:
        if offset % 4 or len(data) % 4:
            raise Misuse(f"{self.engine.name}: port writes are of whole 32-bit words "
                         f"(offset 0x{offset:x}, 0x{len(data):x} bytes)")
        self.wr(ctl, offset & 0xFFFFFC | MEMC_AINCW | flags)
        for i in range(0, len(data), 4):
            self.wr(port, int.from_bytes(data[i:i + 4], "little"))

    def read_dmem(self, offset: int, n: int) -> bytes:
        """``n`` bytes (a 4-byte multiple) of DMEM from ``offset`` through DMEMC/DMEMD."""
        if offset % 4 or n % 4:
            raise Misuse(f"{self.engine.name}: port reads are of whole 32-bit words")
        self.wr(DMEMC, offset & 0xFFFFFC | MEMC_AINCR)
        return b"".join(self.rd(DMEMD).to_bytes(4, "little") for _ in range(n // 4))

    # ---- DMA -----------------------------------------------------------------------------------

    def disable_ctx_req(self) -> None:
        """Let the engine DMA physically with no context: FBIF_CTL.ALLOW_PHYS_NO_CTX set and
        DMACTL (REQUIRE_CTX) 0 (kflcnDisableCtxReq_TU102)."""
        fbif = self.engine.fbif
        ctl = self.bar0.read32(fbif + FBIF_CTL)
        self.bar0.write32(fbif + FBIF_CTL, ctl | FBIF_CTL_ALLOW_PHYS_NO_CTX)
        self.wr(DMACTL, 0)

    def _dma_setup(self) -> None:
        """Physical DMA from coherent system memory with no context (kflcnDisableCtxReq_TU102
        and the TRANSCFG(0) programming of kgspExecuteHsFalcon_GA102)."""
        fbif = self.engine.fbif
        self.disable_ctx_req()
        cfg = self.bar0.read32(fbif + FBIF_TRANSCFG0) & ~0x7
        self.bar0.write32(fbif + FBIF_TRANSCFG0,
                          cfg | FBIF_TRANSCFG_COHERENT_SYSMEM | FBIF_TRANSCFG_PHYSICAL)

    def _dma_wait(self, mask: int, value: int, what: str) -> None:
        self._wait(f"DMA {what}", lambda: self.rd(DMATRFCMD), lambda v: v & mask == value)

    def dma(self, buffer: DmaBuffer, src: int, dest: int, size: int, *, imem: bool,
            secure: bool = False, mem_offset: int = 0) -> None:
        """Copy ``size`` bytes (rounded up to 256) from ``buffer`` at ``src`` into IMEM (or
        DMEM) at ``dest`` in 256-byte transfers, tagged from ``mem_offset``
        (s_dmaTransfer_GA102). The source's bus address and ``dest`` must be 256-aligned."""
        size = _up(size, BLOCK)
        if src % BLOCK or dest % BLOCK or mem_offset % BLOCK or src + size > buffer.length:
            raise Misuse(f"{self.engine.name}: DMA of 0x{size:x} bytes from 0x{src:x} of a "
                         f"0x{buffer.length:x}-byte buffer to 0x{dest:x} is not 256-aligned "
                         "or runs past the buffer")
        cmd = DMATRFCMD_SIZE_256B | (DMATRFCMD_IMEM if imem else 0)
        if imem and secure:
            cmd |= 1 << DMATRFCMD_SEC_SHIFT
        what = "into " + ("IMEM" if imem else "DMEM")
        self._dma_setup()
        base: int | None = None
        for done in range(0, size, BLOCK):
            bus = buffer.bus_address(src + done)
            if bus % BLOCK:
                raise Misuse(f"{self.engine.name}: DMA source bus address 0x{bus:x} is not "
                             "256-aligned")
            self._dma_wait(DMATRFCMD_FULL, 0, f"{what}: its request queue stayed full")
            if base is None or bus != base + mem_offset + done:  # (re)program per bus run
                # the engine reads base + DMATRFFBOFFS: the base is the source less the tag
                # offset (srcPhysAddr + codeOffset - imemVa in kgspExecuteHsFalcon_GA102)
                base = bus - mem_offset - done
                if base < 0:
                    raise Misuse(f"{self.engine.name}: DMA source 0x{bus:x} lies below its "
                                 f"tag offset 0x{mem_offset + done:x}")
                self.wr(DMATRFBASE, (base >> 8) & 0xFFFFFFFF)
                self.wr(DMATRFBASE1, (base >> 40) & 0x1FF)
            self.wr(DMATRFMOFFS, dest + done)
            self.wr(DMATRFFBOFFS, mem_offset + done)
            self.wr(DMATRFCMD, cmd)
        self._dma_wait(DMATRFCMD_IDLE, DMATRFCMD_IDLE, f"{what} did not finish")

    # ---- HS boot, start, halt ----------------------------------------------------------------

    def fuse_version(self, ucode_id: int) -> int:
        """The engine's fuse version for ``ucode_id`` (1..16): the highest set bit of its
        NV_FUSE_OPT_FPF_*_UCODE<id>_VERSION plus one, 0 when none (ReadUcodeFuseVersion_GA100)."""
        if not 1 <= ucode_id <= 16:
            return 0
        return (self.bar0.read32(self.engine.fuse_ucode1 + 4 * (ucode_id - 1)) & 0xFFFF
                ).bit_length()

    def brom(self, sig_dmem_offset: int, engine_id_mask: int, ucode_id: int) -> None:
        """The boot ROM's parameters for an HS ucode: where its signature lies in DMEM, the
        engines and ucode id it is signed for, RSA-3K."""
        self.riscv_wr(BROM_PARAADDR0, sig_dmem_offset)
        self.riscv_wr(BROM_ENGIDMASK, engine_id_mask)
        self.riscv_wr(BROM_CURR_UCODE_ID, ucode_id & 0xFF)
        self.riscv_wr(MOD_SEL, MOD_SEL_ALGO_RSA3K)

    def start(self, bootvec: int = 0, mailbox0: int | None = None,
              mailbox1: int | None = None) -> None:
        """Set the boot vector and mailboxes and start the CPU (kflcnStartCpu_TU102: through
        CPUCTL_ALIAS when CPUCTL.ALIAS_EN is set)."""
        self.wr(BOOTVEC, bootvec)
        if mailbox0 is not None:
            self.wr(MAILBOX0, mailbox0)
        if mailbox1 is not None:
            self.wr(MAILBOX1, mailbox1)
        self.start_cpu()

    def start_cpu(self) -> None:
        """Start the CPU where it stands (kflcnStartCpu_TU102): STARTCPU through CPUCTL_ALIAS
        when CPUCTL.ALIAS_EN is set, else through CPUCTL."""
        if self.rd(CPUCTL) & CPUCTL_ALIAS_EN:
            self.wr(CPUCTL_ALIAS, CPUCTL_STARTCPU)
        else:
            self.wr(CPUCTL, CPUCTL_STARTCPU)

    def wait_halt(self, timeout_s: float | None = None) -> None:
        """Wait for CPUCTL.HALTED; raises :class:`FalconError` after ``timeout_s``."""
        t = self.timeout_s if timeout_s is None else timeout_s
        self._wait(f"did not halt within {t} s", lambda: self.rd(CPUCTL),
                   lambda v: bool(v & CPUCTL_HALTED), t)

    def wait_riscv_halt(self, timeout_s: float | None = None) -> None:
        """Wait for RISCV_CPUCTL.HALTED (kflcnWaitForHaltRiscv_GA102); raises
        :class:`FalconError` after ``timeout_s``."""
        t = self.timeout_s if timeout_s is None else timeout_s
        self._wait(f"did not halt its RISC-V core within {t} s",
                   lambda: self.riscv_rd(RISCV_CPUCTL),
                   lambda v: bool(v & RISCV_CPUCTL_HALTED), t)

    def mailboxes(self) -> tuple[int, int]:
        return self.rd(MAILBOX0), self.rd(MAILBOX1)

    def run_hs(self, buffer: DmaBuffer, ucode: HsUcode, mailbox0: int | None = None,
               mailbox1: int | None = None, timeout_s: float | None = None) -> tuple[int, int]:
        """kgspExecuteHsFalcon_GA102 on an engine already reset: DMA the ucode's code (secure)
        and data from ``buffer``, give the boot ROM its parameters, start it at ``imem_va``
        with the mailboxes given, wait for it to halt; its mailboxes after."""
        self.dma(buffer, ucode.code_offset, ucode.imem_pa, ucode.imem_size, imem=True,
                 secure=True, mem_offset=ucode.imem_va)
        self.dma(buffer, ucode.data_offset, ucode.dmem_pa, ucode.dmem_size, imem=False)
        self.brom(ucode.sig_dmem_offset, ucode.engine_id_mask, ucode.ucode_id)
        self.start(ucode.imem_va, mailbox0, mailbox1)
        self.wait_halt(timeout_s)
        return self.mailboxes()
