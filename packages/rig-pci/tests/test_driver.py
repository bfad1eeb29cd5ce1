"""rig_pci.driver on fixture trees whose sysfs writes are recorded and act as the kernel's
would: which files are written, in which order, and what is refused before the first write."""

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from rig_edge import RigError
from rig_pci import Function, Machine, driver
from rig_pci.function import ResetFailed
from rig_pci.testing import (
    FakeVfio,
    add_driver,
    add_process,
    add_vfio,
    fixture_machine,
    set_lockdown,
)

MakeDevice = Callable[..., Path]
BUS = "0000:01:00.0"
DEV = f"/sys/bus/pci/devices/{BUS}"


def test_detach_without_iommu_leaves_it_to_no_driver(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    make_device(driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    assert driver.detach(machine, BUS) == driver.Detached()
    assert sysfs.writes == [
        (f"{DEV}/driver_override", "none\n"),
        ("/sys/bus/pci/drivers/nvidia/unbind", BUS),
    ]
    assert machine.function(BUS).driver is None
    # Detached already: nothing more is written.
    assert driver.detach(machine, BUS) == driver.Detached()
    assert len(sysfs.writes) == 2
    with Function.take(machine, BUS) as f:
        assert f.how == "physically"


def test_detach_behind_an_iommu_binds_vfio_pci(tmp_path: Path, make_device: MakeDevice) -> None:
    make_device(driver="nvidia", iommu_group=5)
    add_driver(tmp_path, "vfio-pci")
    machine, sysfs = fixture_machine(tmp_path)
    assert driver.detach(machine, BUS) == driver.Detached()
    assert sysfs.writes == [
        (f"{DEV}/driver_override", "vfio-pci\n"),
        ("/sys/bus/pci/drivers/nvidia/unbind", BUS),
        ("/sys/bus/pci/drivers_probe", BUS),
    ]
    assert machine.function(BUS).driver == "vfio-pci"


def test_detach_refuses_without_vfio_pci_loaded(tmp_path: Path, make_device: MakeDevice) -> None:
    make_device(driver="nvidia", iommu_group=5)
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError, match="vfio-pci is not loaded"):
        driver.detach(machine, BUS)
    assert sysfs.writes == []


@pytest.mark.parametrize(
    ("fds", "maps", "files", "named"),
    [
        ({3: "/dev/dri/card0"}, [], (), "/dev/dri/card0"),
        ({}, [f"/sys/devices/pci0000:00/{BUS}/resource0"], (), "resource0"),
        ({7: "/dev/nvidia0"}, [], ("/dev/nvidia0",), "/dev/nvidia0"),
    ],
)
def test_detach_refuses_while_a_process_holds_its_files(
    tmp_path: Path,
    make_device: MakeDevice,
    fds: dict[int, str],
    maps: list[str],
    files: tuple[str, ...],
    named: str,
) -> None:
    make_device(driver="nvidia", drm=("card0", "renderD128"))
    (tmp_path / "sys/kernel/debug/dri").mkdir(parents=True)
    add_process(tmp_path, 4242, "Xorg", fds=fds, maps=maps)
    add_process(tmp_path, 1, "init", fds={0: "/dev/null"})
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError, match=rf"process 4242 \(Xorg\) holds .*{named}"):
        driver.detach(machine, BUS, device_files=files)
    assert sysfs.writes == []


def test_detach_with_drm_needs_debugfs_and_names_its_clients(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    make_device(driver="nvidia", drm=("card1",))
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError, match="mount debugfs at /sys/kernel/debug"):
        driver.detach(machine, BUS)
    clients = tmp_path / "sys/kernel/debug/dri/1/clients"
    clients.parent.mkdir(parents=True)
    clients.write_text(
        "             command  tgid dev master a   uid      magic\n"
        "         gnome-shell  1777   0   y    y  1000          0\n"
    )
    with pytest.raises(RigError, match=r"process 1777 \(gnome-shell\) is a client of card1"):
        driver.detach(machine, BUS)
    assert sysfs.writes == []


def test_detach_refuses_a_function_this_process_holds(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    make_device()
    machine, sysfs = fixture_machine(tmp_path)
    with Function.take(machine, BUS), pytest.raises(RigError, match="this process holds it"):
        driver.detach(machine, BUS)
    assert sysfs.writes == []


def test_detach_error_only_before_the_first_write(
    tmp_path: Path, make_device: MakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_device(driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)

    def refused(path: Path, text: str) -> None:
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(sysfs, "write", refused)  # the first write fails: nothing changed
    with pytest.raises(RigError, match="cannot be detached: writing its driver_override"):
        driver.detach(machine, BUS)


def test_detach_part_way_after_the_first_write(
    tmp_path: Path, make_device: MakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_device(driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    real = sysfs.write

    def stuck_driver(path: Path, text: str) -> None:
        if path.name == "unbind":
            raise OSError(16, "Device or resource busy")
        real(path, text)

    monkeypatch.setattr(sysfs, "write", stuck_driver)
    progress = driver.detach(machine, BUS)
    assert isinstance(progress, driver.PartWay)
    assert "nvidia did not let it go" in progress.why and "busy" in progress.why


def test_detach_after_its_first_write_is_part_way_whatever_fails(
    tmp_path: Path, make_device: MakeDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec: detach "returns Error why only before its first write to the machine, and
    after that write Ok Detached or Ok (Part_way why)". Issue 20 item 11: a driver link that
    cannot be read after it (any OSError but FileNotFoundError) raised."""
    make_device(driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)

    def unreadable(path: Path) -> str | None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(driver, "link_name", unreadable)
    progress = driver.detach(machine, BUS)
    assert isinstance(progress, driver.PartWay)
    assert progress.why.startswith("its override is none, but what holds it cannot be read")
    assert "Permission denied" in progress.why
    assert sysfs.writes == [(f"{DEV}/driver_override", "none\n"),
                            ("/sys/bus/pci/drivers/nvidia/unbind", BUS)]


@pytest.mark.parametrize(("bound", "group", "override"), [(None, None, "none"),
                                                          ("vfio-pci", 5, "vfio-pci")])
def test_detached_already_needs_the_override_too(
    tmp_path: Path, make_device: MakeDevice, bound: str | None, group: int | None,
    override: str,
) -> None:
    """Issue 20 item 11: "already detached" was decided without the driver override, so a
    function that no driver (or vfio-pci) holds but whose override is unset, which any driver
    may bind at the next probe, was reported detached with nothing written. Its override is
    written, and nothing else."""
    make_device(driver=bound, iommu_group=group)
    add_driver(tmp_path, "vfio-pci")
    machine, sysfs = fixture_machine(tmp_path)
    assert driver.detach(machine, BUS) == driver.Detached()
    assert sysfs.writes == [(f"{DEV}/driver_override", f"{override}\n")]
    assert (tmp_path / DEV.lstrip("/") / "driver_override").read_text() == f"{override}\n"
    assert driver.detach(machine, BUS) == driver.Detached() and len(sysfs.writes) == 1


def test_detach_needs_a_sysfs_machine() -> None:
    class Remote:
        name = "the simulator"
        shares_memory = True

    machine = Machine(Remote())  # type: ignore[arg-type]
    with pytest.raises(RigError, match="needs a program there"):
        driver.detach(machine, BUS)


def test_attach_resets_then_clears_the_override_and_reprobes(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    make_device(override="none")
    add_driver(tmp_path, "nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    sysfs.native[BUS] = "nvidia"
    checked = []
    driver.attach(machine, BUS, after_reset=lambda f: checked.append(f.alive()))
    assert checked == [True]
    assert sysfs.writes == [
        (f"{DEV}/reset", "1"),
        (f"{DEV}/driver_override", "\n"),
        ("/sys/bus/pci/drivers_probe", BUS),
    ]
    assert machine.function(BUS).driver == "nvidia"
    driver.attach(machine, BUS)  # attached already: nothing written
    assert len(sysfs.writes) == 3


def test_attach_from_vfio_pci_resets_through_vfio_and_unbinds(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    make_device(driver="vfio-pci", iommu_group=5, override="vfio-pci")
    add_vfio(tmp_path, 5)
    device_file = tmp_path / "vfio-device"
    from rig_pci.testing import config_space

    with open(device_file, "wb") as f:
        f.truncate(8 << FakeVfio.REGION_SHIFT)
        f.seek(7 << FakeVfio.REGION_SHIFT)
        f.write(config_space(0x1234, 0x5678, 0x030200))
    fake = FakeVfio(device_file, regions={7: (3, 256)})
    machine, sysfs = fixture_machine(tmp_path, ioctl=fake)
    sysfs.native[BUS] = "nvidia"
    driver.attach(machine, BUS)
    assert "DEVICE_RESET" in fake.calls
    assert sysfs.writes == [
        ("/sys/bus/pci/drivers/vfio-pci/unbind", BUS),
        (f"{DEV}/driver_override", "\n"),
        ("/sys/bus/pci/drivers_probe", BUS),
    ]
    assert machine.function(BUS).driver == "nvidia"


def test_attach_stops_when_the_check_after_reset_fails(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    make_device(override="none")
    machine, sysfs = fixture_machine(tmp_path)

    def wpr2_up(f: Function) -> None:
        raise RigError("its protected memory (WPR2) is still up after its reset")

    with pytest.raises(RigError, match="WPR2"):
        driver.attach(machine, BUS, after_reset=wpr2_up)
    assert sysfs.writes == [(f"{DEV}/reset", "1")]


def test_attach_fails_when_no_driver_binds(tmp_path: Path, make_device: MakeDevice) -> None:
    make_device(override="none")
    machine, _ = fixture_machine(tmp_path)
    with pytest.raises(RigError, match="no kernel driver bound it"):
        driver.attach(machine, BUS)


def test_attach_fails_without_a_reset(tmp_path: Path, make_device: MakeDevice) -> None:
    """No reset Linux knows: a plain RigError (not ResetFailed), nothing written."""
    make_device(override="none", reset=False)
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError, match="Linux has no reset for it") as e:
        driver.attach(machine, BUS)
    assert not isinstance(e.value, ResetFailed)
    assert sysfs.writes == []


def test_attach_that_cannot_take_the_function_is_not_a_failed_reset(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    """A function that cannot be taken (a kernel locked down against PCI mappings): a plain
    RigError, the reset never attempted."""
    make_device(override="none")
    set_lockdown(tmp_path, "integrity")
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError, match="locked down") as e:
        driver.attach(machine, BUS)
    assert not isinstance(e.value, ResetFailed)
    assert sysfs.writes == []


def test_attach_whose_reset_fails_says_so_by_its_type(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    """The reset is attempted and Linux refuses it (the write to its sysfs ``reset`` fails
    with EIO): ResetFailed, which the caller tells apart without reading the message; nothing
    is written after it."""
    make_device(override="none")
    machine, sysfs = fixture_machine(tmp_path)

    def refused(bus: str) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    sysfs.on_reset = refused
    with pytest.raises(ResetFailed, match="its reset failed"):
        driver.attach(machine, BUS)
    assert sysfs.writes == [(f"{DEV}/reset", "1")]


def test_attach_of_a_function_that_does_not_answer_after_its_reset_is_a_failed_reset(
    tmp_path: Path, make_device: MakeDevice
) -> None:
    """The reset runs, and the function's vendor id reads all ones after it: ResetFailed."""
    dev = make_device(override="none")
    machine, sysfs = fixture_machine(tmp_path)

    def gone(bus: str) -> None:
        with open(dev / "config", "r+b") as f:
            f.write(b"\xff\xff")

    sysfs.on_reset = gone
    with pytest.raises(ResetFailed, match="does not respond after its reset"):
        driver.attach(machine, BUS, timeout_s=0.05)
    assert sysfs.writes == [(f"{DEV}/reset", "1")]


def test_hang_ms() -> None:
    assert driver.hang_ms == 30_000
