"""Which copy engine a device's copy channel runs on (rig_nv.engines), and the channel group
rig_nv.setup makes for it, on the stand-in path (fake_gpu.py).

The expected picks are worked by hand from UVM's pick_ces / compare_ce_for_channel_type
(kernel-open/nvidia-uvm/uvm_channel.c, 580.142): for each channel type in the order
CPU_TO_GPU, GPU_TO_CPU, GPU_INTERNAL, GPU_TO_GPU, MEMOPS, the usable CEs (no GRCE) in index
order, a CE replacing the best so far when it compares better.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fake_gpu import H200_COPY_ENGINES, FakePath, open_on

from rig_edge import RigError
from rig_nv import device as device_module
from rig_nv import engines, push, setup
from rig_nv.engines import (
    CE_GRCE,
    CE_NVLINK_P2P,
    CE_P2P,
    CE_SHARED,
    CE_SYSMEM,
    CE_SYSMEM_READ,
    CE_SYSMEM_WRITE,
    CPU_TO_GPU,
    GPU_INTERNAL,
    GPU_TO_CPU,
    GPU_TO_GPU,
    MEMOPS,
    CopyEngine,
)
from rig_nv.rm import RMError
from rig_nv.status import NV_ERR_NO_MEMORY

KEPLER_CHANNEL_GROUP_A, HOPPER_CHANNEL_GPFIFO_A, HOPPER_DMA_COPY_A = 0xA06C, 0xC86F, 0xC8B5
NVA06C_CTRL_CMD_GPFIFO_SCHEDULE = 0xA06C0101
COPY = {i: 0x09 + i for i in range(10)}  # NV2080_ENGINE_TYPE_COPY0.. (cl2080_notification.h)


def ce(index: int, *caps: tuple[int, int], pces: int = 0) -> CopyEngine:
    """A copy engine with ``caps`` and ``pces`` PCEs; SYSMEM and P2P unless a GRCE."""
    table = bytearray(2)
    for byte, mask in (caps if CE_GRCE in caps else (CE_SYSMEM, CE_P2P, *caps)):
        table[byte] |= mask
    return CopyEngine(index, bytes(table), (1 << pces) - 1)


def grces() -> list[CopyEngine]:
    return [ce(0, CE_GRCE, CE_SHARED, pces=2), ce(1, CE_GRCE, CE_SHARED, pces=2)]


# -- the choice, given caps tables ----------------------------------------------------------------

def test_h200_on_x86_without_peers() -> None:
    """kernel_ce_gh100.c's default map: LCE 2 and 3 share the GRCEs' FBHUB PCEs, LCE 4 has 12.
    No CE reads or writes sysmem faster (SYSMEM_READ/WRITE are NVLink caps), so host copies
    fall to "less used", then "not shared": CPU_TO_GPU takes LCE 4, GPU_TO_CPU then LCE 2 (4 is
    used once); GPU_INTERNAL and GPU_TO_GPU take the most PCEs (4); MEMOPS the least used (3).
    The copy channel gets LCE 4."""
    ces = [*grces(), ce(2, CE_SHARED, pces=2), ce(3, CE_SHARED, pces=2), ce(4, pces=12)]
    assert engines.pick(ces) == {CPU_TO_GPU: 4, GPU_TO_CPU: 2, GPU_INTERNAL: 4, GPU_TO_GPU: 4,
                                 MEMOPS: 3}
    chosen = engines.choose(ces)
    assert chosen is not None and chosen.index == 4 and chosen.pces == 12
    assert chosen.engine_type == COPY[4] and str(chosen) == "LCE 4"


def test_the_fake_h200_table_is_that_one() -> None:
    ces = [CopyEngine(i, caps, mask) for i, (caps, mask) in H200_COPY_ENGINES.items()]
    assert [c.index for c in ces if c.usable] == [2, 3, 4]
    assert engines.choose(ces) == ces[4]


def test_nvswitch_peer_lce() -> None:
    """An NVSwitch-connected Hopper: one LCE for all peers (kceMapPceLceForNvlinkPeers_GH100),
    NVLINK_P2P, with the most PCEs. Host copies keep off it ("Prefer not to take up the CEs for
    nvlink P2P": LCE 2, then 3), GPU_INTERNAL and GPU_TO_GPU take it for its PCEs, and so does
    the copy channel (kceGetP2PCes_GH100 names it for peers too)."""
    ces = [*grces(), ce(2, CE_SHARED, pces=2), ce(3, CE_SHARED, pces=2),
           ce(4, CE_NVLINK_P2P, pces=8)]
    assert engines.pick(ces) == {CPU_TO_GPU: 2, GPU_TO_CPU: 3, GPU_INTERNAL: 4, GPU_TO_GPU: 4,
                                 MEMOPS: 2}
    assert engines.choose(ces) == ces[4]


def test_grace_sysmem_lces_take_host_copies_in_uvm_not_in_rig() -> None:
    """NVLink-C2C sysmem (a Grace host): LCE 2 reads and LCE 3 writes sysmem faster; UVM sends
    host copies there, rig's one copy channel still takes the most PCEs."""
    ces = [*grces(), ce(2, CE_SYSMEM_READ, pces=2), ce(3, CE_SYSMEM_WRITE, pces=2),
           ce(4, pces=12)]
    picked = engines.pick(ces)
    assert (picked[CPU_TO_GPU], picked[GPU_TO_CPU], picked[GPU_TO_GPU]) == (2, 3, 4)
    assert engines.choose(ces) == ces[4]


def test_gpu_internal_leaves_the_nvlink_lce_to_gpu_to_gpu_on_a_tie() -> None:
    ces = [ce(4, CE_NVLINK_P2P, pces=4), ce(5, pces=4)]
    picked = engines.pick(ces)
    assert picked[GPU_INTERNAL] == 5  # same PCEs: not the P2P one
    # CPU_TO_GPU took 5, GPU_TO_CPU then 5 too (the P2P rule comes before usage)
    assert (picked[CPU_TO_GPU], picked[GPU_TO_CPU]) == (5, 5)
    assert picked[GPU_TO_GPU] == 4  # 5 used three times


def test_on_equal_pces_a_ce_sharing_none_then_the_lowest_index() -> None:
    ces = [ce(2, CE_SHARED, pces=4), ce(3, pces=4), ce(5, pces=4)]
    assert engines.choose(ces) == ces[1]


def test_the_choice_has_no_usage_term() -> None:
    """UVM spreads its five channel types over equal CEs (its GPU_TO_GPU pick lands on LCE 6,
    LCE 5 being used twice); rig's one channel takes the first of them."""
    ces = [ce(5, pces=4), ce(6, pces=4)]
    assert engines.pick(ces)[GPU_TO_GPU] == 6
    assert engines.choose(ces) == ces[0]


def test_the_most_pces_wins_over_sharing_and_index() -> None:
    ces = [ce(2, pces=3), ce(7, CE_SHARED, pces=5)]
    assert engines.choose(ces) == ces[1]


@pytest.mark.parametrize("missing", [CE_SYSMEM, CE_P2P])
def test_a_ce_without_sysmem_or_p2p_is_not_usable(missing: tuple[int, int]) -> None:
    table = bytearray(2)
    for byte, mask in (CE_SYSMEM, CE_P2P):
        if (byte, mask) != missing:
            table[byte] |= mask
    lacking = CopyEngine(4, bytes(table), 0xFFF)
    assert not lacking.usable
    assert engines.choose([lacking, ce(5, pces=1)]) == ce(5, pces=1)


def test_no_usable_ce_no_choice() -> None:
    assert engines.choose(grces()) is None and engines.pick(grces()) == {}
    assert engines.choose([]) is None and engines.choose(None) is None


def test_compare_knows_uvms_types_only() -> None:
    with pytest.raises(ValueError, match="WLC"):
        engines.compare("WLC", ce(2), ce(3), {})


def test_engine_types() -> None:
    """NV2080_ENGINE_TYPE_COPY(i), _COPY_IDX (cl2080_notification.h)."""
    assert [engines.copy_engine_type(i) for i in (0, 9, 10, 19)] == [0x09, 0x12, 0x34, 0x3D]
    assert [engines.copy_index(t) for t in (0x09, 0x12, 0x34, 0x3D)] == [0, 9, 10, 19]
    assert [engines.copy_index(t) for t in (0x01, 0x13, 0x33, 0x3E)] == [None] * 4


# -- asking the RM ---------------------------------------------------------------------------------

def test_query_asks_as_uvm_does() -> None:
    """GET_ENGINES_V2 once, CE_GET_CAPS_V2 for each listed copy engine, the PCE mask of the
    usable ones (the GRCEs are never picked)."""
    path = FakePath()
    ces = engines.query(path)  # type: ignore[arg-type]
    assert ces is not None
    assert [(c.index, c.caps, c.pce_mask) for c in ces] == [
        (i, caps, mask if i >= 2 else 0) for i, (caps, mask) in H200_COPY_ENGINES.items()]
    assert path.rm.controls == [0x20800170] + [0x20802A03] * 2 + [0x20802A03, 0x20802A02] * 3


def test_query_leaves_out_a_stubbed_ce_and_answers_none_where_refused() -> None:
    path = FakePath()
    del path.rm.copy_engines[3]  # listed, its caps refused NOT_SUPPORTED
    ces = engines.query(path)  # type: ignore[arg-type]
    assert ces is not None and [c.index for c in ces] == [0, 1, 2, 4]
    path.rm.engines = None  # GET_ENGINES_V2 refused NOT_SUPPORTED
    assert engines.query(path) is None  # type: ignore[arg-type]


def test_query_lets_other_refusals_out() -> None:
    path = FakePath()
    answer = path.rm.control

    def control(obj: int, cmd: int, params: Any) -> None:
        if cmd == 0x20802A02:
            raise RMError("PCE mask", NV_ERR_NO_MEMORY)
        answer(obj, cmd, params)

    path.rm.control = control  # type: ignore[method-assign]
    with pytest.raises(RMError, match="PCE mask"):
        engines.query(path)  # type: ignore[arg-type]


# -- the device's channel groups ------------------------------------------------------------------

class Recording(FakePath):
    """FakePath that records the RM controls with their objects, frees, and UVM detaches."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[int, int]] = []
        self.freed: list[int] = []
        self.detached: list[int] = []
        rm, control, free = self.rm, self.rm.control, self.rm.free

        def record(obj: int, cmd: int, params: Any) -> None:
            self.sent.append((obj, cmd))
            control(obj, cmd, params)

        def release(obj: int) -> None:
            self.freed.append(obj)
            free(obj)

        rm.control = record  # type: ignore[method-assign]
        rm.free = release  # type: ignore[method-assign]

    def detach_channel(self, h_channel: int) -> None:
        self.detached.append(h_channel)


@contextmanager
def made(path: Recording | None = None) -> Iterator[tuple[Any, Recording]]:
    path = path or Recording()
    try:
        yield open_on(path), path
    finally:
        path.device.stop()  # a failed build's too: open_on gave the path its device first


def allocs(path: FakePath, cls: int) -> list[tuple[int, int, bytes]]:
    return [(parent, handle, params) for parent, handle, c, params in path.rm.allocs
            if c == cls]


def test_the_copy_channel_has_a_group_of_its_own_on_the_chosen_lce() -> None:
    """As UVM makes a copy channel (nv_gpu_ops.c): the group on the device with the address
    space and COPY4 (NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS hVASpace @8, engineType @12), no
    context share (hContextShare @24 0: legacy mode), the channel's engineType @128 COPY4, the
    copy object's NVB0B5_ALLOCATION_PARAMETERS {version 1, COPY4}; then the group scheduled.
    The compute channel's group is as it was: GRAPHICS, its context share, the GRCE object."""
    with made() as (d, path):
        assert d.copy_engine == 4 and "copies on LCE 4" in repr(d)
        (gr_parent, gr, gr_params), (ce_parent, ce_group, ce_params) = allocs(
            path, KEPLER_CHANNEL_GROUP_A)
        assert (gr, ce_group) == (d.objects.tsg, d.objects.copy_tsg)
        assert gr_parent == ce_parent == path.h_device
        assert struct.unpack_from("<II", gr_params, 8) == (0, 1)
        assert struct.unpack_from("<II", ce_params, 8) == (path.h_vaspace, COPY[4])
        compute, copy = allocs(path, HOPPER_CHANNEL_GPFIFO_A)
        assert (compute[0], compute[1]) == (d.objects.tsg, d.compute.handle)
        assert (copy[0], copy[1]) == (d.objects.copy_tsg, d.copy_channel.handle)
        assert struct.unpack_from("<I", compute[2], 24)[0] != 0  # its context share
        assert struct.unpack_from("<I", compute[2], 128)[0] == 0
        assert struct.unpack_from("<I", copy[2], 24)[0] == 0
        assert struct.unpack_from("<I", copy[2], 128)[0] == COPY[4]
        objects = {parent: params for parent, _, params in allocs(path, HOPPER_DMA_COPY_A)}
        assert objects == {d.compute.handle: b"", d.copy_channel.handle: struct.pack(
            "<II", 1, COPY[4])}
        schedules = [obj for obj, cmd in path.sent if cmd == NVA06C_CTRL_CMD_GPFIFO_SCHEDULE]
        assert schedules == [d.objects.tsg, d.objects.copy_tsg]
        assert path.rm.objects[d.objects.copy_tsg] == KEPLER_CHANNEL_GROUP_A


@pytest.mark.parametrize("how", ["refused", "grces only", "grce asked"])
def test_without_an_async_ce_the_copy_channel_joins_the_graphics_group(
        how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = Recording()
    if how == "refused":
        path.rm.engines = None
    elif how == "grces only":
        path.rm.copy_engines = {i: H200_COPY_ENGINES[i] for i in (0, 1)}
    else:
        monkeypatch.setattr(setup, "COPY_ENGINE", "grce")
    with made(path) as (d, _):
        assert d.copy_engine is None and d.objects.copy_tsg is None and "copies on GRCE" in repr(d)
        assert [h for _, h, _ in allocs(path, KEPLER_CHANNEL_GROUP_A)] == [d.objects.tsg]
        channels = allocs(path, HOPPER_CHANNEL_GPFIFO_A)
        assert [parent for parent, _, _ in channels] == [d.objects.tsg, d.objects.tsg]
        assert all(params == b"" for _, _, params in allocs(path, HOPPER_DMA_COPY_A))
        schedules = [obj for obj, cmd in path.sent if cmd == NVA06C_CTRL_CMD_GPFIFO_SCHEDULE]
        assert schedules == [d.objects.tsg]
    if how == "grce asked":
        assert not any(cmd == 0x20800170 for _, cmd in path.sent)  # not even asked


def test_a_forced_lce(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "COPY_ENGINE", 2)
    with made() as (d, path):
        assert d.copy_engine == 2
        assert struct.unpack_from("<I", allocs(path, KEPLER_CHANNEL_GROUP_A)[1][2], 12)[0] == \
            COPY[2]


def test_a_forced_lce_the_gpu_lacks_is_refused_and_make_gives_back_all(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(setup, "COPY_ENGINE", 7)
    path = Recording()
    with pytest.raises(RigError, match=r"COPY_ENGINE is 7.*LCE 0, LCE 1, LCE 2, LCE 3, LCE 4"):
        device_module.make(path)  # type: ignore[arg-type]
    assert path.rm.objects == {}


def test_copies_go_to_the_copy_channel_after_the_compute_one() -> None:
    """Device order across the two groups: a copy after a launch acquires its value first."""
    from test_device_cpu import commands, methods

    with made() as (d, path):
        launched = d.timeline.submit(d.compute, ())
        point = d.timeline.submit(d.copy_channel, (), "copy")
        acquire = methods(commands(d, d.copy_channel)[-1])[0]
        assert acquire[1] == push.SEM_ADDR_LO and acquire[2][2] == launched.value
        assert acquire[2][4] & 7 == push.SEM_OP_ACQ_CIRC_GEQ
        path.complete()
        point.wait(timeout_s=1.0)


def test_stop_frees_the_copy_group_and_everything_under_it() -> None:
    """stop() detaches both channels from UVM, then frees every RM object in reverse: the copy
    object and channel before their group, the group with the rest."""
    with made() as (d, path):
        copy_group, copy_channel = d.objects.copy_tsg, d.copy_channel.handle
        copy_object = next(h for parent, h, _ in allocs(path, HOPPER_DMA_COPY_A)
                           if parent == copy_channel)
    assert path.detached == [d.compute.handle, copy_channel]
    at = {h: i for i, h in enumerate(path.freed)}
    assert at[copy_object] < at[copy_channel] < at[copy_group]
    assert copy_group in path.freed and path.rm.objects == {}
