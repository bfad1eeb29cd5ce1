from pathlib import Path

from rig_nv_nvidia import buses, count
from rig_nv_nvidia.listing import gpu_functions
from rig_pci import Machine
from rig_pci.testing import add_function


def test_gpus_of_a_fixture_machine(tmp_path: Path) -> None:
    add_function(tmp_path, "0000:41:00.0", vendor=0x10DE, device=0x2335, class_code=0x030200)
    add_function(tmp_path, "0000:41:00.1", vendor=0x10DE, device=0x22BA, class_code=0x040300)
    add_function(tmp_path, "0000:01:00.0", vendor=0x10DE, device=0x2684, class_code=0x030000)
    found = gpu_functions(Machine.at(tmp_path))
    assert [f.address for f in found] == ["0000:01:00.0", "0000:41:00.0"]


def test_this_machine_count_matches_buses() -> None:
    assert count() == len(buses())
