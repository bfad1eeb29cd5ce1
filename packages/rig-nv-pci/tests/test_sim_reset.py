"""The simulated GPU's function reset (sim/gpu.py SimGpu.reset), which the opener's reset of a
lost or still-booted GPU runs (tests/test_held.py TakenSim.reset): it ends the boot and
GSP-RM with all it held, video memory keeps its bytes, and the next boot's GSP-RM starts with
BAR 1's tables empty."""

from __future__ import annotations

import pytest
from sim.gsp_rm import BAR1_PDB
from support import Opened, copies, give_back_for_good, silence

from rig_nv_pci.path import addresses


def test_a_function_reset_ends_the_boot_and_gsp_rm_and_the_next_boot_starts_afresh(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A device's GPU reset under it (as a lost GPU's next open resets it): WPR2 down, the
    falcons stopped, the GSP serving nothing, GSP-RM's records empty, video memory as it was;
    the device's stop meets a GSP that answers nothing (one RPC timeout); the next boot
    empties BAR 1's root and a device made then copies as it should."""
    before = addresses.PROCESS.addresses().free
    try:
        reset_under_a_device(ga102, monkeypatch)
    finally:
        give_back_for_good(before)


def reset_under_a_device(ga102: Opened, monkeypatch: pytest.MonkeyPatch) -> None:
    d = ga102.open()
    silence(ga102, d, monkeypatch)
    copies(d)
    g, s = ga102.rig.gpu, ga102.sim_rm
    assert s.channels and s.fbmem and s.roots and ga102.firmware.peer.objects
    assert any(s.vram[BAR1_PDB:BAR1_PDB + 0x1000])  # the device's BAR 1 PDEs
    marker = bytes(s.vram[BAR1_PDB:BAR1_PDB + 0x1000])
    g.reset()
    assert not ga102.rig.gpu.wpr2_up() and g.function_resets == 1
    assert g.gsp.state == g.sec2.state == "stopped" and not g.gsp.riscv_core
    assert ga102.firmware.peer is None  # nothing serves the command queue
    assert not (s.channels or s.fbmem or s.sysmem or s.roots or s.tlb or s.groups
                or s.contexts or s.global_ctx or s.devices) and s.running is None
    assert bytes(s.vram[BAR1_PDB:BAR1_PDB + 0x1000]) == marker  # video memory kept
    d.stop()
    assert "the GSP stopped answering" in str(ga102.stops[-1])
    d2 = ga102.open()  # the next boot: BAR 1's root emptied by GSP-RM, then the path's own
    try:
        assert ga102.firmware.boots == 2
        copies(d2)
    finally:
        d2.stop()
    assert ga102.stops[-1] is None
