"""Issue 6, "Faults": a channel error raises rig_edge.Fault from wait, and for an MMU fault
(Xid 31) the Fault carries the address the RM recorded (NV906F_CTRL_CMD_GET_MMU_FAULT_INFO on
the faulted channel), the fault type, the access (read, write...) the RM recorded for the
compute channel's graphics context (NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO of a
GT200_DEBUGGER made for the purpose) or else the one the type implies, and the engine.
On the CPU over the stand-in path: fake_gpu.rc writes the error notifiers as the RM does,
FakeRM.mmu_faults is what the channel control answers, or the status it fails with, and
FakeRM.fault_records / debugger_refusals what the debugger's RM answers.
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
    assert d._faulted() is not None and d._faulted().address == 0xDEAD0000
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
    assert d._faulted() is None
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
    assert d._faulted() is None
    rc(d, 13)
    fault_of(d)
    assert path.rm.debuggers == [] and READ_MMU_FAULT_INFO not in path.rm.controls


def test_the_debuggee_is_the_compute_channels_compute_object(dev: tuple[Any, Any]) -> None:
    """Device._debuggee finds the object by where setup.channel made it: the stand-in, which
    records every object's class and parent, says it is the right one."""
    d, path = dev
    g = d._debuggee()
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
