"""A tensor map as a kernel argument (issue 19), without a GPU: the 128 bytes go into bank 0
by value at the cubin's 64-byte aligned offset, and the bank holds the address a kernel takes
a parameter's address from (a TMA load reads its map there: ``c[0x0][0x198]`` on sm_90, read
off ptxas 13.0's code for cubins/../../rig-nv-nvidia/tests/cubins/tma.cu)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from test_launch import ARCHES, PARAM_BASE, image, region, with_params

import rig_nv
from rig_nv import launch as L  # noqa: N812
from rig_nv.cubin import parse

TMA = (Path(__file__).resolve().parents[2] / "rig-nv-nvidia" / "tests" / "cubins"
       / "tma.sm_90a.cubin")
BANK_GPU = 0x0000_7F12_3456_7800  # 256-byte aligned, as the launch arena and slots are
ADDRESS = {"sm_80": 0x40, "sm_86": 0x40, "sm_89": 0x40, "sm_90": 0x198, "sm_100": 0x348,
           "sm_120": 0x348}


@pytest.mark.parametrize("arch", ARCHES)
def test_bank_holds_the_address_kernels_take_parameters_from(arch: str) -> None:
    """sm_80 adds the parameter base to c[0x0][0x40] (the bank's address); sm_90 on read
    c[0x0][0x198] / c[0x0][0x348] as the parameters' own address."""
    dev, img = image(arch)
    prep = L.prepare(dev, img["vadd"], (1,), (32,), 0)  # type: ignore[arg-type]
    blob = bytearray(prep.blob)
    L.point_cbuf0(prep, memoryview(blob), 0, BANK_GPU - 512)
    want = BANK_GPU + (PARAM_BASE[arch] if arch in ("sm_90", "sm_100", "sm_120") else 0)
    assert struct.unpack_from("<Q", blob, 512 + ADDRESS[arch])[0] == want
    assert blob[512 + PARAM_BASE[arch]:] == prep.bank[PARAM_BASE[arch]:]  # parameters untouched


def test_tma_kernel_takes_its_map_by_value_64_byte_aligned() -> None:
    """The TMA fixture's map parameter: 128 bytes at a bank offset that is 64-byte aligned."""
    k = parse(TMA.read_bytes()).kernels["tma_tile"]
    assert k.params[0] == (112, 128)
    assert (k.param_offset + k.params[0].offset) % 64 == 0


def test_tensor_map_packs_as_a_128_byte_argument() -> None:
    """A TensorMap is passed by value: its bytes, at its parameter's offset."""
    _, img = image("sm_90")
    k = with_params(img["vadd"].kernel, 8, 128, 8)
    tm = rig_nv.tensor_map(0x7F00_0000_0000, "float32", [64, 64], [256], [32, 16])
    packed = L.pack_args(k, [region(0x1000), tm, region(0x2000)])
    assert packed[1] == (k.params[1].offset, bytes(tm))
    assert len(tm) == 128 and isinstance(tm, bytes)
