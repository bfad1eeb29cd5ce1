"""One open or change of an NVIDIA GPU at a time: in the process, between processes, per GPU.

:func:`serial` runs opens and changes (``gpu(i).make``, ``detach``, ``attach``, ``reset``) one
at a time, so a boot delays the others: in the process through a reentrant lock, between
processes through an ``flock`` on ``rig-nv-pci.lock``, which another process waits for up to
:data:`SERIAL_WAIT_S`, then is refused saying so. One called from inside another (a callback
run while the lock is held: the holding thread's signal handler, finalizer or trace hook, or
a callback the open or change calls) raises :class:`rig_edge.Misuse`, having changed nothing
(the Rig_nv_pci spec's Invalid_argument): waiting there would wait for the thread itself.

:class:`BusLock` is an exclusive ``flock`` on a file per GPU, ``rig-nv-pci-BUS.lock``. An
open holds it for as long as its device lives and a change while it runs; another process
waits for it up to :data:`BUS_WAIT_S` (another's stop ends), then is refused. The kernel lets
both go when the process dies. Both files lie in :func:`directory`, one place for root and
every user whatever their environment.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import threading
import time
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


# How long a process waits for another's open or change (longer than a boot's own bounds
# together: GFW, the falcons, GSP_INIT_DONE) and for another's hold of one GPU (its stop).
SERIAL_WAIT_S = 120.0
BUS_WAIT_S = 10.0
_NAP_S = 0.02
RUN_LOCK, TMP = Path("/run/lock"), Path("/tmp")

_serial = _Serial()
_held: set[tuple[str, str]] = set()
_held_lock = threading.Lock()


@contextmanager
def serial(what: str) -> Iterator[None]:
    """Hold the lock on opens and changes of NVIDIA GPUs, the process's and then the
    machine's (``rig-nv-pci.lock``), while the block runs.

    Raises :class:`rig_edge.Misuse` when this thread is inside an open or change already
    (``what``, a call from a callback inside it), having changed nothing. Raises
    :class:`rig_edge.RigError` naming ``what`` when another process's open or change held the
    machine's lock for :data:`SERIAL_WAIT_S`, or its file cannot be opened.
    """
    with _serial.lock:
        if _serial.inside:
            raise Misuse(f"{what} was called from inside another open or change of a GPU")
        _serial.inside = True  # before the wait: a callback during it is refused, not waited on
        try:
            file = directory() / "rig-nv-pci.lock"
            fd = _locked(file, SERIAL_WAIT_S, f"{what} waited {{wait}} s for another process's "
                         "open or change of an NVIDIA GPU, which holds {file}, and no longer")
            try:
                yield
            finally:
                os.close(fd)  # which lets the flock go
        finally:
            _serial.inside = False


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


def _locked(file: Path, wait_s: float, refusal: str) -> int:
    """An fd of ``file`` holding its exclusive flock, waited for up to ``wait_s`` (flock has
    no timeout of its own, so the wait naps and tries again). Raises
    :class:`rig_edge.RigError`: ``refusal`` (formatted with ``file`` and ``wait``) when
    another holds it that long, or why the file cannot be opened or locked."""
    try:
        fd = _open(file)
    except OSError as e:
        raise RigError(f"its lock file {file} cannot be opened: {e.strerror}") from e
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise RigError(f"its lock file {file} cannot be locked: {e.strerror}") from e
            if time.monotonic() >= deadline:
                raise RigError(refusal.format(file=file, wait=f"{wait_s:g}"))
            time.sleep(_NAP_S)
    except BaseException:
        os.close(fd)
        raise


class BusLock:
    """The lock of one GPU, held from :meth:`take` until :meth:`release` (or the process's
    end)."""

    def __init__(self, key: tuple[str, str], fd: int, file: Path) -> None:
        self._key = key
        self._fd: int | None = fd
        self.path = file

    @classmethod
    def take(cls, machine: Machine, bus: str) -> BusLock:
        """Take the lock of the GPU at ``bus`` of ``machine``, waiting up to
        :data:`BUS_WAIT_S` while another process holds it (never while this one does).

        Raises :class:`rig_edge.RigError` saying who holds it: this process (an open device of
        the GPU, or an open or change under way), another process (for that long), or that
        the lock file cannot be opened or locked.
        """
        key = (machine.name, bus)
        with _held_lock:
            if key in _held:
                raise RigError("this process holds it (a device of it is open)")
            _held.add(key)
        file = path(machine, bus)
        try:
            fd = _locked(file, BUS_WAIT_S, "another process holds it (an open or change of it "
                         "held {file} for the {wait} s this one waited)")
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
