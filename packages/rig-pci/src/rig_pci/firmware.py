"""Firmware files: where rig keeps them, and finding one by name and BLAKE2b-256 digest.

:func:`find` reads the caller's directories first, then rig's own (:func:`directory`), then
the system's /lib/firmware, and takes the first file of that name whose digest matches: a
file of the same name with another digest (another release, a damaged download) is passed
over and named in the error. Only :func:`fetch` downloads (what ``rig firmware nv`` runs).

:data:`NVIDIA_GSP_570_144` pins the files of linux-firmware's nvidia/ directory that a boot of
NVIDIA's GSP firmware 570.144 reads (the ``Rig_nv_pci`` spec's Firmware section), each by its
digest, as linux-firmware has them at commit :data:`LINUX_FIRMWARE_COMMIT`.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import tempfile
import urllib.error
from collections.abc import Callable, Iterable
from pathlib import Path

from rig_edge import Misuse, RigError

SYSTEM = Path("/lib/firmware")
DIGEST_SIZE = 32  # BLAKE2b-256: hashlib.blake2b(digest_size=32)

# linux-firmware (git.kernel.org/pub/scm/linux/kernel/git/firmware/linux-firmware.git)
LINUX_FIRMWARE_COMMIT = "0a6871b19abf5d6e024b5d208b101ae53e7fa0de"

# The GSP's firmware is one file for every family (ad102's gsp-570.144.bin is a link to
# ga102's); the bootloader, the image that starts the GSP (booter_load on Ampere and Ada, the
# FMC on Blackwell) and, on Ampere and Ada, the booter that takes the boot down at its stop
# are per family. The two booter_unload digests were computed from Debian's
# firmware-nvidia-graphics (linux-firmware 20260916, rig-nv-pci's tests/debian_firmware.py),
# whose other seven files match the digests the rig-pci issue pins from the commit above.
NVIDIA_GSP_570_144: dict[str, str] = {
    "nvidia/ga102/gsp/gsp-570.144.bin":
        "877edf9f772d262d1ea72b9a6ebe52643e60a37c1d312f6456ebbf7f03feb03f",
    "nvidia/ga102/gsp/bootloader-570.144.bin":
        "ae4ca5499421f1eb508f2378a242eecd79dcfc6cccb1d038a2c3a65a1d612d22",
    "nvidia/ga102/gsp/booter_load-570.144.bin":
        "5e8b7daacf8bf6bc6a1fb85f556230f584fb06c045b68ed3342caada357f7ea3",
    "nvidia/ga102/gsp/booter_unload-570.144.bin":
        "a50f6fdfdd7795e15dd7ce7b7bf768e154cbd89279ed6713cbab4018d4d612ca",
    "nvidia/ad102/gsp/bootloader-570.144.bin":
        "a83162120a5e1b6d8a4ef8f61bd4492423da1bd5aa051112c427148bc3e48b31",
    "nvidia/ad102/gsp/booter_load-570.144.bin":
        "3d70b4ad5b9e27983c645019a2dd30f300e0ce869120004eac5357e1e2fe7b40",
    "nvidia/ad102/gsp/booter_unload-570.144.bin":
        "5afefa3797ea1c6bb94b721ccc75546a68fb497fa3911f8135f060897e822b7d",
    "nvidia/gb202/gsp/bootloader-570.144.bin":
        "9cba35e93b2a6776fe68319a0bb1486bccb6a2e493dcf3c57ddab2686b2c0426",
    "nvidia/gb202/gsp/fmc-570.144.bin":
        "eeca0ba4232118ee41adaa2d8f5dc921f8ee23131cfdc5ebeb0fbf11885f6d46",
}


def directory() -> Path:
    """rig's firmware directory: ``rig/firmware`` under the user's data directory.

    That is ``$XDG_DATA_HOME/rig/firmware`` when ``XDG_DATA_HOME`` is an absolute path, else
    ``~/.local/share/rig/firmware`` (the XDG Base Directory default). Run as root (effective
    uid 0) it is always under root's home from the password database, ignoring the
    environment, which ``sudo`` may carry over from the user who ran it. The directory need
    not exist. Changes nothing.
    """
    if os.geteuid() == 0:
        return Path(pwd.getpwuid(0).pw_dir) / ".local/share/rig/firmware"
    data = os.environ.get("XDG_DATA_HOME", "")
    base = Path(data) if os.path.isabs(data) else Path.home() / ".local/share"
    return base / "rig/firmware"


def digest(path: Path) -> str:
    """The BLAKE2b-256 digest of the file ``path``, in hex; raises :class:`OSError`."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def search_path(dirs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Where :func:`find` looks, in order: ``dirs``, :func:`directory`, /lib/firmware."""
    return [*(Path(d) for d in dirs), directory(), SYSTEM]


def find(dirs: Iterable[str | os.PathLike[str]], name: str, want: str) -> Path:
    """The first file ``name`` (a relative path such as ``nvidia/ga102/gsp/gsp-570.144.bin``)
    whose BLAKE2b-256 digest is ``want`` (64 hex digits), looking in ``dirs``, then rig's
    directory, then /lib/firmware.

    Raises :class:`rig_edge.RigError` when none matches, naming the file, every directory
    searched and every file found with another digest (with its digest) or unreadable.
    Raises :class:`rig_edge.Misuse` if ``name`` is absolute or climbs out with ``..``, or
    ``want`` is no BLAKE2b-256 digest.
    """
    if os.path.isabs(name) or ".." in Path(name).parts or not name:
        raise Misuse(f"firmware name {name!r} is not a relative path inside a directory")
    want = want.lower()
    if len(want) != 2 * DIGEST_SIZE or any(c not in "0123456789abcdef" for c in want):
        raise Misuse(f"{want!r} is not a BLAKE2b-256 digest (64 hex digits)")
    searched = search_path(dirs)
    others = []
    for d in searched:
        path = d / name
        try:
            got = digest(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            others.append(f"{path} cannot be read ({e.strerror})")
            continue
        if got == want:
            return path
        others.append(f"{path} has digest {got}")
    found = "; ".join(others) if others else "none was found"
    raise RigError(
        f"firmware {name} with BLAKE2b-256 digest {want} is missing: searched "
        f"{', '.join(str(d) for d in searched)}; {found}"
    )


# Where `fetch` reads linux-firmware's files from (cgit's raw view at a commit).
LINUX_FIRMWARE_URL = "https://git.kernel.org/pub/scm/linux/kernel/git/firmware/linux-firmware.git/plain"


class FetchFailed(RigError):
    """A download could not be made: the network, the server or the file system failed.

    Something broke, nobody refused: ``rig firmware nv`` exits 1 on it, with the cause."""


def fetch(
    target: str | os.PathLike[str] | None = None,
    *,
    base_url: str = LINUX_FIRMWARE_URL,
    files: dict[str, str] | None = None,
    commit: str = LINUX_FIRMWARE_COMMIT,
    progress: Callable[[str], None] | None = print,
    timeout: float = 60.0,
) -> list[str]:
    """Fetch the pinned NVIDIA set (``files``: name -> BLAKE2b-256) into ``target`` (rig's
    own :func:`directory` by default), from linux-firmware at ``commit`` over HTTPS.

    A file whose digest already matches is kept. Each download goes to a temporary file of its
    own beside the file, is fsynced, read back and its digest checked, then renamed over the
    file and the directory fsynced: fetches running at once each install a whole file, and a
    mismatch or a failure leaves no partial file. A digest mismatch raises
    :class:`rig_edge.RigError`; a network or file-system failure raises :class:`FetchFailed`,
    each naming the file and the cause. Reports a line per file (kept or fetched, with
    progress for long downloads) to ``progress``; returns those lines.
    """
    root = Path(target) if target is not None else directory()
    wanted = NVIDIA_GSP_570_144 if files is None else files
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if progress is not None:
            progress(line)

    for name, want in wanted.items():
        path = root / name
        if path.is_file() and digest(path) == want:
            say(f"kept    {name}")
            continue
        url = f"{base_url.rstrip('/')}/{name}?id={commit}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            part = _download(url, path, name, progress, timeout)
        except OSError as e:  # urllib's URLError and HTTPError among them
            raise FetchFailed(f"firmware {name}: fetching {url} failed: {_cause(e)}") from e
        try:
            got = digest(part)  # the file as written, not the bytes as they came
            if got != want:
                raise RigError(f"firmware {name}: {url} has BLAKE2b-256 {got}, not the pinned "
                               f"{want}; nothing was kept")
            part.replace(path)
        except BaseException as e:
            part.unlink(missing_ok=True)
            if isinstance(e, OSError):
                raise FetchFailed(f"firmware {name}: installing {path} failed: {e}") from e
            raise
        try:
            _sync_directory(path.parent)
        except OSError as e:
            raise FetchFailed(f"firmware {name}: syncing {path.parent} failed: {e}") from e
        say(f"fetched {name} ({path.stat().st_size} bytes)")
    return said


def _download(url: str, path: Path, name: str, progress: Callable[[str], None] | None,
              timeout: float) -> Path:
    """``url`` written to a new temporary file beside ``path`` and fsynced; its path."""
    import urllib.request  # here, not at the top: the http and email modules load slowly

    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    part = Path(temporary)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply, open(fd, "wb") as out:
            total = int(reply.headers.get("Content-Length") or 0)
            got, shown = 0, 0
            while chunk := reply.read(1 << 20):
                out.write(chunk)
                got += len(chunk)
                if progress is not None and total > (8 << 20) and got - shown >= (8 << 20):
                    shown = got
                    bar = "#" * (20 * got // total)
                    progress(f"        {name} [{bar:<20}] {got >> 20}/{total >> 20} MiB")
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return part


def _sync_directory(folder: Path) -> None:
    """fsync ``folder``, so that a rename into it survives a crash (rename(2) alone does not)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cause(e: BaseException) -> str:
    """The cause of a failed fetch in a few words: "HTTP 404 Not Found", "[Errno 111] ..."."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        return str(e.reason)
    return str(e)
