"""rig_pci.firmware: rig's directory, and finding files by BLAKE2b-256 digest in the caller's
directories, then rig's, then /lib/firmware."""

import hashlib
import os
from pathlib import Path

import pytest

from rig_edge import Misuse, RigError
from rig_pci import firmware

NAME = "vendor/chip/fw-1.0.bin"


def blake(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


def put(d: Path, data: bytes) -> Path:
    path = d / NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path, Path]:
    """Two caller's directories, rig's directory and the system's, all under tmp."""
    mine, also, rigs, system = (tmp_path / n for n in ("mine", "also", "rigs", "system"))
    monkeypatch.setattr(firmware, "directory", lambda: rigs)
    monkeypatch.setattr(firmware, "SYSTEM", system)
    return mine, also, rigs, system


def test_directory_under_the_users_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert firmware.directory() == tmp_path / "data/rig/firmware"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert firmware.directory() == tmp_path / "home/.local/share/rig/firmware"


def test_directory_as_root_is_under_roots_home(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv("XDG_DATA_HOME", "/home/someone/.local/share")  # as sudo may keep it
    assert firmware.directory() == Path(pwd.getpwuid(0).pw_dir) / ".local/share/rig/firmware"


def test_search_order_callers_then_rigs_then_system(dirs: tuple[Path, ...]) -> None:
    mine, also, rigs, system = dirs
    data = b"the right bytes"
    for d in (also, rigs, system):
        put(d, data)
    assert firmware.search_path([mine, also]) == [mine, also, rigs, system]
    assert firmware.find([mine, also], NAME, blake(data)) == also / NAME
    assert firmware.find([], NAME, blake(data)) == rigs / NAME
    (rigs / NAME).unlink()
    assert firmware.find([], NAME, blake(data).upper()) == system / NAME


def test_a_file_with_another_digest_is_passed_over(dirs: tuple[Path, ...]) -> None:
    mine, _also, rigs, _system = dirs
    put(mine, b"another release")
    put(rigs, b"the right bytes")
    assert firmware.find([mine], NAME, blake(b"the right bytes")) == rigs / NAME


def test_missing_names_every_directory_and_every_mismatch(dirs: tuple[Path, ...]) -> None:
    mine, also, rigs, system = dirs
    put(mine, b"damaged")
    want = blake(b"the right bytes")
    with pytest.raises(RigError) as e:
        firmware.find([mine, also], NAME, want)
    msg = str(e.value)
    assert NAME in msg and want in msg
    for d in (mine, also, rigs, system):
        assert str(d) in msg
    assert f"{mine / NAME} has digest {blake(b'damaged')}" in msg


def test_misuse(dirs: tuple[Path, ...]) -> None:
    for name in ("/etc/passwd", "../x.bin", ""):
        with pytest.raises(Misuse):
            firmware.find([], name, "0" * 64)
    with pytest.raises(Misuse):
        firmware.find([], NAME, "abc")


def test_pinned_nvidia_set() -> None:
    table = firmware.NVIDIA_GSP_570_144
    assert firmware.LINUX_FIRMWARE_COMMIT == "0a6871b19abf5d6e024b5d208b101ae53e7fa0de"
    assert len(table) == 9
    assert all(len(d) == 64 and int(d, 16) >= 0 for d in table.values())
    for family in ("ga102", "ad102"):
        for image in ("bootloader", "booter_load", "booter_unload"):
            assert f"nvidia/{family}/gsp/{image}-570.144.bin" in table
    assert table["nvidia/ga102/gsp/gsp-570.144.bin"].startswith("877edf9f")
    assert table["nvidia/gb202/gsp/fmc-570.144.bin"].startswith("eeca0ba4")
