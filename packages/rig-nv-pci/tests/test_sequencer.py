"""rig_nv_pci.gsp.sequencer: RUN_CPU_SEQUENCER buffers parsed and run against the simulated GPU."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
import sim
from sim import regs

from rig_nv_pci.boot.falcon import GSP, SEC2, Falcon
from rig_nv_pci.gsp.sequencer import Opcode, Sequencer, SequencerError, encode, parse

LIBOS_ARGS = 0x1_2345_6000
SCRATCH = regs.SW_SCRATCH + 4 * 0x20


def payload(words: list[int], size: int = 64, cmd_index: int | None = None,
            save: tuple[int, ...] = (0,) * 8) -> bytes:
    """rpc_run_cpu_sequencer_v17_00 built by hand: bufferSizeDWord, cmdIndex, regSaveArea[8]."""
    n = len(words) if cmd_index is None else cmd_index
    return struct.pack("<10I", size, n, *save) + struct.pack(f"<{len(words)}I", *words)


class Rig:
    def __init__(self) -> None:
        self.gpu = sim.SimGpu()
        self.bar0 = self.gpu.bar0()
        self.sleeps: list[float] = []
        self.seq = Sequencer(self.bar0, gsp=Falcon(self.bar0, GSP, 0.2),
                             sec2=Falcon(self.bar0, SEC2, 0.2), libos_args=LIBOS_ARGS,
                             app_version=0x5A5A, sleep=self.sleeps.append)

    def run(self, *commands: tuple[int, ...]) -> list[int]:
        return self.seq.run(encode(list(commands)))


# ---- parsing ------------------------------------------------------------------------------------

def test_parse_reads_every_opcode_with_its_arguments_and_offset() -> None:
    words = [0, 0x1400, 7,  1, 0x1404, 0xF0, 0x30,  2, 0x1408, 1, 1, 50, 2,  3, 10,
             4, 0x140C, 3,  5,  6,  7,  8]
    seq = parse(payload(words, size=40, save=(1, 2, 3, 4, 5, 6, 7, 8)))
    assert seq.buffer_size_dwords == 40 and seq.reg_save == (1, 2, 3, 4, 5, 6, 7, 8)
    assert [(c.opcode, c.args, c.offset) for c in seq.commands] == [
        (Opcode.REG_WRITE, (0x1400, 7), 40), (Opcode.REG_MODIFY, (0x1404, 0xF0, 0x30), 52),
        (Opcode.REG_POLL, (0x1408, 1, 1, 50, 2), 68), (Opcode.DELAY_US, (10,), 92),
        (Opcode.REG_STORE, (0x140C, 3), 100), (Opcode.CORE_RESET, (), 112),
        (Opcode.CORE_START, (), 116), (Opcode.CORE_WAIT_FOR_HALT, (), 120),
        (Opcode.CORE_RESUME, (), 124)]


def test_only_cmd_index_dwords_are_commands() -> None:
    seq = parse(payload([3, 1, 99, 99], cmd_index=2))  # what follows cmdIndex is not read
    assert [c.opcode for c in seq.commands] == [Opcode.DELAY_US]


@pytest.mark.parametrize(("data", "message"), [
    (b"\0" * 39, r"payload of 39 bytes is shorter than its 40-byte header"),
    (payload([3, 1], size=0), r"bufferSizeDWord 0"),
    (payload([3, 1], size=2), r"cmdIndex 2 is not below bufferSizeDWord 2"),
    (payload([3, 1], cmd_index=4), r"payload of 48 bytes holds fewer than its cmdIndex 4 dwords"),
    (payload([3, 1, 9]), r"unknown opcode 9 at payload offset 0x30"),
    (payload([3, 1, 2, 0x1400, 1, 1]), r"REG_POLL at payload offset 0x30 needs 5 arguments but "
                                       r"cmdIndex 6 ends"),
    (payload([4, 0x1400, 8]), r"REG_STORE at payload offset 0x28 stores into index 8 of a "
                              r"8-entry save area"),
    (payload([0, 0x1402, 1]), r"REG_WRITE at payload offset 0x28 names register 0x1402, not "
                              r"32-bit aligned"),
])
def test_malformed_buffers_are_refused_naming_opcode_and_offset(data: bytes, message: str) -> None:
    r = Rig()
    with pytest.raises(SequencerError, match=message):
        r.seq.run(data)
    assert r.gpu.writes == [] and r.seq.runs == 0  # nothing ran


# ---- running, against the simulator's registers -------------------------------------------------

def test_reg_write_and_reg_modify() -> None:
    r = Rig()
    r.gpu.regs[SCRATCH + 4] = 0xAAAA_AAAA
    r.run((Opcode.REG_WRITE, SCRATCH, 0x1234_5678),
          (Opcode.REG_MODIFY, SCRATCH + 4, 0xFF00, 0x3400))
    assert r.gpu.regs[SCRATCH] == 0x1234_5678
    assert r.gpu.regs[SCRATCH + 4] == 0xAAAA_34AA
    assert r.gpu.writes == [(SCRATCH, 0x1234_5678), (SCRATCH + 4, 0xAAAA_34AA)]


def test_reg_poll_waits_until_the_register_matches() -> None:
    r = Rig()
    r.gpu.gfw_polls = 3  # the GFW progress register reads 0x03 three times, then 0xff
    r.run((Opcode.REG_POLL, regs.AON_SCRATCH_GROUP_05_0, 0xFF, 0xFF, 100_000, 1))
    assert r.gpu.reads.count(regs.AON_SCRATCH_GROUP_05_0) == 4 and len(r.sleeps) == 3


def test_a_reg_poll_that_never_matches_times_out_clearly() -> None:
    r = Rig()
    r.gpu.regs[SCRATCH] = 0x10
    with pytest.raises(SequencerError, match=r"REG_POLL at payload offset 0x30 timed out after "
                                             r"1000 us: register 0x001480 read 0x00000010, & mask "
                                             r"0x0000000f never equalled 0x00000001 \(GSP error "
                                             r"code 2\)"):
        r.run((Opcode.DELAY_US, 3), (Opcode.REG_POLL, SCRATCH, 0xF, 1, 1000, 2))


def test_delay_us_and_reg_store() -> None:
    r = Rig()
    r.gpu.regs[SCRATCH] = 0xC0FFEE
    save = r.run((Opcode.DELAY_US, 250), (Opcode.REG_STORE, SCRATCH, 5))
    assert r.sleeps == [250e-6]
    assert save == [0, 0, 0, 0, 0, 0xC0FFEE, 0, 0]


def test_core_reset_start_and_wait_for_halt_drive_the_gsp_falcon() -> None:
    r = Rig()
    g = r.gpu.gsp
    r.run((Opcode.CORE_RESET,))
    assert g.resets == 1 and not g.in_reset
    assert g.regs[g.fbif + regs.FBIF_CTL] & 1 << 7  # ALLOW_PHYS_NO_CTX
    assert g.reg(regs.DMACTL) == 0
    r.run((Opcode.CORE_START,), (Opcode.CORE_WAIT_FOR_HALT,))
    assert g.starts == ["falcon"] and g.state == "halted"
    assert g.reg(regs.BOOTVEC) == 0 and (g.base + regs.BOOTVEC, 0) not in r.gpu.writes


def hs_ready(f: sim.SimFalcon, program: Callable[[sim.SimFalcon], None]) -> None:
    """The falcon able to start heavy-secure again: its boot ROM parameters and an accepted
    signature in place, NV_PMC_BOOT_0 in FALCON_RM (as RM's last reset left it), ``program``
    as ucode 7."""
    f.regs[f.base + regs.FALCON_RM] = f.boot0()
    f.regs[f.riscv + regs.MOD_SEL] = 1
    f.regs[f.riscv + regs.BROM_ENGIDMASK] = f.engine_bit
    f.regs[f.riscv + regs.BROM_CURR_UCODE_ID] = 7
    f.signatures = {bytes(384)}
    f.programs[7] = program


def test_core_wait_for_halt_that_never_halts_names_the_command() -> None:
    r = Rig()
    hs_ready(r.gpu.gsp, lambda f: None)
    r.gpu.gsp.run_polls = 10**9
    r.run((Opcode.CORE_START,))
    with pytest.raises(SequencerError, match=r"CORE_WAIT_FOR_HALT at payload offset 0x28 failed: "
                                             r"the GSP falcon did not halt"):
        r.run((Opcode.CORE_WAIT_FOR_HALT,))


def resume_ready(r: Rig, *, mailbox0: int = 0, handoff: bool = True) -> None:
    """SEC2 able to start again, running a program that reloads GSP-RM as SEC2-RTOS does."""

    def reload(f: sim.SimFalcon) -> None:
        if handoff:
            r.gpu.regs[regs.BSI_SECURE_SCRATCH_14] = 1 << 26
        f.set_mailbox(0, mailbox0)
        if mailbox0 == 0:
            r.gpu.gsp.start_riscv()

    hs_ready(r.gpu.sec2, reload)


def test_core_resume_reloads_gsp_rm_through_sec2() -> None:
    r = Rig()
    resume_ready(r)
    r.run((Opcode.CORE_RESUME,))
    g = r.gpu.gsp
    assert (g.mailbox(1) << 32 | g.mailbox(0)) == LIBOS_ARGS
    assert g.reg(regs.OS) == 0x5A5A and g.state == "riscv-running"
    assert r.gpu.sec2.log[-1] == "hs run ucode 7" and g.resets == 1


def test_core_resume_with_a_sec2_error_fails() -> None:
    r = Rig()
    resume_ready(r, mailbox0=0xBAD)
    with pytest.raises(SequencerError, match=r"CORE_RESUME at payload offset 0x28: SEC2 failed to "
                                             r"resume GSP-RM \(MAILBOX0 0x00000bad\)"):
        r.run((Opcode.CORE_RESUME,))


def test_a_register_outside_bar0_fails_naming_the_command() -> None:
    r = Rig()
    with pytest.raises(SequencerError, match=r"REG_WRITE at payload offset 0x28 failed: .*outside"):
        r.run((Opcode.REG_WRITE, sim.gpu.BAR0_SIZE, 1))


def test_core_resume_without_the_handoff_times_out() -> None:
    r = Rig()
    resume_ready(r, handoff=False)
    with pytest.raises(SequencerError, match=r"CORE_RESUME at payload offset 0x28: SEC2 did not "
                                             r"reload GSP-RM within 0.2 s "
                                             r"\(NV_PGC6_BSI_SECURE_SCRATCH_14 0x00000000"):
        r.run((Opcode.CORE_RESUME,))


def test_a_bar_access_error_fails_naming_the_command() -> None:
    r = Rig()
    r.gpu.failing[SCRATCH + 4] = 1
    with pytest.raises(SequencerError, match=r"REG_MODIFY at payload offset 0x34 failed: "
                                             r"\[Errno 5\] BAR 0 access at 0x1484 failed") as e:
        r.run((Opcode.REG_WRITE, SCRATCH, 1), (Opcode.REG_MODIFY, SCRATCH + 4, 1, 1),
              (Opcode.REG_WRITE, SCRATCH + 8, 1))
    assert e.value.command is not None and e.value.command.offset == 0x34
    assert isinstance(e.value.__cause__, OSError)
    assert r.gpu.writes == [(SCRATCH, 1)] and r.seq.runs == 0


def test_an_exception_that_is_not_an_exception_goes_through_naming_what_it_cut_short() -> None:
    r = Rig()

    def interrupt(value: int) -> None:
        raise KeyboardInterrupt

    r.gpu.on_write[SCRATCH + 4] = interrupt
    with pytest.raises(KeyboardInterrupt):
        r.run((Opcode.DELAY_US, 1), (Opcode.REG_WRITE, SCRATCH + 4, 1),
              (Opcode.REG_WRITE, SCRATCH + 8, 1))
    cut = r.seq.cut_short
    assert cut is not None and str(cut) == ("RUN_CPU_SEQUENCER: REG_WRITE at payload offset "
                                            "0x30 was cut short by KeyboardInterrupt")
    assert r.gpu.writes == [(SCRATCH + 4, 1)]
    del r.gpu.on_write[SCRATCH + 4]
    r.run((Opcode.REG_WRITE, SCRATCH, 2))
    assert r.seq.cut_short is None and r.seq.runs == 1


def incoming(data: bytes, serial: int | None = None, function: int = 0x1002) -> Any:
    from rig_nv_pci.gsp.rpc import Incoming

    return Incoming(function, 0, 0, data, serial)


def test_sequencer_events_run_each_request_once_and_hand_the_rest_on() -> None:
    from rig_nv_pci.gsp.sequencer import SequencerEvents

    r = Rig()
    others: list[Any] = []
    events = SequencerEvents(r.seq, others.append)
    events(incoming(encode([(Opcode.REG_WRITE, SCRATCH, 1)]), serial=7))
    events(incoming(encode([(Opcode.REG_WRITE, SCRATCH, 1)]), serial=7))  # handed on again
    events(incoming(encode([(Opcode.REG_WRITE, SCRATCH, 2)]), serial=8))
    events(incoming(b"\x01", function=0x1004))
    assert r.gpu.writes == [(SCRATCH, 1), (SCRATCH, 2)] and r.seq.runs == 2
    assert [e.function for e in others] == [0x1004]


def test_sequencer_events_raise_failures_during_the_boot_and_lose_the_gpu_after() -> None:
    from rig_nv_pci.gsp.sequencer import SequencerEvents

    r = Rig()
    others: list[Any] = []
    events = SequencerEvents(r.seq, others.append)
    bad = encode([(Opcode.REG_WRITE, SCRATCH, 1), (9,)])
    with pytest.raises(SequencerError, match="unknown opcode 9 at payload offset 0x34"):
        events(incoming(bad, serial=1))  # the boot: raised, kept in failed
    assert len(events.failed) == 1 and events.lost is None
    lost: list[SequencerError] = []
    events.runtime(lost.append)
    events(incoming(bad, serial=2))  # the device runs: recorded, not raised
    assert lost == [events.lost] and events.failed[1] is events.lost
    events(incoming(encode([(Opcode.REG_WRITE, SCRATCH, 3)]), serial=3))  # no later one runs
    assert r.gpu.writes == [] and [e.serial for e in others] == [3]

    r = Rig()
    events = SequencerEvents(r.seq)
    events.runtime(lost.append)

    def interrupt(value: int) -> None:
        raise KeyboardInterrupt

    r.gpu.on_write[SCRATCH] = interrupt
    with pytest.raises(KeyboardInterrupt):  # an interruption is raised, having lost the GPU
        events(incoming(encode([(Opcode.REG_WRITE, SCRATCH, 1)]), serial=1))
    assert str(lost[-1]) == ("RUN_CPU_SEQUENCER: REG_WRITE at payload offset 0x28 was cut short "
                             "by KeyboardInterrupt") and events.lost is lost[-1]
