"""What a boot saw and left running: the data classes the Ampere/Ada boot (:mod:`.ampere`) and the
Blackwell boot (:mod:`.blackwell`) return, apart from both so that neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass

from rig_nv_pci.boot import fsp
from rig_nv_pci.boot.falcon import DmaBuffer
from rig_nv_pci.boot.gspmem import GspMemory
from rig_nv_pci.firmware import vbios
from rig_nv_pci.gsp import rpc, static_info
from rig_nv_pci.gsp.sequencer import SequencerEvents


@dataclass(frozen=True)
class Booted:
    """What the boot saw: the VBIOS's FWSEC, WPR2 after FWSEC-FRTS and after booter_load."""

    fwsec: vbios.Fwsec
    wpr2_after_frts: tuple[int, int]
    wpr2_after_booter: tuple[int, int] | None


@dataclass(frozen=True)
class FmcBooted:
    """What :func:`rig_nv_pci.boot.blackwell.boot_fmc` laid out and saw: the bus addresses of
    the FMC image and of GSP_FMC_BOOT_PARAMS, the COT payload sent, the FSP's answer, and WPR2
    afterwards (the FMC raises it; ``None`` if it reads down)."""

    fmc_address: int
    boot_params_address: int
    cot: bytes
    response: fsp.FspResponse
    wpr2: tuple[int, int] | None
    buffers: tuple[DmaBuffer, ...]


@dataclass(frozen=True)
class GspBooted:
    """A booted GSP: what :func:`rig_nv_pci.boot.ampere.boot` (or
    :func:`rig_nv_pci.boot.blackwell.boot_fmc`) saw, the
    host memory, the RPC channel, the INIT_DONE message (``channel`` the RPCs), the RM of
    the root client made on the GSP, the static configuration GSP-RM reported, and the
    channel's handler of GSP_RUN_CPU_SEQUENCER, which goes on running those the GSP sends
    while the device runs (:meth:`rig_nv_pci.gsp.sequencer.SequencerEvents.runtime` makes a
    failed one lose the GPU)."""

    booted: Booted | FmcBooted
    memory: GspMemory
    channel: rpc.Rpc
    init_done: rpc.Incoming
    rm: rpc.RpcRM
    static: static_info.StaticInfo
    sequencers: SequencerEvents
