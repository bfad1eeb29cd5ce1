"""A test double of the GSP's end of the message queues: the half of the simulated GPU that
talks RPC. It creates the status queue, reads requests from the command queue (checking each
message's checksum, element count, sequence number and RPC header), answers GSP_RM_ALLOC,
GSP_RM_CONTROL, FREE, UNLOADING_GUEST_DRIVER and GET_GSP_STATIC_INFO, replies in as many
messages as a request came in, and can send events, corrupt a checksum or answer late.

Written from NVIDIA's published interfaces (msgq_priv.h, message_queue_priv.h, the RPC
headers), not from rig_nv_pci.gsp (which it must not import: a mistake both shared would
pass). Each layout, the checksum and the sequence numbers' rule:
docs/rig-nv-pci-modules/sim-gsp_peer.md."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from operator import xor

from .c_structs import c_struct, static_config

ELEM = 0x1000  # GSP_MSG_QUEUE_ELEMENT_SIZE_MIN
MAX_ELEMS = 16  # GSP_MSG_QUEUE_ELEMENT_SIZE_MAX / MIN
# GSP_MSG_QUEUE_ELEMENT field offsets
QE_CHECKSUM, QE_SEQ, QE_COUNT, QE_RPC = 0x20, 0x24, 0x28, 0x30
# rpc_message_header_v field offsets
R_VERSION, R_SIGNATURE, R_LENGTH, R_FUNCTION = 0x00, 0x04, 0x08, 0x0C
R_RESULT, R_RESULT_PRIVATE, R_SEQUENCE, R_SPARE, R_SIZE = 0x10, 0x14, 0x18, 0x1C, 0x20
# msgqTxHeader field offsets
T_VERSION, T_SIZE, T_MSGSIZE, T_MSGCOUNT = 0x00, 0x04, 0x08, 0x0C
T_WRITEPTR, T_FLAGS, T_RXHDROFF, T_ENTRYOFF = 0x10, 0x14, 0x18, 0x1C
SWAP_RX = 1
GSP_RX_HDR_OFF, GSP_ENTRY_OFF = 0x20, 0x1000  # what msgqTxCreate gives with aligns 4 and 12

VERSION_3_0 = 3 << 24
VRPC = int.from_bytes(b"VRPC", "little")  # NV_VGPU_MSG_SIGNATURE_VALID 0x43505256

FN_ALLOC_MEMORY = 4
FN_FREE = 10
FN_UNLOADING_GUEST_DRIVER = 47
FN_GET_GSP_STATIC_INFO = 65
FN_CONTINUATION_RECORD = 71
FN_GSP_SET_SYSTEM_INFO = 72
FN_SET_REGISTRY = 73
FN_GSP_RM_CONTROL = 76
FN_GSP_RM_ALLOC = 103
EV_GSP_INIT_DONE = 0x1001
EV_POST_EVENT = 0x1003
EV_RC_TRIGGERED = 0x1004
EV_MMU_FAULT_QUEUED = 0x1005
EV_OS_ERROR_LOG = 0x1006
EV_UCODE_LIBOS_PRINT = 0x100C
EV_GSP_LOCKDOWN_NOTICE = 0x101C
RPC_UNKNOWN_FUNCTION = 0xFF100001  # NV_VGPU_MSG_RESULT_RPC_UNKNOWN_FUNCTION

NV_ERR_INSERT_DUPLICATE_NAME = 0x19
NV_ERR_INVALID_CLIENT = 0x23
NV_ERR_INVALID_OBJECT_HANDLE = 0x33
NV_ERR_INVALID_OBJECT_PARENT = 0x36

ROOT_CLASSES = (0x0, 0x41)  # NV01_ROOT, NV01_ROOT_CLIENT
ALLOC_FIXED = 0x20  # rpc_gsp_rm_alloc_v03_00 up to params[]
CONTROL_FIXED = 0x18  # rpc_gsp_rm_control_v03_00 up to params[]


# What this GSP reports unless told otherwise: a 24 GiB board whose RM-internal objects are
# the handles below (made-up numbers, as a GSP-RM picks its own), two FB regions.
STATIC_DEFAULTS: dict[str, int | bytes] = {
    "hInternalClient": 0xC1E00004, "hInternalDevice": 0xDE1D0000,
    "hInternalSubdevice": 0x5B1D0000,
    "fbRegionInfoParams.numFBRegions": 2,
    "fbRegionInfoParams.fbRegion[0].base": 0,
    "fbRegionInfoParams.fbRegion[0].limit": 0x5_FDFF_FFFF,
    "fbRegionInfoParams.fbRegion[0].reserved": 0x1000_0000,
    "fbRegionInfoParams.fbRegion[0].performance": 0xFF,
    "fbRegionInfoParams.fbRegion[0].supportCompressed": 1,
    "fbRegionInfoParams.fbRegion[0].supportISO": 1,
    "fbRegionInfoParams.fbRegion[1].base": 0x5_FE00_0000,
    "fbRegionInfoParams.fbRegion[1].limit": 0x5_FFFF_FFFF,
    "fbRegionInfoParams.fbRegion[1].performance": 0xFF,
    "fbRegionInfoParams.fbRegion[1].bProtected": 1,
    "bar1PdeBase": 0x5_FF80_0000, "bar2PdeBase": 0x5_FF90_0000,
    "fb_length": 24 << 30, "l2_cache_size": 6 << 20,
    "gpuNameString": b"NVIDIA GeForce RTX 3090",
}


class PeerError(AssertionError):
    """The CPU side broke the queue protocol."""


def nova_checksum(data: bytes) -> int:
    """Byte i XORed into byte lane i % 8 of a 64-bit word; the word's halves XORed."""
    lanes = [reduce(xor, data[lane::8], 0) for lane in range(8)]
    word = sum(value << (8 * lane) for lane, value in enumerate(lanes))
    return ((word >> 32) ^ word) & 0xFFFFFFFF


def _u32(buf: bytes | bytearray | memoryview, at: int) -> int:
    return int.from_bytes(bytes(buf[at:at + 4]), "little")


def _put32(buf: bytearray | memoryview, at: int, value: int) -> None:
    buf[at:at + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")


@dataclass
class Request:
    """A request as the GSP reassembled it: function, the first record's header sequence,
    the whole payload, and how many messages carried it."""

    function: int
    sequence: int
    payload: bytes
    records: int
    seqnums: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Alloc:
    """A GSP_RM_ALLOC's payload as the GSP reads it (request or reply): rpc_gsp_rm_alloc_v03_00
    (g_rpc-structures.h): hClient, hParent, hObject, hClass at 0..0xC, status 0x10, paramsSize
    0x14, flags 0x18, reserved[4] 0x1C, params[] from 0x20 (:data:`ALLOC_FIXED`)."""

    client: int
    parent: int
    handle: int
    cls: int
    status: int
    params: bytes


@dataclass(frozen=True)
class Control:
    """A GSP_RM_CONTROL's payload as the GSP reads it: rpc_gsp_rm_control_v03_00
    (g_rpc-structures.h): hClient 0, hObject 4, cmd 8, status 0xC, paramsSize 0x10, flags
    0x14, params[] from 0x18 (:data:`CONTROL_FIXED`)."""

    client: int
    obj: int
    cmd: int
    status: int
    params: bytes


@dataclass(frozen=True)
class Free:
    """A FREE's payload as the GSP reads it: rpc_free_v03_00, NVOS00_PARAMETERS_v03_00
    (g_sdk-structures.h): hRoot, hObjectParent, hObjectOld, status."""

    root: int
    parent: int
    old: int
    status: int


def parse_alloc(p: bytes) -> Alloc:
    """``p`` read as rpc_gsp_rm_alloc_v03_00, its params paramsSize bytes."""
    client, parent, handle, cls, status, size = struct.unpack_from("<6I", p)
    return Alloc(client, parent, handle, cls, status, bytes(p[ALLOC_FIXED:ALLOC_FIXED + size]))


def parse_control(p: bytes) -> Control:
    """``p`` read as rpc_gsp_rm_control_v03_00, its params paramsSize bytes."""
    client, obj, cmd, status, size = struct.unpack_from("<5I", p)
    return Control(client, obj, cmd, status, bytes(p[CONTROL_FIXED:CONTROL_FIXED + size]))


def parse_free(p: bytes) -> Free:
    """``p`` read as rpc_free_v03_00."""
    return Free(*struct.unpack_from("<4I", p))


@dataclass
class Peer:
    """The GSP end of the queues in ``shared`` (the CPU's block; offsets as the CPU passes them
    in MESSAGE_QUEUE_INIT_ARGUMENTS). ``auto``: serve the command queue on every doorbell."""

    shared: memoryview
    cmd_offset: int
    stat_offset: int
    stat_size: int
    auto: bool = True
    alloc_status: dict[int, int] = field(default_factory=dict)  # class -> NV_STATUS
    control_status: dict[int, int] = field(default_factory=dict)  # cmd -> NV_STATUS
    free_status: dict[int, int] = field(default_factory=dict)  # handle -> NV_STATUS
    control_answer: dict[int, Callable[[bytes], bytes]] = field(default_factory=dict)
    alloc_answer: dict[int, Callable[[bytes], bytes]] = field(default_factory=dict)
    status_in_header: bool = True  # also put a refusal's status in rpc_result
    static_info: bytes = b""  # GET_GSP_STATIC_INFO's reply as is (else ``static_fields``)
    static_fields: dict[str, int | bytes] = field(default_factory=dict)  # over STATIC_DEFAULTS
    static_status: int = 0  # NV_STATUS refusing GET_GSP_STATIC_INFO
    unload_reply: bool = True  # answer UNLOADING_GUEST_DRIVER (a hung GSP-RM does not)
    # classes whose GSP_RM_ALLOC is taken (and made, as the checks and on_alloc decide) but
    # never answered: a GSP-RM that hung, or answers too late
    alloc_unanswered: set[int] = field(default_factory=set)
    # functions whose replies are kept back until send_late(): a GSP-RM answering late
    late: set[int] = field(default_factory=set)
    # Further functions: number -> callback(payload) giving (reply payload, rpc_result).
    functions: dict[int, Callable[[bytes], tuple[bytes, int]]] = field(default_factory=dict)
    # An alloc that passed the handle checks: (parent, handle, class, params) -> (status,
    # params); a control: (object, cmd, params) -> (status, params), or None as by default;
    # every handle a FREE removes, children first.
    on_alloc: Callable[[int, int, int, bytes], tuple[int, bytes]] | None = None
    on_control: Callable[[int, int, bytes], tuple[int, bytes] | None] | None = None
    on_free: Callable[[int], None] | None = None

    def __post_init__(self) -> None:
        self.mem = self.shared.cast("B") if self.shared.format != "B" else self.shared
        self.rings = 0
        self.requests: list[Request] = []
        self.objects: dict[int, int] = {}  # handle -> parent (clients: 0)
        self.outbox: list[bytes] = []  # RPCs waiting for room in the status queue
        self.before_reply: list[bytes] = []  # events to slip in before the next reply
        self.withheld: list[bytes] = []  # replies of ``late`` functions, for send_late()
        # False: replies carry sequence 0 whatever the request's (a GSP-RM that does not echo
        # it; whether 570.144's does is not in the open sources)
        self.echo_sequence = True
        self.corrupt_next = False
        self.unloaded = False
        self._rx_expect = 0  # next seqNum expected on the command queue
        self.tx_seq = 0  # next seqNum it sends (a test may set it, making a gap)
        self._event_seq = 0
        self._partial: Request | None = None
        self._partial_total = 0
        self.booted = False

    def allocs(self) -> list[Alloc]:
        """The GSP_RM_ALLOC requests received so far, in order, as the GSP read them."""
        return [parse_alloc(r.payload) for r in self.requests if r.function == FN_GSP_RM_ALLOC]

    def controls(self) -> list[Control]:
        """The GSP_RM_CONTROL requests received so far, in order, as the GSP read them."""
        return [parse_control(r.payload) for r in self.requests
                if r.function == FN_GSP_RM_CONTROL]

    # -- queue bring-up ------------------------------------------------------------------

    def boot(self) -> None:
        """Check the CPU's command queue header and create the status queue (GSP-RM's init)."""
        c = self.cmd_offset
        if _u32(self.mem, c + T_VERSION) != 0 or _u32(self.mem, c + T_MSGSIZE) != ELEM:
            raise PeerError("command queue header: version/msgSize wrong")
        size, count = _u32(self.mem, c + T_SIZE), _u32(self.mem, c + T_MSGCOUNT)
        entry = _u32(self.mem, c + T_ENTRYOFF)
        if count != (size - entry) // ELEM or entry % ELEM or not _u32(self.mem, c + T_FLAGS) & 1:
            raise PeerError(f"command queue header inconsistent: size {size} count {count} "
                            f"entryOff {entry}")
        self.cmd_count, self.cmd_entries = count, c + entry
        self.cmd_rx_hdr = c + _u32(self.mem, c + T_RXHDROFF)
        s = self.stat_offset
        self.stat_count = (self.stat_size - GSP_ENTRY_OFF) // ELEM
        for off, value in ((T_VERSION, 0), (T_SIZE, self.stat_size), (T_MSGSIZE, ELEM),
                           (T_MSGCOUNT, self.stat_count), (T_WRITEPTR, 0), (T_FLAGS, SWAP_RX),
                           (T_RXHDROFF, GSP_RX_HDR_OFF), (T_ENTRYOFF, GSP_ENTRY_OFF)):
            _put32(self.mem, s + off, value)
        _put32(self.mem, s + GSP_RX_HDR_OFF, 0)  # our read pointer of the command queue
        self.booted = True

    # Both sides swap: the GSP's read pointer of the command queue is in the status queue's
    # rx header, the CPU's read pointer of the status queue in the command queue's.
    @property
    def _gsp_cmd_read(self) -> int:
        return _u32(self.mem, self.stat_offset + GSP_RX_HDR_OFF)

    @property
    def _cpu_stat_read(self) -> int:
        return _u32(self.mem, self.cmd_rx_hdr)

    # -- the command queue ---------------------------------------------------------------

    def doorbell(self) -> None:
        """NV_PGSP_QUEUE_HEAD(0) was written."""
        self.rings += 1
        if self.auto and self.booted:
            self.service()

    def service(self) -> None:
        """Read every complete request, answer it, and write what fits in the status queue."""
        while self._read_one():
            pass
        self.pump()

    def _read_one(self) -> bool:
        write = _u32(self.mem, self.cmd_offset + T_WRITEPTR)
        read = self._gsp_cmd_read
        pending = (write - read) % self.cmd_count
        if pending == 0:
            return False
        first = self.cmd_entries + read * ELEM
        count = _u32(self.mem, first + QE_COUNT)
        if not 1 <= count <= min(MAX_ELEMS, pending):
            raise PeerError(f"command at element {read}: elemCount {count}, {pending} written")
        slots = [self.cmd_entries + (read + i) % self.cmd_count * ELEM for i in range(count)]
        msg = b"".join(bytes(self.mem[at:at + ELEM]) for at in slots)
        length = _u32(msg, QE_RPC + R_LENGTH)
        if -(-(QE_RPC + length) // ELEM) != count:
            raise PeerError(f"command at element {read}: rpc length {length} in {count} elements")
        if nova_checksum(msg[:(QE_RPC + length + 7) & ~7]) != 0:
            raise PeerError(f"command at element {read}: bad checksum")
        seq = _u32(msg, QE_SEQ)
        if seq != self._rx_expect:
            raise PeerError(f"command at element {read}: seqNum {seq}, expected {self._rx_expect}")
        rpc = msg[QE_RPC:QE_RPC + length]
        if _u32(rpc, R_VERSION) != VERSION_3_0 or _u32(rpc, R_SIGNATURE) != VRPC:
            raise PeerError(f"command seq {seq}: bad RPC header version/signature")
        self._rx_expect += 1
        _put32(self.mem, self.stat_offset + GSP_RX_HDR_OFF, (read + count) % self.cmd_count)
        self._take(rpc, seq)
        return True

    def _take(self, rpc: bytes, seq: int) -> None:
        fn, payload = _u32(rpc, R_FUNCTION), rpc[R_SIZE:]
        if fn == FN_CONTINUATION_RECORD:
            if self._partial is None:
                raise PeerError(f"command seq {seq}: a continuation of nothing")
            expected = (self._partial.sequence + self._partial.records) & 0xFFFFFFFF
            if _u32(rpc, R_SEQUENCE) != expected:
                raise PeerError(f"command seq {seq}: continuation record with RPC sequence "
                                f"{_u32(rpc, R_SEQUENCE)}, expected {expected}")
            self._partial.payload += payload
            self._partial.records += 1
            self._partial.seqnums.append(seq)
        else:
            if self._partial is not None:
                raise PeerError(f"command seq {seq}: a new request before the last was complete")
            self._partial = Request(fn, _u32(rpc, R_SEQUENCE), payload, 1, [seq])
            fixed = {FN_GSP_RM_ALLOC: ALLOC_FIXED, FN_GSP_RM_CONTROL: CONTROL_FIXED}.get(fn)
            # The size of an alloc or control is in its paramsSize field (at 0x14 / 0x10);
            # ALLOC_MEMORY's from its pageCount (at 40: 8 bytes a page after 56).
            self._partial_total = (fixed + _u32(payload, 0x14 if fn == FN_GSP_RM_ALLOC else 0x10)
                                   if fixed is not None else
                                   56 + 8 * _u32(payload, 40) if fn == FN_ALLOC_MEMORY else
                                   len(payload))
        if len(self._partial.payload) >= self._partial_total:
            request, self._partial = self._partial, None
            self.requests.append(request)
            self._answer(request)

    # -- answers -------------------------------------------------------------------------

    def _answer(self, r: Request) -> None:
        p = r.payload
        if r.function == FN_GSP_RM_ALLOC:
            a = parse_alloc(p)
            client, parent, handle, cls, params = a.client, a.parent, a.handle, a.cls, a.params
            status = self.alloc_status.get(cls, 0) or self._alloc_check(client, parent, handle, cls)
            if status == 0 and self.on_alloc is not None:
                status, params = self.on_alloc(parent, handle, cls, params)
            if status == 0:
                self.objects[handle] = 0 if cls in ROOT_CLASSES else parent
                params = self.alloc_answer.get(cls, lambda b: b)(params)
            out = p[:0x10] + struct.pack("<I", status) + p[0x14:ALLOC_FIXED] + params
            if cls not in self.alloc_unanswered:
                self._reply(r, out, status)
        elif r.function == FN_GSP_RM_CONTROL:
            c = parse_control(p)
            client, obj, cmd, params = c.client, c.obj, c.cmd, c.params
            size = _u32(p, 0x10)  # paramsSize: the reply's params are as long as asked
            status = self.control_status.get(cmd, 0)
            if status == 0 and obj not in self.objects and not self._internal(client, obj):
                status = NV_ERR_INVALID_OBJECT_HANDLE
            if status == 0:
                answer = self.on_control(obj, cmd, params) if self.on_control else None
                if answer is not None:
                    status, params = answer
                params = self.control_answer.get(cmd, lambda b: b)(params)
                params = params[:size].ljust(size, b"\0")
            out = p[:0xC] + struct.pack("<I", status) + p[0x10:CONTROL_FIXED] + params
            self._reply(r, out, status)
        elif r.function == FN_FREE:
            f = parse_free(p)
            root, old = f.root, f.old
            status = self.free_status.get(old, 0)
            if status == 0 and (old not in self.objects or root not in self.objects):
                status = NV_ERR_INVALID_OBJECT_HANDLE
            if status == 0:
                self._free_tree(old)
            self._reply(r, p[:0xC] + struct.pack("<I", status), status)
        elif r.function == FN_UNLOADING_GUEST_DRIVER:
            self.unloaded = True
            if self.unload_reply:
                self._reply(r, p, 0)
        elif r.function == FN_GET_GSP_STATIC_INFO:
            # A request of GspStaticConfigInfo's size (rpcGetGspStaticInfo_v14_00) gets the
            # config; one of another size (the queue tests' echo) as many zero bytes.
            config = static_config({**STATIC_DEFAULTS, **self.static_fields})
            if self.static_status:
                self._reply(r, p, self.static_status)
            elif self.static_info:
                self._reply(r, self.static_info, 0)
            else:
                self._reply(r, config if len(p) == len(config) else bytes(len(p)), 0)
        elif r.function in (FN_GSP_SET_SYSTEM_INFO, FN_SET_REGISTRY):
            pass  # sent before boot without waiting (rpc.c _issueRpcAsync): no answer
        elif r.function in self.functions:
            payload, result = self.functions[r.function](p)
            self._reply(r, payload, result, in_header=True)
        else:
            self._reply(r, p, RPC_UNKNOWN_FUNCTION, in_header=True)

    def _internal(self, client: int, obj: int) -> bool:
        """Whether ``obj`` is GSP-RM's internal device or subdevice under its internal client
        ``client`` (the static info's hInternal* handles: objects GSP-RM made at its init,
        on which CPU-RM sends its RM-internal controls)."""
        fields = {**STATIC_DEFAULTS, **self.static_fields}
        return client == fields["hInternalClient"] and obj in (
            fields["hInternalDevice"], fields["hInternalSubdevice"])

    def _alloc_check(self, client: int, parent: int, handle: int, cls: int) -> int:
        if handle in self.objects:
            return NV_ERR_INSERT_DUPLICATE_NAME
        if cls in ROOT_CLASSES:
            return 0 if parent == 0 and handle == client else NV_ERR_INVALID_OBJECT_PARENT
        if self.objects.get(client, -1) != 0:
            return NV_ERR_INVALID_CLIENT
        return 0 if parent in self.objects else NV_ERR_INVALID_OBJECT_PARENT

    def _free_tree(self, handle: int) -> None:
        for child in [h for h, p in self.objects.items() if p == handle]:
            self._free_tree(child)
        del self.objects[handle]
        if self.on_free is not None:
            self.on_free(handle)

    def _reply(self, r: Request, payload: bytes, status: int, in_header: bool = False) -> None:
        self.outbox.extend(self.before_reply)
        self.before_reply.clear()
        result = status if in_header or self.status_in_header else 0
        room = MAX_ELEMS * ELEM - QE_RPC - R_SIZE  # payload bytes one message carries
        out = self.withheld if r.function in self.late else self.outbox
        for n, i in enumerate(range(0, max(len(payload), 1), room)):
            fn = r.function if i == 0 else FN_CONTINUATION_RECORD
            out.append(self.message(fn, payload[i:i + room], result,
                                 (r.sequence + n) & 0xFFFFFFFF if self.echo_sequence else 0))

    def send_late(self) -> int:
        """Send the replies kept back for ``late`` functions, in order; how many messages."""
        n = len(self.withheld)
        self.outbox.extend(self.withheld)
        self.withheld.clear()
        self.pump()
        return n

    @staticmethod
    def message(fn: int, payload: bytes, result: int, sequence: int) -> bytes:
        """An RPC as the GSP sends it: rpc_message_header_v (version 3.0, "VRPC", length,
        function ``fn``, rpc_result and rpc_result_private ``result``, ``sequence``), then
        ``payload``."""
        return struct.pack("<8I", VERSION_3_0, VRPC, R_SIZE + len(payload), fn, result, result,
                           sequence, 0) + payload

    # -- events --------------------------------------------------------------------------

    def event(self, fn: int, payload: bytes = b"", *, now: bool = True) -> None:
        """Send event ``fn``: now (into the status queue as room allows), or slipped in just
        before the next reply (``now=False``), so it arrives while the CPU waits."""
        rpc = self.message(fn, payload, 0, self._event_seq)
        self._event_seq += 1
        if now:
            self.outbox.append(rpc)
            self.pump()
        else:
            self.before_reply.append(rpc)

    @staticmethod
    def rc_triggered(chid: int, xid: int = 31, engine: int = 1, fault_address: int = 0, *,
                     gfid: int = 0, except_level: int = 0, scope: int = 0, partition: int = 0,
                     fault_type: int = 0, callback: bool = True, journal: bytes = b"") -> bytes:
        """rpc_rc_triggered_v17_02 (48 bytes) and its rcJournalBuffer."""
        return c_struct("rpc_rc_triggered_v17_02", {
            "nv2080EngineType": engine, "chid": chid, "gfid": gfid, "exceptLevel": except_level,
            "exceptType": xid, "scope": scope, "partitionAttributionId": partition,
            "mmuFaultAddrLo": fault_address & 0xFFFFFFFF, "mmuFaultAddrHi": fault_address >> 32,
            "mmuFaultType": fault_type, "bCallbackNeeded": int(callback),
            "rcJournalBufferSize": len(journal)}, journal)

    @staticmethod
    def os_error_log(xid: int, chid: int, text: str, runlist: int = 0,
                     previous_xid: int = 0) -> bytes:
        """rpc_os_error_log_v17_00: exceptType, runlistId, chid, errString[0x100] (NUL-ended),
        preemptiveRemovalPreviousXid: 272 bytes."""
        return c_struct("rpc_os_error_log_v17_00", {
            "exceptType": xid, "runlistId": runlist, "chid": chid,
            "errString": text.encode()[:255], "preemptiveRemovalPreviousXid": previous_xid})

    @staticmethod
    def libos_print(eng_desc: int, data: bytes) -> bytes:
        """rpc_ucode_libos_print_v1E_08 and its libosPrintBuf."""
        return c_struct("rpc_ucode_libos_print_v1E_08", {
            "ucodeEngDesc": eng_desc, "libosPrintBufSize": len(data)}, data)

    @staticmethod
    def lockdown_notice(engaging: bool) -> bytes:
        """rpc_gsp_lockdown_notice_v17_00: one NvBool."""
        return c_struct("rpc_gsp_lockdown_notice_v17_00", {"bLockdownEngaging": int(engaging)})

    @staticmethod
    def post_event(h_client: int, h_event: int, notify_index: int, data: int = 0,
                   info16: int = 0, status: int = 0, event_data: bytes = b"",
                   notify_list: bool = False) -> bytes:
        """rpc_post_event_v17_00 and its eventData (which starts at offset 29)."""
        return c_struct("rpc_post_event_v17_00", {
            "hClient": h_client, "hEvent": h_event, "notifyIndex": notify_index, "data": data,
            "info16": info16, "status": status, "eventDataSize": len(event_data),
            "bNotifyList": int(notify_list)}, event_data)

    # -- the status queue ----------------------------------------------------------------

    def pump(self) -> None:
        """Write queued messages into the status queue while there is room."""
        s = self.stat_offset
        while self.outbox:
            rpc = self.outbox[0]
            count = -(-(QE_RPC + len(rpc)) // ELEM)
            write = _u32(self.mem, s + T_WRITEPTR)
            free = (self._cpu_stat_read - write - 1) % self.stat_count
            if free < count:
                return
            msg = bytearray(count * ELEM)
            msg[QE_RPC:QE_RPC + len(rpc)] = rpc
            _put32(msg, QE_SEQ, self.tx_seq)
            _put32(msg, QE_COUNT, count)
            _put32(msg, QE_CHECKSUM, nova_checksum(bytes(msg[:(QE_RPC + len(rpc) + 7) & ~7])))
            if self.corrupt_next:
                msg[QE_RPC + R_SIZE - 1] ^= 0x5A  # a byte of the header's spare field
                self.corrupt_next = False
            base = s + GSP_ENTRY_OFF
            for i in range(count):
                at = base + (write + i) % self.stat_count * ELEM
                self.mem[at:at + ELEM] = msg[i * ELEM:(i + 1) * ELEM]
            _put32(self.mem, s + T_WRITEPTR, (write + count) % self.stat_count)
            self.tx_seq += 1
            self.outbox.pop(0)
