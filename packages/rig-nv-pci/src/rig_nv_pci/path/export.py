"""Another device's access to the PCI path's memory (:meth:`rig_nv_pci.path.pci.PciPath.export`,
rig_nv's ``Device.dma``, the spec's Rig_nv.dma): the bus ranges of a region, as the
Rig_nv_pci spec has Rig_pci.Memory.bus state them (the path's
:class:`rig_nv_pci.path.host.BusRanges`: rig_pci.memory.bus and dma_bus of the function), or
why another device cannot reach them.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-export.md."""

from __future__ import annotations

import threading

from rig_edge import Bus, Misuse
from rig_nv.rm import Allocation
from rig_nv_pci.path import mmu
from rig_nv_pci.path.allocations import Bar1, Undo
from rig_nv_pci.path.host import BusRanges


class Exports:
    """The bus ranges another device reaches a path's memory at, and the memory they were
    given for (``kept``, the process's for good). ``name`` names the path in reasons,
    ``bar1`` maps Device memory into BAR 1, ``bus`` says the bus ranges of a BAR's range and
    of DMA memory (``None``: the path cannot say)."""

    def __init__(self, name: str, bar1: Bar1, bus: BusRanges | None) -> None:
        self.name, self._bar1, self._bus = name, bar1, bus
        # memory whose bus ranges another device was given: the process's for good
        self.kept: list[Allocation] = []
        self._lock = threading.Lock()  # kept
        self._map_lock = threading.Lock()  # one BAR 1 mapping however many threads ask

    def any_kept(self) -> bool:
        """Whether any memory's bus ranges were given (so a stop keeps the GPU)."""
        with self._lock:
            return bool(self.kept)

    def export(self, a: Allocation, offset: int, length: int) -> Bus:
        """The bus ranges at which another device (a NIC the process drives over PCI)
        reaches ``length`` bytes at ``offset`` of ``a``, or why it cannot (``Bus.reason``),
        as the Rig_nv_pci spec has Rig_pci.Memory.bus state them: GPU memory through BAR 1,
        the memory BAR; Pinned memory at its DMA memory's bus addresses
        (rig_pci.memory.dma_bus). Mapped memory lies in BAR 1 already; Device memory is
        mapped into BAR 1 here by the path's BAR 1 tables, as Mapped memory is (under
        GSP-RM's BAR 1 root, kbusPatchBar1Pdb_GSPCLIENT), and the mapping is undone where
        the BAR is not reachable. Once ranges are given ``a`` is held and in ``kept`` (the
        path's ``free_memory`` keeps it, and a stop keeps the GPU: its ``closed``)."""
        undo: Undo = a.undo
        if undo.dma is not None:
            if self._bus is None:
                return Bus(reason=f"{self.name}: this path was made without its function's "
                           "bus addresses")
            found = self._bus.dma(undo.dma, offset, length)
        else:
            found = self._bar1_bus(undo, offset, length)
        if found.ranges:
            with self._lock:
                if not a.held:
                    a.held = True
                    self.kept.append(a)
        return found

    def _bar1_bus(self, undo: Undo, offset: int, length: int) -> Bus:
        """GPU memory's bus ranges through BAR 1 (see :meth:`export`)."""
        if self._bus is None:
            return Bus(reason=f"{self.name}: this path was made without its function's bus "
                       "addresses")
        assert undo.fb is not None
        bar1 = self._bar1
        with self._map_lock:
            at = undo.bar1  # Mapped memory's, or Device memory's from an earlier export
            mapped_here = False
            if at is None and bar1.tables is None:
                at = undo.fb  # BAR 1 shows video memory one to one
            if at is None:  # Device memory: into BAR 1 as Mapped memory goes
                try:
                    at = bar1.map(undo.fb, undo.size, undo.huge, undo)
                except mmu.NoRoom:  # no video memory for a BAR 1 page table
                    self._drop_bar1(undo)
                if at is None:
                    return Bus(reason=f"{self.name}: BAR 1 has no room for 0x{undo.size:x} "
                               "bytes of Device memory")
                mapped_here = True
            try:
                found = self._bus.bar(1, at + offset, length)
            except Misuse:
                if bar1.tables is not None:
                    raise
                # without BAR 1 tables the memory's FB offset may lie past the BAR's end
                found = Bus(reason=f"{self.name}: BAR 1 does not show FB offset "
                            f"0x{undo.fb + offset:x} (+0x{length:x})")
            if found.reason is not None and mapped_here:  # no use to anyone: give it back
                self._drop_bar1(undo)
            return found

    def _drop_bar1(self, undo: Undo) -> None:
        """End the BAR 1 mapping (whole or partly written) an export made of Device
        memory."""
        if undo.bar1 is not None:
            self._bar1.unmap(undo.bar1, undo.size, undo.huge)
            undo.bar1 = None
