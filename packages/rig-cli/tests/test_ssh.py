"""``rig list|info|reset --machine ssh://[user@]host[:port]``: the real command, its ssh (a
wrapper on PATH that adds the test's key and known hosts, as ~/.ssh/config would) reaching a
real SSH server on 127.0.0.1, whose agent serves a fixture tree (the address's /ROOT) as the
other machine (issue 21)."""

import json
import os
import shlex
import struct
from pathlib import Path

import pytest
from ssh_server import SSH, Server

from rig_cli.testing import rig
from rig_pci.testing import add_function

BUS = "0000:01:00.0"


@pytest.fixture
def there(tmp_path: Path, sshd: Server, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture tree the agent serves; ``ssh`` on PATH reaches the test's server."""
    root = tmp_path / "there"
    dev = add_function(root, BUS, vendor=0x10DE, device=0x2335, class_code=0x030200,
                       bars={0: (0xF000_0000, 16 << 20, False), 1: (0xE000_0000, 256 << 20, True)})
    with open(dev / "resource0", "r+b") as f:  # BOOT_42 of a GH100 (nv_ref.h), WPR2 down
        f.seek(0xA00)
        f.write(struct.pack("<I", 0x180A1000))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    options = " ".join(shlex.quote(o) for o in sshd.options())
    wrapper.write_text(f'#!/bin/sh\nexec {SSH} {options} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return root


def test_rig_list_over_ssh_equals_rig_list_of_the_same_tree(there: Path, sshd: Server) -> None:
    far = rig("list", "--json", "--machine", f"ssh://127.0.0.1:{sshd.port}{there}")
    assert far.returncode == 0, far.stderr
    near = rig("list", "--json", "--machine", str(there))
    assert json.loads(far.stdout) == json.loads(near.stdout)
    assert [r["bus"] for r in json.loads(far.stdout)] == [BUS]
    text = rig("list", "--machine", f"ssh://127.0.0.1:{sshd.port}{there}")
    assert text.returncode == 0 and "0000:01:00.0" in text.stdout and "NV-PCI" in text.stdout


def test_rig_info_and_reset_over_ssh(there: Path, sshd: Server) -> None:
    url = f"ssh://127.0.0.1:{sshd.port}{there}"
    info = rig("info", "--json", "--machine", url, "0")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["bus"] == BUS
    out = rig("reset", "--yes", "--machine", url, "0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"GPU 0 ({BUS}, H200, of the machine at {url}) is reset."
    dev = there / "sys/bus/pci/devices" / BUS
    assert (dev / "reset").read_text() == "1"  # written there, by the agent
    assert rig("info", "--machine", url, "3").returncode == 3


def test_bad_ssh_addresses_are_misuse_and_an_unreachable_machine_refused(
        there: Path, sshd: Server) -> None:
    for bad in ("ssh://", "ssh://host:port", "ssh://@host", "ssh://:22/x"):
        out = rig("list", "--machine", bad)
        assert out.returncode == 2 and "is not ssh://[user@]host[:port][/ROOT]" in out.stderr, bad
    sshd.close()
    out = rig("list", "--machine", f"ssh://127.0.0.1:{sshd.port}")
    assert out.returncode == 4
    assert out.stderr.startswith(f"rig: the machine at ssh://127.0.0.1:{sshd.port}: it cannot "
                                 "be reached: ssh exited with status 255")
    assert "Connection refused" in out.stderr
