"""A GSP booted on the simulated GA102 under a rig_nv_pci.path.pci.PciPath, and its channels."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sim
from sim.gsp_rm import SimRm

from rig_edge import Memory
from rig_nv_pci.boot.booted import GspBooted
from rig_nv_pci.path import pci as pp
from support.boot import Rig, gsp_rig, run_boot
from support.held import BUS


@dataclass
class Booted:
    rig: Rig
    firmware: sim.GspFirmware
    sim_rm: SimRm
    booted: GspBooted

    def bar1(self) -> tuple[int, int]:
        return self.booted.static.bar1_pde_base, self.sim_rm.bar1_size

    def path(self, **kw: object) -> pp.PciPath:
        return pp.PciPath("NV-PCI", BUS, self.booted.rm, bar=self.sim_rm.bar,
                          alloc_dma=self.rig.gpu.host.alloc_dma, maps_host=False,
                          poll=self.booted.channel.poll,
                          fb_regions=self.booted.static.fb_regions,
                          pramin=self.rig.bar0, bar1=self.bar1(), **kw)  # type: ignore[arg-type]


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

