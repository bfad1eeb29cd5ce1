"""Queues: streams of work of one device, each on a timeline of its own, and the submissions
every queue offers (:class:`Submits`: launches, copies, uploads, downloads, steps, profiles,
waits, and ``after``). The device is the default queue; :meth:`rig_nv.Device.queue` makes
more (:class:`Queue`).

Rules: a queue's work runs in order (its compute and copy channels in queue order, as the
device's); the work of different queues runs concurrently unless ``after`` orders it (a
semaphore acquire on the other queue's word, on the GPU). A submission takes only its own
queue's lock. A point belongs to its queue, and any queue of the device waits for it. The
device's health is every queue's: a fault on any channel loses them all.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rig_edge import Lost, Memory, Misuse, Region
from rig_nv import checks, copies, hostmem, setup
from rig_nv import launch as launching
from rig_nv.health import Stopped
from rig_nv.hostmem import view
from rig_nv.launch import Function
from rig_nv.memory import STAGING
from rig_nv.profile import Profile
from rig_nv.setup import VIDEO
from rig_nv.step import Step
from rig_nv.timeline import Point, Timeline

if TYPE_CHECKING:
    from rig_nv.checks import HostData
    from rig_nv.device import Device


class Submits:
    """The submissions of one queue: of the device (its default queue) or of a
    :class:`Queue`. ``timeline`` is the queue's; ``owner`` the device."""

    timeline: Timeline
    owner: Device
    _staging: copies.Staging

    def completed(self) -> int:
        """The last value of this queue's timeline the GPU has completed."""
        return int(self.timeline.word[0])

    def _timeline_of(self, point: Any, what: str) -> Timeline:
        """The timeline of ``point``, a point of a queue of this device; :class:`Misuse`
        for anything else, or a value never submitted."""
        if not isinstance(point, Point):
            raise Misuse(f"{what} needs a Point, not {type(point).__name__}")
        owner, d = point.device, self.owner
        t: Timeline
        if owner is d:
            t = d.timeline
        elif isinstance(owner, Queue) and owner.owner is d:
            t = owner.timeline
        else:
            raise Misuse(f"that point is on another device's timeline: {point}")
        if point.value >= t.next:
            raise Misuse(f"timeline value {point.value} was never submitted (the last is "
                         f"{t.next - 1})")
        return t

    def wait(self, point: Point, timeout_s: float | None = None) -> None:
        """Wait until ``point`` (of any queue of this device) is done: spin briefly, then
        sleep through the path.

        Raises :class:`rig_edge.Lost` (a :class:`rig_edge.Fault` for a channel error) if the
        device faulted or its work stopped making progress for ``hang_ms``;
        :class:`TimeoutError` if ``timeout_s`` passed first; :class:`Misuse` for another
        device's point, or one past the last submitted.
        """
        self._timeline_of(point, "wait").wait_value(point.value, timeout_s)

    def after(self, *points: Point) -> None:
        """The next submission of this queue waits, on the GPU, until each of ``points`` (of
        any queue of this device) is done: no host wait. Raises :class:`Misuse` (having
        changed nothing) for anything that is no point of this device, a point never
        submitted, or one of a stopped queue; the device's loss once it is lost."""
        self.timeline.health.check()
        waits = []
        for p in points:
            t = self._timeline_of(p, "after")
            if t.stopped:
                raise Misuse(f"{p} is a point of a stopped queue")
            if t is not self.timeline:  # this queue's own work runs in order already
                waits.append((t, p.value))
        for t, value in waits:
            self.timeline.after(t, value)

    def synchronize(self) -> None:
        """Wait until every submission of this queue so far is done."""
        self.timeline.synchronize()

    def profile(self, capacity: int = 4096) -> Profile:
        """A profile of this queue's submissions made while it is active (``with
        q.profile() as p``): GPU timestamps before and after each, ``p.events()`` and
        ``p.chrome_trace(path)``. Raises :class:`Misuse` unless ``capacity`` is a positive
        whole number."""
        self.timeline.health.check()
        return Profile(self.owner, capacity, self.timeline)

    def step(self) -> Step:
        """A new step to record launches and copies into, submitted on this queue (see
        :mod:`rig_nv.step`)."""
        self.timeline.health.check()
        return Step(self.owner, self.timeline)

    def launch(self, fn: Function, grid: Sequence[int], block: Sequence[int],
               args: Sequence[Any] = (), shared: int = 0, *,
               cluster: Sequence[int] | None = None, cooperative: bool = False,
               pdl: bool = False) -> Point:
        """Launch kernel ``fn`` (``image["name"]``) on ``grid`` blocks of ``block`` threads.

        ``args`` follow the kernel's parameters (see :func:`rig_nv.launch.pack_args`);
        ``shared`` is dynamic shared memory in bytes; ``cluster`` a cluster shape in CTAs (a
        kernel that declares one launches in it by default), ``cooperative`` a grid whose
        blocks all run at once (``grid.sync()``), ``pdl`` refused (:mod:`rig_nv.grids`). No
        ioctl: the QMD and constant bank go into video memory the GPU reads, and two methods
        to the compute channel. Raises :class:`rig_edge.Misuse` for grid, block, shared
        memory, cluster or arguments out of range.
        """
        d, t = self.owner, self.timeline
        if cluster is not None or cooperative or pdl:
            return launching.launch(d, fn, grid, block, args, shared, None, cluster,
                                    cooperative, pdl, timeline=t)
        # The common case: a configuration launched before, prepared once (its QMD and bank
        # in one blob); its arguments are checked first (Misuse leaves everything as it was).
        prep = fn.prepared.get((grid, block, shared, d.loader.slm)) if (
            type(grid) is tuple and type(block) is tuple and type(fn) is Function) else None
        if prep is None or fn.image.device is not d or t.profile is not None:
            return launching.launch(d, fn, grid, block, args, shared, timeline=t)
        packer = fn.packers.get(tuple(map(type, args))) if type(args) is tuple else None
        if packer is None or packer[1] is not None:
            st, values = launching.arg_values(fn, args)
        else:  # launching.arg_values' common case: a tuple, in the parameters' order
            st, values = packer[0], list(map(operator.call, packer[2], args))
        return t.launch_prepared(prep, st, values, fn.kernel.param_offset)

    def launch_own(self, fn: Function, blocks: int, block: int, args: tuple[int, ...],
                   name: str) -> Point:
        """Launch one of rig's own kernels (the copy kernels) on ``blocks`` blocks of
        ``block`` threads with whole-number ``args`` rig computed, as :meth:`launch` does;
        under a profile its event is ``name`` (the user asked for a copy, not for rig's
        kernel). A size copied before skips this (:func:`rig_nv.copies.kernel_copy`). Raises
        the device's loss or stop, as :meth:`launch` does."""
        t = self.timeline
        if t.profile is None:
            return self.launch(fn, (blocks,), (block,), args)
        return launching.launch(self.owner, fn, (blocks,), (block,), args, name=name,
                                timeline=t)

    def copy(self, dst: Region, src: Region, n: int | None = None, *, dst_offset: int = 0,
             src_offset: int = 0, engine: str = "auto") -> Point:
        """Copy ``n`` bytes (default: all of ``src`` from ``src_offset``), any kinds, any
        offsets, a peer's mapped regions (:meth:`rig_nv.Device.map_peer`) included. Returns
        the copy's point.

        ``engine``: "copy" the copy engine, "sm" rig's copy kernels (GPU memory at both ends),
        "auto" the kernels where both ends are GPU memory, else the copy engine. Raises
        :class:`Misuse` for a length or offset outside either region, a region that is not a
        live one of this device (freed, or another device's), or another ``engine``.
        """
        d = self.owner
        dst, dst_offset, src, src_offset, n = checks.copy_spans(d.memory, dst, dst_offset, src,
                                                                src_offset, n)
        to, fro = dst.gpu + dst_offset, src.gpu + src_offset
        if engine != "copy":
            if engine not in ("auto", "sm"):
                raise Misuse(f"a copy's engine is 'auto', 'copy' or 'sm', not {engine!r}")
            video = dst.kind in VIDEO and src.kind in VIDEO
            if engine == "sm" and not video:
                raise Misuse("engine='sm' copies GPU memory (Device or Mapped) only, not "
                             f"{src.kind.value} to {dst.kind.value}")
            # The SMs copy inside the GPU faster than a copy engine at every size: 4 KiB to
            # 4 MiB took 0.55-0.81x the copy engine's time, 0.44-0.61x behind a kernel
            # (scripts/small_copy_probe.py, docs/results/small-copies-2026-12-04.txt).
            if engine == "sm" or video:
                point = copies.kernel_copy(self, to, fro, n)
                if point is not None:
                    return point
                if engine == "sm":
                    raise Misuse(f"rig ships no copy kernels for {d.arch}: use "
                                 "engine='copy'")
        return self.timeline.copy(to, fro, n)

    def upload(self, dst: Region, data: HostData, offset: int = 0) -> Point:
        """Copy host bytes ``data`` into ``dst`` at ``offset``.

        Host-visible regions are written directly; Device memory through pinned staging,
        pipelined. ``data`` may be reused when this returns; the returned point is done once
        the bytes are in ``dst``. Raises :class:`Misuse` for ``data`` that is no buffer, bytes
        outside ``dst``, or a ``dst`` that is not a live region of this device.
        """
        src = checks.buffer("upload's data", data)
        dst, offset, n = checks.span(self.owner.memory, "destination", dst, offset, len(src))
        self.timeline.health.check()
        if dst.host is not None:
            hostmem.copy(view(dst.host + offset, n), src)
            return self.timeline.point(self.timeline.current())
        return self._staging.upload(dst, src, offset)

    def download(self, src: Region, n: int | None = None, offset: int = 0,
                 out: HostData | None = None) -> memoryview:
        """Copy ``n`` bytes of ``src`` from ``offset`` to the host and return them (in ``out``
        when given). Waits for this queue's earlier work, so the bytes are those its last
        point left. Raises :class:`Misuse` for bytes outside ``src``, a ``src`` that is not a
        live region of this device, or an ``out`` that is no writable buffer of ``n`` bytes.
        """
        if n is None:
            n = checks.region_of("source", src).length - checks.whole("offset", offset)
        src, offset, n = checks.span(self.owner.memory, "source", src, offset, n)
        result = checks.buffer("out", out if out is not None else bytearray(n), writable=True)
        if len(result) < n:
            raise Misuse(f"out holds {len(result)} bytes, fewer than {n}")
        self.timeline.health.check()
        if src.host is not None:
            self.synchronize()
            hostmem.copy(result[:n], view(src.host + offset, n))
            return result[:n]
        self._staging.download(src, n, offset, result)
        return result[:n]


class Queue(Submits):
    """A queue of ``device`` (:meth:`rig_nv.Device.queue`): its own compute and copy channels
    (in channel groups of their own, placed as the device's), its own timeline word and
    values. Any thread may use it; its submissions take only its own lock."""

    def __init__(self, device: Device, number: int) -> None:
        self.owner = device
        self.number = number
        self.objects = setup.Objects(device.path, device.ffi)
        self.timeline = Timeline(self, device.path, device.health, primary=False)
        self._staging = copies.Staging(self._staging_memory, self.timeline)

    def _staging_memory(self) -> Any:
        # A staging buffer of the queue's own: the device's is another queue's pipeline.
        return self.owner.memory.own(STAGING, Memory.PINNED, owner=self.timeline)

    def __repr__(self) -> str:
        return f"<rig_nv.Queue {self.number} of {self.owner.facts.name}>"

    @property
    def compute(self) -> Any:
        """The queue's compute channel."""
        return self.timeline.compute

    @property
    def copy_channel(self) -> Any:
        """The queue's copy channel."""
        return self.timeline.copy_channel

    def stop(self) -> None:
        """Give back the queue's channels and memory once its work is done. Later submissions
        raise :class:`RigError`; its points stay waitable (they answer from the last value
        its word held), and ``after`` refuses them. A second stop does nothing.

        The memory goes back once every queue has passed the values submitted before the
        stop (another queue's ``after`` may still read this queue's word): the stop waits
        for that, as a free to the path does. Raises the first failure of what stayed, every
        step still tried. What stays the device's stop tries again, and where a channel
        stays the device keeps the queue's memory.
        """
        t = self.timeline
        if t.stopped:
            return
        with contextlib.suppress(Lost, TimeoutError):  # a lost device's work ended
            t.synchronize()
        with t.lock:
            t.stopped = True
            t.health = Stopped(self.owner.health, f"{self.owner.facts.name}: queue {self.number}")
        stayed, unmapped = self.objects.free_all()
        failed = stayed or unmapped
        if stayed is None:
            failed = self.give_back() or failed
        if failed is not None:
            raise failed

    def give_back(self) -> BaseException | None:
        """Once the RM freed the queue's channels (its stop, or its failed build): stop
        counting it, and give its memory back to the path under the device's reuse rule
        (:meth:`rig_nv.memory.Heap.disown`). Returns the first failure of a free (that memory
        stays the device's). Raises :class:`Misuse`, having done nothing, while the queue
        runs or holds RM objects."""
        d, t = self.owner, self.timeline
        if not t.stopped or self.objects.handles or self.objects.attached:
            raise Misuse(f"{self} still holds its channels: stop it instead")
        d.forget(self)
        d.health.unwatch({ch.handle for ch in t.channels})
        t.retire()  # its points answer from memory of its own from now on
        # A submission of another queue that read this word before the retire and may
        # acquire it has its value once that queue's lock is free: the mark below counts it.
        for other in d.timelines():
            with other.lock:
                pass
        return d.memory.disown(t)
