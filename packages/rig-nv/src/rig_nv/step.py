"""Steps: launches and copies recorded once and submitted again and again (CUDA's graphs).

A step's commands, QMDs and banks are written once into memory the GPU reads. Each submission
is one GPFIFO entry (:meth:`rig_nv.timeline.Timeline.submit_step`): after compute work it names
the commands where they lie (after new code, from an invalidate laid just before them), else a
copy of them in the pushbuffer behind the wait and stamps. The commands end by adding one to
the timeline word (an IADD reduction, clc56f.h SEM_EXECUTE), so they never change. Launches run
one after another as chained QMDs; a copy waits for idle (WFI) first. A step that ends with a
launch ("marked", wherever QMDs release: :func:`rig_nv.setup.qmd_release`) acquires a marker its
last QMD releases, the channel group staying on: a WFI would hold every queue of the group,
and a switch away and back costs ~6 us a step (docs/queues.md). Other steps wait for idle.
A marked step of launches alone repeated goes as runs: copies of its QMDs chained into its
own, each repetition's last adding one to the timeline word (:meth:`Step.lay_runs`).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rig_edge import Memory, Misuse, Region, RigError
from rig_nv import checks, qmd
from rig_nv import launch as launching
from rig_nv.channel import entry_at
from rig_nv.hostmem import view
from rig_nv.push import (
    COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI,
    SEM_ADDR_LO,
    SEM_PAYLOAD_64BIT,
    SEM_RELEASE_WFI,
    SUBC_COMPUTE,
    SUBC_HOST,
    WFI,
    Push,
    lo_hi,
)
from rig_nv.setup import INVALIDATE_CODE_AND_DATA, qmd_release
from rig_nv.timeline import AROUND, INVALIDATE, PUSHBUFFER_SHARE  # noqa: F401 (tests')

if TYPE_CHECKING:
    from rig_nv.device import Device
    from rig_nv.timeline import Point, Timeline

# SEM_EXECUTE OPERATION REDUCTION (6), REDUCTION IADD (5) in 30:27, FORMAT UNSIGNED (1) at 31.
SEM_OP_REDUCTION = 6
SEM_REDUCTION_IADD = 5 << 27
SEM_REDUCTION_UNSIGNED = 1 << 31
WFI_SCOPE_ALL = 1
CHAIN = True  # consecutive launches chained as dependent QMDs (False: each sent, unordered)
ENTRY_MOST = 0x1FFFFF  # dwords one GPFIFO entry names (clc86f.h NVC86F_GP_ENTRY1_LENGTH 30:10)
RUN_MOST = 64  # repetitions one GPFIFO entry may run (Step.lay_runs): its acquire paid once
# The most bytes a step's copies of its QMDs take: mapped memory, BAR1 space, which a GPU
# without a resizable BAR has 256 MiB of. A repetition of many launches gains little from a
# run (an entry costs ~0.7 us over a chained launch's 1.1 on the H200), so it gets few sets.
RUN_BYTES = 64 << 10


@dataclass
class _Launch:
    fn: launching.Function
    prep: launching.Prepared
    bank: bytearray
    at: int = 0  # offset of its QMD in the step's memory once sealed


@dataclass
class _Copy:
    dst: int
    src: int
    length: int


class Step:
    """A recording of launches and copies on one device, replayed by :meth:`submit`."""

    def __init__(self, device: Device, timeline: Timeline | None = None) -> None:
        self.device = device
        # the queue it is submitted on, whose word its commands add one to
        self.timeline = timeline if timeline is not None else device.timeline
        self.items: list[_Launch | _Copy] = []
        self.memory: Region | None = None
        self.address = 0  # GPU address of the commands in the step's memory, once sealed
        self.dwords = 0  # and their number of words
        self.entry = 0  # the GPFIFO entry naming them (rig_nv.channel.entry_at)
        self.fresh_entry = 0  # the same from the invalidate before them, after new code
        self.commands = array("I")  # the commands, for submissions that copy them
        self.stamped_memory: Region | None = None  # see stamped
        self.marker = 0  # offset of that marker (16 bytes) in the step's memory
        # runs[r - 1]: the GPFIFO entry of r repetitions (lay_runs); () before, (entry,) for none
        self.runs: tuple[int, ...] = ()
        self.run_memory: Region | None = None
        self._release: qmd.Release | None = None  # the QMD release that sets it (marked)
        self._last: Point | None = None
        self._laying = threading.Lock()  # one thread seals and lays runs, once

    @property
    def marked(self) -> bool:
        """Whether its end waits for its last grid by an acquire of its marker (once sealed)."""
        return self._release is not None

    def launch(self, fn: launching.Function, grid: Sequence[int], block: Sequence[int],
               args: Sequence[Any] = (), shared: int = 0, *,
               cluster: Sequence[int] | None = None, cooperative: bool = False,
               pdl: bool = False) -> int:
        """Record a launch; returns its index (for :meth:`set_args`). Takes and raises
        (:class:`Misuse`) as :meth:`rig_nv.Device.launch` does."""
        self._unsealed()
        shape = (cluster, cooperative, pdl)
        prep = launching.prepare(self.device, fn, grid, block, shared, *shape)
        bank = bytearray(prep.bank)
        launching.fill_args(fn, bank, args)  # checked before local memory grows
        if prep.local > self.device.loader.slm:
            self.device.loader.ensure_local(prep.local)
            prep = launching.prepare(self.device, fn, grid, block, shared, *shape)
            bank = bytearray(prep.bank)
            launching.fill_args(fn, bank, args)
        self.items.append(_Launch(fn, prep, bank))
        return len(self.items) - 1

    def copy(self, dst: Region, src: Region, n: int | None = None, *, dst_offset: int = 0,
             src_offset: int = 0) -> None:
        """Record a copy on the copy engine of the compute channel. Raises :class:`Misuse` as
        :meth:`rig_nv.Device.copy` does."""
        self._unsealed()
        if n is None:
            n = checks.region_of("source", src).length - checks.whole("src_offset", src_offset)
        dst, dst_offset, n = checks.span(self.device.memory, "destination", dst, dst_offset, n)
        src, src_offset, n = checks.span(self.device.memory, "source", src, src_offset, n)
        self.items.append(_Copy(dst.gpu + dst_offset, src.gpu + src_offset, n))

    def _unsealed(self) -> None:
        if self.memory is not None:
            raise Misuse("a step is recorded before its first submit; record another step")

    def _seal(self) -> None:
        d = self.device
        launches = [i for i in self.items if isinstance(i, _Launch)]
        if not self.items:
            raise Misuse("an empty step has nothing to submit")
        # Layout: the QMD and bank of each launch (a 512-byte slot, then its bank), then the
        # commands. Commands are built once to measure them, then with the real addresses.
        at = 0
        for x in launches:
            x.at = at
            at += -(-(512 + len(x.bank)) // 256) * 256
        # The marker needs the QMD's release (any timeline's: the device's own too, where it
        # is faster than a wait for idle, docs/queues.md); a copy's end is no QMD's.
        self._release = qmd_release(d) if isinstance(self.items[-1], _Launch) else None
        if self.marked:
            self.marker, at = at, at + 16
        lead = 4 * len(INVALIDATE)  # the invalidate of the SMs' caches, before the commands
        at += lead
        n = len(self._commands(0, None))
        if n + AROUND > ENTRY_MOST:
            raise Misuse(f"a step of {len(self.items)} items makes {n} words of commands, more "
                         f"than one GPFIFO entry holds ({ENTRY_MOST - AROUND} with its wait and "
                         "stamps): record them as several steps")
        size = at + n * 4
        # Video memory seen through BAR1: the GPU fetches QMDs and commands from its own memory.
        memory = d.alloc(size, Memory.MAPPED)
        if memory is None:
            raise RigError(f"{d.facts.name}: no mapped memory for a step of {size} bytes")
        self.memory = memory
        host = view(memory.host or 0, memory.length)
        words = self._commands(memory.gpu, host)
        data = memoryview(words.words).cast("B")
        host[at : at + len(data)] = data
        host[at - lead : at] = array("I", INVALIDATE).tobytes()
        self.address = memory.gpu + at
        self.dwords = len(words)
        self.entry = entry_at(self.address, self.dwords)
        self.fresh_entry = entry_at(self.address - lead, self.dwords + len(INVALIDATE))
        self.commands = words.words

    def _commands(self, base: int, host: memoryview | None) -> Push:
        """The step's commands for its memory at GPU address ``base`` (QMDs and banks are
        written into ``host`` when given). Launches that follow one another are chained: each
        QMD names the next as its dependent, so only the first is sent and the GPU starts each
        as soon as the one before completes. A copy waits for the engine (WFI) first."""
        d = self.device
        layout = qmd.LAYOUTS[d.classes.qmd_version]
        # No invalidate of the SMs' caches first: each QMD invalidates the data and constant
        # caches, and a submission after new code invalidates (Timeline.submit_step). It cost
        # 0.18 us a step on the H200 (docs/results/submit-variants-2026-12-02.txt).
        marker = base + self.marker
        release = self._release
        words = _cleared(marker) if self.marked else Push()
        items = self.items
        for n, item in enumerate(items):
            before = items[n - 1] if n else None
            if isinstance(item, _Launch):
                if host is not None:
                    q = host[item.at : item.at + len(item.prep.qmd)]
                    q[:] = item.prep.qmd
                    qmd.patch_cbuf0(layout, q, base + item.at + 512)
                    launching.address_bank(item.prep, item.bank, 0, base + item.at + 512)
                    host[item.at + 512 : item.at + 512 + len(item.bank)] = item.bank
                    after = items[n + 1] if n + 1 < len(items) else None
                    if isinstance(after, _Launch) and CHAIN:
                        qmd.chain(layout, q, base + after.at)
                    if self.marked and after is None:
                        assert release is not None
                        release.write(q, 0, marker, 1)
                if not isinstance(before, _Launch) or not CHAIN:
                    if before is not None:
                        words.method(SUBC_HOST, WFI, WFI_SCOPE_ALL)
                    words.send_qmd(base + item.at)
            else:
                if before is not None:
                    words.method(SUBC_HOST, WFI, WFI_SCOPE_ALL)
                    words.method(SUBC_COMPUTE, COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI,
                                 INVALIDATE_CODE_AND_DATA)
                words.copy(item.dst, item.src, item.length)
        return self._end(words, marker)

    def _end(self, words: Push, marker: int) -> Push:
        """End ``words`` as every submission of the step ends: the wait for its last grid (the
        acquire of its marker at GPU address ``marker``, or a wait for idle) and one added to
        the timeline word."""
        if self.marked:  # the group stays on: the wait is for its own grid, a switch is slow
            words.semaphore_acquire(marker, 1, switch=False)
        words.method(SUBC_HOST, SEM_ADDR_LO, *lo_hi(self.timeline.gpu), *lo_hi(1),
                     SEM_OP_REDUCTION | (0 if self.marked else SEM_RELEASE_WFI)
                     | SEM_PAYLOAD_64BIT | SEM_REDUCTION_IADD | SEM_REDUCTION_UNSIGNED)
        if self.timeline.interrupt:
            words.interrupt()
        return words

    def lay_runs(self) -> None:
        """Make ``runs``: ``runs[r - 1]`` names commands that run ``r`` repetitions as one
        GPFIFO entry, up to :data:`RUN_MOST`. Copies of the step's QMDs, one set a repetition,
        are chained into the step's own (the last set): each set's last QMD adds one to the
        timeline word by its release and schedules the next set's first, so the GPU goes from
        repetition to repetition with no host work. The entry of ``r`` clears the marker,
        sends the first QMD of the set ``r - 1`` sets before the step's own, and ends as the
        step does (the marker's acquire, then the last repetition's one added). Only for a
        sealed marked step of launches alone where :data:`CHAIN` holds; otherwise, or where
        mapped memory is short, ``runs`` is the step's own entry alone. Once laid (until
        :meth:`free`), a call does nothing."""
        assert self.memory is not None and self.memory.host is not None
        if self.runs:
            return
        launches = [i for i in self.items if isinstance(i, _Launch)]
        d, release = self.device, self._release
        self.runs = (self.entry,)
        if release is None or not CHAIN or len(launches) != len(self.items):
            return
        layout = qmd.LAYOUTS[d.classes.qmd_version]
        slot = -(-layout.size // 256) * 256  # a QMD is 256-byte aligned (qmd.chain)
        per = slot * len(launches)
        sets = min(RUN_MOST - 1, RUN_BYTES // per)
        if not sets:
            return
        n = len(self._run_commands(0, 0))
        memory = d.alloc(sets * per + sets * n * 4, Memory.MAPPED)
        if memory is None:
            return
        own, host = self.memory, view(memory.host or 0, memory.length)
        step_host = view(own.host or 0, own.length)

        def first_of(k: int, i: int) -> int:  # GPU address of set k's i-th QMD
            return memory.gpu + k * per + i * slot if k < sets else own.gpu + launches[i].at

        for k in range(sets):
            for i, item in enumerate(launches):
                q = bytearray(step_host[item.at : item.at + layout.size])
                if i + 1 < len(launches):
                    qmd.chain(layout, q, first_of(k, i + 1))
                else:
                    qmd.chain(layout, q, first_of(k + 1, 0))
                    release.write(q, 0, self.timeline.gpu, 1, add=True)
                host[k * per + i * slot : k * per + i * slot + layout.size] = q
        entries = [self.entry]
        for r in range(2, sets + 2):  # r repetitions: from set sets + 1 - r
            at = sets * per + (r - 2) * n * 4
            words = self._run_commands(own.gpu + self.marker, first_of(sets + 1 - r, 0))
            host[at : at + n * 4] = memoryview(words.words).cast("B")
            entries.append(entry_at(memory.gpu + at, n))
        self.run_memory = memory
        self.runs = tuple(entries)

    def _run_commands(self, marker: int, first: int) -> Push:
        """A run's commands (:meth:`lay_runs`): the QMD at ``first`` sent between the marker's
        clearing and the step's end."""
        return self._end(_cleared(marker).send_qmd(first), marker)

    def set_args(self, index: int, args: Sequence[Any]) -> None:
        """Give launch ``index`` new arguments for the next submissions.

        Waits until the step's earlier submissions are done, since they read the same bank.
        Raises :class:`Misuse` for an index that is no launch, or arguments out of range.
        """
        index = checks.whole("a step item's index", index)
        item = self.items[index] if 0 <= index < len(self.items) else None
        if not isinstance(item, _Launch):
            raise Misuse(f"step item {index} is not a launch")
        launching.fill_args(item.fn, item.bank, args)
        if self.memory is not None:
            if self._last is not None:
                self._last.wait()
            host = view(self.memory.host or 0, self.memory.length)
            host[item.at + 512 : item.at + 512 + len(item.bank)] = item.bank

    def submit(self, times: int = 1) -> Point:
        """Run the step ``times`` more times, each with its own value on the device's
        timeline, in order; returns the last one's point. After compute work they go with one
        doorbell as far as the ring has room, a marked step of launches alone as runs of up to
        :data:`RUN_MOST` an entry (:meth:`lay_runs`, at the first ``times`` above 1), others
        one entry each. Raises :class:`Misuse` for ``times`` that is no whole number of at
        least 1, having submitted nothing."""
        if times != 1:
            times = checks.whole("times", times)
            if times < 1:
                raise Misuse(f"a step is submitted at least once, not times={times}")
        if self.memory is None or (times != 1 and not self.runs):
            with self._laying:  # threads submitting it at once make its memory once
                if self.memory is None:
                    self._seal()
                if times != 1:
                    self.lay_runs()
        self._last = point = self.timeline.submit_step(self, times)
        return point

    def stamp_room(self) -> None:
        """Make sure of the memory :meth:`stamped` writes: mapped memory of the step's own
        for its commands and two stamps. Raises :class:`RigError` when there is none."""
        if self.stamped_memory is None:
            d, n = self.device, (len(self.commands) + 12 + len(INVALIDATE)) * 4
            memory = d.alloc(n, Memory.MAPPED)
            if memory is None:
                raise RigError(f"{d.facts.name}: no mapped memory for a profiled step of "
                               f"{n} bytes")
            self.stamped_memory = memory

    def stamped(self, start: int, end: int, first: Sequence[int] = ()) -> tuple[int, int]:
        """(GPU address, dwords) of the step's commands between a start and an end stamp
        (GPU addresses of a profile's slots), the end stamp before their release, in the
        memory :meth:`stamp_room` made: for a step whose commands are too many to copy into
        the pushbuffer; ``first``: words before them all (an invalidate). The device calls
        it only once every earlier submission is done, so no GPU reads that memory while it
        changes."""
        cmds, memory = self.commands, self.stamped_memory
        assert memory is not None and memory.host is not None
        last, idle = self.timeline.release_words, not self.marked
        words = (array("I", first) + Push().timestamp(start, idle).words + cmds[:-last]
                 + Push().timestamp(end, idle).words + cmds[-last:])
        view(memory.host, len(words) * 4)[:] = memoryview(words).cast("B")
        return memory.gpu, len(words)

    def free(self) -> None:
        """Give back the step's memory once its submissions are done."""
        if self._last is not None:
            self._last.wait()
        for memory in (self.memory, self.stamped_memory, self.run_memory):
            if memory is not None:
                self.device.free(memory)
        self.memory = self.stamped_memory = self.run_memory = None
        self.runs = ()  # a submission after this lays them again, in the memory it seals


def _cleared(marker: int) -> Push:
    """Words that clear a marked step's marker at ``marker`` as the channel reaches them,
    waiting for no idle: the step's last grid sets it again."""
    return Push().semaphore_release(marker, 0, idle=False)
