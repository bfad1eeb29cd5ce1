"""rig_nv_pci.boot.stop against the simulated GPU: GSP-RM unloaded, FWSEC-SB run, booter_unload
taking WPR2 down.

The spec (Rig_nv_pci) promises: "A stop unloads the GSP's firmware and, on Ampere and Ada,
takes down the protected memory (WPR2) the boot set up, which NVIDIA's driver refuses to boot
a GPU with." and "A GPU whose stop could not unload its GSP's firmware or take its boot down
[...] is lost, and its next open resets it first." A stopped GPU can therefore be booted again.
"""

from __future__ import annotations

import dataclasses

import firmware_builders as fb
import pytest
import sim
from sim import gsp_peer
from support import (
    BOOTLOADER,
    FB_SIZE,
    GSP_IMAGE,
    UNLOAD_UCODE_ID,
    Rig,
    run_boot,
    stop,
    stop_rig,
)

from rig_edge import Misuse
from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot import gspmem
from rig_nv_pci.boot.stop import PROCESSOR_SUSPENDED, StopError
from rig_nv_pci.firmware import chips, layout
from rig_nv_pci.gsp import rpc


def test_a_stop_unloads_the_gsp_and_takes_wpr2_down() -> None:
    r, firmware, memory, unload = stop_rig()
    booted = run_boot(r, memory)
    assert r.gpu.wpr2_up()
    stop(r, booted, unload)
    g, peer = r.gpu, firmware.peer
    # the root client freed, then UNLOADING_GUEST_DRIVER: a plain unload, all fields 0
    assert [q.function for q in peer.requests[-2:]] == [gsp_peer.FN_FREE,
                                                        gsp_peer.FN_UNLOADING_GUEST_DRIVER]
    assert peer.requests[-1].payload == bytes(8) and peer.objects == {}
    # the GSP suspended (MAILBOX0 0x80000000, RISC-V halted), then was reset and ran FWSEC-SB
    # heavy-secure, and stays off RISC-V
    assert firmware.suspended and "riscv halted" in g.gsp.log
    after = g.gsp.log[g.gsp.log.index("riscv halted") + 1:]
    assert after[0] == "reset"
    assert after[-3:] == ["reset", f"hs run ucode {r.sv.ucode_id}", "fwsec cmd 0x19"]
    assert g.gsp.state != "riscv-running"
    # booter_unload ran on SEC2 with 0xff in both mailboxes and took WPR2 down
    assert f"hs run ucode {UNLOAD_UCODE_ID}" in g.sec2.log
    assert "booter_unload mailboxes 0xff 0xff" in g.sec2.log
    assert g.sec2.mailbox(0) == 0
    assert not r.gpu.wpr2_up() and g.wpr2 == (0, 0)


def test_a_stopped_gpu_boots_again() -> None:
    r, firmware, memory, unload = stop_rig()
    stop(r, run_boot(r, memory), unload)
    plan = layout.fb_layout(chips.AMPERE, FB_SIZE, len(GSP_IMAGE), len(BOOTLOADER))
    again = gspmem.build(r.gpu.host.alloc_dma, image=GSP_IMAGE, bootloader=BOOTLOADER,
                         code_offset=0, data_offset=0x1000, manifest_offset=0x1800,
                         signature=b"\x5e" * 0x1000, plan=plan,
                         doorbell=boot.doorbell(r.bar0), name="GPU 0")
    booted = run_boot(r, again)
    assert firmware.boots == 2 and firmware.failure is None, firmware.log
    assert booted.init_done.function == rpc.Event.GSP_INIT_DONE
    assert r.gpu.gsp.state == "riscv-running" and r.gpu.wpr2_up()
    assert firmware.peer.objects == {rpc.CLIENT_HANDLE: 0}
    # and it stops again
    stop(r, booted, unload)
    assert not r.gpu.wpr2_up()


def test_a_stop_that_leaves_wpr2s_low_bound_stale_is_down_and_boots_again() -> None:
    """WPR2 is down when its high bound reads 0, whatever its low bound holds
    (kgspIsWpr2Up_TU102; issue 24): a stop that reads the low bound fails here."""
    r, firmware, memory, unload = stop_rig()
    r.gpu.stale_wpr2_lo = True
    stop(r, run_boot(r, memory), unload)
    assert r.gpu.wpr2[0] != 0 and not r.gpu.wpr2_up()
    plan = layout.fb_layout(chips.AMPERE, FB_SIZE, len(GSP_IMAGE), len(BOOTLOADER))
    again = gspmem.build(r.gpu.host.alloc_dma, image=GSP_IMAGE, bootloader=BOOTLOADER,
                         code_offset=0, data_offset=0x1000, manifest_offset=0x1800,
                         signature=b"\x5e" * 0x1000, plan=plan,
                         doorbell=boot.doorbell(r.bar0), name="GPU 0")
    stop(r, run_boot(r, again), unload)
    assert firmware.boots == 2 and firmware.failure is None and not r.gpu.wpr2_up()


def test_a_gsp_that_never_answers_the_unload_times_out_and_booter_unload_still_runs() -> None:
    r, firmware, memory, unload = stop_rig(unload_reply=False, suspend_on_unload=False)
    booted = run_boot(r, memory)
    with pytest.raises(StopError, match=r"^GPU 0: stopping the GSP failed: "
                                        r"UNLOADING_GUEST_DRIVER: .*in time: the GSP is "
                                        r"taken as not answering.*; waiting for the "
                                        r"GSP to suspend: the GSP did not suspend within "
                                        r"0.05 s") as e:
        stop(r, booted, unload)
    assert len(e.value.steps) == 2 and e.value.lost
    assert firmware.peer.unloaded and not firmware.suspended
    assert r.gpu.gsp.mailbox(0) != PROCESSOR_SUSPENDED
    # the teardown still ran: GSP reset, FWSEC-SB, booter_unload on SEC2, WPR2 down
    assert r.gpu.gsp.log[-3:] == ["reset", f"hs run ucode {r.sv.ucode_id}", "fwsec cmd 0x19"]
    assert r.gpu.runs[-2:] == ["fwsec-sb", "booter_unload"]
    assert f"hs run ucode {UNLOAD_UCODE_ID}" in r.gpu.sec2.log
    assert not r.gpu.wpr2_up()


def test_booter_unload_failing_names_its_mailbox_and_wpr2_still_up() -> None:
    r, firmware, memory, unload = stop_rig()
    r.gpu.sec2.programs[UNLOAD_UCODE_ID] = sim.booter_unload_program(r.gpu, error=0x2A)
    booted = run_boot(r, memory)
    with pytest.raises(StopError, match=r"^GPU 0: stopping the GSP failed: booter_unload: "
                                        r"booter_unload failed with error 0x0000002a in "
                                        r"SEC2's MAILBOX0 .*; WPR2 is still up after "
                                        r"booter_unload") as e:
        stop(r, booted, unload)
    assert e.value.lost and len(e.value.steps) == 2
    assert firmware.suspended  # the GSP-RM part went well
    assert r.gpu.wpr2_up()


def test_a_refused_free_still_unloads_and_takes_wpr2_down() -> None:
    r, firmware, memory, unload = stop_rig(free_status={rpc.CLIENT_HANDLE: 0x1F})
    booted = run_boot(r, memory)
    with pytest.raises(StopError, match=r"^GPU 0: stopping the GSP failed: freeing the root "
                                        r"client: ") as e:
        stop(r, booted, unload)
    assert e.value.steps[0].startswith("freeing the root client") and len(e.value.steps) == 1
    assert not e.value.lost
    assert firmware.suspended and not r.gpu.wpr2_up()


def test_a_stop_with_wpr2_already_down_skips_booter_unload() -> None:
    r, _, memory, unload = stop_rig()
    booted = run_boot(r, memory)
    r.gpu.wpr2 = (0, 0)
    stop(r, booted, unload)
    assert f"hs run ucode {UNLOAD_UCODE_ID}" not in r.gpu.sec2.log


def sb_rig(**fwsec: int) -> tuple[Rig, sim.GspFirmware, gspmem.GspMemory, fb.SyntheticBooter]:
    """:func:`stop_rig` whose FWSEC answers SB with ``fwsec``'s keywords (sim.fwsec_program)."""
    r, firmware, memory, unload = stop_rig()
    r.gpu.gsp.programs[r.sv.ucode_id] = sim.fwsec_program(
        r.gpu, r.sv.mapper_offset, r.sv.cmd_in_buffer_offset, **fwsec)
    return r, firmware, memory, unload


def test_a_stop_runs_fwsec_sb_with_the_sb_command_before_booter_unload() -> None:
    r, _, memory, unload = stop_rig()
    booted = run_boot(r, memory)
    assert r.gpu.runs == ["fwsec-frts"]
    stop(r, booted, unload)
    g = r.gpu
    # FWSEC from the boot's VBIOS, patched with SB (0x19) and a bare READ_VBIOS_DESC
    # (FWSEC_SB_BAD_DESC otherwise), run on the GSP after its reset, then booter_unload
    assert g.runs == ["fwsec-frts", "fwsec-sb", "booter_unload"]
    assert g.gsp.log.count(f"hs run ucode {r.sv.ucode_id}") == 2
    assert g.gsp.log[-1] == "fwsec cmd 0x19"
    assert g.read(sim.regs.VBIOS_SCRATCH_15) & 0xFFFF == 0
    assert not r.gpu.wpr2_up()


def test_fwsec_sb_failing_names_its_code_and_booter_unload_still_runs() -> None:
    r, firmware, memory, unload = sb_rig(sb_error=0x1C)
    r.gpu.regs[sim.regs.VBIOS_SCRATCH_15] = 0x5A5A_0000  # bits 31:16 are not the SB code
    booted = run_boot(r, memory)
    with pytest.raises(StopError, match=r"^GPU 0: stopping the GSP failed: FWSEC-SB: FWSEC-SB "
                                        r"failed: SB error code 0x1c "
                                        r"\(NV_PBUS_VBIOS_SCRATCH\(0x15\) 0x5a5a001c") as e:
        stop(r, booted, unload)
    assert len(e.value.steps) == 1 and e.value.steps[0].startswith("FWSEC-SB: ")
    assert e.value.lost  # the pre-OS apps were not put back: the next open resets the GPU
    assert firmware.suspended
    # booter_unload still ran after it and took WPR2 down
    assert r.gpu.runs[-2:] == ["fwsec-sb", "booter_unload"]
    assert not r.gpu.wpr2_up()


def test_fwsec_sb_only_checks_the_low_half_of_its_scratch() -> None:
    r, _, memory, unload = stop_rig()
    r.gpu.regs[sim.regs.VBIOS_SCRATCH_15] = 0xFFFF_0000
    stop(r, run_boot(r, memory), unload)
    assert r.gpu.runs[-2:] == ["fwsec-sb", "booter_unload"]


def test_fwsec_sb_leaving_the_boot_rom_plm_raised_fails_the_step() -> None:
    r, _, memory, unload = stop_rig()
    booted = run_boot(r, memory)
    r.gpu.gfw_polls = None  # the PLM no longer lets level 0 read, progress not COMPLETED
    with pytest.raises(StopError, match=r"FWSEC-SB: FWSEC-SB failed: the boot ROM's PLM was "
                                        r"not lowered .*0x00000000\)$"):
        stop(r, booted, unload)
    assert r.gpu.runs[-2:] == ["fwsec-sb", "booter_unload"]
    assert not r.gpu.wpr2_up()


def test_a_booter_stop_without_the_boots_fwsec_is_refused_before_any_step() -> None:
    r, firmware, memory, unload = stop_rig()
    booted = run_boot(r, memory)
    fmc = dataclasses.replace(booted, booted=object())  # type: ignore[arg-type]
    with pytest.raises(Misuse, match=r"^GPU 0: a booter stop needs the booter boot's FWSEC"):
        stop(r, fmc, unload)
    assert firmware.peer.objects != {} and r.gpu.runs == ["fwsec-frts"]
