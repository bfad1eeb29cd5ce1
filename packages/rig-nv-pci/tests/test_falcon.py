"""rig_nv_pci.boot.falcon against the simulated GPU (tests/sim)."""

from __future__ import annotations

import pytest
import sim

from rig_nv_pci.boot import falcon
from rig_nv_pci.boot.falcon import GSP, SEC2, Falcon, FalconError, HsUcode

SIG = bytes(range(256)) + bytes(128)


def _gpu() -> tuple[sim.SimGpu, Falcon, Falcon]:
    gpu = sim.SimGpu()
    bar0 = gpu.bar0()
    return gpu, Falcon(bar0, GSP, timeout_s=0.05), Falcon(bar0, SEC2, timeout_s=0.05)


def test_reset_scrubs_and_selects_the_falcon_core() -> None:
    gpu, gsp, _ = _gpu()
    gpu.gsp.start_riscv()
    gpu.gsp.imem[0:4] = b"junk"
    gsp.reset()
    assert gpu.gsp.resets == 1 and not gpu.gsp.in_reset
    assert gpu.gsp.imem[0:4] == bytes(4)
    assert gpu.gsp.scrub_left == 0
    assert not gpu.gsp.riscv_core  # switched back to Falcon after the reset
    assert (sim.regs.GSP_BASE + sim.regs.ENGINE, 1) in gpu.writes


def test_reset_fails_naming_the_engine_when_scrubbing_never_ends() -> None:
    gpu, gsp, _ = _gpu()
    gpu.gsp.scrub_polls = 10**9
    with pytest.raises(FalconError, match=r"the GSP falcon did not finish scrubbing .*HWCFG2"):
        gsp.reset()


def test_reset_into_riscv_selects_the_riscv_core() -> None:
    """Issue 26 item 5: kflcnResetIntoRiscv_GA102 programs the BCR and waits for no VALID
    (the simulated core reads VALID only once the booter runs it), writes no FALCON_RM and
    makes no switch to the Falcon core first."""
    gpu, gsp, _ = _gpu()
    gsp.reset_into_riscv()
    assert gpu.gsp.riscv_core
    assert not gsp.riscv_active()
    assert not gsp.riscv_rd(falcon.RISCV_BCR_CTRL) & falcon.BCR_VALID
    assert gpu.gsp.reg(sim.regs.FALCON_RM) == 0
    bcr = [v for r, v in gpu.writes if r == sim.regs.GSP_RISCV + sim.regs.RISCV_BCR_CTRL]
    assert bcr == [falcon.BCR_CORE_SELECT_RISCV | falcon.BCR_VALID | falcon.BCR_BRFETCH]


def test_every_reset_writes_boot_0_into_falcon_rm_for_the_hs_ucode() -> None:
    """Issue 26 finding 2: kflcnReset_TU102 writes NV_PMC_BOOT_0 into NV_PFALCON_FALCON_RM
    (+0x084) after each reset, and the simulated HS ucode checks it before it runs: a reset
    that leaves it 0, or another value, halts FWSEC or booter with RM_MISMATCH."""
    gpu, gsp, sec2 = _gpu()
    for f, model in ((gsp, gpu.gsp), (sec2, gpu.sec2)):
        f.reset()
        assert model.reg(sim.regs.FALCON_RM) == gpu.boot0() == gpu.bar0().read32(0)
        assert gpu.boot0() != gpu.boot42  # BOOT_0, not BOOT_42
    buf, u = _hs(gpu, gpu.sec2)
    gpu.sec2.programs[3] = lambda f: f.set_mailbox(0, 0)
    sec2.reset()
    assert sec2.run_hs(buf, u)[0] == 0
    sec2.reset()
    sec2.wr(falcon.RM, 0)  # the old reset's FALCON_RM: never written, 0 after the reset
    assert sec2.run_hs(buf, u)[0] == sim.falcon.RM_MISMATCH
    assert "FALCON_RM 0x00000000 is not NV_PMC_BOOT_0" in gpu.sec2.log[-1]


def test_a_reset_reads_engine_ten_times_after_each_edge() -> None:
    """kgspResetHw_TU102 / ksec2ResetHw_TU102: FLCN_RESET_PROPAGATION_DELAY_COUNT (10) reads
    of FALCON_ENGINE after setting RESET and after clearing it."""
    gpu, gsp, _ = _gpu()
    engine = sim.regs.GSP_BASE + sim.regs.ENGINE
    gsp.reset()
    assert [v for r, v in gpu.writes if r == engine] == [1, 0]
    assert gpu.reads.count(engine) >= 2 * falcon.RESET_PROPAGATION_READS


def test_ports_load_imem_and_dmem_with_auto_increment() -> None:
    gpu, _, sec2 = _gpu()
    sec2.reset()
    sec2.write_imem(0x100, b"abcdefgh", secure=True)
    sec2.write_dmem(0x40, b"12345678")
    assert gpu.sec2.imem[0x100:0x108] == b"abcdefgh"
    assert gpu.sec2.imem_secure == {1}
    assert gpu.sec2.dmem[0x40:0x48] == b"12345678"
    assert sec2.read_dmem(0x40, 8) == b"12345678"
    with pytest.raises(ValueError, match="whole 32-bit words"):
        sec2.write_dmem(2, b"ab")


def test_dma_loads_imem_and_dmem_from_host_memory() -> None:
    gpu, gsp, _ = _gpu()
    gsp.reset()
    buf = gpu.host.alloc_dma(0x1000)
    buf.view()[:0x300] = bytes(i * 3 & 0xFF for i in range(0x300))
    gsp.dma(buf, 0x100, 0x200, 0x180, imem=True, secure=True)
    gsp.dma(buf, 0, 0, 0x100, imem=False)
    assert gpu.gsp.imem[0x200:0x400] == bytes(buf.data[0x100:0x300])
    assert gpu.gsp.dmem[0:0x100] == bytes(buf.data[0:0x100])
    assert gpu.gsp.imem_secure == {2, 3}
    with pytest.raises(ValueError, match="256-aligned"):
        gsp.dma(buf, 0x10, 0, 0x100, imem=True)


def test_dma_that_never_finishes_names_the_register_state() -> None:
    gpu, gsp, _ = _gpu()
    gsp.reset()
    buf = gpu.host.alloc_dma(0x1000)
    gpu.gsp.dma_fault = "stuck"
    with pytest.raises(FalconError, match=r"GSP falcon DMA into IMEM.*DMATRFCMD 0x00000000"):
        gsp.dma(buf, 0, 0, 0x100, imem=True)


def _hs(gpu: sim.SimGpu, f: sim.SimFalcon, ucode_id: int = 3) -> tuple[sim.SimDma, HsUcode]:
    buf = gpu.host.alloc_dma(0x1000)
    buf.data[0:0x200] = b"\x11" * 0x200  # code
    buf.data[0x200:0x400] = b"\x22" * 0x40 + SIG + bytes(0x200 - 0x40 - len(SIG))
    f.signatures.add(SIG)
    f.ucode_id = ucode_id
    u = HsUcode(code_offset=0, imem_size=0x200, imem_pa=0, imem_va=0, data_offset=0x200,
                dmem_size=0x200, dmem_pa=0, sig_dmem_offset=0x40,
                engine_id_mask=f.engine_bit, ucode_id=ucode_id)
    return buf, u


def test_run_hs_checks_the_brom_parameters_and_runs_the_program() -> None:
    gpu, _, sec2 = _gpu()
    seen: list[tuple[int, int]] = []

    def program(f: sim.SimFalcon) -> None:
        seen.append((f.mailbox(0), f.mailbox(1)))
        f.set_mailbox(0, 0)
        f.set_mailbox(1, 0x1234)

    buf, u = _hs(gpu, gpu.sec2)
    gpu.sec2.programs[3] = program
    sec2.reset()
    assert sec2.run_hs(buf, u, mailbox0=0xAAAA, mailbox1=0xBBBB) == (0, 0x1234)
    assert seen == [(0xAAAA, 0xBBBB)]
    assert gpu.sec2.imem[0:0x200] == b"\x11" * 0x200
    assert gpu.sec2.starts == ["falcon"] and gpu.sec2.state == "halted"
    assert sec2.fuse_version(3) == 0
    gpu.fuses[sim.regs.FUSE_SEC2_UCODE1_VERSION + 8] = 0b100
    assert sec2.fuse_version(3) == 3


def test_run_hs_with_a_bad_signature_halts_with_the_broms_error() -> None:
    gpu, gsp, _ = _gpu()
    buf, u = _hs(gpu, gpu.gsp)
    gpu.gsp.programs[3] = lambda f: None
    gpu.gsp.signatures = {b"\x99" * 384}
    gsp.reset()
    assert gsp.run_hs(buf, u)[0] == sim.BROM_FAILED
    assert "not accepted" in gpu.gsp.log[-1]


def test_wait_halt_times_out_naming_the_engine() -> None:
    gpu, gsp, _ = _gpu()
    buf, u = _hs(gpu, gpu.gsp)
    gpu.gsp.programs[3] = lambda f: None
    gpu.gsp.run_polls = 10**9
    gsp.reset()
    with pytest.raises(FalconError, match=r"the GSP falcon did not halt within 0.05 s \(CPUCTL"):
        gsp.run_hs(buf, u)


def test_start_uses_the_alias_when_enabled() -> None:
    gpu, gsp, _ = _gpu()
    gsp.reset()
    gpu.gsp.regs[sim.regs.GSP_BASE + sim.regs.CPUCTL] = 1 << 6
    gsp.start(0x40)
    assert (sim.regs.GSP_BASE + sim.regs.CPUCTL_ALIAS, falcon.CPUCTL_STARTCPU) in gpu.writes
    assert gpu.gsp.reg(sim.regs.BOOTVEC) == 0x40


def test_dma_with_a_tag_offset_reads_from_the_source_not_the_tag() -> None:
    gpu, gsp, _ = _gpu()
    gsp.reset()
    buf = gpu.host.alloc_dma(0x1000)
    buf.view()[0x200:0x300] = b"\x5a" * 0x100
    gsp.dma(buf, 0x200, 0, 0x100, imem=True, mem_offset=0x100)
    assert gpu.gsp.imem[0:0x100] == b"\x5a" * 0x100
    base = gpu.gsp.reg(sim.regs.DMATRFBASE) << 8
    assert base + gpu.gsp.reg(sim.regs.DMATRFFBOFFS) == buf.bus + 0x200
