"""rig_pci.firmware.fetch against a local HTTP server on 127.0.0.1 serving fixture files."""

from __future__ import annotations

import hashlib
import http.server
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig_edge import RigError
from rig_pci import firmware


def b2(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=32).hexdigest()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Path, list[str]]]:
    root = tmp_path / "served"
    root.mkdir()
    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, directory=str(root), **kw)  # type: ignore[arg-type]

        def do_GET(self) -> None:
            asked.append(self.path)
            self.path = self.path.split("?")[0]
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/base", root, asked
    finally:
        httpd.shutdown()


def serve(root: Path, name: str, data: bytes) -> None:
    f = root / "base" / name
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(data)


def test_fetches_verifies_and_keeps(server: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    url, root, asked = server
    a, b = b"gsp image" * 1000, b"bootloader"
    serve(root, "nvidia/ga102/gsp/gsp-570.144.bin", a)
    serve(root, "nvidia/ga102/gsp/bootloader-570.144.bin", b)
    files = {"nvidia/ga102/gsp/gsp-570.144.bin": b2(a),
             "nvidia/ga102/gsp/bootloader-570.144.bin": b2(b)}
    target = tmp_path / "fw"
    said = firmware.fetch(target, base_url=url, files=files, progress=None)
    assert [s.split()[0] for s in said] == ["fetched", "fetched"]
    assert (target / "nvidia/ga102/gsp/gsp-570.144.bin").read_bytes() == a
    assert all(f"?id={firmware.LINUX_FIRMWARE_COMMIT}" in p for p in asked)
    again = firmware.fetch(target, base_url=url, files=files, progress=None)
    assert [s.split()[0] for s in again] == ["kept", "kept"]
    assert len(asked) == 2  # nothing fetched the second time
    assert not list(target.rglob("*.part"))


def test_a_digest_mismatch_leaves_no_file(server: tuple[str, Path, list[str]],
                                          tmp_path: Path) -> None:
    url, root, _ = server
    serve(root, "nvidia/ad102/gsp/booter_load-570.144.bin", b"not what was pinned")
    files = {"nvidia/ad102/gsp/booter_load-570.144.bin": b2(b"the pinned bytes")}
    with pytest.raises(RigError, match=r"booter_load-570\.144\.bin.*BLAKE2b-256"):
        firmware.fetch(tmp_path / "fw", base_url=url, files=files, progress=None)
    assert not list((tmp_path / "fw").rglob("*booter*"))


def test_a_network_failure_names_the_file(server: tuple[str, Path, list[str]],
                                          tmp_path: Path) -> None:
    url, _, _ = server
    files = {"nvidia/gb202/gsp/fmc-570.144.bin": b2(b"x")}  # not served: 404
    with pytest.raises(firmware.FetchFailed,
                       match=r"fmc-570\.144\.bin: fetching .* failed: HTTP 404 "):
        firmware.fetch(tmp_path / "fw", base_url=url, files=files, progress=None)
    assert not list((tmp_path / "fw").rglob("*fmc*"))


def test_two_fetches_at_once_install_only_the_pinned_file(server: tuple[str, Path, list[str]],
                                                          tmp_path: Path) -> None:
    """Issue 20 item 8: each fetch writes a temporary file of its own. A fetch whose download
    is damaged, running while another installs the file, must not write into the file the
    other installed (with one fixed ``.part`` name it did, and the other said "fetched")."""
    url, root, asked = server
    name = "nvidia/ga102/gsp/gsp-570.144.bin"
    good = bytes(range(256)) * (64 << 12)  # 16 MiB: progress is said after the first 8 MiB
    damaged = good[: 8 << 20] + bytes(len(good) - (8 << 20))
    serve(root, name, damaged)
    target, files = tmp_path / "fw", {name: b2(good)}
    other: list[list[str]] = []

    def midway(line: str) -> None:
        if not other:  # the first fetch is part way: the second runs whole, served well
            serve(root, name, good)
            other.append(firmware.fetch(target, base_url=url, files=files, progress=None))

    with pytest.raises(RigError, match=r"BLAKE2b-256 .* not the pinned"):
        firmware.fetch(target, base_url=url, files=files, progress=midway)
    assert len(asked) == 2 and other[0][0].startswith("fetched")
    assert firmware.digest(target / name) == b2(good)
    assert [p.name for p in target.rglob("*") if p.is_file()] == ["gsp-570.144.bin"]


def test_fetch_checks_the_digest_of_the_file_as_written(
        server: tuple[str, Path, list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 8: the digest is taken over the file written, so bytes that reach the
    disk other than they came (here: changed just before the fsync) are not installed."""
    url, root, _ = server
    name, data = "nvidia/ga102/gsp/bootloader-570.144.bin", b"bootloader" * 100
    serve(root, name, data)
    real = os.fsync

    def damaging(fd: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.pwrite(fd, b"X", 0)
        real(fd)

    monkeypatch.setattr(os, "fsync", damaging)
    with pytest.raises(RigError, match=r"BLAKE2b-256 .* not the pinned"):
        firmware.fetch(tmp_path / "fw", base_url=url, files={name: b2(data)}, progress=None)
    assert not [p for p in (tmp_path / "fw").rglob("*") if p.is_file()]


def test_fetch_fsyncs_the_directory_after_installing(server: tuple[str, Path, list[str]],
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 20 item 8: the rename is made durable by an fsync of the file's directory."""
    url, root, _ = server
    name, data = "nvidia/gb202/gsp/fmc-570.144.bin", b"fmc" * 100
    serve(root, name, data)
    installed = tmp_path / "fw" / name
    real, synced = os.fsync, []

    def recording(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append((os.fstat(fd).st_ino, installed.exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    firmware.fetch(tmp_path / "fw", base_url=url, files={name: b2(data)}, progress=None)
    assert (installed.parent.stat().st_ino, True) in synced


def test_progress_for_long_downloads(server: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    url, root, _ = server
    big = bytes(range(256)) * (80 << 12)  # 20 MiB
    serve(root, "nvidia/ga102/gsp/gsp-570.144.bin", big)
    lines: list[str] = []
    firmware.fetch(tmp_path / "fw", base_url=url, files={
        "nvidia/ga102/gsp/gsp-570.144.bin": b2(big)}, progress=lines.append)
    assert any("[" in line and "MiB" in line for line in lines)
    assert lines[-1].startswith("fetched nvidia/ga102/gsp/gsp-570.144.bin")
