"""rig_nv.qmd against NVIDIA's own QMD headers, decoded independently of rig_nv.qmd's tables.

The bit ranges this test decodes with are NVIDIA's ``#define`` lines, copied verbatim below from
NVIDIA/open-gpu-doc at commit c8607fe576b53ff821ffcf97e7548d2de11c4eaf (2025-07-18):

- V03_00 (Ampere 0xC6C0/0xC7C0, Ada 0xC9C0): classes/compute/clc6c0qmd.h
  (blob e22f3fe6050d959693db1b3b2e611eb302067d88), ``NVC6C0_QMDV03_00_*``
- V04_00 (Hopper 0xCBC0): classes/compute/clcbc0qmd.h
  (blob dd023ba14b6f78f040440a8e865141183afe55cb), ``NVCBC0_QMDV04_00_*``
- V05_00 (Blackwell 0xCDC0/0xCEC0): classes/compute/clcdc0qmd.h
  (blob 80d0724f98e362cfbaf9878c6bcd9e4c33df9118), ``NVCDC0_QMDV05_00_*``

The lines are parsed here (``MW(hi:lo)``, bit 0 = bit 0 of dword 0, little-endian; indexed fields
``MW((a+(i)*s):(b+(i)*s))``; a ``_SHIFTED<n>`` suffix in the name says the field holds the value
>> n). ``test_copied_lines_match_the_header`` checks the copy against the header itself where the
open-gpu-doc mirror is on this machine (set RIG_OPEN_GPU_DOC to a clone or bare mirror); CI
without it runs on the copy. The carveout sizes are Mesa's ``init_shared_mem_sizes()``
(src/nouveau/winsys/nouveau_device.c).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rig_nv import qmd
from rig_nv.classes import Classes

OPEN_GPU_DOC_COMMIT = "c8607fe576b53ff821ffcf97e7548d2de11c4eaf"

HEADERS = {  # version -> (header path in open-gpu-doc, macro prefix, its lines as copied)
    3: ("classes/compute/clc6c0qmd.h", "NVC6C0_QMDV03_00_", """
#define NVC6C0_QMDV03_00_QMD_GROUP_ID                              MW(133:128)
#define NVC6C0_QMDV03_00_SM_GLOBAL_CACHING_ENABLE                  MW(134:134)
#define NVC6C0_QMDV03_00_INVALIDATE_TEXTURE_HEADER_CACHE           MW(186:186)
#define NVC6C0_QMDV03_00_INVALIDATE_TEXTURE_SAMPLER_CACHE          MW(187:187)
#define NVC6C0_QMDV03_00_INVALIDATE_TEXTURE_DATA_CACHE             MW(188:188)
#define NVC6C0_QMDV03_00_INVALIDATE_SHADER_DATA_CACHE              MW(189:189)
#define NVC6C0_QMDV03_00_INVALIDATE_INSTRUCTION_CACHE              MW(190:190)
#define NVC6C0_QMDV03_00_INVALIDATE_SHADER_CONSTANT_CACHE          MW(191:191)
#define NVC6C0_QMDV03_00_CWD_MEMBAR_TYPE                           MW(369:368)
#define NVC6C0_QMDV03_00_CWD_MEMBAR_TYPE_L1_SYSMEMBAR              0x00000001
#define NVC6C0_QMDV03_00_API_VISIBLE_CALL_LIMIT                    MW(378:378)
#define NVC6C0_QMDV03_00_API_VISIBLE_CALL_LIMIT_NO_CHECK           0x00000001
#define NVC6C0_QMDV03_00_SAMPLER_INDEX                             MW(382:382)
#define NVC6C0_QMDV03_00_SAMPLER_INDEX_INDEPENDENTLY               0x00000000
#define NVC6C0_QMDV03_00_CTA_RASTER_WIDTH                          MW(415:384)
#define NVC6C0_QMDV03_00_CTA_RASTER_HEIGHT                         MW(431:416)
#define NVC6C0_QMDV03_00_CTA_RASTER_DEPTH                          MW(463:448)
#define NVC6C0_QMDV03_00_SHARED_MEMORY_SIZE                        MW(561:544)
#define NVC6C0_QMDV03_00_MIN_SM_CONFIG_SHARED_MEM_SIZE             MW(567:562)
#define NVC6C0_QMDV03_00_MAX_SM_CONFIG_SHARED_MEM_SIZE             MW(574:569)
#define NVC6C0_QMDV03_00_QMD_VERSION                               MW(579:576)
#define NVC6C0_QMDV03_00_QMD_MAJOR_VERSION                         MW(583:580)
#define NVC6C0_QMDV03_00_CTA_THREAD_DIMENSION0                     MW(607:592)
#define NVC6C0_QMDV03_00_CTA_THREAD_DIMENSION1                     MW(623:608)
#define NVC6C0_QMDV03_00_CTA_THREAD_DIMENSION2                     MW(639:624)
#define NVC6C0_QMDV03_00_CONSTANT_BUFFER_VALID(i)                  MW((640+(i)*1):(640+(i)*1))
#define NVC6C0_QMDV03_00_REGISTER_COUNT_V                          MW(656:648)
#define NVC6C0_QMDV03_00_TARGET_SM_CONFIG_SHARED_MEM_SIZE          MW(662:657)
#define NVC6C0_QMDV03_00_SHADER_LOCAL_MEMORY_LOW_SIZE              MW(759:736)
#define NVC6C0_QMDV03_00_BARRIER_COUNT                             MW(767:763)
#define NVC6C0_QMDV03_00_CONSTANT_BUFFER_ADDR_LOWER(i)             MW((1055+(i)*64):(1024+(i)*64))
#define NVC6C0_QMDV03_00_CONSTANT_BUFFER_ADDR_UPPER(i)             MW((1072+(i)*64):(1056+(i)*64))
#define NVC6C0_QMDV03_00_CONSTANT_BUFFER_INVALIDATE(i)             MW((1074+(i)*64):(1074+(i)*64))
#define NVC6C0_QMDV03_00_CONSTANT_BUFFER_SIZE_SHIFTED4(i)          MW((1087+(i)*64):(1075+(i)*64))
#define NVC6C0_QMDV03_00_PROGRAM_ADDRESS_LOWER                     MW(1567:1536)
#define NVC6C0_QMDV03_00_PROGRAM_ADDRESS_UPPER                     MW(1584:1568)
#define NVC6C0_QMDV03_00_SHADER_LOCAL_MEMORY_HIGH_SIZE             MW(1623:1600)
#define NVC6C0_QMDV03_00_SASS_VERSION                              MW(1663:1656)
"""),
    4: ("classes/compute/clcbc0qmd.h", "NVCBC0_QMDV04_00_", """
#define NVCBC0_QMDV04_00_QMD_GROUP_ID                              MW(21:16)
#define NVCBC0_QMDV04_00_QMD_TYPE                                  MW(25:23)
#define NVCBC0_QMDV04_00_QMD_TYPE_GRID_CTA                         0x00000002
#define NVCBC0_QMDV04_00_CONSTANT_BUFFER_VALID(i)                  MW((416+(i)*4):(416+(i)*4))
#define NVCBC0_QMDV04_00_CONSTANT_BUFFER_INVALIDATE(i)             MW((419+(i)*4):(419+(i)*4))
#define NVCBC0_QMDV04_00_SHADER_LOCAL_MEMORY_LOW_SIZE              MW(535:512)
#define NVCBC0_QMDV04_00_SASS_VERSION                              MW(543:536)
#define NVCBC0_QMDV04_00_SHADER_LOCAL_MEMORY_HIGH_SIZE             MW(567:544)
#define NVCBC0_QMDV04_00_API_VISIBLE_CALL_LIMIT                    MW(568:568)
#define NVCBC0_QMDV04_00_API_VISIBLE_CALL_LIMIT_NO_CHECK           0x00000001
#define NVCBC0_QMDV04_00_SAMPLER_INDEX                             MW(569:569)
#define NVCBC0_QMDV04_00_SAMPLER_INDEX_INDEPENDENTLY               0x00000000
#define NVCBC0_QMDV04_00_QMD_MINOR_VERSION                         MW(579:576)
#define NVCBC0_QMDV04_00_QMD_MAJOR_VERSION                         MW(583:580)
#define NVCBC0_QMDV04_00_SHARED_MEMORY_SIZE                        MW(601:584)
#define NVCBC0_QMDV04_00_INVALIDATE_TEXTURE_HEADER_CACHE           MW(602:602)
#define NVCBC0_QMDV04_00_INVALIDATE_TEXTURE_SAMPLER_CACHE          MW(603:603)
#define NVCBC0_QMDV04_00_INVALIDATE_TEXTURE_DATA_CACHE             MW(604:604)
#define NVCBC0_QMDV04_00_INVALIDATE_SHADER_DATA_CACHE              MW(605:605)
#define NVCBC0_QMDV04_00_INVALIDATE_INSTRUCTION_CACHE              MW(606:606)
#define NVCBC0_QMDV04_00_INVALIDATE_SHADER_CONSTANT_CACHE          MW(607:607)
#define NVCBC0_QMDV04_00_MIN_SM_CONFIG_SHARED_MEM_SIZE             MW(613:608)
#define NVCBC0_QMDV04_00_MAX_SM_CONFIG_SHARED_MEM_SIZE             MW(619:614)
#define NVCBC0_QMDV04_00_TARGET_SM_CONFIG_SHARED_MEM_SIZE          MW(625:620)
#define NVCBC0_QMDV04_00_GRID_WIDTH                                MW(1055:1024)
#define NVCBC0_QMDV04_00_GRID_HEIGHT                               MW(1071:1056)
#define NVCBC0_QMDV04_00_GRID_DEPTH                                MW(1103:1088)
#define NVCBC0_QMDV04_00_CWD_MEMBAR_TYPE                           MW(1137:1136)
#define NVCBC0_QMDV04_00_CWD_MEMBAR_TYPE_L1_SYSMEMBAR              0x00000001
#define NVCBC0_QMDV04_00_CTA_THREAD_DIMENSION0                     MW(1167:1152)
#define NVCBC0_QMDV04_00_CTA_THREAD_DIMENSION1                     MW(1183:1168)
#define NVCBC0_QMDV04_00_CTA_THREAD_DIMENSION2                     MW(1199:1184)
#define NVCBC0_QMDV04_00_REGISTER_COUNT                            MW(1208:1200)
#define NVCBC0_QMDV04_00_BARRIER_COUNT                             MW(1215:1211)
#define NVCBC0_QMDV04_00_PROGRAM_ADDRESS_LOWER                     MW(1247:1216)
#define NVCBC0_QMDV04_00_PROGRAM_ADDRESS_UPPER                     MW(1272:1248)
#define NVCBC0_QMDV04_00_CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(i)    MW((1567+(i)*64):(1536+(i)*64))
#define NVCBC0_QMDV04_00_CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(i)    MW((1586+(i)*64):(1568+(i)*64))
#define NVCBC0_QMDV04_00_CONSTANT_BUFFER_SIZE_SHIFTED4(i)          MW((1599+(i)*64):(1587+(i)*64))
"""),
    5: ("classes/compute/clcdc0qmd.h", "NVCDC0_QMDV05_00_", """
#define NVCDC0_QMDV05_00_QMD_GROUP_ID                              MW(149:144)
#define NVCDC0_QMDV05_00_QMD_TYPE                                  MW(153:151)
#define NVCDC0_QMDV05_00_QMD_TYPE_GRID_CTA                         0x00000002
#define NVCDC0_QMDV05_00_SASS_VERSION                              MW(455:448)
#define NVCDC0_QMDV05_00_API_VISIBLE_CALL_LIMIT                    MW(456:456)
#define NVCDC0_QMDV05_00_API_VISIBLE_CALL_LIMIT_NO_CHECK           0x00000001
#define NVCDC0_QMDV05_00_SAMPLER_INDEX                             MW(457:457)
#define NVCDC0_QMDV05_00_SAMPLER_INDEX_INDEPENDENTLY               0x00000000
#define NVCDC0_QMDV05_00_QMD_MINOR_VERSION                         MW(467:464)
#define NVCDC0_QMDV05_00_QMD_MAJOR_VERSION                         MW(471:468)
#define NVCDC0_QMDV05_00_INVALIDATE_TEXTURE_HEADER_CACHE           MW(472:472)
#define NVCDC0_QMDV05_00_INVALIDATE_TEXTURE_SAMPLER_CACHE          MW(473:473)
#define NVCDC0_QMDV05_00_INVALIDATE_TEXTURE_DATA_CACHE             MW(474:474)
#define NVCDC0_QMDV05_00_INVALIDATE_SHADER_DATA_CACHE              MW(475:475)
#define NVCDC0_QMDV05_00_INVALIDATE_INSTRUCTION_CACHE              MW(476:476)
#define NVCDC0_QMDV05_00_INVALIDATE_SHADER_CONSTANT_CACHE          MW(477:477)
#define NVCDC0_QMDV05_00_CWD_MEMBAR_TYPE                           MW(625:624)
#define NVCDC0_QMDV05_00_CWD_MEMBAR_TYPE_L1_SYSMEMBAR              0x00000001
#define NVCDC0_QMDV05_00_PROGRAM_ADDRESS_LOWER_SHIFTED4            MW(1055:1024)
#define NVCDC0_QMDV05_00_PROGRAM_ADDRESS_UPPER_SHIFTED4            MW(1076:1056)
#define NVCDC0_QMDV05_00_CTA_THREAD_DIMENSION0                     MW(1103:1088)
#define NVCDC0_QMDV05_00_CTA_THREAD_DIMENSION1                     MW(1119:1104)
#define NVCDC0_QMDV05_00_CTA_THREAD_DIMENSION2                     MW(1127:1120)
#define NVCDC0_QMDV05_00_REGISTER_COUNT                            MW(1136:1128)
#define NVCDC0_QMDV05_00_BARRIER_COUNT                             MW(1141:1137)
#define NVCDC0_QMDV05_00_SHARED_MEMORY_SIZE_SHIFTED7               MW(1162:1152)
#define NVCDC0_QMDV05_00_MIN_SM_CONFIG_SHARED_MEM_SIZE             MW(1168:1163)
#define NVCDC0_QMDV05_00_MAX_SM_CONFIG_SHARED_MEM_SIZE             MW(1174:1169)
#define NVCDC0_QMDV05_00_TARGET_SM_CONFIG_SHARED_MEM_SIZE          MW(1180:1175)
#define NVCDC0_QMDV05_00_SHADER_LOCAL_MEMORY_LOW_SIZE_SHIFTED4     MW(1199:1184)
#define NVCDC0_QMDV05_00_SHADER_LOCAL_MEMORY_HIGH_SIZE_SHIFTED4    MW(1215:1200)
#define NVCDC0_QMDV05_00_GRID_WIDTH                                MW(1279:1248)
#define NVCDC0_QMDV05_00_GRID_HEIGHT                               MW(1295:1280)
#define NVCDC0_QMDV05_00_GRID_DEPTH                                MW(1327:1312)
#define NVCDC0_QMDV05_00_CONSTANT_BUFFER_ADDR_LOWER_SHIFTED6(i)    MW((1375+(i)*64):(1344+(i)*64))
#define NVCDC0_QMDV05_00_CONSTANT_BUFFER_ADDR_UPPER_SHIFTED6(i)    MW((1394+(i)*64):(1376+(i)*64))
#define NVCDC0_QMDV05_00_CONSTANT_BUFFER_SIZE_SHIFTED4(i)          MW((1407+(i)*64):(1395+(i)*64))
#define NVCDC0_QMDV05_00_CONSTANT_BUFFER_VALID(i)                  MW((1856+(i)*4):(1856+(i)*4))
#define NVCDC0_QMDV05_00_CONSTANT_BUFFER_INVALIDATE(i)             MW((1859+(i)*4):(1859+(i)*4))
"""),
}

# QMD sizes: V3's last field is DEBUG_ID_LOWER MW(2047:2016), V4's OUTER_STICKY_OVERFLOW
# MW(3071:3071); V5 is 96 dwords like V4 (Mesa qmd.rs Qmd5_0).
SIZES = {3: 256, 4: 384, 5: 384}

# Legal SM shared-memory carveouts in KiB per architecture (Mesa init_shared_mem_sizes).
CARVEOUTS_KIB = {
    "sm_80": (0, 8, 16, 32, 64, 100, 132, 164),
    "sm_86": (0, 8, 16, 32, 64, 100),
    "sm_89": (0, 8, 16, 32, 64, 100),
    "sm_90": (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    "sm_100": (0, 8, 16, 32, 64, 100, 132, 164, 196, 228),
    "sm_120": (0, 8, 16, 32, 64, 100),
}


# ---- an independent decoder built from the header text -------------------------------------


@dataclass(frozen=True)
class HField:
    """One ``#define PREFIX_NAME MW(...)``: bits of element ``i`` are hi+i*stride .. lo+i*stride."""

    hi: int
    lo: int
    stride: int  # 0 for a field that is not indexed
    shift: int  # n of a ``_SHIFTED<n>`` name: the field holds value >> n

    def bits(self, i: int = 0) -> tuple[int, int]:
        return self.hi + i * self.stride, self.lo + i * self.stride


_DEFINE = re.compile(r"#define\s+(\w+?)(\(i\))?\s+(MW\(.*\)|0x[0-9A-Fa-f]+)\s*$")
_PLAIN = re.compile(r"MW\((\d+):(\d+)\)")
_INDEXED = re.compile(r"MW\(\((\d+)\+\(i\)\*(\d+)\):\((\d+)\+\(i\)\*(\d+)\)\)")


def parse_header(text: str, prefix: str) -> tuple[dict[str, HField], dict[str, int]]:
    """The fields (name without prefix -> HField) and the enum values in ``text``."""
    fields: dict[str, HField] = {}
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = _DEFINE.fullmatch(line.strip())
        if m is None or not m.group(1).startswith(prefix):
            continue
        name, indexed, body = m.group(1)[len(prefix):], m.group(2), m.group(3)
        if body.startswith("0x"):
            values[name] = int(body, 16)
            continue
        shift = int(s.group(1)) if (s := re.search(r"_SHIFTED(\d+)$", name)) else 0
        if indexed:
            im = _INDEXED.fullmatch(body)
            assert im is not None, line
            hi, hs, lo, ls = map(int, im.groups())
            assert hs == ls, line
            fields[name] = HField(hi, lo, hs, shift)
        else:
            pm = _PLAIN.fullmatch(body)
            assert pm is not None, line
            fields[name] = HField(int(pm.group(1)), int(pm.group(2)), 0, shift)
    return fields, values


TABLES = {v: parse_header(text, prefix) for v, (_, prefix, text) in HEADERS.items()}


class Decoder:
    """Reads an encoded QMD through the header's bit ranges and remembers every bit it read."""

    def __init__(self, version: int, data: bytes) -> None:
        self.version = version
        self.fields, self.enums = TABLES[version]
        self.value = int.from_bytes(data, "little")
        self.read_mask = 0

    def name(self, pattern: str) -> str:
        """The one header field whose name matches ``pattern`` (names differ per version)."""
        found = [n for n in self.fields if re.fullmatch(pattern, n)]
        assert len(found) == 1, (self.version, pattern, found)
        return found[0]

    def raw(self, name: str, i: int = 0) -> int:
        hi, lo = self.fields[name].bits(i)
        mask = (1 << (hi - lo + 1)) - 1
        self.read_mask |= mask << lo
        return (self.value >> lo) & mask

    def scaled(self, pattern: str, i: int = 0) -> int:
        name = self.name(pattern)
        return self.raw(name, i) << self.fields[name].shift

    def address(self, stem: str, i: int = 0) -> int:
        """LOWER | UPPER << 32, shifted back (``stem`` e.g. ``PROGRAM_ADDRESS``)."""
        lower = self.name(stem + r"_LOWER(_SHIFTED\d+)?")
        upper = self.name(stem + r"_UPPER(_SHIFTED\d+)?")
        shift = self.fields[lower].shift
        assert self.fields[upper].shift == shift
        return (self.raw(lower, i) | (self.raw(upper, i) << 32)) << shift

    def launch(self) -> dict[str, Any]:
        """Every launch figure the QMD holds, in the units of :class:`rig_nv.qmd.Launch`."""
        cbufs = {}
        for i in range(8):
            cbufs[i] = (
                self.address("CONSTANT_BUFFER_ADDR", i),
                self.scaled(r"CONSTANT_BUFFER_SIZE_SHIFTED4", i),
                self.raw("CONSTANT_BUFFER_VALID", i),
                self.raw("CONSTANT_BUFFER_INVALIDATE", i),
            )
        out: dict[str, Any] = {
            "program": self.address("PROGRAM_ADDRESS"),
            "grid": tuple(self.scaled(rf"(CTA_RASTER|GRID)_{d}") for d in
                          ("WIDTH", "HEIGHT", "DEPTH")),
            "block": tuple(self.scaled(f"CTA_THREAD_DIMENSION{d}") for d in range(3)),
            "registers": self.scaled(r"REGISTER_COUNT(_V)?"),
            "barriers": self.scaled("BARRIER_COUNT"),
            "shared": self.scaled(r"SHARED_MEMORY_SIZE(_SHIFTED\d+)?"),
            "sm_config": tuple(self.scaled(f"{w}_SM_CONFIG_SHARED_MEM_SIZE")
                               for w in ("MIN", "TARGET", "MAX")),
            "local_high": self.scaled(r"SHADER_LOCAL_MEMORY_HIGH_SIZE(_SHIFTED\d+)?"),
            "local_low": self.scaled(r"SHADER_LOCAL_MEMORY_LOW_SIZE(_SHIFTED\d+)?"),
            "cbufs": cbufs,
            "major": self.scaled("QMD_MAJOR_VERSION"),
            "minor": self.scaled(r"QMD_(MINOR_)?VERSION"),
            "call_limit": self.scaled("API_VISIBLE_CALL_LIMIT"),
            "sass": self.scaled("SASS_VERSION"),
        }
        if "QMD_TYPE" in self.fields:
            out["type"] = self.raw("QMD_TYPE")
        return out


# ---- what encode is asked for, and what it should write ---------------------------------------

LAUNCHES = {
    # V3: unshifted 49-bit addresses (ADDR_UPPER 17 bits), any alignment.
    3: qmd.Launch(
        program=0x1_2345_6789_ABC0,
        grid=(0x6543_2107, 0xBEEF, 0x0ACE),
        block=(0x2A7, 0x113, 0x3D),
        registers=0x1A5,
        shared_bytes=0x3001,  # -> 0x3100 bytes -> 16 KiB carveout on sm_86
        local_bytes=0xABCDE0,
        barriers=0x13,
        cbufs=((0, 0x1_0203_0405_0607, 0x1230), (2, 0x0_FEDC_BA98_7654, 0x40),
               (3, 0x1_FFFF_FFFF_FFF0, 0x1FFF0), (5, 0x1000, 0x10),
               (7, 0x1_8000_1234_5678, 0xABC0)),
        sass_version=0x86,
        arch="sm_86",
    ),
    # V4: program unshifted (57-bit), cbuf addresses >> 6 (64-byte aligned).
    4: qmd.Launch(
        program=0x1AB_CDEF_0123_4567,
        grid=(0x1357_9BDF, 0x8421, 0x7E57),
        block=(0x3FF, 0x155, 0x2A),
        registers=0x0DB,
        shared_bytes=0x1_2345,  # -> 0x12400 bytes -> 100 KiB carveout on sm_90
        local_bytes=0x9876A0,
        barriers=0x0F,
        cbufs=((0, 0x1FF_FFFF_FFFF_FFC0, 0x10), (1, 0x0AB_CDEF_0123_4640, 0x4560),
               (4, 0x40, 0x1FFF0), (6, 0x1_0000_0000, 0x8880)),
        sass_version=0x90,
        arch="sm_90",
    ),
    # V5: program >> 4, shared >> 7, local >> 4, cbuf addresses >> 6.
    5: qmd.Launch(
        program=0x1AB_CDEF_0123_4560,
        grid=(0x2468_ACE1, 0x1F2F, 0xFEDC),
        block=(0x155, 0x2AA, 0x3F),
        registers=0x133,
        shared_bytes=0x2_8765,  # -> 0x28800 bytes -> 164 KiB carveout on sm_100
        local_bytes=0xABCD0,
        barriers=0x11,
        cbufs=((0, 0x100_0000_0040, 0x100), (3, 0x1FF_FFFF_FFFF_FFC0, 0x1FFF0),
               (7, 0x0123_4567_89AB_CDC0, 0x1230)),
        sass_version=0xA0,
        arch="sm_100",
    ),
}


def carveout_code(kib: int) -> int:
    """MIN/TARGET/MAX_SM_CONFIG_SHARED_MEM_SIZE encoding (Mesa gv100_smem_size_to_hw)."""
    return kib // 4 + 1


def expected_sm_config(arch: str, nbytes: int) -> tuple[int, int, int]:
    sizes = CARVEOUTS_KIB[arch]
    fits = min(k for k in sizes if k * 1024 >= nbytes)
    return carveout_code(fits), carveout_code(fits), carveout_code(sizes[-1])


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@pytest.mark.parametrize("version", [3, 4, 5])
def test_encode_decodes_back_through_the_header(version: int) -> None:
    launch = LAUNCHES[version]
    data = qmd.encode(version, launch)
    assert len(data) == SIZES[version]
    d = Decoder(version, data)
    got = d.launch()
    enums = d.enums

    assert got["program"] == launch.program
    assert got["grid"] == launch.grid
    assert got["block"] == launch.block
    assert got["registers"] == launch.registers
    assert got["barriers"] == launch.barriers
    shared = round_up(launch.shared_bytes, 0x100)  # Mesa rounds SHARED_MEMORY_SIZE to 0x100
    assert got["shared"] == shared
    assert got["sm_config"] == expected_sm_config(launch.arch, shared)
    assert got["local_high"] == launch.local_bytes
    assert got["local_low"] == 0
    assert got["major"] == version
    assert got["minor"] == 0
    assert got["call_limit"] == enums["API_VISIBLE_CALL_LIMIT_NO_CHECK"]
    assert got["sass"] == launch.sass_version
    if version >= 4:
        assert got["type"] == enums["QMD_TYPE_GRID_CTA"]
    used = {i: (address, size, 1, 1) for i, address, size in launch.cbufs}
    assert got["cbufs"] == {i: used.get(i, (0, 0, 0, 0)) for i in range(8)}


# What encode writes beyond the launch's own figures (tinygrad's choices).
HOUSEKEEPING = {
    "QMD_GROUP_ID": 0x3F,
    "SM_GLOBAL_CACHING_ENABLE": 1,  # V3 only
    "CWD_MEMBAR_TYPE": "CWD_MEMBAR_TYPE_L1_SYSMEMBAR",
    "SAMPLER_INDEX": "SAMPLER_INDEX_INDEPENDENTLY",
    "INVALIDATE_TEXTURE_HEADER_CACHE": 1,
    "INVALIDATE_TEXTURE_SAMPLER_CACHE": 1,
    "INVALIDATE_TEXTURE_DATA_CACHE": 1,
    "INVALIDATE_SHADER_DATA_CACHE": 1,
    "INVALIDATE_INSTRUCTION_CACHE": 0,
    "INVALIDATE_SHADER_CONSTANT_CACHE": 0,
}


@pytest.mark.parametrize("version", [3, 4, 5])
def test_encode_sets_no_other_bits(version: int) -> None:
    d = Decoder(version, qmd.encode(version, LAUNCHES[version]))
    d.launch()
    for name, want in HOUSEKEEPING.items():
        if name not in d.fields:
            assert version >= 4 and name == "SM_GLOBAL_CACHING_ENABLE"
            continue
        assert d.raw(name) == (d.enums[want] if isinstance(want, str) else want), name
    stray = d.value & ~d.read_mask
    assert stray == 0, f"bits set outside every decoded field: {stray:#x}"


@pytest.mark.parametrize("version", [3, 4, 5])
def test_rig_layout_agrees_with_the_header(version: int) -> None:
    """rig_nv.qmd's own names read what the header's names read (a second path to the bits)."""
    data = qmd.encode(version, LAUNCHES[version])
    q = qmd.Qmd(qmd.LAYOUTS[version], data)
    d = Decoder(version, data)
    renamed = {  # rig's name -> the header's, where they differ
        "REGISTER_COUNT": r"REGISTER_COUNT(_V)?",
        "QMD_MINOR_VERSION": r"QMD_(MINOR_)?VERSION",
        "GRID_WIDTH": r"(CTA_RASTER|GRID)_WIDTH",
        "GRID_HEIGHT": r"(CTA_RASTER|GRID)_HEIGHT",
        "GRID_DEPTH": r"(CTA_RASTER|GRID)_DEPTH",
    }
    checked = 0
    for name, bits in q.layout.fields.items():
        pattern = renamed.get(name, name + r"(_SHIFTED\d+)?")
        found = [n for n in d.fields if re.fullmatch(pattern, n)]
        assert len(found) <= 1, found
        if found:  # the copy holds the launch fields (not, e.g., the dependent-QMD ones)
            assert bits == d.fields[found[0]].bits(), name
            checked += 1
    assert checked >= 25
    lay = q.layout
    for i in range(8):
        assert lay.cbuf_addr_lower[i] == d.fields[
            d.name(r"CONSTANT_BUFFER_ADDR_LOWER(_SHIFTED\d+)?")].bits(i)
        assert lay.cbuf_addr_upper[i] == d.fields[
            d.name(r"CONSTANT_BUFFER_ADDR_UPPER(_SHIFTED\d+)?")].bits(i)
        assert lay.cbuf_size[i] == d.fields["CONSTANT_BUFFER_SIZE_SHIFTED4"].bits(i)
        assert lay.cbuf_valid[i] == d.fields["CONSTANT_BUFFER_VALID"].bits(i)
        assert lay.cbuf_invalidate[i] == d.fields["CONSTANT_BUFFER_INVALIDATE"].bits(i)
    assert 1 << lay.cbuf_addr_shift == 1 << d.fields[
        d.name(r"CONSTANT_BUFFER_ADDR_LOWER(_SHIFTED\d+)?")].shift
    assert lay.program_shift == d.fields[d.name(r"PROGRAM_ADDRESS_LOWER(_SHIFTED\d+)?")].shift
    assert lay.shared_shift == d.fields[d.name(r"SHARED_MEMORY_SIZE(_SHIFTED\d+)?")].shift
    assert lay.local_shift == d.fields[
        d.name(r"SHADER_LOCAL_MEMORY_HIGH_SIZE(_SHIFTED\d+)?")].shift


def _mirror() -> Path | None:
    where = os.environ.get("RIG_OPEN_GPU_DOC")
    repo = Path(where) if where else None
    return repo if repo is not None and repo.exists() else None


def _header(version: int) -> str:
    """The whole header of ``version`` at OPEN_GPU_DOC_COMMIT, from the mirror (else skip)."""
    repo = _mirror()
    if repo is None:
        pytest.skip("no open-gpu-doc mirror here (set RIG_OPEN_GPU_DOC)")
    path = HEADERS[version][0]
    try:
        return subprocess.run(
            ["git", "-C", str(repo), "show", f"{OPEN_GPU_DOC_COMMIT}:{path}"],
            capture_output=True, text=True, check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot read {path} at {OPEN_GPU_DOC_COMMIT[:7]}: {e}")


@pytest.mark.parametrize("version", [3, 4, 5])
def test_copied_lines_match_the_header(version: int) -> None:
    header = _header(version)
    _, prefix, text = HEADERS[version]

    def norm(s: str) -> set[str]:
        return {" ".join(line.split()) for line in s.splitlines() if line.strip()}

    assert norm(text) <= norm(header)
    # and parsing the whole header gives the same ranges for every copied name
    fields, values = parse_header(header, prefix)
    mine, my_values = TABLES[version]
    assert {n: fields[n] for n in mine} == mine
    assert {n: values[n] for n in my_values} == my_values


@pytest.mark.parametrize("version", [3, 4, 5])
def test_every_rig_field_matches_the_full_header(version: int) -> None:
    """Every named field of rig_nv.qmd's layout (launch fields, dependent QMDs, prefetch, ...)
    has the bits of the header field of that name (V3's older names and V4's indexed
    dependent-QMD fields mapped), so fields added later are checked too."""
    fields, _ = parse_header(_header(version), HEADERS[version][1])
    older = {"GRID_WIDTH": "CTA_RASTER_WIDTH", "GRID_HEIGHT": "CTA_RASTER_HEIGHT",
             "GRID_DEPTH": "CTA_RASTER_DEPTH", "QMD_MINOR_VERSION": "QMD_VERSION",
             "REGISTER_COUNT": "REGISTER_COUNT_V"}
    for name, bits in qmd.LAYOUTS[version].fields.items():
        found = [n for n in fields if re.fullmatch(re.escape(name) + r"(_SHIFTED\d+)?", n)]
        if not found and name in older:
            found = [older[name]]
        if not found and (m := re.fullmatch(r"DEPENDENT_QMD(\d)_(\w+)", name)):
            indexed = f"DEPENDENT_QMD_{m.group(2)}"
            assert fields[indexed].stride, indexed
            assert bits == fields[indexed].bits(int(m.group(1))), name
            continue
        assert len(found) == 1, (name, found)
        assert bits == fields[found[0]].bits(), name


def test_the_v4_releases_lie_where_the_full_header_puts_them() -> None:
    """rig_nv.qmd.V4's release (the timeline's value, issue 17) and its second release (a
    profile's end stamp): control bits, addresses and payloads where clcbc0qmd.h puts
    RELEASE_*(0), RELEASE_*(1) and RELEASE_SEMAPHORE0/1, with the sizes it names."""
    fields, values = parse_header(_header(4), HEADERS[4][1])
    r = qmd.LAYOUTS[4].release
    assert r is not None
    for i, at, control in ((0, r.control_at, r.control),
                           (1, r.control_at + 2, r.stamp_control)):
        base = fields["RELEASE_ENABLE"].bits(i)[1]
        assert base == 8 * at
        assert control & 1 == values["RELEASE_ENABLE_TRUE"]
        size_hi, size_lo = fields["RELEASE_STRUCTURE_SIZE"].bits(i)
        size = control >> (size_lo - base) & ((1 << (size_hi - size_lo + 1)) - 1)
        want = "TWO_WORDS" if i == 0 else "FOUR_WORDS"
        assert size == values[f"RELEASE_STRUCTURE_SIZE_SEMAPHORE_{want}"]
        assert control >> (fields["RELEASE_PAYLOAD64B"].bits(i)[1] - base) & 1 == 1
    assert fields["RELEASE_SEMAPHORE0_ADDR_LOWER"].bits()[1] == 8 * r.address_at
    assert fields["RELEASE_SEMAPHORE0_PAYLOAD_LOWER"].bits()[1] == 8 * r.payload_at
    assert fields["RELEASE_SEMAPHORE1_ADDR_LOWER"].bits()[1] == 8 * r.stamp_at


# ---- Qmd.set, set_cbuf, set_program: refusals -----------------------------------------------


@pytest.mark.parametrize("version", [3, 4, 5])
def test_set_refuses_values_that_do_not_fit(version: int) -> None:
    q = qmd.Qmd(qmd.LAYOUTS[version])
    q.set("GRID_HEIGHT", 0xFFFF)
    q.set("REGISTER_COUNT", 0x1FF)
    before = q.data
    for name, value in (("GRID_HEIGHT", 0x10000), ("GRID_HEIGHT", -1), ("REGISTER_COUNT", 0x200),
                        ("QMD_MAJOR_VERSION", 16), ("GRID_WIDTH", 1 << 32)):
        with pytest.raises(ValueError, match=name):
            q.set(name, value)
    assert q.data == before  # a refused value changes nothing
    assert q.get("GRID_HEIGHT") == 0xFFFF
    assert q.get("REGISTER_COUNT") == 0x1FF


@pytest.mark.parametrize("version", [3, 4, 5])
def test_unknown_fields_raise_key_error(version: int) -> None:
    q = qmd.Qmd(qmd.LAYOUTS[version])
    with pytest.raises(KeyError):
        q.set("NO_SUCH_FIELD", 0)
    with pytest.raises(KeyError):
        q.get("NO_SUCH_FIELD")
    if version >= 4:
        with pytest.raises(KeyError):
            q.set("SM_GLOBAL_CACHING_ENABLE", 1)  # a V3 field, gone from V4/V5
    else:
        with pytest.raises(KeyError):
            q.set("QMD_TYPE", 2)  # V3 has no QMD_TYPE


def test_unaligned_cbuf_address_refused_where_shifted() -> None:
    for version in (4, 5):
        q = qmd.Qmd(qmd.LAYOUTS[version])
        for address in (0x1000_0020, 0x1000_0001, 0x3F):
            with pytest.raises(ValueError, match="aligned"):
                q.set_cbuf(1, address, 0x100)
        assert q.value == 0
        q.set_cbuf(1, 0x1000_0040, 0x100)
        assert q.cbuf(1) == (0x1000_0040, 0x100, True)
    q = qmd.Qmd(qmd.LAYOUTS[3])  # V3 keeps the address unshifted: any byte address
    q.set_cbuf(1, 0x1000_0021, 0x100)
    assert q.cbuf(1) == (0x1000_0021, 0x100, True)


@pytest.mark.parametrize("version", [3, 4, 5])
def test_cbuf_sizes_and_widths_refused(version: int) -> None:
    q = qmd.Qmd(qmd.LAYOUTS[version])
    for size in (0, 8, 0x18, -16, 0x20000):  # not a positive multiple of 16, or over 13 bits
        with pytest.raises(ValueError):
            q.set_cbuf(0, 0x1000, size)
    too_wide = 1 << (49 if version == 3 else 57)  # ADDR_UPPER: 17 bits, or 19 bits of addr>>6
    with pytest.raises(ValueError):
        q.set_cbuf(0, too_wide, 0x10)


def test_unaligned_program_address_refused_on_v5_only() -> None:
    q = qmd.Qmd(qmd.LAYOUTS[5])
    for address in (0x1008, 0x1001, 0x7FFF_0000_000C):
        with pytest.raises(ValueError, match="aligned"):
            q.set_program(address)
    assert q.value == 0
    q.set_program(0x7FFF_0000_0010)
    assert q.program() == 0x7FFF_0000_0010
    for version in (3, 4):  # unshifted: any byte address
        q = qmd.Qmd(qmd.LAYOUTS[version])
        q.set_program(0x1_0000_1001)
        assert q.program() == 0x1_0000_1001
        d = Decoder(version, q.data)
        assert d.address("PROGRAM_ADDRESS") == 0x1_0000_1001


@pytest.mark.parametrize(("version", "bits"), [(3, 49), (4, 57), (5, 57)])
def test_program_address_width(version: int, bits: int) -> None:
    q = qmd.Qmd(qmd.LAYOUTS[version])
    top = (1 << bits) - 16
    q.set_program(top)
    assert Decoder(version, q.data).address("PROGRAM_ADDRESS") == top
    with pytest.raises(ValueError):
        q.set_program(1 << bits)


# ---- patch_cbuf0 -------------------------------------------------------------------------------

NEW_CBUF0 = {3: 0x0_7777_8888_9999, 4: 0x40, 5: 0x1FF_0000_1234_5640}


@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("as_view", [False, True])
def test_patch_cbuf0_changes_only_cbuf0_address(version: int, as_view: bool) -> None:
    layout = qmd.LAYOUTS[version]
    old = qmd.encode(version, LAUNCHES[version])
    new_address = NEW_CBUF0[version]
    if as_view:  # as the device does it: a slice of a larger ring
        ring = bytearray(b"\xa5" * 64 + old + b"\x5a" * 64)
        qmd.patch_cbuf0(layout, memoryview(ring)[64 : 64 + len(old)], new_address)
        assert ring[:64] == b"\xa5" * 64
        assert ring[-64:] == b"\x5a" * 64
        new = bytes(ring[64:-64])
    else:
        buf = bytearray(old)
        qmd.patch_cbuf0(layout, buf, new_address)
        new = bytes(buf)
    assert len(new) == len(old)

    before, after = Decoder(version, old), Decoder(version, new)
    assert after.address("CONSTANT_BUFFER_ADDR", 0) == new_address
    assert before.address("CONSTANT_BUFFER_ADDR", 0) != new_address
    address_bits = after.read_mask  # just the two cbuf0 address fields
    assert (before.value ^ after.value) & ~address_bits == 0
    # the rest of cbuf0 (size, valid, invalidate) and every other field decode as before
    b, a = before.launch(), after.launch()
    assert a["cbufs"][0][1:] == b["cbufs"][0][1:]
    a["cbufs"] = {i: c for i, c in a["cbufs"].items() if i}
    b["cbufs"] = {i: c for i, c in b["cbufs"].items() if i}
    assert a == b


# ---- carveouts and limits per architecture ------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(CARVEOUTS_KIB))
def test_smem_config(arch: str) -> None:
    sizes = CARVEOUTS_KIB[arch]
    top = carveout_code(sizes[-1])
    assert qmd.smem_config(arch, 0) == (1, top)
    for smaller, k in itertools.pairwise(sizes):
        assert qmd.smem_config(arch, k * 1024) == (carveout_code(k), top)
        assert qmd.smem_config(arch, smaller * 1024 + 1) == (carveout_code(k), top)
    with pytest.raises(ValueError, match=arch):
        qmd.smem_config(arch, sizes[-1] * 1024 + 1)


@pytest.mark.parametrize(("arch", "kib"), [
    ("sm_80", 163), ("sm_86", 99), ("sm_89", 99), ("sm_90", 227), ("sm_100", 227),
    ("sm_120", 99),
])
def test_max_shared(arch: str, kib: int) -> None:
    # CUDA's sharedMemPerBlockOptin: the largest carveout less the 1 KiB reserved per block
    assert qmd.max_shared(arch) == kib * 1024


@pytest.mark.parametrize(("compute", "version"), [
    (0xC6C0, 3), (0xC7C0, 3), (0xC9C0, 3), (0xCBC0, 4), (0xCDC0, 5), (0xCEC0, 5),
])
def test_qmd_version_from_compute_class(compute: int, version: int) -> None:
    c = Classes(usermode=0xC661, gpfifo=0xC86F, compute=compute, copy=0xC8B5)
    assert c.qmd_version == version
    assert qmd.LAYOUTS[c.qmd_version].size == SIZES[version]


@pytest.mark.parametrize("version", [3, 4, 5])
def test_encode_round_trips_through_qmd(version: int) -> None:
    """The encoded QMD read back through rig_nv.qmd itself (decoder and encoder agree)."""
    launch = LAUNCHES[version]
    q = qmd.Qmd(qmd.LAYOUTS[version], qmd.encode(version, launch))
    assert q.program() == launch.program
    for i, address, size in launch.cbufs:
        assert q.cbuf(i) == (address, size, True)
    assert q.get("GRID_WIDTH") == launch.grid[0]
    assert q.get("SASS_VERSION") == launch.sass_version
