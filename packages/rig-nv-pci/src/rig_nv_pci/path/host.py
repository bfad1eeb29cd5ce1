"""What the process hands the PCI path of the GPU's function: its BARs (:class:`Bars`), the
system memory the GPU reaches (:class:`SystemMemory`), the bus ranges another device reaches
them at (:class:`BusRanges`), and where the process's own addresses and the GPU's coincide
(:class:`Placement`). rig_nv_pci.held makes them of a taken rig_pci.Function; the tests, of
the simulated GPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rig_edge import Bus
from rig_nv_pci.path.allocations import Dma
from rig_nv_pci.path.space import Range


class Bars(Protocol):
    """The GPU's BARs as the process maps them."""

    def view(self, index: int, offset: int, length: int, at: int | None = None) -> memoryview:
        """A read-write view of ``length`` bytes at ``offset`` of BAR ``index``; with ``at``,
        mapped at that process address over the process's reservation (:class:`Placement`),
        which :meth:`close` puts back."""
        ...

    def close(self, view: memoryview) -> None:
        """Unmap a view :meth:`view` gave, once the path is done with it."""
        ...


class SystemMemory(Protocol):
    """System memory the GPU reaches (what rig_pci.Function hands out)."""

    @property
    def maps_host(self) -> bool:
        """Whether the process's own pages can be mapped for the GPU (behind an IOMMU)."""
        ...

    def alloc_dma(self, n: int, *, at: int | None = None) -> Dma | None:
        """``n`` bytes the GPU reaches (at process address ``at`` where given), or ``None``
        when there is none."""
        ...

    def map_host(self, address: int, length: int) -> Dma | None:
        """The process's pages ``[address, address+length)`` for the GPU, or ``None`` once
        RLIMIT_MEMLOCK runs out."""
        ...


class BusRanges(Protocol):
    """The bus ranges another device reaches the GPU's memory at, or why not
    (rig_pci.memory.bus and dma_bus of the function)."""

    def bar(self, index: int, offset: int, length: int) -> Bus: ...

    def dma(self, dma: Dma, offset: int, length: int) -> Bus: ...


@dataclass(frozen=True)
class Placement:
    """GPU addresses that are the process's own (its reservation, ``addresses``): Pinned
    memory and Mapped memory's BAR 1 windows lie at their GPU address, Pinned memory in whole
    ``granule``s (the DMA memory's page: 2 MiB for a function taken physically)."""

    addresses: Range
    granule: int
