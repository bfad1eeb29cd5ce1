"""Failure walks, limits, stopping and concurrency on a real GPU (issue 6), each in a fresh
process (walk_child.py) so a bad outcome cannot poison this one.

- The n-th fallible call (ioctl, mmap, open of a driver file; rig_nv.inject) of the process's
  first open fails, for every n, one child each; then of a later open, of stop and of alloc,
  load and launch, in one child; of the stop of a device with queues, and of a queue's, in
  another. After each: the process holds no file and no mapping beyond what it held and what
  the spec keeps for the process (control file and client, UVM's two files and the
  reservation, the GPU's file), the failure escapes only as itself or wrapped
  (OpenRefused for open), and the next open gives a device that runs a kernel correctly.
- Opens at a lowered RLIMIT_NOFILE and RLIMIT_AS are refused with OpenRefused, leak nothing.
- stop() with copies in flight, and exit with an open device, leave the GPU openable.
- 8 threads of checked alloc/upload/launch/wait/download/free for RIG_STRESS_S seconds
  (default 10; the issue's number is 60), then 6 threads racing to open: one holds it at a time.
- SIGINT during a long wait loses no timeline value.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu
CHILD = Path(__file__).resolve().parent / "walk_child.py"
STRESS_S = float(os.environ.get("RIG_STRESS_S", "10"))


def child(*args: str, timeout: float = 300) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(CHILD), *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (
        f"{args}: exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    values: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    return values


NO_LEAK = {"fds": [], "maps": []}


# -- (a) failure walks -------------------------------------------------------------------------

@functools.cache
def first_open_calls() -> list[str]:
    calls: list[str] = child("count")["first"]
    return calls


def test_first_open_walk() -> None:
    """Fail each fallible call of the process's first open, one fresh process per call."""
    calls = first_open_calls()
    print(f"the first open makes {len(calls)} fallible calls")
    assert any(c.startswith("ioctl") for c in calls) and any(c.startswith("mmap") for c in calls)
    bad = []
    for n, call in enumerate(calls, 1):
        r = child("first", str(n))
        if not (r["fired"] and not r["other"] and r["leaks"] == NO_LEAK and r["reopened"]
                and r["leaks_after_reopen"] == NO_LEAK):
            bad.append((n, call, r))
    assert not bad, "\n".join(f"call {n} ({call}): {r}" for n, call, r in bad)


@functools.cache
def later_walks() -> dict[str, Any]:
    return child("again", timeout=600)


# Where a failed stop may keep memory: the RM may not have freed a channel (the spec), when a
# channel's UVM detach or an RM free of rig_nv.setup.Objects.free_all failed; and where UVM's
# range of a freed allocation may remain, its addresses stay taken (path.py free_memory): a
# reused address would be refused as in use. Each a frame and one further down: the frames
# around them (the device's stop or a queue's, a comprehension's) do not matter.
SPEC_KEEPS = (("free_all", "detach_channel"), ("free_all", "free"), ("free_memory", "_uvm_free"))


def _keeps(c: dict[str, Any]) -> bool:
    frames = c["site"].split(">")
    return any(above in frames and below in frames[frames.index(above) + 1:]
               for above, below in SPEC_KEEPS)


def _walk_cases(what: str) -> list[dict[str, Any]]:
    cases = [c for c in later_walks()["cases"] if c["what"] == what]
    assert cases, f"no {what} walk ran"
    return cases


@pytest.mark.parametrize("what", ["open", "alloc-device-4k", "alloc-device-4m", "alloc-pinned",
                                  "alloc-mapped", "load", "launch-local-memory"])
def test_later_walk(what: str) -> None:
    """A later open, and alloc/load/launch on an open device: each call failed in turn leaves
    no file and no mapping once the device stops, and the GPU opens and works after."""
    bad = [c for c in _walk_cases(what) if not (
        c["fired"] and not c["other"] and not c["stuck"] and c["usable"]
        and (c["leaks"] == NO_LEAK or (_keeps(c) and not c["leaks"]["fds"])))]
    # load's known leak (rig_nv/launch.py load) holds memory only until stop: not seen here.
    assert not bad, "\n".join(map(str, bad))
    assert later_walks()["reopened"]


def test_stop_walk() -> None:
    """stop() whose n-th call fails, a free of its memory included: the GPU opens again;
    nothing stays but, where the RM may not have freed a channel, the device's memory (the
    spec), and where UVM's range may remain, its addresses."""
    bad = []
    for c in _walk_cases("stop"):
        if not (c["fired"] and not c["other"] and not c["stuck"] and c["usable"]
                and (_keeps(c) or c["leaks"] == NO_LEAK) and not c["leaks"]["fds"]):
            bad.append(c)
    assert not bad, "\n".join(map(str, bad))


@functools.cache
def queue_walks() -> dict[str, Any]:
    return child("queues", timeout=600)


@pytest.mark.parametrize("what", ["stop-queues", "queue-stop"])
def test_stop_walk_with_queues(what: str) -> None:
    """Issue 17: "stop gives back every queue's channels and memory as the spec's stop rules
    say". The stop of a device with two queues, and a queue's stop then the device's, whose
    n-th call fails: as test_stop_walk, and the GPU opens and works after."""
    cases = [c for c in queue_walks()["cases"] if c["what"] == what]
    assert cases, f"no {what} walk ran"
    bad = [c for c in cases if not (
        c["fired"] and not c["other"] and not c["stuck"] and c["usable"]
        and (_keeps(c) or c["leaks"] == NO_LEAK) and not c["leaks"]["fds"])]
    assert not bad, "\n".join(map(str, bad))
    assert queue_walks()["reopened"]


def test_walks_end_with_nothing_more_held() -> None:
    r = later_walks()
    print(f"GPU memory free after the walks changed by {r['memory_free_change']} bytes")
    assert r["reopened"]
    # The failed stops the spec lets keep memory are the only allowed difference.
    kept = [c for c in r["cases"] if c["what"] == "stop" and c["leaks"] != NO_LEAK]
    if not kept:
        assert r["leaks_at_end"] == NO_LEAK


# -- (b) limits ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("which", "extra"), [
    ("nofile-first", 0), ("nofile-first", 1), ("nofile-first", 2), ("nofile-first", 3),
    ("nofile-first", 5), ("nofile", 0), ("nofile", 1), ("nofile", 3),
    ("as-first", 64), ("as-first", 1024), ("as", 16), ("as", 64)])
def test_open_at_a_limit(which: str, extra: int) -> None:
    """An open at RLIMIT_NOFILE (files open + extra) or RLIMIT_AS (now + extra MiB) is refused
    with OpenRefused, or succeeds, and leaks nothing either way; the next open works."""
    r = child("rlimit", which, str(extra))
    print(r["refused"] or "opened")
    assert not r["other"], r["other"]
    assert r["leaks"] == NO_LEAK, r
    assert r["reopened"]
    if extra == 0 or which.startswith("as-first"):
        assert r["refused"], "an open with no file or address space to spare succeeded"


# -- (c) stopping with work in flight, exit with an open device ----------------------------------

def test_stop_with_work_in_flight_then_open_again() -> None:
    r = child("inflight", "stop")
    assert r["works"]
    print("in flight at stop:", r["in_flight"])


@pytest.mark.parametrize("stage", ["exit", "exit-hard"])
def test_exit_with_an_open_device_leaves_the_gpu_openable(stage: str) -> None:
    r = child("inflight", stage)
    print("in flight at exit:", r["in_flight"])
    assert child("inflight", "after")["works"]


# -- (d) concurrency -----------------------------------------------------------------------------

def test_eight_threads_and_racing_opens() -> None:
    r = child("stress", str(STRESS_S), timeout=STRESS_S + 300)
    print(f"rounds per thread in {STRESS_S:g} s: {r['rounds']}; opens won {r['wins']}, "
          f"refused {r['refusals']}")
    assert not r["errors"], "\n".join(r["errors"])
    assert all(n > 0 for n in r["rounds"])
    assert r["most_open"] == 1 and r["wins"] > 0


# -- (e) KeyboardInterrupt during a wait ---------------------------------------------------------

def test_keyboard_interrupt_during_a_wait_loses_nothing() -> None:
    r = child("interrupt")
    print(r)
    assert r["interrupted"], "the work ended before the signal: give it more to do"
    assert r["completed"] >= r["last"] and r["in_order"]
    assert r["bytes_right"] and r["works"]
