"""GSP_RUN_CPU_SEQUENCER: register work the GSP hands the CPU, run against BAR 0.

While it boots (and around power transitions) GSP-RM sends the event
NV_VGPU_MSG_EVENT_GSP_RUN_CPU_SEQUENCER (0x1002, rpc_global_enums.h) whose payload is
``rpc_run_cpu_sequencer_v17_00`` (generated/g_rpc-structures.h): NvU32 bufferSizeDWord,
NvU32 cmdIndex (the dwords of commands written), NvU32 regSaveArea[8]
(GSP_SEQ_BUF_REG_SAVE_SIZE), then commandBuffer[], a stream of GSP_SEQ_BUF_OPCODE values each
followed by exactly its payload's dwords (src/nvidia/arch/nvalloc/common/inc/rmgspseq.h).

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/gsp-sequencer.md."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from rig_edge import RigError
from rig_nv_pci.boot.falcon import OS, Falcon
from rig_nv_pci.gsp.rpc import Event, Incoming
from rig_pci import Window


class Opcode(IntEnum):
    """GSP_SEQ_BUF_OPCODE (rmgspseq.h)."""

    REG_WRITE = 0
    REG_MODIFY = 1
    REG_POLL = 2
    DELAY_US = 3
    REG_STORE = 4
    CORE_RESET = 5
    CORE_START = 6
    CORE_WAIT_FOR_HALT = 7
    CORE_RESUME = 8


# GSP_SEQUENCER_PAYLOAD_SIZE_DWORDS: sizeof(GSP_SEQ_BUF_PAYLOAD_*) / 4; the core ops take none
ARGUMENTS = {Opcode.REG_WRITE: 2, Opcode.REG_MODIFY: 3, Opcode.REG_POLL: 5, Opcode.DELAY_US: 1,
             Opcode.REG_STORE: 2}
HEADER = struct.Struct("<II8I")  # bufferSizeDWord, cmdIndex, regSaveArea[8]: 40 bytes
REG_SAVE_SIZE = 8  # GSP_SEQ_BUF_REG_SAVE_SIZE
POLL_DEFAULT_US = 4_000_000  # nouveau: a REG_POLL timeout of 0 waits 4 s
# ampere/ga102/dev_gc6_island.h, _addendum.h: SEC2 reports GSP-RM reloaded in bit 26
NV_PGC6_BSI_SECURE_SCRATCH_14 = 0x001180F8
BOOT_STAGE_3_HANDOFF_DONE = 1 << 26


class SequencerError(RigError):
    """A RUN_CPU_SEQUENCER buffer was malformed or one of its commands failed (or was cut
    short); ``command`` is that command where one is to blame."""

    def __init__(self, message: str, command: Command | None = None) -> None:
        super().__init__(message)
        self.command = command


@dataclass(frozen=True)
class Command:
    """One command: its opcode, arguments and the byte offset of its opcode in the payload."""

    opcode: Opcode
    args: tuple[int, ...]
    offset: int

    def where(self) -> str:
        return f"{self.opcode.name} at payload offset 0x{self.offset:x}"


@dataclass(frozen=True)
class Sequence:
    """A parsed rpc_run_cpu_sequencer_v17_00."""

    buffer_size_dwords: int
    commands: tuple[Command, ...]
    reg_save: tuple[int, ...]


def parse(payload: bytes | bytearray | memoryview) -> Sequence:
    """The commands of a RUN_CPU_SEQUENCER payload; raises :class:`SequencerError` for every
    way it can be malformed, naming the opcode and offset where one is to blame."""
    data = bytes(payload)
    if len(data) < HEADER.size:
        raise SequencerError(f"RUN_CPU_SEQUENCER payload of {len(data)} bytes is shorter than "
                             f"its {HEADER.size}-byte header")
    size, end, *save = HEADER.unpack_from(data)
    if size == 0:
        raise SequencerError("RUN_CPU_SEQUENCER with bufferSizeDWord 0")
    if end >= size:
        raise SequencerError(f"RUN_CPU_SEQUENCER cmdIndex {end} is not below bufferSizeDWord "
                             f"{size} (kgspExecuteSequencerBuffer refuses it)")
    if len(data) < HEADER.size + 4 * end:
        raise SequencerError(f"RUN_CPU_SEQUENCER payload of {len(data)} bytes holds fewer than "
                             f"its cmdIndex {end} dwords of commands")
    words = struct.unpack_from(f"<{end}I", data, HEADER.size)
    commands = []
    i = 0
    while i < end:
        at = HEADER.size + 4 * i
        raw = words[i]
        if raw not in Opcode._value2member_map_:
            raise SequencerError(f"RUN_CPU_SEQUENCER: unknown opcode {raw} at payload offset "
                                 f"0x{at:x}")
        op = Opcode(raw)
        n = ARGUMENTS.get(op, 0)
        if i + 1 + n > end:
            raise SequencerError(f"RUN_CPU_SEQUENCER: {op.name} at payload offset 0x{at:x} "
                                 f"needs {n} arguments but cmdIndex {end} ends the commands")
        command = Command(op, tuple(words[i + 1:i + 1 + n]), at)
        _check(command)
        commands.append(command)
        i += 1 + n
    return Sequence(size, tuple(commands), tuple(save))


def _check(c: Command) -> None:
    if c.opcode in ARGUMENTS and c.opcode != Opcode.DELAY_US and c.args[0] % 4:
        raise SequencerError(f"RUN_CPU_SEQUENCER: {c.where()} names register 0x{c.args[0]:x}, "
                             "not 32-bit aligned")
    if c.opcode == Opcode.REG_STORE and c.args[1] >= REG_SAVE_SIZE:
        raise SequencerError(f"RUN_CPU_SEQUENCER: {c.where()} stores into index {c.args[1]} "
                             f"of a {REG_SAVE_SIZE}-entry save area")


def encode(commands: list[tuple[int, ...]], buffer_size_dwords: int | None = None) -> bytes:
    """A payload holding ``commands`` (each an opcode and its arguments), for tests."""
    words = [w for c in commands for w in c]
    size = buffer_size_dwords if buffer_size_dwords is not None else len(words) + 1
    return HEADER.pack(size, len(words), *[0] * REG_SAVE_SIZE) + struct.pack(
        f"<{len(words)}I", *words)


class Sequencer:
    """Runs sequences against ``bar0`` with the GSP and SEC2 falcons behind it.

    ``libos_args`` is the LibOS arguments' bus address (CORE_RESUME puts it back in the GSP's
    mailboxes), ``app_version`` the GSP bootloader's RM_RISCV_UCODE_DESC appVersion
    (CORE_RESUME writes it to NV_PGSP_FALCON_OS). ``sleep`` waits for DELAY_US and between
    polls (seconds)."""

    def __init__(self, bar0: Window, *, gsp: Falcon, sec2: Falcon, libos_args: int,
                 app_version: int = 0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.bar0, self.gsp, self.sec2 = bar0, gsp, sec2
        self.libos_args, self.app_version = libos_args, app_version
        self.sleep = sleep
        self.runs = 0
        # the command an exception that is not an Exception (KeyboardInterrupt) cut short in
        # the last run, as the SequencerError that names it
        self.cut_short: SequencerError | None = None

    def run(self, payload: bytes | bytearray | memoryview) -> list[int]:
        """Parse ``payload`` and run every command once, in order; the register save area
        after. Raises :class:`SequencerError` naming the command that failed: any
        :class:`Exception` a command raises (a falcon that does not answer, a register outside
        BAR 0, a BAR access error) is wrapped. Any other exception (KeyboardInterrupt) goes
        through as it is, with :attr:`cut_short` naming the command it cut short."""
        self.cut_short = None
        seq = parse(payload)
        save = list(seq.reg_save)
        for c in seq.commands:
            try:
                self._one(c, save)
            except SequencerError as e:
                e.command = e.command or c
                raise
            except Exception as e:
                raise SequencerError(f"RUN_CPU_SEQUENCER: {c.where()} failed: {e}", c) from e
            except BaseException as e:
                self.cut_short = SequencerError(
                    f"RUN_CPU_SEQUENCER: {c.where()} was cut short by {type(e).__name__}", c)
                raise
        self.runs += 1
        return save

    def _one(self, c: Command, save: list[int]) -> None:
        a = c.args
        if c.opcode == Opcode.REG_WRITE:
            self.bar0.write32(a[0], a[1])
        elif c.opcode == Opcode.REG_MODIFY:
            self.bar0.write32(a[0], self.bar0.read32(a[0]) & ~a[1] & 0xFFFFFFFF | a[2])
        elif c.opcode == Opcode.REG_POLL:
            self._poll(c)
        elif c.opcode == Opcode.DELAY_US:
            self.sleep(a[0] / 1e6)
        elif c.opcode == Opcode.REG_STORE:
            save[a[1]] = self.bar0.read32(a[0])
        elif c.opcode == Opcode.CORE_RESET:
            self.gsp.reset()
            self.gsp.disable_ctx_req()
        elif c.opcode == Opcode.CORE_START:
            self.gsp.start_cpu()
        elif c.opcode == Opcode.CORE_WAIT_FOR_HALT:
            self.gsp.wait_halt()
        else:
            self._resume(c)

    def _poll(self, c: Command) -> None:
        addr, mask, value, timeout_us, error = c.args
        timeout_us = timeout_us or POLL_DEFAULT_US
        deadline = time.monotonic() + timeout_us / 1e6
        pause = 0.0
        while True:
            got = self.bar0.read32(addr)
            if got & mask == value:
                return
            if time.monotonic() >= deadline:
                raise SequencerError(
                    f"RUN_CPU_SEQUENCER: {c.where()} timed out after {timeout_us} us: register "
                    f"0x{addr:06x} read 0x{got:08x}, & mask 0x{mask:08x} never equalled "
                    f"0x{value:08x} (GSP error code {error})")
            self.sleep(pause)
            pause = min(pause * 2 or 1e-6, 1e-3)

    def _resume(self, c: Command) -> None:
        """kgspExecuteSequencerCommand_GA102's CORE_RESUME."""
        self.gsp.reset_into_riscv()
        self.gsp.wr(0x040, self.libos_args & 0xFFFFFFFF)  # MAILBOX0: kgspProgramLibosBootArgsAddr
        self.gsp.wr(0x044, self.libos_args >> 32)
        self.sec2.start_cpu()
        wait_s = self.sec2.timeout_s  # gpuTimeoutCondWait: GPU_TIMEOUT_DEFAULT, the falcons' own
        deadline = time.monotonic() + wait_s
        while not self.bar0.read32(NV_PGC6_BSI_SECURE_SCRATCH_14) & BOOT_STAGE_3_HANDOFF_DONE:
            if time.monotonic() >= deadline:
                raise SequencerError(
                    f"RUN_CPU_SEQUENCER: {c.where()}: SEC2 did not reload GSP-RM within "
                    f"{wait_s} s (NV_PGC6_BSI_SECURE_SCRATCH_14 0x"
                    f"{self.bar0.read32(NV_PGC6_BSI_SECURE_SCRATCH_14):08x}; "
                    f"SEC2 {self.sec2.state()})")
            self.sleep(1e-5)
        mailbox0 = self.sec2.rd(0x040)
        if mailbox0 != 0:
            raise SequencerError(f"RUN_CPU_SEQUENCER: {c.where()}: SEC2 failed to resume GSP-RM "
                                 f"(MAILBOX0 0x{mailbox0:08x})")
        self.gsp.wr(OS, self.app_version)
        if not self.gsp.riscv_active():
            raise SequencerError(f"RUN_CPU_SEQUENCER: {c.where()}: the GSP's RISC-V core is not "
                                 f"running after SEC2 resumed it ({self.gsp.state()})")


class SequencerEvents:
    """An RPC channel's ``on_event``: each GSP_RUN_CPU_SEQUENCER run against BAR 0 by
    ``sequencer``, every other message handed to ``on_event``.

    A request runs once, front to back: one delivered again (:meth:`rig_nv_pci.gsp.rpc.Rpc.poll`
    hands a message on again when an exception that is not an Exception interrupted its
    handler) is not run again. Every failure is kept in :attr:`failed`, and raised: a
    :class:`SequencerError` for a malformed buffer or a failed command, else the exception
    that cut the sequence short (the boot ends its wait for GSP_INIT_DONE on the first).

    Once the boot is done, :meth:`runtime` hands failures to ``lose`` instead: the sequence
    that failed loses the GPU (:attr:`lost`, the :class:`SequencerError` naming the opcode and
    its offset), a :class:`SequencerError` is not raised (the device raises the loss as
    :class:`rig_edge.Lost`), an exception that cut the sequence short still is, and no later
    request runs (each is handed to ``on_event`` as a message, which a log notes).
    """

    def __init__(self, sequencer: Sequencer,
                 on_event: Callable[[Incoming], None] | None = None) -> None:
        self.sequencer = sequencer
        self.on_event = on_event
        self.failed: list[SequencerError] = []
        self.lost: SequencerError | None = None
        self._lose: Callable[[SequencerError], object] | None = None
        self._serial: int | None = None  # the status queue's number of the last one begun

    def runtime(self, lose: Callable[[SequencerError], object]) -> None:
        """From now on a failed sequence loses the GPU through ``lose``."""
        self._lose = lose

    def __call__(self, incoming: Incoming) -> None:
        sequencer = incoming.function == Event.GSP_RUN_CPU_SEQUENCER
        if sequencer and incoming.serial is not None and incoming.serial == self._serial:
            return  # begun already, and handed on again after an interruption
        if not sequencer or self.lost is not None:
            if self.on_event is not None:
                self.on_event(incoming)
            return
        try:
            self._serial = incoming.serial
            self.sequencer.run(incoming.payload)
        except BaseException as e:
            error = e if isinstance(e, SequencerError) else self.sequencer.cut_short
            if error is None:
                error = SequencerError(f"RUN_CPU_SEQUENCER was cut short by {type(e).__name__} "
                                       "before its first command")
            self.failed.append(error)
            lose = self._lose
            if lose is None:
                raise
            self.lost = error
            lose(error)
            if not isinstance(e, Exception):
                raise
