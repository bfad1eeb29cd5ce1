from pathlib import Path

from rig_nv_pci import buses, count
from rig_pci import Machine
from rig_pci.testing import add_function


def test_buses_of_another_machine(tmp_path: Path) -> None:
    m = Machine.at(tmp_path)
    assert buses(m) == [] and count(m) == 0
    add_function(tmp_path, "0000:81:00.0", vendor=0x10DE, device=0x2684, class_code=0x030000)
    add_function(tmp_path, "0000:03:00.0", vendor=0x10DE, device=0x2204, class_code=0x030000)
    assert buses(m) == ["0000:03:00.0", "0000:81:00.0"] and count(m) == 2
