"""The FSP of a simulated GH100 as BAR 0 shows it: its boot-complete scratch, EMEM channel 0
(1 KiB) behind EMEMC/EMEMD with auto-increment, the command and message queue pointers; a
packet the host rings in (QUEUE_HEAD written) is parsed as MCTP/NVDM, a COT payload checked and
recorded, and an NVDM FSP_RESPONSE put in the message queue.

Written from NVIDIA's headers (open-gpu-kernel-modules 570.144: hopper/gh100/dev_fsp_pri.h,
dev_therm.h, blackwell/gb202/dev_therm.h, fsp_mctp_format.h, fsp_nvdm_format.h,
kern_fsp_cot_payload.h, nvdm_payload_cmd_response.h) and importing nothing of rig_nv_pci.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from . import regs

EMEM_SIZE = 1024  # fsp_emem_channels.h FSP_EMEM_CHANNEL_RM_SIZE; channel 0 at EMEM 0
AINCW, AINCR = 1 << 24, 1 << 25
SOM, EOM = 1 << 31, 1 << 30  # MCTP transport header bits 31, 30; SEQ 29:28
VENDOR_PCI, VENDOR_NV = 0x7E, 0x10DE  # MCTP message header TYPE 6:0, VENDOR_ID 23:8
COT, FSP_RESPONSE = 0x14, 0x15  # NVDM_TYPE 31:24
FSP_ERR_INVALID_DATA = 0xA1  # kern_fsp_retval.h FSP_ERR_IFS_ERR_INVALID_DATA
# NVDM_PAYLOAD_COT, packed: each field's (offset, size)
COT_FIELDS = {"version": (0, 2), "size": (2, 2), "gspFmcSysmemOffset": (4, 8),
              "frtsSysmemOffset": (12, 8), "frtsSysmemSize": (20, 4),
              "frtsVidmemOffset": (24, 8), "frtsVidmemSize": (32, 4), "hash384": (36, 48),
              "publicKey": (84, 384), "signature": (468, 384),
              "gspBootArgsSysmemOffset": (852, 8)}
COT_BYTES = 860


def cot_field(payload: bytes, name: str) -> int | bytes:
    """Field ``name`` of a COT payload: an integer, or the bytes of the hash/key/signature."""
    off, size = COT_FIELDS[name]
    raw = payload[off:off + size]
    return int.from_bytes(raw, "little") if size <= 8 else raw


@dataclass
class SimFsp:
    """The FSP. ``boot_polls``: reads of the boot scratch before it reads 0xff (None: never);
    ``error_code``: the errorCode it answers with; ``answer``: whether it answers at all;
    ``cot_version``: the COT payload version it accepts (1 on GH100); ``therm``: where the
    chip has NV_THERM_I2CS_SCRATCH (GH100's by default, :func:`sim.fmc.gb202` GB202's)."""

    boot_polls: int | None = 0
    error_code: int = 0
    answer: bool = True
    cot_version: int = 1
    therm: int = regs.THERM_I2CS_SCRATCH
    task_id: int = 0
    emem: bytearray = field(default_factory=lambda: bytearray(EMEM_SIZE))
    ememc: int = 0
    queue_head: int = 0
    queue_tail: int = 0
    msgq_head: int = 0
    msgq_tail: int = 0
    packets: list[bytes] = field(default_factory=list)  # every packet rung in, as sent
    received: list[tuple[int, bytes]] = field(default_factory=list)  # (NVDM type, payload)
    log: list[str] = field(default_factory=list)
    # what the FSP does with a COT it accepts (sim/fmc.py: verify and start the GSP's FMC);
    # returns the errorCode to answer with
    on_cot: Callable[[bytes], int] | None = None
    # the message it posts in answer, from the NVDM type and errorCode (None: :meth:`response`,
    # as NVIDIA's FSP answers); a test gives another to make it answer wrongly
    reply: Callable[[int, int], bytes] | None = None

    def response(self, nvdm_type: int, code: int) -> bytes:
        """An NVDM FSP_RESPONSE to ``nvdm_type`` with errorCode ``code`` (MCTP single packet,
        NVIDIA vendor-defined PCI; NVDM_PAYLOAD_COMMAND_RESPONSE: taskId, commandNvdmType,
        errorCode)."""
        return struct.pack("<5I", SOM | EOM, VENDOR_PCI | VENDOR_NV << 8 | FSP_RESPONSE << 24,
                           self.task_id, nvdm_type, code)

    def owns(self, offset: int) -> bool:
        return offset in (self.therm, regs.FSP_EMEMC, regs.FSP_EMEMD,
                          regs.FSP_QUEUE_HEAD, regs.FSP_QUEUE_TAIL, regs.FSP_MSGQ_HEAD,
                          regs.FSP_MSGQ_TAIL)

    # ---- registers ---------------------------------------------------------------------------

    def read(self, offset: int) -> int:
        if offset == self.therm:
            if self.boot_polls is None:
                return 0
            if self.boot_polls > 0:
                self.boot_polls -= 1
                return 0
            return 0xFF
        if offset == regs.FSP_EMEMD:
            at = self._address()
            value = int.from_bytes(self.emem[at:at + 4], "little")
            if self.ememc & AINCR:
                self._advance()
            return value
        return {regs.FSP_EMEMC: self.ememc, regs.FSP_QUEUE_HEAD: self.queue_head,
                regs.FSP_QUEUE_TAIL: self.queue_tail, regs.FSP_MSGQ_HEAD: self.msgq_head,
                regs.FSP_MSGQ_TAIL: self.msgq_tail}.get(offset, 0)

    def write(self, offset: int, value: int) -> None:
        if offset == regs.FSP_EMEMC:
            self.ememc = value & (0xFFFC | AINCW | AINCR)
        elif offset == regs.FSP_EMEMD:
            at = self._address()
            self.emem[at:at + 4] = value.to_bytes(4, "little")
            if self.ememc & AINCW:
                self._advance()
        elif offset == regs.FSP_QUEUE_TAIL:
            self.queue_tail = value
        elif offset == regs.FSP_QUEUE_HEAD:
            self.queue_head = value
            self._doorbell()
        elif offset == regs.FSP_MSGQ_HEAD:
            self.msgq_head = value
        elif offset == regs.FSP_MSGQ_TAIL:
            self.msgq_tail = value

    def _address(self) -> int:
        """The byte address EMEMC points at: BLK (15:8) * 256 + OFFS (7:2) * 4."""
        at = (self.ememc >> 8 & 0xFF) * 256 + (self.ememc & 0xFC)
        if at + 4 > EMEM_SIZE:
            raise AssertionError(f"EMEM access at 0x{at:x}, past channel 0's 1 KiB")
        return at

    def _advance(self) -> None:
        """Auto-increment: the next dword, OFFS carrying into BLK."""
        dword = ((self.ememc >> 8 & 0xFF) * 64 + (self.ememc >> 2 & 0x3F) + 1) & 0x3FFF
        self.ememc = self.ememc & (AINCW | AINCR) | dword << 2

    # ---- the FSP's firmware ------------------------------------------------------------------

    def post(self, message: bytes, at: int = 0) -> None:
        """Put ``message`` (whole dwords) into the message queue at EMEM ``at``."""
        self.emem[at:at + len(message)] = message
        self.msgq_head, self.msgq_tail = at, at + len(message) - 4

    def _doorbell(self) -> None:
        size = (self.queue_tail - self.queue_head) + 4
        if not 4 <= size <= EMEM_SIZE or self.queue_head % 4:
            self.log.append(f"doorbell with head 0x{self.queue_head:x} tail "
                            f"0x{self.queue_tail:x}: ignored")
            return
        packet = bytes(self.emem[self.queue_head:self.queue_head + size])
        self.packets.append(packet)
        self.queue_tail = self.queue_head  # consumed: the queue reads empty again
        nvdm_type, code = self._parse(packet)
        if nvdm_type is None or not self.answer:
            return
        self.post((self.reply or self.response)(nvdm_type, code))

    def _parse(self, packet: bytes) -> tuple[int | None, int]:
        """The NVDM type of a packet and the errorCode to answer it with (None: not a message
        it answers)."""
        if len(packet) < 8:
            self.log.append(f"packet of {len(packet)} bytes: no headers")
            return None, 0
        mctp, msg = struct.unpack_from("<II", packet)
        if mctp & (SOM | EOM) != SOM | EOM or mctp >> 28 & 3:
            self.log.append(f"MCTP header 0x{mctp:08x}: not a single packet")
            return None, 0
        nvdm_type = msg >> 24
        if msg & 0x7F != VENDOR_PCI or msg >> 8 & 0xFFFF != VENDOR_NV:
            self.log.append(f"message header 0x{msg:08x}: not NVIDIA vendor-defined PCI")
            return nvdm_type, FSP_ERR_INVALID_DATA
        payload = packet[8:]
        if nvdm_type == COT:
            payload = payload[:COT_BYTES]
            if len(packet) - 8 < COT_BYTES or len(packet) - 8 - COT_BYTES >= 4:
                self.log.append(f"COT payload of {len(packet) - 8} bytes, not {COT_BYTES}")
                return nvdm_type, FSP_ERR_INVALID_DATA
            version, size = cot_field(payload, "version"), cot_field(payload, "size")
            if version != self.cot_version or size != COT_BYTES:
                self.log.append(f"COT version {version!r} size {size!r}")
                return nvdm_type, FSP_ERR_INVALID_DATA
        self.received.append((nvdm_type, payload))
        if nvdm_type == COT and self.error_code == 0 and self.on_cot is not None:
            return nvdm_type, self.on_cot(payload)
        return nvdm_type, self.error_code
