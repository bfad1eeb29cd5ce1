"""Bus mastering and the open, on the simulated GA102, whose config space's command register
(sim.SimGpu.command) holds Bus Master Enable: with it clear the GPU issues no memory request
(PCIe Base 6.0 7.5.1.1.3), so its falcons' DMA never completes, its GSP reads neither its
arguments nor its queues, and its engines reach no system memory (sim.SimGpu.dma).

Linux leaves the bit clear after a kernel driver let the function go (pci_disable_device), and
vfio-pci's open and rig_pci's reset clear it: an open turns it on before the boot's first DMA
(rig_nv_pci.held.open_device), and turns it off again before the function's release when the
boot fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import sim
from support import BUS, Opened, TakenSim, copies, given_back, opener

import rig_nv_pci
from rig_edge import Memory, OpenRefused
from rig_nv_pci.boot import ampere as boot

UNBOUND = 0x0002  # PCI_COMMAND as pci_disable_device leaves it: MEMORY on, MASTER off


def test_the_simulated_gpu_issues_no_memory_request_with_bus_mastering_off(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator's side, with the open's enable left out (bus_master does nothing): the
    boot's first falcon DMA (FWSEC-FRTS's load on the GSP falcon) never completes, and the
    open fails as on hardware, the GPU untouched beyond it; the GSP's LibOS, started by hand
    on its arguments, finds none; and once booted, an engine's access to system memory faults
    while the bit is clear."""
    g = ga102.rig.gpu
    g.command = UNBOUND
    monkeypatch.setattr(type(ga102.function), "bus_master", lambda self, on: None)
    with pytest.raises(boot.BootError, match=r"DMA .*did not finish"):
        ga102.open()
    assert g.gsp.dma_fault == "no memory request: the function's Bus Master Enable is clear"
    assert ga102.firmware.boots == 0 and ga102.stops == []
    ga102.firmware.start_at(0x1_2340_0000)
    assert ga102.firmware.failure is not None and "no host memory" in ga102.firmware.failure
    assert g.unissued == ["the GSP reading its LibOS arguments: 0x1000 bytes at 0x123400000"]
    monkeypatch.undo()
    # on again (a falcon reset clears its DMA fault): the open boots
    g.command = 0x0006
    g.gsp.write(g.gsp.base + 0x3C0, 1)  # NV_PFALCON_FALCON_ENGINE RESET, then release
    g.gsp.write(g.gsp.base + 0x3C0, 0)
    g.wpr2 = (0, 0)  # FWSEC-FRTS never ran
    d = ga102.open()
    try:
        r = d.alloc(0x1000, Memory.PINNED)
        assert r is not None
        g.command = UNBOUND
        try:
            with pytest.raises(LookupError, match="no memory request"):
                ga102.sim_rm.write(r.gpu, b"DMA")
        finally:
            g.command = 0x0006
        ga102.sim_rm.write(r.gpu, b"DMA")
        copies(d)
    finally:
        d.stop()
    assert ga102.stops == [None]


def test_an_open_of_a_gpu_left_with_bus_mastering_off_boots_and_works(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU as Linux leaves it after its driver unbinds (bus mastering off): the open turns
    memory space decoding and bus mastering on, boots, and its device copies; no memory
    request went unissued. Again after a failed boot, whose next open resets the GPU first
    (rig_pci's reset leaves bus mastering off)."""
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    g = ga102.rig.gpu
    g.command = UNBOUND
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        assert takes[-1].bus_mastering and takes[-1].memory_spaces == 1
        copies(d)
    finally:
        d.stop()
    assert g.unissued == [] and takes[-1].closed
    # a boot that fails loses the GPU; the next open resets it, bus mastering off, and boots
    booter = g.sec2.programs[ga102.rig.sb.ucode_id]
    g.sec2.programs[ga102.rig.sb.ucode_id] = sim.booter_program(g, error=0xB00700FF)
    with pytest.raises(OpenRefused, match="booter_load"):
        rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    g.sec2.programs[ga102.rig.sb.ucode_id] = booter
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        assert takes[-1].resets == 1 and takes[-1].bus_mastering
        copies(d)
    finally:
        d.stop()
    assert g.unissued == [] and not rig_nv_pci.opener.lost(machine, BUS)
    given_back(machine, BUS)


def test_a_failed_boot_turns_bus_mastering_off_before_the_function_frees_its_memory(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A boot that fails once the GSP may have started (booter_load's error, after FWSEC set
    WPR2 up) loses the GPU, and the function's release frees the GSP's memory (as huge pages
    back to the system when taken physically): bus mastering goes off first, as a lost stop
    turns it off."""
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    order: list[str] = []
    real = TakenSim.bus_master

    def bus_master(self: TakenSim, on: bool) -> None:
        order.append(f"bus master {'on' if on else 'off'}")
        real(self, on)

    def close(self: TakenSim) -> None:  # as rig_pci.Function.close frees its DMA memory
        self.closed = True
        order.append("DMA memory freed")

    monkeypatch.setattr(TakenSim, "bus_master", bus_master)
    monkeypatch.setattr(TakenSim, "close", close)
    g = ga102.rig.gpu
    g.sec2.programs[ga102.rig.sb.ucode_id] = sim.booter_program(g, error=0xB00700FF)
    with pytest.raises(OpenRefused, match="booter_load"):
        rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    assert order == ["bus master on", "bus master off", "DMA memory freed"]
    assert not takes[-1].bus_mastering and rig_nv_pci.opener.lost(machine, BUS)



def test_a_refused_open_leaves_memory_decoding_as_it_found_it(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The spec: make "gives back what it took and leaves the GPU as the open found it" when
    an image is missing. The open turns memory space decoding on to read the chip (a
    function no driver enabled may have it clear), so the refusal turns it off again; where
    it was on, the refusal leaves it on. An open that succeeds leaves it on."""
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    g = ga102.rig.gpu
    empty = tmp_path / "no-firmware"
    empty.mkdir()
    for command in (0x0000, 0x0002):
        g.command = command
        with pytest.raises(OpenRefused, match="firmware files a GA102 boots with are missing"):
            rig_nv_pci.gpu(0, machine, firmware=[empty]).open()
        assert takes[-1].memory_spaces == 1 and takes[-1].closed
        assert g.command == command, f"PCI_COMMAND 0x{g.command:04x} after the refusal"
    g.command = 0x0000
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        assert g.command & 0x6 == 0x6
        copies(d)
    finally:
        d.stop()
