"""Kernel arguments by type: how each is converted into its parameter's bytes.

Without a signature a Region is its GPU address, an int fills its parameter (signed or not), a
float is a 4- or 8-byte float by the parameter's size, a numpy scalar keeps its dtype (its size
must be the parameter's) and anything else is copied as bytes of the parameter's exact size.
A signature (Triton's type names, or a string such as ``"*fp32,*fp32,i32"``) fixes each
parameter's type: Python ints and floats are converted to it, numpy scalars must have its
dtype, and other kinds are refused. Type names and their packing are Triton 3.6's
(triton/backends/nvidia/driver.py: ty_to_cpp, pack_fp16/bf16/fp32/fp64). numpy is never
imported here: a numpy scalar is known by its class once numpy is loaded.
"""

from __future__ import annotations

import math
import operator
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rig_edge import Misuse, Region

__all__ = ["TYPES", "parse_signature"]

# Triton's scalar types: (struct code, size, kind); kind "i" integer, "f" float.
TYPES: dict[str, tuple[str, int, str]] = {
    "i1": ("b", 1, "i"), "i8": ("b", 1, "i"), "i16": ("h", 2, "i"), "i32": ("i", 4, "i"),
    "i64": ("q", 8, "i"), "u1": ("B", 1, "i"), "u8": ("B", 1, "i"), "u16": ("H", 2, "i"),
    "u32": ("I", 4, "i"), "u64": ("Q", 8, "i"), "fp16": ("e", 2, "f"), "bf16": ("H", 2, "f"),
    "fp32": ("f", 4, "f"), "f32": ("f", 4, "f"), "fp64": ("d", 8, "f"),
}
TENSOR_MAP = "nvTmaDesc"  # a CUtensorMap by value: 128 bytes
TENSOR_MAP_BYTES = 128
# numpy dtype names each Triton type accepts (a numpy scalar keeps its dtype).
_NUMPY = {"i1": ("bool", "int8"), "i8": ("int8",), "i16": ("int16",), "i32": ("int32",),
          "i64": ("int64",), "u1": ("bool", "uint8"), "u8": ("uint8",), "u16": ("uint16",),
          "u32": ("uint32",), "u64": ("uint64",), "fp16": ("float16",), "fp32": ("float32",),
          "f32": ("float32",), "fp64": ("float64",)}
_UINT = {1: "B", 2: "H", 4: "I", 8: "Q"}
F32_MAX = 3.4028234663852886e38
GPU_ADDRESS = operator.attrgetter("gpu")  # a Region's GPU address

Converter = Callable[[Any], Any]


def parse_signature(signature: str | Sequence[str]) -> tuple[str, ...]:
    """Each parameter's type from ``"*fp32,*fp32,i32"`` or a sequence of type names;
    :class:`Misuse` names one that is not Triton's."""
    types = tuple(t.strip() for t in (signature.split(",") if isinstance(signature, str)
                                      else signature))
    for t in types:
        if not isinstance(t, str) or not (t.startswith("*") or t in TYPES or t == TENSOR_MAP):
            raise Misuse(f"signature type {t!r} is not one of Triton's (*T, "
                         f"{', '.join(TYPES)}, {TENSOR_MAP})")
    return types


def size_of(ty: str) -> int:
    """The bytes a parameter of signature type ``ty`` takes."""
    if ty.startswith("*"):
        return 8
    return TENSOR_MAP_BYTES if ty == TENSOR_MAP else TYPES[ty][1]


def numpy_dtype(kind: type) -> str | None:
    """The dtype name of a numpy scalar type, or None for any other type."""
    np = sys.modules.get("numpy")
    if np is None or not issubclass(kind, np.generic):
        return None
    return str(np.dtype(kind))


def int_of(name: str, i: int, size: int) -> Converter:
    low, high, mask = -(1 << (8 * size - 1)), 1 << (8 * size), (1 << (8 * size)) - 1

    def conv(v: int) -> int:
        if not low <= v < high:
            raise Misuse(f"{name} argument {i}: {v} does not fit {size} bytes")
        return v & mask

    return conv


def _signed_of(name: str, i: int, code: str, size: int) -> Converter:
    """An int checked against its type's own range (``code``: a struct integer code)."""
    signed = code.islower()
    low = -(1 << (8 * size - 1)) if signed else 0
    high = (1 << (8 * size - 1)) if signed else (1 << (8 * size))

    def conv(v: int) -> int:
        v = operator.index(v)
        if not low <= v < high:
            raise Misuse(f"{name} argument {i}: {v} is outside its type's [{low}, {high})")
        return v

    return conv


def float_of(name: str, i: int, size: int) -> Converter:
    def conv(v: float) -> float:
        v = float(v)
        if size == 4 and math.isfinite(v) and abs(v) > F32_MAX:
            raise Misuse(f"{name} argument {i}: {v} is beyond a 4-byte float's range")
        return v

    return conv


def _bf16_of(name: str, i: int) -> Converter:
    f32 = float_of(name, i, 4)

    def conv(v: float) -> int:  # Triton's pack_bf16: the float32's top half, truncated
        return int.from_bytes(struct.pack("<f", f32(v)), "little") >> 16

    return conv


def bytes_of(name: str, i: int, size: int) -> Converter:
    def conv(v: Any) -> bytes:
        try:
            data = bytes(memoryview(v).cast("B"))
        except TypeError:
            raise Misuse(f"{name} argument {i} is a {size}-byte value: pass bytes, "
                         f"not {type(v).__name__}") from None
        if len(data) != size:
            raise Misuse(f"{name} argument {i} is {size} bytes, given {len(data)}")
        return data

    return conv


def field(name: str, i: int, kind: type, size: int, ty: str | None = None) -> tuple[
        str, Converter]:
    """The struct code and converter that write an argument of type ``kind`` into parameter
    ``i`` of ``size`` bytes (``ty``: its signature type, if any); :class:`Misuse` when the
    kind cannot go there."""
    where = f"{name} argument {i}"
    if ty is not None:
        return _typed(where, name, i, kind, size, ty)
    dtype = numpy_dtype(kind)
    if dtype is not None:
        code = _numpy_code(where, dtype)
        if struct.calcsize(code) != size:
            raise Misuse(f"{where} is {size} bytes, given a numpy {dtype} "
                         f"({struct.calcsize(code)}): numpy scalars keep their dtype")
        return code, (float_of(name, i, size) if code in "efd"
                      else _signed_of(name, i, code, size))
    if issubclass(kind, Region):
        if size != 8:
            raise Misuse(f"{where} is {size} bytes: not a pointer")
        return "Q", GPU_ADDRESS
    if issubclass(kind, int) and size in _UINT:
        return _UINT[size], int_of(name, i, size)
    if issubclass(kind, float):
        if size not in (4, 8):
            raise Misuse(f"{where} is {size} bytes: not a float")
        return ("f" if size == 4 else "d"), float_of(name, i, size)
    return f"{size}s", bytes_of(name, i, size)


def _numpy_code(where: str, dtype: str) -> str:
    codes = {"bool": "?", "int8": "b", "uint8": "B", "int16": "h", "uint16": "H",
             "int32": "i", "uint32": "I", "int64": "q", "uint64": "Q", "float16": "e",
             "float32": "f", "float64": "d"}
    try:
        return codes[dtype]
    except KeyError:
        raise Misuse(f"{where}: a numpy {dtype} is no kernel scalar") from None


def _typed(where: str, name: str, i: int, kind: type, size: int, ty: str) -> tuple[
        str, Converter]:
    if ty.startswith("*"):
        if size != 8:
            raise Misuse(f"{where} is {size} bytes, but the signature says {ty}")
        if issubclass(kind, Region):
            return "Q", GPU_ADDRESS
        if issubclass(kind, int) and numpy_dtype(kind) is None:  # a raw address, as Triton
            return "Q", int_of(name, i, 8)
        raise Misuse(f"{where} is a {ty} pointer: pass a Region, not {kind.__name__}")
    if ty == TENSOR_MAP:
        if size != TENSOR_MAP_BYTES:
            raise Misuse(f"{where} is {size} bytes, not a {TENSOR_MAP_BYTES}-byte tensor map")
        return f"{size}s", bytes_of(name, i, size)
    code, width, sort = TYPES[ty]
    if width != size:
        raise Misuse(f"{where} is {size} bytes, but the signature says {ty} ({width})")
    dtype = numpy_dtype(kind)
    if dtype is not None:
        if dtype not in _NUMPY.get(ty, ()):
            raise Misuse(f"{where} is {ty}: a numpy {dtype} keeps its dtype, pass "
                         f"{' or '.join(_NUMPY.get(ty, ('a Python number',)))}")
    elif issubclass(kind, bool | int):
        pass  # an int goes into an integer or a float
    elif not (issubclass(kind, float) and sort == "f"):
        raise Misuse(f"{where} is {ty}, not {kind.__name__}")
    if ty == "bf16":
        return code, _bf16_of(name, i)
    if sort == "f":
        return code, float_of(name, i, size)
    return code, _signed_of(name, i, code, size)
