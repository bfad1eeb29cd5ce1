"""A stand-in RM path for running rig_nv.Device on the CPU: RM objects are numbers, memory is
anonymous host memory at addresses of the process's own (as the kernel path places Pinned and
Mapped memory), and the "GPU" completes a submission when asked. It counts the memory it
gave and has not been given back (``live``), and memory given back reads zeros. It lets the
tests check what a device writes (pushbuffers, GPFIFO entries, QMDs, constant banks) and time
its submission path, without a GPU. It is not a simulator of the hardware: nothing is executed.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from cffi import FFI

from rig_edge import Dmabuf, Memory, Refusal, RigError
from rig_nv.clock import Clock, rm_time_ns
from rig_nv.hostmem import (
    MAP_ANONYMOUS,
    MAP_FIXED_NOREPLACE,
    MAP_NORESERVE,
    MAP_PRIVATE,
    MAP_SHARED,
    PROT_READ,
    PROT_WRITE,
    mmap,
    munmap,
    view,
)
from rig_nv.rm import Allocation, RMError, page_rounded

HOPPER = {0xC661, 0xC86F, 0xC56F, 0xCBC0, 0xC8B5, 0x80, 0x2080, 0x90F1, 0xA06C, 0x9067}
BASE = 512 << 30  # where the stand-in puts its memory (inside the kernel path's reservation)
H_DEVICE = 0x10  # the device object the path made (FakePath.h_device)
GT200_DEBUGGER = 0x83DE
COMPUTE_CLASSES = {0xCBC0}
# NV_STATUS codes the stand-in answers with (nvstatuscodes.h)
NV_ERR_INVALID_ARGUMENT = 0x1F
NV_ERR_INVALID_CLIENT = 0x23
NV_ERR_INVALID_OBJECT = 0x31
NV_ERR_INVALID_OBJECT_PARENT = 0x36

# The engines and copy engines an H200 on an x86 host without NVLink peers would report, as
# kernel_ce_gh100.c (580.142) maps them: LCE 0 and 1 the GRCEs, sharing (kceMapPceLceForGRCE_GH100's
# default case) the FBHUB PCEs 12,13 and 14,15 of LCE 2 and 3; LCE 4 the default async LCE with
# NV_CE_NUM_PCES_NO_LINK_CASE (12) HSHUB PCEs (kceMapAsyncLceDefault_GH100; which 12 is made up).
# Engine types (cl2080_notification.h): GRAPHICS 1, COPY0.. 0x09.., NVDEC0 0x13, SEC2 0x26,
# NVJPG 0x2b, OFA 0x33. Caps (ctrl2080ce.h, byte 0): GRCE 0x01, SHARED 0x02, SYSMEM 0x20, P2P
# 0x40, BL_SIZE_GT_64K 0x80; byte 1: SUPPORTS_NONPIPELINED_BL 0x01, _PIPELINED_BL 0x02. No
# SYSMEM_READ/WRITE (NVLink-to-CPU caps) nor NVLINK_P2P (no peers).
H200_ENGINES = [0x01, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x13, 0x26, 0x2B, 0x33]
H200_COPY_ENGINES: dict[int, tuple[bytes, int]] = {  # LCE -> (capsTbl, pceMask)
    0: (bytes((0x01 | 0x02 | 0x20 | 0x40 | 0x80, 0x03)), 0x3000),
    1: (bytes((0x01 | 0x02 | 0x20 | 0x40 | 0x80, 0x03)), 0xC000),
    2: (bytes((0x02 | 0x20 | 0x40 | 0x80, 0x03)), 0x3000),
    3: (bytes((0x02 | 0x20 | 0x40 | 0x80, 0x03)), 0xC000),
    4: (bytes((0x20 | 0x40 | 0x80, 0x03)), 0x0FFF),
}
NV_ERR_NOT_SUPPORTED = 0x56


class FakeRM:
    """Answers the controls rig_nv.make sends with an H200's values."""

    client = 0xC1D00001
    release = "580.159.04"
    layouts = "580"

    def __init__(self) -> None:
        self.handle = 0x100
        self.lock = threading.Lock()
        self.objects: dict[int, int] = {}  # handle -> class
        self.controls: list[int] = []
        self.ffi = FFI()
        # channel handle -> what NV906F_CTRL_CMD_GET_MMU_FAULT_INFO answers for it, once (the
        # RM clears its record when read): (address, faultType, faultString), or an NV_STATUS
        # the control fails with. A channel without one answers zeros, as the RM with no record.
        self.mmu_faults: dict[int, tuple[int, int, str] | int] = {}
        self.parents: dict[int, int] = {}  # handle -> parent handle
        # compute object handle -> its graphics context's MMU fault records, oldest first, as
        # NV83DE_CTRL_CMD_DEBUG_READ_MMU_FAULT_INFO answers them (not cleared when read):
        # (faultAddress, faultType, accessType).
        self.fault_records: dict[int, list[tuple[int, int, int]]] = {}
        # channel handle -> SM number -> its error state as a GT200_DEBUGGER's
        # NV83DE_CTRL_CMD_DEBUG_READ_ALL_SM_ERROR_STATES answers it (not cleared when read):
        # (hwwGlobalEsr, hwwWarpEsr, hwwWarpEsrPc64, hwwEsrAddr). An SM without one answers
        # zeros, as an SM that reported nothing.
        self.sm_errors: dict[int, dict[int, tuple[int, int, int, int]]] = {}
        self.sm_reads: list[tuple[int, int, int]] = []  # (hTargetChannel, startingSM, numSMsToRead)
        # "alloc", "control", "sm_control" (READ_ALL_SM_ERROR_STATES alone; "control" refuses
        # both) or "free" of a GT200_DEBUGGER -> the NV_STATUS the RM refuses with; "sm_from":
        # the first startingSM READ_ALL_SM_ERROR_STATES refuses (with NV_ERR_INVALID_ARGUMENT)
        self.debugger_refusals: dict[str, int] = {}
        self.debuggers: list[tuple[int, int, bytes]] = []  # (parent, handle, params) made
        # What NV2080_CTRL_CMD_GPU_GET_ENGINES_V2 lists (NV2080 engine types; None: the control
        # answers NV_ERR_NOT_SUPPORTED), and what CE_GET_CAPS_V2 / CE_GET_CE_PCE_MASK answer per
        # LCE index (a listed copy engine missing here answers NOT_SUPPORTED, as a stubbed one).
        self.engines: list[int] | None = list(H200_ENGINES)
        self.copy_engines: dict[int, tuple[bytes, int]] = dict(H200_COPY_ENGINES)
        self.allocs: list[tuple[int, int, int, bytes]] = []  # (parent, handle, class, params)
        # What NV2080_CTRL_CMD_TIMER_GET_TIME answers (PTIMER, ns): by default the host's
        # monotonic clock from an offset; a test may give a counter, or raise an RMError.
        self.gpu_clock: Callable[[], int] = lambda: time.monotonic_ns() + (1 << 40)

    def new_handle(self) -> int:
        with self.lock:
            self.handle += 1
            return self.handle

    def alloc(self, parent: int, handle: int, cls: int, params: bytearray | None = None) -> int:
        if cls == GT200_DEBUGGER:
            self._debugger(parent, handle, params)
        self.objects[handle] = cls
        self.parents[handle] = parent
        self.allocs.append((parent, handle, cls, bytes(params or b"")))
        return handle

    def _debugger(self, parent: int, handle: int, params: bytearray | None) -> None:
        """What the RM checks before it makes a GT200_DEBUGGER: its parent is a device
        (resource_list.h), its parameters NV83DE_ALLOC_PARAMETERS, hAppClient this client or 0,
        hClass3dObject a compute object of that client (ksmdbgssnConstruct_IMPL)."""
        what = f"making RM object 0x{handle:x} of class 0x{GT200_DEBUGGER:x}"
        if "alloc" in self.debugger_refusals:
            raise RMError(what, self.debugger_refusals["alloc"])
        if parent != H_DEVICE:
            raise RMError(what, NV_ERR_INVALID_OBJECT_PARENT)
        if params is None or len(params) != 12:
            raise RMError(what, NV_ERR_INVALID_ARGUMENT)
        obsolete, app_client, obj = struct.unpack("<III", params)
        if obsolete:
            raise RMError(what, NV_ERR_INVALID_ARGUMENT)
        if app_client not in (0, self.client):
            raise RMError(what, NV_ERR_INVALID_CLIENT)
        if obj not in self.objects:
            raise RMError(what, NV_ERR_INVALID_OBJECT_PARENT)
        if self.objects[obj] not in COMPUTE_CLASSES:
            raise RMError(what, NV_ERR_INVALID_OBJECT)
        self.debuggers.append((parent, handle, bytes(params)))

    def free(self, obj: int) -> None:
        if self.objects.get(obj) == GT200_DEBUGGER and "free" in self.debugger_refusals:
            raise RMError(f"freeing RM object 0x{obj:x}", self.debugger_refusals["free"])
        self.objects.pop(obj, None)

    def _buf(self, address: int, n: int) -> Any:
        return self.ffi.buffer(self.ffi.cast("char *", address), n)

    def control(self, obj: int, cmd: int, params: bytearray | None) -> None:
        self.controls.append(cmd)
        assert params is not None or cmd == 0
        if cmd == 0x800201:  # GPU_GET_CLASSLIST: count, then the list at the pointer
            count, pointer = struct.unpack_from("<I4xQ", params)
            if pointer:
                self._buf(pointer, 4 * len(HOPPER))[:] = struct.pack(f"<{len(HOPPER)}I",
                                                                    *sorted(HOPPER))
            struct.pack_into("<I", params, 0, len(HOPPER))
        elif cmd in (0x20801201, 0x20801301, 0x20800101):  # GR, FB, GPU info lists
            count, pointer = struct.unpack_from("<I4xQ", params)
            values = {0x9: 66, 0xC: 0x900, 0xD: 64, 0x20: 2, 0x14: 8, 0x17: 9,  # GR
                      0x16: 140 << 20, 0x7: 141 << 20, 0x34: 0}  # FB KiB, GPU display
            entries = self._buf(pointer, 8 * count)
            for i in range(count):
                index = struct.unpack_from("<I", entries, 8 * i)[0]
                struct.pack_into("<I", entries, 8 * i + 4, values.get(index, 0))
            if cmd == 0x20801301:
                # FB_HEAP_SIZE (0x9) shares GR's index 0x9: answer the FB meaning here.
                for i in range(count):
                    if struct.unpack_from("<I", entries, 8 * i)[0] == 0x9:
                        struct.pack_into("<I", entries, 8 * i + 4, 140 << 20)
        elif cmd == 0x20800170:  # GPU_GET_ENGINES_V2: {engineCount, engineList[0x54]}
            if self.engines is None:
                raise RMError(f"RM control 0x{cmd:x} of object 0x{obj:x}", NV_ERR_NOT_SUPPORTED)
            struct.pack_into(f"<I{len(self.engines)}I", params, 0, len(self.engines),
                             *self.engines)
        elif cmd in (0x20802A03, 0x20802A02):  # CE_GET_CAPS_V2 {type, capsTbl[2]}, PCE_MASK
            (engine,) = struct.unpack_from("<I", params)
            index = engine - 0x09 if 0x09 <= engine <= 0x12 else engine - 0x34 + 10
            if index not in self.copy_engines:
                raise RMError(f"RM control 0x{cmd:x} of object 0x{obj:x}", NV_ERR_NOT_SUPPORTED)
            caps, pces = self.copy_engines[index]
            if cmd == 0x20802A03:
                params[4:6] = caps
            else:
                struct.pack_into("<I", params, 4, pces)
        elif cmd == 0x20800403:  # TIMER_GET_TIME: {NvU64 time_nsec}
            struct.pack_into("<Q", params, 0, self.gpu_clock())
        elif cmd == 0xC36F0108:  # work submit token
            struct.pack_into("<I", params, 0, 0x1234)
        elif cmd == 0x906F0106:  # GET_MMU_FAULT_INFO: {addrHi, addrLo, faultType, faultString[32]}
            answer = self.mmu_faults.pop(obj, None)
            if isinstance(answer, int):
                raise RMError(f"RM control 0x{cmd:x} of object 0x{obj:x}", answer)
            if answer is not None:
                address, fault_type, text = answer
                struct.pack_into("<III32s", params, 0, address >> 32, address & 0xFFFF_FFFF,
                                 fault_type, text.encode())
        elif cmd == 0x83DE0328:  # DEBUG_READ_MMU_FAULT_INFO: 4 x {faultAddress, faultType,
            # accessType} of 16 bytes, then count (72 bytes)
            assert self.objects.get(obj) == GT200_DEBUGGER and len(params) == 72
            if "control" in self.debugger_refusals:
                raise RMError(f"RM control 0x{cmd:x} of object 0x{obj:x}",
                              self.debugger_refusals["control"])
            debuggee = struct.unpack_from("<8xI", next(p for _, h, p in self.debuggers
                                                       if h == obj))[0]
            records = self.fault_records.get(debuggee, [])[-4:]
            for i, (address, fault_type, access) in enumerate(records):
                struct.pack_into("<QII", params, 16 * i, address, fault_type, access)
            struct.pack_into("<I", params, 64, len(records))
        elif cmd == 0x83DE030C:  # DEBUG_READ_ALL_SM_ERROR_STATES: {hTargetChannel, numSMsToRead,
            # 100 x 48-byte states from 8 (hwwGlobalEsr 0, hwwWarpEsr 4, hwwWarpEsrPc 8,
            # hwwEsrAddr 24, hwwWarpEsrPc64 32), ..., startingSM at 4820}, 4824 bytes
            assert self.objects.get(obj) == GT200_DEBUGGER and len(params) == 4824
            what = f"RM control 0x{cmd:x} of object 0x{obj:x}"
            for step in ("control", "sm_control"):
                if step in self.debugger_refusals:
                    raise RMError(what, self.debugger_refusals[step])
            channel, n = struct.unpack_from("<II", params)
            (start,) = struct.unpack_from("<I", params, 4820)
            self.sm_reads.append((channel, start, n))
            if n > 100 or start >= self.debugger_refusals.get("sm_from", 1 << 32):
                raise RMError(what, NV_ERR_INVALID_ARGUMENT)
            if self.objects.get(channel) is None:
                raise RMError(what, NV_ERR_INVALID_OBJECT)
            for sm, (global_esr, warp_esr, pc, address) in self.sm_errors.get(channel, {}).items():
                if start <= sm < start + n:
                    at = 8 + 48 * (sm - start)
                    struct.pack_into("<III", params, at, global_esr, warp_esr, pc & 0xFFFF_FFFF)
                    struct.pack_into("<QQ", params, at + 24, address, pc)


class FakePath:
    """rig_nv.rm.Path over host memory; ``complete()`` plays the GPU finishing everything."""

    name = "NV"
    bus = "0000:00:06.0"
    h_device, h_subdevice, h_vaspace = H_DEVICE, 0x11, 0x12
    hang_ms = 30_000
    maps_host = True
    wakes_on_interrupt = False  # as both paths (a test may set it before the device is made)

    def __init__(self) -> None:
        self._rm = FakeRM()
        self.next = BASE
        self.lock = threading.Lock()  # the kernel path's reservation and handles are locked too
        self.mapped: list[tuple[int, int]] = []
        self.device: Any = None
        self.peer_maps: list[int] = []  # owners' addresses mapped here (map_peer)
        self.map_host_answer: Refusal | None = None  # what map_host answers (None: it maps)
        self.export_refusal: str | None = None  # what export raises (None: it exports)
        self.live: dict[int, Allocation] = {}  # memory handle -> memory given, not freed

    @property
    def rm(self) -> FakeRM:
        return self._rm

    def _memory(self, n: int) -> int:
        with self.lock:
            at = self.next
            self.next += (n + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        mmap(at, n, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE)
        self.mapped.append((at, n))
        return at

    def map_object(self, handle: int, length: int) -> memoryview:
        return view(self._memory(length), length)

    def unmap_object(self, v: memoryview) -> None:
        pass

    def alloc_memory(self, n: int, kind: Memory, *, contiguous: bool = False) -> Allocation:
        size = page_rounded(n, kind)
        at = self._memory(size)
        a = Allocation(at, None if kind is Memory.DEVICE else at, size, kind,
                       self._rm.new_handle())
        self.live[a.handle] = a
        return a

    def alloc_notifier(self) -> Allocation:
        at = self._memory(4096)
        a = Allocation(0, at, 4096, Memory.PINNED, self._rm.new_handle())
        self.live[a.handle] = a
        return a

    def free_memory(self, a: Allocation) -> None:
        """Forget ``a``; its pages read zeros from now on (fresh ones at the same address),
        as memory the RM gave to someone else would read anything but what it held."""
        mine = self.live.pop(a.handle, None)
        if mine is not None:
            at = mine.host if mine.host is not None else mine.gpu
            munmap(at, mine.length)
            mmap(at, mine.length, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE | MAP_NORESERVE)

    def read(self, address: int, n: int) -> bytes:
        """The ``n`` bytes the GPU reads at GPU ``address``; an AssertionError where they do
        not lie inside one allocation given and not freed (the GPU would fault there)."""
        for a in self.live.values():
            if a.gpu <= address and address + n <= a.gpu + a.length:
                return bytes(view(a.host if a.host is not None else a.gpu, a.length)
                             [address - a.gpu : address - a.gpu + n])
        raise AssertionError(f"the GPU reads {n} bytes at 0x{address:x}, outside any memory "
                             "given and not freed: it would fault")

    def in_use(self) -> int:
        """Bytes of memory given and not freed."""
        return sum(a.length for a in self.live.values())

    def map_host(self, address: int, length: int) -> Allocation | Refusal:
        """The pages at a GPU address of their own, or ``map_host_answer`` where a test set
        one (Refusal.NEVER or NO_ROOM)."""
        if self.map_host_answer is not None:
            return self.map_host_answer
        with self.lock:
            at = self.next
            self.next += (length + (2 << 20) - 1) // (2 << 20) * (2 << 20)
        return Allocation(at, address, length, Memory.PINNED, self._rm.new_handle())

    def export(self, a: Allocation, offset: int, length: int) -> Dmabuf:
        """A dma-buf (a memfd here, the caller's to close) marking ``a`` held, as a path does
        once it hands memory out; or the RigError ``export_refusal`` where a test set one."""
        if self.export_refusal is not None:
            raise RigError(self.export_refusal)
        a.held = True
        return Dmabuf(os.memfd_create("stand-in-dmabuf", os.MFD_CLOEXEC), offset, length)

    def map_peer(self, a: Allocation, owner: Any) -> Allocation:
        """Host memory is one for every stand-in: a peer's memory is already reachable."""
        self.peer_maps.append(a.gpu)
        return Allocation(a.gpu, a.host, a.length, a.kind, a.handle)

    def unmap_peer(self, p: Allocation) -> None:
        self.peer_maps.remove(p.gpu)

    def attach_channel(self, h_channel: int) -> None:
        pass

    def detach_channel(self, h_channel: int) -> None:
        pass

    clock = Clock.RM  # rig_nv.rm.ReadsClock, as the kernel path: FakeRM.gpu_clock answers

    def gpu_time_ns(self) -> int:
        return rm_time_ns(self._rm, self.h_subdevice)

    def sleep(self, timeout_s: float) -> None:
        self.complete()

    def closed(self) -> None:
        for at, n in self.mapped:
            munmap(at, n)
        self.mapped.clear()

    def complete(self) -> None:
        """The GPU finishes every submission so far: the timeline word reaches the last."""
        d = self.device
        if d is not None and getattr(d, "timeline", None) is not None:
            for t in d.timelines():  # every queue's
                t.word[0] = t.current()


def entry_words(entry: int, read: Callable[[int, int], bytes | memoryview] = view) -> list[int]:
    """The words GPFIFO ``entry`` names, read through ``read`` (GPU address, bytes). The
    entry's layout follows clc86f.h NVC86F_GP_ENTRY: address in bits 2-39, dwords from 42."""
    address, n = entry & 0xFF_FFFF_FFFC, (entry >> 42) & 0x1FFFFF
    return list(struct.unpack_from(f"<{n}I", read(address, 4 * n)))


def rc(d: Any, xid: int, engine: int = 1) -> None:
    """The RM's robust-channel recovery as a device sees it: every channel of the group gets its
    error notifier written (RC_NOTIFIER_SCOPE_TSG; NvNotification info32 = the Xid, info16 = the
    NV2080 engine type, status 0xFFFF). What GET_MMU_FAULT_INFO answers is FakeRM.mmu_faults,
    what a GT200_DEBUGGER's READ_MMU_FAULT_INFO answers FakeRM.fault_records, its
    READ_ALL_SM_ERROR_STATES FakeRM.sm_errors."""
    for note in d.health.notifiers():
        struct.pack_into("<IHH", note, 8, xid, engine, 0xFFFF)


@contextlib.contextmanager
def held_elsewhere(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread for the block (released after it)."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(5.0)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert held.wait(5.0)
        yield
    finally:
        release.set()
        t.join()


def open_on(path: FakePath, device: type[Any] | None = None) -> Any:
    """A rig_nv.Device (or ``device``, a subclass) built on ``path``, which knows its device
    before the build: its ``complete`` writes the device's timeline word. As
    :func:`rig_nv.make`, but a failed build is left as it is, for the test to look at."""
    from rig_nv import Device

    d = (device or Device)(path)
    path.device = d
    d._build()
    return d


def open_fake() -> tuple[Any, FakePath]:
    """A rig_nv.Device on the stand-in path (the private anonymous mapping of MAP_PRIVATE is
    not used: memory is shared so that views of it alias)."""
    path = FakePath()
    return open_on(path), path


__all__ = ["MAP_PRIVATE", "FakePath", "FakeRM", "held_elsewhere", "open_fake", "open_on", "rc"]
