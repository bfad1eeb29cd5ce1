"""Failure injection for the failure walks (issue 6): make the n-th fallible call fail.

Every fallible call of the paths (an ioctl, an mmap, an open of a driver file) calls
:func:`check` with its kind first. Unused, that is one module-level ``None`` test. Inside
:func:`fail_at`, the n-th such call (counted process-wide, from 1, over every thread) raises
what ``exc_factory`` makes of its kind instead of making the call; :func:`counting` records
the calls without failing any, to learn how many a piece of work makes.

The check sits where the real call's own failure would surface, so an injected
:class:`OSError` is wrapped exactly as the kernel's refusal would be (``nv_ioctl`` turns it
into a :class:`rig_edge.RigError`, ``mmap`` lets it out as it is)::

    with inject.counting() as seen:
        gpu(0).open().stop()
    for n in range(1, len(seen.calls) + 1):
        with inject.fail_at(n) as shot:
            try:
                gpu(0).open().stop()
            except RigError as e:
                assert shot.fired and inject.caused_by(e, shot.raised)

Only one hook is active at a time; nesting raises :class:`RuntimeError`.
"""

from __future__ import annotations

import errno
import threading
import traceback
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

KINDS = ("ioctl", "mmap", "open")


class Injected(OSError):
    """The failure :func:`fail_at` injects by default (an ``EIO`` the call never made)."""


def injected_eio(kind: str) -> BaseException:
    """The default ``exc_factory``: an :class:`Injected` ``EIO`` naming the call's kind."""
    return Injected(errno.EIO, f"injected failure of a {kind} call")


class Counting:
    """What :func:`counting` saw: the kind of every fallible call, in order, and with
    ``sites`` the stack each was made from (this module's frames left out)."""

    def __init__(self, kinds: Collection[str] | None, sites: bool = False) -> None:
        self.kinds = None if kinds is None else frozenset(kinds)
        self.calls: list[str] = []
        self.sites: list[traceback.StackSummary] | None = [] if sites else None
        self._lock = threading.Lock()

    def __call__(self, kind: str) -> None:
        if self.kinds is None or kind in self.kinds:
            with self._lock:
                self.calls.append(kind)
                if self.sites is not None:
                    self.sites.append(traceback.StackSummary.from_list(
                        [f for f in traceback.extract_stack() if f.filename != __file__]))


class Shot(Counting):
    """The hook of :func:`fail_at`: counts the calls and fails the ``n``-th.

    ``fired`` says whether it did (``False`` once ``n`` is past the calls the work makes),
    ``raised`` is the exception it raised and ``kind`` the kind of call it failed.
    """

    def __init__(self, n: int, exc_factory: Callable[[str], BaseException],
                 kinds: Collection[str] | None) -> None:
        super().__init__(kinds)
        if n < 1:
            raise ValueError(f"calls are counted from 1, not {n}")
        self.n = n
        self.exc_factory = exc_factory
        self.raised: BaseException | None = None
        self.kind: str | None = None

    @property
    def fired(self) -> bool:
        return self.raised is not None

    def __call__(self, kind: str) -> None:
        if self.kinds is not None and kind not in self.kinds:
            return
        with self._lock:
            self.calls.append(kind)
            if len(self.calls) != self.n:
                return
            self.kind = kind
            self.raised = exc = self.exc_factory(kind)
        raise exc


_hook: Callable[[str], None] | None = None
_installing = threading.Lock()


def check(kind: str) -> None:
    """Called first by every fallible call of kind ``kind`` ("ioctl", "mmap", "open", ...).

    Raises what the active :func:`fail_at` makes when this is its n-th call; otherwise, and
    always when no hook is active, returns having done nothing.
    """
    hook = _hook
    if hook is not None:
        hook(kind)


@contextmanager
def _installed(hook: Counting) -> Iterator[None]:
    global _hook  # noqa: PLW0603 (check() reads one module-level name: no cost unused)
    with _installing:
        if _hook is not None:
            raise RuntimeError("a failure-injection hook is already active")
        _hook = hook
    try:
        yield
    finally:
        _hook = None


@contextmanager
def counting(kinds: Collection[str] | None = None, *, sites: bool = False
             ) -> Iterator[Counting]:
    """Record the kind of every fallible call (of ``kinds``, default all) made inside, and
    with ``sites`` the stack of each."""
    seen = Counting(kinds, sites)
    with _installed(seen):
        yield seen


@contextmanager
def fail_at(n: int, exc_factory: Callable[[str], BaseException] = injected_eio,
            kinds: Collection[str] | None = None) -> Iterator[Shot]:
    """Make the ``n``-th fallible call (of ``kinds``, default all; from 1) made inside raise
    ``exc_factory(kind)`` instead of happening. Every other call goes through."""
    shot = Shot(n, exc_factory, kinds)
    with _installed(shot):
        yield shot


def caused_by(exc: BaseException, root: BaseException | None) -> bool:
    """Whether ``root`` is ``exc`` or lies in its chain of causes and contexts."""
    seen: set[int] = set()
    at: BaseException | None = exc
    while at is not None and id(at) not in seen:
        if at is root:
            return True
        seen.add(id(at))
        at = at.__cause__ if at.__cause__ is not None else at.__context__
    return False
