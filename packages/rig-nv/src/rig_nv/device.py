"""The NVIDIA device over an RM path: memory, copies, the timeline, stopping.

``make(path)`` builds a device on a GPU a path has opened: it reads the GPU's classes, makes a
compute and a copy channel (the copy one in a channel group of its own on an asynchronous copy
engine, where the GPU has one: rig_nv.setup), the usermode doorbell and the timeline word.

The timeline: every submission gets the next value; the GPU writes it (64 bits) into a word of
host memory once the submission's work is done. A submission on one channel first waits for the
previous value when that went to the other channel, so values complete in order across both
(device order): a program never names a fence.
"""

from __future__ import annotations

import contextlib
import copy
import operator
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cffi import FFI

from rig_edge import Bus, Dmabuf, Facts, Lost, Memory, Misuse, Refusal, Region, RigError
from rig_nv import checks, copies, hostmem, peers, setup, waiting
from rig_nv import classes as cls
from rig_nv import launch as launching
from rig_nv import step as stepping
from rig_nv.channel import Arena, Channel, Ring
from rig_nv.clock import Clock
from rig_nv.controls import (
    PERF_BOOST_CLEAR,
)
from rig_nv.faults import Debuggee, channel_fault, notified
from rig_nv.hostmem import round_up, view
from rig_nv.launch import Function, Image, builtin_cubin
from rig_nv.layouts import rm_ffi
from rig_nv.profile import Profile
from rig_nv.push import (
    COMPUTE_SEND_PCAS_A,
    COMPUTE_SEND_SIGNALING_PCAS2_B,
    COMPUTE_SET_SHADER_LOCAL_MEMORY_A,
    COMPUTE_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A,
    SUBC_COMPUTE,
    Push,
    header,
    hi_lo,
)
from rig_nv.rm import HUGE_PAGE, SMALL_PAGE, Allocation, Path, ReadsClock, ReportsFaults, RMError
from rig_nv.setup import (
    LOCAL_WINDOW,
    SHARED_WINDOW,
    VIDEO,
)
from rig_nv.step import Step

if TYPE_CHECKING:
    from rig_nv.checks import HostData

# NV_ERR_INVALID_OBJECT, NV_ERR_INVALID_OBJECT_HANDLE, NV_ERR_OBJECT_NOT_FOUND: already freed.
GONE = (0x31, 0x33, 0x57)
CACHE_LARGEST = 64 << 20  # Device allocations up to this size are kept for reuse on free
CACHE_BYTES = 1 << 30  # and at most this much in all
KERNEL_COPY_LEAST = 1 << 20  # copies inside the GPU from this size run on the SMs
_new = object.__new__


@dataclass(frozen=True)
class Point:
    """A point on a device's timeline: done once the timeline word reaches ``value``."""

    device: Device
    value: int

    @property
    def signaled(self) -> bool:
        """Whether the work of this point (and of every earlier point) is done."""
        return self.device.completed() >= self.value

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until signaled; raises :class:`rig_edge.Lost` if the device faulted."""
        self.device.wait(self, timeout_s)


class Device:
    """An open GPU. Any thread may call any method at the same time as others.

    Built by :func:`make`; obtained through an opener (``rig_nv_nvidia.gpu(0).open()``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ffi: FFI = rm_ffi(path.rm.layouts)
        self._lock = threading.RLock()
        self._staging_lock = threading.Lock()
        self._allocs: dict[Region, Allocation] = {}
        self._peer_in: dict[Region, Device] = {}  # others' regions mapped here (peers.py)
        self._peer_out: dict[Region, set[Device]] = {}  # regions of this device mapped there
        self._own: list[Allocation] = []  # the device's own memory: rings, pushbuffers, timeline
        self._handles: list[int] = []  # RM objects the device made, freed in reverse
        self._channels: list[Channel] = []
        self._attached: list[int] = []  # channels the path was told of
        self._notifiers: list[memoryview] = []
        self._lost: Lost | None = None
        self._fault: Lost | None = None  # the channels' fault, read once (the RM's record clears)
        # a path whose RM also reports faults by message (rig_nv.rm.ReportsFaults)
        self._reports = path if isinstance(path, ReportsFaults) else None
        # a path that reads the GPU's clock (rig_nv.rm.ReadsClock)
        self._clock = path if isinstance(path, ReadsClock) and path.clock is not None else None
        self._fault_lock = threading.Lock()
        self._stopped = False
        self._next = 1
        self._last: Channel | None = None
        self._staging: Allocation | None = None
        self._staging_busy = [0, 0]
        self._doorbell: memoryview | None = None
        self.windows = (LOCAL_WINDOW, SHARED_WINDOW)
        self._images_loaded = False
        self._pcas_a = header(SUBC_COMPUTE, COMPUTE_SEND_PCAS_A, 1)
        self._pcas2_b = header(SUBC_COMPUTE, COMPUTE_SEND_SIGNALING_PCAS2_B, 1)
        self._slm = 0  # local memory per thread the compute engine has been given
        self._local: list[Region] = []
        self._cache: dict[int, list[tuple[int, Allocation]]] = {}  # length -> (freed at, memory)
        self._cached_bytes = 0
        self._builtins: Image | None = None
        self._boosted = False
        self._profile: Profile | None = None
        self.timeline: Allocation
        self._word: memoryview
        self.classes: cls.Classes
        self._facts: Facts
        # Made by setup.build:
        self.compute: Channel
        self.copy_channel: Channel
        self._arena: Arena
        self._pool: Ring  # launch configurations' slots (rig_nv.launch.Slots), bump-allocated
        self._pool_head = 0
        self._tsg: int
        self._copy_tsg: int | None = None  # the copy channel's group, where it has its own
        self.copy_engine: int | None = None  # the LCE copies run on (None: the GRCE)
        self._release: array[int]
        self._acquire: array[int]
        self._launch_words: array[int]
        self._qmd_layout: Any
        self.sm_count: int
        self.sm_per_tpc: int
        self.tpc_slots: int
        self.max_warps_per_sm: int

    # ---- setup ---------------------------------------------------------------------------

    def _handle(self) -> int:
        h = self.path.rm.new_handle()
        self._handles.append(h)
        return h

    def _own_memory(self, n: int, kind: Memory, *, contiguous: bool = False) -> Allocation:
        a = self.path.alloc_memory(n, kind, contiguous=contiguous)
        if a is None:
            raise RigError(f"{self.path.name}: out of {kind.value} memory for the device's own use")
        self._own.append(a)
        return a

    def _build(self) -> None:
        setup.build(self)
        # A wait for the previous value (at [3] and [4]), for steps after the copy channel's work.
        self._acquire = Push().semaphore_acquire(self.timeline.gpu, 0).words

    def _boost(self, flags: int, duration: int) -> None:
        setup.boost(self, flags, duration)

    # ---- facts and state -----------------------------------------------------------------

    @property
    def facts(self) -> Facts:
        """What the device is; answers even after it is lost or stopped."""
        return self._facts

    @property
    def arch(self) -> str:
        """The GPU's architecture as nvcc names it (``"sm_90"`` on an H200): pick cubins by it."""
        return self._facts.arch

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
        self._check()
        if self._clock is None:
            raise RigError(f"{self._facts.name}: its path reads no GPU clock")
        return self._clock.gpu_time_ns()

    def __repr__(self) -> str:
        on = "GRCE" if self.copy_engine is None else f"LCE {self.copy_engine}"
        return (f"<rig_nv.Device {self._facts.name} {self._facts.arch} {self._facts.bus}, "
                f"copies on {on}>")

    def _check(self) -> None:
        if self._lost is not None:
            raise copy.copy(self._lost)
        if self._stopped:
            raise RigError(f"{self._facts.name}: the device is stopped")

    def completed(self) -> int:
        """The last timeline value the GPU has completed."""
        return int(self._word[0])

    def _faulted(self) -> Lost | None:
        """The fault the path reports (:class:`rig_nv.rm.ReportsFaults`), else the Fault of a
        channel whose error notifier the RM wrote, else ``None`` (a test of each notifier's
        status; the RM is asked about an MMU fault once, when first seen)."""
        if self._fault is None:
            seen = any(notified(note) for note in self._notifiers)
            if not seen and self._reports is None:
                return None
            with self._fault_lock:
                if self._fault is None and self._reports is not None:
                    self._fault = self._reports.fault(
                        {ch.handle: ch.name for ch in self._channels}, seen)
                if self._fault is None and seen:
                    self._fault = channel_fault(self.path.rm, self.ffi, [
                        (ch.name, ch.handle, note)
                        for ch, note in zip(self._channels, self._notifiers, strict=True)
                        if notified(note)], self._debuggee(), self.sm_count)
        return self._fault

    def _debuggee(self) -> Debuggee | None:
        """The compute channel and its compute-class object, whose graphics context the RM
        keeps MMU faults' access types and SM error states of (rig_nv.faults): setup.channel
        makes that object right after the channel, so its handle follows the channel's in
        ``_handles``."""
        handles, h = self._handles, self.compute.handle
        at = handles.index(h) + 1 if h in handles else len(handles)
        return Debuggee(self.path.h_device, h, handles[at]) if at < len(handles) else None

    def _lose(self, why: Lost) -> Lost:
        with self._lock:
            if self._lost is None:
                self._lost = why
            return copy.copy(self._lost)

    def mark_lost(self, why: Lost) -> None:
        """The device is lost for ``why``, from now on: what a path calls where it learns so
        between the device's waits (the PCI path: a GSP taken as not answering). Every later
        launch, copy, allocation, wait or sleep raises it (the checks the submissions already
        make: ``self._lost is not None``), so no work is submitted to a lost GPU; a loss
        recorded earlier is kept.

        Thread safety: it takes no lock. The path learns the loss inside an RPC, which may run
        on a thread that holds :attr:`_lock` (an allocation's, a free's) or on another thread
        while one does and waits for the RPC channel that thread holds: taking the device's
        lock here could deadlock. One attribute store is atomic (the GIL, or the per-object
        lock of free-threaded CPython), and readers test ``_lost`` without the lock already.
        A race with :meth:`_lose` (both see no loss, both store) keeps one of two real causes
        of the loss. A submission that passed its check before the store goes to the GPU,
        as it would had it come a moment earlier; the GPU is lost either way."""
        if self._lost is None:
            self._lost = why

    # ---- the timeline --------------------------------------------------------------------

    def _wait_value(self, value: int, timeout_s: float | None = None) -> None:
        waiting.wait_value(self, value, timeout_s)

    def wait(self, point: Point, timeout_s: float | None = None) -> None:
        """Wait until ``point`` is done: spin briefly, then sleep through the path.

        Raises :class:`rig_edge.Lost` (a :class:`rig_edge.Fault` for a channel error) if the
        device faulted or its work stopped making progress for ``hang_ms``;
        :class:`TimeoutError` if ``timeout_s`` passed first; :class:`Misuse` for another
        device's point, or one past the last submitted.
        """
        if not isinstance(point, Point):
            raise Misuse(f"wait needs a Point, not {type(point).__name__}")
        if point.device is not self:
            raise Misuse("that point is on another device's timeline")
        if point.value >= self._next:
            raise Misuse(f"timeline value {point.value} was never submitted (the last is "
                         f"{self._next - 1})")
        self._wait_value(point.value, timeout_s)

    def _submit(self, channel: Channel, body: Push | None, name: str = "work") -> Point:
        return self._submit_words(channel, body.words if body is not None else (), name)

    def profile(self, capacity: int = 4096) -> Profile:
        """A profile of the submissions made while it is active (``with d.profile() as p``):
        GPU timestamps before and after each, ``p.events()`` and ``p.chrome_trace(path)``.
        Raises :class:`Misuse` unless ``capacity`` is a positive whole number."""
        self._check()
        return Profile(self, capacity)

    def _submit_words(self, channel: Channel, body: Any, name: str = "work") -> Point:
        """Submit ``body`` (32-bit words) on ``channel`` as the next timeline value: after the
        previous value when that went to the other channel, releasing the new one at the end."""
        with self._lock:
            if self._lost is not None or self._stopped:
                self._check()
            value = self._next
            words = array("I")
            if self._last is not channel and self._last is not None:
                words.extend(Push().semaphore_acquire(self.timeline.gpu, value - 1).words)
            profile = self._profile
            if profile is not None:
                start, end = profile.take(name, channel.name)
                profile.value(value)
                words.extend(Push().timestamp(start).words)
                words.extend(body)
                words.extend(Push().timestamp(end).words)
            else:
                words.extend(body)
            rel = self._release
            rel[3] = value & 0xFFFFFFFF
            rel[4] = value >> 32
            words.extend(rel)
            # Taken only now that nothing can refuse (a full profile): a value never submitted
            # would leave every later step's addition to the timeline one short.
            self._next = value + 1
            channel.retire(int(self._word[0]))
            channel.submit(words, value)
            self._last = channel
            return Point(self, value)

    def _submit_step(self, step: Step) -> Point:
        """Submit a sealed step (its commands add one to the timeline themselves) as one
        GPFIFO entry on the compute channel: after compute work (the common case) the entry
        names the step's commands where they lie; otherwise :func:`rig_nv.step.submit_after`."""
        with self._lock:
            if self._lost is not None or self._stopped:
                self._check()
            compute = self.compute
            if self._last is compute and self._profile is None:  # the common case
                value = self._next
                self._next = value + 1
                compute.submit_entry(step._entry, value, self._word[0])
                point = _new(Point)  # Point(self, value), without the frozen __init__'s calls
                fields = point.__dict__
                fields["device"], fields["value"] = self, value
                return point
            return stepping.submit_after(self, step)

    def step(self) -> Step:
        """A new step to record launches and copies into (see :mod:`rig_nv.step`)."""
        self._check()
        return Step(self)

    def synchronize(self) -> None:
        """Wait until every submission so far is done."""
        self._wait_value(self._next - 1)

    # ---- memory --------------------------------------------------------------------------

    def alloc(self, n: int, kind: Memory = Memory.DEVICE) -> Region | None:
        """``n`` bytes of ``kind`` memory, or ``None`` when the RM is out of it.

        Pinned and Mapped regions lie at the same address for host and GPU. Raises
        :class:`rig_edge.Misuse` if ``n`` is not a positive whole number or ``kind`` no
        :class:`rig_edge.Memory`.
        """
        if type(n) is not int or type(kind) is not Memory or n <= 0:
            n = checks.whole("an allocation's size", n)
            if not isinstance(kind, Memory):
                raise Misuse(f"an allocation's kind must be a rig_edge.Memory, not {kind!r}")
            if n <= 0:
                raise Misuse(f"an allocation's size must be positive, not {n}")
        a = None
        if kind is Memory.DEVICE and n <= CACHE_LARGEST:
            # The common case of a caching allocator, in one hold of the lock: memory of this
            # size freed earlier, its last user done.
            page = HUGE_PAGE if n >= HUGE_PAGE else SMALL_PAGE
            with self._lock:
                if self._lost is not None or self._stopped:
                    self._check()
                kept = self._cache.get((n + page - 1) // page * page)
                if kept and kept[0][0] <= self._word[0]:
                    a = kept.pop(0)[1]
                    self._cached_bytes -= a.length
                    region = _new(Region)  # Region(a.gpu, a.host, n, kind), n checked above
                    region.__dict__.update(gpu=a.gpu, host=a.host, length=n, kind=kind)
                    self._allocs[region] = a
                    return region
        self._check()
        a = self.path.alloc_memory(n, kind, contiguous=False)
        if a is None:
            self.trim()  # what the cache holds may be what the RM lacks
            a = self.path.alloc_memory(n, kind, contiguous=False)
            if a is None:
                return None
        region = Region(a.gpu, a.host, n, kind)
        with self._lock:
            self._allocs[region] = a
        return region

    def free(self, region: Region) -> None:
        """Give back a region ``alloc`` or ``map_host`` made. Raises :class:`Misuse` for a
        region this device did not make (or freed already).

        Device memory up to 64 MiB is kept (up to 1 GiB in all) for the next allocation of
        its size, once the work submitted before the free is done, as CUDA's and PyTorch's
        caching allocators do; :meth:`trim` gives it back to the RM.
        """
        if type(region) is not Region:
            checks.region_of("free's region", region)
        if self._peer_in and region in self._peer_in:
            peers.unmap_peer(self, region)
            return
        if self._peer_out:
            peers.refuse_free(self, region)
        with self._lock:
            a = self._allocs.pop(region, None)
            if a is None:
                raise Misuse(f"{region} is not a live region of {self._facts.name} (freed, "
                             "or another device's)")
            # Memory whose bus addresses another device was given (held) must never go to
            # another allocation: the path keeps it for the process.
            if (a.kind is Memory.DEVICE and a.length <= CACHE_LARGEST and not a.held
                    and self._cached_bytes + a.length <= CACHE_BYTES and not self._stopped):
                self._cache.setdefault(a.length, []).append((self._next - 1, a))
                self._cached_bytes += a.length
                return
        try:
            self.path.free_memory(a)
        except BaseException:
            with self._lock:  # still the device's: stop() gives it back
                self._allocs[region] = a
            raise

    def _give_back(self, region: Region) -> None:
        """Free ``region`` to the RM at once (no keeping for reuse): for what a failed
        operation took."""
        with self._lock:
            a = self._allocs.pop(region, None)
        if a is not None:
            self.path.free_memory(a)

    def trim(self) -> None:
        """Give the RM back the Device memory :meth:`free` kept for reuse."""
        with self._lock:
            kept = [(length, entry) for length, entries in self._cache.items()
                    for entry in entries]
            self._cache.clear()
            self._cached_bytes = 0
        for i, (_, (_, a)) in enumerate(kept):
            try:
                self.path.free_memory(a)
            except BaseException:
                with self._lock:  # what was not given back stays kept, for stop()
                    for length, entry in kept[i:]:
                        self._cache.setdefault(length, []).append(entry)
                        self._cached_bytes += length
                raise

    def map_host(self, buffer: HostData) -> Region | Refusal:
        """Map the caller's memory (any buffer of whole pages or not) for the GPU.

        Returns a PINNED-kind region whose ``host`` is the buffer's address and whose ``gpu``
        is an address of its own, or :class:`rig_edge.Refusal` ``NEVER`` (these pages cannot
        be pinned) / ``NO_ROOM`` (the driver lacks memory, GPU addresses or files). Raises
        :class:`Misuse` for an object that is no buffer, or an empty one.
        """
        self._check()
        ffi = self.ffi
        raw: Any = buffer  # the buffer protocol, checked here at run time
        try:
            address = int(ffi.cast("uintptr_t", ffi.from_buffer(raw)))
            length = memoryview(raw).nbytes
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
            self._allocs[region] = a
        return region

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
        self._check()
        with self._lock:
            a = None if region in self._peer_in else self._allocs.get(region)
        if a is None:
            raise Misuse(f"{region} is not a live region of {self._facts.name} (freed, "
                         "another device's, or a peer's mapped here: export it from its own)")
        return self.path.export(a, region.gpu - a.gpu, region.length)

    # ---- kernels --------------------------------------------------------------------------

    def load(self, cubin: bytes) -> Image:
        """Load a cubin (as nvcc, ptxas, NVRTC or Triton emit it) into this device.

        Raises :class:`rig_nv.cubin.CubinError` for a malformed cubin or one built for another
        architecture (naming both), :class:`rig_edge.RigError` when memory runs out,
        :class:`Misuse` for ``cubin`` that is no buffer.
        """
        self._check()
        return launching.load(self, cubin)

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
        prep = fn.prepared.get((grid, block, shared, self._slm)) if (
            type(grid) is tuple and type(block) is tuple and type(fn) is Function) else None
        if prep is None or fn.image.device is not self or self._profile is not None:
            return launching.launch(self, fn, grid, block, args, shared)
        packer = fn.packers.get(tuple(map(type, args))) if type(args) is tuple else None
        if packer is None or packer[1] is not None:
            st, values = launching.arg_values(fn, args)
        else:  # launching.arg_values' common case: a tuple, in the parameters' order
            st, values = packer[0], list(map(operator.call, packer[2], args))
        slots = prep.slots
        if slots.at:  # launching.launch_blob's common case inline: a free slot after compute
            with self._lock:
                if self._lost is not None or self._stopped:
                    self._check()
                k = slots.turn
                done = self._word[0]
                compute = self.compute
                if (slots.values[k] <= done and self._last is compute
                        and not self._images_loaded):
                    at = slots.at[k]
                    pool = self._pool
                    st.pack_into(pool.view, at + 512 + fn.kernel.param_offset, *values)
                    slots.turn = k + 1 if k + 1 < launching.SLOTS else 0
                    value = self._next
                    self._next = value + 1
                    words = self._launch_words
                    words[1] = (pool.gpu + at) >> 8
                    words[7] = value & 0xFFFFFFFF
                    words[8] = value >> 32
                    compute.submit(words, value, done)
                    slots.values[k] = value
                    point = _new(Point)  # Point(self, value), without __init__'s calls
                    fields = point.__dict__
                    fields["device"], fields["value"] = self, value
                    return point
        return launching.launch_blob(self, prep, prep.blob, "launch", st, values,
                                     fn.kernel.param_offset)

    def _grow_local(self, per_thread: int, body: Push) -> None:
        """Give the compute engine ``per_thread`` bytes of local memory per thread."""
        per_tpc = -(-(-(-per_thread * 32 // 0x200) * 0x200) * self.max_warps_per_sm
                    * self.sm_per_tpc // 0x8000) * 0x8000
        region = self.alloc(per_tpc * self.tpc_slots, Memory.DEVICE)
        if region is None:
            raise RigError(f"{self._facts.name}: no memory for {per_thread} bytes of local "
                           "memory per thread")
        # Earlier launches may still use the old memory: it is kept until the device stops.
        self._local.append(region)
        body.method(SUBC_COMPUTE, COMPUTE_SET_SHADER_LOCAL_MEMORY_A, *hi_lo(region.gpu))
        body.method(SUBC_COMPUTE, COMPUTE_SET_SHADER_LOCAL_MEMORY_NON_THROTTLED_A,
                    *hi_lo(per_tpc), 0xFF)
        self._slm = per_thread

    def _ensure_local(self, per_thread: int) -> None:
        with self._lock:
            if per_thread > self._slm:
                body = Push()
                self._grow_local(per_thread, body)
                self._submit(self.compute, body)

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
        if n is None:
            n = checks.region_of("source", src).length - checks.whole("src_offset", src_offset)
        dst, dst_offset, n = checks.span(self, "destination", dst, dst_offset, n)
        src, src_offset, n = checks.span(self, "source", src, src_offset, n)
        d, s = dst.gpu + dst_offset, src.gpu + src_offset
        if engine != "copy":
            if engine not in ("auto", "sm"):
                raise Misuse(f"a copy's engine is 'auto', 'copy' or 'sm', not {engine!r}")
            video = dst.kind in VIDEO and src.kind in VIDEO
            if engine == "sm" and not video:
                raise Misuse("engine='sm' copies GPU memory (Device or Mapped) only, not "
                             f"{src.kind.value} to {dst.kind.value}")
            if engine == "sm" or (video and n >= KERNEL_COPY_LEAST):
                if self._copy_kernels() is not None:
                    return copies.kernel_copy(self, d, s, n)
                if engine == "sm":
                    raise Misuse(f"rig ships no copy kernels for {self.arch}: use "
                                 "engine='copy'")
        return self._submit(self.copy_channel, Push().copy(d, s, n), "copy")

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
        return peers.map_peer(self, owner, region)

    def _copy_kernels(self) -> Image | None:
        """rig's copy kernels for this GPU (loaded once), or None where none ships."""
        if self._builtins is None:
            data = builtin_cubin("copy", self.arch)
            if data is None:
                return None
            # rig's own loading is not the user's work: a profile open now leaves it out.
            profile, self._profile = self._profile, None
            try:
                self._builtins = launching.load(self, data)
            finally:
                self._profile = profile
        return self._builtins

    def upload(self, dst: Region, data: HostData, offset: int = 0) -> Point:
        """Copy host bytes ``data`` into ``dst`` at ``offset``.

        Host-visible regions are written directly; Device memory through pinned staging,
        pipelined. ``data`` may be reused when this returns; the returned point is done once
        the bytes are in ``dst``. Raises :class:`Misuse` for ``data`` that is no buffer, bytes
        outside ``dst``, or a ``dst`` that is not a live region of this device.
        """
        src = checks.buffer("upload's data", data)
        dst, offset, n = checks.span(self, "destination", dst, offset, len(src))
        self._check()
        if dst.host is not None:
            hostmem.copy(view(dst.host + offset, n), src)
            return Point(self, self._next - 1)
        return copies.staged_upload(self, dst, src, offset)

    def download(self, src: Region, n: int | None = None, offset: int = 0,
                 out: HostData | None = None) -> memoryview:
        """Copy ``n`` bytes of ``src`` from ``offset`` to the host and return them (in ``out``
        when given). Waits for earlier work, so the bytes are those the timeline's last point
        left. Raises :class:`Misuse` for bytes outside ``src``, a ``src`` that is not a live
        region of this device, or an ``out`` that is no writable buffer of ``n`` bytes.
        """
        if n is None:
            n = checks.region_of("source", src).length - checks.whole("offset", offset)
        src, offset, n = checks.span(self, "source", src, offset, n)
        result = checks.buffer("out", out if out is not None else bytearray(n), writable=True)
        if len(result) < n:
            raise Misuse(f"out holds {len(result)} bytes, fewer than {n}")
        self._check()
        if src.host is not None:
            self.synchronize()
            hostmem.copy(result[:n], view(src.host + offset, n))
            return result[:n]
        copies.staged_download(self, src, n, offset, result)
        return result[:n]

    # ---- stopping ------------------------------------------------------------------------

    def sleep(self, timeout_s: float) -> None:
        """Sleep through the path until the GPU may have progressed; raises its faults, and
        :class:`Misuse` for a timeout that is not a number of seconds >= 0."""
        checks.seconds("a sleep's timeout", timeout_s)
        self._check()
        fault = self._faulted()
        if fault is not None:
            raise self._lose(fault)
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
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        rm, path = self.path.rm, self.path
        # Whatever fails below, the GPU can be opened again (the spec): closed() runs last.
        try:
            failed = peers.end_all(self) if self._peer_in or self._peer_out else None
            if self._boosted:
                # If the RM refuses, it still drops a client's boost when the client goes.
                with contextlib.suppress(RigError):
                    self._boost(PERF_BOOST_CLEAR, 0)
                self._boosted = False
            channels_freed = True
            for h in self._attached:
                try:
                    path.detach_channel(h)
                except RigError:
                    channels_freed = False
            for h in reversed(self._handles):
                try:
                    rm.free(h)
                except RMError as e:
                    # Freeing a parent frees its children: an already-gone handle is not a
                    # failure.
                    if e.status not in GONE:
                        channels_freed = False
                except RigError:
                    channels_freed = False
            if self._doorbell is not None:
                try:
                    path.unmap_object(self._doorbell)
                except OSError as e:
                    failed = failed or e
            if channels_freed:
                kept = [a for entries in self._cache.values() for _, a in entries]
                self._cache.clear()
                memory = [*self._allocs.values(), *self._own, *kept]
                self._allocs.clear()
                self._own.clear()
                for a in memory:  # give back all it can, then say what failed
                    try:
                        path.free_memory(a)
                    except Exception as e:
                        failed = failed or e
            if failed is not None:
                raise failed
        finally:
            path.closed()


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
