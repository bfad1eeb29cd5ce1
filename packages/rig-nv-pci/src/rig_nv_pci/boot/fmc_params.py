"""GSP_FMC_BOOT_PARAMS: what a Hopper (GH100) boot tells the GSP's FMC, by way of the FSP.

On GH100 the host sends the FSP one chain-of-trust message whose NVDM_PAYLOAD_COT ends with
the bus address of a GSP_FMC_BOOT_PARAMS (``gspBootArgsSysmemOffset``, kfspSetupGspImages in
open-gpu-kernel-modules' src/nvidia/src/kernel/gpu/fsp/arch/hopper/kern_fsp_gh100.c); the FMC
reads from it where GspFwWprMeta lies (:func:`rig_nv_pci.firmware.layout.wpr_meta` with
:func:`rig_nv_pci.firmware.layout.fmc_sizes`: sizes and system-memory addresses only) and where the
LibOS arguments lie, whose address an Ampere boot puts in the GSP's mailboxes instead.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/boot-fmc_params.md."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from rig_edge import Misuse
from rig_nv_pci.firmware import layout
from rig_nv_pci.firmware.chips import GSP_RELEASE

# gspifpub.h: GSP_DMA_TARGET. _kgspMemdescToDmaTarget maps cached system memory to
# COHERENT_SYSTEM, uncached to NONCOHERENT_SYSTEM and FB to LOCAL_FB.
GSP_DMA_TARGET_LOCAL_FB = 0
GSP_DMA_TARGET_COHERENT_SYSTEM = 1
GSP_DMA_TARGET_NONCOHERENT_SYSTEM = 2
GSP_DMA_TARGETS = (0, 1, 2)

# (our name, NVIDIA's member path, struct format) in gspifpub.h's order; padding the compiler
# inserts for natural alignment is spelt out with a None name. 570.144:
_FIELDS_570: tuple[tuple[str | None, str, str], ...] = (
    ("regkeys", "initParams.regkeys", "I"),
    (None, "", "4x"),  # GSP_ACR_BOOT_GSP_RM_PARAMS holds an NvU64: 8-aligned
    ("wpr_meta_target", "bootGspRmParams.target", "I"),
    ("wpr_meta_size", "bootGspRmParams.gspRmDescSize", "I"),
    ("wpr_meta", "bootGspRmParams.gspRmDescOffset", "Q"),
    ("wpr_carveout_offset", "bootGspRmParams.wprCarveoutOffset", "Q"),
    ("wpr_carveout_size", "bootGspRmParams.wprCarveoutSize", "I"),
    ("is_gsp_rm_boot", "bootGspRmParams.bIsGspRmBoot", "B"),
    (None, "", "3x"),
    ("libos_args_target", "gspRmParams.target", "I"),
    (None, "", "4x"),
    ("libos_args", "gspRmParams.bootArgsOffset", "Q"),
    ("spdm_target", "gspSpdmParams.target", "I"),
    (None, "", "4x"),
    ("spdm_payload", "gspSpdmParams.payloadBufferOffset", "Q"),
    ("spdm_payload_size", "gspSpdmParams.payloadBufferSize", "I"),
    (None, "", "4x"),
)
# 580.105.08 appends GSP_RM_MEM_PARAMS (two NvU32: 4-aligned, at 80; the whole stays 8-aligned).
_FIELDS_580 = (
    *_FIELDS_570,
    ("flush_sysmem_addr_lo", "gspRmMemParams.flushSysmemAddrValLo", "I"),
    ("flush_sysmem_addr_hi", "gspRmMemParams.flushSysmemAddrValHi", "I"),
)

# Each release's layout, declared once.
FMC_BOOT_PARAMS_FIELDS: dict[str, tuple[tuple[str | None, str, str], ...]] = {
    "570.144": _FIELDS_570,
    "580.105.08": _FIELDS_580,
}
FMC_BOOT_PARAMS: dict[str, struct.Struct] = {
    release: struct.Struct("<" + "".join(f for _, _, f in fields))
    for release, fields in FMC_BOOT_PARAMS_FIELDS.items()
}
assert FMC_BOOT_PARAMS["570.144"].size == 80  # sizeof(GSP_FMC_BOOT_PARAMS), gcc, 570.144
assert FMC_BOOT_PARAMS["580.105.08"].size == 88  # with gspRmMemParams, 580.105.08


def _fields(release: str) -> tuple[tuple[str | None, str, str], ...]:
    try:
        return FMC_BOOT_PARAMS_FIELDS[release]
    except KeyError:
        raise Misuse(
            f"no GSP_FMC_BOOT_PARAMS layout is known for release {release!r} (known: "
            f"{', '.join(FMC_BOOT_PARAMS_FIELDS)})"
        ) from None


def fmc_boot_params_offsets(release: str = GSP_RELEASE) -> dict[str, int]:
    """NVIDIA's member path of each field (``"gspRmParams.bootArgsOffset"``) → its byte offset
    in ``release``'s GSP_FMC_BOOT_PARAMS."""
    out, at = {}, 0
    for name, nvidia, fmt in _fields(release):
        if name is not None:
            out[nvidia] = at
        at += struct.calcsize("<" + fmt)
    return out


@dataclass(frozen=True)
class FmcBootParams:
    """GSP_FMC_BOOT_PARAMS field by field; :meth:`pack` gives a release's bytes. The
    ``flush_sysmem_addr_*`` fields exist from 580 on and must be 0 for 570.144."""

    regkeys: int = 0
    wpr_meta_target: int = GSP_DMA_TARGET_LOCAL_FB
    wpr_meta_size: int = 0
    wpr_meta: int = 0
    wpr_carveout_offset: int = 0
    wpr_carveout_size: int = 0
    is_gsp_rm_boot: int = 0
    libos_args_target: int = GSP_DMA_TARGET_LOCAL_FB
    libos_args: int = 0
    spdm_target: int = GSP_DMA_TARGET_LOCAL_FB
    spdm_payload: int = 0
    spdm_payload_size: int = 0
    flush_sysmem_addr_lo: int = 0
    flush_sysmem_addr_hi: int = 0

    def pack(self, release: str = GSP_RELEASE) -> bytes:
        """The structure's bytes as ``release`` lays it out (80 for 570.144, 88 for
        580.105.08); raises :class:`rig_edge.Misuse` if a field does not fit, or the release
        has no flush address and one is set."""
        fields = _fields(release)
        names = {n for n, _, _ in fields if n is not None}
        for extra in ("flush_sysmem_addr_lo", "flush_sysmem_addr_hi"):
            if extra not in names and getattr(self, extra):
                raise Misuse(f"GSP_FMC_BOOT_PARAMS of {release} has no gspRmMemParams")
        values = [getattr(self, n) for n, _, _ in fields if n is not None]
        try:
            return FMC_BOOT_PARAMS[release].pack(*values)
        except struct.error as e:
            raise Misuse(f"GSP_FMC_BOOT_PARAMS: a field does not fit: {e}") from None

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview, release: str = GSP_RELEASE
               ) -> FmcBootParams:
        """The structure at the start of ``data``, laid out as ``release`` lays it out."""
        fields = _fields(release)
        names = [n for n, _, _ in fields if n is not None]
        values = FMC_BOOT_PARAMS[release].unpack_from(data)
        return cls(**dict(zip(names, values, strict=True)))


def _address(value: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 64:
        raise Misuse(f"the {what} is a nonzero 64-bit bus address, not {value!r}")
    return value


def fmc_boot_params(
    wpr_meta: int,
    libos_args: int,
    *,
    wpr_meta_target: int = GSP_DMA_TARGET_COHERENT_SYSTEM,
    libos_args_target: int = GSP_DMA_TARGET_COHERENT_SYSTEM,
    regkeys: int = 0,
    flush_sysmem_addr: int = 0,
) -> FmcBootParams:
    """GSP_FMC_BOOT_PARAMS for a first boot, as kgspSetupGspFmcArgs_GH100 fills it without
    Confidential Computing or NVLink proxy regkeys: ``bootGspRmParams`` names GspFwWprMeta
    (bus address ``wpr_meta``, 256 bytes, ``bIsGspRmBoot`` true, no WPR carveout: "no effect
    where the WPR can be allocated implicitly by ACR"), ``gspRmParams`` the LibOS
    arguments at ``libos_args``, SPDM nothing.

    Each aperture follows NVIDIA's rule, _kgspMemdescToDmaTarget: cached system memory is
    COHERENT_SYSTEM, uncached NONCOHERENT_SYSTEM. rig's DMA memory (rig_pci's alloc_dma) is
    write-back cached, so both default to COHERENT_SYSTEM, as tinygrad gives them. NVIDIA's
    NONCOHERENT for the LibOS arguments is of its own NV_MEMORY_UNCACHED buffer
    (kgspAllocBootArgs_TU102); nouveau and nova-core copy the target, not the memory.
    ``flush_sysmem_addr`` is 580's gspRmMemParams (0 unless needed; :meth:`FmcBootParams.pack`
    refuses it for 570.144).

    Raises :class:`rig_edge.Misuse` for an address that is not a nonzero 64-bit bus address or
    a target that is no GSP_DMA_TARGET.
    """
    for target, what in ((wpr_meta_target, "WPR metadata's"), (libos_args_target,
                                                                "LibOS arguments'")):
        if target not in GSP_DMA_TARGETS:
            raise Misuse(f"the {what} aperture is a GSP_DMA_TARGET (0, 1, 2), not {target!r}")
    if not 0 <= flush_sysmem_addr < 1 << 64:
        raise Misuse(f"the flush address 0x{flush_sysmem_addr:x} is no 64-bit address")
    return FmcBootParams(
        regkeys=regkeys,
        wpr_meta_target=wpr_meta_target,
        wpr_meta_size=layout.WPR_META.size,
        wpr_meta=_address(wpr_meta, "WPR metadata's address"),
        is_gsp_rm_boot=1,
        libos_args_target=libos_args_target,
        libos_args=_address(libos_args, "LibOS arguments' address"),
        flush_sysmem_addr_lo=flush_sysmem_addr & 0xFFFFFFFF,
        flush_sysmem_addr_hi=flush_sysmem_addr >> 32,
    )
