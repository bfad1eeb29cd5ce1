"""Ask NVIDIA's libcuda to encode many tensor maps and keep what it answers, as facts.

Calls cuTensorMapEncodeTiled and cuTensorMapEncodeIm2col (cuda.h, CUDA 12+) through ctypes
with random valid parameter sets, one-field sweeps from a base case, targeted cases that
settle what round 1 left open ("mutation": "probe:<question>"), and single-rule violations
(the rule's name in "mutation"), and writes one JSON line per case: the parameters, the
CUresult, and the 128 bytes (hex) where it encoded. The same seed gives the same cases.
Needs a GPU held by NVIDIA's driver (libcuda refuses to encode without one). The encoder
in rig_nv.tensormap is ours; this file only records the driver.

    python3 scripts/tensor_map_probe.py OUT.jsonl.gz [--cases N] [--seed S]
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
import math
import random
import sys
from typing import Any

# CUtensorMapDataType (cuda.h): element size in bytes; the packed sub-byte kinds count as 1.
ELEM = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 4, 11: 4, 12: 4,
        13: 1, 14: 1, 15: 1}
FLOATS = {6, 7, 8, 9, 10, 11, 12}
SWIZZLE_SPAN = {0: 0, 1: 32, 2: 64, 3: 128, 4: 128, 5: 128, 6: 128}

u64 = ctypes.c_uint64
u32 = ctypes.c_uint32


def load() -> ctypes.CDLL:
    cu = ctypes.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return cu


def check(rc: int, what: str) -> None:
    if rc:
        sys.exit(f"{what} failed: CUresult {rc}")


def arr(t: Any, xs: list[int]) -> Any:
    return (t * max(1, len(xs)))(*xs)


def encode(cu: ctypes.CDLL, c: dict[str, Any]) -> dict[str, Any]:
    out = (ctypes.c_uint8 * 128)()
    r = c["rank"]
    dims = arr(u64, c["dims"])
    strides = arr(u64, c["strides"])
    es = arr(u32, c["estrides"])
    addr = ctypes.c_void_p(c["addr"])
    if c["fn"] == "tiled":
        rc = cu.cuTensorMapEncodeTiled(
            out, c["dtype"], u32(r), addr, dims, strides, arr(u32, c["box"]), es,
            c["interleave"], c["swizzle"], c["l2"], c["oob"])
    else:
        rc = cu.cuTensorMapEncodeIm2col(
            out, c["dtype"], u32(r), addr, dims, strides,
            arr(ctypes.c_int, c["lower"]), arr(ctypes.c_int, c["upper"]),
            u32(c["channels"]), u32(c["pixels"]), es,
            c["interleave"], c["swizzle"], c["l2"], c["oob"])
    res = dict(c)
    res["result"] = rc
    res["map"] = bytes(out).hex() if rc == 0 else None
    return res


def loguni(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniform, so small and large values both occur."""
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


# Round 1 saw every map whose box held under 228480 bytes encoded and none over 234000: the
# limit looks like the H200's 227 KiB of shared memory per block. Round 2 settles it.
SMEM = 232448


def box_bytes(c: dict[str, Any]) -> int:
    """Bytes one load brings, as round 1's maps hold them (floor(box / element stride))."""
    e = ELEM[c["dtype"]]
    if c["fn"] == "im2col":
        return e * int(c["channels"]) * int(c["pixels"])
    n = e
    for b, s in zip(c["box"], c["estrides"], strict=True):
        n *= b // s
    return n


def layout(rng: random.Random, dtype: int, rank: int, align: int) -> tuple[list[int], list[int]]:
    """Dims and strides (multiples of align, under 2^40) for a tensor of rank dims."""
    e = ELEM[dtype]
    dims, strides = [], []
    extent = e
    for i in range(rank):
        cap = max(1, min(1 << 32, (1 << 39) // max(extent, 1)))
        d = loguni(rng, 1, cap) if rng.random() < 0.8 else rng.randint(1, 64)
        if dtype in (14, 15) and i == 0:
            d = max(128, d - d % 128)
        if dtype == 13 and i == 0:
            d = max(2, d - d % 2)
        dims.append(d)
        if i < rank - 1:
            need = d * extent if i else d * e
            pad = rng.choice([0, 0, 0, rng.randint(1, 64)]) * align
            s = -(-need // align) * align + pad
            if s >= 1 << 40:
                s = ((1 << 40) - 1) // align * align
            strides.append(s)
            extent = s
    return dims, strides


def inner(rng: random.Random, e: int, interleave: int, swizzle: int) -> int:
    """A box[0] (or channel count) whose bytes are a multiple of 16 and fit the swizzle span."""
    span = SWIZZLE_SPAN[swizzle] if interleave == 0 and swizzle else 256 * e
    k = rng.randint(1, max(1, min(256 * e, span) // 16))
    return max(1, min(256, k * 16 // e))


def common(rng: random.Random) -> dict[str, Any]:
    dtype = rng.choice(range(13)) if rng.random() < 0.97 else rng.choice([13, 14, 15])
    interleave = rng.choice([0, 0, 1, 2])
    if interleave == 2:
        swizzle = rng.choice([1, 1, 1, 0, 2])
    else:
        swizzle = rng.choice([0, 0, 1, 2, 3, 3]) if rng.random() < 0.97 else rng.randint(4, 6)
    align = 32 if interleave == 2 or dtype in (14, 15) else 16
    addr = rng.randrange(1 << 20, 1 << 49) // align * align
    if rng.random() < 0.3:
        addr = addr // 256 * 256 + rng.choice([0, 16, 32, 48, 64, 128]) // align * align
    oob = rng.choice([0, 1]) if dtype in FLOATS else 0
    return {"dtype": dtype, "interleave": interleave, "swizzle": swizzle, "addr": addr,
            "l2": rng.randint(0, 3), "oob": oob, "align": align}


def valid_tiled(rng: random.Random) -> dict[str, Any]:
    """A tiled case meant to encode: every documented rule and round 1's box limit kept."""
    k = common(rng)
    align = k.pop("align")
    rank = rng.randint(3 if k["interleave"] else 1, 5)
    dims, strides = layout(rng, k["dtype"], rank, align)
    e = ELEM[k["dtype"]]
    box = [inner(rng, e, k["interleave"], k["swizzle"])]
    box += [loguni(rng, 1, 256) for _ in range(rank - 1)]
    if k["dtype"] in (14, 15):
        box[0] = 128
    estr = [rng.choice([1, 1, 1, rng.randint(1, 8)]) for _ in range(rank)]
    c = {"fn": "tiled", "rank": rank, "dims": dims, "strides": strides, "box": box,
         "estrides": estr, **k}
    keep_big = rng.random() < 0.05
    while box_bytes(c) >= SMEM and not keep_big:
        i = rng.randrange(1, rank)
        box[i] = max(1, box[i] // 2)
    return c


def valid_im2col(rng: random.Random) -> dict[str, Any]:
    """An im2col case meant to encode; corners kept inside the tensor's extent."""
    k = common(rng)
    align = k.pop("align")
    rank = rng.randint(3, 5)
    dims, strides = layout(rng, k["dtype"], rank, align)
    lim = {3: 1 << 15, 4: 1 << 7, 5: 1 << 4}[rank]
    lower, upper = [], []
    for i in range(rank - 2):
        d = dims[i + 1]
        lo = rng.randint(-lim, lim - 1) if rng.random() < 0.3 else rng.randint(-3, 3)
        up = rng.randint(-lim, lim - 1) if rng.random() < 0.3 else rng.randint(-3, 3)
        if rng.random() < 0.8:
            lo = max(-lim, min(lim - 1, lo))
            up = max(lo - d + 1, min(lim - 1, up))
        lower.append(lo)
        upper.append(up)
    e = ELEM[k["dtype"]]
    ch = inner(rng, e, k["interleave"], k["swizzle"])
    if k["dtype"] in (14, 15):
        ch = 128
    pixels = loguni(rng, 1, 1024)
    keep_big = rng.random() < 0.05
    while e * ch * pixels >= SMEM and not keep_big:
        pixels = max(1, pixels // 2)
    estr = [rng.choice([1, 1, 1, rng.randint(1, 8)]) for _ in range(rank)]
    return {"fn": "im2col", "rank": rank, "dims": dims, "strides": strides, "lower": lower,
            "upper": upper, "channels": ch, "pixels": pixels, "estrides": estr, **k}


RULES = ["addr", "addr32", "dim0", "dimbig", "stride16", "stride32", "stridebig", "stridesmall",
         "box0", "boxbig", "boxinner", "span", "boxbytes", "estr", "estr0", "rank", "rank0",
         "rankil", "swz", "il", "il32swz", "oob", "dtype", "l2", "chan", "pix", "corner", "area",
         "enum"]


def mutate(rng: random.Random, c: dict[str, Any], k: str | None = None) -> dict[str, Any]:
    """Break (or probe) one rule, named in "mutation": the driver decides what it refuses."""
    c = json.loads(json.dumps(c))
    r = c["rank"]
    k = k or rng.choice(RULES)
    e = ELEM[c["dtype"]]
    im = c["fn"] == "im2col"
    if k == "addr":
        c["addr"] += rng.choice([1, 2, 4, 8])
    elif k == "addr32":
        c["addr"] = c["addr"] // 32 * 32 + 16
    elif k == "dim0":
        c["dims"][rng.randrange(r)] = 0
    elif k == "dimbig":
        c["dims"][rng.randrange(r)] = (1 << 32) + rng.choice([0, 0, 1, 5])
    elif k == "stride16" and c["strides"]:
        c["strides"][rng.randrange(len(c["strides"]))] += rng.choice([1, 4, 8])
    elif k == "stride32" and c["strides"]:
        c["strides"][rng.randrange(len(c["strides"]))] |= 16
    elif k == "stridebig" and c["strides"]:
        c["strides"][rng.randrange(len(c["strides"]))] = (1 << 40) + rng.choice([-16, -32, 0, 16])
    elif k == "stridesmall" and c["strides"]:
        c["strides"][rng.randrange(len(c["strides"]))] = rng.choice([16, 32])
    elif k == "box0" and not im:
        c["box"][rng.randrange(r)] = 0
    elif k == "boxbig" and not im:
        c["box"][rng.randrange(r)] = rng.choice([257, 512])
    elif k == "boxinner" and not im:
        c["box"][0] = rng.randint(1, 256)
    elif k == "span":
        n = max(1, min(256, ((SWIZZLE_SPAN[c["swizzle"]] or 32) + 16) // e))
        if im:
            c["channels"] = n
        else:
            c["box"][0] = n
    elif k == "boxbytes":
        if im:
            c["pixels"] = min(1024, SMEM // (e * c["channels"]) + rng.randint(-2, 3))
        else:
            rest = e * max(1, c["box"][0] // c["estrides"][0])
            for i in range(1, r - 1):
                rest *= max(1, c["box"][i] // c["estrides"][i])
                c["box"][i] = max(1, c["box"][i] // c["estrides"][i]) * c["estrides"][i]
            if r > 1:
                c["estrides"][r - 1] = 1
                c["box"][r - 1] = min(256, max(1, SMEM // rest + rng.randint(-1, 2)))
    elif k == "estr":
        c["estrides"][rng.randrange(r)] = rng.choice([9, 16])
    elif k == "estr0":
        c["estrides"][rng.randrange(r)] = 0
    elif k == "rank":
        c["rank"] = 6
        for key in ("dims", "estrides", "box"):
            if key in c:
                c[key].append(1)
        c["strides"].append(c["strides"][-1] if c["strides"] else 16)
        if im:
            c["lower"].append(0)
            c["upper"].append(0)
    elif k == "rank0":
        c["rank"] = 0
    elif k == "rankil":
        c["interleave"] = rng.choice([1, 2])
        c["swizzle"] = 1
        c["rank"] = rng.choice([1, 2]) if not im else 2
        n = c["rank"]
        for key in ("dims", "estrides", "box"):
            if key in c:
                c[key] = c[key][:n]
        c["strides"] = [s // 32 * 32 or 32 for s in c["strides"][:n - 1]]
        c["addr"] = c["addr"] // 32 * 32
    elif k == "swz":
        c["swizzle"] = rng.randint(0, 6)
    elif k == "il":
        c["interleave"] = rng.randint(0, 2)
    elif k == "il32swz":
        c["interleave"] = 2
        c["swizzle"] = rng.choice([0, 2, 3, 3, 3])
        c["strides"] = [s // 32 * 32 or 32 for s in c["strides"]]
        c["addr"] = c["addr"] // 32 * 32
    elif k == "oob":
        c["oob"] = 1
    elif k == "dtype":
        c["dtype"] = rng.randint(0, 15)
    elif k == "l2":
        c["l2"] = rng.randint(0, 3)
    elif k == "chan" and im:
        c["channels"] = rng.choice([0, 257, rng.randint(1, 256)])
    elif k == "pix" and im:
        c["pixels"] = rng.choice([0, 1025, rng.randint(1, 1024)])
    elif k == "corner" and im:
        lim = {3: 1 << 15, 4: 1 << 7, 5: 1 << 4}.get(r, 16)
        j = rng.randrange(r - 2)
        c[rng.choice(["lower", "upper"])][j] = rng.choice([-lim - 1, lim, lim - 1, -lim])
    elif k == "area" and im:
        j = rng.randrange(r - 2)
        lim = {3: 1 << 15, 4: 1 << 7, 5: 1 << 4}.get(r, 16)
        ext = rng.choice([0, 0, -1, 1, -2, 2, rng.randint(-40, 40)])
        up = c["lower"][j] - c["dims"][j + 1] + ext
        c["upper"][j] = max(-lim, min(lim - 1, up))
    elif k == "enum":
        field = rng.choice(["dtype", "interleave", "swizzle", "l2", "oob"])
        c[field] = rng.choice([16, 7, 4, 2, 99])
    c["mutation"] = k
    return c


def variant(base: dict[str, Any], **set_: Any) -> dict[str, Any]:
    """A deep copy of base with the given fields set; list fields as (index, value)."""
    c: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in set_.items():
        if isinstance(value, tuple):
            c[key][value[0]] = value[1]
        else:
            c[key] = value
    return c


def sweeps() -> list[dict[str, Any]]:
    """One field at a time from a base case, so each field's bits can be read alone."""
    base: dict[str, Any] = {"fn": "tiled", "dtype": 7, "rank": 5, "addr": 0x7F0000000000,
            "dims": [64, 32, 16, 8, 4], "strides": [256, 8192, 131072, 1048576],
            "box": [16, 8, 4, 2, 2], "estrides": [1, 1, 1, 1, 1], "interleave": 0,
            "swizzle": 0, "l2": 0, "oob": 0}
    out = [dict(base)]
    for i in range(5):
        out += [variant(base, dims=(i, 1 << b)) for b in range(33)]
        out += [variant(base, dims=(i, v))
                for v in (1, 2, 3, 5, 7, 100, 255, 256, 65535, (1 << 32) - 1)]
        if i < 4:
            out += [variant(base, strides=(i, 1 << b)) for b in range(4, 40)]
        out += [variant(base, box=(i, v)) for v in (4, 8, 16, 32, 64, 128, 200, 256)]
        out += [variant(base, estrides=(i, v)) for v in range(1, 9)]
    out += [variant(base, addr=1 << b) for b in range(4, 57)]
    for key, n in (("dtype", 16), ("swizzle", 7), ("l2", 4), ("oob", 2), ("interleave", 3)):
        out += [variant(base, **{key: v}) for v in range(n)]
    for r in range(1, 6):
        out.append(variant(base, rank=r, dims=base["dims"][:r], strides=base["strides"][:r - 1],
                           box=base["box"][:r], estrides=base["estrides"][:r]))
    im = variant(base, fn="im2col", lower=[0, 0, 0], upper=[0, 0, 0], channels=16, pixels=32)
    del im["box"]
    out.append(im)
    for j in range(3):
        for v in (-16, -8, -1, 1, 2, 7, 15):
            out += [variant(im, lower=(j, v)), variant(im, upper=(j, v))]
    out += [variant(im, channels=v) for v in (1, 4, 8, 16, 32, 64, 128, 256)]
    out += [variant(im, pixels=v) for v in (1, 2, 3, 64, 255, 256, 512, 1023, 1024)]
    for r, lim in ((3, 1 << 15), (4, 1 << 7)):
        for v in (-lim, lim - 1, 1, -1, 1000 % lim):
            out.append(variant(im, rank=r, dims=im["dims"][:r], strides=im["strides"][:r - 1],
                               estrides=im["estrides"][:r], lower=[v] * (r - 2),
                               upper=[-v] * (r - 2)))
    for c in out:
        c["mutation"] = "sweep"
    return out


TILED: dict[str, Any] = {"fn": "tiled", "dtype": 7, "rank": 3, "addr": 0x7F0000000000,
         "dims": [1 << 20, 1 << 10, 1 << 8], "strides": [1 << 22, 1 << 32],
         "box": [16, 8, 4], "estrides": [1, 1, 1], "interleave": 0, "swizzle": 0, "l2": 0,
         "oob": 0}
IM2COL: dict[str, Any] = {"fn": "im2col", "dtype": 7, "rank": 3, "addr": 0x7F0000000000,
          "dims": [64, 8, 4], "strides": [256, 2048], "lower": [0], "upper": [0],
          "channels": 16, "pixels": 8, "estrides": [1, 1, 1], "interleave": 0, "swizzle": 0,
          "l2": 0, "oob": 0}


def with_rank(base: dict[str, Any], r: int, **set_: Any) -> dict[str, Any]:
    """base cut or grown to rank r (new dims 4 deep, strides growing), then fields set."""
    c = variant(base)
    while len(c["dims"]) < r:
        c["strides"].append((c["strides"][-1] if c["strides"] else 256) * 4)
        c["dims"].append(4)
        c["estrides"].append(1)
        if "box" in c:
            c["box"].append(2)
    c["rank"] = r
    c["dims"], c["estrides"] = c["dims"][:r], c["estrides"][:r]
    c["strides"] = c["strides"][:r - 1]
    if "box" in c:
        c["box"] = c["box"][:r]
    else:
        c["lower"] = (c["lower"] + [0] * 3)[:r - 2]
        c["upper"] = (c["upper"] + [0] * 3)[:r - 2]
    return variant(c, **set_)


def targeted() -> list[dict[str, Any]]:
    """Round 2: cases that settle what round 1 left open, each tagged "probe:<question>"."""
    out: list[tuple[str, dict[str, Any]]] = []
    # The box byte limit (232448 = 227 KiB?), and whether it counts floor or ceil(box/stride).
    for b1 in range(200, 257, 1):
        for e_dt, b0 in ((7, 64), (0, 256), (8, 32)):
            out.append(("boxbytes", variant(TILED, dtype=e_dt, box=[b0, b1, 4])))
    for n in (SMEM - 256, SMEM - 16, SMEM, SMEM + 16, SMEM + 256, 1 << 18, (1 << 18) - 16):
        for b2 in range(1, 9):
            if n % (b2 * 1024) == 0 and n // (b2 * 1024) <= 256:
                out.append(("boxbytes", variant(TILED, box=[256, n // (b2 * 1024), b2])))
        if n % 256 == 0 and n // 256 <= 1024:
            out.append(("boxbytes", variant(IM2COL, channels=64, pixels=n // 256)))
        if n % 1024 == 0 and n // 1024 <= 1024:
            out.append(("boxbytes", variant(IM2COL, channels=256, pixels=n // 1024)))
    for p in range(890, 1025, 3):
        out.append(("boxbytes", variant(IM2COL, channels=64, pixels=p)))
    for s1 in range(1, 9):
        for b1 in (227, 228, 229, 240, 256):
            out.append(("boxbytes-estride",
                        variant(TILED, box=[256, b1, 4], estrides=[1, s1, 1])))
            out.append(("boxbytes-estride0",
                        variant(TILED, box=[64, b1, 16], estrides=[s1, 1, 1])))
    for b, s_ in ((1, 2), (3, 4), (7, 8), (2, 3), (1, 8), (9, 8)):
        out.append(("box-under-estride", variant(TILED, box=[16, b, 4], estrides=[1, s_, 1])))
        out.append(("box-under-estride0", variant(TILED, box=[16, 8, 4], estrides=[s_, 1, 1])))
    # The im2col bounding box: which extents, strides and pixel counts it refuses.
    for w in (1, 2, 3, 8):
        for lo in range(-4, 5):
            for up in range(-4, 5):
                out.append(("area3", variant(IM2COL, dims=[64, w, 4], lower=[lo], upper=[up])))
    # Round 1: interleaved im2col maps encoded with empty boxes that plain ones refuse.
    for il in (1, 2):
        for w in (1, 3, 8):
            for lo in range(-4, 5, 2):
                for up in range(-12, 5, 2):
                    out.append(("area3-il", variant(IM2COL, dims=[64, w, 4], lower=[lo],
                                                    upper=[up], interleave=il, swizzle=1)))
        for lo in range(-16, 16, 3):
            for up in (-16, -9, -8, -7, -1, 0, 15):
                out.append(("area5-il", with_rank(IM2COL, 5, dims=[64, 8, 8, 8, 2],
                                                  lower=[0, 0, lo], upper=[0, 0, up],
                                                  interleave=il, swizzle=1)))
    # Round 1: the bounding box counts a dim as a signed 32-bit number, and with interleave
    # pairs offset i with dim i (not i + 1). Dims about 2^31 and 2^32 everywhere settle both.
    for il in (0, 1):
        for r in (3, 4, 5):
            for j in range(r):
                for d in (1, 2, (1 << 31) - 2, (1 << 31) - 1, 1 << 31, (1 << 31) + 1,
                          (1 << 32) - 1, 1 << 32):
                    for lo, up in ((0, 0), (1, 0), (0, -1), (-2, 2)):
                        dims = [64] + [4] * (r - 1)
                        dims[j] = d
                        out.append(("area-dim-edge", with_rank(
                            IM2COL, r, dims=dims, strides=[256, 1 << 20, 1 << 30, 1 << 36][:r - 1],
                            lower=[lo] * (r - 2), upper=[up] * (r - 2), interleave=il)))
    for d0 in (1, 7, 8, 16, 64):
        for ch in (4, 8, 16, 64):
            out.append(("channels-vs-dim0", variant(IM2COL, dims=[d0, 8, 4], channels=ch,
                                                    strides=[256, 2048])))
    for es in (2, 3):
        for lo in range(-4, 5):
            for up in range(-8, 1):
                out.append(("area3-estride", variant(IM2COL, lower=[lo], upper=[up],
                                                     estrides=[1, es, 1])))
    for lo in range(-16, 16):
        for up in (-16, -9, -8, -7, -1, 0, 1, 15):
            out.append(("area5", with_rank(IM2COL, 5, dims=[64, 8, 8, 8, 2],
                                           lower=[0, 0, lo], upper=[0, 0, up])))
            out.append(("area5w", with_rank(IM2COL, 5, dims=[64, 8, 8, 8, 2],
                                            lower=[lo, 0, 0], upper=[up, 0, 0])))
    for lo in (-128, -64, -1, 0, 1, 64, 127):
        for up in (-128, -64, -9, -8, -1, 0, 1, 127):
            out.append(("area4", with_rank(IM2COL, 4, dims=[64, 8, 8, 2], lower=[lo, 0],
                                           upper=[up, 0])))
    for lo in (-32768, -32767, -1000, 0, 1000, 32767):
        for up in (-32768, -32767, -1000, -9, -8, 0, 1000, 32767):
            out.append(("area3-big", variant(IM2COL, lower=[lo], upper=[up])))
    for pix in (1, 7, 8, 9, 16, 31, 32, 33, 64, 1024):
        out.append(("pixels-vs-box", variant(IM2COL, dims=[64, 2, 2], pixels=pix)))
    # Interleave: swizzle, alignment, inner bytes, rank.
    for il in (1, 2):
        for swz in range(7):
            for dt in (0, 1, 7, 8):
                e = ELEM[dt]
                for nb in (8, 16, 32, 48, 64, 128, 256, 512, 1024, 2048):
                    if nb % e == 0 and nb // e <= 256:
                        out.append(("interleave", variant(
                            TILED, dtype=dt, interleave=il, swizzle=swz,
                            box=[nb // e, 8, 4])))
                out.append(("interleave-im2col", variant(
                    IM2COL, dtype=dt, interleave=il, swizzle=swz, channels=max(1, 64 // e))))
        for r in (1, 2, 3, 4, 5):
            out.append(("interleave-rank", with_rank(TILED, r, interleave=il, swizzle=1)))
        for addr_lo in (0, 16, 32, 48, 64):
            out.append(("interleave-addr", variant(TILED, interleave=il, swizzle=1,
                                                   addr=TILED["addr"] + addr_lo)))
        for st in (16, 32, 48, 64, 4096 + 16):
            out.append(("interleave-stride", variant(TILED, interleave=il, swizzle=1,
                                                     strides=[st, 1 << 32])))
        for es0 in range(1, 9):
            out.append(("interleave-estride0", variant(TILED, interleave=il, swizzle=1,
                                                       estrides=[es0, 1, 1])))
            out.append(("estride0", variant(TILED, estrides=[es0, 1, 1])))
    # Swizzle span against the inner box bytes, tiled and im2col, byte and double elements.
    for swz in range(7):
        for dt in (0, 8):
            e = ELEM[dt]
            for nb in range(16, 272, 16):
                if nb // e <= 256:
                    out.append(("span", variant(TILED, dtype=dt, swizzle=swz,
                                                box=[nb // e, 8, 4])))
                    out.append(("span-im2col", variant(IM2COL, dtype=dt, swizzle=swz,
                                                       channels=nb // e)))
            for nb in (1, 2, 4, 8, 24):
                if nb % e == 0:
                    out.append(("inner16", variant(TILED, dtype=dt, swizzle=swz,
                                                   box=[nb // e, 8, 4])))
    # Every dtype with every OOB fill, L2 promotion and swizzle, tiled and im2col.
    for dt in range(16):
        e = ELEM[dt]
        b0 = 128 if dt in (14, 15) else max(1, 32 // e)
        for oob in (0, 1):
            for l2 in range(4):
                out.append(("dtype", variant(TILED, dtype=dt, oob=oob, l2=l2, box=[b0, 8, 4])))
                out.append(("dtype-im2col", variant(IM2COL, dtype=dt, oob=oob, l2=l2,
                                                    channels=b0)))
        for swz in range(7):
            out.append(("dtype-swizzle", variant(TILED, dtype=dt, swizzle=swz, box=[b0, 8, 4],
                                                 dims=[1024, 1024, 256])))
    # Large and edge values of each field, at each position.
    for r in range(1, 6):
        for i in range(r):
            for d in ((1 << 32) - 1, 1 << 32, (1 << 32) + 1, 1 << 33):
                dims = [4] * r
                dims[i] = d
                out.append(("dim-edge", with_rank(TILED, r, dims=dims, box=[16] + [2] * (r - 1),
                                                  strides=[1 << 36] * (r - 1))))
        for i in range(r - 1):
            for st in ((1 << 40) - 32, (1 << 40) - 16, 1 << 40, (1 << 40) + 16, 1 << 41, 0):
                strides = [1 << 20] * (r - 1)
                strides[i] = st
                out.append(("stride-edge", with_rank(TILED, r, strides=strides)))
    for b in range(56, 64):
        out.append(("addr-edge", variant(TILED, addr=1 << b)))
        out.append(("addr-edge", variant(TILED, addr=(1 << b) - 16)))
    out.append(("addr-edge", variant(TILED, addr=(1 << 64) - 16)))
    out.append(("addr-edge", variant(TILED, addr=0)))
    for r in (0, 1, 2, 3, 4, 5, 6):
        out.append(("rank", with_rank(TILED, max(1, r), rank=r)))
        out.append(("rank-im2col", with_rank(IM2COL, max(3, r), rank=r)))
    for ch in (0, 1, 2, 4, 8, 16, 255, 256, 257):
        for dt in (0, 7):
            out.append(("channels", variant(IM2COL, dtype=dt, channels=ch)))
            out.append(("channels-il", variant(IM2COL, dtype=dt, channels=ch, interleave=1)))
    for pix in (0, 1, 1023, 1024, 1025, 2048):
        out.append(("pixels", variant(IM2COL, pixels=pix)))
    for es in (0, 1, 8, 9):
        for i in range(3):
            out.append(("estride", variant(TILED, estrides=(i, es))))
            out.append(("estride-im2col", variant(IM2COL, estrides=(i, es))))
    for bx in (0, 1, 255, 256, 257):
        for i in range(1, 3):
            out.append(("box-edge", variant(TILED, box=(i, bx))))
    # Strides that do not cover the dimension below, or go backwards.
    for pair in ([16, 1 << 32], [1 << 22, 16], [1 << 22, 1 << 21], [64, 64]):
        out.append(("stride-order", variant(TILED, strides=pair)))
    # What Triton's launcher asks for (fill_tma_descriptor: no interleave, L2 128B, dims
    # reversed from its outermost-first block shapes), as a matmul's A and B tiles.
    for dt in (0, 6, 9, 7):
        e = ELEM[dt]
        for want, outer in ((64, 128), (64, 64), (32, 256), (128, 128), (16, 64)):
            inner_ = min(want, 128 // e)  # Triton splits wider tiles at the 128-byte span
            nb = inner_ * e
            swz = 3 if nb % 128 == 0 else 2 if nb % 64 == 0 else 1 if nb % 32 == 0 else 0
            for oob in (0, 1) if dt != 0 else (0,):
                out.append(("triton", variant(TILED, dtype=dt, rank=2, dims=[4096, 2048],
                                              strides=[4096 * e], box=[inner_, outer],
                                              estrides=[1, 1], swizzle=swz, l2=2, oob=oob)))
    for name, c in out:
        c["mutation"] = "probe:" + name
    return [c for _, c in out]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--cases", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=20261201)
    a = ap.parse_args()
    cu = load()
    ver = ctypes.c_int()
    cu.cuDriverGetVersion(ctypes.byref(ver))
    rng = random.Random(a.seed)
    cases = sweeps() + targeted()
    for _ in range(a.cases):
        cases.append(valid_tiled(rng))
    for _ in range(a.cases // 2):
        cases.append(valid_im2col(rng))
    for i in range(a.cases // 2):
        cases.append(mutate(rng, valid_tiled(rng), RULES[i % len(RULES)]))
    for i in range(a.cases // 4):
        cases.append(mutate(rng, valid_im2col(rng), RULES[i % len(RULES)]))
    counts = {"ok": 0, "refused": 0}
    with gzip.open(a.out, "wt") as f:
        f.write(json.dumps({"driver_version": ver.value, "seed": a.seed}) + "\n")
        for c in cases:
            r = encode(cu, c)
            counts["ok" if r["result"] == 0 else "refused"] += 1
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    print(f"tensor maps: {len(cases)} cases, {counts['ok']} encoded, {counts['refused']} "
          f"refused, driver {ver.value}")


if __name__ == "__main__":
    main()
