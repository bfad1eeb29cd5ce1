"""A GSP that stopped answering costs one timeout (rig_nv_pci.gsp.rpc.Rpc.silent), on the
simulated GA102 opened through ``rig_nv_pci.gpu``: once one RPC timed out no later RPC is sent
(each fails at once, a Lost naming the GPU and where the GSP stopped answering), the device is
lost, its stop returns keeping the memory and addresses the GPU may still reach (the Rig_nv_pci
spec: "unless the GPU stopped answering (Rig_nv.stop), which keeps the addresses the GPU may
still reach"), and the GPU, lost ("A GPU whose stop could not unload its GSP's firmware ... is
lost, and its next open resets it first"), opens again after a reset.

The simulated GSP stops answering as tests/test_stop_addresses.py's gsp_goes_silent makes it
(its doorbell rings unheard); what it receives is counted at that doorbell (one ring a
message, rig_nv_pci.gsp.queue.QueuePair.send)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sim.pbdma import USERD_GP_PUT
from support import (
    BUS,
    TIMEOUT_S,
    Opened,
    TakenSim,
    alloc_each,
    copies,
    every_use_is_lost,
    give_back_for_good,
    given_back,
    gsp_goes_silent,
    none_free,
    opener,
    silence,
    spans,
)

import rig_nv_pci
from rig_edge import Lost, Memory
from rig_nv_pci import held
from rig_nv_pci.gsp import rpc
from rig_nv_pci.path import addresses
from rig_pci import Machine


def heard_while_silent(ga102: Opened, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many messages the simulated GSP is sent (its doorbell rung) while it answers
    nothing (``firmware.suspended``)."""
    rings = [0]
    gpu = ga102.rig.gpu
    ring = gpu.on_doorbell
    assert ring is not None

    def counted() -> None:
        if ga102.firmware.suspended:
            rings[0] += 1
        ring()

    monkeypatch.setattr(gpu, "on_doorbell", counted)
    return rings


def opens_again(ga102: Opened, machine: Machine, tmp_path: Path, takes: list[TakenSim]) -> None:
    """The lost GPU answers again once reset: its next open resets it first, then copies as it
    should (the reset ended the silent GSP-RM and all it held: sim/gpu.py SimGpu.reset), and
    its stop gives everything back."""
    kept = addresses.PROCESS.free
    resets = takes[-1].resets
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        assert takes[-1].resets == resets + 1 and not rig_nv_pci.opener.lost(machine, BUS)
        copies(d)
    finally:
        d.stop()
    assert not rig_nv_pci.opener.lost(machine, BUS) and addresses.PROCESS.free == kept


@pytest.mark.parametrize("after_frees", [0, 3], ids=["before-stop", "during-stop"])
def test_the_stop_of_a_silent_gsp_costs_one_timeout_and_sends_nothing_after_it(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after_frees: int,
) -> None:
    """The GSP stops answering before the stop, or after the stop's first frees were answered.
    The stop sends one more RPC, which times out, and none after it (the device's other frees,
    the device object's, the root client's, UNLOADING_GUEST_DRIVER: the simulated GSP's
    doorbell rings once while it is silent); so it takes one timeout, not one a free (well
    under two). It returns (the GSP's silence reported to the opener, not raised: a lost
    device's stop gives the GPU back), the function released and the lock given back, the
    GPU lost; the memory and the addresses the device took stay kept; the next open resets
    the GPU and it works."""
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    before = addresses.PROCESS.addresses().free
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        alloc_each(d)
        taken = spans(d)
        gsp_goes_silent(ga102, d, monkeypatch, after_frees=after_frees)
        silence(ga102, d, monkeypatch)
        rings = heard_while_silent(ga102, monkeypatch)
        start = time.monotonic()
        d.stop()
        took = time.monotonic() - start
        assert TIMEOUT_S <= took < 1.5 * TIMEOUT_S
        assert rings == [1]
        assert isinstance(d.path, held.PciPath)
        assert d.path.rm.rpc_rm.rpc.silent is not None
        assert takes[-1].closed and rig_nv_pci.opener.lost(machine, BUS)
        given_back(machine, BUS)
        assert none_free(taken)
        d.stop()  # a second stop does nothing
        assert rings == [1]
        opens_again(ga102, machine, tmp_path, takes)
        assert none_free(taken)
    finally:
        give_back_for_good(before)


def test_an_rpc_timeout_while_the_device_runs_loses_it_and_later_calls_fail_fast(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GSP stops answering while the device runs: the allocation whose RPC times out
    raises RpcTimeout after the timeout, and the device is lost at once: the next allocation
    raises Lost without a look at the RPC channel, naming the GPU and the RPC the GSP stopped
    answering at, sending nothing; the device's next sleep raises the same Lost and every
    later use is Lost. Its stop takes no timeout at all (it sends no RPC),
    returns, keeps the device's memory and addresses, and leaves the GPU lost; the next open
    resets it and it works."""
    machine, takes = opener(ga102, tmp_path, monkeypatch)
    before = addresses.PROCESS.addresses().free
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        region = d.alloc(0x1000, Memory.PINNED)
        assert region is not None
        taken = spans(d)
        silence(ga102, d, monkeypatch)
        rings = heard_while_silent(ga102, monkeypatch)
        ga102.firmware.suspended = True
        start = time.monotonic()
        # the timeout that silences the GSP is a Lost already (and still an RpcTimeout)
        with pytest.raises(rpc.NotAnswering, match=r"^the device is lost: GPU 0 .*: the GSP "
                                                   r"sent no ALLOC_MEMORY for ALLOC_MEMORY in "
                                                   r"time: the GSP is taken as not answering, "
                                                   r"so the GPU is lost and is reset at its "
                                                   r"next open$"):
            d.alloc(0x3000, Memory.PINNED)
        free_then = list(addresses.PROCESS.free)
        assert TIMEOUT_S <= time.monotonic() - start < 1.5 * TIMEOUT_S
        start = time.monotonic()
        with pytest.raises(Lost, match=r"^the device is lost: GPU 0 .*: the GSP stopped "
                                       r"answering at ALLOC_MEMORY \(the GSP sent no "
                                       r"ALLOC_MEMORY for ALLOC_MEMORY in time\)$"):
            d.alloc(0x3000, Memory.MAPPED)
        with pytest.raises(Lost, match=r"^the device is lost: GPU 0 .*: the GSP stopped "
                                       r"answering at ALLOC_MEMORY \(the GSP sent no "):
            d.sleep(0.0)
        every_use_is_lost(d, region)
        assert list(addresses.PROCESS.free) == free_then  # nothing taken for unsent requests
        assert time.monotonic() - start < 0.5 * TIMEOUT_S
        start = time.monotonic()
        d.stop()
        assert time.monotonic() - start < 0.5 * TIMEOUT_S
        assert rings == [1]
        assert takes[-1].closed and rig_nv_pci.opener.lost(machine, BUS)
        given_back(machine, BUS)
        assert none_free(taken)
        opens_again(ga102, machine, tmp_path, takes)
    finally:
        give_back_for_good(before)


def submitted(ga102: Opened) -> tuple[list[int], bytes, int]:
    """What the device has handed the simulated GPU's channels: each channel's GP_PUT (USERD
    dword 35, dev_ram.h NV_RAMUSERD_GP_PUT, which the PBDMA reads), the usermode page the
    doorbells are written into, and how many doorbell writes the PBDMA took from it."""
    s = ga102.sim_rm
    puts = [int.from_bytes(s.vram[c.userd + USERD_GP_PUT:c.userd + USERD_GP_PUT + 4], "little")
            for c in s.channels.values()]
    return puts, bytes(s.usermode), len(s.doorbells)


def test_once_the_gsp_is_taken_as_silent_no_work_goes_to_the_gpu(
    ga102: Opened, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The RPC that finds the GSP silent loses the device at once, not at its next wait or
    sleep: a launch (rig's compute copy), a copy on the copy engine, an upload to Device
    memory (staged, then copied) and an allocation each raise Lost naming why, at once, and
    none hands the GPU work (no GPFIFO entry, no doorbell) nor the GSP a message."""
    machine, _ = opener(ga102, tmp_path, monkeypatch)
    before = addresses.PROCESS.addresses().free
    d = rig_nv_pci.gpu(0, machine, firmware=[tmp_path]).open()
    try:
        a, b = d.alloc(0x4000, Memory.PINNED), d.alloc(0x4000, Memory.DEVICE)
        assert a is not None and b is not None
        d.copy(b, a, engine="copy").wait(timeout_s=5.0)  # the channels are in use
        silence(ga102, d, monkeypatch)
        rings = heard_while_silent(ga102, monkeypatch)
        ga102.firmware.suspended = True
        with pytest.raises(rpc.NotAnswering):
            d.alloc(0x3000, Memory.PINNED)  # its RPC times out: the GSP is taken as silent
        assert rings == [1]
        work = submitted(ga102)
        why = (r"^the device is lost: GPU 0 .*: the GSP stopped answering at ALLOC_MEMORY "
               r"\(the GSP sent no ALLOC_MEMORY for ALLOC_MEMORY in time\)$")
        start = time.monotonic()
        for use in (lambda: d.copy(b, a), lambda: d.copy(b, a, engine="copy"),
                    lambda: d.upload(b, b"x" * 0x100), lambda: d.alloc(0x1000)):
            with pytest.raises(Lost, match=why):
                use()
        assert time.monotonic() - start < 0.5 * TIMEOUT_S
        assert submitted(ga102) == work and rings == [1]
    finally:
        d.stop()
        give_back_for_good(before)
