"""rig_pci.firmware.fetch against a local HTTP server on 127.0.0.1 serving fixture files."""

from __future__ import annotations

import hashlib
import http.server
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
    with pytest.raises(RigError, match=r"fmc-570\.144\.bin: fetching .* failed"):
        firmware.fetch(tmp_path / "fw", base_url=url, files=files, progress=None)
    assert not list((tmp_path / "fw").rglob("*fmc*"))


def test_progress_for_long_downloads(server: tuple[str, Path, list[str]], tmp_path: Path) -> None:
    url, root, _ = server
    big = bytes(range(256)) * (80 << 12)  # 20 MiB
    serve(root, "nvidia/ga102/gsp/gsp-570.144.bin", big)
    lines: list[str] = []
    firmware.fetch(tmp_path / "fw", base_url=url, files={
        "nvidia/ga102/gsp/gsp-570.144.bin": b2(big)}, progress=lines.append)
    assert any("[" in line and "MiB" in line for line in lines)
    assert lines[-1].startswith("fetched nvidia/ga102/gsp/gsp-570.144.bin")
