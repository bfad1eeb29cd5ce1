"""The Blackwell (GB20x) GSP boot through the FSP, up to GSP_INIT_DONE and the root client
(docs/hopper-boot.md; open-gpu-kernel-modules 570.144 kgspBootstrap_GH100 and what precedes
it in kernel_gsp_gh100.c, kfspPrepareBootCommands_GH100 / kfspSendBootCommands_GH100 in
kern_fsp_gh100.c; GB20x uses these HALs with cotPayloadVersion 2, g_kern_fsp_nvoc.c).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/boot-blackwell.md."""

from __future__ import annotations

from collections.abc import Callable

from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot import fmc_params as hopper
from rig_nv_pci.boot import fsp
from rig_nv_pci.boot.ampere import Alloc, BootError
from rig_nv_pci.boot.booted import FmcBooted, GspBooted
from rig_nv_pci.boot.falcon import (
    GSP,
    HWCFG2,
    MAILBOX0,
    MAILBOX1,
    OS,
    DmaBuffer,
    Falcon,
    poll,
)
from rig_nv_pci.boot.gspmem import GspMemory, in_one_run
from rig_nv_pci.firmware import chips, fwimage, layout
from rig_nv_pci.gsp import rpc, sysinfo
from rig_pci import Window

PAGE = 0x1000
# kfspWaitForGspTargetMaskReleased_GH100 / _kfspIsGspTargetMaskReleased: while the GSP is
# locked to the FSP, BAR 0 reads of it return 0xBADF41xx (or 0)
TARGET_MASK_LOCKED = 0xBADF4100
TARGET_MASK_LOCKED_MASK = 0xFFFFFF00
# hopper/gh100/dev_falcon_v4.h NV_PFALCON_FALCON_HWCFG2_RISCV_BR_PRIV_LOCKDOWN 13:13 (1 LOCK)
HWCFG2_RISCV_BR_PRIV_LOCKDOWN = 1 << 13
# kfspPrepareBootCommands_GH100: the FRTS offset from the end of FB starts at
# memmgrGetFBEndReserveSizeEstimate; with a PMU reservation it grows by
# kfspGetExtraReservedMemorySize and the PMU's size, aligned to 2 MiB. Per family
# (g_mem_mgr_nvoc.c, g_kern_fsp_nvoc.c): GH100 memmgrGetFBEndReserveSizeEstimate_GM107 2 MiB
# and kfspGetExtraReservedMemorySize_GH100 4 KiB ("Bug: 3763996"); GB10x/GB20x
# memmgrGetFBEndReserveSizeEstimate_GB100 0x220000 and the default 0 (_4a4dee)
FB_END_RESERVE = {"gh100": (0x200000, 0x1000), "gb202": (0x220000, 0)}
FRTS_ALIGN = 0x200000


def frts_vidmem_offset(meta: layout.WprMeta, family: chips.Family = chips.BLACKWELL) -> int:
    """NVDM_PAYLOAD_COT.frtsVidmemOffset, counted from the end of FB, as
    kfspPrepareBootCommands_GH100 computes it for a first boot (kgspGetWprEndMargin 0): the
    family's FB end reserve estimate, plus its extra reservation and the PMU's, aligned up to
    2 MiB, when there is a PMU reservation (:data:`FB_END_RESERVE`)."""
    estimate, extra = FB_END_RESERVE[family.name]
    if not meta.pmu_reserved_size:
        return estimate
    return layout.align_up(estimate + extra + meta.pmu_reserved_size, FRTS_ALIGN)


def _dma(alloc: Alloc, data: bytes, what: str) -> DmaBuffer:
    size = layout.align_up(max(len(data), 1), PAGE)
    buf = alloc(size)
    if buf is None:
        raise BootError(f"no DMA memory for {what} (0x{size:x} bytes)")
    if buf.length < size or buf.bus_address(0) % PAGE or not in_one_run(buf, size):
        raise BootError(f"the DMA memory for {what} (0x{size:x} bytes at bus address "
                        f"0x{buf.bus_address(0):x}) is not 4 KiB-aligned and contiguous")
    view = buf.view()
    view[:size] = data.ljust(size, b"\0")
    return buf


def _target_mask_released(value: int) -> bool:
    return value != 0 and value & TARGET_MASK_LOCKED_MASK != TARGET_MASK_LOCKED


def wait_gsp_released(bar0: Window, boot_params_address: int, timeout_s: float) -> None:
    """Step 6's polls up to RISC-V active, less the FALCON_OS write; raises
    :class:`BootError` naming the register that did not change."""
    gsp = Falcon(bar0, GSP, timeout_s)
    ok, hwcfg2 = poll(lambda: gsp.rd(HWCFG2), _target_mask_released, timeout_s)
    if not ok:  # kfspWaitForGspTargetMaskReleased_GH100
        raise BootError(f"the FSP did not release the GSP's PRIV target mask within "
                        f"{timeout_s} s (NV_PGSP_FALCON_HWCFG2 0x{hwcfg2:08x})")

    def released(_: int) -> bool:  # _kgspLockdownReleasedOrFmcError
        m0 = gsp.rd(MAILBOX0)
        if m0 and (gsp.rd(MAILBOX1) << 32 | m0) == boot_params_address:
            return False  # the FMC has not yet taken its arguments' address
        return m0 != 0 or not gsp.rd(HWCFG2) & HWCFG2_RISCV_BR_PRIV_LOCKDOWN

    ok, _ = poll(lambda: 0, released, timeout_s)
    if not ok:
        raise BootError(f"the GSP's FMC did not release its lockdown within {timeout_s} s "
                        f"(HWCFG2.RISCV_BR_PRIV_LOCKDOWN still set; {gsp.state()})")
    m0 = gsp.rd(MAILBOX0)
    if m0:  # "GSP-FMC reported an error": the code is effectively 8-bit
        raise BootError(f"the GSP's FMC reported error 0x{m0 & 0xFF:02x} (NV_PGSP_FALCON_"
                        f"MAILBOX0 0x{m0:08x}; {gsp.state()})")


def boot_fmc(bar0: Window, *, name: str, family: chips.Family, fmc: bytes,
             memory: GspMemory, alloc: Alloc, app_version: int = 0,
             timeout_s: float = fsp.READY_TIMEOUT_S) -> FmcBooted:
    """Steps 1-6 of the module's docstring on the GPU ``name`` behind ``bar0``; ``fmc`` is
    the family's fmc-570.144.bin, ``memory`` built by :func:`rig_nv_pci.boot.gspmem.build` with
    :func:`rig_nv_pci.firmware.layout.fmc_sizes`. The FSP's own boot is awaited at the family's
    register for the family's time (kfspWaitForSecureBoot_GH100 / _GB202), or ``timeout_s``
    where that is shorter than NVIDIA's default wait. Returns once the GSP's RISC-V core
    runs."""
    if family.boot != "fsp" or family.cot_version is None or family.fsp_ready is None:
        raise BootError(f"{name}: {family.architecture} does not boot through the FSP")
    try:
        parsed = fwimage.parse_fmc(fmc, cot_version=family.cot_version)
    except fwimage.FirmwareFormatError as e:
        raise BootError(f"{name}: the FMC firmware is unusable: {e}") from e
    try:
        boot.check_wpr2_down(bar0)
        device = fsp.Fsp(bar0, name, timeout_s=timeout_s, ready=family.fsp_ready)
        device.wait_ready(timeout_s if timeout_s < fsp.READY_TIMEOUT_S else None)
        image = _dma(alloc, bytes(parsed.image.data), "the FMC image")
        params = hopper.fmc_boot_params(memory.wpr_meta, memory.libos_args).pack()
        params_buf = _dma(alloc, params, "GSP_FMC_BOOT_PARAMS")
    except BootError as e:
        raise BootError(f"{name}: {e}") from e
    except fsp.FspError as e:  # already names the GPU
        raise BootError(str(e)) from e
    fmc_address, params_address = image.bus_address(0), params_buf.bus_address(0)
    # kfspSetupGspImages: the hash, key and signature go in zero-padded fields of fixed size
    cot = fsp.cot_payload(
        fmc_address=fmc_address, boot_params_address=params_address,
        hash384=bytes(parsed.hash.data), public_key=bytes(parsed.public_key.data),
        signature=bytes(parsed.signature.data), frts_vidmem_offset=frts_vidmem_offset(
            memory.meta, family), version=family.cot_version)
    try:
        response = device.send_cot(cot, timeout_s)
    except fsp.FspError as e:  # names the GPU, the COT command and the FSP's error code
        raise BootError(str(e)) from e
    try:
        wait_gsp_released(bar0, params_address, timeout_s)
    except BootError as e:
        raise BootError(f"{name}: {e}") from e
    gsp = Falcon(bar0, GSP, timeout_s)
    gsp.wr(OS, app_version)  # kgspBootstrap_GH100: NV_PFALCON_FALCON_OS = appVersion
    if not gsp.riscv_active():
        raise BootError(f"{name}: the FMC released the GSP but its RISC-V core is not running "
                        f"({gsp.state()})")
    return FmcBooted(fmc_address, params_address, cot, response, boot.wpr2_range(bar0),
                     (image, params_buf))


def boot_fsp(bar0: Window, *, name: str, family: chips.Family, fmc: bytes, memory: GspMemory,
             alloc: Alloc, system: sysinfo.SystemInfo, app_version: int = 0,
             timeout_s: float = fsp.READY_TIMEOUT_S,
             init_timeout_s: float = boot.INIT_DONE_TIMEOUT_S,
             on_event: Callable[[rpc.Incoming], None] | None = None) -> GspBooted:
    """Steps 1-7 of the module's docstring: :func:`boot_fmc` between the posted
    SET_SYSTEM_INFO/SET_REGISTRY and GSP_INIT_DONE, as :func:`rig_nv_pci.boot.ampere.boot_gsp` has
    booter_load there. Returns once GSP-RM reported GSP_INIT_DONE and made the root client;
    raises :class:`BootError` naming ``name`` otherwise."""
    channel, sequencers = boot.start_channel(bar0, name=name, memory=memory, system=system,
                                             app_version=app_version, timeout_s=timeout_s,
                                             init_timeout_s=init_timeout_s, on_event=on_event)
    booted = boot_fmc(bar0, name=name, family=family, fmc=fmc, memory=memory, alloc=alloc,
                      app_version=app_version, timeout_s=timeout_s)
    done, rm, static = boot.finish(bar0, name, channel, memory, init_timeout_s,
                                   sequencers.failed, started_by="the FMC")
    return GspBooted(booted, memory, channel, done, rm, static, sequencers)
