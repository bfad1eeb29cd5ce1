"""rig_nv_pci.firmware.vbios against synthetic VBIOSes built by firmware_builders (NVIDIA's layouts,
written independently of the parser). No real VBIOS is read: one comes only from a GPU."""

from __future__ import annotations

import struct

import firmware_builders as fb
import pytest

from rig_edge import Misuse, RigError
from rig_nv_pci.firmware import vbios
from rig_nv_pci.firmware.vbios import VbiosError


def _edit(data: bytes, at: int, new: bytes) -> bytes:
    b = bytearray(data)
    b[at:at + len(new)] = new
    return bytes(b)


@pytest.mark.parametrize("kw", [{}, {"efi": True}, {"npde": False}, {"ifr": 1}, {"ifr": 2},
                                {"ifr": 3, "efi": True}])
def test_parse_finds_everything_the_builder_laid(kw: dict[str, object]) -> None:
    v = fb.build_vbios(**kw)  # type: ignore[arg-type]
    p = vbios.parse(v.data)
    assert p.start == v.start
    assert [i.offset for i in p.images] == v.image_offsets
    assert [i.size for i in p.images] == v.image_sizes
    assert [i.code_type for i in p.images] == v.code_types
    assert [i.last for i in p.images] == [False] * (len(v.code_types) - 1) + [True]
    assert all(i.vendor_id == 0x10DE and i.pcir_signature == b"PCIR" for i in p.images)
    assert all((i.npde_offset is not None) == kw.get("npde", True) for i in p.images)
    assert p.size == sum(v.image_sizes)
    assert p.expansion_rom_offset == v.expansion_rom_offset
    assert p.bit.offset == v.bit_offset  # past the decoy whose checksum fails
    assert (p.bit.bcd_version, p.bit.header_size, p.bit.token_size) == (0x100, 12, 6)
    assert [t.id for t in p.bit.tokens] == [ord("B"), ord("I"), ord("p")]
    assert p.version == v.version
    assert p.ucode_table_offset == v.table_offset
    assert [e.application_id for e in p.ucode_entries] == [0x45, 0x01, 0x85]
    f = p.fwsec
    assert f.entry.offset == v.prod_entry_offset and f.entry.application_id == 0x85
    d = f.desc
    assert (d.offset, d.version, d.size) == (v.desc_offset, 3, v.desc_size)
    assert (d.stored_size, d.pkc_data_offset, d.interface_offset) == (
        v.stored_size, v.pkc_data_offset, v.interface_offset)
    assert (d.imem_load_size, d.dmem_load_size) == (v.imem_load_size, v.dmem_load_size)
    assert (d.engine_id_mask, d.ucode_id, d.signature_count, d.signature_versions) == (
        v.engine_id_mask, v.ucode_id, len(v.signatures), v.signature_versions)
    assert f.ucode_offset == v.ucode_offset and f.ucode == v.ucode and len(f.ucode) == 0x700
    assert f.signatures == b"".join(v.signatures)
    m = f.dmem_mapper
    assert (m.offset, m.signature, m.version, m.size) == (v.mapper_offset, 0x50414D44, 3, 64)
    assert (m.cmd_in_buffer_offset, m.cmd_in_buffer_size) == (v.cmd_in_buffer_offset,
                                                              v.cmd_in_buffer_size)
    assert m.ucode_build_time_stamp == 0x12345678 and m.init_cmd == 0
    assert f.interface_offset_in_ucode == v.imem_load_size + v.interface_offset
    assert f.dmem_offset_in_ucode == v.imem_load_size
    assert f.init_cmd_offset_in_ucode == v.imem_load_size + v.mapper_offset + 44
    assert f.command_offset_in_ucode == v.imem_load_size + v.cmd_in_buffer_offset
    assert f.signature_offset_in_ucode == v.imem_load_size + v.pkc_data_offset


def _expected_patch(v: fb.SyntheticVbios, cmd: int, arg: bytes, sig: bytes) -> bytes:
    out = bytearray(v.ucode)
    dmem = v.imem_load_size
    struct.pack_into("<I", out, dmem + v.mapper_offset + 44, cmd)
    out[dmem + v.cmd_in_buffer_offset:dmem + v.cmd_in_buffer_offset + len(arg)] = arg
    out[dmem + v.pkc_data_offset:dmem + v.pkc_data_offset + 384] = sig
    return bytes(out)


def test_frts_and_sb_patches() -> None:
    v = fb.build_vbios(signature_versions=0b0110)  # signatures for fuse versions 1 and 2
    f = vbios.parse(v.data).fwsec
    frts = 0x3FE00000
    read_vbios = struct.pack("<IIIIII", 1, 24, 0, 0, 0, 2)
    region = struct.pack("<IIIII", 1, 20, frts >> 12, 0x100, 2)
    assert vbios.frts_command(frts) == read_vbios + region
    assert f.frts_image(frts, 2) == _expected_patch(v, 0x15, read_vbios + region,
                                                    v.signatures[1])
    assert f.frts_image(frts, 1) == _expected_patch(v, 0x15, read_vbios + region,
                                                    v.signatures[0])
    assert f.sb_image(1) == _expected_patch(v, 0x19, read_vbios, v.signatures[0])
    assert f.signature_index(2) == 1 and f.signature(1) == v.signatures[0]
    for fuse in (0, 3, 16):
        with pytest.raises(VbiosError, match=f"no signature for fuse version {fuse}"):
            f.frts_image(frts, fuse)
    with pytest.raises(Misuse, match="4 KiB"):
        vbios.frts_command(0x1234)
    with pytest.raises(Misuse):
        vbios.frts_command(0x1000, 0x800)


def test_the_command_must_fit_in_dmem() -> None:
    f = vbios.parse(fb.build_vbios().data).fwsec
    with pytest.raises(VbiosError, match="command buffer at DMEM 0x200 cannot hold"):
        f.patched(0x15, bytes(0x300), 1)


def test_debug_fwsec_is_taken_only_when_asked_and_its_bad_descriptor_named() -> None:
    v = fb.build_vbios()
    with pytest.raises(VbiosError, match=r"lacks a FWSEC this library runs: the descriptor "
                       r"at 0x10c0 has no version"):
        vbios.parse(v.data, application_id=0x45)


def test_firmware_sec_lic_entry_is_taken_as_nvidia_does() -> None:
    v = fb.build_vbios()
    p = vbios.parse(_edit(v.data, v.prod_entry_offset, b"\x05"))
    assert p.fwsec.entry.application_id == 0x05 and p.fwsec.desc.offset == v.desc_offset


def _broken(name: str) -> tuple[bytes, str]:
    """A VBIOS broken in one way, and what the error must say."""
    v = fb.build_vbios()
    d, fw = v.data, v.image_offsets[1]
    pcir, npde = fw + 0x40, fw + 0x60
    dmem = v.ucode_offset + v.imem_load_size
    cases: dict[str, tuple[bytes, str]] = {
        "empty": (b"", "too short for the ROM signature at 0x0"),
        "rom signature": (_edit(d, 0, b"\x00\x00"), r"no PCI expansion ROM signature \(0xAA55\)"
                          r" at 0 and no IFR header"),
        "second signature": (_edit(d, fw, b"\x12\x34"),
                             "ROM image 1 at 0x1000 has signature 0x3412, not 0xAA55"),
        "pcir": (_edit(d, pcir, b"XXXX"), r"no PCI data structure \(PCIR\) at 0x1040"),
        "no last image": (_edit(_edit(d, pcir + 0x15, b"\x00"), npde + 10, b"\x00"),
                          "too short for ROM image 2's signature at 0x1c00"),
        "truncated": (d[:-0x100], r"too short for ROM image 1 \(0xc00 bytes\) at 0x1000"),
        "zero length": (_edit(_edit(d, pcir + 0x10, b"\0\0"), npde + 8, b"\0\0"),
                        "ROM image 1 at 0x1000 has length 0"),
        "bit checksum": (_edit(d, v.bit_offset + 11, bytes([d[v.bit_offset + 11] ^ 1])),
                         r"no BIT header \(0xB8FF 'BIT\\0' with a zero checksum\) in 0x0..0x1c00"),
        "no falcon token": (_edit(d, v.falcon_token_offset, b"q"),
                            r"BIT at 0x200 has no falcon data token \('p'\)"),
        "falcon token version": (_edit(d, v.falcon_token_offset + 1, b"\x01"),
                                 "falcon data token at 0x218 is version 1 of 4 bytes, not "
                                 "version 2"),
        "table version": (_edit(d, v.table_offset, b"\x02"),
                          "falcon ucode table at 0x1080 is version 2"),
        "no prod entry": (_edit(d, v.prod_entry_offset, b"\x86"),
                          r"no FWSEC entry \(application id 0x85\); its entries are 0x45, "
                          r"0x01, 0x86"),
        "descriptor v2": (_edit(d, v.desc_offset + 1, b"\x02"),
                          r"lacks a FWSEC this library runs: the descriptor at 0x1100 is "
                          r"version 2 of 812 bytes, not version 3"),
        "stored size": (_edit(d, v.desc_offset + 4, struct.pack("<I", 0x8F0)),
                        r"FWSEC ucode at 0x142c \(StoredSize 0x8f0, 0x900 loaded\) runs past"),
        "signature count": (_edit(d, v.desc_offset + 39, b"\x03"),
                            "counts 3 signatures but holds 0x300 bytes"),
        "pkc offset": (_edit(d, v.desc_offset + 8, struct.pack("<I", 0x300)),
                       r"IMEMLoadSize \+ PKCDataOffset \+ 384 \(its signature\) = 0x780"),
        "no mapper": (_edit(d, dmem + v.interface_offset + 12, b"\x05"),
                      r"has no DMEM mapper \(id 4\) among its 2 entries"),
        "mapper past dmem": (_edit(d, dmem + v.interface_offset + 16, struct.pack("<I", 0x3F0)),
                             "DMEM mapper at DMEM 0x3f0 .* lies past its 0x400 bytes of DMEM"),
        "interface version": (_edit(d, dmem + v.interface_offset, b"\x02"),
                              "application interface table at VBIOS 0x173c is version 2"),
        "bad ifr": (_edit(d, 0, b"NVGI" + struct.pack("<I", 4 << 8)),
                    "IFR header version 4 is not 1, 2 or 3"),
    }
    return cases[name]


@pytest.mark.parametrize("name", [
    "empty", "rom signature", "second signature", "pcir", "no last image", "truncated",
    "zero length", "bit checksum", "no falcon token", "falcon token version", "table version",
    "no prod entry", "descriptor v2", "stored size", "signature count", "pkc offset",
    "no mapper", "mapper past dmem", "interface version", "bad ifr",
])
def test_malformed_vbios_names_what_is_missing_and_where(name: str) -> None:
    data, message = _broken(name)
    with pytest.raises(VbiosError, match=message) as e:
        vbios.parse(data)
    assert isinstance(e.value, RigError)


def test_ifr_v3_without_rom_directory() -> None:
    v = fb.build_vbios(ifr=3)
    with pytest.raises(VbiosError, match=r"IFR v3 has no ROM directory \(RFRD\) at 0x1100"):
        vbios.parse(_edit(v.data, 0x1100, b"XXXX"))


def test_walk_and_bit_alone() -> None:
    v = fb.build_vbios(efi=True)
    assert [i.offset for i in vbios.rom_images(v.data)] == v.image_offsets
    assert vbios.expansion_rom_offset(vbios.rom_images(v.data)) == 0x800
    assert vbios.find_bit(v.data).offset == v.bit_offset
    with pytest.raises(VbiosError, match="no BIT header"):
        vbios.find_bit(v.data, 0, 0x150)
