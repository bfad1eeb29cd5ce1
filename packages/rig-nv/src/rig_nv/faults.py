"""Channel errors as NVIDIA names them (robust-channel errors, the Xid numbers of the kernel log).

Numbers and names from open-gpu-kernel-modules src/common/sdk/nvidia/inc/nverror.h @580.142
(ROBUST_CHANNEL_*). The RM writes the number into a channel's error notifier (NvNotification
index 0 of the memory given as hObjectError: info32 = the number, info16 = the engine type,
status = 0xFFFF), per nvgputypes.h and kernel_rc_notification.c.

For an MMU fault (Xid 31) the RM also keeps, per channel, what the MMU reported
(FIFO_MMU_EXCEPTION_DATA, kchannelFillMmuExceptionInfo in kernel_channel.c, filled where the
fault is serviced: kgmmuServiceMmuFault_GV100), and a client reads it with the channel control
NV906F_CTRL_CMD_GET_MMU_FAULT_INFO (ctrl906f.h, the same in 570.211.01 and 580.142): exported
by every GPFIFO channel class, non-privileged, routed to the GSP (ROUTE_TO_PHYSICAL: its handler,
kchannelCtrlCmdGetMmuFaultInfo_IMPL, is in the GSP firmware, not in the open source; the GSP
services the channel's MMU faults). The header says the record is cleared once read. Its
answer holds the faulting address (the MMU's, at page granularity), the fault type
(NV_PFAULT_FAULT_TYPE_*) and its name, but neither the access type nor the MMU client.

The access type (read, write, atomic, prefetch) the RM keeps per graphics context:
kgrctxRecordMmuFault_IMPL (gpu/gr/kernel_graphics_context.c) puts {faultAddress, faultType,
accessType} of a GPC client's (an SM's) MMU fault in a ring of four in the context's state
(head == tail is empty, so three at most are read back); it is never cleared, only overwritten
by newer faults ("repeat data may be returned", ctrl83dedebug.h). The published CPU-RM records
there only on an SR-IOV guest's path (kern_gmmu_gv100.c, kgmmuServiceMmuFault_GV100); on a GSP
client the GSP services the fault (kgmmuServiceChannelMmuFault_GV100 is a stub in the kernel
module) and the read below is forwarded to the GSP, whose record-keeping is not published: a
GPU test shows whether it answers. The record is read through a GT200_DEBUGGER object
(class/cl83de.h), with its control NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO (ctrl83dedebug.h;
NON_PRIVILEGED, forwarded to the GSP by ksmdbgssnCtrlCmdDebugReadMMUFaultInfo_IMPL,
gpu/gr/kernel_sm_debugger_session_ctrl.c); all of it alike in 570.211.01 and 580.142:

- the object's parent is the device (rmapi/resource_list.h: Parents RS_LIST(classId(Device)),
  flags RS_FLAGS_ALLOC_NON_PRIVILEGED | RS_FLAGS_ALLOC_RPC_TO_ALL: made by the kernel module's
  RM and by the GSP, no access right required), its NV83DE_ALLOC_PARAMETERS
  {hDebuggerClient_Obsolete 0, hAppClient: the client owning the object (0 means the caller),
  hClass3dObject: the compute-class object of the channel whose context is read};
- its constructor (ksmdbgssnConstruct_IMPL, gpu/gr/kernel_sm_debugger_session.c) asks the kernel
  module's RM for RS_ACCESS_DEBUG on that object, a right its owner has (RS_ACCESS_FLAG_ALLOW_OWNER
  on the client, libraries/resserv/src/rs_access_rights.c; an object inherits its client's rights,
  rs_access_map.c), and the GSP for matching security tokens of the two clients (one client
  here): no root, and RmProfilingAdminOnly is not asked (it gates profilers: kern_profiler_v1.c,
  kern_profiler_v2.c, gpu_register_access_map.c);
- it puts the session on the context's debugger list, makes an internal RM client with a device
  and subdevice, and ties itself to the object; it sets no debug mode (SM debug, MMU debug and
  the like are controls of their own) and stops no work. Freeing it undoes all of that
  (ksmdbgssnFreeCallback_IMPL). It needs the context, which lives until its object is freed,
  faulted channel or not.

:func:`channel_fault` makes one only once an MMU fault was found on the compute channel
(nothing of it runs for a device that does not fault), reads, and frees it; any refusal leaves
the :class:`rig_edge.Fault` as it was without it: with the access the fault type implies, if
any. packages/rig-nv-nvidia/tests/test_gpu_faults.py says what an H200's RM answers.

Of an SM exception (Xid 13, ROBUST_CHANNEL_GR_EXCEPTION) the notifier says no more. What the
SMs reported the RM keeps as SM error states, read through the same GT200_DEBUGGER with
NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES (ctrl83dedebug.h, alike in 570.211.01 and
580.142): per SM (numbered as the RM numbers them, 0 to the GPU's SM count less one), the global
and warp error status registers (hwwGlobalEsr, hwwWarpEsr), the warp's PC (hwwWarpEsrPc64), the
address of an address error (hwwEsrAddr), their report masks and, on Hopper, the CGA's; at most
NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL (100) SMs a call, from startingSM (an H200 has 132: two
calls). What the sources say of when the state is recorded:

- the control is NON_PRIVILEGED | ROUTE_TO_PHYSICAL (flags 0x50048,
  g_kernel_sm_debugger_session_nvoc.c): on a GSP client the kernel module forwards it to the
  GSP before any handler of its own runs (rmresControl_Prologue_IMPL, rmapi/resource.c); its own
  handler (ksmdbgssnCtrlCmdDebugReadAllSmErrorStates_IMPL, kernel_sm_debugger_session_ctrl.c)
  serves only a vGPU guest and answers NV_ERR_NOT_SUPPORTED otherwise. The code that records
  the states, the GSP's exception handling, is not published;
- the header says the RM caches the state because the hardware's must be cleared early in the
  exception handling, that a read returns that cache ("stale by design") and that only
  NV83DE_CTRL_CMD_DEBUG_CLEAR_*_SM_ERROR_STATE(S) clears it, and that the read acts on the
  resident graphics context. Nothing published says whether the cache is kept for a context
  no debugger was attached to when the exception came (rig makes its debugger only afterwards:
  a debugger attached beforehand could change how the RM handles the exception). NVIDIA's Tegra
  driver (nvgpu, another RM) records a TSG's SM error state before it asks whether a debugger is
  attached (nvgpu_gr_intr_handle_sm_exception, common/gr/gr_intr.c), which suggests, no more,
  the same of the GSP. test_gpu_faults.py asks an H200's RM.

The warp error's names (NV_PGRAPH_PRI_GPC0_TPC0_SM0_HWW_WARP_ESR_ERROR_*) and the global
register's bits are not in the open kernel modules: numbers from NVIDIA's published nvgpu
headers for Ampere (include/nvgpu/hw/ga100/hw_gr_ga100.h; ga10b alike), with Volta's codes
that Ampere's header lists no more (gv11b). Hopper's header is not published; the RM's Xid 13
logs print the registers beside its names of the errors, and those agree (warp error 9
"Illegal Instruction Encoding", 0xb "Illegal Instruction Parameter", global 0x4 "Multiple
Warp Errors").

:func:`channel_fault` makes the debugger only for an Xid 13 of a device whose compute channel
it knows (nothing of it runs for a device that does not fault), reads every SM's state, frees
it, and names in the Fault the first SM with a warp error (else the first with a global error
other than the pauses the RM makes every SM take): its error and number, its PC, and the
address for the errors of an access. Any refusal, or an answer of no error, leaves the Fault as
it was without it: the notifier's Xid and engine.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rig_edge import RigError
from rig_edge.errors import Fault
from rig_nv.classes import GT200_DEBUGGER
from rig_nv.controls import (
    NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES,
    NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO,
    NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL,
    NV906F_CTRL_CMD_GET_MMU_FAULT_INFO,
)
from rig_nv.layouts import Params

if TYPE_CHECKING:
    from cffi import FFI

    from rig_nv.rm import RM

XID: dict[int, str] = {
    13: "ROBUST_CHANNEL_GR_EXCEPTION",
    14: "ROBUST_CHANNEL_FAKE_ERROR",
    31: "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT",
    32: "ROBUST_CHANNEL_PBDMA_ERROR",
    39: "ROBUST_CHANNEL_CE0_ERROR",
    40: "ROBUST_CHANNEL_CE1_ERROR",
    41: "ROBUST_CHANNEL_CE2_ERROR",
    43: "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
    44: "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW",
    45: "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
    48: "ROBUST_CHANNEL_GPU_ECC_DBE",
    62: "PMU_HALT_ERROR",
    68: "ROBUST_CHANNEL_NVDEC0_ERROR",
    69: "ROBUST_CHANNEL_GR_CLASS_ERROR",
    70: "ROBUST_CHANNEL_CE3_ERROR",
    71: "ROBUST_CHANNEL_CE4_ERROR",
    72: "ROBUST_CHANNEL_CE5_ERROR",
    75: "ROBUST_CHANNEL_CE6_ERROR",
    76: "ROBUST_CHANNEL_CE7_ERROR",
    77: "ROBUST_CHANNEL_CE8_ERROR",
    79: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
    85: "ROBUST_CHANNEL_CE9_ERROR",
    94: "ROBUST_CHANNEL_CONTAINED_ERROR",
    95: "ROBUST_CHANNEL_UNCONTAINED_ERROR",
    119: "GSP_RPC_TIMEOUT",
    120: "GSP_ERROR",
}

# NV2080_ENGINE_TYPE_* (cl2080_notification.h): the engine in a notifier's info16.
ENGINE = {1: "graphics/compute", **{0x09 + i: f"copy engine {i}" for i in range(10)}}


def xid_name(number: int) -> str:
    """NVIDIA's name of a channel error, and its number: "ROBUST_CHANNEL_GR_EXCEPTION (Xid 13)"."""
    return f"{XID.get(number, 'ROBUST_CHANNEL_ERROR')} (Xid {number})"


MMU_FAULT = 31  # ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT

# NV_PFAULT_FAULT_TYPE_* (src/common/inc/swref/published/pascal/gp100/dev_fault.h, alike in
# 570.211.01 and 580.142) named as the RM names them for GH100 (kgmmuGetFaultTypeString_GP100).
FAULT_TYPE = {
    0x0: "FAULT_PDE", 0x1: "FAULT_PDE_SIZE", 0x2: "FAULT_PTE", 0x3: "FAULT_VA_LIMIT_VIOLATION",
    0x4: "FAULT_UNBOUND_INST_BLOCK", 0x5: "FAULT_PRIV_VIOLATION", 0x6: "FAULT_RO_VIOLATION",
    0x8: "FAULT_PITCH_MASK_VIOLATION", 0x9: "FAULT_WORK_CREATION",
    0xA: "FAULT_UNSUPPORTED_APERTURE", 0xB: "FAULT_COMPRESSION_FAILURE",
    0xC: "FAULT_INFO_TYPE_UNSUPPORTED_KIND", 0xD: "FAULT_INFO_TYPE_REGION_VIOLATION",
    0xE: "FAULT_INFO_TYPE_POISONED", 0xF: "FAULT_INFO_TYPE_ATOMIC_VIOLATION",
}
# The access a fault type implies: only a write or an atomic breaks a read-only page (UVM
# cancels those with UVM_FAULT_CANCEL_VA_MODE_WRITE_AND_ATOMIC), only an atomic is an atomic
# violation. A PDE/PTE fault (nothing mapped) says nothing of the access.
ACCESS_OF_TYPE = {0x6: "write or atomic", 0xF: "atomic"}

# NV_PFAULT_ACCESS_TYPE_* (src/common/inc/swref/published/volta/gv100/dev_fault.h; the same
# numbers in blackwell/gb100 and gb202/dev_fault.h): the access the MMU's fault packet carries
# (NVC369_BUF_ENTRY_ACCESS_TYPE, clc369.h) and the RM records. Named after
# kfifoGetFaultAccessTypeString_GV100 (kernel_fifo_gv100.c), which also makes one of
# VIRT_ATOMIC_STRONG (2) and VIRT_ATOMIC_WEAK (4); PHYS_* are accesses without translation.
ACCESS_TYPE = {
    0x0: "read", 0x1: "write", 0x2: "atomic", 0x3: "prefetch", 0x4: "atomic",
    0x8: "physical read", 0x9: "physical write", 0xA: "physical atomic",
    0xB: "physical prefetch",
}
PAGE_SHIFT = 12  # the MMU reports faulting addresses by 4 KiB page


@dataclass(frozen=True)
class MmuFault:
    """A channel's MMU fault as NV906F_CTRL_CMD_GET_MMU_FAULT_INFO answers it."""

    address: int
    kind: str  # the fault type's name, e.g. "FAULT_PDE"
    access: str | None


def decode_mmu_fault(ffi: FFI, p: Any) -> MmuFault | None:
    """The fault an answer (NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS) holds; ``None`` for an
    answer of zeros (no record: nothing faulted on that channel, or it was read already)."""
    address = (int(p.addrHi) << 32) | int(p.addrLo)
    raw = bytes(ffi.buffer(p.faultString)).split(b"\0", 1)[0]
    text = "".join(chr(b) for b in raw if 0x20 <= b < 0x7F).strip()  # printable ASCII only
    fault_type = int(p.faultType)
    if not address and not fault_type and not text:
        return None
    kind = text or FAULT_TYPE.get(fault_type, f"MMU fault type {fault_type}")
    return MmuFault(address, kind, ACCESS_OF_TYPE.get(fault_type))


def read_mmu_fault(rm: RM, ffi: FFI, channel: int) -> MmuFault | None:
    """Channel ``channel``'s last MMU fault from the RM; ``None`` where the RM refuses (any
    :class:`rig_edge.RigError`) or has no record."""
    p = Params(ffi, "NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS")
    try:
        rm.control(channel, NV906F_CTRL_CMD_GET_MMU_FAULT_INFO, p.buf)
    except RigError:
        return None
    return decode_mmu_fault(ffi, p.p)


@dataclass(frozen=True)
class Debuggee:
    """A channel whose graphics context the RM keeps MMU fault records of, with their access
    types: ``graphics_object`` is the channel's compute-class object (the hClass3dObject of a
    GT200_DEBUGGER), ``device`` the device object the debugger is made under."""

    device: int
    channel: int
    graphics_object: int


@dataclass(frozen=True)
class FaultRecord:
    """An entry of NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO's answer
    (NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_ENTRY)."""

    address: int
    fault_type: int  # the RM's FAULT_TYPE (g_kern_gmmu_nvoc.h), numbered as NV_PFAULT_FAULT_TYPE_*
    access_type: int  # NV_PFAULT_ACCESS_TYPE_*

    @property
    def access(self) -> str:
        """The access's name: "read", "write", "atomic", "prefetch", "physical read"..."""
        return ACCESS_TYPE.get(self.access_type, f"access type {self.access_type}")


def read_fault_records(rm: RM, ffi: FFI, debuggee: Debuggee) -> list[FaultRecord]:
    """The MMU faults the RM recorded for ``debuggee``'s graphics context, oldest first.

    Makes a GT200_DEBUGGER on the graphics object, asks it NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO
    and frees it, whatever the control answered. Raises :class:`rig_edge.RigError` (an
    :class:`rig_nv.rm.RMError` with the RM's status where the RM answered) if the object or the
    control is refused; a refused free raises nothing (the object goes with the client).
    """
    made = Params(ffi, "NV83DE_ALLOC_PARAMETERS", hAppClient=rm.client,
                  hClass3dObject=debuggee.graphics_object)
    handle = rm.new_handle()
    rm.alloc(debuggee.device, handle, GT200_DEBUGGER, made.buf)
    try:
        p = Params(ffi, "NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_PARAMS")
        rm.control(handle, NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO, p.buf)
    finally:
        with contextlib.suppress(RigError):
            rm.free(handle)
    entries = p.p.mmuFaultInfoList
    return [FaultRecord(int(e.faultAddress), int(e.faultType), int(e.accessType))
            for e in (entries[i] for i in range(min(int(p.p.count), len(entries))))]


GR_EXCEPTION = 13  # ROBUST_CHANNEL_GR_EXCEPTION

# NV_PGRAPH_PRI_GPC0_TPC0_SM0_HWW_WARP_ESR_ERROR_* (bits 15:0 of the warp error status register):
# nvgpu's hw_gr_ga100.h (Ampere; hw_gr_ga10b.h alike), with the codes only Volta's hw_gr_gv11b.h
# lists (STACK_ERROR, PC_WRAP, STACK_OVERFLOW). Bits 23:16 are the warp's id, 27:24 the kind of
# address error.
WARP_ERROR = {
    0x01: "STACK_ERROR", 0x02: "API_STACK_ERROR", 0x04: "PC_WRAP", 0x05: "MISALIGNED_PC",
    0x06: "PC_OVERFLOW", 0x08: "MISALIGNED_REG", 0x09: "ILLEGAL_INSTR_ENCODING",
    0x0B: "ILLEGAL_INSTR_PARAM", 0x0D: "OOR_REG", 0x0E: "OOR_ADDR", 0x0F: "MISALIGNED_ADDR",
    0x10: "INVALID_ADDR_SPACE", 0x12: "INVALID_CONST_ADDR_LDC", 0x16: "STACK_OVERFLOW",
    0x17: "MMU_FAULT", 0x18: "TEX_FORMAT", 0x19: "TEX_LAYOUT", 0x20: "MMU_NACK", 0x21: "ARRIVE",
}
WARP_ERROR_MASK = 0xFFFF
# The warp errors of a memory access, whose address the RM reports as hwwEsrAddr.
ADDRESS_ERRORS = frozenset({0x0E, 0x0F, 0x10, 0x12, 0x17, 0x20})
# NV_PGRAPH_PRI_GPC0_TPC0_SM0_HWW_GLOBAL_ESR_* bits (hw_gr_ga100.h, hw_gr_gv11b.h): the SM's own
# errors, and the pauses a debugger or the RM's handling makes an SM take (an RM log of one
# SM's warp error shows BPT_PAUSE on every other SM), which say nothing of what went wrong.
GLOBAL_ERROR = {0x4: "MULTIPLE_WARP_ERRORS", 0x10: "BPT_INT", 0x100: "ERROR_IN_TRAP",
                0x1000: "POISON_DATA"}
GLOBAL_PAUSES = 0x20 | 0x40  # BPT_PAUSE, SINGLE_STEP_COMPLETE


@dataclass(frozen=True)
class SmErrorState:
    """An SM's entry of NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES' answer
    (NV83DE_SM_ERROR_STATE_REGISTERS), with the SM's number."""

    sm: int
    global_esr: int  # hwwGlobalEsr
    warp_esr: int  # hwwWarpEsr
    pc: int  # hwwWarpEsrPc64 (the 32-bit hwwWarpEsrPc where that is 0)
    esr_address: int  # hwwEsrAddr
    cga_esr: int = 0  # hwwCgaEsr

    @property
    def warp_error(self) -> int:
        """The warp error's code (NV_PGRAPH_PRI_GPC0_TPC0_SM0_HWW_WARP_ESR_ERROR_*); 0 is NONE."""
        return self.warp_esr & WARP_ERROR_MASK

    @property
    def global_errors(self) -> int:
        """The global register's bits that are errors, not pauses."""
        return self.global_esr & ~GLOBAL_PAUSES

    @property
    def error(self) -> str | None:
        """The SM's error's name: its warp error's (e.g. "MISALIGNED_ADDR"), else its global
        errors' ("BPT_INT", joined by "+"); ``None`` for an SM that reported neither."""
        if self.warp_error:
            return WARP_ERROR.get(self.warp_error, f"warp error 0x{self.warp_error:x}")
        bits = [1 << i for i in range(32) if self.global_errors >> i & 1]
        if not bits:
            return None
        return "+".join(GLOBAL_ERROR.get(b, f"global error 0x{b:x}") for b in bits)

    @property
    def address(self) -> int | None:
        """The address of a warp error that has one (an access: misaligned, out of range...);
        ``None`` for another error, or where the RM reports 0."""
        if self.warp_error in ADDRESS_ERRORS and self.esr_address:
            return self.esr_address
        return None


def read_sm_error_states(rm: RM, ffi: FFI, debuggee: Debuggee, sm_count: int
                         ) -> list[SmErrorState]:
    """The SM error states the RM keeps for ``debuggee``'s channel, SMs 0 to ``sm_count`` - 1.

    Makes a GT200_DEBUGGER on the graphics object, asks it
    NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES (NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL SMs a
    call, hTargetChannel the channel) and frees it, whatever the controls answered. Raises
    :class:`rig_edge.RigError` (an :class:`rig_nv.rm.RMError` with the RM's status where the RM
    answered) if the object or any call is refused; a refused free raises nothing (the object
    goes with the client).
    """
    made = Params(ffi, "NV83DE_ALLOC_PARAMETERS", hAppClient=rm.client,
                  hClass3dObject=debuggee.graphics_object)
    handle = rm.new_handle()
    rm.alloc(debuggee.device, handle, GT200_DEBUGGER, made.buf)
    states: list[SmErrorState] = []
    try:
        for start in range(0, sm_count, NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL):
            n = min(NV83DE_CTRL_DEBUG_MAX_SMS_PER_CALL, sm_count - start)
            p = Params(ffi, "NV83DE_CTRL_DEBUG_READ_ALL_SM_ERROR_STATES_PARAMS",
                       hTargetChannel=debuggee.channel, numSMsToRead=n, startingSM=start)
            rm.control(handle, NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES, p.buf)
            for i in range(n):
                e = p.p.smErrorStateArray[i]
                states.append(SmErrorState(
                    start + i, int(e.hwwGlobalEsr), int(e.hwwWarpEsr),
                    int(e.hwwWarpEsrPc64) or int(e.hwwWarpEsrPc), int(e.hwwEsrAddr),
                    int(e.hwwCgaEsr)))
    finally:
        with contextlib.suppress(RigError):
            rm.free(handle)
    return states


def first_sm_error(states: list[SmErrorState]) -> SmErrorState | None:
    """The first SM with a warp error, else the first with a global error; ``None`` if none."""
    return (next((s for s in states if s.warp_error), None)
            or next((s for s in states if s.global_errors), None))


def sm_error(rm: RM, ffi: FFI, debuggee: Debuggee, sm_count: int) -> SmErrorState | None:
    """The SM error the RM recorded for ``debuggee``'s channel (:func:`first_sm_error`);
    ``None`` where the RM refuses (any :class:`rig_edge.RigError`) or recorded none."""
    try:
        return first_sm_error(read_sm_error_states(rm, ffi, debuggee, sm_count))
    except RigError:
        return None


def fault_access(rm: RM, ffi: FFI, debuggee: Debuggee, address: int) -> str | None:
    """The access of the newest fault the RM recorded for ``debuggee``'s context in the page of
    ``address``; ``None`` where the RM refuses (any :class:`rig_edge.RigError`) or recorded
    none there."""
    try:
        records = read_fault_records(rm, ffi, debuggee)
    except RigError:
        return None
    for r in reversed(records):
        if r.address >> PAGE_SHIFT == address >> PAGE_SHIFT:
            return r.access
    return None


def notified(note: memoryview) -> bool:
    """Whether an error notifier (NvNotification) has been written: its status is not zero."""
    return bool(note[14] or note[15])


def channel_fault(rm: RM, ffi: FFI, faulted: list[tuple[str, int, memoryview]],
                  debuggee: Debuggee | None = None, sm_count: int = 0) -> Fault:
    """The :class:`rig_edge.Fault` of channels whose error notifiers the RM wrote.

    ``faulted``: (name, RM handle, notifier) of each such channel, the one to name first. Its
    notifier gives the Xid and the engine. For an MMU fault the RM is asked for the fault's
    address and type, channel by channel (the RM writes the notifiers of every channel of the
    group, but keeps the MMU's record on the channel that faulted); the channel that answers is
    the one named. Where that is ``debuggee``'s channel, the access is the one the RM recorded
    for its graphics context in the fault's page (:func:`fault_access`), else the one the fault
    type implies, if any. For an SM exception the RM is asked for the SM error states of
    ``debuggee``'s channel, SMs 0 to ``sm_count`` - 1 (:func:`sm_error`): the first SM's error
    and number follow the channel error, its PC is the Fault's ``pc`` and the address of its
    access, where the error has one, the Fault's ``address``. Where none answers, the Fault is
    the notifier's alone.
    """
    name, _, note = faulted[0]
    xid = int.from_bytes(note[8:12], "little")
    engine = ENGINE.get(int.from_bytes(note[12:14], "little"))
    if xid == MMU_FAULT:
        for ch_name, handle, _ in faulted:
            mmu = read_mmu_fault(rm, ffi, handle)
            if mmu is not None:
                access = mmu.access
                if debuggee is not None and handle == debuggee.channel:
                    access = fault_access(rm, ffi, debuggee, mmu.address) or access
                return Fault(f"{xid_name(xid)} on the {ch_name} channel: {mmu.kind}",
                             address=mmu.address, access=access, engine=engine)
    if xid == GR_EXCEPTION and debuggee is not None and sm_count > 0:
        sm = sm_error(rm, ffi, debuggee, sm_count)
        if sm is not None:
            return Fault(f"{xid_name(xid)} on the {name} channel: {sm.error} (SM {sm.sm})",
                         address=sm.address, engine=engine, pc=sm.pc or None)
    return Fault(f"{xid_name(xid)} on the {name} channel", engine=engine)
