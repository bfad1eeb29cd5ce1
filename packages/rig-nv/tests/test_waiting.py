"""How a wait spins and naps (rig_nv.waiting), on the CPU: the nap schedule a wait asks the
path for, the thread's timer slack lowered while it naps and put back after, and what a nap
then lasts. The spec's promise kept here: a wait returns once its value is done and raises the
device's faults from the path's sleep (rig_nv.Device.wait's docstring); the H200 numbers that
chose the schedule are in rig_nv.waiting's docstring."""

from __future__ import annotations

import statistics
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from rig_edge import Fault, Lost
from rig_nv import waiting
from rig_nv.hostmem import ffi, libc


def slack() -> int:
    z = ffi.cast("unsigned long", 0)
    return int(libc.prctl(waiting.PR_GET_TIMERSLACK, z, z, z, z))


def set_slack(ns: int) -> None:
    z = ffi.cast("unsigned long", 0)
    assert libc.prctl(waiting.PR_SET_TIMERSLACK, ffi.cast("unsigned long", ns), z, z, z) == 0


class Health:
    """A device's health as waiting sees it: its loss, and the fault a sleep would report."""

    def __init__(self) -> None:
        self.lost: Lost | None = None
        self.fault: Fault | None = None

    def raise_lost(self) -> None:
        if self.lost is not None:
            raise self.lost

    def raise_fault(self) -> None:
        if self.fault is not None:
            raise self.lose(self.fault)

    def lose(self, e: Lost) -> Lost:
        self.lost = e
        return e


class Timeline:
    """A device as waiting sees it: its value reaches ``done`` at ``at`` (perf_counter), and
    every nap the path is asked for is kept with the time waited when asked."""

    def __init__(self, at: float, done: int = 5, hang_ms: int | None = None) -> None:
        self.at, self.done = at, done
        self.value = done - 1
        self.naps: list[tuple[float, float]] = []
        self.start = time.perf_counter()
        self.slack_in_naps: set[int] = set()
        self.health = Health()
        self.hang_ms = hang_ms
        self.path = SimpleNamespace(sleep=self._sleep, name="stand-in")

    def completed(self) -> int:
        return self.done if time.perf_counter() >= self.at else self.value

    def _sleep(self, seconds: float) -> None:
        self.naps.append((time.perf_counter() - self.start, seconds))
        self.slack_in_naps.add(slack())
        time.sleep(seconds)


def test_a_short_wait_only_spins() -> None:
    t = Timeline(time.perf_counter() + waiting.SPIN_S / 4)
    waiting.wait_value(t, t.done)
    assert t.naps == []


def test_a_long_wait_naps_a_share_of_the_time_waited_with_a_fine_timer_slack() -> None:
    before = slack()
    t = Timeline(time.perf_counter() + 0.06)
    waiting.wait_value(t, t.done)
    returned = time.perf_counter()
    assert t.naps, "a 60 ms wait never napped"
    assert t.naps[0][0] >= waiting.SPIN_S  # spun first
    for waited, nap in t.naps:
        # each nap is asked when `waited` had passed; the schedule read it a moment earlier
        assert waiting.NAP_FIRST_S <= nap <= waiting.NAP_LAST_S
        assert nap <= max(waited * waiting.NAP_SHARE, waiting.NAP_FIRST_S) + 1e-9
        assert nap >= min(max((waited - 1e-3) * waiting.NAP_SHARE, waiting.NAP_FIRST_S),
                          waiting.NAP_LAST_S)
    assert t.slack_in_naps == {waiting.NAP_SLACK_NS}
    assert slack() == before
    # Returned within the last nap (some 2 ms at 60 ms) and a scheduler's delay of the value.
    assert returned - t.at < waiting.NAP_SHARE * 0.06 + 0.02


def test_the_threads_own_timer_slack_comes_back_after_a_wait_that_raises() -> None:
    got: dict[str, Any] = {}

    def thread() -> None:
        set_slack(123_457)
        t = Timeline(time.perf_counter() + 10.0)
        t.health.fault = Fault("stand-in: an injected fault")
        try:
            waiting.wait_value(t, t.done)
        except Fault as e:
            got["raised"] = e
        got["slack"] = slack()
        got["lost"] = t.health.lost

    th = threading.Thread(target=thread)
    th.start()
    th.join()
    assert isinstance(got["raised"], Fault) and got["lost"] is got["raised"]
    assert got["slack"] == 123_457


def test_a_wait_past_its_timeout_raises_timeout_error_naming_the_value() -> None:
    t = Timeline(time.perf_counter() + 10.0)
    with pytest.raises(TimeoutError, match=r"timeline value 5 not reached in 0\.02 s"):
        waiting.wait_value(t, t.done, 0.02)


def test_no_progress_for_hang_ms_loses_the_device() -> None:
    t = Timeline(time.perf_counter() + 10.0, hang_ms=30)
    with pytest.raises(Lost, match=r"no progress for 0\.03 s"):
        waiting.wait_value(t, t.done)
    assert t.health.lost is not None
    with pytest.raises(Lost):  # and done work's wait raises too, once lost
        waiting.wait_value(t, 1)


def test_a_nap_under_the_fine_slack_ends_nearer_when_asked() -> None:
    if slack() < 20_000:
        pytest.skip(f"this thread's timer slack is {slack()} ns already")

    def median_us() -> float:
        xs = []
        for _ in range(100):
            s = time.perf_counter()
            time.sleep(20e-6)
            xs.append(time.perf_counter() - s)
        return statistics.median(xs) * 1e6

    coarse = median_us()
    with waiting.precise_naps():
        fine = median_us()
    assert fine < coarse - 10, f"20 us naps: {fine:.0f} us fine, {coarse:.0f} us coarse"


def test_without_prctl_naps_keep_their_slack_and_the_wait_still_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Off Linux the C library has no prctl: a wait naps at the thread's own slack."""
    monkeypatch.setattr(waiting, "libc", SimpleNamespace())
    before = slack()
    t = Timeline(time.perf_counter() + 0.01)
    waiting.wait_value(t, t.done)
    assert t.naps and t.slack_in_naps == {before}
