"""rig_nv.clock and a device's clock on the CPU (issue 8): PTIMER's halves read high-low-high
so a carry between them does not tear the time, pairs of the host's and the GPU's clocks,
their drift and the mapping of GPU times onto the host's clock, ``Device.clock`` and
``Device.gpu_time_ns`` over the stand-in path (fake_gpu.py, whose RM answers
NV2080_CTRL_CMD_TIMER_GET_TIME from a clock a test gives), and a profile's pairs, host times and
Chrome trace."""

from __future__ import annotations

import itertools
import struct
import time
from typing import Any

import pytest
from fake_gpu import rc

from rig_edge import Lost, Memory, RigError
from rig_nv import clock
from rig_nv.clock import Clock, Pair, Timebase, read_split
from rig_nv.hostmem import view
from rig_nv.rm import RMError

LOW, HIGH = 0x80, 0x84  # any two offsets


class Ptimer:
    """PTIMER's two registers over a time that advances ``step`` ns at every register read
    (bits 4:0 of the low half read zero, NV_PTIMER_TIME_0_NSEC 31:5)."""

    def __init__(self, start: int, step: int) -> None:
        self.now, self.step = start, step
        self.reads: list[tuple[str, int]] = []  # (register, the time when read)

    def read32(self, offset: int) -> int:
        t = self.now
        self.now += self.step
        if offset == LOW:
            self.reads.append(("lo", t))
            return t & 0xFFFF_FFE0
        assert offset == HIGH
        self.reads.append(("hi", t))
        return t >> 32


def test_a_steady_clock_is_read_high_low_high_once() -> None:
    timer = Ptimer(0x1_2345_6780, 64)
    got = read_split(timer.read32, LOW, HIGH)
    assert [r for r, _ in timer.reads] == ["hi", "lo", "hi"]
    assert got == 0x1_2345_6780 + 64


def test_a_carry_between_the_halves_is_read_again_not_torn() -> None:
    """The high half read before the low half carries into it, the low half after: taken
    as they are the time would be 2^32 ns (4.3 s) early. The second high read differs, and
    the halves are read again."""
    timer = Ptimer((1 << 32) - 32, 64)
    got = read_split(timer.read32, LOW, HIGH)
    assert [r for r, _ in timer.reads] == ["hi", "lo", "hi", "hi", "lo", "hi"]
    torn = timer.reads[0][1] >> 32 << 32 | timer.reads[1][1] & 0xFFFF_FFE0
    assert torn == 32  # what hi then lo alone would have answered
    first, last = timer.reads[0][1], timer.reads[-1][1]
    assert first <= got <= last and got >> 32 == 1


def test_a_low_half_with_bits_4_0_set_is_read_again_and_all_ones_is_an_error() -> None:
    answers = iter([0, 0x0000_001F, 0x0000_0040, 0])

    def flaky(offset: int) -> int:
        return next(answers)

    assert read_split(flaky, LOW, HIGH) == 0x40
    with pytest.raises(RigError, match=r"NV-PCI: PTIMER's low half reads 0xffffffff 8 times"):
        read_split(lambda offset: 0xFFFF_FFFF, LOW, HIGH, what="NV-PCI")


def test_a_high_half_that_never_settles_is_an_error() -> None:
    counter = itertools.count()
    with pytest.raises(RigError, match="high half changed across each of 8 readings"):
        read_split(lambda offset: next(counter) << 5, LOW, HIGH)


def test_a_pair_keeps_the_narrowest_of_its_readings() -> None:
    host = iter([100, 190, 1000, 1010, 2000, 2500])  # spreads 90, 10, 500
    gpu = iter([7, 8, 9])
    p = clock.pair(lambda: next(gpu), host=lambda: next(host))
    assert p == Pair(1005, 8, 10)


def test_two_pairs_measure_the_drift_and_place_gpu_times_on_the_host_clock() -> None:
    # The GPU's clock runs 250 ppm fast from 5e12: over 1 s of the host's, 1.00025 s.
    start = Pair(1_000_000_000, 5_000_000_000_000, 2000)
    end = Pair(2_000_000_000, 5_001_000_250_000, 2000)
    tb = Timebase(start, end)
    assert tb.drift_ppm == pytest.approx(250.0)
    assert tb.uncertainty_ppm == pytest.approx((2000 + 64) / 1e9 * 1e6)
    assert tb.drift_used
    assert tb.to_host(start.gpu_ns) == start.host_ns and tb.to_host(end.gpu_ns) == end.host_ns
    assert tb.to_host(5_000_500_125_000) == 1_500_000_000  # halfway on both clocks
    assert tb.to_host(5_002_000_500_000) == 3_000_000_000  # beyond the end pair: the same line
    # One pair: no drift assumed from it.
    assert Timebase(start).drift_ppm is None and Timebase(start).uncertainty_ppm is None
    assert Timebase(start).to_host(5_001_000_250_000) == 2_000_250_000


def test_pairs_too_close_for_a_drift_to_be_measured_assume_none() -> None:
    """Pairs 1 ms apart with 5 us spreads measure the drift to within 5000 ppm: coarser than
    any drift (PLAUSIBLE_PPM), so the mapping assumes none rather than follow it."""
    start = Pair(0, 10_000, 5000)
    end = Pair(1_000_000, 1_013_000, 5000)  # 3000 ppm, as noise would have it
    tb = Timebase(start, end)
    assert tb.drift_ppm == pytest.approx(3000.0)
    assert tb.uncertainty_ppm is not None and tb.uncertainty_ppm > clock.PLAUSIBLE_PPM
    assert not tb.drift_used
    assert tb.to_host(1_013_000) == 1_003_000


def test_the_device_reads_the_clock_through_the_rm_of_its_path(dev: tuple[Any, Any]) -> None:
    d, path = dev
    assert d.clock is Clock.RM and d.clock.text.startswith("GPU PTIMER through the RM")
    path.rm.gpu_clock = itertools.count(1 << 40, 1000).__next__
    assert [d.gpu_time_ns() for _ in range(3)] == [1 << 40, (1 << 40) + 1000, (1 << 40) + 2000]
    assert path.rm.controls[-3:] == [clock.NV2080_CTRL_CMD_TIMER_GET_TIME] * 3

    def refused() -> int:
        raise RMError("RM control 0x20800403", 0x56)

    path.rm.gpu_clock = refused
    with pytest.raises(RMError, match="NV_ERR_NOT_SUPPORTED"):
        d.gpu_time_ns()


def test_the_clock_advances_with_the_hosts(dev: tuple[Any, Any]) -> None:
    d, _ = dev
    host0, gpu0 = time.monotonic_ns(), d.gpu_time_ns()
    time.sleep(0.01)
    gpu1, host1 = d.gpu_time_ns(), time.monotonic_ns()
    assert 0 < gpu1 - gpu0 <= host1 - host0


def test_a_path_that_reads_no_clock_has_none() -> None:
    from fake_gpu import FakePath, open_on

    class Clockless(FakePath):
        clock = None  # type: ignore[assignment]

    path = Clockless()
    d = open_on(path)
    try:
        assert d.clock is None
        with pytest.raises(RigError, match="NV: its path reads no GPU clock"):
            d.gpu_time_ns()
        with d.profile(capacity=2) as prof:
            pass
        assert prof.timebase is None and prof.to_host(5) is None and prof.drift_ppm is None
        assert "does not read" in prof.chrome_trace()["otherData"]["clock"]
    finally:
        d.stop()


def test_a_lost_device_reads_no_clock(dev: tuple[Any, Any]) -> None:
    d, _ = dev
    rc(d, 13)
    with pytest.raises(Lost):
        d.sleep(0)
    with pytest.raises(Lost):
        d.gpu_time_ns()


def test_a_profile_places_its_events_on_the_hosts_clock_through_its_pairs(
        dev: tuple[Any, Any]) -> None:
    """The stand-in GPU's clock runs 2000 ppm fast: the profile's pairs measure that within
    their uncertainty, and a stamp the GPU wrote maps to the host time it stands for."""
    d, path = dev
    drift, offset = 2000e-6, 7 << 40

    def gpu_at(host_ns: int) -> int:
        return offset + host_ns + int(host_ns * drift)

    path.rm.gpu_clock = lambda: gpu_at(time.monotonic_ns())
    a = d.alloc(4096, Memory.PINNED)
    assert a is not None
    with d.profile(capacity=4) as prof:
        d.copy(a, a, 64)
        time.sleep(0.05)
        mid = time.monotonic_ns()
        time.sleep(0.05)
    tb = prof.timebase
    assert tb is not None and tb.end is not None and tb.drift_used
    assert prof.drift_ppm == pytest.approx(2000.0, abs=tb.uncertainty_ppm)
    # Play the GPU: the copy's stamps at `mid` and 1 ms after it, on the GPU's clock.
    assert prof.memory.host is not None
    slots = view(prof.memory.host, 32)
    struct.pack_into("<Q", slots, 8, gpu_at(mid))
    struct.pack_into("<Q", slots, 24, gpu_at(mid + 1_000_000))
    path.complete()
    (event,) = prof.events()
    slack = (tb.start.spread_ns + tb.end.spread_ns) // 2 + 64
    assert event.host_start_ns is not None and event.host_end_ns is not None
    assert abs(event.host_start_ns - mid) <= slack
    assert abs(event.host_end_ns - (mid + 1_000_000)) <= slack
    assert event.duration_ns == gpu_at(mid + 1_000_000) - gpu_at(mid)  # the GPU's, drifting
    other = prof.chrome_trace()["otherData"]
    assert other["clock"] == "GPU PTIMER through the RM (NV2080_CTRL_CMD_TIMER_GET_TIME)"
    assert "drift from the host's clock" in other["drift"]
    assert other["drift_ppm"] == prof.drift_ppm and other["drift_used"] is True
    assert other["drift_uncertainty_ppm"] == tb.uncertainty_ppm
    assert other["pairs"] == [[p.host_ns, p.gpu_ns, p.spread_ns] for p in (tb.start, tb.end)]
    assert other["origin_host_ns"] == event.host_start_ns


def test_a_profile_whose_device_is_lost_keeps_its_first_pair(dev: tuple[Any, Any]) -> None:
    d, _ = dev
    with pytest.raises(Lost), d.profile(capacity=2) as prof:
        rc(d, 13)
        d.sleep(0)
    tb = prof.timebase
    assert tb is not None and tb.end is None and prof.drift_ppm is None
    assert prof.to_host(tb.start.gpu_ns + 10) == tb.start.host_ns + 10
