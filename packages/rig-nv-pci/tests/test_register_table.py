"""Issue 26's table: per chip, each register address and constant the PCI path uses, the NVIDIA
header or CPU-RM function it comes from (open-gpu-kernel-modules 570.144), and its value as
read there by hand. Each row is checked against the code (rig_nv_pci) and, where the simulator
models the register, against the simulator (tests/sim), which keeps numbers of its own: a
number one side gets wrong fails here even where the two agree with each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import sim
from sim import regs
from sim import runlists as sim_runlists

from rig_nv_pci import held
from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot import blackwell as boot_fsp
from rig_nv_pci.boot import falcon, fsp
from rig_nv_pci.firmware import chips
from rig_nv_pci.gsp import queue, sysinfo
from rig_nv_pci.path import mmu, runlists
from rig_nv_pci.path import pci as path

ALL = "GA10x, AD10x, GB20x"


@dataclass(frozen=True)
class Row:
    name: str
    chips: str
    value: int
    source: str
    code: Callable[[], int]
    sim: Callable[[], int] | None = None


def _gb202_therm() -> int:
    assert sim.gb202().fsp is not None
    return sim.gb202().fsp.therm  # type: ignore[union-attr]


TABLE: tuple[Row, ...] = (
    Row("NV_PMC_BOOT_0", ALL, 0x000000, "nv_ref.h", lambda: falcon.NV_PMC_BOOT_0,
        lambda: regs.PMC_BOOT_0),
    Row("NV_PMC_BOOT_42", ALL, 0x000A00, "nv_ref.h", lambda: chips.NV_PMC_BOOT_42,
        lambda: regs.PMC_BOOT_42),
    Row("NV_PFB_PRI_MMU_WPR2_ADDR_LO", ALL, 0x1FA824, "turing/tu102/dev_fb.h "
        "(kgspIsWpr2Up_TU102; GH100's calls it)", lambda: boot.NV_PFB_PRI_MMU_WPR2_ADDR_LO,
        lambda: regs.WPR2_ADDR_LO),
    Row("NV_PFB_PRI_MMU_WPR2_ADDR_HI", ALL, 0x1FA828, "turing/tu102/dev_fb.h",
        lambda: chips.NV_PFB_PRI_MMU_WPR2_ADDR_HI, lambda: regs.WPR2_ADDR_HI),
    Row("NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_PRIV_LEVEL_MASK", "GA10x, AD10x", 0x118128,
        "ampere/ga102/dev_gc6_island.h (gpuWaitForGfwBootComplete)",
        lambda: boot.NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_PRIV_LEVEL_MASK,
        lambda: regs.AON_SCRATCH_GROUP_05_PLM),
    Row("NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_0_GFW_BOOT", "GA10x, AD10x", 0x118234,
        "ampere/ga102/dev_gc6_island_addendum.h",
        lambda: boot.NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_0_GFW_BOOT,
        lambda: regs.AON_SCRATCH_GROUP_05_0),
    Row("NV_USABLE_FB_SIZE_IN_MB", ALL, 0x1183A4, "ampere/ga102/dev_gc6_island_addendum.h "
        "(NV_PGC6_AON_SECURE_SCRATCH_GROUP_42; kmemsysReadUsableFbSize_GA102, every chip "
        "after GA100)", lambda: held.NV_USABLE_FB_SIZE_IN_MB,
        lambda: regs.USABLE_FB_SIZE_IN_MB),
    Row("NV_PBUS_VBIOS_SCRATCH(0xE)", "GA10x, AD10x", 0x1438, "turing/tu102/dev_bus.h "
        "(kernel_gsp_frts_tu102.c: FRTS error 31:16)", lambda: boot.NV_PBUS_VBIOS_SCRATCH_0E,
        lambda: regs.VBIOS_SCRATCH_0E),
    Row("NV_PBUS_VBIOS_SCRATCH(0x15)", "GA10x, AD10x", 0x1454, "kernel_gsp_frts_tu102.c "
        "(SB error 15:0)", lambda: boot.NV_PBUS_VBIOS_SCRATCH_15,
        lambda: regs.VBIOS_SCRATCH_15),
    Row("NV_PROM_DATA", "GA10x, AD10x", 0x300000, "nouveau shadowrom.c, nova-core vbios.rs",
        lambda: boot.NV_PROM_DATA, lambda: regs.PROM),
    Row("NV_PGSP (falcon base)", ALL, 0x110000, "ampere/ga102/dev_gsp.h",
        lambda: falcon.GSP.base, lambda: regs.GSP_BASE),
    Row("NV_FALCON2_GSP_BASE", ALL, 0x111000, "ampere/ga102/dev_falcon_second_pri.h",
        lambda: falcon.GSP.riscv, lambda: regs.GSP_RISCV),
    Row("NV_PSEC (falcon base)", "GA10x, AD10x", 0x840000, "ampere/ga102/dev_sec_pri.h",
        lambda: falcon.SEC2.base, lambda: regs.SEC_BASE),
    Row("NV_FALCON2_SEC_BASE", "GA10x, AD10x", 0x841000,
        "ampere/ga102/dev_falcon_second_pri.h", lambda: falcon.SEC2.riscv,
        lambda: regs.SEC_RISCV),
    Row("NV_PFALCON_FALCON_MAILBOX0", ALL, 0x040, "ampere/ga102/dev_falcon_v4.h",
        lambda: falcon.MAILBOX0, lambda: regs.MAILBOX0),
    Row("NV_PFALCON_FALCON_OS", ALL, 0x080, "ampere/ga102/dev_falcon_v4.h",
        lambda: falcon.OS, lambda: regs.OS),
    Row("NV_PFALCON_FALCON_RM", ALL, 0x084, "ampere/ga102/dev_falcon_v4.h "
        "(kflcnReset_TU102 writes NV_PMC_BOOT_0)", lambda: falcon.RM,
        lambda: regs.FALCON_RM),
    Row("NV_PFALCON_FALCON_HWCFG2", ALL, 0x0F4, "ampere/ga102/dev_falcon_v4.h",
        lambda: falcon.HWCFG2, lambda: regs.HWCFG2),
    Row("NV_PFALCON_FALCON_HWCFG2_RESET_READY", ALL, 1 << 31,
        "ampere/ga102/dev_falcon_v4_addendum.h (kflcnPreResetWait_GA102)",
        lambda: falcon.HWCFG2_RESET_READY),
    Row("NV_PFALCON_FALCON_CPUCTL", ALL, 0x100, "ampere/ga102/dev_falcon_v4.h",
        lambda: falcon.CPUCTL, lambda: regs.CPUCTL),
    Row("NV_PFALCON_FALCON_DMATRFCMD", ALL, 0x118, "ampere/ga102/dev_falcon_v4.h",
        lambda: falcon.DMATRFCMD, lambda: regs.DMATRFCMD),
    Row("NV_PGSP_FALCON_ENGINE", ALL, 0x3C0, "ampere/ga102/dev_gsp.h (kgspResetHw_TU102)",
        lambda: falcon.ENGINE, lambda: regs.ENGINE),
    Row("FLCN_RESET_PROPAGATION_DELAY_COUNT", ALL, 10, "falcon_common.h",
        lambda: falcon.RESET_PROPAGATION_READS),
    Row("NV_PRISCV_RISCV_CPUCTL", ALL, 0x388, "ampere/ga102/dev_riscv_pri.h",
        lambda: falcon.RISCV_CPUCTL, lambda: regs.RISCV_CPUCTL),
    Row("NV_PRISCV_RISCV_BCR_CTRL", ALL, 0x668, "ampere/ga102/dev_riscv_pri.h",
        lambda: falcon.RISCV_BCR_CTRL, lambda: regs.RISCV_BCR_CTRL),
    Row("NV_PGSP_QUEUE_HEAD(0)", ALL, 0x110C00, "ampere/ga102/dev_gsp.h "
        "(kgspSetCmdQueueHead_TU102)", lambda: queue.QUEUE_HEAD,
        lambda: regs.GSP_QUEUE_HEAD0),
    Row("NV_THERM_I2CS_SCRATCH", "GH100", 0x0200BC, "hopper/gh100/dev_therm.h "
        "(kfspWaitForSecureBoot_GH100)", lambda: chips.HOPPER.fsp_ready[0]  # type: ignore[index]
        , lambda: regs.THERM_I2CS_SCRATCH),
    Row("NV_THERM_I2CS_SCRATCH", "GB20x", 0xAD00BC, "blackwell/gb202/dev_therm.h "
        "(kfspWaitForSecureBoot_GB202)", lambda: chips.BLACKWELL.fsp_ready[0],  # type: ignore[index]
        _gb202_therm),
    Row("kfspWaitForSecureBoot (ms)", "GB20x", 5000, "kern_fsp_gb202.c: gpuScaleTimeout(5000000)",
        lambda: int(chips.BLACKWELL.fsp_ready[1] * 1000)),  # type: ignore[index]
    Row("NV_PFSP_EMEMC(0)", "GB20x", 0x8F2AC0, "hopper/gh100/dev_fsp_pri.h (kern_fsp_gh100.c, "
        "GB20x's HAL)", lambda: fsp.NV_PFSP_EMEMC, lambda: regs.FSP_EMEMC),
    Row("NV_PFSP_QUEUE_HEAD(0)", "GB20x", 0x8F2C00, "hopper/gh100/dev_fsp_pri.h",
        lambda: fsp.NV_PFSP_QUEUE_HEAD, lambda: regs.FSP_QUEUE_HEAD),
    Row("NV_PFSP_MSGQ_HEAD(0)", "GB20x", 0x8F2C80, "hopper/gh100/dev_fsp_pri.h",
        lambda: fsp.NV_PFSP_MSGQ_HEAD, lambda: regs.FSP_MSGQ_HEAD),
    Row("NV_PFSP_FALCON_COMMON_SCRATCH_GROUP_2(0)", "GB20x", 0x8F0320,
        "blackwell/gb202/dev_fsp_pri.h", lambda: fsp.NV_PFSP_FALCON_COMMON_SCRATCH_GROUP_2),
    Row("HWCFG2_RISCV_BR_PRIV_LOCKDOWN", "GB20x", 1 << 13, "hopper/gh100/dev_falcon_v4.h",
        lambda: boot_fsp.HWCFG2_RISCV_BR_PRIV_LOCKDOWN),
    Row("pciConfigMirrorBase", "GA10x, AD10x", 0x88000, "ampere/ga100/dev_nv_xve.h NV_PCFG "
        "(kbifGetPciConfigSpacePriMirror_GM107)", lambda: sysinfo.PCI_CONFIG_MIRROR_BASE,
        lambda: regs.PCFG_MIRROR),
    Row("pciConfigMirrorBase", "GB20x", 0x92000, "hopper/gh100/dev_xtl_ep_pri.h NV_EP_PCFGM "
        "(kbifGetPciConfigSpacePriMirror_GH100)",
        lambda: sysinfo.PCI_CONFIG_MIRROR_BASE_FSP, lambda: regs.EP_PCFGM_MIRROR),
    Row("NV_VIRTUAL_FUNCTION (usermode page in BAR 0)", ALL, 0xBB0000,
        "turing/tu102/dev_vm.h at NV_VIRTUAL_FUNCTION_FULL_PHYS_OFFSET 0xB80000",
        lambda: path.USERMODE_BAR0, lambda: sim.gsp_rm.USERMODE_BAR0),
    Row("NVC361_NOTIFY_CHANNEL_PENDING", ALL, 0x90, "clc361.h",
        lambda: 0x90, lambda: sim_runlists.DOORBELL),
    Row("NV_CTRL_VF_DOORBELL_RUNLIST_ID (shift)", ALL, 16, "ampere/ga100/dev_ctrl.h 22:16, "
        "gb202/dev_vm.h", lambda: runlists.RUNLIST_SHIFT),
    Row("NV_VIRTUAL_FUNCTION_DOORBELL_RUNLIST_DOORBELL_ENABLE", "GB20x", 1 << 30,
        "blackwell/gb202/dev_vm.h 30:30 (kfifoGenerateWorkSubmitTokenHal_GB202)",
        lambda: runlists.RUNLIST_DOORBELL_ENABLE,
        lambda: sim_runlists.RUNLIST_DOORBELL_ENABLE),
    Row("NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE", ALL, 0x20801112, "ctrl2080fifo.h",
        lambda: runlists.NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE,
        lambda: sim_runlists.CTRL_GET_DEVICE_INFO_TABLE),
    Row("NV_PBUS_BAR0_WINDOW", "GA10x, AD10x", 0x1700, "dev_bus.ref.txt (PRAMIN's base)",
        lambda: mmu.NV_PBUS_BAR0_WINDOW,
        lambda: regs.BAR0_WINDOW),
    Row("NV_XAL_EP_BAR0_WINDOW", "GB20x", 0x10FD40, "pri_nv_xal_ep.h",
        lambda: mmu.NV_XAL_EP_BAR0_WINDOW,
        lambda: regs.XAL_EP_BAR0_WINDOW),
    Row("NV_PRAMIN", ALL, 0x700000, "dev_ram.h", lambda: mmu.NV_PRAMIN, lambda: regs.PRAMIN),
    Row("NV_MMU_VER3_PDE_PCF_VALID_CACHED_ATS_NOT_ALLOWED", "GB20x", 2,
        "hopper/gh100/dev_mmu.h (gmmu_walk.c: no ATS in the VA space)",
        lambda: mmu.PDE_PCF_VALID_CACHED_ATS_NOT_ALLOWED),
)


@pytest.mark.parametrize("row", TABLE, ids=[f"{r.name} ({r.chips})" for r in TABLE])
def test_the_code_and_the_simulator_use_the_headers_numbers(row: Row) -> None:
    assert row.code() == row.value, f"rig_nv_pci's {row.name} is not {row.source}'s"
    if row.sim is not None:
        assert row.sim() == row.value, f"the simulator's {row.name} is not {row.source}'s"
