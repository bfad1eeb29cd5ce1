"""NVIDIA's kernel driver as rig's ioctls meet it, for CPU tests of rig_nv_nvidia's driver and
path modules. A stand-in written from open-gpu-kernel-modules @580.142 (kernel-open/nvidia/nv.c's
escapes, src/nvidia/arch/nvalloc/unix/src/escape.c's RM calls, nv-dmabuf.c, os-mlock.c and
kernel-open/nvidia-uvm/uvm.c and uvm_user_channel.c), not from rig's code; nothing runs on a GPU.

``FakeKernel(root).install(monkeypatch)`` puts a fresh ``rig_nv_nvidia.driver.Process`` in place
of the process's. The driver's files are real empty files under ``root/dev``, so a test sees in
/proc/self/fd which stay open; each ioctl on them is answered here; the reservation from 384
GiB is recorded, not mapped. A test sets what the driver answers: its release, the watchdog's
flags, a pin of host pages, a UVM mapping, a dma-buf export. Either way of each is possible.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rig_nv import classes as cls
from rig_nv.layouts import rm_ffi
from rig_nv_nvidia import driver, opener, path
from rig_nv_nvidia import layouts as lay
from rig_pci import parse_address

# nvstatuscodes.h
NV_OK = 0
NV_ERR_INVALID_ADDRESS = 0x1E
NV_ERR_INVALID_ARGUMENT = 0x1F
NV_ERR_INVALID_CHANNEL = 0x21
NV_ERR_INVALID_OBJECT_HANDLE = 0x33
NV_ERR_NO_MEMORY = 0x51
NV_ERR_NOT_SUPPORTED = 0x56
NV_ERR_UVM_ADDRESS_IN_USE = 0x68
# ctrl2080rc.h NV2080_CTRL_RC_GET_WATCHDOG_INFO_FLAGS_*
WATCHDOG_DISABLED, WATCHDOG_RUNNING, WATCHDOG_INITIALIZED = 0x1, 0x2, 0x4

CLIENT = 0xC1D00001  # the handle the RM gives the root client (any the RM picks)
BUS = "0000:41:00.0"
GPU_ID = 0x4100
UUID = bytes(range(0xA0, 0xB0))

# The controls answered, with their params struct (ctrl0000system.h, ctrl0000gpu.h,
# ctrl2080gpu.h, ctrl2080rc.h).
CONTROLS = {
    0x13E: "NV0000_CTRL_SYSTEM_GET_BUILD_VERSION_V2_PARAMS",
    0x205: "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS",
    0x2080014A: "NV2080_CTRL_GPU_GET_GID_INFO_PARAMS",
    0x20802209: "NV2080_CTRL_RC_GET_WATCHDOG_INFO_PARAMS",
    0x20801301: "NV2080_CTRL_INFO_LIST_PARAMS",  # FB_GET_INFO (ctrl2080fb.h)
    0x20802096: "NV2080_CTRL_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2_PARAMS",  # no samples
    0x20800403: "NV2080_CTRL_TIMER_GET_TIME_PARAMS",  # ctrl2080tmr.h
}
GPU_FILE_ONLY = (lay.NV_ESC_REGISTER_FD, lay.NV_ESC_EXPORT_TO_DMABUF_FD)
# What FB_GET_INFO and TIMER_GET_TIME answer (ctrl2080fb.h indices RAM_SIZE 0x7, HEAP_FREE 0x16).
FB_INFO = {0x7: 141_557_760, 0x16: 140_000_000}
NOW_NS = 1_000_000_000_000
# UVM commands answered, with their params struct (uvm_ioctl.h, uvm_linux_ioctl.h).
UVM = {
    lay.UVM_INITIALIZE: "UVM_INITIALIZE_PARAMS",
    lay.UVM_MM_INITIALIZE: "UVM_MM_INITIALIZE_PARAMS",
    lay.UVM_REGISTER_GPU: "UVM_REGISTER_GPU_PARAMS",
    lay.UVM_REGISTER_GPU_VASPACE: "UVM_REGISTER_GPU_VASPACE_PARAMS",
    lay.UVM_CREATE_EXTERNAL_RANGE: "UVM_CREATE_EXTERNAL_RANGE_PARAMS",
    lay.UVM_MAP_EXTERNAL_ALLOCATION: "UVM_MAP_EXTERNAL_ALLOCATION_PARAMS",
    lay.UVM_FREE: "UVM_FREE_PARAMS",
    lay.UVM_REGISTER_CHANNEL: "UVM_REGISTER_CHANNEL_PARAMS",
    lay.UVM_UNREGISTER_CHANNEL: "UVM_UNREGISTER_CHANNEL_PARAMS",
}


class FakeKernel:
    """The driver's state for one test: its RM objects, dma-bufs, UVM ranges and answers."""

    def __init__(self, root: Path, release: str = "580.159.04") -> None:
        self.dev = root / "dev"
        self.dev.mkdir()
        for name in ("nvidiactl", "nvidia0", "nvidia-uvm"):
            (self.dev / name).touch()
        self.release = release
        self.watchdog = WATCHDOG_INITIALIZED | WATCHDOG_DISABLED  # a GPU without a display
        self.pin_status = NV_OK  # NV_ESC_RM_ALLOC_MEMORY of host pages (os-mlock.c)
        self.uvm_map_status = NV_OK  # UVM_MAP_EXTERNAL_ALLOCATION
        self.export_errno: int | None = None  # the escape itself refused
        self.export_status = NV_OK
        self.reservation_at: int | None = None  # where mmap puts the reservation (None: asked)
        self.objects: dict[int, tuple[int, int]] = {}  # handle -> (class, parent)
        self.freed: list[int] = []
        self.dmabufs: dict[int, list[int]] = {}  # fd -> the handles its own client holds
        self.ranges: set[tuple[int, int]] = set()  # UVM external ranges (base, length)
        self.channels: dict[int, tuple[int, int]] = {}  # UVM's registered: hChannel -> VA
        self.mapped: list[tuple[int, int]] = []  # what the process's mmap was asked for
        self.unmapped: list[tuple[int, int]] = []
        self.opened: list[str] = []  # the driver's files the process opened, in order
        self.process = driver.Process()
        self.ffi = lay.ioctl_ffi("580")
        self.rmf = rm_ffi("580")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeKernel:
        for module in (driver, opener, path):
            monkeypatch.setattr(module, "PROCESS", self.process)
        real_open = driver.open_file

        def open_file(name: str) -> int:
            assert name.startswith("/dev/"), name
            self.opened.append(name.removeprefix("/dev/"))
            return real_open(str(self.dev / name.removeprefix("/dev/")))

        monkeypatch.setattr(driver, "open_file", open_file)
        monkeypatch.setattr(path, "open_file", open_file)
        monkeypatch.setattr(driver, "fcntl", SimpleNamespace(ioctl=self.ioctl))
        monkeypatch.setattr(driver, "mmap", self.mmap)
        monkeypatch.setattr(driver, "munmap", self.munmap)
        return self

    def close(self) -> None:
        """Close every file of the driver still open in the process (the test is over)."""
        for fd, target in _open_fds():
            if target.startswith(str(self.dev)) or fd in self.dmabufs:
                os.close(fd)

    def open_files(self) -> list[str]:
        """The driver's files open in this process, by name, sorted."""
        return sorted(os.path.basename(target) for _, target in _open_fds()
                      if target.startswith(str(self.dev)))

    # -- the process's mappings of the reservation (rig_nv.hostmem's, patched in driver) ----

    def mmap(self, addr: int, length: int, prot: int, flags: int, fd: int = -1,
             offset: int = 0) -> int:
        self.mapped.append((addr, length))
        return addr if self.reservation_at is None else self.reservation_at

    def munmap(self, addr: int, length: int) -> None:
        self.unmapped.append((addr, length))

    # -- ioctls ---------------------------------------------------------------------------------

    def ioctl(self, fd: int, request: int, buf: Any, mutate: bool = True) -> int:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name == "nvidia-uvm":
            return self._uvm(request, buf)
        nr, size = request & 0xFF, (request >> 16) & 0x3FFF
        if (request >> 8) & 0xFF != ord("F") or size != len(buf):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))  # nv.c checks both
        handlers = {
            lay.NV_ESC_RM_ALLOC: self._alloc, lay.NV_ESC_RM_CONTROL: self._control,
            lay.NV_ESC_RM_FREE: self._free, lay.NV_ESC_CARD_INFO: self._card_info,
            lay.NV_ESC_REGISTER_FD: self._register_fd,
            lay.NV_ESC_RM_ALLOC_MEMORY: self._alloc_memory,
            lay.NV_ESC_EXPORT_TO_DMABUF_FD: self._export,
        }
        # nv.c: REGISTER_FD and the dma-buf export only on a GPU's file (NV_ACTUAL_DEVICE_ONLY),
        # CARD_INFO only on the control file.
        on_ctl = name == "nvidiactl"
        if (nr not in handlers or (on_ctl and nr in GPU_FILE_ONLY)
                or (not on_ctl and nr == lay.NV_ESC_CARD_INFO)):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        handlers[nr](buf)
        return 0

    def _alloc(self, buf: Any) -> None:
        p = self.ffi.from_buffer("NVOS21_PARAMETERS *", buf)
        if p.hClass == cls.NV01_ROOT_CLIENT and p.hRoot == 0:
            self.objects[CLIENT] = (p.hClass, 0)
            p.hObjectNew, p.status = CLIENT, NV_OK
        elif (p.hRoot != CLIENT or p.hObjectParent not in self.objects
              or p.hObjectNew in self.objects):
            p.status = NV_ERR_INVALID_OBJECT_HANDLE
        else:
            self.objects[p.hObjectNew] = (p.hClass, p.hObjectParent)
            p.status = NV_OK

    def _control(self, buf: Any) -> None:
        p = self.ffi.from_buffer("NVOS54_PARAMETERS *", buf)
        if p.hClient != CLIENT or p.hObject not in self.objects:
            p.status = NV_ERR_INVALID_OBJECT_HANDLE
            return
        struct = CONTROLS.get(p.cmd)
        if struct is None:
            p.status = NV_ERR_NOT_SUPPORTED
            return
        if p.paramsSize != self.rmf.sizeof(struct):
            p.status = NV_ERR_INVALID_ARGUMENT
            return
        q: Any = self.rmf.cast(struct + " *", p.params)
        if p.cmd == 0x13E:
            q.driverVersionBuffer = self.release.encode()
        elif p.cmd == 0x205:
            assert q.gpuId == GPU_ID
            q.deviceInstance, q.subDeviceInstance = 0, 0
        elif p.cmd == 0x2080014A:
            self.rmf.memmove(q.data, UUID, 16)
        elif p.cmd == 0x20802209:
            q.watchdogStatusFlags = self.watchdog
        elif p.cmd == 0x20801301:
            entries: Any = self.rmf.cast("NV2080_CTRL_INFO *", q.list)
            for k in range(q.listSize):
                entries[k].data = FB_INFO[entries[k].index]
        elif p.cmd == 0x20800403:
            q.time_nsec = NOW_NS
        p.status = NV_OK

    def _free(self, buf: Any) -> None:
        p = self.ffi.from_buffer("NVOS00_PARAMETERS *", buf)
        if p.hRoot != CLIENT or p.hObjectOld not in self.objects:
            p.status = NV_ERR_INVALID_OBJECT_HANDLE
            return
        gone = {p.hObjectOld}
        while more := {h for h, (_, parent) in self.objects.items()
                       if parent in gone and h not in gone}:
            gone |= more
        for h in gone:
            del self.objects[h]
        self.freed.append(p.hObjectOld)
        p.status = NV_OK

    def _card_info(self, buf: Any) -> None:
        cards = self.ffi.from_buffer("nv_ioctl_card_info_t[]", buf)
        domain, bus, slot, _ = parse_address(BUS)
        cards[0].valid, cards[0].gpu_id, cards[0].minor_number = 1, GPU_ID, 0
        cards[0].pci_info.domain, cards[0].pci_info.bus, cards[0].pci_info.slot = domain, bus, slot

    def _register_fd(self, buf: Any) -> None:
        p = self.ffi.from_buffer("nv_ioctl_register_fd_t *", buf)
        if os.path.basename(os.readlink(f"/proc/self/fd/{p.ctl_fd}")) != "nvidiactl":
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    def _alloc_memory(self, buf: Any) -> None:
        p = self.ffi.from_buffer("nv_ioctl_nvos02_parameters_with_fd *", buf).params
        if p.hRoot != CLIENT or p.hObjectParent not in self.objects:
            p.status = NV_ERR_INVALID_OBJECT_HANDLE
        elif self.pin_status:
            p.status = self.pin_status
        else:
            self.objects[p.hObjectNew] = (p.hClass, p.hObjectParent)
            p.status = NV_OK

    def _export(self, buf: Any) -> None:
        if self.export_errno is not None:
            raise OSError(self.export_errno, os.strerror(self.export_errno))
        p = self.ffi.from_buffer("nv_ioctl_export_to_dma_buf_fd_t *", buf)
        handles = [p.handles[k] for k in range(p.numObjects)]
        if p.fd != -1 or p.hClient != CLIENT or any(h not in self.objects for h in handles):
            p.status = NV_ERR_INVALID_ARGUMENT
        elif self.export_status:
            p.status = self.export_status
        else:
            # nv-dmabuf.c dups the handles into a client of its own: they live on, whatever
            # the process frees, until the dma-buf's last reference goes.
            fd = os.memfd_create("nvidia-dmabuf", os.MFD_CLOEXEC)
            self.dmabufs[fd] = handles
            p.fd, p.status = fd, NV_OK

    def _uvm(self, cmd: int, buf: Any) -> int:
        struct = UVM.get(cmd)
        if struct is None:
            raise OSError(errno.ENOTTY, os.strerror(errno.ENOTTY))
        p = self.ffi.from_buffer(struct + " *", buf)
        status = NV_OK
        if cmd == lay.UVM_CREATE_EXTERNAL_RANGE:
            if any(b < p.base + p.length and p.base < b + n for b, n in self.ranges):
                status = NV_ERR_UVM_ADDRESS_IN_USE
            else:
                self.ranges.add((p.base, p.length))
        elif cmd == lay.UVM_MAP_EXTERNAL_ALLOCATION:
            if (p.base, p.length) not in self.ranges or p.hMemory not in self.objects:
                status = NV_ERR_INVALID_ADDRESS
            else:
                status = self.uvm_map_status
        elif cmd == lay.UVM_FREE:
            if (p.base, p.length) in self.ranges:
                self.ranges.remove((p.base, p.length))
            else:
                status = NV_ERR_INVALID_ADDRESS
        elif cmd == lay.UVM_REGISTER_CHANNEL:
            # uvm_user_channel.c: the channel's context buffers go at addresses of
            # [base, base + length); the RM channel is retained until it is unregistered.
            self.channels[p.hChannel] = (p.base, p.length)
        elif cmd == lay.UVM_UNREGISTER_CHANNEL and self.channels.pop(p.hChannel, None) is None:
            status = NV_ERR_INVALID_CHANNEL  # uvm_unregister_channel: one not registered
        p.rmStatus = status
        return 0


def _open_fds() -> list[tuple[int, str]]:
    """The process's open files: (fd, what /proc/self/fd links it to)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            found.append((int(name), os.readlink(f"/proc/self/fd/{name}")))
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return found
