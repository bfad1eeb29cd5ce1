"""A simulated Ampere/Ada GPU for the tests: BAR 0's registers, PTIMER, two falcons (GSP,
SEC2), the PROM window, WPR2 and scripted firmware. Written from NVIDIA's interfaces,
importing nothing of rig_nv_pci (see regs.py)."""

from .falcon import BROM_FAILED, PRI_ERROR, SimFalcon
from .fmc import SimFmc, gb202
from .fsp import SimFsp
from .gpu import (
    AD102_BOOT42,
    FWSEC_SB_BAD_DESC,
    GA102_BOOT42,
    GB202_BOOT42,
    HostMemory,
    SimBar0,
    SimDma,
    SimGpu,
    booter_program,
    booter_unload_program,
    fwsec_program,
)
from .gsp_fw import GspFirmware, peer_module
from .timer import SimTimer

__all__ = [
    "AD102_BOOT42",
    "BROM_FAILED",
    "FWSEC_SB_BAD_DESC",
    "GA102_BOOT42",
    "GB202_BOOT42",
    "PRI_ERROR",
    "GspFirmware",
    "HostMemory",
    "SimBar0",
    "SimDma",
    "SimFalcon",
    "SimFmc",
    "SimFsp",
    "SimGpu",
    "SimTimer",
    "booter_program",
    "booter_unload_program",
    "fwsec_program",
    "gb202",
    "peer_module",
]
