"""Lock files: an exclusive ``flock`` on a named file of a machine, which other processes there
respect, and which the kernel lets go when its holder dies.

:func:`directory` is where a machine's lock files lie: /run/lock where every user may write
there, else /tmp, one place for root and every user whatever their environment. A
:class:`FileLock` is taken at once or waited for with a bound. This machine's processes take
them here; another machine's are taken there by rig's agent (:mod:`rig_pci.agent`), which
runs this same module.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from contextlib import suppress
from pathlib import Path

from rig_edge import RigError

RUN_LOCK, TMP = Path("/run/lock"), Path("/tmp")
_NAP_S = 0.02  # flock has no timeout of its own: a bounded wait naps and tries again


def directory() -> Path:
    """Where the lock files lie: /run/lock where every user may write there (Debian and
    Ubuntu make it a sticky tmpfs), else /tmp; one place for root and every user, read from
    neither the user nor the environment."""
    try:
        mode = RUN_LOCK.stat().st_mode
    except OSError:
        return TMP
    others = stat.S_IWOTH | stat.S_IXOTH
    return RUN_LOCK if stat.S_ISDIR(mode) and mode & others == others else TMP


def _open(p: Path) -> int:
    try:
        return os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        pass
    # Readable by all, so that any user's process can open and lock it (flock needs no write).
    fd = os.open(p, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    with suppress(OSError):  # a umask may have taken the others' read bit
        os.fchmod(fd, 0o644)
    return fd


class FileLock:
    """An exclusive ``flock`` on ``path``, held from :meth:`take` until :meth:`release`."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    @classmethod
    def take(cls, path: Path, wait_s: float = 0.0, refusal: str | None = None) -> FileLock:
        """Lock ``path`` (made readable by all if missing), waiting up to ``wait_s`` while
        another process holds it.

        Raises :class:`rig_edge.RigError`: ``refusal`` (formatted with ``file`` and ``wait``)
        when another process holds it that long (by default, that another holds it), or why
        the file cannot be opened or locked."""
        try:
            fd = _open(path)
        except OSError as e:
            raise RigError(f"its lock file {path} cannot be opened: {e.strerror}") from e
        deadline = time.monotonic() + wait_s
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return cls(fd, path)
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise RigError(f"its lock file {path} cannot be locked: "
                                       f"{e.strerror}") from e
                if time.monotonic() >= deadline:
                    raise RigError((refusal or "another process holds it (an open or change "
                                    "of it holds {file})").format(file=path, wait=f"{wait_s:g}"))
                time.sleep(_NAP_S)
        except BaseException:
            os.close(fd)
            raise

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Let the lock go; again does nothing."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
