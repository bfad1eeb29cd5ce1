"""Triton's compiled kernels, launched as Triton's own launcher launches them.

The rules are Triton 3.6's (triton/backends/nvidia/driver.py, CudaLauncher and make_launcher):
grid x ``num_ctas`` CTAs along x, in clusters of ``num_ctas``; 32 x ``num_warps`` threads;
``metadata.shared`` bytes of dynamic shared memory; constexpr parameters left out; a host
tensor descriptor expanded into the 128-byte tensor map then its shape (i32) and strides
(i64) where the metadata describes it (the map built by :func:`rig_nv.tensormap.for_triton`
unless given), else into base, shape, strides, padding, shape and strides; then the global
and the profile scratch pointers (size x CTAs bytes, aligned as the metadata says; null where
the size is 0). Scalars are converted by the signature's types
(:mod:`rig_nv.scalars`). rig never imports triton: a CompiledKernel is read by its attributes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rig_edge import Memory, Misuse, Region, RigError
from rig_nv import launch as launching
from rig_nv import tensormap
from rig_nv.launch import Function

if TYPE_CHECKING:
    from rig_nv.device import Device, Point

__all__ = ["TensorDescriptor", "TritonKernel", "load"]

# Triton's element types on the device are not CUDA's on the host (driver.py's
# TMA_DTYPE_DEVICE_TO_HOST): 8, 9 and 10 are rotated, the others the same.
TMA_DTYPE_DEVICE_TO_HOST = {8: 10, 9: 8, 10: 9}


@dataclass(frozen=True)
class TensorDescriptor:
    """A host tensor descriptor, as triton.tools.tensor_descriptor.TensorDescriptor: a tensor
    at ``base`` of ``shape`` and ``strides`` (in elements, outermost first) read in
    ``block_shape`` tiles. ``map`` is its 128-byte CUtensorMap where the caller has built one
    (:func:`rig_nv.tensormap.tensor_map`); else the launch builds it as Triton does."""

    base: Region
    shape: Sequence[int]
    strides: Sequence[int]
    block_shape: Sequence[int]
    padding: str = "zero"
    map: bytes | None = None


@dataclass(frozen=True)
class _Meta:
    name: str
    num_warps: int
    num_ctas: int
    shared: int
    global_scratch: tuple[int, int]  # (size a CTA, alignment)
    profile_scratch: tuple[int, int]
    cooperative: bool
    pdl: bool
    tensordesc_meta: tuple[Mapping[str, Any] | None, ...]


def _meta(metadata: Any) -> _Meta:
    get: Callable[[str, Any], Any]
    if isinstance(metadata, Mapping):
        get = metadata.get
    else:
        def get(key: str, default: Any) -> Any:
            return getattr(metadata, key, default)
    try:
        return _Meta(
            name=str(get("name", None)), num_warps=int(get("num_warps", None)),
            num_ctas=int(get("num_ctas", 1)), shared=int(get("shared", 0)),
            global_scratch=(int(get("global_scratch_size", 0)),
                            int(get("global_scratch_align", 1))),
            profile_scratch=(int(get("profile_scratch_size", 0)),
                             int(get("profile_scratch_align", 1))),
            cooperative=bool(get("launch_cooperative_grid", False)),
            pdl=bool(get("launch_pdl", False)),
            tensordesc_meta=tuple(get("tensordesc_meta", None) or ()),
        )
    except (TypeError, ValueError):
        raise Misuse("Triton metadata needs name, num_warps, num_ctas, shared and the scratch "
                     f"sizes: {metadata!r}") from None


_TENSORDESC = re.compile(r"tensordesc<([^[>]*)\[([^]]*)\]")


def _expand(signature: Sequence[str], descs: tuple[Mapping[str, Any] | None, ...]) -> tuple[
        list[str], list[tuple[int, Mapping[str, Any] | None, int]]]:
    """Triton's _expand_signature: each kept parameter's type, and for each tensor descriptor
    (its argument's index, its metadata, its rank)."""
    out: list[str] = []
    found: list[tuple[int, Mapping[str, Any] | None, int]] = []
    for i, ty in enumerate(signature):
        m = _TENSORDESC.match(ty)
        if m is None:
            if ty != "constexpr":
                out.append(ty)
            continue
        meta = descs[len(found)] if descs else None
        rank = m.group(2).count(",") + 1
        found.append((i, meta, rank))
        out += [f"*{m.group(1)}", *["i64"] * (2 * rank), "i1"] if meta is None \
            else ["nvTmaDesc"]
        out += ["i32"] * rank + ["i64"] * rank
    if descs and len(found) != len(descs):
        raise Misuse(f"the metadata describes {len(descs)} tensor descriptors, the signature "
                     f"has {len(found)}")
    return out, found


class TritonKernel:
    """A Triton kernel loaded on a device; ``kernel[grid](*args)`` launches it."""

    def __init__(self, device: Device, cubin: bytes, metadata: Any,
                 signature: Mapping[str, str] | Sequence[str] | str) -> None:
        self.device = device
        self.meta = _meta(metadata)
        sig = signature.split(",") if isinstance(signature, str) else list(
            signature.values() if isinstance(signature, Mapping) else signature)
        self.signature = tuple(s.strip() for s in sig)
        types, self._descs = _expand(self.signature, self.meta.tensordesc_meta)
        self._kept = [i for i, ty in enumerate(self.signature) if ty != "constexpr"]
        image = device.load(cubin)
        fn = image[self.meta.name]
        self.function: Function = fn.typed([*types, "*i8", "*i8"])
        self._scratch: dict[str, Region] = {}

    def __getitem__(self, grid: int | Sequence[int]) -> Callable[..., Point | None]:
        return lambda *args: self.launch(grid, *args)

    def grid_of(self, grid: int | Sequence[int]) -> tuple[int, int, int]:
        """The grid in programs, three-dimensional (Misuse for one that is not)."""
        dims = (grid,) if isinstance(grid, int) else tuple(grid)
        if not 1 <= len(dims) <= 3 or any(type(v) is not int or v < 0 for v in dims):
            raise Misuse(f"{self.meta.name}: a grid is one to three whole numbers >= 0, not "
                         f"{grid!r}")
        return (*dims, 1, 1)[:3]  # type: ignore[return-value]

    def arguments(self, grid: tuple[int, int, int], args: Sequence[Any]) -> tuple[Any, ...]:
        """The kernel's parameters for ``args`` (every parameter of the signature, constexprs
        included, or only the others), descriptors expanded, scratch pointers last."""
        if len(args) == len(self.signature):
            args = [args[i] for i in self._kept]
        elif len(args) != len(self._kept):
            raise Misuse(f"{self.meta.name} takes {len(self.signature)} arguments (or the "
                         f"{len(self._kept)} that are not constexpr), not {len(args)}")
        by_index = dict(zip(self._kept, args, strict=True))
        descs = {i: (meta, rank) for i, meta, rank in self._descs}
        out: list[Any] = []
        for i in self._kept:
            arg = by_index[i]
            if i in descs:
                out += self._descriptor(i, arg, *descs[i])
            else:
                out.append(arg)
        m = self.meta
        if m.global_scratch[0] > 0 or m.profile_scratch[0] > 0:
            # Everything checked (Misuse) before scratch memory is taken: null pointers stand in.
            launching.arg_values(self.function, (*out, 0, 0))
            cluster, cooperative, pdl = self._options()
            launching.prepare(self.device, self.function, *self._shape(grid), m.shared,
                              cluster, cooperative, pdl)
        programs = grid[0] * grid[1] * grid[2] * m.num_ctas
        out.append(self._scratch_for("global", m.global_scratch, programs))
        out.append(self._scratch_for("profile", m.profile_scratch, programs))
        return tuple(out)  # a tuple: the device's fast path caches its packer

    def _shape(self, grid: tuple[int, int, int]) -> tuple[tuple[int, int, int],
                                                           tuple[int, int, int]]:
        """Triton's launch: grid x num_ctas CTAs along x, 32 x num_warps threads."""
        return (grid[0] * self.meta.num_ctas, grid[1], grid[2]), (32 * self.meta.num_warps, 1, 1)

    def _options(self) -> tuple[tuple[int, int, int] | None, bool, bool]:
        """(cluster, cooperative, pdl) as Triton's launcher asks for them."""
        m = self.meta
        return (m.num_ctas, 1, 1) if m.num_ctas != 1 else None, m.cooperative, m.pdl

    def _descriptor(self, i: int, arg: Any, meta: Mapping[str, Any] | None,
                    rank: int) -> list[Any]:
        if not isinstance(arg, TensorDescriptor):
            raise Misuse(f"{self.meta.name} argument {i} is a tensor descriptor: pass a "
                         f"rig_nv.triton.TensorDescriptor, not {type(arg).__name__}")
        shape, strides = list(arg.shape), list(arg.strides)
        if len(shape) != rank or len(strides) != rank:
            raise Misuse(f"{self.meta.name} argument {i} has rank {rank}, not shape {shape} "
                         f"and strides {strides}")
        if meta is None:
            return [arg.base, *shape, *strides, arg.padding == "nan", *shape, *strides]
        if list(arg.block_shape) != list(meta["block_size"]):
            raise Misuse(f"{self.meta.name} argument {i} was compiled for blocks of "
                         f"{list(meta['block_size'])}, not {list(arg.block_shape)}")
        if meta.get("fp4_padded"):
            shape[-1] *= 2
        tensor_map = arg.map
        if tensor_map is None:  # as driver.py's make_tensordesc_arg fills it
            elem_type = int(meta["elem_type"])
            tensor_map = tensormap.for_triton(
                arg.base.gpu, int(meta["swizzle"]), int(meta["elem_size"]),
                TMA_DTYPE_DEVICE_TO_HOST.get(elem_type, elem_type), list(meta["block_size"]),
                shape, strides, 1 if arg.padding == "nan" else 0)
        return [bytes(tensor_map), *shape, *strides]

    def _scratch_for(self, kind: str, size_align: tuple[int, int], programs: int) -> Any:
        size, align = size_align
        if size <= 0:
            return 0
        need = size * programs
        have = self._scratch.get(kind)
        if have is None or have.length < need:
            region = self.device.alloc(need, Memory.DEVICE)
            if region is None:
                raise RigError(f"{self.device.facts.name}: no memory for {need} bytes of "
                               f"{self.meta.name}'s {kind} scratch")
            if region.gpu % align:
                raise RigError(f"{kind} scratch at 0x{region.gpu:x} is not {align}-aligned")
            if have is not None:
                self.device.free(have)  # reused only once the launches before are done
            self._scratch[kind] = have = region
        return have

    def launch(self, grid: int | Sequence[int], *args: Any) -> Point | None:
        """Launch on ``grid`` programs as Triton does; None (nothing launched) for an empty
        grid, as Triton. Raises :class:`Misuse` as :meth:`rig_nv.Device.launch` does."""
        g = self.grid_of(grid)
        if g[0] * g[1] * g[2] == 0:
            return None
        cluster, cooperative, pdl = self._options()
        return self.device.launch(self.function, *self._shape(g), self.arguments(g, args),
                                  self.meta.shared, cluster=cluster, cooperative=cooperative,
                                  pdl=pdl)


def load(device: Device, kernel: Any, metadata: Any = None,
         signature: Mapping[str, str] | Sequence[str] | str | None = None) -> TritonKernel:
    """Load a Triton kernel: a CompiledKernel, or its cubin with its metadata (a mapping or
    an object of Triton's KernelMetadata fields) and the signature it was compiled with
    (name -> type, in parameter order, constexprs marked "constexpr").

    Raises :class:`Misuse` for a kernel that is neither, or a signature that does not fit the
    cubin's parameters; what :meth:`rig_nv.Device.load` raises."""
    if isinstance(kernel, bytes | bytearray | memoryview):
        if metadata is None or signature is None:
            raise Misuse("a Triton cubin needs its metadata and its signature")
        return TritonKernel(device, bytes(kernel), metadata, signature)
    try:
        cubin, meta, src = kernel.asm["cubin"], kernel.metadata, kernel.src
    except (AttributeError, KeyError, TypeError):
        raise Misuse(f"not a Triton CompiledKernel (asm['cubin'], metadata, src): "
                     f"{type(kernel).__name__}") from None
    return TritonKernel(device, cubin, meta, signature or src.signature)
