"""A falcon engine (GSP or SEC2 of an Ampere/Ada GPU) as a state machine behind its registers:
reset and scrubbing, the IMEM/DMEM ports, DMA from host memory (refused without physical
sysmem access or Bus Master Enable), the BROM's heavy-secure start checking signature, engine
and ucode id, then a scripted program, and the RISC-V core select.

Behaviour as NVIDIA's RM and nouveau drive it (kernel_falcon_tu102.c, kernel_falcon_ga102.c,
kernel_gsp_falcon_ga102.c, nvkm/falcon/*.c). Each register's rule in full:
docs/rig-nv-pci-modules/sim-falcon.md."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from . import regs

PRI_ERROR = 0xBADF1100
TARGET_MASK_LOCKED = 0xBADF4100  # kern_fsp_gh100.c: what a GSP locked to the FSP reads
BROM_FAILED = 0xB0B0DEAD
RM_MISMATCH = 0xB0B00084  # the simulated ucode's code for a FALCON_RM that is not BOOT_0
BLOCK = 256


@dataclass
class SimFalcon:
    name: str
    base: int
    riscv: int
    fbif: int
    engine_bit: int
    read_host: Callable[[int, int], bytes]
    # whether the GPU's Bus Master Enable is set (SimGpu.bus_master): a DMA without it
    # issues no memory request and never completes
    bus_master: Callable[[], bool] = lambda: True
    # NV_PMC_BOOT_0 of the chip (SimGpu.boot0), what the HS ucode wants in FALCON_RM
    boot0: Callable[[], int] = lambda: 0
    imem_size: int = 0x10000
    dmem_size: int = 0x10000
    scrub_polls: int = 3
    run_polls: int = 2
    signatures: set[bytes] = field(default_factory=set)
    ucode_id: int | None = None
    programs: dict[int, Callable[[SimFalcon], None]] = field(default_factory=dict)
    regs: dict[int, int] = field(default_factory=dict)
    imem: bytearray = field(default_factory=bytearray)
    dmem: bytearray = field(default_factory=bytearray)
    in_reset: bool = False
    scrub_left: int = 0
    state: str = "stopped"  # stopped, running, halted; RISC-V: riscv-running
    run_left: int = 0
    riscv_core: bool = False
    bcr_valid_left: int = 0
    dma_fault: str | None = None
    imem_secure: set[int] = field(default_factory=set)
    resets: int = 0
    # Hopper/Blackwell, before the FMC runs: BAR 0 reads of the engine return 0xBADF4100 while
    # the FSP holds its PRIV target mask (_kfspIsGspTargetMaskReleased), and HWCFG2's
    # RISCV_BR_PRIV_LOCKDOWN (13:13, dev_falcon_v4.h) reads LOCK while ``br_lockdown``
    target_mask_locked: bool = False
    br_lockdown: bool = False
    starts: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.imem = bytearray(self.imem_size)
        self.dmem = bytearray(self.dmem_size)

    # ---- address decoding -------------------------------------------------------------------

    def owns(self, offset: int) -> bool:
        return any(b <= offset < b + 0x1000 for b in (self.base, self.riscv)) or \
            self.fbif <= offset < self.fbif + 0x100

    def read(self, offset: int) -> int:
        if self.in_reset and offset - self.base != regs.ENGINE:
            return PRI_ERROR
        if self.target_mask_locked and any(b <= offset < b + 0x1000
                                           for b in (self.base, self.riscv)):
            return TARGET_MASK_LOCKED
        if self.base <= offset < self.base + 0x1000:
            return self._falcon_read(offset - self.base)
        if self.riscv <= offset < self.riscv + 0x1000:
            return self._riscv_read(offset - self.riscv)
        return self.regs.get(offset, 0)

    def write(self, offset: int, value: int) -> None:
        if self.base <= offset < self.base + 0x1000:
            r = offset - self.base
            if r == regs.ENGINE:
                self._engine(value)
            elif not self.in_reset:
                self._falcon_write(r, value)
        elif self.in_reset:
            return
        elif self.riscv <= offset < self.riscv + 0x1000:
            self._riscv_write(offset - self.riscv, value)
        else:
            self.regs[offset] = value

    # ---- reset and scrubbing ----------------------------------------------------------------

    def _engine(self, value: int) -> None:
        if value & 1:
            self.in_reset = True
            self.state = "stopped"
            self.resets += 1
            return
        if self.in_reset:
            self.in_reset = False
            self.imem[:] = bytes(self.imem_size)
            self.dmem[:] = bytes(self.dmem_size)
            self.imem_secure.clear()
            self.scrub_left = self.scrub_polls
            self.dma_fault = None
            bcr = self.riscv + regs.RISCV_BCR_CTRL
            keep = {k: v for k, v in self.regs.items() if k == bcr or not (
                self.base <= k < self.base + 0x1000 or self.riscv <= k < self.riscv + 0x1000)}
            self.regs = keep
            self.log.append("reset")

    def power_on(self) -> None:
        """The engine as a function reset leaves it: out of reset, stopped, its IMEM and DMEM
        zero, its registers (the core select and mailboxes among them) at 0; what the chip
        holds in ROM and fuses (``signatures``, ``ucode_id``, ``programs``) stays. The Hopper
        FSP's target mask (``target_mask_locked``) is the FSP's to model (sim/fsp.py)."""
        self.in_reset, self.state, self.run_left = False, "stopped", 0
        self.imem[:] = bytes(self.imem_size)
        self.dmem[:] = bytes(self.dmem_size)
        self.imem_secure.clear()
        self.scrub_left, self.dma_fault = 0, None
        self.riscv_core, self.bcr_valid_left = False, 0
        self.regs = {}
        self.log.append("function reset")

    def _scrub_bits(self) -> int:
        if self.scrub_left > 0:
            self.scrub_left -= 1
            return 1
        return 0

    # ---- falcon registers -------------------------------------------------------------------

    def _falcon_read(self, r: int) -> int:
        if r == regs.HWCFG2:
            return (1 << 31 | 1 << 10 | self._scrub_bits() << 12
                    | (1 << 13 if self.br_lockdown else 0))
        if r == regs.DMACTL:
            bits = self._scrub_bits()
            return self.regs.get(self.base + r, 1) & 1 | bits << 1 | bits << 2
        if r == regs.HWCFG:
            return self.imem_size // BLOCK
        if r == regs.CPUCTL:
            if self.state == "running":
                self.run_left -= 1
                if self.run_left <= 0:
                    self.state = "halted"
            alias = self.regs.get(self.base + r, 0) & 1 << 6
            return alias | (1 << 4 if self.state == "halted" else 0)
        if r == regs.DMATRFCMD:
            return 0 if self.dma_fault else 1 << 1
        if r in (regs.IMEMD, regs.DMEMD):
            return self._port_read(r)
        return self.regs.get(self.base + r, 0)

    def _falcon_write(self, r: int, value: int) -> None:
        if r in (regs.CPUCTL, regs.CPUCTL_ALIAS) and value & 1 << 1:
            self._start()
        elif r == regs.DMATRFCMD:
            self._dma(value)
        elif r in (regs.IMEMD, regs.DMEMD):
            self._port_write(r, value)
        else:
            self.regs[self.base + r] = value

    # ---- ports ------------------------------------------------------------------------------

    def _port(self, r: int) -> tuple[bytearray, int, int]:
        ctl_reg = regs.IMEMC if r == regs.IMEMD else regs.DMEMC
        mem = self.imem if r == regs.IMEMD else self.dmem
        return mem, ctl_reg, self.regs.get(self.base + ctl_reg, 0)

    @staticmethod
    def _address(ctl: int) -> int:
        return (ctl >> 8 & 0xFFFF) * BLOCK + (ctl >> 2 & 0x3F) * 4

    def _advance(self, ctl_reg: int, ctl: int) -> None:
        a = self._address(ctl) + 4
        self.regs[self.base + ctl_reg] = ctl & ~0xFFFFFC | (a // BLOCK) << 8 | (a % BLOCK) // 4 << 2

    def _port_write(self, r: int, value: int) -> None:
        mem, ctl_reg, ctl = self._port(r)
        a = self._address(ctl)
        if a + 4 <= len(mem):
            struct.pack_into("<I", mem, a, value)
            if r == regs.IMEMD and ctl >> 28 & 1:
                self.imem_secure.add(a // BLOCK)
        if ctl >> 24 & 1:
            self._advance(ctl_reg, ctl)

    def _port_read(self, r: int) -> int:
        mem, ctl_reg, ctl = self._port(r)
        a = self._address(ctl)
        value = struct.unpack_from("<I", mem, a)[0] if a + 4 <= len(mem) else 0
        if ctl & regs.MEMC_AINCR:
            self._advance(ctl_reg, ctl)
        return int(value)

    # ---- DMA --------------------------------------------------------------------------------

    def _dma(self, cmd: int) -> None:
        transcfg = self.regs.get(self.fbif + regs.FBIF_TRANSCFG0, 0)
        ctl = self.regs.get(self.fbif + regs.FBIF_CTL, 0)
        dmactl = self.regs.get(self.base + regs.DMACTL, 1)
        if not self.bus_master():  # PCIe Base 6.0 7.5.1.1.3: no memory request is issued
            self.dma_fault = "no memory request: the function's Bus Master Enable is clear"
        elif transcfg & 3 != 1 or not transcfg >> 2 & 1:
            self.dma_fault = f"FBIF TRANSCFG(0) 0x{transcfg:x} is not physical coherent sysmem"
        elif not ctl >> 7 & 1:
            self.dma_fault = f"FBIF_CTL 0x{ctl:x} does not allow physical DMA with no context"
        elif dmactl & 1:
            self.dma_fault = "DMACTL requires a context"
        elif cmd >> 8 & 7 != 6:
            self.dma_fault = f"DMATRFCMD 0x{cmd:x} is not a 256-byte transfer"
        if self.dma_fault:
            self.log.append("dma fault: " + self.dma_fault)
            return
        base = (self.regs.get(self.base + regs.DMATRFBASE, 0)
                | (self.regs.get(self.base + regs.DMATRFBASE1, 0) & 0x1FF) << 32) << 8
        src = base + self.regs.get(self.base + regs.DMATRFFBOFFS, 0)
        dst = self.regs.get(self.base + regs.DMATRFMOFFS, 0) & 0xFFFFFF
        mem = self.imem if cmd >> 4 & 1 else self.dmem
        mem[dst:dst + BLOCK] = self.read_host(src, BLOCK)
        if cmd >> 4 & 1 and cmd >> 2 & 3:
            self.imem_secure.add(dst // BLOCK)

    # ---- RISC-V registers, BROM, start ------------------------------------------------------

    def _riscv_read(self, r: int) -> int:
        if r == regs.RISCV_BCR_CTRL:
            value = self.regs.get(self.riscv + r, 0) & ~1
            if self.riscv_core and self.state != "riscv-running":
                return value  # VALID once the booter runs the core (see the module)
            if self.bcr_valid_left > 0:
                self.bcr_valid_left -= 1
                return value
            return value | 1
        if r == regs.RISCV_CPUCTL:
            if self.state == "riscv-running":
                return 1 << 7
            return 1 << 4 if self.state == "halted" else 0
        return self.regs.get(self.riscv + r, 0)

    def _riscv_write(self, r: int, value: int) -> None:
        if r == regs.RISCV_BCR_CTRL:
            self.riscv_core = bool(value >> 4 & 1)
            self.bcr_valid_left = 1
            value &= ~1
        self.regs[self.riscv + r] = value

    def reg(self, r: int, riscv: bool = False) -> int:
        """A register's stored value, for tests (no side effects)."""
        return self.regs.get((self.riscv if riscv else self.base) + r, 0)

    def _halt(self, mailbox0: int | None = None, why: str = "") -> None:
        if mailbox0 is not None:
            self.regs[self.base + regs.MAILBOX0] = mailbox0
        if why:
            self.log.append(why)
        self.state = "running"
        self.run_left = 1

    def _start(self) -> None:
        if self.state == "running":
            return
        if self.riscv_core:
            self.starts.append("riscv")
            self.state = "riscv-running"
            return
        self.starts.append("falcon")
        if self.reg(regs.MOD_SEL, riscv=True) & 0xFF != 1:
            self._halt(BROM_FAILED, "start without MOD_SEL RSA3K: no HS boot")
            return
        sig_at = self.reg(regs.BROM_PARAADDR0, riscv=True)
        sig = bytes(self.dmem[sig_at:sig_at + 384])
        ucode = self.reg(regs.BROM_CURR_UCODE_ID, riscv=True) & 0xFF
        if not self.reg(regs.BROM_ENGIDMASK, riscv=True) & self.engine_bit:
            self._halt(BROM_FAILED, "BROM_ENGIDMASK does not name this engine")
        elif self.ucode_id is not None and ucode != self.ucode_id:
            self._halt(BROM_FAILED, f"BROM_CURR_UCODE_ID {ucode} is not {self.ucode_id}")
        elif sig not in self.signatures:
            self._halt(BROM_FAILED, f"signature at DMEM 0x{sig_at:x} is not accepted")
        elif ucode not in self.programs:
            self._halt(BROM_FAILED, f"no program for ucode id {ucode}")
        elif self.reg(regs.FALCON_RM) != self.boot0():
            self._halt(RM_MISMATCH, f"FALCON_RM 0x{self.reg(regs.FALCON_RM):08x} is not "
                       f"NV_PMC_BOOT_0 0x{self.boot0():08x}")
        else:
            self.log.append(f"hs run ucode {ucode}")
            self.state = "running"
            self.run_left = self.run_polls
            self.programs[ucode](self)

    def mailbox(self, i: int) -> int:
        return self.regs.get(self.base + (regs.MAILBOX0, regs.MAILBOX1)[i], 0)

    def set_mailbox(self, i: int, value: int) -> None:
        self.regs[self.base + (regs.MAILBOX0, regs.MAILBOX1)[i]] = value

    def halt_riscv(self) -> None:
        """GSP-RM's LibOS suspending after UNLOADING_GUEST_DRIVER: the RISC-V core halts
        (RISCV_CPUCTL reads HALTED, no longer ACTIVE_STAT)."""
        self.state = "halted"
        self.log.append("riscv halted")

    def start_riscv(self) -> None:
        """What booter_load does to the GSP on real hardware: its RISC-V core runs."""
        self.riscv_core = True
        self.regs[self.riscv + regs.RISCV_BCR_CTRL] = 1 << 4
        self.state = "riscv-running"
