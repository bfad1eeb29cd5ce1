"""rig_nv_pci.firmware.fwimage against synthetic containers (firmware_builders) and, when they are
present, NVIDIA's own 570.144 files, each checked against rig_pci's pinned digest first."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import firmware_builders as fb
import pytest

from rig_edge import RigError
from rig_nv_pci.firmware import fwimage
from rig_nv_pci.firmware.fwimage import FirmwareFormatError
from rig_pci.firmware import NVIDIA_GSP_570_144


def _edit(data: bytes, at: int, new: bytes) -> bytes:
    b = bytearray(data)
    b[at:at + len(new)] = new
    return bytes(b)


# ---------------------------------------------------------------------------------------------
# gsp-570.144.bin


def test_gsp_elf_sections() -> None:
    image = bytes(range(256)) * 64
    sigs = {"ga10x": b"\x01" * 4096, "ad10x": b"\x02" * 4096, "gb20x": b"\x03" * 4096}
    data = fb.build_gsp_elf(image, sigs)
    g = fwimage.parse_gsp(data)
    assert g.version == "570.144"
    assert bytes(g.image.data) == image and g.image.offset == 64 and g.image.size == len(image)
    assert data[g.image.offset:g.image.offset + g.image.size] == image
    for fam, sig in sigs.items():
        s = g.signature(fam)
        assert bytes(s.data) == sig and data[s.offset:s.offset + s.size] == sig
    assert g.build_id is not None and g.build_id.size == 36
    with pytest.raises(FirmwareFormatError, match=r"no section '.fwsignature_gh100' \(it has "
                       r".fwsignature_ad10x, .fwsignature_ga10x, .fwsignature_gb20x\)"):
        g.signature("gh100")


@pytest.mark.parametrize(("data", "message"), [
    (b"", r"gsp-570.144.bin: the ELF identification \(0x10 bytes\) runs past the end of the "
          r"file \(0x0 bytes\) at offset 0x0"),
    (b"\x7fELG" + bytes(60), "no ELF magic"),
    (fb.build_elf([(".fwimage", b"x", 1, 0, 0)], 1), "ELF class 1 data 1, not ELF64"),
    (fb.build_gsp_elf(b"img", {}, b"570.86\0"), r".fwversion at offset 0x.* is '570.86', not "
                                                 r"'570.144'"),
    (fb.build_gsp_elf(b"img", {}, b"570.144"), "is not a NUL-ended version string"),
    (fb.build_elf([(".fwversion", b"570.144\0", 1, 0, 0)]),
     r"gsp-570.144.bin: no section '.fwimage' \(its sections: .fwversion, .shstrtab\)"),
    (fb.build_gsp_elf(b"img", {})[:-10], "the section header table .* runs past the end"),
])
def test_gsp_elf_malformed(data: bytes, message: str) -> None:
    with pytest.raises(FirmwareFormatError, match=message) as e:
        fwimage.parse_gsp(data)
    assert isinstance(e.value, RigError)


def test_gsp_elf_section_past_end_names_its_header() -> None:
    data = fb.build_gsp_elf(b"img", {"ga10x": b"s" * 16})
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    # section 1 (.fwimage): its sh_size at +32
    bad = _edit(data, shoff + 64 + 32, struct.pack("<Q", 1 << 20))
    with pytest.raises(FirmwareFormatError, match=f"section 1's data \\(section header at "
                       f"0x{shoff + 64:x}\\)"):
        fwimage.parse_gsp(bad)


def test_gsp_version_is_optional() -> None:
    assert fwimage.parse_gsp(fb.build_gsp_elf(b"i", {}, b"580.1\0"), version=None).version == \
        "580.1"


# ---------------------------------------------------------------------------------------------
# fmc (Hopper: COT v1; Blackwell: COT v2)

# NVDM_PAYLOAD_COT's hash384[12], publicKey[96] and signature[96] hold 48, 384 and 384 bytes;
# GH100 fills them whole (cotPayloadPublicKeySize/SignatureSize 384, g_kern_fsp_nvoc.c), GB20x
# with a 97-byte P-384 point and a 96-byte signature.
V1 = {"hash_": b"\x11" * 48, "signature": b"\x22" * 384, "public_key": b"\x33" * 384}


def test_fmc_sections() -> None:
    image = bytes(range(200)) * 10
    data = fb.build_fmc(image)
    m = fwimage.parse_fmc(data)
    assert bytes(m.image.data) == image
    assert (m.hash.size, m.signature.size, m.public_key.size) == (48, 96, 97)
    assert m.cot_version == 2
    assert bytes(m.public_key.data)[:1] == b"\x04"
    assert data[m.hash.offset:m.hash.offset + 48] == b"\x11" * 48
    assert fwimage.parse_fmc(fb.build_fmc(image, crc=False)).image.info == 0
    assert fwimage.parse_fmc(data, cot_version=2).cot_version == 2


def test_gh100_fmc_sections_are_cot_v1() -> None:
    image = bytes(range(256)) * 7
    data = fb.build_fmc(image, **V1)
    m = fwimage.parse_fmc(data, "nvidia/gh100/gsp/fmc-570.144.bin")
    assert m.cot_version == 1
    assert (m.hash.size, m.signature.size, m.public_key.size) == (48, 384, 384)
    assert bytes(m.image.data) == image
    assert data[m.signature.offset:m.signature.offset + 384] == b"\x22" * 384
    assert bytes(m.public_key.data) == b"\x33" * 384
    assert fwimage.parse_fmc(data, cot_version=1) == m


def test_fmc_of_the_other_cot_version_is_refused_when_one_is_wanted() -> None:
    v1 = fb.build_fmc(b"img", **V1)
    with pytest.raises(FirmwareFormatError, match=r"fmc-570.144.bin: sections hash, signature, "
                       r"publickey of 48, 384, 384 bytes are COT version 1's, not the version 2 "
                       r"this FSP takes at offset 0x"):
        fwimage.parse_fmc(v1, cot_version=2)
    with pytest.raises(FirmwareFormatError, match="are COT version 2's, not the version 1"):
        fwimage.parse_fmc(fb.build_fmc(b"img"), cot_version=1)


@pytest.mark.parametrize("sizes", [(47, 96, 97), (48, 384, 97), (48, 96, 384), (48, 384, 383)])
def test_fmc_of_mixed_sizes_fits_no_cot_version(sizes: tuple[int, int, int]) -> None:
    h, sig, key = sizes
    data = fb.build_fmc(b"img", hash_=b"h" * h, signature=b"s" * sig, public_key=b"k" * key)
    with pytest.raises(FirmwareFormatError, match=(
            f"sections hash, signature, publickey of {h}, {sig}, {key} bytes fit no COT payload "
            r"\(version 1 48, 384, 384; version 2 48, 96, 97\)")):
        fwimage.parse_fmc(data)


def test_fmc_malformed() -> None:
    data = fb.build_fmc(b"abcdefgh" * 8)
    m = fwimage.parse_fmc(data)
    with pytest.raises(FirmwareFormatError, match=r"fmc-570.144.bin: section 'image' has CRC32 "
                       r"0x[0-9a-f]{8}, not the 0x[0-9a-f]{8} its header records at offset"):
        fwimage.parse_fmc(_edit(data, m.image.offset, b"X"))
    with pytest.raises(FirmwareFormatError, match="hash, signature, publickey of 47, 96, 97 "
                       "bytes fit no COT payload"):
        fwimage.parse_fmc(fb.build_fmc(b"img", hash_=b"h" * 47))
    # section 2 (hash) flags at 0x34 + 2 * 40 + 8
    with pytest.raises(FirmwareFormatError, match="section 'hash' has type 1 flags 0x2, not 1 "
                       "0xfff00102"):
        fwimage.parse_fmc(_edit(data, 0x34 + 80 + 8, struct.pack("<I", 2)))
    without_key = fb.build_elf([(n, d, 1, fb.FMC_FLAGS, 0) for n, d in
                                (("hash", b"h" * 48), ("signature", b"s" * 96), ("image", b"i"))],
                               1, headers_first=True)
    with pytest.raises(FirmwareFormatError, match="no section 'publickey'"):
        fwimage.parse_fmc(without_key)
    with pytest.raises(FirmwareFormatError, match="ELF class 2 data 1, not ELF32"):
        fwimage.parse_fmc(fb.build_gsp_elf(b"i", {}))


# ---------------------------------------------------------------------------------------------
# bootloader


DESC = {"version": 5, "bootloaderOffset": 0x400, "bootloaderSize": 0x100,
        "bootloaderParamOffset": 0x500, "bootloaderParamSize": 0x10, "manifestSize": 0x80,
        "monitorDataOffset": 0x80, "monitorDataSize": 0x100, "monitorCodeOffset": 0x180,
        "monitorCodeSize": 0x280, "bIsMonitorEnabled": 1, "fbReservedSize": 0x600,
        "appVersion": 77}


def test_bootloader() -> None:
    image = bytes(i * 3 & 0xFF for i in range(0x600))
    b = fwimage.parse_bootloader(fb.build_bootloader(image, DESC))
    assert (b.header.magic, b.header.header_offset, b.header.data_offset) == (0x10DE, 0x18, 0x6C)
    assert b.desc_offset == 0x18 and bytes(b.image) == image
    assert (b.desc.version, b.desc.monitor_code_offset, b.desc.monitor_code_size) == (5, 0x180,
                                                                                      0x280)
    assert (b.desc.app_version, b.desc.is_monitor_enabled, b.desc.fb_reserved_size) == (77, 1,
                                                                                        0x600)
    assert bytes(b.part("monitor_code")) == image[0x180:0x400]
    assert bytes(b.part("manifest")) == image[:0x80]
    assert bytes(b.part("bootloader_param")) == image[0x500:0x510]


def test_bootloader_malformed() -> None:
    good = fb.build_bootloader(bytes(0x600), DESC)
    with pytest.raises(FirmwareFormatError, match=r"bootloader-570\.144\.bin: nvfw_bin_hdr magic "
                       r"0x10df, not 0x10de at offset 0x0"):
        fwimage.parse_bootloader(_edit(good, 0, b"\xdf\x10"))
    with pytest.raises(FirmwareFormatError, match=r"the image \(nvfw_bin_hdr data_offset/"
                       r"data_size\) \(0x600 bytes\) runs past the end"):
        fwimage.parse_bootloader(good[:-1])
    with pytest.raises(FirmwareFormatError, match=r"RM_RISCV_UCODE_DESC monitor_code \(0x180 \+ "
                       r"0x500\) lies past the 0x600-byte image at offset 0x48"):
        fwimage.parse_bootloader(fb.build_bootloader(bytes(0x600),
                                                     {**DESC, "monitorCodeSize": 0x500}))
    with pytest.raises(FirmwareFormatError, match="RM_RISCV_UCODE_DESC version 9"):
        fwimage.parse_bootloader(fb.build_bootloader(bytes(0x600), {**DESC, "version": 9}))


# ---------------------------------------------------------------------------------------------
# booter


def test_booter_fields_and_patch() -> None:
    s = fb.build_booter()
    b = fwimage.parse_booter(s.data)
    assert bytes(b.image) == s.image
    assert (b.patch_location, b.num_signatures, b.signature_size) == (s.patch_location, 2, 384)
    assert (b.fuse_ver, b.engine_id, b.ucode_id) == (s.fuse_ver, s.engine_id, s.ucode_id)
    assert b.load.os_data_offset == s.os_data_offset and b.load.num_apps == 1
    assert (b.load.app_code_offset, b.load.app_code_size) == (0x100, 0x400)
    assert b.dmem_signature_offset == 0x10
    assert bytes(b.signatures) == b"".join(s.signatures)
    # NVIDIA: with n signatures, fuse version f takes signature n - 1 - f
    assert b.signature_index(0) == 1 and b.signature_index(1) == 0
    for fuse, sig in ((0, s.signatures[1]), (1, s.signatures[0])):
        want = bytearray(s.image)
        want[s.patch_location:s.patch_location + 384] = sig
        assert b.patched(fuse) == bytes(want)
    with pytest.raises(FirmwareFormatError, match="no signature for fuse version 2: it has 2"):
        b.patched(2)
    one = fwimage.parse_booter(fb.build_booter(num_sig=1).data)
    assert one.signature_index(0) == one.signature_index(5) == 0


def test_booter_malformed() -> None:
    s = fb.build_booter()
    num_at = s.patch_loc_field + 20
    cases = [
        (_edit(s.data, num_at, struct.pack("<I", 0)),
         f"0 signatures in 0x300 bytes .* at offset 0x{num_at:x}"),
        (_edit(s.data, num_at, struct.pack("<I", 5)), "5 signatures in 0x300 bytes"),
        (_edit(s.data, s.patch_loc_field, struct.pack("<I", 0x10)),
         f"signature patch location 0x10 lies outside the OS data .* at offset "
         f"0x{s.patch_loc_field:x}"),
        (_edit(s.data, s.patch_loc_field, struct.pack("<I", 0x7F0)),
         r"signature patch location 0x7f0 \(\+0x180\) lies past the 0x800-byte image"),
        (_edit(s.data, s.load_offset + 16, struct.pack("<I", 2)),
         f"load header with 2 apps, not 1 at offset 0x{s.load_offset + 16:x}"),
        (_edit(s.data, s.hs_offset + 20, struct.pack("<I", 8)), "metadata of 8 bytes"),
        (_edit(s.data, s.hs_offset + 8, struct.pack("<I", 1 << 20)),
         r"the signature patch location \(hs patch_loc\) \(0x4 bytes\) runs past the end"),
        (_edit(s.data, s.load_offset + 12, struct.pack("<I", 0x1000)),
         r"OS data \(0x500 \+ 0x1000\) lies past the 0x800-byte image"),
        (s.data[:0x20], r"the image \(nvfw_bin_hdr data_offset/data_size\) \(0x800 bytes\) runs "
                        r"past the end of the file \(0x20 bytes\)"),
    ]
    for data, message in cases:
        with pytest.raises(FirmwareFormatError, match="booter_unload-570.144.bin: " + message):
            fwimage.parse_booter(data, "booter_unload-570.144.bin")


def test_fuse_version() -> None:
    assert [fwimage.fuse_version(v) for v in (0, 1, 2, 3, 0x80, 0x80000000)] == [0, 1, 2, 2, 8,
                                                                                  32]


# ---------------------------------------------------------------------------------------------
# NVIDIA's own files


# Hopper's files are not in rig_pci's pinned set (its boot is not built, so `rig firmware nv`
# does not fetch them); their BLAKE2b-256 digests here were computed from Debian's
# firmware-nvidia-graphics (linux-firmware 20260916, fetched by tests/debian_firmware.py).
HOPPER_570_144 = {
    "nvidia/gh100/gsp/bootloader-570.144.bin":
        "f4713d4418da92b4d2079528ca94e64cc2b0fd5f12b3d4259625ba25ad003de7",
    "nvidia/gh100/gsp/fmc-570.144.bin":
        "1a1aaae6e75bbb7327d565ab7566f72839243f9f838f02945bc4380ef01ca23c",
}
PINNED = {**NVIDIA_GSP_570_144, **HOPPER_570_144}


def _real(firmware: Path, name: str) -> bytes:
    """The pinned file ``name`` from the directory ``firmware`` (the nvidia_firmware fixture),
    its digest checked first."""
    path = firmware / name
    if not path.exists():
        pytest.skip(f"NVIDIA's {name} is not in {firmware}")
    data = path.read_bytes()
    got = hashlib.blake2b(data, digest_size=32).hexdigest()
    assert got == PINNED[name], f"{path} has BLAKE2b-256 {got}, not the pinned {PINNED[name]}"
    return data


def test_real_gsp(nvidia_firmware: Path) -> None:
    g = fwimage.parse_gsp(_real(nvidia_firmware, "nvidia/ga102/gsp/gsp-570.144.bin"))
    assert g.version == "570.144"
    assert (g.image.offset, g.image.size) == (0x40, 0x3C99000)
    for fam in ("ga102", "ad102", "gb202"):
        assert g.signature(fwimage.FAMILIES[fam]).size == 0x1000


@pytest.mark.parametrize("family", ["ga102", "ad102", "gh100", "gb202"])
def test_real_bootloader(nvidia_firmware: Path, family: str) -> None:
    name = f"nvidia/{family}/gsp/bootloader-570.144.bin"
    b = fwimage.parse_bootloader(_real(nvidia_firmware, name))
    assert (b.header.header_offset, b.header.data_offset) == (0x18, 0x6C)
    assert b.desc.version == 5 and b.desc.is_monitor_enabled == 1
    assert b.desc.manifest_size > 0 and b.desc.monitor_code_size > 0
    assert b.desc.monitor_data_offset + b.desc.monitor_data_size <= len(b.image)
    assert b.desc.monitor_code_offset + b.desc.monitor_code_size <= len(b.image)


@pytest.mark.parametrize(("family", "which", "patch_location"), [
    ("ga102", "booter_load", 0x8A10), ("ga102", "booter_unload", 0x5010),
    ("ad102", "booter_load", 0x7E10), ("ad102", "booter_unload", 0x5010)])
def test_real_booter(nvidia_firmware: Path, family: str, which: str,
                     patch_location: int) -> None:
    name = f"nvidia/{family}/gsp/{which}-570.144.bin"
    b = fwimage.parse_booter(_real(nvidia_firmware, name), name)
    assert b.patch_location == patch_location and b.dmem_signature_offset == 0x10
    assert (b.num_signatures, b.signature_size) == (2, 384)
    assert (b.fuse_ver, b.engine_id, b.ucode_id) == (1, 1, 3)  # SEC2 (engine mask bit 0)
    assert (b.load.num_apps, b.load.os_code_offset, b.load.app_code_offset) == (1, 0, 0x100)
    image = bytes(b.image)
    for fuse in (0, 1):
        p = b.patched(fuse)
        assert len(p) == len(image)
        assert p[:patch_location] == image[:patch_location]
        assert p[patch_location + 384:] == image[patch_location + 384:]
        assert p[patch_location:patch_location + 384] == b.signature(fuse)
    assert b.signature(0) != b.signature(1)


def test_real_fmc(nvidia_firmware: Path) -> None:
    m = fwimage.parse_fmc(_real(nvidia_firmware, "nvidia/gb202/gsp/fmc-570.144.bin"))
    assert (m.hash.size, m.signature.size, m.public_key.size) == (48, 96, 97)
    assert bytes(m.public_key.data)[:1] == b"\x04"  # an uncompressed P-384 point
    assert m.image.size == 199240 and all(s.info for s in (m.image, m.hash, m.signature,
                                                           m.public_key))
    assert m.cot_version == 2


def test_real_gh100_fmc(nvidia_firmware: Path) -> None:
    name = "nvidia/gh100/gsp/fmc-570.144.bin"
    m = fwimage.parse_fmc(_real(nvidia_firmware, name), name, cot_version=1)
    assert m.cot_version == 1
    assert (m.hash.size, m.signature.size, m.public_key.size) == (48, 384, 384)
    # the size of the "ucode_image" of g_bindata_kgspGetBinArchiveGspRmFmcGfwProdSigned_GH100.c
    assert m.image.size == 165448
    assert all(s.info for s in (m.image, m.hash, m.signature, m.public_key))
