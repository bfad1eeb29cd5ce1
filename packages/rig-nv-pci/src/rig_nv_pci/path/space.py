"""The PCI path's GPU address space and its BAR 1: the GPU addresses it hands out, the page
tables it writes through BAR 0's PRAMIN window (or, without them, the GSP's mappings), and
BAR 1's tables under GSP-RM's root with the BAR 1 offsets they map.

Each part owns its state and lock; the page tables of both share the PRAMIN window, and so
one lock (:class:`Window`)."""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Protocol

from rig_edge import RigError
from rig_nv.rm import RMError
from rig_nv_pci.gsp import payloads, rpc
from rig_nv_pci.path import mmu, vidmem
from rig_nv_pci.path.allocations import Undo
from rig_nv_pci.path.rm import PciRM
from rig_nv_pci.path.vidmem import Addresses, Heap

# NVOS46_FLAGS (nvos.h): PAGE_SIZE 11:8 (4KB 1, HUGE 4), DMA_OFFSET_FIXED 15:15.
MAP_FIXED = 1 << 15
MAP_4KB, MAP_HUGE = 1 << 8, 4 << 8
HUGE, SMALL = 2 << 20, 4 << 10
# The server RM's part of every address space (g_gpu_vaspace_nvoc.h
# SPLIT_VAS_SERVER_RM_MANAGED_VA_START 4 GiB, _SIZE 512 MiB), whose PD3/PD2/PD1 the client
# hands over with NV90F1_CTRL_CMD_VASPACE_COPY_SERVER_RESERVED_PDES (ctrl90f1.h), pageSize
# 2^GMMU_PD1_VADDR_BIT_LO (29) as gpu_vaspace.c _gvaspacePopulatePDEentries fills it.
NV90F1_CTRL_CMD_VASPACE_COPY_SERVER_RESERVED_PDES = 0x90F10106
SERVER_VA, SERVER_VA_SIZE, SERVER_PAGE_SIZE = 1 << 32, 512 << 20, 1 << 29
GMMU_APERTURE_VIDEO = 1  # gmmu_fmt.h GMMU_APERTURE
# NV90F1_CTRL_VASPACE_COPY_SERVER_RESERVED_PDES_PARAMS: hSubDevice, subDeviceId, pageSize,
# virtAddrLo, virtAddrHi, numLevelsToCopy, then levels[GMMU_FMT_MAX_LEVELS 6] of
# {physAddress, size, aperture, pageShift} (24 bytes each): 184 bytes.
COPY_PDES = struct.Struct("<IIQQQI4x")
COPY_PDES_LEVEL = struct.Struct("<QQIB3x")
GMMU_FMT_MAX_LEVELS = 6


class Range(Protocol):
    """GPU addresses to take and give back (:class:`rig_nv_pci.path.vidmem.Addresses`,
    :class:`rig_nv_pci.path.addresses.Reservation`)."""

    def take(self, size: int, align: int) -> int | None: ...

    def give(self, at: int, size: int) -> None: ...


class Window:
    """Video memory reached through BAR 0's PRAMIN window (``bar0``, of page table format
    ``fmt``), and the page tables written through it: one lock for all of them, since each
    write moves the window."""

    def __init__(self, bar0: mmu.Registers, fmt: mmu.Format, heap: Heap) -> None:
        self.bar0, self.fmt, self._heap = bar0, fmt, heap
        self._pramin = mmu.Pramin(bar0, fmt.window)
        self.lock = threading.Lock()  # held around every write through the window

    def tables(self, root: int | None = None) -> mmu.PageTables:
        """Page tables whose pages come from the heap (under ``root``, another's, if given);
        use them under :attr:`lock`."""
        bar0 = self.bar0
        return mmu.PageTables(
            lambda: self._heap.take(SMALL), self._pramin.write,
            lambda root, downgrade: mmu.invalidate(bar0, root, downgrade=downgrade),
            self.fmt, lambda page: self._heap.give(page, SMALL), root, self._pramin.read)

    def zero(self, at: int, size: int) -> None:
        """Zero video memory ``[at, at+size)``."""
        with self.lock:
            self._pramin.write(at, bytes(size))


class Bar1:
    """BAR 1 as the path maps video memory into it (:class:`rig_nv_pci.path.allocations.Bar1`):
    ``tables`` under GSP-RM's BAR 1 root (``None``: BAR 1 shows video memory one to one),
    through ``window``, and the BAR 1 ``offsets`` they may map."""

    def __init__(self, tables: mmu.PageTables | None = None, offsets: Addresses | None = None,
                 window: Window | None = None) -> None:
        self.tables, self._window = tables, window
        self.offsets = offsets or Addresses(0, 0)
        self._lock = threading.Lock()  # offsets

    def map(self, fb: int, size: int, huge: bool, undo: Undo) -> int | None:
        """Video memory ``[fb, fb+size)`` mapped into BAR 1 by the tables: its BAR 1 offset,
        noted in ``undo.bar1`` (``None`` where BAR 1 has no room); ``fb`` itself without
        them."""
        if self.tables is None:
            return fb
        with self._lock:
            at = self.offsets.take(size, HUGE if huge else SMALL)
        if at is None:
            return None
        undo.bar1 = at
        assert self._window is not None
        with self._window.lock:
            self.tables.map(at, size, lambda o: fb + o, video=True, huge=huge,
                            kind=vidmem.KIND_GENERIC)
        return at

    def unmap(self, at: int, size: int, huge: bool) -> None:
        """Undo :meth:`map` of ``size`` bytes at BAR 1 offset ``at``."""
        if self.tables is not None:
            assert self._window is not None
            with self._window.lock:
                self.tables.unmap(at, size, huge=huge)
            with self._lock:
                self.offsets.give(at, size)


class AddressSpace:
    """A device's GPU address space: the GPU addresses it takes from ``addresses`` and the
    mappings of them, written into ``tables`` through ``window`` or, without a window, asked
    of the GSP (MAP_MEMORY_DMA of ``device``'s virtual memory object ``virtual``)."""

    def __init__(self, name: str, rm: PciRM, device: int, virtual: int, addresses: Range,
                 window: Window | None) -> None:
        self.name, self._rm, self._device, self._virtual = name, rm, device, virtual
        self.addresses = addresses
        self._window = window
        self.tables: mmu.PageTables | None = None if window is None else window.tables()
        self._lock = threading.Lock()  # addresses

    def take(self, size: int, align: int) -> int | None:
        """``size`` GPU addresses aligned to ``align``, or ``None`` when none are left."""
        with self._lock:
            return self.addresses.take(size, align)

    def give(self, va: int, size: int) -> None:
        with self._lock:
            self.addresses.give(va, size)

    def copy_server_pdes(self, subdevice: int, vaspace: int) -> None:
        """Hand the GSP the page directories over the server's range, as CPU-RM does for a
        GSP client's address space (gpu_vaspace.c _gvaspaceCopyServerRmReservedPdesToServerRm):
        GSP-RM mirrors them, so its tables hang from the path's PD3."""
        assert self.tables is not None
        levels = self.tables.directory(SERVER_VA)
        shifts = [level.shift for level in self.tables.fmt.directories]
        params = bytearray(COPY_PDES.pack(subdevice, 0, SERVER_PAGE_SIZE, SERVER_VA,
                                          SERVER_VA + SERVER_VA_SIZE - 1, len(levels)))
        for i in range(GMMU_FMT_MAX_LEVELS):
            params += (COPY_PDES_LEVEL.pack(levels[i], mmu.PAGE, GMMU_APERTURE_VIDEO, shifts[i])
                       if i < len(levels) else bytes(COPY_PDES_LEVEL.size))
        self._rm.control(vaspace, NV90F1_CTRL_CMD_VASPACE_COPY_SERVER_RESERVED_PDES, params)

    def map(self, handle: int, size: int, va: int, huge: bool,
            address: Callable[[int], int], video: bool, *, kind: int | None = None,
            coherent: bool = True, volatile: bool = False, big: bool = False) -> None:
        """Map ``handle``'s ``size`` bytes at ``va``: in the page tables (the page at offset
        ``o`` is ``address(o)``, in video memory or, by bus address, system memory; ``kind``,
        ``coherent`` and ``volatile`` as :meth:`rig_nv_pci.path.mmu.PageTables.map` takes
        them, the kind GENERIC for video memory and PITCH for system memory by default; in
        64 KiB pages where ``big`` and not ``huge``), else by the GSP. Raises
        :class:`rig_nv_pci.path.mmu.NoRoom` where video memory has no room for a table,
        :class:`rig_nv.rm.RMError` where the GSP refuses."""
        if self.tables is not None:
            if kind is None:
                kind = vidmem.KIND_GENERIC if video else mmu.KIND_PITCH
            assert self._window is not None
            with self._window.lock:
                self.tables.map(va, size, address, video=video, huge=huge, big=big, kind=kind,
                                coherent=coherent, volatile=volatile)
            return
        payload = payloads.encode_map_dma(self._rm.client, self._device, self._virtual, handle, 0,
                                     size, MAP_FIXED | (MAP_HUGE if huge else MAP_4KB), va)
        reply = self._rm.rpc_rm.rpc.call(rpc.Function.MAP_MEMORY_DMA, payload, check=False)
        got, status = (payloads.decode_map_dma(reply.payload)
                       if len(reply.payload) >= payloads.MAP_DMA.size
                       else (0, rpc.NV_ERR_GENERIC))
        status = status or rpc.result_status(reply.result)
        if status:
            raise RMError(f"{self.name}: mapping memory 0x{handle:x} at GPU address 0x{va:x}",
                          status)
        if got != va:
            raise RigError(f"{self.name}: the GSP mapped memory 0x{handle:x} at 0x{got:x}, "
                           f"not at the fixed 0x{va:x} asked for")

    def unmap(self, handle: int, va: int, size: int, huge: bool) -> None:
        """Undo :meth:`map` of ``handle``'s ``size`` bytes at ``va``."""
        if self.tables is not None:
            assert self._window is not None
            with self._window.lock:
                self.tables.unmap(va, size, huge=huge)
            return
        payload = payloads.encode_unmap_dma(self._rm.client, self._device, self._virtual, handle, 0,
                                       va)
        reply = self._rm.rpc_rm.rpc.call(rpc.Function.UNMAP_MEMORY_DMA, payload, check=False)
        status = (payloads.decode_unmap_dma(reply.payload)
                  if len(reply.payload) >= payloads.UNMAP_DMA.size
                  else rpc.NV_ERR_GENERIC) or rpc.result_status(reply.result)
        if status:
            raise RMError(f"{self.name}: unmapping memory 0x{handle:x} at 0x{va:x}", status)

    def map_fb(self, fb: int, size: int) -> int | None:
        """Video memory ``[fb, fb+size)`` (not a memory object: a context buffer) mapped at
        GPU addresses of its own; ``None`` without room."""
        va = self.take(size, SMALL)
        if va is None:
            return None
        try:
            self.map(0, size, va, False, lambda o: fb + o, True)
        except mmu.NoRoom:
            self.unmap(0, va, size, False)
            self.give(va, size)
            return None
        return va

    def unmap_fb(self, va: int, size: int) -> None:
        """Undo :meth:`map_fb`."""
        self.unmap(0, va, size, False)
        self.give(va, size)
