"""detach, attach and reset of a GPU by index, on fixture sysfs trees whose writes are recorded
and act as the kernel's (rig_pci.testing.fixture_machine); their errors name the GPU."""

import errno
import fcntl
import os
import re
import signal
import struct
import threading
import time
from pathlib import Path

import pytest
from support import attach_on, detach_on

import rig_nv_pci
from rig_edge import Misuse, RigError
from rig_nv_pci import lock
from rig_pci import Function, Machine
from rig_pci.driver import Detached
from rig_pci.testing import add_function, add_process, fixture_machine, set_lockdown

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
    assert detach_on(machine, 0) == Detached()
    assert sysfs.writes == [
        (f"/sys/bus/pci/devices/{BUS}/driver_override", "none\n"),
        ("/sys/bus/pci/drivers/nvidia/unbind", BUS),
    ]
    assert detach_on(machine, 0) == Detached() and len(sysfs.writes) == 2  # already


def hold(file: Path) -> int:
    """Another process's hold of a lock file: an flock of an open file of its own (flock
    locks one open file description, so this process's lock conflicts with it as another's)."""
    fd = os.open(file, os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def detach_refused_while_held(file: Path, machine: Machine, writes: list[tuple[str, str]],
                              match: str) -> None:
    """GPU 0's detach, while another process holds ``file``, raises ``match`` having written
    nothing."""
    fd = hold(file)
    try:
        with pytest.raises(RigError, match=match):
            detach_on(machine, 0)
    finally:
        os.close(fd)
    assert writes == []


def test_a_change_waits_for_another_processs_open_or_change_then_runs(
        tmp_path: Path, locks: Path) -> None:
    """The spec: "Opens and changes of NVIDIA GPUs run one at a time, so a boot delays the
    others", between processes too (issue 20 item 10: another process went ahead at once)."""
    add_gpu(tmp_path, driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    fd = hold(locks / "rig-nv-pci.lock")
    threading.Timer(0.3, os.close, (fd,)).start()  # the other process's boot ends
    start = time.monotonic()
    assert detach_on(machine, 0) == Detached()
    assert time.monotonic() - start >= 0.3 and len(sysfs.writes) == 2


def test_another_processs_open_or_change_is_waited_for_with_a_bound_then_refused(
        tmp_path: Path, locks: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 10: the wait has a bound, then a clear error, having changed nothing."""
    monkeypatch.setattr(lock, "SERIAL_WAIT_S", 0.2)
    add_gpu(tmp_path, driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    detach_refused_while_held(locks / "rig-nv-pci.lock", machine, sysfs.writes,
                              r"^detach waited 0\.2 s for another process's open or change "
                              r"of an NVIDIA GPU, which holds .*/rig-nv-pci\.lock")


def test_detach_takes_the_gpus_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 10: detach took no per-GPU lock. Now it waits for another process's open
    of the GPU, then past the bound is refused, having written nothing."""
    monkeypatch.setattr(lock, "BUS_WAIT_S", 0.2)
    add_gpu(tmp_path, driver="nvidia")
    machine, sysfs = fixture_machine(tmp_path)
    detach_refused_while_held(lock.path(machine, BUS), machine, sysfs.writes,
                              rf"^{re.escape(name(tmp_path))}: another process holds it "
                              r"\(an open or change of it held .* for the 0\.2 s")
    monkeypatch.setattr(lock, "BUS_WAIT_S", 30.0)
    fd = hold(lock.path(machine, BUS))
    threading.Timer(0.3, os.close, (fd,)).start()  # the other process's stop ends
    start = time.monotonic()
    assert detach_on(machine, 0) == Detached() and len(sysfs.writes) == 2
    assert time.monotonic() - start >= 0.3
    assert not lock.held(machine, BUS)  # and let it go


def test_detach_refuses_while_a_process_holds_its_device_file(tmp_path: Path) -> None:
    add_gpu(tmp_path, driver="nvidia")
    info = tmp_path / "proc/driver/nvidia/gpus" / BUS / "information"
    info.parent.mkdir(parents=True)
    info.write_text("Model: \t\t NVIDIA GeForce RTX 3090\nDevice Minor: \t 3\n")
    add_process(tmp_path, 4242, "python3", fds={5: "/dev/nvidia3"})
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError) as e:
        detach_on(machine, 0)
    assert str(e.value) == f"{name(tmp_path)}: it is in use: process 4242 (python3) holds " \
                           "/dev/nvidia3"
    assert sysfs.writes == []


def test_detach_refuses_no_gpu_and_a_gpu_this_process_holds(tmp_path: Path) -> None:
    add_gpu(tmp_path)
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError, match=r"the machine at .* has no GPU 1 \(it has 1\)$"):
        detach_on(machine, 1)
    with Function.take(machine, BUS), pytest.raises(RigError) as e:
        detach_on(machine, 0)
    assert str(e.value) == f"{name(tmp_path)}: this process holds it (an open of it, or its " \
                           "function taken)"
    assert sysfs.writes == []


# ---- attach ------------------------------------------------------------------------------------


def test_attach_resets_checks_wpr2_then_gives_it_back(tmp_path: Path) -> None:
    add_gpu(tmp_path, override="none")
    machine, sysfs = fixture_machine(tmp_path)
    sysfs.native[BUS] = "nvidia"
    attach_on(machine, 0)
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
        attach_on(machine, 0)
    assert str(e.value) == (
        f"{name(tmp_path)}: its protected memory (WPR2) is still up after its reset "
        "(NV_PFB_PRI_MMU_WPR2_ADDR_HI reads 0x0005f4b0)"
    )
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]  # and nothing more
    assert not lock.held(machine, BUS)
    assert rig_nv_pci.opener.lost(machine, BUS)  # a failed reset: the next open resets


def test_attach_refuses_while_an_open_holds_it(tmp_path: Path) -> None:
    add_gpu(tmp_path, override="none")
    machine, sysfs = fixture_machine(tmp_path)
    held = lock.BusLock.take(machine, BUS)
    try:
        with pytest.raises(RigError, match="this process holds it"):
            attach_on(machine, 0)
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
    assert rig_nv_pci.opener.lost(machine, BUS)  # a failed reset loses the GPU
    # A reset that takes it down succeeds, and the GPU is lost no more.
    dev = tmp_path / "sys/bus/pci/devices" / BUS
    sysfs.on_reset = lambda bus: poke(dev, WPR2_HI, 0)
    rig_nv_pci.reset(0, machine)
    assert not rig_nv_pci.opener.lost(machine, BUS)


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


# ---- called from a callback inside the lock ----------------------------------------------------


def inside(machine: object) -> dict[str, tuple[BaseException | None, int]]:
    """gpu(0)'s make, detach, attach and reset of ``machine``'s GPU 0, each called: what each
    raised, and how many sysfs writes the machine had after it."""
    from rig_pci import Machine

    assert isinstance(machine, Machine)
    sysfs = machine.sysfs
    calls = {"make": lambda: rig_nv_pci.gpu(0, machine).make(),
             "detach": lambda: detach_on(machine, 0),
             "attach": lambda: attach_on(machine, 0),
             "reset": lambda: rig_nv_pci.reset(0, machine)}
    got: dict[str, tuple[BaseException | None, int]] = {}
    for what, call in calls.items():
        try:
            call()
        except BaseException as e:
            got[what] = (e, len(sysfs.writes))  # type: ignore[attr-defined]
        else:
            got[what] = (None, len(sysfs.writes))  # type: ignore[attr-defined]
    return got


def assert_misuse(got: dict[str, tuple[BaseException | None, int]], writes: int) -> None:
    for what, (e, after) in got.items():
        assert isinstance(e, Misuse) and isinstance(e, ValueError), (what, e)
        assert "was called from inside another open or change of a GPU" in str(e)
        assert after == writes, what  # it wrote nothing


def test_an_open_or_change_called_back_inside_another_is_misuse_having_changed_nothing(
    tmp_path: Path,
) -> None:
    """The spec: gpu's make, detach, attach and reset, called from a callback inside a lock
    (Rig's domains section), raise Invalid_argument (here Misuse, a ValueError), having changed
    nothing. The lock is the process's lock on opens and changes (rig_nv_pci.lock.serial); the
    callbacks that run inside it are the thread's own: here a signal handler, which Python runs
    in the main thread between two of its bytecodes, while a reset holds the lock (its write
    to the function's reset file raises the signal), and a call inside attach (the fixture's
    answer to the write of its reset). Each call raises, writing nothing and taking no lock or
    function; the change around it goes on and ends as it would have."""
    add_gpu(tmp_path)
    machine, sysfs = fixture_machine(tmp_path)
    got: list[dict[str, tuple[BaseException | None, int]]] = []

    def handler(signum: int, frame: object) -> None:
        assert lock.held(machine, BUS)  # inside the reset
        got.append(inside(machine))

    sysfs.on_reset = lambda bus: signal.raise_signal(signal.SIGUSR1)
    old = signal.signal(signal.SIGUSR1, handler)
    try:
        rig_nv_pci.reset(0, machine)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]
    assert len(got) == 1
    assert_misuse(got[0], 1)
    assert not lock.held(machine, BUS)

    sysfs.native[BUS] = "nvidia"
    sysfs.on_reset = lambda bus: got.append(inside(machine))  # attach's reset, inside it
    attach_on(machine, 0)
    assert len(got) == 2
    assert_misuse(got[1], 2)
    assert sysfs.writes[1:] == [
        (f"/sys/bus/pci/devices/{BUS}/reset", "1"),
        (f"/sys/bus/pci/devices/{BUS}/driver_override", "\n"),
        ("/sys/bus/pci/drivers_probe", BUS),
    ]
    assert machine.function(BUS).driver == "nvidia" and not lock.held(machine, BUS)


def test_a_callback_right_after_the_lock_is_taken_runs_its_change_whole_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A signal handler may run right after a change took the process's lock and before it
    marked itself inside: its own reset is not refused then (the outer one has changed nothing
    yet) and runs whole first, instead of waiting forever for a lock its own thread holds.
    The lock stands in for the process's with a callback after each take."""
    add_gpu(tmp_path)
    machine, sysfs = fixture_machine(tmp_path)
    real = lock._serial.lock
    strikes = [lambda: rig_nv_pci.reset(0, machine)]

    class Striking:
        def __enter__(self) -> None:
            assert real.acquire(timeout=5.0), "the thread waited for its own lock"
            if strikes:
                strikes.pop()()

        def __exit__(self, *exc: object) -> None:
            real.release()

    monkeypatch.setattr(lock._serial, "lock", Striking())
    rig_nv_pci.reset(0, machine)
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")] * 2
    assert not lock.held(machine, BUS)
    rig_nv_pci.reset(0, machine)  # no longer inside a change: not refused as Misuse
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")] * 3


# ---- every Error of the spec, named with the GPU ----------------------------------------------


def test_each_change_is_an_error_naming_the_gpu_when_the_functions_cannot_be_listed(
    tmp_path: Path,
) -> None:
    """The spec (Changes to the machine): "Each returns Error why if the machine's PCI
    functions cannot be listed", naming the GPU, then the reason, having written nothing."""
    from rig_pci import Machine
    from rig_pci.listing import FunctionInfo
    from rig_pci.testing import FixtureSysfs

    class Unlistable(FixtureSysfs):
        def functions(self) -> list[FunctionInfo]:
            raise RigError("the machine's PCI functions cannot be listed: Too many open files")

    sysfs = Unlistable(tmp_path)
    machine = Machine(sysfs)
    for change in (detach_on, attach_on,
                   lambda m, i: rig_nv_pci.reset(i, m)):
        with pytest.raises(RigError) as e:
            change(machine, 0)
        assert str(e.value) == (
            f"GPU 0 of the machine at {tmp_path}: the machine at {tmp_path}'s PCI functions "
            "cannot be listed: Too many open files"
        )
    assert sysfs.writes == [] and not lock.held(machine, BUS)


def test_attach_refuses_no_gpu_i_saying_how_many(tmp_path: Path) -> None:
    """The spec: attach is Error why if there is no GPU i."""
    add_gpu(tmp_path, override="none")
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError) as e:
        attach_on(machine, 1)
    assert str(e.value) == (
        f"GPU 1 of the machine at {tmp_path}: the machine at {tmp_path} has no GPU 1 (it has 1)"
    )
    assert sysfs.writes == []


def test_attach_of_a_gpu_linux_cannot_reset_names_the_gpu_and_gives_nothing_back(
    tmp_path: Path,
) -> None:
    """The spec: attach resets first as reset does, and is Error as Rig_pci.Driver.attach
    among its failed resets: a GPU Linux has no reset for is not given to its driver."""
    dev = add_gpu(tmp_path, override="none")
    (dev / "reset").unlink()
    machine, sysfs = fixture_machine(tmp_path)
    sysfs.native[BUS] = "nvidia"
    with pytest.raises(RigError) as e:
        attach_on(machine, 0)
    assert str(e.value) == f"{name(tmp_path)}: it cannot be reset: Linux has no reset for it"
    assert sysfs.writes == [] and machine.function(BUS).driver is None
    assert not lock.held(machine, BUS)
    assert not rig_nv_pci.opener.lost(machine, BUS)  # no reset was attempted: the GPU is as it was


def test_attach_whose_function_cannot_be_taken_does_not_lose_the_gpu(tmp_path: Path) -> None:
    """The spec: a GPU whose reset has failed is lost. One whose function attach could not
    take (a kernel locked down against PCI mappings) was never reset: named, not lost."""
    add_gpu(tmp_path, override="none")
    set_lockdown(tmp_path, "integrity")
    machine, sysfs = fixture_machine(tmp_path)
    with pytest.raises(RigError) as e:
        attach_on(machine, 0)
    assert str(e.value).startswith(f"{name(tmp_path)}: ") and "locked down" in str(e.value)
    assert sysfs.writes == [] and not rig_nv_pci.opener.lost(machine, BUS)
    assert not lock.held(machine, BUS)


def test_attach_whose_own_reset_fails_loses_the_gpu(tmp_path: Path) -> None:
    """The spec: attach resets a GPU first, as reset does, and a GPU whose reset has failed is
    lost (its next open resets it first). Linux refuses the function's reset (the write to
    its sysfs ``reset`` fails with EIO): the attach is an error naming the GPU, nothing more is
    written, the GPU is lost."""
    add_gpu(tmp_path, override="none")
    machine, sysfs = fixture_machine(tmp_path)
    sysfs.native[BUS] = "nvidia"

    def refused(bus: str) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    sysfs.on_reset = refused
    with pytest.raises(RigError) as e:
        attach_on(machine, 0)
    assert str(e.value).startswith(f"{name(tmp_path)}: its reset failed: ")
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]
    assert machine.function(BUS).driver is None and not lock.held(machine, BUS)
    assert rig_nv_pci.opener.lost(machine, BUS)
    # a reset that works ends the loss (rig_nv_pci.reset), as the next open's would
    sysfs.on_reset = None
    rig_nv_pci.reset(0, machine)
    assert not rig_nv_pci.opener.lost(machine, BUS)


def test_attach_of_a_gpu_that_does_not_answer_after_its_reset_loses_it(tmp_path: Path) -> None:
    """The reset runs and the GPU's config space reads all ones after it: a failed reset,
    named with the GPU; the GPU is lost."""
    dev = add_gpu(tmp_path, override="none")
    machine, sysfs = fixture_machine(tmp_path)

    def gone(bus: str) -> None:
        with open(dev / "config", "r+b") as f:
            f.write(b"\xff\xff")

    sysfs.on_reset = gone
    with pytest.raises(RigError) as e:
        attach_on(machine, 0)
    assert str(e.value).startswith(f"{name(tmp_path)}: it does not respond after its reset")
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]
    assert rig_nv_pci.opener.lost(machine, BUS)
