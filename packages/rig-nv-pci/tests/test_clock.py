"""The GPU's clock over PCI (issue 8; the Rig_nv_pci spec: "A device reads the GPU's timer
registers through BAR 0 (Rig_nv.clock.Registers), so its profiles' times drift from the host's
clock"), against the simulated GA102 booted to GSP_INIT_DONE, whose PTIMER (tests/sim/timer.py)
advances with the host's monotonic clock, drifting from it as a test says, and whose PBDMA
writes it into timestamp releases (tests/sim/pbdma.py)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
import sim
from sim.timer import VF_TIME_0, VF_TIME_1
from support import Booted, ga102, simulated_ga102

import rig_nv
from rig_edge import Memory, RigError
from rig_nv.clock import Clock, Timebase
from rig_nv_pci.path import pci as pp

__all__ = ["ga102"]  # the fixture, from support.path


def timer_reads(gpu: sim.SimGpu) -> list[str]:
    names = {VF_TIME_0: "lo", VF_TIME_1: "hi", sim.timer.TIME_0: "lo (0x9400)",
             sim.timer.TIME_1: "hi (0x9410)"}
    return [names[r] for r in gpu.reads if r in names]


def test_the_paths_registers_are_the_ones_the_simulated_gpu_documents() -> None:
    """PTIMER where NVIDIA's RM reads it from Turing on: NV_VIRTUAL_FUNCTION_TIME_0/_1 at the
    PF's virtual-register offset (the simulator has them from dev_vm.h on its own)."""
    assert (pp.PTIMER_TIME_0, pp.PTIMER_TIME_1) == (VF_TIME_0, VF_TIME_1) == (0xBB0080, 0xBB0084)


def test_an_opened_gpus_device_reads_ptimer_through_the_functions_bar0(
        tmp_path: Path) -> None:
    """rig_nv_pci.held hands the path the BAR 0 window the open took (the spec's
    Rig_nv.clock.Registers): the device's clock reads the simulated PTIMER, drifting with it."""
    opened = simulated_ga102(tmp_path)
    opened.rig.gpu.timer = sim.SimTimer(start_ns=1 << 50, drift_ppm=-300.0)
    try:
        d = opened.open()
        try:
            assert d.clock is Clock.REGISTERS
            opened.rig.gpu.reads.clear()
            assert d.gpu_time_ns() >= 1 << 50
            assert timer_reads(opened.rig.gpu) == ["hi", "lo", "hi"]
            with d.profile(capacity=1) as prof:
                time.sleep(0.1)
            assert prof.drift_ppm is not None and prof.timebase is not None
            assert prof.drift_ppm == pytest.approx(-300.0, abs=prof.timebase.uncertainty_ppm)
        finally:
            d.stop()
    finally:
        opened.sim_rm.stop()


def test_the_devices_clock_is_registers_and_advances_with_the_hosts(ga102: Booted) -> None:
    p, s = ga102.path(timer=ga102.rig.bar0), ga102.sim_rm.start()
    d = rig_nv.make(p)
    try:
        assert d.clock is Clock.REGISTERS and d.clock.text == "GPU PTIMER through BAR 0 registers"
        gpu = ga102.rig.gpu
        gpu.reads.clear()
        host0, gpu0 = time.monotonic_ns(), d.gpu_time_ns()
        assert timer_reads(gpu) == ["hi", "lo", "hi"]  # through BAR 0, no RPC
        time.sleep(0.02)
        gpu1, host1 = d.gpu_time_ns(), time.monotonic_ns()
        assert gpu0 % 32 == 0 and gpu1 % 32 == 0  # NV_PTIMER_TIME_0_NSEC 31:5
        assert 0.02e9 <= gpu1 - gpu0 <= host1 - host0 + 32
        assert s.faults == []
    finally:
        d.stop()


def test_a_carry_between_the_halves_is_not_torn(ga102: Booted) -> None:
    """PTIMER's low half carries into the high one between the path's reads of them: the
    second read of the high half differs, and both are read again (a time 2^32 ns early
    otherwise)."""
    p = ga102.path(timer=ga102.rig.bar0)
    gpu = ga102.rig.gpu
    # Each register read comes 64 ns after the one before it, the first at 2^32 - 32.
    gpu.timer = sim.SimTimer(start_ns=(1 << 32) - 96, clock=itertools.count(0, 64).__next__)
    gpu.reads.clear()
    assert p.gpu_time_ns() == (1 << 32) + 224
    assert timer_reads(gpu) == ["hi", "lo", "hi", "hi", "lo", "hi"]
    p.closed()


def test_a_gpu_that_stopped_answering_or_a_failed_read_is_an_error(ga102: Booted) -> None:
    p = ga102.path(timer=ga102.rig.bar0)
    gpu = ga102.rig.gpu
    gpu.timer.answers = False  # every read all ones, as a function off the bus
    with pytest.raises(RigError, match=r"NV-PCI: PTIMER's low half reads 0xffffffff"):
        p.gpu_time_ns()
    gpu.timer.answers = True
    gpu.failing[VF_TIME_1] = 1  # the region's read fails (EIO)
    with pytest.raises(RigError, match=r"NV-PCI: reading PTIMER through BAR 0 failed"):
        p.gpu_time_ns()
    assert p.gpu_time_ns() > 0
    p.closed()


def test_a_path_given_no_bar0_for_it_reads_no_clock(ga102: Booted) -> None:
    p, _ = ga102.path(), ga102.sim_rm.start()
    d = rig_nv.make(p)
    try:
        assert p.clock is None and d.clock is None
        with pytest.raises(RigError, match="its path reads no GPU clock"):
            d.gpu_time_ns()
        with pytest.raises(RigError, match="was given no BAR 0 for it"):
            p.gpu_time_ns()
    finally:
        d.stop()


def test_a_profile_maps_its_events_onto_the_hosts_clock_despite_the_drift(
        ga102: Booted) -> None:
    """The simulated PTIMER runs 2000 ppm fast. The profile's pairs, 0.25 s apart, measure
    that within their uncertainty, and a copy's stamps (the simulated PBDMA's
    RELEASE_TIMESTAMP) map into the host time the copy was submitted and waited in; through
    the first pair alone, with no drift, they would lie half a millisecond late."""
    ga102.rig.gpu.timer = sim.SimTimer(drift_ppm=2000.0)
    p, s = ga102.path(timer=ga102.rig.bar0), ga102.sim_rm.start()
    d = rig_nv.make(p)
    try:
        pinned = d.alloc(4096, Memory.PINNED)
        mapped = d.alloc(4096, Memory.MAPPED)
        assert pinned is not None and mapped is not None
        with d.profile(capacity=4) as prof:
            d.copy(mapped, pinned).wait(timeout_s=5.0)
            time.sleep(0.25)
            before = time.monotonic_ns()
            d.copy(pinned, mapped).wait(timeout_s=5.0)
            after = time.monotonic_ns()
        events = prof.events()
        assert [e.name for e in events] == ["copy", "copy"] and s.faults == []
        tb = prof.timebase
        assert tb is not None and tb.end is not None and tb.uncertainty_ppm is not None
        assert tb.drift_used and tb.uncertainty_ppm < 500
        assert prof.drift_ppm == pytest.approx(2000.0, abs=tb.uncertainty_ppm)
        last = events[-1]
        assert last.host_start_ns is not None and last.host_end_ns is not None
        slack = 100_000  # 0.1 ms: the pairs' spreads and the drift's uncertainty, with room
        assert before - slack <= last.host_start_ns <= last.host_end_ns <= after + slack
        undrifted = Timebase(tb.start).to_host(last.start_ns)
        assert undrifted - last.host_start_ns > 400_000  # 2000 ppm of 0.25 s, uncorrected
        other = prof.chrome_trace()["otherData"]
        assert other["clock"] == "GPU PTIMER through BAR 0 registers"
        assert "drift from the host's clock" in other["drift"]
        assert other["drift_ppm"] == prof.drift_ppm
    finally:
        d.stop()
