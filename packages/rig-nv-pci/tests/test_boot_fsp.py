"""rig_nv_pci.boot.blackwell against a simulated GB202 (tests/sim: SimFsp, the FMC of sim/fmc.py,
the scripted GSP-RM) and a synthetic FMC: the Blackwell boot through the FSP to GSP_INIT_DONE
and the root client, and its stop (docs/hopper-boot.md)."""

from __future__ import annotations

import dataclasses
import hashlib
import struct

import firmware_builders as fb
import pytest
import sim
from sim import fmc as sim_fmc
from sim import fsp as sim_fsp
from sim import gsp_peer
from support import BOOTLOADER, FB_SIZE, FMC_IMAGE, GSP_IMAGE

from rig_nv_pci.boot import ampere as boot
from rig_nv_pci.boot import blackwell as boot_fsp
from rig_nv_pci.boot import fmc_params as hopper
from rig_nv_pci.boot import fsp, gspmem
from rig_nv_pci.boot.ampere import BootError
from rig_nv_pci.boot.stop import PROCESSOR_SUSPENDED, StopError, stop_gsp
from rig_nv_pci.firmware import chips, layout
from rig_nv_pci.gsp import rpc, sysinfo

FMC_FILE = fb.build_fmc(FMC_IMAGE, hash_=hashlib.sha384(FMC_IMAGE).digest())
APP_VERSION = 0x0B57_0144


class Gb202:
    """A simulated GB202 whose FSP and FMC boot a synthetic FMC, its GSP-RM scripted."""

    def __init__(self, **fmc: object) -> None:
        self.gpu = sim.gb202()
        self.fmc = sim.SimFmc(self.gpu, FMC_IMAGE, **fmc).install()  # type: ignore[arg-type]
        self.firmware = sim.GspFirmware(self.gpu).install()
        self.bar0 = self.gpu.bar0()
        sizes = layout.fmc_sizes(chips.BLACKWELL, FB_SIZE)
        self.memory = gspmem.build(self.gpu.host.alloc_dma, image=GSP_IMAGE,
                                   bootloader=BOOTLOADER, code_offset=0, data_offset=0x1000,
                                   manifest_offset=0x1800, signature=b"\x5e" * 0x1000,
                                   plan=sizes, doorbell=boot.doorbell(self.bar0),
                                   name="GPU 3")

    @property
    def fsp(self) -> sim.SimFsp:
        assert self.gpu.fsp is not None
        return self.gpu.fsp

    def system(self) -> sysinfo.SystemInfo:
        g = self.gpu
        return sysinfo.SystemInfo(g.bar0_address, g.bar1_address, g.bar3_address, domain=0,
                                  bus=0x41, devfn=0, vendor=0x10DE, device=0x2B85,
                                  subsystem_vendor=0x10DE, subsystem_device=0x2057,
                                  revision=0xA1,
                                  config_mirror=sysinfo.PCI_CONFIG_MIRROR_BASE_FSP)

    def boot(self, timeout_s: float = 0.2, fmc: bytes = FMC_FILE) -> boot.GspBooted:
        return boot_fsp.boot_fsp(self.bar0, name="GPU 3", family=chips.BLACKWELL, fmc=fmc,
                                 memory=self.memory, alloc=self.gpu.host.alloc_dma,
                                 system=self.system(), app_version=APP_VERSION,
                                 timeout_s=timeout_s, init_timeout_s=1.0)


def test_a_gb202_boots_through_the_fsp_to_init_done_and_the_root_client() -> None:
    r = Gb202()
    assert chips.identify(sim.GB202_BOOT42).family is chips.BLACKWELL
    done = r.boot()
    g, firmware = r.gpu, r.firmware
    assert firmware.failure is None, (firmware.log, r.fmc.log, r.fsp.log)
    assert done.init_done.function == rpc.Event.GSP_INIT_DONE
    # GSP-RM found its LibOS arguments through the FMC (not the mailboxes, never written)
    assert firmware.log[0] == f"libos args at 0x{r.memory.libos_args:x}"
    assert sorted(firmware.regions) == sorted(sim.gsp_fw.LIBOS_REGIONS)
    mailboxes = (sim.regs.GSP_BASE + sim.regs.MAILBOX0, sim.regs.GSP_BASE + sim.regs.MAILBOX1)
    assert not [w for w in g.writes if w[0] in mailboxes]
    # SET_SYSTEM_INFO, SET_REGISTRY before the boot, the sequencer ran, then the static info
    # and the root client
    peer = firmware.peer
    assert [q.function for q in peer.requests] == [gsp_peer.FN_GSP_SET_SYSTEM_INFO,
                                                    gsp_peer.FN_SET_REGISTRY,
                                                    gsp_peer.FN_GET_GSP_STATIC_INFO,
                                                    gsp_peer.FN_GSP_RM_ALLOC]
    assert done.static.internal_client == sim.peer_module().STATIC_DEFAULTS["hInternalClient"]
    assert firmware.log.index("sequencer ran") < firmware.log.index("GSP_INIT_DONE sent")
    assert peer.objects == {rpc.CLIENT_HANDLE: 0} and done.rm.client == rpc.CLIENT_HANDLE
    handle = done.rm.new_handle()
    assert done.rm.alloc(rpc.CLIENT_HANDLE, handle, 0x80) == handle  # NV01_DEVICE_0
    assert peer.objects[handle] == rpc.CLIENT_HANDLE
    # the FMC raised WPR2, released the GSP; FALCON_OS holds the app version, RISC-V runs
    assert isinstance(done.booted, boot_fsp.FmcBooted) and done.booted.wpr2 is not None
    assert "GSP-RM started" in r.fmc.log and g.gsp.state == "riscv-running"
    assert g.gsp.reg(sim.regs.OS) == APP_VERSION


def test_the_cot_is_version_2_with_the_addresses_the_cpu_laid_out() -> None:
    r = Gb202()
    done = r.boot()
    assert isinstance(done.booted, boot_fsp.FmcBooted)
    b = done.booted
    [(nvdm, payload)] = r.fsp.received
    assert nvdm == sim_fsp.COT and len(r.fsp.packets[0]) == 8 + 860
    assert r.fsp.packets[0][:8] == struct.pack("<II", 0xC0000000, 0x1410DE7E)
    assert payload == b.cot

    def f(name: str) -> int | bytes:
        return sim_fsp.cot_field(payload, name)

    assert (f("version"), f("size")) == (2, 860)
    assert f("gspFmcSysmemOffset") == b.fmc_address
    assert f("gspBootArgsSysmemOffset") == b.boot_params_address
    assert f("hash384") == hashlib.sha384(FMC_IMAGE).digest()
    assert f("publicKey") == (b"\x04" + b"\x33" * 96).ljust(384, b"\0")
    assert f("signature") == (b"\x22" * 96).ljust(384, b"\0")
    # FRTS: memmgrGetFBEndReserveSizeEstimate_GB100's 0x220000 plus GB202's PMU reservation
    # (kfspGetExtraReservedMemorySize 0 past GH100), aligned to 2 MiB: 28 MiB, tinygrad's
    # 0x1c00000 too; 1 MiB; no sysmem
    pmu = r.memory.meta.pmu_reserved_size
    assert pmu and f("frtsVidmemOffset") == layout.align_up(0x220000 + pmu, 0x200000)
    assert f("frtsVidmemOffset") == 0x1C00000
    assert (f("frtsVidmemSize"), f("frtsSysmemOffset"), f("frtsSysmemSize")) == (0x100000, 0, 0)
    # the image in 4 KiB-rounded DMA memory, zero-padded; the boot params name meta and LibOS
    host = r.gpu.host
    size = layout.align_up(len(FMC_IMAGE), 0x1000)
    assert host.read(b.fmc_address, size) == FMC_IMAGE.ljust(size, b"\0")
    assert b.fmc_address % 0x1000 == 0 and b.boot_params_address % 0x1000 == 0
    params = hopper.FmcBootParams.unpack(host.read(b.boot_params_address, 80))
    assert (params.wpr_meta, params.libos_args) == (r.memory.wpr_meta, r.memory.libos_args)
    assert r.fmc.boot_params["meta"] == r.memory.wpr_meta
    assert r.fmc.boot_params["libos"] == r.memory.libos_args
    # the WPR meta holds sizes for the FMC, no offsets
    assert r.memory.meta.frts_size == 0x100000 and r.memory.meta.gsp_fw_wpr_start == 0


def test_the_fmc_is_one_run_of_bus_addresses_on_every_page() -> None:
    """The spec: "on Blackwell the FMC [...] lie[s] in one run of bus addresses". Issue 20
    item 12: an FMC image whose middle page lay elsewhere (its ends in place) was booted."""
    from test_gspmem import middle_page_elsewhere

    image = bytes(range(256)) * 0x28  # 10 KiB: three pages
    r = Gb202()
    with pytest.raises(BootError, match=r"^GPU 3: the DMA memory for the FMC image \(0x3000 "
                                        r"bytes at .*\) is not 4 KiB-aligned and contiguous"):
        boot_fsp.boot_fsp(r.bar0, name="GPU 3", family=chips.BLACKWELL,
                          fmc=fb.build_fmc(image, hash_=hashlib.sha384(image).digest()),
                          memory=r.memory, alloc=middle_page_elsewhere(r.gpu.host),
                          system=r.system(), app_version=APP_VERSION, timeout_s=0.2,
                          init_timeout_s=1.0)
    assert r.firmware.boots == 0 and r.gpu.gsp.state != "riscv-running"


def test_an_fsp_error_code_fails_the_boot_naming_it() -> None:
    r = Gb202()
    r.fsp.error_code = 0x9F
    with pytest.raises(BootError, match=r"^GPU 3: the FSP refused the COT \(0x14\) command with "
                                        r"error code 0x9f \(FSP_ERR_IFR_FILE_NOT_FOUND\)"):
        r.boot()
    assert r.firmware.boots == 0 and r.gpu.gsp.state != "riscv-running"


def test_an_fmc_whose_hash_does_not_match_is_refused_by_the_fsp() -> None:
    r = Gb202()
    wrong = fb.build_fmc(FMC_IMAGE)  # hash section 0x11...: not the image's SHA-384
    with pytest.raises(BootError, match=r"GPU 3: the FSP refused the COT .* error code 0xa1"):
        r.boot(fmc=wrong)
    assert r.fmc.log == ["hash384 is not the image's SHA-384"]


def test_an_fmc_error_in_mailbox0_fails_the_boot_naming_it() -> None:
    r = Gb202(error=0x3C)
    with pytest.raises(BootError, match=r"^GPU 3: the GSP's FMC reported error 0x3c "
                                        r"\(NV_PGSP_FALCON_MAILBOX0 0x0000003c"):
        r.boot()
    assert r.firmware.boots == 0


def test_lockdown_never_released_times_out_naming_the_gpu() -> None:
    r = Gb202(release_lockdown=False)
    with pytest.raises(BootError, match=r"^GPU 3: the GSP's FMC did not release its lockdown "
                                        r"within 0.05 s .*HWCFG2 0x80002400"):
        r.boot(timeout_s=0.05)
    assert r.firmware.boots == 0


def test_a_target_mask_never_released_times_out_naming_the_register() -> None:
    r = Gb202(release_target_mask=False)
    with pytest.raises(BootError, match=r"^GPU 3: the FSP did not release the GSP's PRIV "
                                        r"target mask within 0.05 s \(NV_PGSP_FALCON_HWCFG2 "
                                        r"0xbadf4100\)"):
        r.boot(timeout_s=0.05)


def test_wpr2_already_up_is_refused_before_the_fsp_is_spoken_to() -> None:
    r = Gb202()
    r.gpu.set_wpr2(0x1000_0000, 0x1010_0000)
    with pytest.raises(BootError, match=r"^GPU 3: its protected memory \(WPR2\) is already up"):
        r.boot()
    assert r.fsp.packets == []


def test_an_fsp_that_never_boots_times_out_naming_the_gpu() -> None:
    r = Gb202()
    r.fsp.boot_polls = None
    with pytest.raises(BootError, match=r"^GPU 3: the FSP did not finish its boot within "
                                        r"0.05 s \(NV_THERM_I2CS_SCRATCH 0x00000000"):
        r.boot(timeout_s=0.05)


def test_a_stop_unloads_and_waits_for_the_risc_v_halt_without_booter_unload() -> None:
    r = Gb202()
    booted = r.boot()
    stop_gsp(r.bar0, booted, name="GPU 3", family=chips.BLACKWELL, timeout_s=0.2,
             unload_timeout_s=0.1, suspend_timeout_s=0.05)
    g, peer = r.gpu, r.firmware.peer
    assert [q.function for q in peer.requests[-2:]] == [gsp_peer.FN_FREE,
                                                        gsp_peer.FN_UNLOADING_GUEST_DRIVER]
    assert r.firmware.suspended and g.gsp.mailbox(0) == PROCESSOR_SUSPENDED
    assert g.gsp.state == "halted" and g.gsp.resets == 0  # no falcon reset
    assert g.sec2.starts == []  # no booter_unload: SEC2 never ran


def test_a_stop_whose_gsp_never_halts_is_lost() -> None:
    r = Gb202()
    r.firmware.suspend_on_unload = False
    booted = r.boot()
    with pytest.raises(StopError, match=r"GPU 3: stopping the GSP failed: .*waiting for the "
                                        r"GSP's RISC-V core to halt") as e:
        stop_gsp(r.bar0, booted, name="GPU 3", family=chips.BLACKWELL, timeout_s=0.05,
                 unload_timeout_s=0.1, suspend_timeout_s=0.05)
    assert e.value.lost
    assert r.gpu.sec2.starts == []


def test_a_wpr_meta_the_fmc_cannot_use_fails_the_boot_with_its_error() -> None:
    r = Gb202()
    view = r.gpu.host.view(r.memory.wpr_meta, 8)
    assert view is not None
    view[:] = bytes(8)  # no GspFwWprMeta magic
    with pytest.raises(BootError, match=rf"GPU 3: the GSP's FMC reported error "
                                        rf"0x{sim_fmc.FMC_BAD_ARGS:02x}"):
        r.boot()
    assert "FMC error: GspFwWprMeta" in r.fmc.log[-1]


def test_blackwell_waits_for_the_fsp_at_gb202s_therm_scratch_five_seconds() -> None:
    """Issue 26 finding 1: GB202's NV_THERM_I2CS_SCRATCH is 0x00ad00bc (blackwell/gb202/
    dev_therm.h), and kfspWaitForSecureBoot_GB202 waits 5 s. The simulated GB202 answers
    only there (GH100's 0x000200bc reads 0), so an open waiting at GH100's address fails."""
    assert chips.BLACKWELL.fsp_ready == (0xAD00BC, 5.0)
    assert chips.HOPPER.fsp_ready == (0x0200BC, 4.0)
    r = Gb202()
    r.fsp.boot_polls = 3
    r.boot()
    assert 0xAD00BC in r.gpu.reads and 0x0200BC not in r.gpu.reads
    assert r.gpu.bar0().read32(0x0200BC) == 0  # nothing answers at GH100's address on GB202


def test_the_fsp_wait_at_gh100s_address_times_out_on_a_gb202() -> None:
    """Issue 26 finding 1, the old behaviour planted: a wait at GH100's address on the
    simulated GB202 never sees 0xff."""
    r = Gb202()
    device = fsp.Fsp(r.bar0, "GPU 3", timeout_s=0.05, ready=(0x0200BC, 0.05))
    with pytest.raises(fsp.FspError, match=r"did not finish its boot within 0.05 s "
                                            r"\(NV_THERM_I2CS_SCRATCH 0x00000000, not "
                                            r"0x000000ff, at 0x0200bc\)"):
        device.wait_ready()
    fsp.Fsp(r.bar0, "GPU 3", ready=chips.BLACKWELL.fsp_ready).wait_ready()


def test_blackwell_names_gb20xs_config_mirror_and_coherent_libos_arguments() -> None:
    """Issue 26 finding 4: GspSystemInfo.pciConfigMirrorBase is NV_EP_PCFGM 0x92000 from GH100
    on (kbifGetPciConfigSpacePriMirror_GH100), and the FMC boot parameters name rig's
    write-back cached LibOS arguments COHERENT_SYSTEM (_kgspMemdescToDmaTarget)."""
    r = Gb202()
    r.boot()
    assert r.firmware.failure is None, r.firmware.log
    assert sysinfo.decode(r.firmware.system_info or b"")["pciConfigMirrorBase"] == 0x92000
    assert r.fmc.boot_params["libos_target"] == hopper.GSP_DMA_TARGET_COHERENT_SYSTEM


def test_a_gb202_told_ampere_s_config_mirror_never_reports_init_done() -> None:
    """Issue 26 finding 4, the old mirror planted: GSP-RM on the simulated GB202 reads config
    space through the mirror GspSystemInfo names, so 0x88000 there is garbage: no INIT_DONE."""
    r = Gb202()
    old = dataclasses.replace(r.system(), config_mirror=sysinfo.PCI_CONFIG_MIRROR_BASE)
    r.system = lambda: old  # type: ignore[method-assign]
    with pytest.raises(BootError, match="did not report GSP_INIT_DONE"):
        r.boot(timeout_s=0.2)
    assert "pciConfigMirrorBase 0x88000" in (r.firmware.failure or "")


def test_libos_arguments_named_noncoherent_read_stale_and_never_start_gsp_rm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26 finding 4, the old target planted: NONCOHERENT_SYSTEM over cached memory reads
    stale data on the simulated GB202 (no snoop), so LibOS finds no arguments."""
    made = hopper.fmc_boot_params
    monkeypatch.setattr(boot_fsp.hopper, "fmc_boot_params", lambda *a, **k: made(
        *a, **k, libos_args_target=hopper.GSP_DMA_TARGET_NONCOHERENT_SYSTEM))
    r = Gb202()
    with pytest.raises(BootError, match="did not report GSP_INIT_DONE"):
        r.boot(timeout_s=0.2)
    assert "stale" in " ".join(r.firmware.log)
    assert "no RMARGS" in (r.firmware.failure or "")


def test_the_frts_offset_follows_each_familys_reserve_estimate() -> None:
    """kfspPrepareBootCommands_GH100's FRTS offset: GH100's 2 MiB estimate plus 4 KiB
    (kfspGetExtraReservedMemorySize_GH100), GB20x's 0x220000 (memmgrGetFBEndReserveSize
    Estimate_GB100) plus nothing, each with the PMU's reservation and aligned to 2 MiB."""
    meta = dataclasses.replace(Gb202().memory.meta, pmu_reserved_size=0x1FF000)
    assert boot_fsp.frts_vidmem_offset(meta, chips.HOPPER) == 0x400000
    assert boot_fsp.frts_vidmem_offset(meta, chips.BLACKWELL) == 0x600000
    none = dataclasses.replace(meta, pmu_reserved_size=0)
    assert boot_fsp.frts_vidmem_offset(none, chips.BLACKWELL) == 0x220000
