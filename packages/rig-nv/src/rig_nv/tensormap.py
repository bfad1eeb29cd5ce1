"""Tensor maps (TMA descriptors, CUDA's CUtensorMap): the 128 bytes Hopper's tensor memory
accelerator reads, built bit for bit as NVIDIA's driver builds them, with no CUDA library.

:func:`tensor_map` is cuTensorMapEncodeTiled, :func:`tensor_map_im2col` is
cuTensorMapEncodeIm2col (cuda.h, CUDA 12+). Dimension 0 is the innermost (contiguous) one,
as in cuda.h; ``strides`` are the byte strides of dimensions 1 and up. Each refuses what the
H200's driver (580.159.04) refuses with a :class:`TensorMapError` naming the rule broken.
The layout was learned from that driver's answers (tests/data/tensor_maps_*.jsonl.gz, made
by scripts/tensor_map_probe.py); docs/tensor-maps.md has its table of fields and bits, and
:data:`FIELDS` lists them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from rig_edge import Misuse, Region

# CUtensorMapDataType (cuda.h) by name: (CUDA's enum value, bytes an element). The packed
# 4- and 6-bit kinds (13-15) are named so that they can be refused by name.
DTYPES: dict[str, tuple[int, int]] = {
    "uint8": (0, 1), "uint16": (1, 2), "uint32": (2, 4), "int32": (3, 4), "uint64": (4, 8),
    "int64": (5, 8), "float16": (6, 2), "float32": (7, 4), "float64": (8, 8),
    "bfloat16": (9, 2), "float32_ftz": (10, 4), "tfloat32": (11, 4), "tfloat32_ftz": (12, 4),
    "16u4_align8b": (13, 1), "16u4_align16b": (14, 1), "16u6_align16b": (15, 1),
}
ALIASES = {"u8": "uint8", "u16": "uint16", "u32": "uint32", "i32": "int32", "u64": "uint64",
           "i64": "int64", "f16": "float16", "fp16": "float16", "half": "float16",
           "f32": "float32", "fp32": "float32", "float": "float32", "f64": "float64",
           "fp64": "float64", "double": "float64", "bf16": "bfloat16", "tf32": "tfloat32"}
# The enums' names, each at its CUDA value (CUtensorMapInterleave, ...Swizzle, ...L2promotion,
# ...FloatOOBfill in cuda.h).
INTERLEAVES = ("none", "16b", "32b")
SWIZZLES = ("none", "32b", "64b", "128b", "128b_atom_32b", "128b_atom_32b_flip_8b",
            "128b_atom_64b")
L2_PROMOTIONS = ("none", "64b", "128b", "256b")
OOB_FILLS = ("zero", "nan")

# The element-format code the map holds (bits 71-74), by CUDA's enum value: tf32 is float32's
# code (or float32_ftz's) with bit 80 set. Learned from the driver; see docs/tensor-maps.md.
_FORMAT = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 9, 9: 10, 10: 8, 11: 7, 12: 8}
_FLOATS = frozenset(range(6, 13))
_SPAN = (0, 32, 64, 128, 128, 128, 128)  # bytes a swizzle pattern's row spans
# What the map says the destination's shared memory must be aligned to (bytes 72-75): one
# whole swizzle pattern (8 rows of its span), 16 bytes with none.
_SMEM_ALIGN = (16, 256, 512, 1024)
# The most bytes one load may bring: 228 KiB, an H100/H200 SM's shared memory (H200 probe
# round 2, 2026-12-01: boxbytes encoded 233472 bytes in many shapes, refused 233712 and up).
MAX_BOX_BYTES = 233472
_CORNER_BITS = {3: 16, 4: 8, 5: 5}  # im2col corner offsets' width by rank (cuda.h's ranges)

# (name, first bit, width, meaning): the fields of the 128 bytes, as docs/tensor-maps.md has
# them. Bits no encoded map ever set are listed in that document.
FIELDS: tuple[tuple[str, int, int, str], ...] = (
    ("address", 0, 57, "global address, as given (under 2^57)"),
    ("im2col", 64, 1, "1 for im2col maps"),
    ("rank_minus_1", 68, 3, "rank - 1"),
    ("format", 71, 4, "element format (_FORMAT)"),
    ("interleave", 75, 2, "CUtensorMapInterleave"),
    ("swizzle", 77, 2, "CUtensorMapSwizzle (0-3)"),
    ("oob_nan", 79, 1, "OOB fill NaN (NAN_REQUEST_ZERO_FMA)"),
    ("tf32", 80, 1, "round to tf32 (TFLOAT32, TFLOAT32_FTZ)"),
    ("l2_promotion", 81, 2, "CUtensorMapL2promotion"),
    ("stride_1_4", 96, 128, "strides of dims 1-4 >> 4, bits 4-35 of each, 32 bits each"),
    ("stride_high", 224, 16, "bits 36-39 of each stride, 4 bits each"),
    ("dim_minus_1", 256, 160, "dims - 1, 32 bits each"),
    ("estride_minus_1", 416, 15, "element strides - 1, 3 bits each"),
    ("box0_minus_1", 440, 8, "box[0] - 1 (tiled) or channels per pixel - 1 (im2col)"),
    ("box_minus_1", 448, 32, "tiled: box[1..4] - 1, 8 bits each"),
    ("lower_corner", 448, 16, "im2col: lower corner offsets packed (16, 8 or 5 bits each)"),
    ("upper_corner", 464, 16, "im2col: upper corner offsets packed likewise"),
    ("pixels_minus_1", 480, 10, "im2col: pixels per column - 1"),
    ("load_bytes", 512, 32, "bytes one load brings"),
    ("smem_align", 576, 32, "shared memory alignment the destination needs"),
)


class TensorMapError(Misuse):
    """A tensor map NVIDIA's driver would refuse; ``rule`` names the rule broken."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"tensor map: {message} (rule {rule})")
        self.rule = rule


class TensorMap(bytes):
    """The 128 bytes of a tensor map: pass it as a kernel argument by value (a
    ``const __grid_constant__ CUtensorMap``), or copy it to memory 64-byte aligned."""

    def __repr__(self) -> str:
        return f"TensorMap({self.hex()})"


def dtype_of(dtype: Any) -> tuple[int, int]:
    """(CUDA's enum value, element bytes) of a dtype named as numpy names it (or a numpy
    dtype), "bf16", "tf32", ... (:data:`ALIASES`); :class:`TensorMapError` if none."""
    name = getattr(dtype, "name", dtype)
    if isinstance(name, str):
        key = ALIASES.get(name.lower(), name.lower())
        if key in DTYPES:
            return DTYPES[key]
    raise TensorMapError("dtype", f"dtype {dtype!r} is none of {', '.join(DTYPES)}")


def _enum(what: str, names: tuple[str, ...], value: Any) -> int:
    if isinstance(value, str) and value.lower() in names:
        return names.index(value.lower())
    raise TensorMapError(what, f"{what} {value!r} is none of {', '.join(names)}")


def _ints(what: str, xs: Any) -> list[int]:
    try:
        return [operator.index(x) for x in xs]
    except TypeError:
        raise TensorMapError(what, f"{what} must be a sequence of whole numbers, not "
                             f"{xs!r}") from None


def _address(base: Region | int, dims: Sequence[int], strides: Sequence[int],
             elem: int) -> int:
    if isinstance(base, Region):
        end = dims[0] * elem + sum((d - 1) * s for d, s in zip(dims[1:], strides, strict=True))
        if end > base.length:
            raise TensorMapError("region", f"the tensor spans {end} bytes, its region "
                                 f"{base.length}")
        return base.gpu
    return _ints("address", [base])[0]


def _common(base: Region | int, dtype: Any, shape: Sequence[int], strides: Sequence[int],
            estrides: Sequence[int] | None, interleave: str, swizzle: str, l2: str, oob: str,
            ranks: range) -> dict[str, Any]:
    """The checks cuTensorMapEncodeTiled and ...Im2col share, and the fields they give.

    Each rule names its source: "cuda.h" for the calls' documented requirements (the CUDA
    driver API's cuTensorMapEncodeTiled / ...Im2col), "round 1" (2026-12-01 21:08) and
    "round 2" (H200 probe round 2, 2026-12-01) for what only the driver's answers show."""
    code, elem = dtype_of(dtype)
    # cuda.h lists the packed types 13-15; the H200's driver refuses them whatever else is
    # given (rounds 1 and 2: dtype, dtype-im2col, dtype-swizzle).
    if code >= 13:
        raise TensorMapError("dtype", f"{dtype!r}: the H200's driver encodes no packed 4- "
                             "or 6-bit type")
    il = _enum("interleave", INTERLEAVES, interleave)
    swz = _enum("swizzle", SWIZZLES, swizzle)
    # cuda.h lists the 128B atom modes; the H200's driver refuses them (rounds 1 and 2).
    if swz > 3:
        raise TensorMapError("swizzle", f"swizzle {swizzle!r}: the H200's driver encodes only "
                             "none, 32b, 64b and 128b")
    l2p = _enum("l2", L2_PROMOTIONS, l2)
    fill = _enum("oob", OOB_FILLS, oob)
    dims = _ints("shape", shape)
    rank = len(dims)
    # cuda.h: rank 1-5 (im2col 3-5), and 3 or more with interleave.
    if rank not in ranks:
        raise TensorMapError("rank", f"rank {rank} is not {ranks.start}-{ranks.stop - 1}")
    if il and rank < 3:
        raise TensorMapError("rank", f"an interleaved map needs rank 3 or more, not {rank}")
    st = _ints("strides", strides)
    if len(st) != rank - 1:
        raise TensorMapError("strides", f"{rank} dims need {rank - 1} strides, not {len(st)}")
    es = [1] * rank if estrides is None else _ints("element_strides", estrides)
    if len(es) != rank:
        raise TensorMapError("element_strides", f"{rank} dims need {rank} element strides, "
                             f"not {len(es)}")
    # cuda.h: dims 1 to 2^32; strides multiples of 16 (of 32 with interleave 32B) under
    # 2^40; element strides 1-8 (round 2: dim-edge, stride-edge, estride agree). Strides
    # need not cover the dim below nor grow (round 2: stride-order encodes).
    for d in dims:
        if not 1 <= d <= 1 << 32:
            raise TensorMapError("shape", f"dims must be 1 to 2^32, not {d}")
    align = 32 if il == 2 else 16
    for s in st:
        if s % align or not 0 <= s < 1 << 40:
            raise TensorMapError("strides", f"strides must be multiples of {align} under "
                                 f"2^40, not {s}")
    for e in es:
        if not 1 <= e <= 8:
            raise TensorMapError("element_strides", f"element strides must be 1 to 8, not {e}")
    addr = _address(base, dims, st, elem)
    # Hopper's virtual addresses are 57 bits: the driver encodes 0 to 2^57 - 16 and refuses
    # every address from 2^57 up (H200 probe round 2, 2026-12-01: addr-edge).
    if not 0 <= addr < 1 << 57:
        raise TensorMapError("address", f"address {addr:#x} is past 57 bits")
    # cuda.h: 16-byte aligned, 32 with interleave 32B.
    if addr % align:
        raise TensorMapError("address", f"address {addr:#x} is not {align}-byte aligned")
    # cuda.h: NaN fill for floating-point dtypes only.
    if fill and code not in _FLOATS:
        raise TensorMapError("oob", f"NaN fill needs a floating-point dtype, not {dtype!r}")
    return {"code": code, "elem": elem, "il": il, "swz": swz, "l2": l2p, "fill": fill,
            "dims": dims, "strides": st, "estrides": es, "addr": addr}


def _inner(c: dict[str, Any], n: int, what: str) -> None:
    """The rules on the inner box dimension: bytes a multiple of 16 and within the span.

    cuda.h asks both with no interleave; the driver asks a multiple of 16 with interleave
    too (round 1). cuda.h asks swizzle 32B of interleave 32B, but the driver encodes every
    swizzle 0-3 with either interleave, of any inner width (round 2: interleave,
    interleave-im2col, il32swz)."""
    nbytes = n * c["elem"]
    if nbytes % 16:
        raise TensorMapError("inner", f"{what} {n} x {c['elem']} bytes is not a multiple of 16")
    span = _SPAN[c["swz"]]
    if c["il"] == 0 and span and nbytes > span:
        raise TensorMapError("swizzle", f"{what} {n} x {c['elem']} bytes exceeds the "
                             f"{span}-byte swizzle span")


def _load_bytes(n: int) -> int:
    """Bytes one load brings, within the limit (round 2: boxbytes, MAX_BOX_BYTES)."""
    if n > MAX_BOX_BYTES:
        raise TensorMapError("box", f"a load of {n} bytes exceeds {MAX_BOX_BYTES}")
    return n


def _pack(c: dict[str, Any], im2col: bool, inner: int, tail: int, load: int) -> TensorMap:
    """The 128 bytes from checked fields (docs/tensor-maps.md)."""
    rank, code = len(c["dims"]), c["code"]
    flags = (int(im2col) | (rank - 1) << 4 | _FORMAT[code] << 7 | c["il"] << 11
             | c["swz"] << 13 | c["fill"] << 15 | int(code in (11, 12)) << 16 | c["l2"] << 17)
    m = c["addr"] | flags << 64
    for i, s in enumerate(c["strides"]):
        m |= (s >> 4 & 0xFFFFFFFF) << (96 + 32 * i) | (s >> 36) << (224 + 4 * i)
    for i, d in enumerate(c["dims"]):
        m |= (d - 1) << (256 + 32 * i)
    for i, e in enumerate(c["estrides"]):
        m |= (e - 1) << (416 + 3 * i)
    m |= (inner - 1) << 440 | tail << 448 | load << 512 | _SMEM_ALIGN[c["swz"]] << 576
    return TensorMap(m.to_bytes(128, "little"))


def tensor_map(base: Region | int, dtype: Any, shape: Sequence[int], strides: Sequence[int],
               box: Sequence[int], *, element_strides: Sequence[int] | None = None,
               interleave: str = "none", swizzle: str = "none", l2: str = "none",
               oob: str = "zero") -> TensorMap:
    """A tiled tensor map, as cuTensorMapEncodeTiled makes it.

    ``base`` is the tensor's region (the tensor must fit it) or GPU address; ``shape`` its
    dims (1-5, dim 0 innermost); ``strides`` the byte strides of dims 1 and up; ``box`` the
    elements one load traverses per dim; ``element_strides`` the traversal steps (1 each by
    default). Raises :class:`TensorMapError` (a Misuse) naming the rule broken.
    """
    c = _common(base, dtype, shape, strides, element_strides, interleave, swizzle, l2, oob,
                range(1, 6))
    bx = _ints("box", box)
    if len(bx) != len(c["dims"]):
        raise TensorMapError("box", f"{len(c['dims'])} dims need {len(c['dims'])} box sizes, "
                             f"not {len(bx)}")
    for b in bx:
        if not 1 <= b <= 256:
            raise TensorMapError("box", f"box sizes must be 1 to 256, not {b}")
    _inner(c, bx[0], "box[0]")
    # The load's bytes count floor(box / element stride) elements a dim, 0 where the box is
    # under the stride: the driver's maps hold this, and its limit counts it too (round 2:
    # box-under-estride*, and some 600 maps encoded whose ceil count is over the limit).
    load = c["elem"]
    for b, e in zip(bx, c["estrides"], strict=True):
        load *= b // e
    tail = 0
    for i, b in enumerate(bx[1:]):
        tail |= (b - 1) << (8 * i)
    return _pack(c, False, bx[0], tail, _load_bytes(load))


def tensor_map_im2col(base: Region | int, dtype: Any, shape: Sequence[int],
                      strides: Sequence[int], *, lower: Sequence[int], upper: Sequence[int],
                      channels: int, pixels: int,
                      element_strides: Sequence[int] | None = None, interleave: str = "none",
                      swizzle: str = "none", l2: str = "none", oob: str = "zero") -> TensorMap:
    """An im2col tensor map, as cuTensorMapEncodeIm2col makes it.

    ``shape`` is 3-5 dims, innermost first (C, W, H, D, N as the rank has them); ``lower`` and
    ``upper`` the bounding box's corner offsets, one per spatial dim (W first); ``channels``
    per pixel and ``pixels`` per column what one load brings. Raises :class:`TensorMapError`
    (a Misuse) naming the rule broken.
    """
    c = _common(base, dtype, shape, strides, element_strides, interleave, swizzle, l2, oob,
                range(3, 6))
    rank = len(c["dims"])
    lo, up = _ints("lower", lower), _ints("upper", upper)
    bits = _CORNER_BITS[rank]
    # cuda.h: corner offsets in 16, 8 or 5 signed bits by rank; channels 1-256, pixels
    # 1-1024. Neither is held to dim 0 or the box (round 2: channels-vs-dim0, pixels-vs-box).
    for name, xs in (("lower", lo), ("upper", up)):
        if len(xs) != rank - 2:
            raise TensorMapError("corner", f"rank {rank} needs {rank - 2} {name} offsets, "
                                 f"not {len(xs)}")
        for v in xs:
            if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
                raise TensorMapError("corner", f"{name} offset {v} is not within "
                                     f"[{-(1 << (bits - 1))}, {(1 << (bits - 1)) - 1}]")
    # Each spatial dim's box must not be empty: dim + upper > lower, as the driver computes
    # it, dim + upper wrapped to a signed 32-bit number, then compared (H200 probe round 2,
    # 2026-12-01, area-dim-edge: with lower 0, upper -1 a dim of 2^31 encodes; with lower 1,
    # upper 0 it is refused; 2^32 - 1 encodes with lower -2, upper 2). With interleave offset
    # i pairs with dim i, not i + 1 (round 1; round 2's area-dim-edge agrees).
    first = 0 if c["il"] else 1
    for d, a, b in zip(c["dims"][first:], lo, up, strict=False):
        far = (d + b + (1 << 31)) % (1 << 32) - (1 << 31)
        if far <= a:
            raise TensorMapError("corner", f"the bounding box is empty: dim {d} + upper {b} "
                                 f"is {far} as a signed 32-bit number, not past lower {a}")
    ch, px = _ints("channels", [channels])[0], _ints("pixels", [pixels])[0]
    if not 1 <= ch <= 256:
        raise TensorMapError("channels", f"channels per pixel must be 1 to 256, not {ch}")
    if not 1 <= px <= 1024:
        raise TensorMapError("pixels", f"pixels per column must be 1 to 1024, not {px}")
    _inner(c, ch, "channels")
    mask = (1 << bits) - 1
    packed_lo = sum((v & mask) << (bits * i) for i, v in enumerate(lo))
    packed_up = sum((v & mask) << (bits * i) for i, v in enumerate(up))
    tail = packed_lo | packed_up << 16 | (px - 1) << 32
    return _pack(c, True, ch, tail, _load_bytes(c["elem"] * ch * px))


def for_triton(address: int, swizzle: int, elem_size: int, elem_type: int,
               block_size: Sequence[int], shape: Sequence[int], strides: Sequence[int],
               padding: int) -> TensorMap:
    """The map Triton's launcher builds for a host tensor descriptor, taking what its
    ``fill_tma_descriptor`` takes (triton/backends/nvidia/driver.c, Triton 3.6): sizes and
    element strides outermost first, CUDA's dtype and swizzle values, padding 1 for NaN.
    It asks for no interleave and 128-byte L2 promotion. Raises :class:`TensorMapError`."""
    names = {code: name for name, (code, _) in DTYPES.items()}
    if elem_type not in names or DTYPES[names[elem_type]][1] != elem_size:
        raise TensorMapError("dtype", f"Triton's element type {elem_type} of {elem_size} "
                             "bytes is no tensor map dtype")
    if not 0 <= swizzle < len(SWIZZLES):
        raise TensorMapError("swizzle", f"Triton's swizzle {swizzle} is no CUtensorMapSwizzle")
    inner = [elem_size * s for s in _ints("strides", strides)[-2::-1]]
    return tensor_map(address, names[elem_type], list(shape)[::-1], inner,
                      list(block_size)[::-1], swizzle=SWIZZLES[swizzle], l2="128b",
                      oob="nan" if padding == 1 else "zero")
