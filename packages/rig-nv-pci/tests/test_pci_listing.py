from pathlib import Path

import pytest

from rig_edge import RigError
from rig_nv_pci import buses, count
from rig_pci import Machine
from rig_pci.listing import FunctionInfo
from rig_pci.testing import FixtureSysfs, add_function, fixture_machine


def test_buses_of_another_machine(tmp_path: Path) -> None:
    m = Machine.at(tmp_path)
    assert buses(m) == [] and count(m) == 0
    add_function(tmp_path, "0000:81:00.0", vendor=0x10DE, device=0x2684, class_code=0x030000)
    add_function(tmp_path, "0000:03:00.0", vendor=0x10DE, device=0x2204, class_code=0x030000)
    assert buses(m) == ["0000:03:00.0", "0000:81:00.0"] and count(m) == 2


def test_buses_lists_only_nvidia_gpus_and_changes_nothing(tmp_path: Path) -> None:
    """The spec: buses is the bus addresses of the machine's NVIDIA GPUs (Rig_nv.is_gpu), in
    bus order; listing changes nothing on the machine. A GPU's audio function, another vendor's
    GPU and an NVIDIA bridge are not GPUs."""
    m, sysfs = fixture_machine(tmp_path)
    add_function(tmp_path, "0000:03:00.0", vendor=0x10DE, device=0x2204, class_code=0x030000)
    add_function(tmp_path, "0000:03:00.1", vendor=0x10DE, device=0x1AEF, class_code=0x040300)
    add_function(tmp_path, "0000:04:00.0", vendor=0x1002, device=0x744C, class_code=0x030000)
    add_function(tmp_path, "0000:05:00.0", vendor=0x10DE, device=0x22B1, class_code=0x060400)
    add_function(tmp_path, "0000:41:00.0", vendor=0x10DE, device=0x2684, class_code=0x030200)
    assert buses(m) == ["0000:03:00.0", "0000:41:00.0"] and count(m) == 2
    assert sysfs.writes == []


def test_buses_and_count_are_an_error_when_the_functions_cannot_be_listed(
    tmp_path: Path,
) -> None:
    """The spec: buses is Error why if the machine's PCI functions cannot be listed; count is
    the buses' Error."""

    class Unlistable(FixtureSysfs):
        def functions(self) -> list[FunctionInfo]:
            raise RigError("the machine's PCI functions cannot be listed: Permission denied")

    m = Machine(Unlistable(tmp_path))
    for listing in (buses, count):
        with pytest.raises(RigError, match="cannot be listed: Permission denied"):
            listing(m)
