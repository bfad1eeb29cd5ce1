"""A device's health: whether it is lost or stopped, the fault that lost it, and the check
every call makes first.

Rules: ``ok`` is True until the device is lost or stopped, so the hot paths test one
attribute. A loss is kept once recorded: a later cause never replaces the first. The fault
of a channel is read from the RM once (its record clears when read), on the first wait or
sleep that sees an error notifier written, or through a path that reports faults by message
(:class:`rig_nv.rm.ReportsFaults`). :meth:`Health.mark_lost` takes no lock (its docstring says
why); the rest take only this part's own lock.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING

from rig_edge import Lost, RigError
from rig_nv.faults import Debuggee, channel_fault, notified
from rig_nv.rm import ReportsFaults

if TYPE_CHECKING:
    from cffi import FFI

    from rig_nv.rm import Path


class Health:
    """Loss, stop and fault state of one device (the GPU named ``path.name``)."""

    def __init__(self, path: Path, ffi: FFI) -> None:
        self.path = path
        self.ffi = ffi
        self.ok = True  # neither lost nor stopped
        self.lost: Lost | None = None
        self.stopped = False
        self.sm_count = 0
        self._fault: Lost | None = None  # the channels' fault, read once
        self._lock = threading.Lock()
        self._watched: list[tuple[str, int, memoryview]] = []  # (channel, handle, notifier)
        self._debuggee: Debuggee | None = None
        # a path whose RM also reports faults by message (rig_nv.rm.ReportsFaults)
        self._reports = path if isinstance(path, ReportsFaults) else None

    def check(self) -> None:
        """Raise the device's loss (a copy of its :class:`rig_edge.Lost`), or
        :class:`rig_edge.RigError` once it is stopped; return while it is usable."""
        if self.lost is not None:
            raise copy.copy(self.lost)
        if self.stopped:
            raise RigError(f"{self.path.name}: the device is stopped")

    def raise_lost(self) -> None:
        """Raise the device's loss, if any (a lost device's every wait raises it)."""
        if self.lost is not None:
            raise copy.copy(self.lost)

    def stop(self) -> bool:
        """Mark the device stopped; False if it was already."""
        with self._lock:
            if self.stopped:
                return False
            self.stopped = True
            self.ok = False
            return True

    def watch(self, channel: str, handle: int, notifier: memoryview) -> None:
        """Read ``notifier``, the error notifier of channel ``handle``, in :meth:`faulted`."""
        self._watched.append((channel, handle, notifier))

    def unwatch(self, handles: set[int]) -> None:
        """Read the notifiers of channels ``handles`` no more (a stopped queue's, whose memory
        goes back); a new list, so a reader of the last one reads it whole."""
        self._watched = [w for w in self._watched if w[1] not in handles]

    def notifiers(self) -> list[memoryview]:
        """The error notifiers watched, in the order the channels were made."""
        return [note for _, _, note in self._watched]

    def set_debuggee(self, debuggee: Debuggee) -> None:
        """The compute channel and its compute object, whose graphics context the RM keeps
        MMU faults' access types and SM error states of (:mod:`rig_nv.faults`)."""
        self._debuggee = debuggee

    def debuggee(self) -> Debuggee | None:
        """What :meth:`set_debuggee` was given, ``None`` before."""
        return self._debuggee

    def faulted(self) -> Lost | None:
        """The fault the path reports, else the Fault of a channel whose error notifier the RM
        wrote, else ``None`` (a test of each notifier's status; the RM is asked about an MMU
        fault once, when first seen)."""
        if self._fault is None:
            seen = any(notified(note) for _, _, note in self._watched)
            if not seen and self._reports is None:
                return None
            with self._lock:
                if self._fault is None and self._reports is not None:
                    self._fault = self._reports.fault(
                        {handle: name for name, handle, _ in self._watched}, seen)
                if self._fault is None and seen:
                    self._fault = channel_fault(self.path.rm, self.ffi, [
                        w for w in self._watched if notified(w[2])], self.debuggee(),
                        self.sm_count)
        return self._fault

    def lose(self, why: Lost) -> Lost:
        """Record ``why`` as the loss unless one is recorded; returns a copy of the loss."""
        with self._lock:
            if self.lost is None:
                self.lost = why
                self.ok = False
            return copy.copy(self.lost)

    def raise_fault(self) -> None:
        """Lose the device for the fault :meth:`faulted` finds, and raise it."""
        fault = self.faulted()
        if fault is not None:
            raise self.lose(fault)

    def mark_lost(self, why: Lost) -> None:
        """The device is lost for ``why``, from now on (:meth:`rig_nv.Device.mark_lost`).

        It takes no lock: the path learns the loss inside an RPC, which may run on a thread
        that holds a part's lock, or on another while one does and waits for the RPC channel
        that thread holds. One attribute store is atomic, and readers test ``lost`` and
        ``ok`` without the lock. A race with :meth:`lose` keeps one of two real causes."""
        if self.lost is None:
            self.lost = why
            self.ok = False


class Stopped(Health):
    """A stopped queue's view of its device's ``health``: never ok; its check raises the
    device's loss or stop, else that the queue (``name``) is stopped."""

    def __init__(self, health: Health, name: str) -> None:  # shares nothing but the health
        self.health = health
        self.name = name
        self.ok = False
        self.lost = health.lost
        self.stopped = True

    def check(self) -> None:
        self.health.check()
        raise RigError(f"{self.name} is stopped")

    def raise_lost(self) -> None:
        self.health.raise_lost()

    def raise_fault(self) -> None:
        self.health.raise_fault()

    def lose(self, why: Lost) -> Lost:
        return self.health.lose(why)
