"""Register numbers of the simulated GPU, written from NVIDIA's published headers
(open-gpu-kernel-modules 570.144, src/common/inc/swref/published/) on their own: nothing here
comes from rig_nv_pci, so that a mistake in the driver's numbers does not pass by being shared.
"""

from __future__ import annotations

# nv_ref.h
PMC_BOOT_0 = 0x000000
PMC_BOOT_42 = 0x000A00

# turing/tu102/dev_fb.h: WPR2 bounds, VAL in bits 31:4 holding the address >> 12 (ALIGNMENT 0xc)
WPR2_ADDR_LO = 0x1FA824
WPR2_ADDR_HI = 0x1FA828

# ampere/ga102/dev_gc6_island.h and _addendum.h: the boot ROM's progress (GFW_BOOT_PROGRESS 7:0,
# COMPLETED 0xff) and the mask whose READ_PROTECTION_LEVEL0 (bit 0) lets level 0 read it
AON_SCRATCH_GROUP_05_PLM = 0x118128
AON_SCRATCH_GROUP_05_0 = 0x118234

# ampere/ga102/dev_gc6_island_addendum.h: NV_USABLE_FB_SIZE_IN_MB, an alias of
# NV_PGC6_AON_SECURE_SCRATCH_GROUP_42 (0x001183a4) where the VBIOS's devinit leaves the usable FB
# size in MiB (nouveau ga102_fb_vidmem_size reads it; every chip after GA100 uses it)
USABLE_FB_SIZE_IN_MB = 0x1183A4

# turing/tu102/dev_bus.h NV_PBUS_VBIOS_SCRATCH(i); kernel_gsp_frts_tu102.c: index 0xE holds the
# FRTS error code in 31:16
VBIOS_SCRATCH_0E = 0x1400 + 4 * 0xE
# ... and NV_VBIOS_FWSECLIC_SCRATCH_INDEX_15 the SB error code (NV_VBIOS_FWSECLIC_SB_ERR_CODE) in
# 15:0 (nouveau nvkm_gsp_fwsec_sb: 0x001400 + 0x15 * 4, & 0xffff)
VBIOS_SCRATCH_15 = 0x1400 + 4 * 0x15

# ampere/ga100/dev_fuse.h: ucode fuse versions, one register per ucode id from 1
FUSE_SEC2_UCODE1_VERSION = 0x824140
FUSE_GSP_UCODE1_VERSION = 0x8241C0

# dev_bus.ref.txt NV_PBUS_BAR0_WINDOW (BASE 23:0 in 64 KiB units, TARGET 25:24); from Hopper on
# pri_nv_xal_ep.h NV_XAL_EP_BAR0_WINDOW (BASE 22:0); dev_ram.h NV_PRAMIN, the 1 MiB they show
BAR0_WINDOW = 0x1700
XAL_EP_BAR0_WINDOW = 0x10FD40
PRAMIN, PRAMIN_SIZE = 0x700000, 0x100000

# nouveau nvkm/subdev/bios/shadowrom.c: the PROM window of the VBIOS
PROM = 0x300000
PROM_SIZE = 0x100000

# Falcon engines: ga102/dev_gsp.h (NV_PGSP 0x110000), dev_sec_pri.h (NV_PSEC 0x840000),
# dev_falcon_second_pri.h (NV_FALCON2_*_BASE), dev_gsp_addendum.h / dev_sec_addendum.h (FBIF)
GSP_BASE, GSP_RISCV, GSP_FBIF = 0x110000, 0x111000, 0x110600
SEC_BASE, SEC_RISCV, SEC_FBIF = 0x840000, 0x841000, 0x840600

# ga102/dev_falcon_v4.h, relative to the engine's base
MAILBOX0, MAILBOX1 = 0x040, 0x044
OS = 0x080
FALCON_RM = 0x084  # NV_PFALCON_FALCON_RM: what the HS ucode checks against NV_PMC_BOOT_0
HWCFG2 = 0x0F4  # RISCV 10:10, MEM_SCRUBBING 12:12 (0 = done); _addendum.h RESET_READY 31:31
CPUCTL = 0x100  # STARTCPU 1:1 (write), HALTED 4:4, ALIAS_EN 6:6
BOOTVEC = 0x104
HWCFG = 0x108  # IMEM_SIZE 8:0 in 256-byte blocks
DMACTL = 0x10C  # REQUIRE_CTX 0:0, DMEM_SCRUBBING 1:1, IMEM_SCRUBBING 2:2
DMATRFBASE = 0x110
DMATRFMOFFS = 0x114
DMATRFCMD = 0x118  # FULL 0:0, IDLE 1:1, SEC 3:2, IMEM 4:4, WRITE 5:5, SIZE 10:8, CTXDMA 14:12
DMATRFFBOFFS = 0x11C
DMATRFBASE1 = 0x128
CPUCTL_ALIAS = 0x130
IMEMC, IMEMD, IMEMT = 0x180, 0x184, 0x188  # port 0; OFFS 7:2, BLK 23:8, AINCW 24, SECURE 28
DMEMC, DMEMD = 0x1C0, 0x1C4  # port 0
ENGINE = 0x3C0  # NV_PGSP_FALCON_ENGINE / NV_PSEC_FALCON_ENGINE: RESET 0:0
MEMC_AINCR = 1 << 25  # nouveau nvkm/falcon/v1.c: read auto-increment

# ga102/dev_falcon_second_pri.h, relative to the RISC-V base
MOD_SEL = 0x180
BROM_CURR_UCODE_ID = 0x198
BROM_ENGIDMASK = 0x19C
BROM_PARAADDR0 = 0x210
# ga102/dev_riscv_pri.h
RISCV_CPUCTL = 0x388  # HALTED 4:4, ACTIVE_STAT 7:7
RISCV_BCR_CTRL = 0x668  # VALID 0:0, CORE_SELECT 4:4 (1 RISC-V), BRFETCH 8:8

# ga102/dev_fbif_v4.h, relative to the FBIF base
FBIF_TRANSCFG0 = 0x000  # TARGET 1:0 (1 coherent sysmem), MEM_TYPE 2:2 (1 physical)
FBIF_CTL = 0x024  # ALLOW_PHYS_NO_CTX 7:7

# src/nvidia/arch/nvalloc/common/inc/gsp/gsp_fw_wpr_meta.h: GspFwWprMeta's fields the booter reads
META_MAGIC = 0xDC3AAE21371A60B3
META_OFFSETS = {"magic": 0, "revision": 8, "gspFwWprStart": 112, "frtsOffset": 152,
                "frtsSize": 160, "gspFwWprEnd": 168}

# ga102/dev_gsp.h: NV_PGSP_QUEUE_HEAD(i) = 0x110C00 + 8i; the CPU writes 0 to (0) as the doorbell
# of the GSP's command queue (kgspSetCmdQueueHead_TU102)
GSP_QUEUE_HEAD0 = 0x110C00

# ampere/ga100/dev_bus.h: NV_PBUS_SW_SCRATCH(i) = 0x1400 + 4i, 64 of them (0xE is the VBIOS's)
SW_SCRATCH = 0x1400
# ampere/ga102/dev_gc6_island.h / _addendum.h: BOOT_STAGE_3_HANDOFF 26:26, VALUE_DONE 1 (SEC2
# reports GSP-RM reloaded)
BSI_SECURE_SCRATCH_14 = 0x1180F8

# NV_THERM_I2CS_SCRATCH, per chip: hopper/gh100/dev_therm.h 0x000200bc, blackwell/gb202/
# dev_therm.h 0x00ad00bc (gb100's keeps GH100's); dev_therm_addendum.h: _FSP_BOOT_COMPLETE_STATUS
# reads _SUCCESS 0xff once the FSP has booted. On GB202 nothing answers at GH100's address.
THERM_I2CS_SCRATCH = 0x0200BC
GB202_THERM_I2CS_SCRATCH = 0xAD00BC
# hopper/gh100/dev_fsp_pri.h, channel i at + 8i: EMEMC (OFFS 7:2, BLK 15:8, AINCW 24, AINCR 25),
# EMEMD, the host -> FSP queue and the FSP -> host message queue
FSP_EMEMC, FSP_EMEMD = 0x8F2AC0, 0x8F2AC4
FSP_QUEUE_HEAD, FSP_QUEUE_TAIL = 0x8F2C00, 0x8F2C04
FSP_MSGQ_HEAD, FSP_MSGQ_TAIL = 0x8F2C80, 0x8F2C84

# The PCI config space's mirror in BAR 0, which GSP-RM reads config space through
# (GspSystemInfo.pciConfigMirrorBase): ampere/ga100/dev_nv_xve.h NV_PCFG 0x00088FFF:0x00088000
# on GA10x/AD10x; hopper/gh100/dev_xtl_ep_pri.h NV_EP_PCFGM 0x92FFF:0x92000 from GH100 on
PCFG_MIRROR = 0x088000
EP_PCFGM_MIRROR = 0x092000
