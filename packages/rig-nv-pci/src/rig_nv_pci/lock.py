"""One open or change of an NVIDIA GPU at a time: in the process, and per GPU across processes.

:func:`serial` runs opens and changes (``gpu(i).make``, ``detach``, ``attach``, ``reset``) one
at a time in this process, so a boot delays the others; one called from inside another (a
callback run while the lock is held) raises :class:`rig_edge.Misuse`, having changed nothing.
This is the Rig_nv_pci spec's "called from a callback inside a lock (Rig's domains section),
raise Invalid_argument" (rig_edge.errors: such a call is Misuse): the
callbacks that run inside it in Python are the holding thread's own, a signal handler (which
runs between any two bytecodes of the main thread), a finalizer, a trace hook, or a callback
the open or change itself calls. Waiting for the lock there would wait forever for the thread
itself, so the lock is reentrant and the call refused instead; one that runs after the lock is
taken but before the holder marked itself inside runs whole first (the holder has changed
nothing yet).

:class:`BusLock` is an exclusive ``flock`` on a file per GPU, ``rig-nv-pci-BUS.lock``, in
/run/lock where the process may write there, else in ``$XDG_RUNTIME_DIR``, else in the
system's temporary directory. An open holds it for as long as its device lives, so no other
open or change, in this process or another, takes the GPU meanwhile; the kernel lets the lock
go when the process dies. (Taking the function is exclusive too: VFIO opens a group once and
a physical take locks the function's config file. The lock file says why earlier, and names
the GPU.)
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from rig_edge import Misuse, RigError
from rig_pci import Machine


class _Serial:
    """The process's lock on opens and changes (reentrant, so that the holding thread's
    callbacks get it at once), and whether an open or change of its holder is under way."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.inside = False


_serial = _Serial()
_held: set[tuple[str, str]] = set()
_held_lock = threading.Lock()


@contextmanager
def serial(what: str) -> Iterator[None]:
    """Hold the process's lock on opens and changes of NVIDIA GPUs while the block runs.

    Raises :class:`rig_edge.Misuse` when this thread is inside an open or change already
    (``what``, a call from a callback inside it), having changed nothing.
    """
    with _serial.lock:
        if _serial.inside:
            raise Misuse(f"{what} was called from inside another open or change of a GPU")
        _serial.inside = True
        try:
            yield
        finally:
            _serial.inside = False


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


def path(machine: Machine, bus: str) -> Path:
    """The lock file of the GPU at ``bus`` of ``machine``: ``rig-nv-pci-BUS.lock`` for this
    machine, with a digest of the machine's name before the bus for another."""
    if machine.name == "this machine":
        return directory() / f"rig-nv-pci-{bus}.lock"
    tag = hashlib.blake2b(machine.name.encode(), digest_size=6).hexdigest()
    return directory() / f"rig-nv-pci-{tag}-{bus}.lock"


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


class BusLock:
    """The lock of one GPU, held from :meth:`take` until :meth:`release` (or the process's
    end)."""

    def __init__(self, key: tuple[str, str], fd: int, file: Path) -> None:
        self._key = key
        self._fd: int | None = fd
        self.path = file

    @classmethod
    def take(cls, machine: Machine, bus: str) -> BusLock:
        """Take the lock of the GPU at ``bus`` of ``machine``, without waiting.

        Raises :class:`rig_edge.RigError` saying who holds it: this process (an open device of
        the GPU, or an open or change under way), another process, or that the lock file
        cannot be opened or locked.
        """
        key = (machine.name, bus)
        with _held_lock:
            if key in _held:
                raise RigError("this process holds it (a device of it is open)")
            _held.add(key)
        file = path(machine, bus)
        try:
            try:
                fd = _open(file)
            except OSError as e:
                raise RigError(f"its lock file {file} cannot be opened: {e.strerror}") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise RigError(
                        f"another process holds it (an open or change of it holds {file})"
                    ) from e
                raise RigError(f"its lock file {file} cannot be locked: {e.strerror}") from e
        except BaseException:
            with _held_lock:
                _held.discard(key)
            raise
        return cls(key, fd, file)

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
            with _held_lock:
                _held.discard(self._key)


def held(machine: Machine, bus: str) -> bool:
    """Whether this process holds the lock of the GPU at ``bus`` of ``machine``."""
    with _held_lock:
        return (machine.name, bus) in _held
