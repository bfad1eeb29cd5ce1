"""The Ampere/Ada GSP stop: GSP-RM unloaded and the boot's protected memory (WPR2) taken down,
as NVIDIA's driver unloads (open-gpu-kernel-modules 570.144: kgspUnloadRm_IMPL in
kernel_gsp.c, kgspTeardown_TU102 and kgspWaitForProcessorSuspend_TU102 in
kernel_gsp_tu102.c, kgspExecuteFwsec_TU102 in kernel_gsp_frts_tu102.c,
kgspExecuteBooterUnloadIfNeeded_TU102 in kernel_gsp_booter_tu102.c;
nouveau r535_gsp_fini).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/boot-stop.md."""

from __future__ import annotations

import time

from rig_edge import Misuse, RigError
from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot.booted import Booted, GspBooted
from rig_nv_pci.boot.falcon import GSP, MAILBOX0, SEC2, Falcon, FalconError
from rig_nv_pci.firmware import chips, fwimage
from rig_nv_pci.gsp import payloads, rpc
from rig_nv_pci.gsp.queue import QueueError
from rig_pci import Window

# kernel_gsp_tu102.c _kgspIsProcessorSuspended: LIBOS_INTERRUPT_PROCESSOR_SUSPENDED in
# NV_PFALCON_FALCON_MAILBOX0 (compared for equality; nouveau r535_gsp_fini likewise since its
# "== 0x80000000" fix)
PROCESSOR_SUSPENDED = 0x80000000
# kernel_gsp_booter_tu102.c kgspExecuteBooterUnloadIfNeeded_TU102: mailbox0 = mailbox1 = 0xFF
# for an unload that is neither a suspend nor a GC6 entry
BOOTER_UNLOAD_MAILBOX = 0xFF
SUSPEND_TIMEOUT_S = 2.0  # nouveau r535_gsp_fini: nvkm_msec(device, 2000, ...)
UNLOAD_TIMEOUT_S = 10.0  # the RPC channel's default


class StopError(RigError):
    """Steps of a stop failed; the message names the GPU and each failed step. ``steps``
    holds the failed steps' messages; ``lost`` is true when the GSP's firmware may still be
    loaded, WPR2 is still up, or FWSEC-SB failed (the VBIOS's pre-OS applications were not put
    back, which the boot ROM's run after a reset does), the spec's lost GPU: its next open
    resets it first."""

    def __init__(self, message: str, steps: tuple[str, ...], lost: bool) -> None:
        super().__init__(message)
        self.steps = steps
        self.lost = lost


def run_booter_unload(sec2: Falcon, booter: bytes, alloc: boot.Alloc) -> None:
    """booter_unload on SEC2 (kgspExecuteBooterUnloadIfNeeded_TU102 for a normal unload):
    SEC2 reset, the signature patched for its fuse version, 0xff in both mailboxes. Raises
    :class:`rig_nv_pci.boot.ampere.BootError` naming MAILBOX0 on failure."""
    b = fwimage.parse_booter(booter)
    image = b.patched(sec2.fuse_version(b.ucode_id))
    buf = alloc(len(image))
    if buf is None:
        raise boot.BootError(f"no DMA memory for booter_unload (0x{len(image):x} bytes)")
    buf.view()[:len(image)] = image
    try:
        sec2.reset()
        m0, m1 = sec2.run_hs(buf, boot.booter_ucode(b), BOOTER_UNLOAD_MAILBOX,
                             BOOTER_UNLOAD_MAILBOX)
    except FalconError as e:
        raise boot.BootError(f"booter_unload failed: {e}") from e
    if m0 != 0:
        raise boot.BootError(f"booter_unload failed with error 0x{m0:08x} in SEC2's MAILBOX0 "
                             f"(MAILBOX1 0x{m1:08x})")


def wait_processor_suspended(gsp: Falcon, timeout_s: float = SUSPEND_TIMEOUT_S) -> None:
    """Wait for NV_PGSP_FALCON_MAILBOX0 to read LIBOS_INTERRUPT_PROCESSOR_SUSPENDED
    (kgspWaitForProcessorSuspend_TU102); raises :class:`rig_nv_pci.boot.ampere.BootError`."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0
    while (mailbox := gsp.rd(MAILBOX0)) != PROCESSOR_SUSPENDED:
        if time.monotonic() >= deadline:
            raise boot.BootError(
                f"the GSP did not suspend within {timeout_s} s (MAILBOX0 0x{mailbox:08x}, not "
                f"0x{PROCESSOR_SUSPENDED:08x}; {gsp.state()})")
        time.sleep(pause)
        pause = min(pause * 2 or 1e-5, 1e-3)


def stop_gsp(bar0: Window, booted: GspBooted, *, name: str,
             booter_unload: bytes | None = None, alloc: boot.Alloc | None = None,
             family: chips.Family | None = None, timeout_s: float = boot.GFW_TIMEOUT_S,
             unload_timeout_s: float = UNLOAD_TIMEOUT_S,
             suspend_timeout_s: float = SUSPEND_TIMEOUT_S) -> None:
    """Stop the GSP that :func:`rig_nv_pci.boot.ampere.boot_gsp` booted on the GPU ``name`` behind
    ``bar0``: steps 1-7 of the module's docstring, with DMA memory from ``alloc`` for the
    ``booter_unload`` image. ``unload_timeout_s`` bounds the wait for UNLOADING_GUEST_DRIVER's
    reply (the FREE waits the channel's own timeout), ``suspend_timeout_s`` the wait for the
    GSP to suspend, ``timeout_s`` each falcon wait. Afterwards the GPU can be
    booted again (WPR2 is down). ``booted.booted`` must be the :class:`.booted.Booted`
    of a booter boot (its FWSEC runs FWSEC-SB). Raises :class:`StopError` naming ``name`` and
    every step that failed, after attempting every step still safe to attempt (the module's
    docstring).

    For a ``family`` that boots through the FSP (Hopper, Blackwell: ``booter_unload`` and
    ``alloc`` unused) steps 4-7 are kgspTeardown_GH100's instead: wait for the GSP's RISC-V
    core to halt (kflcnWaitForHaltRiscv_GA102: NV_PRISCV_RISCV_CPUCTL.HALTED), "to allow ACR
    and GSP FMC to finish shutdown"; no reset, no FWSEC-SB, no booter_unload (there is none),
    and WPR2 is not checked (whether it is down after the halt is not confirmed by NVIDIA's
    sources)."""
    fsp_boot = family is not None and family.boot == "fsp"
    if not fsp_boot and (booter_unload is None or alloc is None):
        raise Misuse(f"{name}: a booter stop needs booter_unload and alloc")
    if not fsp_boot and not isinstance(booted.booted, Booted):
        raise Misuse(f"{name}: a booter stop needs the booter boot's FWSEC (boot.Booted), not "
                     f"{type(booted.booted).__name__}")
    failed: list[str] = []
    causes: list[BaseException] = []
    unloaded = True  # whether GSP-RM acknowledged the unload and suspended

    def fail(step: str, e: BaseException) -> None:
        failed.append(f"{step}: {e}")
        causes.append(e)

    rpcs_ok = True
    try:
        booted.rm.close()
    except (rpc.RpcTimeout, QueueError) as e:
        rpcs_ok = False
        fail("freeing the root client", e)
    except RigError as e:  # the GSP refused the FREE (RMError): it still answers
        fail("freeing the root client", e)
    if rpcs_ok:
        try:
            booted.channel.call(rpc.Function.UNLOADING_GUEST_DRIVER,
                                payloads.encode_unloading(False, False, 0),
                                timeout_s=unload_timeout_s)
        except RigError as e:
            unloaded = False
            fail("UNLOADING_GUEST_DRIVER", e)
    else:
        unloaded = False
        failed.append("UNLOADING_GUEST_DRIVER: not sent (the GSP stopped answering RPCs)")
    gsp, sec2 = Falcon(bar0, GSP, timeout_s), Falcon(bar0, SEC2, timeout_s)
    try:
        wait_processor_suspended(gsp, suspend_timeout_s)
    except boot.BootError as e:
        unloaded = False
        fail("waiting for the GSP to suspend", e)
    if fsp_boot:
        try:
            gsp.wait_riscv_halt(timeout_s)
        except FalconError as e:
            unloaded = False
            fail("waiting for the GSP's RISC-V core to halt", e)
        if failed:
            raise StopError(f"{name}: stopping the GSP failed: " + "; ".join(failed),
                            tuple(failed), lost=not unloaded) from (
                                causes[0] if causes else None)
        return
    assert booter_unload is not None and alloc is not None
    assert isinstance(booted.booted, Booted)
    sb_failed = False
    try:
        gsp.reset()
    except FalconError as e:
        fail("resetting the GSP falcon", e)
    try:  # kgspTeardown_TU102: FWSEC-SB after the reset, booter_unload whatever it returned
        boot.run_fwsec_sb(gsp, bar0, booted.booted.fwsec, alloc)
    except boot.BootError as e:
        sb_failed = True
        fail("FWSEC-SB", e)
    if boot.wpr2_range(bar0) is not None:  # kgspExecuteBooterUnloadIfNeeded_TU102's skip
        try:
            run_booter_unload(sec2, booter_unload, alloc)
        except boot.BootError as e:
            fail("booter_unload", e)
    wpr2_up = boot.wpr2_range(bar0) is not None
    if wpr2_up:
        lo = bar0.read32(boot.NV_PFB_PRI_MMU_WPR2_ADDR_LO)
        hi = bar0.read32(chips.NV_PFB_PRI_MMU_WPR2_ADDR_HI)
        failed.append(f"WPR2 is still up after booter_unload (NV_PFB_PRI_MMU_WPR2_ADDR_LO "
                      f"0x{lo:08x}, _HI 0x{hi:08x})")
    if failed:
        error = StopError(f"{name}: stopping the GSP failed: " + "; ".join(failed),
                          tuple(failed), lost=wpr2_up or not unloaded or sb_failed)
        raise error from (causes[0] if causes else None)
