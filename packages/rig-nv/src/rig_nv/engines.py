"""The GPU's copy engines, and the one a device's copy channel runs on, chosen as NVIDIA's UVM
driver chooses the copy engines of its own channels.

A GPU exposes logical copy engines (LCEs, NV2080_ENGINE_TYPE_COPY(n)), each backed by some
physical copy engines (PCEs) that the RM maps to it. A graphics/compute channel group reaches
only its runlist's GR copy engine (a GRCE: the LCE the GR runlist shares, at most two PCEs on
Hopper, kernel_ce_gh100.c NV_CE_MAX_PCE_PER_GRCE); an asynchronous LCE has a runlist of its own
and, where it is the GPU's main one, many PCEs (kceMapAsyncLceDefault_GH100 gives the default
async LCE NV_CE_NUM_PCES_NO_LINK_CASE 12; kceMapPceLceForNvlinkPeers_GH100 gives a peer's LCE
the PCEs of the hubs its NVLinks reach).

What the RM tells a client, as UVM asks it (open-gpu-kernel-modules 580.142,
src/nvidia/src/kernel/rmapi/nv_gpu_ops.c queryCopyEngines): the GPU's engines
(NV2080_CTRL_CMD_GPU_GET_ENGINES, here its _V2 twin with the list inline, ctrl2080gpu.h), for
each copy engine among them its caps (NV2080_CTRL_CMD_CE_GET_CAPS, here _V2, ctrl2080ce.h) and
its PCEs (NV2080_CTRL_CMD_CE_GET_CE_PCE_MASK). The _V2 forms carry no pointer, so both of rig's
paths send them as they are (the PCI path cannot send a pointer to the GSP). A stubbed CE (no
PCEs) is absent from the engine list (gpu.c gpuUpdateEngineTable lists engines with classes;
kernel_ce.c kceUpdateClassDB_KERNEL removes a stubbed CE's) and answers CE_GET_CAPS_V2
NV_ERR_NOT_SUPPORTED (kernel_ce_shared.c subdeviceCtrlCmdCeGetCapsV2_IMPL).

How UVM chooses (kernel-open/nvidia-uvm/uvm_channel.c, 580.142): a CE is usable when the RM
reported it and it is no GRCE (ce_is_usable; the Confidential Computing test does not apply to
rig, which does not run under it); every usable CE must read and write system memory and do
P2P (ces_validate: UVM refuses the GPU otherwise; here a CE without them is just not usable).
Then one CE per channel type, in the order CPU_TO_GPU, GPU_TO_CPU, GPU_INTERNAL, GPU_TO_GPU,
MEMOPS (pick_ces), by compare_ce_for_channel_type: host-to-device copies prefer SYSMEM_READ,
device-to-host SYSMEM_WRITE, both then a CE not taken for NVLink P2P; GPU-internal and
GPU-to-GPU copies the most PCEs (UVM's measure of a CE's bandwidth), GPU-internal then a CE
not taken for NVLink P2P; every type then the CE UVM picked least often so far, then one that
shares no PCE (CE_SHARED), then the lowest index. :func:`pick` is that, type for type.

A device has one copy channel for all four kinds of copy. It runs on the CE UVM's GPU_TO_GPU
order ranks first (:func:`choose`): the most PCEs, which is also the CE the RM names optimal
for P2P on an NVSwitch-connected Hopper (kernel_ce_gh100.c kceGetP2PCes_GH100: "optimal LCE is
always LCE with max PCE"), and the order GPU-internal copies are ranked by first too. Host
copies would prefer a SYSMEM_READ/WRITE CE where one exists; those caps mark the CEs of NVLink
sysmem (kernel_ce_gp100.c kceIsCeSysmemRead_GP100 via kceGetCeFromNvlinkConfig: Grace hosts),
not of PCIe, so on an x86 host no CE has them and UVM's host-copy order falls to its later
terms too: on an H200 there without NVLink peers, where LCE 2 and 3 share their FBHUB PCEs with
the GRCEs (kernel_ce_gh100.c kceMapPceLceForGRCE_GH100, so they should report CE_SHARED) and
LCE 4 has the 12 PCEs (kceMapAsyncLceDefault_GH100), UVM's CPU_TO_GPU pick is LCE 4 too, the
CE rig takes. Where the picks differ (a Grace host; a direct-connected peer whose NVLinks sit on
another LCE), rig still runs every copy on one CE.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rig_nv.layouts import Params, rm_ffi
from rig_nv.rm import RMError
from rig_nv.status import NV_ERR_NOT_SUPPORTED

if TYPE_CHECKING:
    from rig_nv.rm import Path

# ctrl2080gpu.h, ctrl2080ce.h (570.211.01 and 580.142 alike).
NV2080_CTRL_CMD_GPU_GET_ENGINES_V2 = 0x20800170
NV2080_CTRL_CMD_CE_GET_CAPS_V2 = 0x20802A03
NV2080_CTRL_CMD_CE_GET_CE_PCE_MASK = 0x20802A02

# NV2080_ENGINE_TYPE_* (class/cl2080_notification.h): GRAPHICS 1; COPY0..COPY9 are 0x09..0x12,
# COPY10..COPY19 0x34..0x3d (NV2080_ENGINE_TYPE_COPY(i), _IS_COPY, _COPY_IDX).
ENGINE_GRAPHICS = 0x01
_COPY0, _COPY9, _COPY10, _COPY19 = 0x09, 0x12, 0x34, 0x3D

# NV2080_CTRL_CE_CAPS_* (ctrl2080ce.h): byte index, bit mask in NV2080_CTRL_CE_CAPS_TBL_SIZE 2.
CE_GRCE = (0, 0x01)  # synchronous with GR: a graphics group's own copy engine
CE_SHARED = (0, 0x02)  # shares PCEs with another CE
CE_SYSMEM_READ = (0, 0x04)  # faster system memory reads than other CEs
CE_SYSMEM_WRITE = (0, 0x08)  # faster system memory writes than other CEs
CE_NVLINK_P2P = (0, 0x10)  # used for P2P over NVLink
CE_SYSMEM = (0, 0x20)  # can reach system memory
CE_P2P = (0, 0x40)  # can reach peers' memory
CE_BL_SIZE_GT_64K_SUPPORTED = (0, 0x80)
CE_SUPPORTS_NONPIPELINED_BL = (1, 0x01)
CE_SUPPORTS_PIPELINED_BL = (1, 0x02)
CE_CC_SECURE = (1, 0x04)
CAPS_TBL_SIZE = 2

# UVM's channel types (uvm_channel.h uvm_channel_type_t), in pick_ces' order.
CPU_TO_GPU, GPU_TO_CPU, GPU_INTERNAL, GPU_TO_GPU, MEMOPS = (
    "cpu_to_gpu", "gpu_to_cpu", "gpu_internal", "gpu_to_gpu", "memops")
TYPES = (CPU_TO_GPU, GPU_TO_CPU, GPU_INTERNAL, GPU_TO_GPU, MEMOPS)


def copy_engine_type(index: int) -> int:
    """NV2080_ENGINE_TYPE_COPY(index)."""
    return _COPY0 + index if index < 10 else _COPY10 + index - 10


def copy_index(engine_type: int) -> int | None:
    """The LCE index of an NV2080 engine type (NV2080_ENGINE_TYPE_COPY_IDX), or ``None`` for
    an engine that is no copy engine."""
    if _COPY0 <= engine_type <= _COPY9:
        return engine_type - _COPY0
    if _COPY10 <= engine_type <= _COPY19:
        return engine_type - _COPY10 + 10
    return None


@dataclass(frozen=True)
class CopyEngine:
    """An LCE as the RM reports it: its index, its caps table (NV2080_CTRL_CE_CAPS_TBL_SIZE
    bytes) and the mask of PCEs behind it."""

    index: int
    caps: bytes
    pce_mask: int = 0

    def has(self, cap: tuple[int, int]) -> bool:
        """Whether the caps table has ``cap`` (NV2080_CTRL_CE_GET_CAP)."""
        byte, mask = cap
        return bool(self.caps[byte] & mask)

    @property
    def engine_type(self) -> int:
        return copy_engine_type(self.index)

    @property
    def pces(self) -> int:
        return bin(self.pce_mask).count("1")

    @property
    def usable(self) -> bool:
        """UVM's ce_is_usable (not a GRCE) with ces_validate's SYSMEM and P2P: rig's copies
        reach pinned host memory and peers' memory."""
        return not self.has(CE_GRCE) and self.has(CE_SYSMEM) and self.has(CE_P2P)

    def __str__(self) -> str:
        return f"LCE {self.index}"


def query(path: Path) -> list[CopyEngine] | None:
    """The GPU's copy engines with their caps; the PCE mask only of the usable ones (the
    others are never picked). ``None`` where the RM refuses GET_ENGINES_V2 as NOT_SUPPORTED;
    a CE whose caps it refuses so is left out (a stubbed one). Other refusals raise."""
    ffi = rm_ffi(path.rm.layouts)
    rm, sub = path.rm, path.h_subdevice
    listed = Params(ffi, "NV2080_CTRL_GPU_GET_ENGINES_V2_PARAMS")
    try:
        rm.control(sub, NV2080_CTRL_CMD_GPU_GET_ENGINES_V2, listed.buf)
    except RMError as e:
        if e.status == NV_ERR_NOT_SUPPORTED:
            return None
        raise
    count = min(int(listed.p.engineCount), len(listed.p.engineList))
    out = []
    for engine_type in (int(listed.p.engineList[i]) for i in range(count)):
        index = copy_index(engine_type)
        if index is None:
            continue
        caps = Params(ffi, "NV2080_CTRL_CE_GET_CAPS_V2_PARAMS", ceEngineType=engine_type)
        try:
            rm.control(sub, NV2080_CTRL_CMD_CE_GET_CAPS_V2, caps.buf)
        except RMError as e:
            if e.status == NV_ERR_NOT_SUPPORTED:
                continue
            raise
        ce = CopyEngine(index, bytes(caps.p.capsTbl[0:CAPS_TBL_SIZE]))
        if ce.usable:
            pce = Params(ffi, "NV2080_CTRL_CE_GET_CE_PCE_MASK_PARAMS", ceEngineType=engine_type)
            rm.control(sub, NV2080_CTRL_CMD_CE_GET_CE_PCE_MASK, pce.buf)
            ce = CopyEngine(index, ce.caps, int(pce.p.pceMask))
        out.append(ce)
    return out


def _usage(index: int, preferred: dict[str, int]) -> int:
    """How many of UVM's channel types picked ``index`` so far (ce_usage_count)."""
    return sum(1 for picked in preferred.values() if picked == index)


def compare(kind: str, a: CopyEngine, b: CopyEngine, preferred: dict[str, int]) -> int:
    """Negative if ``a`` is the better CE for UVM channel type ``kind``
    (compare_ce_for_channel_type, uvm_channel.c), positive if ``b`` is."""
    if kind in (CPU_TO_GPU, GPU_TO_CPU):
        fast = CE_SYSMEM_READ if kind == CPU_TO_GPU else CE_SYSMEM_WRITE
        if a.has(fast) != b.has(fast):
            return int(b.has(fast)) - int(a.has(fast))
        # "Prefer not to take up the CEs for nvlink P2P"
        if a.has(CE_NVLINK_P2P) != b.has(CE_NVLINK_P2P):
            return int(a.has(CE_NVLINK_P2P)) - int(b.has(CE_NVLINK_P2P))
    elif kind in (GPU_INTERNAL, GPU_TO_GPU):
        if a.pces != b.pces:  # "prefer the LCE with the most PCEs"
            return b.pces - a.pces
        # GPU_INTERNAL: "Leave P2P CEs to the GPU_TO_GPU channel type, when possible"
        if kind == GPU_INTERNAL and a.has(CE_NVLINK_P2P) != b.has(CE_NVLINK_P2P):
            return int(a.has(CE_NVLINK_P2P)) - int(b.has(CE_NVLINK_P2P))
    elif kind != MEMOPS:
        raise ValueError(f"no UVM channel type {kind!r}")
    # "By default, prefer less used CEs", "And CEs that don't share PCEs", then the index.
    used = _usage(a.index, preferred) - _usage(b.index, preferred)
    if used:
        return used
    if a.has(CE_SHARED) != b.has(CE_SHARED):
        return int(a.has(CE_SHARED)) - int(b.has(CE_SHARED))
    return a.index - b.index


def best(ces: Iterable[CopyEngine], kind: str,
         preferred: dict[str, int] | None = None) -> CopyEngine | None:
    """The usable CE UVM takes for channel type ``kind`` given the picks so far (the loop of
    pick_ces_for_channel_types: in index order, a CE replaces the best so far when it compares
    better), or ``None`` where none is usable."""
    found: CopyEngine | None = None
    for ce in sorted((ce for ce in ces if ce.usable), key=lambda ce: ce.index):
        if found is None or compare(kind, ce, found, preferred or {}) < 0:
            found = ce
    return found


def pick(ces: Iterable[CopyEngine]) -> dict[str, int]:
    """The CE (its index) UVM picks for each of its channel types (pick_ces), in :data:`TYPES`'
    order, each pick counting in the next ones' usage; empty where no CE is usable."""
    ces = list(ces)
    preferred: dict[str, int] = {}
    for kind in TYPES:
        found = best(ces, kind, preferred)
        if found is None:
            break
        preferred[kind] = found.index
    return preferred


def choose(ces: Sequence[CopyEngine] | None) -> CopyEngine | None:
    """The CE a device's copy channel runs on (see the module's text): the best for UVM's
    GPU_TO_GPU type with no CE taken yet (the most PCEs, then one sharing none, then the lowest
    index: the usage term, which spreads UVM's several channel types over the CEs, has nothing
    to spread for rig's one copy channel). ``None`` where the RM reported no usable CE (the
    copy channel then stays on the graphics group's GRCE)."""
    return best(ces or (), GPU_TO_GPU)
