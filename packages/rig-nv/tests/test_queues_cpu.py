"""Queues on the stand-in path (issue 17, "Queues"): the command streams of two queues (their own
channels and words, the acquire ``after`` writes, none between unordered queues), memory
reuse held until every queue passed a free's values, faults, bad input, locks and stop.
The default device's commands stay byte for byte as they were: test_launch_golden.py."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fake_gpu import BASE, FakePath, held_elsewhere, open_on, rc
from test_device_cpu import commands, methods

from rig_edge import Fault, Lost, Memory, Misuse, RigError
from rig_nv import Queue, push
from rig_nv.hostmem import view

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"


def semaphores(words: list[int]) -> list[tuple[int, int, int]]:
    """(address, value, operation) of each semaphore method in ``words``."""
    return [(d[0] | d[1] << 32, d[2] | d[3] << 32, d[4] & 7) for _, m, d in methods(words)
            if m == push.SEM_ADDR_LO and len(d) == 5]


def acquires(words: list[int]) -> list[tuple[int, int]]:
    """(address, value) of each semaphore acquire in ``words``."""
    return [(a, v) for a, v, op in semaphores(words) if op == push.SEM_OP_ACQ_CIRC_GEQ]


def last(d: Any, channel: Any) -> list[int]:
    return commands(d, channel)[-1]


@pytest.fixture
def two(dev: tuple[Any, Any]) -> tuple[Any, Any, Queue, Any, Any]:
    """(device, path, a queue, an image, a region)."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    q = d.queue()
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    return d, path, q, img, a


def test_a_queue_has_its_own_channels_word_and_values(two: Any) -> None:
    """Issue 17: "d.queue() returns a new queue of the device: its own channels (compute and
    copy ...), its own timeline word and values"."""
    d, path, q, img, a = two
    assert {q.compute.handle, q.copy_channel.handle}.isdisjoint(
        {d.compute.handle, d.copy_channel.handle})
    # Its compute channel joins the device's group (test_queue_groups_cpu.py says why).
    assert q.objects.tsg == d.objects.tsg and q.objects.copy_tsg != d.objects.copy_tsg
    assert q.timeline.gpu != d.timeline.gpu
    before = d.timeline.next
    p = q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    assert p.device is q and d.timeline.next == before
    assert q.compute.put > 0 and q.completed() < p.value
    path.complete()
    assert p.signaled
    p.wait()
    d.wait(p)  # the device waits for any of its queues' points


def test_after_writes_an_acquire_of_the_other_queues_word(two: Any) -> None:
    """Issue 17: "q.after(*points): the queue's next submission waits, on the GPU, for those
    points ... (a semaphore acquire on that queue's word; no host wait)"."""
    d, _path, q, img, a = two
    q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    p = d.launch(img["vadd"], (4,), (256,), (a, a, a, 2))
    copied = d.copy(a, a, 64, dst_offset=128, engine="copy")
    q.after(p, copied)
    assert d.completed() < copied.value  # no host wait
    q.launch(img["vadd"], (4,), (256,), (a, a, a, 3))
    assert acquires(last(d, q.compute))[:2] == [(d.timeline.gpu, p.value),
                                                (d.timeline.gpu, copied.value)]
    q.launch(img["vadd"], (4,), (256,), (a, a, a, 4))  # only the next one waits on d's word
    assert [w for w, _ in acquires(last(d, q.compute))] in ([], [q.timeline.gpu])


def test_after_orders_a_queues_copy_too(two: Any) -> None:
    d, _path, q, img, a = two
    p = d.launch(img["vadd"], (4,), (256,), (a, a, a, 2))
    q.after(p)
    q.copy(a, a, 64, dst_offset=256, engine="copy")
    assert (d.timeline.gpu, p.value) in acquires(last(d, q.copy_channel))


def test_unordered_queues_put_no_acquire_between_them(two: Any) -> None:
    """Issue 17: "work of different queues runs concurrently unless ordered"."""
    d, _path, q, img, a = two
    q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    for i in range(3):
        d.launch(img["vadd"], (4,), (256,), (a, a, a, i))
        d.copy(a, a, 64, dst_offset=128, engine="copy")
        q.launch(img["vadd"], (4,), (256,), (a, a, a, i))
        q.copy(a, a, 64, dst_offset=256, engine="copy")
    for channel in (q.compute, q.copy_channel):
        for words in commands(d, channel):
            assert all(address == q.timeline.gpu for address, _ in acquires(words))
    for channel in (d.compute, d.copy_channel):
        for words in commands(d, channel):
            assert all(address == d.timeline.gpu for address, _ in acquires(words))


def test_a_queues_step_adds_to_its_own_word(two: Any) -> None:
    d, _path, q, img, a = two
    s = q.step()
    s.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    before = d.timeline.next
    p = s.submit()
    assert p.device is q and d.timeline.next == before
    assert any(method == push.SEM_ADDR_LO and data[0] | data[1] << 32 == q.timeline.gpu
               for _, method, data in methods(list(s.commands)))


def test_freed_memory_is_not_reused_until_every_queue_passed_the_free(two: Any) -> None:
    """Issue 17: "a region freed while any queue's work may still use it is not handed out
    again (by the reuse cache ...) until every queue has passed the values that were current
    at the free". Fails when the reuse check hands memory out one value early."""
    d, _path, q, _img, a = two
    region = d.alloc(1 << 20, Memory.DEVICE)
    assert region is not None
    p = q.copy(region, a, 4096)  # the queue's work uses it; the device's is all done
    d.free(region)
    again = d.alloc(1 << 20, Memory.DEVICE)
    assert again is not None and again.gpu != region.gpu
    q.timeline.word[0] = p.value  # the queue passed the free's value
    reused = d.alloc(1 << 20, Memory.DEVICE)
    assert reused is not None and reused.gpu == region.gpu


def test_the_device_queue_holds_reuse_until_its_own_value_too(dev: tuple[Any, Any]) -> None:
    """The same on the device's own queue: memory freed while a launch that may use it runs
    is not handed out before the GPU passed that launch's value (one value early fails)."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    region = d.alloc(1 << 20, Memory.DEVICE)
    assert region is not None
    p = d.launch(img["vadd"], (4,), (256,), (region, region, region, 1))
    d.free(region)
    d.timeline.word[0] = p.value - 1
    again = d.alloc(1 << 20, Memory.DEVICE)
    assert again is not None and again.gpu != region.gpu
    d.timeline.word[0] = p.value
    reused = d.alloc(1 << 20, Memory.DEVICE)
    assert reused is not None and reused.gpu == region.gpu


def test_memory_freed_to_the_path_waits_for_every_queue(two: Any, monkeypatch: Any) -> None:
    """Issue 17: "... not handed out again (by the reuse cache or to the path) until every
    queue has passed the values": a region the cache does not keep (Pinned) goes back to the
    path only once the queue that uses it passed the free's value."""
    d, path, q, _img, a = two
    region = d.alloc(1 << 16, Memory.PINNED)
    assert region is not None
    p = q.copy(a, region, 4096)
    seen: list[int] = []
    free = path.free_memory

    def recorded(alloc: Any) -> None:
        seen.append(q.completed())
        free(alloc)

    monkeypatch.setattr(path, "free_memory", recorded)
    d.free(region)
    assert seen == [p.value]  # the path's sleep completed the queue's work first


def test_after_refuses_bad_points_having_changed_nothing(two: Any) -> None:
    """Issue 17: "a point of another device or of a stopped queue given to after is Misuse,
    naming it"."""
    d, path, q, img, a = two
    other_path = FakePath()
    other_path.next = BASE + (64 << 30)
    other = open_on(other_path)
    try:
        x, y = other.alloc(4096, Memory.PINNED), other.alloc(4096, Memory.PINNED)
        foreign = other.copy(x, y, 64, engine="copy")
        with pytest.raises(Misuse, match="another device"):
            q.after(foreign)
    finally:
        other.stop()
    stopped = d.queue()
    sp = stopped.copy(a, a, 64, dst_offset=512, engine="copy")
    path.complete()
    stopped.stop()
    with pytest.raises(Misuse, match="stopped queue"):
        q.after(sp)
    with pytest.raises(Misuse, match="needs a Point"):
        q.after(5)  # type: ignore[arg-type]
    good = d.copy(a, a, 64, dst_offset=640, engine="copy")
    with pytest.raises(Misuse, match="never submitted"):
        q.after(good, type(good)(d, d.timeline.next + 3))
    q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    # nothing of the refused calls stayed: no wait on another queue's word
    assert all(address == q.timeline.gpu for address, _ in acquires(last(d, q.compute)))
    with pytest.raises(RigError, match="queue 2 is stopped"):
        stopped.copy(a, a, 64, engine="copy")


def test_a_fault_on_a_queues_channel_loses_the_device(two: Any) -> None:
    """Issue 17: "a fault on any queue's channel loses the device, and every queue's later
    use raises that Lost"."""
    d, _path, q, img, a = two
    p = q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    notes = d.health.notifiers()
    rc(d, 13)  # every channel's notifier, as a TSG-wide recovery writes them
    for note in notes[:-2]:
        note[:] = bytes(64)  # only the queue's two channels faulted
    with pytest.raises(Fault, match=r"compute 1|copy 1"):
        p.wait(timeout_s=5)
    for use in (lambda: d.launch(img["vadd"], (4,), (256,), (a, a, a, 1)),
                lambda: q.copy(a, a, 64, engine="copy"), d.queue):
        with pytest.raises(Lost):
            use()


def test_a_queue_submits_while_another_holds_its_lock(two: Any) -> None:
    """Issue 17: "submitting on one queue takes no lock that another queue's submissions
    hold"."""
    d, _path, q, img, a = two
    q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    with held_elsewhere(d.timeline.lock):
        done = []
        worker = threading.Thread(target=lambda: done.append(
            (q.launch(img["vadd"], (4,), (256,), (a, a, a, 2)), q.copy(a, a, 64, engine="copy"))))
        worker.start()
        worker.join(2.0)
        assert done, "a queue's submission waited for the device's lock"


def test_stop_gives_back_every_queues_channels(dev: tuple[Any, Any]) -> None:
    """Issue 17: "stop gives back every queue's channels and memory as the spec's stop rules
    say"; a queue of a stopped device raises as the device does."""
    d, path = dev
    q = d.queue()
    handles = set(q.objects.handles)
    assert handles <= set(path.rm.objects)
    d.stop()
    assert handles.isdisjoint(path.rm.objects)
    with pytest.raises(RigError, match="the device is stopped"):
        q.copy(q.owner.alloc(64), q.owner.alloc(64), 64, engine="copy")


def test_synchronize_waits_for_every_queue(two: Any) -> None:
    d, _path, q, img, a = two
    p = q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    assert not p.signaled
    d.synchronize()  # the stand-in's sleep completes them
    assert p.signaled


def test_local_memory_grows_on_every_queue(two: Any) -> None:
    """A launch that needs local memory gives it to every queue's compute channel, and a
    queue made afterwards starts with it."""
    d, _path, q, img, a = two
    d.launch(img["local_array"], (2,), (32,), (a, a, a, 64))
    local = push.COMPUTE_SET_SHADER_LOCAL_MEMORY_A
    for channel in (d.compute, q.compute):
        assert any(m == local for words in commands(d, channel) for _, m, _ in methods(words))
    later = d.queue()
    assert any(m == local for words in commands(d, later.compute) for _, m, _ in methods(words))


def test_a_queues_profile_stamps_its_own_submissions(two: Any) -> None:
    """Issue 17: "A queue has every submission the device has (... profiles)": a queue's
    profile brackets the queue's submissions, on its channels' tracks, and not the device's."""
    d, path, q, img, a = two
    with q.profile(capacity=4) as prof:
        q.copy(a, a, 64, dst_offset=128, engine="copy")
        # the device's own: not in the queue's profile
        d.copy(a, a, 64, dst_offset=256, engine="copy")
        q.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    path.complete()
    events = prof.events()
    assert [(e.name, e.queue) for e in events] == [("copy", "copy 1"), ("vadd", "compute 1")]
    assert d.timeline.profile is None and q.timeline.profile is None


def test_a_refused_queue_gives_back_its_rm_objects_and_the_device_goes_on(
        dev: tuple[Any, Any], monkeypatch: Any) -> None:
    """Device.queue: "Raises ... where the RM refuses the channels, having given back the RM
    objects and the memory it made"; the device and its other queues work on, and the next
    queue gets a number of its own."""
    from rig_nv.rm import RMError

    d, path = dev
    first = d.queue()
    before = dict(path.rm.objects)
    alloc = path.rm.alloc

    channels = []

    def refuse_copy_channel(parent: int, handle: int, cls: int, params: Any = None) -> int:
        if cls == d.classes.gpfifo:
            channels.append(handle)
            if len(channels) == 2:  # the new queue's copy channel
                raise RMError(f"making RM object 0x{handle:x}", 0x1F)
        return alloc(parent, handle, cls, params)

    monkeypatch.setattr(path.rm, "alloc", refuse_copy_channel)
    in_use = path.in_use()
    with pytest.raises(RMError):
        d.queue()
    monkeypatch.setattr(path.rm, "alloc", alloc)
    assert path.rm.objects == before
    assert path.in_use() == in_use  # its word, channel area, pushbuffers and notifiers too
    again = d.queue()
    assert again.number == 3 and again.compute.name == "compute 3"
    a = d.alloc(4096, Memory.PINNED)
    first.copy(a, a, 64, dst_offset=128, engine="copy")
    again.copy(a, a, 64, dst_offset=256, engine="copy")
    d.synchronize()


# ---- a queue's memory at its stop ------------------------------------------------------------

def test_making_and_stopping_50_queues_gives_all_their_memory_back(dev: tuple[Any, Any]) -> None:
    """Queue.stop: "Give back the queue's channels and memory once its work is done": the
    stand-in's memory in use and RM objects return to where they were after 50 queues, each
    with work done and staging of its own, made and stopped (they grew by some 12 MiB a
    queue while the memory stayed the device's)."""
    d, path = dev
    a = d.alloc(1 << 16, Memory.DEVICE)
    d.synchronize()
    in_use, objects = path.in_use(), dict(path.rm.objects)
    for i in range(50):
        q = d.queue()
        q.upload(a, bytes([i]) * a.length)
        q.copy(a, a, 64, dst_offset=128, engine="copy")
        if i == 0:
            assert path.in_use() > in_use + (8 << 20)
        q.stop()
    assert path.in_use() == in_use and path.rm.objects == objects


def test_a_stopped_queues_points_answer_from_its_last_value(two: Any) -> None:
    """Queue.stop: "its points stay waitable (they answer from the last value its word
    held)": its word's memory went back (the stand-in's reads zeros since), yet its points,
    its completed(), the device's waits, and the reuse check of a region freed while the
    queue's work ran all read the queue's last value."""
    d, path, q, _img, a = two
    region = d.alloc(1 << 20, Memory.DEVICE)
    assert region is not None
    first = q.copy(a, a, 64, dst_offset=128, engine="copy")
    p = q.copy(region, a, 4096)
    d.free(region)  # kept for reuse until the queue passes p
    word = next(m for m in path.live.values() if m.host == q.timeline.host)
    q.stop()
    assert word.handle not in path.live  # given back: its pages read zeros now
    assert q.completed() == p.value and p.signaled and first.signaled
    p.wait(timeout_s=1.0)
    d.wait(first, timeout_s=1.0)
    reused = d.alloc(1 << 20, Memory.DEVICE)
    assert reused is not None and reused.gpu == region.gpu


def test_a_stopped_queues_word_stays_until_an_acquire_of_it_is_passed(
        two: Any, monkeypatch: Any) -> None:
    """Issue 17: "a region freed while any queue's work may still use it is not handed out
    again ... until every queue has passed the values that were current at the free": the
    stopped queue's word goes back to the path only after the queue whose ``after`` acquires
    it passed that submission. Fails where the stop frees without the mark."""
    d, path, q, _img, a = two
    other = d.queue()
    path.complete()
    p = q.copy(a, a, 64, dst_offset=128, engine="copy")
    other.after(p)
    waiting = other.copy(a, a, 64, dst_offset=256, engine="copy")
    assert (q.timeline.gpu, p.value) in acquires(last(d, other.copy_channel))
    q.timeline.word[0] = p.value  # the queue is done; the other's acquire not yet run
    word = next(m for m in path.live.values() if m.host == q.timeline.host)
    seen: list[tuple[bool, int]] = []

    def the_other_runs(timeout_s: float) -> None:  # the path's sleep, where the stop waits
        seen.append((word.handle in path.live, other.completed()))
        other.timeline.word[0] = waiting.value

    monkeypatch.setattr(path, "sleep", the_other_runs)
    q.stop()
    assert seen and seen[0] == (True, waiting.value - 1)
    assert word.handle not in path.live and other.completed() == waiting.value


def test_an_after_pending_when_its_queue_stops_acquires_nothing(two: Any) -> None:
    """An ``after`` given before the queue of its point stopped acquires nothing: that
    queue's work is done and its word's memory gone (the GPU would read freed memory)."""
    d, _path, q, img, a = two
    p = q.copy(a, a, 64, dst_offset=128, engine="copy")
    d.after(p)
    q.stop()
    d.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    assert all(address == d.timeline.gpu for address, _ in acquires(last(d, d.compute)))


def test_a_stopped_devices_points_still_read(dev: tuple[Any, Any]) -> None:
    """After the device's stop its memory is gone (the stand-in unmaps it all): its points
    and a queue's answer from their last values."""
    d, path = dev
    q = d.queue()
    a = d.alloc(4096, Memory.PINNED)
    p, r = d.copy(a, a, 64, dst_offset=128), q.copy(a, a, 64, dst_offset=256)
    path.complete()
    d.stop()
    assert p.signaled and r.signaled and d.completed() == p.value


def test_a_stopped_queues_notifiers_are_read_no_more(two: Any) -> None:
    """The stopped queue's error notifiers went back with its memory, which the path may give
    to anything: bytes written there later (as another owner would) lose nothing."""
    d, path, q, img, a = two
    before = dict(path.live)
    q.stop()
    freed = [m for h, m in before.items() if h not in path.live]
    assert len([m for m in freed if m.gpu == 0 and m.length == 4096]) == 2  # the notifiers
    for m in freed:
        if m.host is not None:
            view(m.host, m.length)[:] = b"\xff" * m.length
    d.launch(img["vadd"], (4,), (256,), (a, a, a, 1)).wait(timeout_s=1.0)
    d.sleep(0)
