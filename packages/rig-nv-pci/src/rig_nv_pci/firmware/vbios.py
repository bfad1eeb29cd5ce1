"""The VBIOS of an Ampere or Ada GPU as read through the PROM window, parsed down to FWSEC.

Pure functions over bytes. :func:`parse` walks the expansion-ROM images, scans for the BIT
header (signature and checksum), follows the falcon data token to the ucode table, takes the
FWSEC_PROD entry's v3 descriptor and finds the DMEM mapper whose init_cmd and command buffer
a boot patches for FRTS (:meth:`Fwsec.frts_image`). Layouts follow open-gpu-kernel-modules
570.144: platform/pci_exp_table.h (ROM header, PCIR, NPDE), turing/tu102/dev_bus.h (IFR),
gsp/arch/turing/kernel_gsp_vbios_tu102.c (image walk, expansion-ROM offset),
gsp/kernel_gsp_fwsec.c (BIT, tokens, falcon data, ucode table, FALCON_UCODE_DESC_V3) and
gsp/arch/turing/kernel_gsp_frts_tu102.c (interface table, DMEM mapper v3, FWSECLIC_FRTS_CMD,
signature by fuse version); nova-core's vbios.rs and firmware/fwsec.rs agree. Offsets are
from the start of the bytes given, unless named ``*_in_ucode`` (from :attr:`Fwsec.ucode`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rig_edge import Misuse, RigError


class VbiosError(RigError):
    """The VBIOS lacks what a boot needs; the message names what is missing and where."""


# pci_exp_table.h
ROM_SIGNATURES = (0xAA55, 0x4E56, 0xBB77)  # PCI_EXP_ROM_SIGNATURE, _NV ("VN"), _NV2
PCIR_SIGNATURES = (b"PCIR", b"NPDS", b"RGIS")  # PCI_DATA_STRUCT_SIGNATURE(_NV, _NV2)
NPDE_SIGNATURE = b"NPDE"  # NV_PCI_DATA_EXT_SIG
NPDE_REVISIONS = (0x100, 0x101)  # NV_PCI_DATA_EXT_REV_10, _11
ROM_BLOCK = 512  # PCI_ROM_IMAGE_BLOCK_SIZE
LAST_IMAGE = 0x80  # PCI_LAST_IMAGE
MAX_VBIOS = 0x100000  # s_getBaseBiosMaxSize_TU102: 1 MiB
# kernel_gsp_vbios_tu102.c: NV_BCRT_HASH_INFO_BASE_CODE_TYPE_VBIOS_BASE / _EXT
CODE_TYPE_BASE = 0x00
CODE_TYPE_EXT = 0xE0
# dev_bus.h NV_PBUS_IFR_FMT_FIXED0_SIGNATURE_VALUE 0x4947564E, and the ROM directory "RFRD"
IFR_SIGNATURE = b"NVGI"
ROM_DIRECTORY = b"RFRD"

# kernel_gsp_fwsec.c
BIT_ID = 0xB8FF
BIT_SIGNATURE = b"BIT\0"
BIT_HEADER_SIZE = 12  # BIT_HEADER_V1_00: 1w1d1w4b
TOKEN_BIOSDATA = 0x42  # 'B'
TOKEN_FALCON_DATA = 0x70  # 'p'
APPID_FIRMWARE_SEC_LIC = 0x05
APPID_FWSEC_DBG = 0x45
APPID_FWSEC_PROD = 0x85
DESC_V3_SIZE = 44  # FALCON_UCODE_DESC_V3_SIZE_44
SIGNATURE_SIZE = 384  # BCRT30_RSA3K_SIG_SIZE
UCODE_ALIGN = 256

# kernel_gsp_frts_tu102.c
APPIF_ID_DMEMMAPPER = 0x4
DMEMMAPPER_V3_SIZE = 64
DMEMMAPPER_INIT_CMD = 44  # offset of init_cmd in FALCON_APPLICATION_INTERFACE_DMEM_MAPPER_V3
CMD_FRTS = 0x15
CMD_SB = 0x19
FRTS_SIZE = 0x100000  # NV_PGC6_AON_FRTS_INPUT_WPR_SIZE_..._1MB_IN_4K (0x100) * 4 KiB
FRTS_MEDIA_FB = 2  # FWSECLIC_FRTS_REGION_MEDIA_FB
READ_VBIOS_FLAGS = 2  # FWSECLIC_READ_VBIOS_STRUCT_FLAGS


Bytes = bytes | bytearray | memoryview


class _Reader:
    """Little-endian reads from the VBIOS that name what they read when it runs short."""

    def __init__(self, data: Bytes) -> None:
        self.data = bytes(data)

    def need(self, off: int, n: int, what: str) -> None:
        if off < 0 or off + n > len(self.data):
            raise VbiosError(f"VBIOS is too short for {what} at 0x{off:x} "
                             f"(0x{n:x} bytes; the VBIOS read is 0x{len(self.data):x} bytes)")

    def unpack(self, fmt: str, off: int, what: str) -> tuple[int, ...]:
        self.need(off, struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.data, off)

    def u16(self, off: int, what: str) -> int:
        return self.unpack("<H", off, what)[0]

    def u32(self, off: int, what: str) -> int:
        return self.unpack("<I", off, what)[0]


@dataclass(frozen=True)
class RomImage:
    """One PCI expansion-ROM image: its ROM header, PCI data structure and NVIDIA extension."""

    offset: int
    size: int  # bytes, from the NPDE's sub-image length where there is one, else the PCIR's
    code_type: int  # 0x00 PC-AT (base), 0x03 EFI, 0x70 NBSI, 0xE0 NVIDIA extended (FWSEC)
    last: bool
    rom_signature: int
    pcir_offset: int
    pcir_signature: bytes
    vendor_id: int
    device_id: int
    npde_offset: int | None


@dataclass(frozen=True)
class BitToken:
    """A BIT token; ``data_pointer`` is from the start of the VBIOS image (:attr:`Vbios.start`)."""

    offset: int
    id: int
    data_version: int
    data_size: int
    data_pointer: int


@dataclass(frozen=True)
class BitTable:
    """The BIT header (BIT_HEADER_V1_00) and its tokens."""

    offset: int
    bcd_version: int
    header_size: int
    token_size: int
    tokens: tuple[BitToken, ...]

    def token(self, token_id: int) -> BitToken | None:
        """The first token with id ``token_id``, or ``None``."""
        return next((t for t in self.tokens if t.id == token_id), None)


@dataclass(frozen=True)
class UcodeEntry:
    """FALCON_UCODE_TABLE_ENTRY_V1; ``desc_pointer`` is as stored (before the ROM offset)."""

    offset: int
    application_id: int
    target_id: int
    desc_pointer: int


@dataclass(frozen=True)
class FalconUcodeDescV3:
    """FALCON_UCODE_DESC_V3 (kernel_gsp_fwsec.c); ``size`` is the header's, signatures included."""

    offset: int
    version: int
    size: int
    stored_size: int
    pkc_data_offset: int
    interface_offset: int
    imem_phys_base: int
    imem_load_size: int
    imem_virt_base: int
    dmem_phys_base: int
    dmem_load_size: int
    engine_id_mask: int
    ucode_id: int
    signature_count: int
    signature_versions: int


@dataclass(frozen=True)
class DmemMapper:
    """FALCON_APPLICATION_INTERFACE_DMEM_MAPPER_V3; ``offset`` is within the ucode's DMEM."""

    offset: int
    signature: int
    version: int
    size: int
    cmd_in_buffer_offset: int
    cmd_in_buffer_size: int
    cmd_out_buffer_offset: int
    cmd_out_buffer_size: int
    nvf_img_data_buffer_offset: int
    nvf_img_data_buffer_size: int
    printf_buffer_hdr: int
    ucode_build_time_stamp: int
    ucode_signature: int
    init_cmd: int
    ucode_feature: int
    ucode_cmd_mask0: int
    ucode_cmd_mask1: int
    multi_tgt_tbl: int


@dataclass(frozen=True)
class Fwsec:
    """The FWSEC ucode: its table entry, descriptor, signatures, image and DMEM mapper.

    ``ucode`` is the image the GSP falcon loads, StoredSize rounded up to 256 bytes as NVIDIA
    loads it: IMEM from 0, DMEM from ``desc.imem_load_size``.
    """

    entry: UcodeEntry
    desc: FalconUcodeDescV3
    ucode_offset: int
    ucode: bytes = field(repr=False)
    signatures: bytes = field(repr=False)
    interface_offset_in_ucode: int
    dmem_mapper: DmemMapper

    @property
    def dmem_offset_in_ucode(self) -> int:
        return self.desc.imem_load_size

    @property
    def signature_offset_in_ucode(self) -> int:
        """Where the signature for the fuse version goes (PKCDataOffset within DMEM)."""
        return self.desc.imem_load_size + self.desc.pkc_data_offset

    @property
    def init_cmd_offset_in_ucode(self) -> int:
        """Where the command to run (FRTS 0x15, SB 0x19) is written: the mapper's init_cmd."""
        return self.desc.imem_load_size + self.dmem_mapper.offset + DMEMMAPPER_INIT_CMD

    @property
    def command_offset_in_ucode(self) -> int:
        """Where the command's argument (:func:`frts_command`) is written."""
        return self.desc.imem_load_size + self.dmem_mapper.cmd_in_buffer_offset

    def signature_index(self, fuse_version: int) -> int:
        """The index of the signature for ``fuse_version`` (the falcon's fuse, as
        :func:`rig_nv_pci.firmware.fwimage.fuse_version` reads it): one signature per bit set in
        SignatureVersions, in bit order. Raises :class:`VbiosError` if none is for it."""
        versions = self.desc.signature_versions
        if not 0 <= fuse_version < 16 or not versions >> fuse_version & 1:
            raise VbiosError(f"FWSEC (VBIOS 0x{self.desc.offset:x}) has no signature for fuse "
                             f"version {fuse_version} (signature versions 0x{versions:04x})")
        index = (versions & ((1 << fuse_version) - 1)).bit_count()
        if (index + 1) * SIGNATURE_SIZE > len(self.signatures):
            raise VbiosError(f"FWSEC's signature {index} for fuse version {fuse_version} lies past "
                             f"its 0x{len(self.signatures):x} bytes of signatures (VBIOS "
                             f"0x{self.desc.offset + DESC_V3_SIZE:x})")
        return index

    def signature(self, fuse_version: int) -> bytes:
        """The RSA-3K signature for ``fuse_version``."""
        i = self.signature_index(fuse_version) * SIGNATURE_SIZE
        return self.signatures[i:i + SIGNATURE_SIZE]

    def patched(self, command: int, argument: bytes, fuse_version: int) -> bytes:
        """The ucode with ``command`` in the mapper's init_cmd, ``argument`` in its command
        buffer and the signature for ``fuse_version`` at PKCDataOffset."""
        dmem = self.desc.imem_load_size
        start = self.dmem_mapper.cmd_in_buffer_offset
        if start + len(argument) > self.desc.dmem_load_size:
            raise VbiosError(f"FWSEC's command buffer at DMEM 0x{start:x} cannot hold a "
                             f"0x{len(argument):x}-byte command inside its "
                             f"0x{self.desc.dmem_load_size:x} bytes of DMEM")
        out = bytearray(self.ucode)
        struct.pack_into("<I", out, self.init_cmd_offset_in_ucode, command)
        out[dmem + start:dmem + start + len(argument)] = argument
        sig = self.signature_offset_in_ucode
        out[sig:sig + SIGNATURE_SIZE] = self.signature(fuse_version)
        return bytes(out)

    def frts_image(self, frts_offset: int, fuse_version: int, frts_size: int = FRTS_SIZE) -> bytes:
        """The ucode patched to run FWSEC-FRTS: WPR2 with the FRTS region at ``frts_offset``
        (bytes into FB, 4 KiB aligned) of ``frts_size`` bytes."""
        return self.patched(CMD_FRTS, frts_command(frts_offset, frts_size), fuse_version)

    def sb_image(self, fuse_version: int) -> bytes:
        """The ucode patched to run FWSEC-SB (which a stop runs before booter_unload)."""
        return self.patched(CMD_SB, read_vbios_desc(), fuse_version)


@dataclass(frozen=True)
class Vbios:
    """What :func:`parse` found. ``start`` is where the first ROM image lies (after an IFR
    header, if any); BIT pointers count from it."""

    start: int
    size: int
    images: tuple[RomImage, ...]
    expansion_rom_offset: int
    bit: BitTable
    version: int | None  # BIOSDATA's Version << 8 | OemVersion, as NVIDIA combines them
    ucode_table_offset: int
    ucode_entries: tuple[UcodeEntry, ...]
    fwsec: Fwsec


def read_vbios_desc() -> bytes:
    """FWSECLIC_READ_VBIOS_DESC as NVIDIA fills it: version 1, size 24, no image, flags 2."""
    return struct.pack("<IIQII", 1, 24, 0, 0, READ_VBIOS_FLAGS)


def frts_command(frts_offset: int, frts_size: int = FRTS_SIZE) -> bytes:
    """FWSECLIC_FRTS_CMD (44 bytes, packed as nova-core writes it): the read-VBIOS
    descriptor, then the FRTS region (version 1, size 20, offset and size in 4 KiB, in FB).

    Raises :class:`rig_edge.Misuse` if the offset or size is not 4 KiB aligned or too large.
    """
    if frts_offset <= 0 or frts_offset % 4096 or frts_offset >> 12 >= 1 << 32:
        raise Misuse(f"FRTS offset 0x{frts_offset:x} is not a 4 KiB-aligned FB offset")
    if frts_size <= 0 or frts_size % 4096 or frts_size >> 12 >= 1 << 32:
        raise Misuse(f"FRTS size 0x{frts_size:x} is not a positive multiple of 4 KiB")
    region = struct.pack("<5I", 1, 20, frts_offset >> 12, frts_size >> 12, FRTS_MEDIA_FB)
    return read_vbios_desc() + region


def _rom_start(r: _Reader) -> int:
    """Where the first ROM image lies: 0, or past the IFR header (kernel_gsp_vbios_tu102.c,
    s_romImgFindPciHeader_TU102, IFR versions 1 to 3)."""
    if r.u16(0, "the ROM signature") in ROM_SIGNATURES:
        return 0
    if r.data[:4] != IFR_SIGNATURE:
        raise VbiosError(f"VBIOS has no PCI expansion ROM signature (0xAA55) at 0 and no IFR "
                         f"header (NVGI): it begins {r.data[:4].hex()}")
    fixed1 = r.u32(4, "the IFR header's FIXED1")
    version = fixed1 >> 8 & 0xFF
    if version in (1, 2):
        start = r.u32((fixed1 >> 16 & 0x7FFF) + 4, "the IFR's image offset")
    elif version == 3:
        flash_status = r.u32(r.u32(8, "the IFR's FIXED2") & 0xFFFFF, "the IFR flash status")
        directory = flash_status + 4096
        r.need(directory, 12, "the ROM directory")
        if r.data[directory:directory + 4] != ROM_DIRECTORY:
            raise VbiosError(f"VBIOS's IFR v3 has no ROM directory (RFRD) at 0x{directory:x}")
        start = r.u32(directory + 8, "the ROM directory's image offset")
    else:
        raise VbiosError(f"VBIOS's IFR header version {version} is not 1, 2 or 3")
    if start % 4 or r.u16(start, "the ROM signature after the IFR") not in ROM_SIGNATURES:
        raise VbiosError(f"VBIOS's IFR header points at 0x{start:x}, where no ROM image begins")
    return start


def rom_images(data: Bytes) -> tuple[RomImage, ...]:
    """The expansion-ROM images from :func:`rom_start` to the one marked last, as
    s_locateExpansionRoms walks them (the NPDE's sub-image length and last-image flag win)."""
    return _rom_images(_Reader(data))


def _rom_images(r: _Reader) -> tuple[RomImage, ...]:
    start = _rom_start(r)
    images: list[RomImage] = []
    off = start
    while True:
        n = len(images)
        if off - start >= MAX_VBIOS:
            raise VbiosError(f"VBIOS has no last ROM image within 1 MiB of 0x{start:x}")
        sig = r.u16(off, f"ROM image {n}'s signature")
        if sig not in ROM_SIGNATURES:
            raise VbiosError(f"VBIOS ROM image {n} at 0x{off:x} has signature 0x{sig:04x}, "
                             "not 0xAA55")
        pcir = off + r.u16(off + 0x18, f"ROM image {n}'s PCI data structure pointer")
        r.need(pcir, 0x18, f"ROM image {n}'s PCI data structure")
        pcir_sig = r.data[pcir:pcir + 4]
        if pcir_sig not in PCIR_SIGNATURES:
            raise VbiosError(f"VBIOS ROM image {n} at 0x{off:x} has no PCI data structure (PCIR) "
                             f"at 0x{pcir:x}: found {pcir_sig!r}")
        vendor, device, _, struct_len, blocks = struct.unpack_from("<4H4xH", r.data, pcir + 4)
        code_type, last = r.data[pcir + 0x14], bool(r.data[pcir + 0x15] & LAST_IMAGE)
        # The NPDE follows the PCIR, 16-byte aligned (counted from the start of the read).
        at = (pcir + struct_len + 0xF) & ~0xF
        npde = None
        if r.data[at:at + 4] == NPDE_SIGNATURE and len(r.data) >= at + 0xA:
            rev, ext_len, sub = struct.unpack_from("<3H", r.data, at + 4)
            if rev in NPDE_REVISIONS:
                npde = at
                if ext_len >= 0xB:
                    last = bool(r.unpack("<B", at + 0xA, "the NPDE's last image")[0] & LAST_IMAGE)
                elif sub < blocks:
                    last = False
                blocks = sub
        if blocks == 0:
            raise VbiosError(f"VBIOS ROM image {n} at 0x{off:x} has length 0")
        size = blocks * ROM_BLOCK
        r.need(off, size, f"ROM image {n} (0x{size:x} bytes)")
        images.append(RomImage(off, size, code_type, last, sig, pcir, pcir_sig, vendor, device,
                               npde))
        if last:
            break
        off += size
    if off + images[-1].size - start > MAX_VBIOS:
        raise VbiosError(f"VBIOS's ROM images span more than 1 MiB from 0x{start:x}")
    return tuple(images)


def expansion_rom_offset(images: tuple[RomImage, ...]) -> int:
    """What the falcon ucode table's pointers add (s_locateExpansionRoms): the offset of the
    first extended image (0xE0) less the size of the first base image (0x00), or 0."""
    start = images[0].offset
    ext = next((i.offset - start for i in images if i.code_type == CODE_TYPE_EXT), 0)
    base = next((i.size for i in images if i.code_type == CODE_TYPE_BASE), 0)
    return ext - base if ext > 0 and base > 0 else 0


def find_bit(data: Bytes, start: int = 0, end: int | None = None) -> BitTable:
    """The first BIT header in ``data[start:end]`` whose header bytes sum to 0 mod 256
    (s_vbiosFindBitHeader), with its tokens."""
    return _find_bit(_Reader(data), start, end)


def _find_bit(r: _Reader, start: int, end: int | None) -> BitTable:
    end = len(r.data) if end is None else end
    pattern = BIT_ID.to_bytes(2, "little") + BIT_SIGNATURE
    at = r.data.find(pattern, start, end)
    while at >= 0:
        header_size = r.data[at + 8] if at + 9 <= end else 0
        if header_size >= BIT_HEADER_SIZE and at + header_size <= end \
                and sum(r.data[at:at + header_size]) & 0xFF == 0:
            break
        at = r.data.find(pattern, at + 1, end)
    else:
        raise VbiosError(f"VBIOS has no BIT header (0xB8FF 'BIT\\0' with a zero checksum) in "
                         f"0x{start:x}..0x{end:x}")
    bcd, header_size, token_size, count = struct.unpack_from("<H3B", r.data, at + 6)
    if token_size < 6:
        raise VbiosError(f"VBIOS's BIT at 0x{at:x} has tokens of {token_size} bytes (< 6)")
    fmt = "<BBHI" if token_size >= 8 else "<BBHH"
    tokens = []
    for i in range(count):
        off = at + header_size + i * token_size
        tid, ver, size, ptr = r.unpack(fmt, off, f"BIT token {i} of {count}")
        tokens.append(BitToken(off, tid, ver, size, ptr))
    return BitTable(at, bcd, header_size, token_size, tuple(tokens))


def parse(data: Bytes, *, application_id: int = APPID_FWSEC_PROD) -> Vbios:
    """Parse the VBIOS read through the PROM window down to its FWSEC (the entry with
    ``application_id``, FWSEC_PROD by default, or FIRMWARE_SEC_LIC as NVIDIA also takes).

    Raises :class:`VbiosError` naming what is missing and where.
    """
    r = _Reader(data)
    images = _rom_images(r)
    start = images[0].offset
    end = images[-1].offset + images[-1].size
    ext = expansion_rom_offset(images)
    bit = _find_bit(r, start, end)
    version = None
    biosdata = bit.token(TOKEN_BIOSDATA)
    if biosdata is not None and biosdata.data_version in (1, 2) and biosdata.data_size > 5:
        v, oem = r.unpack("<IB", start + biosdata.data_pointer, "the BIOSDATA token's data")
        version = v << 8 | oem
    falcon = [t for t in bit.tokens if t.id == TOKEN_FALCON_DATA]
    if not falcon:
        raise VbiosError(f"VBIOS's BIT at 0x{bit.offset:x} has no falcon data token ('p')")
    t = next((t for t in falcon if t.data_version == 2 and t.data_size >= 4), falcon[0])
    if t.data_version != 2 or t.data_size < 4:
        raise VbiosError(f"VBIOS's falcon data token at 0x{t.offset:x} is version "
                         f"{t.data_version} of {t.data_size} bytes, not version 2 of at least 4")
    table = start + ext + r.u32(start + t.data_pointer, "the falcon data (ucode table pointer)")
    ver, hsize, esize, count = r.unpack("<4B", table, "the falcon ucode table header")
    if ver != 1 or hsize < 6 or esize < 6:
        raise VbiosError(f"VBIOS's falcon ucode table at 0x{table:x} is version {ver} with a "
                         f"{hsize}-byte header and {esize}-byte entries, not version 1 with at "
                          "least 6 and 6")
    entries = []
    for i in range(count):
        off = table + hsize + i * esize
        app, target, ptr = r.unpack("<BBI", off, f"falcon ucode table entry {i} of {count}")
        entries.append(UcodeEntry(off, app, target, ptr))
    fwsec = _fwsec(r, start, end, ext, entries, application_id, table)
    return Vbios(start, end - start, images, ext, bit, version, table, tuple(entries), fwsec)


def _fwsec(r: _Reader, start: int, end: int, ext: int, entries: list[UcodeEntry],
           application_id: int, table: int) -> Fwsec:
    wanted = [e for e in entries if e.application_id in (application_id, APPID_FIRMWARE_SEC_LIC)]
    if not wanted:
        ids = ", ".join(f"0x{e.application_id:02x}" for e in entries) or "none"
        raise VbiosError(f"VBIOS's falcon ucode table at 0x{table:x} has no FWSEC entry "
                         f"(application id 0x{application_id:02x}); its entries are {ids}")
    refusals = []
    for entry in wanted:
        at = start + ext + entry.desc_pointer
        vdesc = r.u32(at, f"the FWSEC descriptor header (entry at 0x{entry.offset:x})")
        version, size = vdesc >> 8 & 0xFF, vdesc >> 16
        if not vdesc & 1:
            refusals.append(f"the descriptor at 0x{at:x} has no version")
        elif version != 3 or size < DESC_V3_SIZE:
            refusals.append(f"the descriptor at 0x{at:x} is version {version} of {size} bytes, "
                            f"not version 3 of at least {DESC_V3_SIZE}")
        else:
            return _fwsec_v3(r, entry, at, size, end)
    raise VbiosError("VBIOS lacks a FWSEC this library runs: " + "; ".join(refusals))


def _fwsec_v3(r: _Reader, entry: UcodeEntry, at: int, size: int, end: int) -> Fwsec:
    f = r.unpack("<9IHBBHH", at, "the FWSEC v3 descriptor")
    desc = FalconUcodeDescV3(at, 3, size, *f[1:9], *f[9:13])
    if desc.signature_count * SIGNATURE_SIZE > size - DESC_V3_SIZE:
        raise VbiosError(f"FWSEC descriptor at 0x{at:x} counts {desc.signature_count} signatures "
                         f"but holds 0x{size - DESC_V3_SIZE:x} bytes of them")
    ucode_at = at + size
    length = -(-desc.stored_size // UCODE_ALIGN) * UCODE_ALIGN
    if ucode_at + length > end:
        raise VbiosError(f"FWSEC ucode at 0x{ucode_at:x} (StoredSize 0x{desc.stored_size:x}, "
                         f"0x{length:x} loaded) runs past the VBIOS's images, which end at "
                         f"0x{end:x}")
    imem, dmem = desc.imem_load_size, desc.dmem_load_size
    for what, limit in (("IMEMLoadSize + 1", imem + 1),
                        ("IMEMLoadSize + DMEMLoadSize", imem + dmem),
                        ("IMEMLoadSize + PKCDataOffset + 384 (its signature)",
                         imem + desc.pkc_data_offset + SIGNATURE_SIZE)):
        if limit > length:
            raise VbiosError(f"FWSEC descriptor at 0x{at:x}: {what} = 0x{limit:x} lies past its "
                             f"0x{length:x}-byte ucode")
    ucode = r.data[ucode_at:ucode_at + length]
    dmem_bytes = ucode[imem:imem + dmem]
    mapper = _dmem_mapper(dmem_bytes, desc.interface_offset, ucode_at + imem)
    signatures = r.data[at + DESC_V3_SIZE:at + size]
    return Fwsec(entry, desc, ucode_at, ucode, signatures, imem + desc.interface_offset, mapper)


def _dmem_mapper(dmem: bytes, interface: int, where: int) -> DmemMapper:
    """The DMEM mapper that the application interface table at DMEM ``interface`` names
    (s_vbiosPatchInterfaceData; nova-core's patch_command reads the header's sizes)."""
    if interface + 4 > len(dmem):
        raise VbiosError(f"FWSEC's application interface table at DMEM 0x{interface:x} (VBIOS "
                         f"0x{where + interface:x}) lies past its 0x{len(dmem):x} bytes of DMEM")
    version, hsize, esize, count = dmem[interface:interface + 4]
    if version != 1 or hsize < 4 or esize < 8:
        raise VbiosError(f"FWSEC's application interface table at VBIOS 0x{where + interface:x} is "
                         f"version {version} with a {hsize}-byte header and {esize}-byte entries, "
                          "not version 1")
    for i in range(count):
        off = interface + hsize + i * esize
        if off + 8 > len(dmem):
            raise VbiosError(f"FWSEC's application interface entry {i} of {count} at VBIOS "
                             f"0x{where + off:x} lies past its DMEM")
        app_id, mapper = struct.unpack_from("<II", dmem, off)
        if app_id != APPIF_ID_DMEMMAPPER:
            continue
        if mapper + DMEMMAPPER_V3_SIZE > len(dmem):
            raise VbiosError(f"FWSEC's DMEM mapper at DMEM 0x{mapper:x} (VBIOS "
                             f"0x{where + mapper:x}) lies past its 0x{len(dmem):x} bytes of DMEM")
        fields = struct.unpack_from("<IHH14I", dmem, mapper)
        m = DmemMapper(mapper, *fields)
        if m.cmd_in_buffer_offset >= len(dmem):
            raise VbiosError(f"FWSEC's DMEM mapper at VBIOS 0x{where + mapper:x} puts its command "
                             f"buffer at DMEM 0x{m.cmd_in_buffer_offset:x}, past its "
                             f"0x{len(dmem):x} bytes of DMEM")
        return m
    raise VbiosError(f"FWSEC's application interface table at VBIOS 0x{where + interface:x} has no "
                     f"DMEM mapper (id 4) among its {count} entries")
