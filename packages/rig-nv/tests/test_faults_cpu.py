"""Issue 6, "Faults": a channel error raises rig_edge.Fault from wait, and for an MMU fault
(Xid 31) the Fault carries the address the RM recorded (NV906F_CTRL_CMD_GET_MMU_FAULT_INFO on
the faulted channel), the fault type, the access (read, write...) the RM recorded for the
compute channel's graphics context (NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO of a
GT200_DEBUGGER made for the purpose) or else the one the type implies, and the engine; for an
SM exception (Xid 13) the error, the PC and, for an access, the address the RM recorded of the
first SM that reported one (NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES of such a debugger).
On the CPU over the stand-in path: fake_gpu.rc writes the error notifiers as the RM does,
FakeRM.mmu_faults is what the channel control answers, or the status it fails with, and
FakeRM.fault_records / sm_errors / debugger_refusals what the debugger's RM answers.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_gpu import rc

from rig_edge import Fault, Lost, Memory
from rig_nv.faults import ACCESS_TYPE, FAULT_TYPE, FaultRecord, decode_mmu_fault
from rig_nv.layouts import Params, rm_ffi

GET_MMU_FAULT_INFO = 0x906F0106
READ_MMU_FAULT_INFO = 0x83DE0328
READ_ALL_SM_ERROR_STATES = 0x83DE030C
GT200_DEBUGGER = 0x83DE
MMU = "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31)"
NV_ERR_NOT_SUPPORTED = 0x56
NV_ERR_INSUFFICIENT_PERMISSIONS = 0x1B


def pending(d: Any) -> Any:
    """A copy the stand-in has not completed: waiting on it meets the notifiers."""
    a, b = d.alloc(4096, Memory.DEVICE), d.alloc(4096, Memory.DEVICE)
    return d.copy(b, a, engine="copy")


def fault_of(d: Any) -> Fault:
    point = pending(d)
    with pytest.raises(Fault) as e:
        point.wait(timeout_s=10)
    return e.value


def test_an_mmu_fault_names_its_address_type_and_engine(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0xDEAD0000, 0x0, "FAULT_PDE")
    rc(d, 31, engine=1)
    f = fault_of(d)
    assert f.channel_error == f"{MMU} on the compute channel: FAULT_PDE"
    assert f.address == 0xDEAD0000
    assert f.access is None  # the context recorded no access; FAULT_PDE implies none
    assert f.engine == "graphics/compute"
    assert f.reason == f"{MMU} on the compute channel: FAULT_PDE at 0xdead0000 by graphics/compute"
    assert str(f) == f"the device is lost: {f.reason}"  # once: the raised copy says the same
    assert path.rm.controls.count(GET_MMU_FAULT_INFO) == 1


def test_the_fault_type_implies_the_access_where_it_can(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0x7F00_0000_1000, 0x6, "FAULT_RO_VIOLATION")
    rc(d, 31)
    f = fault_of(d)
    assert f.address == 0x7F00_0000_1000  # above 4 GiB: addrHi and addrLo joined
    assert f.access == "write or atomic"
    assert "on write or atomic" in str(f)


def test_without_the_rms_string_the_type_is_named_from_its_number(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0x1000, 0xF, "")
    rc(d, 31)
    f = fault_of(d)
    assert f.channel_error.endswith(": FAULT_INFO_TYPE_ATOMIC_VIOLATION")
    assert f.access == "atomic"


def test_a_null_address_is_an_address(dev: tuple[Any, Any]) -> None:
    """A kernel reading through a null pointer faults at 0: the RM's string tells it apart from
    an answer of zeros (no record)."""
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0, 0x0, "FAULT_PDE")
    rc(d, 31)
    f = fault_of(d)
    assert f.address == 0
    assert "at 0x0 " in str(f)


def test_a_failing_control_does_not_hide_the_fault(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = NV_ERR_NOT_SUPPORTED
    path.rm.mmu_faults[d.copy_channel.handle] = NV_ERR_NOT_SUPPORTED
    rc(d, 31, engine=0x09)
    f = fault_of(d)
    assert f.channel_error == f"{MMU} on the compute channel"
    assert f.address is None and f.access is None
    assert f.engine == "copy engine 0"
    # Both channels of the group were asked; each refused.
    assert path.rm.controls.count(GET_MMU_FAULT_INFO) == 2


def test_an_empty_answer_falls_back_to_the_notifier(dev: tuple[Any, Any]) -> None:
    d, path = dev
    rc(d, 31)  # no record in the RM: the control answers zeros
    f = fault_of(d)
    assert f.channel_error == f"{MMU} on the compute channel"
    assert f.address is None
    assert path.rm.controls.count(GET_MMU_FAULT_INFO) == 2  # both channels asked


def test_the_channel_that_faulted_is_named(dev: tuple[Any, Any]) -> None:
    """The RM writes every channel's notifier in the group but keeps the MMU's record on the
    channel that faulted: here the copy channel, asked after the compute channel's empty answer."""
    d, path = dev
    path.rm.mmu_faults[d.copy_channel.handle] = (0x5000, 0x2, "FAULT_PTE")
    rc(d, 31, engine=0x0A)
    f = fault_of(d)
    assert f.channel_error == f"{MMU} on the copy channel: FAULT_PTE"
    assert f.address == 0x5000
    assert f.engine == "copy engine 1"


def test_the_rm_is_asked_once_and_the_device_stays_lost(dev: tuple[Any, Any]) -> None:
    """The RM clears its record when read: the Fault is kept, and every later use raises it."""
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0xDEAD0000, 0x0, "FAULT_PDE")
    rc(d, 31)
    first = fault_of(d)
    with pytest.raises(Lost) as again:
        d.alloc(4096, Memory.DEVICE)
    assert isinstance(again.value, Fault)
    assert again.value.address == 0xDEAD0000
    assert str(again.value) == str(first)
    with pytest.raises(Fault):
        d.sleep(0)
    assert d.health.faulted() is not None and d.health.faulted().address == 0xDEAD0000
    assert path.rm.controls.count(GET_MMU_FAULT_INFO) == 1


def test_other_channel_errors_ask_the_rm_nothing(dev: tuple[Any, Any]) -> None:
    d, path = dev
    rc(d, 13)
    f = fault_of(d)
    assert f.channel_error == "ROBUST_CHANNEL_GR_EXCEPTION (Xid 13) on the compute channel"
    assert f.address is None
    assert GET_MMU_FAULT_INFO not in path.rm.controls


def test_nothing_faulted_asks_nothing(dev: tuple[Any, Any]) -> None:
    d, path = dev
    assert d.health.faulted() is None
    pending(d).wait(timeout_s=10)  # the stand-in completes it: no Fault
    d.sleep(0)
    assert GET_MMU_FAULT_INFO not in path.rm.controls


@pytest.mark.parametrize("key", ["570", "580"])
def test_decode_reads_the_headers_fields(key: str) -> None:
    ffi = rm_ffi(key)
    p = Params(ffi, "NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS", addrHi=0x7F, addrLo=0xDEAD_0000,
               faultType=2)
    assert decode_mmu_fault(ffi, p.p) is not None
    got = decode_mmu_fault(ffi, p.p)
    assert got is not None and got.address == 0x7F_DEAD_0000 and got.kind == "FAULT_PTE"
    p.buf[12:12 + 9] = b"FAULT\x01PDE"  # not printable: dropped, the rest kept
    got = decode_mmu_fault(ffi, p.p)
    assert got is not None and got.kind == "FAULTPDE"
    assert decode_mmu_fault(ffi, Params(ffi, "NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS").p) is None
    p = Params(ffi, "NV906F_CTRL_GET_MMU_FAULT_INFO_PARAMS", faultType=0x7)
    got = decode_mmu_fault(ffi, p.p)
    assert got is not None and got.kind == "MMU fault type 7"  # no GP100 name for 7


def test_fault_type_names() -> None:
    """pascal/gp100/dev_fault.h numbers, kgmmuGetFaultTypeString_GP100 names (GH100 uses it)."""
    assert FAULT_TYPE[0x0] == "FAULT_PDE"
    assert FAULT_TYPE[0x2] == "FAULT_PTE"
    assert FAULT_TYPE[0x6] == "FAULT_RO_VIOLATION"
    assert FAULT_TYPE[0xF] == "FAULT_INFO_TYPE_ATOMIC_VIOLATION"
    assert 0x7 not in FAULT_TYPE


# -- the access type, through a GT200_DEBUGGER made after the fault -------------------------


def graphics_object(d: Any, path: Any) -> int:
    """The compute channel's compute-class object, from the stand-in's own record."""
    (h,) = [h for h, parent in path.rm.parents.items()
            if parent == d.compute.handle and path.rm.objects.get(h) == d.classes.compute]
    return h


def debuggers_left(path: Any) -> list[int]:
    return [h for h, c in path.rm.objects.items() if c == GT200_DEBUGGER]


def test_an_mmu_fault_names_the_access_the_rm_recorded(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0xDEAD0000, 0x0, "FAULT_PDE")
    path.rm.fault_records[graphics_object(d, path)] = [(0xDEAD0000, 0x0, 0x1)]  # VIRT_WRITE
    rc(d, 31)
    f = fault_of(d)
    assert f.access == "write"
    assert f.address == 0xDEAD0000
    assert f.reason == (f"{MMU} on the compute channel: FAULT_PDE at 0xdead0000 on write "
                        "by graphics/compute")
    # One debugger, under the device, on the compute channel's compute object, of this client;
    # asked once and freed.
    ((parent, _, params),) = path.rm.debuggers
    assert parent == path.h_device
    ffi = rm_ffi(path.rm.layouts)
    made = ffi.from_buffer("NV83DE_ALLOC_PARAMETERS *", bytearray(params))
    assert made.hDebuggerClient_Obsolete == 0
    assert made.hAppClient == path.rm.client
    assert made.hClass3dObject == graphics_object(d, path)
    assert path.rm.controls.count(READ_MMU_FAULT_INFO) == 1
    assert debuggers_left(path) == []


def test_the_newest_record_in_the_faults_page_is_taken(dev: tuple[Any, Any]) -> None:
    """The context's records are its last faults, oldest first: a fault elsewhere or an older
    one in the page does not name the access."""
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0x7F00_0000_1000, 0x2, "FAULT_PTE")
    path.rm.fault_records[graphics_object(d, path)] = [
        (0x7F00_0000_1000, 0x2, 0x1), (0x7F00_0000_1000, 0x2, 0x0), (0x5000, 0x2, 0x2)]
    rc(d, 31)
    assert fault_of(d).access == "read"


def test_a_record_of_another_page_names_no_access(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0xDEAD0000, 0x0, "FAULT_PDE")
    path.rm.fault_records[graphics_object(d, path)] = [(0xDEAD1000, 0x0, 0x1)]
    rc(d, 31)
    f = fault_of(d)
    assert f.access is None
    assert debuggers_left(path) == []


def test_the_recorded_access_is_finer_than_the_types(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.mmu_faults[d.compute.handle] = (0x4000, 0x6, "FAULT_RO_VIOLATION")
    path.rm.fault_records[graphics_object(d, path)] = [(0x4000, 0x6, 0x4)]  # VIRT_ATOMIC_WEAK
    rc(d, 31)
    assert fault_of(d).access == "atomic"


def today(d: Any, path: Any, fault_type: int = 0x0, name: str = "FAULT_PDE") -> Fault:
    """The Fault of an MMU fault at 0xdead0000 on the compute channel."""
    path.rm.mmu_faults[d.compute.handle] = (0xDEAD0000, fault_type, name)
    path.rm.fault_records[graphics_object(d, path)] = [(0xDEAD0000, fault_type, 0x1)]
    rc(d, 31)
    return fault_of(d)


@pytest.mark.parametrize("step", ["alloc", "control"])
@pytest.mark.parametrize("status", [NV_ERR_INSUFFICIENT_PERMISSIONS, NV_ERR_NOT_SUPPORTED])
def test_a_refused_debugger_leaves_the_fault_as_it_was(dev: tuple[Any, Any], step: str,
                                                       status: int) -> None:
    d, path = dev
    path.rm.debugger_refusals[step] = status
    f = today(d, path)
    assert f.reason == f"{MMU} on the compute channel: FAULT_PDE at 0xdead0000 by graphics/compute"
    assert f.access is None
    assert debuggers_left(path) == []  # a refused control: the object made is freed
    assert path.rm.controls.count(READ_MMU_FAULT_INFO) == (step == "control")


@pytest.mark.parametrize("step", ["alloc", "control"])
def test_a_refused_debugger_leaves_the_access_the_type_implies(dev: tuple[Any, Any],
                                                               step: str) -> None:
    d, path = dev
    path.rm.debugger_refusals[step] = NV_ERR_INSUFFICIENT_PERMISSIONS
    assert today(d, path, 0x6, "FAULT_RO_VIOLATION").access == "write or atomic"


def test_a_refused_free_still_names_the_access(dev: tuple[Any, Any]) -> None:
    """The answer was read: the RM keeping the object (it goes with the client) changes nothing."""
    d, path = dev
    path.rm.debugger_refusals["free"] = NV_ERR_NOT_SUPPORTED
    f = today(d, path)
    assert f.access == "write"
    assert len(debuggers_left(path)) == 1


def test_an_ioctl_refusal_leaves_the_fault_as_it_was(dev: tuple[Any, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A RigError that is no RMError (the kernel refusing the ioctl itself) is a refusal too."""
    from rig_edge import RigError

    d, path = dev
    alloc = path.rm.alloc

    def refuse(parent: int, handle: int, cls: int, params: Any = None) -> int:
        if cls == GT200_DEBUGGER:
            raise RigError("the NVIDIA driver refused escape 43 (Input/output error)")
        return alloc(parent, handle, cls, params)

    monkeypatch.setattr(path.rm, "alloc", refuse)
    f = today(d, path)
    assert f.access is None and f.address == 0xDEAD0000


def test_the_debugger_is_made_once_and_the_fault_kept(dev: tuple[Any, Any]) -> None:
    d, path = dev
    first = today(d, path)
    with pytest.raises(Lost) as again:
        d.alloc(4096, Memory.DEVICE)
    assert isinstance(again.value, Fault)
    assert (again.value.access, again.value.reason) == (first.access, first.reason) == (
        "write", first.reason)
    with pytest.raises(Fault) as third:
        d.sleep(0)
    assert str(third.value) == str(first)
    assert len(path.rm.debuggers) == 1
    assert path.rm.controls.count(READ_MMU_FAULT_INFO) == 1


def test_a_copy_channel_fault_makes_no_debugger(dev: tuple[Any, Any]) -> None:
    """The RM records accesses for a graphics context only (kgrctxRecordMmuFault): a fault the
    copy channel answers for asks no debugger."""
    d, path = dev
    path.rm.mmu_faults[d.copy_channel.handle] = (0x5000, 0x2, "FAULT_PTE")
    rc(d, 31, engine=0x0A)
    assert fault_of(d).access is None
    assert path.rm.debuggers == []
    assert READ_MMU_FAULT_INFO not in path.rm.controls


def test_no_mmu_record_makes_no_debugger(dev: tuple[Any, Any]) -> None:
    d, path = dev
    rc(d, 31)  # the channels' controls answer zeros
    fault_of(d)
    assert path.rm.debuggers == []


def test_other_faults_and_no_fault_make_no_debugger(dev: tuple[Any, Any]) -> None:
    d, path = dev
    pending(d).wait(timeout_s=10)
    assert d.health.faulted() is None
    rc(d, 69)  # ROBUST_CHANNEL_GR_CLASS_ERROR: neither an MMU fault nor an SM exception
    f = fault_of(d)
    assert f.channel_error == "ROBUST_CHANNEL_GR_CLASS_ERROR (Xid 69) on the compute channel"
    assert path.rm.debuggers == [] and READ_MMU_FAULT_INFO not in path.rm.controls
    assert READ_ALL_SM_ERROR_STATES not in path.rm.controls


def test_the_debuggee_is_the_compute_channels_compute_object(dev: tuple[Any, Any]) -> None:
    """Device._debuggee finds the object by where setup.channel made it: the stand-in, which
    records every object's class and parent, says it is the right one."""
    d, path = dev
    g = d.health.debuggee()
    assert g is not None
    assert g.device == path.h_device and g.channel == d.compute.handle
    assert g.graphics_object == graphics_object(d, path)


def test_access_type_names() -> None:
    """NV_PFAULT_ACCESS_TYPE_* (volta/gv100/dev_fault.h), named after
    kfifoGetFaultAccessTypeString_GV100."""
    assert [ACCESS_TYPE[i] for i in range(5)] == ["read", "write", "atomic", "prefetch", "atomic"]
    assert ACCESS_TYPE[0x9] == "physical write"
    assert FaultRecord(0, 0, 0x1).access == "write"
    assert FaultRecord(0, 0, 0x7).access == "access type 7"


@pytest.mark.parametrize("key", ["570", "580"])
def test_read_fault_records_decodes_the_headers_fields(key: str) -> None:
    """read_fault_records over a minimal RM: entries by count, oldest first; refusals raise
    the RM's status and free what was made."""
    from rig_nv.faults import Debuggee, read_fault_records
    from rig_nv.rm import RMError

    ffi = rm_ffi(key)

    class RM:
        client = 0xC1D00001

        def __init__(self) -> None:
            self.freed: list[int] = []
            self.refuse: int | None = None

        def new_handle(self) -> int:
            return 0x77

        def alloc(self, parent: int, handle: int, cls: int, params: bytearray) -> int:
            assert (parent, handle, cls, len(params)) == (0x10, 0x77, GT200_DEBUGGER, 12)
            return handle

        def control(self, obj: int, cmd: int, params: bytearray) -> None:
            if self.refuse:
                raise RMError("RM control", self.refuse)
            p = ffi.from_buffer("NV83DE_CTRL_DEBUG_READ_MMU_FAULT_INFO_PARAMS *", params)
            p.mmuFaultInfoList[0] = {"faultAddress": 0x7F_DEAD_0000, "faultType": 2,
                                     "accessType": 0}
            p.mmuFaultInfoList[1] = {"faultAddress": 0x1000, "faultType": 0, "accessType": 3}
            p.mmuFaultInfoList[2] = {"faultAddress": 0x2000, "faultType": 0, "accessType": 1}
            p.count = 2

        def free(self, obj: int) -> None:
            self.freed.append(obj)

    rm = RM()
    got = read_fault_records(rm, ffi, Debuggee(0x10, 0x20, 0x21))  # type: ignore[arg-type]
    assert got == [FaultRecord(0x7F_DEAD_0000, 2, 0), FaultRecord(0x1000, 0, 3)]
    assert [r.access for r in got] == ["read", "prefetch"]
    assert rm.freed == [0x77]
    rm.refuse = NV_ERR_INSUFFICIENT_PERMISSIONS
    with pytest.raises(RMError) as e:
        read_fault_records(rm, ffi, Debuggee(0x10, 0x20, 0x21))  # type: ignore[arg-type]
    assert e.value.status == NV_ERR_INSUFFICIENT_PERMISSIONS
    assert rm.freed == [0x77, 0x77]


# -- SM exceptions: the SM error states, through a GT200_DEBUGGER made after the fault ------

GR = "ROBUST_CHANNEL_GR_EXCEPTION (Xid 13)"
AS_TODAY = f"{GR} on the compute channel by graphics/compute"
PC = 0x7FFF_0000_1230  # a PC above 4 GiB: hwwWarpEsrPc alone would lose its high half


def sm_fault(d: Any, path: Any, states: dict[int, tuple[int, int, int, int]]) -> Fault:
    """The Fault of an SM exception whose SM error states the RM answers as ``states``
    (SM -> (hwwGlobalEsr, hwwWarpEsr, hwwWarpEsrPc64, hwwEsrAddr)) for the compute channel."""
    path.rm.sm_errors[d.compute.handle] = states
    rc(d, 13)
    return fault_of(d)


def test_an_sm_exception_names_the_sms_error_pc_and_address(dev: tuple[Any, Any]) -> None:
    """A misaligned access on SM 5 (warp 3: bits 23:16), an SM the RM paused (BPT_PAUSE alone)
    before it: SM 5's error, number, PC and address."""
    d, path = dev
    f = sm_fault(d, path, {2: (0x20, 0, 0, 0), 5: (0x4 | 0x20, 0x0F | 3 << 16, PC,
                                                  0x7F00_0000_0001)})
    assert f.channel_error == f"{GR} on the compute channel: MISALIGNED_ADDR (SM 5)"
    assert (f.address, f.pc, f.access, f.engine) == (0x7F00_0000_0001, PC, None,
                                                     "graphics/compute")
    assert f.reason == (f"{GR} on the compute channel: MISALIGNED_ADDR (SM 5) at 0x7f0000000001"
                        f" by graphics/compute, pc 0x{PC:x}")
    # One debugger, under the device, on the compute channel's compute object, of this client;
    # asked for the H200's 132 SMs (66 TPCs of 2) in calls of at most 100, on the compute
    # channel, and freed.
    assert d.sm_count == 132
    ((parent, _, params),) = path.rm.debuggers
    made = rm_ffi(path.rm.layouts).from_buffer("NV83DE_ALLOC_PARAMETERS *", bytearray(params))
    assert parent == path.h_device
    assert (made.hAppClient, made.hClass3dObject) == (path.rm.client, graphics_object(d, path))
    assert path.rm.sm_reads == [(d.compute.handle, 0, 100), (d.compute.handle, 100, 32)]
    assert debuggers_left(path) == []
    assert GET_MMU_FAULT_INFO not in path.rm.controls
    assert READ_MMU_FAULT_INFO not in path.rm.controls


def test_the_first_sm_with_a_warp_error_is_named(dev: tuple[Any, Any]) -> None:
    """A warp error before a global one, whatever the SMs' order; an illegal instruction has no
    address, whatever hwwEsrAddr holds."""
    d, path = dev
    f = sm_fault(d, path, {3: (0x10, 0, 0x5000, 0), 40: (0x4, 0x9, PC, 0xDEAD),
                           41: (0x4, 0x0F, PC, 0x1)})
    assert f.channel_error == f"{GR} on the compute channel: ILLEGAL_INSTR_ENCODING (SM 40)"
    assert (f.address, f.pc) == (None, PC)


def test_a_global_error_alone_is_named(dev: tuple[Any, Any]) -> None:
    """A breakpoint: the global register's BPT_INT, no warp error; pauses are no errors."""
    d, path = dev
    f = sm_fault(d, path, {0: (0x20, 0, 0, 0), 9: (0x10 | 0x20, 0, PC, 0)})
    assert f.channel_error == f"{GR} on the compute channel: BPT_INT (SM 9)"
    assert (f.address, f.pc) == (None, PC)


def test_an_sm_past_the_first_call_is_read(dev: tuple[Any, Any]) -> None:
    d, path = dev
    f = sm_fault(d, path, {131: (0x4, 0x0E, PC, 0x1_0000_0000)})
    assert f.channel_error.endswith(": OOR_ADDR (SM 131)")
    assert f.address == 0x1_0000_0000


def test_unknown_codes_are_named_by_number(dev: tuple[Any, Any]) -> None:
    d, path = dev
    assert sm_fault(d, path, {1: (0x4, 0x3E, PC, 0)}).channel_error.endswith(
        ": warp error 0x3e (SM 1)")


def test_a_pc_of_zero_is_no_pc(dev: tuple[Any, Any]) -> None:
    d, path = dev
    f = sm_fault(d, path, {1: (0x4, 0x0F, 0, 0)})
    assert f.pc is None and f.address is None  # hwwEsrAddr 0: the RM reported no address
    assert f.reason == f"{GR} on the compute channel: MISALIGNED_ADDR (SM 1) by graphics/compute"


@pytest.mark.parametrize("states", [{}, {0: (0x20, 0, 0, 0), 7: (0x40, 0, 0, 0)}],
                         ids=["zeros", "pauses"])
def test_no_recorded_error_leaves_the_fault_as_it_was(dev: tuple[Any, Any],
                                                      states: dict[int, Any]) -> None:
    d, path = dev
    f = sm_fault(d, path, states)
    assert f.reason == AS_TODAY
    assert (f.address, f.pc, f.access) == (None, None, None)
    assert len(path.rm.sm_reads) == 2 and debuggers_left(path) == []


STATES = {5: (0x4, 0x0F, PC, 0x7F00_0000_0001)}


@pytest.mark.parametrize(("step", "status"), [
    ("alloc", NV_ERR_INSUFFICIENT_PERMISSIONS), ("alloc", NV_ERR_NOT_SUPPORTED),
    ("sm_control", NV_ERR_INSUFFICIENT_PERMISSIONS), ("sm_control", NV_ERR_NOT_SUPPORTED),
    ("sm_from", 100),  # the second call (SMs 100 to 131) refused: the first's answer is dropped
])
def test_a_refusal_at_any_step_leaves_the_fault_as_it_was(dev: tuple[Any, Any], step: str,
                                                          status: int) -> None:
    d, path = dev
    path.rm.debugger_refusals[step] = status
    f = sm_fault(d, path, STATES)
    assert f.reason == AS_TODAY
    assert (f.address, f.pc) == (None, None)
    assert debuggers_left(path) == []  # a refused control: the object made is freed
    assert len(path.rm.sm_reads) == {"alloc": 0, "sm_control": 0, "sm_from": 2}[step]


def test_a_refused_free_still_names_the_error(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.debugger_refusals["free"] = NV_ERR_NOT_SUPPORTED
    f = sm_fault(d, path, STATES)
    assert f.channel_error.endswith(": MISALIGNED_ADDR (SM 5)") and f.pc == PC
    assert len(debuggers_left(path)) == 1


def test_an_ioctl_refusal_leaves_the_sm_fault_as_it_was(dev: tuple[Any, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A RigError that is no RMError (the kernel refusing the ioctl itself) is a refusal too."""
    from rig_edge import RigError

    d, path = dev
    control = path.rm.control

    def refuse(obj: int, cmd: int, params: Any) -> None:
        if cmd == READ_ALL_SM_ERROR_STATES:
            raise RigError("the NVIDIA driver refused escape 2a (Bad address)")
        control(obj, cmd, params)

    monkeypatch.setattr(path.rm, "control", refuse)
    assert sm_fault(d, path, STATES).reason == AS_TODAY
    assert debuggers_left(path) == []


def test_the_sm_states_are_read_once_and_the_fault_kept(dev: tuple[Any, Any]) -> None:
    d, path = dev
    first = sm_fault(d, path, STATES)
    with pytest.raises(Lost) as again:
        d.alloc(4096, Memory.DEVICE)
    assert isinstance(again.value, Fault)
    assert (again.value.reason, again.value.pc, again.value.address) == (
        first.reason, PC, 0x7F00_0000_0001)
    with pytest.raises(Fault) as third:
        d.sleep(0)
    assert str(third.value) == str(first)
    assert len(path.rm.debuggers) == 1 and len(path.rm.sm_reads) == 2


def test_without_a_known_compute_object_no_debugger_is_made(dev: tuple[Any, Any],
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    d, path = dev
    monkeypatch.setattr(d.health, "debuggee", lambda: None)
    assert sm_fault(d, path, STATES).reason == AS_TODAY
    assert path.rm.debuggers == [] and path.rm.sm_reads == []


def test_an_mmu_fault_reads_no_sm_states(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.sm_errors[d.compute.handle] = STATES
    today(d, path)
    assert path.rm.sm_reads == []


def test_a_device_that_does_not_fault_reads_no_sm_states(dev: tuple[Any, Any]) -> None:
    d, path = dev
    path.rm.sm_errors[d.compute.handle] = STATES
    pending(d).wait(timeout_s=10)
    d.sleep(0)
    assert d.health.faulted() is None
    assert path.rm.debuggers == [] and READ_ALL_SM_ERROR_STATES not in path.rm.controls


def test_warp_error_names() -> None:
    """NV_PGRAPH_PRI_GPC0_TPC0_SM0_HWW_WARP_ESR_ERROR_* as nvgpu's hw_gr_ga100.h numbers them,
    and the global register's bits (hw_gr_ga100.h, hw_gr_gv11b.h)."""
    from rig_nv.faults import GLOBAL_ERROR, WARP_ERROR, SmErrorState

    assert WARP_ERROR[0x09] == "ILLEGAL_INSTR_ENCODING"
    assert WARP_ERROR[0x0B] == "ILLEGAL_INSTR_PARAM"
    assert WARP_ERROR[0x0E] == "OOR_ADDR"
    assert WARP_ERROR[0x0F] == "MISALIGNED_ADDR"
    assert WARP_ERROR[0x17] == "MMU_FAULT"
    assert GLOBAL_ERROR[0x10] == "BPT_INT" and GLOBAL_ERROR[0x4] == "MULTIPLE_WARP_ERRORS"
    # RM logs of Xid 13 print the registers and name the error: warp ESR 0x30009 "Illegal
    # Instruction Encoding" with global ESR 0x24 "Multiple Warp Errors" (3dem/relion issue 436),
    # 0xc04000b "Illegal Instruction Parameter" (leptonai/gpud pull request 46).
    s = SmErrorState(0, 0x24, 0x30009, PC, 0)
    assert (s.warp_error, s.error, s.global_errors) == (9, "ILLEGAL_INSTR_ENCODING", 0x4)
    assert SmErrorState(0, 0x20, 0, 0, 0).error is None
    assert SmErrorState(0, 0x24, 0xC04000B, 0, 0).error == "ILLEGAL_INSTR_PARAM"
    assert SmErrorState(0, 0x114, 0, 0, 0).error == "MULTIPLE_WARP_ERRORS+BPT_INT+ERROR_IN_TRAP"
    assert SmErrorState(0, 0x2000, 0, 0, 0).error == "global error 0x2000"
    # 0x101000e (an A800's log, vllm-project/vllm issue 5901): OOR_ADDR, bit 24 (the kind of
    # address error) set
    assert SmErrorState(0, 0x4, 0x101000E, PC, 0x40).address == 0x40


@pytest.mark.parametrize("key", ["570", "580"])
def test_read_sm_error_states_decodes_the_headers_fields(key: str) -> None:
    """read_sm_error_states over a minimal RM: the channel asked, SMs in calls of 100 from
    startingSM, the fields at the headers' offsets (the 32-bit PC where the 64-bit one is 0);
    a refusal raises the RM's status and frees what was made."""
    from rig_nv.faults import Debuggee, first_sm_error, read_sm_error_states
    from rig_nv.rm import RMError

    ffi = rm_ffi(key)

    class RM:
        client = 0xC1D00001

        def __init__(self) -> None:
            self.freed: list[int] = []
            self.asked: list[tuple[int, int, int]] = []
            self.refuse: int | None = None

        def new_handle(self) -> int:
            return 0x77

        def alloc(self, parent: int, handle: int, cls: int, params: bytearray) -> int:
            assert (parent, handle, cls, len(params)) == (0x10, 0x77, GT200_DEBUGGER, 12)
            return handle

        def control(self, obj: int, cmd: int, params: bytearray) -> None:
            assert (obj, cmd, len(params)) == (0x77, READ_ALL_SM_ERROR_STATES, 4824)
            if self.refuse:
                raise RMError("RM control", self.refuse)
            p = ffi.from_buffer("NV83DE_CTRL_DEBUG_READ_ALL_SM_ERROR_STATES_PARAMS *", params)
            self.asked.append((p.hTargetChannel, p.startingSM, p.numSMsToRead))
            for i in range(p.numSMsToRead):
                sm = p.startingSM + i
                p.smErrorStateArray[i] = {"hwwGlobalEsr": sm, "hwwWarpEsr": 0x0F if sm == 120
                                          else 0, "hwwWarpEsrPc": 0x1230 + sm,
                                          "hwwEsrAddr": 0x7F_0000_0000 + sm,
                                          "hwwWarpEsrPc64": 0 if sm < 100 else PC,
                                          "hwwCgaEsr": 1}

        def free(self, obj: int) -> None:
            self.freed.append(obj)

    rm = RM()
    got = read_sm_error_states(rm, ffi, Debuggee(0x10, 0x20, 0x21), 132)  # type: ignore[arg-type]
    assert rm.asked == [(0x20, 0, 100), (0x20, 100, 32)]
    assert [s.sm for s in got] == list(range(132))
    assert (got[7].global_esr, got[7].pc, got[7].esr_address, got[7].cga_esr) == (
        7, 0x1237, 0x7F_0000_0007, 1)
    assert got[120].pc == PC and got[120].warp_esr == 0x0F
    assert first_sm_error(got) == got[120]  # a warp error before SM 1's "global errors"
    assert rm.freed == [0x77]
    rm.refuse = NV_ERR_INSUFFICIENT_PERMISSIONS
    with pytest.raises(RMError) as e:
        read_sm_error_states(rm, ffi, Debuggee(0x10, 0x20, 0x21), 132)  # type: ignore[arg-type]
    assert e.value.status == NV_ERR_INSUFFICIENT_PERMISSIONS
    assert rm.freed == [0x77, 0x77]


def test_a_loss_the_path_marks_takes_no_lock_and_stops_every_later_use(
    dev: tuple[Any, Any],
) -> None:
    """Device.mark_lost (a path that learns its GPU is lost between the device's waits):
    it returns while another thread holds the device's lock (where a lock would deadlock an
    RPC's thread), every later use raises the Lost, and the first loss is the one kept."""
    from fake_gpu import held_elsewhere

    d, _ = dev
    region = d.alloc(0x1000, Memory.PINNED)
    with held_elsewhere(d.timeline.lock):
        d.mark_lost(Lost("GPU 0: the GSP stopped answering at X"))
        d.mark_lost(Lost("a later cause"))
    for use in (lambda: d.alloc(0x1000), lambda: d.copy(region, region, engine="copy"),
                lambda: d.sleep(0.0)):
        with pytest.raises(Lost, match=r"^the device is lost: GPU 0: the GSP stopped "
                                       r"answering at X$"):
            use()
