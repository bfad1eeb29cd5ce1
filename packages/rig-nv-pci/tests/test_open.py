"""``gpu(i).make``'s preconditions, each refusal triggered on a fixture sysfs tree whose BAR 0
resource file holds the registers the open reads (NV_PMC_BOOT_42 at 0xA00,
NV_PFB_PRI_MMU_WPR2_ADDR_HI at 0x1FA828: nv_ref.h and tu102/dev_fb.h), and where an open goes
once they pass: the open reads its firmware images (test_held.py boots simulated GPUs through
the opener)."""

import fcntl
import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import firmware_builders
import pytest
from support import (
    AD104,
    BOOT_42,
    GA102,
    GB202,
    PROM,
    VBIOS,
    WPR2_HI,
    WPR2_LO,
    add_gpu,
    given_back,
    here,
    poke,
)
from support.machine import BUS

from rig_edge import Misuse, OpenRefused, RigError
from rig_nv_pci import gpu, lock, reset
from rig_pci import Function, Machine, firmware
from rig_pci.function import held as function_held
from rig_pci.listing import FunctionInfo
from rig_pci.testing import FakeVfio, FixtureSysfs, add_function, add_vfio, set_lockdown

GH100 = 0x180A1000

REPO_SRC = [str(p) for p in sorted(Path(__file__).resolve().parents[2].glob("*/src"))]


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Lock files under the test's directory; firmware searched only where a test puts it
    (rig's directory and /lib/firmware point at empty directories)."""
    locks = tmp_path / "locks"
    locks.mkdir()
    monkeypatch.setattr(lock, "directory", lambda: locks)
    monkeypatch.setattr(firmware, "directory", lambda: tmp_path / "rig-firmware")
    monkeypatch.setattr(firmware, "SYSTEM", tmp_path / "lib-firmware")
    return locks


def fake_firmware(root: Path, family: str, monkeypatch: pytest.MonkeyPatch,
                  *, pin: bool = True) -> Path:
    """A directory with a file of each name the family boots with; ``pin`` pins the table to
    their digests (their contents are not NVIDIA's)."""
    d = root / "fw"
    names = ["nvidia/ga102/gsp/gsp-570.144.bin", f"nvidia/{family}/gsp/bootloader-570.144.bin"]
    names += ([f"nvidia/{family}/gsp/fmc-570.144.bin"] if family == "gb202" else
              [f"nvidia/{family}/gsp/booter_load-570.144.bin",
               f"nvidia/{family}/gsp/booter_unload-570.144.bin"])
    for name in names:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(f"not NVIDIA's {name}".encode())
        if pin:
            digest = hashlib.blake2b((d / name).read_bytes(), digest_size=32).hexdigest()
            monkeypatch.setitem(firmware.NVIDIA_GSP_570_144, name, digest)
    return d


def refusal(machine: Machine, i: int = 0, **kwargs: object) -> str:
    with pytest.raises(OpenRefused) as e:
        gpu(i, machine, **kwargs).make()  # type: ignore[arg-type]
    assert e.value.stays == ""
    return str(e.value)


# ---- names and misuse --------------------------------------------------------------------------


def test_names_and_misuse() -> None:
    assert gpu(0).name == "NV-PCI" and gpu(3).name == "NV-PCI:3"
    with pytest.raises(Misuse):
        gpu(-1)
    for bad in (True, 1.5, "1"):  # issue 20 item 4's rule, rig_edge.opener_name's
        with pytest.raises(Misuse, match="a GPU index is an int"):
            gpu(bad)  # type: ignore[arg-type]
        with pytest.raises(Misuse, match="a GPU index is an int"):
            reset(bad)  # type: ignore[arg-type]
    with pytest.raises(Misuse):
        gpu(0, firmware="/some/dir")


def test_make_inside_another_open_or_change_is_misuse(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path)
    with lock.serial("a test's change"), pytest.raises(Misuse):
        gpu(0, machine).make()
    assert not function_held(machine, BUS) and not lock.held(machine, BUS)


# ---- before the function is taken --------------------------------------------------------------


def test_no_gpu_i_says_how_many(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path)
    add_function(tmp_path, "0000:01:00.1", vendor=0x10DE, device=0x1AEF, class_code=0x040300)
    assert refusal(machine, 2) == (
        f"GPU 2 of the machine at {tmp_path}: the machine at {tmp_path} has no GPU 2 (it has 1)"
    )


def test_listing_failure_says_why(tmp_path: Path) -> None:
    class Unlistable(FixtureSysfs):
        def functions(self) -> list[FunctionInfo]:
            raise RigError("the machine's PCI functions cannot be listed: Too many open files")

    text = refusal(Machine(Unlistable(tmp_path)))
    assert text == (
        f"GPU 0 of the machine at {tmp_path}: the machine at {tmp_path}'s PCI functions cannot "
        "be listed: Too many open files"
    )


def test_a_kernel_driver_holding_it_says_to_detach(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, driver="nvidia")
    assert refusal(machine) == (
        f"GPU 0 of the machine at {tmp_path} ({BUS}): the kernel driver nvidia holds it: detach "
        "it first (rig_nv_pci.detach(0), or `rig detach 0` as root)"
    )


def test_this_process_holding_it(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path)
    with Function.take(machine, BUS):
        assert "this process holds it" in refusal(machine)
    held = lock.BusLock.take(machine, BUS)
    try:
        assert "this process holds it" in refusal(machine)
    finally:
        held.release()


CHILD = """
import sys
import threading
import time
from pathlib import Path
from rig_nv_pci import lock
from rig_pci import Machine
locks, root, bus = sys.argv[1:]
lock.directory = lambda: Path(locks)
held = lock.BusLock.take(Machine.at(Path(root)), bus)
print("held", flush=True)
sys.stdin.readline()
held.release()
"""


def test_another_processs_open_holds_it(tmp_path: Path, isolated: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 10: another process's hold is waited for, with a bound, then refused
    clearly."""
    monkeypatch.setattr(lock, "BUS_WAIT_S", 0.3)
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, boot42=GH100)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(REPO_SRC)}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(isolated), str(tmp_path), BUS],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        text = refusal(machine)
        assert text.startswith(f"GPU 0 of the machine at {tmp_path} ({BUS}): another process "
                               "holds it (an open or change of it held ")
        assert text.endswith(" for the 0.3 s this one waited)")
        assert not function_held(machine, BUS)  # refused before taking anything
    finally:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    assert "chip GH100" in refusal(machine)  # its lock gone, the open goes on


def test_an_open_waits_for_another_processs_open_or_change_with_a_bound(
        tmp_path: Path, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec: "Opens and changes of NVIDIA GPUs run one at a time, so a boot delays the
    others." Another process's boot (its hold of rig-nv-pci.lock) delays this open, which
    goes on once it ends, and past the bound is refused saying so (issue 20 item 10)."""
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, boot42=GH100)
    fd = os.open(isolated / "rig-nv-pci.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # flock locks an open file: as another process's would
    monkeypatch.setattr(lock, "SERIAL_WAIT_S", 0.2)
    assert refusal(machine).startswith("NV-PCI's make waited 0.2 s for another process's open "
                                       "or change of an NVIDIA GPU, which holds ")
    assert not function_held(machine, BUS) and not lock.held(machine, BUS)
    monkeypatch.setattr(lock, "SERIAL_WAIT_S", 30.0)
    threading.Timer(0.3, os.close, (fd,)).start()
    start = time.monotonic()
    assert "chip GH100" in refusal(machine) and time.monotonic() - start >= 0.3


# ---- taking the function -----------------------------------------------------------------------


def test_behind_an_iommu_unbound_gives_takes_reason(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, iommu_group=7)
    assert refusal(machine) == (
        f"GPU 0 of the machine at {tmp_path} ({BUS}): its function cannot be taken: it lies "
        "behind an IOMMU (group 7): bind it to vfio-pci and grant access to /dev/vfio/7 to "
        "take it"
    )
    given_back(machine)


def test_locked_down_kernel(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path)
    set_lockdown(tmp_path, "integrity")
    assert refusal(machine).endswith(
        "its function cannot be taken: the kernel is locked down (integrity), which refuses "
        "PCI mappings from user space"
    )
    given_back(machine)


def vfio_gpu(root: Path, boot42: int, **fake: object) -> tuple[Machine, FakeVfio]:
    """A GPU bound to vfio-pci in IOMMU group 12, VFIO's device file holding BAR 0 (region 0,
    mappable) with ``boot42`` and config space (region 7)."""
    add_gpu(root, driver="vfio-pci", iommu_group=12)
    add_vfio(root, 12)
    device = root / "vfio-device"
    with open(device, "wb") as f:
        f.truncate(8 << FakeVfio.REGION_SHIFT)
    poke(root, BOOT_42, boot42, name="vfio-device")
    with open(device, "r+b") as f:
        f.seek(7 << FakeVfio.REGION_SHIFT)
        f.write((root / "sys/bus/pci/devices" / BUS / "config").read_bytes())
    regions = {0: (1 | 2 | 4, 16 << 20), 1: (1 | 2, 256 << 20), 7: (1 | 2, 256)}
    fake_vfio = FakeVfio(device, regions=regions, **fake)  # type: ignore[arg-type]
    machine, _ = here(root, ioctl=fake_vfio)
    return machine, fake_vfio


def test_a_group_that_is_not_viable(tmp_path: Path) -> None:
    machine, _ = vfio_gpu(tmp_path, GA102, viable=False)
    assert "its function cannot be taken: IOMMU group 12 is not viable" in refusal(machine)
    given_back(machine)


def test_a_machine_other_than_this_one(tmp_path: Path) -> None:
    add_gpu(tmp_path)
    machine = Machine.at(tmp_path)
    assert refusal(machine) == (
        f"GPU 0 of the machine at {tmp_path} ({BUS}): the machine at {tmp_path}'s memory is "
        "not this process's, so the windows an open maps are not the GPU's to reach (a machine "
        "reached through a transport cannot be opened)"
    )
    given_back(machine)


# ---- the chip, the firmware, WPR2 --------------------------------------------------------------


def test_gh100_is_refused_naming_the_chip(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, boot42=GH100)
    assert refusal(machine) == (
        f"GPU 0 of the machine at {tmp_path} ({BUS}): chip GH100 (boot42 0x180a1000) is not "
        "one this library boots; it boots GA102, GA103, GA104, GA106, GA107, AD102, AD103, "
        "AD104, AD106, AD107, GB202, GB203, GB205, GB206 and GB207"
    )
    given_back(machine)


def test_a_gpu_that_does_not_answer(tmp_path: Path) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, boot42=0xFFFFFFFF, runtime_status="suspended")
    assert refusal(machine).endswith(
        "it does not answer: NV_PMC_BOOT_42 reads 0xffffffff (its runtime power state is "
        "suspended)"
    )


def test_a_vbios_without_fwsec_is_refused_before_anything_changes(tmp_path: Path) -> None:
    machine, sysfs = here(tmp_path)
    dev = add_gpu(tmp_path, boot42=AD104)
    with open(dev / "resource0", "r+b") as f:
        f.seek(PROM)
        f.write(bytes(len(VBIOS)))
    assert "its VBIOS (read through the PROM window) has no usable FWSEC: " in refusal(machine)
    given_back(machine)
    assert sysfs.writes == []


@pytest.mark.parametrize(("boot42", "family", "files"),
                         [(GA102, "ga102", 4), (AD104, "ad102", 4), (GB202, "gb202", 3)])
def test_missing_firmware_names_the_files_and_directories(
    tmp_path: Path, boot42: int, family: str, files: int
) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, boot42=boot42)
    text = refusal(machine, firmware=[str(tmp_path / "mine")])
    chip = {"ga102": "GA102", "ad102": "AD104", "gb202": "GB202"}[family]
    assert text.startswith(
        f"GPU 0 of the machine at {tmp_path} ({BUS}): {files} of the {files} firmware files a "
        f"{chip} boots with are missing (`rig firmware nv` downloads them): firmware "
        "nvidia/ga102/gsp/gsp-570.144.bin with BLAKE2b-256 digest 877edf9f"
    )
    assert f"nvidia/{family}/gsp/bootloader-570.144.bin" in text
    assert (f"searched {tmp_path}/mine, {tmp_path}/rig-firmware, {tmp_path}/lib-firmware; "
            "none was found") in text
    given_back(machine)


def test_firmware_with_another_digest_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, boot42=AD104)
    fw = fake_firmware(tmp_path, "ad102", monkeypatch, pin=False)
    text = refusal(machine, firmware=[fw])
    found = fw / "nvidia/ad102/gsp/booter_load-570.144.bin"
    digest = hashlib.blake2b(found.read_bytes(), digest_size=32).hexdigest()
    assert "4 of the 4 firmware files a AD104 boots with are missing" in text
    assert f"{found} has digest {digest}" in text
    # One file right, the others wrong: only those are named.
    fake_firmware(tmp_path, "ad102", monkeypatch)
    monkeypatch.setitem(firmware.NVIDIA_GSP_570_144, "nvidia/ad102/gsp/booter_load-570.144.bin",
                        "00" * 32)
    text = refusal(machine, firmware=[fw])
    assert "1 of the 4 firmware files a AD104 boots with is missing" in text
    assert "booter_load" in text and "booter_unload" not in text


@pytest.mark.parametrize(("boot42", "family", "chip"),
                         [(GA102, "ga102", "GA102"), (AD104, "ad102", "AD104"),
                          (GB202, "gb202", "GB202")])
def test_every_check_passes_then_the_images_are_read_or_the_boot_is_not_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, boot42: int, family: str, chip: str
) -> None:
    """Past every check an open reads the firmware images: these are not NVIDIA's, and are
    refused naming the file."""
    machine, sysfs = here(tmp_path)
    add_gpu(tmp_path, boot42=boot42)
    fw = fake_firmware(tmp_path, family, monkeypatch)
    for _ in range(2):  # and again: the first gave everything back
        assert refusal(machine, firmware=[fw]) == (
            f"GPU 0 of the machine at {tmp_path} ({BUS}): a firmware file is not laid out "
            f"as its format says: {fw}/nvidia/ga102/gsp/gsp-570.144.bin: no ELF magic "
            "(found 6e6f7420) at offset 0x0"
        )
        given_back(machine)
    assert sysfs.writes == []  # nothing was changed: no reset, no driver write


def test_through_vfio_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    machine, fake_vfio = vfio_gpu(tmp_path, GB202)
    fw = fake_firmware(tmp_path, "gb202", monkeypatch)
    assert "not laid out as its format says" in refusal(machine, firmware=[fw])
    assert "GROUP_GET_DEVICE_FD 0000:01:00.0" in fake_vfio.calls
    given_back(machine)


def test_wpr2_up_is_reset_and_refused_if_it_stays_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine, sysfs = here(tmp_path)
    dev = add_gpu(tmp_path, wpr2=0x2FFF0)
    fw = fake_firmware(tmp_path, "ga102", monkeypatch)
    assert refusal(machine, firmware=[fw]).endswith(
        "its protected memory (WPR2) is still up after its reset "
        "(NV_PFB_PRI_MMU_WPR2_ADDR_HI reads 0x0002fff0)"
    )
    assert sysfs.writes == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]
    given_back(machine)
    # A reset that takes WPR2 down: the open goes on, and the GPU stays reset.
    sysfs.on_reset = lambda bus: poke(dev, WPR2_HI, 0)
    assert "not laid out as its format says" in refusal(machine, firmware=[fw])
    (dev / "reset").unlink()
    poke(dev, WPR2_HI, 0x2FFF0)
    assert refusal(machine, firmware=[fw]).endswith(
        "its protected memory (WPR2) is up from an earlier boot, and it cannot be reset: Linux "
        "has no reset for it"
    )
    given_back(machine)


def test_a_stale_wpr2_low_bound_is_not_wpr2_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WPR2 is up by its high bound alone (kgspIsWpr2Up_TU102; issue 24): a low bound left
    stale over a high bound of 0 is no reason to reset; a precondition reading the wrong
    bound fails here."""
    machine, sysfs = here(tmp_path)
    dev = add_gpu(tmp_path)
    poke(dev, WPR2_LO, 0x2FFF0)
    fw = fake_firmware(tmp_path, "ga102", monkeypatch)
    assert "not laid out as its format says" in refusal(machine, firmware=[fw])
    assert sysfs.writes == []
    given_back(machine)


def test_a_failed_reset_loses_the_gpu_and_its_next_open_resets_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec: "A GPU [...] whose reset has failed, is lost, and its next open resets it
    first." reset's function reset goes through but the GPU does not respond after it; once
    it answers again (WPR2 down), the next open resets it before going on. A reset Linux has
    none for changed nothing, and loses nothing."""
    import rig_nv_pci

    machine, sysfs = here(tmp_path)
    dev = add_gpu(tmp_path)
    fw = fake_firmware(tmp_path, "ga102", monkeypatch)
    config = (dev / "config").read_bytes()

    def gone(bus: str) -> None:
        with open(dev / "config", "r+b") as f:
            f.write(b"\xff\xff")

    sysfs.on_reset = gone
    with pytest.raises(RigError, match="it does not respond after its reset"):
        rig_nv_pci.reset(0, machine)
    given_back(machine)
    (dev / "config").write_bytes(config)  # it answers again
    sysfs.on_reset = None
    writes = len(sysfs.writes)
    assert "not laid out as its format says" in refusal(machine, firmware=[fw])
    assert sysfs.writes[writes:] == [(f"/sys/bus/pci/devices/{BUS}/reset", "1")]
    # the GPU so reset stays reset: the next open resets it no more
    assert "not laid out as its format says" in refusal(machine, firmware=[fw])
    assert len(sysfs.writes) == writes + 1
    # a GPU Linux has no reset for: reset changed nothing and the GPU is not lost
    (dev / "reset").unlink()
    with pytest.raises(RigError, match="Linux has no reset for it"):
        rig_nv_pci.reset(0, machine)
    assert "not laid out as its format says" in refusal(machine, firmware=[fw])
    assert not rig_nv_pci.opener.lost(machine, BUS)


def test_make_opens_the_gpu_that_is_ith_when_it_runs(tmp_path: Path) -> None:
    """The spec: make boots the GPU that is ith when it runs: an opener made before a GPU
    with a lower bus address appeared names that one."""
    machine, _ = here(tmp_path)
    add_gpu(tmp_path, "0000:41:00.0", boot42=GH100)
    opener = gpu(0, machine)
    add_gpu(tmp_path, BUS, boot42=GH100)
    with pytest.raises(OpenRefused, match=rf"^GPU 0 of the machine at .* \({BUS}\): chip GH100"):
        opener.make()


def test_a_vbios_without_a_fwsec_prod_entry_is_refused_naming_what_it_lacks(
    tmp_path: Path,
) -> None:
    """The spec: on Ampere and Ada, make is refused if the VBIOS lacks a FWSEC this library
    runs, naming what it lacks: here its ucode table has no FWSEC_PROD (application id 0x85)."""
    machine, sysfs = here(tmp_path)
    dev = add_gpu(tmp_path)
    v = firmware_builders.build_vbios()
    with open(dev / "resource0", "r+b") as f:
        f.seek(PROM + v.prod_entry_offset)
        f.write(b"\x86")
    assert refusal(machine) == (
        f"GPU 0 of the machine at {tmp_path} ({BUS}): its VBIOS (read through the PROM window) "
        "has no usable FWSEC: VBIOS's falcon ucode table at 0x1080 has no FWSEC entry "
        "(application id "
        "0x85); its entries are 0x45, 0x01, 0x86"
    )
    given_back(machine)
    assert sysfs.writes == []
