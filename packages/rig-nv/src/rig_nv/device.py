"""The NVIDIA device over an RM path: a facade over its parts.

``make(path)`` builds a device on a GPU a path has opened (:mod:`rig_nv.setup`). The parts
each own their state and lock; the device builds them and offers the public API:

- :attr:`Device.health` (:mod:`rig_nv.health`): loss, stop, faults, the checks of every call;
- :attr:`Device.memory` (:mod:`rig_nv.memory`): regions, reuse, own memory, peer records;
- :attr:`Device.timeline` (:mod:`rig_nv.timeline`): channels, the timeline word, points,
  waits and the one submit primitive (device order across the compute and copy channels);
- :attr:`Device.loader` (:mod:`rig_nv.loader`): images, copy kernels, local memory;
- :attr:`Device.objects` (:class:`rig_nv.setup.Objects`): the RM objects the build made.

Programs use the device's methods; the parts are for the backends and the tests.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from cffi import FFI

from rig_edge import Bus, Dmabuf, Facts, Lost, Memory, Misuse, Refusal, Region, RigError
from rig_nv import checks, copies, peers, setup
from rig_nv import classes as cls
from rig_nv.channel import Arena, Channel
from rig_nv.clock import Clock
from rig_nv.health import Health
from rig_nv.launch import Image
from rig_nv.layouts import rm_ffi
from rig_nv.loader import Loader
from rig_nv.memory import Heap
from rig_nv.queues import Queue, Submits
from rig_nv.rm import Path, ReadsClock
from rig_nv.setup import LOCAL_WINDOW, SHARED_WINDOW
from rig_nv.timeline import Point, Timeline

if TYPE_CHECKING:
    from rig_nv.checks import HostData

__all__ = ["Device", "Point", "Queue", "make"]


class _Progress:
    """The memory's view of the queues (rig_nv.memory.Progress): a free's mark is the last
    value submitted on each live queue whose word has not reached it yet (empty when nothing
    is in flight); the GPU has passed it once every such queue's word reaches its value."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.timeline = device.timeline

    def now(self) -> tuple[tuple[Timeline, int], ...]:
        t = self.timeline
        # The common case, first and in one test (each free asks): the device's own queue
        # alone, and its work done.
        if not self.device._queues and t.word[0] >= t.next - 1:
            return ()
        value = t.next - 1
        mark = [(t, value)] if t.word[0] < value else []
        # A copy of the list, not timelines()'s lock: tuple() copies it in one step, and a
        # queue added or forgotten meanwhile has no work in flight (stop waits for it first).
        for q in tuple(self.device._queues):
            t = q.timeline
            value = t.next - 1
            if not t.stopped and t.word[0] < value:
                mark.append((t, value))
        return tuple(mark)

    def passed(self, mark: tuple[tuple[Timeline, int], ...]) -> bool:
        for t, value in mark:  # noqa: SIM110 (a loop: half the time of all() over a generator)
            if t.word[0] < value:
                return False
        return True

    def wait(self, mark: tuple[tuple[Timeline, int], ...]) -> None:
        for t, value in mark:
            t.wait_value(value)


class Device(Submits):
    """An open GPU, and its default queue (:class:`rig_nv.queues.Submits`: launches, copies,
    steps, profiles, waits). Any thread may call any method at the same time as others.

    Built by :func:`make`; obtained through an opener (``rig_nv_nvidia.gpu(0).open()``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ffi: FFI = rm_ffi(path.rm.layouts)
        self.health = Health(path, self.ffi)
        self.memory = Heap(path, self.ffi, self.health)
        self.timeline = Timeline(self, path, self.health)
        self.owner = self  # the device of every queue's submissions (Submits)
        self._queues: list[Queue] = []
        self._queues_made = 0  # queues are numbered from 1, never twice
        self._queues_lock = threading.Lock()
        self.memory.progress = _Progress(self)
        # alloc and free are the heap's own (bound methods in the instance's dict, found
        # before the class's): a Python frame less on each, a tenth of a cache's round trip
        # (bench row 6). The class's methods say what they promise and make the same call.
        vars(self).update(alloc=self.memory.alloc, free=self.memory.free)
        self.loader = Loader(self)
        self.objects = setup.Objects(path, self.ffi)
        self._staging = copies.Staging(self.memory.staging, self.timeline)
        # a path that reads the GPU's clock (rig_nv.rm.ReadsClock)
        self._clock = path if isinstance(path, ReadsClock) and path.clock is not None else None
        self.windows = (LOCAL_WINDOW, SHARED_WINDOW)
        self.copy_engine: int | None = None  # the LCE copies run on (None: the GRCE)
        # Made by setup.build:
        self.facts: Facts
        self.classes: cls.Classes
        self.sm_count: int
        self.sm_per_tpc: int
        self.tpc_slots: int
        self.max_warps_per_sm: int

    def _build(self) -> None:
        setup.build(self)
        self.memory.limit = self.facts.budget // 4

    # The golden record's view of the parts (tests/test_launch_golden.py, which stays as it is).
    @property
    def _channels(self) -> list[Channel]:
        return self.timeline.channels

    @property
    def _slm(self) -> int:
        return self.loader.slm

    @property
    def _arena(self) -> Arena:
        return self.timeline.arena

    @property
    def _next(self) -> int:
        return self.timeline.next

    # ---- facts and state -----------------------------------------------------------------

    @property
    def arch(self) -> str:
        """The GPU's architecture as nvcc names it (``"sm_90"`` on an H200): pick cubins by it."""
        return self.facts.arch

    @property
    def compute(self) -> Channel:
        """The compute channel."""
        return self.timeline.compute

    @property
    def copy_channel(self) -> Channel:
        """The copy channel (on :attr:`copy_engine`)."""
        return self.timeline.copy_channel

    @property
    def clock(self) -> Clock | None:
        """How this device reads the GPU's clock (the spec's Rig_nv.clock, :mod:`rig_nv.clock`):
        ``Clock.REGISTERS`` (PTIMER through BAR 0, the PCI path), ``Clock.RM`` (the RM's
        NV2080_CTRL_CMD_TIMER_GET_TIME, the kernel path), ``None`` where its path reads none.
        That clock's times drift from the host's; profiles measure by how much."""
        return None if self._clock is None else self._clock.clock

    def gpu_time_ns(self) -> int:
        """The GPU's clock now (PTIMER, nanoseconds), read as :attr:`clock` says. Raises
        :class:`rig_edge.RigError` where the path reads no clock or the read fails,
        :class:`rig_edge.Lost` once the device is lost."""
        self.health.check()
        if self._clock is None:
            raise RigError(f"{self.facts.name}: its path reads no GPU clock")
        return self._clock.gpu_time_ns()

    def __repr__(self) -> str:
        on = "GRCE" if self.copy_engine is None else f"LCE {self.copy_engine}"
        return (f"<rig_nv.Device {self.facts.name} {self.facts.arch} {self.facts.bus}, "
                f"copies on {on}>")

    def completed(self) -> int:
        """The last timeline value the GPU has completed."""
        return int(self.timeline.word[0])

    def mark_lost(self, why: Lost) -> None:
        """The device is lost for ``why``, from now on: what a path calls where it learns so
        between the device's waits (the PCI path: a GSP taken as not answering). Every later
        launch, copy, allocation, wait or sleep raises it, so no work is submitted to a lost
        GPU; a loss recorded earlier is kept.

        Thread safety: it takes no lock (:meth:`rig_nv.health.Health.mark_lost` says why): a
        path learns the loss inside an RPC, which may run on a thread that holds a part's
        lock. A submission that passed its check before the store goes to the GPU, as it
        would had it come a moment earlier; the GPU is lost either way."""
        self.health.mark_lost(why)

    # ---- the timeline --------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait until every submission so far, of every queue, is done."""
        for t in self.timelines():
            t.synchronize()

    # ---- queues --------------------------------------------------------------------------

    def queue(self) -> Queue:
        """A new queue of this device (:class:`rig_nv.queues.Queue`): its own compute and
        copy channels, timeline word and values; every submission the device has. Its work
        runs beside the device's and other queues' unless :meth:`after` orders it. Raises the
        device's loss or stop, and :class:`rig_edge.RigError` where the RM refuses the
        channels, having given back the RM objects and the memory it made (as the queue's
        stop does; where an object stays, the memory stays until the device's stop)."""
        self.health.check()
        with self._queues_lock:
            self._queues_made += 1
            q = Queue(self, self._queues_made)
            self._queues.append(q)
        try:
            setup.timeline_of(self, q.objects, q.timeline, f" {q.number}")
        except BaseException:
            q.timeline.stopped = True
            stayed, _ = q.objects.free_all()
            if stayed is None:  # else the device's stop tries again, keeping memory if it stays
                q.give_back()  # a failed free stays the device's, for its stop
            raise
        q.timeline.code_loaded()  # its first launch invalidates the SMs' caches
        return q

    def forget(self, queue: Queue) -> None:
        """Stop counting ``queue`` among the live ones (its stop)."""
        with self._queues_lock:
            if queue in self._queues:
                self._queues.remove(queue)

    def timelines(self) -> list[Timeline]:
        """The timelines of the live queues, the device's first."""
        with self._queues_lock:
            return [self.timeline, *(q.timeline for q in self._queues
                                     if not q.timeline.stopped)]

    # ---- memory --------------------------------------------------------------------------

    def alloc(self, n: int, kind: Memory = Memory.DEVICE) -> Region | None:
        """``n`` bytes of ``kind`` memory, or ``None`` when the RM is out of it.

        Pinned and Mapped regions lie at the same address for host and GPU. Raises
        :class:`rig_edge.Misuse` if ``n`` is not a positive whole number or ``kind`` no
        :class:`rig_edge.Memory`.
        """
        return self.memory.alloc(n, kind)

    def free(self, region: Region) -> None:
        """Give back a region ``alloc`` or ``map_host`` made. Raises :class:`Misuse` for a
        region this device did not make (or freed already).

        Device memory of any size is kept, up to :attr:`cache_limit` bytes in all, for the
        next allocation of its size (in whole pages), as PyTorch's and CuPy's pools do. That
        allocation gets it once every queue has passed the values submitted before the free.
        :meth:`trim` gives what is kept back to the RM, as does an allocation the RM refuses.
        """
        self.memory.free(region)

    def trim(self) -> None:
        """Give the RM back the Device memory :meth:`free` kept for reuse, each block once
        every queue has passed the values submitted before its free."""
        self.memory.trim()

    @property
    def cache_limit(self) -> int:
        """The most bytes of freed Device memory :meth:`free` keeps for reuse: a quarter of
        the memory the process may use (``facts.budget``) from the open. Setting it gives
        back at once what is kept if that is more; 0 keeps nothing. Setting it to anything
        but a whole number of bytes, 0 or more, raises :class:`Misuse`."""
        return self.memory.limit

    @cache_limit.setter
    def cache_limit(self, n: int) -> None:
        self.memory.limit = n

    def map_host(self, buffer: HostData) -> Region | Refusal:
        """Map the caller's memory (any buffer of whole pages or not) for the GPU.

        Returns a PINNED-kind region whose ``host`` is the buffer's address and whose ``gpu``
        is an address of its own, or :class:`rig_edge.Refusal` ``NEVER`` (these pages cannot
        be pinned) / ``NO_ROOM`` (the driver lacks memory, GPU addresses or files). Raises
        :class:`Misuse` for an object that is no buffer, or an empty one.
        """
        return self.memory.map_host(buffer)

    def dma(self, region: Region) -> Dmabuf | Bus:
        """Give another device, such as a NIC a process drives over PCI, ``region``'s memory:
        what the device's path gives (``rig_edge.Dmabuf | rig_edge.Bus``, the spec's
        ``Rig_edge.dma``).

        - Through the kernel driver (rig_nv_nvidia): a new :class:`rig_edge.Dmabuf` of the RM
          object the region lies in, at the region's offset in it, which holds the object
          until its last reference goes; raises :class:`rig_edge.RigError` where the kernel
          driver exports none (an :class:`rig_nv.rm.RMError` where the RM refuses).
        - Over PCI (rig_nv_pci): a :class:`rig_edge.Bus`, as ``rig_pci.memory.bus`` states:
          its ``ranges`` (bus address, length), in order, covering the region (GPU memory
          through BAR 1: Mapped memory where it lies there, Device memory mapped into BAR 1
          first; Pinned memory at its DMA bus addresses), or its ``reason`` where another
          device cannot reach them (a GPU taken through VFIO, whose BAR and DMA addresses only
          its own IOMMU domain translates; no room in BAR 1). Once ranges are given the
          region's memory and the GPU stay the process's until it exits: :meth:`free` and
          :meth:`stop` give none of it back (nor its BAR 1 mapping), and no later open of the
          GPU, in this process or another, succeeds. Raises :class:`rig_edge.RigError` where
          the GPU's BAR 1 page tables cannot be written.

        Either way raises :class:`Misuse` for a region that is not a live one of this device
        (freed, another device's, or a peer's mapped here), :class:`rig_edge.Lost` once the
        device is lost and :class:`rig_edge.RigError` once it is stopped."""
        checks.region_of("dma's region", region)
        self.health.check()
        a = self.memory.allocation(region)
        if a is None:
            raise Misuse(f"{region} is not a live region of {self.facts.name} (freed, "
                         "another device's, or a peer's mapped here: export it from its own)")
        return self.path.export(a, region.gpu - a.gpu, region.length)

    def map_peer(self, owner: Device, region: Region) -> Region:
        """Map ``region``, a whole region ``owner`` (another open device) allocated, into this
        GPU's address space, at the address it has on ``owner``'s GPU; returns it as a region
        of this device for its copies and kernels. Free it with this device's :meth:`free`
        before ``owner`` frees ``region``; a stop of either device ends the mapping.

        Raises :class:`Misuse` for an ``owner`` that is this device or no device, a region
        that is not a live one ``owner`` allocated, or one mapped here already; an
        :class:`rig_nv.rm.RMError` where the kernel driver cannot map it (the GPUs do not
        reach each other: ``rig_nv_nvidia.reaches``).
        """
        if not isinstance(owner, Device):
            raise Misuse(f"map_peer's owner must be a rig_nv.Device, not {type(owner).__name__}")
        if owner is self:
            raise Misuse(f"{region} is {self.facts.name}'s own: map_peer maps another "
                         "device's region")
        return peers.map_peer(self.memory, owner.memory, region)

    # ---- kernels --------------------------------------------------------------------------

    def load(self, cubin: bytes) -> Image:
        """Load a cubin (as nvcc, ptxas, NVRTC or Triton emit it) into this device.

        Raises :class:`rig_nv.cubin.CubinError` for a malformed cubin or one built for another
        architecture (naming both), :class:`rig_edge.RigError` when memory runs out,
        :class:`Misuse` for ``cubin`` that is no buffer.
        """
        self.health.check()
        return self.loader.load(cubin)

    # ---- copies --------------------------------------------------------------------------

    # ---- stopping ------------------------------------------------------------------------

    def sleep(self, timeout_s: float) -> None:
        """Sleep through the path until the GPU may have progressed; raises its faults, and
        :class:`Misuse` for a timeout that is not a number of seconds >= 0."""
        checks.seconds("a sleep's timeout", timeout_s)
        self.health.check()
        self.health.raise_fault()
        self.path.sleep(timeout_s)

    def __enter__(self) -> Device:
        """``with gpu(0).open() as d:`` holds the device for the block."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the device at the block's end, on an exception too (which then propagates)."""
        self.stop()

    def stop(self) -> None:
        """Free the channels and what the device holds; the GPU can then be opened again.

        Every step is tried whatever failed before it (peers' mappings, each queue's channels,
        a queue's failed stop's included, then the device's; then its memory). Memory returns
        only if the RM freed every channel: otherwise the GPU may still reach it, and it stays
        with the process, raising nothing (the GPU may have stopped answering). Raises the
        first failure of a peer mapping's end, an unmap or a free of memory. A second stop
        does nothing.
        """
        if not self.health.stop():
            return
        # Whatever fails below, the GPU can be opened again (the spec): closed() runs last.
        try:
            failed = peers.end_all(self.memory)
            with self._queues_lock:
                queues, self._queues = self._queues, []
            channels_freed = True
            for q in queues:  # each queue's channels and groups, then the device's
                q.timeline.stopped = True
            for objects in [*(q.objects for q in queues), self.objects]:
                stayed, unmapped = objects.free_all()
                channels_freed, failed = channels_freed and stayed is None, failed or unmapped
            if channels_freed:
                for t in [self.timeline, *(q.timeline for q in queues)]:
                    t.retire()  # points answer from the last values, not freed memory
                released = self.memory.release()  # tried whatever failed before
                failed = failed or released
            if failed is not None:
                raise failed
        finally:
            self.path.closed()


def make(path: Path) -> Device:
    """Make the device on a GPU that ``path`` has opened.

    Raises :class:`rig_edge.RigError` (an :class:`rig_nv.rm.RMError` for an RM refusal),
    having given back what it made.
    """
    device = Device(path)
    try:
        device._build()
    except BaseException:
        device.stop()
        raise
    return device
