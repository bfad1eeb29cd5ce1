"""Class choice (rig_nv.classes), RM status names (rig_nv.status), channel errors (rig_nv.faults).

The class sets are the engine class lists NVIDIA's RM gives each chip
(open-gpu-kernel-modules src/nvidia/generated/g_gpu_class_list.c @580.142,
gpuGetEngClassDescriptorList_GH100 / _GA102 / _AD102 / _TU102), with a few non-engine classes.
"""

from __future__ import annotations

import pytest

from rig_edge import RigError
from rig_nv import classes
from rig_nv.classes import Classes, arch_of, choose
from rig_nv.faults import XID, xid_name
from rig_nv.status import STATUS, status_name

COMMON = {0x0080, 0x2080, 0x0041, 0x90F1, 0xA06C, 0x9067, 0x003E, 0x0040, 0x0071}
VOLTA_TURING_HOST = {0xC361, 0xC36F, 0xC461, 0xC46F}  # VOLTA/TURING_USERMODE_A, _CHANNEL_GPFIFO_A

GH100 = COMMON | VOLTA_TURING_HOST | {
    0xC561,  # AMPERE_USERMODE_A
    0xC661,  # HOPPER_USERMODE_A
    0xC56F,  # AMPERE_CHANNEL_GPFIFO_A (GH100 lists it too)
    0xC86F,  # HOPPER_CHANNEL_GPFIFO_A
    0xCB97,  # HOPPER_A
    0xCBC0,  # HOPPER_COMPUTE_A
    0xC8B5,  # HOPPER_DMA_COPY_A
    0xA140,  # KEPLER_INLINE_TO_MEMORY_B
}
GA102 = COMMON | VOLTA_TURING_HOST | {
    0xC561,  # AMPERE_USERMODE_A
    0xC56F,  # AMPERE_CHANNEL_GPFIFO_A
    0xC797,  # AMPERE_B
    0xC7C0,  # AMPERE_COMPUTE_B
    0xC7B5,  # AMPERE_DMA_COPY_B
}
AD102 = COMMON | VOLTA_TURING_HOST | {
    0xC561, 0xC56F,  # AMPERE_USERMODE_A, AMPERE_CHANNEL_GPFIFO_A
    0xC997,  # ADA_A
    0xC9C0,  # ADA_COMPUTE_A
    0xC7B5,  # AMPERE_DMA_COPY_B
}
TU102 = COMMON | VOLTA_TURING_HOST | {
    0xC597,  # TURING_A
    0xC5C0,  # TURING_COMPUTE_A
    0xC5B5,  # TURING_DMA_COPY_A
}


def test_hopper_classes_from_a_gh100_list() -> None:
    c = choose(GH100, "NV")
    assert c == Classes(usermode=0xC661, gpfifo=0xC86F, compute=0xCBC0, copy=0xC8B5)
    assert c.qmd_version == 4


def test_ampere_classes_from_a_ga102_list() -> None:
    c = choose(GA102, "NV")
    assert c == Classes(usermode=0xC561, gpfifo=0xC56F, compute=0xC7C0, copy=0xC7B5)
    assert c.qmd_version == 3


def test_ada_classes_from_an_ad102_list() -> None:
    c = choose(AD102, "NV")
    assert c == Classes(usermode=0xC561, gpfifo=0xC56F, compute=0xC9C0, copy=0xC7B5)
    assert c.qmd_version == 3


def test_blackwell_classes_are_newest_first() -> None:
    c = choose(GH100 | {0xC761, 0xC96F, 0xCA6F, 0xCDC0, 0xCEC0, 0xC9B5, 0xCAB5}, "NV")
    assert c == Classes(usermode=0xC761, gpfifo=0xCA6F, compute=0xCEC0, copy=0xCAB5)
    assert c.qmd_version == 5


def test_a_turing_gpu_is_refused_naming_what_it_lacks() -> None:
    with pytest.raises(RigError) as e:
        choose(TU102, "NV:1 (0000:41:00.0)")
    msg = str(e.value)
    assert msg.startswith("NV:1 (0000:41:00.0): ")
    assert "GPFIFO" in msg  # Turing has a usermode class rig knows, but no GPFIFO class
    assert "Ampere" in msg
    assert "0xc56f" in msg


@pytest.mark.parametrize(("drop", "what"), [
    (set(classes.USERMODE), "usermode"), (set(classes.GPFIFO), "GPFIFO"),
    (set(classes.COMPUTE), "compute"), (set(classes.COPY), "copy"),
])
def test_each_missing_kind_is_named(drop: set[int], what: str) -> None:
    with pytest.raises(RigError, match=f"no {what} class"):
        choose(GH100 - drop, "NV")


def test_no_classes_at_all() -> None:
    with pytest.raises(RigError, match="usermode"):
        choose(set(), "NV")


@pytest.mark.parametrize(("compute", "version"), [
    (0xC6C0, 3), (0xC7C0, 3), (0xC9C0, 3), (0xCBC0, 4), (0xCDC0, 5), (0xCEC0, 5),
])
def test_qmd_version(compute: int, version: int) -> None:
    assert Classes(0xC661, 0xC86F, compute, 0xC8B5).qmd_version == version


@pytest.mark.parametrize(("sm", "arch"), [
    (0x800, "sm_80"), (0x806, "sm_86"), (0x809, "sm_89"), (0x900, "sm_90"),
    (0xA00, "sm_100"), (0xA03, "sm_103"), (0xC00, "sm_120"),
])
def test_arch_of(sm: int, arch: str) -> None:
    """NV2080_CTRL_GR_INFO_SM_VERSION_* (ctrl2080gr.h @580.142): major 15:8, minor 7:0."""
    assert arch_of(sm) == arch


# -- status codes ----------------------------------------------------------------------------


def test_status_name() -> None:
    text = status_name(0x51)
    assert "NV_ERR_NO_MEMORY" in text
    assert "(0x51)" in text
    assert text == "NV_ERR_NO_MEMORY (0x51): Out of memory"


def test_status_names_of_codes_rig_meets() -> None:
    assert status_name(0x1F).startswith("NV_ERR_INVALID_ARGUMENT (0x1f)")
    assert status_name(0x5D).startswith("NV_ERR_PAGE_TABLE_NOT_AVAIL (0x5d)")
    assert status_name(0x10006).startswith("NV_WARN_NOTHING_TO_DO (0x10006)")
    assert status_name(0xFFFF).startswith("NV_ERR_GENERIC (0xffff)")


def test_an_unknown_status_still_names_its_number() -> None:
    assert "(0x12345)" in status_name(0x12345)


def test_status_table() -> None:
    """nvstatuscodes.h @580.142: NV_OK, 0x1-0x8B, NV_ERR_GENERIC and the warnings."""
    assert STATUS[0] == ("NV_OK", "Success")
    assert len(STATUS) >= 140
    assert all(code in STATUS for code in range(0x8C))
    names = [name for name, _ in STATUS.values()]
    assert len(set(names)) == len(names)
    assert all(n == "NV_OK" or n.startswith(("NV_ERR_", "NV_WARN_")) for n in names)
    assert all(n.startswith("NV_WARN_") for c, (n, _) in STATUS.items() if c > 0x10000)


# -- channel errors --------------------------------------------------------------------------


def test_xid_name() -> None:
    assert xid_name(13) == "ROBUST_CHANNEL_GR_EXCEPTION (Xid 13)"
    assert xid_name(31) == "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT (Xid 31)"
    assert xid_name(45) == "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL (Xid 45)"


def test_xid_of_an_unlisted_number_keeps_the_number() -> None:
    assert xid_name(12345) == "ROBUST_CHANNEL_ERROR (Xid 12345)"


def test_xid_numbers() -> None:
    """nverror.h @580.142 (notes: channels.md section 8)."""
    assert XID[32] == "ROBUST_CHANNEL_PBDMA_ERROR"
    assert XID[43] == "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR"
    assert XID[48] == "ROBUST_CHANNEL_GPU_ECC_DBE"
    assert XID[79] == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    assert XID[94] == "ROBUST_CHANNEL_CONTAINED_ERROR"
    assert XID[95] == "ROBUST_CHANNEL_UNCONTAINED_ERROR"
    assert XID[119] == "GSP_RPC_TIMEOUT"
    assert all(n >= 13 for n in XID)  # nothing is defined below 13


def test_xid_names_are_nvidias_own() -> None:
    """rig_edge.Fault.channel_error is "NVIDIA's name of the channel error"."""
    assert xid_name(62) == "PMU_HALT_ERROR (Xid 62)"
    assert xid_name(119) == "GSP_RPC_TIMEOUT (Xid 119)"
    assert xid_name(120) == "GSP_ERROR (Xid 120)"
