"""Cubins read without a GPU: the ELF files that ``nvcc -cubin`` and ``ptxas`` write.

``parse(data)`` gives a :class:`Cubin`: its architecture, each kernel's resources (registers,
shared, local and parameter memory, as ``ptxas -v`` reports them) and a loadable image (every
allocated section laid out in one blob, with the relocations that still apply to it).

Where the format facts come from (no code was taken from any of them):

- ELF64 itself: the System V gABI (header, section headers, ``Elf64_Sym``, ``Elf64_Rel(a)``).
- ``e_machine`` 190 (EM_CUDA), the two ABIs and where the SM number sits in ``e_flags``:
  Mesa ``src/nouveau/cubin/nv_cubin.c`` (OSABI >= 0x41 reads ``(e_flags >> 8) & 0xff``), checked
  against cubins from ptxas 12.9 and 13.0 (old ABI: OSABI 0x33, ABI version 7, SM in bits 7:0,
  0x800 = the 'a' variant; new ABI: OSABI 0x41, ABI version 8, SM in bits 15:8, 0x8 = 'a').
- The ``.nv.info`` record format (u8 format, u8 attribute, u16 value or size) and the codes
  EIATTR_PARAM_CBANK 0x0a, MIN_STACK_SIZE 0x12, KPARAM_INFO 0x17, CRS_STACK_SIZE 0x1e,
  REGCOUNT 0x2f, NUM_BARRIERS 0x4c: Mesa ``nv_cubin_defs.h``; the other names and codes
  (MAX_THREADS 0x05, REQNTID 0x10, FRAME_SIZE 0x11, CBANK_PARAM_SIZE 0x19, EXIT_INSTR_OFFSETS
  0x1c): redplait/denvdis ``test/eiattrs.inc`` (reverse-engineered from nvdisasm), each layout
  measured in ptxas 13.0 output. The KPARAM_INFO size field ``(packed >> 18) & 0x3fff``: Mesa.
- Section names and roles (``.text.<k>``, ``.nv.constantN[.<k>]``, ``.nv.shared.<k>``,
  ``.nv.global``) and the tinygrad loader's habits (``tinygrad/runtime/ops_nv.py``): measured,
  and tinygrad's ``elf_loader`` with ``force_section_align=128``.
- R_CUDA relocation numbers: nvdisasm's machine description as transcribed in denvdis
  ``data/sm70_1.txt`` (R_CUDA_32 = 1, R_CUDA_64 = 2, R_CUDA_G32 = 3, R_CUDA_G64 = 4).
- The 1 KiB of shared memory that ptxas counts inside ``.nv.shared.<k>`` on sm_90 and later but
  leaves out of its ``-v`` figure: measured (notes section 2.4), with the size taken from the
  ``.nv.reservedSmem.cap`` symbol where ptxas writes one (sm_100+).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from rig_edge import RigError

__all__ = ["Cubin", "CubinError", "Kernel", "Param", "Relocation", "UnknownKernel", "parse"]

EM_CUDA = 190  # Mesa nv_cubin.c
_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 2, 4, 8, 9  # gABI
_SHT_PROGBITS = 1
_SHT_CUDA_INFO = 0x70000000  # .nv.info and .nv.info.<k> (measured; Mesa)
_SHF_ALLOC = 0x2
_SHF_MERCURY = 0x10000000  # sm_100+ .nv.merc.* / .nv.capmerc.* copies: never loaded (measured)
_STT_FUNC = 2

# EIATTR codes (see the module docstring for the source of each).
_MAX_THREADS, _PARAM_CBANK, _REQNTID, _FRAME_SIZE, _MIN_STACK_SIZE = 0x05, 0x0A, 0x10, 0x11, 0x12
_KPARAM_INFO, _CBANK_PARAM_SIZE, _EXIT_INSTR_OFFSETS, _CRS_STACK_SIZE = 0x17, 0x19, 0x1C, 0x1E
_REGCOUNT, _NUM_BARRIERS = 0x2F, 0x4C
_EIFMT_SVAL = 0x04  # the only format with a payload; NVAL/BVAL/HVAL records are 4 bytes

_LOAD_ALIGN = 128  # tinygrad's force_section_align; also .text's own sh_addralign
_MAX_GAP = 1 << 24  # how much an image laid out by sh_addr may exceed twice the file's size
_DEFAULT_SMEM_RESERVE = 0x400  # sm_90+ without a .nv.reservedSmem.cap symbol (measured)


class CubinError(RigError):
    """The bytes are not a cubin this parser can read; the message says what and where."""


class UnknownKernel(CubinError, KeyError):
    """No kernel of that name; the message lists the kernels the cubin has."""

    def __init__(self, name: str, available: tuple[str, ...]) -> None:
        names = ", ".join(available) if available else "none"
        super().__init__(f"the cubin has no kernel named {name!r}; its kernels: {names}")
        self.name = name
        self.available = available

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class Param(NamedTuple):
    """One kernel parameter: its offset from the parameter base in cbank 0, and its size."""

    offset: int
    size: int


class Relocation(NamedTuple):
    """A relocation against a loaded section, in image coordinates.

    ``offset`` is where it applies in the image. ``target`` is the image offset of the symbol it
    names, or ``None`` where the symbol is not in the image: then ``nobits_offset`` is its offset
    in its section, which ``section`` names (``.nv.global``; "" for an undefined symbol).
    ``type`` is the R_CUDA number (2 = R_CUDA_64: write the symbol's u64 address + addend). For
    REL sections the addend is the implicit one in the image (whole-word types 1-4), else 0.
    """

    offset: int
    target: int | None
    type: int
    addend: int
    symbol: str
    nobits_offset: int = 0
    section: str = ""


@dataclass(frozen=True)
class Kernel:
    """One kernel's resources, as ``ptxas -v`` reports them, and where its parts sit.

    ``shared_bytes`` is ptxas's ``smem`` (the static ``__shared__`` bytes);
    ``shared_section_bytes`` is the size of ``.nv.shared.<k>``, which on sm_90+ also holds the
    driver's reserved 1 KiB: the shared size to program is it plus the dynamic bytes.
    ``frame_bytes`` is ptxas's "bytes stack frame" (EIATTR_FRAME_SIZE); ``local_bytes`` the
    per-thread stack a launch needs (EIATTR_MIN_STACK_SIZE, callees included; the frame where
    absent). ``text_offset`` / ``text_size`` place ``.text.<k>`` in :attr:`Cubin.image`; the
    entry point is at ``entry_offset``. ``constants`` maps this kernel's banks (0, 2) to
    (image offset, size). ``max_threads`` is the product of EIATTR_MAX_THREADS (the
    ``__launch_bounds__`` limit).
    """

    name: str
    registers: int
    shared_bytes: int
    local_bytes: int
    param_bytes: int
    param_offset: int
    params: tuple[Param, ...]
    constant0_size: int
    text_offset: int
    text_size: int
    entry_offset: int
    shared_section_bytes: int = 0
    frame_bytes: int = 0
    crs_stack_bytes: int = 0
    barriers: int = 0
    max_threads: int | None = None
    required_block: tuple[int, int, int] | None = None
    exit_offsets: tuple[int, ...] = ()
    constants: Mapping[int, tuple[int, int]] = field(default_factory=dict, compare=False)


class _Kernels(Mapping[str, Kernel]):
    """A read-only name -> Kernel mapping whose misses raise :class:`UnknownKernel`."""

    def __init__(self, kernels: dict[str, Kernel]) -> None:
        self._kernels = kernels

    def __getitem__(self, name: str) -> Kernel:
        try:
            return self._kernels[name]
        except KeyError:
            raise UnknownKernel(name, tuple(self._kernels)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._kernels)

    def __len__(self) -> int:
        return len(self._kernels)


@dataclass(frozen=True, eq=False)
class Cubin:
    """A parsed cubin.

    ``image`` holds every loaded (SHF_ALLOC, PROGBITS) section at ``section_offsets[name]``: at
    its ``sh_addr`` where the cubin gives addresses, else packed in section order, each aligned
    to max(sh_addralign, 128). ``.nv.global`` (NOBITS: uninitialised ``__device__`` data) is not
    in it: a loader allocates ``globals_size`` zeroed bytes for it, copies ``image`` and applies
    ``relocations``. ``constants`` maps the module-wide banks (``.nv.constant3``: user
    ``__constant__`` data, ``.nv.constant4``: addresses of globals) to (image offset, size).
    ``sm`` is the SM number (90 for sm_90a).
    """

    arch: str
    sm: int
    kernels: Mapping[str, Kernel]
    image: bytes
    section_offsets: Mapping[str, int]
    relocations: tuple[Relocation, ...]
    constants: Mapping[int, tuple[int, int]]
    globals_size: int

    def kernel(self, name: str) -> Kernel:
        """The kernel named ``name``; :class:`UnknownKernel` lists the others if there is none."""
        return self.kernels[name]


_Section = NamedTuple("_Section", [  # noqa: UP014 (one line per ELF field would be noise)
    ("index", int), ("name", str), ("type", int), ("flags", int), ("addr", int),
    ("offset", int), ("size", int), ("link", int), ("info", int), ("align", int),
    ("header", int),  # the file offset of its section header, for messages
])


_Symbol = NamedTuple(  # noqa: UP014
    "_Symbol", [("name", str), ("info", int), ("shndx", int), ("value", int)]
)


class _Reader:
    """Bounds-checked little-endian reads: every failure is a CubinError naming the offset."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def unpack(self, fmt: str, offset: int, what: str) -> tuple[int, ...]:
        size = struct.calcsize("<" + fmt)
        if offset < 0 or offset + size > len(self.data):
            raise CubinError(f"truncated cubin: {what} at offset {offset:#x} needs {size} "
                             f"bytes, the file has {len(self.data)}")
        return struct.unpack_from("<" + fmt, self.data, offset)

    def read(self, offset: int, size: int, what: str) -> bytes:
        if offset < 0 or size < 0 or offset + size > len(self.data):
            raise CubinError(f"truncated cubin: {what} at offset {offset:#x} spans {size} "
                             f"bytes, the file has {len(self.data)}")
        return self.data[offset : offset + size]

    def section(self, sec: _Section) -> bytes:
        if sec.type == _SHT_NOBITS:
            return b""
        return self.read(sec.offset, sec.size, f"section {sec.name or sec.index}")


def _cstring(table: bytes, index: int, table_offset: int, what: str) -> str:
    end = table.find(b"\0", index)
    if index < 0 or index >= len(table) or end < 0:
        raise CubinError(
            f"{what}: name index {index} is outside its string table at offset {table_offset:#x}"
        )
    return table[index:end].decode("utf-8", "replace")


def _header(r: _Reader) -> tuple[int, str, int, int, int, int]:
    """Check the ELF header; returns (sm, arch, shoff, shentsize, shnum, shstrndx)."""
    if len(r.data) < 4 or r.data[:4] != b"\x7fELF":
        raise CubinError(f"not an ELF file: bytes {r.data[:4]!r} at offset 0x0, not b'\\x7fELF'")
    if len(r.data) < 64:
        raise CubinError(f"truncated cubin: the ELF64 header at offset 0x0 needs 64 bytes, "
                         f"the file has {len(r.data)}")
    ei_class, ei_data, _, osabi, abiversion = r.data[4:9]
    if ei_class != 2 or ei_data != 1:
        raise CubinError(f"not a cubin: ELF class {ei_class} / data {ei_data} at offset 0x4, "
                         "cubins are ELF64 little-endian (2 / 1)")
    (machine,) = r.unpack("H", 0x12, "e_machine")
    if machine != EM_CUDA:
        raise CubinError(f"not a cubin: e_machine {machine} at offset 0x12, not EM_CUDA (190)")
    (flags,) = r.unpack("I", 0x30, "e_flags")
    if osabi == 0x41:  # new ABI (ptxas 13.0 everywhere, 12.8+ for sm_100+): SM in bits 15:8
        sm, accelerated = (flags >> 8) & 0xFF, bool(flags & 0x8)
    elif osabi == 0x33:  # old ABI (ptxas <= 12.x below sm_100): SM in bits 7:0
        sm, accelerated = flags & 0xFF, bool(flags & 0x800)
    else:
        raise CubinError(f"unknown CUDA ELF ABI: EI_OSABI {osabi:#x} (ABI version {abiversion}) "
                         "at offset 0x7, expected 0x33 (version 7) or 0x41 (version 8)")
    if sm == 0:
        raise CubinError(f"no SM number in e_flags {flags:#x} at offset 0x30")
    # The program headers are not needed (sections say everything), but a file cut inside them
    # is truncated all the same: ptxas writes them last.
    (phoff, shoff) = r.unpack("QQ", 0x20, "e_phoff/e_shoff")
    phentsize, phnum = r.unpack("HH", 0x36, "e_phentsize/e_phnum")
    if phnum:
        r.read(phoff, phnum * phentsize, "the program header table")
    shentsize, shnum, shstrndx = r.unpack("HHH", 0x3A, "e_shentsize/e_shnum/e_shstrndx")
    if shnum == 0 or shentsize < 64:
        raise CubinError(f"no usable section table: e_shnum {shnum}, e_shentsize {shentsize} "
                         "at offset 0x3a")
    if shstrndx >= shnum:
        raise CubinError(f"e_shstrndx {shstrndx} at offset 0x3e is not below e_shnum {shnum}")
    return sm, f"sm_{sm}{'a' if accelerated else ''}", shoff, shentsize, shnum, shstrndx


def _sections(r: _Reader, shoff: int, entsize: int, count: int, strndx: int) -> list[_Section]:
    raw = [
        r.unpack("IIQQQQIIQQ", shoff + i * entsize, f"section header {i}") for i in range(count)
    ]
    strtab_hdr = raw[strndx]
    strtab = r.read(strtab_hdr[4], strtab_hdr[5], "the section name table")
    sections = []
    for i, (nm, typ, flags, addr, off, size, link, info, align, _) in enumerate(raw):
        name = _cstring(strtab, nm, strtab_hdr[4], f"section header {i}")
        header = shoff + i * entsize
        sections.append(_Section(i, name, typ, flags, addr, off, size, link, info, align, header))
    return sections


def _symbols(r: _Reader, sections: list[_Section]) -> list[_Symbol]:
    tables = [s for s in sections if s.type == _SHT_SYMTAB]
    if len(tables) != 1:
        raise CubinError(f"a cubin has one symbol table (.symtab); the section table at offset "
                         f"{sections[0].header:#x} lists {len(tables)}")
    symtab = tables[0]
    if symtab.link >= len(sections):
        raise CubinError(f"{symtab.name}'s sh_link {symtab.link} (header at offset "
                         f"{symtab.header:#x}) names no section")
    strsec = sections[symtab.link]
    names, data = r.section(strsec), r.section(symtab)
    symbols = []
    for i in range(len(data) // 24):
        nm, info, _other, shndx, value, _size = struct.unpack_from("<IBBHQQ", data, i * 24)
        name = _cstring(names, nm, strsec.offset, f"symbol {i}") if nm else ""
        symbols.append(_Symbol(name, info, shndx, value))
    return symbols


class _Record(NamedTuple):
    attr: int
    value: int  # the u16 of a 4-byte record; the payload size of an SVAL one
    payload: bytes
    offset: int  # file offset, for messages


def _records(r: _Reader, sec: _Section) -> list[_Record]:
    data, pos, out = r.section(sec), 0, []
    while pos < len(data):
        if pos + 4 > len(data):
            raise CubinError(f"{sec.name}: a record header at offset {sec.offset + pos:#x} "
                             "runs past the section's end")
        fmt, attr, value = struct.unpack_from("<BBH", data, pos)
        payload = b""
        if fmt == _EIFMT_SVAL:
            if pos + 4 + value > len(data):
                raise CubinError(f"{sec.name}: attribute {attr:#x} at offset "
                                 f"{sec.offset + pos:#x} claims {value} bytes past the end")
            payload = data[pos + 4 : pos + 4 + value]
        out.append(_Record(attr, value, payload, sec.offset + pos))
        pos += 4 + len(payload)
    return out


def _words(rec: _Record, sec: _Section, fmt: str) -> tuple[int, ...]:
    """The fields ``fmt`` (a struct format, little-endian) at the start of an SVAL payload."""
    layout = "<" + fmt
    need = struct.calcsize(layout)
    if len(rec.payload) < need:
        raise CubinError(f"{sec.name}: attribute {rec.attr:#x} at offset {rec.offset:#x} has "
                         f"{len(rec.payload)} bytes, needs {need}")
    return struct.unpack_from(layout, rec.payload)


def _layout(r: _Reader, sections: list[_Section]) -> tuple[dict[int, int], bytearray]:
    """Image offsets of the loaded sections (SHF_ALLOC PROGBITS), and the image."""
    loaded = [
        (s, r.section(s)) for s in sections  # reading first checks each size against the file
        if s.type == _SHT_PROGBITS and s.flags & _SHF_ALLOC and not s.flags & _SHF_MERCURY
    ]
    offsets: dict[int, int] = {}
    end = 0
    by_address = any(s.addr for s, _ in loaded)
    for s, _ in loaded:
        align = max(s.align, _LOAD_ALIGN)
        offsets[s.index] = at = s.addr if by_address else -(-end // align) * align
        end = max(end, at + s.size)
        if end > _MAX_GAP + 2 * len(r.data):  # only sh_addr can do this: addresses are corrupt
            raise CubinError(f"section {s.name} (header at {s.header:#x}) would end at image "
                             f"offset {end:#x}, implausibly far for a {len(r.data)}-byte file")
    image = bytearray(end)
    for s, content in loaded:
        image[offsets[s.index] : offsets[s.index] + len(content)] = content
    return offsets, image


def parse(data: bytes) -> Cubin:
    """Parse a cubin; raises :class:`CubinError` for anything that is not a readable cubin."""
    return _Parser(bytes(data)).cubin()


class _Parser:
    def __init__(self, data: bytes) -> None:
        self.r = r = _Reader(data)
        self.sm, self.arch, shoff, shentsize, shnum, shstrndx = _header(r)
        self.sections = _sections(r, shoff, shentsize, shnum, shstrndx)
        self.symbols = _symbols(r, self.sections)
        self.symtab_at = next(s.offset for s in self.sections if s.type == _SHT_SYMTAB)
        self.by_name = {s.name: s for s in self.sections}
        self.offsets, self.image = _layout(r, self.sections)
        # Module-wide attributes in .nv.info: SVAL 8 = u32 function symbol index, u32 value.
        self.module: dict[int, dict[int, int]] = {
            _REGCOUNT: {}, _FRAME_SIZE: {}, _MIN_STACK_SIZE: {}
        }
        for sec in self.sections:
            if sec.type == _SHT_CUDA_INFO and sec.name == ".nv.info":
                for rec in _records(r, sec):
                    if rec.attr in self.module:
                        sym_index, value = _words(rec, sec, "II")
                        self.module[rec.attr][sym_index] = value
        # The shared memory ptxas adds to .nv.shared.<k> but leaves out of its smem figure.
        self.reserve = _DEFAULT_SMEM_RESERVE if self.sm >= 90 else 0
        for sym in self.symbols:
            if sym.name == ".nv.reservedSmem.cap":  # sm_100+ (measured: 0x400)
                self.reserve = sym.value

    def cubin(self) -> Cubin:
        gsec = self.by_name.get(".nv.global")  # NOBITS (measured); were it not, it is loaded
        kernels: dict[str, Kernel] = {}
        constants: dict[int, tuple[int, int]] = {}
        for sec in self.sections:
            if sec.type == _SHT_CUDA_INFO and sec.name.startswith(".nv.info."):
                name = sec.name[len(".nv.info.") :]
                kernels[name] = self.kernel(sec, name)
            m = re.fullmatch(r"\.nv\.constant(\d+)", sec.name)
            if m and sec.index in self.offsets:
                constants[int(m.group(1))] = (self.offsets[sec.index], sec.size)
        section_offsets = {self.sections[i].name: at for i, at in self.offsets.items()}
        return Cubin(
            arch=self.arch, sm=self.sm, kernels=_Kernels(kernels), image=bytes(self.image),
            section_offsets=MappingProxyType(section_offsets),
            relocations=self.relocations(), constants=MappingProxyType(constants),
            globals_size=gsec.size if gsec is not None and gsec.type == _SHT_NOBITS else 0,
        )

    def relocations(self) -> tuple[Relocation, ...]:
        out: list[Relocation] = []
        sections, symbols, offsets = self.sections, self.symbols, self.offsets
        for sec in sections:
            if sec.type not in (_SHT_REL, _SHT_RELA) or sec.info not in offsets:
                continue  # e.g. .rel(a).debug_frame: its target is not loaded
            target = sections[sec.info]
            entsize = 24 if sec.type == _SHT_RELA else 16
            content = self.r.section(sec)
            for pos in range(0, len(content) - entsize + 1, entsize):
                r_offset, r_info = struct.unpack_from("<QQ", content, pos)
                sym_index, rtype = r_info >> 32, r_info & 0xFFFFFFFF
                if sym_index >= len(symbols) or r_offset >= target.size:
                    raise CubinError(
                        f"{sec.name}: the relocation at offset {sec.offset + pos:#x} names "
                        f"symbol {sym_index} at {r_offset:#x} in {target.name}: out of range"
                    )
                at = offsets[sec.info] + r_offset
                if sec.type == _SHT_RELA:
                    (addend,) = struct.unpack_from("<q", content, pos + 16)
                elif rtype in (1, 2, 3, 4):  # R_CUDA_32/64/G32/G64: implicit addend in place
                    width = 8 if rtype in (2, 4) else 4
                    addend = int.from_bytes(self.image[at : at + width], "little")
                else:
                    addend = 0
                sym = symbols[sym_index]
                base = offsets.get(sym.shndx)
                home = sections[sym.shndx].name if 0 < sym.shndx < len(sections) else ""
                out.append(Relocation(
                    at, None if base is None else base + sym.value, rtype, addend, sym.name,
                    0 if base is not None else sym.value, home,
                ))
        return tuple(out)

    def kernel(self, info: _Section, name: str) -> Kernel:
        sections, symbols, offsets = self.sections, self.symbols, self.offsets
        if info.info >= len(sections) or sections[info.info].name != ".text." + name:
            raise CubinError(f"{info.name} (section header at offset {info.header:#x}) links "
                             f"section {info.info}, not .text.{name}")
        text = sections[info.info]
        entry = next(
            (i for i, s in enumerate(symbols)
             if s.name == name and s.shndx == text.index and s.info & 0xF == _STT_FUNC),
            None,
        )
        if entry is None:
            raise CubinError(f"kernel {name}: the symbol table at offset {self.symtab_at:#x} "
                             f"has no function symbol in {text.name}")
        if text.index not in offsets:
            raise CubinError(f"kernel {name}: {text.name} at offset {text.offset:#x} is not "
                             "an allocated PROGBITS section")

        param_offset: int | None = None
        param_bytes: int | None = None
        kparams: list[tuple[int, int, int]] = []
        max_threads: int | None = None
        required_block: tuple[int, int, int] | None = None
        barriers: int | None = None
        crs = 0
        exits: tuple[int, ...] = ()
        for rec in _records(self.r, info):
            if rec.attr == _PARAM_CBANK:  # u32 symbol of .nv.constant0.<k>, u16 offset, u16 size
                _, param_offset, size = _words(rec, info, "IHH")
                param_bytes = size if param_bytes is None else param_bytes
            elif rec.attr == _CBANK_PARAM_SIZE:
                param_bytes = rec.value
            elif rec.attr == _KPARAM_INFO:  # u32 index, u16 ordinal, u16 offset, u32 packed
                _, ordinal, offset, packed = _words(rec, info, "IHHI")
                kparams.append((ordinal, offset, (packed >> 18) & 0x3FFF))
            elif rec.attr == _MAX_THREADS:
                x, y, z = _words(rec, info, "III")
                max_threads = x * max(y, 1) * max(z, 1)
            elif rec.attr == _REQNTID:
                x, y, z = _words(rec, info, "III")
                required_block = (x, y, z)
            elif rec.attr == _NUM_BARRIERS:
                barriers = rec.value & 0xFF
            elif rec.attr == _CRS_STACK_SIZE:
                (crs,) = _words(rec, info, "I")
            elif rec.attr == _EXIT_INSTR_OFFSETS:
                exits = _words(rec, info, f"{len(rec.payload) // 4}I")

        registers = self.module[_REGCOUNT].get(entry)
        if registers is None:  # sm <= 89 also keeps the count in .text's sh_info bits 31:24
            registers = text.info >> 24
        if barriers is None:  # the old ABI keeps it in .text's sh_flags bits 23:20 (Mesa)
            barriers = (text.flags >> 20) & 0xF
        frame = self.module[_FRAME_SIZE].get(entry, 0)

        banks: dict[int, tuple[int, int]] = {}
        for sec in sections:
            m = re.fullmatch(r"\.nv\.constant(\d+)\.(.+)", sec.name)
            if m and m.group(2) == name and sec.index in offsets:
                banks[int(m.group(1))] = (offsets[sec.index], sec.size)
        constant0_size = banks.get(0, (0, 0))[1]
        shared = self.by_name.get(".nv.shared." + name)
        shared_section = shared.size if shared is not None else 0

        return Kernel(
            name=name, registers=registers,
            shared_bytes=max(0, shared_section - self.reserve),
            local_bytes=self.module[_MIN_STACK_SIZE].get(entry, frame),
            param_bytes=param_bytes or 0,
            # no parameters, no PARAM_CBANK: cbank 0 then holds the driver's area alone
            param_offset=param_offset if param_offset is not None else constant0_size,
            params=tuple(Param(off, size) for _, off, size in sorted(kparams)),
            constant0_size=constant0_size,
            text_offset=offsets[text.index], text_size=text.size,
            entry_offset=offsets[text.index] + symbols[entry].value,
            shared_section_bytes=shared_section, frame_bytes=frame, crs_stack_bytes=crs,
            barriers=barriers, max_threads=max_threads, required_block=required_block,
            exit_offsets=exits, constants=MappingProxyType(banks),
        )
