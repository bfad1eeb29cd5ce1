"""A simulated GA102 with synthetic firmware, scripted to boot, and its stop."""

from __future__ import annotations

from collections.abc import Callable

import firmware_builders as fb
import sim

from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot import gspmem
from rig_nv_pci.boot.stop import stop_gsp
from rig_nv_pci.firmware import chips, layout
from rig_nv_pci.gsp import rpc, sysinfo

FB_SIZE = 8 << 30


GSP_FUSE = sim.regs.FUSE_GSP_UCODE1_VERSION


SEC_FUSE = sim.regs.FUSE_SEC2_UCODE1_VERSION


class Rig:
    """A simulated GA102 with a synthetic VBIOS, booter and WPR meta, scripted to boot; GPUs
    given one ``host`` lie on one machine (sim.HostMemory)."""

    def __init__(self, host: sim.HostMemory | None = None) -> None:
        self.sv = fb.build_vbios()
        self.sb = fb.build_booter()
        self.gpu = sim.SimGpu(vbios=self.sv.data, host=host or sim.HostMemory())
        g = self.gpu
        g.fuses[GSP_FUSE + 4 * (self.sv.ucode_id - 1)] = 0b10  # fuse version 2
        g.gsp.signatures = {self.sv.signatures[1]}  # versions 0b0110: 2 is the second
        g.gsp.ucode_id = self.sv.ucode_id
        g.gsp.programs[self.sv.ucode_id] = sim.fwsec_program(
            g, self.sv.mapper_offset, self.sv.cmd_in_buffer_offset)
        g.fuses[SEC_FUSE + 4 * (self.sb.ucode_id - 1)] = 0b1  # fuse version 1
        g.sec2.signatures = {self.sb.signatures[2 - 1 - 1]}
        g.sec2.ucode_id = self.sb.ucode_id
        g.sec2.programs[self.sb.ucode_id] = sim.booter_program(g)
        self.plan = layout.fb_layout(chips.AMPERE, FB_SIZE, 0x800000, 0x10000)
        sysmem = layout.Sysmem(radix3_root=0x1000, elf_size=0x800000, bootloader=0x2000,
                               bootloader_size=0x10000, code_offset=0, data_offset=0x100,
                               manifest_offset=0x200)
        self.meta = g.host.alloc_dma(0x1000)
        packed = layout.wpr_meta(self.plan, sysmem).pack()
        self.meta.data[:len(packed)] = packed
        self.bar0 = g.bar0()

    def boot(self, timeout_s: float = 0.2) -> boot.Booted:
        return boot.boot(self.bar0, booter_load=self.sb.data, frts_offset=self.plan.frts_offset,
                         wpr_meta_address=self.meta.bus, alloc=self.gpu.host.alloc_dma,
                         libos_args=0x1_2345_6000, timeout_s=timeout_s)


GSP_IMAGE = b"\x7f" * 0x5000


BOOTLOADER = b"\xb0" * 0x2000


def gsp_rig(*, host: sim.HostMemory | None = None, **fw: object
            ) -> tuple[Rig, sim.GspFirmware, gspmem.GspMemory]:
    r = Rig(host)
    firmware = sim.GspFirmware(r.gpu, **fw).install()  # type: ignore[arg-type]
    plan = layout.fb_layout(chips.AMPERE, FB_SIZE, len(GSP_IMAGE), len(BOOTLOADER))
    memory = gspmem.build(r.gpu.host.alloc_dma, image=GSP_IMAGE, bootloader=BOOTLOADER,
                          code_offset=0, data_offset=0x1000, manifest_offset=0x1800,
                          signature=b"\x5e" * 0x1000, plan=plan,
                          doorbell=boot.doorbell(r.bar0), name="GPU 0")
    return r, firmware, memory


def system_of(r: Rig) -> sysinfo.SystemInfo:
    g = r.gpu
    return sysinfo.SystemInfo(g.bar0_address, g.bar1_address, g.bar3_address, domain=0, bus=0x41,
                              devfn=0, vendor=0x10DE, device=0x2204, subsystem_vendor=0x10DE,
                              subsystem_device=0x1454, revision=0xA1)


def run_boot(r: Rig, memory: gspmem.GspMemory, init_timeout_s: float = 1.0, *,
             system: sysinfo.SystemInfo | None = None,
             on_event: Callable[[rpc.Incoming], None] | None = None) -> boot.GspBooted:
    return boot.boot_gsp(r.bar0, name="GPU 0", booter_load=r.sb.data, memory=memory,
                         alloc=r.gpu.host.alloc_dma, system=system or system_of(r),
                         timeout_s=0.2, init_timeout_s=init_timeout_s, on_event=on_event)


UNLOAD_UCODE_ID = 4


def stop_rig(*, host: sim.HostMemory | None = None, **fw: object
             ) -> tuple[Rig, sim.GspFirmware, gspmem.GspMemory, fb.SyntheticBooter]:
    """:func:`gsp_rig` with a booter_unload (ucode id 4) SEC2 accepts."""
    r, firmware, memory = gsp_rig(host=host, **fw)
    unload = fb.build_booter(meta=(1, 1, UNLOAD_UCODE_ID))
    g = r.gpu
    g.sec2.ucode_id = None  # SEC2 runs both booters, each under its own ucode id
    g.fuses[SEC_FUSE + 4 * (UNLOAD_UCODE_ID - 1)] = 0b1
    g.sec2.programs[UNLOAD_UCODE_ID] = sim.booter_unload_program(g)
    return r, firmware, memory, unload


def stop(r: Rig, booted: boot.GspBooted, unload: fb.SyntheticBooter) -> None:
    stop_gsp(r.bar0, booted, name="GPU 0", booter_unload=unload.data,
             alloc=r.gpu.host.alloc_dma, timeout_s=0.2, unload_timeout_s=0.1,
             suspend_timeout_s=0.05)


FMC_IMAGE = bytes(range(256)) * 0x15 + b"\xfe" * 0x123  # not a multiple of 4 KiB

