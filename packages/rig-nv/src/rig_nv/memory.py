"""A device's memory: the regions it allocated or mapped, the reuse cache of freed Device
memory, the device's own memory (rings, pushbuffers, timeline, staging), and the records of
peer mappings (:mod:`rig_nv.peers`).

Rules: every table here is guarded by this part's own lock, and no other lock is taken while
it is held. A freed region is handed out again, by the reuse cache or to the path, only once
every queue has passed the values that were current at the free (``progress``:
:class:`Progress`); a free to the path waits for that. Memory whose bus addresses another
device was given (``Allocation.held``) never goes to another allocation. The cache keeps
blocks of any size, up to :attr:`Heap.limit` bytes in all; those of one size leave oldest
first. A queue's own memory goes back at its stop (:meth:`Heap.disown`) under the same rule;
what this part holds at the device's stop is given back by :meth:`Heap.release` only if the
RM freed the channels.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from rig_edge import Lost, Memory, Misuse, Refusal, Region, RigError
from rig_nv import checks
from rig_nv.hostmem import round_up
from rig_nv.rm import SMALL_PAGE, Allocation

if TYPE_CHECKING:
    from cffi import FFI

    from rig_nv.health import Health
    from rig_nv.rm import Path

CACHE_BYTES = 1 << 30  # freed Device memory kept for reuse, in all, until the device's build
STAGING = 32 << 20  # pinned staging for copies through the host (rig_nv.copies)
_new = object.__new__
_DEVICE = Memory.DEVICE


class Progress(Protocol):
    """How far the GPU's work has come: :meth:`now` marks the values current now,
    :meth:`passed` says whether the GPU has passed a mark."""

    def now(self) -> Any: ...

    def passed(self, mark: Any) -> bool: ...

    def wait(self, mark: Any) -> None: ...


class Heap:
    """The memory of one device over ``path``."""

    def __init__(self, path: Path, ffi: FFI, health: Health) -> None:
        self.path = path
        self.name = path.name
        self.ffi = ffi
        self.health = health
        self.progress: Progress | None = None  # set once the timeline exists
        self._lock = threading.Lock()
        # The live regions by GPU address (unique in the device's address space; an int's hash
        # is C's, a Region's Python's): address -> (region, memory).
        self._allocs: dict[int, tuple[Region, Allocation]] = {}
        self._own: dict[object, list[Allocation]] = {}  # the device's own memory, by owner
        # The reuse cache: length in small pages -> (mark, memory, region), oldest first.
        self._cache: dict[int, deque[tuple[Any, Allocation, Region]]] = {}
        self._cached_bytes = 0
        self._limit = CACHE_BYTES
        self._staging: Allocation | None = None
        self._peer_in: dict[Region, Heap] = {}  # others' regions mapped here (peers.py)
        self._peer_out: dict[Region, set[Heap]] = {}  # regions of this device mapped there

    # ---- the device's own -----------------------------------------------------------------

    def own(self, n: int, kind: Memory, *, contiguous: bool = False,
            owner: object = None) -> Allocation:
        """``n`` bytes for the device's own use, kept for ``owner`` (the timeline it serves,
        or None) until :meth:`disown` or the device's stop; RigError when none."""
        a = self.path.alloc_memory(n, kind, contiguous=contiguous)
        if a is None:
            raise RigError(f"{self.name}: out of {kind.value} memory for the device's own use")
        self.keep(a, owner)
        return a

    def keep(self, a: Allocation, owner: object = None) -> None:
        """Keep ``a`` (memory the path made for the device) for ``owner``, as :meth:`own`."""
        with self._lock:
            self._own.setdefault(owner, []).append(a)

    def disown(self, owner: object) -> BaseException | None:
        """Give the path back the memory kept for ``owner`` (a queue whose channels the RM
        freed), once every queue has passed the values current now: another queue's acquire
        may still read that queue's word. It waits for that, as a free to the path does.
        Returns the first failure of a free; what failed stays for :meth:`release`."""
        progress = self.progress
        mark = progress.now() if progress is not None else None
        with self._lock:
            memory = self._own.pop(owner, [])
        self._settle(mark)
        failed = self._free_each(memory)
        if not failed:
            return None
        with self._lock:
            self._own.setdefault(None, []).extend(a for a, _ in failed)
        return failed[0][1]

    def _free_each(self, memory: list[Allocation]) -> list[tuple[Allocation, Exception]]:
        """Give the path back each of ``memory``, whatever failed before: what failed, and
        why."""
        failed = []
        for a in memory:
            try:
                self.path.free_memory(a)
            except Exception as e:
                failed.append((a, e))
        return failed

    def staging(self) -> Allocation:
        """The pinned staging memory of copies through the host (made on first use)."""
        if self._staging is None:
            a = self.path.alloc_memory(STAGING, Memory.PINNED, contiguous=False)
            if a is None:
                raise RigError(f"{self.name}: no pinned memory for copy staging")
            self._staging = a
            self.keep(a)
        return self._staging

    # ---- regions ---------------------------------------------------------------------------

    def alloc(self, n: int, kind: Memory = Memory.DEVICE) -> Region | None:
        """As :meth:`rig_nv.Device.alloc`."""
        if type(n) is not int or type(kind) is not Memory or n <= 0:
            n = checks.whole("an allocation's size", n)
            if not isinstance(kind, Memory):
                raise Misuse(f"an allocation's kind must be a rig_edge.Memory, not {kind!r}")
            if n <= 0:
                raise Misuse(f"an allocation's size must be positive, not {n}")
        if kind is _DEVICE and self.health.ok:
            # The common case of a caching allocator: a block of this size freed earlier, the
            # GPU past every value current at its free. Blocks of a size leave in the order
            # they came (marks only grow), so only the oldest needs asking.
            progress = self.progress
            lock = self._lock
            lock.acquire()  # not `with`: on this path its protocol costs as much as the rest
            try:
                # The cache's key: the length in small pages, which the path rounded the
                # block up to at least (rm.page_rounded), so any length of that key fits.
                kept = self._cache.get((n + SMALL_PAGE - 1) // SMALL_PAGE)
                if kept:
                    mark, a, region = kept[0]
                    if not mark or (progress is not None and progress.passed(mark)):
                        kept.popleft()
                        self._cached_bytes -= a.length
                        if region.length != n:
                            host = region.host  # Region(a.gpu, host, n, kind), n checked
                            region = _new(Region)
                            region.__dict__.update(gpu=a.gpu, host=host, length=n, kind=kind)
                        self._allocs[a.gpu] = (region, a)
                        return region
            finally:
                lock.release()
        self.health.check()
        got = self.path.alloc_memory(n, kind, contiguous=False)
        if got is None:
            self.trim()  # what the cache holds may be what the RM lacks
            got = self.path.alloc_memory(n, kind, contiguous=False)
            if got is None:
                return None
        region = Region(got.gpu, got.host, n, kind)
        with self._lock:
            self._allocs[region.gpu] = (region, got)
        return region

    def free(self, region: Region) -> bool:
        """As :meth:`rig_nv.Device.free`; False, having done nothing, for a peer's region
        mapped here (:func:`rig_nv.peers.unmap_peer` frees those)."""
        progress = self.progress
        mark = progress.now() if progress is not None else None
        lock = self._lock
        lock.acquire()  # as alloc's
        try:
            if self._peer_in or self._peer_out:  # peer mappings, rare: peers.py
                if region in self._peer_in:
                    return False
                mappers = self._peer_out.get(region)
                if mappers:
                    raise Misuse(f"{region} of {self.name} is mapped into "
                                 f"{', '.join(sorted(m.name for m in mappers))}: free those "
                                 "mappings (their free of it) first")
            entry = self._allocs.get(region.gpu)
            if entry is not None and entry[0] is region:  # the very region alloc gave
                del self._allocs[region.gpu]
                a = entry[1]
            else:
                got = self._take(region)
                if got is None:
                    raise Misuse(f"{region} is not a live region of {self.name} (freed, "
                                 "or another device's)")
                a = got
            # Memory whose bus addresses another device was given (held) must never go to
            # another allocation: the path keeps it for the process.
            if (a.kind is _DEVICE and not a.held and mark is not None
                    and self._cached_bytes + a.length <= self._limit
                    and not self.health.stopped):
                key = (region.length + SMALL_PAGE - 1) // SMALL_PAGE  # as alloc's
                kept = self._cache.get(key)
                if kept is None:
                    kept = self._cache[key] = deque()
                kept.append((mark, a, region))
                self._cached_bytes += a.length
                return True
        finally:
            lock.release()
        try:
            self._settle(mark)
            self.path.free_memory(a)
        except BaseException:
            with self._lock:  # still the device's: release() gives it back
                self._allocs[region.gpu] = (region, a)
            raise
        return True

    def _take(self, region: Region) -> Allocation | None:
        """Forget the live ``region`` (under the lock): its memory, or None if it is none."""
        a = self._live(region)
        if a is not None:
            del self._allocs[region.gpu]
        return a

    def _live(self, region: Region) -> Allocation | None:
        """The memory of the live ``region``, else None (no lock: a dict's lookup is
        atomic)."""
        entry = self._allocs.get(region.gpu)
        if entry is None or (entry[0] is not region and entry[0] != region):
            return None
        return entry[1]

    def _settle(self, mark: Any) -> None:
        """Wait until every queue has passed ``mark``, before memory goes back to the path
        (which may hand it out again); a lost device's work ended with its channels."""
        progress = self.progress
        if progress is not None and mark and not progress.passed(mark):
            with contextlib.suppress(Lost):
                progress.wait(mark)

    def give_back(self, region: Region) -> None:
        """Free ``region`` to the RM at once (no keeping for reuse): for what a failed
        operation took. Where the free fails the region stays the device's, for
        :meth:`release` to try again."""
        with self._lock:
            a = self._take(region)
        if a is None:
            return
        try:
            self.path.free_memory(a)
        except BaseException:
            with self._lock:
                self._allocs[region.gpu] = (region, a)
            raise

    @property
    def limit(self) -> int:
        """The most bytes of freed Device memory :meth:`free` keeps for reuse."""
        return self._limit

    @limit.setter
    def limit(self, n: int) -> None:
        n = checks.whole("the reuse cache's limit", n)
        if n < 0:
            raise Misuse(f"the reuse cache's limit must be 0 or more bytes, not {n}")
        with self._lock:
            self._limit = n
            over = self._cached_bytes > n
        if over:
            self.trim()

    def trim(self) -> None:
        """Give the RM back the Device memory :meth:`free` kept for reuse, each block once
        every queue passed its free."""
        with self._lock:
            kept = [(key, entry) for key, entries in self._cache.items() for entry in entries]
            self._cache.clear()
            self._cached_bytes = 0
        for i, (_, (mark, a, _)) in enumerate(kept):
            try:
                self._settle(mark)
                self.path.free_memory(a)
            except BaseException:
                with self._lock:  # what was not given back stays kept, for release()
                    for key, entry in kept[i:]:
                        self._cache.setdefault(key, deque()).append(entry)
                        self._cached_bytes += entry[1].length
                raise

    def map_host(self, buffer: Any) -> Region | Refusal:
        """As :meth:`rig_nv.Device.map_host`."""
        self.health.check()
        ffi = self.ffi
        try:
            address = int(ffi.cast("uintptr_t", ffi.from_buffer(buffer)))
            length = memoryview(buffer).nbytes
        except TypeError as e:
            raise Misuse(f"map_host needs a buffer, not {type(buffer).__name__} ({e})") from None
        if length <= 0:
            raise Misuse("map_host needs a buffer of at least one byte")
        base = address & ~0xFFF
        a = self.path.map_host(base, round_up(address + length, 0x1000) - base)
        if isinstance(a, Refusal):
            return a
        region = Region(a.gpu + (address - base), address, length, Memory.PINNED)
        with self._lock:
            self._allocs[region.gpu] = (region, a)
        return region

    # ---- what is live ----------------------------------------------------------------------

    def holds(self, region: Region) -> bool:
        """Whether ``region`` is one this device made and has not freed (no lock: a dict's
        lookup is atomic)."""
        return self._live(region) is not None

    def contains(self, region: Region) -> bool:
        """Whether ``region`` is, or lies inside, a live region (at the same host address)."""
        with self._lock:
            if self._live(region) is not None:
                return True
            return any(r.kind is region.kind and r.gpu <= region.gpu
                       and region.gpu + region.length <= r.gpu + r.length
                       and region.host == (None if r.host is None
                                           else r.host + region.gpu - r.gpu)
                       for r, _ in self._allocs.values())

    def allocation(self, region: Region) -> Allocation | None:
        """The memory of ``region``, a live region this device made (not a peer's mapped
        here), else ``None``."""
        with self._lock:
            return None if region in self._peer_in else self._live(region)

    def regions(self) -> dict[Region, Allocation]:
        """A copy of the live regions and their memory (peers' mapped here included)."""
        with self._lock:
            return dict(self._allocs.values())

    def owned(self) -> list[Allocation]:
        """The device's own memory, every owner's (a copy)."""
        with self._lock:
            return [a for kept in self._own.values() for a in kept]

    def kept(self) -> list[Allocation]:
        """The memory the reuse cache holds (a copy)."""
        with self._lock:
            return [a for entries in self._cache.values() for _, a, _ in entries]

    # ---- peer records (rig_nv.peers) -------------------------------------------------------

    def lend(self, region: Region, a: Allocation, mapper: Heap) -> bool:
        """Record that ``mapper`` maps ``region`` (whose memory is ``a``), if it is still live
        and the device not stopped; whether it was."""
        with self._lock:
            alive = not self.health.stopped and self._live(region) is a
            if alive:
                self._peer_out.setdefault(region, set()).add(mapper)
            return alive

    def unlend(self, region: Region, mapper: Heap) -> None:
        """``mapper`` no longer maps ``region``."""
        with self._lock:
            mappers = self._peer_out.get(region)
            if mappers is not None:
                mappers.discard(mapper)
                if not mappers:
                    del self._peer_out[region]

    def borrow(self, region: Region, p: Allocation, owner: Heap) -> bool:
        """Record ``region`` of ``owner`` as mapped here (``p``); False if it is already."""
        with self._lock:
            if region in self._peer_in or region.gpu in self._allocs:
                return False
            self._allocs[region.gpu] = (region, p)
            self._peer_in[region] = owner
            return True

    def borrowed(self, region: Region) -> bool:
        with self._lock:
            return region in self._peer_in

    def unborrow(self, region: Region) -> tuple[Heap, Allocation] | None:
        """Forget the mapping of another device's ``region`` here: (its owner, the mapping)."""
        with self._lock:
            owner = self._peer_in.pop(region, None)
            p = self._take(region) if owner is not None else None
        return None if owner is None or p is None else (owner, p)

    def peers_in(self) -> dict[Region, Heap]:
        """Others' regions mapped here and their owners (a copy)."""
        with self._lock:
            return dict(self._peer_in)

    def peers_out(self) -> dict[Region, set[Heap]]:
        """This device's regions mapped elsewhere and their mappers (a copy)."""
        with self._lock:
            return {r: set(ms) for r, ms in self._peer_out.items()}

    def forget_lent(self) -> None:
        with self._lock:
            self._peer_out.clear()

    # ---- the stop --------------------------------------------------------------------------

    def release(self) -> BaseException | None:
        """Give back every region, the reuse cache and the device's own memory (the device's
        stop, once the RM freed its channels), a free that failed tried once more after the
        others (a path's free goes on from the step that failed); the first failure of a
        second try, the rest still tried."""
        with self._lock:
            kept = [a for entries in self._cache.values() for _, a, _ in entries]
            self._cache.clear()
            self._cached_bytes = 0
            own = [a for mine in self._own.values() for a in mine]
            memory = [*(a for _, a in self._allocs.values()), *own, *kept]
            self._allocs.clear()
            self._own.clear()
        failed = self._free_each(memory)
        stayed: BaseException | None = None
        for a, first in failed:
            try:
                self.path.free_memory(a)
            except Exception:
                stayed = stayed or first
        return stayed
