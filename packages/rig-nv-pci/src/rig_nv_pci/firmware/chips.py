"""Which chip a GPU is, from its NV_PMC_BOOT_42 register, and the family it boots as.

NV_PMC_BOOT_42 lies at BAR 0 offset 0xA00 (open-gpu-kernel-modules 570.144,
src/common/inc/swref/published/nv_ref.h): the architecture in bits 29:24, the implementation in
bits 23:20, together the chip id in bits 29:20. The architectures are nv_ref.h's
``NV_PMC_BOOT_42_ARCHITECTURE_*`` (0x17 GA100, i.e. Ampere; 0x18 GH100; 0x19 AD100; 0x1A
GB100; 0x1B GB200) and the implementations nv_arch.h's ``GPU_IMPLEMENTATION_*``; nova-core's
``Chipset`` table (drivers/gpu/nova-core/gpu.rs: GA102 = 0x172 ... GB207 = 0x1b7) has the same
numbers.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/firmware-chips.md."""

from __future__ import annotations

from dataclasses import dataclass

from rig_edge import RigError

NV_PMC_BOOT_42 = 0x00000A00
NV_PMC_BOOT_42_IMPLEMENTATION = (23, 20)
NV_PMC_BOOT_42_ARCHITECTURE = (29, 24)

# src/common/inc/swref/published/turing/tu102/dev_fb.h: WPR2's upper bound, in 128 KiB units in
# bits 31:4; kgspIsWpr2Up_TU102 (kernel_gsp_tu102.c) reads it for TU102 through AD107, and
# kgspIsWpr2Up_GH100 (Hopper and Blackwell) calls it too: nonzero means WPR2 is up.
NV_PFB_PRI_MMU_WPR2_ADDR_HI = 0x001FA828
NV_PFB_PRI_MMU_WPR2_ADDR_HI_VAL = (31, 4)

GSP_RELEASE = "570.144"
BOOTS = ("booter", "fsp")
GSP_IMAGE = f"nvidia/ga102/gsp/gsp-{GSP_RELEASE}.bin"


def field(value: int, bits: tuple[int, int]) -> int:
    """Bits ``hi:lo`` of ``value`` (NVIDIA's DRF_VAL)."""
    hi, lo = bits
    return (value >> lo) & ((1 << (hi - lo + 1)) - 1)


@dataclass(frozen=True)
class Family:
    """How a chip boots: ``name`` is its firmware directory (``ga102``), ``architecture`` the
    marketing name (``Ampere``), ``boot`` either ``"booter"`` (FWSEC-FRTS, then booter_load on
    SEC2; booter_unload at stop) or ``"fsp"`` (one COT message to the FSP, which starts the
    GSP's FMC); ``cot_version`` the NVDM_PAYLOAD_COT version an ``"fsp"`` boot sends (1 on
    GH100, 2 on Blackwell; ``None`` for ``"booter"``); ``fsp_ready`` where an ``"fsp"`` boot
    waits for the FSP's own boot (NV_THERM_I2CS_SCRATCH's address) and for how long, in
    seconds; ``runlist_doorbell`` whether a work-submit token carries
    NV_VIRTUAL_FUNCTION_DOORBELL_RUNLIST_DOORBELL _ENABLE (GB20x)."""

    name: str
    architecture: str
    boot: str
    cot_version: int | None = None
    fsp_ready: tuple[int, float] | None = None
    runlist_doorbell: bool = False

    def __post_init__(self) -> None:
        if self.boot not in BOOTS:
            raise ValueError(f"a family boots by one of {BOOTS}, not {self.boot!r}")
        fsp = self.boot == "fsp"
        if fsp != (self.cot_version is not None) or fsp != (self.fsp_ready is not None):
            raise ValueError("a COT version and the FSP's ready register are given for, and "
                             "only for, an FSP boot")

    def path(self, image: str) -> str:
        """The firmware file ``image`` (``bootloader``, ``booter_load``...) of this family."""
        return f"nvidia/{self.name}/gsp/{image}-{GSP_RELEASE}.bin"

    @property
    def gsp_image(self) -> str:
        """The GSP's firmware: ga102's for every family."""
        return GSP_IMAGE

    @property
    def bootloader(self) -> str:
        return self.path("bootloader")

    @property
    def booter_load(self) -> str | None:
        return self.path("booter_load") if self.boot == "booter" else None

    @property
    def booter_unload(self) -> str | None:
        return self.path("booter_unload") if self.boot == "booter" else None

    @property
    def fmc(self) -> str | None:
        return self.path("fmc") if self.boot == "fsp" else None

    @property
    def firmware(self) -> tuple[str, ...]:
        """Every file a boot of this family reads, in the spec's order: the GSP's firmware,
        its bootloader, the image that starts it, the booter that takes the boot down."""
        names = (self.gsp_image, self.bootloader, self.booter_load, self.fmc, self.booter_unload)
        return tuple(n for n in names if n is not None)


AMPERE = Family("ga102", "Ampere", "booter")
ADA = Family("ad102", "Ada", "booter")
# The FSP's boot-complete scratch: hopper/gh100/dev_therm.h NV_THERM_I2CS_SCRATCH 0x000200bc,
# waited on 4 s by kfspWaitForSecureBoot_GH100; blackwell/gb202/dev_therm.h moves it to
# 0x00ad00bc, and kfspWaitForSecureBoot_GB202 (GB202..GB207 in g_kern_fsp_nvoc.c) waits 5 s
# ("Increase to 5 seconds for WS SKUs"). nova-core's gb202 registers and tinygrad
# (dev_therm of gb202) read the same address.
HOPPER = Family("gh100", "Hopper", "fsp", cot_version=1, fsp_ready=(0x000200BC, 4.0))
# kfifoGenerateWorkSubmitTokenHal_GB202 (GB202..GB207) sets the token's RUNLIST_DOORBELL
# (gb202/dev_vm.h NV_VIRTUAL_FUNCTION_DOORBELL 30:30, _ENABLE 1); GA100's HAL (GA10x, AD10x,
# GH100) has no such bit
BLACKWELL = Family("gb202", "Blackwell", "fsp", cot_version=2,
                   fsp_ready=(0x00AD00BC, 5.0), runlist_doorbell=True)


@dataclass(frozen=True)
class Chip:
    """A chip this library boots: ``name`` (``"GA102"``), its BOOT_42 ``architecture`` and
    ``implementation``, and its ``family``."""

    name: str
    architecture: int
    implementation: int
    family: Family

    @property
    def chip_id(self) -> int:
        """BOOT_42's bits 29:20 (0x172 for GA102), as nova-core numbers chips."""
        return self.architecture << 4 | self.implementation


def _chips(
    family: Family, architecture: int, series: str, impls: tuple[int, ...]
) -> list[Chip]:
    """The chips ``series`` + implementation (``"GA10"`` + 2 is GA102)."""
    return [Chip(f"{series}{i}", architecture, i, family) for i in impls]


# The spec's Requirements: GA102/103/104/106/107, AD102/103/104/106/107, GB202/203/205/206/207.
CHIPS: tuple[Chip, ...] = (
    *_chips(AMPERE, 0x17, "GA10", (0x2, 0x3, 0x4, 0x6, 0x7)),
    *_chips(ADA, 0x19, "AD10", (0x2, 0x3, 0x4, 0x6, 0x7)),
    *_chips(BLACKWELL, 0x1B, "GB20", (0x2, 0x3, 0x5, 0x6, 0x7)),
)
_BY_ID = {c.chip_id: c for c in CHIPS}

# Chips whose family is known here but which the spec does not list: identify() refuses them.
# GH100 (nv_ref.h architecture 0x18, nv_arch.h GPU_IMPLEMENTATION_GH100 0x0) is H100/H200.
PENDING: tuple[Chip, ...] = (Chip("GH100", 0x18, 0x0, HOPPER),)
_PENDING_BY_ID = {c.chip_id: c for c in PENDING}

# Names of the chips this library does not boot, so that a refusal names them: nv_arch.h's
# GPU_IMPLEMENTATION_* by nv_ref.h's BOOT_42 architecture (Tegra parts left out).
OTHER_CHIPS: dict[int, str] = {
    0x117: "GM107", 0x118: "GM108",
    0x120: "GM200", 0x124: "GM204", 0x126: "GM206",
    0x130: "GP100", 0x132: "GP102", 0x134: "GP104", 0x136: "GP106", 0x137: "GP107",
    0x138: "GP108",
    0x140: "GV100",
    0x162: "TU102", 0x164: "TU104", 0x166: "TU106", 0x167: "TU117", 0x168: "TU116",
    0x170: "GA100", 0x17F: "GA102F",
    0x1A0: "GB100", 0x1A2: "GB102",
    0x1B4: "GB204",
}


def chip_id(boot42: int) -> int:
    """BOOT_42's chip id: architecture << 4 | implementation (bits 29:20)."""
    return field(boot42, NV_PMC_BOOT_42_ARCHITECTURE) << 4 | field(
        boot42, NV_PMC_BOOT_42_IMPLEMENTATION
    )


def chip_name(boot42: int) -> str | None:
    """The chip BOOT_42 names (``"GH100"``), or ``None`` where no table here has it."""
    cid = chip_id(boot42)
    known = _BY_ID.get(cid) or _PENDING_BY_ID.get(cid)
    return known.name if known is not None else OTHER_CHIPS.get(cid)


def describe(boot42: int) -> str:
    """The chip BOOT_42 names, for messages: ``"chip GH100 (boot42 0x180000a1)"``, or its
    numbers where it is unknown."""
    name = chip_name(boot42)
    if name is not None:
        return f"chip {name} (boot42 0x{boot42:08x})"
    cid = chip_id(boot42)
    return (
        f"an unknown chip (boot42 0x{boot42:08x}: architecture 0x{cid >> 4:x}, "
        f"implementation 0x{cid & 0xF:x})"
    )


class UnsupportedChip(RigError):
    """The GPU's chip is not one this library boots; the message names it."""


def supported() -> str:
    """The chips this library boots, for messages: ``"GA102, GA103, ... and GB207"``."""
    names = [c.name for c in CHIPS]
    return ", ".join(names[:-1]) + " and " + names[-1]


def identify(boot42: int) -> Chip:
    """The chip NV_PMC_BOOT_42 reading ``boot42`` names.

    Raises :class:`UnsupportedChip` naming the chip and its BOOT_42 value when it is not one of
    :data:`CHIPS`, as the spec's Requirements list them (a chip of :data:`PENDING` too: Hopper
    is outside that list, its family here only as data for the FSP boot Blackwell shares).
    """
    found = _BY_ID.get(chip_id(boot42))
    if found is None:
        raise UnsupportedChip(
            f"{describe(boot42)} is not one this library boots; "
            f"it boots {supported()}"
        )
    return found


def lookup(boot42: int) -> Chip | None:
    """The chip NV_PMC_BOOT_42 reading ``boot42`` names, of :data:`CHIPS` or :data:`PENDING`
    (whose boot is not built), or ``None``: for code that needs a chip's family whether or not
    :func:`identify` would boot it."""
    cid = chip_id(boot42)
    return _BY_ID.get(cid) or _PENDING_BY_ID.get(cid)


def wpr2_up(addr_hi: int) -> bool:
    """Whether NV_PFB_PRI_MMU_WPR2_ADDR_HI reading ``addr_hi`` says WPR2 is up (its upper
    bound nonzero, as kgspIsWpr2Up_TU102 tests it)."""
    return field(addr_hi, NV_PFB_PRI_MMU_WPR2_ADDR_HI_VAL) != 0
