"""The spec's refusals of ``gpu i``'s make and of ``usage`` that need no GPU (Rig_nv_nvidia.txt).

The machine is a fixture sysfs tree (rig_pci.testing.add_function, rig_pci.Machine.at), put in
place of this machine's by patching ``rig_nv_nvidia.opener.gpu_functions``. The process's client
of the kernel driver is patched to fail the test if anything reaches it, so each refusal here is
shown to come before any driver file is opened.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from rig_edge import Misuse, OpenRefused, RigError
from rig_nv.layouts import rm_ffi
from rig_nv_nvidia import gpu, opener, usage
from rig_nv_nvidia.driver import PROCESS
from rig_nv_nvidia.listing import gpu_functions
from rig_pci import FunctionInfo, Machine
from rig_pci.testing import add_function

GPU_A, GPU_B = "0000:41:00.0", "0000:c1:00.0"


def _forbidden(*_: object) -> NoReturn:
    raise AssertionError("a driver file was touched")


@pytest.fixture(autouse=True)
def no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any test that reaches the kernel driver (the control file, a GPU's file)."""
    monkeypatch.setattr(PROCESS, "client", _forbidden)
    monkeypatch.setattr(PROCESS, "gpu", _forbidden)


def use_machine(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.setattr(opener, "gpu_functions", lambda: gpu_functions(Machine.at(root)))


def use_listing(monkeypatch: pytest.MonkeyPatch, listing: Callable[[], list[FunctionInfo]]) -> None:
    monkeypatch.setattr(opener, "gpu_functions", listing)


def add_gpu(root: Path, address: str, driver: str | None = "nvidia",
            runtime_status: str | None = "active") -> None:
    add_function(root, address, vendor=0x10DE, device=0x2335, class_code=0x030200,
                 driver=driver, runtime_status=runtime_status)


def two_gpus(root: Path) -> None:
    add_gpu(root, GPU_A)
    add_gpu(root, GPU_B)
    # The GPUs' audio function and another vendor's GPU are no GPUs of this path.
    add_function(root, "0000:41:00.1", vendor=0x10DE, device=0x22BA, class_code=0x040300,
                 driver="snd_hda_intel")
    add_function(root, "0000:03:00.0", vendor=0x1002, device=0x73BF, class_code=0x030000,
                 driver="amdgpu")


# -- (a) no GPU i ----------------------------------------------------------------------------


def test_no_gpu_on_a_machine_without_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """make is Error "if the machine has no GPU i (count), saying how many there are"."""
    use_machine(monkeypatch, tmp_path)  # no /sys/bus/pci at all: a machine with no GPU
    with pytest.raises(OpenRefused) as e:
        gpu(0).open()
    assert "no GPU 0" in str(e.value)
    assert "(it has 0)" in str(e.value)
    assert str(e.value).startswith("NV: ")


def test_no_gpu_5_on_a_machine_with_two(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """make is Error "if the machine has no GPU i (count), saying how many there are"."""
    two_gpus(tmp_path)
    use_machine(monkeypatch, tmp_path)
    for i in (2, 5):
        with pytest.raises(OpenRefused) as e:
            gpu(i).open()
        assert f"no GPU {i}" in str(e.value)
        assert "(it has 2)" in str(e.value)
        assert str(e.value).startswith(f"NV:{i}: ")
        assert e.value.stays == ""  # it took nothing


def test_usage_of_no_gpu_i(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """usage is "Error msg if the machine has no GPU i"."""
    two_gpus(tmp_path)
    use_machine(monkeypatch, tmp_path)
    with pytest.raises(RigError, match=r"no GPU 2 \(it has 2\)"):
        usage(2)


# -- (b) the kernel driver does not hold GPU i ------------------------------------------------


@pytest.mark.parametrize("driver", [None, "vfio-pci", "nouveau"])
def test_gpu_not_held_by_nvidia(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                driver: str | None) -> None:
    """make is Error if "the kernel driver does not hold GPU i"."""
    add_gpu(tmp_path, GPU_A)
    add_gpu(tmp_path, GPU_B, driver=driver)
    use_machine(monkeypatch, tmp_path)
    with pytest.raises(OpenRefused) as e:
        gpu(1).open()
    msg = str(e.value)
    assert "NVIDIA's kernel driver does not hold" in msg
    assert GPU_B in msg
    assert f"its driver is {driver or 'none'}" in msg
    assert msg.startswith(f"NV:1 ({GPU_B}): ")


def test_usage_of_a_gpu_not_held_by_nvidia(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    """usage is Error "if the kernel driver does not hold the GPU"."""
    add_gpu(tmp_path, GPU_A, driver="vfio-pci")
    use_machine(monkeypatch, tmp_path)
    with pytest.raises(RigError, match="NVIDIA's kernel driver does not hold") as e:
        usage(0)
    assert GPU_A in str(e.value)


# -- (c) misuse and names --------------------------------------------------------------------


def test_negative_index_is_misuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu "Raises Invalid_argument if i < 0", before it reads anything."""
    use_listing(monkeypatch, _forbidden)
    with pytest.raises(Misuse):
        gpu(-1)
    with pytest.raises(ValueError, match="-1"):
        gpu(-1).open()


def test_opener_names() -> None:
    """gpu i "is the opener of GPU i, named "NV" for 0 and "NV:i" otherwise"."""
    assert gpu(0).name == "NV"
    assert gpu(3).name == "NV:3"
    assert str(gpu(12)) == "NV:12"


def test_making_an_opener_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its make "opens the GPU that is ith when it runs": the opener itself reads nothing."""
    use_listing(monkeypatch, _forbidden)
    gpu(0)
    gpu(7)


# -- (d) usage's misuse ----------------------------------------------------------------------


@pytest.mark.parametrize(("i", "window"), [
    (-1, 1.0), (0, 0), (0, 0.0), (0, -1), (0, -0.5), (0, math.nan), (0, -math.inf),
])
def test_usage_misuse(monkeypatch: pytest.MonkeyPatch, i: int, window: float) -> None:
    """usage "Raises Invalid_argument if i < 0 or window is not positive (or is NaN) ...
    having read nothing"."""
    use_listing(monkeypatch, _forbidden)
    with pytest.raises(Misuse):
        usage(i, window=window)
    with pytest.raises(ValueError):
        usage(i, window)


# -- (e) a suspended GPU is not read ---------------------------------------------------------


@pytest.mark.parametrize(("status", "shown"), [
    ("suspended", "suspended"), ("suspending", "suspending"), ("resuming", "resuming"),
    (None, "unreadable"),
])
def test_usage_of_a_gpu_that_is_not_active(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           status: str | None, shown: str) -> None:
    """usage is Error "if the GPU's PCI function is not active by its power/runtime_status,
    or that cannot be read, since reading could resume a GPU the kernel suspended"; the
    autouse fixture fails the test if it opens a driver file."""
    add_gpu(tmp_path, GPU_A, runtime_status=status)
    use_machine(monkeypatch, tmp_path)
    with pytest.raises(RigError) as e:
        usage(0)
    msg = str(e.value)
    assert "runtime_status" in msg
    assert shown in msg
    assert GPU_A in msg


# -- (f) the PCI functions cannot be read ----------------------------------------------------


def test_listing_errors_refuse_the_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """make is Error if "the machine's PCI functions cannot be read, saying why"."""
    def listing() -> list[FunctionInfo]:
        raise RigError("the machine's PCI functions cannot be listed: Too many open files")

    use_listing(monkeypatch, listing)
    with pytest.raises(OpenRefused) as e:
        gpu(0).open()
    msg = str(e.value)
    assert "PCI functions cannot be read" in msg
    assert "Too many open files" in msg
    assert isinstance(e.value.__cause__, RigError)
    with pytest.raises(RigError, match="Too many open files"):
        usage(0)


def test_an_unlistable_sysfs_refuses_the_open(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """The same through rig_pci: /sys/bus/pci/devices that is no directory cannot be listed."""
    (tmp_path / "sys/bus/pci").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices").write_text("not a directory\n")
    use_machine(monkeypatch, tmp_path)
    with pytest.raises(OpenRefused, match="PCI functions cannot be read"):
        gpu(0).open()


# -- usage's answer, through a fake RM --------------------------------------------------------

NOW_NS = 1_000_000_000_000
RAM_KIB, FREE_KIB = 141_557_760, 140_000_000


@dataclass
class FakeRM:
    """The few RM controls usage sends, answered as a GPU's RM would."""

    samples: list[tuple[int, int]]  # (timeStamp ns, gr.util in hundredths of a percent)
    layouts: str = "580"
    calls: list[int] = field(default_factory=list)

    def control(self, obj: int, cmd: int, params: bytearray | None) -> None:
        assert obj == 0x5C000002 and params is not None
        self.calls.append(cmd)
        ffi = rm_ffi(self.layouts)
        if cmd == 0x20801301:  # NV2080_CTRL_CMD_FB_GET_INFO, the pointer form
            p: Any = ffi.from_buffer("NV2080_CTRL_INFO_LIST_PARAMS *", params)
            entries: Any = ffi.cast("NV2080_CTRL_INFO *", p.list)
            for k in range(p.listSize):
                entries[k].data = {0x7: RAM_KIB, 0x16: FREE_KIB}[entries[k].index]
        elif cmd == 0x20802096:  # PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2
            s: Any = ffi.from_buffer(
                "NV2080_CTRL_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2_PARAMS *", params)
            assert s.type == 2 and s.bufSize == 776 * 72
            for k, (stamp, util) in enumerate(self.samples):
                s.samples[k].base.timeStamp = stamp
                s.samples[k].gr.util = util
        elif cmd == 0x20800403:  # NV2080_CTRL_CMD_TIMER_GET_TIME
            t: Any = ffi.from_buffer("NV2080_CTRL_TIMER_GET_TIME_PARAMS *", params)
            t.time_nsec = NOW_NS
        else:
            raise AssertionError(f"usage sent control 0x{cmd:x}")


@dataclass
class FakeGpu:
    h_subdevice: int = 0x5C000002


def fake_rm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rm: FakeRM) -> None:
    add_gpu(tmp_path, GPU_A)
    use_machine(monkeypatch, tmp_path)
    monkeypatch.setattr(PROCESS, "client", lambda: rm)

    def gpu_of(bus: str) -> FakeGpu:
        assert bus == GPU_A
        return FakeGpu()

    monkeypatch.setattr(PROCESS, "gpu", gpu_of)


SAMPLES = [
    (NOW_NS - 100_000_000, 5000),     # 0.1 s ago, 50 %
    (NOW_NS - 900_000_000, 2500),     # 0.9 s ago, 25 %
    (NOW_NS - 1_500_000_000, 10000),  # 1.5 s ago, 100 %
    (NOW_NS - 10_000_000_000, 0),     # 10 s ago, idle
]


def test_usage_reads_memory_and_busy(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """memory_total and memory_free in bytes; busy "the mean of the RM's samples ... taken in
    the window usage reads, by the GPU's own clock"."""
    rm = FakeRM(SAMPLES)
    fake_rm(monkeypatch, tmp_path, rm)
    u = usage(0, window=1.0)
    assert u.memory_total == RAM_KIB * 1024
    assert u.memory_free == FREE_KIB * 1024
    assert u.busy == pytest.approx(37.5)
    assert usage(0, window=2).busy == pytest.approx((50 + 25 + 100) / 3)
    assert usage(0, window=14).busy == pytest.approx((50 + 25 + 100 + 0) / 4)
    # It reads and makes nothing else: no channel, address space or mapping.
    assert set(rm.calls) == {0x20801301, 0x20802096, 0x20800403}


def test_usage_without_samples_in_the_window(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    """busy is "None if the RM took none in that time, or takes none on this GPU"."""
    fake_rm(monkeypatch, tmp_path, FakeRM(SAMPLES))
    assert usage(0, window=0.05).busy is None
    monkeypatch.setattr(PROCESS, "client", lambda: FakeRM([]))
    assert usage(0).busy is None


def test_usage_with_an_infinite_window(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """"The RM keeps samples of about the last 14 seconds, so a longer window reads those"."""
    fake_rm(monkeypatch, tmp_path, FakeRM(SAMPLES))
    assert usage(0, window=math.inf).busy == pytest.approx(175 / 4)


# -- the GPU's clock: the RM's NV2080_CTRL_CMD_TIMER_GET_TIME --------------------------------


def test_the_paths_clock_is_the_rms_timer_of_its_subdevice() -> None:
    """Device.clock on this path is Clock.RM: gpu_time_ns sends TIMER_GET_TIME to the
    subdevice (FakeRM asserts the handle) and answers its time_nsec."""
    from rig_nv.clock import Clock
    from rig_nv.rm import ReadsClock
    from rig_nv_nvidia.path import NvidiaPath

    @dataclass
    class Opened:
        bus: str = GPU_A
        h_device: int = 0x5C000001
        h_subdevice: int = 0x5C000002
        h_vaspace: int = 0x5C000003

    rm = FakeRM([])
    path = NvidiaPath("NV", Opened(), rm, hang_ms=None)  # type: ignore[arg-type]
    assert isinstance(path, ReadsClock) and path.clock is Clock.RM
    assert path.gpu_time_ns() == NOW_NS and rm.calls == [0x20800403]


# -- index types (issue 20, item 4) ----------------------------------------------------------


@pytest.mark.parametrize("i", [True, False, 1.5, 1.0, "1", None])
def test_a_gpu_index_that_is_no_int_is_misuse(monkeypatch: pytest.MonkeyPatch, i: Any) -> None:
    """gpu i and usage i take an int: a bool (gpu(True) would open GPU 1 as "NV:True") or a
    float is Misuse, raised before anything is read, whether or not the machine has GPUs."""
    use_listing(monkeypatch, _forbidden)
    with pytest.raises(Misuse, match="GPU index is an int"):
        gpu(i)
    with pytest.raises(Misuse, match="GPU index is an int"):
        usage(i)
    with pytest.raises(Misuse, match="GPU index is an int"):
        opener.reaches(0, i)


@pytest.mark.parametrize("window", [True, False, "1", None, 1j])
def test_a_usage_window_that_is_no_number_is_misuse(monkeypatch: pytest.MonkeyPatch,
                                                    window: Any) -> None:
    """usage's window is a positive number of seconds: True is not one."""
    use_listing(monkeypatch, _forbidden)
    with pytest.raises(Misuse, match="window"):
        usage(0, window=window)


# -- a callback inside the process's lock (issue 20, item 2) ---------------------------------


def test_make_and_usage_from_a_callback_inside_the_lock_are_misuse(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """make "raises Invalid_argument, having opened nothing, from a callback inside a lock";
    usage raises it "having read nothing". The callback is this thread's own, inside the
    process's lock on the driver (as a signal handler or finalizer would run there): the
    refusal comes before the listing is read (use_listing fails the test otherwise)."""
    use_listing(monkeypatch, _forbidden)
    with PROCESS.locked():
        with PROCESS.locked():  # the driver's own calls nest; leaving one leaves it held
            pass
        with pytest.raises(Misuse, match="callback inside the process's lock"):
            gpu(0).open()
        with pytest.raises(Misuse, match="callback inside the process's lock"):
            usage(0)
        with pytest.raises(Misuse, match="callback inside the process's lock"):
            opener.reaches(0, 1)
    with pytest.raises(AssertionError, match="a driver file was touched"):
        usage(0)  # out of the lock, the call goes on (to the listing)


def test_another_threads_hold_of_the_lock_is_no_misuse() -> None:
    """Only the holding thread's callbacks are refused: another thread's call waits its turn."""
    import threading

    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with PROCESS.locked():
            inside.set()
            leave.wait(5)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert inside.wait(5)
        PROCESS.refuse_inside("usage")  # raises nothing on this thread
    finally:
        leave.set()
        t.join()
    PROCESS.refuse_inside("usage")


# -- usage's and reaches' errors (issue 20, items 5 and 7) -----------------------------------


def test_an_unreadable_runtime_status_renumbers_no_gpu(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """usage is Error "if the GPU's PCI function is not active by its power/runtime_status, or
    that cannot be read": a read that fails (here EISDIR) leaves GPU 0 GPU 0, refused for its
    runtime_status, and GPU 1 stays GPU 1 rather than "no GPU 1"."""
    add_gpu(tmp_path, GPU_A, runtime_status=None)
    add_gpu(tmp_path, GPU_B, runtime_status="suspended")
    (tmp_path / "sys/bus/pci/devices" / GPU_A / "power/runtime_status").mkdir(parents=True)
    use_machine(monkeypatch, tmp_path)
    with pytest.raises(RigError, match=rf"{GPU_A}.*runtime_status is unreadable"):
        usage(0)
    with pytest.raises(RigError, match=rf"NV:1 \({GPU_B}\).*runtime_status is suspended"):
        usage(1)


def test_usage_errors_are_no_open_refusals(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    """usage opens nothing: its Error msg is a RigError, never an opener's OpenRefused."""
    add_gpu(tmp_path, GPU_A, driver="vfio-pci")
    add_gpu(tmp_path, GPU_B, runtime_status="suspended")
    use_machine(monkeypatch, tmp_path)
    for i in (0, 1, 2):
        with pytest.raises(RigError) as e:
            usage(i)
        assert not isinstance(e.value, OpenRefused), str(e.value)


def test_reaches_does_not_read_a_gpu_that_may_be_suspended(monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    """reaches reads the RM of both GPUs: as usage, it refuses one whose PCI function is not
    active (reading could resume it), before any driver file is opened."""
    add_gpu(tmp_path, GPU_A)
    add_gpu(tmp_path, GPU_B, runtime_status="suspended")
    use_machine(monkeypatch, tmp_path)
    with pytest.raises(RigError, match=rf"{GPU_B}.*runtime_status is suspended") as e:
        opener.reaches(0, 1)
    assert not isinstance(e.value, OpenRefused)


def test_what_stays_names_the_uvm_registration_and_address_space(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """make's Error names what the kernel driver keeps for the process (Rig_nv.make): with a
    GPU opened before, that is its file and RM device, and its UVM registration and address
    space too."""
    from rig_nv_nvidia.driver import Gpu

    two_gpus(tmp_path)
    use_machine(monkeypatch, tmp_path)
    opened = Gpu(GPU_A, 0, 0x100, -1, 0x5C000001, 0x5C000002, b"u" * 16, 0x5C000003)
    monkeypatch.setattr(PROCESS, "gpus", {GPU_A: opened})
    with pytest.raises(OpenRefused, match="no GPU 2") as e:
        gpu(2).open()
    assert e.value.stays == (f"the GPU files and RM devices of {GPU_A}; "
                             f"the UVM registrations and address spaces of {GPU_A}")
