"""The issue's evidence for each family of the spec's chips: boot, open, alloc, a submission
through the simulated channel, stop and reopen, on the simulated AD102 (Ada: booter_load and
booter_unload of ad102, the GSP image's ad10x signature, ADA_COMPUTE_A) and GB202 (Blackwell:
the FSP; its stop leaves WPR2 up, so the reopen is through the opener, which resets the GPU
first). GA102's is test_held.py's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sim
from sim.gsp_rm import GA102_CLASSES, GA102_GR, SimRm
from support import (
    BUS,
    FB_SIZE,
    FMC_IMAGE,
    GB202_CLASSES,
    UNLOAD_UCODE_ID,
    Opened,
    SimFunction,
    TakenSim,
    gb202_files,
    given_back,
    images,
    machine_with_a_gpu,
    round_trip,
    stop_rig,
)

import rig_nv_pci
from rig_nv_pci.firmware import chips
from rig_pci import Machine

# What an AD102 (RTX 4090's chip) reports beyond a GA102's classes: ADA_COMPUTE_A (0xC9C0,
# clc9c0.h); its GPFIFO, usermode and copy classes are Ampere's (clc56f.h,
# clc561.h, clc7b5.h). NV2080_CTRL_GR_INFO_INDEX_SM_VERSION 0x809 (sm_89, ctrl2080gr.h).
AD102_CLASSES = (*GA102_CLASSES, 0xC9C0)
AD102_GR = {**GA102_GR, 0xC: 0x809}


def ad102_files(tmp: Path, opened_files: dict[str, os.PathLike[str]]
                ) -> dict[str, os.PathLike[str]]:
    """GA102's synthetic files under Ada's names (nvidia/ad102/gsp/...), the GSP image kept
    at ga102's (chips.GSP_IMAGE: every family boots ga102's)."""
    out: dict[str, os.PathLike[str]] = {}
    for name, path in opened_files.items():
        new = name.replace("/ga102/", "/ad102/") if name != chips.GSP_IMAGE else name
        (tmp / new).parent.mkdir(parents=True, exist_ok=True)
        (tmp / new).write_bytes(Path(path).read_bytes())
        out[new] = tmp / new
    return out


def simulated_ad102(tmp: Path) -> Opened:
    r, firmware, _, unload = stop_rig()
    r.gpu.boot42 = sim.AD102_BOOT42
    r.gpu.usable_fb_mib = FB_SIZE >> 20
    s = SimRm(r.gpu, classes=AD102_CLASSES, gr=AD102_GR).install(firmware).start()
    files = ad102_files(tmp / "ad102", images(tmp / "ga102", r, unload))
    return Opened(r, firmware, s, SimFunction(r.gpu, s), files, [])


def test_an_ad102_boots_opens_allocates_submits_stops_and_opens_again(tmp_path: Path) -> None:
    """Issue 8's evidence for AD102: the open reads ad102's files (the chip its BOOT_42
    names is AD102, family Ada), boots through FWSEC-FRTS and booter_load, makes a device of
    sm_89 with ADA_COMPUTE_A whose first submissions and a copy complete on the simulated
    copy engine; the stop runs FWSEC-SB and booter_unload, WPR2 comes down, and the GPU opens
    and copies again."""
    opened = simulated_ad102(tmp_path)
    try:
        chip = chips.identify(opened.rig.gpu.boot42)
        assert (chip.name, chip.family) == ("AD102", chips.ADA)
        assert all("/ad102/" in n for n in chip.family.firmware if n != chips.GSP_IMAGE)
        g = opened.rig.gpu
        for round in (1, 2):
            d = opened.open()
            assert opened.firmware.boots == round and opened.firmware.failure is None
            assert d.facts.arch == "sm_89" and d.classes.compute == 0xC9C0
            assert d.classes.qmd_version == 3 and d.completed() == 2
            round_trip(d)
            assert opened.sim_rm.faults == []
            d.stop()
            assert opened.stops == [None] * round and opened.firmware.suspended
            assert not opened.rig.gpu.wpr2_up()
            assert f"hs run ucode {UNLOAD_UCODE_ID}" in g.sec2.log
    finally:
        opened.sim_rm.stop()


def test_a_gb202_boots_opens_allocates_submits_stops_and_opens_again_through_the_opener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 8's evidence for GB202: through rig_nv_pci.gpu(0).open(), the FSP boot, a device
    of sm_120 whose copy completes, its stop (WPR2 stays up on Blackwell), and a second open,
    which finds WPR2 up from the earlier boot, resets the GPU first (a function reset ends
    the boot: the simulated GB202 starts over, WPR2 down, its FSP answering afresh) and boots
    it again."""
    paths = gb202_files(tmp_path / "fw")
    made: list[tuple[sim.SimGpu, sim.GspFirmware, SimRm]] = []

    def power_on() -> None:
        """A GB202 as a function reset leaves it: WPR2 down, the FSP and FMC fresh."""
        if made:
            made[-1][2].stop()
        g = sim.gb202()
        sim.SimFmc(g, FMC_IMAGE).install()
        fw = sim.GspFirmware(g).install()
        g.usable_fb_mib = FB_SIZE >> 20
        s = SimRm(g, classes=GB202_CLASSES, gr={**GA102_GR, 0xC: 0xC00}).install(fw).start()
        made.append((g, fw, s))

    power_on()
    machine = machine_with_a_gpu(tmp_path, monkeypatch, sim.GB202_BOOT42, paths)
    resets: list[int] = []

    def take(m: Machine, bus: str, name: str) -> TakenSim:
        g, _, s = made[-1]
        return TakenSim(g, s)

    def reset(self: TakenSim) -> None:
        resets.append(1)
        power_on()
        self.gpu, self.sim_rm = made[-1][0], made[-1][2]  # the same function, reset

    monkeypatch.setattr(rig_nv_pci.opener, "_take", take)
    monkeypatch.setattr(TakenSim, "reset", reset)
    try:
        for round in (1, 2):
            d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path / "fw"]).open()
            g, fw, s = made[-1]
            assert fw.boots == 1 and fw.failure is None, fw.log
            assert len(resets) == round - 1  # the second open reset the GPU first
            assert d.facts.arch == "sm_120" and d.completed() == 2
            assert d.classes.compute == 0xCEC0 and d.classes.qmd_version == 5
            round_trip(d)
            assert s.faults == []
            d.stop()
            assert fw.suspended and g.wpr2_up()
            given_back(machine, BUS)
    finally:
        made[-1][2].stop()
