"""A device's timeline: its channels, the timeline word, values, points and waits, the launch
arena and slot pool, and the one submit primitive every launch, step, copy and upload goes
through.

The rule, written here once (:meth:`Timeline.submit`): every submission gets the next value;
it is taken only once nothing can fail, then the work is sent. A submission on one channel
first waits for the previous value when that went to the other channel and the host has not
seen it done, so values complete in order across both (device order). On one channel, work
behind a launch its QMD releases, not seen done, first acquires its value; behind anything
else (:attr:`Timeline.settled`) it needs nothing. The GPU writes the value (64 bits) into the
word once the work is done. The primitive's common cases (a launch from a free slot, a step,
after compute work, a copy) are inlined beside it, measured by scripts/cpu_launch_bench.py.
Every method that submits holds :attr:`Timeline.lock`.
"""

from __future__ import annotations

import struct
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rig_nv import waiting
from rig_nv.channel import Arena, Channel, Ring, entry_at
from rig_nv.hostmem import view
from rig_nv.launch import SEND_AT, SLOTS, Slots, point_cbuf0
from rig_nv.push import (
    CE_CHUNK,
    COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI,
    COPY_WORDS,
    SEM_ACQUIRE_SWITCH_TSG,
    SUBC_COMPUTE,
    SUBC_HOST,
    WFI,
    Push,
    header,
    send_qmd_words,
)
from rig_nv.setup import INVALIDATE_CODE_AND_DATA

if TYPE_CHECKING:
    from rig_nv.health import Health
    from rig_nv.launch import Prepared
    from rig_nv.profile import Profile
    from rig_nv.qmd import Release
    from rig_nv.rm import Allocation, Path
    from rig_nv.step import Step

_new = object.__new__
# A step's commands copied into the pushbuffer take at most this part of it (rig_nv.step).
PUSHBUFFER_SHARE = 2
AROUND = 18  # words a submission may put around a step's commands: an acquire and two stamps
RELEASE_WORDS = 6  # a step's commands' last words: the timeline's reduction ...
INTERRUPT_WORDS = 2  # ... and, where the path wakes on it, the non-stall interrupt
# The invalidate of the SMs' caches (code, data, constants) before the first work after new code.
INVALIDATE = (header(SUBC_COMPUTE, COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI, 1),
              INVALIDATE_CODE_AND_DATA)


@dataclass(frozen=True)
class Point:
    """A point on a device's timeline: done once the timeline word reaches ``value``."""

    device: Any
    value: int

    @property
    def signaled(self) -> bool:
        """Whether the work of this point (and of every earlier point) is done."""
        return bool(self.device.completed() >= self.value)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until signaled; raises :class:`rig_edge.Lost` if the device faulted."""
        self.device.wait(self, timeout_s)


def _point(device: Any, value: int) -> Point:
    """Point(device, value), without the frozen __init__'s calls (the fast paths')."""
    point = _new(Point)
    fields = point.__dict__
    fields["device"], fields["value"] = device, value
    return point


class Timeline:
    """The channels and timeline of ``device`` (whose points it makes)."""

    def __init__(self, device: Any, path: Path, health: Health, primary: bool = True) -> None:
        self.device = device  # the owner of its points: the device, or a queue of it
        self.primary = primary  # the device's own (its slots live in the configurations)
        self.path = path
        self.health = health
        self.hang_ms = path.hang_ms
        # Submissions ask for the non-stall interrupt only where the path's sleep wakes on it.
        self.interrupt = path.wakes_on_interrupt
        self.release_words = RELEASE_WORDS + (INTERRUPT_WORDS if self.interrupt else 0)
        self.lock = threading.RLock()  # held by every submission
        self.next = 1  # the value the next submission gets
        self.last: Channel | None = None  # the channel of the last submission
        # Whether the last submission's entry ends only once its work is done (a channel's
        # release after a wait for idle, a step's acquire of its marker): compute work after
        # it on its channel needs no acquire of it. A launch whose QMD releases its value
        # ends as the QMD is sent.
        self.settled = True
        self.profile: Profile | None = None
        self.invalidate = False  # new code loaded: the next launch invalidates the SMs' caches
        # (timeline, value): the words of other queues' timelines the next one acquires
        self._after: list[tuple[Timeline, int]] = []
        self.plain = True  # neither of those: a launch may take the common case
        self._slots: dict[int, Slots] = {}  # a queue's own slots, per configuration (id)
        self.stopped = False
        self.channels: list[Channel] = []
        self.gpu = self.host = 0  # the word's addresses
        # How a launch's QMD releases its value (place_word); None: the launch ends with the
        # channel's release, after a wait for idle.
        self.qmd_release: Release | None = None
        self.word = memoryview(bytearray(8)).cast("Q")
        self.compute: Channel
        self.copy_channel: Channel
        self.arena: Arena
        self.pool: Ring  # launch configurations' slots (rig_nv.launch.Slots), bump-allocated
        self.pool_head = 0
        self._release = array("I")
        self.copy_words = array("I")
        # A launch after a launch (:meth:`place_word`); scripts/latency_probe.py varies it.
        self.launch_words = array("I")

    # ---- made by rig_nv.setup -----------------------------------------------------------

    def place_word(self, a: Allocation, qmd_release: Release | None = None,
                   order: str = "acquire-stay") -> None:
        """Keep the word in ``a`` (pinned memory the GPU writes), before any submission.
        With ``qmd_release`` (the QMD layout's) launches end with their QMD's release of the
        value, not the channel's; a launch after such a launch the host has not seen done
        then first waits for it on the GPU as ``order`` says (rig_nv.setup.ORDER): grids of
        one channel otherwise run at once, and their releases land out of order
        (:attr:`settled`)."""
        assert a.host is not None
        self.gpu, self.host = a.gpu, a.host
        self.word = view(a.host, 16).cast("Q")
        # The words that end every submission, with the value to patch in at [3] and [4].
        self._release = Push().semaphore_release(a.gpu, 0, interrupt=self.interrupt).words
        # A copy engine launch and the release: Push.copy's layout, the value at
        # [COPY_WORDS + 3] and [COPY_WORDS + 4] (copy).
        self.copy_words = array("I", (*Push().copy(0, 0, 1).words, *self._release))
        # A launch after a launch: SEND_PCAS_A (QMD address at [1]), SEND_SIGNALING_PCAS2_B,
        # then the release (the value at [7] and [8]), or none where the QMD releases it.
        # The channel's release waits for the channel's engine to idle: while it waits, no
        # other channel of the group is served, so kernels of other queues wait too (the
        # H200, docs/queues.md). The QMD's release waits only for its grid.
        self.qmd_release = qmd_release
        self.launch_words = array("I", (*send_qmd_words(0),
                                         *(() if qmd_release else self._release)))
        self._launch_tail = array("I") if qmd_release else None
        # The words that keep a launch behind the work before (value at [3] and [4] where
        # they acquire), and the launch words behind them (QMD address at [-3]).
        if order == "wfi":
            self._order = Push().method(SUBC_HOST, WFI, 0).words  # WFI_SCOPE_CURRENT_VEID
        else:
            self._order = Push().semaphore_acquire(self.gpu, 0).words
            if order == "acquire-stay":
                self._order[5] &= ~SEM_ACQUIRE_SWITCH_TSG
        self._order_acquires = order != "wfi"
        self.ordered_words = array("I", (*self._order, *self.launch_words))

    def retire(self) -> None:
        """The word's memory is about to go back (its queue's channels are gone): from now on
        :attr:`word` is memory of the timeline's own that keeps the last value the GPU wrote.
        Every reader reads ``word``, so a stopped queue's points still answer from it."""
        final = memoryview(bytearray(8)).cast("Q")
        final[0] = self.word[0]
        self.word = final

    def add(self, channel: Channel) -> None:
        self.channels.append(channel)

    def place_arenas(self, pool: Allocation, arena: Allocation) -> None:
        """Use ``pool`` for launch slots and ``arena`` for launches' QMDs and banks."""
        assert pool.host is not None and arena.host is not None
        self.pool, self.pool_head = Ring(pool.gpu, view(pool.host, pool.length), pool.length), 0
        self.arena = Arena(Ring(arena.gpu, view(arena.host, arena.length), arena.length),
                           self.wait_value)

    # ---- values and waits ---------------------------------------------------------------

    def completed(self) -> int:
        """The last value the GPU has completed."""
        return int(self.word[0])

    def point(self, value: int) -> Point:
        """The point of ``value`` on this timeline."""
        return Point(self.device, value)

    def current(self) -> int:
        """The last value submitted."""
        return self.next - 1

    def wait_value(self, value: int, timeout_s: float | None = None) -> None:
        waiting.wait_value(self, value, timeout_s)

    def synchronize(self) -> None:
        """Wait until every submission so far is done."""
        self.wait_value(self.next - 1)

    def code_loaded(self) -> None:
        """New code lies in memory: the next launch invalidates the SMs' caches first."""
        self.invalidate = True
        self.plain = False

    def after(self, other: Timeline, value: int) -> None:
        """The next submission waits on the GPU until ``other``'s word reaches ``value``
        (another queue's timeline: :meth:`rig_nv.Device.after`), unless it has already."""
        with self.lock:
            self._after.append((other, value))
            self.plain = False

    def slots_of(self, prep: Prepared) -> Slots:
        """The slots of ``prep`` on this timeline: the configuration's own on the device's,
        a queue's own elsewhere (their values are this timeline's)."""
        if self.primary:
            return prep.slots
        slots = self._slots.get(id(prep))
        if slots is None:
            slots = self._slots[id(prep)] = Slots()
        return slots

    def set_profile(self, profile: Profile | None) -> Profile | None:
        """Stamp submissions into ``profile`` from now on (None: none); returns the last."""
        before, self.profile = self.profile, profile
        return before

    # ---- the primitive ------------------------------------------------------------------

    def submit(self, channel: Channel, body: Any, name: str = "work",
               tail: Any = None, qmd: memoryview | None = None, idle: bool = True) -> Point:
        """Submit ``body`` (32-bit words) on ``channel`` as the next value: after the previous
        value when that went to the other channel, not seen done, ending with ``tail``
        (default: the release of the new value). ``qmd``: the launch's QMD where it releases
        the value (:attr:`qmd_release`); under a profile its second release stamps the
        grid's end, and the start stamp waits for no idle, so a profile keeps queues' grids
        side by side; with ``idle`` false (a marked step's, :mod:`rig_nv.step`) neither stamp does.
        Raises the device's loss or stop, or a full profile's RigError, having taken no
        value."""
        with self.lock:
            health = self.health
            if not health.ok:
                health.check()
            value = self.next
            words = array("I")
            for other, at in self._after:  # Timeline.after's waits, on the GPU
                # One the host sees passed needs none: a stopped queue's word may be gone.
                if other.word[0] < at:
                    words.extend(Push().semaphore_acquire(other.gpu, at).words)
            if self.last is not channel and self.last is not None and \
                    self.word[0] < value - 1:  # one the host sees done needs no wait
                words.extend(Push().semaphore_acquire(self.gpu, value - 1).words)
            elif self.qmd_release is not None and channel is self.last and \
                    channel is self.compute and not self.settled and self.word[0] < value - 1:
                words.extend(self._ordered(value)[:len(self._order)])
            if tail is None:
                tail = self._release
                tail[3] = value & 0xFFFFFFFF
                tail[4] = value >> 32
            profile = self.profile
            stamp = 0
            if profile is not None:
                start, end = profile.take(name, channel.name)
                profile.value(value)
                idle = idle and qmd is None
                words.extend(Push().timestamp(start, idle).words)
                words.extend(body)
                if qmd is None:
                    words.extend(Push().timestamp(end, idle).words)
                else:
                    stamp = end
            else:
                words.extend(body)
            if qmd is not None:
                assert self.qmd_release is not None
                self.qmd_release.write(qmd, 0, self.gpu, value, stamp)
            words.extend(tail)
            # Taken only now that nothing can refuse (a full profile): a value never submitted
            # would leave every later step's addition to the timeline one short.
            self.next = value + 1
            if self._after:
                self._after.clear()
                self.plain = not self.invalidate
            channel.retire(int(self.word[0]))
            channel.submit(words, value)
            self.last = channel
            self.settled = qmd is None
            return Point(self.device, value)

    # ---- its common cases, inlined --------------------------------------------------------

    def copy(self, to: int, fro: int, n: int, name: str = "copy") -> Point:
        """Copy ``n`` bytes from GPU address ``fro`` to ``to`` on the copy engine as the next
        value (``name``: a profile's event), as :meth:`submit` does: its common case (one
        launch of the engine, no profile, no waits of :meth:`after`, behind copy work or work
        the host has seen done) inline. Raises the device's loss or stop, having sent
        nothing."""
        if n <= CE_CHUNK:
            lock = self.lock
            lock.acquire()  # as launch_prepared's
            try:
                health = self.health
                if not health.ok:
                    health.check()
                value = self.next
                done = self.word[0]
                channel = self.copy_channel
                if (self.last is channel or done >= value - 1) and self.profile is None \
                        and not self._after:
                    words = self.copy_words
                    words[1], words[2], words[3], words[4] = \
                        fro >> 32, fro & 0xFFFFFFFF, to >> 32, to & 0xFFFFFFFF
                    words[6] = n
                    words[COPY_WORDS + 3] = value & 0xFFFFFFFF
                    words[COPY_WORDS + 4] = value >> 32
                    self.next = value + 1
                    channel.submit(words, value, done)
                    self.last = channel
                    self.settled = True
                    return _point(self.device, value)
            finally:
                lock.release()
        return self.submit(self.copy_channel, Push().copy(to, fro, n).words, name)

    def launch_prepared(self, prep: Prepared, st: struct.Struct, values: Any,
                        params: int) -> Point:
        """Launch ``prep`` with ``values`` packed by ``st`` at ``params`` in its bank: the
        common case (a free slot, after compute work, no new code) inline, else
        :meth:`launch_blob`."""
        slots = prep.slots if self.primary else self.slots_of(prep)
        if slots.at:
            lock = self.lock
            lock.acquire()  # not `with`: its protocol cost 0.1 us a call (stand-in), as memory's
            try:
                health = self.health
                if not health.ok:
                    health.check()
                k = slots.turn
                done = self.word[0]
                compute = self.compute
                if slots.values[k] <= done and self.last is compute and self.plain:
                    at = slots.at[k]
                    pool = self.pool
                    st.pack_into(pool.view, at + 512 + params, *values)
                    slots.turn = k + 1 if k + 1 < SLOTS else 0
                    value = self.next
                    self.next = value + 1
                    release = self.qmd_release
                    if release is not None:
                        release.write(pool.view, at, self.gpu, value)
                        if done < value - 1 and not self.settled:
                            words = self._ordered(value)
                            words[-3] = (pool.gpu + at) >> 8
                            compute.submit(words, value, done)
                        else:  # the slot's own words, as a step's entry
                            compute.submit_entry(slots.entries[k], value, done)
                        self.settled = False
                    else:
                        words = self.launch_words
                        words[1] = (pool.gpu + at) >> 8
                        words[7] = value & 0xFFFFFFFF
                        words[8] = value >> 32
                        compute.submit(words, value, done)
                    slots.values[k] = value
                    point = _new(Point)  # _point(self.device, value), inline
                    fields = point.__dict__
                    fields["device"], fields["value"] = self.device, value
                    return point
            finally:
                lock.release()
        return self.launch_blob(prep, prep.blob, "launch", st, values, params)

    def _send_qmd(self, address: int, name: str, done: int,
                  qmd: memoryview | None = None) -> Point:
        """Launch the QMD at ``address`` on the compute channel (the lock held; ``done``: the
        word as read): the launch words after compute work, else :meth:`submit`. ``qmd``:
        where the host writes it, for its release of the value (:attr:`qmd_release`)."""
        compute = self.compute
        release = self.qmd_release
        if self.last is not compute or not self.plain or self.profile:
            body = (*self._invalidation(), *send_qmd_words(address))
            # The QMD releases the value, else submit's own release ends the launch.
            return self.submit(compute, body, name, self._launch_tail,
                               None if release is None else qmd)
        value = self.next
        self.next = value + 1
        words = self.launch_words
        if release is None:
            words[1] = address >> 8
            words[7] = value & 0xFFFFFFFF
            words[8] = value >> 32
        else:
            assert qmd is not None
            release.write(qmd, 0, self.gpu, value)
            if done < value - 1 and not self.settled:
                words = self._ordered(value)
            words[-3] = address >> 8
            self.settled = False
        compute.submit(words, value, done)
        return _point(self.device, value)

    def _invalidation(self) -> tuple[int, ...]:
        """The invalidate of the SMs' caches where new code lies in memory since the last one
        (then taken: the lock held), else nothing. A QMD invalidates the data and constant
        caches itself (INVALIDATE_SHADER_DATA_CACHE, as libcuda's), not the code's."""
        if not self.invalidate:
            return ()
        self.invalidate = False
        self.plain = not self._after
        return INVALIDATE

    def _ordered(self, value: int) -> array[int]:
        """The launch words behind the order words, which wait for ``value - 1``."""
        words = self.ordered_words
        if self._order_acquires:
            words[3] = (value - 1) & 0xFFFFFFFF
            words[4] = (value - 1) >> 32
        return words

    def _send_entry(self, channel: Channel, entry: int) -> Point:
        """Send commands that lie in GPU memory and add one to the word themselves (a step's)
        as the next value (the lock held)."""
        value = self.next
        self.next = value + 1
        channel.submit_entry(entry, value, self.word[0])
        self.last = channel
        self.settled = True
        return _point(self.device, value)

    # ---- launches -----------------------------------------------------------------------

    def make_slots(self, prep: Prepared, slots: Slots) -> None:
        """Give ``prep`` its :data:`rig_nv.launch.SLOTS` places in the slot pool, each written
        once, or mark it as having none (turn -1) when the pool is full."""
        pool = self.pool
        size = -(-len(prep.blob) // 256) * 256
        if self.pool_head + SLOTS * size > pool.length:
            slots.turn = -1
            return
        send = SEND_AT
        for _ in range(SLOTS):
            at = self.pool_head
            self.pool_head = at + size
            pool.view[at : at + len(prep.blob)] = prep.blob
            point_cbuf0(prep, pool.view, at, pool.gpu + at)
            words = memoryview(array("I", send_qmd_words(pool.gpu + at))).cast("B")
            pool.view[at + send : at + send + len(words)] = words
            slots.at.append(at)
            slots.entries.append(entry_at(pool.gpu + at + send, len(words) // 4))
            slots.values.append(0)

    def launch_blob(self, prep: Prepared, blob: bytes | bytearray, name: str = "launch",
                    st: struct.Struct | None = None, values: Any = (),
                    params: int = 0) -> Point:
        """Send the QMD of ``blob`` (a QMD in its 512-byte slot, then its bank) with ``values``
        packed by ``st`` at ``params`` in the bank: from one of the configuration's slots
        (only the arguments written) when ``blob`` is the prepared one and a slot is free,
        else written whole into the launch arena."""
        with self.lock:
            health = self.health
            if not health.ok:
                health.check()
            done = self.word[0]
            slots = self.slots_of(prep)
            k = slots.turn
            if st is not None and blob is prep.blob and k >= 0:
                if not slots.at:
                    self.make_slots(prep, slots)
                    k = slots.turn
                if k >= 0 and slots.values[k] <= done:
                    at = slots.at[k]
                    st.pack_into(self.pool.view, at + 512 + params, *values)
                    slots.turn = k + 1 if k + 1 < SLOTS else 0
                    point = self._send_qmd(self.pool.gpu + at, name, done,
                                           self.pool.view[at:at + 512])
                    slots.values[k] = point.value
                    return point
            arena = self.arena
            ring = arena.ring
            inflight = arena.inflight
            n = len(blob)
            head = arena.head
            while inflight and inflight[0][0] <= done:  # Arena.retire
                inflight.popleft()
            # Arena.take(n, 256), its common case here: no wrap, no bytes still being read.
            at = -(-head // 256) * 256
            end = at + n
            if end > ring.length or n > ring.length >> 1 or (
                    inflight and inflight[0][1] < end and at < inflight[0][2]):
                at = arena.take(n, 256)
                end = at + n
            else:
                arena.head = end
            host = ring.view
            host[at:end] = blob
            if st is not None:
                try:  # values no Misuse check caught (a made-up Region's address): as it was
                    st.pack_into(host, at + 512 + params, *values)
                except BaseException:
                    arena.head = head
                    raise
            point_cbuf0(prep, host, at, ring.gpu + at)
            point = self._send_qmd(ring.gpu + at, name, done, host[at:at + 512])
            inflight.append((point.value, at, end))  # Arena.used
            return point

    # ---- steps --------------------------------------------------------------------------

    def submit_step(self, step: Step, times: int = 1) -> Point:
        """Submit a sealed step ``times`` times (each its own value; the last one's point),
        each as one GPFIFO entry on the compute channel.

        After compute work (the common case) the entry names the step's commands where they
        lie. After the copy channel's work, or under a profile, the acquire, the stamps and a
        copy of the commands (the end stamp before their release) go through the pushbuffer
        as one entry: an entry names one run of words, and the acquire's value changes with
        every submission while the GPU may still read the step's memory for an earlier one.
        A step whose copy would fill more than half the pushbuffer is the exception: the CPU
        waits for the work before it, then sends its commands where they lie, or between
        stamps in memory of the step's own (:meth:`rig_nv.step.Step.stamped`).

        Repetitions after compute work (all but the first after the copy channel's; none
        under a profile, where each has its stamps) go as the step's runs where it has them
        (:meth:`rig_nv.step.Step.lay_runs`), as many entries at once as the ring has room
        for, with one GP_PUT write and one doorbell (:meth:`_send_entries`). A wait for room
        may raise; the repetitions before it stay submitted."""
        lock = self.lock
        lock.acquire()  # as launch_prepared's
        try:
            health = self.health
            if not health.ok:
                health.check()
            compute = self.compute
            # A step behind a launch its QMD releases, or behind the copy channel's work, not
            # seen done, goes the way that puts an acquire of it first (submit): its grids
            # could overlap the launch's, or read what the copy has not written.
            if self.profile is None and not self._after and (
                    (self.last is compute and self.settled) or self.word[0] >= self.next - 1):
                if self.invalidate:  # new code: the first from the invalidate before it
                    point = self._send_entry(compute, self._entry_of(step))
                    times -= 1
                    if not times:
                        return point
                if times != 1:
                    return self._send_entries(compute, step, times)
                # _send_entry, inline: the common case of a step after compute work
                value = self.next
                self.next = value + 1
                compute.submit_entry(step.entry, value, self.word[0])
                self.last = compute
                self.settled = True
                point = _new(Point)
                fields = point.__dict__
                fields["device"], fields["value"] = self.device, value
                return point
            point = self._step_alone(step)
            if times > 1 and self.profile is None:
                return self._send_entries(compute, step, times - 1)
            for _ in range(times - 1):
                point = self._step_alone(step)
            return point
        finally:
            lock.release()

    def _send_entries(self, channel: Channel, step: Step, times: int) -> Point:
        """Send ``times`` repetitions of ``step`` as the next values, as many entries at once
        as the ring holds (the lock held): whole runs of the most its runs hold, then one of
        the rest (:attr:`rig_nv.step.Step.runs`, laid by :meth:`rig_nv.step.Step.submit`
        before any submission of more than one). The last one's point."""
        runs = step.runs
        most = len(runs)
        while times:
            value = self.next
            whole, rest = divmod(times, most)
            entries = array("Q", runs[-1:]) * whole
            ends: Sequence[int] = range(value + most - 1, value + whole * most, most)
            if rest:
                entries.append(runs[rest - 1])
                ends = [*ends, value + times - 1]
            n = channel.submit_entries(entries, ends, self.completed)
            sent = ends[n - 1] + 1 - value
            self.next = value + sent
            self.last = channel
            self.settled = True
            times -= sent
        return _point(self.device, self.next - 1)

    def _step_alone(self, step: Step) -> Point:
        """One submission of ``step`` after the copy channel's work, under a profile or after
        :meth:`after` (the lock held), as :meth:`submit_step` says."""
        compute = self.compute
        profile = self.profile
        cmds = step.commands
        if (len(cmds) + AROUND) * 4 <= compute.pb.length // PUSHBUFFER_SHARE:
            last = self.release_words
            body = cmds[:-last]
            first = self._invalidation()
            if first:
                body = array("I", first) + body
            return self.submit(compute, body, "step", tail=cmds[-last:], idle=not step.marked)
        if self._after:  # its waits on other queues go first, in a submission of their own
            self.submit(compute, ())
        # Waited for before the value is taken: a wait may raise.
        self.wait_value(self.next - 1)
        if profile is None:
            return self._send_entry(compute, self._entry_of(step))
        step.stamp_room()
        start, end = profile.take("step", "compute")
        profile.value(self.next)
        return self._send_entry(compute, entry_at(*step.stamped(start, end,
                                                                self._invalidation())))

    def _entry_of(self, step: Step) -> int:
        """The GPFIFO entry of ``step``'s commands where they lie, from the invalidate before
        them where new code is owed one (then taken; the lock held)."""
        return step.fresh_entry if self._invalidation() else step.entry
