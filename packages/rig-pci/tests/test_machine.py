"""rig-pci listing on fixture sysfs trees."""

from pathlib import Path

import pytest

from rig_edge import RigError
from rig_pci import Machine
from rig_pci.testing import add_function


def test_no_sysfs_lists_nothing(tmp_path: Path) -> None:
    assert Machine.at(tmp_path).functions() == []


def test_functions_in_numeric_bus_order_with_their_files(tmp_path: Path) -> None:
    # Numeric order: bus 0x0a after 0x02, domain 1 after domain 0 (not string order of "1"/"a").
    add_function(tmp_path, "0001:00:00.0", vendor=0x8086, device=0x1, class_code=0x060000)
    add_function(
        tmp_path,
        "0000:0a:00.0",
        vendor=0x10DE,
        device=0x2335,
        class_code=0x030200,
        bars={0: (0xF000_0000, 16 << 20, False), 1: (0x40_0000_0000, 256 << 30, True)},
        driver="nvidia",
        runtime_status="active",
    )
    add_function(
        tmp_path,
        "0000:02:00.1",
        vendor=0x10DE,
        device=0x22BA,
        class_code=0x040300,
        iommu_group=7,
        runtime_status=None,
    )
    fs = Machine.at(tmp_path).functions()
    assert [f.address for f in fs] == ["0000:02:00.1", "0000:0a:00.0", "0001:00:00.0"]
    gpu = fs[1]
    assert (gpu.vendor, gpu.device, gpu.class_code) == (0x10DE, 0x2335, 0x030200)
    assert gpu.driver == "nvidia" and gpu.iommu_group is None and gpu.runtime_status == "active"
    assert [(b.index, b.address, b.size, b.prefetchable) for b in gpu.bars] == [
        (0, 0xF000_0000, 16 << 20, False),
        (1, 0x40_0000_0000, 256 << 30, True),
    ]
    assert fs[0].iommu_group == 7 and fs[0].driver is None and fs[0].runtime_status is None


def test_unreadable_function_is_left_out(tmp_path: Path) -> None:
    add_function(tmp_path, "0000:01:00.0", vendor=0x10DE, device=0x2335, class_code=0x030200)
    gone = add_function(tmp_path, "0000:02:00.0", vendor=0x10DE, device=0x2335, class_code=0x030200)
    (gone / "vendor").unlink()  # as while the kernel removes it
    assert [f.address for f in Machine.at(tmp_path).functions()] == ["0000:01:00.0"]


def test_a_runtime_status_that_cannot_be_read_leaves_the_function_listed(tmp_path: Path) -> None:
    """Only the function's own files decide whether it is listed: a power/runtime_status that
    fails to read (here EISDIR, as EIO or EACCES would) is shown as None, not a reason to
    leave the function out and renumber the ones after it."""
    first = add_function(tmp_path, "0000:01:00.0", vendor=0x10DE, device=0x2335,
                         class_code=0x030200, runtime_status=None)
    add_function(tmp_path, "0000:02:00.0", vendor=0x10DE, device=0x2335, class_code=0x030200)
    (first / "power" / "runtime_status").mkdir(parents=True)  # reading it fails with EISDIR
    fs = Machine.at(tmp_path).functions()
    assert [(f.address, f.runtime_status) for f in fs] == [
        ("0000:01:00.0", None), ("0000:02:00.0", "active")]


def test_listing_that_cannot_be_made_raises_with_reason(tmp_path: Path) -> None:
    (tmp_path / "sys/bus/pci").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices").write_text("not a directory")
    with pytest.raises(RigError, match="cannot be listed"):
        Machine.at(tmp_path).functions()


def test_bad_address_is_misuse(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Machine.at(tmp_path).function("nonsense")


def test_this_machine_is_this() -> None:
    assert Machine.this().is_this
    assert not Machine.at("/tmp").is_this
