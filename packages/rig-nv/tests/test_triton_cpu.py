"""rig_nv.triton without a GPU: Triton 3.6's real output for sm_90a (triton/build.py wrote the
cubins and metadata beside it) launched as triton/backends/nvidia/driver.py launches it.

QMD positions are re-typed from open-gpu-doc's clcbc0qmd.h; the launch rules (grid x
num_ctas, 32 x num_warps threads, metadata.shared, scratch size x CTAs, constexprs dropped,
descriptors expanded) from driver.py's CudaLauncher and make_launcher.
"""

from __future__ import annotations

import json
import struct
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rig_edge import Misuse
from rig_nv import launch as L  # noqa: N812
from rig_nv import tensormap
from rig_nv import triton as rt

HERE = Path(__file__).resolve().parent / "triton"
NAMES = ["vector_add", "softmax", "matmul", "matmul_ctas2", "matmul_tma", "tile_copy"]


def fixture(name: str) -> tuple[bytes, dict[str, Any]]:
    return (HERE / f"{name}.cubin").read_bytes(), json.loads((HERE / f"{name}.json").read_text())


def loaded(d: Any, name: str) -> rt.TritonKernel:
    cubin, meta = fixture(name)
    return rt.load(d, cubin, meta["metadata"], meta["signature"])


def bits(data: bytes, hi: int, lo: int) -> int:
    return (int.from_bytes(data, "little") >> lo) & ((1 << (hi - lo + 1)) - 1)


def params(k: rt.TritonKernel, grid: tuple[int, int, int], *args: Any) -> bytes:
    """The parameter bytes a launch of ``args`` on ``grid`` writes (rig_nv.launch.fill_args
    of what the Triton launcher makes of them)."""
    fn = k.function
    bank = bytearray(fn.kernel.param_offset + fn.kernel.param_bytes)
    L.fill_args(fn, bank, k.arguments(grid, args))
    return bytes(bank[fn.kernel.param_offset :])


def last(d: Any, k: rt.TritonKernel, grid: tuple[int, int, int], block: int, shared: int,
         cluster: tuple[int, int, int] | None = None) -> L.Prepared:
    return L.prepare(d, k.function, grid, (block, 1, 1), shared, cluster)


@pytest.mark.parametrize("name", NAMES)
def test_every_fixture_loads_with_its_parameters_and_two_scratch_pointers(
        dev: Any, name: str) -> None:
    """Issue 18: each Triton kernel parsed; its parameters are the signature's less the
    constexprs, descriptors expanded, and the two scratch pointers."""
    d, _ = dev
    k = loaded(d, name)
    _, meta = fixture(name)
    kept = [t for t in meta["signature"].values() if t != "constexpr"]
    expanded = sum(1 if not t.startswith("tensordesc") else 5 for t in kept)
    assert len(k.function.kernel.params) == expanded + 2
    assert k.function.kernel.params[-1].size == k.function.kernel.params[-2].size == 8
    assert k.function.kernel.cluster == ((2, 1, 1) if name == "matmul_ctas2" else None)


@pytest.mark.parametrize("name", NAMES)
def test_every_fixtures_qmd_holds_its_launch(dev: Any, name: str) -> None:
    """clcbc0qmd.h positions: CTA_THREAD_DIMENSION0 MW(1167:1152) = 32 x num_warps,
    REGISTER_COUNT MW(1208:1200) the cubin's, SHARED_MEMORY_SIZE MW(601:584) the section's
    1 KiB (the system's 1 KiB where none) and metadata.shared rounded up to 256, QMD_TYPE
    and GPC_CGA_WIDTH by num_ctas, the grid in clusters (GRID_WIDTH MW(1055:1024)), as
    libcuda's cluster QMDs count it."""
    d, _ = dev
    k = loaded(d, name)
    m, kern = k.meta, k.function.kernel
    cluster = (m.num_ctas, 1, 1) if m.num_ctas != 1 else None
    q = last(d, k, (3 * m.num_ctas, 2, 1), 32 * m.num_warps, m.shared, cluster).qmd
    assert bits(q, 1167, 1152) == 32 * m.num_warps and bits(q, 1183, 1168) == 1
    assert bits(q, 1208, 1200) == kern.registers > 0
    # The section holds the system's 1 KiB where it exists; a kernel with none gets it too.
    held = max(kern.shared_section_bytes, 1024)
    assert bits(q, 601, 584) == -(-(held + m.shared) // 256) * 256
    assert (bits(q, 1055, 1024), bits(q, 1071, 1056)) == (3, 2)
    assert bits(q, 25, 23) == (3 if cluster else 2)
    assert bits(q, 2149, 2144) == (m.num_ctas if cluster else 0)


def test_vector_add_launches_as_triton_does(dev: Any, monkeypatch: Any) -> None:
    """32 x num_warps threads, the grid as given, constexpr BLOCK left out (given or not),
    scratch pointers null (sizes 0)."""
    d, _ = dev
    k = loaded(d, "vector_add")
    calls = recorded(d, monkeypatch)
    x, y, out = d.alloc(4096), d.alloc(4096), d.alloc(4096)
    k[(3,)](x, y, out, 1000, 1024).wait()
    assert calls == [((3, 1, 1), (128, 1, 1), 0, None)]
    k.launch(3, x, y, out, np.int32(1000)).wait()
    prep = last(d, k, (3, 1, 1), 128, 0)
    assert bits(prep.qmd, 1055, 1024) == 3 and bits(prep.qmd, 1167, 1152) == 128
    assert bits(prep.qmd, 25, 23) == 2
    offs = [p.offset for p in k.function.kernel.params]
    got = params(k, (3, 1, 1), x, y, out, 1000, 1024)
    assert got == params(k, (3, 1, 1), x, y, out, np.int32(1000))
    assert [struct.unpack_from("<Q", got, o)[0] for o in offs[:3]] == [x.gpu, y.gpu, out.gpu]
    with pytest.raises(Misuse, match="takes 5 arguments"):
        k[(3,)](x, y, out)
    with pytest.raises(Misuse, match="is i32, not float"):
        k[(3,)](x, y, out, 1000.0)
    assert k[(0,)](x, y, out, 1000) is None  # an empty grid launches nothing, as Triton


def test_softmax_converts_scalars_by_the_signature(dev: Any) -> None:
    """softmax(out, in, in_stride, out_stride, n_cols, scale: fp32): an int scale packs as a
    float, 8 warps make 256 threads."""
    d, _ = dev
    k = loaded(d, "softmax")
    a, b = d.alloc(1 << 16), d.alloc(1 << 16)
    k[(16,)](b, a, 1024, 1024, 1000, 2).wait()
    scale = k.function.kernel.params[5].offset
    got = params(k, (16, 1, 1), b, a, 1024, 1024, 1000, 2)
    assert struct.unpack_from("<f", got, scale) == (2.0,)


def recorded(d: Any, monkeypatch: Any) -> list[tuple[Any, ...]]:
    """The device's launches from now on: (grid, block, shared, cluster), each still made."""
    calls: list[tuple[Any, ...]] = []
    launch = d.launch

    def spy(fn: Any, grid: Any, block: Any, args: Any = (), shared: int = 0,
            **options: Any) -> Any:
        calls.append((grid, block, shared, options.get("cluster")))
        return launch(fn, grid, block, args, shared, **options)

    monkeypatch.setattr(d, "launch", spy)
    return calls


def test_matmul_with_num_ctas_2_launches_clusters_of_two(dev: Any, monkeypatch: Any) -> None:
    """Issue 18: grid x num_ctas CTAs in clusters of num_ctas: a (2, 3) grid is 4 x 3 CTAs, a
    GRID_GPC_CGA QMD of 2 x 1 x 1 (clcbc0qmd.h) whose grid is 2 x 3 clusters (as libcuda's
    cluster QMDs on the H200), 2 x 3 clusters in bank 0 and 4 x 3 CTAs at its 0x0c."""
    d, _ = dev
    k = loaded(d, "matmul_ctas2")
    calls = recorded(d, monkeypatch)
    a, b, c = d.alloc(1 << 20), d.alloc(1 << 20), d.alloc(1 << 20)
    k[(2, 3)](a, b, c, 256, 384, 256, 256, 1, 384, 1, 384, 1, 128, 128, 64).wait()
    assert calls == [((4, 3, 1), (256, 1, 1), k.meta.shared, (2, 1, 1))]
    prep = last(d, k, (4, 3, 1), 256, k.meta.shared, (2, 1, 1))
    q = prep.qmd
    assert bits(q, 25, 23) == 3
    assert (bits(q, 2149, 2144), bits(q, 2157, 2152), bits(q, 2165, 2160)) == (2, 1, 1)
    assert (bits(q, 1055, 1024), bits(q, 1071, 1056)) == (2, 3)
    assert struct.unpack_from("<3I", prep.bank, 0x15C) == (2, 3, 1)
    assert struct.unpack_from("<3I", prep.bank, 0x0C) == (4, 3, 1)  # the grid in CTAs


def test_device_built_descriptors_get_their_global_scratch(dev: Any) -> None:
    """Issue 18: global_scratch_size x CTAs bytes, aligned as the metadata says, allocated
    from the device and reused; ~96 KiB of dynamic shared memory (metadata.shared)."""
    d, _ = dev
    k = loaded(d, "matmul_tma")
    assert (k.meta.global_scratch, k.meta.shared) == ((384, 128), 98328)
    a, b, c = d.alloc(1 << 20), d.alloc(1 << 20), d.alloc(1 << 20)
    k[(2, 2)](a, b, c, 256, 256, 256).wait()
    scratch = k._scratch["global"]
    assert scratch.length >= 384 * 4 and scratch.gpu % 128 == 0
    k[(1, 2)](a, b, c, 128, 256, 256).wait()
    assert k._scratch["global"] is scratch
    prep = last(d, k, (1, 2, 1), 256, 98328)
    at = k.function.kernel.params[-2].offset
    got = params(k, (1, 2, 1), a, b, c, 128, 256, 256)
    assert struct.unpack_from("<QQ", got, at) == (scratch.gpu, 0)
    shared = bits(prep.qmd, 601, 584)  # SHARED_MEMORY_SIZE: the section's 1 KiB + dynamic
    assert shared == -(-(k.function.kernel.shared_section_bytes + 98328) // 256) * 256
    k[(4, 4)](a, b, c, 512, 512, 256).wait()
    assert k._scratch["global"].length >= 384 * 16
    fresh = loaded(d, "matmul_tma")
    with pytest.raises(Misuse, match="is i32, not float"):
        fresh[(2, 2)](a, b, c, 256, 256, 256.0)
    assert fresh._scratch == {}  # Misuse before any scratch memory is taken


def test_host_descriptors_are_their_map_then_shape_and_strides(dev: Any) -> None:
    """Issue 18: a host tensor descriptor the metadata describes is the 128-byte map then its
    shape (i32) and strides (i64); the map is rig_nv.tensormap.for_triton's of what Triton's
    make_tensordesc_arg hands fill_tma_descriptor, or one given (tensor_map(...)) as it is."""
    d, _ = dev
    k = loaded(d, "tile_copy")
    meta = k.meta.tensordesc_meta[0]
    assert meta is not None and (meta["swizzle"], meta["elem_size"], meta["elem_type"]) == (
        3, 2, 6)
    src, dst = d.alloc(1 << 16), d.alloc(1 << 16)
    built = (rt.TensorDescriptor(src, (128, 128), (128, 1), (64, 64)),
             rt.TensorDescriptor(dst, (96, 128), (256, 1), (64, 64), padding="nan"))
    k[(2, 2)](*built, 64, 64).wait()
    got = params(k, (2, 2, 1), *built)
    p = [x.offset for x in k.function.kernel.params]
    want = (tensormap.for_triton(src.gpu, 3, 2, 6, [64, 64], [128, 128], [128, 1], 0),
            tensormap.for_triton(dst.gpu, 3, 2, 6, [64, 64], [96, 128], [256, 1], 1))
    assert got[p[0] : p[0] + 128] == want[0] and got[p[5] : p[5] + 128] == want[1]
    assert want[0] != want[1]
    maps = bytes(range(128)), bytes(range(128, 256))
    given = (rt.TensorDescriptor(src, (128, 128), (128, 1), (64, 64), map=maps[0]),
             rt.TensorDescriptor(dst, (96, 128), (256, 1), (64, 64), map=maps[1]))
    k[(2, 2)](*given).wait()
    got = params(k, (2, 2, 1), *given)
    assert got[p[0] : p[0] + 128] == maps[0] and got[p[5] : p[5] + 128] == maps[1]
    assert struct.unpack_from("<iiqq", got, p[6]) == (96, 128, 256, 1)
    assert (p[0] + k.function.kernel.param_offset) % 64 == 0  # CUtensorMap's alignment
    with pytest.raises(Misuse, match="compiled for blocks of"):
        k[(2, 2)](rt.TensorDescriptor(src, (128, 128), (128, 1), (32, 64)), built[1])


def test_device_element_types_become_cudas_for_the_map() -> None:
    """driver.py's TMA_DTYPE_DEVICE_TO_HOST: device types 8, 9, 10 are CUDA's 10, 8, 9."""
    assert {t: rt.TMA_DTYPE_DEVICE_TO_HOST.get(t, t) for t in range(12)} == {
        0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 10, 9: 8, 10: 9, 11: 11}


def test_cooperative_and_dependent_launches_as_the_metadata_asks(dev: Any) -> None:
    """launch_cooperative_grid: a cooperative launch (the grid workspace in bank 0);
    launch_pdl: Misuse, as rig_nv.grids refuses it."""
    d, _ = dev
    cubin, meta = fixture("vector_add")
    coop = rt.load(d, cubin, {**meta["metadata"], "launch_cooperative_grid": True},
                   meta["signature"])
    x = d.alloc(4096)
    coop[(2,)](x, x, x, 16, 1024).wait()
    prep = L.prepare(d, coop.function, (2, 1, 1), (128, 1, 1), 0, None, True)
    assert struct.unpack_from("<II", prep.bank, 0x44) != (0, 0)
    pdl = rt.load(d, cubin, {**meta["metadata"], "launch_pdl": True}, meta["signature"])
    with pytest.raises(Misuse, match="latch"):
        pdl[(2,)](x, x, x, 16, 1024)


def test_descriptors_without_metadata_expand_as_triton_does() -> None:
    """driver.py's _expand_signature for a descriptor the metadata does not describe: base,
    shape and strides (i64), padding (i1), then shape (i32) and strides (i64) again."""
    types_, found = rt._expand(["*fp32", "tensordesc<fp16[64, 32]>", "constexpr"], ())
    assert types_ == ["*fp32", "*fp16", "i64", "i64", "i64", "i64", "i1", "i32", "i32",
                      "i64", "i64"]
    assert found == [(1, None, 2)]


def test_a_compiled_kernel_is_read_by_its_attributes(dev: Any) -> None:
    """rig never imports triton: a CompiledKernel is its asm['cubin'], metadata and src."""
    d, _ = dev
    cubin, meta = fixture("vector_add")
    compiled = types.SimpleNamespace(asm={"cubin": cubin}, metadata=types.SimpleNamespace(
        **meta["metadata"]), src=types.SimpleNamespace(signature=meta["signature"]))
    k = rt.load(d, compiled)
    assert k.function.signature == ("*fp32", "*fp32", "*fp32", "i32", "*i8", "*i8")
    with pytest.raises(Misuse, match="not a Triton CompiledKernel"):
        rt.load(d, object())


def test_triton_compiles_here_and_its_compiled_kernel_loads(dev: Any) -> None:
    """With triton installed (an optional test dependency), a kernel compiled now for sm_90a
    loads as its CompiledKernel."""
    # triton.language, not triton: tests/triton (the fixtures' folder) is a namespace package
    # named triton wherever the real one is not installed.
    tl = pytest.importorskip("triton.language", reason="triton is not installed (an optional "
                             "test dependency: pip install triton)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit  # type: ignore[misc]
    def scale(x_ptr, n, s, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * s, mask=offs < n)

    src = ASTSource(fn=scale, signature={"x_ptr": "*fp32", "n": "i32", "s": "fp32",
                                         "BLOCK": "constexpr"}, constexprs={(3,): 256})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    d, _ = dev
    k = rt.load(d, compiled)
    k[(4,)](d.alloc(4096), 1000, 0.5).wait()
    assert k.function.signature == ("*fp32", "i32", "fp32", "*i8", "*i8")
