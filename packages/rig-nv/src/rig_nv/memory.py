"""A device's memory: the regions it allocated or mapped, the reuse cache of freed Device
memory, the device's own memory (rings, pushbuffers, timeline, staging), and the records of
peer mappings (:mod:`rig_nv.peers`).

Rules: every table is guarded by this part's own lock; no other lock is taken while it is
held. A freed region is handed out again, by the cache or the path, only once every queue
passed the values current at the free (``progress``); a free to the path waits for that.
Memory whose bus addresses another device was given (``Allocation.held``) never goes to
another allocation. The cache keeps blocks of any size up to :attr:`Heap.limit` bytes, oldest
first per size, in the table of blocks (:class:`_Block`). A queue's own memory goes back at
its stop (:meth:`Heap.disown`); :meth:`Heap.release` gives back the rest at the device's stop
only if the RM freed the channels.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from rig_edge import Lost, Memory, Misuse, Refusal, Region, RigError
from rig_nv import checks, peers
from rig_nv.hostmem import round_up
from rig_nv.rm import SMALL_PAGE, Allocation

if TYPE_CHECKING:
    from collections.abc import Iterator

    from cffi import FFI

    from rig_nv.health import Health
    from rig_nv.rm import Path

CACHE_BYTES = 1 << 30  # freed Device memory kept for reuse, in all, until the device's build
STAGING = 32 << 20  # pinned staging for copies through the host (rig_nv.copies)
_DEVICE = Memory.DEVICE
_PAGE_SHIFT = SMALL_PAGE.bit_length() - 1
_PAGE_ROUND = SMALL_PAGE - 1
_new = object.__new__


class Progress(Protocol):
    """How far the GPU's work has come: :meth:`now` marks the values current now,
    :meth:`passed` says whether the GPU has passed a mark."""

    def now(self) -> Any: ...

    def passed(self, mark: Any) -> bool: ...

    def wait(self, mark: Any) -> None: ...


class _Unset:
    """The progress before the timeline exists: no work in flight, and no mark, so that a
    free gives its memory to the path."""

    def now(self) -> None:
        return None

    def passed(self, mark: Any) -> bool:
        return True

    def wait(self, mark: Any) -> None:
        pass


def _pages(n: int) -> int:
    """``n`` bytes in small pages, rounded up (a shift: cheaper than a division where n is
    a long int, from 1 GiB up)."""
    return (n + _PAGE_ROUND) >> _PAGE_SHIFT


class _Block:
    """One region the device made or mapped, and its memory: live (``live``), or kept by the
    reuse cache (in the bin of ``key`` since the free that left ``mark``, the progress then).
    A kept block stays in the table of blocks at its GPU address, so a round trip through the
    cache changes no table but its bin.

    ``key``, the cache's: the region's length in small pages, which the path rounded the
    memory up to at least (rm.page_rounded), so the block fits any length of its key; 0 for
    memory the cache never keeps. ``pages``: the memory's length in small pages, what it
    counts against the cache's limit."""

    __slots__ = ("key", "live", "mark", "memory", "pages", "region")

    def __init__(self, region: Region, memory: Allocation, key: int = 0) -> None:
        self.region = region
        self.memory = memory
        self.key = key
        self.pages = _pages(memory.length)
        self.live = True
        self.mark: Any = None


def _resized(region: Region, n: int) -> Region:
    """``region`` at length ``n``, a positive int: Region(gpu, host, n, kind) without the
    frozen dataclass's __init__ and check, for a length checked already."""
    out = _new(Region)
    out.__dict__.update(gpu=region.gpu, host=region.host, length=n, kind=region.kind)
    return out


class Heap:
    """The memory of one device over ``path``."""

    def __init__(self, path: Path, ffi: FFI, health: Health) -> None:
        self.path = path
        self.name = path.name
        self.ffi = ffi
        self.health = health
        self.progress: Progress = _Unset()  # the timeline's once it exists
        self._lock = threading.Lock()
        # Every block by GPU address (unique in the device's address space; an int's hash is
        # C's, a Region's Python's): the live regions, peers' mapped here included, and the
        # blocks the reuse cache keeps.
        self._blocks: dict[int, _Block] = {}
        self._own: dict[object, list[Allocation]] = {}  # the device's own memory, by owner
        # The reuse cache: a bin of kept blocks for each key (_Block.key), oldest first.
        self._bins: dict[int, deque[_Block]] = {}
        self._limit = CACHE_BYTES
        # The limit less what is kept, in small pages: one test on a free, of an int small
        # enough for Python's fast arithmetic (the limit in bytes is a long int).
        self._room = CACHE_BYTES >> _PAGE_SHIFT
        self._staging: Allocation | None = None
        self._peer_in: dict[Region, Heap] = {}  # others' regions mapped here (peers.py)
        self._peer_out: dict[Region, set[Heap]] = {}  # regions of this device mapped there
        self._peered = False  # any record in either: free asks them only then

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
        mark = self.progress.now()
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
        if kind is _DEVICE and type(n) is int and self.health.ok:
            # The common case of a caching allocator: a block of this size freed earlier, the
            # GPU past every value current at its free. Blocks of a size leave in the order
            # they came (marks only grow), so only the oldest needs asking. Every step counts
            # here: each costs a few percent of a round trip, all Python.
            lock = self._lock
            lock.acquire()  # not `with`: its protocol costs as much as the rest
            try:
                try:  # a subscript, not get(): a method's call costs twice as much
                    kept = self._bins[(n + _PAGE_ROUND) >> _PAGE_SHIFT]  # _pages(n), inline
                except KeyError:  # no block of its key was kept; n <= 0 has no key
                    kept = None
                if kept:
                    block = kept[0]
                    mark = block.mark
                    if not mark or self.progress.passed(mark):
                        kept.popleft()
                        self._room += block.pages
                        region = block.region
                        if region.length != n:  # another length of the same pages
                            block.region = region = _resized(region, n)
                        # live last: holds(), which takes no lock, never sees a freed region
                        # live again unless alloc hands out that very region
                        block.live = True
                        return region
            finally:
                lock.release()
        return self._alloc_new(n, kind)

    def _alloc_new(self, n: int, kind: Memory) -> Region | None:
        """:meth:`alloc` of memory the path makes now (the cache holds none for it)."""
        if type(n) is not int or type(kind) is not Memory or n <= 0:
            n = checks.whole("an allocation's size", n)
            if not isinstance(kind, Memory):
                raise Misuse(f"an allocation's kind must be a rig_edge.Memory, not {kind!r}")
            if n <= 0:
                raise Misuse(f"an allocation's size must be positive, not {n}")
        self.health.check()
        got = self.path.alloc_memory(n, kind, contiguous=False)
        if got is None:
            self.trim()  # what the cache holds may be what the RM lacks
            got = self.path.alloc_memory(n, kind, contiguous=False)
            if got is None:
                return None
        region = Region(got.gpu, got.host, n, kind)
        with self._lock:
            self._blocks[region.gpu] = _Block(region, got, _pages(n) if kind is _DEVICE else 0)
        return region

    def free(self, region: Region) -> None:
        """As :meth:`rig_nv.Device.free`, a peer's region mapped here included
        (:func:`rig_nv.peers.unmap_peer`)."""
        if type(region) is not Region:
            checks.region_of("free's region", region)
        if self._peered and region in self._peer_in:  # a dict's lookup: no lock needed
            peers.unmap_peer(self, region)  # which takes the lock itself
            return
        mark = self.progress.now()
        lock = self._lock
        lock.acquire()  # as alloc's
        try:
            if self._peered:
                self._refuse_lent(region)
            try:  # as alloc's
                block = self._blocks[region.gpu]
            except KeyError:
                raise self._not_live(region) from None
            if block.region is not region or not block.live:
                block = self._live_block(region)  # an equal region, or Misuse
            a = block.memory
            key = block.key
            # Memory whose bus addresses another device was given (held) must never go to
            # another allocation: the path keeps it for the process.
            if key and not a.held and mark is not None and not self.health.stopped:
                room = self._room - block.pages
                if room >= 0:
                    self._room = room
                    block.live = False
                    block.mark = mark
                    try:
                        self._bins[key].append(block)
                    except KeyError:  # the first of its key, or the first since a trim
                        self._bins[key] = deque((block,))
                    return
            del self._blocks[region.gpu]
        finally:
            lock.release()
        try:
            self._settle(mark)
            self.path.free_memory(a)
        except BaseException:
            with self._lock:  # still the device's: release() gives it back
                self._blocks[region.gpu] = block
            raise

    def _refuse_lent(self, region: Region) -> None:
        """Misuse for a region of this device that others map (under the lock)."""
        mappers = self._peer_out.get(region)
        if mappers:
            raise Misuse(f"{region} of {self.name} is mapped into "
                         f"{', '.join(sorted(m.name for m in mappers))}: free those "
                         "mappings (their free of it) first")

    def _live_block(self, region: Region) -> _Block:
        """The block of the live ``region`` (under the lock), else Misuse."""
        block = self._block(region)
        if block is None:
            raise self._not_live(region)
        return block

    def _not_live(self, region: Region) -> Misuse:
        """The Misuse of a free of what is not a live region here."""
        return Misuse(f"{region} is not a live region of {self.name} (freed, or another "
                      "device's)")

    def _take(self, region: Region) -> _Block | None:
        """Forget the live ``region`` (under the lock): its block, or None if it is none."""
        block = self._block(region)
        if block is not None:
            del self._blocks[region.gpu]
        return block

    def _block(self, region: Region) -> _Block | None:
        """The block of the live ``region``, else None (no lock: a dict's lookup is
        atomic)."""
        block = self._blocks.get(region.gpu)
        if (block is None or not block.live
                or (block.region is not region and block.region != region)):
            return None
        return block

    def _memory(self, region: Region) -> Allocation | None:
        """The memory of the live ``region``, else None (no lock, as :meth:`_block`)."""
        block = self._block(region)
        return None if block is None else block.memory

    def _settle(self, mark: Any) -> None:
        """Wait until every queue has passed ``mark``, before memory goes back to the path
        (which may hand it out again); a lost device's work ended with its channels."""
        progress = self.progress
        if mark and not progress.passed(mark):
            with contextlib.suppress(Lost):
                progress.wait(mark)

    def give_back(self, region: Region) -> None:
        """Free ``region`` to the RM at once (no keeping for reuse): for what a failed
        operation took. Where the free fails the region stays the device's, for
        :meth:`release` to try again."""
        with self._lock:
            block = self._take(region)
        if block is None:
            return
        try:
            self.path.free_memory(block.memory)
        except BaseException:
            with self._lock:
                self._blocks[region.gpu] = block
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
            self._room += (n >> _PAGE_SHIFT) - (self._limit >> _PAGE_SHIFT)
            self._limit = n
            over = self._room < 0
        if over:
            self.trim()

    def trim(self) -> None:
        """Give the RM back the Device memory :meth:`free` kept for reuse, each block once
        every queue passed its free."""
        with self._lock:
            kept = [block for blocks in self._bins.values() for block in blocks]
            self._bins.clear()
            self._room = self._limit >> _PAGE_SHIFT
            for block in kept:
                del self._blocks[block.region.gpu]
        for i, block in enumerate(kept):
            try:
                self._settle(block.mark)
                self.path.free_memory(block.memory)
            except BaseException:
                with self._lock:  # what was not given back stays kept, for release()
                    for left in kept[i:]:
                        self._bins.setdefault(left.key, deque()).append(left)
                        self._blocks[left.region.gpu] = left
                        self._room -= left.pages
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
            self._blocks[region.gpu] = _Block(region, a)
        return region

    # ---- what is live ----------------------------------------------------------------------

    def holds(self, region: Region) -> bool:
        """Whether ``region`` is one this device made and has not freed (no lock: a dict's
        lookup is atomic)."""
        return self._block(region) is not None

    def contains(self, region: Region) -> bool:
        """Whether ``region`` is, or lies inside, a live region (at the same host address)."""
        with self._lock:
            if self._block(region) is not None:
                return True
            return any(r.kind is region.kind and r.gpu <= region.gpu
                       and region.gpu + region.length <= r.gpu + r.length
                       and region.host == (None if r.host is None
                                           else r.host + region.gpu - r.gpu)
                       for r in self._live_regions())

    def _live_regions(self) -> Iterator[Region]:
        """The live regions (under the lock)."""
        return (block.region for block in self._blocks.values() if block.live)

    def allocation(self, region: Region) -> Allocation | None:
        """The memory of ``region``, a live region this device made (not a peer's mapped
        here), else ``None``."""
        with self._lock:
            return None if region in self._peer_in else self._memory(region)

    def regions(self) -> dict[Region, Allocation]:
        """A copy of the live regions and their memory (peers' mapped here included)."""
        with self._lock:
            return {block.region: block.memory for block in self._blocks.values()
                    if block.live}

    def owned(self) -> list[Allocation]:
        """The device's own memory, every owner's (a copy)."""
        with self._lock:
            return [a for kept in self._own.values() for a in kept]

    def kept(self) -> list[Allocation]:
        """The memory the reuse cache holds (a copy)."""
        with self._lock:
            return [block.memory for blocks in self._bins.values() for block in blocks]

    # ---- peer records (rig_nv.peers) -------------------------------------------------------

    def lend(self, region: Region, a: Allocation, mapper: Heap) -> bool:
        """Record that ``mapper`` maps ``region`` (whose memory is ``a``), if it is still live
        and the device not stopped; whether it was."""
        with self._lock:
            alive = not self.health.stopped and self._memory(region) is a
            if alive:
                self._peer_out.setdefault(region, set()).add(mapper)
                self._peered = True
            return alive

    def unlend(self, region: Region, mapper: Heap) -> None:
        """``mapper`` no longer maps ``region``."""
        with self._lock:
            mappers = self._peer_out.get(region)
            if mappers is not None:
                mappers.discard(mapper)
                if not mappers:
                    del self._peer_out[region]
                    self._peered = bool(self._peer_in or self._peer_out)

    def borrow(self, region: Region, p: Allocation, owner: Heap) -> bool:
        """Record ``region`` of ``owner`` as mapped here (``p``); False if it is already."""
        with self._lock:
            if region in self._peer_in or region.gpu in self._blocks:
                return False
            self._blocks[region.gpu] = _Block(region, p)
            self._peer_in[region] = owner
            self._peered = True
            return True

    def borrowed(self, region: Region) -> bool:
        with self._lock:
            return region in self._peer_in

    def unborrow(self, region: Region) -> tuple[Heap, Allocation] | None:
        """Forget the mapping of another device's ``region`` here: (its owner, the mapping)."""
        with self._lock:
            owner = self._peer_in.pop(region, None)
            p = self._take(region) if owner is not None else None
            self._peered = bool(self._peer_in or self._peer_out)
        return None if owner is None or p is None else (owner, p.memory)

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
            self._peered = bool(self._peer_in)

    # ---- the stop --------------------------------------------------------------------------

    def release(self) -> BaseException | None:
        """Give back every region, the reuse cache and the device's own memory (the device's
        stop, once the RM freed its channels), a free that failed tried once more after the
        others (a path's free goes on from the step that failed); the first failure of a
        second try, the rest still tried."""
        with self._lock:
            own = [a for mine in self._own.values() for a in mine]
            kept = [block.memory for blocks in self._bins.values() for block in blocks]
            live = [block.memory for block in self._blocks.values() if block.live]
            memory = [*live, *own, *kept]
            self._blocks.clear()
            self._bins.clear()
            self._room = self._limit >> _PAGE_SHIFT
            self._own.clear()
        failed = self._free_each(memory)
        stayed: BaseException | None = None
        for a, first in failed:
            try:
                self.path.free_memory(a)
            except Exception:
                stayed = stayed or first
        return stayed
