"""NVIDIA's GSP 570.144 firmware files, parsed: pure functions over their bytes.

The module's notes in full (NVIDIA's sources, formats, histories):
docs/rig-nv-pci-modules/firmware-fwimage.md."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

from rig_edge import RigError

Bytes = bytes | bytearray | memoryview


class FirmwareFormatError(RigError):
    """A firmware file is not laid out as its format says; the message names file and offset."""


BIN_MAGIC = 0x10DE  # NVFW_BIN_MAGIC
RISCV_DESC_SIZE = 84  # RM_RISCV_UCODE_DESC: 21 NvU32
HS_LOAD_HEADER_V2_SIZE = 36  # one app: os code, os data, num_apps, app code, app data
FMC_SECTION_FLAGS = 0xFFF00102  # SHF_MASKPROC | SHF_MASKOS | SHF_OS_NONCONFORMING | SHF_ALLOC
# The hash, signature and public key the FSP takes in NVDM_PAYLOAD_COT, by its version
# (open-gpu-kernel-modules 570.144, src/nvidia/inc/kernel/gpu/fsp/kern_fsp_cot_payload.h and the
# per-chip cotPayloadSignatureSize/cotPayloadPublicKeySize of g_kern_fsp_nvoc.c): version 1 on
# GH100, SHA-384 with RSA-3072 (the bindata archive's "ucode_hash" 48, "ucode_sig" 384,
# "ucode_pkey" 384 bytes in g_bindata_kgspGetBinArchiveGspRmFmcGfwProdSigned_GH100.c); version
# 2 on GB10x/GB20x, SHA-384 with ECDSA P-384 (a 96-byte signature, a 97-byte uncompressed point:
# nouveau's nvkm/subdev/fsp gb202 COT).
FMC_COT_SIZES: dict[int, dict[str, int]] = {
    1: {"hash": 48, "signature": 384, "publickey": 384},
    2: {"hash": 48, "signature": 96, "publickey": 97},
}
SHT_PROGBITS, SHT_STRTAB, SHT_NOBITS = 1, 3, 8
SHF_STRINGS = 0x20

# The chip families whose GSP signatures gsp-570.144.bin carries, by the chips rig boots
# (nv-firmware.h nv_firmware_chip_family_to_string).
FAMILIES = {"ga102": "ga10x", "ad102": "ad10x", "gb202": "gb20x"}


def fuse_version(register: int) -> int:
    """A ucode fuse register read from the GPU (NV_FUSE_OPT_FPF_<ENGINE>_UCODE<n>_VERSION) as
    a fuse version: its highest set bit plus one, 0 when none is set (ksec2/kgsp
    ReadUcodeFuseVersion_GA100)."""
    return (register & 0xFFFFFFFF).bit_length()


class _File:
    """Little-endian reads from a named file that name the file and offset when they fail."""

    def __init__(self, data: Bytes, name: str) -> None:
        self.view = memoryview(data).toreadonly().cast("B")
        self.name = name

    def fail(self, what: str, off: int) -> FirmwareFormatError:
        return FirmwareFormatError(f"{self.name}: {what} at offset 0x{off:x}")

    def need(self, off: int, n: int, what: str) -> None:
        if off < 0 or n < 0 or off + n > len(self.view):
            raise self.fail(f"{what} (0x{n:x} bytes) runs past the end of the file "
                            f"(0x{len(self.view):x} bytes)", off)

    def unpack(self, fmt: str, off: int, what: str) -> tuple[int, ...]:
        self.need(off, struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.view, off)

    def u32(self, off: int, what: str) -> int:
        return self.unpack("<I", off, what)[0]

    def slice(self, off: int, n: int, what: str) -> memoryview:
        self.need(off, n, what)
        return self.view[off:off + n]


# ---------------------------------------------------------------------------------------------
# ELF sections (the System V ABI's Elf32_Ehdr/Elf64_Ehdr and section headers; NVIDIA's
# LibosElf64SectionHeader)


@dataclass(frozen=True)
class ElfSection:
    name: str
    index: int
    type: int
    flags: int
    offset: int
    size: int
    info: int
    data: memoryview = field(repr=False, compare=False)


def elf_sections(data: Bytes, name: str, elf_class: int) -> tuple[ElfSection, ...]:
    """The sections of a little-endian ELF of ``elf_class`` (1: ELF32, 2: ELF64), each inside
    the file, with names from the section-name string table."""
    f = _File(data, name)
    f.need(0, 16, "the ELF identification")
    if bytes(f.view[:4]) != b"\x7fELF":
        raise f.fail(f"no ELF magic (found {bytes(f.view[:4]).hex()})", 0)
    if f.view[4] != elf_class or f.view[5] != 1:
        raise f.fail(f"ELF class {f.view[4]} data {f.view[5]}, not ELF{32 * elf_class} "
                     f"little-endian", 4)
    if elf_class == 2:
        (shoff,) = f.unpack("<Q", 0x28, "the ELF header's e_shoff")
        shentsize, shnum, shstrndx = f.unpack("<3H", 0x3A, "the ELF header's section fields")
        entry, want = "<IIQQQQIIQQ", 64
    else:
        (shoff,) = f.unpack("<I", 0x20, "the ELF header's e_shoff")
        shentsize, shnum, shstrndx = f.unpack("<3H", 0x2E, "the ELF header's section fields")
        entry, want = "<10I", 40
    if shentsize != want:
        raise f.fail(f"section header size {shentsize}, not {want}", 0x3A if elf_class == 2
                     else 0x2E)
    if shstrndx >= shnum:
        raise f.fail(f"section-name table index {shstrndx} of {shnum} sections", shoff)
    f.need(shoff, shnum * shentsize, f"the section header table ({shnum} entries)")
    raw = []
    for i in range(shnum):
        at = shoff + i * shentsize
        v = struct.unpack_from(entry, f.view, at)
        sh_name, sh_type, sh_flags, sh_off, sh_size, sh_info = v[0], v[1], v[2], v[4], v[5], v[7]
        if sh_type != SHT_NOBITS:
            f.need(sh_off, sh_size, f"section {i}'s data (section header at 0x{at:x})")
        raw.append((at, sh_name, sh_type, sh_flags, sh_off, sh_size, sh_info))
    names = raw[shstrndx]
    strtab = bytes(f.view[names[4]:names[4] + names[5]])
    out = []
    for i, (at, sh_name, sh_type, sh_flags, sh_off, sh_size, sh_info) in enumerate(raw):
        end = strtab.find(b"\0", sh_name)
        if sh_name >= len(strtab) or end < 0:
            raise f.fail(f"section {i}'s name offset {sh_name} lies outside the section-name "
                         f"table ({len(strtab)} bytes)", at)
        data_view = f.view[sh_off:sh_off + sh_size] if sh_type != SHT_NOBITS else f.view[:0]
        out.append(ElfSection(strtab[sh_name:end].decode("latin-1"), i, sh_type, sh_flags,
                              sh_off, sh_size, sh_info, data_view))
    return tuple(out)


def _section(sections: tuple[ElfSection, ...], wanted: str, name: str) -> ElfSection:
    found = next((s for s in sections if s.name == wanted), None)
    if found is None:
        have = ", ".join(s.name for s in sections if s.name) or "none"
        raise FirmwareFormatError(f"{name}: no section {wanted!r} (its sections: {have})")
    return found


# ---------------------------------------------------------------------------------------------
# gsp-570.144.bin


@dataclass(frozen=True)
class GspFirmware:
    """The GSP-RM ELF: its version, image and per-family signatures."""

    version: str
    image: ElfSection
    build_id: ElfSection | None
    signatures: dict[str, ElfSection] = field(compare=False)  # ".fwsignature_ga10x" -> ...

    def signature(self, family: str) -> ElfSection:
        """The signature section for ``family`` (``ga10x``, ``ad10x``, ``gb20x``, ...)."""
        wanted = ".fwsignature_" + family
        if wanted not in self.signatures:
            have = ", ".join(sorted(self.signatures)) or "none"
            raise FirmwareFormatError(f"GSP firmware has no section {wanted!r} (it has {have})")
        return self.signatures[wanted]


def parse_gsp(data: Bytes, name: str = "gsp-570.144.bin", version: str | None = "570.144"
              ) -> GspFirmware:
    """Parse the GSP-RM ELF; when ``version`` is given, ``.fwversion`` must be it, NUL-ended
    (_kgspFwContainerVerifyVersion)."""
    sections = elf_sections(data, name, 2)
    ver = _section(sections, ".fwversion", name)
    text = bytes(ver.data)
    if not text.endswith(b"\0") or len(text) > 64:
        raise FirmwareFormatError(f"{name}: .fwversion at offset 0x{ver.offset:x} is not a "
                                  f"NUL-ended version string ({text[:64]!r})")
    found = text[:-1].decode("latin-1")
    if version is not None and found != version:
        raise FirmwareFormatError(f"{name}: .fwversion at offset 0x{ver.offset:x} is {found!r},"
                                  f" not {version!r}")
    image = _section(sections, ".fwimage", name)
    if image.size == 0:
        raise FirmwareFormatError(f"{name}: .fwimage at offset 0x{image.offset:x} is empty")
    sigs = {s.name: s for s in sections if s.name.startswith(".fwsignature_")}
    build = next((s for s in sections if s.name == ".note.gnu.build-id"), None)
    return GspFirmware(found, image, build, sigs)


# ---------------------------------------------------------------------------------------------
# nvfw_bin_hdr


@dataclass(frozen=True)
class BinHeader:
    """nvfw_bin_hdr: magic 0x10de, version, size, header and data offsets, data size."""

    magic: int
    version: int
    size: int
    header_offset: int
    data_offset: int
    data_size: int


def _bin_header(f: _File) -> BinHeader:
    h = BinHeader(*f.unpack("<6I", 0, "nvfw_bin_hdr"))
    if h.magic != BIN_MAGIC:
        raise f.fail(f"nvfw_bin_hdr magic 0x{h.magic:x}, not 0x{BIN_MAGIC:x}", 0)
    f.need(h.data_offset, h.data_size, "the image (nvfw_bin_hdr data_offset/data_size)")
    return h


# ---------------------------------------------------------------------------------------------
# bootloader-570.144.bin

RISCV_FIELDS = (
    "version", "bootloader_offset", "bootloader_size", "bootloader_param_offset",
    "bootloader_param_size", "riscv_elf_offset", "riscv_elf_size", "app_version",
    "manifest_offset", "manifest_size", "monitor_data_offset", "monitor_data_size",
    "monitor_code_offset", "monitor_code_size", "is_monitor_enabled", "swbrom_code_offset",
    "swbrom_code_size", "swbrom_data_offset", "swbrom_data_size", "fb_reserved_size",
    "signed_as_code",
)


@dataclass(frozen=True)
class RiscvUcodeDesc:
    """RM_RISCV_UCODE_DESC (rmRiscvUcode.h); offsets are within the image."""

    version: int
    bootloader_offset: int
    bootloader_size: int
    bootloader_param_offset: int
    bootloader_param_size: int
    riscv_elf_offset: int
    riscv_elf_size: int
    app_version: int
    manifest_offset: int
    manifest_size: int
    monitor_data_offset: int
    monitor_data_size: int
    monitor_code_offset: int
    monitor_code_size: int
    is_monitor_enabled: int
    swbrom_code_offset: int
    swbrom_code_size: int
    swbrom_data_offset: int
    swbrom_data_size: int
    fb_reserved_size: int
    signed_as_code: int


@dataclass(frozen=True)
class Bootloader:
    """The GSP bootloader: its headers and the image (the RISC-V monitor, manifest, ...)."""

    header: BinHeader
    desc_offset: int
    desc: RiscvUcodeDesc
    image: memoryview = field(repr=False, compare=False)

    def part(self, what: str) -> memoryview:
        """A part of the image by the desc's name: ``monitor_code``, ``monitor_data``,
        ``manifest``, ``bootloader``, ``bootloader_param``, ``swbrom_code``, ..."""
        off = getattr(self.desc, what + "_offset")
        size = getattr(self.desc, what + "_size")
        assert isinstance(off, int) and isinstance(size, int)
        return self.image[off:off + size]


def parse_bootloader(data: Bytes, name: str = "bootloader-570.144.bin") -> Bootloader:
    """Parse nvfw_bin_hdr, RM_RISCV_UCODE_DESC and the image; every part the desc names
    must lie inside the image."""
    f = _File(data, name)
    h = _bin_header(f)
    desc = RiscvUcodeDesc(*f.unpack("<21I", h.header_offset, "RM_RISCV_UCODE_DESC"))
    if not 1 <= desc.version <= 5:
        raise f.fail(f"RM_RISCV_UCODE_DESC version {desc.version}, not 1 to 5", h.header_offset)
    for i, part in enumerate(RISCV_FIELDS):
        if part.endswith("_offset"):
            off, size = getattr(desc, part), getattr(desc, RISCV_FIELDS[i + 1])
            if size and off + size > h.data_size:
                raise f.fail(f"RM_RISCV_UCODE_DESC {part.removesuffix('_offset')} "
                             f"(0x{off:x} + 0x{size:x}) lies past the 0x{h.data_size:x}-byte "
                             f"image", h.header_offset + 4 * i)
    return Bootloader(h, h.header_offset, desc, f.slice(h.data_offset, h.data_size, "image"))


# ---------------------------------------------------------------------------------------------
# booter_load / booter_unload


@dataclass(frozen=True)
class HsHeaderV2:
    """nvfw_hs_header_v2 as stored: patch_loc, patch_sig and num_sig are file offsets of the
    values (see :class:`Booter` for the values)."""

    sig_prod_offset: int
    sig_prod_size: int
    patch_loc: int
    patch_sig: int
    meta_data_offset: int
    meta_data_size: int
    num_sig: int
    header_offset: int
    header_size: int


@dataclass(frozen=True)
class HsLoadHeaderV2:
    """nvfw_hs_load_header_v2 with its one app; offsets are within the image."""

    os_code_offset: int
    os_code_size: int
    os_data_offset: int
    os_data_size: int
    num_apps: int
    app_code_offset: int
    app_code_size: int
    app_data_offset: int
    app_data_size: int


@dataclass(frozen=True)
class Booter:
    """A booter (load or unload) for SEC2: headers, signatures and the image to patch.

    ``patch_location`` is where in the image a signature goes; ``signatures`` holds
    ``num_signatures`` of ``signature_size`` bytes each; ``fuse_ver``, ``engine_id`` and
    ``ucode_id`` are the metadata the SEC2 boot ROM is given.
    """

    header: BinHeader
    hs: HsHeaderV2
    load: HsLoadHeaderV2
    patch_location: int
    patch_signature: int
    num_signatures: int
    signature_size: int
    fuse_ver: int
    engine_id: int
    ucode_id: int
    signatures: memoryview = field(repr=False, compare=False)
    image: memoryview = field(repr=False, compare=False)

    @property
    def dmem_signature_offset(self) -> int:
        """Where the signature lies in DMEM (patch location less the OS data offset)."""
        return self.patch_location - self.load.os_data_offset

    def signature_index(self, fuse_version: int) -> int:
        """The signature for the SEC2 fuse version ``fuse_version`` (:func:`fuse_version`):
        the only one, or ``num_signatures - 1 - fuse_version``."""
        if self.num_signatures == 1:
            return 0
        if not 0 <= fuse_version < self.num_signatures:
            raise FirmwareFormatError(
                f"booter (ucode id {self.ucode_id}) has no signature for fuse version "
                f"{fuse_version}: it has {self.num_signatures}")
        return self.num_signatures - 1 - fuse_version

    def signature(self, fuse_version: int) -> bytes:
        i = self.signature_index(fuse_version) * self.signature_size
        return bytes(self.signatures[i:i + self.signature_size])

    def patched(self, fuse_version: int) -> bytes:
        """The image with the signature for ``fuse_version`` at :attr:`patch_location`."""
        out = bytearray(self.image)
        at = self.patch_location
        out[at:at + self.signature_size] = self.signature(fuse_version)
        return bytes(out)


def parse_booter(data: Bytes, name: str = "booter_load-570.144.bin") -> Booter:
    """Parse a booter's nvfw_bin_hdr, HS header v2, metadata, signatures and load header."""
    f = _File(data, name)
    h = _bin_header(f)
    hs = HsHeaderV2(*f.unpack("<9I", h.header_offset, "nvfw_hs_header_v2"))
    loc = f.u32(hs.patch_loc, "the signature patch location (hs patch_loc)")
    sig_base = f.u32(hs.patch_sig, "the signature base (hs patch_sig)")
    count = f.u32(hs.num_sig, "the signature count (hs num_sig)")
    if hs.meta_data_size < 12:
        raise f.fail(f"metadata of {hs.meta_data_size} bytes, not 12 (fuse_ver, engine_id, "
                     f"ucode_id)", hs.meta_data_offset)
    fuse_ver, engine_id, ucode_id = f.unpack("<3I", hs.meta_data_offset, "the metadata")
    if count == 0 or hs.sig_prod_size == 0 or hs.sig_prod_size % count:
        raise f.fail(f"{count} signatures in 0x{hs.sig_prod_size:x} bytes (sig_prod_size) do "
                     f"not divide evenly", hs.num_sig)
    size = hs.sig_prod_size // count
    sigs = f.slice(hs.sig_prod_offset + sig_base, hs.sig_prod_size, "the production signatures")
    if hs.header_size < HS_LOAD_HEADER_V2_SIZE:
        raise f.fail(f"load header of {hs.header_size} bytes, less than the "
                     f"{HS_LOAD_HEADER_V2_SIZE} of one app", hs.header_offset)
    load = HsLoadHeaderV2(*f.unpack("<9I", hs.header_offset, "nvfw_hs_load_header_v2"))
    if load.num_apps != 1:
        raise f.fail(f"load header with {load.num_apps} apps, not 1", hs.header_offset + 16)
    if loc + size >= h.data_size:  # s_patchBooterUcodeSignature: image - loc > size
        raise f.fail(f"signature patch location 0x{loc:x} (+0x{size:x}) lies past the "
                     f"0x{h.data_size:x}-byte image", hs.patch_loc)
    for what, off, n, at in (("OS code", load.os_code_offset, load.os_code_size, 0),
                             ("OS data", load.os_data_offset, load.os_data_size, 8),
                             ("app code", load.app_code_offset, load.app_code_size, 20)):
        if off + n > h.data_size:
            raise f.fail(f"{what} (0x{off:x} + 0x{n:x}) lies past the 0x{h.data_size:x}-byte "
                         f"image", hs.header_offset + at)
    if not load.os_data_offset <= loc < load.os_data_offset + load.os_data_size:
        raise f.fail(f"signature patch location 0x{loc:x} lies outside the OS data "
                     f"(0x{load.os_data_offset:x} + 0x{load.os_data_size:x})", hs.patch_loc)
    image = f.slice(h.data_offset, h.data_size, "the image")
    return Booter(h, hs, load, loc, sig_base, count, size, fuse_ver, engine_id, ucode_id, sigs,
                  image)


# ---------------------------------------------------------------------------------------------
# fmc-570.144.bin (Blackwell)


@dataclass(frozen=True)
class Fmc:
    """The GSP's first-mutable-code image and what the FSP checks it with; ``cot_version`` is
    the NVDM_PAYLOAD_COT version whose sizes the hash, signature and public key fit
    (:data:`FMC_COT_SIZES`: 1 for GH100's FMC, 2 for Blackwell's)."""

    image: ElfSection
    hash: ElfSection
    signature: ElfSection
    public_key: ElfSection
    cot_version: int


def parse_fmc(data: Bytes, name: str = "fmc-570.144.bin", cot_version: int | None = None
              ) -> Fmc:
    """Parse the FMC ELF32: every section but the name table PROGBITS with the FMC flags,
    inside the file past the section headers, matching its CRC32 where sh_info holds one;
    hash, signature and publickey of the sizes of a COT payload version (of ``cot_version``
    when given: a family's :attr:`rig_nv_pci.firmware.chips.Family.cot_version`)."""
    sections = elf_sections(data, name, 1)
    f = _File(data, name)
    (shoff,) = f.unpack("<I", 0x20, "e_shoff")
    first = shoff + 40 * len(sections)
    (shstrndx,) = f.unpack("<H", 0x32, "e_shstrndx")
    for s in sections[1:]:
        want = (SHT_STRTAB, SHF_STRINGS) if s.index == shstrndx else (SHT_PROGBITS,
                                                                      FMC_SECTION_FLAGS)
        if (s.type, s.flags) != want:
            raise f.fail(f"section {s.name!r} has type {s.type} flags 0x{s.flags:x}, not "
                         f"{want[0]} 0x{want[1]:x}", shoff + 40 * s.index)
        if s.offset < first:
            raise f.fail(f"section {s.name!r} overlaps the section headers", s.offset)
        if s.info and zlib.crc32(s.data) != s.info:
            raise f.fail(f"section {s.name!r} has CRC32 0x{zlib.crc32(s.data):08x}, not the "
                         f"0x{s.info:08x} its header records", s.offset)
    parts = {n: _section(sections, n, name) for n in ("image", "hash", "signature", "publickey")}
    keys = ("hash", "signature", "publickey")
    got = ", ".join(str(parts[n].size) for n in keys)
    fits = [v for v, want in FMC_COT_SIZES.items() if all(parts[n].size == want[n] for n in keys)]
    if not fits:
        takes = "; ".join(f"version {v} {', '.join(str(w[n]) for n in keys)}"
                          for v, w in FMC_COT_SIZES.items())
        raise f.fail(f"sections hash, signature, publickey of {got} bytes fit no COT payload "
                     f"({takes})", parts["hash"].offset)
    if cot_version is not None and fits[0] != cot_version:
        raise f.fail(f"sections hash, signature, publickey of {got} bytes are COT version "
                     f"{fits[0]}'s, not the version {cot_version} this FSP takes",
                     parts["hash"].offset)
    return Fmc(parts["image"], parts["hash"], parts["signature"], parts["publickey"], fits[0])
