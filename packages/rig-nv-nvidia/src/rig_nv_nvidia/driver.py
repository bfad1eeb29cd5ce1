"""The process's client of NVIDIA's kernel driver: the control file, the RM client, UVM.

What this module makes stays for the process, as the spec says: the control file and the RM
root client (made by the first open or ``usage`` that succeeds), the two UVM files and the
reservation of the process's addresses from 384 GiB to 2^40 (made by the first open that
succeeds), and each GPU's file and RM objects (made by the first open or ``usage`` of it).
One lock guards it all (:meth:`Process.locked`); it is reentrant, so a callback that runs
inside it (a signal handler, a finalizer) must be refused (:meth:`Process.refuse_inside`),
not let in half-way through another's making.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cffi import FFI

from rig_edge import Misuse, OpenRefused, RigError
from rig_nv import classes as cls
from rig_nv import inject
from rig_nv.hostmem import (
    MAP_ANONYMOUS,
    MAP_FIXED_NOREPLACE,
    MAP_NORESERVE,
    MAP_PRIVATE,
    PROT_NONE,
    mmap,
    munmap,
)
from rig_nv.layouts import Params, cnew, layout_key, rm_ffi
from rig_nv.rm import RMError
from rig_nv.setup import WINDOWS
from rig_nv.status import NV_WARN_NOTHING_TO_DO
from rig_nv_nvidia import layouts as lay

CTL = "/dev/nvidiactl"
UVM = "/dev/nvidia-uvm"
# The client's reservation: where Pinned and Mapped memory lie, at one address for host and GPU.
RESERVATION = (384 << 30, 1 << 40)
NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2 = 0x13E
NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 = 0x205
NV2080_CTRL_CMD_GPU_GET_GID_INFO = 0x2080014A
NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY = 2
# FERMI_VASPACE_A as UVM wants it: externally owned, page faulting on (nvos.h flags bits 3, 6);
# the range tinygrad and CUDA use, 4 KiB to just under 2^49.
VASPACE_FLAGS = (1 << 3) | (1 << 6)
VA_BASE, VA_SIZE = 0x1000, 0x1FFFFFB000000
NV_DEVICE_ALLOCATION_VAMODE_OPTIONAL_MULTIPLE_VASPACES = 0


class KernelRM:
    """The RM reached by ioctls on /dev/nvidiactl (implements :class:`rig_nv.rm.RM`)."""

    def __init__(self, ctl: int, client: int, release: str) -> None:
        self.ctl = ctl
        self._client = client
        self._release = release
        self._layouts = layout_key(release)
        self.ffi: FFI = lay.ioctl_ffi(self._layouts)
        self._next = 0x52000000  # below the RM's own handles (RS_UNIQUE_HANDLE_BASE 0xcaf00000)
        self._lock = threading.Lock()

    @property
    def client(self) -> int:
        return self._client

    @property
    def release(self) -> str:
        return self._release

    @property
    def layouts(self) -> str:
        return self._layouts

    def new_handle(self) -> int:
        with self._lock:
            self._next += 1
            return self._next

    def alloc(self, parent: int, handle: int, cls_: int, params: bytearray | None = None) -> int:
        p = cnew(self.ffi, "NVOS21_PARAMETERS *", {"hRoot": self._client, "hObjectParent": parent,
                                                 "hObjectNew": handle, "hClass": cls_})
        keep = None
        if params is not None:
            keep = self.ffi.from_buffer(params)
            p.pAllocParms = int(self.ffi.cast("uintptr_t", keep))
            p.paramsSize = len(params)
        nv_ioctl(self.ctl, lay.NV_ESC_RM_ALLOC, self.ffi, p)
        if p.status:
            raise RMError(f"making RM object 0x{handle:x} of class 0x{cls_:x}", p.status)
        del keep
        return int(p.hObjectNew)

    def control(self, obj: int, cmd: int, params: bytearray | None) -> None:
        p = cnew(self.ffi, "NVOS54_PARAMETERS *", {"hClient": self._client, "hObject": obj,
                                                 "cmd": cmd})
        keep = None
        if params is not None:
            keep = self.ffi.from_buffer(params)
            p.params = int(self.ffi.cast("uintptr_t", keep))
            p.paramsSize = len(params)
        nv_ioctl(self.ctl, lay.NV_ESC_RM_CONTROL, self.ffi, p)
        if p.status:
            raise RMError(f"RM control 0x{cmd:x} of object 0x{obj:x}", p.status)
        del keep

    def free(self, obj: int) -> None:
        p = cnew(self.ffi, "NVOS00_PARAMETERS *", {"hRoot": self._client, "hObjectOld": obj})
        nv_ioctl(self.ctl, lay.NV_ESC_RM_FREE, self.ffi, p)
        if p.status:
            raise RMError(f"freeing RM object 0x{obj:x}", p.status)


def nv_ioctl(fd: int, nr: int, ffi: FFI, cdata: Any) -> None:
    """Escape ``nr`` on ``fd`` with the struct ``cdata`` points to, read and written in place.

    Raises :class:`rig_edge.RigError` when the kernel refuses the ioctl itself (a wrong size or
    file); the RM's own answer is in the struct's status field.
    """
    buf = ffi.buffer(cdata)
    try:
        inject.check("ioctl")
        fcntl.ioctl(fd, lay.nv_request(nr, len(buf)), buf, True)
    except OSError as e:
        raise RigError(f"the NVIDIA driver refused escape {nr} ({e.strerror})") from e


def uvm_ioctl(fd: int, cmd: int, ffi: FFI, cdata: Any, what: str) -> int:
    """UVM command ``cmd`` with the struct ``cdata``; returns its rmStatus (0 is success)."""
    try:
        inject.check("ioctl")
        fcntl.ioctl(fd, cmd, ffi.buffer(cdata), True)
    except OSError as e:
        raise RigError(f"the NVIDIA UVM driver refused {what} ({e.strerror})") from e
    return int(cdata.rmStatus)


def uvm_check(fd: int, cmd: int, ffi: FFI, cdata: Any, what: str) -> None:
    status = uvm_ioctl(fd, cmd, ffi, cdata, what)
    if status:
        raise RMError(what, status)


def open_file(path: str) -> int:
    """Open a driver file read-write; :class:`rig_edge.RigError` says why not."""
    try:
        inject.check("open")
        return os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise RigError(f"{path} cannot be opened: {e.strerror}") from e


@dataclass
class Gpu:
    """One GPU's state in this process: its file and RM objects (they stay), its UVM
    registration and address space (made by its first open; they stay), whether a device
    of it is open (read and written under :meth:`Process.locked`)."""

    bus: str
    minor: int
    gpu_id: int
    fd: int
    h_device: int
    h_subdevice: int
    uuid: bytes = b""
    h_vaspace: int = 0
    device_open: bool = False


def gpu_uuid(rm: KernelRM, h_subdevice: int) -> bytes:
    """The GPU's 16-byte UUID, as the RM reports it (NV2080_CTRL_CMD_GPU_GET_GID_INFO in its
    binary format, ctrl2080gpu.h): what UVM names the GPU by and nvidia-smi prints.
    Raises :class:`rig_nv.rm.RMError` where the RM refuses."""
    rmf = rm_ffi(rm.layouts)
    gid = Params(rmf, "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS",
                 flags=NV2080_GPU_CMD_GPU_GET_GID_FLAGS_FORMAT_BINARY, length=16)
    rm.control(h_subdevice, NV2080_CTRL_CMD_GPU_GET_GID_INFO, gid.buf)
    return bytes(rmf.buffer(gid.p.data, 16))


class Process:
    """What the process keeps of the kernel driver; one per process (``PROCESS``)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None  # the thread inside locked(), if any
        self.rm: KernelRM | None = None
        self.uvm: int | None = None
        self.uvm_mm: int | None = None
        self.gpus: dict[str, Gpu] = {}
        # Pairs of GPUs (their UUIDs) whose peer access UVM was asked for: the answer stays
        # for the process, as the UVM file does.
        self.peers: dict[frozenset[bytes], int] = {}
        self.free_va: list[tuple[int, int]] = []  # free runs of the reservation, by address

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the process's lock while the block runs (this module's calls nest in it)."""
        with self._lock:
            outer, self._owner = self._owner, threading.get_ident()
            try:
                yield
            finally:
                self._owner = outer

    def refuse_inside(self, what: str) -> None:
        """Raise :class:`rig_edge.Misuse` if this thread is inside :meth:`locked`: ``what``
        was called from a callback (a signal handler, a finalizer) run while the thread holds
        the lock, which would enter it again half-way through another making. Another
        thread's hold is no misuse: that call waits its turn."""
        if self._owner == threading.get_ident():
            raise Misuse(f"{what} was called from a callback inside the process's lock on "
                         "the NVIDIA kernel driver (a signal handler or finalizer run while "
                         "it is held)")

    # -- the client ---------------------------------------------------------------------------

    def client(self) -> KernelRM:
        """The process's RM client, made (and kept) by the first call that succeeds."""
        with self.locked():
            if self.rm is not None:
                return self.rm
            ctl = open_file(CTL)
            try:
                ffi = lay.ioctl_ffi("580")  # the NVOS structs are the same in every release
                p = cnew(ffi, "NVOS21_PARAMETERS *", {"hClass": cls.NV01_ROOT_CLIENT})
                nv_ioctl(ctl, lay.NV_ESC_RM_ALLOC, ffi, p)
                if p.status:
                    raise RMError("making the RM client", p.status)
                client = int(p.hObjectNew)
                release = self._release(ctl, client, ffi)
                try:
                    self.rm = KernelRM(ctl, client, release)
                except OpenRefused:
                    free = cnew(ffi, "NVOS00_PARAMETERS *", {"hRoot": client, "hObjectOld": client})
                    nv_ioctl(ctl, lay.NV_ESC_RM_FREE, ffi, free)
                    raise
            except BaseException:
                os.close(ctl)
                raise
            return self.rm

    @staticmethod
    def _release(ctl: int, client: int, ffi: FFI) -> str:
        rmf = rm_ffi("580")  # the build-version params are the same in every release
        v = Params(rmf, "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS")
        keep = ffi.from_buffer(v.buf)
        p = cnew(ffi, "NVOS54_PARAMETERS *", {"hClient": client, "hObject": client,
                                            "cmd": NV0000_CTRL_CMD_SYSTEM_GET_BUILD_VERSION_V2,
                                            "params": int(ffi.cast("uintptr_t", keep)),
                                            "paramsSize": len(v.buf)})
        nv_ioctl(ctl, lay.NV_ESC_RM_CONTROL, ffi, p)
        if p.status:
            raise RMError("reading the driver's release", p.status)
        return bytes(v.buf[:256]).split(b"\0")[0].decode()

    # -- unified memory -----------------------------------------------------------------------

    def unified_memory(self) -> int:
        """The UVM file (made, with its second file and the reservation, by the first open)."""
        with self.locked():
            if self.uvm is not None:
                return self.uvm
            rm = self.client()
            ffi = rm.ffi
            a = open_file(UVM)
            taken: list[int] = [a]
            try:
                b = open_file(UVM)
                taken.append(b)
                init = cnew(ffi, "UVM_INITIALIZE_PARAMS *")
                uvm_check(a, lay.UVM_INITIALIZE, ffi, init, "UVM_INITIALIZE")
                mm = cnew(ffi, "UVM_MM_INITIALIZE_PARAMS *", {"uvmFd": a})
                status = uvm_ioctl(b, lay.UVM_MM_INITIALIZE, ffi, mm, "UVM_MM_INITIALIZE")
                if status not in (0, NV_WARN_NOTHING_TO_DO):
                    raise RMError("UVM_MM_INITIALIZE", status)
                lo, hi = RESERVATION
                try:
                    at = mmap(lo, hi - lo, PROT_NONE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE)
                except OSError as e:
                    raise RigError(
                        f"the process's addresses from 384 GiB to 2^40 cannot be reserved "
                        f"({e.strerror}): something else is mapped there") from e
                if at != lo:
                    # A kernel before Linux 4.17 takes MAP_FIXED_NOREPLACE for a hint and maps
                    # the range wherever it has room.
                    munmap(at, hi - lo)
                    raise RigError(
                        f"the process's addresses from 384 GiB to 2^40 cannot be reserved: the "
                        f"kernel put the reservation at 0x{at:x} (before Linux 4.17 it takes "
                        f"MAP_FIXED_NOREPLACE for a hint)")
            except BaseException:
                for fd in taken:
                    os.close(fd)
                raise
            self.uvm, self.uvm_mm = a, b
            # The top of the reservation holds the shared and local memory windows.
            self.free_va = [(lo, WINDOWS - lo)]
            return a

    def reserve(self, size: int, align: int) -> int | None:
        """An address range of the reservation, or ``None`` when it is full."""
        with self.locked():
            for i, (start, length) in enumerate(self.free_va):
                at = -(-start // align) * align
                if at + size <= start + length:
                    rest = [(start, at - start), (at + size, start + length - at - size)]
                    self.free_va[i : i + 1] = [r for r in rest if r[1] > 0]
                    return at
            return None

    def unreserve(self, at: int, size: int) -> None:
        """Give a range back to the reservation's free runs, merging neighbours."""
        with self.locked():
            runs = sorted([*self.free_va, (at, size)])
            merged: list[tuple[int, int]] = []
            for s, n in runs:
                if merged and merged[-1][0] + merged[-1][1] == s:
                    merged[-1] = (merged[-1][0], merged[-1][1] + n)
                else:
                    merged.append((s, n))
            self.free_va = merged

    # -- GPUs ---------------------------------------------------------------------------------

    def gpu(self, bus: str) -> Gpu:
        """GPU ``bus``'s file, RM device and subdevice (made by the first call, kept)."""
        with self.locked():
            if bus in self.gpus:
                return self.gpus[bus]
            rm = self.client()
            minor, gpu_id = find_card(rm, bus)
            fd = open_file(f"/dev/nvidia{minor}")
            made: list[int] = []
            try:
                reg = cnew(rm.ffi, "nv_ioctl_register_fd_t *", {"ctl_fd": rm.ctl})
                nv_ioctl(fd, lay.NV_ESC_REGISTER_FD, rm.ffi, reg)
                rmf = rm_ffi(rm.layouts)
                ids = Params(rmf, "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS", gpuId=gpu_id)
                rm.control(rm.client, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, ids.buf)
                h_device = rm.alloc(rm.client, rm.new_handle(), cls.NV01_DEVICE_0, Params(
                    rmf, "NV0080_ALLOC_PARAMETERS", deviceId=ids.p.deviceInstance,
                    hClientShare=rm.client,
                    vaMode=NV_DEVICE_ALLOCATION_VAMODE_OPTIONAL_MULTIPLE_VASPACES).buf)
                made.append(h_device)
                h_subdevice = rm.alloc(h_device, rm.new_handle(), cls.NV20_SUBDEVICE_0, Params(
                    rmf, "NV2080_ALLOC_PARAMETERS", subDeviceId=ids.p.subDeviceInstance).buf)
            except BaseException:
                for h in made:
                    rm.free(h)
                os.close(fd)
                raise
            g = Gpu(bus, minor, gpu_id, fd, h_device, h_subdevice)
            self.gpus[bus] = g
            return g

    def address_space(self, g: Gpu) -> None:
        """Register GPU ``g`` with UVM and give it an address space (first open; kept)."""
        with self.locked():
            if g.h_vaspace:
                return
            rm = self.client()
            uvm = self.unified_memory()
            rmf = rm_ffi(rm.layouts)
            uuid = gpu_uuid(rm, g.h_subdevice)
            # The driver copies its own struct's size for allocs: a buffer at least that large.
            vas = Params(rmf, "NV_VASPACE_ALLOCATION_PARAMETERS", vaBase=VA_BASE, vaSize=VA_SIZE,
                         flags=VASPACE_FLAGS)
            h_vaspace = rm.alloc(g.h_device, rm.new_handle(), cls.FERMI_VASPACE_A, vas.buf)
            ffi = rm.ffi
            try:
                reg = cnew(ffi, "UVM_REGISTER_GPU_PARAMS *", {"rmCtrlFd": -1})
                ffi.memmove(reg.gpu_uuid.uuid, uuid, 16)
                uvm_check(uvm, lay.UVM_REGISTER_GPU, ffi, reg, "UVM_REGISTER_GPU")
                try:
                    space = cnew(ffi, "UVM_REGISTER_GPU_VASPACE_PARAMS *", {
                        "rmCtrlFd": rm.ctl, "hClient": rm.client, "hVaSpace": h_vaspace})
                    ffi.memmove(space.gpuUuid.uuid, uuid, 16)
                    uvm_check(uvm, lay.UVM_REGISTER_GPU_VASPACE, ffi, space,
                              "UVM_REGISTER_GPU_VASPACE")
                except BaseException:
                    un = cnew(ffi, "UVM_UNREGISTER_GPU_PARAMS *")
                    ffi.memmove(un.gpu_uuid.uuid, uuid, 16)
                    uvm_ioctl(uvm, lay.UVM_UNREGISTER_GPU, ffi, un, "UVM_UNREGISTER_GPU")
                    raise
            except BaseException:
                rm.free(h_vaspace)
                raise
            g.uuid, g.h_vaspace = uuid, h_vaspace

    def enable_peers(self, a: Gpu, b: Gpu) -> int:
        """Ask UVM once per process for peer access between ``a`` and ``b``; its status.

        NVLink peers are enabled when a GPU's address space registers (uvm_va_space.c), so
        UVM answers them NV_ERR_INVALID_DEVICE here, as it does GPUs with no PCIe peer path:
        the status is kept for a mapping's error to name, not raised.
        """
        pair = frozenset((a.uuid, b.uuid))
        with self.locked():
            if pair not in self.peers:
                rm = self.client()
                p = cnew(rm.ffi, "UVM_ENABLE_PEER_ACCESS_PARAMS *")
                rm.ffi.memmove(p.gpuUuidA.uuid, a.uuid, 16)
                rm.ffi.memmove(p.gpuUuidB.uuid, b.uuid, 16)
                self.peers[pair] = uvm_ioctl(self.unified_memory(), lay.UVM_ENABLE_PEER_ACCESS,
                                             rm.ffi, p, "UVM_ENABLE_PEER_ACCESS")
            return self.peers[pair]


def find_card(rm: KernelRM, bus: str) -> tuple[int, int]:
    """(minor number, gpu id) of the GPU at ``bus``, from the driver's card list.

    NV_ESC_CARD_INFO fills domain, bus and slot but never the function (nv-ioctl.h notes).
    """
    from rig_pci import parse_address

    domain, b, slot, function = parse_address(bus)
    cards = cnew(rm.ffi, "nv_ioctl_card_info_t[]", lay.MAX_CARDS)
    nv_ioctl(rm.ctl, lay.NV_ESC_CARD_INFO, rm.ffi, cards)
    for c in cards:
        pci = c.pci_info
        if c.valid and (pci.domain, pci.bus, pci.slot) == (domain, b, slot) and function == 0:
            # Copy out: the entry's memory goes with ``cards``.
            return int(c.minor_number), int(c.gpu_id)
    raise RigError(f"the NVIDIA kernel driver lists no GPU at {bus}")


PROCESS = Process()
