"""Issue 26 finding 3: a channel's doorbell token, as a GSP client's CPU-RM builds it per chip
(kfifoGenerateWorkSubmitTokenHal_GA100 / _GB202: runlist 22:16 | ChID 11:0, and GB20x's
RUNLIST_DOORBELL 30:30), against the simulated PBDMA, which fetches only for a doorbell naming
a channel by its runlist and ChID (sim/runlists.py)."""

from __future__ import annotations

import pytest
from support import Opened, round_trip

from rig_nv import Device
from rig_nv_pci.firmware import chips
from rig_nv_pci.path import runlists
from rig_nv_pci.path.runlists import Doorbells


def test_tokens_carry_the_runlist_and_on_gb20x_the_doorbell_enable() -> None:
    table = {0x01: 1, 0x0B: 2, 0x13: 7}  # RM_ENGINE_TYPE GR0, COPY2, COPY10
    ga = Doorbells("GPU 0", table, chips.AMPERE.runlist_doorbell)
    assert ga.token(0x01, 5) == 1 << 16 | 5 and ga.token(0x0B, 3) == 2 << 16 | 3
    assert ga.token(0x34, 1) == 7 << 16 | 1  # NV2080 COPY10 is RM's 0x13
    gb = Doorbells("GPU 0", table, chips.BLACKWELL.runlist_doorbell)
    assert gb.token(0x01, 5) == 1 << 30 | 1 << 16 | 5
    assert not chips.ADA.runlist_doorbell and not chips.HOPPER.runlist_doorbell
    with pytest.raises(runlists.RunlistError, match="names no runlist for engine type 0x2b"):
        ga.token(0x2B, 1)


def test_a_ga102_copy_runs_on_the_tokens_cpu_rm_builds(ga102: Opened) -> None:
    """The device's channels, on the simulated GA102's runlists 1 and 2, ring tokens holding
    the runlist; the PBDMA ignored none; no GSP_RM_CONTROL asked GSP-RM for a token (CPU-RM
    answers NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN itself)."""
    d = ga102.open()
    try:
        round_trip(d)
        s = ga102.sim_rm
        tokens = {c.runlist_id << 16 | c.chid for c in s.channels.values()}
        assert {1 << 16 | 1, 2 << 16 | 1} <= tokens and set(s.doorbells) <= tokens
        assert s.doorbells and s.ignored_doorbells == []
        asked = [c.cmd for c in ga102.firmware.peer.controls()]
        assert 0xC36F0108 not in asked
        assert runlists.NV2080_CTRL_CMD_FIFO_GET_DEVICE_INFO_TABLE in asked
    finally:
        d.stop()


def test_a_bare_chid_token_is_never_fetched(ga102: Opened,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The old behaviour planted: GSP-RM's token (the ChID only) names runlist 0, where no
    channel of the device is, so the simulated PBDMA fetches nothing and the device's first
    work never completes."""
    monkeypatch.setattr(Doorbells, "token", lambda self, engine, chid: chid)
    wait = Device.wait  # the device's first submissions wait 10 s (rig_nv.setup): 1 s here
    monkeypatch.setattr(Device, "wait", lambda self, point, timeout_s=None: wait(
        self, point, min(timeout_s or 1.0, 1.0)))
    with pytest.raises(TimeoutError):
        d = ga102.open()
        try:
            round_trip(d)
        finally:
            d.stop()
    assert ga102.sim_rm.ignored_doorbells and all(
        t < 0x1000 for t in ga102.sim_rm.ignored_doorbells)
