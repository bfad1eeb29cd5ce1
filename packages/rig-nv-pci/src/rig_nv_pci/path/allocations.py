"""What an allocation of the PCI path holds (:class:`Undo`), and the parts it names: the
system memory the GPU reaches (:class:`Dma`) and a GPU's BAR 1 as its path maps it
(:class:`Bar1`). Here, not in :mod:`rig_nv_pci.path.pci`, so that the modules the path
calls (:mod:`rig_nv_pci.path.export`, :mod:`rig_nv_pci.path.peers`) take them without
importing the path back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from rig_nv_pci.path import mmu


class Dma(Protocol):
    """System memory the GPU reaches (rig_pci.DmaMemory)."""

    @property
    def length(self) -> int: ...

    def view(self) -> memoryview: ...

    def bus_address(self, offset: int) -> int: ...

    def free(self) -> None: ...


class Bar1(Protocol):
    """A GPU's BAR 1 as its path maps video memory into it
    (:class:`rig_nv_pci.path.space.Bar1` is one)."""

    @property
    def tables(self) -> mmu.PageTables | None:
        """The path's BAR 1 page tables; ``None``: BAR 1 shows video memory one to one."""
        ...

    def map(self, fb: int, size: int, huge: bool, undo: Undo) -> int | None:
        """Video memory ``[fb, fb+size)`` mapped into BAR 1: its BAR 1 offset, noted in
        ``undo.bar1`` (``None`` where BAR 1 has no room)."""
        ...

    def unmap(self, at: int, size: int, huge: bool) -> None:
        """Undo :meth:`map` of ``size`` bytes at BAR 1 offset ``at``."""
        ...


@dataclass
class Undo:
    """What an allocation holds: its DMA memory (system memory), its GPU range, the steps of
    freeing done so far (a failed free is retried from the first step not done)."""

    dma: Dma | None
    va: int | None
    size: int
    done: set[str] = field(default_factory=set)
    view: memoryview | None = None  # Mapped memory: its BAR 1 view
    fb: int | None = None  # video memory: its offset in the path's heap
    bar1: int | None = None  # Mapped memory: its offset in BAR 1 (the path's BAR 1 tables)
    huge: bool = False  # mapped with 2 MiB pages
    # a peer mapping of another GPU's Device memory: that GPU's BAR 1 and the offset it
    # mapped the memory at for this mapping (given back with it)
    lent: tuple[Bar1, int] | None = None
