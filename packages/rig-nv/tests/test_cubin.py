"""rig_nv.cubin against the fixture cubins in cubins/ (built by cubins/build.sh from kernels.cu).

Every figure is checked against what ptxas -v printed while building that cubin, as recorded in
cubins/kernels.sm_XX.ptxas.txt. No GPU is needed.
"""

from __future__ import annotations

import contextlib
import random
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rig_nv.cubin import Cubin, CubinError, UnknownKernel, parse

CUBINS = Path(__file__).resolve().parent / "cubins"
ARCHES = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
KERNELS = {"vadd", "saxpy", "reduce", "local_array", "grid3d", "by_value"}


@dataclass
class Reported:
    """One entry function's figures in a ptxas -v report."""

    registers: int = -1
    barriers: int = 0
    smem: int = 0
    stack_frame: int = -1
    cumulative_stack: int | None = None
    cmem: dict[int, int] = field(default_factory=dict)


@dataclass
class Report:
    arch: str = ""
    gmem: int = 0
    cmem: dict[int, int] = field(default_factory=dict)
    entries: dict[str, Reported] = field(default_factory=dict)


def _cmem(text: str) -> dict[int, int]:
    return {int(bank): int(n) for n, bank in re.findall(r"(\d+) bytes cmem\[(\d+)\]", text)}


def read_report(arch: str) -> Report:
    """Parse the ptxas -v text build.sh recorded for ``arch``."""
    report = Report()
    entry: str | None = None  # the entry function being compiled
    props: str | None = None  # the function whose properties come next
    frames: dict[str, int] = {}
    for line in (CUBINS / f"kernels.{arch}.ptxas.txt").read_text().splitlines():
        if line.startswith("#"):
            continue
        if m := re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line):
            entry, report.arch = m.group(1), m.group(2)
            report.entries[entry] = Reported()
        elif m := re.search(r"Function properties for (\S+)", line):
            props = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame", line):
            assert props is not None
            frames[props] = int(m.group(1))
        elif m := re.search(r"Used (\d+) registers", line):
            assert entry is not None
            e = report.entries[entry]
            e.registers = int(m.group(1))
            if b := re.search(r"used (\d+) barriers", line):
                e.barriers = int(b.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                e.smem = int(s.group(1))
            if c := re.search(r"(\d+) bytes cumulative stack size", line):
                e.cumulative_stack = int(c.group(1))
            e.cmem = _cmem(line)
        elif m := re.search(r"(\d+) bytes gmem", line):
            report.gmem = int(m.group(1))
            report.cmem = _cmem(line)
    for name, e in report.entries.items():
        e.stack_frame = frames[name]
    return report


def load(arch: str) -> bytes:
    return (CUBINS / f"kernels.{arch}.cubin").read_bytes()


@pytest.fixture(scope="module", params=ARCHES)
def arch(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def cubin(arch: str) -> Cubin:
    return parse(load(arch))


def test_fixtures_and_reports_are_all_there() -> None:
    for a in ARCHES:
        assert (CUBINS / f"kernels.{a}.cubin").is_file(), a
        assert (CUBINS / f"kernels.{a}.ptxas.txt").is_file(), a


def test_arch(arch: str, cubin: Cubin) -> None:
    assert read_report(arch).arch == arch
    assert cubin.arch == arch
    assert cubin.sm == int(arch[3:])


def test_every_kernel_matches_ptxas(arch: str, cubin: Cubin) -> None:
    report = read_report(arch)
    assert set(report.entries) == KERNELS
    assert set(cubin.kernels) == KERNELS
    for name, want in report.entries.items():
        k = cubin.kernel(name)
        assert k.name == name
        assert k.registers == want.registers, name
        assert k.barriers == want.barriers, name
        assert k.shared_bytes == want.smem, name
        assert k.frame_bytes == want.stack_frame, name
        stack = want.cumulative_stack if want.cumulative_stack is not None else want.stack_frame
        assert k.local_bytes == stack, name
        if 0 in want.cmem:  # ptxas 13.0 prints cmem[0] below sm_90 only
            assert k.constant0_size == want.cmem[0], name


def test_module_data_matches_ptxas(arch: str, cubin: Cubin) -> None:
    report = read_report(arch)
    assert ".nv.global.init" not in cubin.section_offsets  # so gmem is .nv.global alone
    assert cubin.globals_size == report.gmem == 4  # one __device__ unsigned int
    for bank, size in report.cmem.items():  # cmem[3] (taps) and cmem[4] (&visits), below sm_90
        assert cubin.constants[bank][1] == size, bank
    assert cubin.constants[3][1] == 32  # __constant__ float taps[8]


def test_shared_memory_section_holds_the_reserve_from_sm_90(arch: str, cubin: Cubin) -> None:
    reserve = 0x400 if cubin.sm >= 90 else 0
    for k in cubin.kernels.values():
        assert k.shared_section_bytes in (0, k.shared_bytes + reserve), k.name
    assert cubin.kernel("reduce").shared_bytes == 47 * 1024
    assert cubin.kernel("reduce").shared_section_bytes == 47 * 1024 + reserve


def test_parameters(arch: str, cubin: Cubin) -> None:
    vadd = cubin.kernel("vadd")
    assert vadd.param_bytes == 28  # three pointers and an int
    assert vadd.params == ((0, 8), (8, 8), (16, 8), (24, 4))
    assert cubin.kernel("saxpy").params == ((0, 4), (8, 8), (16, 8), (24, 4))
    by_value = cubin.kernel("by_value")
    assert by_value.params == ((0, 64), (64, 8), (72, 1))  # the 64-byte struct, float*, char
    assert by_value.param_bytes == 73
    for k in cubin.kernels.values():
        last = k.params[-1]
        assert k.param_bytes == last.offset + last.size, k.name
        assert k.constant0_size == k.param_offset + k.param_bytes, k.name


def test_param_base_per_arch(arch: str, cubin: Cubin) -> None:
    """Where cbank 0's parameters start (EIATTR_PARAM_CBANK); bases measured on nvcc's."""
    want = 0x160 if cubin.sm < 90 else 0x210 if cubin.sm < 100 else 0x380
    assert {k.param_offset for k in cubin.kernels.values()} == {want}


def test_other_attributes(arch: str, cubin: Cubin) -> None:
    assert cubin.kernel("reduce").max_threads == 256  # __launch_bounds__(256)
    assert cubin.kernel("vadd").max_threads is None
    for k in cubin.kernels.values():
        assert k.required_block is None
        assert k.exit_offsets, k.name
        assert all(0 <= e < k.text_size and e % 16 == 0 for e in k.exit_offsets), k.name


def test_image_layout(arch: str, cubin: Cubin) -> None:
    data = load(arch)
    image = cubin.image
    for name, at in cubin.section_offsets.items():
        assert at % 128 == 0, name
        assert 0 <= at < len(image), name
    for k in cubin.kernels.values():
        assert cubin.section_offsets[f".text.{k.name}"] == k.text_offset == k.entry_offset
        assert k.text_size > 0 and k.text_size % 128 == 0, k.name
        assert k.text_offset >= 0 and k.text_offset + k.text_size <= len(image), k.name
        code = image[k.text_offset : k.text_offset + k.text_size]
        assert code in data and any(code), k.name  # the section's bytes, unchanged
        at, size = k.constants[0]
        assert at == cubin.section_offsets[f".nv.constant0.{k.name}"]
        assert size == k.constant0_size and at + size <= len(image)
    offsets = list(cubin.section_offsets.values())
    assert len(set(offsets)) == len(offsets)  # every loaded section has its own place
    for bank, (at, size) in cubin.constants.items():
        assert at == cubin.section_offsets[f".nv.constant{bank}"] and at + size <= len(image)
    assert not any(".nv.merc" in n or ".nv.shared" in n for n in cubin.section_offsets)


def test_relocations(arch: str, cubin: Cubin) -> None:
    """&visits goes into cbank 4 through one R_CUDA_64 against the NOBITS .nv.global."""
    (r,) = cubin.relocations
    assert r.symbol == "visits" and r.type == 2 and r.addend == 0
    assert r.target is None and r.section == ".nv.global" and r.nobits_offset == 0
    assert r.offset == cubin.constants[4][0]


def test_not_elf() -> None:
    for data in (b"", b"\x7fEL", b"hello, world" * 20, bytes(200)):
        with pytest.raises(CubinError, match=r"not an ELF file.*offset 0x0"):
            parse(data)


def test_elf_for_another_machine() -> None:
    data = bytearray(load("sm_90"))
    struct.pack_into("<H", data, 0x12, 62)  # EM_X86_64
    with pytest.raises(CubinError, match="e_machine 62 at offset 0x12"):
        parse(bytes(data))
    data = bytearray(load("sm_90"))
    data[4] = 1  # ELFCLASS32
    with pytest.raises(CubinError, match="ELF64"):
        parse(bytes(data))


@pytest.mark.parametrize("name", ARCHES)
def test_truncated(name: str) -> None:
    data = load(name)
    cuts = {0, 4, 16, 63, 64, 65, len(data) // 2, len(data) - 64, len(data) - 1}
    cuts |= set(range(0, len(data), 211))
    for cut in sorted(cuts):
        with pytest.raises(CubinError, match="offset"):
            parse(data[:cut])


def test_corrupt_bytes_raise_cubin_error_or_parse() -> None:
    """Random damage anywhere never escapes as IndexError, struct.error, ValueError..."""
    rnd = random.Random(5)
    data = load("sm_90")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    for i in range(400):
        damaged = bytearray(data)
        # half the time hit the ELF or section headers, where damage matters most
        lo = rnd.choice([0, shoff]) if i % 2 else 0
        for _ in range(rnd.randint(1, 4)):
            damaged[rnd.randrange(lo, len(data))] = rnd.randrange(256)
        with contextlib.suppress(CubinError):
            parse(bytes(damaged))


def test_unknown_kernel() -> None:
    cubin = parse(load("sm_90"))
    with pytest.raises(UnknownKernel) as caught:
        cubin.kernel("vector_add")
    message = str(caught.value)
    assert "vector_add" in message
    assert all(name in message for name in KERNELS)
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, CubinError)
    assert caught.value.available == tuple(cubin.kernels)
    with pytest.raises(UnknownKernel):
        cubin.kernels["vector_add"]
    assert "vector_add" not in cubin.kernels and "vadd" in cubin.kernels


def with_header(data: bytes, osabi: int, abiversion: int, flags: int) -> bytes:
    b = bytearray(data)
    b[7], b[8] = osabi, abiversion
    struct.pack_into("<I", b, 0x30, flags)
    return bytes(b)


def test_arch_from_both_abis() -> None:
    """e_flags of the old ABI (ptxas <= 12.x) and the new, as measured on nvcc's cubins."""
    data = load("sm_90")
    assert parse(with_header(data, 0x33, 7, 0x00500550)).arch == "sm_80"
    assert parse(with_header(data, 0x33, 7, 0x005A055A)).arch == "sm_90"
    assert parse(with_header(data, 0x33, 7, 0x005A0D5A)).arch == "sm_90a"
    assert parse(with_header(data, 0x41, 8, 0x06005604)).arch == "sm_86"
    assert parse(with_header(data, 0x41, 8, 0x0600640A)).arch == "sm_100a"
    assert parse(with_header(data, 0x41, 8, 0x06007902)).arch == "sm_121"
    with pytest.raises(CubinError, match=r"EI_OSABI 0x0 .*offset 0x7"):
        parse(with_header(data, 0, 0, 0x06005A04))
