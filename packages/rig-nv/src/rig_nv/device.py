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

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cffi import FFI

from rig_edge import Bus, Dmabuf, Facts, Lost, Memory, Misuse, Refusal, Region, RigError
from rig_nv import checks, copies, hostmem, peers, setup
from rig_nv import classes as cls
from rig_nv import launch as launching
from rig_nv.channel import Arena, Channel
from rig_nv.clock import Clock
from rig_nv.health import Health
from rig_nv.hostmem import view
from rig_nv.launch import Function, Image
from rig_nv.layouts import rm_ffi
from rig_nv.loader import Loader
from rig_nv.memory import Heap
from rig_nv.profile import Profile
from rig_nv.push import Push
from rig_nv.rm import Path, ReadsClock
from rig_nv.setup import LOCAL_WINDOW, SHARED_WINDOW, VIDEO
from rig_nv.step import Step
from rig_nv.timeline import Point, Timeline

if TYPE_CHECKING:
    from rig_nv.checks import HostData

KERNEL_COPY_LEAST = 1 << 20  # copies inside the GPU from this size run on the SMs

__all__ = ["Device", "Point", "make"]


class _Progress:
    """The memory's view of the timeline (rig_nv.memory.Progress): a free's mark is the last
    value submitted; the GPU has passed it once the word reaches it."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline

    def now(self) -> int:
        return self.timeline.current()

    def passed(self, mark: int) -> bool:
        return bool(self.timeline.word[0] >= mark)


class Device:
    """An open GPU. Any thread may call any method at the same time as others.

    Built by :func:`make`; obtained through an opener (``rig_nv_nvidia.gpu(0).open()``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ffi: FFI = rm_ffi(path.rm.layouts)
        self.health = Health(path, self.ffi)
        self.memory = Heap(path, self.ffi, self.health)
        self.timeline = Timeline(self, path, self.health)
        self.memory.progress = _Progress(self.timeline)
        self.loader = Loader(self)
        self.objects = setup.Objects(path, self.ffi)
        self._staging = copies.Staging(self.memory, self.timeline)
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

    def wait(self, point: Point, timeout_s: float | None = None) -> None:
        """Wait until signaled; raises :class:`rig_edge.Lost` if the device faulted."""
        if not isinstance(point, Point):
            raise Misuse(f"wait needs a Point, not {type(point).__name__}")
        if point.device is not self:
            raise Misuse("that point is on another device's timeline")
        t = self.timeline
        if point.value >= t.next:
            raise Misuse(f"timeline value {point.value} was never submitted (the last is "
                         f"{t.next - 1})")
        t.wait_value(point.value, timeout_s)

    def synchronize(self) -> None:
        """Wait until every submission so far is done."""
        self.timeline.synchronize()

    def profile(self, capacity: int = 4096) -> Profile:
        """A profile of the submissions made while it is active (``with d.profile() as p``):
        GPU timestamps before and after each, ``p.events()`` and ``p.chrome_trace(path)``.
        Raises :class:`Misuse` unless ``capacity`` is a positive whole number."""
        self.health.check()
        return Profile(self, capacity)

    def step(self) -> Step:
        """A new step to record launches and copies into (see :mod:`rig_nv.step`)."""
        self.health.check()
        return Step(self)

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

        Device memory up to 64 MiB is kept (up to 1 GiB in all) for the next allocation of
        its size, once the work submitted before the free is done, as CUDA's and PyTorch's
        caching allocators do; :meth:`trim` gives it back to the RM.
        """
        if type(region) is not Region:
            checks.region_of("free's region", region)
        if self.memory.is_peer(region):
            peers.unmap_peer(self.memory, region)
            return
        self.memory.free(region)

    def trim(self) -> None:
        """Give the RM back the Device memory :meth:`free` kept for reuse."""
        self.memory.trim()

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
        if cluster is not None or cooperative or pdl:
            return launching.launch(self, fn, grid, block, args, shared, None, cluster,
                                    cooperative, pdl)
        # The common case: a configuration launched before, prepared once (its QMD and bank
        # in one blob); its arguments are checked first (Misuse leaves everything as it was).
        t = self.timeline
        prep = fn.prepared.get((grid, block, shared, self.loader.slm)) if (
            type(grid) is tuple and type(block) is tuple and type(fn) is Function) else None
        if prep is None or fn.image.device is not self or t.profile is not None:
            return launching.launch(self, fn, grid, block, args, shared)
        packer = fn.packers.get(tuple(map(type, args))) if type(args) is tuple else None
        if packer is None or packer[1] is not None:
            st, values = launching.arg_values(fn, args)
        else:  # launching.arg_values' common case: a tuple, in the parameters' order
            st, values = packer[0], list(map(operator.call, packer[2], args))
        return t.launch_prepared(prep, st, values, fn.kernel.param_offset)

    # ---- copies --------------------------------------------------------------------------

    def copy(self, dst: Region, src: Region, n: int | None = None, *, dst_offset: int = 0,
             src_offset: int = 0, engine: str = "auto") -> Point:
        """Copy ``n`` bytes (default: all of ``src`` from ``src_offset``), any kinds, any
        offsets, a peer's mapped regions (:meth:`map_peer`) included. Returns the copy's point.

        ``engine``: "copy" the copy engine, "sm" rig's copy kernels (GPU memory at both ends),
        "auto" the kernels for 1 MiB or more of GPU memory, else the copy engine. Raises
        :class:`Misuse` for a length or offset outside either region, a region that is not a
        live one of this device (freed, or another device's), or another ``engine``.
        """
        memory = self.memory
        if n is None:
            n = checks.region_of("source", src).length - checks.whole("src_offset", src_offset)
        dst, dst_offset, n = checks.span(memory, "destination", dst, dst_offset, n)
        src, src_offset, n = checks.span(memory, "source", src, src_offset, n)
        d, s = dst.gpu + dst_offset, src.gpu + src_offset
        if engine != "copy":
            if engine not in ("auto", "sm"):
                raise Misuse(f"a copy's engine is 'auto', 'copy' or 'sm', not {engine!r}")
            video = dst.kind in VIDEO and src.kind in VIDEO
            if engine == "sm" and not video:
                raise Misuse("engine='sm' copies GPU memory (Device or Mapped) only, not "
                             f"{src.kind.value} to {dst.kind.value}")
            if engine == "sm" or (video and n >= KERNEL_COPY_LEAST):
                if self.loader.copy_kernels() is not None:
                    return copies.kernel_copy(self, d, s, n)
                if engine == "sm":
                    raise Misuse(f"rig ships no copy kernels for {self.arch}: use "
                                 "engine='copy'")
        t = self.timeline
        return t.submit(t.copy_channel, Push().copy(d, s, n).words, "copy")

    def upload(self, dst: Region, data: HostData, offset: int = 0) -> Point:
        """Copy host bytes ``data`` into ``dst`` at ``offset``.

        Host-visible regions are written directly; Device memory through pinned staging,
        pipelined. ``data`` may be reused when this returns; the returned point is done once
        the bytes are in ``dst``. Raises :class:`Misuse` for ``data`` that is no buffer, bytes
        outside ``dst``, or a ``dst`` that is not a live region of this device.
        """
        src = checks.buffer("upload's data", data)
        dst, offset, n = checks.span(self.memory, "destination", dst, offset, len(src))
        self.health.check()
        if dst.host is not None:
            hostmem.copy(view(dst.host + offset, n), src)
            return Point(self, self.timeline.current())
        return self._staging.upload(dst, src, offset)

    def download(self, src: Region, n: int | None = None, offset: int = 0,
                 out: HostData | None = None) -> memoryview:
        """Copy ``n`` bytes of ``src`` from ``offset`` to the host and return them (in ``out``
        when given). Waits for earlier work, so the bytes are those the timeline's last point
        left. Raises :class:`Misuse` for bytes outside ``src``, a ``src`` that is not a live
        region of this device, or an ``out`` that is no writable buffer of ``n`` bytes.
        """
        if n is None:
            n = checks.region_of("source", src).length - checks.whole("offset", offset)
        src, offset, n = checks.span(self.memory, "source", src, offset, n)
        result = checks.buffer("out", out if out is not None else bytearray(n), writable=True)
        if len(result) < n:
            raise Misuse(f"out holds {len(result)} bytes, fewer than {n}")
        self.health.check()
        if src.host is not None:
            self.synchronize()
            hostmem.copy(result[:n], view(src.host + offset, n))
            return result[:n]
        self._staging.download(src, n, offset, result)
        return result[:n]

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

        Memory returns only if the RM freed the channels: otherwise the GPU may still reach it,
        and it stays with the process. A second stop does nothing.
        """
        if not self.health.stop():
            return
        # Whatever fails below, the GPU can be opened again (the spec): closed() runs last.
        try:
            failed = peers.end_all(self.memory)
            channels_freed, unmapped = self.objects.free_all()
            failed = failed or unmapped
            if channels_freed:
                failed = failed or self.memory.release()
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
