"""Steps on the stand-in path (fake_gpu.py): how many GPFIFO entries each submission takes, what
the entry names, and that no submission changes bytes an earlier one may still be reading."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from fake_gpu import entry_words

from rig_edge import Memory, Misuse, RigError
from rig_nv import push, setup
from rig_nv import step as step_module
from rig_nv import timeline as timeline_module
from rig_nv.hostmem import view

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"
ACQUIRE = push.SEM_OP_ACQ_CIRC_GEQ | push.SEM_PAYLOAD_64BIT | push.SEM_ACQUIRE_SWITCH_TSG
STAMP = push.SEM_OP_RELEASE | push.SEM_RELEASE_WFI | push.SEM_PAYLOAD_64BIT \
    | push.SEM_RELEASE_TIMESTAMP


def _entry(channel: Any, i: int) -> tuple[int, list[int]]:
    """(GPU address, words) of the channel's GPFIFO entry ``i`` (counted from its first)."""
    entry = int(channel.entries[i % channel.count])
    return entry & 0xFF_FFFF_FFFC, entry_words(entry)


def _submit(d: Any, step: Any) -> tuple[Any, int, list[int]]:
    """Submit ``step`` and check that it took one GPFIFO entry, on the compute channel; returns
    its point and that entry's address and words."""
    puts = d.compute.put, d.copy_channel.put
    point = step.submit()
    assert (d.compute.put - puts[0], d.copy_channel.put - puts[1]) == (1, 0)
    return (point, *_entry(d.compute, d.compute.put - 1))


def _acquire(d: Any, value: int) -> list[int]:
    return [push.header(push.SUBC_HOST, push.SEM_ADDR_LO, 5), *push.lo_hi(d.timeline.gpu),
            *push.lo_hi(value), ACQUIRE]


def _stamp(address: int, idle: bool = True) -> list[int]:
    op = STAMP if idle else STAMP & ~push.SEM_RELEASE_WFI
    return [push.header(push.SUBC_HOST, push.SEM_ADDR_LO, 5), *push.lo_hi(address), 0, 0, op]


# The invalidate of the SMs' caches that a submission after new code puts first.
INVALIDATE = [push.header(push.SUBC_COMPUTE, push.COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI, 1),
              setup.INVALIDATE_CODE_AND_DATA]
assert tuple(INVALIDATE) == timeline_module.INVALIDATE


def _in_pushbuffer(d: Any, address: int) -> bool:
    return d.compute.pb.gpu <= address < d.compute.pb.gpu + d.compute.pb.length


def _step(d: Any, img: Any, a: Any, b: Any) -> Any:
    s = d.step()
    s.launch(img["vadd"], (2,), (64,), (a, b, a, 128))
    s.launch(img["saxpy"], (2,), (64,), (1.5, a, b, 128))
    s.copy(b, a, 1024)
    s.launch(img["vadd"], (1,), (32,), (b, b, b, 32))
    return s


def test_a_step_after_new_code_invalidates_the_sms_caches_first_once(
        dev: tuple[Any, Any]) -> None:
    """Issue 23 (row 3): a step's commands hold no invalidate of the SMs' caches (0.18 us a
    step on the H200; each QMD invalidates the data and constant caches itself). New code
    loaded since the timeline's last invalidate must not meet old bytes in the instruction
    cache: the next submission, of a step or a launch, invalidates first, and only it."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    a = d.alloc(1 << 16, Memory.DEVICE)
    s = d.step()
    s.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    d.launch(img["vadd"], (1,), (32,), (a, a, a, 1))  # takes the load's invalidate
    path.complete()
    _, address, words = _submit(d, s)
    assert (address, words) == (s.address, list(s.commands))
    assert INVALIDATE[0] not in words  # the step's own commands invalidate nothing
    d.load(CUBIN.read_bytes())  # new code: an upload on the copy channel
    path.complete()
    d.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    path.complete()
    _, address, words = _submit(d, s)  # a launch took the invalidate: the step needs none
    assert (address, words) == (s.address, list(s.commands))
    d.load(CUBIN.read_bytes())
    d.copy(a, a, 64, dst_offset=4096, engine="copy")
    s.submit()  # after the copy channel, not seen done: its acquire, the invalidate, in the
    _, words = _entry(d.compute, d.compute.put - 1)  # pushbuffer
    assert words[:6] == _acquire(d, d.timeline.next - 2)
    assert words[6:8] == INVALIDATE and words[8:] == list(s.commands)
    d.load(CUBIN.read_bytes())
    d.synchronize()
    _, address, words = _submit(d, s)  # seen done: the entry, from the invalidate before it
    assert (address, words) == (s.address - 4 * len(INVALIDATE), INVALIDATE + list(s.commands))
    path.complete()
    _, address, words = _submit(d, s)
    assert (address, words) == (s.address, list(s.commands))
    # New code after compute work (as the timeline is told of it): the entry names the
    # step's commands from the invalidate that lies before them, once; with times= the
    # other repetitions go as a run, with no invalidate.
    d.timeline.code_loaded()
    put = d.compute.put
    s.submit(times=3)
    assert d.compute.put == put + 2
    address, words = _entry(d.compute, put)
    assert (address, words) == (s.address - 4 * len(INVALIDATE), INVALIDATE + list(s.commands))
    _, words = _entry(d.compute, put + 1)
    assert d.compute.entries[put + 1] == s.runs[1] and INVALIDATE[0] not in words
    path.complete()


def test_a_large_step_after_new_code_is_still_one_entry(
        dev: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A step too large to copy into the pushbuffer (the CPU waits for the work before it,
    then names the step's own memory) after new code: still one entry, from the invalidate
    before its commands; under a profile, the invalidate first in the stamped copy."""
    monkeypatch.setattr(timeline_module, "PUSHBUFFER_SHARE", 1 << 40)
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    a = d.alloc(1 << 16, Memory.DEVICE)
    s = d.step()
    s.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    path.complete()
    _, address, words = _submit(d, s)
    assert (address, words) == (s.address - 4 * len(INVALIDATE), INVALIDATE + list(s.commands))
    path.complete()
    _, address, words = _submit(d, s)
    assert (address, words) == (s.address, list(s.commands))
    d.load(CUBIN.read_bytes())
    path.complete()
    with d.profile(capacity=4) as prof:
        _, address, words = _submit(d, s)
    assert words[:2] == INVALIDATE and words[2:8] == _stamp(prof.memory.gpu, False)
    assert words[8:8 + len(s.commands) - d.timeline.release_words] == \
        list(s.commands)[:-d.timeline.release_words]
    path.complete()


def test_each_step_submission_is_one_gpfifo_entry(dev: tuple[Any, Any]) -> None:
    """Issue 5 ("Steps"): "submit the step many times, each submission one GPFIFO entry" --
    the first submission, after compute work, after another step, after a copy, after an
    upload through the copy channel, under a profile: one entry on the compute channel, none
    on the copy channel. After compute work done or ordered it names the step's own commands;
    after the copy channel's work not seen done it holds the acquire of that work's value,
    then the same commands."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    a = d.alloc(1 << 16, Memory.DEVICE)
    b = d.alloc(1 << 16, Memory.PINNED)
    s, other = _step(d, img, a, b), _step(d, img, a, b)
    d.copy(b, a, 64)  # the copy channel last, not seen done
    p, address, words = _submit(d, s)  # the first submission of any step, after a copy
    cmds = list(s.commands)
    # after the copy, new code loaded: its acquire, then the invalidate of the SMs' caches
    assert words == _acquire(d, p.value - 1) + INVALIDATE + cmds and _in_pushbuffer(d, address)
    d.launch(img["vadd"], (4,), (256,), (a, a, b, 1))
    # Seen done: behind a launch its QMD releases, not yet, a step acquires it first
    # (test_queue_groups_cpu.py).
    path.complete()
    for target, before in ((other, "first of another step, after a launch"),
                           (s, "after another step"), (s, "after itself"), (other, "after it")):
        p, address, words = _submit(d, target)
        assert p.value == d.timeline.next - 1, before
        # the entry names the step's commands in its own memory: nothing is copied
        assert (address, len(words)) == (target.address, target.dwords), before
        assert words == list(target.commands), before
    prior = d.launch(img["vadd"], (4,), (256,), (a, a, b, 1))
    path.complete()
    p, address, words = _submit(d, s)
    assert p.value == prior.value + 1 and address == s.address
    prior = d.copy(b, a, 4096)
    p, address, words = _submit(d, s)
    assert p.value == prior.value + 1
    assert words == _acquire(d, prior.value) + cmds and _in_pushbuffer(d, address)
    prior = d.upload(a, bytes(range(256)) * 4)  # Device memory: staged, on the copy channel
    assert d.timeline.last is d.copy_channel
    p, address, words = _submit(d, s)
    assert words == _acquire(d, prior.value) + cmds and p.value == prior.value + 1
    # under a profile: the stamps bracket the commands in the same entry, the end stamp before
    # the release, so the step's point is done only once both stamps are written; a step that
    # ends with a launch waits for its grid by its marker, so its stamps wait for no idle
    assert s.marked
    with d.profile(capacity=4) as prof:
        p, address, words = _submit(d, s)  # after compute
        base = prof.memory.gpu
        release = cmds[-d.timeline.release_words:]  # the reduction (no interrupt: issue 23)
        assert release[0] == push.header(push.SUBC_HOST, push.SEM_ADDR_LO, 5)
        assert release[5] & 7 == step_module.SEM_OP_REDUCTION and len(release) == 6
        assert words == (_stamp(base, False) + cmds[:-len(release)] + _stamp(base + 16, False)
                         + release)
        prior = d.copy(b, a, 64)
        p, address, words = _submit(d, s)
        assert words == (_acquire(d, prior.value) + _stamp(base + 64, False)
                         + cmds[:-len(release)] + _stamp(base + 80, False) + release)
    path.complete()
    assert [(e.name, e.value) for e in prof.events()] == [
        ("step", prior.value - 1), ("copy", prior.value), ("step", p.value)]
    # and many in a row: one entry each
    for _ in range(5):
        _submit(d, s)
    d.copy(b, a, 64)
    for _ in range(5):
        _submit(d, s)


def test_a_step_after_a_copy_acquires_the_copys_value_before_its_commands(
        dev: tuple[Any, Any]) -> None:
    """The entry's first method waits (ACQ_CIRC_GEQ, 64 bits, on the timeline word) for the
    copy's value, before any of the step's commands; the step's commands add one to the
    timeline only after that, so its value follows the copy's."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    b = d.alloc(1 << 16, Memory.PINNED)
    s = _step(d, img, a, b)
    s.submit()
    copied = d.copy(b, a, 4096)
    p, _, words = _submit(d, s)
    first = words[:6]
    h = first[0]
    assert (h >> 13) & 7 == push.SUBC_HOST and (h & 0xFFF) << 2 == push.SEM_ADDR_LO
    assert (h >> 16) & 0x1FFF == 5 and h >> 29 == push.INCREMENTING
    assert first[1] | first[2] << 32 == d.timeline.gpu
    assert first[3] | first[4] << 32 == copied.value
    assert first[5] & 7 == push.SEM_OP_ACQ_CIRC_GEQ and first[5] & push.SEM_PAYLOAD_64BIT
    # the copy itself went alone on the copy channel, as the value before the step's
    _, copy_words = _entry(d.copy_channel, d.copy_channel.put - 1)
    assert copy_words[-3] == copied.value  # its release's payload (low half)
    assert p.value == copied.value + 1
    # a value past 2^32: both halves of the acquire's payload
    d.timeline.next = (5 << 32) + 7
    path.complete()
    copied = d.copy(b, a, 64)
    p, _, words = _submit(d, s)
    assert words[3:5] == [copied.value & 0xFFFFFFFF, copied.value >> 32] == [7, 5]


def test_no_submission_changes_bytes_an_earlier_one_may_still_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU may still read an earlier submission of the same step while the next is sent:
    with small pushbuffers (they wrap many times) and the GPU lagging behind, every entry not
    yet completed still names the words it named when sent, and the step's memory never
    changes."""
    from fake_gpu import open_fake

    monkeypatch.setattr(setup, "PUSHBUFFER", 0x4000)
    monkeypatch.setattr(setup, "GPFIFO_ENTRIES", 64)
    monkeypatch.setattr(setup, "CHANNEL_AREA", 0x1000)
    d, path = open_fake()
    try:
        img = d.load(CUBIN.read_bytes())
        path.complete()
        a = d.alloc(1 << 16, Memory.DEVICE)
        b = d.alloc(1 << 16, Memory.PINNED)
        s = _step(d, img, a, b)
        s.submit()
        memory = s.memory
        sealed = bytes(view(memory.host, memory.length))
        sent: list[tuple[int, int, list[int]]] = []
        for i in range(600):
            if i % 3 == 0:
                d.copy(b, a, 64 + i)
            elif i % 5 == 0:
                d.launch(img["vadd"], (4,), (256,), (a, a, b, i))
            p, address, words = _submit(d, s)
            sent.append((p.value, address, words))
            # the GPU completes all but the last few submissions
            d.timeline.word[0] = max(d.completed(), d.timeline.next - 1 - (i % 7))
            done = d.completed()
            sent = [x for x in sent if x[0] > done]
            for value, address, words in sent:
                assert list(struct.unpack_from(f"<{len(words)}I",
                                               view(address, 4 * len(words)))) == words, value
        assert bytes(view(memory.host, memory.length)) == sealed
        assert d.compute.arena.head < 0x4000 and d.compute.put > 600
    finally:
        path.complete()
        d.stop()


def _giant(d: Any, a: Any, b: Any) -> Any:
    """A step whose commands with an acquire and two stamps fill more than half of a 16 KiB
    pushbuffer (each copy after another: a WFI, an invalidate and the copy, 13 words)."""
    s = d.step()
    for i in range(200):
        s.copy(b, a, 64, dst_offset=64 * i)
    return s


def test_a_step_too_large_to_copy_waits_for_the_work_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose commands would fill more than half the pushbuffer is not copied there:
    after a copy, the CPU waits for the copy's value, then the one entry names the step's own
    commands; under a profile, a copy of them between the stamps in memory of the step's own,
    written only once everything before is done."""
    from fake_gpu import open_fake

    monkeypatch.setattr(setup, "PUSHBUFFER", 0x4000)
    d, path = open_fake()
    try:
        a = d.alloc(1 << 16, Memory.DEVICE)
        b = d.alloc(1 << 16, Memory.PINNED)
        s = _giant(d, a, b)
        path.complete()
        first, address, words = _submit(d, s)  # after make's work on the copy channel
        assert (address, len(words)) == (s.address, s.dwords)
        assert (len(s.commands) + step_module.AROUND) * 4 > 0x4000 // 2
        assert d.completed() == first.value - 1  # it waited for the work before it
        waits: list[int] = []
        wait = d.timeline.wait_value
        monkeypatch.setattr(d.timeline, "wait_value",
                            lambda value, timeout_s=None: (waits.append(value), wait(value)))
        copied = d.copy(b, a, 64)
        p, address, words = _submit(d, s)
        assert waits == [copied.value] and (address, len(words)) == (s.address, s.dwords)
        assert words == list(s.commands) and p.value == copied.value + 1
        p, address, words = _submit(d, s)  # after compute: no wait
        assert waits == [copied.value] and address == s.address
        with d.profile(capacity=4) as prof:
            p, address, words = _submit(d, s)
            base = prof.memory.gpu
            release = list(s.commands[-d.timeline.release_words:])
            assert waits[-1] == p.value - 1 and s.stamped_memory is not None
            assert address == s.stamped_memory.gpu
            assert words == (_stamp(base) + list(s.commands[:-len(release)]) + _stamp(base + 16)
                             + release)
            p, address, words = _submit(d, s)
            assert waits[-1] == p.value - 1 and address == s.stamped_memory.gpu
            assert words[:6] == _stamp(base + 32)
        s.free()
        assert s.stamped_memory is None and s.memory is None
    finally:
        path.complete()
        d.stop()


def test_a_step_more_than_one_entry_holds_is_misuse(dev: tuple[Any, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """One GPFIFO entry names at most 2^21 - 1 words (clc86f.h GP_ENTRY1_LENGTH 30:10): a step
    whose commands (with a wait and two stamps) exceed that is refused at its first submit,
    having taken no memory."""
    d, _ = dev
    a = d.alloc(1 << 16, Memory.DEVICE)
    monkeypatch.setattr(step_module, "ENTRY_MOST", 100)
    s = d.step()
    for _ in range(10):
        s.copy(a, a, 64)
    put = d.compute.put
    with pytest.raises(Misuse, match="more than one GPFIFO entry holds"):
        s.submit()
    assert s.memory is None and d.compute.put == put


def test_a_full_profile_refuses_before_a_timeline_value_is_taken(dev: tuple[Any, Any]) -> None:
    """A step's commands add one to the timeline word: a value taken but never submitted would
    leave every later step one short, its point never done. A full profile refuses a launch, a
    copy and a step (first or later submission) having taken no value."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    b = d.alloc(1 << 16, Memory.PINNED)
    s, fresh = _step(d, img, a, b), _step(d, img, a, b)
    s.submit()
    with d.profile(capacity=1):
        d.launch(img["vadd"], (4,), (256,), (a, a, b, 1))
        taken, puts = d.timeline.next, (d.compute.put, d.copy_channel.put)
        for refused in (lambda: d.launch(img["vadd"], (4,), (256,), (a, a, b, 2)),
                        lambda: d.copy(b, a, 64), s.submit, fresh.submit):
            with pytest.raises(RigError, match="the profile holds 1 events"):
                refused()
            assert d.timeline.next == taken and (d.compute.put, d.copy_channel.put) == puts
    assert s.submit().value == taken and fresh.submit().value == taken + 1
