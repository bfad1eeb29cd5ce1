"""Hopper's launch features on the H200 (issue 18): clusters, cooperative grids, Triton's
kernels. Fresh random data every time, compared with numpy. Kernels: rig-nv's fixtures
(tests/cubins/hopper.cu, tests/triton/*.cubin)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rig_edge import Memory, Region
from rig_nv import Device
from rig_nv import triton as rt
from rig_nv.launch import Image

pytestmark = pytest.mark.gpu
rng = np.random.default_rng()
TESTS = Path(__file__).resolve().parents[2] / "rig-nv" / "tests"


def put(device: Device, array: np.ndarray) -> Region:
    r = device.alloc(max(array.nbytes, 1), Memory.DEVICE)
    assert r is not None
    device.upload(r, array.tobytes()).wait()
    return r


def get(device: Device, r: Region, dtype: type, count: int) -> np.ndarray:
    return np.frombuffer(bytes(device.download(r, count * np.dtype(dtype).itemsize)),
                         dtype=dtype)


def hopper(device: Device) -> Image:
    return device.load((TESTS / "cubins" / "hopper.sm_90.cubin").read_bytes())


def triton_kernel(device: Device, name: str) -> rt.TritonKernel:
    meta = json.loads((TESTS / "triton" / f"{name}.json").read_text())
    return rt.load(device, (TESTS / "triton" / f"{name}.cubin").read_bytes(),
                   meta["metadata"], meta["signature"])


def test_cluster_ctas_read_each_others_shared_memory(device: Device) -> None:
    """cluster_swap (__cluster_dims__(2,1,1)): each CTA reads its neighbour's shared memory
    through map_shared_rank; cluster.num_blocks() is 2, block_rank() the CTA's rank."""
    img = hopper(device)
    blocks = 264
    x = rng.integers(0, 1000, blocks * 128, dtype=np.int32)
    rin, rout = put(device, x), device.alloc(x.nbytes, Memory.DEVICE)
    assert rout is not None
    device.launch(img["cluster_swap"], (blocks,), (128,), (rin, rout)).wait()
    b = np.arange(blocks * 128) // 128
    t = np.arange(blocks * 128) % 128
    want = x[(b ^ 1) * 128 + t] + 2 * 1000 + (b % 2) * 100000
    np.testing.assert_array_equal(get(device, rout, np.int32, blocks * 128), want)


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 2, 1), (8, 1, 1)])
def test_cluster_values_each_cta_sees(device: Device, cluster: tuple[int, int, int]) -> None:
    """cluster_probe: the cluster's shape, index, rank, count, the grid in clusters and
    %is_explicit_cluster, as bank 0 and the hardware give them."""
    img = hopper(device)
    grid = (16, 4, 2)
    n = grid[0] * grid[1] * grid[2]
    out = device.alloc(n * 24 * 4, Memory.DEVICE)
    assert out is not None
    device.launch(img["cluster_probe"], grid, (32,), (out,), cluster=cluster).wait()
    got = get(device, out, np.uint32, n * 24).reshape(n, 24)
    size = cluster[0] * cluster[1] * cluster[2]
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                p = got[x + grid[0] * (y + grid[1] * z)]
                idx = (x % cluster[0], y % cluster[1], z % cluster[2])
                assert tuple(p[0:3]) == cluster
                assert tuple(p[3:6]) == idx
                assert p[6] == size and p[8] == size * 32
                assert p[7] == idx[0] + cluster[0] * (idx[1] + cluster[1] * idx[2])
                assert tuple(p[9:12]) == tuple(g // c for g, c in zip(grid, cluster,
                                                                      strict=True))
                assert tuple(p[12:15]) == (x // cluster[0], y // cluster[1], z // cluster[2])
                assert p[15] == 1


def test_a_cooperative_grid_syncs_across_the_gpu(device: Device) -> None:
    """grid_sum: every block of the largest cooperative grid adds its part, grid.sync(), then
    block 0 sums the parts: the sum of fresh random data, twice (the workspace reused)."""
    img = hopper(device)
    fn = img["grid_sum"]
    blocks = fn.max_active_blocks(256) * device.sm_count
    n = 1 << 22
    for _ in range(2):
        x = rng.random(n, dtype=np.float32)
        rx, part = put(device, x), put(device, np.zeros(blocks, np.float32))
        out = device.alloc(4, Memory.DEVICE)
        assert out is not None
        device.launch(fn, (blocks,), (256,), (rx, part, out, n), cooperative=True).wait()
        np.testing.assert_allclose(get(device, out, np.float32, 1)[0], x.sum(dtype=np.float64),
                                   rtol=1e-4)


def test_triton_vector_add_and_softmax(device: Device) -> None:
    n = (1 << 20) + 17
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    ra, rb, rc = put(device, a), put(device, b), device.alloc(4 * n, Memory.DEVICE)
    assert rc is not None
    triton_kernel(device, "vector_add")[(-(-n // 1024),)](ra, rb, rc, n, 1024).wait()
    np.testing.assert_array_equal(get(device, rc, np.float32, n), a + b)

    rows, cols, scale = 300, 1000, 0.75
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    rx, ry = put(device, x), device.alloc(x.nbytes, Memory.DEVICE)
    assert ry is not None
    triton_kernel(device, "softmax")[(rows,)](ry, rx, cols, cols, cols, scale, 1024).wait()
    e = np.exp(x * scale - (x * scale).max(axis=1, keepdims=True))
    np.testing.assert_allclose(get(device, ry, np.float32, rows * cols).reshape(rows, cols),
                               e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["matmul", "matmul_ctas2", "matmul_tma"])
def test_triton_fp16_matmuls(device: Device, name: str) -> None:
    """wgmma, clusters of num_ctas=2, and TMA descriptors built on the GPU (global scratch)."""
    m, n, k = 512, 384, 256
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    ra, rb = put(device, a), put(device, b)
    rc = device.alloc(m * n * 2, Memory.DEVICE)
    assert rc is not None
    kern = triton_kernel(device, name)
    grid = (m // 128, n // 128)
    if name == "matmul_tma":
        kern[grid](ra, rb, rc, m, n, k, 128, 128, 64).wait()
    else:
        kern[grid](ra, rb, rc, m, n, k, k, 1, n, 1, n, 1, 128, 128, 64).wait()
    want = a.astype(np.float32) @ b.astype(np.float32)
    np.testing.assert_allclose(get(device, rc, np.float16, m * n).reshape(m, n)
                               .astype(np.float32), want, rtol=2e-2, atol=5e-2)


def test_triton_host_tensor_descriptors(device: Device) -> None:
    """tile_copy: two host descriptors, their maps built by rig_nv.tensormap.for_triton; the
    tiles of a 192 x 128 fp16 tensor copied into a wider one (row stride 256)."""
    x = rng.standard_normal((192, 128)).astype(np.float16)
    rx = put(device, x)
    ry = put(device, np.zeros((192, 256), np.float16))
    kern = triton_kernel(device, "tile_copy")
    kern[(3, 2)](rt.TensorDescriptor(rx, (192, 128), (128, 1), (64, 64)),
                 rt.TensorDescriptor(ry, (192, 128), (256, 1), (64, 64)), 64, 64).wait()
    got = get(device, ry, np.float16, 192 * 256).reshape(192, 256)
    np.testing.assert_array_equal(got[:, :128], x)
    np.testing.assert_array_equal(got[:, 128:], 0)
