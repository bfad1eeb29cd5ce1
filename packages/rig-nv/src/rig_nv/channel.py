"""A GPFIFO channel: its ring, its USERD, its doorbell, and the pushbuffer memory it reads.

A submission writes its words into the channel's pushbuffer ring (host memory the GPU reads),
one GPFIFO entry naming them, the new GP_PUT in USERD, and the work-submit token to the
usermode doorbell. No ioctl. Layouts: GP entry per clc86f.h (NVC86F_GP_ENTRY0/1: address bits
39:2, LENGTH in dwords at bit 42, LEVEL at bit 41); USERD per clc86f.h Nvc86fControl (GPPut at
0x8C); doorbell NVC361_NOTIFY_CHANNEL_PENDING at 0x90 of the usermode page (clc361.h).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rig_nv.hostmem import fence

USERD_GP_PUT = 0x8C
DOORBELL = 0x90
# GP entries address pushbuffers with 40 bits on Hopper (NVC86F_GP_ENTRY1_GET_HI 7:0).
PB_LIMIT = 1 << 40
GP_LEVEL_SUBROUTINE = 1 << 41


def entry_at(address: int, ndwords: int) -> int:
    """The GPFIFO entry naming ``ndwords`` words of commands at GPU ``address`` (clc86f.h
    NVC86F_GP_ENTRY0/1). Raises ValueError unless they lie word-aligned below 2^40."""
    if address + ndwords * 4 > PB_LIMIT or address & 3:
        raise ValueError("commands must lie word-aligned below 2^40")
    return address | GP_LEVEL_SUBROUTINE | (ndwords << 42)


@dataclass
class Ring:
    """Host memory the GPU reads: GPU address, host view, length."""

    gpu: int
    view: memoryview
    length: int


class Arena:
    """A ring of host memory the GPU reads (pushbuffers, QMDs, constant banks).

    Space is handed out in order and wraps; before it hands out bytes the GPU may still read,
    it waits (``wait``) for the timeline value of the work that reads them.
    """

    def __init__(self, ring: Ring, wait: Callable[[int], None]) -> None:
        self.ring = ring
        self.head = 0
        self.inflight: deque[tuple[int, int, int]] = deque()  # (value, start, end)
        self._wait = wait

    def take(self, nbytes: int, align: int = 4) -> int:
        """The offset of ``nbytes`` free bytes, aligned; waits for old readers of them."""
        if nbytes > self.ring.length // 2:
            raise ValueError(f"{nbytes} bytes do not fit a {self.ring.length}-byte arena")
        start = -(-self.head // align) * align
        if start + nbytes > self.ring.length:
            start = 0
        end = start + nbytes
        while self.inflight:
            value, s, e = self.inflight[0]
            if not (s < end and start < e):
                break
            self._wait(value)
            self.inflight.popleft()
        self.head = end
        return start

    def used(self, value: int, start: int, end: int) -> None:
        """Record that work of timeline ``value`` reads ``[start, end)``."""
        self.inflight.append((value, start, end))

    def retire(self, completed: int) -> None:
        while self.inflight and self.inflight[0][0] <= completed:
            self.inflight.popleft()


class Channel:
    """One GPFIFO channel of the device (compute or copy).

    ``wait`` is the device's wait for a timeline value; the channel calls it before it reuses
    pushbuffer space or GPFIFO entries that work of that value still reads.
    """

    def __init__(
        self,
        name: str,
        handle: int,
        ring: memoryview,
        gpput: memoryview,
        doorbell: memoryview,
        token: int,
        pushbuffer: Ring,
        wait: Callable[[int], None],
    ) -> None:
        if pushbuffer.gpu + pushbuffer.length > PB_LIMIT:
            raise ValueError("a pushbuffer must lie below 2^40 for the GPFIFO to address it")
        self.name = name
        self.handle = handle
        self.entries = ring.cast("B").cast("Q")
        self.count = len(self.entries)
        self.gpput = gpput.cast("B").cast("I")
        self.doorbell = doorbell.cast("B").cast("I")
        self.token = token
        self.pb = pushbuffer
        self.pb_words = pushbuffer.view.cast("B").cast("I")
        self._pb_view, self._pb_length = pushbuffer.view, pushbuffer.length
        # An entry for the pushbuffer's bytes at offset o: _pb_entry + o + (dwords << 42)
        # (the address is below 2^40, so adding is or-ing).
        self._pb_entry = pushbuffer.gpu | GP_LEVEL_SUBROUTINE
        self.put = 0
        self.arena = Arena(pushbuffer, wait)
        self.pending: deque[int] = deque()  # timeline values of GPFIFO entries in use
        self._wait = wait

    def submit(self, words: Any, value: int, completed: int = -1) -> None:
        """Send ``words`` (little-endian 32-bit, any buffer) as one GPFIFO entry; ``value`` is
        the timeline value whose completion means the GPU is done reading them. Submissions
        up to ``completed`` are forgotten first (:meth:`retire`)."""
        data: Any
        if type(words) is array and words.typecode == "I":  # written through the word view
            data, n = words, len(words) << 2
        else:
            data = memoryview(words).cast("B")
            n = len(data)
        pending, count = self.pending, self.count
        arena = self.arena
        inflight = arena.inflight
        while inflight and inflight[0][0] <= completed:
            inflight.popleft()
        while pending and pending[0] <= completed:
            pending.popleft()
        while len(pending) >= count - 1:
            self._wait(pending.popleft())
        # Arena.take(n), its common case here: no wrap, no bytes still being read.
        start = (arena.head + 3) & ~3
        end = start + n
        if end > self._pb_length or n > self._pb_length >> 1 or (
                inflight and inflight[0][1] < end and start < inflight[0][2]):
            start = arena.take(n)
            end = start + n
        else:
            arena.head = end
        if data is words:
            self.pb_words[start >> 2 : end >> 2] = data
        else:
            self._pb_view[start:end] = data
        put = self.put
        self.entries[put % count] = self._pb_entry + start + ((n >> 2) << 42)
        self.put = put = put + 1
        self.gpput[0] = put % count
        # The ring and GP_PUT may be write-combined BAR1 memory: drain it before the doorbell.
        fence()
        self.doorbell[DOORBELL >> 2] = self.token
        inflight.append((value, start, end))
        pending.append(value)

    def submit_at(self, address: int, ndwords: int, value: int, completed: int = -1) -> None:
        """Send commands already in GPU-readable memory (a step's) as one GPFIFO entry;
        submissions up to ``completed`` are forgotten first (:meth:`retire`)."""
        self.submit_entry(entry_at(address, ndwords), value, completed)

    def submit_entry(self, entry: int, value: int, completed: int = -1) -> None:
        """Send the GPFIFO entry ``entry`` (:func:`entry_at`'s, made once for commands that
        stay where they are: a sealed step's), as :meth:`submit_at` does. (The pushbuffer's
        readers are left to the next :meth:`submit`, which retires them before it takes
        space: an entry takes none.)"""
        pending, count = self.pending, self.count
        while pending and pending[0] <= completed:
            pending.popleft()
        while len(pending) >= count - 1:
            self._wait(pending.popleft())
        put = self.put
        self.entries[put % count] = entry
        self.put = put = put + 1
        self.gpput[0] = put % count
        fence()
        self.doorbell[DOORBELL >> 2] = self.token
        pending.append(value)

    def submit_entries(self, entries: array[int], ends: Sequence[int],
                       completed: Callable[[], int]) -> int:
        """Send ``entries`` from the first (GPFIFO entries, as :meth:`submit_entry`'s), the
        i-th done once timeline value ``ends[i]`` is, with one GP_PUT write and one doorbell:
        as many as the ring has room for once submissions up to ``completed()`` are
        forgotten, after waiting for room for one where there is none. Returns how many it
        sent."""
        pending, count = self.pending, self.count
        done = completed()
        while True:
            while pending and pending[0] <= done:
                pending.popleft()
            if len(pending) < count - 1:
                break
            self._wait(pending[0])
            done = completed()  # the wait may have seen more than the one value done
        n = min(len(entries), count - 1 - len(pending))
        put, ring = self.put, self.entries
        at = put % count
        first = min(n, count - at)  # the ring's end, then its start
        ring[at : at + first] = entries[:first]
        if n > first:
            ring[: n - first] = entries[first:n]
        self.put = put = put + n
        self.gpput[0] = put % count
        fence()
        self.doorbell[DOORBELL >> 2] = self.token
        pending.extend(ends[:n])
        return n

    def retire(self, completed: int) -> None:
        """Forget submissions whose value has completed."""
        self.arena.retire(completed)
        while self.pending and self.pending[0] <= completed:
            self.pending.popleft()
