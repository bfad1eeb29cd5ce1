"""The FSP (Hopper's firmware security processor) message transport and the chain-of-trust
(COT) message that makes it boot the GSP-FMC, through BAR 0 (docs/hopper-boot.md §1.2, §2).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/boot-fsp.md."""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass

from rig_edge import Misuse, RigError
from rig_nv_pci.boot.falcon import poll
from rig_pci import Window

# hw/dev_therm.h NV_THERM_I2CS_SCRATCH (GH100's address; each chip's is its family's
# chips.Family.fsp_ready); dev_therm_addendum.h NV_THERM_I2CS_SCRATCH_FSP_BOOT_COMPLETE_STATUS
# 31:0, _SUCCESS 0xff (_FAILED 0), the same on gh100 and gb202
NV_THERM_I2CS_SCRATCH = 0x000200BC
FSP_BOOT_COMPLETE_SUCCESS = 0x000000FF
# hw/dev_fsp_pri.h NV_PFSP_FALCON_COMMON_SCRATCH_GROUP_2(i) = 0x8f0320 + 4i, i < 4: what RM
# dumps when the FSP fails (kfspDumpDebugState_GH100)
NV_PFSP_FALCON_COMMON_SCRATCH_GROUP_2 = 0x008F0320

# hw/dev_fsp_pri.h, channel i
NV_PFSP_EMEMC = 0x008F2AC0  # + 8i: OFFS 7:2, BLK 15:8, AINCW 24:24, AINCR 25:25
NV_PFSP_EMEMD = 0x008F2AC4  # + 8i: DATA 31:0
NV_PFSP_QUEUE_HEAD = 0x008F2C00  # + 8i: host -> FSP command queue
NV_PFSP_QUEUE_TAIL = 0x008F2C04  # + 8i
NV_PFSP_MSGQ_HEAD = 0x008F2C80  # + 8i: FSP -> host message queue
NV_PFSP_MSGQ_TAIL = 0x008F2C84  # + 8i
EMEMC_OFFS_MASK = 0xFC  # OFFS 7:2, the dword in the block
EMEMC_BLK_SHIFT = 8  # BLK 15:8, the 256-byte block
EMEMC_AINCW = 1 << 24
EMEMC_AINCR = 1 << 25
DWORDS_PER_EMEM_BLOCK = 64  # kern_fsp_gh100.c
# src/nvidia/arch/nvalloc/common/inc/fsp/fsp_emem_channels.h: RM's channel and its size; on GH100
# it starts at EMEM offset 0 (comment in kfspSendPacket_GH100)
FSP_EMEM_CHANNEL_RM = 0
FSP_EMEM_CHANNEL_RM_SIZE = 1024

# src/nvidia/arch/nvalloc/common/inc/fsp/fsp_mctp_format.h: the MCTP transport header (dword 0)
MCTP_HEADER_SEID_SHIFT = 16  # SEID 23:16 (VERSION 3:0, DEID 15:8, TAG 26:24, TO 27 stay 0)
MCTP_HEADER_SEQ_SHIFT = 28  # SEQ 29:28
MCTP_HEADER_EOM = 1 << 30
MCTP_HEADER_SOM = 1 << 31
# ... and the MCTP message header (dword 1): TYPE 6:0, IC 7, VENDOR_ID 23:8, NVDM_TYPE 31:24
MCTP_MSG_HEADER_TYPE_VENDOR_PCI = 0x7E
MCTP_MSG_HEADER_VENDOR_ID_NV = 0x10DE
# src/nvidia/arch/nvalloc/common/inc/fsp/fsp_nvdm_format.h
NVDM_TYPE_COT = 0x14
NVDM_TYPE_FSP_RESPONSE = 0x15
NVDM_TYPE_CAPS_QUERY = 0x16
NVDM_TYPE_CLOCK_BOOST = 0x20
NVDM_NAMES = {0x04: "RESET", 0x11: "HULK", 0x12: "FIRMWARE_UPDATE", 0x13: "PRC",
              NVDM_TYPE_COT: "COT", NVDM_TYPE_FSP_RESPONSE: "FSP_RESPONSE",
              NVDM_TYPE_CAPS_QUERY: "CAPS_QUERY", 0x17: "INFOROM", 0x18: "SMBPBI",
              0x1A: "ROMREAD", 0x1C: "UEFI_RM", 0x1D: "UEFI_XTL_DEBUG_INTR", 0x1F: "TNVL",
              NVDM_TYPE_CLOCK_BOOST: "CLOCK_BOOST", 0x21: "FSP_GSP_COMM"}
# src/nvidia/inc/kernel/gpu/fsp/kern_fsp_retval.h (kfspErrorCode2NvStatusMap_GH100)
FSP_OK = 0x00
FSP_ERRORS = {0x9E: "FSP_ERR_IFS_ERR_INVALID_STATE", 0x9F: "FSP_ERR_IFR_FILE_NOT_FOUND",
              0xA0: "FSP_ERR_IFS_ERR_NOT_SUPPORTED", 0xA1: "FSP_ERR_IFS_ERR_INVALID_DATA"}
# src/nvidia/arch/nvalloc/common/inc/fsp/nvdm_payload_cmd_response.h, #pragma pack(1):
# NVDM_PAYLOAD_COMMAND_RESPONSE {NvU32 taskId, commandNvdmType, errorCode}
COMMAND_RESPONSE_FORMAT = "<III"
HEADERS = 8  # MCTP transport header + MCTP message header

# src/nvidia/inc/kernel/gpu/fsp/kern_fsp_cot_payload.h, #pragma pack(1): NVDM_PAYLOAD_COT
# {NvU16 version, size; NvU64 gspFmcSysmemOffset, frtsSysmemOffset; NvU32 frtsSysmemSize;
#  NvU64 frtsVidmemOffset (from the end of FB); NvU32 frtsVidmemSize; NvU32 hash384[12],
#  publicKey[96], signature[96]; NvU64 gspBootArgsSysmemOffset} = 860 bytes
COT_FORMAT = "<HHQQIQI48s384s384sQ"
COT_SIZE = struct.calcsize(COT_FORMAT)
# cotPayloadVersion and the signature sizes the FSP checks (g_kern_fsp_nvoc.c): version 1 on
# GH100 (SHA-384 hash, RSA-3072 public key and signature); version 2 on GB10x/GB20x, whose
# public key (97) and signature (96) lie zero-padded in the same 384-byte fields
COT_SIZES = {1: (48, 384, 384), 2: (48, 97, 96)}
# hw/dev_gc6_island_addendum.h NV_PGC6_AON_FRTS_INPUT_WPR_SIZE_SECURE_SCRATCH_GROUP_03_0_WPR_SIZE_
# 1MB_IN_4K 0x100, in 4 KiB: the FRTS size RM asks for (kgspGetFrtsSize_TU102)
FRTS_SIZE = 0x100 << 12

READY_TIMEOUT_S = 4.0  # kfspWaitForSecureBoot_GH100: gpuScaleTimeout(4 000 000 us)
RESPONSE_TIMEOUT_S = 4.0  # GPU_TIMEOUT_DEFAULT (kfspSetResponseTimeout, kfspPollForCanSend)


class FspError(RigError):
    """The FSP refused or did not answer; the message names the GPU, the command and why."""


def nvdm_name(nvdm_type: int) -> str:
    return f"{NVDM_NAMES.get(nvdm_type, 'NVDM type')} (0x{nvdm_type:02x})"


def fsp_error_name(code: int) -> str:
    return f"0x{code:x}" + (f" ({FSP_ERRORS[code]})" if code in FSP_ERRORS else "")


def mctp_header(*, som: bool, eom: bool, seq: int = 0, seid: int = 0) -> int:
    """The MCTP transport header of a packet (kfspCreateMctpHeader_GH100)."""
    return ((MCTP_HEADER_SOM if som else 0) | (MCTP_HEADER_EOM if eom else 0)
            | (seq & 3) << MCTP_HEADER_SEQ_SHIFT | (seid & 0xFF) << MCTP_HEADER_SEID_SHIFT)


def nvdm_header(nvdm_type: int) -> int:
    """The MCTP message header of an NVDM message (kfspCreateNvdmHeader_GH100)."""
    return (MCTP_MSG_HEADER_TYPE_VENDOR_PCI | MCTP_MSG_HEADER_VENDOR_ID_NV << 8
            | (nvdm_type & 0xFF) << 24)


def _field(name: str, value: int, bits: int) -> None:
    if not 0 <= value < 1 << bits:
        raise Misuse(f"COT payload: {name} 0x{value:x} does not fit in {bits} bits")


def cot_payload(*, fmc_address: int, boot_params_address: int, hash384: bytes,
                public_key: bytes, signature: bytes, frts_vidmem_offset: int,
                frts_vidmem_size: int = FRTS_SIZE, frts_sysmem_address: int = 0,
                frts_sysmem_size: int = 0, version: int = 1) -> bytes:
    """NVDM_PAYLOAD_COT (kfspPrepareBootCommands_GH100, kfspSetupGspImages): the bus address of
    the GSP-FMC image, where FRTS goes (``frts_vidmem_offset`` counted from the end of FB; an
    optional sysmem copy), the bus address of GSP_FMC_BOOT_PARAMS, and the FMC's hash, public
    key and signature, whose lengths must be those of COT ``version`` (1: GH100)."""
    if version not in COT_SIZES:
        raise Misuse(f"COT payload: version {version} is not one of {sorted(COT_SIZES)}")
    for name, blob, want in zip(("hash384", "public_key", "signature"),
                                (hash384, public_key, signature), COT_SIZES[version],
                                strict=True):
        if len(blob) != want:
            raise Misuse(f"COT payload version {version}: {name} is {len(blob)} bytes, "
                         f"not {want}")
    for name, value, bits in (("fmc_address", fmc_address, 64),
                              ("boot_params_address", boot_params_address, 64),
                              ("frts_sysmem_address", frts_sysmem_address, 64),
                              ("frts_sysmem_size", frts_sysmem_size, 32),
                              ("frts_vidmem_offset", frts_vidmem_offset, 64),
                              ("frts_vidmem_size", frts_vidmem_size, 32)):
        _field(name, value, bits)
    return struct.pack(COT_FORMAT, version, COT_SIZE, fmc_address, frts_sysmem_address,
                       frts_sysmem_size, frts_vidmem_offset, frts_vidmem_size, hash384,
                       public_key, signature, boot_params_address)


@dataclass(frozen=True)
class FspResponse:
    """An FSP_RESPONSE's NVDM_PAYLOAD_COMMAND_RESPONSE."""

    task_id: int
    command: int  # commandNvdmType
    error_code: int


class Fsp:
    """The FSP of the GPU named ``gpu`` (for messages; the window's name by default) through
    ``bar0``, on EMEM channel ``channel``."""

    def __init__(self, bar0: Window, gpu: str | None = None, *,
                 channel: int = FSP_EMEM_CHANNEL_RM,
                 timeout_s: float = RESPONSE_TIMEOUT_S,
                 ready: tuple[int, float] = (NV_THERM_I2CS_SCRATCH, READY_TIMEOUT_S)) -> None:
        self.bar0 = bar0
        self.gpu = gpu if gpu is not None else bar0.name
        self.channel = channel
        self.timeout_s = timeout_s
        # the chip's NV_THERM_I2CS_SCRATCH and its wait (chips.Family.fsp_ready)
        self.ready_register, self.ready_timeout_s = ready

    def _rd(self, base: int) -> int:
        return self.bar0.read32(base + 8 * self.channel)

    def _wr(self, base: int, value: int) -> None:
        self.bar0.write32(base + 8 * self.channel, value)

    def _fail(self, what: str) -> FspError:
        return FspError(f"{self.gpu}: {what} ({self.state()})")

    def state(self) -> str:
        """The queue pointers and FSP scratch registers, for messages."""
        parts = [("QUEUE_HEAD", self._rd(NV_PFSP_QUEUE_HEAD)),
                 ("QUEUE_TAIL", self._rd(NV_PFSP_QUEUE_TAIL)),
                 ("MSGQ_HEAD", self._rd(NV_PFSP_MSGQ_HEAD)),
                 ("MSGQ_TAIL", self._rd(NV_PFSP_MSGQ_TAIL))]
        parts += [(f"SCRATCH_GROUP_2({i})",
                   self.bar0.read32(NV_PFSP_FALCON_COMMON_SCRATCH_GROUP_2 + 4 * i))
                  for i in range(4)]
        return ", ".join(f"{n} 0x{v:08x}" for n, v in parts)

    # ---- readiness ---------------------------------------------------------------------------

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Wait for the FSP to finish its boot (the chip's NV_THERM_I2CS_SCRATCH_FSP_BOOT_
        COMPLETE reading _SUCCESS, kfspWaitForSecureBoot_GH100 / _GB202), ``timeout_s`` or
        the chip's wait."""
        wait = self.ready_timeout_s if timeout_s is None else timeout_s
        ok, value = poll(lambda: self.bar0.read32(self.ready_register),
                          lambda v: v == FSP_BOOT_COMPLETE_SUCCESS, wait)
        if not ok:
            raise self._fail(f"the FSP did not finish its boot within {wait} s "
                             f"(NV_THERM_I2CS_SCRATCH 0x{value:08x}, not 0x000000ff, at "
                             f"0x{self.ready_register:06x})")

    # ---- EMEM ----------------------------------------------------------------------------------

    def _ememc(self, offset: int, flag: int) -> int:
        if offset % 4 or not 0 <= offset < FSP_EMEM_CHANNEL_RM_SIZE:
            raise Misuse(f"{self.gpu}: EMEM offset 0x{offset:x} is not a dword of the channel")
        ctl = (offset & EMEMC_OFFS_MASK) | (offset >> 8) << EMEMC_BLK_SHIFT | flag
        self._wr(NV_PFSP_EMEMC, ctl)
        return offset // 4

    def _check_advanced(self, start: int, dwords: int, what: str) -> None:
        """Auto-increment moved EMEMC by ``dwords`` (RM re-reads it after the copy)."""
        ctl = self._rd(NV_PFSP_EMEMC)
        end = (ctl & EMEMC_OFFS_MASK) // 4 + (ctl >> EMEMC_BLK_SHIFT & 0xFF) * \
            DWORDS_PER_EMEM_BLOCK
        if end != start + dwords:
            raise self._fail(f"EMEM {what} of {dwords} dwords stopped at dword {end}, not "
                             f"{start + dwords} (EMEMC 0x{ctl:08x})")

    def _check_span(self, offset: int, n: int) -> None:
        if n % 4 or n < 0 or offset + n > FSP_EMEM_CHANNEL_RM_SIZE:
            raise Misuse(f"{self.gpu}: 0x{n:x} bytes at EMEM 0x{offset:x} are not whole "
                         f"dwords within the 0x{FSP_EMEM_CHANNEL_RM_SIZE:x}-byte channel")

    def emem_write(self, offset: int, data: bytes) -> None:
        """``data`` (whole dwords) into the channel at ``offset`` through EMEMC/EMEMD with
        write auto-increment (_kfspConfigEmemc_GH100, _kfspWriteToEmem_GH100)."""
        self._check_span(offset, len(data))
        start = self._ememc(offset, EMEMC_AINCW)
        for i in range(0, len(data), 4):
            self._wr(NV_PFSP_EMEMD, int.from_bytes(data[i:i + 4], "little"))
        self._check_advanced(start, len(data) // 4, "write")

    def emem_read(self, offset: int, n: int) -> bytes:
        """``n`` bytes (whole dwords) of the channel from ``offset``, read auto-increment."""
        self._check_span(offset, n)
        start = self._ememc(offset, EMEMC_AINCR)
        data = b"".join(self._rd(NV_PFSP_EMEMD).to_bytes(4, "little") for _ in range(n // 4))
        self._check_advanced(start, n // 4, "read")
        return data

    # ---- packets -------------------------------------------------------------------------------

    def _message_size(self) -> int:
        head, tail = self._rd(NV_PFSP_MSGQ_HEAD), self._rd(NV_PFSP_MSGQ_TAIL)
        return 0 if head == tail else (tail - head + 4) & 0xFFFFFFFF

    def send_packet(self, packet: bytes, what: str = "a packet") -> None:
        """One packet into the command queue (kfspSendPacket_GH100): wait for the queue (and,
        as 580 does, the message queue) to be empty, copy the packet zero-padded to dwords,
        QUEUE_TAIL = its last dword, then QUEUE_HEAD = 0, the doorbell."""
        if not 4 <= len(packet) <= FSP_EMEM_CHANNEL_RM_SIZE:
            raise Misuse(f"{self.gpu}: an FSP packet is 4 to {FSP_EMEM_CHANNEL_RM_SIZE} bytes, "
                         f"not {len(packet)}")
        padded = packet + bytes(-len(packet) % 4)
        deadline = time.monotonic() + self.timeout_s
        pause = 0.0
        while self._rd(NV_PFSP_QUEUE_HEAD) != self._rd(NV_PFSP_QUEUE_TAIL) or \
                self._message_size():
            if self._message_size():
                got = self.receive_packet(what)
                raise self._fail(f"the FSP sent a message (0x{len(got):x} bytes, starting "
                                 f"{got[:8].hex()}) while {what} waited to be sent")
            if time.monotonic() >= deadline:
                raise self._fail(f"the FSP's command queue did not empty within "
                                 f"{self.timeout_s} s, so {what} could not be sent")
            time.sleep(pause)
            pause = min(pause * 2 or 1e-5, 1e-3)
        self.emem_write(0, padded)
        self._wr(NV_PFSP_QUEUE_TAIL, len(padded) - 4)  # TAIL: the last dword written
        self._wr(NV_PFSP_QUEUE_HEAD, 0)  # after TAIL: it interrupts the FSP

    def receive_packet(self, what: str = "a packet",
                       timeout_s: float | None = None) -> bytes:
        """One packet from the message queue (kfspReadPacket_GH100), acknowledged by setting
        MSGQ_TAIL then MSGQ_HEAD to the head; waits ``timeout_s`` (the transport's default)."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        ok, size = poll(self._message_size, bool, wait)
        if not ok:
            raise self._fail(f"the FSP did not answer {what} within {wait} s")
        head = self._rd(NV_PFSP_MSGQ_HEAD)
        if size % 4 or size > FSP_EMEM_CHANNEL_RM_SIZE or \
                head % 4 or head + size > FSP_EMEM_CHANNEL_RM_SIZE:
            raise self._fail(f"the FSP's answer to {what} is 0x{size:x} bytes at EMEM "
                             f"0x{head:x}, outside the channel")
        data = self.emem_read(head, size)
        self._wr(NV_PFSP_MSGQ_TAIL, head)
        self._wr(NV_PFSP_MSGQ_HEAD, head)
        return data

    # ---- NVDM commands -------------------------------------------------------------------------

    def command(self, nvdm_type: int, payload: bytes,
                timeout_s: float | None = None) -> FspResponse:
        """Send NVDM message ``nvdm_type`` with ``payload`` as one packet and check the FSP's
        FSP_RESPONSE: headers, the command it answers (as nouveau gh100_fsp_send_sync does)
        and errorCode FSP_OK; raises :class:`FspError` naming the GPU, command and code."""
        what = f"the {nvdm_name(nvdm_type)} command"
        if HEADERS + len(payload) > FSP_EMEM_CHANNEL_RM_SIZE:
            raise Misuse(f"{self.gpu}: {what}'s 0x{len(payload):x}-byte payload does not fit "
                         "one packet (multi-packet messages are not supported)")
        headers = struct.pack("<II", mctp_header(som=True, eom=True), nvdm_header(nvdm_type))
        self.send_packet(headers + payload, what)
        reply = self.receive_packet(what, timeout_s)
        return self._check_response(reply, nvdm_type, what)

    def _check_response(self, reply: bytes, nvdm_type: int, what: str) -> FspResponse:
        size = HEADERS + struct.calcsize(COMMAND_RESPONSE_FORMAT)
        if len(reply) < size:
            raise self._fail(f"the FSP's answer to {what} is {len(reply)} bytes, too short "
                             f"for an FSP_RESPONSE ({size}): {reply.hex()}")
        mctp, msg = struct.unpack_from("<II", reply)
        if not (mctp & MCTP_HEADER_SOM and mctp & MCTP_HEADER_EOM):
            raise self._fail(f"the FSP's answer to {what} is not a single-packet message "
                             f"(MCTP header 0x{mctp:08x})")
        if msg & 0x7F != MCTP_MSG_HEADER_TYPE_VENDOR_PCI or \
                msg >> 8 & 0xFFFF != MCTP_MSG_HEADER_VENDOR_ID_NV or \
                msg >> 24 != NVDM_TYPE_FSP_RESPONSE:
            raise self._fail(f"the FSP's answer to {what} is not an NVDM FSP_RESPONSE "
                             f"(message header 0x{msg:08x})")
        response = FspResponse(*struct.unpack_from(COMMAND_RESPONSE_FORMAT, reply, HEADERS))
        if response.command != nvdm_type:
            raise self._fail(f"the FSP answered {nvdm_name(response.command)}, not {what}")
        if response.error_code != FSP_OK:
            raise self._fail(f"the FSP refused {what} with error code "
                             f"{fsp_error_name(response.error_code)}")
        return response

    def send_cot(self, payload: bytes, timeout_s: float | None = None) -> FspResponse:
        """The COT message (kfspSendBootCommands_GH100): ``payload`` from :func:`cot_payload`,
        checked for its size and version before any register is touched."""
        if len(payload) != COT_SIZE:
            raise Misuse(f"{self.gpu}: a COT payload is {COT_SIZE} bytes, not {len(payload)}")
        version, size = struct.unpack_from("<HH", payload)
        if version not in COT_SIZES or size != COT_SIZE:
            raise Misuse(f"{self.gpu}: the COT payload says version {version}, size {size}; "
                         f"want a version of {sorted(COT_SIZES)} and size {COT_SIZE}")
        return self.command(NVDM_TYPE_COT, payload, timeout_s)
