"""Issue 6, "Bad input": every public call of a device given a wrong type, a negative size, an
out-of-range offset, a freed region, a region of another device or a too-large grid raises a
clear error before touching the GPU. On the CPU over the stand-in RM path (fake_gpu.py).

The promises quoted: the error policy (rig_edge.errors), "misuse (the spec's
``Invalid_argument``) raises ``ValueError`` (or a subclass), having changed nothing",
``rig_edge.Misuse``'s "The caller broke a call's contract; nothing was changed", and each
method's own Raises words. The backend
spec (Rig_nv_nvidia) promises ``Invalid_argument`` for ``gpu i`` and ``usage`` with ``i < 0``
or a window that is not positive: test_open_errors.py in rig-nv-nvidia checks those.

Each case asserts the exception type, a message naming the problem, and that nothing reached
the GPU or the RM: the timeline (``d.timeline.next``), every channel's ``put``, the stand-in's
memory (``path.next``), its RM objects, the device's live regions and its local memory are as
before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_gpu import BASE, FakePath, open_fake, open_on

from rig_edge import Memory, Misuse, Region
from rig_nv.cubin import CubinError
from rig_nv.device import Point
from rig_nv.hostmem import view

CUBIN = Path(__file__).resolve().parent / "cubins" / "kernels.sm_90.cubin"
OTHER_ARCH = Path(__file__).resolve().parent / "cubins" / "kernels.sm_80.cubin"
N = 4096


@dataclass
class Ctx:
    d: Any
    path: FakePath
    other: Any  # a second device, on a stand-in path of its own
    dev: Region  # live Device memory
    pin: Region  # live Pinned memory
    freed: Region  # Pinned memory freed
    freed_dev: Region  # Device memory freed (kept by the device for reuse)
    foreign: Region  # the other device's Pinned memory
    image: Any
    vadd: Any
    local: Any  # local_array: its first launch grows the compute engine's local memory
    reduce: Any  # __launch_bounds__(256)
    other_vadd: Any
    step: Any


def open_other() -> tuple[Any, FakePath]:
    """A second stand-in device whose memory lies apart from open_fake()'s."""
    path = FakePath()
    path.next = BASE + (64 << 30)
    return open_on(path), path


@pytest.fixture
def ctx() -> Iterator[Ctx]:
    d, path = open_fake()
    other, _ = open_other()
    try:
        image = d.load(CUBIN.read_bytes())
        other_image = other.load(CUBIN.read_bytes())
        dev, pin = d.alloc(N), d.alloc(N, Memory.PINNED)
        freed, freed_dev = d.alloc(N, Memory.PINNED), d.alloc(N)
        foreign = other.alloc(N, Memory.PINNED)
        assert dev and pin and freed and freed_dev and foreign
        d.free(freed)
        d.free(freed_dev)
        path.complete()
        yield Ctx(d, path, other, dev, pin, freed, freed_dev, foreign, image, image["vadd"],
                  image["local_array"], image["reduce"], other_image["vadd"], d.step())
    finally:
        other.stop()
        d.stop()


def state(c: Ctx) -> tuple[Any, ...]:
    """What a call may not change when it refuses its input."""
    d, path = c.d, c.path
    return (d.timeline.next, tuple(ch.put for ch in d.timeline.channels), path.next,
            dict(path.rm.objects), d.memory.regions(), d.loader.slm, len(c.step.items),
            c.other.timeline.next,
            bytes(view(c.freed.host, N)), bytes(view(c.foreign.host, N)))


def refused(c: Ctx, call: Callable[[Ctx], Any], exc: type[BaseException], match: str) -> None:
    before = state(c)
    with pytest.raises(exc, match=match) as e:
        call(c)
    assert type(e.value) is not TypeError and not isinstance(e.value, AttributeError)
    assert state(c) == before, "the refused call touched the GPU, the RM or memory"


Case = tuple[Callable[[Ctx], Any], type[BaseException], str]


def cases(table: dict[str, Case]) -> Any:
    return pytest.mark.parametrize(("call", "exc", "match"), list(table.values()),
                                   ids=list(table))


ALLOC: dict[str, Case] = {
    "zero": (lambda c: c.d.alloc(0), Misuse, "size must be positive, not 0"),
    "negative": (lambda c: c.d.alloc(-N), Misuse, "size must be positive, not -4096"),
    "str-size": (lambda c: c.d.alloc("4096"), Misuse, "size must be a whole number, not str"),
    "float-size": (lambda c: c.d.alloc(4096.0), Misuse, "whole number, not float"),
    "none-size": (lambda c: c.d.alloc(None), Misuse, "whole number, not NoneType"),
    "str-kind": (lambda c: c.d.alloc(N, "device"), Misuse, "kind must be a rig_edge.Memory"),
}


@cases(ALLOC)
def test_alloc(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.alloc: "Raises rig_edge.Misuse if n is not positive" (a positive whole number of
    bytes of a rig_edge.Memory kind), having changed nothing."""
    refused(ctx, call, exc, match)


FREE: dict[str, Case] = {
    "freed": (lambda c: c.d.free(c.freed), Misuse, "not a live region .*freed"),
    "freed-device-memory": (lambda c: c.d.free(c.freed_dev), Misuse, "not a live region"),
    "other-device": (lambda c: c.d.free(c.foreign), Misuse, "another device's"),
    "sub-region": (lambda c: c.d.free(Region(c.pin.gpu + 64, c.pin.host + 64, 64,
                                             Memory.PINNED)), Misuse, "not a live region"),
    "str": (lambda c: c.d.free("region"), Misuse, "must be a rig_edge.Region, not str"),
    "unhashable": (lambda c: c.d.free([c.pin]), Misuse, "must be a rig_edge.Region, not list"),
}


@cases(FREE)
def test_free(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.free: "Raises Misuse for a region this device did not make (or freed
    already)"."""
    refused(ctx, call, exc, match)


MAP_HOST: dict[str, Case] = {
    "int": (lambda c: c.d.map_host(4096), Misuse, "map_host needs a buffer, not int"),
    "str": (lambda c: c.d.map_host("bytes"), Misuse, "map_host needs a buffer, not str"),
    "empty": (lambda c: c.d.map_host(bytearray(0)), Misuse, "at least one byte"),
}


@cases(MAP_HOST)
def test_map_host(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.map_host: maps "the caller's memory (any buffer of whole pages or not)"; it
    "Raises Misuse for an object that is no buffer, or an empty one"."""
    refused(ctx, call, exc, match)


DMA: dict[str, Case] = {
    "freed": (lambda c: c.d.dma(c.freed), Misuse, "not a live region"),
    "other-device": (lambda c: c.d.dma(c.foreign), Misuse, "another device's"),
    "str": (lambda c: c.d.dma("region"), Misuse, "must be a rig_edge.Region, not str"),
    "unhashable": (lambda c: c.d.dma({}), Misuse, "must be a rig_edge.Region, not dict"),
}


@cases(DMA)
def test_dma(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.dma: exports "the RM object a region lies in"; "Raises Misuse for a region that
    is not a live one of this device"."""
    refused(ctx, call, exc, match)


LOAD: dict[str, Case] = {
    "empty": (lambda c: c.d.load(b""), CubinError, "."),
    "not-elf": (lambda c: c.d.load(b"\x7fELF" + bytes(60)), CubinError, "."),
    "other-arch": (lambda c: c.d.load(OTHER_ARCH.read_bytes()), CubinError,
                   "for sm_80, but NV is sm_90: build it for sm_90"),
    "str": (lambda c: c.d.load(str(CUBIN)), Misuse, "a cubin must be a contiguous buffer, not str"),
    "int": (lambda c: c.d.load(7), Misuse, "a cubin must be a contiguous buffer, not int"),
}


@cases(LOAD)
def test_load(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.load: "Raises rig_nv.cubin.CubinError for a malformed cubin or one built for
    another architecture (naming both)"."""
    refused(ctx, call, exc, match)


def _launch(fn: str = "vadd", grid: Any = (4,), block: Any = (128,), args: Any = None,
            shared: Any = 0) -> Callable[[Ctx], Any]:
    def call(c: Ctx) -> Any:
        f = getattr(c, fn) if fn in ("vadd", "local", "reduce", "other_vadd") else fn
        a = (c.dev, c.dev, c.dev, 1) if args is None else args(c) if callable(args) else args
        return c.d.launch(f, grid, block, a, shared)

    return call


LAUNCH: dict[str, Case] = {
    "grid-zero": (_launch(grid=(0,)), Misuse, "positive whole numbers"),
    "grid-negative": (_launch(grid=(-4,)), Misuse, "positive whole numbers"),
    "grid-float": (_launch(grid=(4.0,)), Misuse, "positive whole numbers"),
    "grid-x-too-large": (_launch(grid=(1 << 31,)), Misuse, "exceeds the hardware's"),
    "grid-y-too-large": (_launch(grid=(1, 65536)), Misuse, "exceeds the hardware's"),
    "grid-z-too-large": (_launch(grid=(1, 1, 65536)), Misuse, "exceeds the hardware's"),
    "grid-four-dims": (_launch(grid=(1, 1, 1, 2)), Misuse, "at most three dimensions"),
    "grid-int": (_launch(grid=4), Misuse, "must be sequences of whole numbers"),
    "grid-none": (_launch(grid=None), Misuse, "must be sequences of whole numbers"),
    "block-too-large": (_launch(block=(1025,)), Misuse, "exceeds .* 1024 threads"),
    "block-too-many-threads": (_launch(block=(32, 32, 2)), Misuse, "1024 threads"),
    "block-z-too-large": (_launch(block=(1, 1, 65)), Misuse, "exceeds"),
    "block-launch-bounds": (_launch("reduce", block=(512,), args=lambda c: (c.dev, c.dev, 1)),
                            Misuse, "allows 256 threads a block"),
    "shared-negative": (_launch(shared=-1), Misuse, "must be >= 0, not -1"),
    "shared-too-large": (_launch(shared=1 << 20), Misuse, "shared memory exceed sm_90's"),
    "shared-str": (_launch(shared="0"), Misuse, "shared a whole number"),
    "args-too-few": (_launch(args=lambda c: (c.dev,)), Misuse, "takes 4 arguments, not 1"),
    "args-not-sequence": (_launch(args=5), Misuse, "arguments must be a sequence, not int"),
    "args-int-too-large": (_launch(args=lambda c: (c.dev, c.dev, c.dev, 1 << 40)), Misuse,
                           "does not fit 4 bytes"),
    "args-str-pointer": (_launch(args=lambda c: (c.dev, "a", c.dev, 1)), Misuse,
                         "argument 1 is a 8-byte value: pass bytes, not str"),
    "args-region-for-int": (_launch(args=lambda c: (c.dev, c.dev, c.dev, c.dev)), Misuse,
                            "argument 3 is 4 bytes: not a pointer"),
    "fn-str": (_launch("vadd_by_name"), Misuse, "needs a kernel .*, not str"),
    "fn-other-device": (_launch("other_vadd"), Misuse, "vadd is loaded on another device"),
    # local_array needs local memory: a refused launch must not grow it first.
    "local-args-bad": (_launch("local", args=lambda c: (c.dev, c.dev, c.dev, "n")), Misuse,
                       "argument 3"),
    "local-args-too-few": (_launch("local", args=()), Misuse, "takes 4 arguments, not 0"),
}


@cases(LAUNCH)
def test_launch(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.launch: "Raises rig_edge.Misuse for grid, block, shared memory or arguments out
    of range" (and a kernel of another device), before the QMD is written or sent."""
    refused(ctx, call, exc, match)


def test_launch_misuse_after_a_good_launch(ctx: Ctx) -> None:
    """Device.launch's prepared (fast) path: "Raises rig_edge.Misuse for ... arguments out of
    range" there too, once the configuration was launched before."""
    ctx.d.launch(ctx.vadd, (4,), (128,), (ctx.dev, ctx.dev, ctx.dev, 1))
    ctx.path.complete()
    refused(ctx, _launch(args=lambda c: (c.dev, c.dev, c.dev, 1 << 40)), Misuse,
            "does not fit 4 bytes")
    refused(ctx, _launch(args=lambda c: (c.dev, c.dev)), Misuse, "takes 4 arguments")
    refused(ctx, _launch("other_vadd"), Misuse, "another device")


def test_image_lookup(ctx: Ctx) -> None:
    """Image[name]: a kernel the image lacks is Misuse naming the kernels it has."""
    refused(ctx, lambda c: c.image["nope"], Misuse, "no kernel 'nope' .*vadd")


COPY: dict[str, Case] = {
    "n-zero": (lambda c: c.d.copy(c.dev, c.pin, 0), Misuse, "length must be positive, not 0"),
    "n-negative": (lambda c: c.d.copy(c.dev, c.pin, -1), Misuse, "positive, not -1"),
    "n-too-large": (lambda c: c.d.copy(c.dev, c.pin, N + 1), Misuse,
                    r"\[0, 4097\) lie outside the 4096-byte destination"),
    "n-str": (lambda c: c.d.copy(c.dev, c.pin, "64"), Misuse, "whole number, not str"),
    "dst-offset-past-end": (lambda c: c.d.copy(c.dev, c.pin, 64, dst_offset=N), Misuse,
                            "outside the 4096-byte destination"),
    "dst-offset-negative": (lambda c: c.d.copy(c.dev, c.pin, 64, dst_offset=-64), Misuse,
                            "outside the 4096-byte destination"),
    "src-offset-past-end": (lambda c: c.d.copy(c.dev, c.pin, 64, src_offset=N - 63), Misuse,
                            "outside the 4096-byte source"),
    "src-offset-negative": (lambda c: c.d.copy(c.dev, c.pin, 64, src_offset=-1), Misuse,
                            "outside the 4096-byte source"),
    "src-offset-float": (lambda c: c.d.copy(c.dev, c.pin, 64, src_offset=1.5), Misuse,
                         "offset must be a whole number, not float"),
    "dst-freed": (lambda c: c.d.copy(c.freed, c.pin), Misuse, "destination .* not a live"),
    "src-freed": (lambda c: c.d.copy(c.pin, c.freed_dev), Misuse, "source .* not a live"),
    "dst-other-device": (lambda c: c.d.copy(c.foreign, c.pin), Misuse, "another device's"),
    "src-other-device": (lambda c: c.d.copy(c.pin, c.foreign), Misuse, "another device's"),
    "dst-str": (lambda c: c.d.copy("dst", c.pin), Misuse, "must be a rig_edge.Region, not str"),
    "src-bytes": (lambda c: c.d.copy(c.pin, b"abc"), Misuse, "rig_edge.Region, not bytes"),
    # Issue 22, trip 1: alloc's None (out of memory) passed on says what None means.
    "dst-none": (lambda c: c.d.copy(None, c.pin), Misuse,
                 "destination is None.*alloc returns None when the GPU is out of that memory"),
    "made-up-host": (lambda c: c.d.copy(Region(c.pin.gpu, 0x1000, 64, Memory.PINNED), c.dev, 64),
                     Misuse, "not a live region"),
}


@cases(COPY)
def test_copy(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.copy: "Raises Misuse for a length or offset outside either region, or a region
    that is not a live one of this device (freed, or another device's)"."""
    refused(ctx, call, exc, match)


def test_copy_accepts_a_sub_region(ctx: Ctx) -> None:
    """Device.copy: "any kinds, any offsets" -- a Region lying inside a live one is live."""
    sub = Region(ctx.pin.gpu + 64, ctx.pin.host + 64, 64, Memory.PINNED)  # type: ignore[operator]
    before = ctx.d.timeline.next
    ctx.d.copy(sub, Region(ctx.dev.gpu + 128, None, 64, Memory.DEVICE))
    assert ctx.d.timeline.next == before + 1


UPLOAD: dict[str, Case] = {
    "offset-past-end": (lambda c: c.d.upload(c.pin, b"x", N), Misuse,
                        r"\[4096, 4097\) lie outside"),
    "offset-negative": (lambda c: c.d.upload(c.dev, b"x", -1), Misuse, r"\[-1, 0\) lie outside"),
    "data-too-long": (lambda c: c.d.upload(c.pin, bytes(N + 1)), Misuse, "outside the 4096"),
    "data-empty": (lambda c: c.d.upload(c.pin, b""), Misuse, "length must be positive, not 0"),
    "data-int": (lambda c: c.d.upload(c.pin, 5), Misuse,
                 "data must be a contiguous buffer, not int"),
    "data-str": (lambda c: c.d.upload(c.pin, "abc"), Misuse, "contiguous buffer, not str"),
    "data-strided": (lambda c: c.d.upload(c.pin, memoryview(bytes(8))[::2]), Misuse,
                     "contiguous buffer"),
    "offset-str": (lambda c: c.d.upload(c.pin, b"x", "0"), Misuse, "whole number, not str"),
    "dst-freed-pinned": (lambda c: c.d.upload(c.freed, b"x"), Misuse, "not a live region"),
    "dst-freed-device": (lambda c: c.d.upload(c.freed_dev, b"x"), Misuse, "not a live region"),
    "dst-other-device": (lambda c: c.d.upload(c.foreign, b"x"), Misuse, "another device's"),
    "dst-str": (lambda c: c.d.upload("dst", b"x"), Misuse, "rig_edge.Region, not str"),
}


@cases(UPLOAD)
def test_upload(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.upload: "Raises Misuse for data that is no buffer, bytes outside dst, or a dst
    that is not a live region of this device" -- nothing written, nothing submitted."""
    refused(ctx, call, exc, match)


DOWNLOAD: dict[str, Case] = {
    "n-zero": (lambda c: c.d.download(c.dev, 0), Misuse, "positive, not 0"),
    "n-negative": (lambda c: c.d.download(c.dev, -8), Misuse, "positive, not -8"),
    "n-too-large": (lambda c: c.d.download(c.pin, N + 1), Misuse, "outside the 4096"),
    "n-float": (lambda c: c.d.download(c.dev, 8.0), Misuse, "whole number, not float"),
    "offset-past-end": (lambda c: c.d.download(c.dev, 8, N), Misuse, "outside the 4096"),
    "offset-negative": (lambda c: c.d.download(c.dev, offset=-1), Misuse, "outside the 4096"),
    "src-freed": (lambda c: c.d.download(c.freed_dev), Misuse, "not a live region"),
    "src-other-device": (lambda c: c.d.download(c.foreign), Misuse, "another device's"),
    "src-str": (lambda c: c.d.download("src", 8), Misuse, "rig_edge.Region, not str"),
    "out-too-small": (lambda c: c.d.download(c.dev, 8, out=bytearray(4)), Misuse,
                      "out holds 4 bytes, fewer than 8"),
    "out-read-only": (lambda c: c.d.download(c.dev, 8, out=bytes(8)), Misuse,
                      "out is a read-only buffer"),
    "out-int": (lambda c: c.d.download(c.dev, 8, out=8), Misuse,
                "out must be a contiguous buffer, not int"),
}


@cases(DOWNLOAD)
def test_download(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.download: "Raises Misuse for bytes outside src, a src that is not a live region
    of this device, or an out that is no writable buffer of n bytes"."""
    refused(ctx, call, exc, match)


WAIT: dict[str, Case] = {
    "int": (lambda c: c.d.wait(1), Misuse, "wait needs a Point, not int"),
    "other-device": (lambda c: c.d.wait(Point(c.other, 1)), Misuse, "another device's"),
    "never-submitted": (lambda c: c.d.wait(Point(c.d, c.d.timeline.next)), Misuse,
                        "was never submitted"),
    "point-never-submitted": (lambda c: Point(c.d, c.d.timeline.next + 5).wait(), Misuse,
                              "never submitted"),
}


@cases(WAIT)
def test_wait(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.wait: "Misuse for another device's point, or one past the last submitted" --
    refused at once rather than waited on until the device is lost."""
    refused(ctx, call, exc, match)


SLEEP: dict[str, Case] = {
    "negative": (lambda c: c.d.sleep(-1), Misuse, "seconds >= 0, not -1"),
    "nan": (lambda c: c.d.sleep(math.nan), Misuse, "seconds >= 0, not nan"),
    "str": (lambda c: c.d.sleep("1"), Misuse, "seconds >= 0, not '1'"),
    "none": (lambda c: c.d.sleep(None), Misuse, "seconds >= 0, not None"),
}


@cases(SLEEP)
def test_sleep(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.sleep (rig_edge.Driver.sleep): "raises ... Misuse for a timeout that is not a
    number of seconds >= 0"."""
    refused(ctx, call, exc, match)


PROFILE: dict[str, Case] = {
    "zero": (lambda c: c.d.profile(0), Misuse, "positive number of events, not 0"),
    "negative": (lambda c: c.d.profile(-1), Misuse, "positive number of events, not -1"),
    "str": (lambda c: c.d.profile("10"), Misuse, "positive number of events, not '10'"),
}


@cases(PROFILE)
def test_profile(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Device.profile: a profile "holds a positive number of events"; Misuse otherwise."""
    refused(ctx, call, exc, match)


STEP: dict[str, Case] = {
    "launch-grid-too-large": (lambda c: c.step.launch(c.vadd, (1, 1 << 16), (1,),
                                                      (c.dev, c.dev, c.dev, 1)), Misuse,
                              "exceeds the hardware's"),
    "launch-fn-other-device": (lambda c: c.step.launch(c.other_vadd, (1,), (1,),
                                                       (c.dev, c.dev, c.dev, 1)), Misuse,
                               "loaded on another device"),
    "launch-fn-str": (lambda c: c.step.launch("vadd", (1,), (1,)), Misuse, "needs a kernel"),
    "launch-local-args-bad": (lambda c: c.step.launch(c.local, (1,), (32,), (c.dev,)), Misuse,
                              "takes 4 arguments, not 1"),
    "copy-dst-offset-negative": (lambda c: c.step.copy(c.dev, c.pin, 64, dst_offset=-64),
                                 Misuse, "outside the 4096-byte destination"),
    "copy-src-offset-negative": (lambda c: c.step.copy(c.dev, c.pin, 64, src_offset=-64), Misuse,
                                 "outside the 4096-byte source"),
    "copy-n-negative": (lambda c: c.step.copy(c.dev, c.pin, -1), Misuse, "positive, not -1"),
    "copy-too-long": (lambda c: c.step.copy(c.dev, c.pin, N + 1), Misuse, "outside the 4096"),
    "copy-freed": (lambda c: c.step.copy(c.dev, c.freed), Misuse, "not a live region"),
    "copy-other-device": (lambda c: c.step.copy(c.foreign, c.dev), Misuse, "another device's"),
    "set-args-index-range": (lambda c: c.step.set_args(3, ()), Misuse, "item 3 is not a launch"),
    "set-args-index-str": (lambda c: c.step.set_args("0", ()), Misuse, "whole number, not str"),
    "submit-empty": (lambda c: c.step.submit(), Misuse, "an empty step has nothing to submit"),
}


@cases(STEP)
def test_step(ctx: Ctx, call: Any, exc: Any, match: str) -> None:
    """Step.launch / copy / set_args / submit: "Raises Misuse as rig_nv.Device.copy does" and
    as Device.launch does, when recorded, before the step's memory is made or submitted."""
    refused(ctx, call, exc, match)


def test_step_set_args_checks_before_writing(ctx: Ctx) -> None:
    """Step.set_args: bad arguments are Misuse, and the recorded bank keeps its old bytes."""
    i = ctx.step.launch(ctx.vadd, (1,), (32,), (ctx.dev, ctx.dev, ctx.dev, 1))
    bank = bytes(ctx.step.items[i].bank)
    refused(ctx, lambda c: c.step.set_args(i, (c.dev, c.dev, c.dev, 1 << 40)), Misuse,
            "does not fit 4 bytes")
    assert bytes(ctx.step.items[i].bank) == bank
