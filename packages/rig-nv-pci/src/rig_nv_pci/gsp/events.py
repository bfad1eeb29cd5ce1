"""The GSP's events that say something went wrong, decoded, and a log the device polls.

The GSP sends these unasked, on the status queue (:class:`rig_nv_pci.gsp.rpc.Rpc` hands them
to its ``on_event``): a channel it stopped (RC_TRIGGERED, the Xid of the kernel log), a
non-replayable MMU fault waiting to be serviced (MMU_FAULT_QUEUED), an Xid's text
(OS_ERROR_LOG), a ucode's LibOS print (UCODE_LIBOS_PRINT), lockdown engaging or released
(GSP_LOCKDOWN_NOTICE) and an RM event for a client (POST_EVENT). :class:`EventLog` keeps what
they say until the device asks (:meth:`EventLog.fault`, through
:meth:`rig_nv_pci.path.pci.PciPath.fault`).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/gsp-events.md."""

from __future__ import annotations

import struct
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rig_edge import Fault, Lost, RigError
from rig_nv.faults import ACCESS_OF_TYPE, ENGINE, FAULT_TYPE, MMU_FAULT, xid_name
from rig_nv_pci.gsp.rpc import Event, Incoming

# Each layout is its struct up to a flexible array member (which follows at .size). NvBool is
# one byte; scalars are naturally aligned.
# rpc_rc_triggered_v17_02: nv2080EngineType, chid, gfid, exceptLevel, exceptType, scope,
# NvU16 partitionAttributionId (+2), mmuFaultAddrLo, mmuFaultAddrHi, mmuFaultType,
# NvBool bCallbackNeeded (+3), rcJournalBufferSize, then rcJournalBuffer[]: 48 bytes.
RC_TRIGGERED = struct.Struct("<6IH2x3I?3xI")
# rpc_os_error_log_v17_00: exceptType, runlistId, chid, char errString[0x100],
# preemptiveRemovalPreviousXid: 272 bytes.
OS_ERROR_LOG = struct.Struct("<3I256sI")
# rpc_ucode_libos_print_v1E_08: ucodeEngDesc, libosPrintBufSize, then libosPrintBuf[]: 8 bytes.
LIBOS_PRINT = struct.Struct("<2I")
# rpc_gsp_lockdown_notice_v17_00: NvBool bLockdownEngaging: 1 byte.
LOCKDOWN_NOTICE = struct.Struct("<?")
# rpc_post_event_v17_00: NvHandle hClient, hEvent, notifyIndex, data, NvU16 info16 (+2),
# status, eventDataSize, NvBool bNotifyList, then eventData[] at offset 29 (sizeof 32).
POST_EVENT = struct.Struct("<4IH2x2I?")

LINES_KEPT = 256  # text lines an EventLog keeps, the oldest dropped first


class EventError(RigError):
    """An event's payload does not hold what its struct says."""


def _fixed(name: str, struct_name: str, layout: struct.Struct, payload: bytes) -> tuple[Any, ...]:
    if len(payload) < layout.size:
        raise EventError(f"GSP event {name}: {len(payload)} bytes, shorter than "
                         f"{struct_name}'s {layout.size}")
    return layout.unpack_from(payload)


def _tail(name: str, member: str, payload: bytes, at: int, size: int) -> bytes:
    if len(payload) < at + size:
        raise EventError(f"GSP event {name}: {member} of {size} bytes, but only "
                         f"{max(0, len(payload) - at)} follow its struct")
    return payload[at:at + size]


@dataclass(frozen=True)
class RcTriggered:
    """RC_TRIGGERED: a channel the GSP's robust-channel recovery stopped."""

    engine_type: int  # nv2080EngineType
    chid: int
    gfid: int
    except_level: int
    except_type: int  # the Xid, e.g. 31 ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT
    scope: int
    partition_attribution_id: int
    mmu_fault_address: int  # mmuFaultAddrHi:Lo
    mmu_fault_type: int
    callback_needed: bool
    journal: bytes  # rcJournalBuffer[rcJournalBufferSize]

    @property
    def engine(self) -> str:
        return ENGINE.get(self.engine_type, f"engine type 0x{self.engine_type:x}")


def decode_rc_triggered(payload: bytes) -> RcTriggered:
    name = "RC_TRIGGERED"
    (engine, chid, gfid, level, xtype, scope, part, lo, hi, ftype, callback,
     size) = _fixed(name, "rpc_rc_triggered_v17_02", RC_TRIGGERED, payload)
    journal = _tail(name, "rcJournalBuffer", payload, RC_TRIGGERED.size, size)
    return RcTriggered(engine, chid, gfid, level, xtype, scope, part, hi << 32 | lo, ftype,
                       callback, journal)


@dataclass(frozen=True)
class OsErrorLog:
    """OS_ERROR_LOG: an Xid the GSP reports, with the text RM prints for it."""

    except_type: int  # the Xid
    runlist_id: int
    chid: int
    err_string: str  # errString up to its NUL
    preemptive_removal_previous_xid: int


def decode_os_error_log(payload: bytes) -> OsErrorLog:
    xtype, runlist, chid, text, previous = _fixed("OS_ERROR_LOG", "rpc_os_error_log_v17_00",
                                                  OS_ERROR_LOG, payload)
    return OsErrorLog(xtype, runlist, chid, text.split(b"\0", 1)[0].decode(errors="replace"),
                      previous)


@dataclass(frozen=True)
class LibosPrint:
    """UCODE_LIBOS_PRINT: a ucode's LibOS log buffer (its entries need the ucode's format
    strings to read; they are kept as bytes)."""

    ucode_eng_desc: int  # the engine class in bits 31:8 (nouveau: ucodeEngDesc >> 8)
    data: bytes  # libosPrintBuf[libosPrintBufSize]

    @property
    def text(self) -> str:
        """The buffer as text where it is printable, else its first 64 bytes in hex."""
        body = self.data.rstrip(b"\0")
        if body.isascii() and all(c >= 0x20 or c in b"\t\n\r" for c in body):
            return body.decode()
        return self.data[:64].hex() + ("..." if len(self.data) > 64 else "")


def decode_libos_print(payload: bytes) -> LibosPrint:
    name = "UCODE_LIBOS_PRINT"
    desc, size = _fixed(name, "rpc_ucode_libos_print_v1E_08", LIBOS_PRINT, payload)
    return LibosPrint(desc, _tail(name, "libosPrintBuf", payload, LIBOS_PRINT.size, size))


@dataclass(frozen=True)
class LockdownNotice:
    """GSP_LOCKDOWN_NOTICE: the GSP entering (or leaving) lockdown (RM's bInLockdown)."""

    engaging: bool  # bLockdownEngaging


def decode_lockdown_notice(payload: bytes) -> LockdownNotice:
    (engaging,) = _fixed("GSP_LOCKDOWN_NOTICE", "rpc_gsp_lockdown_notice_v17_00",
                         LOCKDOWN_NOTICE, payload)
    return LockdownNotice(engaging)


@dataclass(frozen=True)
class PostEvent:
    """POST_EVENT: an RM event for a client's event object (hEvent, notifyIndex)."""

    h_client: int
    h_event: int
    notify_index: int
    data: int
    info16: int
    status: int
    notify_list: bool  # bNotifyList
    event_data: bytes  # eventData[eventDataSize]


def decode_post_event(payload: bytes) -> PostEvent:
    name = "POST_EVENT"
    client, event, index, data, info16, status, size, notify_list = _fixed(
        name, "rpc_post_event_v17_00", POST_EVENT, payload)
    return PostEvent(client, event, index, data, info16, status, notify_list,
                     _tail(name, "eventData", payload, POST_EVENT.size, size))


@dataclass(frozen=True)
class MmuFaultQueued:
    """MMU_FAULT_QUEUED: a non-replayable MMU fault is waiting in the shadow buffer (no
    payload that RM reads)."""


def decode_mmu_fault_queued(payload: bytes) -> MmuFaultQueued:
    return MmuFaultQueued()


Decoded = RcTriggered | OsErrorLog | LibosPrint | LockdownNotice | PostEvent | MmuFaultQueued

DECODERS: dict[int, Callable[[bytes], Decoded]] = {
    Event.RC_TRIGGERED: decode_rc_triggered,
    Event.MMU_FAULT_QUEUED: decode_mmu_fault_queued,
    Event.OS_ERROR_LOG: decode_os_error_log,
    Event.UCODE_LIBOS_PRINT: decode_libos_print,
    Event.GSP_LOCKDOWN_NOTICE: decode_lockdown_notice,
    Event.POST_EVENT: decode_post_event,
}


def decode(event: Incoming) -> Decoded | None:
    """The event decoded, or None for an event this module does not decode."""
    decoder = DECODERS.get(event.function)
    return None if decoder is None else decoder(event.payload)


def rc_fault(rc: RcTriggered, channel: str | None = None) -> Fault:
    """The :class:`rig_edge.Fault` an RC_TRIGGERED stands for, named as rig_nv's device names
    a channel's fault (:func:`rig_nv.faults.channel_fault`): the Xid, the channel (``channel``,
    the device's name of it, else its ChID), the engine; for an MMU fault (Xid 31) the fault
    type's name (NV_PFAULT_FAULT_TYPE_*, whose numbers RM's FAULT_TYPE shares up to 0xf), the
    faulting address (the MMU's, at page granularity; 0 too) and the access the type implies."""
    where = f"on the {channel} channel" if channel else f"on channel {rc.chid}"
    text = f"{xid_name(rc.except_type)} {where}"
    if rc.except_type == MMU_FAULT:
        kind = FAULT_TYPE.get(rc.mmu_fault_type, f"MMU fault type {rc.mmu_fault_type}")
        return Fault(f"{text}: {kind}", address=rc.mmu_fault_address,
                     access=ACCESS_OF_TYPE.get(rc.mmu_fault_type), engine=rc.engine)
    return Fault(text, address=rc.mmu_fault_address or None, engine=rc.engine)


class EventLog:
    """What the GSP's events said, kept until the device asks.

    :meth:`take` (an :class:`Rpc`'s ``on_event``) records an event; a payload that does not
    decode raises :class:`EventError` naming the event. :meth:`lose` records the GPU lost
    (a sequencer that failed). :meth:`fault` answers the device: the :class:`rig_edge.Fault`
    of the first RC_TRIGGERED since the last question that names one of its channels, or the
    loss :meth:`lose` recorded, whichever came first, else that loss, else
    :class:`rig_edge.Lost` while the GSP's last lockdown notice said engaging
    (:meth:`raise_pending` raises the same for any channel). OS_ERROR_LOG, LibOS prints and
    the others are kept as text (:attr:`lines`, the last :data:`LINES_KEPT`) for error
    messages.
    """

    def __init__(self, name: str = "GPU", *, keep: int = LINES_KEPT) -> None:
        self.name = name
        self.lines: deque[str] = deque(maxlen=keep)
        self.events: deque[Decoded] = deque(maxlen=keep)
        self.in_lockdown = False
        # how many reports of trouble came (RC_TRIGGERED, MMU_FAULT_QUEUED, lockdown engaging,
        # lose()), whoever's channel: what faulted_since compares
        self.faults = 0
        self.lost: Lost | None = None  # what lose() recorded first
        self.answer: Lost | None = None  # the first answer fault() kept
        # the reports not yet examined, in the order they came
        self._reports: deque[RcTriggered | Lost] = deque(maxlen=keep)
        self._lock = threading.Lock()

    def take(self, event: Incoming) -> Decoded | None:
        decoded = decode(event)
        with self._lock:
            if decoded is None:
                self.lines.append(f"GSP event {event.name} ({len(event.payload)} bytes)")
                return None
            self.events.append(decoded)
            self.lines.append(_line(decoded))
            if isinstance(decoded, RcTriggered):
                self._reports.append(decoded)
            elif isinstance(decoded, LockdownNotice):
                self.in_lockdown = decoded.engaging
            if (isinstance(decoded, RcTriggered | MmuFaultQueued)
                    or (isinstance(decoded, LockdownNotice) and decoded.engaging)):
                self.faults += 1
            return decoded

    def lose(self, why: object) -> Lost:
        """Record the GPU lost for ``why`` (a RUN_CPU_SEQUENCER that failed or was cut short,
        naming the opcode and its offset): a report :meth:`fault` answers in its turn, and
        from then on whenever no earlier report is left."""
        lost = Lost(f"{self.name}: {why}")
        with self._lock:
            self.lines.append(f"the GPU is lost: {why}")
            self._reports.append(lost)
            self.faults += 1
            if self.lost is None:
                self.lost = lost
        return lost

    def fault(self, channel: Callable[[RcTriggered], str | None], *,
              keep: bool = False) -> Lost | None:
        """The first report since the last call (of this or :meth:`raise_pending`): the
        :class:`rig_edge.Fault` of an RC_TRIGGERED that ``channel`` names (the device's name
        of the channel it stopped; one it names none of, not the device's, stays a line) or
        the loss :meth:`lose` recorded; else that loss, else :class:`rig_edge.Lost` while
        lockdown is engaged, else ``None``.

        The reports are let go (the rest with the one answered) only once the answer is
        known, all at once, so an exception meanwhile (in ``channel``, a KeyboardInterrupt)
        drops none; ``channel`` must not call into the log. With ``keep``
        (a device, whose loss is final) the first answer is kept before that and every later
        call with ``keep`` answers it again: one the caller never got to record is not lost
        either."""
        with self._lock:
            if keep and self.answer is not None:
                return self.answer
            answer: Lost | None = None
            for report in self._reports:
                if isinstance(report, Lost):
                    answer = report
                    break
                name = channel(report)
                if name is not None:
                    answer = rc_fault(report, name)
                    break
            if answer is None:
                answer = self.lost
            if answer is None and self.in_lockdown:
                answer = Lost(f"{self.name}: the GSP engaged lockdown (GSP_LOCKDOWN_NOTICE)")
            if keep and answer is not None:
                self.answer = answer
            self._reports = deque(maxlen=self._reports.maxlen)
            return answer

    def faulted_since(self, mark: int) -> bool:
        """Whether the GPU may have faulted since :attr:`faults` read ``mark``: a report of
        trouble came since (an RC_TRIGGERED or MMU_FAULT_QUEUED of any channel, lockdown
        engaging, a loss :meth:`lose` recorded), or the GSP is in lockdown, or the GPU is
        lost (:class:`rig_nv_pci.path.rm.PciRM` keeps a refused allocation's memory then)."""
        with self._lock:
            return self.faults != mark or self.in_lockdown or self.lost is not None

    def raise_pending(self) -> None:
        """Raise what :meth:`fault` answers, any channel's RC_TRIGGERED named by its ChID."""
        lost = self.fault(lambda rc: "")
        if lost is not None:
            raise lost

    def text(self, last: int = 8) -> str:
        """The last ``last`` lines, one per line, for an error message."""
        with self._lock:
            return "\n".join(list(self.lines)[-last:])


def _line(e: Decoded) -> str:
    if isinstance(e, RcTriggered):
        return (f"RC_TRIGGERED: {xid_name(e.except_type)} on channel {e.chid} of {e.engine}"
                + (f" at 0x{e.mmu_fault_address:x}" if e.mmu_fault_address else ""))
    if isinstance(e, OsErrorLog):
        return (f"OS_ERROR_LOG: {xid_name(e.except_type)} channel {e.chid} runlist "
                f"{e.runlist_id}: {e.err_string}")
    if isinstance(e, LibosPrint):
        return f"UCODE_LIBOS_PRINT from class 0x{e.ucode_eng_desc >> 8:x}: {e.text}"
    if isinstance(e, LockdownNotice):
        return f"GSP_LOCKDOWN_NOTICE: lockdown {'engaging' if e.engaging else 'released'}"
    if isinstance(e, PostEvent):
        return (f"POST_EVENT: client 0x{e.h_client:x} event 0x{e.h_event:x} notify "
                f"{e.notify_index} data 0x{e.data:x} status 0x{e.status:x}")
    return "MMU_FAULT_QUEUED"
