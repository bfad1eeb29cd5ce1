"""The GPU's clock through the kernel driver (issue 8): ``Device.clock`` is ``Clock.RM``
(NV2080_CTRL_CMD_TIMER_GET_TIME), it advances with the host's clock, it is the clock the
semaphores' RELEASE_TIMESTAMP writes, and a profile's events land on the host's clock inside
the wall-clock window of their submission and wait."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from rig_edge import Memory
from rig_nv import Device
from rig_nv.clock import Clock

pytestmark = pytest.mark.gpu

CUBINS = Path(__file__).resolve().parents[2] / "rig-nv" / "tests" / "cubins"
N = 1 << 26
SLACK_NS = 100_000  # 0.1 ms: a pair's half spread (an ioctl) is some microseconds


def test_the_clock_is_the_rms_and_advances_with_the_hosts(device: Device) -> None:
    assert device.clock is Clock.RM
    host0, gpu0 = time.monotonic_ns(), device.gpu_time_ns()
    time.sleep(0.5)
    gpu1, host1 = device.gpu_time_ns(), time.monotonic_ns()
    rate = (gpu1 - gpu0) / (host1 - host0)
    print(f"GPU ns per host ns over 0.5 s: {rate:.9f} (the ioctls' time included)")
    assert abs(rate - 1) < 1e-3  # a loose bound: 1000 ppm, with the reads' own time


def test_the_semaphores_stamps_are_the_clock_the_rm_reads(device: Device) -> None:
    """A launch's stamps fall after a GET_TIME read before its submission and before one
    read after its wait: one clock, PTIMER."""
    img = device.load((CUBINS / "kernels.sm_90.cubin").read_bytes())
    a = device.alloc(4 * N, Memory.DEVICE)
    assert a is not None
    with device.profile() as prof:
        before = device.gpu_time_ns()
        device.launch(img["vadd"], (N // 256,), (256,), (a, a, a, N)).wait()
        after = device.gpu_time_ns()
    (event,) = prof.events()
    assert before <= event.start_ns <= event.end_ns <= after


def test_a_profiles_events_lie_on_the_hosts_clock_within_their_window(device: Device) -> None:
    rng = np.random.default_rng()
    img = device.load((CUBINS / "kernels.sm_90.cubin").read_bytes())
    x = rng.random(N, dtype=np.float32)
    ra, rc = device.alloc(4 * N, Memory.DEVICE), device.alloc(4 * N, Memory.DEVICE)
    assert ra is not None and rc is not None
    device.upload(ra, x.tobytes()).wait()
    windows = []
    with device.profile() as prof:
        for _ in range(3):
            start = time.monotonic_ns()
            device.launch(img["vadd"], (N // 256,), (256,), (ra, ra, rc, N))
            device.copy(ra, rc).wait()
            windows.append((start, time.monotonic_ns()))
            time.sleep(0.2)  # pairs 0.6 s apart: the drift is measured
    events = prof.events()
    assert [e.name for e in events] == ["vadd", "copy"] * 3
    tb = prof.timebase
    assert tb is not None and tb.end is not None
    print("pairs", tb.start, tb.end, "drift", prof.drift_ppm, "+-", tb.uncertainty_ppm,
          "used", tb.drift_used)
    assert prof.drift_ppm is not None and abs(prof.drift_ppm) < 1000
    pairs = list(zip(events[::2], events[1::2], strict=True))
    for (start, end), (launch, copy) in zip(windows, pairs, strict=True):
        for e in (launch, copy):
            assert e.host_start_ns is not None and e.host_end_ns is not None
            assert start - SLACK_NS <= e.host_start_ns <= e.host_end_ns <= end + SLACK_NS, (
                e, start, end)
        assert launch.host_end_ns <= copy.host_start_ns  # device order
    other = prof.chrome_trace()["otherData"]
    print("otherData", other)
    assert other["clock"].startswith("GPU PTIMER through the RM")
    assert "drift_ppm" in other
