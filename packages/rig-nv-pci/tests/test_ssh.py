"""buses, count and reset of another machine's GPUs over SSH (the Rig_nv_pci spec: "buses,
count and reset also reach another machine through a Rig_pci.Machine.t transport, which an
open refuses"), against a real SSH server on 127.0.0.1 whose agent serves a fixture tree."""

import os
import shutil
import struct
from pathlib import Path

import pytest
from ssh_server import Server  # rig-pci's tests/ssh_server.py (conftest.py)

import rig_nv_pci
from rig_edge import OpenRefused, RigError
from rig_nv_pci import lock
from rig_pci import Function, Machine, locks
from rig_pci.testing import add_function

BUS = "0000:01:00.0"
GA102 = 0x172A1000
BOOT_42, WPR2_HI = 0xA00, 0x1FA828  # nv_ref.h; tu102/dev_fb.h NV_PFB_PRI_MMU_WPR2_ADDR_HI


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "locks"
    d.mkdir()
    monkeypatch.setattr(lock, "directory", lambda: d)


def gpu_tree(root: Path, *, wpr2: int = 0) -> Path:
    """A GA102 with no driver, its BAR 0 reading BOOT_42 and WPR2 as given, and a NIC."""
    dev = add_function(root, BUS, vendor=0x10DE, device=0x2204, class_code=0x030000,
                       bars={0: (0xF000_0000, 16 << 20, False), 1: (0xE000_0000, 256 << 20, True)})
    add_function(root, "0000:02:00.0", vendor=0x8086, device=0x1572, class_code=0x020000,
                 driver="i40e")
    with open(dev / "resource0", "r+b") as f:
        f.seek(BOOT_42)
        f.write(struct.pack("<I", GA102))
        f.seek(WPR2_HI)
        f.write(struct.pack("<I", wpr2))
    return Path(os.path.realpath(dev))


def files(dev: Path) -> dict[str, bytes]:
    return {name: (dev / name).read_bytes() for name in ("config", "reset", "resource0")}


def test_buses_and_count_over_ssh_equal_the_local_ones(tmp_path: Path, sshd: Server) -> None:
    gpu_tree(tmp_path)
    with sshd.machine(tmp_path) as there:
        assert rig_nv_pci.buses(there) == rig_nv_pci.buses(Machine.at(tmp_path)) == [BUS]
        assert rig_nv_pci.count(there) == 1


def test_a_reset_over_ssh_of_a_fixture_gpu_does_what_a_local_one_does(
        tmp_path: Path, sshd: Server) -> None:
    here, there_root = gpu_tree(tmp_path / "here"), gpu_tree(tmp_path / "there")
    assert files(here) == files(there_root)
    rig_nv_pci.reset(0, Machine.at(tmp_path / "here"))
    with sshd.machine(tmp_path / "there") as there:
        rig_nv_pci.reset(0, there)
        assert not lock.held(there, BUS)
        # the function and the GPU's lock were let go there: another process takes both
        Function.take(Machine.at(tmp_path / "there"), BUS).close()
        locks.FileLock.take(tmp_path / "there/run/lock" / f"rig-nv-pci-{BUS}.lock").release()
    assert files(here) == files(there_root)
    assert (there_root / "reset").read_text() == "1"
    assert struct.unpack_from("<H", (there_root / "config").read_bytes(), 4)[0] & 0x4 == 0


def test_a_reset_over_ssh_that_leaves_wpr2_up_fails_as_a_local_one(
        tmp_path: Path, sshd: Server) -> None:
    gpu_tree(tmp_path / "here", wpr2=0x10)
    gpu_tree(tmp_path / "there", wpr2=0x10)
    local = Machine.at(tmp_path / "here")
    with pytest.raises(RigError) as here:
        rig_nv_pci.reset(0, local)
    with sshd.machine(tmp_path / "there") as there, pytest.raises(RigError) as far:
        rig_nv_pci.reset(0, there)
    assert str(far.value) == str(here.value).replace(local.name, there.name)
    assert "still up after its reset (NV_PFB_PRI_MMU_WPR2_ADDR_HI reads 0x00000010)" in str(
        far.value)
    assert rig_nv_pci.opener.lost(local, BUS) and rig_nv_pci.opener.lost(there, BUS)


def test_the_gpu_s_lock_is_taken_on_that_machine(tmp_path: Path, sshd: Server) -> None:
    """Another process there holding the GPU's lock file keeps a reset over SSH off it, and a
    lock taken over SSH keeps that machine's other processes off."""
    dev = gpu_tree(tmp_path)
    file = tmp_path / "run/lock" / f"rig-nv-pci-{BUS}.lock"
    file.parent.mkdir(parents=True)
    with sshd.machine(tmp_path) as there:
        held = locks.FileLock.take(file)  # this test's process is another process there
        with pytest.raises(RigError, match=f"another process holds it .*{file}"):
            rig_nv_pci.reset(0, there)
        held.release()
        assert (dev / "reset").read_text() == ""  # nothing was reset
        taken = lock.BusLock.take(there, BUS)
        with pytest.raises(RigError, match="another process holds it"):
            locks.FileLock.take(file)
        taken.release()
        locks.FileLock.take(file).release()


def test_an_open_over_ssh_is_refused_as_the_spec_says(tmp_path: Path, sshd: Server) -> None:
    gpu_tree(tmp_path)
    with sshd.machine(tmp_path) as there:
        with pytest.raises(OpenRefused) as e:
            rig_nv_pci.gpu(0, machine=there).make()
        assert str(e.value) == (
            f"GPU 0 of {there.name} ({BUS}): {there.name}'s memory is not this process's, so "
            "the windows an open maps are not the GPU's to reach (a machine reached through a "
            "transport cannot be opened)")
        rig_nv_pci.reset(0, there)  # the refused open let the GPU go


def test_a_machine_without_ssh_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("ssh") is None
    with pytest.raises(RigError, match="the machine at ssh://gpu-host: it cannot be reached: "
                                       "ssh cannot be run: No such file or directory"):
        rig_nv_pci.count(Machine.ssh("gpu-host"))
