"""Which RM classes a GPU's device uses, chosen from the classes the GPU reports.

Class numbers from open-gpu-kernel-modules src/common/sdk/nvidia/inc/class/ (clc56f.h,
clc86f.h, clc96f.h, clca6f.h, clc661.h, clc6c0.h ... clcec0.h, clc6b5.h ... clcab5.h);
the GH100 list (g_gpu_class_list.c) offers only the Hopper compute and copy classes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig_edge import RigError

# Newest first: a GPU also reports some older classes, and the newest it has is its own.
USERMODE = (0xC761, 0xC661, 0xC561, 0xC461)  # BLACKWELL, HOPPER, AMPERE, TURING_USERMODE_A
GPFIFO = (0xCA6F, 0xC96F, 0xC86F, 0xC56F)  # BLACKWELL_B/_A, HOPPER, AMPERE_CHANNEL_GPFIFO_A
COMPUTE = (0xCEC0, 0xCDC0, 0xCBC0, 0xC9C0, 0xC7C0, 0xC6C0)
COPY = (0xCAB5, 0xC9B5, 0xC8B5, 0xC7B5, 0xC6B5)

# Non-RM classes every device makes (nvos.h, cl0080.h, cl2080.h, cla06c.h, cl9067.h, cl90f1.h).
NV01_ROOT_CLIENT = 0x41
NV01_DEVICE_0 = 0x80
NV20_SUBDEVICE_0 = 0x2080
NV01_MEMORY_SYSTEM = 0x3E
NV01_MEMORY_LOCAL_USER = 0x40
NV01_MEMORY_SYSTEM_OS_DESCRIPTOR = 0x71
FERMI_VASPACE_A = 0x90F1
KEPLER_CHANNEL_GROUP_A = 0xA06C
FERMI_CONTEXT_SHARE_A = 0x9067
# Made only to read an MMU fault's access type, after a fault (rig_nv.faults; class/cl83de.h).
GT200_DEBUGGER = 0x83DE


@dataclass(frozen=True)
class Classes:
    usermode: int
    gpfifo: int
    compute: int
    copy: int

    @property
    def qmd_version(self) -> int:
        """The QMD layout the compute class reads: 5 (Blackwell), 4 (Hopper), 3 (Ampere, Ada)."""
        if self.compute >= 0xCDC0:
            return 5
        if self.compute == 0xCBC0:
            return 4
        return 3


def choose(available: set[int], gpu: str) -> Classes:
    """The newest usermode, GPFIFO, compute and copy classes in ``available``.

    Raises :class:`rig_edge.RigError` naming what the GPU lacks (a GPU older than Ampere).
    """
    picked = []
    for what, wanted in (("usermode", USERMODE), ("GPFIFO", GPFIFO), ("compute", COMPUTE),
                         ("copy", COPY)):
        found = next((c for c in wanted if c in available), None)
        if found is None:
            raise RigError(
                f"{gpu}: the GPU reports no {what} class rig knows "
                f"(rig needs Ampere or newer; known: {', '.join(f'0x{c:x}' for c in wanted)})"
            )
        picked.append(found)
    return Classes(*picked)


def arch_of(sm_version: int) -> str:
    """``"sm_90"`` from the RM's SM version (0x900; NV2080_CTRL_GR_INFO_SM_VERSION_*: major in
    bits 15:8, minor in 7:0, e.g. 0x806 is sm_86, 0xA00 sm_100, 0xC00 sm_120)."""
    return f"sm_{(sm_version >> 8) & 0xFF}{sm_version & 0xFF:x}"
