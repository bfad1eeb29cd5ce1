"""A step submitted many times at once on the stand-in path (fake_gpu.py): issue 23, "a way to
submit a step many times with one GP_PUT write and one doorbell". Each repetition has its own
timeline value; a marked step of launches alone goes as runs of up to RUN_MOST repetitions an
entry (test_step_runs_cpu.py plays them), others one entry each; the entries go out together
as far as the ring has room."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rig_edge import Memory, Misuse
from rig_nv import channel as channel_module
from rig_nv import setup
from rig_nv.step import RUN_MOST

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"


class _Doorbells:
    """Counts the drains before a doorbell (rig_nv.channel.fence), one per doorbell; with
    ``channel``, keeps what its GPFIFO ring holds at each, and its put."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, channel: Any = None) -> None:
        self.count = 0
        self.rings: list[tuple[int, list[int]]] = []
        fence = channel_module.fence

        def counted() -> None:
            self.count += 1
            if channel is not None:
                self.rings.append((channel.put, list(channel.entries)))
            fence()

        monkeypatch.setattr(channel_module, "fence", counted)


def _one_kernel_step(d: Any, path: Any) -> tuple[Any, Any, Any]:
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    s = d.step()
    s.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    return img, a, s


def _copy_step(d: Any, path: Any) -> tuple[Any, Any, Any]:
    """A step of a launch then a copy: unmarked, so no runs (one entry a repetition)."""
    img, a, s = _one_kernel_step(d, path)
    s.copy(a, a, 4096, dst_offset=8192)
    return img, a, s


def _entries(channel: Any, first: int, last: int) -> list[int]:
    return [int(channel.entries[i % channel.count]) for i in range(first, last)]


def test_times_after_compute_work_is_one_doorbell_and_a_value_each(
        dev: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """After compute work the GPU has done, submit(times=N) of a step that ends with a copy
    writes N entries naming its commands where they lie, one GP_PUT write and one doorbell; a
    step of one launch, whole runs then one of the rest. Either takes N values and returns the last
    one's point, and the points of the values between keep their meaning."""
    d, path = dev
    img, a, s = _copy_step(d, path)
    before = d.launch(img["vadd"], (4,), (256,), (a, a, a, 2))
    path.complete()  # seen done: one its QMD releases, not yet, is acquired first (submit)
    bells, put = _Doorbells(monkeypatch), d.compute.put
    p = s.submit(times=1000)
    assert bells.count == 1 and d.compute.put == put + 1000
    assert int(d.compute.gpput[0]) == d.compute.put % d.compute.count
    assert _entries(d.compute, put, put + 1000) == [s.entry] * 1000 and s.runs == (s.entry,)
    assert p.value == before.value + 1000 == d.timeline.current()
    assert list(d.compute.pending)[-1000:] == list(range(before.value + 1, p.value + 1))
    _, _, runs = _one_kernel_step(d, path)
    path.complete()
    before = d.launch(img["vadd"], (4,), (256,), (a, a, a, 2))
    path.complete()
    bells.count, put = 0, d.compute.put
    p = runs.submit(times=1000)
    whole, rest = divmod(1000, RUN_MOST)
    assert bells.count == 1 and d.compute.put == put + whole + 1
    assert _entries(d.compute, put, d.compute.put) == [runs.runs[-1]] * whole + [
        runs.runs[rest - 1]]
    assert p.value == before.value + 1000 == d.timeline.current()
    ends = [before.value + RUN_MOST * (i + 1) for i in range(whole)] + [p.value]
    assert list(d.compute.pending)[-whole - 1:] == ends
    d.timeline.word[0] = before.value + 500  # the GPU has run 500 of them
    assert d.timeline.point(before.value + 500).signaled and not p.signaled
    path.complete()
    p.wait()
    nxt = d.launch(img["vadd"], (4,), (256,), (a, a, a, 3))
    assert nxt.value == p.value + 1


def test_times_after_the_copy_channel_acquires_once_then_goes_as_one(
        dev: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """After the copy channel's work the first repetition waits for it (the acquire and a copy
    of the commands, through the pushbuffer); the other N-1 follow as one doorbell, as one
    run."""
    d, path = dev
    _, a, s = _one_kernel_step(d, path)
    s.submit()  # takes the load's invalidate of the SMs' caches
    b = d.alloc(1 << 16, Memory.PINNED)
    copied = d.copy(b, a, 4096)
    bells, put = _Doorbells(monkeypatch), d.compute.put
    p = s.submit(times=50)
    assert bells.count == 2 and p.value == copied.value + 50
    first = _entries(d.compute, put, put + 1)[0]
    assert first != s.entry and (first >> 42) & 0x1FFFFF == s.dwords + 6  # + the acquire
    assert d.compute.put == put + 2 and _entries(d.compute, put + 1, put + 2) == [s.runs[48]]


def test_times_under_a_profile_stamps_each_repetition(dev: tuple[Any, Any]) -> None:
    """Under a profile every repetition is its own entry with its own stamps and record."""
    d, path = dev
    _, _, s = _one_kernel_step(d, path)
    s.submit()
    put = d.compute.put
    with d.profile(capacity=16) as prof:
        p = s.submit(times=5)
    assert d.compute.put == put + 5
    assert len(set(_entries(d.compute, put, put + 5)) | {s.entry}) == 6
    path.complete()
    events = prof.events()[-5:]
    assert [e.name for e in events] == ["step"] * 5
    assert [e.value for e in events] == list(range(p.value - 4, p.value + 1))


def test_times_beyond_the_rings_room_goes_in_ring_sized_batches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """More repetitions than the GPFIFO holds (of a step with no runs): as many at once as it
    has room for (one entry of the ring always stays free), each batch after waiting for
    room, written across the ring's end where it wraps; every repetition still gets its own
    value, in order."""
    from fake_gpu import open_fake

    monkeypatch.setattr(setup, "GPFIFO_ENTRIES", 64)
    d, path = open_fake()
    try:
        img, a, s = _copy_step(d, path)
        s.submit()
        for i in range(70):  # the ring full of launches' entries, none the step's
            d.launch(img["vadd"], (4,), (256,), (a, a, a, i))
        path.complete()
        put, value, count = d.compute.put, d.timeline.current(), d.compute.count
        bells = _Doorbells(monkeypatch, d.compute)
        p = s.submit(times=200)
        assert p.value == value + 200 and d.compute.put == put + 200
        assert bells.count == 4  # 63 + 63 + 63 + 11: the fake GPU finishes all at each wait
        assert put % count not in (0, 1)  # the first batch of 63 wraps
        starts = [put] + [now for now, _ in bells.rings]
        for last, (now, ring) in zip(starts, bells.rings, strict=False):
            assert [ring[i % count] for i in range(last, now)] == [s.entry] * (now - last)
        path.complete()
        p.wait()
    finally:
        d.stop()


@pytest.mark.parametrize("times", [0, -1, 2.5, "3", None])
def test_times_that_is_no_count_is_misuse_and_submits_nothing(dev: tuple[Any, Any],
                                                              times: Any) -> None:
    """Bad input is Misuse naming ``times``, having changed nothing (the error policy): no
    value taken, no entry written, the step not sealed."""
    d, path = dev
    _, _, s = _one_kernel_step(d, path)
    put, value = d.compute.put, d.timeline.current()
    with pytest.raises(Misuse, match="times"):
        s.submit(times=times)
    assert (d.compute.put, d.timeline.current(), s.memory) == (put, value, None)


def test_a_queues_step_goes_as_one_doorbell_on_its_own_channel_after_its_waits(
        dev: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue's step: submit(times=N) takes N values of the queue's own timeline. After
    ``after`` the first repetition carries the waits (through the pushbuffer), the other
    N-1 follow as one doorbell on the queue's compute channel, as runs; the device's stay as
    they were."""
    d, path = dev
    img, a, _ = _one_kernel_step(d, path)
    q = d.queue()
    s = q.step()
    s.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    s.submit()  # the queue's last work is compute work
    waited = d.launch(img["vadd"], (4,), (256,), (a, a, a, 2))
    q.after(waited)
    device_puts = d.compute.put, d.copy_channel.put
    bells, put, value = _Doorbells(monkeypatch), q.compute.put, q.timeline.current()
    p = s.submit(times=100)
    assert p.device is q and p.value == value + 100 == q.timeline.current()
    assert bells.count == 2 and q.compute.put == put + 3  # the waits, a whole run, the rest
    assert _entries(q.compute, put, put + 1)[0] != s.entry
    assert _entries(q.compute, put + 1, put + 3) == [s.runs[-1], s.runs[99 - RUN_MOST - 1]]
    assert (d.compute.put, d.copy_channel.put) == device_puts
    path.complete()
    q.timeline.word[0] = q.timeline.current()
    p.wait()
