"""Where a queue's channels go, and how launches release their values (issue 17, "Queues": "its
own channels (compute and copy, placed where the GPU runs them beside the device's others)";
"work of different queues runs concurrently unless ordered"), on the stand-in path.

On the H200 (docs/queues.md) a queue's compute channel in a group of its own was time-sliced
against the device's, and a spinning kernel's group never gave the GPU up (Xid 109). In the
device's group, with a subcontext of its own, the channel runs beside the device's; but the
release after a launch waits for idle, and while it waits no other channel of the group is
served. A launch released by its QMD (rig_nv.setup.RELEASE_BY_QMD) does not wait; a launch
behind it on the same channel then waits for its value on the GPU (rig_nv.setup.ORDER). The
device's own launches release so from open.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_device_cpu import (
    FOUR_WORDS_64,
    TWO_WORDS_64,
    commands,
    methods,
    qmd_of,
    release,
    stamp,
)
from test_engines import (
    HOPPER_CHANNEL_GPFIFO_A,
    KEPLER_CHANNEL_GROUP_A,
    Recording,
    allocs,
    made,
)
from test_engines import NVA06C_CTRL_CMD_GPFIFO_SCHEDULE as GROUP_SCHEDULE
from test_queues_cpu import semaphores

from rig_nv import push, qmd, setup
from rig_nv.hostmem import view
from rig_nv.launch import SLOTS
from rig_nv.push import SUBC_HOST

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"
FERMI_CONTEXT_SHARE_A = 0x9067  # cl9067.h
CHANNEL_SCHEDULE = 0xA06F0103  # NVA06F_CTRL_CMD_GPFIFO_SCHEDULE (ctrla06fgpfifo.h)
H_CONTEXT_SHARE = 24  # NV_CHANNEL_ALLOC_PARAMS.hContextShare (alloc_channel.h)


def executes(words: list[int]) -> list[int]:
    """The SEM_EXECUTE word of each semaphore method in ``words``."""
    return [d_[4] for _, m, d_ in methods(words) if m == push.SEM_ADDR_LO and len(d_) == 5]


def vadd(d: Any) -> tuple[Any, tuple[Any, ...]]:
    img = d.load(CUBIN.read_bytes())
    a = d.alloc(1 << 16)
    return img["vadd"], (a, a, a, 1)


# ---- where the channels go ------------------------------------------------------------


def test_a_queues_compute_channel_joins_the_devices_group_with_a_subcontext_of_its_own() -> None:
    """Its channel is made in the device's graphics group, naming a context share of its own
    (so a VEID of its own), and is scheduled by itself: the group is not scheduled again. Its
    copy channel has a group of its own on the copy engine. Its stop frees its channel and
    context share, never the device's group, and the device launches on."""
    with made() as (d, path):
        q = d.queue()
        groups = [h for _, h, _ in allocs(path, KEPLER_CHANNEL_GROUP_A)]
        assert groups == [d.objects.tsg, d.objects.copy_tsg, q.objects.copy_tsg]
        shares = allocs(path, FERMI_CONTEXT_SHARE_A)
        assert [parent for parent, _, _ in shares] == [d.objects.tsg, d.objects.tsg]
        ours = shares[1][1]
        assert ours in q.objects.handles and ours not in d.objects.handles
        (parent, _, params), = [c for c in allocs(path, HOPPER_CHANNEL_GPFIFO_A)
                                if c[1] == q.compute.handle]
        assert parent == d.objects.tsg
        assert struct.unpack_from("<I", params, H_CONTEXT_SHARE)[0] == ours
        assert [o for o, c in path.sent if c == CHANNEL_SCHEDULE] == [q.compute.handle]
        assert [o for o, c in path.sent if c == GROUP_SCHEDULE] == [
            d.objects.tsg, d.objects.copy_tsg, q.objects.copy_tsg]
        q.stop()
        assert {q.compute.handle, ours} <= set(path.freed)
        assert d.objects.tsg not in path.freed
        fn, args = vadd(d)
        d.launch(fn, (1,), (32,), args).wait()


def test_with_queue_group_own_a_queue_has_a_graphics_group_of_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "QUEUE_GROUP", "own")
    with made() as (d, path):
        q = d.queue()
        assert q.objects.tsg not in (0, d.objects.tsg)
        assert q.objects.tsg in q.objects.handles
        (parent, _, _), = [c for c in allocs(path, HOPPER_CHANNEL_GPFIFO_A)
                           if c[1] == q.compute.handle]
        assert parent == q.objects.tsg
        assert q.objects.tsg in [o for o, c in path.sent if c == GROUP_SCHEDULE]
        assert not [o for o, c in path.sent if c == CHANNEL_SCHEDULE]


def test_without_a_copy_engine_both_channels_of_a_queue_join_the_devices_group(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "COPY_ENGINE", "grce")
    with made() as (d, path):
        q = d.queue()
        mine = {q.compute.handle, q.copy_channel.handle}
        assert {h for p, h, _ in allocs(path, HOPPER_CHANNEL_GPFIFO_A)
                if p == d.objects.tsg} >= mine
        assert sorted(o for o, c in path.sent if c == CHANNEL_SCHEDULE) == sorted(mine)
        assert [o for o, c in path.sent if c == GROUP_SCHEDULE] == [d.objects.tsg]


# ---- launches released by their QMD ---------------------------------------------------


@contextmanager
def by_qmd(monkeypatch: pytest.MonkeyPatch, order: str | None = None) -> Iterator[Any]:
    """A device with a queue, launches released by their QMD, ``order`` between them (the
    shipped rig_nv.setup.ORDER when None)."""
    if order is not None:
        monkeypatch.setattr(setup, "ORDER", order)
    with made(Recording()) as (d, path):
        d.queue()
        path.complete()
        yield d, path


def channel_release(d: Any, p: Any) -> bool:
    """Whether the device's last compute entry ends with the channel's release of ``p``
    after a wait for idle (and its QMD releases nothing)."""
    words = commands(d, d.compute)[-1]
    return (semaphores(words)[-1] == (d.timeline.gpu, p.value, push.SEM_OP_RELEASE)
            and bool(words[-1] & push.SEM_RELEASE_WFI) and release(qmd_of(words))[0] == 0)


def test_a_device_releases_by_qmd_from_its_first_launch() -> None:
    """The device's own launches release by their QMD from open, queue or none: on the H200
    that took launch+wait from 7.0 to 6.5 us (docs/results/pcas-2026-12-04.txt). Both the
    first launch (the arena) and later ones (a slot) do; a queue changes nothing."""
    assert setup.RELEASE_BY_QMD
    with made() as (d, _path):
        assert d.timeline.qmd_release is not None
        fn, args = vadd(d)
        for n in range(3):
            if n == 2:
                d.queue()
            p = d.launch(fn, (1,), (32,), args)
            words = commands(d, d.compute)[-1]
            assert release(qmd_of(words)) == (TWO_WORDS_64, d.timeline.gpu, p.value)
            assert not [s for s in semaphores(words) if s[2] == push.SEM_OP_RELEASE]


def test_with_release_by_qmd_off_queues_keep_the_channels_release(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "RELEASE_BY_QMD", False)
    with made() as (d, path):
        q = d.queue()
        path.complete()
        fn, args = vadd(d)
        assert channel_release(d, d.launch(fn, (1,), (32,), args))
        assert q.timeline.qmd_release is None


@pytest.mark.parametrize("queue", [False, True])
def test_a_launch_released_by_its_qmd_names_its_word_and_value(
        monkeypatch: pytest.MonkeyPatch, queue: bool) -> None:
    """The QMD releases the value (64 bits, TWO_WORDS with PAYLOAD64B: the H200's answer in
    scripts/queue_probe.py) at the word of the launch's own timeline; the channel releases
    nothing after it. Both the first launch (the arena) and later ones (a slot) do, and a
    value above 2**32 lands whole."""
    with by_qmd(monkeypatch) as (d, path):
        on = d.queue() if queue else d
        t = on.timeline
        fn, args = vadd(d)
        for n in range(3):
            if n == 2:
                t.next = (1 << 32) + 7
            p = on.launch(fn, (1,), (32,), args)
            words = commands(d, on.compute)[-1]
            assert release(qmd_of(words)) == (TWO_WORDS_64, t.gpu, p.value)
            assert all(op != push.SEM_OP_RELEASE for _, _, op in semaphores(words))
            path.complete()


def test_a_launch_behind_an_unfinished_one_acquires_its_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Grids of one channel run at once unless told: a launch the host has not seen the one
    before finish waits for its value on the GPU; one after finished work waits for none."""
    with by_qmd(monkeypatch) as (d, path):
        fn, args = vadd(d)
        first = d.launch(fn, (1,), (32,), args)
        path.complete()
        d.launch(fn, (1,), (32,), args)
        assert semaphores(commands(d, d.compute)[-1]) == []
        second = d.timeline.next - 1
        assert first.value < second
        third = d.launch(fn, (1,), (32,), args)
        (acquire,) = semaphores(commands(d, d.compute)[-1])
        assert acquire == (d.timeline.gpu, third.value - 1, push.SEM_OP_ACQ_CIRC_GEQ)
        # the group stays on: the wait is for the channel's own grid (issue 23)
        assert not commands(d, d.compute)[-1][5] & push.SEM_ACQUIRE_SWITCH_TSG


@pytest.mark.parametrize("order", ["acquire", "acquire-stay", "wfi"])
def test_the_order_words_are_those_setup_order_names(
        monkeypatch: pytest.MonkeyPatch, order: str) -> None:
    with by_qmd(monkeypatch, order) as (d, _path):
        fn, args = vadd(d)
        d.launch(fn, (1,), (32,), args)
        d.launch(fn, (1,), (32,), args)
        words = commands(d, d.compute)[-1]
        if order == "wfi":
            assert methods(words)[0][:2] == (SUBC_HOST, push.WFI) and not semaphores(words)
        else:
            assert semaphores(words)[0][2] == push.SEM_OP_ACQ_CIRC_GEQ
            assert bool(words[5] & push.SEM_ACQUIRE_SWITCH_TSG) == (order == "acquire")


def test_a_step_behind_unfinished_work_acquires_it_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's grids could overlap a launch before it: behind work not seen done, its
    commands go through the pushbuffer behind an acquire of the work's value; behind done
    work, as the entry that names them where they lie."""
    with by_qmd(monkeypatch) as (d, path):
        fn, args = vadd(d)
        s = d.step()
        s.launch(fn, (1,), (32,), args)
        s.submit()
        path.complete()
        s.submit()
        assert commands(d, d.compute)[-1] == list(s.commands)
        d.launch(fn, (1,), (32,), args)
        p = s.submit()
        words = commands(d, d.compute)[-1]
        assert semaphores(words)[0] == (d.timeline.gpu, p.value - 1, push.SEM_OP_ACQ_CIRC_GEQ)
        assert words[len(words) - len(s.commands):] == list(s.commands)


def test_work_behind_a_marked_step_acquires_nothing_the_step_waits_for_its_grid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A marked step's entry ends only once its last grid released its marker, so work behind
    it on its channel cannot overlap it, done or not: a step submitted again goes as the entry
    that names its commands where they lie, a launch goes with no acquire. Behind that
    launch, not seen done, a step and a launch acquire its value again."""
    with by_qmd(monkeypatch) as (d, path):
        fn, args = vadd(d)
        for _ in range(2):  # the configuration prepared, its slots made: the inline path next
            d.launch(fn, (1,), (32,), args)
        s = d.step()
        s.launch(fn, (1,), (32,), args)
        path.complete()
        s.submit()
        put = d.compute.put
        s.submit()  # the one before not seen done
        s.submit()
        assert [int(d.compute.entries[i % d.compute.count]) for i in (put, put + 1)] == \
            [s.entry, s.entry]
        assert d.compute.put == put + 2
        d.launch(fn, (1,), (32,), args)
        assert semaphores(commands(d, d.compute)[-1]) == []
        p = s.submit()
        words = commands(d, d.compute)[-1]
        assert semaphores(words)[0] == (d.timeline.gpu, p.value - 1, push.SEM_OP_ACQ_CIRC_GEQ)
        d.launch(fn, (1,), (32,), args)
        launched = d.launch(fn, (1,), (32,), args)
        (acquire,) = semaphores(commands(d, d.compute)[-1])
        assert acquire == (d.timeline.gpu, launched.value - 1, push.SEM_OP_ACQ_CIRC_GEQ)
        s.submit(times=3)  # behind the launch, then two repetitions as runs
        d.launch(fn, (1,), (32,), args)
        assert semaphores(commands(d, d.compute)[-1]) == []
        path.complete()
        s.submit(times=3)  # behind done work: runs alone
        d.launch(fn, (1,), (32,), args)
        assert semaphores(commands(d, d.compute)[-1]) == []
        path.complete()
        d.timeline.code_loaded()  # as a load does: the step's next entry invalidates first
        s.submit()
        assert int(d.compute.entries[(d.compute.put - 1) % d.compute.count]) == s.fresh_entry
        d.launch(fn, (1,), (32,), args)
        assert semaphores(commands(d, d.compute)[-1]) == []


def test_a_profiled_launch_is_stamped_by_its_qmd_and_waits_for_no_idle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17: a queue has "every submission the device has (... profiles)", and work of
    different queues runs concurrently: a profile's wait for idle would hold every queue of
    the group. Its launch's start stamp waits for no idle and its end is the QMD's second
    release (FOUR_WORDS: the time at the slot + 8); launches after the profile, from the same
    slots again, stamp nothing."""
    with by_qmd(monkeypatch) as (d, path):
        q = d.queue()
        path.complete()
        fn, args = vadd(d)
        q.launch(fn, (1,), (32,), args)
        with q.profile() as pr:
            p = q.launch(fn, (1,), (32,), args)
        words = commands(d, q.compute)[-1]
        start, end = pr.memory.gpu, pr.memory.gpu + 16
        releases = [s for s in semaphores(words) if s[2] == push.SEM_OP_RELEASE]
        assert releases == [(start, 0, push.SEM_OP_RELEASE)]
        (op,) = [op for op in executes(words) if op & 7 == push.SEM_OP_RELEASE]
        assert op & push.SEM_RELEASE_TIMESTAMP and not op & push.SEM_RELEASE_WFI
        assert release(qmd_of(words)) == (TWO_WORDS_64, q.timeline.gpu, p.value)
        assert stamp(qmd_of(words)) == (FOUR_WORDS_64, end)
        for _ in range(SLOTS + 1):
            path.complete()
            q.launch(fn, (1,), (32,), args)
            assert stamp(qmd_of(commands(d, q.compute)[-1]))[0] == 0
        pr.free()


def test_a_queues_step_that_ends_with_a_launch_waits_for_it_by_an_acquire(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17: a step's end waited for idle, which holds every queue's channel of the
    group until the step's last grid is done. A queue's step that ends with a launch clears
    a marker of its own as the channel reaches it, its last QMD releases 1 there, and the
    timeline's reduction follows an acquire of it: no wait for idle anywhere, and the same
    words every submission. Under a profile its stamps wait for no idle either."""
    with by_qmd(monkeypatch) as (d, path):
        q = d.queue()
        path.complete()
        fn, args = vadd(d)
        s = q.step()
        s.launch(fn, (1,), (32,), args)
        s.launch(fn, (2,), (32,), args)
        s.submit()
        cmds = list(s.commands)
        assert s.marked
        assert s.memory is not None
        marker = s.memory.gpu + s.marker
        sems = semaphores(cmds)
        assert sems[0] == (marker, 0, push.SEM_OP_RELEASE)
        assert sems[-2] == (marker, 1, push.SEM_OP_ACQ_CIRC_GEQ)
        assert not executes(cmds)[-2] & push.SEM_ACQUIRE_SWITCH_TSG  # the group stays on
        assert sems[-1][:2] == (q.timeline.gpu, 1)
        assert not any(op & push.SEM_RELEASE_WFI for op in executes(cmds))
        assert not [m for _, m, _ in methods(cmds) if m == push.WFI]
        assert release(view(s.memory.host or 0, 384)) == (0, 0, 0)  # the first QMD's
        last = s.items[-1].at
        assert release(view((s.memory.host or 0) + last, 384)) == (TWO_WORDS_64, marker, 1)
        path.complete()
        s.submit()
        assert list(s.commands) == cmds
        with q.profile():
            path.complete()
            s.submit()
        words = commands(d, q.compute)[-1]
        stamps = [op for op in executes(words) if op & push.SEM_RELEASE_TIMESTAMP]
        assert len(stamps) == 2 and not any(op & push.SEM_RELEASE_WFI for op in stamps)


def test_a_step_that_ends_with_a_copy_waits_for_idle_and_one_that_ends_with_a_launch_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23 (row 3): a step that ends with a launch is marked on a device without queues
    too, and its marker's acquire stays on the group: a switch away and back made a step 8.2
    us on the H200, against 1.9 without and 2.4 after a wait for idle. A copy's end is no
    QMD's: such a step keeps the reduction after a wait for idle."""
    with made() as (d, path):
        fn, args = vadd(d)
        s = d.step()
        s.launch(fn, (1,), (32,), args)
        s.submit()
        assert s.marked
        ops = executes(list(s.commands))
        assert not any(op & push.SEM_RELEASE_WFI for op in ops)
        (acquire,) = [op for op in ops if op & 7 == push.SEM_OP_ACQ_CIRC_GEQ]
        assert not acquire & push.SEM_ACQUIRE_SWITCH_TSG
        q = d.queue()
        path.complete()
        a = d.alloc(4096)
        c = q.step()
        c.launch(fn, (1,), (32,), args)
        c.copy(a, a, 16, dst_offset=64)
        c.submit()
        assert not c.marked and executes(list(c.commands))[-1] & push.SEM_RELEASE_WFI


def test_a_qmd_release_is_not_used_where_the_path_wakes_on_the_interrupt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The QMD's release raises no non-stall interrupt: a path whose sleep waits for one keeps
    the channel's release."""
    path = Recording()
    path.wakes_on_interrupt = True
    with made(path) as (d, _):
        q = d.queue()
        path.complete()
        assert d.timeline.qmd_release is None and q.timeline.qmd_release is None
        fn, args = vadd(d)
        p = d.launch(fn, (1,), (32,), args)
        assert (d.timeline.gpu, p.value, push.SEM_OP_RELEASE) in semaphores(
            commands(d, d.compute)[-1])


def test_only_a_layout_measured_releases_by_qmd() -> None:
    assert qmd.LAYOUTS[4].release is not None
    assert qmd.LAYOUTS[3].release is None and qmd.LAYOUTS[5].release is None
