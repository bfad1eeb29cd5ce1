"""NVIDIA's GSP 570.144 firmware files from Debian's package firmware-nvidia-graphics, for the
tests that parse NVIDIA's own files (never committed: the package's licence is NVIDIA's).

:func:`fetch` reads the package's entry in Debian unstable's non-free-firmware index, downloads
the .deb it names, checks its SHA-256 against the index, and writes its
``nvidia/*/gsp/*-570.144.bin`` files (links kept as links) under a directory, with no apt.
Where unstable no longer carries a package,
the one these tests were written against (20260916-1, linux-firmware 20260916) comes from
snapshot.debian.org by its SHA-1. The tests check each file's BLAKE2b-256 digest themselves.
Run as a script it fills a directory: ``python debian_firmware.py DIR``.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import re
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

MIRROR = "https://deb.debian.org/debian"
INDEX = f"{MIRROR}/dists/sid/non-free-firmware/binary-all/Packages.xz"
PACKAGE = "firmware-nvidia-graphics"
# The package the pinned digests were computed from: snapshot.debian.org keeps every file
# Debian ever published, by its SHA-1 (https://snapshot.debian.org/file/SHA1).
PINNED_SHA1 = "af4cff8a7712ab0d75edb46ced146415b4ba3e54"
PINNED_SHA256 = "438dea065c930a4626c9cb711635149507471307f9d7ede9b981c61f963e0d68"
SNAPSHOT = f"https://snapshot.debian.org/file/{PINNED_SHA1}"
WANTED = re.compile(r"^(?:\./)?usr/lib/firmware/(nvidia/[a-z0-9]+/gsp/[a-z_]+-570\.144\.bin)$")
TIMEOUT_S = 60.0


class FetchError(Exception):
    """The package could not be fetched or read; the message says where and why."""


def _get(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
            data: bytes = reply.read()
            return data
    except OSError as e:  # urllib's URLError and HTTPError among them
        raise FetchError(f"{url}: {e}") from e


def current() -> tuple[str, str]:
    """(URL, SHA-256) of the package unstable carries now, from its index."""
    try:
        text = lzma.decompress(_get(INDEX)).decode()
    except lzma.LZMAError as e:
        raise FetchError(f"{INDEX} is not xz: {e}") from e
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if fields.get("Package") == PACKAGE:
            return f"{MIRROR}/{fields['Filename']}", fields["SHA256"]
    raise FetchError(f"{INDEX} has no {PACKAGE}")


def _data_tar(deb: bytes) -> bytes:
    """The data.tar.* member of a .deb (an ar archive: deb(5))."""
    if not deb.startswith(b"!<arch>\n"):
        raise FetchError("the package is not an ar archive")
    at = 8
    while at + 60 <= len(deb):
        name, size = deb[at:at + 16].decode().strip().rstrip("/"), int(deb[at + 48:at + 58])
        if name.startswith("data.tar"):
            return deb[at + 60:at + 60 + size]
        at += 60 + size + (size & 1)
    raise FetchError("the package has no data.tar member")


def extract(deb: bytes, into: Path) -> list[str]:
    """Write the package's GSP 570.144 files under ``into`` by their linux-firmware paths
    (a link stays a link, as linux-firmware has ad102's gsp-570.144.bin); their names."""
    names = []
    with tarfile.open(fileobj=io.BytesIO(_data_tar(deb)), mode="r|*") as tar:
        for member in tar:
            match = WANTED.match(member.name)
            if match is None:
                continue
            path = into / match[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            if member.issym():
                target = (path.parent / member.linkname).resolve()
                if not target.is_relative_to(into.resolve()):
                    raise FetchError(f"{member.name} links out of the firmware tree")
                path.unlink(missing_ok=True)
                os.symlink(member.linkname, path)
            elif member.isfile():
                source = tar.extractfile(member)
                assert source is not None
                path.write_bytes(source.read())
            else:
                continue
            names.append(match[1])
    return sorted(names)


def fetch(into: Path) -> str:
    """Fill ``into`` with the GSP 570.144 files of Debian's firmware-nvidia-graphics: the
    package unstable carries, else the pinned one from snapshot.debian.org. Returns the URL
    fetched. Raises :class:`FetchError` saying why, for each place tried, when none could be."""
    failures = []
    try:
        candidates = [current()]
    except FetchError as e:
        failures.append(str(e))
        candidates = []
    if not any(sha == PINNED_SHA256 for _, sha in candidates):
        candidates.append((SNAPSHOT, PINNED_SHA256))
    for url, sha256 in candidates:
        try:
            deb = _get(url)
            got = hashlib.sha256(deb).hexdigest()
            if got != sha256:
                raise FetchError(f"{url} has SHA-256 {got}, not the index's {sha256}")
            if not extract(deb, into):
                raise FetchError(f"{url} has no nvidia/*/gsp/*-570.144.bin")
            return url
        except (FetchError, tarfile.TarError, lzma.LZMAError, OSError) as e:
            failures.append(str(e))
    raise FetchError(f"Debian's {PACKAGE} could not be fetched: " + "; ".join(failures))


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="rig-nv-fw-"))
    print(f"fetched {fetch(target)} into {target}")
