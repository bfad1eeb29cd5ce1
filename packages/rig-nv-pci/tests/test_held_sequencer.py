"""What the GSP sends while a device of the simulated GA102 runs (the Rig_nv_pci spec's
"Opening"): a GSP_RUN_CPU_SEQUENCER runs once, front to back, against BAR 0 as the path polls
the GSP's messages, and one an exception cuts short loses the GPU, whose next open resets it;
a report the path received (RC_TRIGGERED; for a fault the MMU queued, RC_TRIGGERED Xid 31 and
MMU_FAULT_QUEUED) is raised by the device's next sleep or wait, its first sleep when no wait
came, whatever exception struck in between (Rig_edge.Driver.sleep)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sim import regs
from sim.gsp_fw import sequencer_payload
from support import BUS, Opened, every_use_is_lost, given_back, opener, reopens

import rig_nv_pci
from rig_edge import Fault, Lost, Memory
from rig_nv import Device
from rig_nv_pci import held
from rig_nv_pci.gsp import events as ev
from rig_nv_pci.gsp.sequencer import SequencerError
from rig_nv_pci.path import faults
from rig_nv_pci.path import pci as pci_path

# GSP_SEQ_BUF_OPCODE (rmgspseq.h)
WRITE, MODIFY, POLL, DELAY, STORE = 0, 1, 2, 3, 4
# NV_PBUS_SW_SCRATCH registers the boot's sequencer leaves alone (it uses 0x30..0x32)
A, B, C = (regs.SW_SCRATCH + 4 * i for i in (0x33, 0x34, 0x35))
HEADER = 0x28  # rpc_run_cpu_sequencer_v17_00's header: the first command's payload offset
EV_RC_TRIGGERED = 0x1004  # NV_VGPU_MSG_EVENT_RC_TRIGGERED (rpc_global_enums.h)
EV_MMU_FAULT_QUEUED = 0x1005  # NV_VGPU_MSG_EVENT_MMU_FAULT_QUEUED (rpc_global_enums.h)
FAULT_PTE = 0x2  # NV_PFAULT_FAULT_TYPE_PTE (gv100/dev_fault.h)
FAULT_AT = (64 << 30) + 0x7000  # a page the GSP reports the MMU faulted at


def writes(d: Opened, since: int, *registers: int) -> list[tuple[int, int]]:
    """BAR 0's writes to ``registers`` since write number ``since``, in order."""
    return [w for w in d.rig.gpu.writes[since:] if w[0] in registers]


def at(dwords: int) -> str:
    """The payload offset of the command after ``dwords`` dwords of commands."""
    return f"0x{HEADER + 4 * dwords:x}"


# ---- a sequence run while the device runs -----------------------------------------------------


def test_a_sequence_the_gsp_sends_while_the_device_runs_runs_once_in_order(
    ga102: Opened,
) -> None:
    """GSP-RM asks for a sequence after the boot: the device's sleep, draining the status
    queue, runs it against BAR 0 once, every command in order (REG_MODIFY reading back what
    REG_WRITE wrote, REG_POLL seeing it); one that arrives while an RPC waits for its reply
    runs there, once too; the device goes on working."""
    d = ga102.open()
    try:
        start = len(ga102.rig.gpu.writes)
        ga102.sim_rm.run_cpu_sequencer([
            (WRITE, A, 0x11), (MODIFY, A, 0xF0, 0x20), (POLL, A, 0xFF, 0x21, 2000, 7),
            (DELAY, 5), (STORE, A, 3), (WRITE, B, 0x22), (WRITE, A, 0x33)])
        d.sleep(0.0)
        d.sleep(0.0)
        assert writes(ga102, start, A, B) == [(A, 0x11), (A, 0x21), (B, 0x22), (A, 0x33)]
        ga102.sim_rm.run_cpu_sequencer([(WRITE, C, 0x44), (WRITE, C, 0x45)])
        region = d.alloc(0x1000, Memory.DEVICE)  # its RPCs read the request before the reply
        assert region is not None
        assert writes(ga102, start, C) == [(C, 0x44), (C, 0x45)]
        pinned = d.alloc(0x1000, Memory.PINNED)
        assert pinned is not None
        d.upload(pinned, b"after")
        d.copy(region, pinned, engine="copy").wait(timeout_s=5.0)
        assert bytes(d.download(region, 5)) == b"after"
        assert writes(ga102, start, A, B, C) == [(A, 0x11), (A, 0x21), (B, 0x22), (A, 0x33),
                                                 (C, 0x44), (C, 0x45)]
    finally:
        d.stop()
    assert ga102.stops == [None]


# ---- a sequence cut short loses the GPU ------------------------------------------------------


FAILURES: dict[str, tuple[Callable[[Opened], Any], str, list[tuple[int, int]]]] = {
    # a malformed buffer: refused before anything runs
    "malformed": (lambda o: sequencer_payload([(WRITE, A, 1), (9,)]),
                  rf"RUN_CPU_SEQUENCER: unknown opcode 9 at payload offset {at(3)}", []),
    # a REG_POLL that times out
    "poll timeout": (lambda o: [(WRITE, A, 1), (POLL, B, 0xFFFF_FFFF, 5, 1000, 9), (WRITE, C, 2)],
                     rf"RUN_CPU_SEQUENCER: REG_POLL at payload offset {at(3)} timed out after "
                     r"1000 us: register 0x0014d0 read 0x00000000", [(A, 1)]),
    # a BAR access error
    "BAR access error": (lambda o: (o.rig.gpu.failing.update({B: 1}),
                                    [(WRITE, A, 1), (WRITE, B, 2), (WRITE, C, 3)])[1],
                         rf"RUN_CPU_SEQUENCER: REG_WRITE at payload offset {at(3)} failed: "
                         r"\[Errno 5\] BAR 0 access at 0x14d0 failed", [(A, 1)]),
}


@pytest.mark.parametrize("why", list(FAILURES))
def test_a_sequence_that_fails_loses_the_gpu(ga102: Opened, why: str) -> None:
    """The device's next sleep raises Lost (not a Fault) naming the opcode and its offset,
    having run the sequence no further; every later use raises Lost; no later sequence runs;
    the stop gives the GPU back, reporting it lost (so that the opener resets it first), and
    it opens again."""
    make, message, written = FAILURES[why]
    d = ga102.open()
    try:
        region = d.alloc(0x1000)
        assert region is not None
        start = len(ga102.rig.gpu.writes)
        ga102.sim_rm.run_cpu_sequencer(make(ga102))
        with pytest.raises(Lost, match=rf"the device is lost: GPU 0: {message}") as e:
            d.sleep(0.0)
        assert not isinstance(e.value, Fault)
        assert writes(ga102, start, A, B, C) == written
        every_use_is_lost(d, region)
        with pytest.raises(Lost, match=message):  # the first cause, kept
            d.sleep(0.0)
        ga102.sim_rm.run_cpu_sequencer([(WRITE, C, 0x99)])  # read by the stop's RPCs
    finally:
        d.stop()
    assert writes(ga102, start, A, B, C) == written  # the later one did not run
    assert isinstance(d.path, held.PciPath) and d.path.events is not None
    assert "GSP event GSP_RUN_CPU_SEQUENCER" in d.path.events.text()
    [lost] = ga102.stops
    assert isinstance(lost, SequencerError) and str(lost) in str(e.value)
    assert ga102.firmware.suspended and not ga102.rig.gpu.wpr2_up()
    reopens(ga102)



def test_a_sequence_that_fails_during_an_rpc_loses_the_device_before_any_wait(
    ga102: Opened,
) -> None:
    """A failed sequence read while an RPC waits for its reply (an allocation's) loses the
    device at once (Device.mark_lost): the launch and the copy after it raise Lost naming the
    sequence's failure, with no wait or sleep between, and hand the GPU no work (no channel's
    GP_PUT moves, no doorbell)."""
    from test_silent import submitted

    make, message, _ = FAILURES["malformed"]
    d = ga102.open()
    try:
        a, b = d.alloc(0x4000, Memory.PINNED), d.alloc(0x4000, Memory.DEVICE)
        assert a is not None and b is not None
        d.copy(b, a, engine="copy").wait(timeout_s=5.0)  # the channels are in use
        ga102.sim_rm.run_cpu_sequencer(make(ga102))
        d.alloc(0x3000, Memory.PINNED)  # its RPC's wait reads the sequence, which fails
        work = submitted(ga102)
        for use in (lambda: d.copy(b, a), lambda: d.copy(b, a, engine="copy")):
            with pytest.raises(Lost, match=rf"the device is lost: GPU 0: {message}"):
                use()
        assert submitted(ga102) == work
    finally:
        d.stop()
    reopens(ga102)

def test_a_wait_raises_the_loss(ga102: Opened) -> None:
    """The loss reaches a wait as well: work the GPU has not done (its PBDMA stopped) is
    waited for, the sequence fails meanwhile, and the wait raises Lost naming it."""
    d = ga102.open()
    try:
        a, b = d.alloc(0x1000, Memory.PINNED), d.alloc(0x1000, Memory.DEVICE)
        assert a is not None and b is not None
        ga102.sim_rm.stop()
        point = d.copy(b, a, engine="copy")
        ga102.sim_rm.run_cpu_sequencer([(POLL, A, 1, 1, 500, 3)])
        with pytest.raises(Lost, match=rf"REG_POLL at payload offset {at(0)} timed out"):
            point.wait(timeout_s=5.0)
    finally:
        d.stop()
    assert isinstance(ga102.stops[0], SequencerError)


def interrupt(o: Opened) -> None:
    def raise_(value: int) -> None:
        raise KeyboardInterrupt

    o.rig.gpu.on_write[B] = raise_


def test_a_sequence_an_exception_cuts_short_loses_the_gpu_and_runs_no_further(
    ga102: Opened,
) -> None:
    """A KeyboardInterrupt strikes at the second of three writes (after BAR 0 took it): the
    sleep raises the KeyboardInterrupt, the next sleep raises Lost naming that command as cut
    short, and the sequence neither went on nor ran again (the message the interrupted poll
    kept is recognised)."""
    d = ga102.open()
    try:
        region = d.alloc(0x1000)
        assert region is not None
        start = len(ga102.rig.gpu.writes)
        interrupt(ga102)
        ga102.sim_rm.run_cpu_sequencer([(WRITE, A, 1), (WRITE, B, 2), (WRITE, C, 3)])
        with pytest.raises(KeyboardInterrupt):
            d.sleep(0.0)
        del ga102.rig.gpu.on_write[B]
        with pytest.raises(Lost, match=rf"GPU 0: RUN_CPU_SEQUENCER: REG_WRITE at payload "
                           rf"offset {at(3)} was cut short by KeyboardInterrupt"):
            d.sleep(0.0)
        every_use_is_lost(d, region)
    finally:
        d.stop()
    assert writes(ga102, start, A, B, C) == [(A, 1), (B, 2)]
    assert isinstance(ga102.stops[0], SequencerError)
    reopens(ga102)


# ---- through the opener: the lost GPU is reset at its next open -----------------------------


def test_the_gpu_a_failed_sequence_lost_is_reset_at_its_next_open(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        ga102.sim_rm.run_cpu_sequencer([(POLL, A, 1, 1, 500, 3)])
        with pytest.raises(Lost, match=rf"GPU 0 of .*\({BUS}\): RUN_CPU_SEQUENCER: REG_POLL"):
            d.sleep(0.0)
    finally:
        d.stop()
    given_back(machine, BUS)
    assert rig_nv_pci.opener.lost(machine, BUS) and takes[-1].resets == 0
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        assert takes[-1].resets == 1 and not rig_nv_pci.opener.lost(machine, BUS)
        assert d.completed() == 2
    finally:
        d.stop()
    given_back(machine, BUS)
    assert not rig_nv_pci.opener.lost(machine, BUS)


# ---- a report kept through an exception in a sleep ------------------------------------------


def once(what: Callable[..., Any], after: bool = False) -> Callable[..., Any]:
    """``what`` that raises KeyboardInterrupt the first time it is called (after doing its
    work, with ``after``), and is itself after."""
    struck = [False]

    def call(*args: Any, **kwargs: Any) -> Any:
        if struck[0]:
            return what(*args, **kwargs)
        struck[0] = True
        if after:
            what(*args, **kwargs)
        raise KeyboardInterrupt

    return call


def report(o: Opened, d: Device) -> None:
    """GSP-RM stops the device's compute channel (as for a GR exception) and reports it."""
    o.sim_rm.event(EV_RC_TRIGGERED,
                   o.firmware.peer.rc_triggered(o.sim_rm.chid(d.compute.handle), xid=13))


def mmu_report(o: Opened, d: Device) -> None:
    """GSP-RM stops the device's copy channel for an MMU fault and reports it as it reports
    one its MMU queued (kern_gmmu_gv100.c kgmmuServiceNonReplayableFault_GV100: the RC first,
    then the client notified): RC_TRIGGERED with ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid
    31, nverror.h), the copy engine's NV2080 engine type (NV2080_ENGINE_TYPE_COPY0 + n,
    cl2080_notification.h), the page's address and NV_PFAULT_FAULT_TYPE_PTE (2,
    gv100/dev_fault.h), then MMU_FAULT_QUEUED (no payload)."""
    lce = d.copy_engine
    assert isinstance(lce, int)
    o.sim_rm.event(EV_RC_TRIGGERED, o.firmware.peer.rc_triggered(
        o.sim_rm.chid(d.copy_channel.handle), xid=31, engine=0x9 + lce, fault_address=FAULT_AT,
        fault_type=FAULT_PTE))
    o.sim_rm.event(EV_MMU_FAULT_QUEUED)


REPORTS: dict[str, tuple[Callable[[Opened, Device], None], str]] = {
    "rc": (report, r"ROBUST_CHANNEL_GR_EXCEPTION \(Xid 13\) on the compute channel"),
    "mmu": (mmu_report, r"ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT \(Xid 31\) on the copy "
                        r"channel: FAULT_PTE"),
}


def in_the_nap(o: Opened, d: Device, monkeypatch: pytest.MonkeyPatch,
               send: Callable[[Opened, Device], None]) -> None:
    """The report comes after the sleep asked the path about faults and before its nap's poll,
    which receives it; the nap is then interrupted."""
    asked = held.PciPath.fault

    def fault(self: held.PciPath, channels: Any, notified: bool) -> Any:
        found = asked(self, channels, notified)
        monkeypatch.setattr(held.PciPath, "fault", asked)
        send(o, d)
        return found

    monkeypatch.setattr(held.PciPath, "fault", fault)
    monkeypatch.setattr(pci_path, "time", SimpleNamespace(
        sleep=once(time.sleep), monotonic=time.monotonic))


def while_recorded(o: Opened, d: Device, monkeypatch: pytest.MonkeyPatch,
                   send: Callable[[Opened, Device], None]) -> None:
    """The exception strikes while the event log decodes the RC_TRIGGERED it was handed."""
    monkeypatch.setitem(ev.DECODERS, EV_RC_TRIGGERED, once(ev.decode_rc_triggered))
    send(o, d)


def while_examined(o: Opened, d: Device, monkeypatch: pytest.MonkeyPatch,
                   send: Callable[[Opened, Device], None]) -> None:
    """The exception strikes while the path looks up the channel the report names."""
    monkeypatch.setattr(faults, "channel_of", once(faults.channel_of))
    send(o, d)


def once_answered(o: Opened, d: Device, monkeypatch: pytest.MonkeyPatch,
                  send: Callable[[Opened, Device], None]) -> None:
    """The exception strikes once the path answered the device, before the device kept it."""
    monkeypatch.setattr(held.PciPath, "fault", once(held.PciPath.fault, after=True))
    send(o, d)


@pytest.mark.parametrize("kind", ["rc", "mmu"])
@pytest.mark.parametrize("strike", [in_the_nap, while_recorded, while_examined, once_answered],
                         ids=lambda f: f.__name__)
def test_a_report_is_kept_through_an_exception_in_a_sleep(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
    strike: Callable[[Opened, Device, pytest.MonkeyPatch, Callable[[Opened, Device], None]],
                     None],
    kind: str,
) -> None:
    """The spec: the device raises the GSP's reports (a channel it stopped, a fault its MMU
    queued) from Rig_nv.sleep, keeping a report through an exception in a sleep. A
    KeyboardInterrupt ends the sleep in which the path received RC_TRIGGERED for the device's
    compute channel (or, "mmu", RC_TRIGGERED Xid 31 then MMU_FAULT_QUEUED for its copy
    channel); the report is not dropped: the next sleep raises its Fault, and every use after
    it Lost."""
    send, error = REPORTS[kind]
    d = ga102.open()
    try:
        region = d.alloc(0x1000)
        assert region is not None
        strike(ga102, d, monkeypatch, send)
        with pytest.raises(KeyboardInterrupt):
            d.sleep(0.0)
        assert isinstance(d.path, held.PciPath) and d.path.events is not None
        with pytest.raises(Fault, match=error) as e:
            d.sleep(0.0)
        if kind == "mmu":
            assert e.value.address == FAULT_AT and e.value.engine == f"copy engine {d.copy_engine}"
        every_use_is_lost(d, region)
    finally:
        d.stop()
    assert d.path.events.text().count("RC_TRIGGERED") == 1  # received once
    assert d.path.events.text().count("MMU_FAULT_QUEUED") == (kind == "mmu")
    assert ga102.stops == [None]


def test_an_exception_while_mmu_fault_queued_is_decoded_keeps_the_fault(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The spec's MMU-fault report, struck as its second event (MMU_FAULT_QUEUED) is decoded,
    the RC_TRIGGERED before it already recorded: the next sleep raises the Fault."""
    d = ga102.open()
    try:
        monkeypatch.setitem(ev.DECODERS, EV_MMU_FAULT_QUEUED, once(ev.decode_mmu_fault_queued))
        mmu_report(ga102, d)
        with pytest.raises(KeyboardInterrupt):
            d.sleep(0.0)
        with pytest.raises(Fault, match=REPORTS["mmu"][1]) as e:
            d.sleep(0.0)
        assert e.value.address == FAULT_AT
    finally:
        d.stop()
    assert ga102.stops == [None]


@pytest.mark.parametrize("kind", ["rc", "mmu"])
def test_the_first_sleep_raises_a_report_the_gsp_sent_before_any_wait(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch, kind: str,
) -> None:
    """The spec: the device raises the GSP's reports from Rig_nv.sleep. The GSP sends them
    while nothing waits (no submission, no wait after them): the device's very first sleep
    raises the Fault (before it naps: the path's sleep is never reached), naming the Xid, the
    channel and, for the MMU's fault, its type, page and engine; every use after it is
    Lost."""
    send, error = REPORTS[kind]
    d = ga102.open()
    naps: list[float] = []
    try:
        region = d.alloc(0x1000)
        assert region is not None
        monkeypatch.setattr(held.PciPath, "sleep", lambda self, t: naps.append(t))
        send(ga102, d)
        with pytest.raises(Fault, match=error) as e:
            d.sleep(1.0)
        assert naps == []
        if kind == "mmu":
            assert (e.value.address, e.value.engine, e.value.access) == (
                FAULT_AT, f"copy engine {d.copy_engine}", None)
        else:
            assert e.value.engine == "graphics/compute" and e.value.address is None
        every_use_is_lost(d, region)
    finally:
        d.stop()
    assert ga102.stops == [None]


def test_an_mmu_fault_of_work_nobody_waits_for_is_raised_by_a_sleep(ga102: Opened) -> None:
    """The spec's MMU-fault report from the simulated MMU itself: a copy reads a page whose
    mapping the test took away, and the program only sleeps (it never waits for the copy's
    point). The simulated GSP-RM stops the group, posts RC_TRIGGERED then MMU_FAULT_QUEUED,
    and a sleep raises the Fault naming the page."""
    d = ga102.open()
    try:
        src, dst = d.alloc(0x11000), d.alloc(0x11000)
        assert src is not None and dst is not None
        assert isinstance(d.path, held.PciPath) and d.path.space.tables is not None
        d.path.space.tables.unmap(src.gpu + 0x3000, 0x1000, huge=False)
        d.copy(dst, src, engine="copy")
        deadline = time.monotonic() + 5.0
        with pytest.raises(Fault) as e:
            while time.monotonic() < deadline:
                d.sleep(0.001)
        assert e.value.channel_error == ("ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31) on the "
                                         "copy channel: FAULT_PTE")
        assert e.value.address == src.gpu + 0x3000
        every_use_is_lost(d, dst)
    finally:
        d.stop()
    assert d.path.events is not None
    assert d.path.events.text(2).splitlines()[-1] == "MMU_FAULT_QUEUED"
    assert ga102.stops == [None]


def test_a_wait_raises_a_report_kept_through_an_exception(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same for a wait: the device's first look at the path's reports is interrupted while
    it examines one; the wait that comes next raises the Fault."""
    d = ga102.open()
    try:
        a, b = d.alloc(0x1000, Memory.PINNED), d.alloc(0x1000, Memory.DEVICE)
        assert a is not None and b is not None
        ga102.sim_rm.stop()
        point = d.copy(b, a, engine="copy")
        while_examined(ga102, d, monkeypatch, report)
        with pytest.raises(KeyboardInterrupt):
            point.wait(timeout_s=5.0)
        with pytest.raises(Fault, match=r"\(Xid 13\) on the compute channel"):
            point.wait(timeout_s=5.0)
    finally:
        d.stop()


def test_a_sequence_handed_on_again_after_an_interruption_is_not_run_again(
    ga102: Opened, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exception strikes once the whole sequence ran, before the poll moved on: the poll
    keeps the message and hands it on again next time, and the handler, knowing it by its
    serial, does not run it twice. The GPU is not lost: nothing was cut short."""
    from rig_nv_pci.gsp.sequencer import SequencerEvents

    d = ga102.open()
    try:
        monkeypatch.setattr(SequencerEvents, "__call__",
                            once(SequencerEvents.__call__, after=True))
        start = len(ga102.rig.gpu.writes)
        ga102.sim_rm.run_cpu_sequencer([(WRITE, A, 1), (WRITE, B, 2)])
        with pytest.raises(KeyboardInterrupt):
            d.sleep(0.0)
        d.sleep(0.0)
        d.sleep(0.0)
        assert writes(ga102, start, A, B) == [(A, 1), (B, 2)]
        region = d.alloc(0x1000, Memory.PINNED)
        assert region is not None
        d.copy(region, region, engine="copy").wait(timeout_s=5.0)
    finally:
        d.stop()
    assert ga102.stops == [None]
