"""Steps: launches and copies recorded once and submitted again and again (what CUDA graphs
are for).

A step's commands, QMDs and constant banks are written once into memory the GPU reads. Each
submission is one GPFIFO entry (:meth:`rig_nv.Device._submit_step`): after compute work it
names the step's commands where they lie; after the copy channel's work, or under a profile,
it names a copy of them in the compute channel's pushbuffer behind the wait and the stamps.
The commands end by adding one to the timeline word (a 64-bit unsigned IADD reduction,
clc56f.h SEM_EXECUTE), so they never change between submissions. Launches inside a step run
one after another: a host WFI between them waits for the compute engine before the next starts.
"""

from __future__ import annotations

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
    COMPUTE_SEND_PCAS_A,
    COMPUTE_SEND_SIGNALING_PCAS2_B,
    NON_STALL_INTERRUPT,
    SEM_ADDR_LO,
    SEM_PAYLOAD_64BIT,
    SEM_RELEASE_WFI,
    SUBC_COMPUTE,
    SUBC_HOST,
    WFI,
    Push,
    lo_hi,
)

if TYPE_CHECKING:
    from rig_nv.device import Device, Point

# SEM_EXECUTE OPERATION REDUCTION (6), REDUCTION IADD (5) in 30:27, FORMAT UNSIGNED (1) at 31.
SEM_OP_REDUCTION = 6
SEM_REDUCTION_IADD = 5 << 27
SEM_REDUCTION_UNSIGNED = 1 << 31
WFI_SCOPE_ALL = 1
INVALIDATE_CODE_AND_DATA = 0x1011
CHAIN = True  # consecutive launches chained as dependent QMDs (False: each sent, unordered)
PCAS_ACTION = 3  # SEND_SIGNALING_PCAS2_B INVALIDATE_COPY_SCHEDULE (clcbc0.h), as NVK sends
RELEASE_WORDS = 8  # the commands' last words: the timeline's reduction, the non-stall interrupt
ENTRY_MOST = 0x1FFFFF  # dwords one GPFIFO entry names (clc86f.h NVC86F_GP_ENTRY1_LENGTH 30:10)
# A step's commands copied into the pushbuffer take at most this part of it.
PUSHBUFFER_SHARE = 2
AROUND = 18  # words a submission may put around the commands: an acquire and two stamps


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

    def __init__(self, device: Device) -> None:
        self.device = device
        self._items: list[_Launch | _Copy] = []
        self._memory: Region | None = None
        self._pb = 0  # GPU address of the commands in the step's memory, once sealed
        self._words = 0  # and their number of words
        self._entry = 0  # the GPFIFO entry naming them (rig_nv.channel.entry_at)
        self._cmds = array("I")  # the commands, for submissions that copy them
        self._stamped_memory: Region | None = None  # see _stamped
        self._last: Point | None = None

    def launch(self, fn: launching.Function, grid: Sequence[int], block: Sequence[int],
               args: Sequence[Any] = (), shared: int = 0) -> int:
        """Record a launch; returns its index (for :meth:`set_args`). Raises :class:`Misuse`
        as :meth:`rig_nv.Device.launch` does."""
        self._unsealed()
        prep = launching.prepare(self.device, fn, grid, block, shared)
        bank = bytearray(prep.bank)
        launching.fill_args(fn, bank, args)  # checked before local memory grows
        if prep.local > self.device._slm:
            self.device._ensure_local(prep.local)
            prep = launching.prepare(self.device, fn, grid, block, shared)
            bank = bytearray(prep.bank)
            launching.fill_args(fn, bank, args)
        self._items.append(_Launch(fn, prep, bank))
        return len(self._items) - 1

    def copy(self, dst: Region, src: Region, n: int | None = None, *, dst_offset: int = 0,
             src_offset: int = 0) -> None:
        """Record a copy on the copy engine of the compute channel. Raises :class:`Misuse` as
        :meth:`rig_nv.Device.copy` does."""
        self._unsealed()
        if n is None:
            n = checks.region_of("source", src).length - checks.whole("src_offset", src_offset)
        dst, dst_offset, n = checks.span(self.device, "destination", dst, dst_offset, n)
        src, src_offset, n = checks.span(self.device, "source", src, src_offset, n)
        self._items.append(_Copy(dst.gpu + dst_offset, src.gpu + src_offset, n))

    def _unsealed(self) -> None:
        if self._memory is not None:
            raise Misuse("a step is recorded before its first submit; record another step")

    def _seal(self) -> None:
        d = self.device
        launches = [i for i in self._items if isinstance(i, _Launch)]
        if not self._items:
            raise Misuse("an empty step has nothing to submit")
        # Layout: the QMD and bank of each launch (a 512-byte slot, then its bank), then the
        # commands. Commands are built once to measure them, then with the real addresses.
        at = 0
        for x in launches:
            x.at = at
            at += -(-(512 + len(x.bank)) // 256) * 256
        n = len(self._commands(0, None))
        if n + AROUND > ENTRY_MOST:
            raise Misuse(f"a step of {len(self._items)} items makes {n} words of commands, more "
                         f"than one GPFIFO entry holds ({ENTRY_MOST - AROUND} with its wait and "
                         "stamps): record them as several steps")
        size = at + n * 4
        # Video memory seen through BAR1: the GPU fetches QMDs and commands from its own memory.
        memory = d.alloc(size, Memory.MAPPED)
        if memory is None:
            raise RigError(f"{d.facts.name}: no mapped memory for a step of {size} bytes")
        self._memory = memory
        host = view(memory.host or 0, memory.length)
        words = self._commands(memory.gpu, host)
        data = memoryview(words.words).cast("B")
        host[at : at + len(data)] = data
        self._pb = memory.gpu + at
        self._words = len(words)
        self._entry = entry_at(self._pb, self._words)
        self._cmds = words.words

    def _commands(self, base: int, host: memoryview | None) -> Push:
        """The step's commands for its memory at GPU address ``base`` (QMDs and banks are
        written into ``host`` when given). Launches that follow one another are chained: each
        QMD names the next as its dependent, so only the first is sent and the GPU starts each
        as soon as the one before completes. A copy waits for the engine (WFI) first."""
        d = self.device
        words = Push()
        words.method(SUBC_COMPUTE, COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI,
                     INVALIDATE_CODE_AND_DATA)
        items = self._items
        for n, item in enumerate(items):
            before = items[n - 1] if n else None
            if isinstance(item, _Launch):
                if host is not None:
                    q = host[item.at : item.at + len(item.prep.qmd)]
                    q[:] = item.prep.qmd
                    qmd.patch_cbuf0(d._qmd_layout, q, base + item.at + 512)
                    launching.address_bank(item.prep, item.bank, 0, base + item.at + 512)
                    host[item.at + 512 : item.at + 512 + len(item.bank)] = item.bank
                    after = items[n + 1] if n + 1 < len(items) else None
                    if isinstance(after, _Launch) and CHAIN:
                        qmd.chain(d._qmd_layout, q, base + after.at)
                if not isinstance(before, _Launch) or not CHAIN:
                    if before is not None:
                        words.method(SUBC_HOST, WFI, WFI_SCOPE_ALL)
                    words.method(SUBC_COMPUTE, COMPUTE_SEND_PCAS_A, (base + item.at) >> 8)
                    words.method(SUBC_COMPUTE, COMPUTE_SEND_SIGNALING_PCAS2_B, PCAS_ACTION)
            else:
                if before is not None:
                    words.method(SUBC_HOST, WFI, WFI_SCOPE_ALL)
                    words.method(SUBC_COMPUTE, COMPUTE_INVALIDATE_SHADER_CACHES_NO_WFI,
                                 INVALIDATE_CODE_AND_DATA)
                words.copy(item.dst, item.src, item.length)
        words.method(SUBC_HOST, SEM_ADDR_LO, *lo_hi(d.timeline.gpu), *lo_hi(1),
                     SEM_OP_REDUCTION | SEM_RELEASE_WFI | SEM_PAYLOAD_64BIT
                     | SEM_REDUCTION_IADD | SEM_REDUCTION_UNSIGNED)
        words.method(SUBC_HOST, NON_STALL_INTERRUPT, 0)
        return words

    def set_args(self, index: int, args: Sequence[Any]) -> None:
        """Give launch ``index`` new arguments for the next submissions.

        Waits until the step's earlier submissions are done, since they read the same bank.
        Raises :class:`Misuse` for an index that is no launch, or arguments out of range.
        """
        index = checks.whole("a step item's index", index)
        item = self._items[index] if 0 <= index < len(self._items) else None
        if not isinstance(item, _Launch):
            raise Misuse(f"step item {index} is not a launch")
        launching.fill_args(item.fn, item.bank, args)
        if self._memory is not None:
            if self._last is not None:
                self._last.wait()
            host = view(self._memory.host or 0, self._memory.length)
            host[item.at + 512 : item.at + 512 + len(item.bank)] = item.bank

    def submit(self) -> Point:
        """Run the step once more, as one GPFIFO entry; returns its point on the device's
        timeline."""
        if self._memory is None:
            self._seal()
        self._last = self.device._submit_step(self)
        return self._last

    def _stamp_room(self) -> None:
        """Make sure of the memory :meth:`_stamped` writes: mapped memory of the step's own
        for its commands and two stamps. Raises :class:`RigError` when there is none."""
        if self._stamped_memory is None:
            d, n = self.device, (len(self._cmds) + 12) * 4
            memory = d.alloc(n, Memory.MAPPED)
            if memory is None:
                raise RigError(f"{d.facts.name}: no mapped memory for a profiled step of "
                               f"{n} bytes")
            self._stamped_memory = memory

    def _stamped(self, start: int, end: int) -> tuple[int, int]:
        """(GPU address, dwords) of the step's commands between a start and an end stamp
        (GPU addresses of a profile's slots), the end stamp before their release, in the
        memory :meth:`_stamp_room` made: for a step whose commands are too many to copy into
        the pushbuffer. The device calls it only once every earlier submission is done, so
        no GPU reads that memory while it changes."""
        cmds, memory = self._cmds, self._stamped_memory
        assert memory is not None and memory.host is not None
        words = (Push().timestamp(start).words + cmds[:-RELEASE_WORDS]
                 + Push().timestamp(end).words + cmds[-RELEASE_WORDS:])
        view(memory.host, len(words) * 4)[:] = memoryview(words).cast("B")
        return memory.gpu, len(words)

    def free(self) -> None:
        """Give back the step's memory once its submissions are done."""
        if self._last is not None:
            self._last.wait()
        for memory in (self._memory, self._stamped_memory):
            if memory is not None:
                self.device.free(memory)
        self._memory = self._stamped_memory = None


def submit_after(d: Device, step: Step) -> Point:
    """Submit ``step`` after the copy channel's work, or under a profile (the caller holds
    ``d``'s lock and has checked the device): one GPFIFO entry still.

    The step must first acquire the previous value, and under a profile stamps bracket it: so
    the acquire, the stamps and a copy of the step's commands (the end stamp before its
    release) go through the compute channel's pushbuffer as one entry. An entry names one run
    of words, so the acquire must lie right before the commands; it is not kept in the step's
    memory, since its value changes with every submission while the GPU may still read that
    memory for an earlier one (patching it there would wait for that, and stall a
    copy-step-copy-step pipeline). The pushbuffer hands out only bytes no submission still
    reads (Arena), and the step's commands never change once sealed (set_args changes a bank
    only once the step's submissions are done). A step whose copy would fill more than half
    the pushbuffer (some 20,000 copies) is the exception: the CPU waits for the work before it
    (so for its own earlier submissions), then sends its commands, with no acquire, or between
    stamps in memory of its own (Step._stamped).
    """
    from rig_nv.device import Point

    compute = d.compute
    # What may fail comes before the value is taken: a value never submitted would leave the
    # next step's addition one short.
    after = d._last is not None and d._last is not compute
    cmds = step._cmds
    fits = (len(cmds) + AROUND) * 4 <= compute.pb.length // PUSHBUFFER_SHARE
    profile = d._profile
    if profile is not None and not fits:
        d._wait_value(d._next - 1)
        step._stamp_room()
    stamps = profile.take("step", "compute") if profile is not None else None
    value = d._next
    d._next = value + 1
    if profile is not None:
        profile.value(value)
    done = d._word[0]
    if not after and stamps is None:
        compute.submit_entry(step._entry, value, done)
    elif fits:
        words = array("I")
        if after:
            acquire = d._acquire
            acquire[3], acquire[4] = (value - 1) & 0xFFFFFFFF, (value - 1) >> 32
            words.extend(acquire)
        if stamps is None:
            words.extend(cmds)
        else:
            words.extend(Push().timestamp(stamps[0]).words)
            words.extend(cmds[:-RELEASE_WORDS])
            words.extend(Push().timestamp(stamps[1]).words)
            words.extend(cmds[-RELEASE_WORDS:])
        compute.submit(words, value, done)
    else:
        d._wait_value(value - 1)  # done already under a profile
        if stamps is None:
            compute.submit_entry(step._entry, value, d._word[0])
        else:
            compute.submit_at(*step._stamped(*stamps), value, d._word[0])
    d._last = compute
    return Point(d, value)
