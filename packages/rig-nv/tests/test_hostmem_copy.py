"""rig_nv.hostmem.copy: host copies split over threads from PARALLEL_FROM bytes on (the staged
copies' and host-visible regions' host side) give the bytes a plain slice assignment gives."""

from __future__ import annotations

import os

import pytest

from rig_nv import hostmem


@pytest.mark.parametrize("n", [0, 1, 4095, hostmem.PARALLEL_FROM - 1, hostmem.PARALLEL_FROM,
                               3 * hostmem.PARALLEL_FROM + 12345])
def test_copy_gives_the_bytes_of_a_slice_assignment(n: int, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    monkeypatch.setattr(hostmem, "COPY_THREADS", 3)  # parts even where this CPU has one core
    src = os.urandom(n)  # read-only bytes, as a caller's data may be
    dst = bytearray(n + 2)
    hostmem.copy(memoryview(dst)[1 : n + 1], memoryview(src))
    assert dst[1 : n + 1] == src and dst[0] == dst[n + 1] == 0


def test_copy_of_unequal_lengths_is_refused_and_writes_nothing() -> None:
    dst = bytearray(hostmem.PARALLEL_FROM)
    with pytest.raises(ValueError):
        hostmem.copy(memoryview(dst), memoryview(bytes(hostmem.PARALLEL_FROM + 1)).cast("B")
                     [: hostmem.PARALLEL_FROM - 1])
    assert dst == bytearray(hostmem.PARALLEL_FROM)


def test_an_interrupted_copy_returns_only_once_no_part_still_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt out of one part (as a Ctrl-C while copy waits) is raised only after
    every other part has finished: staging memory is reused right after."""
    import threading
    import time
    import types

    done: list[int] = []
    lock = threading.Lock()

    def memcpy(to: object, fro: object, n: int) -> None:
        with lock:
            first = not done and not getattr(memcpy, "raised", False)
            if first:
                memcpy.raised = True  # type: ignore[attr-defined]
        if first:
            raise KeyboardInterrupt
        time.sleep(0.2)
        with lock:
            done.append(n)

    monkeypatch.setattr(hostmem, "COPY_THREADS", 4)
    monkeypatch.setattr(hostmem, "libc", types.SimpleNamespace(memcpy=memcpy))
    n = 4 * hostmem.PARALLEL_FROM
    with pytest.raises(KeyboardInterrupt):
        hostmem.copy(memoryview(bytearray(n)), memoryview(bytes(n)))
    assert len(done) == 3  # the three other parts ran to their end before the raise
