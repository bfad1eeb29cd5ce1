"""Loading cubins into images and launching their kernels.

A launch writes a QMD and constant bank 0 into host memory the GPU reads, and sends two compute
methods (SEND_PCAS_A with the QMD's address, SEND_SIGNALING_PCAS2_B) on the compute channel:
no ioctl. Constant bank 0 holds the driver's area (block and grid sizes, the shared and local
memory windows, the initial stack pointer) and then the kernel's parameters, at the offsets the
cubin's .nv.info declares. The driver-area offsets were read off ptxas's own code (every
kernel loads its stack pointer and window bases from c[0x0][...], as cuobjdump -sass shows).
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rig_edge import Memory, Misuse, Region, RigError
from rig_nv import checks, grids, occupancy, qmd, scalars
from rig_nv.cubin import Cubin, CubinError, Kernel, parse
from rig_nv.hostmem import view

if TYPE_CHECKING:
    from rig_nv.device import Device
    from rig_nv.timeline import Point, Timeline

# R_CUDA relocation types (the numbers nvdisasm's machine description gives them).
R_CUDA_64 = 2
R_CUDA_G64 = 4
R_CUDA_ABS32_LO_32 = 0x38
R_CUDA_ABS32_HI_32 = 0x39
# The stack pointer the driver gives every thread: the top of a 16 MiB local window less
# 0x240 bytes (what CUDA and tinygrad program), so a thread needs frame + 0x240 bytes.
STACK_TOP = 0x1000000 - 0x240
STACK_RESERVE = 0x240
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = ((1 << 31) - 1, 65535, 65535)
MAX_THREADS = 1024
CODE_SLACK = 0x1000  # the SM prefetches past a kernel's last instruction


@dataclass(frozen=True)
class Bank0:
    """Where the driver's values lie in constant bank 0 (per architecture). ``descriptor`` is
    the 64-bit memory descriptor that global loads and stores name (``desc[UR]``).
    ``address`` holds the bank's own GPU address, plus the parameters' offset where
    ``to_params``: a kernel takes a parameter's address from it (``&p`` of a
    ``__grid_constant__`` parameter, a TMA load's tensor map)."""

    block: int
    grid: int
    shared_window: int
    local_window: int
    stack: int
    descriptor: int
    address: int
    to_params: bool


# ``address``: read off ptxas 13.0's code for ``&p`` of a __grid_constant__ parameter:
# sm_80 adds 0x160 to c[0x0][0x40]; sm_90 uses c[0x0][0x198] as the parameters' address (a
# tensor map at parameter offset 0x70 is c[0x0][0x198] + 0x70), sm_100 and sm_120 c[0x0][0x348].
BANK0_AMPERE = Bank0(block=0x00, grid=0x0C, shared_window=0x18, local_window=0x20, stack=0x28,
                     descriptor=0x118, address=0x40, to_params=False)
BANK0_HOPPER = Bank0(block=0x00, grid=0x0C, shared_window=0x18, local_window=0x20, stack=0x28,
                     descriptor=0x208, address=0x198, to_params=True)
BANK0_BLACKWELL = Bank0(block=0x360, grid=0x370, shared_window=0x2F0, local_window=0x2F8,
                        stack=0x37C, descriptor=0x358, address=0x348, to_params=True)
# The memory descriptor written for every launch (0 until measured otherwise).
MEMORY_DESCRIPTOR = 0


def bank0_of(arch: str) -> Bank0:
    sm = int(arch[3:].rstrip("af"))
    return BANK0_BLACKWELL if sm >= 100 else BANK0_HOPPER if sm >= 90 else BANK0_AMPERE


def sass_version(arch: str) -> int:
    """The QMD's SASS_VERSION byte: major in the high nibble, minor in the low (0x90)."""
    n = int(arch[3:].rstrip("af"))
    return ((n // 10) << 4) | (n % 10)


_pack_q = struct.Struct("<Q").pack_into

# Places a launch configuration keeps in the device's slot pool: a launch of it writes only its
# arguments there while one of them is free (the GPU done with it), else goes through the arena.
SLOTS = 8
SEND_AT = 496  # a slot's QMD-sending words: the last 16 bytes of its 512-byte place


class Slots:
    """A configuration's places in video memory, each a QMD pointed at the bank behind it.

    The host writes video memory through BAR 1, write-combined, and the fence before a
    doorbell waits for those writes to drain: on the H200 a launch's ~1 KiB QMD and bank cost
    ~3 us of that wait (scripts/launch_cpu_probe.py), its arguments alone little. The QMD asks
    the SMs to invalidate bank 0 (qmd.set_cbuf), so rewriting it in place is safe once the
    GPU is done with the launch that last used it (``values``: its timeline value). Each
    place ends with the words that send its QMD, at :data:`SEND_AT` behind it (no QMD is
    longer), so a launch is a GPFIFO entry naming them (``entries``), as a step's is."""

    __slots__ = ("at", "entries", "turn", "values")

    def __init__(self) -> None:
        self.at: list[int] = []  # offsets in the pool
        self.entries: list[int] = []  # GPFIFO entries of the words that send each one's QMD
        self.values: list[int] = []
        self.turn = 0  # the next to use; -1: the pool had no room for them


@dataclass(frozen=True)
class Prepared:
    """A launch configuration made once: the QMD (constant buffer 0 still to point) and
    constant bank 0 with the driver's area filled (the parameters still to write)."""

    qmd: bytes
    bank: bytes
    local: int  # local memory per thread it needs
    blob: bytes = b""  # the QMD in a 512-byte slot, then the bank: what a launch writes
    slot: int = 0  # where constant buffer 0's address lies in the QMD
    keep: int = 0  # the bits above that address in its upper dword (its size, flags)
    shift: int = 0  # how far the QMD shifts constant-buffer addresses
    address: int = 0  # where the bank holds its own address (Bank0.address)
    to_address: int = 0  # what that address adds to the bank's (0 or the parameters' offset)
    slots: Slots = field(default_factory=Slots, compare=False)


def point_cbuf0(prep: Prepared, host: memoryview, at: int, gpu: int) -> None:
    """Point the QMD at ``host[at:]`` (GPU address ``gpu``) at the bank 512 bytes behind it,
    and write the bank's address into the bank."""
    shifted = (gpu + 512) >> prep.shift
    _pack_q(host, at + prep.slot, (shifted & 0xFFFFFFFF) | ((prep.keep | (shifted >> 32)) << 32))
    address_bank(prep, host, at + 512, gpu + 512)


def address_bank(prep: Prepared, bank: memoryview | bytearray, at: int, gpu: int) -> None:
    """Write into the bank at ``bank[at:]`` its GPU address ``gpu`` where the kernel reads it
    (:attr:`Bank0.address`)."""
    _pack_q(bank, at + prep.address, gpu + prep.to_address)


@dataclass(frozen=True)
class Function:
    """A kernel of a loaded image: what a launch needs."""

    image: Image
    kernel: Kernel
    program: int  # GPU address of its first instruction
    cbufs: tuple[tuple[int, int, int], ...]  # its constant banks other than 0: (bank, addr, size)
    prepared: dict[tuple[Any, ...], Prepared] = field(default_factory=dict, compare=False)
    packers: dict[tuple[type, ...], Any] = field(default_factory=dict, compare=False)
    signature: tuple[str, ...] | None = None  # each parameter's type (rig_nv.scalars)

    @property
    def name(self) -> str:
        """The kernel's name in its cubin (``extern "C"`` names stay as written)."""
        return self.kernel.name

    def typed(self, signature: str | Sequence[str]) -> Function:
        """This kernel with a type for each parameter (``"*fp32,*fp32,i32"`` or Triton's
        names, :mod:`rig_nv.scalars`): its launches convert Python numbers to those types and
        refuse other kinds. :class:`Misuse` for an unknown type or a count that is not the
        kernel's."""
        types = scalars.parse_signature(signature)
        if len(types) != len(self.kernel.params):
            raise Misuse(f"{self.name} takes {len(self.kernel.params)} arguments; the "
                         f"signature names {len(types)}")
        for i, (t, (_, size)) in enumerate(zip(types, self.kernel.params, strict=True)):
            want = scalars.size_of(t)
            if want != size:
                raise Misuse(f"{self.name} argument {i} is {size} bytes, not a {t} ({want})")
        return dataclasses.replace(self, signature=types, prepared={}, packers={})

    def max_active_blocks(self, block: int | Sequence[int], shared: int = 0) -> int:
        """Blocks of ``block`` threads (and ``shared`` dynamic bytes) one SM holds at once, as
        cuOccupancyMaxActiveBlocksPerMultiprocessor counts them (:mod:`rig_nv.occupancy`)."""
        return occupancy.max_active_blocks(self.kernel, self.image.device.arch, block, shared)


class Image:
    """A cubin loaded into a device's memory: code copied, relocations applied."""

    def __init__(self, device: Device, cubin: Cubin, code: Region, globals_: Region | None) -> None:
        self.device = device
        self.cubin = cubin
        self.code = code
        self.globals = globals_
        self.functions = {}
        for name, k in cubin.kernels.items():
            banks = {**cubin.constants, **{b: c for b, c in k.constants.items() if b != 0}}
            cbufs = tuple((bank, code.gpu + off, -(-size // 16) * 16)
                          for bank, (off, size) in sorted(banks.items()) if size)
            self.functions[name] = Function(self, k, code.gpu + k.entry_offset, cbufs)

    def __getitem__(self, name: str) -> Function:
        """The kernel ``name``; raises :class:`rig_edge.Misuse` naming the image's kernels."""
        try:
            return self.functions[name]
        except KeyError:
            raise Misuse(f"the image has no kernel {name!r} (it has "
                         f"{', '.join(sorted(self.functions)) or 'none'})") from None

    def free(self) -> None:
        """Give back the image's memory (after its launches are done)."""
        self.device.synchronize()
        self.device.free(self.code)
        if self.globals is not None:
            self.device.free(self.globals)


def builtin_cubin(name: str, arch: str) -> bytes | None:
    """One of rig's own cubins (``kernels/<name>.<arch>.cubin`` in this package), or None."""
    from importlib.resources import files

    f = files("rig_nv") / "kernels" / f"{name}.{arch.rstrip('af')}.cubin"
    return f.read_bytes() if f.is_file() else None


def relocate(cubin: Cubin, image: bytearray, base: int, globals_base: int | None) -> None:
    """Apply the cubin's relocations for an image loaded at GPU address ``base``."""
    for r in cubin.relocations:
        offset, target, rtype, addend = r.offset, r.target, r.type, r.addend
        if target is None:
            if globals_base is None:
                raise CubinError(f"relocation at 0x{offset:x} names {r.symbol!r}, which lies "
                                 "in no loaded section")
            address = globals_base + r.nobits_offset + addend
        else:
            address = base + target + addend
        if rtype in (R_CUDA_64, R_CUDA_G64):
            struct.pack_into("<Q", image, offset, address)
        elif rtype == R_CUDA_ABS32_LO_32:
            struct.pack_into("<I", image, offset + 4, address & 0xFFFFFFFF)
        elif rtype == R_CUDA_ABS32_HI_32:
            struct.pack_into("<I", image, offset + 4, address >> 32)
        else:
            raise CubinError(f"relocation type 0x{rtype:x} at 0x{offset:x} is not one rig applies")


def load(device: Device, data: bytes | bytearray | memoryview) -> Image:
    """Parse ``data`` (a cubin) and copy it into ``device``'s memory.

    Raises :class:`rig_nv.cubin.CubinError` for a malformed cubin or one built for another
    architecture than the GPU's (naming both), :class:`Misuse` for ``data`` that is no buffer.
    """
    if not isinstance(data, bytes):
        data = bytes(checks.buffer("a cubin", data))
    cubin = parse(data)
    want = device.arch
    if cubin.arch.rstrip("af") != want:
        raise CubinError(f"the cubin is for {cubin.arch}, but {device.facts.name} is {want}: "
                         f"build it for {want}")
    image = bytearray(cubin.image)
    code = device.alloc(len(image) + CODE_SLACK, Memory.DEVICE)
    if code is None:
        raise RigError(f"{device.facts.name}: no memory for a {len(image)}-byte image")
    globals_ = None
    try:
        if cubin.globals_size:
            globals_ = device.alloc(cubin.globals_size, Memory.DEVICE)
            if globals_ is None:
                raise RigError(f"{device.facts.name}: no memory for the image's globals")
            device.upload(globals_, bytes(cubin.globals_size))
        relocate(cubin, image, code.gpu, globals_.gpu if globals_ else None)
        device.upload(code, image).wait()
    except BaseException:
        for region in (code, globals_):  # nothing of a failed load stays
            if region is not None:
                with contextlib.suppress(Exception):
                    device.memory.give_back(region)
        raise
    for t in device.timelines():  # the next launch of each invalidates the SMs' caches
        t.code_loaded()
    return Image(device, cubin, code, globals_)


def pack_args(kernel: Kernel, args: Sequence[Any],
              signature: Sequence[str] | None = None) -> list[tuple[int, bytes]]:
    """Each argument's (offset within the parameters, bytes), converted as a launch converts
    them (:mod:`rig_nv.scalars`): a :class:`rig_edge.Region` is its GPU address; an int fills
    its parameter's size (signed or unsigned, little-endian); a float is a 4-byte float or an
    8-byte double by the parameter's size; a numpy scalar keeps its dtype; bytes-like values
    are copied as they are and must have the parameter's exact size (structs by value).
    ``signature`` types the parameters as :meth:`Function.typed` does.
    """
    if len(args) != len(kernel.params):
        raise Misuse(f"{kernel.name} takes {len(kernel.params)} arguments, not {len(args)}")
    st, order, convs = _packer(kernel, tuple(map(type, args)),
                               None if signature is None else scalars.parse_signature(signature))
    data = bytearray(st.size)
    st.pack_into(data, 0, *(conv(args[j]) for conv, j in
                            zip(convs, order or range(len(args)), strict=True)))
    return [(offset, bytes(data[offset : offset + size])) for offset, size in kernel.params]


def check_dims(name: str, grid: Sequence[int], block: Sequence[int]) -> tuple[
        tuple[int, int, int], tuple[int, int, int]]:
    if len(grid) > 3 or len(block) > 3:
        raise Misuse(f"{name}: grid {grid} and block {block} have at most three dimensions")
    g = (*grid, 1, 1, 1)[:3]
    b = (*block, 1, 1, 1)[:3]
    if any(not isinstance(v, int) or v < 1 for v in (*g, *b)):
        raise Misuse(f"{name}: grid {grid} and block {block} need positive whole numbers")
    if any(v > m for v, m in zip(g, MAX_GRID, strict=True)):
        raise Misuse(f"{name}: grid {g} exceeds the hardware's {MAX_GRID}")
    if any(v > m for v, m in zip(b, MAX_BLOCK, strict=True)) or b[0] * b[1] * b[2] > MAX_THREADS:
        raise Misuse(f"{name}: block {b} exceeds {MAX_BLOCK} or {MAX_THREADS} threads")
    return g, b  # type: ignore[return-value]


def prepare(device: Device, fn: Function, grid: Sequence[int], block: Sequence[int],
            shared: int, cluster: Sequence[int] | None = None, cooperative: bool = False,
            pdl: bool = False) -> Prepared:
    """The QMD and bank-0 templates of a launch configuration (cached on ``fn``); ``cluster``,
    ``cooperative`` and ``pdl`` as :func:`rig_nv.grids.check` takes them."""
    check_function(device, fn)
    try:
        shared = operator.index(shared)
        key: tuple[Any, ...] = (tuple(grid), tuple(block), shared, device.loader.slm)
        if cluster is not None or cooperative or pdl:
            key += (None if cluster is None else tuple(cluster), bool(cooperative), bool(pdl))
    except TypeError:
        raise Misuse(f"{fn.name}: grid and block must be sequences of whole numbers and shared "
                     f"a whole number, not {grid!r}, {block!r} and {shared!r}") from None
    got = fn.prepared.get(key)
    if got is not None:
        return got
    k = fn.kernel
    g, b = check_dims(k.name, grid, block)
    if k.required_block and tuple(k.required_block) != b:
        raise Misuse(f"{k.name} requires block {k.required_block}, not {b}")
    if shared < 0:
        raise Misuse(f"dynamic shared memory must be >= 0, not {shared}")
    threads = b[0] * b[1] * b[2]
    if k.max_threads and threads > k.max_threads:
        raise Misuse(f"{k.name} allows {k.max_threads} threads a block (__launch_bounds__), "
                     f"not {threads}")
    # Registers are given out per warp in units of 256 (tinygrad ops_nv.py, CUDA's occupancy
    # calculator): a block must fit the SM's 65536.
    per_warp = -(-max(k.registers, 1) * 32 // 256) * 256
    if -(-threads // 32) * per_warp > 65536:
        raise Misuse(f"{k.name} uses {k.registers} registers a thread: {threads} threads "
                     f"exceed the SM's 65536")
    arch = device.arch
    # The system keeps 1 KiB of every block's shared memory; ptxas counts it in
    # .nv.shared.<kernel> from sm_90 on (measured on the H200's cubins), not before. A kernel
    # with no such section gets it too: libcuda's QMDs on the H200 hold the dynamic bytes plus
    # 1 KiB for such kernels (docs/results/cuda-launches-2026-12-01-v2.jsonl).
    total = max(k.shared_section_bytes, k.shared_bytes + occupancy.RESERVED_SHARED) + shared
    if total > qmd.max_shared(arch) + 1024:
        raise Misuse(f"{k.name}: {total - 1024} bytes of shared memory exceed {arch}'s "
                     f"{qmd.max_shared(arch)} per block")
    options = grids.check(k, arch, g, b, shared, device.sm_count if cooperative else 0, cluster,
                          cooperative, pdl)
    lay = bank0_of(arch)
    size = max(k.param_offset + k.param_bytes, k.constant0_size, lay.stack + 4)
    bank = bytearray(-(-size // 64) * 64)
    struct.pack_into("<3I", bank, lay.block, *b)
    struct.pack_into("<3I", bank, lay.grid, *g)
    local_window, shared_window = device.windows
    struct.pack_into("<Q", bank, lay.shared_window, shared_window)
    struct.pack_into("<Q", bank, lay.local_window, local_window)
    struct.pack_into("<I", bank, lay.stack, STACK_TOP)
    if MEMORY_DESCRIPTOR and lay.descriptor + 8 <= len(bank):
        struct.pack_into("<Q", bank, lay.descriptor, MEMORY_DESCRIPTOR)
    if options is not grids.PLAIN:
        workspace = device.loader.grid_workspace().gpu if options.cooperative else 0
        grids.fill_bank(bank, arch, g, options,
                        shared=total,
                        window=shared_window, workspace_address=workspace)
    local = (-(-(k.local_bytes + STACK_RESERVE) // 32) * 32) if k.local_bytes else 0
    desc = qmd.encode(device.classes.qmd_version, qmd.Launch(
        program=fn.program,
        grid=g,
        block=b,
        registers=max(k.registers, 1),
        shared_bytes=total,
        local_bytes=max(local, device.loader.slm),
        barriers=max(k.barriers, 1),
        cbufs=((0, 0, len(bank)), *fn.cbufs),
        sass_version=sass_version(arch),
        arch=arch,
        cluster=options.cluster,
    ))
    layout = qmd.LAYOUTS[device.classes.qmd_version]
    slot, width = qmd.cbuf0_slot(layout)
    keep = int.from_bytes(desc[slot + 4 : slot + 8], "little") & ~((1 << width) - 1)
    got = Prepared(desc, bytes(bank), local, desc.ljust(512, b"\0") + bytes(bank), slot,
                   keep, layout.cbuf_addr_shift, lay.address,
                   k.param_offset if lay.to_params else 0)
    fn.prepared[key] = got
    if isinstance(grid, tuple) and isinstance(block, tuple) and len(key) == 4:
        fn.prepared[(grid, block, shared, device.loader.slm)] = got  # the caller's own spelling
    return got


def _packer(kernel: Kernel, kinds: tuple[type, ...], signature: tuple[str, ...] | None) -> tuple[
        struct.Struct, tuple[int, ...] | None, tuple[Any, ...]]:
    """A struct that writes arguments of these types at the kernel's parameter offsets, the
    order of the arguments in it (by offset; None when that is their own order), and one
    converter each (:func:`rig_nv.scalars.field`)."""
    fmt, at, convs = "<", 0, list[Any]()
    order = tuple(sorted(range(len(kinds)), key=lambda j: kernel.params[j][0]))
    for i in order:
        offset, size = kernel.params[i]
        fmt += "x" * (offset - at)
        at = offset + size
        code, conv = scalars.field(kernel.name, i, kinds[i], size,
                                   signature[i] if signature else None)
        fmt += code
        convs.append(conv)
    return (struct.Struct(fmt), None if order == tuple(range(len(kinds))) else order,
            tuple(convs))


def arg_values(fn: Function, args: Sequence[Any]) -> tuple[struct.Struct, list[Any]]:
    """The struct that writes ``args`` at the kernel's parameter offsets (from its start) and
    the values it packs, checked (:class:`Misuse`): what :func:`fill_args` writes."""
    try:
        kinds = tuple(map(type, args))
    except TypeError:
        raise Misuse(f"{fn.name}'s arguments must be a sequence, not "
                     f"{type(args).__name__}") from None
    packer = fn.packers.get(kinds)
    if packer is None:
        if len(args) != len(fn.kernel.params):
            raise Misuse(f"{fn.name} takes {len(fn.kernel.params)} arguments, not {len(args)}")
        packer = fn.packers[kinds] = _packer(fn.kernel, kinds, fn.signature)
    st, order, convs = packer
    if order is None and (type(args) is tuple or type(args) is list):  # in offset order
        return st, list(map(operator.call, convs, args))
    return st, [conv(args[j]) for conv, j in zip(convs, order or range(len(convs)), strict=True)]


def fill_args(fn: Function, bank: bytearray, args: Sequence[Any], base: int = 0) -> None:
    """Write ``args`` into a bank-0 copy (lying at ``base`` in ``bank``) at the kernel's
    parameter offsets."""
    st, values = arg_values(fn, args)
    st.pack_into(bank, base + fn.kernel.param_offset, *values)


def check_function(device: Device, fn: Any) -> None:
    """:class:`Misuse` unless ``fn`` is a kernel of an image loaded on ``device``."""
    if not isinstance(fn, Function):
        raise Misuse(f"a launch needs a kernel (image[name]), not {type(fn).__name__}")
    if fn.image.device is not device:
        raise Misuse(f"{fn.name} is loaded on another device")


def launch(device: Device, fn: Function, grid: Sequence[int], block: Sequence[int],
           args: Sequence[Any], shared: int = 0, name: str | None = None,
           cluster: Sequence[int] | None = None, cooperative: bool = False,
           pdl: bool = False, timeline: Timeline | None = None) -> Point:
    """Launch ``fn`` on ``grid`` blocks of ``block`` threads with ``args``; returns its point.
    A profile names it ``name`` (default: the kernel's name).

    Everything is checked (:class:`Misuse`) before the compute engine's local memory grows."""
    prep = prepare(device, fn, grid, block, shared, cluster, cooperative, pdl)
    blob = bytearray(prep.blob)
    fill_args(fn, blob, args, 512)
    if prep.local > device.loader.slm:
        device.loader.ensure_local(prep.local)
        prep = prepare(device, fn, grid, block, shared, cluster, cooperative, pdl)
        blob = bytearray(prep.blob)
        fill_args(fn, blob, args, 512)
    t = timeline if timeline is not None else device.timeline  # the queue's
    return t.launch_blob(prep, blob, name or fn.name)


def view_of(region: Region) -> memoryview:
    assert region.host is not None
    return view(region.host, region.length)
