"""``gpu(i)`` and ``usage(i)``: the spec's entry points of the kernel-driver path."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rig_edge import Misuse, Opener, OpenRefused, RigError, opener_name
from rig_nv import Device, make
from rig_nv.clock import rm_time_ns
from rig_nv.controls import FB_HEAP_FREE, FB_RAM_SIZE, NV2080_CTRL_CMD_FB_GET_INFO, info_list
from rig_nv.layouts import Params, rm_ffi
from rig_nv_nvidia.driver import PROCESS, Gpu, KernelRM, gpu_uuid
from rig_nv_nvidia.listing import gpu_functions
from rig_nv_nvidia.path import NvidiaPath
from rig_pci import FunctionInfo

# ctrl/ctrl2080/ctrl2080rc.h @570.211.01, @580.142: the RM's watchdog state. The kernel's own
# RM answers it (g_subdevice_nvoc.c flags 0x118: NON_PRIVILEGED, no ROUTE_TO_PHYSICAL), setting
# RUNNING where the watchdog is initialized, not disabled and the GPU at full power
# (kernel_rc_watchdog_ctrl.c).
NV2080_CTRL_CMD_RC_GET_WATCHDOG_INFO = 0x20802209
NV2080_CTRL_RC_GET_WATCHDOG_INFO_FLAGS_RUNNING = 0x2
NV2080_CTRL_CMD_PERF_GET_GPUMON_PERFMON_UTIL_SAMPLES_V2 = 0x20802096
NV2080_CTRL_GPUMON_SAMPLE_TYPE_PERFMON_UTIL = 2
HANG_MS = 30_000  # rig's limit where the RM's watchdog does not run (a GPU without a display)


def _function(name: str, i: int) -> FunctionInfo:
    """GPU ``i`` as the machine lists it now; :class:`rig_edge.RigError` naming it if there is
    none or NVIDIA's kernel driver does not hold it."""
    try:
        functions = gpu_functions()
    except RigError as e:
        raise RigError(f"{name}: the machine's PCI functions cannot be read: {e}") from e
    if i >= len(functions):
        raise RigError(f"{name}: the machine has no GPU {i} (it has {len(functions)})")
    f = functions[i]
    if f.driver != "nvidia":
        raise RigError(f"{name} ({f.address}): NVIDIA's kernel driver does not hold this GPU "
                       f"(its driver is {f.driver or 'none'})")
    return f


def _active(name: str, i: int) -> FunctionInfo:
    """:func:`_function`, refused unless its power/runtime_status reads ``active``: reading a
    suspended GPU's RM would resume it (usage and reaches read, they do not open)."""
    f = _function(name, i)
    if f.runtime_status != "active":
        raise RigError(f"{name} ({f.address}): the GPU's PCI function is not active "
                       f"(power/runtime_status is {f.runtime_status or 'unreadable'}); "
                       f"reading it could wake it")
    return f


def _reading(f: FunctionInfo) -> tuple[KernelRM, Gpu]:
    """The process's client and GPU ``f``'s objects, for a call that reads (not an open): the
    driver's refusals as :class:`rig_edge.RigError`, none an OpenRefused."""
    try:
        return PROCESS.client(), PROCESS.gpu(f.address)
    except OpenRefused as e:  # an unaccepted release (rig_nv.layouts.layout_key)
        raise RigError(str(e)) from e


def _stays() -> str:
    kept = []
    if PROCESS.rm is not None:
        kept.append("the control file and the RM client")
    if PROCESS.uvm is not None:
        kept.append("UVM's two files and the address reservation from 384 GiB to 2^40")
    if PROCESS.gpus:
        kept.append("the GPU files and RM devices of " + ", ".join(sorted(PROCESS.gpus)))
    spaces = sorted(bus for bus, g in PROCESS.gpus.items() if g.h_vaspace)
    if spaces:
        kept.append("the UVM registrations and address spaces of " + ", ".join(spaces))
    return "; ".join(kept)


class _Reader:
    """What :func:`rig_nv.controls.info_list` needs of a path: its RM."""

    def __init__(self, rm: KernelRM) -> None:
        self.rm = rm


def _hang_ms(rm: KernelRM, g: Gpu) -> int | None:
    """None while the RM's watchdog runs on the GPU (it ends work that holds the GPU too
    long), else rig's own limit; the RM's refusal raises."""
    p = Params(rm_ffi(rm.layouts), "NV2080_CTRL_RC_GET_WATCHDOG_INFO_PARAMS")
    rm.control(g.h_subdevice, NV2080_CTRL_CMD_RC_GET_WATCHDOG_INFO, p.buf)
    running = p.p.watchdogStatusFlags & NV2080_CTRL_RC_GET_WATCHDOG_INFO_FLAGS_RUNNING
    return None if running else HANG_MS


def _open(i: int, name: str) -> Device:
    PROCESS.refuse_inside(f"{name}'s make")
    try:
        f = _function(name, i)
    except RigError as e:
        raise OpenRefused(str(e), stays=_stays()) from e
    where = f"{name} ({f.address})"
    try:
        rm = PROCESS.client()
        g = PROCESS.gpu(f.address)
    except RigError as e:
        raise OpenRefused(f"{where}: {e}", stays=_stays()) from e
    with PROCESS.locked():
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
        with PROCESS.locked():
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
    is open and not stopped, or the RM refuses an object or memory. ``make`` raises
    :class:`rig_edge.Misuse`, having opened nothing, from a callback inside the process's lock
    on the driver (a signal handler or finalizer run while this thread holds it). Raises
    :class:`rig_edge.Misuse` (a ValueError) here if ``i`` is no int (a bool is none) or < 0.
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
    if the machine has no GPU ``a`` or ``b``, its PCI function is not active (reading could
    resume a GPU the kernel suspended), the kernel driver does not hold it or the RM refuses;
    :class:`rig_edge.Misuse`, having read nothing, if ``a`` or ``b`` is no int or < 0, or
    from a callback inside the process's lock on the driver.
    """
    na, nb = opener_name("NV", a), opener_name("NV", b)
    PROCESS.refuse_inside("reaches")
    fa, fb = _active(na, a), _active(nb, b)
    rm, ga = _reading(fa)
    _, gb = _reading(fb)
    p = Params(rm_ffi(rm.layouts), "NV0000_CTRL_SYSTEM_GET_P2P_CAPS_V2_PARAMS", gpuCount=2)
    p.p.gpuIds[0], p.p.gpuIds[1] = ga.gpu_id, gb.gpu_id
    rm.control(rm.client, NV0000_CTRL_CMD_SYSTEM_GET_P2P_CAPS_V2, p.buf)
    status = p.p.p2pCapsStatus
    return bool(status[P2P_CAPS_INDEX_READ] == NV0000_P2P_CAPS_STATUS_OK
                and status[P2P_CAPS_INDEX_WRITE] == NV0000_P2P_CAPS_STATUS_OK)


def uuid_text(raw: bytes) -> str:
    """A 16-byte GPU UUID as nvidia-smi prints it: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    import uuid

    return f"GPU-{uuid.UUID(bytes=raw)}"


def uuid(i: int) -> str:
    """GPU ``i``'s UUID as nvidia-smi prints it (``GPU-`` and 32 hex digits in five groups),
    from the RM. Reads as :func:`usage` does and opens no device. Raises
    :class:`rig_edge.RigError` if the machine has no GPU i, the kernel driver does not hold it
    or the RM refuses; :class:`rig_edge.Misuse` if ``i`` < 0."""
    f = _function(opener_name("NV", i), i)
    rm = PROCESS.client()
    return uuid_text(gpu_uuid(rm, PROCESS.gpu(f.address).h_subdevice))


def usage(i: int, window: float = 1.0) -> Usage:
    """GPU ``i``'s usage, ``busy`` over the last ``window`` seconds (the RM keeps about 14 s).

    Reads through the process's client, the GPU's file and its RM device and subdevice, which
    the first call makes and which stay for the process; makes no channel, address space or
    mapping, opens no device. Raises :class:`rig_edge.RigError` if the machine has no GPU i,
    its PCI function is not active (reading could resume a GPU the kernel suspended), the
    kernel driver does not hold it or is of a release rig does not accept, or the RM refuses;
    :class:`rig_edge.Misuse`, having read nothing, if ``i`` is no int or < 0, ``window`` is
    no positive number of seconds, or from a callback inside the process's lock on the driver.
    """
    name = opener_name("NV", i)
    if not (isinstance(window, int | float) and not isinstance(window, bool)
            and not math.isnan(window) and window > 0):
        raise Misuse(f"usage window must be a positive number of seconds, not {window!r}")
    PROCESS.refuse_inside("usage")
    rm, g = _reading(_active(name, i))
    ffi = rm_ffi(rm.layouts)
    total_kib, free_kib = info_list(_Reader(rm),  # type: ignore[arg-type]
                                    NV2080_CTRL_CMD_FB_GET_INFO, [FB_RAM_SIZE, FB_HEAP_FREE],
                                    g.h_subdevice)
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
