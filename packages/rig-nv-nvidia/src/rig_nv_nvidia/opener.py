"""``gpu(i)`` and ``usage(i)``: the spec's entry points of the kernel-driver path."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rig_edge import Misuse, Opener, OpenRefused, RigError, opener_name
from rig_nv import Device, make
from rig_nv.clock import rm_time_ns
from rig_nv.controls import NV2080_CTRL_CMD_FB_GET_INFO, info_list
from rig_nv.layouts import Params, rm_ffi
from rig_nv_nvidia.driver import PROCESS, Gpu, KernelRM
from rig_nv_nvidia.listing import gpu_functions
from rig_nv_nvidia.path import NvidiaPath
from rig_pci import FunctionInfo

NV2080_CTRL_CMD_GPU_GET_INFO = 0x20800101  # the pointer form: 16 bytes in every release
NV2080_CTRL_GPU_INFO_INDEX_DISPLAY_ENABLED = 0x34
NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2 = 0x20802096
NV2080_CTRL_GPUMON_SAMPLE_TYPE_PERFMON_UTIL = 2
FB_RAM_SIZE, FB_HEAP_FREE = 0x7, 0x16  # KiB (ctrl2080fb.h)
HANG_MS = 30_000  # rig's limit where no RM watchdog runs (a GPU without a display)


def _function(name: str, i: int) -> FunctionInfo:
    try:
        functions = gpu_functions()
    except RigError as e:
        raise OpenRefused(f"{name}: the machine's PCI functions cannot be read: {e}") from e
    if i >= len(functions):
        raise OpenRefused(f"{name}: the machine has no GPU {i} (it has {len(functions)})")
    f = functions[i]
    if f.driver != "nvidia":
        raise OpenRefused(f"{name} ({f.address}): NVIDIA's kernel driver does not hold this GPU "
                          f"(its driver is {f.driver or 'none'})")
    return f


def _stays() -> str:
    kept = []
    if PROCESS.rm is not None:
        kept.append("the control file and the RM client")
    if PROCESS.uvm is not None:
        kept.append("UVM's two files and the address reservation from 384 GiB to 2^40")
    if PROCESS.gpus:
        kept.append("the GPU files and RM devices of " + ", ".join(sorted(PROCESS.gpus)))
    return "; ".join(kept)


def _hang_ms(rm: KernelRM, g: Gpu) -> int | None:
    class _P:  # the few fields info_list reads
        def __init__(self) -> None:
            self.rm = rm

    (display,) = info_list(_P(), NV2080_CTRL_CMD_GPU_GET_INFO,  # type: ignore[arg-type]
                           [NV2080_CTRL_GPU_INFO_INDEX_DISPLAY_ENABLED], g.h_subdevice)
    return None if display else HANG_MS


def _open(i: int, name: str) -> Device:
    f = _function(name, i)
    where = f"{name} ({f.address})"
    try:
        rm = PROCESS.client()
        g = PROCESS.gpu(f.address)
    except RigError as e:
        raise OpenRefused(f"{where}: {e}", stays=_stays()) from e
    with g.lock:
        if g.device_open:
            raise OpenRefused(f"{where}: a device of this GPU is open and not stopped",
                              stays=_stays())
        g.device_open = True
    try:
        PROCESS.unified_memory()
        PROCESS.address_space(g)
        path = NvidiaPath(name, g, rm, hang_ms=_hang_ms(rm, g))
        return make(path)
    except BaseException as e:
        with g.lock:
            g.device_open = False
        if isinstance(e, (RigError, OSError)):
            # OSError: the host refused a file or address space (RLIMIT_NOFILE, RLIMIT_AS).
            raise OpenRefused(f"{where}: {e}", stays=_stays()) from e
        raise


def gpu(i: int) -> Opener[Device]:
    """The opener of GPU ``i`` (named "NV" for 0, "NV:i" otherwise).

    Its ``make`` opens the GPU that is ith when it runs and changes only the kernel driver's
    state for this process. It raises :class:`rig_edge.OpenRefused`, having given back what it
    took but what stays for the process (named in the message), if the machine has no GPU i
    (saying how many there are), its PCI functions cannot be read, the kernel driver does not
    hold GPU i or cannot be opened, the driver's release has no layouts here, a device of GPU i
    is open and not stopped, or the RM refuses an object or memory. Raises
    :class:`rig_edge.Misuse` (a ValueError) if ``i`` < 0.
    """
    name = opener_name("NV", i)
    return Opener(name, lambda: _open(i, name))


@dataclass(frozen=True)
class Usage:
    """What a GPU's RM reports of its use, by every process.

    ``memory_total``: the GPU's memory in bytes. ``memory_free``: the bytes the RM has free to
    allocate. ``busy``: how busy the graphics/compute engine was, 0.0-100.0, the mean of the
    RM's samples in the window (by the GPU's clock), or ``None`` if it took none then.
    """

    memory_total: int
    memory_free: int
    busy: float | None


# ctrl/ctrl0000/ctrl0000system.h @570.211.01, @580.142
NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS_V2 = 0x12B
P2P_CAPS_INDEX_READ, P2P_CAPS_INDEX_WRITE, P2P_CAPS_INDEX_NVLINK = 0, 1, 2
NV0000_P2P_CAPS_STATUS_OK = 0


def reaches(a: int, b: int) -> bool:
    """Whether GPUs ``a`` and ``b`` can map each other's memory: the RM's peer-to-peer
    capabilities answer reads and writes both OK (over NVLink or PCIe).

    Like :func:`usage`, it makes the process's client and each GPU's file, RM device and
    subdevice, which stay for the process; opens no device. Raises :class:`rig_edge.RigError`
    if the machine has no GPU ``a`` or ``b``, the kernel driver does not hold it or the RM
    refuses; :class:`rig_edge.Misuse` if ``a`` or ``b`` < 0.
    """
    fa = _function(opener_name("NV", a), a)
    fb = _function(opener_name("NV", b), b)
    rm = PROCESS.client()
    ga, gb = PROCESS.gpu(fa.address), PROCESS.gpu(fb.address)
    p = Params(rm_ffi(rm.layouts), "NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS", gpuCount=2)
    p.p.gpuIds[0], p.p.gpuIds[1] = ga.gpu_id, gb.gpu_id
    rm.control(rm.client, NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS_V2, p.buf)
    status = p.p.p2pCapsStatus
    return bool(status[P2P_CAPS_INDEX_READ] == NV0000_P2P_CAPS_STATUS_OK
                and status[P2P_CAPS_INDEX_WRITE] == NV0000_P2P_CAPS_STATUS_OK)


def usage(i: int, window: float = 1.0) -> Usage:
    """GPU ``i``'s usage, ``busy`` over the last ``window`` seconds (the RM keeps about 14 s).

    Reads through the process's client, the GPU's file and its RM device and subdevice, which
    the first call makes and which stay for the process; makes no channel, address space or
    mapping, opens no device. Raises :class:`rig_edge.RigError` if the machine has no GPU i,
    its PCI function is not active (reading could resume a GPU the kernel suspended), the
    kernel driver does not hold it or is of a release rig does not accept, or the RM refuses;
    :class:`rig_edge.Misuse` if ``i`` < 0 or ``window`` is not positive.
    """
    name = opener_name("NV", i)
    if not (isinstance(window, int | float) and not math.isnan(window) and window > 0):
        raise Misuse(f"usage window must be a positive number of seconds, not {window!r}")
    f = _function(name, i)
    if f.runtime_status != "active":
        raise RigError(f"{name} ({f.address}): the GPU's PCI function is not active "
                       f"(power/runtime_status is {f.runtime_status or 'unreadable'}); "
                       f"reading it could wake it")
    rm = PROCESS.client()
    g = PROCESS.gpu(f.address)
    ffi = rm_ffi(rm.layouts)

    class _P:
        def __init__(self) -> None:
            self.rm = rm

    total_kib, free_kib = info_list(_P(), NV2080_CTRL_CMD_FB_GET_INFO,  # type: ignore[arg-type]
                                    [FB_RAM_SIZE, FB_HEAP_FREE], g.h_subdevice)
    s = Params(ffi, "NV2080_CTRL_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2_PARAMS",
               type=NV2080_CTRL_GPUMON_SAMPLE_TYPE_PERFMON_UTIL,
               bufSize=ffi.sizeof("NV2080_CTRL_PERF_GPUMON_PERFMON_UTIL_SAMPLE") * 72)
    rm.control(g.h_subdevice, NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2, s.buf)
    # The RM keeps about 14 s of samples: a longer window (even an infinite one) reads them all.
    since = rm_time_ns(rm, g.h_subdevice) - int(min(window, 3600.0) * 1e9)
    utils = [int(x.gr.util) for x in s.p.samples
             if x.base.timeStamp and x.base.timeStamp >= since]
    busy = sum(utils) / len(utils) / 100 if utils else None  # util is percent x 100
    return Usage(total_kib * 1024, free_kib * 1024, busy)
