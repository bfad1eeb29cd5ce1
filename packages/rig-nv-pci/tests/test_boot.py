"""rig_nv_pci.boot.ampere against the simulated GPU (tests/sim) and synthetic firmware."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import sim
from sim import gsp_fw, gsp_peer
from support import Rig, gsp_rig, run_boot, system_of

from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot.ampere import BootError
from rig_nv_pci.gsp import rpc, static_info, sysinfo


def test_the_boot_reaches_a_running_gsp() -> None:
    r = Rig()
    done = r.boot()
    g = r.gpu
    # FWSEC ran heavy-secure on the GSP with the FRTS command and the right signature
    assert g.gsp.log.count(f"hs run ucode {r.sv.ucode_id}") == 1
    assert "fwsec cmd 0x15" in g.gsp.log
    assert done.fwsec.desc.ucode_id == r.sv.ucode_id
    # WPR2 stage one: FRTS; stage two: from the WPR start to FRTS's end
    frts = r.plan.frts_offset
    assert done.wpr2_after_frts == (frts, frts + r.plan.frts_size - 0x1000)
    assert done.wpr2_after_booter == (r.plan.gsp_fw_wpr_start, frts + r.plan.frts_size - 0x1000)
    # booter_load on SEC2: patched signature, the meta address in its mailboxes, success
    assert g.sec2.log[-1] == f"hs run ucode {r.sb.ucode_id}"
    assert g.sec2.dmem[0x10:0x10 + 384] == r.sb.signatures[0]
    assert g.sec2.mailbox(0) == 0
    assert g.sec2.imem[0:0x400] == r.sb.image[0x100:0x500]
    # the GSP was reset into RISC-V with the LibOS args, and booter_load started it
    assert g.gsp.state == "riscv-running"
    assert (g.gsp.mailbox(0), g.gsp.mailbox(1)) == (0x2345_6000, 0x1)


def test_the_vbios_is_read_through_the_prom_window() -> None:
    r = Rig()
    data, rom = boot.read_vbios(r.bar0)
    assert data[:len(r.sv.data)] == r.sv.data
    assert rom.fwsec.desc.offset == r.sv.desc_offset


def test_wpr2_already_up_is_refused_before_anything_runs() -> None:
    r = Rig()
    r.gpu.set_wpr2(0x1000_0000, 0x1010_0000)
    with pytest.raises(BootError, match=r"WPR2\) is already up .*_HI 0x00100ff0\)"):
        r.boot()
    assert r.gpu.gsp.starts == [] and r.gpu.sec2.starts == []


def test_wpr2_is_up_by_its_high_bound_alone() -> None:
    """kgspIsWpr2Up_TU102 reads NV_PFB_PRI_MMU_WPR2_ADDR_HI alone (issue 24: a check that reads
    the wrong bound fails here). A low bound left stale over a high bound of 0 is WPR2 down:
    the boot goes on. A high bound over a low bound of 0 is WPR2 up: refused."""
    stale = Rig()
    stale.gpu.wpr2 = (0x0010_0000, 0)
    stale.boot()
    assert stale.gpu.gsp.state == "riscv-running"
    up = Rig()
    up.gpu.wpr2 = (0, 0x0010_0FF0)
    with pytest.raises(BootError, match=r"WPR2\) is already up .*_LO 0x00000000, _HI 0x00100ff0"):
        up.boot()
    assert up.gpu.gsp.starts == [] and up.gpu.sec2.starts == []


def test_a_boot_rom_that_never_completes_times_out() -> None:
    r = Rig()
    r.gpu.gfw_polls = None
    with pytest.raises(BootError, match=r"boot ROM did not complete within 0.05 s .*0x03"):
        r.boot(timeout_s=0.05)
    assert r.gpu.gsp.starts == []


def test_a_vbios_without_fwsec_is_refused() -> None:
    r = Rig()
    r.gpu.vbios = r.sv.data[:0x1000]
    with pytest.raises(BootError, match=r"VBIOS .* has no usable FWSEC"):
        boot.read_vbios(r.bar0)


def test_fwsec_reporting_an_frts_error_fails_the_boot() -> None:
    r = Rig()
    r.gpu.gsp.programs[r.sv.ucode_id] = sim.fwsec_program(
        r.gpu, r.sv.mapper_offset, r.sv.cmd_in_buffer_offset, error=0xABC)
    with pytest.raises(BootError, match=r"FWSEC-FRTS failed: FRTS error code 0xabc"):
        r.boot()
    assert r.gpu.sec2.starts == []


def test_fwsec_that_leaves_wpr2_down_fails_the_boot() -> None:
    r = Rig()
    r.gpu.gsp.programs[r.sv.ucode_id] = sim.fwsec_program(
        r.gpu, r.sv.mapper_offset, r.sv.cmd_in_buffer_offset, set_wpr2=False)
    with pytest.raises(BootError, match=r"FWSEC-FRTS ran but WPR2 is not up"):
        r.boot()


def test_fwsec_rejected_by_the_boot_rom_fails_the_boot() -> None:
    r = Rig()
    r.gpu.gsp.signatures = {r.sv.signatures[0]}  # the GPU's fuses want another signature
    with pytest.raises(BootError, match=r"FWSEC-FRTS failed: FRTS error code|WPR2 is not up"):
        r.boot()
    assert "not accepted" in r.gpu.gsp.log[-1]


def test_fwsec_that_never_halts_fails_naming_the_gsp() -> None:
    r = Rig()
    r.gpu.gsp.run_polls = 10**9
    with pytest.raises(BootError, match=r"FWSEC-FRTS failed: the GSP falcon did not halt"):
        r.boot(timeout_s=0.05)


def test_booter_error_mailbox_fails_the_boot() -> None:
    r = Rig()
    r.gpu.sec2.programs[r.sb.ucode_id] = sim.booter_program(r.gpu, error=0x1F)
    with pytest.raises(BootError, match=r"booter_load failed with error 0x0000001f in SEC2's"):
        r.boot()
    assert r.gpu.gsp.state != "riscv-running"


def test_booter_that_does_not_start_the_gsp_fails_the_boot() -> None:
    r = Rig()
    r.gpu.sec2.programs[r.sb.ucode_id] = sim.booter_program(r.gpu, start_gsp=False)
    with pytest.raises(BootError, match=r"GSP's RISC-V core is not running \(CPUCTL"):
        r.boot()


def test_booter_given_a_bad_meta_address_reports_its_error() -> None:
    r = Rig()
    r.meta.data[0:8] = bytes(8)  # no magic
    with pytest.raises(BootError, match=r"booter_load failed with error 0xb0070001"):
        r.boot()


# ---- the GSP's host memory, its queues and INIT_DONE (boot_gsp) ---------------------------------


def test_the_boot_reaches_init_done_and_makes_the_root_client() -> None:
    r, firmware, memory = gsp_rig()
    events: list[rpc.Incoming] = []
    done = run_boot(r, memory, on_event=events.append)
    assert firmware.failure is None, firmware.log
    # the GSP found its arguments through the mailboxes, LibOS regions and RMARGS
    assert (r.gpu.gsp.mailbox(1) << 32 | r.gpu.gsp.mailbox(0)) == memory.libos_args
    assert sorted(firmware.regions) == sorted(sim.gsp_fw.LIBOS_REGIONS)
    # issue 26 item 5: what Linux's CPU-RM registers (osinit.c initUnixSpecificRegistry)
    assert firmware.registry == {"RMSecBusResetEnable": 1, "RMForcePcieConfigSave": 1}
    assert firmware.queue_init == (memory.shared, 129, 0x1000, 0x41000)
    assert done.init_done.function == rpc.Event.GSP_INIT_DONE and events == []
    # SET_SYSTEM_INFO and SET_REGISTRY (an empty table) went first, then (after INIT_DONE)
    # GET_GSP_STATIC_INFO, then the root client
    peer = firmware.peer
    assert [q.function for q in peer.requests] == [gsp_peer.FN_GSP_SET_SYSTEM_INFO,
                                                    gsp_peer.FN_SET_REGISTRY,
                                                    gsp_peer.FN_GET_GSP_STATIC_INFO,
                                                    gsp_peer.FN_GSP_RM_ALLOC]
    assert peer.requests[0].payload == system_of(r).encode()
    # PACKED_REGISTRY_TABLE (g_os_nvoc.h) by hand: size 82, 2 entries of 16 bytes {nameOffset,
    # type DWORD 1 (3 bytes padding), data 1, length 4}, then the names
    assert peer.requests[1].payload == struct.pack(
        "<IIIB3xIIIB3xII", 82, 2, 40, 1, 1, 4, 60, 1, 1, 4) + (
        b"RMSecBusResetEnable\0RMForcePcieConfigSave\0")
    # the GSP's sequencer ran against BAR 0 before INIT_DONE, and was not handed to on_event
    g = r.gpu
    assert g.regs[gsp_fw.SEQ_REG_A] == gsp_fw.SEQ_VALUE_A
    assert g.regs[gsp_fw.SEQ_REG_B] == gsp_fw.SEQ_VALUE_B
    assert firmware.log.index("sequencer ran") < firmware.log.index("GSP_INIT_DONE sent")
    a, b, flag = gsp_fw.SEQ_REG_A, gsp_fw.SEQ_REG_B, gsp_fw.SEQ_DONE
    assert [w for w in g.writes if w[0] in (a, b, flag)] == [
        (a, gsp_fw.SEQ_VALUE_A), (b, gsp_fw.SEQ_VALUE_B), (flag, 1)]
    assert peer.objects == {rpc.CLIENT_HANDLE: 0} and done.rm.client == rpc.CLIENT_HANDLE
    # the doorbell rang through NV_PGSP_QUEUE_HEAD(0): for SET_SYSTEM_INFO and SET_REGISTRY
    # before anything else (the GSP served them when it started), then for the static info
    # and the alloc, which the running GSP heard
    rings = [i for i, w in enumerate(r.gpu.writes) if w == (sim.regs.GSP_QUEUE_HEAD0, 0)]
    assert rings[:2] == [0, 1] and len(rings) == 4 and peer.rings == 2
    # and the channel goes on serving the RM
    handle = done.rm.new_handle()
    assert done.rm.alloc(rpc.CLIENT_HANDLE, handle, 0x80) == handle  # NV01_DEVICE_0
    assert peer.objects[handle] == rpc.CLIENT_HANDLE


def test_the_boot_keeps_the_static_info_the_gsp_sent() -> None:
    fields = {"hInternalClient": 0xC1E0_0042, "hInternalDevice": 0xDE1D_0042,
              "hInternalSubdevice": 0x5B1D_0042, "bar1PdeBase": 0x3_FFA0_0000,
              "bar2PdeBase": 0x3_FFB0_0000, "fb_length": 16 << 30, "l2_cache_size": 4 << 20,
              "gpuNameString": b"NVIDIA RTX A4000", "fbRegionInfoParams.numFBRegions": 1,
              "fbRegionInfoParams.fbRegion[0].base": 0x10_0000,
              "fbRegionInfoParams.fbRegion[0].limit": 0x3_FDFF_FFFF,
              "fbRegionInfoParams.fbRegion[0].reserved": 0x800_0000,
              "fbRegionInfoParams.fbRegion[0].performance": 7,
              "fbRegionInfoParams.fbRegion[0].supportISO": 1,
              "fbRegionInfoParams.fbRegion[0].supportCompressed": 0}
    r, firmware, memory = gsp_rig(static_fields=fields)
    done = run_boot(r, memory)
    assert done.static == static_info.StaticInfo(
        0xC1E0_0042, 0xDE1D_0042, 0x5B1D_0042,
        (static_info.FbRegion(0x10_0000, 0x3_FDFF_FFFF, 0x800_0000, 7, compressed=False,
                              iso=True, protected=False),),
        0x3_FFA0_0000, 0x3_FFB0_0000, 16 << 30, 4 << 20, "NVIDIA RTX A4000")
    # asked as rpcGetGspStaticInfo_v14_00 asks: a GspStaticConfigInfo-sized request
    (request,) = [q for q in firmware.peer.requests
                  if q.function == gsp_peer.FN_GET_GSP_STATIC_INFO]
    assert len(request.payload) == 1656 and request.records == 1


def test_a_short_static_info_fails_the_boot_naming_the_gpu() -> None:
    r, firmware, memory = gsp_rig(static_info=bytes(100))
    with pytest.raises(BootError, match=r"^GPU 0: the GSP booted but GET_GSP_STATIC_INFO "
                                        r"failed: GPU 0: GET_GSP_STATIC_INFO replied 100 bytes, "
                                        r"not the 1656 of 570.144's GspStaticConfigInfo"):
        run_boot(r, memory, init_timeout_s=0.5)
    # no client was made on a GSP whose static info rig could not read
    assert gsp_peer.FN_GSP_RM_ALLOC not in [q.function for q in firmware.peer.requests]


def test_garbled_fb_regions_fail_the_boot_naming_the_gpu() -> None:
    r, _, memory = gsp_rig(static_fields={"fbRegionInfoParams.numFBRegions": 17})
    with pytest.raises(BootError, match=r"^GPU 0: .*GET_GSP_STATIC_INFO failed: GPU 0: "
                                        r"GET_GSP_STATIC_INFO is garbled: 17 FB regions"):
        run_boot(r, memory, init_timeout_s=0.5)


def test_a_refused_static_info_fails_the_boot_naming_the_rpc_result() -> None:
    r, _, memory = gsp_rig(static_status=0x56)  # NV_ERR_NOT_SUPPORTED
    with pytest.raises(BootError, match=r"^GPU 0: the GSP booted but GET_GSP_STATIC_INFO "
                                        r"failed: GPU 0: RPC GET_GSP_STATIC_INFO "
                                        r"\(rpc_result NV_ERR_NOT_SUPPORTED"):
        run_boot(r, memory, init_timeout_s=0.5)


def test_init_done_never_coming_is_a_timeout_naming_the_gpu() -> None:
    r, firmware, memory = gsp_rig(init_done=False)
    with pytest.raises(BootError, match=r"GPU 0: the GSP did not report GSP_INIT_DONE within "
                                        r"0.05 s after booter_load started it \(status queue "
                                        r"created by the GSP"):
        run_boot(r, memory, init_timeout_s=0.05)
    assert firmware.failure is None and firmware.peer.booted


def test_a_gsp_that_cannot_use_its_arguments_never_reports_init_done() -> None:
    r, firmware, memory = gsp_rig()
    r.gpu.host.view(memory.libos_args, 0x1000)[32 * 3:32 * 4] = bytes(32)  # RMARGS gone
    with pytest.raises(BootError, match=r"GPU 0: .*GSP_INIT_DONE .*status queue never created"):
        run_boot(r, memory, init_timeout_s=0.05)
    assert firmware.failure is not None and "no RMARGS" in firmware.failure


def test_a_failing_boot_step_names_the_gpu() -> None:
    r, _, memory = gsp_rig()
    r.gpu.sec2.programs[r.sb.ucode_id] = sim.booter_program(r.gpu, error=0x1F)
    with pytest.raises(BootError, match=r"^GPU 0: booter_load failed with error 0x0000001f"):
        run_boot(r, memory, init_timeout_s=0.05)


def test_a_refused_root_client_fails_the_boot() -> None:
    r, _, memory = gsp_rig(alloc_status={0x0: 0x1F})
    with pytest.raises(BootError, match=r"GPU 0: the GSP booted but refused the root client"):
        run_boot(r, memory, init_timeout_s=0.5)


def test_set_system_info_carries_the_bars_and_pci_ids() -> None:
    r, firmware, memory = gsp_rig()
    run_boot(r, memory)
    assert firmware.system_info is not None
    info = sysinfo.decode(firmware.system_info)
    g = r.gpu
    assert (info["gpuPhysAddr"], info["gpuPhysFbAddr"], info["gpuPhysInstAddr"]) == (
        g.bar0_address, g.bar1_address, g.bar3_address)
    assert info["nvDomainBusDeviceFunc"] == 0x4100
    assert info["PCIDeviceID"] == 0x2204_10DE and info["PCISubDeviceID"] == 0x1454_10DE
    assert info["PCIRevisionID"] == 0xA1 and info["simAccessBufPhysAddr"] == 0
    assert (info["pciConfigMirrorBase"], info["pciConfigMirrorSize"]) == (0x88000, 0x1000)
    assert info["maxUserVa"] == (1 << 47) - 0x1000 and info["hostPageSize"] == 0x1000


def test_system_info_with_another_bar0_stops_the_gsp() -> None:
    r, firmware, memory = gsp_rig()
    wrong = dataclasses.replace(system_of(r), bar0=0xDEAD_0000)
    with pytest.raises(BootError, match=r"GPU 0: the GSP did not report GSP_INIT_DONE"):
        run_boot(r, memory, init_timeout_s=0.05, system=wrong)
    assert firmware.failure is not None and "gpuPhysAddr 0xdead0000" in firmware.failure


def test_a_sequencer_poll_that_never_matches_fails_the_boot_at_once() -> None:
    payload = gsp_fw.sequencer_payload([
        (0, gsp_fw.SEQ_REG_A, 1),  # REG_WRITE
        (2, gsp_fw.SEQ_REG_A, 0xFF, 2, 2000, 3),  # REG_POLL for 2 ms, error code 3
    ])
    r, firmware, memory = gsp_rig(sequencer=payload)
    with pytest.raises(BootError, match=r"GPU 0: a sequencer the GSP sent before GSP_INIT_DONE "
                                        r"failed: .*REG_POLL at payload offset 0x34 timed out "
                                        r"after 2000 us: register 0x0014c0 read 0x00000001"
                                        r".*\(GSP error code 3\)"):
        run_boot(r, memory, init_timeout_s=5.0)
    assert not firmware.sequencer_done and "GSP_INIT_DONE sent" not in firmware.log


def test_a_malformed_sequencer_fails_the_boot_naming_the_opcode() -> None:
    payload = gsp_fw.sequencer_payload([(3, 1), (9,)])  # DELAY_US 1, then no opcode 9
    r, _, memory = gsp_rig(sequencer=payload)
    with pytest.raises(BootError, match=r"unknown opcode 9 at payload offset 0x30"):
        run_boot(r, memory, init_timeout_s=5.0)


def test_the_boot_writes_the_app_version_to_falcon_os_after_booter_load() -> None:
    r = Rig()
    boot.boot(r.bar0, booter_load=r.sb.data, frts_offset=r.plan.frts_offset,
              wpr_meta_address=r.meta.bus, alloc=r.gpu.host.alloc_dma, app_version=0x0A57_0144,
              timeout_s=0.2)
    g = r.gpu
    os_reg = sim.regs.GSP_BASE + sim.regs.OS
    assert g.gsp.reg(sim.regs.OS) == 0x0A57_0144
    # written once booter_load (SEC2's start) ran, as kgspBootstrap_TU102 programs FALCON_OS
    sec2_start = max(i for i, (reg, v) in enumerate(g.writes)
                     if reg == sim.regs.SEC_BASE + sim.regs.CPUCTL and v & 2)
    assert [i for i, (reg, _) in enumerate(g.writes) if reg == os_reg] > [sec2_start]
