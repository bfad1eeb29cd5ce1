"""One GPU through the kernel driver: the rig_nv path (memory, mappings, channels' UVM side).

Memory (flows per open-gpu-kernel-modules escape.c, nv-mmap.c and uvm_map_external.c @580.142):
- Device: video memory (NV01_MEMORY_LOCAL_USER) at a GPU address the process reserves for it
  (an inaccessible mapping anywhere in its address space), mapped by UVM.
- Mapped: video memory mapped for the host through BAR1 (NV_ESC_RM_MAP_MEMORY, then mmap of a
  fresh /dev/nvidiaN) at an address of the client's reservation; the GPU maps the same address.
- Pinned: anonymous shared memory at an address of the reservation, pinned by the driver as an
  OS descriptor (NV_ESC_RM_ALLOC_MEMORY of NV01_MEMORY_SYSTEM_OS_DESCRIPTOR), GPU at the same
  address.
- map_host: the caller's pages as an OS descriptor, at a GPU address of their own.

The GPU's clock (``Device.clock``, rig_nv.clock): ``Clock.RM``, PTIMER as the RM reads it
(NV2080_CTRL_CMD_TIMER_GET_TIME of the subdevice, one ioctl: CPU-RM answers it itself,
tmrGetCurrentTime's register reads, no ROUTE_TO_PHYSICAL in its g_subdevice_nvoc.c flags).
NV2080_CTRL_CMD_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO is not used: its GPU times add
tmrGetPtimerOffsetNs (a software offset, not zero on GB10B/GB20B, that PTIMER's registers, and
so the semaphores' stamps, lack), and its host clocks are the kernel's (CLOCK_MONOTONIC_RAW for
PLATFORM_API: os-interface.c os_get_monotonic_time_ns_hr), not the process's CLOCK_MONOTONIC.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rig_edge import Dmabuf, Memory, Refusal, RigError
from rig_nv import classes as cls
from rig_nv.clock import Clock, rm_time_ns
from rig_nv.hostmem import (
    MAP_ANONYMOUS,
    MAP_FIXED,
    MAP_NORESERVE,
    MAP_PRIVATE,
    MAP_SHARED,
    PROT_NONE,
    PROT_READ,
    PROT_WRITE,
    mmap,
    munmap,
    round_up,
    view,
)
from rig_nv.layouts import Params, cnew, rm_ffi
from rig_nv.rm import Allocation, RMError, page_rounded
from rig_nv.status import (
    NV_ERR_INSUFFICIENT_RESOURCES,
    NV_ERR_INVALID_ADDRESS,
    NV_ERR_NO_MEMORY,
    NV_ERR_NOT_SUPPORTED,
    NV_ERR_OPERATING_SYSTEM,
)
from rig_nv_nvidia import layouts as lay
from rig_nv_nvidia.driver import (
    CTL,
    PROCESS,
    Gpu,
    KernelRM,
    nv_ioctl,
    open_file,
    uvm_check,
    uvm_ioctl,
)

HUGE = 2 << 20
SMALL = 4 << 10
# NVOS32_ALLOC_FLAGS (nvos.h): IGNORE_BANK_PLACEMENT | ALIGNMENT_FORCE | MEMORY_HANDLE_PROVIDED
# | MAP_NOT_REQUIRED, and PERSISTENT_VIDMEM for video memory.
ALLOC_FLAGS = 0x1 | 0x100 | 0x4000 | 0x8000
PERSISTENT_VIDMEM = 0x10000
# NVOS32_ATTR: PAGE_SIZE 24:23 (4KB 1, HUGE 3), LOCATION 26:25 (PCI 1), PHYSICALITY 28:27
# (NONCONTIGUOUS 1, CONTIGUOUS 2, ALLOW_NONCONTIGUOUS 3), COHERENCY 31:29 (CACHED 1).
ATTR_4KB, ATTR_HUGE = 1 << 23, 3 << 23
ATTR_PCI = 1 << 25
ATTR_NONCONTIGUOUS, ATTR_CONTIGUOUS, ATTR_ALLOW_NONCONTIGUOUS = 1 << 27, 2 << 27, 3 << 27
ATTR_CACHED = 1 << 29
# NVOS32_ATTR2: ZBC_PREFER_NO_ZBC 1, GPU_CACHEABLE 3:2 (YES 1, NO 2), PAGE_SIZE_HUGE 21:20 (2MB 1).
ATTR2_GPU_CACHED = 0x1 | (1 << 2)
ATTR2_GPU_UNCACHED = 0x1 | (2 << 2)
ATTR2_HUGE_2MB = 1 << 20
NVOS32_TYPE_IMAGE, NVOS32_TYPE_NOTIFIER = 0, 13
# NV_MMU_PTE_KIND_GENERIC_MEMORY (hopper/gh100/dev_mmu.h), the kind tinygrad and UVM use.
KIND_GENERIC = 6
# NVOS02_FLAGS (nvos.h): PHYSICALITY_NONCONTIGUOUS 7:4=1, COHERENCY_CACHED 15:12=1,
# MAPPING_NO_MAP 31:30=1; LOCATION 11:8 = PCI (0), as RmAllocOsDescriptor requires.
OS_DESCRIPTOR_FLAGS = (1 << 4) | (1 << 12) | (1 << 30)
CHANNEL_VA = 64 << 20  # UVM maps a channel's context buffers here (tinygrad's size)
NO_ROOM = (NV_ERR_NO_MEMORY, NV_ERR_OPERATING_SYSTEM, NV_ERR_INSUFFICIENT_RESOURCES)
PCI_DEVICES = "/sys/bus/pci/devices"  # where a dma-buf's function must be (the spec's fn)


@dataclass
class Undo:
    """How to give back an allocation: where its addresses came from."""

    reserved: bool  # from the client's reservation (else a private inaccessible mapping)
    base: int  # start of the addresses taken
    size: int
    cpu_mapped: bool  # host pages were mapped there (Pinned, Mapped)
    # The steps of free_memory done so far: a free that failed part-way is retried (by stop)
    # from the first step not done, never repeating one (a second unreserve would hand the
    # same addresses out twice).
    done: set[str] = field(default_factory=set)


def _private_range(size: int, align: int) -> tuple[int, int]:
    """An inaccessible range of ``size`` bytes aligned to ``align``, anywhere; (start, taken)."""
    taken = size + align
    base = mmap(0, taken, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE)
    start = round_up(base, align)
    if start > base:
        munmap(base, start - base)
    if base + taken > start + size:
        munmap(start + size, base + taken - start - size)
    return start, size


class NvidiaPath:
    """GPU ``index`` opened through the kernel driver (implements :class:`rig_nv.rm.Path`)."""

    def __init__(self, name: str, gpu: Gpu, rm: KernelRM, *, hang_ms: int | None) -> None:
        self.name = name
        self.gpu = gpu
        self.rm = rm
        self.bus = gpu.bus
        self.h_device = gpu.h_device
        self.h_subdevice = gpu.h_subdevice
        self.h_vaspace = gpu.h_vaspace
        self.hang_ms = hang_ms
        self.maps_host = True
        # Its sleep is a timed nap (time.sleep): no event object waits on the interrupt.
        self.wakes_on_interrupt = False
        self.rmf = rm_ffi(rm.layouts)
        self._maps: dict[int, tuple[int, int]] = {}
        self._channel_va: dict[int, tuple[int, int]] = {}

    # -- mappings of RM objects ---------------------------------------------------------------

    def _gpu_file(self) -> int:
        fd = open_file(f"/dev/nvidia{self.gpu.minor}")
        try:
            reg = cnew(self.rm.ffi, "nv_ioctl_register_fd_t *", {"ctl_fd": self.rm.ctl})
            nv_ioctl(fd, lay.NV_ESC_REGISTER_FD, self.rm.ffi, reg)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _map_rm(self, handle: int, length: int, at: int, *, system: bool = False) -> int:
        """Map RM memory object ``handle`` for the host (at ``at``, or anywhere if 0).

        Each file carries one mapping context for its life (nv-usermap.c), so every mapping
        takes a fresh file: /dev/nvidiaN for the GPU's memory, /dev/nvidiactl for system memory.
        The file may close once mapped.
        """
        fd = open_file(CTL) if system else self._gpu_file()
        try:
            ffi = self.rm.ffi
            p = cnew(ffi, "nv_ioctl_nvos33_parameters_with_fd *")
            p.params.hClient, p.params.hDevice = self.rm.client, self.h_device
            p.params.hMemory, p.params.length, p.fd = handle, length, fd
            nv_ioctl(self.rm.ctl, lay.NV_ESC_RM_MAP_MEMORY, ffi, p)
            if p.params.status:
                raise RMError(f"{self.name}: mapping RM object 0x{handle:x}", p.params.status)
            flags = MAP_SHARED | (MAP_FIXED if at else 0)
            return mmap(at, length, PROT_READ | PROT_WRITE, flags, fd, 0)
        finally:
            os.close(fd)

    def map_object(self, handle: int, length: int) -> memoryview:
        addr = self._map_rm(handle, length, 0)
        v = view(addr, length)
        self._maps[id(v)] = (addr, length)
        return v

    def unmap_object(self, v: memoryview) -> None:
        addr, length = self._maps.pop(id(v))
        v.release()
        munmap(addr, length)

    # -- UVM ----------------------------------------------------------------------------------

    def _uvm_map_here(self, va: int, size: int, handle: int) -> int:
        """Map RM memory ``handle`` for this GPU at ``va`` in UVM's range there; the RM status."""
        ffi = self.rm.ffi
        m = cnew(ffi, "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS *", {
            "base": va, "length": size, "gpuAttributesCount": 1, "rmCtrlFd": self.rm.ctl,
            "hClient": self.rm.client, "hMemory": handle})
        ffi.memmove(m.perGpuAttributes[0].gpuUuid.uuid, self.gpu.uuid, 16)
        m.perGpuAttributes[0].gpuMappingType = 1  # UvmGpuMappingTypeReadWriteAtomic
        return uvm_ioctl(PROCESS.unified_memory(), lay.UVM_MAP_EXTERNAL_ALLOCATION, ffi, m,
                         "UVM_MAP_EXTERNAL_ALLOCATION")

    def _uvm_map(self, va: int, size: int, handle: int) -> None:
        ffi, uvm = self.rm.ffi, PROCESS.unified_memory()
        r = cnew(ffi, "UVM_CREATE_EXTERNAL_RANGE_PARAMS *", {"base": va, "length": size})
        uvm_check(uvm, lay.UVM_CREATE_EXTERNAL_RANGE, ffi, r, "UVM_CREATE_EXTERNAL_RANGE")
        try:
            status = self._uvm_map_here(va, size, handle)
        except BaseException:
            # The range exists now: left, it would refuse the next range at this address
            # (NV_ERR_UVM_ADDRESS_IN_USE) once the caller gives the address back.
            self._uvm_free(va, size)
            raise
        if status:
            self._uvm_free(va, size)
            raise RMError(f"{self.name}: mapping memory for the GPU", status)

    def _uvm_free(self, va: int, size: int) -> None:
        ffi = self.rm.ffi
        f = cnew(ffi, "UVM_FREE_PARAMS *", {"base": va, "length": size})
        uvm_ioctl(PROCESS.unified_memory(), lay.UVM_FREE, ffi, f, "UVM_FREE")

    # -- memory -------------------------------------------------------------------------------

    def _vidmem(self, size: int, huge: bool, contiguous: bool) -> int | None:
        attr = (ATTR_CONTIGUOUS if contiguous else ATTR_ALLOW_NONCONTIGUOUS) | (
            ATTR_HUGE if huge else ATTR_4KB)
        handle = self.rm.new_handle()
        p = Params(self.rmf, "NV_MEMORY_ALLOCATION_PARAMS", owner=self.rm.client,
                   type=NVOS32_TYPE_IMAGE, flags=ALLOC_FLAGS | PERSISTENT_VIDMEM, attr=attr,
                   attr2=ATTR2_GPU_CACHED | (ATTR2_HUGE_2MB if huge else 0), format=KIND_GENERIC,
                   size=size, alignment=HUGE if huge else SMALL, limit=size - 1)
        try:
            return self.rm.alloc(self.h_device, handle, cls.NV01_MEMORY_LOCAL_USER, p.buf)
        except RMError as e:
            if e.status in NO_ROOM:
                return None
            raise

    def _os_descriptor(self, address: int, size: int) -> int:
        handle = self.rm.new_handle()
        ffi = self.rm.ffi
        p = cnew(ffi, "nv_ioctl_nvos02_parameters_with_fd *")
        p.params.hRoot, p.params.hObjectParent, p.params.hObjectNew = (
            self.rm.client, self.h_device, handle)
        p.params.hClass = cls.NV01_MEMORY_SYSTEM_OS_DESCRIPTOR
        p.params.flags, p.params.pMemory, p.params.limit, p.fd = (
            OS_DESCRIPTOR_FLAGS, address, size - 1, -1)
        nv_ioctl(self.gpu.fd, lay.NV_ESC_RM_ALLOC_MEMORY, ffi, p)
        if p.params.status:
            raise RMError(f"{self.name}: pinning host memory for the GPU", p.params.status)
        return handle

    def alloc_memory(self, n: int, kind: Memory, *, contiguous: bool = False) -> Allocation | None:
        """``n`` bytes of ``kind``; None where the RM or the host has no room for them.

        A host mapping refused for want of memory (ENOMEM) is no room; any other refusal is
        a :class:`RigError` saying which. Nothing stays on failure.
        """
        try:
            return self._alloc_memory(n, kind, contiguous)
        except OSError as e:
            if e.errno == errno.ENOMEM:
                return None
            raise RigError(f"{self.name}: the host refused a mapping for {kind.value} memory "
                           f"({e.strerror})") from e

    def _alloc_memory(self, n: int, kind: Memory, contiguous: bool) -> Allocation | None:
        size = page_rounded(n, kind)
        huge = size >= HUGE and kind is not Memory.PINNED
        page = HUGE if huge else SMALL
        if kind is Memory.DEVICE:
            made = self._vidmem(size, huge, contiguous)
            if made is None:
                return None
            try:
                va, _ = _private_range(size, page)
            except OSError:
                self.rm.free(made)
                return None
            undo = Undo(False, va, size, False)
            try:
                self._uvm_map(va, size, made)
            except BaseException:
                self.rm.free(made)
                munmap(va, size)
                raise
            return Allocation(va, None, size, kind, made, undo)
        at = PROCESS.reserve(size, page)
        if at is None:
            return None
        undo = Undo(True, at, size, True)
        handle: int | None = None
        try:
            if kind is Memory.PINNED:
                mmap(at, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED)
                try:
                    handle = self._os_descriptor(at, size)
                except RMError as e:
                    if e.status in NO_ROOM:
                        self._restore(undo)
                        return None
                    raise
            else:
                handle = self._vidmem(size, huge, contiguous)
                if handle is None:
                    self._restore(undo)
                    return None
                self._map_rm(handle, size, at)
            assert handle is not None
            self._uvm_map(at, size, handle)
        except BaseException:
            if handle is not None:
                self.rm.free(handle)
            self._restore(undo)
            raise
        return Allocation(at, at, size, kind, handle, undo)

    def alloc_notifier(self) -> Allocation:
        size = SMALL
        handle = self.rm.new_handle()
        p = Params(self.rmf, "NV_MEMORY_ALLOCATION_PARAMS", owner=self.rm.client,
                   type=NVOS32_TYPE_NOTIFIER, flags=ALLOC_FLAGS,
                   attr=ATTR_PCI | ATTR_NONCONTIGUOUS | ATTR_CACHED | ATTR_4KB,
                   attr2=ATTR2_GPU_UNCACHED, format=KIND_GENERIC, size=size, alignment=size,
                   limit=size - 1)
        self.rm.alloc(self.h_device, handle, cls.NV01_MEMORY_SYSTEM, p.buf)
        try:
            addr = self._map_rm(handle, size, 0, system=True)
        except BaseException:
            self.rm.free(handle)
            raise
        return Allocation(0, addr, size, Memory.PINNED, handle, Undo(False, addr, size, True))

    def _restore(self, undo: Undo) -> None:
        if undo.reserved:
            mmap(undo.base, undo.size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED)
            PROCESS.unreserve(undo.base, undo.size)
        else:
            munmap(undo.base, undo.size)

    def free_memory(self, a: Allocation) -> None:
        """Give back ``a``: the host's view, UVM's range, the RM's memory, the addresses.

        Each step is tried even when one before it fails, but for the memory and its
        addresses while the host's view stays; the first failure is raised after (an OSError
        as a :class:`RigError`). A step done is not done again when the free is retried.
        Where UVM's range may remain, its addresses stay taken (reused, the next range there
        would be refused), so a failure leaks addresses, never a later allocation.
        """
        undo: Undo = a.undo
        failed: BaseException | None = None

        def step(name: str, fn: Callable[[], object]) -> bool:
            nonlocal failed
            if name in undo.done:
                return True
            try:
                fn()
            except (OSError, RigError) as e:
                failed = failed or e
                return False
            undo.done.add(name)
            return True

        # Take the host's view away first, so nothing maps memory the RM has freed: while it
        # stays, the memory and its addresses stay too (for the retry).
        view_gone = not undo.reserved or step(
            "view", lambda: mmap(undo.base, undo.size, PROT_NONE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED))
        range_gone = not a.gpu or step("range", lambda: self._uvm_free(a.gpu, undo.size))
        if view_gone:
            step("memory", lambda: self.rm.free(a.handle))
        if range_gone and view_gone:
            if undo.reserved:
                step("addresses", lambda: PROCESS.unreserve(undo.base, undo.size))
            else:
                step("addresses", lambda: munmap(undo.base, undo.size))
        if isinstance(failed, OSError):
            raise RigError(f"{self.name}: the host refused to unmap freed memory "
                           f"({failed.strerror})") from failed
        if failed is not None:
            raise failed

    def map_host(self, address: int, length: int) -> Allocation | Refusal:
        try:
            handle = self._os_descriptor(address, length)
        except RMError as e:
            if e.status == NV_ERR_INVALID_ADDRESS:
                return Refusal.NEVER
            if e.status in NO_ROOM:
                return Refusal.NO_ROOM
            raise
        try:
            va, size = _private_range(length, SMALL)
        except OSError:
            self.rm.free(handle)
            return Refusal.NO_ROOM
        try:
            self._uvm_map(va, size, handle)
        except RMError as e:
            self.rm.free(handle)
            munmap(va, size)
            if e.status in NO_ROOM:
                return Refusal.NO_ROOM
            raise
        return Allocation(va, address, length, Memory.PINNED, handle, Undo(False, va, size, False))

    def export(self, a: Allocation, offset: int, length: int) -> Dmabuf:
        """A new dma-buf of ``a``'s RM object, which holds the object until its last
        reference goes (the driver dups the handle into a client of its own, nv-dmabuf.c
        nv_dma_buf_dup_mem_handles), freed or not. Marks ``a`` held, so the device never
        hands its memory out again while an importer may map it. Raises
        :class:`rig_edge.RigError`, marking nothing, where the object is no whole number of
        the host's pages, the GPU is no function under /sys/bus/pci/devices, or the driver
        exports none (an :class:`rig_nv.rm.RMError` where the RM refuses)."""
        if a.length % os.sysconf("SC_PAGE_SIZE"):
            raise RigError(f"{self.name}: the object is no whole number of the host's pages")
        if not os.path.exists(f"{PCI_DEVICES}/{self.bus}"):
            raise RigError(f"{self.name}: {self.bus} is no function under {PCI_DEVICES}")
        ffi = self.rm.ffi
        p = cnew(ffi, "nv_ioctl_export_to_dma_buf_fd_t *", {
            "fd": -1, "hClient": self.rm.client, "totalObjects": 1, "numObjects": 1,
            "totalSize": a.length})
        p.handles[0], p.sizes[0] = a.handle, a.length
        try:
            nv_ioctl(self.gpu.fd, lay.NV_ESC_EXPORT_TO_DMABUF_FD, ffi, p)
        except RigError as e:
            raise RigError(f"{self.name}: the kernel driver exports no dma-buf ({e})") from e
        if p.status == NV_ERR_NOT_SUPPORTED:
            # nv-dmabuf.c: a kernel without CONFIG_DMA_SHARED_BUFFER, or a GPU whose RM
            # supports none (nv->dma_buf_supported), as outside the open kernel modules.
            raise RMError(f"{self.name}: the kernel driver exports no dma-buf", p.status)
        if p.status:
            raise RMError(f"{self.name}: exporting a dma-buf", p.status)
        a.held = True
        return Dmabuf(int(p.fd), offset, length)

    # -- peers --------------------------------------------------------------------------------

    def map_peer(self, a: Allocation, owner: object) -> Allocation:
        """Map ``a``, memory of the GPU ``owner`` opened, into this GPU's address space at the
        address it has on its own GPU (UVM's range is one for the process)."""
        if not isinstance(owner, NvidiaPath):
            raise RigError(f"{self.name}: a peer must be opened through the kernel driver too")
        peers = PROCESS.enable_peers(self.gpu, owner.gpu)
        undo: Undo = a.undo
        status = self._uvm_map_here(a.gpu, undo.size, a.handle)
        if status:
            why = f"mapping {owner.name}'s memory at 0x{a.gpu:x}"
            if peers:
                why += f" (UVM_ENABLE_PEER_ACCESS answered 0x{peers:x})"
            raise RMError(f"{self.name}: {why}", status)
        return Allocation(a.gpu, a.host, a.length, a.kind, a.handle, Undo(False, a.gpu,
                                                                         undo.size, False))

    def unmap_peer(self, p: Allocation) -> None:
        """Take a peer mapping ``map_peer`` made out of this GPU's address space."""
        ffi = self.rm.ffi
        u = cnew(ffi, "UVM_UNMAP_EXTERNAL_PARAMS *", {"base": p.gpu, "length": p.undo.size})
        ffi.memmove(u.gpuUuid.uuid, self.gpu.uuid, 16)
        uvm_check(PROCESS.unified_memory(), lay.UVM_UNMAP_EXTERNAL, ffi, u, "UVM_UNMAP_EXTERNAL")

    # -- channels -----------------------------------------------------------------------------

    def attach_channel(self, h_channel: int) -> None:
        va, size = _private_range(CHANNEL_VA, HUGE)
        ffi = self.rm.ffi
        p = cnew(ffi, "UVM_REGISTER_CHANNEL_PARAMS *", {
            "rmCtrlFd": self.rm.ctl, "hClient": self.rm.client, "hChannel": h_channel,
            "base": va, "length": size})
        ffi.memmove(p.gpuUuid.uuid, self.gpu.uuid, 16)
        try:
            uvm_check(PROCESS.unified_memory(), lay.UVM_REGISTER_CHANNEL, ffi, p,
                      "UVM_REGISTER_CHANNEL")
        except BaseException:
            munmap(va, size)
            raise
        self._channel_va[h_channel] = (va, size)

    def detach_channel(self, h_channel: int) -> None:
        if h_channel not in self._channel_va:
            return
        ffi = self.rm.ffi
        p = cnew(ffi, "UVM_UNREGISTER_CHANNEL_PARAMS *", {"hClient": self.rm.client,
                                                        "hChannel": h_channel})
        ffi.memmove(p.gpuUuid.uuid, self.gpu.uuid, 16)
        uvm_check(PROCESS.unified_memory(), lay.UVM_UNREGISTER_CHANNEL, ffi, p,
                  "UVM_UNREGISTER_CHANNEL")
        va, size = self._channel_va.pop(h_channel)
        munmap(va, size)

    clock = Clock.RM

    def gpu_time_ns(self) -> int:
        """PTIMER as the RM reads it (rig_nv.rm.ReadsClock; rig_nv.clock.rm_time_ns)."""
        return rm_time_ns(self.rm, self.h_subdevice)

    def sleep(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def closed(self) -> None:
        with PROCESS.locked():
            self.gpu.device_open = False

