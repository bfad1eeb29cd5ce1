"""Tensor maps on a real GPU (issue 19): a TMA load (cp.async.bulk.tensor, cubins/tma.cu)
through a map rig built, on fresh random data, compared with numpy; and the same kernel
through the map NVIDIA's libcuda encodes for the same tensor, which must be the same 128
bytes and compute the same. libcuda is called here only, to show the two agree."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

import rig_nv
from rig_edge import Memory, Region
from rig_nv import Device

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()

CUBIN = Path(__file__).resolve().parent / "cubins" / "tma.sm_90a.cubin"
BW, BH = 32, 16  # the kernel's tile (tma.cu)
# A tensor whose edges cut tiles short, rows padded past their width (the stride is no
# multiple of the row), so dims, stride and out-of-bounds fill all show in the result.
WIDTH, HEIGHT, PITCH = 200, 100, 1040  # floats, floats, bytes a row
SWIZZLE = {"none": 0, "128b": 3}  # CUtensorMapSwizzle


def put(device: Device, data: bytes) -> Region:
    r = device.alloc(len(data), Memory.DEVICE)
    assert r is not None
    device.upload(r, data)
    return r


def tensor(device: Device) -> tuple[np.ndarray, Region]:
    """A fresh random HEIGHT x WIDTH float32 tensor in GPU memory, rows PITCH bytes apart."""
    a = rng.standard_normal((HEIGHT, WIDTH), dtype=np.float32)
    rows = np.zeros((HEIGHT, PITCH // 4), dtype=np.float32)
    rows[:, :WIDTH] = a
    return a, put(device, rows.tobytes())


def run(device: Device, tmap: bytes, swizzled: bool, scale: float) -> np.ndarray:
    """The kernel's output through ``tmap``: a grid of whole tiles."""
    img = device.load(CUBIN.read_bytes())
    gx, gy = -(-WIDTH // BW), -(-HEIGHT // BH)
    out = device.alloc(gx * BW * gy * BH * 4, Memory.DEVICE)
    assert out is not None
    device.upload(out, bytes(out.length))
    device.launch(img["tma_tile"], (gx, gy), (128,), (tmap, out, int(swizzled), scale)).wait()
    got = np.frombuffer(bytes(device.download(out, out.length)), dtype=np.float32)
    return got.reshape(gy * BH, gx * BW)


def check(got: np.ndarray, a: np.ndarray, scale: float) -> None:
    """``got`` is the tensor, zero past its edges, times scale plus 1 (the GPU fuses the
    multiply and add into one rounding, numpy rounds twice: a few ulps apart at most)."""
    padded = np.zeros((-(-HEIGHT // BH) * BH, -(-WIDTH // BW) * BW), dtype=np.float64)
    padded[:HEIGHT, :WIDTH] = a
    np.testing.assert_allclose(got, padded * scale + 1.0, rtol=1e-6, atol=1e-7)


def rig_map(r: Region, swizzle: str) -> rig_nv.TensorMap:
    return rig_nv.tensor_map(r, "float32", [WIDTH, HEIGHT], [PITCH], [BW, BH], swizzle=swizzle)


@pytest.mark.parametrize("swizzle", list(SWIZZLE))
def test_tma_load_through_a_rig_built_map(device: Device, swizzle: str) -> None:
    """Issue 19: a cp.async.bulk.tensor kernel with a rig-built map, checked against numpy."""
    a, r = tensor(device)
    scale = float(np.float32(rng.uniform(0.5, 2.0)))
    check(run(device, rig_map(r, swizzle), swizzle != "none", scale), a, scale)


def libcuda_map(address: int, swizzle: int) -> bytes:
    """cuTensorMapEncodeTiled's map (cuda.h) of the test's tensor at ``address``."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        pytest.skip("no libcuda.so.1 here")
    u32, u64, vp = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
    cu.cuTensorMapEncodeTiled.argtypes = [
        vp, ctypes.c_int, u32, vp, ctypes.POINTER(u64), ctypes.POINTER(u64),
        ctypes.POINTER(u32), ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_int]
    assert cu.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), vp()
    assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    try:
        assert cu.cuCtxSetCurrent(ctx) == 0
        buf = ctypes.create_string_buffer(128 + 64)  # CUtensorMap is 64-byte aligned
        at = -ctypes.addressof(buf) % 64
        dims, strides = (u64 * 2)(WIDTH, HEIGHT), (u64 * 1)(PITCH)
        box, steps = (u32 * 2)(BW, BH), (u32 * 2)(1, 1)
        rc = cu.cuTensorMapEncodeTiled(ctypes.addressof(buf) + at, 7, 2, address, dims,
                                       strides, box, steps, 0, swizzle, 0, 0)
        assert rc == 0, f"cuTensorMapEncodeTiled: CUresult {rc}"
        return buf.raw[at : at + 128]
    finally:
        # cuda.h names the call cuDevicePrimaryCtxRelease_v2 since CUDA 11.
        release = getattr(cu, "cuDevicePrimaryCtxRelease_v2", None)
        (release or cu.cuDevicePrimaryCtxRelease)(dev)


@pytest.mark.parametrize("swizzle", list(SWIZZLE))
def test_libcuda_map_is_rigs_and_computes_the_same(device: Device, swizzle: str) -> None:
    """Issue 19: the same kernel with a map from libcuda: the same bytes, the same result."""
    a, r = tensor(device)
    theirs = libcuda_map(r.gpu, SWIZZLE[swizzle])
    ours = rig_map(r, swizzle)
    assert bytes(ours) == theirs, f"rig {ours.hex()}\nlibcuda {theirs.hex()}"
    scale = float(np.float32(rng.uniform(0.5, 2.0)))
    with_theirs = run(device, theirs, swizzle != "none", scale)
    check(with_theirs, a, scale)
    np.testing.assert_array_equal(run(device, ours, swizzle != "none", scale), with_theirs)

