"""Synthetic firmware containers in NVIDIA's formats, built for the tests: VBIOS images
(expansion ROM, PCIR, NPDE, IFR, BIT and its falcon ucode tables), nvfw/nouveau binary
headers, RISC-V ucode descriptors and ELF FMC images.

Written from NVIDIA's headers and nouveau's readers, independently of rig_nv_pci.firmware
(nothing here imports it): a mistake shared by a parser and its builder would otherwise pass.
Each layout and its source: docs/rig-nv-pci-modules/tests-firmware_builders.md."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field


def _pad(b: bytearray, size: int) -> None:
    b.extend(bytes(size - len(b)))


def _rom_image(size: int, code_type: int, last: bool, device: int = 0x2204,
               npde: bool = True) -> bytearray:
    """One expansion-ROM image of ``size`` bytes (a multiple of 512) with its PCIR at 0x40."""
    img = bytearray(size)
    img[0:2] = b"\x55\xaa"
    struct.pack_into("<H", img, 0x18, 0x40)
    # PCIR: sig, vendor, device, device list, struct len, rev, class[3], image len, rom rev,
    # code type, last image, max run-time length
    struct.pack_into("<4sHHHHB3sHHBBH", img, 0x40, b"PCIR", 0x10DE, device, 0, 0x18, 3,
                     b"\x00\x00\x03", size // 512, 1, code_type, 0x80 if last else 0, 0)
    if npde:  # at (0x40 + 0x18 + 15) & ~15 = 0x60: sig, rev 1.1, len 12, sub-image len, last
        struct.pack_into("<4sHHHBB", img, 0x60, b"NPDE", 0x101, 12, size // 512,
                         0x80 if last else 0, 0)
    return img


@dataclass
class SyntheticVbios:
    """A VBIOS and what a correct parser must find in it (offsets from the start of data)."""

    data: bytes
    start: int
    image_offsets: list[int]
    image_sizes: list[int]
    code_types: list[int]
    expansion_rom_offset: int
    bit_offset: int
    falcon_token_offset: int
    table_offset: int
    prod_entry_offset: int
    desc_offset: int
    desc_size: int
    ucode_offset: int
    ucode: bytes = field(repr=False)
    signatures: list[bytes] = field(repr=False)
    imem_load_size: int
    dmem_load_size: int
    stored_size: int
    pkc_data_offset: int
    interface_offset: int
    mapper_offset: int  # in DMEM
    cmd_in_buffer_offset: int  # in DMEM
    cmd_in_buffer_size: int
    signature_versions: int
    engine_id_mask: int
    ucode_id: int
    version: int


def build_vbios(*, efi: bool = False, ifr: int | None = None, npde: bool = True,
                signature_versions: int = 0b0110, decoy_bit: bool = True) -> SyntheticVbios:
    """A VBIOS of a PC-AT image (with the BIT), optionally an EFI image, and a FWSEC image
    (code type 0xE0, last) holding the ucode table, a FWSEC_DBG entry with a bad descriptor,
    the FWSEC_PROD entry and its v3 descriptor, signatures and ucode. ``ifr`` puts an IFR
    header of that version (1, 2 or 3) before the images."""
    base_size, efi_size = 0x1000, 0x800 if efi else 0
    base = _rom_image(base_size, 0x00, False, npde=npde)
    if decoy_bit:  # a BIT signature whose checksum fails: the scan must pass over it
        base[0x100:0x10C] = b"\xff\xb8BIT\x00" + bytes([0, 1, 12, 6, 2, 0x56])
    bit = 0x200
    tokens = [(0x42, 2, 8, 0x300), (0x49, 1, 0, 0), (0x70, 2, 4, 0x320)]
    struct.pack_into("<H4sHBBBB", base, bit, 0xB8FF, b"BIT\x00", 0x0100, 12, 6, len(tokens), 0)
    base[bit + 11] = -sum(base[bit:bit + 12]) & 0xFF
    for i, (tid, ver, size, ptr) in enumerate(tokens):
        struct.pack_into("<BBHH", base, bit + 12 + 6 * i, tid, ver, size, ptr)
    struct.pack_into("<IB", base, 0x300, 0x94020012, 0x05)  # BIOSDATA Version, OemVersion
    images = [base]
    if efi:
        images.append(_rom_image(efi_size, 0x03, False, npde=npde))

    # The FWSEC image: table at 0x80, a bad DBG descriptor at 0xC0, PROD descriptor at 0x100.
    nsig = bin(signature_versions).count("1")
    signatures = [bytes([0xA0 + i]) * 384 for i in range(nsig)]
    imem, dmem, stored = 0x300, 0x400, 0x6F0
    pkc, interface, mapper, cmd_in = 0x80, 0x10, 0x40, 0x200
    desc_size = 44 + 384 * nsig
    desc_at = 0x100
    ucode_at = desc_at + desc_size
    fw_size = -(-(ucode_at + 0x700) // 512) * 512
    fw = _rom_image(fw_size, 0xE0, True, npde=npde)
    fw_rel = base_size + efi_size  # from the first image
    ext = fw_rel - base_size
    table = 0x80
    struct.pack_into("<I", base, 0x320, fw_rel + table - ext)  # falcon data: table pointer
    entries = [(0x45, 0, 0xC0), (0x01, 0, 0), (0x85, 0, desc_at)]
    struct.pack_into("<6B", fw, table, 1, 6, 6, len(entries), 3, 44)
    for i, (app, target, ptr) in enumerate(entries):
        struct.pack_into("<BBI", fw, table + 6 + 6 * i, app, target, fw_rel + ptr - ext)
    struct.pack_into("<I", fw, 0xC0, 0)  # DBG's descriptor: version unavailable
    engine, ucode_id = 0x0400, 9
    struct.pack_into("<9IHBBHH", fw, desc_at, 1 | 3 << 8 | desc_size << 16, stored, pkc,
                     interface, 0, imem, 0, 0, dmem, engine, ucode_id, nsig, signature_versions,
                     0)
    for i, s in enumerate(signatures):
        fw[desc_at + 44 + 384 * i:desc_at + 44 + 384 * (i + 1)] = s
    ucode = bytearray(bytes(range(256)) * 3)  # IMEM 0x300
    d = bytearray(dmem)
    struct.pack_into("<4B", d, interface, 1, 4, 8, 2)
    struct.pack_into("<II", d, interface + 4, 0x1, 0x380)  # some other application
    struct.pack_into("<II", d, interface + 12, 0x4, mapper)  # the DMEM mapper
    struct.pack_into("<IHH14I", d, mapper, 0x50414D44, 3, 64, cmd_in, 0x100, 0x300, 0x80,
                     0, 0, 0, 0x12345678, 0, 0, 0, 0, 0, 0)
    ucode += d
    ucode += bytes(0x700 - len(ucode))
    fw[ucode_at:ucode_at + 0x700] = ucode
    images.append(fw)

    start = 0
    prefix = bytearray()
    if ifr is not None:
        start = 0x400
        prefix = bytearray(start)
        if ifr in (1, 2):
            struct.pack_into("<4sI", prefix, 0, b"NVGI", ifr << 8 | 0x20 << 16)
            struct.pack_into("<I", prefix, 0x24, start)
        else:  # v3: total data size -> flash status offset; +4 KiB the ROM directory
            start = 0x1400
            prefix = bytearray(start)
            struct.pack_into("<4sII", prefix, 0, b"NVGI", 3 << 8, 0x40)
            struct.pack_into("<I", prefix, 0x40, 0x100)
            struct.pack_into("<4sII", prefix, 0x1100, b"RFRD", 0, start)
    data = bytes(prefix) + b"".join(bytes(i) for i in images)
    offsets, at = [], start
    for i in images:
        offsets.append(at)
        at += len(i)
    fw_abs = offsets[-1]
    return SyntheticVbios(
        data=data, start=start, image_offsets=offsets, image_sizes=[len(i) for i in images],
        code_types=[0x00, 0x03, 0xE0] if efi else [0x00, 0xE0], expansion_rom_offset=ext,
        bit_offset=start + bit, falcon_token_offset=start + bit + 12 + 12,
        table_offset=fw_abs + table, prod_entry_offset=fw_abs + table + 6 + 12,
        desc_offset=fw_abs + desc_at, desc_size=desc_size, ucode_offset=fw_abs + ucode_at,
        ucode=bytes(ucode), signatures=signatures, imem_load_size=imem, dmem_load_size=dmem,
        stored_size=stored, pkc_data_offset=pkc, interface_offset=interface,
        mapper_offset=mapper, cmd_in_buffer_offset=cmd_in, cmd_in_buffer_size=0x100,
        signature_versions=signature_versions, engine_id_mask=engine, ucode_id=ucode_id,
        version=0x94020012 << 8 | 0x05,
    )


# ---------------------------------------------------------------------------------------------
# ELF


def build_elf(sections: list[tuple[str, bytes, int, int, int]], elf_class: int = 2,
              headers_first: bool = False) -> bytes:
    """A little-endian ELF with a NULL section, ``sections`` (name, data, type, flags, info)
    and a ``.shstrtab``. ELF64 puts the section headers last (as gsp-570.144.bin does);
    ``headers_first`` puts them right after the ELF header, the name table first (as the
    FMC does: section 1 is .shstrtab)."""
    ehsize, shentsize = (64, 64) if elf_class == 2 else (52, 40)
    names = bytearray(b"\0")
    entries = []
    order = [(".shstrtab", b"", 3, 0x20, 0), *sections] if headers_first else \
        [*sections, (".shstrtab", b"", 3, 0, 0)]
    for name, *_ in order:
        entries.append(len(names))
        names += name.encode() + b"\0"
    nsec = len(order) + 1
    blobs = [bytes(names) if n == ".shstrtab" else d for n, d, *_ in order]
    shoff = ehsize if headers_first else None
    at = ehsize + (nsec * shentsize if headers_first else 0)
    offsets = []
    body = bytearray()
    for b in blobs:
        offsets.append(at + len(body))
        body += b
    if shoff is None:
        shoff = at + len(body)
    shstrndx = 1 if headers_first else nsec - 1
    ident = b"\x7fELF" + bytes([elf_class, 1, 1]) + bytes(9)
    if elf_class == 2:
        hdr = ident + struct.pack("<HHIQQQIHHHHHH", 1, 243, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                                  nsec, shstrndx)
    else:
        hdr = ident + struct.pack("<HHIIIIIHHHHHH", 0, 0, 1, 0, 0, shoff, 0, 52, 0, 0, 40,
                                  nsec, shstrndx)
    shdrs = bytearray(shentsize)  # the NULL section
    for (_, _, typ, flags, info), name_at, off, blob in zip(order, entries, offsets, blobs,
                                                            strict=True):
        if elf_class == 2:
            shdrs += struct.pack("<IIQQQQIIQQ", name_at, typ, flags, 0, off, len(blob), 0,
                                 info, 1, 0)
        else:
            shdrs += struct.pack("<10I", name_at, typ, flags, 0, off, len(blob), 0, info, 1, 0)
    if headers_first:
        return hdr + bytes(shdrs) + bytes(body)
    return hdr + bytes(body) + bytes(shdrs)


def build_gsp_elf(image: bytes, signatures: dict[str, bytes], version: bytes = b"570.144\0"
                  ) -> bytes:
    """gsp-570.144.bin's layout: .fwimage, build id, .fwversion, .fwsignature_<family>s."""
    sections = [(".fwimage", image, 1, 3, 0), (".note.gnu.build-id", b"\x04" * 36, 7, 0, 0),
                (".fwversion", version, 1, 0, 0)]
    sections += [(".fwsignature_" + fam, sig, 1, 0, 0) for fam, sig in signatures.items()]
    return build_elf(sections, 2)


FMC_FLAGS = 0xF0000000 | 0x0FF00000 | 0x100 | 0x2  # MASKPROC | MASKOS | OS_NONCONFORMING | ALLOC


def build_fmc(image: bytes, hash_: bytes = b"\x11" * 48, signature: bytes = b"\x22" * 96,
              public_key: bytes = b"\x04" + b"\x33" * 96, crc: bool = True) -> bytes:
    """fmc-570.144.bin's layout: ELF32, headers at 52, .shstrtab, hash, signature, publickey,
    image, each PROGBITS with the FMC flags and (if ``crc``) its CRC32 in sh_info."""
    parts = [("hash", hash_), ("signature", signature), ("publickey", public_key),
             ("image", image)]
    return build_elf([(n, d, 1, FMC_FLAGS, zlib.crc32(d) if crc else 0) for n, d in parts], 1,
                     headers_first=True)


# ---------------------------------------------------------------------------------------------
# nvfw_bin_hdr containers


def build_bootloader(image: bytes, desc: dict[str, int]) -> bytes:
    """nvfw_bin_hdr (magic 0x10de, version 1, header at 0x18, data after the 84-byte desc),
    RM_RISCV_UCODE_DESC from ``desc`` (missing fields 0) and the image."""
    names = ["version", "bootloaderOffset", "bootloaderSize", "bootloaderParamOffset",
             "bootloaderParamSize", "riscvElfOffset", "riscvElfSize", "appVersion",
             "manifestOffset", "manifestSize", "monitorDataOffset", "monitorDataSize",
             "monitorCodeOffset", "monitorCodeSize", "bIsMonitorEnabled", "swbromCodeOffset",
             "swbromCodeSize", "swbromDataOffset", "swbromDataSize", "fbReservedSize",
             "bSignedAsCode"]
    unknown = set(desc) - set(names)
    assert not unknown, unknown
    data_off = 0x18 + 4 * len(names)
    hdr = struct.pack("<6I", 0x10DE, 1, data_off + len(image), 0x18, data_off, len(image))
    return hdr + struct.pack("<21I", *(desc.get(n, 0) for n in names)) + image


@dataclass
class SyntheticBooter:
    data: bytes
    image: bytes = field(repr=False)
    signatures: list[bytes] = field(repr=False)
    patch_location: int
    os_data_offset: int
    fuse_ver: int
    engine_id: int
    ucode_id: int
    hs_offset: int
    load_offset: int
    patch_loc_field: int  # where the patch location value lies in the file


def build_booter(*, num_sig: int = 2, sig_size: int = 384, os_code: int = 0x100,
                 app_code: int = 0x400, os_data: int = 0x300, sig_in_data: int = 0x10,
                 meta: tuple[int, int, int] = (1, 1, 3)) -> SyntheticBooter:
    """A booter laid out as booter_load-570.144.bin is: nvfw_bin_hdr at 0, hs header v2 at
    0x18, signatures at 0x3c, then the words patch_loc, patch_sig, metadata (fuse_ver,
    engine_id, ucode_id), num_sig, the load header (one app) and the image."""
    sigs = [bytes([0x50 + i]) * sig_size for i in range(num_sig)]
    hs_at, sig_at = 0x18, 0x3C
    loc_at = sig_at + num_sig * sig_size
    psig_at, meta_at = loc_at + 4, loc_at + 8
    num_at, load_at = meta_at + 12, meta_at + 16
    data_at = load_at + 36
    os_data_off = os_code + app_code
    image = bytearray(os_data_off + os_data)
    for i in range(len(image)):
        image[i] = i * 7 & 0xFF
    loc = os_data_off + sig_in_data
    out = bytearray(struct.pack("<6I", 0x10DE, 1, data_at + len(image), hs_at, data_at,
                                len(image)))
    out += struct.pack("<9I", sig_at, num_sig * sig_size, loc_at, psig_at, meta_at, 12, num_at,
                       load_at, 36)
    out += b"".join(sigs)
    out += struct.pack("<II3II", loc, 0, *meta, num_sig)
    out += struct.pack("<9I", 0, os_code, os_data_off, os_data, 1, os_code, app_code, os_code,
                       0)
    out += image
    return SyntheticBooter(bytes(out), bytes(image), sigs, loc, os_data_off, *meta, hs_at,
                           load_at, loc_at)
