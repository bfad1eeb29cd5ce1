"""The non-stall interrupt on the stand-in path (fake_gpu.py): issue 23, "the non-stall
interrupt only where a path waits on it". A submission ends by asking for one only on a path
whose sleep wakes on it (rig_nv.rm.Path.wakes_on_interrupt); neither of rig's paths does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_gpu import FakePath, entry_words, open_on

from rig_edge import Memory
from rig_nv import push

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"


def _methods(words: list[int]) -> list[int]:
    """The host and class methods (byte offsets) the words send, in order (dev_ram.ref.txt
    FIFO_DMA headers: SEC_OP 4 carries its datum in the header)."""
    out, i = [], 0
    while i < len(words):
        h = words[i]
        op, count, method = h >> 29, (h >> 16) & 0x1FFF, (h & 0xFFF) << 2
        if op == push.IMMEDIATE:
            out.append(method)
            i += 1
            continue
        out.extend(method + 4 * k if op == push.INCREMENTING else method for k in range(count))
        i += 1 + count
    return out


def _sent(d: Any, puts: dict[str, int]) -> list[list[int]]:
    """The methods of each GPFIFO entry sent on either channel since ``puts``."""
    out = []
    for ch in (d.compute, d.copy_channel):
        for i in range(puts[ch.name], ch.put):
            out.append(_methods(entry_words(int(ch.entries[i % ch.count]))))
    return out


def _every_kind(d: Any, path: Any) -> list[list[int]]:
    """A launch after a copy, launches, a step after a launch and after a copy, a step under a
    profile, a copy and an upload: each submission's methods."""
    img = d.load(CUBIN.read_bytes())
    path.complete()
    a = d.alloc(1 << 16, Memory.DEVICE)
    b = d.alloc(1 << 16, Memory.PINNED)
    s = d.step()
    s.launch(img["vadd"], (1,), (32,), (a, a, a, 1))
    puts = {ch.name: ch.put for ch in (d.compute, d.copy_channel)}
    for i in range(3):
        d.launch(img["vadd"], (4,), (256,), (a, a, b, i))
    s.submit()
    d.copy(b, a, 4096)
    s.submit()
    d.upload(a, bytes(64))
    with d.profile(capacity=8):
        s.submit()
        d.launch(img["vadd"], (4,), (256,), (a, a, b, 9))
    path.complete()
    return _sent(d, puts)


@pytest.mark.parametrize("wakes", [False, True])
def test_a_submission_asks_for_the_interrupt_only_where_the_path_wakes_on_it(
        wakes: bool) -> None:
    """Every submission ends with the non-stall interrupt (after its release) where the path
    says its sleep wakes on it; where it does not (both of rig's paths), none asks for one."""
    path = FakePath()
    path.wakes_on_interrupt = wakes
    d = open_on(path)
    try:
        sent = _every_kind(d, path)
    finally:
        d.stop()
    assert len(sent) >= 9
    for methods in sent:
        asks = methods.count(push.NON_STALL_INTERRUPT)
        if wakes:
            assert methods[-1] == push.NON_STALL_INTERRUPT and asks == 1, methods
            assert methods[-2] == push.SEM_EXECUTE, methods
        else:
            # It ends with its release: the channel's, or a launch's QMD sent (its release).
            assert asks == 0, methods
            assert methods[-1] in (push.SEM_EXECUTE, push.COMPUTE_SEND_SIGNALING_PCAS2_B), methods

