"""Ask NVIDIA's libcuda to encode many tensor maps and keep what it answers, as facts.

Calls cuTensorMapEncodeTiled and cuTensorMapEncodeIm2col (cuda.h, CUDA 12+) through ctypes
with random valid parameter sets, one-field sweeps from a base case, and single-rule
violations, and writes one JSON line per case: the parameters, the CUresult, and the 128
bytes (hex) where it encoded. Needs a GPU held by NVIDIA's driver (libcuda refuses to encode
without one). The encoder in rig_nv.tensor_map is ours; this file only records the driver.

    python3 scripts/tensor_map_probe.py OUT.jsonl.gz [--cases N] [--seed S]
"""

from __future__ import annotations

import argparse
import ctypes
import gzip
import json
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
    import math
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def valid_tiled(rng: random.Random) -> dict[str, Any]:
    dtype = rng.choice(range(13)) if rng.random() < 0.93 else rng.choice([13, 14, 15])
    e = ELEM[dtype]
    interleave = rng.choice([0, 0, 0, 1, 2])
    rank = rng.randint(3 if interleave else 1, 5)
    if interleave == 2:
        swizzle = 1
    elif interleave == 1:
        swizzle = rng.choice([0, 1, 2, 3])
    else:
        swizzle = rng.choice([0, 0, 1, 2, 3, 3, 4, 5, 6])
    align = 32 if interleave == 2 or dtype in (14, 15) else 16
    dims, strides = [], []
    extent = e
    budget = 1 << 39
    for i in range(rank):
        cap = max(1, min(1 << 32, budget // max(extent, 1)))
        d = loguni(rng, 1, cap)
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
    box = []
    for i in range(rank):
        b = rng.randint(1, 256)
        if i == 0 and interleave == 0:
            span = SWIZZLE_SPAN[swizzle] or 256 * e
            maxb = max(16, min(256 * e, span)) // e
            b = rng.randint(1, max(1, maxb))
            b = max(16 // e if e < 16 else 1, b - b % max(1, 16 // e)) if e < 16 else b
            if dtype in (14, 15):
                b = 128
        box.append(b)
    estr = [rng.randint(1, 8) for _ in range(rank)]
    addr = rng.randrange(1 << 20, 1 << 49) // align * align
    if rng.random() < 0.3:
        addr = addr // 256 * 256 + rng.choice([0, 16, 32, 48, 64, 128]) // align * align
    oob = rng.choice([0, 1]) if dtype in FLOATS else 0
    return {"fn": "tiled", "dtype": dtype, "rank": rank, "addr": addr, "dims": dims,
            "strides": strides, "box": box, "estrides": estr, "interleave": interleave,
            "swizzle": swizzle, "l2": rng.randint(0, 3), "oob": oob}


def valid_im2col(rng: random.Random) -> dict[str, Any]:
    c = valid_tiled(rng)
    while c["rank"] < 3 or c["dtype"] > 12:
        c = valid_tiled(rng)
    rank = c["rank"]
    lim = {3: 1 << 15, 4: 1 << 7, 5: 1 << 4}[rank]
    c["fn"] = "im2col"
    c["lower"] = [rng.randint(-lim, lim - 1) for _ in range(rank - 2)]
    c["upper"] = [rng.randint(-lim, lim - 1) for _ in range(rank - 2)]
    e = ELEM[c["dtype"]]
    if c["interleave"] == 0:
        span = SWIZZLE_SPAN[c["swizzle"]] or 256 * e
        ch = rng.randint(1, max(1, min(256 * e, span) // e))
        step = max(1, 16 // e)
        c["channels"] = max(step, ch - ch % step)
    else:
        c["channels"] = rng.randint(1, 256)
    c["pixels"] = loguni(rng, 1, 1024)
    del c["box"]
    return c


def mutate(rng: random.Random, c: dict[str, Any]) -> dict[str, Any]:
    """Break (or probe) one rule: the driver decides which of these it refuses."""
    c = json.loads(json.dumps(c))
    r = c["rank"]
    k = rng.choice(["addr", "dim0", "dimbig", "stride16", "stridebig", "stridesmall", "box0",
                    "boxbig", "boxinner", "estr", "estr0", "rank", "rank0", "swz", "il",
                    "oob", "dtype", "l2", "chan", "pix", "corner", "enum"])
    if k == "addr":
        c["addr"] += rng.choice([1, 2, 4, 8, 16])
    elif k == "dim0":
        c["dims"][rng.randrange(r)] = 0
    elif k == "dimbig":
        c["dims"][rng.randrange(r)] = (1 << 32) + rng.randint(0, 5)
    elif k == "stride16" and c["strides"]:
        c["strides"][rng.randrange(len(c["strides"]))] += rng.choice([1, 4, 8, 16])
    elif k == "stridebig" and c["strides"]:
        c["strides"][rng.randrange(len(c["strides"]))] = (1 << 40) + rng.choice([0, 16])
    elif k == "stridesmall" and c["strides"]:
        c["strides"][rng.randrange(len(c["strides"]))] = 16
    elif k == "box0" and "box" in c:
        c["box"][rng.randrange(r)] = 0
    elif k == "boxbig" and "box" in c:
        c["box"][rng.randrange(r)] = rng.choice([257, 512])
    elif k == "boxinner" and "box" in c:
        c["box"][0] = rng.randint(1, 256)
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
    elif k == "rank0":
        c["rank"] = 0
    elif k == "swz":
        c["swizzle"] = rng.randint(0, 6)
    elif k == "il":
        c["interleave"] = rng.randint(0, 2)
    elif k == "oob":
        c["oob"] = 1
    elif k == "dtype":
        c["dtype"] = rng.randint(0, 15)
    elif k == "l2":
        c["l2"] = rng.randint(0, 3)
    elif k == "chan" and "channels" in c:
        c["channels"] = rng.choice([0, 257, rng.randint(1, 256)])
    elif k == "pix" and "pixels" in c:
        c["pixels"] = rng.choice([0, 1025, rng.randint(1, 1024)])
    elif k == "corner" and "lower" in c:
        lim = {3: 1 << 15, 4: 1 << 7, 5: 1 << 4}.get(r, 16)
        c["lower"][0] = rng.choice([-lim - 1, lim, lim - 1, -lim])
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
    base = {"fn": "tiled", "dtype": 7, "rank": 5, "addr": 0x7F0000000000,
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
    cases = sweeps()
    for _ in range(a.cases):
        cases.append(valid_tiled(rng))
    for _ in range(a.cases // 3):
        cases.append(valid_im2col(rng))
    for _ in range(a.cases // 2):
        cases.append(mutate(rng, valid_tiled(rng)))
    for _ in range(a.cases // 6):
        cases.append(mutate(rng, valid_im2col(rng)))
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
