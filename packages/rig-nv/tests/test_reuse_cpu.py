"""The reuse cache of freed Device memory on the stand-in path (issue 23, row 6: a pool of any
size, within a limit the user sets; issue 17: reuse only once every queue passed the free).
The GPU's progress is the timeline words, which the tests write as the GPU would."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from rig_edge import Memory, Misuse, Region

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"
SIZES = [64 << 10, 64 << 20, 1 << 30]  # bench row 6's


@pytest.fixture
def loaded(dev: tuple[Any, Any]) -> tuple[Any, Any, Any]:
    """(device, path, image), everything so far done."""
    d, path = dev
    img = d.load(CUBIN.read_bytes())
    path.complete()
    return d, path, img


def freed_to_path(monkeypatch: Any, path: Any) -> list[int]:
    """The GPU addresses the device gives back to the path, in order."""
    seen: list[int] = []
    free = path.free_memory

    def recorded(a: Any) -> None:
        seen.append(a.gpu)
        free(a)

    monkeypatch.setattr(path, "free_memory", recorded)
    return seen


@pytest.mark.parametrize("size", SIZES, ids=["64k", "64m", "1g"])
def test_a_block_freed_while_a_kernel_may_read_it_waits_for_the_kernel(
        loaded: tuple[Any, Any, Any], size: int) -> None:
    """Issue 17: "a region freed while any queue's work may still use it is not handed out
    again (by the reuse cache ...) until every queue has passed the values that were current
    at the free", at every size the cache now keeps. A kernel reads the block; the free comes
    before it ends; the next allocation of that size gets other memory until the timeline
    word reaches the kernel's value, then the block."""
    d, _path, img = loaded
    region = d.alloc(size)
    p = d.launch(img["vadd"], (4,), (256,), (region, region, region, 1))
    d.free(region)
    d.timeline.word[0] = p.value - 1
    other = d.alloc(size)
    assert other is not None and other.gpu != region.gpu
    d.timeline.word[0] = p.value
    again = d.alloc(size)
    assert again is not None and again.gpu == region.gpu


@pytest.mark.parametrize("reader", ["queue", "device"])
def test_with_two_queues_a_block_waits_for_the_one_whose_kernel_reads_it(
        loaded: tuple[Any, Any, Any], reader: str) -> None:
    """Issue 17, "every queue": a second queue exists; the kernel reading the block runs on
    it (the device's own queue idle) or on the device's queue (the second idle). Its reuse
    waits for that queue's word."""
    d, path, img = loaded
    q = d.queue()
    path.complete()
    on = q if reader == "queue" else d
    word = q.timeline.word if reader == "queue" else d.timeline.word
    region = d.alloc(64 << 10)
    p = on.launch(img["vadd"], (4,), (256,), (region, region, region, 1))
    d.free(region)
    word[0] = p.value - 1
    other = d.alloc(64 << 10)
    assert other is not None and other.gpu != region.gpu
    word[0] = p.value
    again = d.alloc(64 << 10)
    assert again is not None and again.gpu == region.gpu


def test_blocks_of_a_size_leave_oldest_first_each_when_its_work_is_done(
        loaded: tuple[Any, Any, Any]) -> None:
    """Two blocks of one size, freed behind two kernels: the first comes back once the first
    kernel is done, the second not before the second is."""
    d, _path, img = loaded
    a, b = d.alloc(1 << 20), d.alloc(1 << 20)
    pa = d.launch(img["vadd"], (4,), (256,), (a, a, a, 1))
    d.free(a)
    pb = d.launch(img["vadd"], (4,), (256,), (b, b, b, 1))
    d.free(b)
    d.timeline.word[0] = pa.value
    first, second = d.alloc(1 << 20), d.alloc(1 << 20)
    assert first is not None and second is not None
    assert first.gpu == a.gpu and second.gpu not in (a.gpu, b.gpu)
    d.timeline.word[0] = pb.value
    third = d.alloc(1 << 20)
    assert third is not None and third.gpu == b.gpu


def test_an_idle_gpu_hands_a_freed_block_out_at_once_at_its_new_length(
        loaded: tuple[Any, Any, Any]) -> None:
    """Row 6's case: nothing in flight, a freed block is the next allocation of its size in
    whole pages, whatever its length in bytes; the region has the length asked for."""
    d, _path, _img = loaded
    region = d.alloc(64 << 10)
    d.free(region)
    again = d.alloc((64 << 10) - 100)
    assert again is not None
    assert (again.gpu, again.length, again.kind) == (region.gpu, (64 << 10) - 100, Memory.DEVICE)
    d.free(again)
    same = d.alloc(64 << 10)
    assert same == region


def test_a_gigabyte_block_is_kept_and_the_limit_gives_it_back(
        loaded: tuple[Any, Any, Any], monkeypatch: Any) -> None:
    """Issue 23: big blocks are kept too, within a limit the user sets. Lowering
    ``cache_limit`` below what is kept gives it back to the path; a limit of 0 keeps nothing;
    ``trim`` still gives all back."""
    d, path, _img = loaded
    seen = freed_to_path(monkeypatch, path)
    big = d.alloc(1 << 30)
    d.free(big)
    assert seen == [] and [a.gpu for a in d.memory.kept()] == [big.gpu]
    d.cache_limit = 1 << 30
    assert seen == []  # within it
    d.cache_limit = (1 << 30) - 1
    assert seen == [big.gpu] and d.memory.kept() == []
    small = d.alloc(64 << 10)
    d.free(small)
    assert seen == [big.gpu]  # 64 KiB fits
    d.trim()
    assert seen == [big.gpu, small.gpu] and d.memory.kept() == []
    d.cache_limit = 0
    one = d.alloc(4096)
    d.free(one)
    assert seen[-1] == one.gpu and d.memory.kept() == []


@pytest.mark.parametrize("size", SIZES, ids=["64k", "64m", "1g"])
def test_round_trips_through_the_cache_leave_its_limit_whole(
        loaded: tuple[Any, Any, Any], monkeypatch: Any, size: int) -> None:
    """Issue 23, row 6: the cache keeps up to ``cache_limit`` bytes, however often a block
    went round (each reuse gives back the room its free took). With room for exactly two
    blocks, one block taken and freed again 50 times, then two blocks at once: both are kept,
    and a third goes to the path."""
    d, path, _img = loaded
    seen = freed_to_path(monkeypatch, path)
    d.cache_limit = 2 * size
    first = d.alloc(size)
    for _ in range(50):
        d.free(first)
        again = d.alloc(size)
        assert again is not None and again.gpu == first.gpu
        first = again
    second, third = d.alloc(size), d.alloc(size)
    d.free(first)
    d.free(second)
    assert seen == [] and sorted(a.gpu for a in d.memory.kept()) == sorted(
        [first.gpu, second.gpu])
    d.free(third)
    assert seen == [third.gpu]


def test_the_limit_starts_at_a_quarter_of_the_budget_and_refuses_bad_values(
        loaded: tuple[Any, Any, Any]) -> None:
    """``cache_limit`` is a quarter of ``facts.budget`` from the open; anything but a whole
    number of bytes, 0 or more, is Misuse naming the limit, having changed nothing."""
    d, _path, _img = loaded
    assert d.cache_limit == d.facts.budget // 4
    for bad in (-1, 1.5, "1"):
        with pytest.raises(Misuse, match="limit"):
            d.cache_limit = bad
    assert d.cache_limit == d.facts.budget // 4


def test_free_knows_a_region_by_all_its_fields_not_its_address_alone(
        loaded: tuple[Any, Any, Any]) -> None:
    """The live regions are found by GPU address; free still takes only a region alloc
    made (DESIGN's error policy: Misuse, having changed nothing): a shorter region at the
    same address is refused and the live one stays; an equal copy of it frees it."""
    d, _path, _img = loaded
    region = d.alloc(64 << 10)
    with pytest.raises(Misuse, match="not a live region"):
        d.free(Region(region.gpu, None, 4096, Memory.DEVICE))
    assert d.memory.holds(region) and not d.memory.holds(Region(region.gpu, None, 4096,
                                                                 Memory.DEVICE))
    d.free(Region(region.gpu, region.host, region.length, region.kind))
    assert not d.memory.holds(region)
    with pytest.raises(Misuse, match="not a live region"):
        d.free(region)


def test_threads_sharing_the_cache_never_get_one_block_twice(
        loaded: tuple[Any, Any, Any]) -> None:
    """Device: "Any thread may call any method at the same time as others": eight threads
    allocating and freeing blocks of two sizes (cache hits, mostly), up to five each, never
    hold one block at once, and the cache keeps each block once at the end."""
    d, _path, _img = loaded
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter lets them
    held: set[int] = set()
    book = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def work() -> None:
        try:
            start.wait()
            mine: list[Any] = []  # each thread holds up to four blocks at a time
            for i in range(1500):
                r = d.alloc((64 << 10) if i % 3 else (2 << 20))
                with book:
                    assert r.gpu not in held
                    held.add(r.gpu)
                mine.append(r)
                if len(mine) > 4:
                    old = mine.pop(0)
                    with book:
                        held.discard(old.gpu)
                    d.free(old)
            for r in mine:
                with book:
                    held.discard(r.gpu)
                d.free(r)
        except BaseException as e:  # reported by the test's thread
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(old)
    assert not errors, errors[0]
    kept = d.memory.kept()
    assert len({a.gpu for a in kept}) == len(kept)  # each block once
    for size in (64 << 10, 2 << 20):  # no more blocks of a size than were ever held at once
        assert 1 <= sum(a.length == size for a in kept) <= 8 * 5

