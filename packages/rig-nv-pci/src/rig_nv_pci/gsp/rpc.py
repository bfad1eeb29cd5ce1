"""RPC framing over the GSP's message queues, and the RM interface rig-nv speaks over it.

Each message holds an ``rpc_message_header_v`` and a payload. A request longer than one
message (:data:`MAX_PAYLOAD`) goes as a first part under its function and CONTINUATION_RECORD
messages after it, and its reply comes back alike (rpc.c ``_issueRpcLarge``). Events the GSP
sends while the CPU waits go to a callback (kernel_gsp.c ``_kgspRpcRecvPoll``); their payloads
are decoded by :mod:`rig_nv_pci.gsp.events`, those of the RM's requests laid out by
:mod:`rig_nv_pci.gsp.payloads`.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/gsp-rpc.md."""

from __future__ import annotations

import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

from rig_edge import Lost, Misuse, RigError
from rig_nv.rm import RM, RMError
from rig_nv.status import status_name
from rig_nv_pci.gsp.payloads import (
    ALLOC,
    CONTROL,
    FREE,
    AllocReply,
    ControlReply,
    decode_alloc,
    decode_control,
    decode_free,
    encode_alloc,
    encode_control,
    encode_free,
    root_params,
)
from rig_nv_pci.gsp.queue import RPC_SIZE_MAX, Message, QueueError, QueuePair

# rpc_message_header_v03_00: header_version, signature, length, function, rpc_result,
# rpc_result_private, sequence, u (spare / cpuRmGfid).
HEADER = struct.Struct("<8I")
HEADER_VERSION = 0x03000000  # NV_VGPU_MSG_HEADER_VERSION_MAJOR_TOT 3 in bits 31:24, minor 0
SIGNATURE = 0x43505256  # NV_VGPU_MSG_SIGNATURE_VALID: the bytes "VRPC" in memory
RESULT_PENDING = 0xFFFFFFFF  # NV_VGPU_MSG_RESULT_RPC_PENDING, written into every request
RESULT_VMIOP_BASE = 0xFF000000  # DRF_BASE(NV_VGPU_MSG_RESULT__VMIOP): not NV_STATUS codes
MAX_PAYLOAD = RPC_SIZE_MAX - HEADER.size  # bytes of payload one message carries (65456)
SEQUENCE_MASK = 0xFFFFFFFF  # rpc_message_header_v.sequence is an NvU32, counted modulo 2^32
# NV_VGPU_MSG_EVENT_FIRST_EVENT (rpc_global_enums.h): numbers from it up are events the GSP
# sends unasked; those below are NV_VGPU_MSG_FUNCTION_*, whose messages from the GSP are replies
FIRST_EVENT = 0x1000
UNEXPECTED_KEPT = 64  # unexpected replies an Rpc keeps, the oldest dropped first
NV_ERR_GENERIC = 0xFFFF
T = TypeVar("T")

NV01_ROOT = 0x0  # cl0000.h; what nouveau's r535/r570 client constructors allocate on the GSP
CLIENT_HANDLE = 0xC1D00001  # RS_CLIENT_HANDLE_BASE | 1, as nouveau numbers its clients
FIRST_HANDLE = 0x52000000  # object handles, as rig's kernel path numbers them


class Function(IntEnum):
    """NV_VGPU_MSG_FUNCTION_* of 570.144 that this path sends (rpc_global_enums.h)."""

    ALLOC_MEMORY = 4
    FREE = 10
    MAP_MEMORY_DMA = 14
    UNMAP_MEMORY_DMA = 15
    UNLOADING_GUEST_DRIVER = 47
    GET_GSP_STATIC_INFO = 65
    CONTINUATION_RECORD = 71
    GSP_SET_SYSTEM_INFO = 72
    SET_REGISTRY = 73
    GSP_RM_CONTROL = 76
    GSP_RM_ALLOC = 103


class Event(IntEnum):
    """NV_VGPU_MSG_EVENT_* of 570.144 that rig handles: messages the GSP sends unasked
    (rpc_global_enums.h; the others are named in :data:`OTHER_EVENTS`)."""

    GSP_INIT_DONE = 0x1001
    GSP_RUN_CPU_SEQUENCER = 0x1002
    POST_EVENT = 0x1003
    RC_TRIGGERED = 0x1004
    MMU_FAULT_QUEUED = 0x1005
    OS_ERROR_LOG = 0x1006
    UCODE_LIBOS_PRINT = 0x100C
    GSP_LOCKDOWN_NOTICE = 0x101C
    UPDATE_GSP_TRACE = 0x101E
    GSP_POST_NOCAT_RECORD = 0x1020
    FECS_ERROR = 0x1021
    RECOVERY_ACTION = 0x1022


OTHER_EVENTS = {
    0x1000: "FIRST_EVENT", 0x1007: "RG_LINE_INTR", 0x1008: "GPUACCT_PERFMON_UTIL_SAMPLES",
    0x1009: "SIM_READ", 0x100A: "SIM_WRITE", 0x100B: "SEMAPHORE_SCHEDULE_CALLBACK",
    0x100D: "VGPU_GSP_PLUGIN_TRIGGERED", 0x100E: "PERF_GPU_BOOST_SYNC_LIMITS_CALLBACK",
    0x100F: "PERF_BRIDGELESS_INFO_UPDATE", 0x1010: "VGPU_CONFIG", 0x1011: "DISPLAY_MODESET",
    0x1012: "EXTDEV_INTR_SERVICE", 0x1013: "NVLINK_INBAND_RECEIVED_DATA_256",
    0x1014: "NVLINK_INBAND_RECEIVED_DATA_512", 0x1015: "NVLINK_INBAND_RECEIVED_DATA_1024",
    0x1016: "NVLINK_INBAND_RECEIVED_DATA_2048", 0x1017: "NVLINK_INBAND_RECEIVED_DATA_4096",
    0x1018: "TIMED_SEMAPHORE_RELEASE", 0x1019: "NVLINK_IS_GPU_DEGRADED",
    0x101A: "PFM_REQ_HNDLR_STATE_SYNC_CALLBACK", 0x101B: "NVLINK_FAULT_UP",
    0x101D: "MIG_CI_CONFIG_UPDATE", 0x101F: "NVLINK_FATAL_ERROR_RECOVERY",
}


# NV_VGPU_MSG_RESULT_RPC_* (rpc_headers.h): results above NV_STATUS's range.
RPC_RESULTS = {0xFF100001 + i: "NV_VGPU_MSG_RESULT_RPC_" + name for i, name in enumerate((
    "UNKNOWN_FUNCTION", "INVALID_MESSAGE_FORMAT", "HANDLE_NOT_FOUND", "HANDLE_EXISTS",
    "UNKNOWN_RM_ERROR", "UNKNOWN_VMIOP_ERROR", "RESERVED_HANDLE", "CUDA_PROFILING_DISABLED",
    "API_CONTROL_NOT_SUPPORTED"))} | {RESULT_PENDING: "NV_VGPU_MSG_RESULT_RPC_PENDING"}


def function_name(number: int) -> str:
    """NVIDIA's name of an RPC function or event number, or its number in hex."""
    for enum in (Function, Event):
        if number in enum._value2member_map_:
            return enum(number).name
    return OTHER_EVENTS.get(number, f"0x{number:x}")


def header(function: int, length: int, sequence: int) -> bytes:
    """A request's header as rpcWriteCommonHeader writes it (``length`` counts the header)."""
    return HEADER.pack(HEADER_VERSION, SIGNATURE, length, function, RESULT_PENDING,
                       RESULT_PENDING, sequence, 0)


@dataclass(frozen=True)
class Incoming:
    """A message from the GSP, a reply (its continuation records joined) or an event: its
    header's function, rpc_result and sequence, and the payload after the header; for an
    event, ``serial`` is its status queue element's sequence number (one per message), which
    tells a message handed on again (:meth:`Rpc.poll`) from the next."""

    function: int
    result: int
    sequence: int
    payload: bytes
    serial: int | None = None

    @property
    def name(self) -> str:
        return function_name(self.function)


def result_status(result: int) -> int:
    """The NV_STATUS an rpc_result stands for (_issueRpcAndWait: codes from 0xFF000000 up
    are the transport's own and count as NV_ERR_GENERIC)."""
    return result if result < RESULT_VMIOP_BASE else NV_ERR_GENERIC


def result_text(result: int) -> str:
    return RPC_RESULTS.get(result, status_name(result) if result < RESULT_VMIOP_BASE
                           else f"0x{result:08x}")


# -- the RPC engine ---------------------------------------------------------------------------


class RpcTimeout(RigError):
    """The GSP did not answer within the time allowed."""


class NotAnswering(RpcTimeout, Lost):
    """A request not sent: the GSP stopped answering at an earlier RPC (:attr:`Rpc.silent`),
    so the GPU is lost (a :class:`rig_edge.Lost`) and is reset at its next open. Also an
    :class:`RpcTimeout`: what GSP-RM made of the requests before is as unknown as after a
    timeout, so what was given for them stays kept (:mod:`rig_nv_pci.path.rm`)."""


class Refused(RMError):
    """GSP-RM answered a request of :class:`RpcRM` whole, with a refusal: the status its reply
    carries (the params' status, else its rpc_result), as rpcRmApiAlloc_GSP /
    rpcRmApiControl_GSP read one. GSP-RM made nothing of the request. Other failures of a
    request (no answer in time, a reply too short to hold its status, an exception while the
    reply was awaited) say nothing of what GSP-RM did with it, and are not this."""


class Rpc:
    """Requests and replies over a :class:`QueuePair`, one request at a time.

    ``on_event`` receives every message that is not the awaited reply, in order; an exception
    it raises is raised once the reply has been read, so the queues stay in step. One that is
    not an :class:`Exception` (KeyboardInterrupt) does not cost the message it interrupted:
    that message, and those that come after it while the reply is awaited, are handed on
    again, in order, by the next :meth:`poll` (which itself stops at once). ``sleep``
    is called with the seconds left while nothing has arrived (a short nap by default).
    Calling :meth:`call` from inside ``on_event`` is misuse (as in _kgspRpcRecvPoll).

    A reply is the awaited function with the awaited sequence (the module's docstring); a
    reply no call waits for, read during a wait or a poll, is not handed to ``on_event``: it
    is dropped and kept in :attr:`unexpected` (the last :data:`UNEXPECTED_KEPT`; how many in
    all in :attr:`unexpected_count`), as CPU-RM logs and drops it.

    A GSP that stopped answering costs one timeout: once a request's reply does not come in
    time (:class:`RpcTimeout`; the ``silent_after``-th such request) or the queues fail
    (:class:`QueueError`, in a request or a poll), :attr:`silent` says where, ``on_silent``
    is told once, and every later :meth:`call` and :meth:`post` raises :class:`NotAnswering`
    at once, sending nothing. So CPU-RM skips every RPC once its GSP had a fatal error
    (570.144 kernel_gsp.c _kgspRpcSanityCheck: "GSP crashed, skipping RPC",
    NV_ERR_RESET_REQUIRED) and, in later releases, once an RPC's timeout is fatal (595.45.04
    kernel_gsp.c _kgspHandleFatalTimeout marks the GPU for reset and sets bFatalError;
    _kgspIsTimeoutFatal makes the RmGspRpcTimeoutGpuResetThreshold-th timeout fatal, the
    third by default). rig's ``silent_after`` is 1: a GSP that let one request pass the
    timeout, 10 s by default, is taken as gone (None: never, for tests of late replies).
    :meth:`wait_for` is not counted: the boot waits for GSP_INIT_DONE in slices that time
    out by design.
    """

    def __init__(self, queues: QueuePair, *, on_event: Callable[[Incoming], None] | None = None,
                 sleep: Callable[[float], None] | None = None, timeout_s: float = 10.0,
                 silent_after: int | None = 1) -> None:
        self.queues = queues
        self.name = queues.name
        self.on_event = on_event
        self.timeout_s = timeout_s
        self._sleep = sleep or (lambda left: time.sleep(min(left, 50e-6)))
        # Requests are numbered from 1, so that a reply carrying 0 cannot pass for an echo.
        self._sequence = 1
        # Whether GSP-RM's replies carry their request's sequence (None: no reply to a numbered
        # request read yet). CPU-RM 580.82.07 on matches on it; 570.144's CPU-RM never sets a
        # request's sequence (only vgpu/rpc.c numbers its own messages) and matches by function
        # alone, and whether the 570.144 GSP-RM copies the request's sequence into its reply is
        # not in the open sources. So the first reply decides: one that carries its request's
        # number turns matching by sequence on; one that does not leaves matching by function
        # alone, as 570.144's CPU-RM does (where a late reply can then pass for the next one).
        self.echoes: bool | None = None
        self._backlog: deque[Message] = deque()
        self._lock = threading.RLock()
        self._in_event = False
        self._deferred: BaseException | None = None
        # messages an RPC's wait holds back once an interruption struck the handing on of one
        # (the first): handed on by the next poll, in order
        self._held: list[Message] = []
        # replies no call waited for (kernel_gsp.c _kgspProcessRpcEvent's "Unexpected RPC
        # event"): a timed-out or interrupted RPC's late answer, a sequence never sent
        self.unexpected: deque[Incoming] = deque(maxlen=UNEXPECTED_KEPT)
        self.unexpected_count = 0
        # where the GSP stopped answering (the class's docstring), None while it answers;
        # on_silent is told that once; after how many timed-out requests, and how many so far
        self.silent: str | None = None
        self.on_silent: Callable[[str], object] | None = None
        self.silent_after = silent_after
        self.timeouts = 0

    def post(self, function: int, payload: bytes | bytearray = b"") -> int:
        """Send a request without waiting for an answer (rpc.c _issueRpcAsyncLarge); returns
        how many messages it took."""
        with self._lock:
            self._refuse_reentry(function)
            self.answering(function)
            try:
                return self._send(function, bytes(payload), time.monotonic() + self.timeout_s)
            except (RpcTimeout, QueueError) as e:
                self._went_silent(function, e)
                raise

    def call(self, function: int, payload: bytes | bytearray = b"", *,
             reply_size: int | None = None, check: bool = True,
             timeout_s: float | None = None) -> Incoming:
        """Send a request and wait for its reply: the same function with the request's
        sequence (the module's docstring).

        A request sent in several messages is answered in as many bytes (bidirectional
        _issueRpcLarge); ``reply_size`` (header included) asks for another total. With
        ``check``, a non-zero rpc_result raises :class:`rig_nv.rm.RMError`.
        """
        with self._lock:
            self._refuse_reentry(function)
            self.answering(function)
            deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
            first = self._sequence
            try:
                records = self._send(function, bytes(payload), deadline)
                if reply_size is None and records > 1:
                    reply_size = HEADER.size + len(payload)
                reply = self._settled(lambda: self._await(function, deadline, reply_size,
                                                          first))
            except (RpcTimeout, QueueError) as e:
                self._went_silent(function, e)
                raise
            if check and reply.result != 0:
                raise RMError(f"{self.name}: RPC {reply.name} (rpc_result "
                              f"{result_text(reply.result)})", result_status(reply.result))
            return reply

    def wait_for(self, function: int, timeout_s: float | None = None) -> Incoming:
        """Wait for a message of ``function`` the CPU did not ask for (GSP_INIT_DONE),
        handing others to ``on_event``. Its sequence is not checked: it answers no request
        (CPU-RM 580.82.07 waits for GSP_INIT_DONE with expectedSequence 0, kernel_gsp.c
        kgspWaitForRmInitDone; what sequence the 570.144 GSP-RM gives it is not in the open
        sources)."""
        with self._lock:
            self._refuse_reentry(function)
            deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
            try:
                return self._settled(lambda: self._await(function, deadline, None, None))
            except QueueError as e:
                self._went_silent(function, e)
                raise

    def poll(self) -> int:
        """Hand every message already in the status queue to ``on_event``; how many.

        An exception of ``on_event`` that is not an :class:`Exception` (KeyboardInterrupt,
        SystemExit) ends the poll at once, raised, and the message it interrupted stays first
        for the next poll, handed on again then: what the GSP reported is not lost while it
        was being recorded (a handler that must not act twice tells the message by its
        :attr:`Incoming.serial`). An :class:`Exception` of ``on_event`` ends the poll too, the
        message counting as handled."""
        with self._lock:
            if self._in_event:
                return 0
            n = 0
            try:
                while self._backlog or self._receive():
                    n += 1
                    self._settled(self._hand_on)
            except QueueError as e:
                self._went_silent(None, e)
                raise
            return n

    # -- internals --------------------------------------------------------------------------

    def _settled(self, work: Callable[[], T]) -> T:
        """``work()``, then raise what an event callback raised meanwhile, if anything. Where
        ``work`` fails itself (the reply never came), its error is raised, unless what the
        callback raised is not an Exception (a KeyboardInterrupt is not dropped)."""
        try:
            result = work()
        except Exception as e:
            deferred, self._deferred = self._deferred, None
            if deferred is not None and not isinstance(deferred, Exception):
                raise deferred from e
            raise
        except BaseException:
            self._deferred = None
            raise
        finally:
            if self._held:  # first in the backlog, for the next poll
                self._backlog.extendleft(reversed(self._held))
                self._held.clear()
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            raise deferred
        return result

    def answering(self, function: int) -> None:
        """Raise :class:`NotAnswering` once the GSP stopped answering (the class's
        docstring): ``function`` is not sent. Callers that take memory for a request ask
        first, so that nothing is taken (and kept) for a request that would not be sent."""
        if self.silent is not None:
            raise NotAnswering(f"{self.name}: {function_name(function)} not sent: the GSP "
                               f"stopped answering at {self.silent}; the GPU is reset at its "
                               "next open")

    def _went_silent(self, function: int | None, e: BaseException) -> None:
        """Record that the GSP stopped answering at ``function`` (None: a poll) with ``e``,
        and tell ``on_silent``, the first time. The timeout that so makes the GSP taken as
        not answering is raised as a :class:`NotAnswering` (an :class:`RpcTimeout` and a
        :class:`rig_edge.Lost`), as every request after it is: the GPU is lost from this one
        on; a QueueError the caller raises as it is."""
        if self.silent is not None:
            return
        if isinstance(e, RpcTimeout):
            self.timeouts += 1
            if self.silent_after is None or self.timeouts < self.silent_after:
                return
        what = "a poll of its queues" if function is None else function_name(function)
        why = str(e).removeprefix(f"{self.name}: ")
        self.silent = f"{what} ({why})"
        if self.on_silent is not None:
            self.on_silent(f"the GSP stopped answering at {self.silent}")
        if isinstance(e, RpcTimeout):
            raise NotAnswering(f"{e}: the GSP is taken as not answering, so the GPU is lost "
                               "and is reset at its next open") from e

    def _refuse_reentry(self, function: int) -> None:
        if self._in_event:
            raise Misuse(f"{self.name}: RPC {function_name(function)} from inside a GSP "
                         "event callback (an RPC is already waiting for its reply)")

    def _send(self, function: int, payload: bytes, deadline: float) -> int:
        def on_full(needed: int, free: int) -> bool:
            # The GSP may be waiting for room in the status queue: read what it sent.
            while (message := self.queues.receive()) is not None:
                self._backlog.append(message)
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._sleep(left)
            return True

        chunks = [payload[i:i + MAX_PAYLOAD] for i in range(0, len(payload), MAX_PAYLOAD)]
        for i, chunk in enumerate(chunks or [b""]):
            fn = function if i == 0 else Function.CONTINUATION_RECORD
            rpc = header(fn, HEADER.size + len(chunk), self._sequence) + chunk
            self.queues.send(rpc, on_full)
            self._sequence = (self._sequence + 1) & SEQUENCE_MASK
        return max(1, len(chunks))

    def _next(self) -> Message | None:
        if self._backlog:
            return self._backlog.popleft()
        return self.queues.receive()

    def _receive(self) -> bool:
        """Read the status queue's next message into the backlog; whether there was one."""
        message = self.queues.receive()
        if message is None:
            return False
        self._backlog.append(message)
        return True

    def _hand_on(self) -> None:
        """The backlog's first message handed to ``on_event`` and taken off the backlog; put
        back first if an exception that is not an Exception interrupts that."""
        message = self._backlog[0]
        try:
            self._backlog.popleft()
            self._deliver(message, defer_all=False)
        except BaseException:
            if not self._backlog or self._backlog[0] is not message:
                self._backlog.appendleft(message)
            raise

    def _await(self, function: int, deadline: float, total: int | None,
               sequence: int | None) -> Incoming:
        """The reply of ``function`` whose first message carries ``sequence`` (any, for
        None), its continuation records the numbers after it (_issueRpcAndWaitLarge)."""
        first = self._wait_message(function, deadline, function, sequence)
        result, sequence = HEADER.unpack_from(first.rpc)[4], HEADER.unpack_from(first.rpc)[6]
        parts = [first.rpc[HEADER.size:]]
        got, last = len(first.rpc), len(first.rpc)
        following = sequence
        # Only a full message can be followed by more of the same reply.
        while total is not None and got < total and last == RPC_SIZE_MAX:
            following = (following + 1) & SEQUENCE_MASK
            more = self._wait_message(Function.CONTINUATION_RECORD, deadline, function,
                                      following)
            parts.append(more.rpc[HEADER.size:])
            got, last = got + len(more.rpc) - HEADER.size, len(more.rpc)
        payload = b"".join(parts)
        if total is not None:
            payload = payload[:total - HEADER.size]
        return Incoming(function, result, sequence, payload)

    def _wait_message(self, function: int, deadline: float, awaited: int,
                      sequence: int | None) -> Message:
        """The next message of ``function`` with ``sequence`` (any, for None); others go to
        :meth:`_deliver` (events to ``on_event``, replies nobody awaits to
        :attr:`unexpected`), as kernel_gsp.c _kgspRpcDrainOneEvent sends every message but
        the expected one to _kgspProcessRpcEvent."""
        while True:
            message = self._next()
            if message is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RpcTimeout(f"{self.name}: the GSP sent no "
                                     f"{function_name(function)} for "
                                     f"{function_name(awaited)} in time")
                self._sleep(left)
            elif message.function == function and self._fits(message, sequence):
                return message
            elif self._held:
                self._held.append(message)
            else:
                try:
                    self._deliver(message, defer_all=False)
                except BaseException as e:  # not an Exception: the message is held back
                    self._held.append(message)
                    self._defer(e)

    def _fits(self, message: Message, sequence: int | None) -> bool:
        """Whether ``message`` (of the awaited function) carries the awaited ``sequence``, as
        far as GSP-RM is known to echo one (:attr:`echoes`; the first reply decides)."""
        if sequence is None:
            return True
        got = HEADER.unpack_from(message.rpc)[6]
        if self.echoes is None:
            self.echoes = got == sequence
            return True
        return got == sequence or not self.echoes

    def _deliver(self, message: Message, *, defer_all: bool = True) -> None:
        """``message`` handed to ``on_event``; what that raises is kept until the awaited
        reply has been read (``_settled``), but with ``defer_all`` False an exception that is
        not an Exception goes through at once."""
        (_, _, _, function, result, _, sequence, _) = HEADER.unpack_from(message.rpc)
        incoming = Incoming(function, result, sequence, message.rpc[HEADER.size:], message.seq)
        if function < FIRST_EVENT:
            # a reply no call awaits: _kgspProcessRpcEvent's default case logs it and drops it
            self.unexpected.append(incoming)
            self.unexpected_count += 1
            return
        if self.on_event is None:
            return
        self._in_event = True
        try:
            self.on_event(incoming)
        except BaseException as e:
            if not defer_all and not isinstance(e, Exception):
                raise
            self._defer(e)
        finally:
            self._in_event = False

    def _defer(self, e: BaseException) -> None:
        """Keep ``e`` for ``_settled``: the first, unless a later one is not an Exception (a
        KeyboardInterrupt is not dropped for an event's error)."""
        first = self._deferred
        if first is None or (isinstance(first, Exception) and not isinstance(e, Exception)):
            self._deferred = e


class RpcRM:
    """The RM interface of :mod:`rig_nv.rm` over GSP_RM_ALLOC / GSP_RM_CONTROL / FREE.

    ``client`` is a client this object made on the GSP (:meth:`open`). A refusal raises
    :class:`Refused` (a :class:`rig_nv.rm.RMError`) naming NVIDIA's status: the reply's own
    status field where the GSP set one, else its rpc_result (rpcRmApiAlloc_GSP /
    rpcRmApiControl_GSP); a reply too short to hold a status a plain RMError.
    """

    def __init__(self, rpc: Rpc, client: int, *, release: str = "570.144",
                 layouts: str = "570", first_handle: int = FIRST_HANDLE) -> None:
        self.rpc = rpc
        self.client, self.release, self.layouts = client, release, layouts
        self._next = first_handle
        self._lock = threading.Lock()

    @classmethod
    def open(cls, rpc: Rpc, client: int = CLIENT_HANDLE, *, release: str = "570.144",
             layouts: str = "570", first_handle: int = FIRST_HANDLE) -> RpcRM:
        """Make client ``client`` (NV01_ROOT with NV0000_ALLOC_PARAMETERS, no parent) on the
        GSP and return its RM."""
        rm = cls(rpc, client, release=release, layouts=layouts, first_handle=first_handle)
        rm._alloc(client, 0, client, NV01_ROOT, root_params(client))
        return rm

    def close(self) -> None:
        """Free the client and everything under it."""
        self.free(self.client)

    def new_handle(self) -> int:
        with self._lock:
            self._next += 1
            return self._next

    def alloc(self, parent: int, handle: int, cls: int, params: bytearray | None = None) -> int:
        return self._alloc(self.client, parent, handle, cls, params)

    def control(self, obj: int, cmd: int, params: bytearray | None) -> None:
        reply = self.rpc.call(Function.GSP_RM_CONTROL,
                              encode_control(self.client, obj, cmd, params or b""), check=False)
        answer = decode_control(reply.payload) if len(reply.payload) >= CONTROL.size else None
        self._check(f"RM control 0x{cmd:x} of object 0x{obj:x}", reply, answer)
        _copy_back(params, answer)

    def free(self, obj: int) -> None:
        reply = self.rpc.call(Function.FREE, encode_free(self.client, 0, obj), check=False)
        status = decode_free(reply.payload) if len(reply.payload) >= FREE.size else None
        self._check(f"freeing RM object 0x{obj:x}", reply, status)

    def _alloc(self, client: int, parent: int, handle: int, cls: int,
               params: bytearray | None) -> int:
        reply = self.rpc.call(Function.GSP_RM_ALLOC,
                              encode_alloc(client, parent, handle, cls, params or b""),
                              check=False)
        answer = decode_alloc(reply.payload) if len(reply.payload) >= ALLOC.size else None
        self._check(f"making RM object 0x{handle:x} of class 0x{cls:x}", reply, answer)
        _copy_back(params, answer)
        return handle

    def _check(self, what: str, reply: Incoming,
               answer: AllocReply | ControlReply | int | None) -> None:
        """Raise :class:`Refused` for the reply's own status, else for its rpc_result, else
        RMError for a reply too short to hold its status (not a refusal GSP-RM stated)."""
        status = answer if isinstance(answer, int) else answer.status if answer else 0
        what = f"{self.rpc.name}: {what}"
        if status:
            raise Refused(what, status)
        if reply.result != 0:
            raise Refused(f"{what} (rpc_result {result_text(reply.result)})",
                          result_status(reply.result))
        if answer is None:
            raise RMError(f"{what} (a reply too short to hold its status)", NV_ERR_GENERIC)


def _copy_back(params: bytearray | None, answer: AllocReply | ControlReply | None) -> None:
    """The RM writes its answers back into the caller's params, in place."""
    if params is not None and answer is not None:
        n = min(len(params), len(answer.params))
        params[:n] = answer.params[:n]


def _speaks_rm(rm: RpcRM) -> RM:  # mypy --strict proves RpcRM implements rig_nv.rm.RM
    return rm
