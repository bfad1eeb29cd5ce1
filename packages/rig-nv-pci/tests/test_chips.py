"""Chip identification from NV_PMC_BOOT_42 and the families chips boot as.

The numbers are written here from open-gpu-kernel-modules 570.144 (nv_ref.h's
NV_PMC_BOOT_42_ARCHITECTURE_*, nv_arch.h's GPU_IMPLEMENTATION_*) and nova-core's Chipset
table, not read from rig_nv_pci.firmware.chips."""

import pytest

from rig_nv_pci.firmware import chips
from rig_pci import firmware


def boot42(arch: int, impl: int, major: int = 0xA, minor: int = 1) -> int:
    """NV_PMC_BOOT_42 as a chip reads it: architecture 29:24, implementation 23:20, major
    revision 19:16, minor revision 15:12."""
    return arch << 24 | impl << 20 | major << 16 | minor << 12


# nova-core drivers/gpu/nova-core/gpu.rs: GA102 = 0x172 ... GB207 = 0x1b7.
NOVA_CORE = {
    "GA102": 0x172, "GA103": 0x173, "GA104": 0x174, "GA106": 0x176, "GA107": 0x177,
    "AD102": 0x192, "AD103": 0x193, "AD104": 0x194, "AD106": 0x196, "AD107": 0x197,
    "GB202": 0x1B2, "GB203": 0x1B3, "GB205": 0x1B5, "GB206": 0x1B6, "GB207": 0x1B7,
}


def test_register_and_fields_are_nv_ref_h() -> None:
    assert chips.NV_PMC_BOOT_42 == 0xA00
    assert chips.NV_PMC_BOOT_42_ARCHITECTURE == (29, 24)
    assert chips.NV_PMC_BOOT_42_IMPLEMENTATION == (23, 20)
    assert chips.NV_PFB_PRI_MMU_WPR2_ADDR_HI == 0x1FA828


def test_the_table_is_the_spec_list_with_nova_cores_numbers() -> None:
    assert {c.name: c.chip_id for c in chips.CHIPS} == NOVA_CORE
    for c in chips.CHIPS:
        assert chips.identify(boot42(c.chip_id >> 4, c.chip_id & 0xF)) is c


@pytest.mark.parametrize(
    ("name", "family", "architecture", "boot", "cot"),
    [("GA104", "ga102", "Ampere", "booter", None), ("AD107", "ad102", "Ada", "booter", None),
     ("GB206", "gb202", "Blackwell", "fsp", 2)],
)
def test_family(name: str, family: str, architecture: str, boot: str, cot: int | None) -> None:
    chip = chips.identify(boot42(NOVA_CORE[name] >> 4, NOVA_CORE[name] & 0xF))
    assert chip.name == name
    assert (chip.family.name, chip.family.architecture) == (family, architecture)
    assert (chip.family.boot, chip.family.cot_version) == (boot, cot)
    assert chips.lookup(boot42(NOVA_CORE[name] >> 4, NOVA_CORE[name] & 0xF)) is chip


def test_gh100_is_hopper_booted_through_the_fsp_with_cot_v1() -> None:
    # nv_ref.h NV_PMC_BOOT_42_ARCHITECTURE_GH100 0x18, nv_arch.h GPU_IMPLEMENTATION_GH100 0x0;
    # cotPayloadVersion 1 on GH100 (g_kern_fsp_nvoc.c).
    chip = chips.lookup(boot42(0x18, 0x0))
    assert chip is not None and (chip.name, chip.chip_id) == ("GH100", 0x180)
    assert chip.family is chips.HOPPER
    assert (chips.HOPPER.name, chips.HOPPER.architecture) == ("gh100", "Hopper")
    assert (chips.HOPPER.boot, chips.HOPPER.cot_version) == ("fsp", 1)
    assert chips.chip_name(boot42(0x18, 0x0, major=0xB)) == "GH100"
    assert chips.lookup(boot42(0x18, 0x2)) is None and chips.lookup(boot42(0x16, 0x2)) is None


def test_gh100_is_refused_as_outside_the_specs_chips() -> None:
    """Spec (Requirements): "The chips whose boot this library lays out open: GA10x, AD10x,
    GB20x"; an open refuses "its chip is outside the chips Requirements lists, naming it".
    Hopper's family is known (its data serves the FSP boot Blackwell shares), not opened."""
    with pytest.raises(chips.UnsupportedChip) as e:
        chips.identify(boot42(0x18, 0x0))
    assert str(e.value) == (
        "chip GH100 (boot42 0x180a1000) is not one this library boots; it boots GA102, GA103, "
        "GA104, GA106, GA107, AD102, AD103, AD104, AD106, AD107, GB202, GB203, GB205, GB206 "
        "and GB207"
    )


def test_a_family_boots_by_booter_or_fsp_with_a_cot_version_only_for_fsp() -> None:
    for bad in (("x", "X", "fmc", None), ("x", "X", "fsp", None), ("x", "X", "booter", 1)):
        with pytest.raises(ValueError):
            chips.Family(*bad)


def test_families_firmware_is_the_spec_list_and_pinned() -> None:
    gsp = "nvidia/ga102/gsp/gsp-570.144.bin"  # every family's GSP image is ga102's
    assert chips.AMPERE.firmware == (
        gsp,
        "nvidia/ga102/gsp/bootloader-570.144.bin",
        "nvidia/ga102/gsp/booter_load-570.144.bin",
        "nvidia/ga102/gsp/booter_unload-570.144.bin",
    )
    assert chips.ADA.firmware == (
        gsp,
        "nvidia/ad102/gsp/bootloader-570.144.bin",
        "nvidia/ad102/gsp/booter_load-570.144.bin",
        "nvidia/ad102/gsp/booter_unload-570.144.bin",
    )
    assert chips.BLACKWELL.firmware == (
        gsp,
        "nvidia/gb202/gsp/bootloader-570.144.bin",
        "nvidia/gb202/gsp/fmc-570.144.bin",
    )
    # Hopper: the GSP image shared with ga10x (nv-firmware.h maps GH100 to gsp_ga10x; gh100's
    # gsp-570.144.bin is a link to ga102's), gh100's bootloader and FMC; no booter.
    assert chips.HOPPER.firmware == (
        gsp,
        "nvidia/gh100/gsp/bootloader-570.144.bin",
        "nvidia/gh100/gsp/fmc-570.144.bin",
    )
    assert chips.BLACKWELL.booter_load is None and chips.AMPERE.fmc is None
    assert chips.HOPPER.booter_load is None and chips.HOPPER.booter_unload is None
    for family in (chips.AMPERE, chips.ADA, chips.BLACKWELL):
        for name in family.firmware:
            assert name in firmware.NVIDIA_GSP_570_144
    # Hopper's own files are not pinned (nor fetched) until its boot is built.
    assert chips.HOPPER.fmc not in firmware.NVIDIA_GSP_570_144


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (boot42(0x18, 0x2), "an unknown chip (boot42 0x182a1000: architecture 0x18, "
                            "implementation 0x2)"),  # no Hopper but GH100 in nv_arch.h
        (boot42(0x17, 0x0), "chip GA100 (boot42 0x170a1000)"),  # Ampere, but not GA10x
        (boot42(0x1A, 0x0), "chip GB100 (boot42 0x1a0a1000)"),
        (boot42(0x1B, 0x4), "chip GB204 (boot42 0x1b4a1000)"),  # in nv_arch.h, not the spec
        (boot42(0x16, 0x2), "chip TU102 (boot42 0x162a1000)"),
        (boot42(0x1F, 0x5), "an unknown chip (boot42 0x1f5a1000: architecture 0x1f, "
                            "implementation 0x5)"),
    ],
)
def test_other_chips_are_refused_naming_them(value: int, named: str) -> None:
    with pytest.raises(chips.UnsupportedChip) as e:
        chips.identify(value)
    assert str(e.value) == (
        f"{named} is not one this library boots; it boots GA102, GA103, GA104, GA106, GA107, "
        "AD102, AD103, AD104, AD106, AD107, GB202, GB203, GB205, GB206 and GB207"
    )


def test_revision_bits_do_not_change_the_chip() -> None:
    assert chips.identify(boot42(0x19, 0x4, major=0xF, minor=0xF) | 0xFFF).name == "AD104"
    assert chips.identify(boot42(0x19, 0x4) | 0xC000_0000).name == "AD104"  # bits 31:30


def test_wpr2_up_reads_bits_31_4() -> None:
    assert not chips.wpr2_up(0x0000000F)  # bits 3:0 are not the bound
    assert chips.wpr2_up(0x00000010)
    assert chips.wpr2_up(0x0FFF_FFF0)


def test_the_booter_unload_digests_are_the_issues() -> None:
    """Issue 8 pins ga102's and ad102's booter_unload by the BLAKE2b-256 digests read off
    Debian's firmware-nvidia-graphics 20260916-1."""
    from rig_pci import firmware

    table = firmware.NVIDIA_GSP_570_144
    assert table["nvidia/ga102/gsp/booter_unload-570.144.bin"] == (
        "a50f6fdfdd7795e15dd7ce7b7bf768e154cbd89279ed6713cbab4018d4d612ca")
    assert table["nvidia/ad102/gsp/booter_unload-570.144.bin"] == (
        "5afefa3797ea1c6bb94b721ccc75546a68fb497fa3911f8135f060897e822b7d")
