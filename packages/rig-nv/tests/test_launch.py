"""rig_nv.launch without a GPU: arguments, limits, bank 0, relocations and launch templates.

The kernels are the fixture cubins' (cubins/kernels.cu, built by cubins/build.sh). Expected
figures: the cbank-0 driver area per architecture (read off ptxas's own SASS:
``c[0x0][0x28]`` / ``c[0x0][0x37c]`` for the stack pointer, tinygrad's 0xfffdc0), the
parameter bases, SASS_VERSION = major << 4 | minor (tinygrad's ``sass_version``), the 1 KiB
shared-memory reservation that ptxas counts in ``.nv.shared.<k>`` only from sm_90 on, the
carveouts per arch (Mesa) and the R_CUDA relocation numbers and bit positions (nvdisasm's
table via denvdis).
"""

from __future__ import annotations

import array
import dataclasses
import struct
from functools import cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rig_edge import Facts, Memory, Misuse, Region
from rig_nv import launch as L  # noqa: N812
from rig_nv import qmd
from rig_nv.classes import Classes
from rig_nv.cubin import Cubin, CubinError, Kernel, Param, Relocation, parse

CUBINS = Path(__file__).resolve().parent / "cubins"
ARCHES = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
COMPUTE = {"sm_80": 0xC6C0, "sm_86": 0xC7C0, "sm_89": 0xC9C0, "sm_90": 0xCBC0,
           "sm_100": 0xCDC0, "sm_120": 0xCEC0}
QMD_VERSION = {"sm_80": 3, "sm_86": 3, "sm_89": 3, "sm_90": 4, "sm_100": 5, "sm_120": 5}
PARAM_BASE = {"sm_80": 0x160, "sm_86": 0x160, "sm_89": 0x160, "sm_90": 0x210,
              "sm_100": 0x380, "sm_120": 0x380}
LARGEST_CARVEOUT_KIB = {"sm_80": 164, "sm_86": 100, "sm_89": 100, "sm_90": 228, "sm_100": 228,
                        "sm_120": 100}

# Distinct window values, so a swap of the two shows.
LOCAL_WINDOW = 0x0000_7293_0000_0000
SHARED_WINDOW = 0x0000_7A94_0000_0000
CODE_GPU = 0x0000_7FFF_0012_0000  # 64 KiB aligned, below 2^47
STACK_POINTER = 0xFFFDC0  # 16 MiB local window less 0x240


@cache
def cubin(arch: str) -> Cubin:
    return parse((CUBINS / f"kernels.{arch}.cubin").read_bytes())


class FakeDevice:
    """What :func:`rig_nv.launch.prepare` reads off a device, and nothing else."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.windows = (LOCAL_WINDOW, SHARED_WINDOW)  # (local, shared), as Device has them
        self.loader = SimpleNamespace(slm=0)  # local memory per thread given so far
        self.classes = Classes(usermode=0xC661, gpfifo=0xC86F, compute=COMPUTE[arch],
                               copy=0xC8B5)
        self.facts = Facts(name="fake GPU", arch=arch, budget=1 << 34,
                           queues=("compute", "copy"), hang_ms=None, maps_host=False,
                           bus="0000:00:00.0", driver="0")


def image(arch: str) -> tuple[FakeDevice, L.Image]:
    dev = FakeDevice(arch)
    c = cubin(arch)
    code = Region(gpu=CODE_GPU, host=None, length=len(c.image) + L.CODE_SLACK,
                  kind=Memory.DEVICE)
    return dev, L.Image(dev, c, code, None)  # type: ignore[arg-type]


def region(gpu: int, length: int = 256) -> Region:
    return Region(gpu=gpu, host=None, length=length, kind=Memory.DEVICE)


def with_params(kernel: Kernel, *sizes: int) -> Kernel:
    """``kernel`` with parameters of these sizes, naturally aligned one after another."""
    params, at = [], 0
    for size in sizes:
        at = -(-at // min(size, 8)) * min(size, 8)
        params.append(Param(at, size))
        at += size
    return dataclasses.replace(kernel, params=tuple(params), param_bytes=at)


# ---- pack_args ------------------------------------------------------------------------------


def test_pack_args_vadd_regions_and_int() -> None:
    k = cubin("sm_90").kernels["vadd"]  # (const float* a, const float* b, float* c, int n)
    a, b, c = region(0x7F00_1234_5600), region(0x0000_0000_0100), region(0xFFFF_FFFF_FFFF_FF00)
    out = L.pack_args(k, [a, b, c, -7])
    assert out == [
        (0, struct.pack("<Q", 0x7F00_1234_5600)),
        (8, struct.pack("<Q", 0x100)),
        (16, b"\x00\xff" + b"\xff" * 6),
        (24, struct.pack("<i", -7)),
    ]


@pytest.mark.parametrize(("size", "value", "packed"), [
    (1, -1, b"\xff"), (1, -128, b"\x80"), (1, 255, b"\xff"), (1, 0x7F, b"\x7f"),
    (2, -2, b"\xfe\xff"), (2, 0xFFFF, b"\xff\xff"), (2, -0x8000, b"\x00\x80"),
    (4, -(1 << 31), b"\x00\x00\x00\x80"), (4, 0xFFFF_FFFF, b"\xff" * 4), (4, 0x1234_5678,
                                                                         b"\x78\x56\x34\x12"),
    (8, -1, b"\xff" * 8), (8, (1 << 64) - 1, b"\xff" * 8), (8, -(1 << 63), b"\x00" * 7 + b"\x80"),
    (8, 0x0102_0304_0506_0708, bytes(range(8, 0, -1))),
    (1, True, b"\x01"), (4, False, b"\x00" * 4),
])
def test_pack_args_ints_signed_and_unsigned(size: int, value: int, packed: bytes) -> None:
    k = with_params(cubin("sm_80").kernels["vadd"], size)
    assert L.pack_args(k, [value]) == [(0, packed)]


@pytest.mark.parametrize(("size", "value"), [
    (1, 256), (1, -129), (2, 0x10000), (2, -0x8001), (4, 1 << 32), (4, -(1 << 31) - 1),
    (8, 1 << 64), (8, -(1 << 63) - 1),
])
def test_pack_args_int_out_of_range(size: int, value: int) -> None:
    k = with_params(cubin("sm_80").kernels["vadd"], size)
    with pytest.raises(Misuse, match="does not fit"):
        L.pack_args(k, [value])


def test_pack_args_mixed_sizes_offsets() -> None:
    k = with_params(cubin("sm_80").kernels["vadd"], 1, 2, 4, 8)
    assert [p.offset for p in k.params] == [0, 2, 4, 8]
    out = L.pack_args(k, [-1, 0xBEEF, -2, 1 << 40])
    assert out == [(0, b"\xff"), (2, b"\xef\xbe"), (4, b"\xfe\xff\xff\xff"),
                   (8, struct.pack("<Q", 1 << 40))]


def test_pack_args_floats_by_parameter_size() -> None:
    saxpy = cubin("sm_90").kernels["saxpy"]  # (float a, const float* x, float* y, int n)
    assert saxpy.params[0].size == 4
    out = L.pack_args(saxpy, [1.1, region(0x1000), region(0x2000), 3])
    assert out[0] == (0, struct.pack("<f", 1.1))
    k = with_params(saxpy, 8, 4)
    assert L.pack_args(k, [1.1, -2.5]) == [(0, struct.pack("<d", 1.1)),
                                           (8, struct.pack("<f", -2.5))]
    assert struct.pack("<d", 1.1) != struct.pack("<f", 1.1) + bytes(4)  # f64, not widened f32
    for size in (1, 2):
        with pytest.raises(Misuse, match="not a float"):
            L.pack_args(with_params(saxpy, size), [1.0])


def test_pack_args_float_out_of_f32_range_is_misuse() -> None:
    k = with_params(cubin("sm_90").kernels["saxpy"], 4)
    with pytest.raises(Misuse):
        L.pack_args(k, [1e40])


def _block64() -> bytes:
    """kernels.cu's Block64: float m[12]; int n; int stride; unsigned long long tag."""
    return struct.pack("<12fiiQ", *[float(i) / 4 for i in range(12)], 77, -3, 0xDEAD_BEEF_F00D)


def test_pack_args_struct_by_value_bytes_of_exact_size() -> None:
    k = cubin("sm_100").kernels["by_value"]  # (Block64 b, float* out, char flag)
    assert [tuple(p) for p in k.params] == [(0, 64), (64, 8), (72, 1)]
    blob = _block64()
    out_region = region(0x7000_0000_0040)
    want = [(0, blob), (64, struct.pack("<Q", out_region.gpu)), (72, b"\xfe")]
    assert L.pack_args(k, [blob, out_region, -2]) == want
    assert L.pack_args(k, [bytearray(blob), out_region, 254]) == want
    assert L.pack_args(k, [memoryview(blob), out_region, -2]) == want
    floats = array.array("f", struct.unpack("<16f", blob))  # any buffer of 64 bytes
    assert L.pack_args(k, [floats, out_region, -2])[0] == (0, blob)


def test_pack_args_misuse() -> None:
    k = cubin("sm_90").kernels["by_value"]
    blob, out = _block64(), region(0x1000)
    with pytest.raises(Misuse, match="takes 3 arguments, not 2"):
        L.pack_args(k, [blob, out])
    with pytest.raises(Misuse, match="takes 3 arguments, not 4"):
        L.pack_args(k, [blob, out, 1, 2])
    with pytest.raises(Misuse, match="64 bytes, given 63"):
        L.pack_args(k, [blob[:63], out, 1])
    with pytest.raises(Misuse, match="64 bytes, given 65"):
        L.pack_args(k, [blob + b"\0", out, 1])
    with pytest.raises(Misuse, match="not a pointer"):
        L.pack_args(k, [blob, out, out])  # a Region into the 1-byte char
    with pytest.raises(Misuse, match="not a pointer"):
        L.pack_args(k, [out, out, 1])  # a Region into the 64-byte struct
    with pytest.raises(Misuse, match="does not fit"):
        L.pack_args(k, [blob, out, 300])
    with pytest.raises(Misuse, match="8 bytes, given 4"):
        L.pack_args(k, [blob, b"\0" * 4, 1])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
def test_fill_args_writes_what_pack_args_packs(arch: str) -> None:
    """fill_args (the launch path) places the same bytes as pack_args, at the parameter base."""
    _, img = image(arch)
    cases: dict[str, list[Any]] = {
        "vadd": [region(0x1000), region(0x7F00_0000_2000), region(0x3000), -5],
        "saxpy": [2.5, region(0x1000), region(0x2000), 0xFFFF_FFFF],
        "by_value": [_block64(), region(0x7000_0000_0040), -2],
        "reduce": [region(0x1000), region(0x2000), 1 << 20],
    }
    for name, args in cases.items():
        fn = img[name]
        base, end = PARAM_BASE[arch], PARAM_BASE[arch] + fn.kernel.param_bytes
        # the driver area and what follows the parameters must stay; the parameters' own
        # bytes (padding between them included) start zero, as in a prepared bank
        bank = bytearray(b"\xcc" * (end + 0x40))
        bank[base:end] = bytes(end - base)
        want = bytearray(bank)
        for offset, data in L.pack_args(fn.kernel, args):
            at = PARAM_BASE[arch] + offset
            want[at : at + len(data)] = data
        L.fill_args(fn, bank, args)
        assert bank == want, name
        L.fill_args(fn, bank, args)  # a second time through the cached packer
        assert bank == want, name
    fn = img["vadd"]
    with pytest.raises(Misuse):
        L.fill_args(fn, bytearray(0x400), [region(0x1000)] * 3)
    with pytest.raises(Misuse):
        L.fill_args(fn, bytearray(0x400), [region(0x1000)] * 3 + [1 << 32])


@pytest.mark.parametrize("args", [
    pytest.param(["blob", "out"], id="too-few"),
    pytest.param(["blob", "out", 1, 2], id="too-many"),
    pytest.param(["short", "out", 1], id="struct-63-bytes"),
    pytest.param(["blob", "out", "out"], id="region-into-char"),
    pytest.param(["out", "out", 1], id="region-into-struct"),
    pytest.param(["blob", "out", 300], id="int-too-big"),
    pytest.param(["blob", "out", -129], id="int-too-small"),
    pytest.param(["blob", "out", 1.5], id="float-into-char"),
])
def test_fill_args_refuses_what_pack_args_refuses(args: list[Any]) -> None:
    _, img = image("sm_90")
    fn = img["by_value"]
    named = {"blob": _block64(), "short": _block64()[:63], "out": region(0x1000)}
    real = [named.get(a, a) if isinstance(a, str) else a for a in args]
    with pytest.raises(Misuse):
        L.pack_args(fn.kernel, real)
    bank = bytearray(0x300)
    with pytest.raises(Misuse):
        L.fill_args(fn, bank, real)


# ---- check_dims -----------------------------------------------------------------------------


def test_check_dims_limits() -> None:
    assert L.check_dims("k", ((1 << 31) - 1, 65535, 65535), (1024, 1, 1)) == (
        ((1 << 31) - 1, 65535, 65535), (1024, 1, 1))
    assert L.check_dims("k", [7], [32]) == ((7, 1, 1), (32, 1, 1))
    assert L.check_dims("k", (2, 3), (4, 5)) == ((2, 3, 1), (4, 5, 1))
    assert L.check_dims("k", (1,), (1, 1024, 1))[1] == (1, 1024, 1)
    assert L.check_dims("k", (1,), (1, 1, 64))[1] == (1, 1, 64)
    assert L.check_dims("k", (1,), (32, 32, 1))[1] == (32, 32, 1)
    assert L.check_dims("k", (1,), (4, 4, 64))[1] == (4, 4, 64)
    for grid in ((1 << 31, 1, 1), (1, 65536, 1), (1, 1, 65536)):
        with pytest.raises(Misuse, match="grid"):
            L.check_dims("k", grid, (1,))
    for block in ((1025,), (1, 1025), (1, 1, 65), (32, 32, 2), (64, 17), (2, 2, 257)):
        with pytest.raises(Misuse, match="block"):
            L.check_dims("k", (1,), block)
    for grid, block in (((0,), (1,)), ((1,), (0,)), ((-1,), (1,)), ((1, 0), (1,)),
                        ((1,), (1, 1, -4)), ((1.0,), (1,)), ((1,), ("32",))):
        with pytest.raises(Misuse, match="positive whole numbers"):
            L.check_dims("k", grid, block)  # type: ignore[arg-type]


# ---- bank0_of, sass_version -------------------------------------------------------------------


@pytest.mark.parametrize(("arch", "bank", "sass"), [
    ("sm_80", (0x00, 0x0C, 0x18, 0x20, 0x28), 0x80),
    ("sm_86", (0x00, 0x0C, 0x18, 0x20, 0x28), 0x86),
    ("sm_89", (0x00, 0x0C, 0x18, 0x20, 0x28), 0x89),
    ("sm_90", (0x00, 0x0C, 0x18, 0x20, 0x28), 0x90),
    ("sm_90a", (0x00, 0x0C, 0x18, 0x20, 0x28), 0x90),
    ("sm_100", (0x360, 0x370, 0x2F0, 0x2F8, 0x37C), 0xA0),
    ("sm_100a", (0x360, 0x370, 0x2F0, 0x2F8, 0x37C), 0xA0),
    ("sm_103", (0x360, 0x370, 0x2F0, 0x2F8, 0x37C), 0xA3),
    ("sm_120", (0x360, 0x370, 0x2F0, 0x2F8, 0x37C), 0xC0),
    ("sm_121", (0x360, 0x370, 0x2F0, 0x2F8, 0x37C), 0xC1),
])
def test_bank0_and_sass_version(arch: str, bank: tuple[int, ...], sass: int) -> None:
    b = L.bank0_of(arch)
    assert (b.block, b.grid, b.shared_window, b.local_window, b.stack) == bank
    assert L.sass_version(arch) == sass


def test_stack_top() -> None:
    assert STACK_POINTER == L.STACK_TOP == 0x1000000 - L.STACK_RESERVE


# ---- relocate --------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHES)
def test_relocate_r_cuda_64_against_visits(arch: str) -> None:
    c = cubin(arch)
    (r,) = c.relocations
    assert (r.type, r.symbol, r.target, r.section) == (L.R_CUDA_64, "visits", None, ".nv.global")
    assert c.globals_size == 4
    bank4_at, _ = c.constants[4]  # the address of `visits` lives in cbank 4
    assert r.offset == bank4_at
    image = bytearray(c.image)
    globals_base = 0x7FFF_AB00_0000
    L.relocate(c, image, CODE_GPU, globals_base)
    assert struct.unpack_from("<Q", image, r.offset)[0] == globals_base + r.nobits_offset + r.addend
    rest = bytearray(image)
    rest[r.offset : r.offset + 8] = c.image[r.offset : r.offset + 8]
    assert rest == c.image  # nothing else changed
    with pytest.raises(CubinError, match="visits"):
        L.relocate(c, bytearray(c.image), CODE_GPU, None)  # its globals were not loaded


def test_relocate_abs32_halves_and_g64() -> None:
    c = cubin("sm_90")
    base, globals_base = 0x7FFF_0012_0000, 0x7FFF_AB00_0000
    text = c.kernels["vadd"].text_offset
    relocs = (
        Relocation(offset=text + 0x10, target=0x100, type=L.R_CUDA_ABS32_LO_32, addend=8,
                   symbol="lo"),
        Relocation(offset=text + 0x20, target=0x100, type=L.R_CUDA_ABS32_HI_32, addend=8,
                   symbol="hi"),
        Relocation(offset=text + 0x30, target=None, type=L.R_CUDA_ABS32_LO_32, addend=4,
                   symbol="visits", nobits_offset=0, section=".nv.global"),
        Relocation(offset=text + 0x40, target=None, type=L.R_CUDA_ABS32_HI_32, addend=4,
                   symbol="visits", nobits_offset=0, section=".nv.global"),
        Relocation(offset=0x80, target=0x200, type=L.R_CUDA_G64, addend=4, symbol="g"),
    )
    fake = dataclasses.replace(c, relocations=relocs)
    image = bytearray(c.image)
    L.relocate(fake, image, base, globals_base)
    target = base + 0x100 + 8
    g = globals_base + 4
    # ABS32_LO/HI_32 patch bits 63:32 of the 64-bit word at r_offset; bits 31:0 stay
    assert image[text + 0x10 : text + 0x14] == c.image[text + 0x10 : text + 0x14]
    assert struct.unpack_from("<I", image, text + 0x14)[0] == target & 0xFFFF_FFFF
    assert image[text + 0x20 : text + 0x24] == c.image[text + 0x20 : text + 0x24]
    assert struct.unpack_from("<I", image, text + 0x24)[0] == target >> 32
    assert struct.unpack_from("<I", image, text + 0x34)[0] == g & 0xFFFF_FFFF
    assert struct.unpack_from("<I", image, text + 0x44)[0] == g >> 32
    assert struct.unpack_from("<Q", image, 0x80)[0] == base + 0x200 + 4
    touched = {text + 0x14 + i for i in range(4)} | {text + 0x24 + i for i in range(4)} | {
        text + 0x34 + i for i in range(4)} | {text + 0x44 + i for i in range(4)} | {
        0x80 + i for i in range(8)}
    assert all(image[i] == c.image[i] for i in range(len(image)) if i not in touched)

    unknown = dataclasses.replace(c, relocations=(
        Relocation(offset=0x80, target=0, type=1, addend=0, symbol="x"),))  # R_CUDA_32
    with pytest.raises(CubinError, match="0x1"):
        L.relocate(unknown, bytearray(c.image), base, globals_base)


# ---- prepare -----------------------------------------------------------------------------------


def _u32s(bank: bytes, at: int) -> tuple[int, ...]:
    return struct.unpack_from("<3I", bank, at)


@pytest.mark.parametrize("arch", ARCHES)
def test_prepare_bank0_driver_area(arch: str) -> None:
    dev, img = image(arch)
    fn = img["vadd"]
    grid, block = (0x12345, 7, 3), (32, 4, 2)
    prep = L.prepare(dev, fn, grid, block, 0)  # type: ignore[arg-type]
    bank = prep.bank
    if int(arch[3:]) >= 100:  # Blackwell moved the driver area (notes 5.7)
        at_block, at_grid, at_shared, at_local, at_sp = 0x360, 0x370, 0x2F0, 0x2F8, 0x37C
    else:
        at_block, at_grid, at_shared, at_local, at_sp = 0x00, 0x0C, 0x18, 0x20, 0x28
    assert _u32s(bank, at_block) == block
    assert _u32s(bank, at_grid) == grid
    assert struct.unpack_from("<Q", bank, at_shared)[0] == SHARED_WINDOW
    assert struct.unpack_from("<Q", bank, at_local)[0] == LOCAL_WINDOW
    assert struct.unpack_from("<I", bank, at_sp)[0] == STACK_POINTER
    # nothing else yet: the parameters are written per launch
    rest = bytearray(bank)
    for at, n in ((at_block, 12), (at_grid, 12), (at_shared, 8), (at_local, 8), (at_sp, 4)):
        rest[at : at + n] = bytes(n)
    assert rest == bytes(len(bank))
    k = fn.kernel
    assert k.param_offset == PARAM_BASE[arch]
    assert len(bank) % 64 == 0
    assert len(bank) >= max(k.param_offset + k.param_bytes, k.constant0_size)


def test_prepare_bank0_sm_90_and_sm_100_explicitly() -> None:
    dev, img = image("sm_90")
    bank = L.prepare(dev, img["vadd"], (9, 8, 7), (6, 5, 4), 0).bank  # type: ignore[arg-type]
    assert bank[0x00:0x0C] == struct.pack("<3I", 6, 5, 4)
    assert bank[0x0C:0x18] == struct.pack("<3I", 9, 8, 7)
    assert bank[0x18:0x20] == struct.pack("<Q", SHARED_WINDOW)
    assert bank[0x20:0x28] == struct.pack("<Q", LOCAL_WINDOW)
    assert bank[0x28:0x2C] == struct.pack("<I", 0xFFFDC0)
    dev, img = image("sm_100")
    bank = L.prepare(dev, img["vadd"], (9, 8, 7), (6, 5, 4), 0).bank  # type: ignore[arg-type]
    assert bank[0x360:0x36C] == struct.pack("<3I", 6, 5, 4)
    assert bank[0x370:0x37C] == struct.pack("<3I", 9, 8, 7)
    assert bank[0x2F0:0x2F8] == struct.pack("<Q", SHARED_WINDOW)
    assert bank[0x2F8:0x300] == struct.pack("<Q", LOCAL_WINDOW)
    assert bank[0x37C:0x380] == struct.pack("<I", 0xFFFDC0)
    assert bank[:0x2F0] == bytes(0x2F0)


def _shared_total(arch: str, kernel: Kernel, dynamic: int) -> int:
    """What the SM must provide: .nv.shared.<k> + dynamic, + the 1 KiB ptxas leaves out of the
    section below sm_90 (notes 2.4)."""
    return kernel.shared_section_bytes + dynamic + (0x400 if int(arch[3:]) < 90 else 0)


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", ["vadd", "reduce", "by_value"])
def test_prepare_qmd_fields(arch: str, name: str) -> None:
    dev, img = image(arch)
    dev.loader.slm = 0x300 if name == "vadd" else 0  # the device's current local memory per thread
    fn = img[name]
    k = fn.kernel
    grid, block, dynamic = (0x1234, 5, 3), (128, 2, 1), 0x310
    prep = L.prepare(dev, fn, grid, block, dynamic)  # type: ignore[arg-type]
    version = QMD_VERSION[arch]
    layout = qmd.LAYOUTS[version]
    assert len(prep.qmd) == layout.size
    q = qmd.Qmd(layout, prep.qmd)
    assert q.get("QMD_MAJOR_VERSION") == version
    assert q.program() == CODE_GPU + k.entry_offset
    assert (q.get("GRID_WIDTH"), q.get("GRID_HEIGHT"), q.get("GRID_DEPTH")) == grid
    assert tuple(q.get(f"CTA_THREAD_DIMENSION{i}") for i in range(3)) == block
    assert q.get("REGISTER_COUNT") == k.registers
    assert q.get("BARRIER_COUNT") == max(k.barriers, 1)
    assert q.get("SASS_VERSION") == L.sass_version(arch)

    total = _shared_total(arch, k, dynamic)
    rounded = -(-total // 0x100) * 0x100
    assert q.get("SHARED_MEMORY_SIZE") << layout.shared_shift == rounded
    low, high = qmd.smem_config(arch, rounded)
    assert q.get("MIN_SM_CONFIG_SHARED_MEM_SIZE") == low
    assert q.get("TARGET_SM_CONFIG_SHARED_MEM_SIZE") == low
    assert q.get("MAX_SM_CONFIG_SHARED_MEM_SIZE") == high == LARGEST_CARVEOUT_KIB[arch] // 4 + 1

    # local memory: MIN_STACK_SIZE + 0x240, rounded to 32, or what the device already gives
    want_local = -(-(k.local_bytes + 0x240) // 32) * 32 if k.local_bytes else 0
    assert prep.local == want_local
    got_local = q.get("SHADER_LOCAL_MEMORY_HIGH_SIZE") << layout.local_shift
    assert got_local == max(want_local, dev.loader.slm)

    # constant buffers: 0 (pointed per launch), 3 (__constant__ taps), 4 (globals' addresses)
    assert q.cbuf(0) == (0, len(prep.bank), True)
    c = cubin(arch)
    off3, size3 = c.constants[3]
    off4, size4 = c.constants[4]
    assert q.cbuf(3) == (CODE_GPU + off3, -(-size3 // 16) * 16, True)
    assert q.cbuf(4) == (CODE_GPU + off4, -(-size4 // 16) * 16, True)
    for i in (1, 2, 5, 6, 7):
        assert q.cbuf(i)[2] is False


def test_prepare_shared_memory_totals() -> None:
    """reduce has 47 KiB of static shared memory: .nv.shared.reduce is 0xbc00 before sm_90 and
    0xc000 (with the reserved 1 KiB) from sm_90 on; the SM is asked for the same either way."""
    for arch in ARCHES:
        dev, img = image(arch)
        k = img["reduce"].kernel
        assert k.shared_section_bytes == (0xBC00 if int(arch[3:]) < 90 else 0xC000), arch
        q = qmd.Qmd(qmd.LAYOUTS[QMD_VERSION[arch]],
                    L.prepare(dev, img["reduce"], (1,), (256,), 0x300).qmd)  # type: ignore[arg-type]
        assert q.get("SHARED_MEMORY_SIZE") << q.layout.shared_shift == 0xC300, arch
        assert q.get("MIN_SM_CONFIG_SHARED_MEM_SIZE") == 64 // 4 + 1  # the 64 KiB carveout


@pytest.mark.parametrize("arch", ARCHES)
def test_prepare_too_much_shared_memory(arch: str) -> None:
    dev, img = image(arch)
    fn = img["reduce"]
    k = fn.kernel
    limit = LARGEST_CARVEOUT_KIB[arch] * 1024
    most = limit - _shared_total(arch, k, 0)  # the most dynamic shared memory that fits
    prep = L.prepare(dev, fn, (1,), (256,), most)  # type: ignore[arg-type]
    q = qmd.Qmd(qmd.LAYOUTS[QMD_VERSION[arch]], prep.qmd)
    assert q.get("SHARED_MEMORY_SIZE") << q.layout.shared_shift == limit
    assert q.get("MIN_SM_CONFIG_SHARED_MEM_SIZE") == LARGEST_CARVEOUT_KIB[arch] // 4 + 1
    with pytest.raises(Misuse, match="shared memory"):
        L.prepare(dev, fn, (1,), (256,), most + 1)  # type: ignore[arg-type]
    with pytest.raises(Misuse, match="shared memory"):
        L.prepare(dev, img["vadd"], (1,), (256,), limit + 1)  # type: ignore[arg-type]
    with pytest.raises(Misuse):
        L.prepare(dev, fn, (1,), (256,), -1)  # type: ignore[arg-type]
    assert qmd.max_shared(arch) == limit - 1024


def test_prepare_refuses_bad_dims() -> None:
    dev, img = image("sm_90")
    fn = img["vadd"]
    for grid, block in (((0,), (1,)), ((1,), (1025,)), ((1 << 31,), (1,)), ((1,), (32, 32, 2))):
        with pytest.raises(Misuse):
            L.prepare(dev, fn, grid, block, 0)  # type: ignore[arg-type]
    assert not fn.prepared


def test_prepare_required_block() -> None:
    """A kernel built with __reqntid__ (EIATTR_REQNTID) launches with that block only."""
    dev, img = image("sm_90")
    plain = img["vadd"]
    fn = dataclasses.replace(plain, kernel=dataclasses.replace(plain.kernel,
                                                               required_block=(32, 2, 1)),
                             prepared={})
    L.prepare(dev, fn, (1,), (32, 2), 0)  # type: ignore[arg-type]
    with pytest.raises(Misuse, match="requires block"):
        L.prepare(dev, fn, (1,), (64,), 0)  # type: ignore[arg-type]


def test_prepare_refuses_block_above_launch_bounds() -> None:
    dev, img = image("sm_90")
    fn = img["reduce"]
    assert fn.kernel.max_threads == 256
    L.prepare(dev, fn, (1,), (256,), 0)  # type: ignore[arg-type]
    with pytest.raises(Misuse):
        L.prepare(dev, fn, (1,), (512,), 0)  # type: ignore[arg-type]


def test_prepare_caches_per_configuration() -> None:
    dev, img = image("sm_90")
    fn = img["by_value"]
    a = L.prepare(dev, fn, (4, 2), (64,), 0)  # type: ignore[arg-type]
    assert L.prepare(dev, fn, (4, 2), (64,), 0) is a  # type: ignore[arg-type]
    assert L.prepare(dev, fn, [4, 2], [64], 0) is a  # type: ignore[arg-type]
    b = L.prepare(dev, fn, (4, 2), (64,), 0x100)  # type: ignore[arg-type]
    assert b is not a and b.qmd != a.qmd
    c = L.prepare(dev, fn, (4, 3), (64,), 0)  # type: ignore[arg-type]
    assert c is not a and c.bank != a.bank
    dev.loader.slm = 0x1000  # the device grew its local memory: the QMD says so
    d = L.prepare(dev, fn, (4, 2), (64,), 0)  # type: ignore[arg-type]
    assert d is not a
    q = qmd.Qmd(qmd.LAYOUTS[4], d.qmd)
    assert q.get("SHADER_LOCAL_MEMORY_HIGH_SIZE") == 0x1000
    assert L.prepare(dev, fn, (4, 2), (64,), 0) is d  # type: ignore[arg-type]
    assert a.local == d.local == -(-(64 + 0x240) // 32) * 32  # by_value: 64-byte frame
    other = img["vadd"]
    assert L.prepare(dev, other, (4, 2), (64,), 0) is not a  # type: ignore[arg-type]


@pytest.mark.parametrize("arch", ARCHES)
def test_function_program_and_cbufs(arch: str) -> None:
    """Image places each kernel's entry and the module's constant banks at the code's address."""
    _, img = image(arch)
    c = cubin(arch)
    for name, k in c.kernels.items():
        fn = img[name]
        assert fn.program == CODE_GPU + k.entry_offset
        assert fn.program % 128 == 0
        banks = {b: (addr, size) for b, addr, size in fn.cbufs}
        assert banks[3] == (CODE_GPU + c.constants[3][0], 32)
        assert banks[4] == (CODE_GPU + c.constants[4][0], 16)  # 8 bytes, rounded up to 16
        assert 0 not in banks
    with pytest.raises(Misuse, match="no kernel"):
        img["nope"]
