"""Scalars by type (issue 18): numpy scalars keep their dtype, and a function given a signature
converts Python numbers to it and refuses other kinds. Expected bytes are worked by hand from
IEEE 754 and Triton 3.6's packing (driver.py: pack_fp16, pack_bf16 truncates)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rig_edge import Memory, Misuse, Region
from rig_nv import launch as L  # noqa: N812
from rig_nv.cubin import Kernel, Param, parse

HERE = Path(__file__).resolve().parent
SAXPY = parse((HERE / "cubins" / "kernels.sm_90.cubin").read_bytes()).kernels["saxpy"]
X = Region(gpu=0x7000_0000_1000, host=None, length=256, kind=Memory.DEVICE)


def fn_of(kernel: Kernel, signature: str | None = None) -> L.Function:
    fn = L.Function(image=None, kernel=kernel, program=0, cbufs=())  # type: ignore[arg-type]
    return fn.typed(signature) if signature else fn


def kernel(*sizes: int) -> Kernel:
    params, at = [], 0
    for size in sizes:
        at = -(-at // min(size, 8)) * min(size, 8)
        params.append(Param(at, size))
        at += size
    return SAXPY.__class__(**{**SAXPY.__dict__, "params": tuple(params), "param_bytes": at})


def packed(fn: L.Function, args: tuple[Any, ...]) -> bytes:
    bank = bytearray(fn.kernel.param_offset + fn.kernel.param_bytes)
    L.fill_args(fn, bank, args)
    return bytes(bank[fn.kernel.param_offset :])


def test_numpy_scalars_keep_their_dtype() -> None:
    """Issue 18: numpy scalars keep their dtype; an np.float32 into an 8-byte parameter is
    Misuse, as an np.int64 into a 4-byte one."""
    fn = fn_of(kernel(4, 4, 8, 2))
    got = packed(fn, (np.float32(5), np.int32(-1), np.float64(0.5), np.float16(1.5)))
    assert got == struct.pack("<fid", 5.0, -1, 0.5) + b"\x00\x3e"
    with pytest.raises(Misuse, match="8 bytes, given a numpy float32"):
        packed(fn_of(kernel(8)), (np.float32(5),))
    with pytest.raises(Misuse, match="4 bytes, given a numpy int64"):
        packed(fn_of(kernel(4)), (np.int64(5),))
    with pytest.raises(Misuse, match="4 bytes, given a numpy float64"):
        packed(fn_of(kernel(4)), (np.float64(5),))  # a float subclass: its dtype all the same


def test_a_signature_converts_python_numbers_and_refuses_wrong_kinds() -> None:
    """Issue 18: given "*fp32,*fp32,i32"-style signatures, Python ints and floats are converted
    to the parameter's type and wrong kinds refused (2 for a float packs 2.0; 2.0 for an int,
    an np.float32 for an i32 and an np.float64 for an fp32 are Misuse)."""
    fn = fn_of(SAXPY, "fp32,*fp32,*fp32,i32")  # saxpy(float a, const float* x, float* y, int n)
    assert packed(fn, (2, X, X, 7)) == struct.pack("<fxxxxQQi", 2.0, X.gpu, X.gpu, 7)
    assert packed(fn, (np.float32(2), X, X, np.int32(7))) == packed(fn, (2.0, X, X, 7))
    for bad, match in (((2.0, X, X, 7.0), "is i32, not float"),
                       ((2.0, X, X, np.float32(7)), "numpy float32 keeps its dtype"),
                       ((np.float64(2), X, X, 7), "numpy float64 keeps its dtype"),
                       ((2.0, 5.0, X, 7), "pass a Region, not float"),
                       ((2.0, X, X, 1 << 31), "outside its type's")):
        with pytest.raises(Misuse, match=match):
            packed(fn, bad)


def test_half_precision_packs_as_triton_does() -> None:
    fn = fn_of(kernel(2, 2, 1, 1), "fp16,bf16,i1,u8")
    assert packed(fn, (1.5, 1.00390625, True, 255)) == b"\x00\x3e\x80\x3f\x01\xff"


def test_a_signature_must_fit_the_kernel() -> None:
    with pytest.raises(Misuse, match="takes 4 arguments; the signature names 3"):
        fn_of(SAXPY, "fp32,*fp32,*fp32")
    with pytest.raises(Misuse, match="argument 3 is 4 bytes, not a i64"):
        fn_of(SAXPY, "fp32,*fp32,*fp32,i64")
    with pytest.raises(Misuse, match="'f16' is not one of Triton's"):
        fn_of(SAXPY, "f16,*fp32,*fp32,i32")


def test_a_typed_function_launches_with_converted_arguments(dev: Any) -> None:
    """The device's fast path (a prepared configuration, its packer cached) converts by the
    signature too."""
    d, _ = dev
    img = d.load((HERE / "cubins" / "kernels.sm_90.cubin").read_bytes())
    fn = img["saxpy"].typed("fp32,*fp32,*fp32,i32")
    x, y = d.alloc(256), d.alloc(256)
    for _ in range(2):
        d.launch(fn, (1,), (64,), (3, x, y, 64)).wait()
    prep = L.prepare(d, fn, (1,), (64,), 0)
    at = prep.slots.at[prep.slots.turn - 1] + 512 + fn.kernel.param_offset
    assert struct.unpack_from("<f", d.timeline.pool.view, at) == (3.0,)
    with pytest.raises(Misuse, match="is i32, not float"):
        d.launch(fn, (1,), (64,), (3, x, y, 64.0))
