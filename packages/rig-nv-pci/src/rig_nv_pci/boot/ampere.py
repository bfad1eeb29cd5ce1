"""The Ampere/Ada GSP boot up to a running GSP RISC-V core, through BAR 0 (kgspBootstrap_TU102
and what precedes it in open-gpu-kernel-modules 570.144).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/boot-ampere.md."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

from rig_edge import RigError
from rig_nv.rm import RMError
from rig_nv_pci.boot.booted import Booted, GspBooted
from rig_nv_pci.boot.falcon import GSP, OS, SEC2, DmaBuffer, Falcon, FalconError, HsUcode
from rig_nv_pci.boot.gspmem import GspMemory
from rig_nv_pci.firmware import chips, fwimage, vbios
from rig_nv_pci.gsp import rpc, static_info, sysinfo
from rig_nv_pci.gsp.queue import QUEUE_HEAD, QueueError
from rig_nv_pci.gsp.sequencer import Sequencer, SequencerError, SequencerEvents
from rig_pci import Window

# dev_fb.h (turing/tu102): WPR2's bounds, bits 31:4 holding the address >> 12 (ALIGNMENT 0xc)
NV_PFB_PRI_MMU_WPR2_ADDR_LO = 0x001FA824
WPR2_ALIGNMENT = 12
# dev_gc6_island.h / dev_gc6_island_addendum.h (ampere/ga102)
NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_PRIV_LEVEL_MASK = 0x00118128
PLM_READ_PROTECTION_LEVEL0 = 1 << 0  # _ENABLE: level 0 may read
NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_0_GFW_BOOT = 0x00118234
GFW_BOOT_PROGRESS_COMPLETED = 0xFF  # _PROGRESS 7:0
# dev_bus.h (turing/tu102) NV_PBUS_VBIOS_SCRATCH(i) = 0x1400 + 4i; kernel_gsp_frts_tu102.c:
# index 0xE holds NV_VBIOS_FWSECLIC_FRTS_ERR_CODE in 31:16
NV_PBUS_VBIOS_SCRATCH_0E = 0x1400 + 4 * 0xE
# kernel_gsp_frts_tu102.c: index 0x15 (NV_VBIOS_FWSECLIC_SCRATCH_INDEX_15) holds
# NV_VBIOS_FWSECLIC_SB_ERR_CODE in 15:0 (nouveau nvkm_gsp_fwsec_sb reads the same 0x1454 & 0xffff)
NV_PBUS_VBIOS_SCRATCH_15 = 0x1400 + 4 * 0x15
# nouveau nvkm/subdev/bios/shadowrom.c, nova-core vbios.rs: the PROM window
NV_PROM_DATA = 0x300000
VBIOS_CHUNK = 0x10000

GFW_TIMEOUT_S = 4.0


class BootError(RigError):
    """A step of the boot failed; the message names it and what the GPU showed."""


Alloc = Callable[[int], DmaBuffer | None]


def _wpr2(bar0: Window) -> tuple[int, int]:
    return (bar0.read32(NV_PFB_PRI_MMU_WPR2_ADDR_LO),
            bar0.read32(chips.NV_PFB_PRI_MMU_WPR2_ADDR_HI))


def wpr2_range(bar0: Window) -> tuple[int, int] | None:
    """WPR2's (start, end) in bytes of FB as its registers hold them (end is the start of its
    last 4 KiB page), or ``None`` when it is down."""
    lo, hi = _wpr2(bar0)
    if not chips.wpr2_up(hi):
        return None
    return (lo >> 4) << WPR2_ALIGNMENT, (hi >> 4) << WPR2_ALIGNMENT


def check_wpr2_down(bar0: Window) -> None:
    lo, hi = _wpr2(bar0)
    if chips.wpr2_up(hi):
        raise BootError(f"its protected memory (WPR2) is already up (NV_PFB_PRI_MMU_WPR2_ADDR_LO "
                        f"0x{lo:08x}, _HI 0x{hi:08x}): an earlier boot left it; reset the GPU")


def wait_gfw_boot(bar0: Window, timeout_s: float = GFW_TIMEOUT_S) -> None:
    """Wait for the boot ROM (GFW) to finish; raises :class:`BootError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0
    while True:
        plm = bar0.read32(NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_PRIV_LEVEL_MASK)
        progress = bar0.read32(NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_0_GFW_BOOT)
        if plm & PLM_READ_PROTECTION_LEVEL0 and progress & 0xFF == GFW_BOOT_PROGRESS_COMPLETED:
            return
        if time.monotonic() >= deadline:
            raise BootError(
                f"its boot ROM did not complete within {timeout_s} s (GFW boot progress "
                f"0x{progress & 0xFF:02x}, not 0xff; PRIV_LEVEL_MASK 0x{plm:08x})")
        time.sleep(pause)
        pause = min(pause * 2 or 1e-5, 1e-3)


def read_vbios(bar0: Window) -> tuple[bytes, vbios.Vbios]:
    """The VBIOS read through the PROM window in 64 KiB steps until it parses (at most
    :data:`vbios.MAX_VBIOS`), and what :func:`vbios.parse` found in it."""
    data = bytearray()
    last: vbios.VbiosError | None = None
    while len(data) < vbios.MAX_VBIOS:
        at = len(data)
        for off in range(at, at + VBIOS_CHUNK, 4):
            data += bar0.read32(NV_PROM_DATA + off).to_bytes(4, "little")
        try:
            return bytes(data), vbios.parse(bytes(data))
        except vbios.VbiosError as e:
            last = e
    raise BootError(f"its VBIOS (read through the PROM window) has no usable FWSEC: {last}")


def _buffer(alloc: Alloc, image: bytes, what: str) -> DmaBuffer:
    buf = alloc(len(image))
    if buf is None:
        raise BootError(f"no DMA memory for {what} (0x{len(image):x} bytes)")
    buf.view()[:len(image)] = image
    return buf


def fwsec_ucode(fw: vbios.Fwsec) -> HsUcode:
    """How FWSEC loads (kgspParseFwsecUcodeFromVbiosImg, descriptor v3): IMEM from 0 of the
    image, DMEM from its IMEMLoadSize; the signature at PKCDataOffset."""
    d = fw.desc
    return HsUcode(code_offset=0, imem_size=d.imem_load_size, imem_pa=d.imem_phys_base,
                   imem_va=d.imem_virt_base, data_offset=d.imem_load_size,
                   dmem_size=d.dmem_load_size, dmem_pa=d.dmem_phys_base,
                   sig_dmem_offset=d.pkc_data_offset, engine_id_mask=d.engine_id_mask,
                   ucode_id=d.ucode_id)


def booter_ucode(b: fwimage.Booter) -> HsUcode:
    """How a booter loads (kernel_gsp_booter.c): its app code to IMEM 0 tagged from the app's
    offset, its OS data to DMEM 0, the signature at the patch location less the data offset."""
    return HsUcode(code_offset=b.load.app_code_offset, imem_size=b.load.app_code_size,
                   imem_pa=0, imem_va=b.load.app_code_offset, data_offset=b.load.os_data_offset,
                   dmem_size=b.load.os_data_size, dmem_pa=0,
                   sig_dmem_offset=b.dmem_signature_offset, engine_id_mask=b.engine_id,
                   ucode_id=b.ucode_id)


def _run_fwsec(gsp: Falcon, fw: vbios.Fwsec, command: int, argument: bytes, alloc: Alloc,
               what: str) -> None:
    """FWSEC with ``command`` in its DMEM mapper's init_cmd and ``argument`` in its command
    buffer (s_vbiosPatchInterfaceData), the signature for the GSP's fuse version patched in,
    run heavy-secure on the reset GSP falcon (kernel_gsp_frts_tu102.c: s_prepareForFwsec_TU102
    and kgspExecuteFwsec_TU102 up to kgspExecuteHsFalcon, shared by FRTS and SB). Raises
    :class:`BootError` naming ``what`` if it does not halt."""
    image = fw.patched(command, argument, gsp.fuse_version(fw.desc.ucode_id))
    buf = _buffer(alloc, image, what)
    try:
        gsp.reset()
        gsp.run_hs(buf, fwsec_ucode(fw))
    except FalconError as e:
        raise BootError(f"{what} failed: {e}") from e


def run_fwsec_frts(gsp: Falcon, bar0: Window, fw: vbios.Fwsec, frts_offset: int,
                   alloc: Alloc) -> tuple[int, int]:
    """FWSEC-FRTS on the GSP falcon; WPR2's range after it. Raises :class:`BootError` if it
    does not halt, reports an FRTS error, or leaves WPR2 down or elsewhere."""
    _run_fwsec(gsp, fw, vbios.CMD_FRTS, vbios.frts_command(frts_offset), alloc, "FWSEC-FRTS")
    scratch = bar0.read32(NV_PBUS_VBIOS_SCRATCH_0E)
    if scratch >> 16:
        raise BootError(f"FWSEC-FRTS failed: FRTS error code 0x{scratch >> 16:x} "
                        f"(NV_PBUS_VBIOS_SCRATCH(0xE) 0x{scratch:08x}; {gsp.state()})")
    lo, hi = _wpr2(bar0)
    if not chips.wpr2_up(hi):
        raise BootError(f"FWSEC-FRTS ran but WPR2 is not up (NV_PFB_PRI_MMU_WPR2_ADDR_LO "
                        f"0x{lo:08x}, _HI 0x{hi:08x}; {gsp.state()})")
    if lo >> 4 != frts_offset >> WPR2_ALIGNMENT:
        raise BootError(f"FWSEC-FRTS put WPR2 at 0x{(lo >> 4) << 12:x}, not at the FRTS offset "
                        f"0x{frts_offset:x} (NV_PFB_PRI_MMU_WPR2_ADDR_LO 0x{lo:08x})")
    got = wpr2_range(bar0)
    assert got is not None
    return got


def run_fwsec_sb(gsp: Falcon, bar0: Window, fw: vbios.Fwsec, alloc: Alloc) -> None:
    """FWSEC-SB on the GSP falcon, which a stop runs after resetting the GSP and before
    booter_unload "to put back PreOsApps" (kgspPrepareForFwsecSb_TU102 then
    kgspExecuteFwsec_TU102, from kgspTeardown_TU102; nouveau nvkm_gsp_fwsec_sb). It differs
    from FRTS as s_prepareForFwsec_TU102 and kgspExecuteFwsec_TU102 have it: the
    command is FALCON_APPLICATION_INTERFACE_DMEM_MAPPER_V3_CMD_SB (0x19) and its argument a
    bare FWSECLIC_READ_VBIOS_DESC (no FRTS region); afterwards the boot ROM's PLM must let
    level 0 read (GFW PLM lowered) and its progress read COMPLETED, and the error code is
    NV_PBUS_VBIOS_SCRATCH(0x15) bits 15:0 (not 0xE's 31:16); WPR2 is not checked. Raises
    :class:`BootError` naming what failed."""
    _run_fwsec(gsp, fw, vbios.CMD_SB, vbios.read_vbios_desc(), alloc, "FWSEC-SB")
    plm = bar0.read32(NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_PRIV_LEVEL_MASK)
    if not plm & PLM_READ_PROTECTION_LEVEL0:
        raise BootError(f"FWSEC-SB failed: the boot ROM's PLM was not lowered "
                        f"(NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_PRIV_LEVEL_MASK 0x{plm:08x})")
    progress = bar0.read32(NV_PGC6_AON_SECURE_SCRATCH_GROUP_05_0_GFW_BOOT)
    if progress & 0xFF != GFW_BOOT_PROGRESS_COMPLETED:
        raise BootError(f"FWSEC-SB failed: the boot ROM's progress is 0x{progress & 0xFF:02x}, "
                        f"not COMPLETED 0xff")
    scratch = bar0.read32(NV_PBUS_VBIOS_SCRATCH_15)
    if scratch & 0xFFFF:
        raise BootError(f"FWSEC-SB failed: SB error code 0x{scratch & 0xFFFF:x} "
                        f"(NV_PBUS_VBIOS_SCRATCH(0x15) 0x{scratch:08x}; {gsp.state()})")


def run_booter_load(sec2: Falcon, booter: bytes, wpr_meta_address: int, alloc: Alloc) -> None:
    """booter_load on SEC2, the signature patched for SEC2's fuse version, GspFwWprMeta's bus
    address in its mailboxes. Raises :class:`BootError` naming MAILBOX0 on failure."""
    b = fwimage.parse_booter(booter)
    image = b.patched(sec2.fuse_version(b.ucode_id))
    buf = _buffer(alloc, image, "booter_load")
    try:
        sec2.reset()
        m0, m1 = sec2.run_hs(buf, booter_ucode(b), wpr_meta_address & 0xFFFFFFFF,
                             wpr_meta_address >> 32)
    except FalconError as e:
        raise BootError(f"booter_load failed: {e}") from e
    if m0 != 0:
        raise BootError(f"booter_load failed with error 0x{m0:08x} in SEC2's MAILBOX0 "
                        f"(MAILBOX1 0x{m1:08x})")


def boot(bar0: Window, *, booter_load: bytes, frts_offset: int, wpr_meta_address: int,
         alloc: Alloc, libos_args: int = 0, app_version: int = 0,
         timeout_s: float = GFW_TIMEOUT_S) -> Booted:
    """Steps 1-6 of the module's docstring on the GPU behind ``bar0``, with DMA memory from
    ``alloc``; GspFwWprMeta (with its FRTS offset ``frts_offset``) already lies at
    ``wpr_meta_address``; ``app_version`` is the GSP bootloader's RM_RISCV_UCODE_DESC
    appVersion. Returns when the GSP's RISC-V core runs."""
    check_wpr2_down(bar0)
    wait_gfw_boot(bar0, timeout_s)
    _, rom = read_vbios(bar0)
    gsp, sec2 = Falcon(bar0, GSP, timeout_s), Falcon(bar0, SEC2, timeout_s)
    after_frts = run_fwsec_frts(gsp, bar0, rom.fwsec, frts_offset, alloc)
    try:
        gsp.reset_into_riscv()
    except FalconError as e:
        raise BootError(f"the GSP could not be reset into RISC-V: {e}") from e
    gsp.wr(0x040, libos_args & 0xFFFFFFFF)  # NV_PGSP_FALCON_MAILBOX0 (dev_gsp.h)
    gsp.wr(0x044, libos_args >> 32)  # NV_PGSP_FALCON_MAILBOX1
    run_booter_load(sec2, booter_load, wpr_meta_address, alloc)
    gsp.wr(OS, app_version)  # NV_PFALCON_FALCON_OS (kgspBootstrap_TU102 "Program FALCON_OS")
    if not gsp.riscv_active():
        raise BootError(f"booter_load succeeded but the GSP's RISC-V core is not running "
                        f"({gsp.state()})")
    return Booted(rom.fwsec, after_frts, wpr2_range(bar0))


INIT_DONE_TIMEOUT_S = 10.0


def doorbell(bar0: Window) -> Callable[[], None]:
    """The command queue's doorbell: 0 written to NV_PGSP_QUEUE_HEAD(0)
    (kgspSetCmdQueueHead_TU102), for :func:`rig_nv_pci.boot.gspmem.build`."""
    return lambda: bar0.write32(QUEUE_HEAD, 0)


# What NVIDIA's Linux CPU-RM puts in every GPU's registry, which SET_REGISTRY hands GSP-RM
# (arch/nvalloc/unix/src/osinit.c initUnixSpecificRegistry: "By default, enable GPU reset on
# Unix"); tinygrad sends the same two
REGISTRY = {"RMSecBusResetEnable": 1, "RMForcePcieConfigSave": 1}
# g_os_nvoc.h: PACKED_REGISTRY_TABLE {NvU32 size, numEntries; PACKED_REGISTRY_ENTRY[]}, an
# entry {NvU32 nameOffset; NvU8 type; NvU32 data, length} (16 bytes, natural alignment), the
# names after the entries (osPackageRegistry); REGISTRY_TABLE_ENTRY_TYPE_DWORD 1
REGISTRY_ENTRY = struct.Struct("<IB3xII")
REGISTRY_TABLE_ENTRY_TYPE_DWORD = 1


def registry(dwords: dict[str, int] = REGISTRY) -> bytes:
    """The PACKED_REGISTRY_TABLE of ``dwords``, each a DWORD entry named NUL-terminated."""
    head = 8 + REGISTRY_ENTRY.size * len(dwords)
    entries, names = b"", b""
    for name, value in dwords.items():
        entries += REGISTRY_ENTRY.pack(head + len(names), REGISTRY_TABLE_ENTRY_TYPE_DWORD,
                                       value, 4)
        names += name.encode() + b"\0"
    return struct.pack("<II", head + len(names), len(dwords)) + entries + names


def boot_gsp(bar0: Window, *, name: str, booter_load: bytes, memory: GspMemory, alloc: Alloc,
             system: sysinfo.SystemInfo, app_version: int = 0,
             timeout_s: float = GFW_TIMEOUT_S, init_timeout_s: float = INIT_DONE_TIMEOUT_S,
             on_event: Callable[[rpc.Incoming], None] | None = None) -> GspBooted:
    """Steps 1-8 of the module's docstring on the GPU ``name`` behind ``bar0``: ``memory``
    (:func:`rig_nv_pci.boot.gspmem.build`, its doorbell :func:`doorbell`) holds the GSP's host
    memory and queues, ``system`` the GPU's place on the bus for GSP_SET_SYSTEM_INFO,
    ``app_version`` the bootloader's appVersion (NV_PGSP_FALCON_OS after booter_load, and a
    sequencer's CORE_RESUME). Returns once
    GSP-RM reported GSP_INIT_DONE and made the root client; raises :class:`BootError` naming
    ``name`` otherwise (a sequencer the GSP sent that failed or was malformed included)."""
    channel, sequencers = start_channel(bar0, name=name, memory=memory, system=system,
                                        app_version=app_version, timeout_s=timeout_s,
                                        init_timeout_s=init_timeout_s, on_event=on_event)
    try:
        booted = boot(bar0, booter_load=booter_load, frts_offset=memory.meta.frts_offset,
                      wpr_meta_address=memory.wpr_meta, alloc=alloc,
                      libos_args=memory.libos_args, app_version=app_version,
                      timeout_s=timeout_s)
    except BootError as e:
        raise BootError(f"{name}: {e}") from e
    done, rm, static = finish(bar0, name, channel, memory, init_timeout_s, sequencers.failed)
    return GspBooted(booted, memory, channel, done, rm, static, sequencers)


def start_channel(bar0: Window, *, name: str, memory: GspMemory, system: sysinfo.SystemInfo,
                  app_version: int, timeout_s: float, init_timeout_s: float,
                  on_event: Callable[[rpc.Incoming], None] | None
                  ) -> tuple[rpc.Rpc, SequencerEvents]:
    """Step 7, shared by every boot (kgspInitRm posts these before kgspBootstrap): the RPC
    channel over ``memory``'s queues, whose events run GSP_RUN_CPU_SEQUENCER against BAR 0
    (the returned handler, its failures in its ``failed``) and hand the rest to ``on_event``,
    with GSP_SET_SYSTEM_INFO and SET_REGISTRY posted."""
    sequencer = Sequencer(bar0, gsp=Falcon(bar0, GSP, timeout_s),
                          sec2=Falcon(bar0, SEC2, timeout_s), libos_args=memory.libos_args,
                          app_version=app_version)
    events = SequencerEvents(sequencer, on_event)
    channel = rpc.Rpc(memory.queues, on_event=events, timeout_s=init_timeout_s)
    for function, payload in ((rpc.Function.GSP_SET_SYSTEM_INFO, system.encode()),
                              (rpc.Function.SET_REGISTRY, registry())):
        try:
            channel.post(function, payload)
        except QueueError as e:
            raise BootError(f"{name}: {function.name} could not be queued: {e}") from e
    return channel, events


def finish(bar0: Window, name: str, channel: rpc.Rpc, memory: GspMemory, timeout_s: float,
           failed: list[SequencerError], started_by: str = "booter_load"
           ) -> tuple[rpc.Incoming, rpc.RpcRM, static_info.StaticInfo]:
    """Step 8, shared by every boot once the GSP's RISC-V core runs: GSP_INIT_DONE
    (kgspWaitForRmInitDone), GET_GSP_STATIC_INFO (kgspInitRm asks for it next, before any
    client exists), then the root client; ``started_by`` names what started the GSP, for the
    timeout's message."""
    done = _wait_init_done(bar0, name, channel, memory, timeout_s, failed, started_by)
    try:
        static = static_info.get_static_info(channel)
    except (RMError, QueueError, rpc.RpcTimeout, static_info.StaticInfoError) as e:
        raise BootError(f"{name}: the GSP booted but GET_GSP_STATIC_INFO failed: {e}") from e
    try:
        rm = rpc.RpcRM.open(channel)
    except (RMError, QueueError, rpc.RpcTimeout) as e:
        raise BootError(f"{name}: the GSP booted but refused the root client: {e}") from e
    return done, rm, static


def _wait_init_done(bar0: Window, name: str, channel: rpc.Rpc, memory: GspMemory,
                    timeout_s: float, failed: list[SequencerError],
                    started_by: str = "booter_load") -> rpc.Incoming:
    """GSP_INIT_DONE, waited for in slices so that a failed sequencer ends the wait at once
    (the GSP waits for the CPU to finish it and would never report INIT_DONE)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return channel.wait_for(rpc.Event.GSP_INIT_DONE,
                                    max(0.0, min(0.05, deadline - time.monotonic())))
        except rpc.RpcTimeout:
            pass
        except SequencerError:
            pass  # recorded in ``failed``
        except RigError as e:
            raise BootError(f"{name}: waiting for GSP_INIT_DONE failed: {e}") from e
        if failed:
            raise BootError(f"{name}: a sequencer the GSP sent before GSP_INIT_DONE failed: "
                            f"{failed[0]}") from failed[0]
        if time.monotonic() >= deadline:
            break
    mailbox = bar0.read32(GSP.base + 0x040)
    raise BootError(
        f"{name}: the GSP did not report GSP_INIT_DONE within {timeout_s} s after "
        f"{started_by} started it (status queue "
        f"{'created' if memory.queues.linked else 'never created'} by the GSP; "
        f"NV_PGSP_FALCON_MAILBOX0 0x{mailbox:08x})")
