"""Queues over PCI (issue 17, "Queues"): the extra channels made through the same
rig_nv.rm.Path over GSP-RM, and the simulated GA102's PBDMA running two queues' copies, ordered
by ``after`` or not. The PBDMA runs only when a test steps it, channels in the order GSP-RM
made them (sim/pbdma.py): queue 1's before queue 2's."""

from __future__ import annotations

import os

from support import Opened

from rig_edge import Memory, Region
from rig_nv import Device, Queue
from rig_nv.hostmem import view


def two_queues(d: Device) -> tuple[Queue, Queue, bytes, Region, Region, Region]:
    """Two queues of ``d``, fresh random bytes in a pinned source, a zeroed pinned
    destination and zeroed Device memory between them."""
    q1, q2 = d.queue(), d.queue()
    data = os.urandom(4096)
    src, out = d.alloc(4096, Memory.PINNED), d.alloc(4096, Memory.PINNED)
    mid = d.alloc(4096, Memory.DEVICE)
    assert src is not None and out is not None and mid is not None
    assert out.host is not None and src.host is not None
    d.upload(mid, bytes(4096)).wait(timeout_s=5.0)
    view(src.host, 4096)[:] = data
    return q1, q2, data, src, out, mid


def test_two_queues_copies_run_in_the_order_after_gives_them(ga102: Opened) -> None:
    """Issue 17: "the simulated GPU on the PCI path runs two queues' copies and orders them by
    after": queue 1's copy after queue 2's point stalls on the PBDMA at its acquire of queue
    2's word until queue 2's copy released it, then copies what that copy wrote."""
    d = ga102.open()
    s = ga102.sim_rm
    try:
        q1, q2, data, src, out, mid = two_queues(d)
        s.stop()  # the PBDMA runs only when stepped
        copy1 = s.channels[q1.copy_channel.handle]
        filled = q2.copy(mid, src, engine="copy")
        q1.after(filled)
        drained = q1.copy(out, mid, engine="copy")
        s.step()
        assert copy1.stalled_on == f"acquire 0x{q2.timeline.gpu:x} >= {filled.value}"
        assert q2.completed() == filled.value and q1.completed() < drained.value
        assert out.host is not None and bytes(view(out.host, 4096)) == bytes(4096)
        s.step()
        assert q1.completed() == drained.value and bytes(view(out.host, 4096)) == data
        assert s.faults == []
    finally:
        s.start()
        d.stop()


def test_two_queues_copies_without_after_are_not_ordered(ga102: Opened) -> None:
    """Issue 17: "work of different queues runs concurrently unless ordered": without after,
    queue 1's copy (run first by the PBDMA) does not wait for queue 2's, and both complete in
    one pass; queue 1's copied what lay there before queue 2's copy."""
    d = ga102.open()
    s = ga102.sim_rm
    try:
        q1, q2, _data, src, out, mid = two_queues(d)
        s.stop()
        copy1 = s.channels[q1.copy_channel.handle]
        filled = q2.copy(mid, src, engine="copy")
        drained = q1.copy(out, mid, engine="copy")
        s.step()
        assert copy1.stalled_on == ""
        assert q2.completed() == filled.value and q1.completed() == drained.value
        assert out.host is not None
        assert bytes(view(out.host, 4096)) == bytes(4096)  # it ran before queue 2's
        assert s.faults == []
    finally:
        s.start()
        d.stop()


def test_a_queues_channels_go_back_at_the_stop(ga102: Opened) -> None:
    """Issue 17: "stop gives back every queue's channels": GSP-RM holds none of them after
    the device's stop, and the GPU opens again."""
    d = ga102.open()
    q = d.queue()
    handles = {q.compute.handle, q.copy_channel.handle}
    assert handles <= set(ga102.sim_rm.channels)
    d.stop()
    assert handles.isdisjoint(ga102.sim_rm.channels)
    again = ga102.open()
    again.stop()


def test_a_queue_uploads_and_downloads_through_staging_of_its_own(ga102: Opened) -> None:
    """Issue 17: "A queue has every submission the device has (... upload, download)": fresh
    random bytes up into Device memory and back on a queue's copy channel, byte-exact, beside
    the device's own upload of other bytes."""
    d = ga102.open()
    try:
        q = d.queue()
        mine, theirs = os.urandom(0x5000), os.urandom(0x3000)
        a, b = d.alloc(len(mine), Memory.DEVICE), d.alloc(len(theirs), Memory.DEVICE)
        assert a is not None and b is not None
        p = q.upload(a, mine)
        d.upload(b, theirs)
        assert p.device is q
        p.wait(timeout_s=5.0)
        assert bytes(q.download(a)) == mine and bytes(d.download(b)) == theirs
    finally:
        d.stop()


def test_a_stopped_queues_memory_goes_back_to_gsp_rm(ga102: Opened) -> None:
    """Queue.stop: "Give back the queue's channels and memory": after queues made, used and
    stopped, the simulated GSP-RM holds the memory objects (video and system memory), GPU
    mappings and channels it held before; a stopped queue's point still reads."""
    d = ga102.open()
    s = ga102.sim_rm
    try:
        a = d.alloc(0x5000, Memory.DEVICE)
        assert a is not None
        d.synchronize()
        before = (dict(s.fbmem), dict(s.sysmem), dict(s.mappings), set(s.channels))
        for _ in range(3):
            q = d.queue()
            p = q.upload(a, os.urandom(a.length))
            assert set(s.fbmem) != before[0] and set(s.sysmem) != set(before[1])
            q.stop()
            assert (dict(s.fbmem), dict(s.sysmem), dict(s.mappings), set(s.channels)) == before
            assert p.signaled
    finally:
        d.stop()
