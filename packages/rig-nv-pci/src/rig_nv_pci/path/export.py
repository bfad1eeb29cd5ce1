"""Another device's access to the PCI path's memory (:meth:`rig_nv_pci.path.pci.PciPath.export`,
rig_nv's ``Device.dma``, the spec's Rig_nv.dma): the bus ranges of a region, as the
Rig_nv_pci spec has Rig_pci.Memory.bus state them (the path's ``bar_bus`` and ``dma_bus``:
rig_pci.memory.bus and dma_bus of the function), or why another device cannot reach them.

GPU memory goes through BAR 1, the memory BAR: Mapped memory at its BAR 1 offset; Device
memory mapped into BAR 1 first by the path's BAR 1 tables, as Mapped memory is (under
GSP-RM's BAR 1 root, GspStaticConfigInfo.bar1PdeBase, as kern_bus.c
kbusPatchBar1Pdb_GSPCLIENT has CPU-RM do), that mapping undone where the BAR is not
reachable. Pinned memory is reached at its DMA memory's bus addresses.

Ranges once given, the memory stays the process's (the spec: "The region's memory and the GPU
then stay the process's until it exits"): the allocation is marked held and kept in the
path's ``kept``, so its free gives nothing back and the device's stop leaves the GSP running
with every object of the device (so BAR 1 keeps showing the memory) and calls ``on_kept``
instead of ``on_closed``, for the opener to keep the GPU
(:meth:`rig_nv_pci.path.pci.PciPath.free_memory`, :meth:`rig_nv_pci.path.pci.PciPath.closed`).

Module functions taking the path; :class:`rig_nv_pci.path.pci.PciPath` keeps the method rig_nv's
Path protocol names, which calls them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rig_edge import Bus, Misuse
from rig_nv.rm import Allocation
from rig_nv_pci.path import mmu

if TYPE_CHECKING:
    from rig_nv_pci.path.pci import PciPath, Undo


def export(path: PciPath, a: Allocation, offset: int, length: int) -> Bus:
    """The bus ranges at which another device (a NIC the process drives over PCI) reaches
    ``length`` bytes at ``offset`` of ``a``, or why it cannot (``Bus.reason``), as the
    Rig_nv_pci spec has Rig_pci.Memory.bus state them: GPU memory through BAR 1, the
    memory BAR; Pinned memory at its DMA memory's bus addresses (rig_pci.memory.dma_bus).
    Mapped memory lies in BAR 1 already; Device memory is mapped into BAR 1 here by the
    path's BAR 1 tables, as Mapped memory is (under GSP-RM's BAR 1 root,
    kbusPatchBar1Pdb_GSPCLIENT), and the mapping is undone where the BAR is not
    reachable. Once ranges are given ``a`` is held (the path's ``free_memory`` keeps it, and
    a stop keeps the GPU: its ``closed``)."""
    undo: Undo = a.undo
    if undo.dma is not None:
        if path._dma_bus is None:
            return Bus(reason=f"{path.name}: this path was made without its function's "
                       "bus addresses")
        found = path._dma_bus(undo.dma, offset, length)
    else:
        found = bar1_bus(path, a, undo, offset, length)
    if found.ranges:
        with path._lock:
            if not a.held:
                a.held = True
                path.kept.append(a)
    return found


def bar1_bus(path: PciPath, a: Allocation, undo: Undo, offset: int, length: int) -> Bus:
    """GPU memory's bus ranges through BAR 1 (see :func:`export`)."""
    if path._bar_bus is None:
        return Bus(reason=f"{path.name}: this path was made without its function's bus "
                   "addresses")
    assert undo.fb is not None
    with path._export_lock:  # one BAR 1 mapping however many threads ask at once
        at = undo.bar1  # Mapped memory's, or Device memory's from an earlier export
        mapped_here = False
        if at is None and path.bar1_tables is None:
            at = undo.fb  # BAR 1 shows video memory one to one
        if at is None:  # Device memory: into BAR 1 as Mapped memory goes
            try:
                at = path.map_bar1(undo.fb, undo.size, undo.huge, undo)
            except mmu.NoRoom:  # no video memory for a BAR 1 page table
                drop_bar1(path, undo)
            if at is None:
                return Bus(reason=f"{path.name}: BAR 1 has no room for 0x{undo.size:x} "
                           "bytes of Device memory")
            mapped_here = True
        try:
            found = path._bar_bus(1, at + offset, length)
        except Misuse:
            if path.bar1_tables is not None:
                raise
            # without BAR 1 tables the memory's FB offset may lie past the BAR's end
            found = Bus(reason=f"{path.name}: BAR 1 does not show FB offset "
                        f"0x{undo.fb + offset:x} (+0x{length:x})")
        if found.reason is not None and mapped_here:  # no use to anyone: give it back
            drop_bar1(path, undo)
        return found


def drop_bar1(path: PciPath, undo: Undo) -> None:
    """End the BAR 1 mapping (whole or partly written) an export made of Device memory."""
    if undo.bar1 is not None:
        path.unmap_bar1(undo.bar1, undo.size, undo.huge)
        undo.bar1 = None
