"""Transports: how a :class:`rig_pci.Machine` reaches its PCI functions.

A :class:`Transport` lists a machine's functions and takes one, answering an :class:`Access`
through which the function's config space, BARs and reset are reached. rig-pci has one
sysfs implementation, :class:`rig_pci.sysfs.SysfsTransport`: a sysfs tree, this machine's
(root ``/``, ``Machine.this()``) or one under a directory (``Machine.at(path)``, which is how
every test runs without hardware). :class:`rig_pci.ssh.SshTransport` reaches another machine
through rig's agent there (``Machine.ssh``). A simulated device is reached by writing another:
listing, config space, BAR access and reset then go wherever it sends them. A transport to
another machine's processes takes the locks that keep them off a device there
(:class:`LocksThere`).

What only this machine can do (DMA memory lies in this process's memory) needs a transport
whose ``shares_memory`` is true; :class:`rig_pci.Function` refuses it elsewhere, clearly.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rig_pci.dma import DmaMemory
from rig_pci.listing import FunctionInfo
from rig_pci.window import Window


class Access(Protocol):
    """A function a transport took for this process. Only :class:`rig_pci.Function` calls it,
    and it calls :meth:`close` once."""

    @property
    def how(self) -> str:
        """How it was taken, for messages: ``"VFIO"``, ``"physically"``, or the transport's."""
        ...

    @property
    def maps_host(self) -> bool:
        """Whether the device can be given the process's own (pageable) memory: true behind
        an IOMMU, false for a function taken physically."""
        ...

    @property
    def can_reset(self) -> bool:
        """Whether Linux (or the transport) has a reset for the function."""
        ...

    def config(self) -> Window:
        """The function's config space."""
        ...

    def window(self, bar: int, offset: int, length: int, write_combined: bool,
               at: int | None = None) -> Window:
        """``length`` bytes of BAR ``bar`` from ``offset`` (both page-aligned, inside the BAR).

        ``at`` (passed only when a caller asks for it, so a transport that places nothing
        need not take it) maps them at that page-aligned address of this process, over a
        range the caller reserved: a :class:`rig_pci.window.PlacedWindow`, whose close puts
        the reservation back.

        Raises :class:`rig_edge.RigError` if the BAR cannot be mapped (there)."""
        ...

    def reset(self) -> None:
        """Linux's function reset (or the transport's); raises :class:`rig_edge.RigError` if it
        fails."""
        ...

    def alloc_dma(self, n: int, at: int | None) -> DmaMemory | None:
        """``n`` bytes (a multiple of :attr:`dma_granule`) the device reaches, at ``at`` when
        given (a reserved range of the process's, which the memory replaces and gives back on
        free), or ``None`` when out of it."""
        ...

    @property
    def dma_granule(self) -> int:
        """The size DMA memory comes in: a page behind an IOMMU, a 2 MiB huge page physically."""
        ...

    def map_host(self, address: int, length: int) -> DmaMemory | None:
        """Map the process's own memory for the device (when :attr:`maps_host`), or ``None``
        when the locked-memory limit is reached."""
        ...

    def close(self) -> None:
        """Give everything back: mappings, files, the hold on the function."""
        ...


class Transport(Protocol):
    """How a machine's functions are reached."""

    @property
    def name(self) -> str:
        """The machine, for messages: ``"this machine"``, ``"the machine at /tmp/x"``."""
        ...

    @property
    def shares_memory(self) -> bool:
        """Whether this process's memory is the machine's, so its devices reach it by DMA."""
        ...

    def functions(self) -> list[FunctionInfo]:
        """The machine's functions in bus order (domain, bus, device, function as numbers).

        None on a machine with no PCI; a function whose files cannot be read is left out.
        Raises :class:`rig_edge.RigError` with the reason when no listing can be made.
        """
        ...

    def function(self, address: str) -> FunctionInfo:
        """The function at ``address``; raises :class:`rig_edge.RigError` if it can't be read."""
        ...

    def take(self, address: str) -> Access:
        """Take the function at ``address`` for this process.

        Raises :class:`rig_edge.RigError` with the reason when it cannot: another driver holds
        it, its IOMMU group is not viable, its files cannot be opened, another holder has it.
        """
        ...


class Held(Protocol):
    """A lock held until :meth:`release` (again does nothing)."""

    def release(self) -> None: ...


@runtime_checkable
class LocksThere(Protocol):
    """A transport to another machine, whose processes respect only locks taken there."""

    def lock(self, name: str) -> Held:
        """Take the lock file ``name`` in the machine's lock directory
        (:func:`rig_pci.locks.directory` there), without waiting, held until released or the
        connection ends; raises :class:`rig_edge.RigError` as
        :meth:`rig_pci.locks.FileLock.take`, or when the machine cannot be reached."""
        ...
