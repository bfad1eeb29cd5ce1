"""Issue 6, "Faults": a channel error raises rig_edge.Fault from wait, and for an MMU fault
(Xid 31) the Fault carries the address the RM recorded (NV906F_CTRL_CMD_GET_MMU_FAULT_INFO on
the faulted channel), the fault type, the access where the type implies one and the engine.
On the CPU over the stand-in path: fake_gpu.rc writes the error notifiers as the RM does, and
FakeRM.mmu_faults is what the control answers, or the status it fails with.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_gpu import rc

from rig_edge import Fault, Lost, Memory
from rig_nv.faults import FAULT_TYPE, decode_mmu_fault
from rig_nv.layouts import Params, rm_ffi

GET_MMU_FAULT_INFO = 0x906F0106
MMU = "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31)"
NV_ERR_NOT_SUPPORTED = 0x56


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
    assert f.access is None  # the control carries no access type; FAULT_PDE implies none
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
