"""A step's runs on the stand-in path (fake_gpu.py): issue 23, row 3 (a step submitted many
times). A marked step of launches alone goes as runs, each one GPFIFO entry of up to RUN_MOST
repetitions: copies of its QMDs chained into its own. These tests play each entry as the GPU
would, from the entry's words and the QMDs' bits as clcbc0qmd.h (V04_00) places them, not
through rig's own QMD layout: the QMDs it sends and those each schedules on completion, and
every release."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_gpu import entry_words
from test_device_cpu import methods

from rig_edge import Memory
from rig_nv import push
from rig_nv.step import RUN_BYTES, RUN_MOST

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"
QMD_BYTES = 384  # V04_00


@dataclass
class Ran:
    """One QMD as the GPU runs it: its program, its bank 0 and its first release."""

    address: int
    program: int
    bank: int
    release: tuple[str, int, int] | None  # ("add" or "write", address, payload)


def _bits(raw: bytes, hi: int, lo: int) -> int:
    return (int.from_bytes(raw, "little") >> lo) & ((1 << (hi - lo + 1)) - 1)


def _qmd(path: Any, address: int) -> tuple[Ran, int | None]:
    """The QMD at ``address`` and the one it schedules once its grid completes (or None)."""
    raw = path.read(address, QMD_BYTES)
    release = None
    if _bits(raw, 320, 320):  # RELEASE_ENABLE(0)
        assert _bits(raw, 322, 321) == 2 and _bits(raw, 332, 332) == 1  # TWO_WORDS, 64 bits
        adds = _bits(raw, 324, 324) and _bits(raw, 327, 325) == 0  # REDUCTION, RED_ADD
        release = ("add" if adds else "write", _bits(raw, 696, 640), _bits(raw, 767, 704))
    ran = Ran(address, _bits(raw, 1272, 1216), _bits(raw, 1586, 1536) << 6, release)
    if not _bits(raw, 368, 368):  # DEPENDENT_QMD_ENABLE(0)
        return ran, None
    assert _bits(raw, 371, 369) == 1  # ACTION QMD_SCHEDULE
    return ran, _bits(raw, 479, 448) << 8


def _methods(path: Any, entry: int) -> list[tuple[int, list[int]]]:
    """(method, data) of each method header in the words GPFIFO ``entry`` names."""
    return [(method, data) for _, method, data in methods(entry_words(entry, path.read))]


def play(path: Any, entry: int) -> tuple[list[Ran], list[tuple[int, list[int]]]]:
    """The QMDs one entry runs, in order, and its host methods (the semaphores), read
    through the stand-in: a read outside its live memory fails the test."""
    sent_methods = _methods(path, entry)
    sent = [data[0] << 8 for m, data in sent_methods if m == push.COMPUTE_SEND_PCAS_A]
    assert len(sent) == 1
    ran: list[Ran] = []
    at: int | None = sent[0]
    while at is not None:
        one, at = _qmd(path, at)
        ran.append(one)
        assert len(ran) <= 4 * RUN_MOST, "the chain does not end"
    return ran, [(m, data) for m, data in sent_methods if m == push.SEM_ADDR_LO]


def _step(d: Any, path: Any, launches: int = 2) -> tuple[Any, Any]:
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    s = d.step()
    kernels = ["vadd", "saxpy"]  # alternately
    for i in range(launches):
        args = (a, a, a, i + 1) if i % 2 == 0 else (2.0, a, a, i + 1)
        s.launch(img[kernels[i % 2]], (1,), (32,), args)
    return s, img


def _word(sem: list[int]) -> tuple[int, int, int]:
    """(address, payload, SEM_EXECUTE) of a host semaphore method's data."""
    return sem[0] | sem[1] << 32, sem[2] | sem[3] << 32, sem[4]


@pytest.mark.parametrize("launches", [1, 2, 8])
def test_each_run_plays_its_repetitions_in_order_adding_one_each(
        dev: tuple[Any, Any], launches: int) -> None:
    """Each entry of runs[r - 1] runs the step's QMDs r times over, each repetition's programs
    and banks the step's own in order; each repetition but the last adds one to the timeline
    word by its last QMD's release, the last releases the marker the entry then acquires,
    and the entry's own reduction adds the last one: r in all. submit(times=150) goes as
    whole runs and one of the rest, and its points keep their values. Runs hold up to
    RUN_MOST repetitions, fewer where the copies would pass RUN_BYTES (8 launches)."""
    d, path = dev
    s, _ = _step(d, path, launches)
    s.submit()
    path.complete()
    own, _ = play(path, s.entry)
    assert len(own) == launches
    put, value = d.compute.put, d.timeline.current()
    p = s.submit(times=150)
    most = len(s.runs)
    assert s.runs[0] == s.entry and 1 < most <= RUN_MOST
    assert (most - 1) * launches * 512 <= RUN_BYTES < most * launches * 512 or most == RUN_MOST
    whole, rest = divmod(150, most)
    sent = [int(d.compute.entries[i % d.compute.count]) for i in range(put, d.compute.put)]
    assert sent == [s.runs[-1]] * whole + ([s.runs[rest - 1]] if rest else [])
    assert p.value == value + 150
    for r in range(1, most + 1):
        ran, sems = play(path, s.runs[r - 1])
        assert len(ran) == r * launches
        marker = _word(sems[0][1])
        assert marker[1] == 0 and marker[2] & 7 == push.SEM_OP_RELEASE  # cleared first
        acquire, reduction = _word(sems[-2][1]), _word(sems[-1][1])
        assert acquire[:2] == (marker[0], 1) and acquire[2] & 7 == push.SEM_OP_ACQ_CIRC_GEQ
        assert reduction[:2] == (d.timeline.gpu, 1) and (reduction[2] >> 27) & 0xF == 5
        for k in range(r):
            rep = ran[k * launches : (k + 1) * launches]
            assert [(x.program, x.bank) for x in rep] == [(x.program, x.bank) for x in own]
            assert [x.release for x in rep[:-1]] == [None] * (launches - 1)
            last = ("write", marker[0], 1) if k == r - 1 else ("add", d.timeline.gpu, 1)
            assert rep[-1].release == last
        assert ran[-launches:] == own  # the last repetition is the step's own QMDs


def test_set_args_reaches_every_repetition_of_a_run(dev: tuple[Any, Any]) -> None:
    """The copies read the step's own banks: after set_args, every QMD a run sends reads a
    bank that holds the new arguments (fresh ones, at the kernel's parameter offset)."""
    d, path = dev
    s, img = _step(d, path, 1)
    s.submit(times=3)
    path.complete()
    b = d.alloc(1 << 16, Memory.DEVICE)
    count = 0x1234_5678
    s.set_args(0, (b, b, b, count))
    offset = img["vadd"].kernel.param_offset
    ran, _ = play(path, s.runs[-1])
    assert len(ran) == RUN_MOST
    for x in ran:
        got = struct.unpack_from("<QQQI", path.read(x.bank + offset, 28))
        assert got == (b.gpu, b.gpu, b.gpu, count)


def test_only_marked_steps_of_launches_alone_have_runs(dev: tuple[Any, Any]) -> None:
    """A step that ends with a copy, or has one between launches, waits for idle between
    them: no chain of QMDs holds it, so each repetition stays an entry of its own."""
    d, path = dev
    for copy_at in (1, 0):
        s, img = _step(d, path, 1)
        a = d.alloc(1 << 16, Memory.DEVICE)
        s.copy(a, a, 4096, dst_offset=8192)
        if copy_at == 0:
            s.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
        s.submit(times=3)
        assert s.runs == (s.entry,) and s.run_memory is None


def test_runs_fall_back_to_an_entry_each_where_memory_is_short(
        dev: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """No mapped memory for the copies: every repetition goes as the step's own entry, still
    right; a step's free gives the copies' memory back with its own."""
    d, path = dev
    s, _ = _step(d, path, 1)
    s.submit()
    alloc = d.alloc
    monkeypatch.setattr(d, "alloc", lambda *a, **k: None)
    put, value = d.compute.put, d.timeline.current()
    p = s.submit(times=5)
    assert s.runs == (s.entry,) and p.value == value + 5 and d.compute.put == put + 5
    monkeypatch.setattr(d, "alloc", alloc)
    t, _ = _step(d, path, 1)
    t.submit(times=2)
    assert t.run_memory is not None
    in_use = d.path.in_use()
    path.complete()
    t.free()
    assert d.path.in_use() < in_use and t.run_memory is None


def test_a_freed_step_submitted_again_runs_from_its_new_memory(dev: tuple[Any, Any]) -> None:
    """After free, a submission seals the step again and lays its runs again: every run it
    sends starts at a QMD in memory it holds now, none in what free gave back."""
    d, path = dev
    s, _ = _step(d, path, 1)
    s.submit(times=3)
    path.complete()
    s.free()
    s.submit(times=3)
    assert s.memory is not None and s.run_memory is not None
    held = [(m.gpu, m.gpu + m.length) for m in (s.memory, s.run_memory)]
    ran, _ = play(path, int(d.compute.entries[(d.compute.put - 1) % d.compute.count]))
    assert len(ran) == 3 and all(any(lo <= x.address < hi for lo, hi in held) for x in ran)
    path.complete()


def test_runs_beyond_the_rings_room_go_in_ring_sized_batches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """More whole runs than the GPFIFO holds: as many at once as it has room for, the next
    after waiting for room, each entry done at its last repetition's value."""
    from fake_gpu import open_fake

    from rig_nv import setup

    monkeypatch.setattr(setup, "GPFIFO_ENTRIES", 64)
    d, path = open_fake()
    try:
        s, _ = _step(d, path, 1)
        s.submit()
        path.complete()
        put, value = d.compute.put, d.timeline.current()
        p = s.submit(times=100 * RUN_MOST)
        assert p.value == value + 100 * RUN_MOST and d.compute.put == put + 100
        ends = [value + RUN_MOST * (i + 1) for i in range(100)]
        assert list(d.compute.pending) == [e for e in ends if e > d.timeline.completed()]
        path.complete()
        p.wait()
    finally:
        d.stop()
