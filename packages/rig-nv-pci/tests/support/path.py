"""A GSP booted on the simulated GA102 under a rig_nv_pci.path.pci.PciPath, and its channels."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
import sim
from sim.gsp_rm import SimRm

from rig_edge import Memory
from rig_nv_pci.boot.booted import GspBooted
from rig_nv_pci.gsp.events import EventLog
from rig_nv_pci.path import pci as pp
from rig_nv_pci.path.rm import GspClient
from rig_nv_pci.path.vidmem import FbLayout
from support.boot import Rig, gsp_rig, run_boot
from support.held import BUS


class SimBars:
    """The simulated GPU's BARs as a path takes them (rig_nv_pci.path.host.Bars): views of
    the simulated GSP-RM's usermode page and BAR 1, each one closed noted in ``closed``."""

    def __init__(self, sim_rm: SimRm) -> None:
        self._sim_rm = sim_rm
        self.closed: list[memoryview] = []

    def view(self, index: int, offset: int, length: int, at: int | None = None) -> memoryview:
        assert at is None, "the simulated path's memory is not placed"
        return self._sim_rm.bar(index, offset, length)

    def close(self, view: memoryview) -> None:
        self.closed.append(view)


@dataclass
class SimMemory:
    """The simulated machine's memory as a path takes it (rig_nv_pci.path.host.SystemMemory),
    the process's pages mapped for the GPU only where ``maps_host`` (behind an IOMMU)."""

    host: sim.HostMemory
    maps_host: bool = False

    def alloc_dma(self, n: int, *, at: int | None = None) -> sim.SimDma:
        return self.host.alloc_dma(n, at=at)

    def map_host(self, address: int, length: int) -> sim.SimDma:
        return self.host.map_host(address, length)


@dataclass
class Booted:
    rig: Rig
    firmware: sim.GspFirmware
    sim_rm: SimRm
    booted: GspBooted

    def bar1(self) -> tuple[int, int]:
        return self.booted.static.bar1_pde_base, self.sim_rm.bar1_size

    def fb(self, kept: Sequence[tuple[int, int]] = (), *, bar1: bool = True) -> FbLayout:
        """The booted GSP's FB regions, BAR 1's root and size (where ``bar1``) and ``kept``."""
        return FbLayout(self.booted.static.fb_regions, self.bar1() if bar1 else None, kept)

    def path(self, *, bars: SimBars | None = None, maps_host: bool = False,
             events: EventLog | None = None, fb: FbLayout | None = None,
             **kw: object) -> pp.PciPath:
        return pp.PciPath("NV-PCI", BUS, GspClient(self.booted.rm, self.booted.channel.poll,
                                                   events),
                          bars=bars or SimBars(self.sim_rm),
                          memory=SimMemory(self.rig.gpu.host, maps_host),
                          fb=fb or self.fb(), pramin=self.rig.bar0,
                          **kw)  # type: ignore[arg-type]


@pytest.fixture
def ga102() -> Iterator[Booted]:
    r, firmware, memory = gsp_rig()
    sim_rm = SimRm(r.gpu).install(firmware)
    booted = run_boot(r, memory)
    assert firmware.failure is None, firmware.log
    yield Booted(r, firmware, sim_rm, booted)
    sim_rm.stop()


def _channel_kit(p: pp.PciPath, engine: int) -> tuple[int, bytearray]:
    """A channel group of ``engine`` (NV2080_ENGINE_TYPE_GRAPHICS 1, _COPY0 9,
    cl2080_notification.h) and the NV_CHANNEL_ALLOC_PARAMS for a channel of it."""
    from rig_nv import classes as cls
    from rig_nv.layouts import Params

    tsg = p.rm.new_handle()
    p.rm.alloc(p.h_device, tsg, cls.KEPLER_CHANNEL_GROUP_A,
               Params(p.ffi, "NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS", engineType=engine).buf)
    area, notifier = p.alloc_memory(2 << 20, Memory.MAPPED), p.alloc_notifier()
    assert area is not None
    asked = Params(p.ffi, "NV_CHANNEL_ALLOC_PARAMS", hObjectError=notifier.handle,
                   gpFifoOffset=area.gpu, gpFifoEntries=0x400)
    asked.p.hUserdMemory[0] = area.handle
    asked.p.userdOffset[0] = 0x2000
    return tsg, asked.buf

