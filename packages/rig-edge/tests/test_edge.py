"""rig-edge: openers' names, the error policy's classes, memory descriptions."""

import pytest

import rig_edge
from rig_edge import Memory, Misuse, Opener, OutOfMemory, Region, RigError, opener_name


def test_opener_names_follow_the_spec() -> None:
    assert opener_name("NV", 0) == "NV"
    assert opener_name("NV", 3) == "NV:3"
    assert opener_name("NV-PCI", 0) == "NV-PCI"
    assert opener_name("NV-PCI", 1) == "NV-PCI:1"


def test_negative_index_is_misuse_a_value_error() -> None:
    with pytest.raises(ValueError, match="negative"):
        opener_name("NV", -1)


def test_open_makes_the_device_each_time() -> None:
    made: list[int] = []
    opener = Opener("NV", lambda: made.append(1) or len(made))
    assert opener.open() == 1
    assert opener.open() == 2
    assert str(opener) == "NV"


def test_error_policy_classes() -> None:
    assert issubclass(OutOfMemory, MemoryError) and issubclass(OutOfMemory, RigError)
    assert issubclass(Misuse, ValueError) and not issubclass(Misuse, RigError)
    assert issubclass(rig_edge.Fault, rig_edge.Lost)
    lost = rig_edge.Fault("ROBUST_CHANNEL_GR_EXCEPTION", address=0x1000, access="write")
    assert lost.reason == "ROBUST_CHANNEL_GR_EXCEPTION at 0x1000 on write"
    assert lost.pc is None
    sm = rig_edge.Fault("ROBUST_CHANNEL_GR_EXCEPTION (Xid 13): MISALIGNED_ADDR (SM 3)",
                        address=0x7F00_0000_0001, engine="graphics/compute", pc=0x1230)
    assert sm.reason == ("ROBUST_CHANNEL_GR_EXCEPTION (Xid 13): MISALIGNED_ADDR (SM 3) at "
                         "0x7f0000000001 by graphics/compute, pc 0x1230")
    assert (sm.address, sm.access, sm.pc) == (0x7F00_0000_0001, None, 0x1230)
    assert "is lost" in str(lost)
    refused = rig_edge.OpenRefused("NV: no GPU 2", stays="the control file")
    assert str(refused) == "NV: no GPU 2 (the control file stays for the process)"


@pytest.mark.parametrize("error", [
    rig_edge.Lost("its work made no progress for 30 s"),
    rig_edge.Fault("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31)", address=0xDEAD0000,
                   access="write or atomic", engine="graphics/compute"),
    rig_edge.Fault("ROBUST_CHANNEL_GR_EXCEPTION (Xid 13)"),
    rig_edge.Fault("ROBUST_CHANNEL_GR_EXCEPTION (Xid 13): ILLEGAL_INSTR_ENCODING (SM 0)",
                   engine="graphics/compute", pc=0),
])
def test_lost_and_fault_copy_and_pickle_whole(error: rig_edge.Lost) -> None:
    """A device raises a copy of the Lost it keeps: the copy says the same, prefixed once."""
    import copy
    import pickle

    for again in (copy.copy(error), pickle.loads(pickle.dumps(error))):
        assert type(again) is type(error)
        assert str(again) == str(error) and again.args == error.args
        assert str(again).count("the device is lost") == 1
        assert vars(again) == vars(error)


def test_region_length_must_be_positive() -> None:
    Region(0x1000, None, 1, Memory.DEVICE)
    with pytest.raises(ValueError):
        Region(0x1000, None, 0, Memory.DEVICE)
