"""debian_firmware, the tests' fetch of NVIDIA's firmware from Debian (issue 20 item 13), on a
package built here and served from 127.0.0.1: what it writes, and why it fails."""

from __future__ import annotations

import hashlib
import http.server
import io
import lzma
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import debian_firmware
import pytest

GSP = b"NVIDIA's GSP image stands here" * 100


def deb() -> bytes:
    """A .deb (deb(5): an ar archive) whose data.tar.xz holds a GSP image, a link to it and
    a file of another release."""
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w:xz") as t:
        def add(name: str, data: bytes = b"", link: str | None = None) -> None:
            info = tarfile.TarInfo(f"./usr/lib/firmware/nvidia/{name}")
            if link is None:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, link
                t.addfile(info)
        add("ga102/gsp/gsp-570.144.bin", GSP)
        add("ad102/gsp/gsp-570.144.bin", link="../../ga102/gsp/gsp-570.144.bin")
        add("ga102/gsp/gsp-535.113.01.bin", b"another release")
    out = b"!<arch>\n"
    for name, data in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", tar.getvalue())):
        out += name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"100644".ljust(8)
        out += str(len(data)).encode().ljust(10) + b"`\n" + data + b"\n" * (len(data) & 1)
    return out


@pytest.fixture
def mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A Debian mirror on 127.0.0.1 serving ``tmp_path/served`` (debian_firmware pointed at
    it, snapshot.debian.org at a file it lacks)."""
    root = tmp_path / "served"
    root.mkdir()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kw: object) -> None:
            super().__init__(*args, directory=str(root), **kw)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setattr(debian_firmware, "MIRROR", url)
    monkeypatch.setattr(debian_firmware, "INDEX", f"{url}/Packages.xz")
    monkeypatch.setattr(debian_firmware, "SNAPSHOT", f"{url}/snapshot/file")
    try:
        yield root
    finally:
        httpd.shutdown()


def publish(root: Path, package: bytes, *, sha256: str | None = None) -> None:
    (root / "pool").mkdir(exist_ok=True)
    (root / "pool/fw.deb").write_bytes(package)
    stanza = (f"Package: firmware-nvidia-graphics\nFilename: pool/fw.deb\n"
              f"SHA256: {sha256 or hashlib.sha256(package).hexdigest()}\n")
    (root / "Packages.xz").write_bytes(lzma.compress(f"Package: other\n\n{stanza}\n".encode()))


def test_the_package_unstable_carries_gives_its_gsp_files_links_kept(mirror: Path,
                                                                     tmp_path: Path) -> None:
    """Issue 20 item 13: the tests that parse NVIDIA's files fetch them from Debian's
    firmware-nvidia-graphics at test time, by their linux-firmware paths."""
    publish(mirror, deb())
    into = tmp_path / "fw"
    assert debian_firmware.fetch(into).endswith("/pool/fw.deb")
    assert (into / "nvidia/ga102/gsp/gsp-570.144.bin").read_bytes() == GSP
    link = into / "nvidia/ad102/gsp/gsp-570.144.bin"
    assert link.is_symlink() and link.read_bytes() == GSP
    assert sorted(str(p.relative_to(into)) for p in into.rglob("*.bin")) == [
        "nvidia/ad102/gsp/gsp-570.144.bin", "nvidia/ga102/gsp/gsp-570.144.bin"]


def test_a_fetch_that_fails_says_why_for_each_place_tried(mirror: Path, tmp_path: Path) -> None:
    """Issue 20 item 13: the real-firmware tests skip only where the fetch fails, saying why:
    here a package whose SHA-256 is not the index's, and no snapshot to fall back on."""
    publish(mirror, deb(), sha256="0" * 64)
    with pytest.raises(debian_firmware.FetchError) as e:
        debian_firmware.fetch(tmp_path / "fw")
    text = str(e.value)
    assert text.startswith("Debian's firmware-nvidia-graphics could not be fetched: ")
    assert f"not the index's {'0' * 64}" in text and "/snapshot/file: HTTP Error 404" in text
    assert not list((tmp_path / "fw").rglob("*.bin"))
