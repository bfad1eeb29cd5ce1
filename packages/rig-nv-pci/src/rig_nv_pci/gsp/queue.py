"""The GSP's two shared-memory message queues, driven from the CPU side as the kernel RM does.

One block of system memory, shared with the GSP, holds (each part page aligned):

- a page table: the bus address of every 4 KiB page of the block, the table's own first;
- the command queue (CPU -> GSP): a ``msgqTxHeader`` and ``msgqRxHeader`` in its first page,
  then ``msgCount`` 4 KiB elements;
- the status queue (GSP -> CPU), laid out alike; the GSP writes its header once it runs.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/gsp-queue.md."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from operator import xor

from rig_edge import Misuse, RigError

PAGE_SIZE = 0x1000  # RM_PAGE_SIZE (rm_page_size.h)
ELEMENT_SIZE = PAGE_SIZE  # GSP_MSG_QUEUE_ELEMENT_SIZE_MIN
ELEMENT_SIZE_MAX = 16 * ELEMENT_SIZE  # GSP_MSG_QUEUE_ELEMENT_SIZE_MAX: one message, 64 KiB
DEFAULT_QUEUE_SIZE = 0x40000  # defaultCommandQueueSize / defaultStatusQueueSize: 256 KiB each

# GSP_MSG_QUEUE_ELEMENT: authTagBuffer[16], aadBuffer[16], checkSum, seqNum, elemCount, then
# the rpc_message_header_v aligned to 8 (NV_DECLARE_ALIGNED(..., 8)), so 4 bytes of padding.
ELEMENT_HEADER = struct.Struct("<16s16sIII4x")
ELEMENT_HEADER_SIZE = ELEMENT_HEADER.size  # GSP_MSG_QUEUE_ELEMENT_HDR_SIZE = 48
CHECKSUM_AT, SEQ_AT, COUNT_AT = 32, 36, 40  # offsets of checkSum, seqNum, elemCount
RPC_HEADER_SIZE = 32  # sizeof(rpc_message_header_v); its length field is at byte 8
RPC_SIZE_MAX = ELEMENT_SIZE_MAX - ELEMENT_HEADER_SIZE  # GSP_MSG_QUEUE_RPC_SIZE_MAX
MESSAGE_MIN = ELEMENT_HEADER_SIZE + RPC_HEADER_SIZE  # sizeof(GSP_MSG_QUEUE_ELEMENT) = 80

# msgqTxHeader: version, size, msgSize, msgCount, writePtr, flags, rxHdrOff, entryOff;
# msgqRxHeader: readPtr (msgq_priv.h).
TX_HEADER = struct.Struct("<8I")
RX_HEADER = struct.Struct("<I")
WRITE_PTR_AT = 16  # offsetof(msgqTxHeader, writePtr)
MSGQ_VERSION = 0
MSGQ_FLAGS_SWAP_RX = 1
# msgqTxCreate(hdrAlign = GSP_MSG_QUEUE_HEADER_ALIGN = 4, entryAlign = GSP_MSG_QUEUE_ELEMENT_ALIGN
# = 12): rxHdrOff = ALIGN_UP(sizeof tx, 1 << 4), entryOff = ALIGN_UP(rxHdrOff + sizeof rx, 1 << 12).
RX_HEADER_OFFSET = -(-TX_HEADER.size // 16) * 16  # 32
ENTRY_OFFSET = -(-(RX_HEADER_OFFSET + RX_HEADER.size) // PAGE_SIZE) * PAGE_SIZE  # 4096

QUEUE_HEAD = 0x110C00  # NV_PGSP_QUEUE_HEAD(0) (dev_gsp.h, tu102 and ga102): the doorbell
CHECKSUM_TRIES = 3  # GspMsgQueueReceiveStatus re-reads a message this often before failing


class QueueError(RigError):
    """The GSP's message queues refused an operation or hold something malformed."""


class QueueFull(QueueError):
    """The command queue has no room for a message and the caller chose not to wait longer."""

    def __init__(self, name: str, needed: int, free: int) -> None:
        super().__init__(f"{name}: the GSP command queue is full: the message needs {needed} "
                         f"elements of 4 KiB and {free} are free (the GSP has not read the rest)")
        self.needed, self.free = needed, free


class BadChecksum(QueueError):
    """A message's checksum does not fold to zero: the queue memory is corrupt."""

    def __init__(self, name: str, queue: str, seq: int, element: int, residue: int) -> None:
        super().__init__(f"{name}: bad checksum in the GSP {queue}: message seq {seq} at "
                         f"element {element} folds to 0x{residue:08x}, not 0")
        self.queue, self.seq, self.element, self.residue = queue, seq, element, residue


class QueueCorrupt(QueueError):
    """A header, pointer, length or sequence number in the queues makes no sense."""


def checksum32(data: bytes | bytearray | memoryview, length: int) -> int:
    """NVIDIA's ``_checkSum32``: XOR of the 64-bit little-endian words of ``data[:length]``
    (read on to the next multiple of 8, zeros past the end of ``data``), folded to 32 bits by
    XORing its halves. A message whose ``checkSum`` field is set right folds to 0."""
    padded = (length + 7) & ~7
    raw = bytes(memoryview(data).cast("B")[:padded])
    raw += bytes(padded - len(raw))
    whole = reduce(xor, struct.unpack(f"<{padded // 8}Q", raw), 0)
    return (whole >> 32) ^ (whole & 0xFFFFFFFF)


def elements_for(rpc_length: int) -> int:
    """``GSP_MSG_QUEUE_BYTES_TO_ELEMENTS`` of a message whose RPC is ``rpc_length`` bytes."""
    return -(-(ELEMENT_HEADER_SIZE + rpc_length) // ELEMENT_SIZE)


@dataclass(frozen=True)
class Layout:
    """Sizes and offsets of the shared block (``_getMsgQueueParams``, ``GspMsgQueuesInit``).

    The boot hands the GSP ``page_table_entries``, ``command_offset`` and ``status_offset`` in
    MESSAGE_QUEUE_INIT_ARGUMENTS (gsp_init_args.h) with the bus address of the block's first
    page (sharedMemPhysAddr).
    """

    command_size: int = DEFAULT_QUEUE_SIZE
    status_size: int = DEFAULT_QUEUE_SIZE

    def __post_init__(self) -> None:
        for what, n in (("command", self.command_size), ("status", self.status_size)):
            if n % PAGE_SIZE or n < ENTRY_OFFSET + 2 * ELEMENT_SIZE:
                raise Misuse(f"a GSP {what} queue of {n} bytes: it must be whole 4 KiB pages, "
                             "a header page and at least two elements")

    @property
    def page_table_entries(self) -> int:
        """pageTableEntryCount: one per page of both queues plus the pages of the table."""
        pages = (self.command_size + self.status_size) // PAGE_SIZE
        return pages + -(-pages * 8 // PAGE_SIZE)

    @property
    def page_table_size(self) -> int:
        """pageTableSize: the table (8-byte bus addresses) rounded up to whole pages."""
        return -(-self.page_table_entries * 8 // PAGE_SIZE) * PAGE_SIZE

    @property
    def command_offset(self) -> int:
        """cmdQueueOffset: where the command queue starts in the block."""
        return self.page_table_size

    @property
    def status_offset(self) -> int:
        """statQueueOffset: where the status queue starts in the block."""
        return self.command_offset + self.command_size

    @property
    def size(self) -> int:
        """sharedBufSize: the whole block."""
        return self.status_offset + self.status_size

    def queue_elements(self, queue_size: int) -> int:
        """msgCount of a queue of ``queue_size`` bytes (msgqTxCreate)."""
        return (queue_size - ENTRY_OFFSET) // ELEMENT_SIZE


def write_page_table(shared: memoryview, layout: Layout, bus: Sequence[int]) -> None:
    """Write the bus address of each of the block's pages into its page table
    (``memdescGetPhysAddrs(..., RM_PAGE_SIZE, pageTableEntryCount, pPageTbl)``)."""
    if len(bus) != layout.page_table_entries:
        raise Misuse(f"the GSP queue page table takes {layout.page_table_entries} bus "
                     f"addresses, not {len(bus)}")
    struct.pack_into(f"<{len(bus)}Q", shared, 0, *bus)


@dataclass(frozen=True)
class Message:
    """One message read from the status queue: its sequence number, the element it started
    at, how many elements it took, and its RPC (header and payload, ``length`` bytes)."""

    seq: int
    element: int
    elements: int
    rpc: bytes

    @property
    def function(self) -> int:
        return int(struct.unpack_from("<I", self.rpc, 12)[0])


class QueuePair:
    """The CPU's end of the command and status queues in ``shared`` (laid out as ``layout``).

    ``doorbell`` is called after each message is submitted; on hardware it writes 0 to
    NV_PGSP_QUEUE_HEAD(0) (:data:`QUEUE_HEAD`). ``name`` begins every error's message.
    """

    def __init__(self, shared: memoryview, layout: Layout | None = None, *,
                 doorbell: Callable[[], None], name: str = "GSP") -> None:
        self.layout = layout or Layout()
        self._mem = shared.cast("B") if shared.format != "B" else shared
        if self._mem.nbytes < self.layout.size or self._mem.readonly:
            raise Misuse(f"{name}: the GSP queues need {self.layout.size} writable bytes, "
                         f"not {self._mem.nbytes}{' read-only' if self._mem.readonly else ''}")
        self.name = name
        self._doorbell = doorbell
        self._cmd = self.layout.command_offset
        self._stat = self.layout.status_offset
        self._cmd_count = self.layout.queue_elements(self.layout.command_size)
        self._write = 0  # our next command element (tx.writePtr)
        self._read = 0  # our next status element (rxReadPtr)
        self._tx_seq = 0  # txSeqNum
        self._rx_seq = 0  # rxSeqNum
        self._linked = False
        self._stat_count = 0
        self._stat_entries = 0
        # Until the status queue is linked, the GSP's read pointer is looked for in our own
        # msgqRxHeader (msgqTxCreate with the other side's flags still unknown).
        self._gsp_read_at = self._cmd + RX_HEADER_OFFSET
        self._our_read_at = self._cmd + RX_HEADER_OFFSET

    # -- set-up ---------------------------------------------------------------------------

    def create(self) -> None:
        """Write the command queue's headers (msgqTxCreate with MSGQ_FLAGS_SWAP_RX)."""
        TX_HEADER.pack_into(self._mem, self._cmd, MSGQ_VERSION, self.layout.command_size,
                            ELEMENT_SIZE, self._cmd_count, 0, MSGQ_FLAGS_SWAP_RX,
                            RX_HEADER_OFFSET, ENTRY_OFFSET)
        RX_HEADER.pack_into(self._mem, self._cmd + RX_HEADER_OFFSET, 0)
        self._write = self._tx_seq = 0

    @property
    def linked(self) -> bool:
        """Whether the status queue the GSP creates has been linked (:meth:`link`)."""
        return self._linked

    def link(self) -> bool:
        """Link the status queue once the GSP has written its header (msgqRxLink).

        ``False`` while the header is still blank (the GSP has not started its queue yet);
        raises :class:`QueueCorrupt` if the GSP wrote a header this side cannot use.
        """
        if self._linked:
            return True
        (version, size, msg_size, count, write, flags, rx_off,
         entry_off) = TX_HEADER.unpack_from(self._mem, self._stat)
        if size == 0 and msg_size == 0:
            return False
        want = self.layout.status_size
        problems = [
            f"size {size} (expected {want})" if size != want else "",
            f"msgSize {msg_size} (expected {ELEMENT_SIZE})" if msg_size != ELEMENT_SIZE else "",
            f"version {version} (expected {MSGQ_VERSION})" if version != MSGQ_VERSION else "",
            f"rxHdrOff {rx_off}" if rx_off < TX_HEADER.size or rx_off + 4 > entry_off else "",
            f"entryOff {entry_off}" if entry_off + msg_size > size or entry_off % 8 else "",
        ]
        if not any(problems) and count != (size - entry_off) // msg_size:
            problems.append(f"msgCount {count} (expected {(size - entry_off) // msg_size})")
        if not any(problems) and write >= count:
            problems.append(f"writePtr {write} outside its {count} elements")
        if any(problems):
            raise QueueCorrupt(f"{self.name}: the GSP status queue's header is unusable: "
                               + ", ".join(p for p in problems if p))
        self._stat_count, self._stat_entries = count, self._stat + entry_off
        if flags & MSGQ_FLAGS_SWAP_RX:  # both sides swap: each writes its own queue only
            self._gsp_read_at = self._stat + rx_off
            self._our_read_at = self._cmd + RX_HEADER_OFFSET
        else:
            self._gsp_read_at = self._cmd + RX_HEADER_OFFSET
            self._our_read_at = self._stat + rx_off
        self._read = self._rx_seq = 0
        RX_HEADER.pack_into(self._mem, self._our_read_at, 0)
        self._linked = True
        return True

    # -- sending --------------------------------------------------------------------------

    def free_elements(self) -> int:
        """Elements of the command queue the GSP has read and we may write (msgq keeps one
        element empty, so at most msgCount - 1). Links the status queue first if the GSP
        has created it: the GSP keeps its read pointer in that queue's header."""
        if not self._linked:
            self.link()
        read = self._u32(self._gsp_read_at)
        if read >= self._cmd_count:
            raise QueueCorrupt(f"{self.name}: the GSP's read pointer of the command queue is "
                               f"{read}, outside its {self._cmd_count} elements")
        return (read + self._cmd_count - self._write - 1) % self._cmd_count

    @property
    def next_seq(self) -> int:
        """The seqNum the next message sent will carry."""
        return self._tx_seq

    def send(self, rpc: bytes | bytearray | memoryview,
             on_full: Callable[[int, int], bool] | None = None) -> int:
        """Put one message (an RPC whose header's length is ``len(rpc)``) on the command queue,
        ring the doorbell and return the message's seqNum.

        While the queue lacks room, ``on_full(needed, free)`` is called; it may wait or drain
        the status queue and returns whether to look again. Without it, or when it answers
        ``False``, :class:`QueueFull` is raised, nothing written.
        """
        n = len(rpc)
        if n < RPC_HEADER_SIZE or ELEMENT_HEADER_SIZE + n > ELEMENT_SIZE_MAX:
            raise Misuse(f"{self.name}: an RPC of {n} bytes: one message carries "
                         f"{RPC_HEADER_SIZE} to {RPC_SIZE_MAX} bytes")
        if struct.unpack_from("<I", rpc, 8)[0] != n:
            raise Misuse(f"{self.name}: the RPC header's length is not the RPC's {n} bytes")
        count = elements_for(n)
        if count > self._cmd_count - 1:
            raise Misuse(f"{self.name}: a message of {count} elements never fits a command "
                         f"queue of {self._cmd_count} elements")
        buf = bytearray(count * ELEMENT_SIZE)  # zero padded, as the checksum assumes
        ELEMENT_HEADER.pack_into(buf, 0, b"", b"", 0, self._tx_seq, count)
        buf[ELEMENT_HEADER_SIZE:ELEMENT_HEADER_SIZE + n] = rpc
        struct.pack_into("<I", buf, CHECKSUM_AT, checksum32(buf, ELEMENT_HEADER_SIZE + n))
        while (free := self.free_elements()) < count:
            if on_full is None or not on_full(count, free):
                raise QueueFull(self.name, count, free)
        entries = self._cmd + ENTRY_OFFSET
        for i in range(count):
            at = entries + (self._write + i) % self._cmd_count * ELEMENT_SIZE
            self._mem[at:at + ELEMENT_SIZE] = buf[i * ELEMENT_SIZE:(i + 1) * ELEMENT_SIZE]
        # The elements are written before the write pointer (msgqTxSubmitBuffers after a store
        # fence; Python's stores reach host memory in program order on x86).
        self._write = (self._write + count) % self._cmd_count
        struct.pack_into("<I", self._mem, self._cmd + WRITE_PTR_AT, self._write)
        seq, self._tx_seq = self._tx_seq, (self._tx_seq + 1) & 0xFFFFFFFF
        self._doorbell()
        return seq

    # -- receiving ------------------------------------------------------------------------

    def available(self) -> int:
        """Elements of the status queue written by the GSP and not yet read
        (msgqRxGetReadAvailable); 0 before the status queue is linked."""
        if not self._linked:
            return 0
        write = self._u32(self._stat + WRITE_PTR_AT)
        if write >= self._stat_count:
            raise QueueCorrupt(f"{self.name}: the GSP's write pointer of the status queue is "
                               f"{write}, outside its {self._stat_count} elements")
        return (write + self._stat_count - self._read) % self._stat_count

    def receive(self) -> Message | None:
        """The next message of the status queue, consumed, or ``None`` if none is complete.

        Links the status queue first if the GSP has created it meanwhile. Raises
        :class:`BadChecksum` (after re-reading it :data:`CHECKSUM_TRIES` times) or
        :class:`QueueCorrupt` (bad element count, length or sequence number), leaving the
        message in the queue.
        """
        if not self._linked and not self.link():
            return None
        available = self.available()
        if available == 0:
            return None
        element = self._read
        seq, count = struct.unpack_from("<II", self._mem, self._entry(element) + SEQ_AT)
        if not 1 <= count <= ELEMENT_SIZE_MAX // ELEMENT_SIZE or count >= self._stat_count:
            raise QueueCorrupt(f"{self.name}: the GSP status queue's message seq {seq} at "
                               f"element {element} claims {count} elements")
        if available < count:
            return None  # the rest is still being written (GspMsgQueueReceiveStatus retries)
        for _ in range(CHECKSUM_TRIES):
            buf = bytearray(count * ELEMENT_SIZE)
            for i in range(count):
                at = self._entry((element + i) % self._stat_count)
                buf[i * ELEMENT_SIZE:(i + 1) * ELEMENT_SIZE] = self._mem[at:at + ELEMENT_SIZE]
            seq = int(struct.unpack_from("<I", buf, SEQ_AT)[0])
            length = int(struct.unpack_from("<I", buf, ELEMENT_HEADER_SIZE + 8)[0])
            if not MESSAGE_MIN <= ELEMENT_HEADER_SIZE + length <= count * ELEMENT_SIZE:
                raise QueueCorrupt(f"{self.name}: the GSP status queue's message seq {seq} at "
                                   f"element {element} has an RPC of {length} bytes in "
                                   f"{count} elements")
            residue = checksum32(buf, ELEMENT_HEADER_SIZE + length)
            if residue == 0:
                break
        else:
            raise BadChecksum(self.name, "status queue", seq, element, residue)
        if seq != self._rx_seq:
            raise QueueCorrupt(f"{self.name}: the GSP status queue's message at element "
                               f"{element} has seq {seq}, expected {self._rx_seq}")
        # The message is made before the read pointer moves past it, and no Python call (where
        # an exception such as KeyboardInterrupt could strike) runs after: an exception while
        # receiving leaves the message in the queue, never gone from it and not returned.
        message = Message(seq, element, count, bytes(buf[ELEMENT_HEADER_SIZE:
                                                         ELEMENT_HEADER_SIZE + length]))
        read = (self._read + count) % self._stat_count
        RX_HEADER.pack_into(self._mem, self._our_read_at, read)
        self._read, self._rx_seq = read, (self._rx_seq + 1) & 0xFFFFFFFF
        return message

    # -- helpers --------------------------------------------------------------------------

    def _entry(self, element: int) -> int:
        return self._stat_entries + element * ELEMENT_SIZE

    def _u32(self, at: int) -> int:
        return int(struct.unpack_from("<I", self._mem, at)[0])
