"""One open or change of an NVIDIA GPU at a time: in the process, between processes, per GPU.

:func:`serial` runs opens and changes (``gpu(i).make``, ``detach``, ``attach``, ``reset``) one
at a time, so a boot delays the others: in the process through a reentrant lock, between
processes through an ``flock`` on ``rig-nv-pci.lock``, which another process waits for up to
:data:`SERIAL_WAIT_S`, then is refused saying so. One called from inside another (a callback
run while the lock is held: the holding thread's signal handler, finalizer or trace hook, or
a callback the open or change calls) raises :class:`rig_edge.Misuse`, having changed nothing
(the Rig_nv_pci spec's Invalid_argument): waiting there would wait for the thread itself.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/lock.md."""
from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rig_edge import Misuse, RigError
from rig_pci import Machine, locks
from rig_pci.transport import Held, LocksThere


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
            held = locks.FileLock.take(
                directory() / "rig-nv-pci.lock", SERIAL_WAIT_S, f"{what} waited {{wait}} s for "
                "another process's open or change of an NVIDIA GPU, which holds {file}, and "
                "no longer")
            try:
                yield
            finally:
                held.release()
        finally:
            _serial.inside = False


def directory() -> Path:
    """Where this machine's lock files lie (:func:`rig_pci.locks.directory`)."""
    return locks.directory()


def path(machine: Machine, bus: str) -> Path:
    """The lock file of the GPU at ``bus`` of ``machine``: ``rig-nv-pci-BUS.lock`` for this
    machine, with a digest of the machine's name before the bus for another."""
    if machine.name == "this machine":
        return directory() / f"rig-nv-pci-{bus}.lock"
    tag = hashlib.blake2b(machine.name.encode(), digest_size=6).hexdigest()
    return directory() / f"rig-nv-pci-{tag}-{bus}.lock"


class BusLock:
    """The lock of one GPU, held from :meth:`take` until :meth:`release` (or the process's
    end)."""

    def __init__(self, key: tuple[str, str], lock: Held, file: Path) -> None:
        self._key = key
        self._lock: Held | None = lock
        self.path = file

    @classmethod
    def take(cls, machine: Machine, bus: str) -> BusLock:
        """Take the lock of the GPU at ``bus`` of ``machine``, waiting up to
        :data:`BUS_WAIT_S` while another process holds it (never while this one does); on
        another machine reached by a :class:`rig_pci.transport.LocksThere`, there, at once.

        Raises :class:`rig_edge.RigError` saying who holds it: this process (an open device of
        the GPU, or an open or change under way), another process (for that long), or that
        the lock file cannot be opened or locked (or the machine cannot be reached).
        """
        key = (machine.name, bus)
        with _held_lock:
            if key in _held:
                raise RigError("this process holds it (a device of it is open)")
            _held.add(key)
        try:
            if isinstance(machine.transport, LocksThere):
                name = f"rig-nv-pci-{bus}.lock"
                return cls(key, machine.transport.lock(name), Path(name))
            file = path(machine, bus)
            return cls(key, locks.FileLock.take(
                file, BUS_WAIT_S, "another process holds it (an open or change of it held "
                "{file} for the {wait} s this one waited)"), file)
        except BaseException:
            with _held_lock:
                _held.discard(key)
            raise

    @property
    def held(self) -> bool:
        return self._lock is not None

    def release(self) -> None:
        """Let the lock go; again does nothing."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:
            lock.release()
        finally:
            with _held_lock:
                _held.discard(self._key)


def held(machine: Machine, bus: str) -> bool:
    """Whether this process holds the lock of the GPU at ``bus`` of ``machine``."""
    with _held_lock:
        return (machine.name, bus) in _held
