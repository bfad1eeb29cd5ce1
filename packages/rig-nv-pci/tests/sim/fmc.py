"""The GSP-FMC of a simulated Blackwell (GB202) as the host sees it: what the FSP starts once it
accepts a COT payload, until GSP-RM runs. It checks the FMC image's SHA-384, reads
GSP_FMC_BOOT_PARAMS and the GspFwWprMeta they name (anything wrong: :data:`FMC_BAD_ARGS`),
raises WPR2, releases the lockdown and starts GSP-RM on the RISC-V core.

Written from NVIDIA's interfaces (open-gpu-kernel-modules 570.144), importing nothing of
rig_nv_pci. Each layout and assumption: docs/rig-nv-pci-modules/sim-fmc.md."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from . import regs
from .fsp import FSP_ERR_INVALID_DATA, SimFsp, cot_field
from .gpu import GB202_BOOT42, HostMemory, SimGpu

FMC_BAD_ARGS = 0x000000E1  # an FMC error code the simulated FMC reports for bad arguments
BOOT_PARAMS_SIZE = 80  # sizeof(GSP_FMC_BOOT_PARAMS), 570.144
COHERENT_SYSTEM, NONCOHERENT_SYSTEM = 1, 2  # GSP_DMA_TARGET
WPR_META_SIZE = 256  # sizeof(GspFwWprMeta)


def gb202(host: HostMemory | None = None) -> SimGpu:
    """A simulated GB202: the FSP takes COT version 2 and reports its boot at GB202's
    NV_THERM_I2CS_SCRATCH; the GSP locked to it until the FMC. GPUs given one ``host`` lie on
    one machine (sim/gpu.py HostMemory)."""
    gpu = SimGpu(boot42=GB202_BOOT42, host=host or HostMemory(),
                 fsp=SimFsp(cot_version=2, therm=regs.GB202_THERM_I2CS_SCRATCH))
    gpu.gsp.target_mask_locked = True
    gpu.gsp.br_lockdown = True
    return gpu


@dataclass
class SimFmc:
    """Install with :meth:`install` on a :func:`gb202`. ``image``: the FMC image the FSP
    verifies against; ``error``: an FMC error code left in MAILBOX0 instead of booting;
    ``release_target_mask`` / ``release_lockdown``: whether those happen at all."""

    gpu: SimGpu
    image: bytes
    error: int = 0
    release_target_mask: bool = True
    release_lockdown: bool = True
    fb_size: int = 8 << 30
    boot_params: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def install(self) -> SimFmc:
        assert self.gpu.fsp is not None
        self.gpu.fsp.on_cot = self.cot
        return self

    def cot(self, payload: bytes) -> int:
        """The FSP's check of the FMC, then the FMC's run; the FSP's errorCode."""
        host = self.gpu.host
        fmc = int(cot_field(payload, "gspFmcSysmemOffset"))
        if self.gpu.dma(fmc, len(self.image), "the FSP reading the FMC") is None or \
                host.read(fmc, len(self.image)) != self.image:
            self.log.append(f"no FMC image at 0x{fmc:x}")
            return FSP_ERR_INVALID_DATA
        if cot_field(payload, "hash384") != hashlib.sha384(self.image).digest():
            self.log.append("hash384 is not the image's SHA-384")
            return FSP_ERR_INVALID_DATA
        self.log.append(f"FMC verified at 0x{fmc:x}")
        self._run(payload)
        return 0

    def _fail(self, why: str, code: int) -> None:
        self.log.append("FMC error: " + why)
        self.gpu.gsp.set_mailbox(0, code)

    def _run(self, payload: bytes) -> None:
        gsp = self.gpu.gsp
        if self.release_target_mask:
            gsp.target_mask_locked = False
        if self.error:
            self._fail("scripted", self.error)
            return
        at = int(cot_field(payload, "gspBootArgsSysmemOffset"))
        raw = self.gpu.dma(at, BOOT_PARAMS_SIZE, "the FMC reading GSP_FMC_BOOT_PARAMS")
        if raw is None:
            self._fail(f"no GSP_FMC_BOOT_PARAMS at 0x{at:x}", FMC_BAD_ARGS)
            return
        meta_target, meta_size, meta = struct.unpack_from("<IIQ", raw, 8)
        (is_rm_boot,) = struct.unpack_from("<B", raw, 36)
        (libos_target,) = struct.unpack_from("<I", raw, 40)
        (libos,) = struct.unpack_from("<Q", raw, 48)
        self.boot_params = {"meta_target": meta_target, "meta_size": meta_size, "meta": meta,
                            "is_rm_boot": is_rm_boot, "libos_target": libos_target,
                            "libos": libos}
        self.log.append(f"boot params at 0x{at:x}: meta 0x{meta:x}, libos 0x{libos:x}")
        body = self.gpu.dma(meta, WPR_META_SIZE, "the FMC reading GspFwWprMeta")
        if meta_size != WPR_META_SIZE or is_rm_boot != 1 or body is None or \
                meta_target not in (COHERENT_SYSTEM, NONCOHERENT_SYSTEM) or \
                libos_target not in (COHERENT_SYSTEM, NONCOHERENT_SYSTEM):
            self._fail(f"bad boot params {self.boot_params}", FMC_BAD_ARGS)
            return

        def q(name: str) -> int:
            return int(struct.unpack_from("<Q", body, regs.META_OFFSETS[name])[0])

        if q("magic") != regs.META_MAGIC or q("revision") != 1 or not q("frtsSize") or \
                q("gspFwWprStart"):
            self._fail("GspFwWprMeta is not a first boot's sizes-only meta", FMC_BAD_ARGS)
            return
        # ACR: WPR2 from below the heap up to FRTS's end, frtsVidmemOffset from FB's end
        end = self.fb_size - int(cot_field(payload, "frtsVidmemOffset"))
        self.gpu.set_wpr2(end - (128 << 20), end)
        if not self.release_lockdown:
            self.log.append("lockdown kept")
            return
        gsp.br_lockdown = False
        gsp.start_riscv()
        self.log.append("GSP-RM started")
        if self.gpu.on_gsp_start_at is not None:
            self.gpu.on_gsp_start_at(libos, libos_target == COHERENT_SYSTEM)
