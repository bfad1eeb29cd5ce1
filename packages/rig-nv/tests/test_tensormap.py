"""rig_nv.tensormap against NVIDIA's driver: every case scripts/tensor_map_probe.py asked the
H200's libcuda (driver 580.159.04) to encode, kept in data/tensor_maps_*.jsonl.gz. Issue 19:
bit-exact on every encoded case, every refused case refused with a Misuse naming its rule,
and no case the driver encodes refused."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from rig_edge import Memory, Misuse, Region
from rig_nv import tensormap

DATA = sorted((Path(__file__).resolve().parent / "data").glob("tensor_maps_*.jsonl.gz"))
NAMES = {code: name for name, (code, _) in tensormap.DTYPES.items()}


@cache
def cases(path: Path) -> tuple[dict[str, Any], ...]:
    with gzip.open(path, "rt") as f:
        return tuple(json.loads(line) for line in list(f)[1:])


def name(names: tuple[str, ...], v: int, what: str) -> str:
    return names[v] if 0 <= v < len(names) else f"{what}{v}"  # an unknown name: refused


def encode(c: dict[str, Any]) -> tensormap.TensorMap:
    """The driver's call of case ``c``, made through rig's API (lists cut or padded with
    1s to its rank, which rig reads off the shape)."""
    r = c["rank"]
    c = {k: (v + [v[-1] if v else 1] * 6)[:r] if k in ("dims", "box", "estrides") else v
         for k, v in c.items()}
    args: dict[str, Any] = {
        "element_strides": c["estrides"][:r],
        "interleave": name(tensormap.INTERLEAVES, c["interleave"], "interleave"),
        "swizzle": name(tensormap.SWIZZLES, c["swizzle"], "swizzle"),
        "l2": name(tensormap.L2_PROMOTIONS, c["l2"], "l2"),
        "oob": name(tensormap.OOB_FILLS, c["oob"], "oob"),
    }
    dtype = NAMES.get(c["dtype"], f"dtype{c['dtype']}")
    strides = c["strides"][:r - 1] if r else []
    if c["fn"] == "tiled":
        return tensormap.tensor_map(c["addr"], dtype, c["dims"][:r], strides, c["box"][:r], **args)
    return tensormap.tensor_map_im2col(c["addr"], dtype, c["dims"][:r], strides,
                               lower=c["lower"][:max(r - 2, 0)],
                               upper=c["upper"][:max(r - 2, 0)], channels=c["channels"],
                               pixels=c["pixels"], **args)


def outcomes(path: Path) -> tuple[list[str], list[str], Counter[str]]:
    """(encoded cases rig got wrong, refused cases rig encoded, rules rig named)."""
    wrong, accepted, rules = [], [], Counter[str]()
    for i, c in enumerate(cases(path)):
        try:
            got: tensormap.TensorMap | None = encode(c)
        except tensormap.TensorMapError as e:
            got = None
            rules[e.rule] += 1
            if c["result"] == 0:
                wrong.append(f"case {i} refused ({e}): {c}")
        if got is not None and c["result"] == 0 and got.hex() != c["map"]:
            wrong.append(f"case {i}: rig {got.hex()}\n driver {c['map']}: {c}")
        if got is not None and c["result"] != 0:
            accepted.append(f"case {i} encoded, the driver refused ({c['result']}): {c}")
    return wrong, accepted, rules


@pytest.mark.parametrize("path", DATA, ids=[p.name for p in DATA])
def test_every_encoded_case_bit_exact_and_none_refused(path: Path) -> None:
    """Issue 19: bit-exact against every encoded case; no accepted case refused."""
    wrong, _, _ = outcomes(path)
    assert sum(c["result"] == 0 for c in cases(path)) > 2000
    assert not wrong, f"{len(wrong)} cases differ, the first:\n" + "\n".join(wrong[:5])


@pytest.mark.parametrize("path", DATA, ids=[p.name for p in DATA])
def test_every_refused_case_refused_naming_a_rule(path: Path) -> None:
    """Issue 19: every case the driver refuses is refused, with a Misuse naming the rule."""
    _, accepted, rules = outcomes(path)
    assert not accepted, f"{len(accepted)} cases encoded, the first:\n" + "\n".join(accepted[:5])
    assert issubclass(tensormap.TensorMapError, Misuse)
    assert set(rules) <= {"dtype", "interleave", "swizzle", "l2", "oob", "rank", "strides",
                          "element_strides", "shape", "address", "box", "inner", "corner",
                          "channels", "pixels"}


BASE = 0x7F00_0000_0000


def test_names_numpy_dtypes_and_aliases() -> None:
    """dtype by numpy's name, a numpy dtype, or "bf16"/"tf32"/...; enums by name."""
    np = pytest.importorskip("numpy")
    args = (BASE, [64, 32], [256], [16, 8])
    f32 = tensormap.tensor_map(BASE, "float32", *args[1:])
    assert tensormap.tensor_map(BASE, np.dtype(np.float32), *args[1:]) == f32
    assert tensormap.tensor_map(BASE, "f32", *args[1:]) == f32
    bf16 = tensormap.tensor_map(BASE, "bf16", [64, 32], [128], [16, 8])
    assert bf16 == tensormap.tensor_map(BASE, "bfloat16", [64, 32], [128], [16, 8])
    assert bf16[8:12] != f32[8:12]
    for bad in ("int8", "float8", 7, None):
        with pytest.raises(tensormap.TensorMapError, match="dtype") as e:
            tensormap.tensor_map(BASE, bad, *args[1:])
        assert e.value.rule == "dtype"
    with pytest.raises(Misuse, match="swizzle"):
        tensormap.tensor_map(BASE, "float32", *args[1:], swizzle="16b")


def test_region_base_must_hold_the_tensor() -> None:
    """A region gives the address; a tensor past its end is refused (rule region)."""
    r = Region(gpu=BASE, host=None, length=64 * 4 * 32, kind=Memory.DEVICE)
    assert tensormap.tensor_map(r, "float32", [64, 32], [256], [16, 8]) == \
        tensormap.tensor_map(BASE, "float32", [64, 32], [256], [16, 8])
    with pytest.raises(tensormap.TensorMapError) as e:
        tensormap.tensor_map(r, "float32", [64, 33], [256], [16, 8])
    assert e.value.rule == "region"


def test_fields_table_covers_what_the_encoder_writes() -> None:
    """The layout table (FIELDS, docs/tensor-maps.md) names every bit an encoded map set."""
    covered = 0
    for _, first, width, _ in tensormap.FIELDS:
        covered |= ((1 << width) - 1) << first
    seen = 0
    for path in DATA:
        for c in cases(path):
            if c["result"] == 0:
                seen |= int.from_bytes(bytes.fromhex(c["map"]), "little")
    assert seen & ~covered == 0


def test_for_triton_is_fill_tma_descriptor_reversed() -> None:
    """Triton's fill_tma_descriptor arguments (outermost first, strides in elements) give the
    map of the same tensor named innermost first in bytes, with 128-byte L2 promotion."""
    got = tensormap.for_triton(BASE, 3, 2, 6, [128, 64], [1024, 512], [512, 1], 0)
    assert got == tensormap.tensor_map(BASE, "float16", [512, 1024], [1024], [64, 128],
                                       swizzle="128b", l2="128b")
    nan = tensormap.for_triton(BASE, 2, 4, 7, [8, 4, 16], [6, 40, 64], [2560, 64, 1], 1)
    assert nan == tensormap.tensor_map(BASE, "float32", [64, 40, 6], [256, 10240], [16, 4, 8],
                                       swizzle="64b", l2="128b", oob="nan")
    with pytest.raises(tensormap.TensorMapError):
        tensormap.for_triton(BASE, 3, 4, 6, [128, 64], [1024, 512], [512, 1], 0)


# The rules a one-field sweep from a valid base case may break, by the field it changed.
SWEPT_RULES = {"box": {"box"}, "dtype": {"dtype"}, "swizzle": {"swizzle"},
               "lower": {"corner"}, "upper": {"corner"}, "channels": {"inner", "channels"},
               "pixels": {"pixels"}, "rank": {"rank", "corner"}, "dims": {"shape"},
               "strides": {"strides"}, "estrides": {"element_strides"}, "addr": {"address"},
               "interleave": {"interleave", "swizzle"}, "l2": {"l2"}, "oob": {"oob"}}


@pytest.mark.parametrize("path", DATA, ids=[p.name for p in DATA])
def test_a_refused_sweep_names_the_rule_of_the_field_it_changed(path: Path) -> None:
    """Issue 19: the rule a Misuse names is the one broken. A sweep case differs from its
    valid base case (the first sweep case of its kind) in one field: the rule named must be
    that field's."""
    bases: dict[str, dict[str, Any]] = {}
    checked = 0
    for c in cases(path):
        if c.get("mutation") != "sweep":
            continue
        base = bases.setdefault(c["fn"], c)
        changed = {k for k in SWEPT_RULES if c.get(k) != base.get(k)}
        if c["result"] == 0 or len(changed - {"dims", "strides", "estrides", "box"}) > 1:
            continue
        with pytest.raises(tensormap.TensorMapError) as e:
            encode(c)
        key = (changed - {"dims", "strides", "estrides", "box"} or changed).pop()
        assert e.value.rule in SWEPT_RULES[key], (key, e.value, c)
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize(("call", "rule"), [
    (lambda: tensormap.tensor_map(BASE, "float32", [64, 32], [256, 512], [16, 8]), "strides"),
    (lambda: tensormap.tensor_map(BASE, "float32", [64, 32], [256], [16]), "box"),
    (lambda: tensormap.tensor_map(BASE, "float32", [64, 32], [256], [16, 8],
                                  element_strides=[1]), "element_strides"),
    (lambda: tensormap.tensor_map(BASE, "float32", [64, 32], [256], ["a", 8]), "box"),
    (lambda: tensormap.tensor_map(BASE + 8, "float32", [64, 32], [256], [16, 8]), "address"),
    (lambda: tensormap.tensor_map(-16, "float32", [64, 32], [256], [16, 8]), "address"),
    (lambda: tensormap.tensor_map_im2col(BASE, "float32", [64, 8, 4], [256, 2048], lower=[0, 0],
                                         upper=[0], channels=16, pixels=8), "corner"),
    (lambda: tensormap.tensor_map_im2col(BASE, "float32", [64, 8], [256], lower=[], upper=[],
                                         channels=16, pixels=8), "rank"),
])
def test_calls_of_the_wrong_shape_are_refused_naming_the_argument(call: Any, rule: str) -> None:
    """Misuse, naming what was wrong, for arguments the driver's call cannot even express."""
    with pytest.raises(tensormap.TensorMapError) as e:
        call()
    assert e.value.rule == rule
