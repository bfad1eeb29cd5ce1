"""One GPU over PCI with its GSP booted: the rig_nv path (:class:`rig_nv.rm.Path`).

The RM runs on the GSP; this process is its kernel half, what CPU-RM is for a GSP client in
open-gpu-kernel-modules 570.144, with no UVM.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/path-pci.md."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rig_edge import Bus, Lost, Memory, Refusal, RigError
from rig_nv import classes as cls
from rig_nv.clock import Clock, read_split
from rig_nv.hostmem import ffi as libc_ffi
from rig_nv.layouts import Params, rm_ffi
from rig_nv.rm import Allocation, page_rounded
from rig_nv_pci.gsp import payloads, rpc
from rig_nv_pci.path import channels, faults, mmu, peers, runlists, vidmem
from rig_nv_pci.path.allocations import Dma, Undo
from rig_nv_pci.path.channels import ChannelMemory, Placed
from rig_nv_pci.path.export import Exports
from rig_nv_pci.path.grctx import GrContexts
from rig_nv_pci.path.host import Bars, BusRanges, Placement, SystemMemory
from rig_nv_pci.path.rm import GspClient, PciRM
from rig_nv_pci.path.space import AddressSpace, Bar1, Window
from rig_nv_pci.path.vidmem import Addresses, FbLayout
from rig_pci import Function

NV50_MEMORY_VIRTUAL = 0x50A0  # cl50a0.h
NV01_MEMORY_LIST_SYSTEM = 0x81  # cl84a0.h
# NVOS32_ALLOC_FLAGS (nvos.h): FIXED_ADDRESS_ALLOCATE 0x10, MEMORY_HANDLE_PROVIDED 0x4000,
# VIRTUAL 0x80000: the virtual range.
VIRTUAL_FLAGS = 0x80000 | 0x10 | 0x4000
# NVOS02_FLAGS (nvos.h): PHYSICALITY 7:4 NONCONTIGUOUS 1, LOCATION 11:8 PCI 0,
# COHERENCY 15:12 CACHED 1.
SYSTEM_FLAGS = (1 << 4) | (1 << 12)
# The GPU addresses this path hands out (the Rig_nv_pci spec: from 64 GiB to the windows
# rig_nv.setup keeps at the top 8 GiB below 2^40).
VA_BASE = 64 << 30
VA_LIMIT = (1 << 40) - (8 << 30)
NV_VIRTUAL_FUNCTION_FULL_PHYS_OFFSET = 0x00B80000  # turing/tu102/dev_vm.h, 0xBBFFFF:0xB80000
# The usermode page: NV_VIRTUAL_FUNCTION (dev_vm.h 0x30000) at the virtual registers' offset
USERMODE_BAR0 = NV_VIRTUAL_FUNCTION_FULL_PHYS_OFFSET + 0x30000
USERMODE_SIZE = 0x10000
# PTIMER's halves as the RM reads them on a PF (turing/tu102/dev_vm.h NV_VIRTUAL_FUNCTION_TIME_0
# 0x30080, _TIME_1 0x30084, at the virtual registers' offset; see the module's docstring)
PTIMER_TIME_0 = USERMODE_BAR0 + 0x80
PTIMER_TIME_1 = USERMODE_BAR0 + 0x84
HUGE, BIG, SMALL = 2 << 20, 64 << 10, 4 << 10


def address_of(v: memoryview) -> int:
    """The process address of the memory behind ``v``."""
    return int(libc_ffi.cast("uintptr_t", libc_ffi.from_buffer(v)))


class PciPath:
    """A booted GPU's RM path, made of parts: ``gsp`` the GSP as its client speaks to it,
    ``bars`` the BARs as the process maps them, ``memory`` the system memory the GPU reaches,
    ``fb`` what the path is told of video memory (its heap, BAR 1's root and size),
    ``placement`` where the GPU's addresses are the process's own (``None``: the path's own
    range, from :data:`VA_BASE` to :data:`VA_LIMIT`), ``bus_ranges`` the bus ranges another
    device reaches its memory at (``None``: the path cannot say, and :meth:`export` answers
    so), ``function`` the GPU's PCI function as rig_pci took it (``None``: the path maps no
    peer's memory), ``doorbells`` its channels' runlists (``None``: as GSP-RM's device info
    table answers the path's own subdevice, with no RUNLIST_DOORBELL _ENABLE).

    ``pramin`` is BAR 0 for writing the page tables (of ``mmu_format``) through its PRAMIN
    window (``None``: the GSP maps), ``timer`` BAR 0 whose PTIMER registers the device's
    clock reads (``None``: the path reads no clock). ``on_closed`` runs once the device
    stopped; ``on_kept`` instead, once :meth:`export` handed out bus ranges (the GPU stays
    the process's).

    Makes the device, subdevice, address space and its virtual range at once (and with
    ``pramin`` the page directories, handed to the GSP); raises :class:`rig_nv.rm.RMError`
    (having freed what it made) if the GSP refuses them."""

    def __init__(self, name: str, bus: str, gsp: GspClient, *, bars: Bars,
                 memory: SystemMemory, fb: FbLayout | None = None,
                 pramin: mmu.Registers | None = None, mmu_format: mmu.Format = mmu.VER2,
                 timer: mmu.Registers | None = None, placement: Placement | None = None,
                 bus_ranges: BusRanges | None = None, function: Function | None = None,
                 doorbells: runlists.Doorbells | None = None, hang_ms: int | None = None,
                 on_closed: Callable[[], None] | None = None,
                 on_kept: Callable[[], None] | None = None) -> None:
        fb = fb or FbLayout()
        self.name, self.bus, self.hang_ms = name, bus, hang_ms
        self.maps_host = memory.maps_host
        # Its sleep polls the GSP's message queue and naps: the GPU's interrupts do not reach
        # a process that holds the function without a kernel driver, and the GSP posts no
        # event for them (rig makes no event object), so none is asked for.
        self.wakes_on_interrupt = False
        # the GPU's clock (rig_nv.rm.ReadsClock)
        self._timer = timer
        self.clock: Clock | None = Clock.REGISTERS if timer is not None else None
        self._on_kept = on_kept
        self.function, self.fb_size = function, fb.size
        self._rm = PciRM(gsp.rm, gsp.events)
        self._bars, self._memory, self._placement = bars, memory, placement
        # What the GSP's events said (its boot's on_event): the faults the device raises
        # (fault), and text for messages.
        self.events = gsp.events
        self._poll, self._on_closed = gsp.poll, on_closed
        # video memory: the path's own heap over the FB regions GSP-RM reported
        self.heap = fb.heap()
        self._placed: dict[int, Placed] = {}  # memory handle -> where it lies
        self.ffi = rm_ffi(gsp.rm.layouts)
        client = gsp.rm.client
        self.h_device = self._rm.new_handle()
        self._rm.alloc(client, self.h_device, cls.NV01_DEVICE_0,
                       Params(self.ffi, "NV0080_ALLOC_PARAMETERS", hClientShare=client).buf)
        try:
            self.h_subdevice = self._rm.new_handle()
            self._rm.alloc(self.h_device, self.h_subdevice, cls.NV20_SUBDEVICE_0,
                           Params(self.ffi, "NV2080_ALLOC_PARAMETERS").buf)
            self.h_vaspace = self._rm.new_handle()
            self._rm.alloc(self.h_device, self.h_vaspace, cls.FERMI_VASPACE_A,
                           Params(self.ffi, "NV_VASPACE_ALLOCATION_PARAMETERS").buf)
            self.h_virtual = self._rm.new_handle()
            self._rm.alloc(self.h_device, self.h_virtual, NV50_MEMORY_VIRTUAL, Params(
                self.ffi, "NV_MEMORY_ALLOCATION_PARAMS", owner=client, flags=VIRTUAL_FLAGS,
                hVASpace=self.h_vaspace, size=VA_LIMIT - VA_BASE, offset=VA_BASE,
                limit=VA_LIMIT - VA_BASE - 1).buf)
            # the GPU addresses and their page tables, written through PRAMIN (else the GSP
            # maps), and BAR 1's tables under GSP-RM's root, sharing the window
            window = None if pramin is None else Window(pramin, mmu_format, self.heap)
            self.space = AddressSpace(name, self._rm, self.h_device, self.h_virtual,
                                      Addresses(VA_BASE, VA_LIMIT) if placement is None
                                      else placement.addresses, window)
            self.bar1 = Bar1()
            if window is not None:
                self.space.copy_server_pdes(self.h_subdevice, self.h_vaspace)
                if fb.bar1 is not None:
                    root, size = fb.bar1
                    # all of BAR 1 but its last page (kbusInitBar1_GM107's overfetch WAR)
                    self.bar1 = Bar1(window.tables(root), Addresses(*vidmem.bar1_range(size)),
                                     window)
            # bus ranges for another device (export), and the memory they were given for
            self._exports = Exports(name, self.bar1, bus_ranges)
            # the channels' runlists and doorbell tokens (rig_nv_pci.path.runlists): GSP-RM's
            # device info table as asked of its internal subdevice (the open's), else of
            # this path's own
            if doorbells is None:
                doorbells = runlists.Doorbells(name, runlists.get(lambda p: self._rm.control(
                    self.h_subdevice, runlists.NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE, p)),
                    False)
            self._rm.doorbells = doorbells
            self._rm.channels = ChannelMemory(
                name, self.ffi, take_fb=self.heap.take, give_fb=self.heap.give,
                zero_fb=None if window is None else window.zero, alloc_dma=memory.alloc_dma,
                placed=self._placed.get,
                method_buffer_size=self._method_buffer_size, runlist_of=doorbells.runlist)
            self._rm.channels.roots.update((client, self.h_device))
            if self.space.tables is not None:
                self._rm.grctx = GrContexts(
                    client, self.h_device, self.h_subdevice, control=self._rm.control,
                    take_fb=self.heap.take, give_fb=self.heap.give, map_fb=self.space.map_fb,
                    unmap=self.space.unmap_fb)
        except BaseException:
            self._rm.free(self.h_device)
            raise

    @property
    def kept(self) -> list[Allocation]:
        """The memory whose bus ranges :meth:`export` gave another device: the process's for
        good."""
        return self._exports.kept

    @property
    def rm(self) -> PciRM:
        return self._rm

    @property
    def _rpc(self) -> rpc.Rpc:
        return self._rm.rpc_rm.rpc

    # -- mappings on the GSP --------------------------------------------------------------

    def _register(self, handle: int, payload: bytes, what: str) -> int:
        """ALLOC_MEMORY of ``payload`` (mem.c memRegisterWithGsp_IMPL): ``handle``, or
        :class:`rig_nv_pci.gsp.rpc.Refused` for a non-zero rpc_result, its reply's only status
        (rpc.c rpcAllocMemory_v13_01). On any failure the caller gives the memory back only
        where :meth:`rig_nv_pci.path.rm.PciRM.refused` says so, else keeps it (:meth:`_keep`)."""
        reply = self._rpc.call(rpc.Function.ALLOC_MEMORY, payload, check=False)
        if reply.result:
            raise rpc.Refused(f"{self.name}: describing {what} to the GSP",
                              rpc.result_status(reply.result))
        return handle

    def _describe(self, dma: Dma, size: int) -> int:
        """Register system memory with the GSP: NV01_MEMORY_LIST_SYSTEM by ALLOC_MEMORY."""
        handle = self._rm.new_handle()
        pages = [dma.bus_address(i) for i in range(0, size, SMALL)]
        payload = payloads.encode_alloc_memory(self._rm.client, self.h_device, handle,
                                          NV01_MEMORY_LIST_SYSTEM, SYSTEM_FLAGS, size, pages)
        return self._register(handle, payload, f"{size} bytes of system memory")

    def _vidmem(self, undo: Undo, align: int) -> int | None:
        """Video memory from the path's heap (its offset in ``undo.fb`` before the RPC),
        registered with the GSP as CPU-RM registers its heap's memory (memRegisterWithGsp_IMPL:
        ALLOC_MEMORY of NV01_MEMORY_LIST_FBMEM, one PTE for contiguous memory): its handle;
        ``None`` when the heap is full."""
        size = undo.size
        at = undo.fb = self.heap.take(size, align)
        if at is None:
            return None
        handle = self._rm.new_handle()
        payload = payloads.encode_alloc_memory(self._rm.client, self.h_device, handle,
                                          vidmem.NV01_MEMORY_LIST_FBMEM, vidmem.FBMEM_FLAGS,
                                          size, [at], format=vidmem.KIND_GENERIC)
        return self._register(handle, payload,
                              f"{size} bytes of video memory at FB offset 0x{at:x}")

    def _keep(self, undo: Undo) -> None:
        """The memory, video memory and GPU addresses ``undo`` holds, kept as memory GSP-RM may
        hold (an ALLOC_MEMORY that failed without a plain refusal: rig_nv_pci.path.rm's docstring)
        until GSP-RM answers the free of the device, under which its object would be
        (:attr:`rig_nv_pci.path.rm.PciRM.kept`); never, where no such answer comes."""
        def give_back() -> None:
            if undo.dma is not None:
                undo.dma.free()
            if undo.fb is not None:
                self.heap.give(undo.fb, undo.size)
            if undo.va is not None:
                self.space.give(undo.va, undo.size)

        self._rm.kept.append(give_back)

    def _method_buffer_size(self) -> int:
        """A channel group's fault method buffer's size, as GSP-RM answers CPU-RM
        (kernel_ce.c kceGetFaultMethodBufferSize)."""
        params = bytearray(4)
        self._rm.control(self.h_subdevice, channels.NV2080_CTRL_CMD_CE_GET_FAULT_METHOD_BUFFER_SIZE,
                         params)
        size = int.from_bytes(params, "little")
        if not size:
            raise RigError(f"{self.name}: GSP-RM reports no channel method buffer size")
        return size

    # -- memory ---------------------------------------------------------------------------

    def alloc_memory(self, n: int, kind: Memory, *, contiguous: bool = False) -> Allocation | None:
        """``n`` bytes of ``kind`` mapped for the GPU; ``None`` where the GSP, the GPU's
        addresses, video memory (for the memory or its page tables), BAR 1 or the host's DMA
        memory have no room."""
        self._rpc.answering(rpc.Function.ALLOC_MEMORY)  # nothing taken for a request not sent
        size = page_rounded(n, kind)
        huge = size >= HUGE and kind is not Memory.PINNED
        # video memory of whole 64 KiB in big pages, at 64 KiB of the GPU's addresses and
        # of video memory, as RM maps it (mmu.py)
        big = not huge and kind is not Memory.PINNED and size % BIG == 0
        align = HUGE if huge else BIG if big else SMALL
        placed = self._placement is not None  # memory at its GPU address
        if placed and kind is Memory.PINNED:  # in the whole granules it comes in
            assert self._placement is not None
            granule = self._placement.granule
            size = -(-size // granule) * granule
            align = max(align, granule)
        va = self.space.take(size, align)
        if va is None:
            return None
        undo = Undo(None, va, size, huge=huge)
        handle: int | None = None
        mark, asked = self._rm.mark(), False  # asked: ALLOC_MEMORY sent or about to be
        try:
            host: int | None = None
            if kind is Memory.PINNED:
                dma = self._memory.alloc_dma(size, at=va if placed else None)
                if dma is None:
                    self.space.give(va, size)
                    return None
                undo.dma = dma
                host = address_of(dma.view())
                if placed and host != va:
                    raise RigError(f"{self.name}: system memory asked for at 0x{va:x} lies at "
                                   f"0x{host:x}")
                asked = True
                handle = self._describe(dma, size)
            else:
                asked = True
                handle = self._vidmem(undo, align)  # every heap block is contiguous
                if handle is None:
                    self.space.give(va, size)
                    return None
                assert undo.fb is not None
                fb_offset = undo.fb
                if kind is Memory.MAPPED:
                    at = self.bar1.map(fb_offset, size, huge, undo)
                    if at is None:
                        raise mmu.NoRoom("no room in BAR 1")
                    # the window at the GPU address (over the process's reservation), so
                    # the host reaches the memory where the GPU does
                    undo.view = self._bars.view(1, at, size, at=va if placed else None)
                    host = address_of(undo.view)
                    if placed and host != va:
                        raise RigError(f"{self.name}: BAR 1 asked for at 0x{va:x} lies at "
                                       f"0x{host:x}")
            if undo.dma is not None:
                self.space.map(handle, size, va, huge, undo.dma.bus_address, False)
                self._placed[handle] = Placed(channels.ADDR_SYSMEM, undo.dma.bus_address, size,
                                              channels.NV_MEMORY_CACHED)
            else:
                fb = fb_offset
                self.space.map(handle, size, va, huge, lambda o: fb + o, True, big=big)
                self._placed[handle] = Placed(channels.ADDR_FBMEM, lambda o: fb + o, size,
                                              channels.NV_MEMORY_UNCACHED)
        except BaseException as e:
            if asked and handle is None and not self._rm.refused(e, mark):
                self._keep(undo)  # nothing mapped yet: the registration is what failed
                raise
            if self.space.tables is not None:
                self.space.unmap(handle or 0, va, size, huge)  # what was written of it
            if undo.bar1 is not None:
                self.bar1.unmap(undo.bar1, size, huge)
            if undo.view is not None:
                self._bars.close(undo.view)
            if handle is not None:
                self._rm.free(handle)
            if undo.fb is not None:
                self.heap.give(undo.fb, size)
            if undo.dma is not None:
                undo.dma.free()
            self.space.give(va, size)
            if isinstance(e, mmu.NoRoom):
                return None
            raise
        return Allocation(va, host, size, kind, handle, undo)

    def alloc_notifier(self) -> Allocation:
        """A page of system memory the GSP writes a channel's errors into, not mapped for the
        GPU."""
        dma = self._memory.alloc_dma(SMALL)
        if dma is None:
            raise RigError(f"{self.name}: no system memory for a channel's error notifier")
        mark = self._rm.mark()
        try:
            handle = self._describe(dma, SMALL)
        except BaseException as e:
            if self._rm.refused(e, mark):
                dma.free()
            else:
                self._keep(Undo(dma, None, SMALL))
            raise
        self._placed[handle] = Placed(channels.ADDR_SYSMEM, dma.bus_address, SMALL,
                                      channels.NV_MEMORY_CACHED)
        return Allocation(0, address_of(dma.view()), SMALL, Memory.PINNED, handle,
                          Undo(dma, None, SMALL))

    def free_memory(self, a: Allocation) -> None:
        """Give back ``a``: its mapping on the GSP, the GSP's memory object, the DMA memory,
        the GPU addresses; a step that fails is retried by the next call, none repeated.
        Memory whose bus ranges :meth:`export` gave another device (``a.held``) is kept
        whole, its BAR 1 mapping and GSP-RM's object too: that device may still reach it, and
        the spec has it stay the process's until it exits."""
        if a.held:
            return
        undo: Undo = a.undo

        def step(name: str, fn: Callable[[], object]) -> None:
            if name not in undo.done:
                fn()
                undo.done.add(name)

        if undo.va is not None:
            va = undo.va
            step("unmap", lambda: self.space.unmap(a.handle, va, undo.size, undo.huge))
        if undo.view is not None:
            # before the addresses go back: a window placed at them puts the reservation back
            # as it closes, so no later allocation finds BAR 1 still mapped there
            view = undo.view
            step("bar", lambda: self._bars.close(view))
        if undo.bar1 is not None:
            at = undo.bar1
            step("bar1", lambda: self.bar1.unmap(at, undo.size, undo.huge))
        step("free", lambda: self._rm.free(a.handle))
        self._placed.pop(a.handle, None)
        if undo.dma is not None:
            dma = undo.dma
            step("dma", dma.free)
        if undo.fb is not None:
            fb = undo.fb
            step("fb", lambda: self.heap.give(fb, undo.size))
        if undo.va is not None:
            va = undo.va
            step("va", lambda: self.space.give(va, undo.size))

    def map_object(self, handle: int, length: int) -> memoryview:
        """The usermode page (``handle`` an object of a USERMODE class): BAR 0's
        NV_VIRTUAL_FUNCTION range at :data:`USERMODE_BAR0`."""
        if length > USERMODE_SIZE:
            raise RigError(f"{self.name}: the usermode page is 0x{USERMODE_SIZE:x} bytes, not "
                           f"0x{length:x}")
        return self._bars.view(0, USERMODE_BAR0, length)

    def unmap_object(self, view: memoryview) -> None:
        self._bars.close(view)

    def map_host(self, address: int, length: int) -> Allocation | Refusal:
        """The caller's pages ``[address, address+length)`` (whole pages) for the GPU, at a GPU
        address of their own: mapped by the IOMMU, registered with the GSP as Pinned memory
        is, and mapped. ``NEVER`` for a GPU taken physically (the spec: its pages would go
        back to the system at the process's death with the GPU still writing them);
        ``NO_ROOM`` once RLIMIT_MEMLOCK or the GPU's addresses run out."""
        self._rpc.answering(rpc.Function.ALLOC_MEMORY)
        if not self.maps_host:
            return Refusal.NEVER
        dma = self._memory.map_host(address, length)
        if dma is None:
            return Refusal.NO_ROOM
        va = self.space.take(length, SMALL)
        if va is None:
            dma.free()
            return Refusal.NO_ROOM
        handle: int | None = None
        mark = self._rm.mark()
        try:
            handle = self._describe(dma, length)
            self.space.map(handle, length, va, False, dma.bus_address, False)
        except BaseException as e:
            if handle is None and not self._rm.refused(e, mark):
                self._keep(Undo(dma, va, length))  # GSP-RM may hold the pages: kept mapped
                raise
            if self.space.tables is not None:
                self.space.unmap(handle or 0, va, length, False)
            if handle is not None:
                self._rm.free(handle)
            dma.free()
            self.space.give(va, length)
            if isinstance(e, mmu.NoRoom):
                return Refusal.NO_ROOM
            raise
        return Allocation(va, address, length, Memory.PINNED, handle, Undo(dma, va, length))

    def export(self, a: Allocation, offset: int, length: int) -> Bus:
        """The bus ranges at which another device reaches ``length`` bytes at ``offset`` of
        ``a``, or why it cannot; once ranges are given ``a`` is held (:meth:`free_memory`
        keeps it, and a stop keeps the GPU: :meth:`closed`). See
        :meth:`rig_nv_pci.path.export.Exports.export`."""
        return self._exports.export(a, offset, length)

    # -- peers ----------------------------------------------------------------------------

    def map_peer(self, a: Allocation, owner: Any) -> Allocation:
        """Map ``a``, memory of the GPU of ``owner`` (another GPU opened over PCI), into this
        GPU's address space at ``a.gpu``, as NVIDIA's RM maps BAR1 P2P, or raise
        :class:`rig_edge.RigError` naming why not: ``owner`` is no GPU opened over PCI, or
        :func:`rig_nv_pci.path.peers.map_peer` refuses."""
        if not isinstance(owner, PciPath):
            raise RigError(f"{self.name}: a peer of a GPU opened over PCI must be opened over "
                           f"PCI too, not through {type(owner).__name__}")
        return peers.map_peer(self, a, owner)

    def unmap_peer(self, p: Allocation) -> None:
        """End a mapping :meth:`map_peer` made: this GPU's PTEs cleared (and its TLB
        invalidated), then the owner's BAR 1 range lent for it given back; a step that fails
        is retried by the next call, none repeated (:func:`rig_nv_pci.path.peers.unmap_peer`)."""
        peers.unmap_peer(self, p.undo)

    def gpu_time_ns(self) -> int:
        """PTIMER now (rig_nv.rm.ReadsClock): its halves read through BAR 0, high, low, high
        (:func:`rig_nv.clock.read_split`). Raises :class:`rig_edge.RigError` where the path was
        given no BAR 0 for it, a read fails, or the halves read what a GPU that answers cannot
        (all ones)."""
        if self._timer is None:
            raise RigError(f"{self.name}: the path reads no GPU clock (it was given no BAR 0 "
                           "for it)")
        try:
            return read_split(self._timer.read32, PTIMER_TIME_0, PTIMER_TIME_1, what=self.name)
        except OSError as e:
            raise RigError(f"{self.name}: reading PTIMER through BAR 0 failed ({e})") from e

    def attach_channel(self, h_channel: int) -> None:
        """Nothing to do: there is no UVM to register the channel with."""

    def detach_channel(self, h_channel: int) -> None:
        """Nothing to do (see :meth:`attach_channel`)."""

    def fault(self, channels: Mapping[int, str], notified: bool) -> Lost | None:
        """What the GSP reported of ``channels`` (rig_nv.rm.ReportsFaults), the first answer
        kept: :func:`rig_nv_pci.path.faults.fault`."""
        return faults.fault(self.events, self._poll, self.rm.channels, channels, notified)

    def sleep(self, timeout_s: float) -> None:
        """Hand on the GSP's events (running the sequencers it asked for), then nap (the GPU's
        non-stall interrupts do not reach a process that holds the function without a kernel
        driver). What they report is kept for the device's next :meth:`fault`, whatever
        exception ends the sleep."""
        if self._poll is not None:
            self._poll()
        time.sleep(min(timeout_s, 200e-6))

    def closed(self) -> None:
        """The device stopped: free the device and everything under it on the GSP, then
        whatever the opener does at a stop (``on_closed``: it stops the GSP). Where
        :meth:`export` gave another device bus ranges, nothing is freed and the GSP is not
        stopped, so that the memory, its GSP-RM objects and BAR 1's tables under GSP-RM's
        root stay as they were (the spec: the region's memory and the GPU stay the process's
        until it exits); ``on_kept`` runs instead, for the opener to keep the GPU. A GSP that
        stopped answering fails neither (:meth:`rig_nv_pci.path.rm.PciRM.free_at_stop`)."""
        if self._exports.any_kept():
            if self._on_kept is not None:
                self._on_kept()
            return
        try:
            self._rm.free_at_stop(self.h_device)
        finally:
            if self._on_closed is not None:
                self._on_closed()


def _is_path(p: PciPath) -> Any:  # mypy proves PciPath implements rig_nv.rm.Path
    from rig_nv.rm import Path, ReadsClock, ReportsFaults

    checked: Path = p
    reports: ReportsFaults = p
    clocked: ReadsClock = p
    return checked, reports, clocked
