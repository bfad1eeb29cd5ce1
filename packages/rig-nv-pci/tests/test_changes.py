"""detach, attach and reset of a GPU by index, on fixture sysfs trees whose writes are recorded
and act as the kernel's (rig_pci.testing.fixture_machine); their errors name the GPU."""

import os
import struct
from pathlib import Path

import pytest

import rig_nv_pci
from rig_edge import Misuse, RigError
from rig_nv_pci import lock
from rig_pci import Function
from rig_pci.driver import Detached
from rig_pci.testing import add_function, add_process, fixture_machine

BUS = "0000:01:00.0"
GA102, GH100 = 0x172A1000, 0x180A1000
BOOT_42, WPR2_HI = 0xA00, 0x1FA828


def poke(dev: Path, offset: int, value: int) -> None:
    with open(dev / "resource0", "r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<I", value))


def add_gpu(root: Path, *, boot42: int = GA102, wpr2: int = 0, **kwargs: object) -> Path:
    dev = add_function(root, BUS, vendor=0x10DE, device=0x2204, class_code=0x030000,
                       bars={0: (0xF000_0000, 16 << 20, False), 1: (0xE000_0000, 256 << 20, True)},
                       **kwargs)  # type: ignore[arg-type]
    poke(dev, BOOT_42, boot42)
    poke(dev, WPR2_HI, wpr2)
    return dev


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "locks"
    d.mkdir()
    monkeypatch.setattr(lock, "directory", lambda: d)
    return d


def name(root: Path) -> str:
    return f"GPU 0 of the machine at {root} ({BUS})"


def test_misuse_changes_nothing() -> None:
    for change in (rig_nv_pci.detach, rig_nv_pci.attach, rig_nv_pci.reset):
        with pytest.raises(Misuse):
            change(-1)


# ---- detach ------------------------------------------------------------------------------------


def test_detach_leaves_it_to_no_driver_without_an_iommu(tmp_path: Path) -> None:
    add_gpu(tmp_path, driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    assert rig_nv_pci._detach(machine, 0) == Detached()
    assert sysfs.writes == [
        (f"/sys/bus/pci/devices/{BUS}/driver_override", "none\n"),
        ("/sys/bus/pci/drivers/nvidia/unbind", BUS),
    ]
    assert rig_nv_pci._detach(machine, 0) == Detached() and len(sysfs.writes) == 2  # already


def test_detach_refuses_while_a_process_holds_its_device_file(tmp_path: Path) -> None:
    add_gpu(tmp_path, driver="nvidia")
    info = tmp_path / "proc/driver/nvidia/gpus" / BUS / "information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: \t\t NVIDIA GeForce RTX 3090\nDevice Minor: \t 3\n")
    add_process(tmp_path, 4242, "python3", fds={5: "/dev/nvidia3"})
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError) as e:
        rig_nv_pci._detach(machine, 0)
    assert str(e.value) == f"{name(tmp_path)}: it is in use: process 4242 (python3) holds " \
                           "/dev/nvidia3"
    assert sysfs.writes == []


def test_detach_refuses_no_gpu_and_a_gpu_this_process_holds(tmp_path: Path) -> None:
    add_gpu(tmp_path)
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError, match=r"the machine at .* has no GPU 1 \(it has 1\)$"):
        rig_nv_pci._detach(machine, 1)
    with Function.take(machine, BUS), pytest.raises(RigError) as e:
        rig_nv_pci._detach(machine, 0)
    assert str(e.value) == f"{name(tmp_path)}: this process holds it (an open of it, or its " \
                           "function taken)"
    assert sysfs.writes == []


# ---- attach ------------------------------------------------------------------------------------


def test_attach_resets_checks_wpr2_then_gives_it_back(tmp_path: Path) -> None:
    add_gpu(tmp_path, override="none")
    machine, sysfs = fixture_machine(tmp_path)
    sysfs.native[BUS] = "nvidia"
    rig_nv_pci._attach(machine, 0)
    assert sysfs.writes == [
        (f"/sys/bus/pci/devices/{BUS}/reset", "1"),
        (f"/sys/bus/pci/devices/{BUS}/driver_override", "\n"),
        ("/sys/bus/pci/drivers_probe", BUS),
    ]
    assert machine.function(BUS).driver == "nvidia"


def test_attach_stops_when_wpr2_stays_up(tmp_path: Path) -> None:
    add_gpu(tmp_path, override="none", wpr2=0x5F4B0)
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError) as e:
        rig_nv_pci._attach(machine, 0)
    assert str(e.value) == (
        f"{name(tmp_path)}: its protected memory (WPR2) is still up after its reset "
        "(NV_PFB_PRI_MMU_WPR2_ADDR_HI reads 0x0005f4b0)"
    )
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]  # and nothing more
    assert not lock.held(machine, BUS)


def test_attach_refuses_while_an_open_holds_it(tmp_path: Path) -> None:
    add_gpu(tmp_path, override="none")
    machine, sysfs = fixture_machine(tmp_path)
    held = lock.BusLock.take(machine, BUS)
    try:
        with pytest.raises(RigError, match="this process holds it"):
            rig_nv_pci._attach(machine, 0)
    finally:
        held.release()
    assert sysfs.writes == []


# ---- reset -------------------------------------------------------------------------------------


def test_reset_of_a_machine_through_its_transport(tmp_path: Path) -> None:
    add_gpu(tmp_path)
    machine, sysfs = fixture_machine(tmp_path)
    rig_nv_pci.reset(0, machine)
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]
    assert not lock.held(machine, BUS)


def test_reset_errors_name_the_gpu(tmp_path: Path) -> None:
    dev = add_gpu(tmp_path, driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError) as e:
        rig_nv_pci.reset(0, machine)
    assert str(e.value) == (
        f"{name(tmp_path)}: its function cannot be taken: the kernel driver nvidia holds it "
        "(detach it first)"
    )
    os.unlink(dev / "driver")
    (dev / "reset").unlink()
    with pytest.raises(RigError) as e:
        rig_nv_pci.reset(0, machine)
    assert str(e.value) == f"{name(tmp_path)}: it cannot be reset: Linux has no reset for it"
    assert sysfs.writes == []


def test_reset_fails_when_wpr2_stays_up_even_on_a_chip_it_does_not_boot(tmp_path: Path) -> None:
    add_gpu(tmp_path, boot42=GH100, wpr2=0x10)
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError) as e:
        rig_nv_pci.reset(0, machine)
    assert str(e.value) == (
        f"{name(tmp_path)}: its protected memory (WPR2) is still up after its reset "
        "(NV_PFB_PRI_MMU_WPR2_ADDR_HI reads 0x00000010)"
    )
    # A reset that takes it down succeeds.
    dev = tmp_path / "sys/bus/pci/devices" / BUS
    sysfs.on_reset = lambda bus: poke(dev, WPR2_HI, 0)
    rig_nv_pci.reset(0, machine)


def test_reset_refuses_what_this_process_or_another_open_holds(tmp_path: Path) -> None:
    add_gpu(tmp_path)
    machine, sysfs = fixture_machine(tmp_path)
    with Function.take(machine, BUS), pytest.raises(RigError, match="this process holds it"):
        rig_nv_pci.reset(0, machine)
    with pytest.raises(RigError, match=r"has no GPU 4 \(it has 1\)"):
        rig_nv_pci.reset(4, machine)
    assert sysfs.writes == []


def test_reset_of_a_gpu_that_does_not_answer_after_it(tmp_path: Path) -> None:
    dev = add_gpu(tmp_path)
    machine, sysfs = fixture_machine(tmp_path)

    def gone(bus: str) -> None:
        with open(dev / "config", "r+b") as f:
            f.write(b"\xff\xff")

    sysfs.on_reset = gone
    with pytest.raises(RigError) as e:
        rig_nv_pci.reset(0, machine)
    assert str(e.value).startswith(f"{name(tmp_path)}: it does not respond after its reset")
