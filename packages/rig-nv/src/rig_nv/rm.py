"""The one RM interface both of rig's paths speak, and what a path gives the device beyond it.

The resource manager (RM) holds objects in a tree under a client: ``alloc`` makes one,
``control`` sends it a command, ``free`` removes it and everything under it. The kernel-driver
path reaches the RM by ioctls; the PCI path by RPCs to the GSP. Parameters travel as the bytes
of the structs in :mod:`rig_nv.layouts`; the RM writes its answers back into the same buffer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rig_edge import Bus, Dmabuf, Lost, Memory, Refusal, RigError
from rig_nv.clock import Clock
from rig_nv.status import status_name

HUGE_PAGE = 2 << 20
SMALL_PAGE = 4 << 10


def page_rounded(n: int, kind: Memory) -> int:
    """The size a path allocates for ``n`` bytes of ``kind``: whole 2 MiB pages from 2 MiB of
    GPU memory up, else whole 4 KiB pages."""
    page = HUGE_PAGE if n >= HUGE_PAGE and kind is not Memory.PINNED else SMALL_PAGE
    return (n + page - 1) // page * page


class RMError(RigError):
    """The RM refused a call; ``status`` is its NV_STATUS code (see :mod:`rig_nv.status`)."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what}: the RM answered {status_name(status)}")
        self.status = status


class RM(Protocol):
    """An RM client: alloc / control / free of RM objects."""

    @property
    def client(self) -> int:
        """The client's handle, root of every object this client makes."""
        ...

    @property
    def release(self) -> str:
        """The driver release the RM speaks, e.g. ``"580.159.04"``."""
        ...

    @property
    def layouts(self) -> str:
        """The struct layout set for that release (``"570"``, ``"580"``)."""
        ...

    def new_handle(self) -> int:
        """A handle no object of this client has."""
        ...

    def alloc(self, parent: int, handle: int, cls: int, params: bytearray | None = None) -> int:
        """Make object ``handle`` of class ``cls`` under ``parent``; raises :class:`RMError`."""
        ...

    def control(self, obj: int, cmd: int, params: bytearray | None) -> None:
        """Send command ``cmd`` to ``obj``; ``params`` is read and written in place."""
        ...

    def free(self, obj: int) -> None:
        """Remove ``obj`` and every object under it; raises :class:`RMError`."""
        ...


@dataclass
class Allocation:
    """Memory a path made and mapped: GPU address, host address (or ``None``), length, kind,
    the RM memory object's handle, and whatever the path needs to undo it.

    ``held``: the path gave the memory to another device (:meth:`Path.export`), so the device
    never keeps it for reuse. The kernel path's dma-buf holds the RM object until its last
    reference goes; the PCI path handed out bus addresses, and its ``free_memory`` gives none
    of it back (Rig_nv_pci: "The region's memory and the GPU then stay the process's until it
    exits")."""

    gpu: int
    host: int | None
    length: int
    kind: Memory
    handle: int
    undo: Any = field(default=None, repr=False)
    held: bool = False


class Path(Protocol):
    """One GPU reached through one RM path: what ``rig_nv.make`` needs beyond :class:`RM`.

    The path made the GPU's device, subdevice and address space in the RM (``h_device``,
    ``h_subdevice``, ``h_vaspace``); the device makes its channels under them.
    """

    name: str
    bus: str
    h_device: int
    h_subdevice: int
    h_vaspace: int
    hang_ms: int | None
    maps_host: bool
    # Whether the path's sleep can end on the GPU's non-stall interrupt: only then does a
    # submission end by asking for one (host method NON_STALL_INTERRUPT, clc86f.h).
    wakes_on_interrupt: bool

    @property
    def rm(self) -> RM:
        """The RM client the GPU's objects belong to."""
        ...

    def map_object(self, handle: int, length: int) -> memoryview:
        """Map RM object ``handle`` (a usermode page) into the process, read-write."""
        ...

    def unmap_object(self, view: memoryview) -> None:
        """Unmap what :meth:`map_object` mapped."""
        ...

    def alloc_memory(self, n: int, kind: Memory, *, contiguous: bool = False) -> Allocation | None:
        """``n`` bytes (rounded up to pages) mapped for the GPU, or ``None`` when out of it."""
        ...

    def alloc_notifier(self) -> Allocation:
        """A page of system memory the RM can write a channel's error notifier into,
        mapped for the host (not for the GPU)."""
        ...

    def free_memory(self, a: Allocation) -> None:
        """Give back memory :meth:`alloc_memory`, :meth:`alloc_notifier` or :meth:`map_host`
        made."""
        ...

    def map_host(self, address: int, length: int) -> Allocation | Refusal:
        """Map the caller's pages ``[address, address+length)`` for the GPU."""
        ...

    def export(self, a: Allocation, offset: int, length: int) -> Dmabuf | Bus:
        """Give another device ``length`` bytes at ``offset`` of ``a``: the kernel path exports
        the RM object as a new dma-buf; the PCI path answers the bus ranges (or why it
        cannot reach them). Either sets ``a.held`` once it hands the memory out."""
        ...

    def map_peer(self, a: Allocation, owner: Any) -> Allocation:
        """Map ``a``, memory of the GPU of path ``owner``, into this GPU's address space at
        ``a.gpu``; raises :class:`rig_edge.RigError` where it cannot."""
        ...

    def unmap_peer(self, p: Allocation) -> None:
        """End a mapping :meth:`map_peer` made."""
        ...

    def attach_channel(self, h_channel: int) -> None:
        """Tell the path about a new channel (the kernel path registers it with UVM)."""
        ...

    def detach_channel(self, h_channel: int) -> None:
        """Tell the path a channel is going, before the RM frees it."""
        ...

    def sleep(self, timeout_s: float) -> None:
        """Sleep until the GPU may have made progress, or ``timeout_s`` passed."""
        ...

    def closed(self) -> None:
        """The device stopped: the GPU may be opened again."""
        ...


@runtime_checkable
class ReportsFaults(Protocol):
    """A path whose RM also reports faults by message, beside the channels' error notifiers
    (the PCI path: the GSP's RC_TRIGGERED and lockdown notices). A path need not be one; the
    device asks one where it tests its notifiers, while it waits and sleeps."""

    def fault(self, channels: Mapping[int, str], notified: bool) -> Lost | None:
        """What the RM reported since the device's last question: a :class:`rig_edge.Fault`
        of one of ``channels`` (a channel's RM handle to the device's name of it), or the
        :class:`rig_edge.Lost` of the GPU, else ``None``. ``notified``: an error notifier
        of the device's channels is written, and the report may follow it."""
        ...


@runtime_checkable
class ReadsClock(Protocol):
    """A path that reads the GPU's clock (PTIMER, :mod:`rig_nv.clock`): ``clock`` says how
    (``None``: this one cannot), ``gpu_time_ns`` reads it. A path need not be one; the
    device's ``clock`` is ``None`` then, and its profiles' times stay the GPU's alone."""

    @property
    def clock(self) -> Clock | None: ...

    def gpu_time_ns(self) -> int:
        """The GPU's clock now, in nanoseconds; raises :class:`rig_edge.RigError` where the
        read fails."""
        ...
