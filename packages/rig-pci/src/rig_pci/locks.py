"""Lock files: an exclusive ``flock`` on a named file of a machine, which other processes there
respect, and which the kernel lets go when its holder dies.

:func:`directory` is where a machine's lock files lie: /run/lock where the process may write
there, else ``$XDG_RUNTIME_DIR``, else the system's temporary directory. :class:`FileLock`
holds one without waiting. This machine's processes take them here; another machine's are
taken there by rig's agent (:mod:`rig_pci.agent`), which runs this same module.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from contextlib import suppress
from pathlib import Path

from rig_edge import RigError


def directory() -> Path:
    """Where the lock files lie: /run/lock if writable, else $XDG_RUNTIME_DIR (an absolute
    directory), else the temporary directory."""
    run = Path("/run/lock")
    if run.is_dir() and os.access(run, os.W_OK | os.X_OK):
        return run
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime)
    return Path(tempfile.gettempdir())


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
    def take(cls, path: Path) -> FileLock:
        """Lock ``path`` (made readable by all if missing), without waiting.

        Raises :class:`rig_edge.RigError` saying that another process holds it, or why the
        file cannot be opened or locked."""
        try:
            fd = _open(path)
        except OSError as e:
            raise RigError(f"its lock file {path} cannot be opened: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RigError(
                    f"another process holds it (an open or change of it holds {path})"
                ) from e
            raise RigError(f"its lock file {path} cannot be locked: {e.strerror}") from e
        return cls(fd, path)

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
